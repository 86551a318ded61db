//! Q6_K: super-blocks of 256 weights in 16 sub-blocks of 16; 6-bit values `q - 32`
//! with signed 8-bit sub-block scales and an f16 `d`.
//!
//! Layout (`block_q6_K`, 210 bytes): `ql[128]` (low 4 bits), `qh[64]` (high 2 bits),
//! `scales[16]: i8`, `d: f16`. Element `e` (`h = e/128`, `g = (e % 128)/32`,
//! `l = e % 32`): low bits from `ql[64h + l + 32·(g & 1)]` (low nibble for `g < 2`),
//! high bits `(qh[32h + l] >> 2g) & 3`; sub-block `e/16`. Value = `d·sc·(q - 32)`.
//! Dot product pairs with Q8_K activations.

use super::Unpacked;
use super::kquant_search::{GROUP_MAX_EPS, make_qx_quants};
use crate::fp::{f32_to_f16, nearest_int, rd_f16, wr_u16};

pub(crate) const BYTES: usize = 210;

/// The unsigned 6-bit value (`0..=63`) of element `e`.
#[inline]
pub(crate) fn value(b: &[u8], e: usize) -> u8 {
    let (h, g, l) = (e / 128, (e % 128) / 32, e % 32);
    let lq = b[64 * h + l + 32 * (g & 1)];
    let low = if g < 2 { lq & 0x0f } else { lq >> 4 };
    low | (((b[128 + 32 * h + l] >> (2 * g)) & 3) << 4)
}

/// Dequantizes whole blocks (`dequantize_row_q6_K`: `(d·sc)·q`).
pub(crate) fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(BYTES).zip(dst.chunks_exact_mut(256)) {
        let d = rd_f16(b, 208);
        for e in 0..256 {
            let sc = b[192 + e / 16] as i8;
            y[e] = d * sc as f32 * (value(b, e) as i32 - 32) as f32;
        }
    }
}

/// ggml's `quantize_row_q6_K_ref`.
pub(crate) fn quantize(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(256).zip(dst.chunks_exact_mut(BYTES)) {
        let mut l = [0i8; 256];
        let mut scales = [0f32; 16];
        let (mut max_scale, mut max_abs_scale) = (0.0f32, 0.0f32);
        for ib in 0..16 {
            let s = make_qx_quants(32, &x[16 * ib..16 * ib + 16], &mut l[16 * ib..16 * ib + 16]);
            scales[ib] = s;
            if s.abs() > max_abs_scale {
                max_abs_scale = s.abs();
                max_scale = s;
            }
        }
        if max_abs_scale < GROUP_MAX_EPS {
            b.fill(0);
            continue;
        }
        let iscale = -128.0 / max_scale;
        wr_u16(b, 208, f32_to_f16(1.0 / iscale));
        for ib in 0..16 {
            b[192 + ib] = nearest_int(iscale * scales[ib]).min(127) as i8 as u8;
        }
        let d_all = rd_f16(b, 208);
        for j in 0..16 {
            let d = d_all * b[192 + j] as i8 as f32;
            if d == 0.0 {
                continue;
            }
            for ii in 0..16 {
                l[16 * j + ii] = (nearest_int(x[16 * j + ii] / d).clamp(-32, 31) + 32) as i8;
            }
        }
        for h in 0..2 {
            let lh = &l[128 * h..];
            for k in 0..32 {
                let q = |o: usize| lh[k + o] as u8;
                b[64 * h + k] = (q(0) & 0x0f) | ((q(64) & 0x0f) << 4);
                b[64 * h + k + 32] = (q(32) & 0x0f) | ((q(96) & 0x0f) << 4);
                b[128 + 32 * h + k] =
                    (q(0) >> 4) | ((q(32) >> 4) << 2) | ((q(64) >> 4) << 4) | ((q(96) >> 4) << 6);
            }
        }
    }
}

/// Decodes a block: values `q - 32`, signed sub-block scales, `d`.
pub(crate) fn unpack(b: &[u8], u: &mut Unpacked) {
    u.d = rd_f16(b, 208);
    for s in 0..16 {
        u.sub[s] = b[192 + s] as i8 as i32;
    }
    for (e, v) in u.vals.iter_mut().enumerate() {
        *v = value(b, e) as i8 - 32;
    }
}
