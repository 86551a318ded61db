//! MXFP4: blocks of 32 weights, one E8M0 (power-of-two) scale, 4-bit e2m1 values.
//!
//! Layout (`block_mxfp4`, ggml-common.h, 17 bytes): `e: u8`, `qs[16]`; element `j < 16`
//! is the low nibble of `qs[j]`, element `j + 16` its high nibble. A nibble indexes
//! `kvalues_mxfp4 = {0, 1, 2, 3, 4, 6, 8, 12, -0, -1, -2, -3, -4, -6, -8, -12}` (the
//! e2m1 values doubled, so that they are integers); value = `kvalue · 2^(e−127) / 2`
//! (`GGML_E8M0_TO_FP32_HALF`). The dot product pairs with Q8_0 activations
//! (`ggml_vec_dot_mxfp4_q8_0`). DeepSeek-V4's routed experts ship in this format
//! (its FP4 checkpoint repacks losslessly into it).

use super::Unpacked;

pub(crate) const BYTES: usize = 17;

/// `kvalues_mxfp4` (ggml-common.h): e2m1 codes doubled.
pub(crate) const KVALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// `GGML_E8M0_TO_FP32_HALF`: `2^(e−128)` as f32 bits (subnormal for `e < 2`).
#[inline]
pub(crate) fn e8m0_half(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        u32::from(e - 1) << 23
    };
    f32::from_bits(bits)
}

/// Dequantizes whole blocks (`dequantize_row_mxfp4`).
pub(crate) fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(BYTES).zip(dst.chunks_exact_mut(32)) {
        let d = e8m0_half(b[0]);
        for j in 0..16 {
            let q = b[1 + j];
            y[j] = KVALUES[(q & 0x0f) as usize] as f32 * d;
            y[j + 16] = KVALUES[(q >> 4) as usize] as f32 * d;
        }
    }
}

/// `best_index_mxfp4`: the first code whose value `kvalue·d` is nearest to `x`.
fn best_index(x: f32, d: f32) -> u8 {
    let mut best = 0;
    let mut err = (KVALUES[0] as f32 * d - x).abs();
    for (i, &k) in KVALUES.iter().enumerate().skip(1) {
        let e = (k as f32 * d - x).abs();
        if e < err {
            best = i;
            err = e;
        }
    }
    best as u8
}

/// ggml's `quantize_row_mxfp4_ref`: `e = floor(log2(amax)) − 2 + 127` (0 for an
/// all-zero block), each value the nearest code. Values already of the form
/// `e2m1 · 2^k` with one `k` per block (DeepSeek's FP4 weights) are kept exactly.
pub(crate) fn quantize(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(32).zip(dst.chunks_exact_mut(BYTES)) {
        let amax = x
            .iter()
            .fold(0.0f32, |m, v| if m < v.abs() { v.abs() } else { m });
        // C: (uint8_t) (floorf(log2f(amax)) - 2 + 127), truncated through an int.
        let e = if amax > 0.0 {
            ((amax.log2().floor() - 2.0 + 127.0) as i32) as u8
        } else {
            0
        };
        let d = e8m0_half(e);
        b[0] = e;
        for j in 0..16 {
            b[1 + j] = best_index(x[j], d) | (best_index(x[j + 16], d) << 4);
        }
    }
}

/// Decodes a block to its integer values (`kvalues`) and scale `2^(e−128)`.
pub(crate) fn unpack(b: &[u8], u: &mut Unpacked) {
    u.d = e8m0_half(b[0]);
    for j in 0..16 {
        u.vals[j] = KVALUES[(b[1 + j] & 0x0f) as usize];
        u.vals[j + 16] = KVALUES[(b[1 + j] >> 4) as usize];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e8m0_half_is_a_power_of_two() {
        assert_eq!(e8m0_half(127), 0.5);
        assert_eq!(e8m0_half(128), 1.0);
        assert_eq!(e8m0_half(1), 2f32.powi(-127));
        assert_eq!(e8m0_half(0), 2f32.powi(-128));
        assert_eq!(e8m0_half(254), 2f32.powi(126));
    }

    /// Blocks of e2m1 values times one power of two round-trip exactly, and the
    /// exponent is the one DeepSeek's FP4 packing picks (`ceil(log2(amax/6))`).
    #[test]
    fn e2m1_blocks_round_trip() {
        let e2m1 = [0.0f32, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
        for k in [-9i32, -3, 0, 2] {
            for top in 1..8 {
                let x: Vec<f32> = (0..32)
                    .map(|i| {
                        let v = e2m1[(i * 5 + 3) % (top + 1)] * 2f32.powi(k);
                        if i % 3 == 0 { -v } else { v }
                    })
                    .collect();
                let mut b = [0u8; BYTES];
                quantize(&x, &mut b);
                let mut y = [0f32; 32];
                dequantize(&b, &mut y);
                assert_eq!(x, y, "k {k}, top {top}");
                let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
                let want = (amax / 6.0).log2().ceil() as i32 + 127;
                assert_eq!(b[0] as i32, want, "k {k}, top {top}");
            }
        }
    }
}
