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
