//! Q2_K: super-blocks of 256 weights in 16 sub-blocks of 16; 2-bit values with a 4-bit
//! scale and 4-bit minimum per sub-block, f16 super-block scale `d` and `dmin`.
//!
//! Layout (`block_q2_K`, 84 bytes): `scales[16]` (low nibble scale, high nibble min),
//! `qs[64]`, `d: f16`, `dmin: f16`. Element `e`: 2-bit field `(e % 128)/32` of
//! `qs[32·(e/128) + e % 32]`; sub-block `e/16`. Value = `d·sc·q - dmin·m`.
//! Dot product pairs with Q8_K activations.

use super::Unpacked;
use super::kquant_search::{Qkx2, make_qkx2_quants};
use crate::fp::{f16_to_f32, f32_to_f16, nearest_int, rd_f16, wr_u16};

pub(crate) const BYTES: usize = 84;

/// The 2-bit value of element `e` of a block.
#[inline]
pub(crate) fn value(b: &[u8], e: usize) -> u8 {
    (b[16 + 32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3
}

/// Dequantizes whole blocks (`dequantize_row_q2_K`).
pub(crate) fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(BYTES).zip(dst.chunks_exact_mut(256)) {
        let d = rd_f16(b, 80);
        let dmin = rd_f16(b, 82);
        for s in 0..16 {
            let sc = b[s];
            let dl = d * (sc & 0x0f) as f32;
            let ml = dmin * (sc >> 4) as f32;
            for e in 16 * s..16 * s + 16 {
                y[e] = dl * value(b, e) as f32 - ml;
            }
        }
    }
}

/// ggml's `quantize_row_q2_K_ref`.
pub(crate) fn quantize(src: &[f32], dst: &mut [u8]) {
    const Q4SCALE: f32 = 15.0;
    let p = Qkx2 {
        nmax: 3,
        rmin: -0.5,
        rdelta: 0.1,
        nstep: 15,
        use_mad: true,
    };
    for (x, b) in src.chunks_exact(256).zip(dst.chunks_exact_mut(BYTES)) {
        let mut l = [0u8; 256];
        let mut scales = [0f32; 16];
        let mut mins = [0f32; 16];
        let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
        for j in 0..16 {
            let xs = &x[16 * j..16 * j + 16];
            let mut w = [0f32; 16];
            for (w, v) in w.iter_mut().zip(xs) {
                *w = v.abs();
            }
            let (sc, mn) = make_qkx2_quants(&p, xs, &w, &mut l[16 * j..16 * j + 16]);
            scales[j] = sc;
            mins[j] = mn;
            if sc > max_scale {
                max_scale = sc;
            }
            if mn > max_min {
                max_min = mn;
            }
        }
        if max_scale > 0.0 {
            let iscale = Q4SCALE / max_scale;
            for j in 0..16 {
                b[j] = nearest_int(iscale * scales[j]) as u8;
            }
            wr_u16(b, 80, f32_to_f16(max_scale / Q4SCALE));
        } else {
            b[..16].fill(0);
            wr_u16(b, 80, f32_to_f16(0.0));
        }
        if max_min > 0.0 {
            let iscale = Q4SCALE / max_min;
            for j in 0..16 {
                b[j] |= (nearest_int(iscale * mins[j]) << 4) as u8;
            }
            wr_u16(b, 82, f32_to_f16(max_min / Q4SCALE));
        } else {
            wr_u16(b, 82, f32_to_f16(0.0));
        }
        let d_all = f16_to_f32(u16::from_le_bytes([b[80], b[81]]));
        let dmin_all = f16_to_f32(u16::from_le_bytes([b[82], b[83]]));
        for j in 0..16 {
            let d = d_all * (b[j] & 0x0f) as f32;
            if d == 0.0 {
                continue;
            }
            let dm = dmin_all * (b[j] >> 4) as f32;
            for ii in 0..16 {
                l[16 * j + ii] = nearest_int((x[16 * j + ii] + dm) / d).clamp(0, 3) as u8;
            }
        }
        for half in 0..2 {
            let lh = &l[128 * half..];
            for k in 0..32 {
                b[16 + 32 * half + k] =
                    lh[k] | (lh[k + 32] << 2) | (lh[k + 64] << 4) | (lh[k + 96] << 6);
            }
        }
    }
}

/// Decodes a block: values `0..=3`, sub-block scales and minimums (4-bit), `d`, `dmin`.
pub(crate) fn unpack(b: &[u8], u: &mut Unpacked) {
    u.d = rd_f16(b, 80);
    u.aux = rd_f16(b, 82);
    for s in 0..16 {
        u.sub[s] = (b[s] & 0x0f) as i32;
        u.min[s] = (b[s] >> 4) as i32;
    }
    for (e, v) in u.vals.iter_mut().enumerate() {
        *v = value(b, e) as i8;
    }
}
