//! Manifold hyper-connections on the CPU ([`crate::backend::Backend::hc_pre`],
//! [`hc_post`](crate::backend::Backend::hc_post), [`hc_head`](crate::backend::Backend::hc_head)),
//! following `Glm5NextTextHyperConnection` / `DeepseekV4HyperConnection` (`pre`, `post`,
//! Sinkhorn-normalised `comb`) and the final collapses `Glm5NextTextHyperHead` (mean)
//! and `DeepseekV4HyperHead` (learned `pre`).
//!
//! The residual stream is `N` streams per token, `x [rows, N, D]`. Everything up to
//! the collapse is an f32 island; the collapse and the mixing are rounded to the model
//! dtype.

use super::CpuBackend;
use super::torch_math::{rms_scale, sigmoid, softmax};
use super::weight::CpuWeight;
use crate::Result;
use crate::backend::{HcShape, HcWeights, Prec};

/// `m = fn · rms(x)` per token: `[rows, fn.rows]` (f32 island).
fn mixes(b: &CpuBackend, x: &[f32], rows: usize, fn_: &CpuWeight, s: &HcShape) -> Vec<f32> {
    let nd = s.n * s.d;
    let mut xn = x[..rows * nd].to_vec();
    if !crate::ablated!(b, HcInputNormOff) {
        for row in xn.chunks_exact_mut(nd) {
            let r = rms_scale(row, s.norm_eps);
            row.iter_mut().for_each(|v| *v *= r);
        }
    }
    let mut m = vec![0f32; rows * fn_.rows];
    fn_.matrix(0).forward_upcast(&xn, rows, &mut m);
    m
}

/// Sinkhorn normalisation of `c [n, n]` in place: softmax over each row plus `eps`, a
/// column normalisation, then `iters − 1` (row, column) normalisations, every
/// denominator `sum + eps`.
pub fn sinkhorn(c: &mut [f32], n: usize, iters: usize, eps: f32) {
    for row in c.chunks_exact_mut(n) {
        softmax(row);
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

/// `round(Σₙ preₙ · x[n])` of one token's streams `xt [N, D]` into `out [D]`.
fn collapse(pre: &[f32], xt: &[f32], d: usize, p: Prec, out: &mut [f32]) {
    for (k, o) in out.iter_mut().enumerate() {
        let mut acc = 0f32;
        for (i, pi) in pre.iter().enumerate() {
            acc += pi * xt[i * d + k];
        }
        *o = p.round(acc);
    }
}

/// See [`crate::backend::Backend::hc_pre`].
#[allow(clippy::too_many_arguments)]
pub fn pre(
    b: &CpuBackend,
    x: &[f32],
    rows: usize,
    w: &HcWeights<'_, CpuWeight>,
    s: &HcShape,
    p: Prec,
    out: &mut [f32],
    mix: &mut [f32],
) -> Result<()> {
    let (n, d) = (s.n, s.d);
    let nd = n * d;
    let m_dim = (2 + n) * n;
    let base = w.base.expect_len(m_dim, "hc_pre base")?;
    let scale = w.scale.expect_len(3, "hc_pre scale")?;
    let m = mixes(b, x, rows, w.fn_, s);
    let ml = s.mix_len();
    for t in 0..rows {
        let mt = &m[t * m_dim..(t + 1) * m_dim];
        let mut pre: Vec<f32> = (0..n)
            .map(|i| sigmoid(mt[i] * scale[0] + base[i]) + s.eps)
            .collect();
        if crate::ablated!(b, HcPreMean) {
            pre.iter_mut().for_each(|v| *v = 1.0 / n as f32);
        }
        let mix_t = &mut mix[t * ml..(t + 1) * ml];
        for i in 0..n {
            let post = if crate::ablated!(b, HcPostOnes) {
                1.0
            } else {
                2.0 * sigmoid(mt[n + i] * scale[1] + base[n + i])
            };
            mix_t[i] = p.round(post);
        }
        let c = &mut mix_t[n..];
        for (k, cv) in c.iter_mut().enumerate() {
            *cv = mt[2 * n + k] * scale[2] + base[2 * n + k];
        }
        sinkhorn(c, n, s.iters, s.eps);
        p.round_all(c);
        collapse(
            &pre,
            &x[t * nd..(t + 1) * nd],
            d,
            p,
            &mut out[t * d..(t + 1) * d],
        );
    }
    Ok(())
}

/// See [`crate::backend::Backend::hc_post`].
pub fn post(
    b: &CpuBackend,
    x: &mut [f32],
    y: &[f32],
    mix: &[f32],
    rows: usize,
    s: &HcShape,
    p: Prec,
) {
    let (n, d) = (s.n, s.d);
    let ml = s.mix_len();
    let transposed = crate::ablated!(b, HcCombTransposed);
    let mut old = vec![0f32; n * d];
    for t in 0..rows {
        let (post, comb) = mix[t * ml..(t + 1) * ml].split_at(n);
        let xt = &mut x[t * n * d..(t + 1) * n * d];
        old.copy_from_slice(xt);
        let yt = &y[t * d..(t + 1) * d];
        for j in 0..n {
            for k in 0..d {
                let mut acc = 0f32;
                for i in 0..n {
                    let c = if transposed {
                        comb[j * n + i]
                    } else {
                        comb[i * n + j]
                    };
                    acc += c * old[i * d + k];
                }
                let a = p.round(post[j] * yt[k]);
                xt[j * d + k] = p.round(a + p.round(acc));
            }
        }
    }
}

/// See [`crate::backend::Backend::hc_head`].
pub fn head(
    b: &CpuBackend,
    x: &[f32],
    rows: usize,
    w: Option<&HcWeights<'_, CpuWeight>>,
    s: &HcShape,
    p: Prec,
    out: &mut [f32],
) -> Result<()> {
    let (n, d) = (s.n, s.d);
    let nd = n * d;
    match w {
        None => {
            for t in 0..rows {
                let xt = &x[t * nd..(t + 1) * nd];
                for k in 0..d {
                    out[t * d + k] = if crate::ablated!(b, HcHeadFirstStream) {
                        xt[k]
                    } else {
                        p.round((0..n).map(|i| xt[i * d + k]).sum::<f32>() / n as f32)
                    };
                }
            }
        }
        Some(w) => {
            let base = w.base.expect_len(n, "hc_head base")?;
            let scale = w.scale.expect_len(1, "hc_head scale")?;
            let m = mixes(b, x, rows, w.fn_, s);
            for t in 0..rows {
                let pre: Vec<f32> = (0..n)
                    .map(|i| sigmoid(m[t * n + i] * scale[0] + base[i]) + s.eps)
                    .collect();
                collapse(
                    &pre,
                    &x[t * nd..(t + 1) * nd],
                    d,
                    p,
                    &mut out[t * d..(t + 1) * d],
                );
            }
        }
    }
    Ok(())
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
