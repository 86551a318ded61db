//! The DSA indexer with k-pool compression (`Glm5NextTextIndexer`,
//! `modeling_glm5_next.py` `:773-1061`; doc §6): which cached tokens each query of an
//! MLA layer attends to.
//!
//! Per token `j` the cache holds `k_j = LayerNorm(x_j·wkᵀ)` and `gs_j = x_j·gateᵀ`
//! (`[di]` each). Tokens form pools of `P` from position 0; a complete pool's key is a
//! per-channel softmax-weighted sum `K_p[d] = Σ_s α_{p,s}[d]·k_{pP+s}[d]` with
//! `α = softmax_s(gs + ape)`. A query at position `t` scores every *visible* pool (one
//! whose last token is `≤ t`) with `I(p) = Σ_h w_h·relu(q_h·K_p·di^-½)`, keeps the
//! `Ktop/P` best and adds the tail `[P·⌊(t+1)/P⌋, t]` (the incomplete pool). While at
//! most `Ktop/P` pools are visible the selection is every token `≤ t` (dense).

use std::ops::Range;

use rayon::prelude::*;

use super::ablation::{Ablation, Switches};
use super::linear::{Acts, Linear, dot_f32};
use super::ops::{Prec, layer_norm};
use super::state::IndexerState;

/// One query's attended tokens: sorted, disjoint ranges.
pub type Selection = Vec<Range<usize>>;

/// The indexer of a `full` MLA layer.
pub struct Indexer {
    /// `[Hi·di, rq]`.
    pub wq_b: Linear,
    /// `[di, D]`.
    pub wk: Linear,
    /// LayerNorm weight and bias `[di]`.
    pub k_norm_w: Vec<f32>,
    pub k_norm_b: Vec<f32>,
    /// `[Hi, D]`.
    pub weights_proj: Linear,
    /// `index_kpool_compress_gate [di, D]`.
    pub gate: Linear,
    /// `index_kpool_compress_ape [P, di]`.
    pub ape: Vec<f32>,
}

/// Indexer settings.
#[derive(Clone, Copy)]
pub struct IndexerParams {
    pub heads: usize,
    pub head_dim: usize,
    pub kpool: usize,
    pub topk: usize,
    pub select_tail: bool,
    pub ln_eps: f32,
    pub prec: Prec,
    pub sw: Switches,
}

/// The selection of a query at `t` that attends to every token `≤ t`.
pub fn dense(t: usize) -> Selection {
    std::iter::once(0..t + 1).collect()
}

