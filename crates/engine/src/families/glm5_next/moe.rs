//! The dense MLP (`Glm5NextTextMLP`, `:85-103`), the router
//! (`Glm5NextTextTopkRouter`, `:144-182`) and the MoE with its shared expert
//! (`Glm5NextTextMoE`, `:185-206`); doc §7.
//!
//! SwiGLU with clamp: `gate = min(x·W_gᵀ, lim)`, `up = clamp(x·W_uᵀ, −lim, lim)`,
//! `y = (silu(gate)⊙up)·W_dᵀ`. Router, all f32: `s = sigmoid(x·W_rᵀ)`, choice scores
//! `s + bias`; with `n_group > 1` each group is scored by the sum of its two best
//! choice scores and only the `topk_group` best groups stay; the top-`k` experts by
//! choice score are weighted by their *unbiased* `s`, renormalised when
//! `norm_topk_prob` (`/(Σ + 1e-20)`), times `routed_scaling_factor`. Experts' outputs
//! (model dtype) are weighted and summed in f32, cast once, then the shared expert's
//! output is added (the reference's default `grouped_mm` path).

use super::ablation::{Ablation, Switches};
use super::linear::{Acts, Linear};
use super::ops::{Prec, sigmoid, silu};

/// A SwiGLU MLP: the dense layers' MLP and the shared expert.
pub struct Mlp {
    pub gate: Linear,
    pub up: Linear,
    pub down: Linear,
}

/// The MoE block.
pub struct Moe {
    /// Router weight `[E, D]`.
    pub router: Linear,
    /// `e_score_correction_bias [E]`, f32.
    pub bias: Vec<f32>,
    /// Per expert: gate and up `[I, D]`, down `[D, I]`.
    pub gate_exps: Vec<Linear>,
    pub up_exps: Vec<Linear>,
    pub down_exps: Vec<Linear>,
    pub shared: Mlp,
}

/// MoE settings.
#[derive(Clone, Copy)]
pub struct MoeParams {
    pub n_used: usize,
    pub n_group: usize,
    pub topk_group: usize,
    pub norm_topk_prob: bool,
    pub routed_scale: f32,
    pub limit_exp: f32,
    pub limit_shexp: f32,
    pub prec: Prec,
    pub sw: Switches,
}

/// The SwiGLU activation with the reference's clamp, in place over `gate` (result) and
/// `up`, cast as the reference's model-dtype ops round.
fn swiglu(gate: &mut [f32], up: &[f32], limit: f32, p: Prec, sw: Switches) {
    let lim = if sw.on(Ablation::SwigluClampOff) {
        f32::INFINITY
    } else {
        limit
    };
    for (g, u) in gate.iter_mut().zip(up) {
        let mut gv = g.min(lim);
        if sw.on(Ablation::SwigluGateClampedBelow) {
            gv = gv.max(-lim);
        }
        let uv = u.clamp(-lim, lim);
        *g = p.one(p.one(silu(gv)) * uv);
    }
}

impl Mlp {
    /// `y [s, D]` for `x [s, D]`.
    pub fn forward(&self, acts: &Acts, limit: f32, p: Prec, sw: Switches) -> Vec<f32> {
        swiglu_mlp([&self.gate, &self.up, &self.down], acts, limit, p, sw)
    }
}

/// The clamped SwiGLU MLP of weights `[gate, up, down]` on `acts`.
fn swiglu_mlp(w: [&Linear; 3], acts: &Acts, limit: f32, p: Prec, sw: Switches) -> Vec<f32> {
    let [gate, up, down] = w;
    let s = acts.n;
    let ff = gate.rows;
    let mut g = vec![0f32; s * ff];
    let mut u = vec![0f32; s * ff];
    gate.forward_acts(acts, &mut g);
    up.forward_acts(acts, &mut u);
    p.cast(&mut g);
    p.cast(&mut u);
    swiglu(&mut g, &u, limit, p, sw);
    let mut y = vec![0f32; s * down.rows];
    down.forward(&g, s, &mut y);
    p.cast(&mut y);
    y
}

