//! Q8_0: blocks of 32 weights, one f16 scale, signed 8-bit values. Also the activation
//! format paired with Q4_0, Q5_0 and Q8_0 weights.
//!
//! Layout (`block_q8_0`, 34 bytes): `d: f16`, `qs[32]: i8`. Value = `q·d`.

use super::Unpacked;
use crate::fp::{f32_to_f16, rd_f16, wr_u16};

pub(crate) const BYTES: usize = 34;

/// Dequantizes whole blocks (`dequantize_row_q8_0`).
pub(crate) fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(BYTES).zip(dst.chunks_exact_mut(32)) {
        let d = rd_f16(b, 0);
        for (y, &q) in y.iter_mut().zip(&b[2..]) {
            *y = q as i8 as f32 * d;
        }
    }
}

/// ggml's `quantize_row_q8_0_ref` (weights): `d = amax/127`, values `roundf(x/d)`
/// (ties away from zero). Activations use [`quantize_act`] instead.
pub(crate) fn quantize(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(32).zip(dst.chunks_exact_mut(BYTES)) {
        let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        wr_u16(b, 0, f32_to_f16(d));
        for (q, &v) in b[2..].iter_mut().zip(x) {
            *q = (v * id).round() as i8 as u8;
        }
    }
}

/// Activation quantization as ggml's x86 CPU backend does it (`quantize_row_q8_0` in
/// `arch/x86/quants.c`): `d = amax/127` stored as f16, multiplier `127/amax` (0 for an
/// all-zero block), values rounded to nearest even. Returns the stored f16 bits of `d`,
/// the exact sum of the 32 values and the unrounded `d` (Q8_1's `s` uses it).
pub(crate) fn quantize_act(x: &[f32], qs: &mut [i8]) -> (u16, i32, f32) {
    let amax = max_abs(x);
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    for (q, &v) in qs.iter_mut().zip(x) {
        *q = round_even_small(v * id) as i8;
    }
    let sum = qs.iter().map(|&q| q as i32).sum();
    (f32_to_f16(d), sum, d)
}

/// Largest magnitude of `x` (written as 8 independent maxima so it vectorizes; `max`
/// does not depend on the order).
#[inline]
pub(crate) fn max_abs(x: &[f32]) -> f32 {
    let mut m = [0f32; 8];
    let chunks = x.chunks_exact(8);
    let tail = chunks.remainder();
    for c in chunks {
        for i in 0..8 {
            m[i] = m[i].max(c[i].abs());
        }
    }
    let mut r = m.iter().fold(0f32, |a, &b| a.max(b));
    for v in tail {
        r = r.max(v.abs());
    }
    r
}

/// Rounds to the nearest integer, ties to even, for |v| < 2^22 (exactly what
/// `_mm256_round_ps(v, _MM_ROUND_NEAREST)` does there), clamped to the i8 range as the
/// saturating packs of ggml's kernel do.
#[inline]
pub(crate) fn round_even_small(v: f32) -> i32 {
    const MAGIC: f32 = 12_582_912.0;
    (((v + MAGIC) - MAGIC) as i32).clamp(-128, 127)
}

/// Decodes a block to its signed values and scale.
pub(crate) fn unpack(b: &[u8], u: &mut Unpacked) {
    u.d = rd_f16(b, 0);
    for (o, &q) in u.vals.iter_mut().zip(&b[2..34]) {
        *o = q as i8;
    }
}