impl Indexer {
    /// Appends the rows of `x [s, D]` (tokens `pos0..pos0+s`) to `st`, completes the
    /// pooled keys, and returns each query's selection; `q_lat [s, rq]` is MLA's
    /// normalised query latent (`q_resid`).
    pub fn forward(
        &self,
        x: &[f32],
        q_lat: &[f32],
        s: usize,
        pos0: usize,
        st: &mut IndexerState,
        p: &IndexerParams,
    ) -> Vec<Selection> {
        let di = p.head_dim;
        let hi = p.heads;
        let d = self.wk.cols;
        let acts = Acts::new(x, s, d);
        // k = LayerNorm(wk x), gs = gate x, both in the model dtype (packed cache).
        let mut k = vec![0f32; s * di];
        self.wk.forward_acts(&acts, &mut k);
        p.prec.cast(&mut k);
        if !p.sw.on(Ablation::DsaKNormOff) {
            layer_norm(&mut k, &self.k_norm_w, &self.k_norm_b, p.ln_eps, di, p.prec);
        }
        let mut gs = vec![0f32; s * di];
        self.gate.forward_acts(&acts, &mut gs);
        p.prec.cast(&mut gs);
        st.k.extend_from_slice(&k);
        st.gs.extend_from_slice(&gs);
        self.complete_pools(st, pos0 + s, p);
        let n_pools = st.pooled.len() / di;
        let per_q = p.topk / p.kpool;
        // Queries that see more pools than the budget need scores.
        let need_scores = (0..s).any(|i| ((pos0 + i + 1) / p.kpool).min(n_pools) > per_q);
        let (q, w) = if need_scores {
            let mut q = vec![0f32; s * hi * di];
            self.wq_b.forward(q_lat, s, &mut q);
            p.prec.cast(&mut q);
            let mut w = vec![0f32; s * hi];
            self.weights_proj.forward_acts(&acts, &mut w);
            p.prec.cast(&mut w);
            let scale = (hi as f32).powf(-0.5);
            for v in w.iter_mut() {
                *v = if p.sw.on(Ablation::DsaHeadWeightsOnes) {
                    scale
                } else {
                    *v * scale
                };
            }
            (q, w)
        } else {
            (Vec::new(), Vec::new())
        };
        (0..s)
            .into_par_iter()
            .map(|i| {
                let t = pos0 + i;
                let visible = ((t + 1) / p.kpool).min(n_pools);
                let mut pools: Vec<usize> = if visible <= per_q {
                    (0..visible).collect()
                } else {
                    let qi = &q[i * hi * di..(i + 1) * hi * di];
                    let wi = &w[i * hi..(i + 1) * hi];
                    let scores: Vec<f32> = (0..visible)
                        .map(|pp| self.score(qi, wi, &st.pooled[pp * di..(pp + 1) * di], p))
                        .collect();
                    let mut order: Vec<usize> = (0..visible).collect();
                    order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
                    order.truncate(per_q);
                    order.sort_unstable();
                    order
                };
                pools.dedup();
                let mut sel: Selection = Vec::with_capacity(pools.len() + 1);
                for pp in pools {
                    let r = pp * p.kpool..(pp + 1) * p.kpool;
                    match sel.last_mut() {
                        Some(last) if last.end == r.start => last.end = r.end,
                        _ => sel.push(r),
                    }
                }
                if p.select_tail && !p.sw.on(Ablation::DsaNoTail) {
                    let tail = p.kpool * ((t + 1) / p.kpool)..t + 1;
                    if !tail.is_empty() {
                        match sel.last_mut() {
                            Some(last) if last.end == tail.start => last.end = tail.end,
                            _ => sel.push(tail),
                        }
                    }
                }
                sel
            })
            .collect()
    }

    /// `I(p) = Σ_h w_h · relu(q_h · K_p · di^-½)` in f32.
    fn score(&self, q: &[f32], w: &[f32], key: &[f32], p: &IndexerParams) -> f32 {
        let di = p.head_dim;
        let scale = (di as f32).powf(-0.5);
        let mut acc = 0f32;
        for (h, wh) in w.iter().enumerate() {
            let sc = dot_f32(&q[h * di..(h + 1) * di], key) * scale;
            let sc = if p.sw.on(Ablation::DsaReluOff) {
                sc
            } else {
                sc.max(0.0)
            };
            acc += wh * sc;
        }
        acc
    }

    /// Computes the keys of pools completed by the rows now in `st` (`t_len` tokens):
    /// `α = softmax_s(f32(gs) + ape)` per channel (cast to the model dtype), then the
    /// weighted sum of the pool's keys in the model dtype.
    fn complete_pools(&self, st: &mut IndexerState, t_len: usize, p: &IndexerParams) {
        let di = p.head_dim;
        let pl = p.kpool;
        let have = st.pooled.len() / di;
        for pool in have..t_len / pl {
            let mut key = vec![0f32; di];
            let mut logits = vec![0f32; pl];
            for (dd, kv) in key.iter_mut().enumerate() {
                for (sidx, l) in logits.iter_mut().enumerate() {
                    let tok = pool * pl + sidx;
                    let ape = if p.sw.on(Ablation::DsaApeOff) {
                        0.0
                    } else {
                        self.ape[sidx * di + dd]
                    };
                    *l = st.gs[tok * di + dd] + ape;
                }
                if p.sw.on(Ablation::DsaPoolPlainMean) {
                    logits.iter_mut().for_each(|v| *v = 0.0);
                }
                super::ops::softmax(&mut logits);
                let mut acc = 0f32;
                for (sidx, a) in logits.iter().enumerate() {
                    let tok = pool * pl + sidx;
                    acc += p.prec.one(p.prec.one(*a) * st.k[tok * di + dd]);
                }
                *kv = p.prec.one(acc);
            }
            st.pooled.extend_from_slice(&key);
        }
    }
}
