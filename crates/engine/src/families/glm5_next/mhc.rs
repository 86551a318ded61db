//! Manifold hyper-connections (`Glm5NextTextHyperConnection`, `modeling_glm5_next.py`
//! `:218-329`; doc §3) and the final stream collapse (`Glm5NextTextHyperHead`,
//! `:332-336`).
//!
//! The residual stream is `N = hc_mult` streams per token, `X [S, N, D]` (stream-major
//! within a token). Each decoder sub-block reads a weighted collapse of the streams
//! ([`HyperConnection::pre`]) and writes back `X'[j] = post[j]·y + Σᵢ C[i][j]·X[i]`
//! ([`HyperConnection::post`]). `C` is Sinkhorn-normalised: row softmax (+eps), one
//! column normalisation, then `iters − 1` (row, column) pairs. Everything up to the
//! collapse is an f32 island; the collapse and the mixing are cast to the model dtype.

use super::ablation::{Ablation, Switches};
use super::linear::Linear;
use super::ops::{Prec, rms_scale, sigmoid};

/// One hyper-connection's parameters: `fn [(2+N)·N, N·D]`, `base [(2+N)·N]`,
/// `scale [3]` (the latter two kept in f32 by the reference).
pub struct HyperConnection {
    pub fn_: Linear,
    pub base: Vec<f32>,
    pub scale: [f32; 3],
}

/// The mixing weights of one token: `post [N]`, `comb [N, N]` (row `i`, column `j`).
pub struct Mix {
    pub post: Vec<f32>,
    pub comb: Vec<f32>,
}

/// Settings shared by every hyper-connection.
#[derive(Clone, Copy)]
pub struct HcParams {
    pub n: usize,
    pub d: usize,
    pub iters: usize,
    pub eps: f32,
    pub rms_eps: f32,
    pub prec: Prec,
    pub sw: Switches,
}

impl HyperConnection {
    /// For `s` tokens of streams `x [s, N, D]`: the collapsed input of the sub-block
    /// `[s, D]` (cast to the model dtype) and each token's mixing weights.
    pub fn pre(&self, x: &[f32], s: usize, p: &HcParams) -> (Vec<f32>, Vec<Mix>) {
        let (n, d) = (p.n, p.d);
        let nd = n * d;
        let m_dim = (2 + n) * n;
        // xn = xf · rsqrt(mean(xf²) + rms_eps)   (Glm5NextTextUnweightedRMSNorm, :209-215)
        let mut xn = x[..s * nd].to_vec();
        if !p.sw.on(Ablation::HcInputNormOff) {
            for row in xn.chunks_exact_mut(nd) {
                let r = rms_scale(row, p.rms_eps);
                row.iter_mut().for_each(|v| *v *= r);
            }
        }
        // m = fn₃₂ · xn, with the upcast weight and f32 activations.
        let mut m = vec![0f32; s * m_dim];
        self.fn_.forward_exact(&xn, s, &mut m);
        let eps = if p.sw.on(Ablation::HcEps0) {
            0.0
        } else {
            p.eps
        };
        let iters = if p.sw.on(Ablation::HcSinkhorn1) {
            1
        } else if p.sw.on(Ablation::HcSinkhorn19) {
            p.iters.saturating_sub(1).max(1)
        } else {
            p.iters
        };
        let mut collapsed = vec![0f32; s * d];
        let mut mixes = Vec::with_capacity(s);
        for t in 0..s {
            let mt = &m[t * m_dim..(t + 1) * m_dim];
            let mut pre: Vec<f32> = (0..n)
                .map(|i| sigmoid(mt[i] * self.scale[0] + self.base[i]) + eps)
                .collect();
            if p.sw.on(Ablation::HcPreMean) {
                pre.iter_mut().for_each(|v| *v = 1.0 / n as f32);
            }
            let mut post: Vec<f32> = (0..n)
                .map(|i| 2.0 * sigmoid(mt[n + i] * self.scale[1] + self.base[n + i]))
                .collect();
            if p.sw.on(Ablation::HcPostOnes) {
                post.iter_mut().for_each(|v| *v = 1.0);
            }
            let mut c: Vec<f32> = (0..n * n)
                .map(|k| mt[2 * n + k] * self.scale[2] + self.base[2 * n + k])
                .collect();
            sinkhorn(&mut c, n, iters, eps);
            // x = Σₙ pre[n] · X[n] in f32, cast to the model dtype.
            let xt = &x[t * nd..(t + 1) * nd];
            let out = &mut collapsed[t * d..(t + 1) * d];
            for (k, o) in out.iter_mut().enumerate() {
                let mut acc = 0f32;
                for (i, pi) in pre.iter().enumerate() {
                    acc += pi * xt[i * d + k];
                }
                *o = p.prec.one(acc);
            }
            p.prec.cast(&mut post);
            p.prec.cast(&mut c);
            mixes.push(Mix { post, comb: c });
        }
        (collapsed, mixes)
    }

