//! Elementwise operations of the `glm5_next` family with the reference's precision
//! rules (doc §2, §10): activations may be rounded to bfloat16 at the reference's cast
//! points ([`Prec::cast`]), normalisations compute in f32 and cast back, and the
//! scalar functions (sigmoid, SiLU, softplus) are evaluated in f32.

use half::bf16;

use super::config::Dtype;

/// The model dtype's rounding: a no-op for f32, round-to-nearest-even to bfloat16
/// otherwise (what `tensor.to(torch.bfloat16)` does).
#[derive(Debug, Clone, Copy)]
pub struct Prec(pub Dtype);

impl Prec {
    /// Rounds every value to the model dtype.
    #[inline]
    pub fn cast(self, v: &mut [f32]) {
        if self.0 == Dtype::Bf16 {
            for x in v {
                *x = bf16::from_f32(*x).to_f32();
            }
        }
    }

    /// One value rounded to the model dtype.
    #[inline]
    pub fn one(self, x: f32) -> f32 {
        if self.0 == Dtype::Bf16 {
            bf16::from_f32(x).to_f32()
        } else {
            x
        }
    }

    /// Whether activations are bf16.
    pub fn is_bf16(self) -> bool {
        self.0 == Dtype::Bf16
    }
}

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

/// The reference's softplus (`Glm5NextTextForgetGate`, `:364`): `x` above 20, else
/// `log(1 + exp(x))` evaluated as written (not `log1p`), in f32.
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

/// `Glm5NextTextRMSNorm` on every row of `x` (rows of `w.len()`), in place:
/// `x ← w ⊙ cast(x · rsqrt(mean(x²) + eps))`, then cast (the product of two model-dtype
/// tensors). `w = None` is the unweighted norm.
pub fn rms_norm(x: &mut [f32], w: Option<&[f32]>, eps: f32, cols: usize, p: Prec) {
    for row in x.chunks_exact_mut(cols) {
        let r = rms_scale(row, eps);
        for v in row.iter_mut() {
            *v = p.one(*v * r);
        }
        if let Some(w) = w {
            for (v, w) in row.iter_mut().zip(w) {
                *v = p.one(*v * w);
            }
        }
    }
}

/// `nn.LayerNorm` (weight, bias, eps) on every row, in place, statistics in f64, the
/// result cast to the model dtype (PyTorch computes a bf16 LayerNorm in f32 and rounds
/// the output).
pub fn layer_norm(x: &mut [f32], w: &[f32], b: &[f32], eps: f32, cols: usize, p: Prec) {
    for row in x.chunks_exact_mut(cols) {
        let n = row.len() as f64;
        let mean = row.iter().map(|&v| v as f64).sum::<f64>() / n;
        let var = row.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n;
        let r = 1.0 / (var + eps as f64).sqrt();
        for ((v, w), b) in row.iter_mut().zip(w).zip(b) {
            *v = p.one((((*v as f64 - mean) * r) as f32) * w + b);
        }
    }
}

/// Softmax of `x` in place (f32, max-subtracted, sum in f64).
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_cast_rounds_to_nearest_even() {
        let p = Prec(Dtype::Bf16);
        // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1.0).
        assert_eq!(p.one(1.0 + 1.0 / 256.0), 1.0);
        assert_eq!(p.one(1.0 + 3.0 / 256.0), 1.0 + 4.0 / 256.0);
        assert_eq!(Prec(Dtype::F32).one(1.0 + 1.0 / 256.0), 1.0 + 1.0 / 256.0);
    }

    #[test]
    fn softplus_threshold() {
        assert_eq!(softplus(25.0), 25.0);
        assert!((softplus(0.0) - std::f32::consts::LN_2).abs() < 1e-7);
    }

    #[test]
    fn rms_norm_unit_rows() {
        let mut x = vec![3.0f32, 4.0];
        rms_norm(&mut x, Some(&[2.0, 1.0]), 0.0, 2, Prec(Dtype::F32));
        let r = (12.5f32).sqrt();
        assert!((x[0] - 6.0 / r).abs() < 1e-6 && (x[1] - 4.0 / r).abs() < 1e-6);
    }
}
