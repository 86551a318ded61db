//! Q5_0: blocks of 32 weights, one f16 scale, 5-bit values `q - 16`.
//!
//! Layout (`block_q5_0`, 22 bytes): `d: f16`, `qh: u32` (bit `j` = fifth bit of element
//! `j`), `qs[16]` (element `j` = low nibble of `qs[j]`, element `j + 16` = high nibble).
//! Value = `(q - 16)·d`. Dot product pairs with Q8_0 activations.

use super::Unpacked;
use crate::fp::{f32_to_f16, rd_f16, rd_u32, wr_u16};

pub(crate) const BYTES: usize = 22;

/// The 32 unsigned 5-bit values of one block, in element order.
#[inline]
pub(crate) fn values(b: &[u8]) -> [u8; 32] {
    let qh = rd_u32(b, 2);
    let mut v = [0u8; 32];
    for j in 0..16 {
        let q = b[6 + j];
        v[j] = (q & 0x0f) | ((((qh >> j) & 1) as u8) << 4);
        v[j + 16] = (q >> 4) | ((((qh >> (j + 16)) & 1) as u8) << 4);
    }
    v
}

/// Dequantizes whole blocks (`dequantize_row_q5_0`).
pub(crate) fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(BYTES).zip(dst.chunks_exact_mut(32)) {
        let d = rd_f16(b, 0);
        for (y, q) in y.iter_mut().zip(values(b)) {
            *y = (q as i32 - 16) as f32 * d;
        }
    }
}

/// ggml's `quantize_row_q5_0_ref`: `d = max / -16`, values `trunc(x/d + 16.5)` clamped
/// to 31.
pub(crate) fn quantize(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(32).zip(dst.chunks_exact_mut(BYTES)) {
        let (mut amax, mut max) = (0.0f32, 0.0f32);
        for &v in x {
            if amax < v.abs() {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / -16.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        wr_u16(b, 0, f32_to_f16(d));
        let mut qh = 0u32;
        for j in 0..16 {
            let q0 = ((x[j] * id + 16.5) as i8).min(31) as u8;
            let q1 = ((x[j + 16] * id + 16.5) as i8).min(31) as u8;
            b[6 + j] = (q0 & 0x0f) | ((q1 & 0x0f) << 4);
            qh |= u32::from((q0 & 0x10) >> 4) << j;
            qh |= u32::from((q1 & 0x10) >> 4) << (j + 16);
        }
        b[2..6].copy_from_slice(&qh.to_le_bytes());
    }
}

/// Decodes a block to signed values `q - 16` and its scale.
pub(crate) fn unpack(b: &[u8], u: &mut Unpacked) {
    u.d = rd_f16(b, 0);
    for (o, q) in u.vals.iter_mut().zip(values(b)) {
        *o = q as i8 - 16;
    }
}
