//! Q8_K: the activation format paired with the K-quants and IQ2_XXS.
//!
//! Layout (`block_q8_K`, 292 bytes): `d: f32`, `qs[256]: i8`, `bsums[16]: i16` (sums of
//! each 16 consecutive values). Value = `q·d`.

use crate::fp::{nearest_int, rd_u32};

pub(crate) const BYTES: usize = 292;

/// Dequantizes whole blocks (`dequantize_row_q8_K`).
pub(crate) fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(BYTES).zip(dst.chunks_exact_mut(256)) {
        let d = f32::from_bits(rd_u32(b, 0));
        for (y, &q) in y.iter_mut().zip(&b[4..260]) {
            *y = d * q as i8 as f32;
        }
    }
}

/// ggml's `quantize_row_q8_K_ref` on one block of 256 (the CPU backend uses it as is):
/// the signed value of largest magnitude `max` (first one on ties) gives
/// `iscale = -127/max`, values `min(127, nearest_int(iscale·x))`, `d = 1/iscale`.
/// Returns `d` (0 for an all-zero block, whose values are all 0).
pub(crate) fn quantize_act(x: &[f32], qs: &mut [i8]) -> f32 {
    let amax = super::q8_0::max_abs(x);
    if amax == 0.0 {
        qs.fill(0);
        return 0.0;
    }
    // The first value whose magnitude is the maximum (ggml's strict `>` scan).
    let max = x.iter().copied().find(|v| v.abs() == amax).unwrap_or(amax);
    let iscale = -127.0 / max;
    for (q, &v) in qs.iter_mut().zip(x) {
        *q = nearest_int(iscale * v).min(127) as i8;
    }
    1.0 / iscale
}

/// Writes ggml `block_q8_K` bytes for `x` (`quantize_row_q8_K_ref`).
pub(crate) fn quantize(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(256).zip(dst.chunks_exact_mut(BYTES)) {
        let mut qs = [0i8; 256];
        let d = quantize_act(x, &mut qs);
        b[0..4].copy_from_slice(&d.to_le_bytes());
        for (o, q) in b[4..260].iter_mut().zip(qs) {
            *o = q as u8;
        }
        for j in 0..16 {
            let s: i32 = qs[16 * j..16 * j + 16].iter().map(|&q| q as i32).sum();
            b[260 + 2 * j..262 + 2 * j].copy_from_slice(&(s as i16).to_le_bytes());
        }
    }
}
