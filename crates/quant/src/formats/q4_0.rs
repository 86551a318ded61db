//! Q4_0: blocks of 32 weights, one f16 scale, 4-bit values `q - 8`.
//!
//! Layout (`block_q4_0`, ggml-common.h, 18 bytes): `d: f16`, `qs[16]`; element `j < 16`
//! is the low nibble of `qs[j]`, element `j + 16` its high nibble. Value = `(q - 8)·d`.
//! Dot product pairs with Q8_0 activations.

use super::Unpacked;
use crate::fp::{f32_to_f16, rd_f16, wr_u16};

pub(crate) const BYTES: usize = 18;

/// Dequantizes whole blocks (`dequantize_row_q4_0`).
pub(crate) fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(BYTES).zip(dst.chunks_exact_mut(32)) {
        let d = rd_f16(b, 0);
        for j in 0..16 {
            let q = b[2 + j];
            y[j] = ((q & 0x0f) as i32 - 8) as f32 * d;
            y[j + 16] = ((q >> 4) as i32 - 8) as f32 * d;
        }
    }
}

/// ggml's `quantize_row_q4_0_ref`: scale from the signed value of largest magnitude,
/// `d = max / -8`, values truncated after adding 8.5 and clamped to 15.
pub(crate) fn quantize(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(32).zip(dst.chunks_exact_mut(BYTES)) {
        let (mut amax, mut max) = (0.0f32, 0.0f32);
        for &v in x {
            if amax < v.abs() {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        wr_u16(b, 0, f32_to_f16(d));
        for j in 0..16 {
            let x0 = x[j] * id;
            let x1 = x[j + 16] * id;
            // C: (int8_t)(x + 8.5f) truncates toward zero, then MIN(15, ·).
            let q0 = ((x0 + 8.5) as i8).min(15) as u8;
            let q1 = ((x1 + 8.5) as i8).min(15) as u8;
            b[2 + j] = q0 | (q1 << 4);
        }
    }
}

/// Decodes a block to signed values `q - 8` and its scale.
pub(crate) fn unpack(b: &[u8], u: &mut Unpacked) {
    u.d = rd_f16(b, 0);
    for j in 0..16 {
        u.vals[j] = (b[2 + j] & 0x0f) as i8 - 8;
        u.vals[j + 16] = (b[2 + j] >> 4) as i8 - 8;
    }
}
