//! Elementwise and reduction arithmetic in the exact operation order of ggml's x86 CPU
//! backend as built for AVX-512 (llama.cpp's `ggml-cpu` "zen4"-class variant, the one
//! our llama.cpp reference fixtures were recorded with).
//!
//! Batch-1 logits of small quantized models are chaotic in the last ulps: a one-ulp
//! difference in an attention score can flip an f16 or Q8 rounding a few layers later
//! and move a tail log-probability by 0.1–0.2. Matching llama.cpp therefore means
//! matching its operation order, not only its formulas. Each function names the ggml
//! routine whose order it follows (ggml `ggml-cpu/vec.h`, `vec.cpp`,
//! `simd-mappings.h`, `llamafile/sgemm.cpp`). The code is plain Rust over 16-lane
//! arrays, so the results are the same on every CPU; the compiler vectorises it.

/// Lanes of an AVX-512 f32 vector.
pub const LANES: usize = 16;

/// `_mm512_reduce_add_ps` as GCC implements it: 256-bit halves, then 128-bit halves,
/// then pairs `(0+2)+(1+3)`.
#[inline]
pub fn reduce_add_16(v: &[f32; LANES]) -> f32 {
    let mut t3 = [0f32; 8];
    for i in 0..8 {
        t3[i] = v[8 + i] + v[i];
    }
    let mut t6 = [0f32; 4];
    for i in 0..4 {
        t6[i] = t3[4 + i] + t3[i];
    }
    (t6[0] + t6[2]) + (t6[1] + t6[3])
}

/// `ggml_vec_dot_f16` on AVX-512 (no FP16 arithmetic): four 16-lane accumulators over
/// steps of 64 elements, reduced `(a0+a2)+(a1+a3)` then [`reduce_add_16`], leftovers
/// added in f64. `x`, `y` hold f16 values widened to f32.
pub fn dot_f16_vec(x: &[f32], y: &[f32]) -> f32 {
    let n = x.len();
    let np = n & !63;
    let mut acc = [[0f32; LANES]; 4];
    for c in (0..np).step_by(64) {
        for (j, a) in acc.iter_mut().enumerate() {
            let (xs, ys) = (&x[c + j * LANES..][..LANES], &y[c + j * LANES..][..LANES]);
            for l in 0..LANES {
                a[l] = xs[l].mul_add(ys[l], a[l]);
            }
        }
    }
    let mut r = [0f32; LANES];
    for l in 0..LANES {
        r[l] = (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]);
    }
    let mut sum = reduce_add_16(&r) as f64;
    for i in np..n {
        sum += (x[i] * y[i]) as f64;
    }
    sum as f32
}

/// `ggml_v_expf` (AVX-512): ggml's vectorised `expf`, adapted from Arm's optimized
/// routines (max error 1.45 ulp + 0.5). Values below about -104 give 0, above 88.4 give
/// infinity.
#[inline]
pub fn expf(x: f32) -> f32 {
    let r = f32::from_bits(0x4b40_0000); // 0x1.8p23
    let z = x.mul_add(f32::from_bits(0x3fb8_aa3b), r); // 0x1.715476p+0 = log2(e)
    let n = z - r;
    // b = x - n·ln2_hi - n·ln2_lo
    let b = (-n).mul_add(
        f32::from_bits(0x35bf_be8e),                  // 0x1.7f7d1cp-20
        (-n).mul_add(f32::from_bits(0x3f31_7200), x), // 0x1.62e4p-1
    );
    if n.abs() > 192.0 {
        return if n <= 0.0 { 0.0 } else { f32::INFINITY };
    }
    let u = b * b;
    let j = f32::from_bits(0x3c07_2010) // 0x1.0e4020p-7
        .mul_add(b, f32::from_bits(0x3d2b_9f17)) // 0x1.573e2ep-5
        .mul_add(
            u,
            f32::from_bits(0x3e2a_af33).mul_add(b, f32::from_bits(0x3eff_fedb)), // 0x1.555e66p-3, 0x1.fffdb6p-2
        )
        .mul_add(u, f32::from_bits(0x3f7f_fff6).mul_add(b, 1.0)); // 0x1.ffffecp-1
    // _mm512_scalef_ps(j, n): j · 2^n rounded once.
    (j as f64 * pow2(n)) as f32
}

/// `2^n` for an integral `n` with `|n| <= 192`, exactly (built from its exponent bits:
/// libm's `exp2` gives the same value at several times the cost).
#[inline]
fn pow2(n: f32) -> f64 {
    f64::from_bits(((n as i64 + 1023) as u64) << 52)
}

