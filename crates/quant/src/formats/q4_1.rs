//! Q4_1: blocks of 32 weights, f16 scale and f16 minimum, 4-bit values.
//!
//! Layout (`block_q4_1`, 20 bytes): `d: f16`, `m: f16`, `qs[16]` (element `j` = low
//! nibble of `qs[j]`, element `j + 16` = high nibble). Value = `q·d + m`.
//! Dot product pairs with Q8_1 activations (which carry `s = d·Σq`).

use super::Unpacked;
use crate::fp::{f32_to_f16, rd_f16, wr_u16};

pub(crate) const BYTES: usize = 20;

/// Dequantizes whole blocks (`dequantize_row_q4_1`; `q·d + m` without fused multiply-add).
pub(crate) fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(BYTES).zip(dst.chunks_exact_mut(32)) {
        let d = rd_f16(b, 0);
        let m = rd_f16(b, 2);
        for j in 0..16 {
            let q = b[4 + j];
            y[j] = (q & 0x0f) as f32 * d + m;
            y[j + 16] = (q >> 4) as f32 * d + m;
        }
    }
}

/// ggml's `quantize_row_q4_1_ref`: `d = (max - min)/15`, `m = min`, values
/// `trunc((x - min)/d + 0.5)` clamped to 15.
pub(crate) fn quantize(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(32).zip(dst.chunks_exact_mut(BYTES)) {
        let (mut min, mut max) = (f32::MAX, -f32::MAX);
        for &v in x {
            if v < min {
                min = v;
            }
            if v > max {
                max = v;
            }
        }
        let d = (max - min) / 15.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        wr_u16(b, 0, f32_to_f16(d));
        wr_u16(b, 2, f32_to_f16(min));
        for j in 0..16 {
            let x0 = (x[j] - min) * id;
            let x1 = (x[j + 16] - min) * id;
            let q0 = ((x0 + 0.5) as i8).min(15) as u8;
            let q1 = ((x1 + 0.5) as i8).min(15) as u8;
            b[4 + j] = q0 | (q1 << 4);
        }
    }
}

/// Decodes a block to its values `q`, scale `d` and minimum `m` (as `aux`).
pub(crate) fn unpack(b: &[u8], u: &mut Unpacked) {
    u.d = rd_f16(b, 0);
    u.aux = rd_f16(b, 2);
    for j in 0..16 {
        u.vals[j] = (b[4 + j] & 0x0f) as i8;
        u.vals[j + 16] = (b[4 + j] >> 4) as i8;
    }
}
