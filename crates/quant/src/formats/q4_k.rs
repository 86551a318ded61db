//! Q4_K: super-blocks of 256 weights in 8 sub-blocks of 32; 4-bit values with a 6-bit
//! scale and 6-bit minimum per sub-block, f16 `d` and `dmin`.
//!
//! Layout (`block_q4_K`, 144 bytes): `d: f16`, `dmin: f16`, `scales[12]` (see
//! [`scale_min_k4`]), `qs[128]`. Element `e`: byte `qs[32·(e/64) + e % 32]`, low nibble
//! if `e % 64 < 32` else high nibble; sub-block `e/32`.
//! Value = `d·sc·q - dmin·m`. Dot product pairs with Q8_K activations.

use super::Unpacked;
use super::kquant_search::{Qkx2, make_qkx2_quants, pack_scale_min_k4, scale_min_k4};
use crate::fp::{f32_to_f16, nearest_int, rd_f16, wr_u16};

pub(crate) const BYTES: usize = 144;

/// The 4-bit value of element `e`.
#[inline]
pub(crate) fn value(b: &[u8], e: usize) -> u8 {
    let q = b[16 + 32 * (e / 64) + e % 32];
    if e % 64 < 32 { q & 0x0f } else { q >> 4 }
}

/// Dequantizes whole blocks (`dequantize_row_q4_K`).
pub(crate) fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(BYTES).zip(dst.chunks_exact_mut(256)) {
        let d = rd_f16(b, 0);
        let dmin = rd_f16(b, 2);
        for j in 0..8 {
            let (sc, m) = scale_min_k4(j, &b[4..16]);
            let d1 = d * sc as f32;
            let m1 = dmin * m as f32;
            for e in 32 * j..32 * j + 32 {
                y[e] = d1 * value(b, e) as f32 - m1;
            }
        }
    }
}

/// Shared tail of the Q4_K and Q5_K reference quantizers: quantizes the eight
/// sub-block scales and minimums to 6 bits, writes `d`, `dmin` and the packed scales
/// (at `b[0..16]`), then re-quantizes the values with the stored scales into `l`.
pub(crate) fn store_scales_and_requantize(
    x: &[f32],
    scales: &[f32; 8],
    mins: &[f32; 8],
    nmax: i32,
    b: &mut [u8],
    l: &mut [u8; 256],
) {
    let max_scale = scales
        .iter()
        .fold(0.0f32, |m, &s| if s > m { s } else { m });
    let max_min = mins.iter().fold(0.0f32, |m, &s| if s > m { s } else { m });
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let mut ls = [0u8; 8];
    let mut lm = [0u8; 8];
    for j in 0..8 {
        ls[j] = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        lm[j] = (nearest_int(inv_min * mins[j]) as u8).min(63);
    }
    pack_scale_min_k4(&ls, &lm, &mut b[4..16]);
    wr_u16(b, 0, f32_to_f16(max_scale / 63.0));
    wr_u16(b, 2, f32_to_f16(max_min / 63.0));
    let d_all = rd_f16(b, 0);
    let dmin_all = rd_f16(b, 2);
    for j in 0..8 {
        let (sc, m) = scale_min_k4(j, &b[4..16]);
        let d = d_all * sc as f32;
        if d == 0.0 {
            continue;
        }
        let dm = dmin_all * m as f32;
        for ii in 0..32 {
            l[32 * j + ii] = nearest_int((x[32 * j + ii] + dm) / d).clamp(0, nmax) as u8;
        }
    }
}

/// Per-sub-block scale search shared by Q4_K and Q5_K: weights `rms + |x|`.
pub(crate) fn search_sub_blocks(x: &[f32], p: &Qkx2, l: &mut [u8; 256]) -> ([f32; 8], [f32; 8]) {
    let mut scales = [0f32; 8];
    let mut mins = [0f32; 8];
    for j in 0..8 {
        let xs = &x[32 * j..32 * j + 32];
        let sum_x2: f32 = xs.iter().fold(0.0, |s, v| s + v * v);
        let av_x = (sum_x2 / 32.0).sqrt();
        let mut w = [0f32; 32];
        for (w, v) in w.iter_mut().zip(xs) {
            *w = av_x + v.abs();
        }
        (scales[j], mins[j]) = make_qkx2_quants(p, xs, &w, &mut l[32 * j..32 * j + 32]);
    }
    (scales, mins)
}

/// ggml's `quantize_row_q4_K_ref`.
pub(crate) fn quantize(src: &[f32], dst: &mut [u8]) {
    let p = Qkx2 {
        nmax: 15,
        rmin: -1.0,
        rdelta: 0.1,
        nstep: 20,
        use_mad: false,
    };
    for (x, b) in src.chunks_exact(256).zip(dst.chunks_exact_mut(BYTES)) {
        let mut l = [0u8; 256];
        let (scales, mins) = search_sub_blocks(x, &p, &mut l);
        store_scales_and_requantize(x, &scales, &mins, 15, b, &mut l);
        for c in 0..4 {
            for k in 0..32 {
                b[16 + 32 * c + k] = l[64 * c + k] | (l[64 * c + k + 32] << 4);
            }
        }
    }
}

/// Decodes a block: values `0..=15`, 6-bit sub-block scales and minimums, `d`, `dmin`.
pub(crate) fn unpack(b: &[u8], u: &mut Unpacked) {
    u.d = rd_f16(b, 0);
    u.aux = rd_f16(b, 2);
    for j in 0..8 {
        let (sc, m) = scale_min_k4(j, &b[4..16]);
        u.sub[j] = sc as i32;
        u.min[j] = m as i32;
    }
    for c in 0..4 {
        for k in 0..32 {
            let q = b[16 + 32 * c + k];
            u.vals[64 * c + k] = (q & 0x0f) as i8;
            u.vals[64 * c + k + 32] = (q >> 4) as i8;
        }
    }
}