    /// Writes back the sub-block output `y [s, D]`: `X[j] ← post[j]·y + Σᵢ C[i][j]·X[i]`
    /// (doc §3, `:1336`; note the transpose: stream `j` takes column `j`).
    pub fn post(x: &mut [f32], y: &[f32], mixes: &[Mix], p: &HcParams) {
        let (n, d) = (p.n, p.d);
        let transposed = p.sw.on(Ablation::HcCombTransposed);
        let mut old = vec![0f32; n * d];
        for (t, mix) in mixes.iter().enumerate() {
            let xt = &mut x[t * n * d..(t + 1) * n * d];
            old.copy_from_slice(xt);
            let yt = &y[t * d..(t + 1) * d];
            for j in 0..n {
                for k in 0..d {
                    let mut acc = 0f32;
                    for i in 0..n {
                        let c = if transposed {
                            mix.comb[j * n + i]
                        } else {
                            mix.comb[i * n + j]
                        };
                        acc += c * old[i * d + k];
                    }
                    let a = p.prec.one(mix.post[j] * yt[k]);
                    xt[j * d + k] = p.prec.one(a + p.prec.one(acc));
                }
            }
        }
    }
}

/// Sinkhorn normalisation of `c [n, n]` in place (doc §3): softmax over each row plus
/// `eps`, a column normalisation, then `iters − 1` (row, column) normalisations, every
/// denominator `sum + eps`.
pub fn sinkhorn(c: &mut [f32], n: usize, iters: usize, eps: f32) {
    for row in c.chunks_exact_mut(n) {
        super::ops::softmax(row);
        row.iter_mut().for_each(|v| *v += eps);
    }
    let cols = |c: &mut [f32]| {
        for j in 0..n {
            let s: f32 = (0..n).map(|i| c[i * n + j]).sum::<f32>() + eps;
            for i in 0..n {
                c[i * n + j] /= s;
            }
        }
    };
    cols(c);
    for _ in 1..iters {
        for row in c.chunks_exact_mut(n) {
            let s: f32 = row.iter().sum::<f32>() + eps;
            row.iter_mut().for_each(|v| *v /= s);
        }
        cols(c);
    }
}

/// The final collapse: the unweighted mean of the streams `[s, N, D] → [s, D]`, in the
/// model dtype (or stream 0 under [`Ablation::HcHeadFirstStream`]).
pub fn head(x: &[f32], s: usize, p: &HcParams) -> Vec<f32> {
    let (n, d) = (p.n, p.d);
    let mut out = vec![0f32; s * d];
    for t in 0..s {
        let xt = &x[t * n * d..(t + 1) * n * d];
        for k in 0..d {
            out[t * d + k] = if p.sw.on(Ablation::HcHeadFirstStream) {
                xt[k]
            } else {
                p.prec
                    .one((0..n).map(|i| xt[i * d + k]).sum::<f32>() / n as f32)
            };
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sinkhorn_converges_to_doubly_stochastic() {
        let mut c: Vec<f32> = (0..16).map(|k| ((k * 7 % 5) as f32) * 0.3 - 0.5).collect();
        sinkhorn(&mut c, 4, 20, 1e-6);
        for i in 0..4 {
            let row: f32 = (0..4).map(|j| c[i * 4 + j]).sum();
            let col: f32 = (0..4).map(|j| c[j * 4 + i]).sum();
            assert!((row - 1.0).abs() < 1e-3, "row {i}: {row}");
            assert!((col - 1.0).abs() < 1e-5, "col {i}: {col}");
        }
    }
}
