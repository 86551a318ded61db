//! Q8_1: the activation format paired with Q4_1 and Q5_1 weights: Q8_0 plus
//! `s = d·Σq`, so the weights' minimum term needs no pass over the values.
//!
//! Layout (`block_q8_1`, 36 bytes): `d: f16`, `s: f16`, `qs[32]: i8`. Value = `q·d`.

use crate::fp::{f32_to_f16, rd_f16, wr_u16};

pub(crate) const BYTES: usize = 36;

/// Dequantizes whole blocks (`q·d`; `s` is redundant).
pub(crate) fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(BYTES).zip(dst.chunks_exact_mut(32)) {
        let d = rd_f16(b, 0);
        for (y, &q) in y.iter_mut().zip(&b[4..]) {
            *y = q as i8 as f32 * d;
        }
    }
}

/// ggml's `quantize_row_q8_1_ref`: as Q8_0's reference (`roundf`), with
/// `s = f16(Σq · d)`.
pub(crate) fn quantize(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(32).zip(dst.chunks_exact_mut(BYTES)) {
        let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        wr_u16(b, 0, f32_to_f16(d));
        let mut sum = 0i32;
        for (q, &v) in b[4..].iter_mut().zip(x) {
            let r = (v * id).round() as i8;
            *q = r as u8;
            sum += r as i32;
        }
        wr_u16(b, 2, f32_to_f16(sum as f32 * d));
    }
}
