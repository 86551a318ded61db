//! Scalar number helpers shared by every format: half-precision conversions, ggml's
//! `nearest_int`, and little-endian field reads.
//!
//! Sources: ggml `ggml-impl.h` (`ggml_compute_fp32_to_bf16`, `GGML_FP32_TO_FP16`) and
//! `ggml-quants.c` (`nearest_int`).

use half::f16;

/// An IEEE half stored as its bits, converted to f32 exactly.
#[inline]
pub(crate) fn f16_to_f32(bits: u16) -> f32 {
    f16::from_bits(bits).to_f32()
}

/// f32 to IEEE half bits, rounding to nearest even (ggml's `GGML_FP32_TO_FP16`, and
/// F16C's `_cvtss_sh(x, 0)` on the CPU backend).
#[inline]
pub(crate) fn f32_to_f16(x: f32) -> u16 {
    f16::from_f32(x).to_bits()
}

/// bfloat16 bits to f32 (exact).
#[inline]
pub(crate) fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

/// f32 to bfloat16 bits as ggml's `ggml_compute_fp32_to_bf16`: NaN is made quiet,
/// everything else rounds to nearest even.
#[inline]
pub(crate) fn f32_to_bf16(x: f32) -> u16 {
    let u = x.to_bits();
    if (u & 0x7fff_ffff) > 0x7f80_0000 {
        return ((u >> 16) | 64) as u16;
    }
    ((u as u64 + (0x7fff + ((u >> 16) & 1)) as u64) >> 16) as u16
}

/// ggml's `nearest_int`: rounds to nearest, ties to even, through the 1.5·2²³ trick.
/// Valid for |x| ≤ 4194303 (ggml asserts this); outside that range the result is
/// meaningless but defined (no panic).
#[inline]
pub(crate) fn nearest_int(x: f32) -> i32 {
    let val = x + 12_582_912.0;
    (val.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

/// Little-endian u16 at `off`.
#[inline]
pub(crate) fn rd_u16(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes([b[off], b[off + 1]])
}

/// Little-endian u32 at `off`.
#[inline]
pub(crate) fn rd_u32(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

/// Half at `off`, as f32.
#[inline]
pub(crate) fn rd_f16(b: &[u8], off: usize) -> f32 {
    f16_to_f32(rd_u16(b, off))
}

/// Writes half bits at `off`.
#[inline]
pub(crate) fn wr_u16(b: &mut [u8], off: usize, v: u16) {
    b[off..off + 2].copy_from_slice(&v.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_int_rounds_half_to_even() {
        assert_eq!(nearest_int(0.5), 0);
        assert_eq!(nearest_int(1.5), 2);
        assert_eq!(nearest_int(2.5), 2);
        assert_eq!(nearest_int(-0.5), 0);
        assert_eq!(nearest_int(-1.5), -2);
        assert_eq!(nearest_int(-2.6), -3);
        assert_eq!(nearest_int(126.49), 126);
    }

    #[test]
    fn bf16_rounding_matches_ggml_rule() {
        // 1 + 2^-8 is exactly halfway between two bf16 values: ties to even (down).
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8000)), 0x3f80);
        // 1 + 3·2^-8 is halfway and rounds up to the even neighbour.
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f81_8000)), 0x3f82);
        // NaN stays NaN and becomes quiet.
        assert_eq!(f32_to_bf16(f32::from_bits(0x7f80_0001)), 0x7fc0);
    }
}