/// `silu(x) = x / (1 + exp(-x))` as `ggml_v_silu` (AVX-512) computes it.
#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + expf(0.0 - x))
}

/// `ggml_vec_swiglu_f32` (AVX-512): `silu(x) · g` over 16-lane chunks with
/// [`silu`]; a tail shorter than 16 uses libm `expf` as ggml's scalar loop does.
pub fn swiglu(x: &[f32], g: &[f32], y: &mut [f32]) {
    let n = x.len();
    let np = n - n % LANES;
    for i in 0..np {
        y[i] = silu(x[i]) * g[i];
    }
    for i in np..n {
        y[i] = x[i] / (1.0 + (-x[i]).exp()) * g[i];
    }
}

/// `ggml_compute_forward_soft_max_f32` for one row already scaled and masked (masked
/// entries are `-inf`): `exp(x - max)` with [`expf`] over 16-lane chunks whose sums
/// ([`reduce_add_16`]) accumulate in f64, then scaling by `(f32)(1/sum)`. The row
/// length must be a multiple of 16 (ggml pads the KV length to 256).
pub fn softmax(row: &mut [f32]) {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f64;
    for chunk in row.chunks_exact_mut(LANES) {
        let mut v = [0f32; LANES];
        for l in 0..LANES {
            v[l] = expf(chunk[l] - max);
            chunk[l] = v[l];
        }
        sum += reduce_add_16(&v) as f64;
    }
    let scale = (1.0 / sum) as f32;
    for v in row.iter_mut() {
        *v *= scale;
    }
}

/// `ggml_compute_forward_rms_norm_f32` then the weight multiply of llama.cpp's graph:
/// squares in f32 summed in f64, `scale = 1/sqrt(mean + eps)` in f32, `y = (x·scale)·w`.
pub fn rms_norm_row(x: &mut [f32], w: Option<&[f32]>, eps: f32) {
    let sum: f64 = x.iter().map(|&v| (v * v) as f64).sum();
    let mean = (sum / x.len().max(1) as f64) as f32;
    let scale = 1.0f32 / (mean + eps).sqrt();
    match w {
        Some(w) => {
            for (v, &g) in x.iter_mut().zip(w) {
                *v = (*v * scale) * g;
            }
        }
        None => x.iter_mut().for_each(|v| *v *= scale),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expf_is_within_two_ulps_of_libm() {
        let mut x = -100.0f32;
        while x < 88.0 {
            let (a, b) = (expf(x), x.exp());
            let ulps = (a.to_bits() as i64 - b.to_bits() as i64).abs();
            assert!(ulps <= 2, "expf({x}) = {a}, libm {b} ({ulps} ulps)");
            x += 0.0137;
        }
        assert_eq!(expf(f32::NEG_INFINITY), 0.0);
        assert_eq!(expf(-200.0), 0.0);
        assert_eq!(expf(100.0), f32::INFINITY);
    }

    #[test]
    fn pow2_is_exp2() {
        for n in -192..=192 {
            assert_eq!(pow2(n as f32), (n as f64).exp2(), "2^{n}");
        }
    }

    #[test]
    fn reduction_order_is_gcc_s() {
        // Values whose sum depends on the order: 1e8 + 1 - 1e8 style cancellations.
        let mut v = [0f32; 16];
        v[0] = 1.0e8;
        v[8] = -1.0e8;
        v[1] = 1.0;
        // (v0+v8) + ... keeps the 1; a left-to-right sum would lose it.
        assert_eq!(reduce_add_16(&v), 1.0);
    }

    #[test]
    fn dots_equal_f64_on_exact_values() {
        let x: Vec<f32> = (0..128).map(|i| (i % 7) as f32 - 3.0).collect();
        let y: Vec<f32> = (0..128).map(|i| (i % 5) as f32 * 0.5).collect();
        let exact: f64 = x
            .iter()
            .zip(&y)
            .map(|(a, b)| (*a as f64) * (*b as f64))
            .sum();
        assert_eq!(dot_f16_vec(&x, &y) as f64, exact);
    }

    #[test]
    fn softmax_sums_to_one_and_masks() {
        let mut row: Vec<f32> = (0..32)
            .map(|i| {
                if i < 20 {
                    i as f32 * 0.1
                } else {
                    f32::NEG_INFINITY
                }
            })
            .collect();
        softmax(&mut row);
        let s: f64 = row.iter().map(|&v| v as f64).sum();
        assert!((s - 1.0).abs() < 1e-6);
        assert!(row[20..].iter().all(|&v| v == 0.0));
    }
}
