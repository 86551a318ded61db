//! Q3_K: super-blocks of 256 weights in 16 sub-blocks of 16; 3-bit signed values
//! (2 low bits plus a high-bit mask) with 6-bit sub-block scales and an f16 `d`.
//!
//! Layout (`block_q3_K`, 110 bytes): `hmask[32]`, `qs[64]`, `scales[12]`, `d: f16`.
//! Element `e`: low bits as Q2_K (`qs` at offset 32); the high bit is bit `e/32` of
//! `hmask[e % 32]`, and a clear bit means 4 is subtracted. Sub-block `s = e/16` has the
//! 6-bit scale (low nibble from `scales[s % 8]` (high nibble for `s >= 8`), top two bits
//! from `scales[8 + s % 4]` bits `2·(s/4)`), minus 32. Value = `d·(sc - 32)·q`.
//! Dot product pairs with Q8_K activations.

use super::Unpacked;
use super::kquant_search::make_q3_quants;
use crate::fp::{f32_to_f16, nearest_int, rd_f16, wr_u16};

pub(crate) const BYTES: usize = 110;

/// Signed 3-bit value (`-4..=3`) of element `e`.
#[inline]
pub(crate) fn value(b: &[u8], e: usize) -> i8 {
    let low = (b[32 + 32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
    let high = (b[e % 32] >> (e / 32)) & 1;
    low as i8 - if high == 1 { 0 } else { 4 }
}

/// Signed scale (`-32..=31`) of sub-block `s` (0..16).
#[inline]
pub(crate) fn scale(b: &[u8], s: usize) -> i8 {
    let sc = &b[96..108];
    let low = if s < 8 { sc[s] & 0x0f } else { sc[s - 8] >> 4 };
    let high = (sc[8 + s % 4] >> (2 * (s / 4))) & 3;
    (low | (high << 4)) as i8 - 32
}

/// Dequantizes whole blocks (`dequantize_row_q3_K`).
pub(crate) fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(BYTES).zip(dst.chunks_exact_mut(256)) {
        let d = rd_f16(b, 108);
        for s in 0..16 {
            let dl = d * scale(b, s) as f32;
            for e in 16 * s..16 * s + 16 {
                y[e] = dl * value(b, e) as f32;
            }
        }
    }
}

/// ggml's `quantize_row_q3_K_ref`.
pub(crate) fn quantize(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(256).zip(dst.chunks_exact_mut(BYTES)) {
        let mut l = [0i8; 256];
        let mut scales = [0f32; 16];
        let (mut max_scale, mut amax) = (0.0f32, 0.0f32);
        for j in 0..16 {
            scales[j] = make_q3_quants(4, &x[16 * j..16 * j + 16], &mut l[16 * j..16 * j + 16]);
            if scales[j].abs() > amax {
                amax = scales[j].abs();
                max_scale = scales[j];
            }
        }
        b[96..108].fill(0);
        if max_scale != 0.0 {
            let iscale = -32.0 / max_scale;
            for j in 0..16 {
                let mut lv = (nearest_int(iscale * scales[j]) as i8).clamp(-32, 31) + 32;
                if j < 8 {
                    b[96 + j] = (lv & 0x0f) as u8;
                } else {
                    b[96 + j - 8] |= ((lv & 0x0f) << 4) as u8;
                }
                lv >>= 4;
                b[96 + 8 + j % 4] |= (lv << (2 * (j / 4))) as u8;
            }
            wr_u16(b, 108, f32_to_f16(1.0 / iscale));
        } else {
            wr_u16(b, 108, f32_to_f16(0.0));
        }
        let d_all = rd_f16(b, 108);
        for j in 0..16 {
            let d = d_all * scale(b, j) as f32;
            if d == 0.0 {
                continue;
            }
            for ii in 0..16 {
                l[16 * j + ii] = (nearest_int(x[16 * j + ii] / d).clamp(-4, 3) + 4) as i8;
            }
        }
        b[..32].fill(0);
        for (j, lj) in l.iter_mut().enumerate() {
            if *lj > 3 {
                b[j % 32] |= 1 << (j / 32);
                *lj -= 4;
            }
        }
        for half in 0..2 {
            let lh = &l[128 * half..];
            for k in 0..32 {
                let v = lh[k] | (lh[k + 32] << 2) | (lh[k + 64] << 4) | (lh[k + 96] << 6);
                b[32 + 32 * half + k] = v as u8;
            }
        }
    }
}

/// Decodes a block: values `-4..=3`, signed sub-block scales, `d`.
pub(crate) fn unpack(b: &[u8], u: &mut Unpacked) {
    u.d = rd_f16(b, 108);
    for s in 0..16 {
        u.sub[s] = scale(b, s) as i32;
    }
    for (e, v) in u.vals.iter_mut().enumerate() {
        *v = value(b, e);
    }
}
