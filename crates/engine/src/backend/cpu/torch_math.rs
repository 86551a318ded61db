//! Scalar and row arithmetic of the PyTorch references (`Prec::F32`/`Bf16`): sigmoid,
//! SiLU and softplus in f32 as written in the references, RMS scales and softmax sums in
//! f64, LayerNorm statistics in f64.

use crate::backend::Prec;

/// `1 / (1 + e^-x)` in f32.
#[inline]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// `x · sigmoid(x)`.
#[inline]
pub fn silu(x: f32) -> f32 {
    x * sigmoid(x)
}

/// PyTorch's softplus (threshold 20): `x` above 20, else `log(1 + exp(x))` evaluated as
/// written (not `log1p`), in f32.
#[inline]
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 { x } else { (1.0 + x.exp()).ln() }
}

/// `1 / sqrt(mean(x²) + eps)`, the sum of squares accumulated in f64.
#[inline]
pub fn rms_scale(x: &[f32], eps: f32) -> f32 {
    let ss: f64 = x.iter().map(|&v| (v as f64) * (v as f64)).sum();
    let mean = (ss / x.len().max(1) as f64) as f32;
    1.0 / (mean + eps).sqrt()
}

/// Softmax of `x` in place (f32, max-subtracted, sum in f64). An all `-inf` row stays.
pub fn softmax(x: &mut [f32]) {
    let m = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if m == f32::NEG_INFINITY {
        return;
    }
    let mut s = 0f64;
    for v in x.iter_mut() {
        *v = (*v - m).exp();
        s += *v as f64;
    }
    let inv = (1.0 / s) as f32;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// `*RMSNorm` of GLM-5.3 on one row in place: `round(round(x·r)·w)` (unweighted:
/// `round(x·r)`).
pub fn rms_norm_row(x: &mut [f32], w: Option<&[f32]>, eps: f32, p: Prec) {
    let r = rms_scale(x, eps);
    for v in x.iter_mut() {
        *v = p.round(*v * r);
    }
    if let Some(w) = w {
        for (v, w) in x.iter_mut().zip(w) {
            *v = p.round(*v * w);
        }
    }
}

/// PyTorch's f32 sum of a contiguous row (`SumKernel.cpp`, `vectorized_inner_sum` with
/// 8-lane vectors): the row as vectors of 8, grouped by 4 (`row_sum`, `ilp_factor` 4)
/// into four vector accumulators through `multi_row_sum`'s cascade (4 levels, steps of
/// `2^max(4, ⌈log2 n⌉/4)` groups), the leftover vectors into the first, the four added
/// lane-wise in order; then the scalar tail and the 8 lanes added in order to 0.
/// Matches `torch.sum` (2.12, AVX-512 CPU) bit for bit on 2000 random rows of 16 to
/// 256 values.
#[cfg(test)]
pub fn torch_sum(x: &[f32]) -> f32 {
    torch_sum_of(x.len(), |i| x[i])
}

/// [`torch_sum`] of `n` values `f(0) … f(n − 1)` (each computed as the tensor PyTorch
/// sums would hold it). Indexed as the C++ it follows.
#[allow(clippy::needless_range_loop)]
pub fn torch_sum_of(n: usize, f: impl Fn(usize) -> f32) -> f32 {
    const L: usize = 8;
    let nvec = n / L;
    let lanes = |v: usize| -> [f32; L] { std::array::from_fn(|l| f(v * L + l)) };
    let add = |a: &mut [f32; L], b: &[f32; L]| a.iter_mut().zip(b).for_each(|(a, b)| *a += b);
    // row_sum over `nvec` vectors: `size_ilp` groups of 4.
    let size = nvec / 4;
    let mut parts = [[0f32; L]; 4];
    if size > 0 {
        // multi_row_sum::<4 rows>.
        const LEVELS: usize = 4;
        let ceil_log2 = usize::BITS as usize - (size - 1).leading_zeros() as usize;
        let power = 4usize.max(ceil_log2 / LEVELS);
        let step = 1usize << power;
        let mask = step - 1;
        let mut acc = [[[0f32; L]; 4]; LEVELS];
        let mut i = 0;
        while i + step <= size {
            for _ in 0..step {
                for (k, a) in acc[0].iter_mut().enumerate() {
                    add(a, &lanes(i * 4 + k));
                }
                i += 1;
            }
            for j in 1..LEVELS {
                for k in 0..4 {
                    let prev = acc[j - 1][k];
                    add(&mut acc[j][k], &prev);
                    acc[j - 1][k] = [0.0; L];
                }
                if i & (mask << (j * power)) != 0 {
                    break;
                }
            }
        }
        while i < size {
            for (k, a) in acc[0].iter_mut().enumerate() {
                add(a, &lanes(i * 4 + k));
            }
            i += 1;
        }
        for j in 1..LEVELS {
            for k in 0..4 {
                let v = acc[j][k];
                add(&mut acc[0][k], &v);
            }
        }
        parts = acc[0];
    }
    for v in size * 4..nvec {
        add(&mut parts[0], &lanes(v));
    }
    for k in 1..4 {
        let v = parts[k];
        add(&mut parts[0], &v);
    }
    let mut acc = 0f32;
    for i in nvec * L..n {
        acc += f(i);
    }
    for v in parts[0] {
        acc += v;
    }
    acc
}

/// `torch.rsqrt(x.pow(2).mean(-1) + eps)` in f32 as PyTorch computes it: squares
/// rounded, [`torch_sum`], divided by the length, `1 / sqrt`.
pub fn torch_rms_scale(x: &[f32], eps: f32) -> f32 {
    let mean = torch_sum_of(x.len(), |i| x[i] * x[i]) / x.len().max(1) as f32;
    1.0 / (mean + eps).sqrt()
}

/// DeepSeek-V4's RMSNorms on one row in place (see
/// [`crate::backend::Backend::rms_norm_cast_once`]): `round(w·(x·r))`, or unweighted
/// `round(x·round(r))`, `r` from [`torch_rms_scale`] (a bf16 model rounds right after
/// the norm, so the scale follows PyTorch's summation order).
pub fn rms_norm_row_cast_once(x: &mut [f32], w: Option<&[f32]>, eps: f32, p: Prec) {
    let r = torch_rms_scale(x, eps);
    match w {
        Some(w) => {
            for (v, w) in x.iter_mut().zip(w) {
                *v = p.round(w * (*v * r));
            }
        }
        None => {
            let r = p.round(r);
            for v in x.iter_mut() {
                *v = p.round(*v * r);
            }
        }
    }
}

/// `nn.LayerNorm` on one row in place, statistics in f64, the result rounded (PyTorch
/// computes a bf16 LayerNorm in f32 and rounds the output).
pub fn layer_norm_row(x: &mut [f32], w: &[f32], b: &[f32], eps: f32, p: Prec) {
    let n = x.len() as f64;
    let mean = x.iter().map(|&v| v as f64).sum::<f64>() / n;
    let var = x.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n;
    let r = 1.0 / (var + eps as f64).sqrt();
    for ((v, w), b) in x.iter_mut().zip(w).zip(b) {
        *v = p.round((((*v as f64 - mean) * r) as f32) * w + b);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_round_is_to_nearest_even() {
        // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1.0).
        assert_eq!(Prec::Bf16.round(1.0 + 1.0 / 256.0), 1.0);
        assert_eq!(Prec::Bf16.round(1.0 + 3.0 / 256.0), 1.0 + 4.0 / 256.0);
        assert_eq!(Prec::F32.round(1.0 + 1.0 / 256.0), 1.0 + 1.0 / 256.0);
    }

    /// A row of 600 values exercises the cascade (more than 16 groups of 4 vectors), the
    /// leftover vectors and the scalar tail; every order gives the exact sum of these
    /// integers, and small rows are the plain lane order.
    #[test]
    fn torch_sum_adds_everything() {
        let x: Vec<f32> = (0..603).map(|i| ((i * 37) % 101) as f32 - 50.0).collect();
        assert_eq!(torch_sum(&x), x.iter().sum::<f32>());
        let y = [1e8f32, 1.0, -1e8, 1.0, 0.0, 0.0, 0.0, 0.0, 3.0];
        // Lanes (1e8, 1, -1e8, 1, …) in order, then the tail 3 first: ((3 + 1e8) + 1) − 1e8 + 1.
        assert_eq!(torch_sum(&y), ((((3.0f32 + 1e8) + 1.0) - 1e8) + 1.0));
    }

    #[test]
    fn softplus_threshold() {
        assert_eq!(softplus(25.0), 25.0);
        assert!((softplus(0.0) - std::f32::consts::LN_2).abs() < 1e-7);
    }

    #[test]
    fn rms_norm_unit_rows() {
        let mut x = vec![3.0f32, 4.0];
        rms_norm_row(&mut x, Some(&[2.0, 1.0]), 0.0, Prec::F32);
        let r = (12.5f32).sqrt();
        assert!((x[0] - 6.0 / r).abs() < 1e-6 && (x[1] - 4.0 / r).abs() < 1e-6);
    }
}
