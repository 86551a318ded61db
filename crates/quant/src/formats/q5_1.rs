//! Q5_1: blocks of 32 weights, f16 scale and minimum, 5-bit values.
//!
//! Layout (`block_q5_1`, 24 bytes): `d: f16`, `m: f16`, `qh: u32`, `qs[16]`, packed as
//! Q5_0. Value = `q·d + m`. Dot product pairs with Q8_1 activations.

use super::Unpacked;
use crate::fp::{f32_to_f16, rd_f16, rd_u32, wr_u16};

pub(crate) const BYTES: usize = 24;

/// The 32 unsigned 5-bit values of one block, in element order.
#[inline]
pub(crate) fn values(b: &[u8]) -> [u8; 32] {
    let qh = rd_u32(b, 4);
    let mut v = [0u8; 32];
    for j in 0..16 {
        let q = b[8 + j];
        v[j] = (q & 0x0f) | ((((qh >> j) & 1) as u8) << 4);
        v[j + 16] = (q >> 4) | ((((qh >> (j + 16)) & 1) as u8) << 4);
    }
    v
}

/// Dequantizes whole blocks (`dequantize_row_q5_1`).
pub(crate) fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(BYTES).zip(dst.chunks_exact_mut(32)) {
        let d = rd_f16(b, 0);
        let m = rd_f16(b, 2);
        for (y, q) in y.iter_mut().zip(values(b)) {
            *y = q as f32 * d + m;
        }
    }
}

/// ggml's `quantize_row_q5_1_ref`: `d = (max - min)/31`, values `trunc((x - min)/d + 0.5)`.
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
        let d = (max - min) / 31.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        wr_u16(b, 0, f32_to_f16(d));
        wr_u16(b, 2, f32_to_f16(min));
        let mut qh = 0u32;
        for j in 0..16 {
            let q0 = ((x[j] - min) * id + 0.5) as u8;
            let q1 = ((x[j + 16] - min) * id + 0.5) as u8;
            b[8 + j] = (q0 & 0x0f) | ((q1 & 0x0f) << 4);
            qh |= u32::from((q0 & 0x10) >> 4) << j;
            qh |= u32::from((q1 & 0x10) >> 4) << (j + 16);
        }
        b[4..8].copy_from_slice(&qh.to_le_bytes());
    }
}

/// Decodes a block to its values `q`, scale `d` and minimum `m` (as `aux`).
pub(crate) fn unpack(b: &[u8], u: &mut Unpacked) {
    u.d = rd_f16(b, 0);
    u.aux = rd_f16(b, 2);
    for (o, q) in u.vals.iter_mut().zip(values(b)) {
        *o = q as i8;
    }
}