impl Moe {
    /// The experts chosen for one token and their weights (doc §7.2).
    pub fn route(&self, logits: &[f32], p: &MoeParams) -> Vec<(usize, f32)> {
        let e = logits.len();
        let scores: Vec<f32> = logits.iter().map(|&l| sigmoid(l)).collect();
        let bias_off = p.sw.on(Ablation::MoeBiasOff);
        let mut choice: Vec<f32> = scores
            .iter()
            .zip(&self.bias)
            .map(|(s, b)| if bias_off { *s } else { s + b })
            .collect();
        if p.n_group > 1 && !p.sw.on(Ablation::MoeGroupsOff) {
            let per = e / p.n_group;
            let mut gscore: Vec<(usize, f32)> = (0..p.n_group)
                .map(|g| {
                    let mut v: Vec<f32> = choice[g * per..(g + 1) * per].to_vec();
                    v.sort_by(|a, b| b.total_cmp(a));
                    (g, v[0] + v[1])
                })
                .collect();
            gscore.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            let keep: Vec<usize> = gscore[..p.topk_group].iter().map(|x| x.0).collect();
            for (g, chunk) in choice.chunks_mut(per).enumerate() {
                if !keep.contains(&g) {
                    chunk.iter_mut().for_each(|v| *v = f32::NEG_INFINITY);
                }
            }
        }
        let mut idx: Vec<usize> = (0..e).collect();
        idx.sort_by(|&a, &b| choice[b].total_cmp(&choice[a]).then(a.cmp(&b)));
        idx.truncate(p.n_used);
        let mut w: Vec<f32> = idx
            .iter()
            .map(|&i| {
                if p.sw.on(Ablation::MoeWeightsWithBias) {
                    scores[i] + self.bias[i]
                } else {
                    scores[i]
                }
            })
            .collect();
        if p.norm_topk_prob != p.sw.on(Ablation::MoeRenormFlipped) {
            let sum: f32 = w.iter().sum::<f32>() + 1e-20;
            w.iter_mut().for_each(|v| *v /= sum);
        }
        let scale = if p.sw.on(Ablation::MoeRoutedScaling1) {
            1.0
        } else {
            p.routed_scale
        };
        idx.into_iter()
            .zip(w)
            .map(|(i, w)| (i, w * scale))
            .collect()
    }

    /// `y [s, D]` for `x [s, D]`.
    pub fn forward(&self, x: &[f32], s: usize, p: &MoeParams) -> Vec<f32> {
        let d = self.router.cols;
        let e = self.router.rows;
        let acts = Acts::new(x, s, d);
        let mut logits = vec![0f32; s * e];
        self.router.forward_acts(&acts, &mut logits);
        // Per expert, the tokens (and their weights) routed to it.
        let mut per_expert: Vec<Vec<(usize, f32)>> = vec![Vec::new(); e];
        for t in 0..s {
            for (ex, w) in self.route(&logits[t * e..(t + 1) * e], p) {
                per_expert[ex].push((t, w));
            }
        }
        let mut acc = vec![0f32; s * d];
        for (ex, toks) in per_expert.iter().enumerate() {
            if toks.is_empty() {
                continue;
            }
            let m = toks.len();
            let mut xs = Vec::with_capacity(m * d);
            for &(t, _) in toks {
                xs.extend_from_slice(&x[t * d..(t + 1) * d]);
            }
            let ex_acts = Acts::new(&xs, m, d);
            let w = [&self.gate_exps[ex], &self.up_exps[ex], &self.down_exps[ex]];
            let y = swiglu_mlp(w, &ex_acts, p.limit_exp, p.prec, p.sw);
            for (r, &(t, w)) in toks.iter().enumerate() {
                for (a, v) in acc[t * d..(t + 1) * d]
                    .iter_mut()
                    .zip(&y[r * d..(r + 1) * d])
                {
                    *a += v * w;
                }
            }
        }
        p.prec.cast(&mut acc);
        if !p.sw.on(Ablation::MoeSharedExpertOff) {
            let sh = self.shared.forward(&acts, p.limit_shexp, p.prec, p.sw);
            for (a, v) in acc.iter_mut().zip(&sh) {
                *a = p.prec.one(*a + v);
            }
        }
        acc
    }
}
