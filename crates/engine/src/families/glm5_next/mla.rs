//! Multi-head latent attention without RoPE (`Glm5NextTextAttention`,
//! `modeling_glm5_next.py` `:1100-1276`; doc §5), over the tokens the DSA indexer
//! selects.
//!
//! ```text
//! q_lat = RMSNorm_qa(x·q_aᵀ)                 [S, rq]   (also the indexer's q input)
//! q     = q_lat·q_bᵀ                         [S, Ha, dn]
//! c     = RMSNorm_kva(x·kv_aᵀ)               [S, rkv]  appended to the latent cache
//! per head h and query t over its selected tokens j:
//!   score_j = (W_k,h c_j)·q_h · dn^-½ ,  out_h = softmax(score)·(W_v,h c_j)
//! ```
//!
//! The reference expands `kv_b_proj` over the whole cache; we absorb it instead (the
//! same math, doc §5): `q̃_h = W_k,hᵀ q_h` (`attn_k_b` per head `[rkv, dn]`), scores
//! `q̃_h·c_j`, context `Σ_j p_j c_j`, then `W_v,h` (`attn_v_b` per head `[dv, rkv]`).

use rayon::prelude::*;

use super::ablation::{Ablation, Switches};
use super::indexer::{Indexer, IndexerParams, Selection, dense};
use super::linear::{Acts, Linear, dot_f32};
use super::ops::{Prec, rms_norm};
use super::state::MlaLayer;

/// One MLA layer's parameters.
pub struct Attention {
    pub q_a_proj: Linear,
    pub q_a_norm: Vec<f32>,
    pub q_b_proj: Linear,
    pub kv_a_proj: Linear,
    pub kv_a_norm: Vec<f32>,
    /// Per head `[rkv, dn]`: `k_b[h][c][d] = kv_b_proj[h·(dn+dv) + d][c]`.
    pub k_b: Vec<Linear>,
    /// Per head `[dv, rkv]`: `v_b[h][e][c] = kv_b_proj[h·(dn+dv) + dn + e][c]`.
    pub v_b: Vec<Linear>,
    pub o_proj: Linear,
    /// `Some` for a `full` layer.
    pub indexer: Option<Indexer>,
}

/// MLA settings.
#[derive(Clone, Copy)]
pub struct MlaParams {
    pub heads: usize,
    pub qk_nope_dim: usize,
    pub v_head_dim: usize,
    pub kv_lora_rank: usize,
    pub rms_eps: f32,
    pub prec: Prec,
    pub sw: Switches,
    pub index: IndexerParams,
}

impl Attention {
    /// Runs the layer on `x [s, D]` at positions `pos0..`, appending to `st`. A `shared`
    /// layer takes the previous layer's selections in `prev`. Returns the output
    /// `[s, D]` and this layer's selections.
    pub fn forward(
        &self,
        x: &[f32],
        s: usize,
        pos0: usize,
        st: &mut MlaLayer,
        prev: Option<&[Selection]>,
        p: &MlaParams,
    ) -> (Vec<f32>, Vec<Selection>) {
        let (ha, dn, rkv) = (p.heads, p.qk_nope_dim, p.kv_lora_rank);
        let d = self.q_a_proj.cols;
        let rq = self.q_a_proj.rows;
        let acts = Acts::new(x, s, d);
        let mut q_lat = vec![0f32; s * rq];
        self.q_a_proj.forward_acts(&acts, &mut q_lat);
        p.prec.cast(&mut q_lat);
        if !p.sw.on(Ablation::MlaQANormOff) {
            rms_norm(&mut q_lat, Some(&self.q_a_norm), p.rms_eps, rq, p.prec);
        }
        let mut q = vec![0f32; s * ha * dn];
        self.q_b_proj.forward(&q_lat, s, &mut q);
        p.prec.cast(&mut q);
        let mut c = vec![0f32; s * rkv];
        self.kv_a_proj.forward_acts(&acts, &mut c);
        p.prec.cast(&mut c);
        if !p.sw.on(Ablation::MlaKvANormOff) {
            rms_norm(&mut c, Some(&self.kv_a_norm), p.rms_eps, rkv, p.prec);
        }
        st.latent.extend_from_slice(&c);
        // Token selections (doc §6).
        let full = self.indexer.is_some();
        let sel: Vec<Selection> = match (&self.indexer, prev) {
            _ if p.sw.on(Ablation::DsaDense) || (!full && p.sw.on(Ablation::DsaSharedDense)) => {
                if let (Some(ix), Some(ist)) = (&self.indexer, st.indexer.as_mut()) {
                    ix.forward(x, &q_lat, s, pos0, ist, &p.index);
                }
                (0..s).map(|i| dense(pos0 + i)).collect()
            }
            (Some(ix), _) => {
                let ist = st.indexer.get_or_insert_with(Default::default);
                ix.forward(x, &q_lat, s, pos0, ist, &p.index)
            }
            (None, Some(prev)) => prev.to_vec(),
            (None, None) => (0..s).map(|i| dense(pos0 + i)).collect(),
        };
        let mut o = if p.prec.is_bf16() {
            self.attend_expanded(&q, &st.latent, &sel, s, p)
        } else {
            self.attend_absorbed(&q, &st.latent, &sel, s, p)
        };
        p.prec.cast(&mut o);
        let mut y = vec![0f32; s * d];
        self.o_proj.forward(&o, s, &mut y);
        p.prec.cast(&mut y);
        (y, sel)
    }

    /// Attention with `kv_b_proj` absorbed (see the module header): `[s, Ha·dv]`.
    fn attend_absorbed(
        &self,
        q: &[f32],
        latent: &[f32],
        sel: &[Selection],
        s: usize,
        p: &MlaParams,
    ) -> Vec<f32> {
        let (ha, dn, dv, rkv) = (p.heads, p.qk_nope_dim, p.v_head_dim, p.kv_lora_rank);
        // Absorbed queries q̃ [s, Ha, rkv].
        let mut qt = vec![0f32; s * ha * rkv];
        {
            let mut qh = vec![0f32; s * dn];
            let mut out = vec![0f32; s * rkv];
            for h in 0..ha {
                for t in 0..s {
                    qh[t * dn..(t + 1) * dn]
                        .copy_from_slice(&q[(t * ha + h) * dn..(t * ha + h + 1) * dn]);
                }
                self.k_b[h].forward(&qh, s, &mut out);
                for t in 0..s {
                    qt[(t * ha + h) * rkv..(t * ha + h + 1) * rkv]
                        .copy_from_slice(&out[t * rkv..(t + 1) * rkv]);
                }
            }
        }
        let scale_dim = if p.sw.on(Ablation::MlaScaleVHeadDim) {
            dv
        } else {
            dn
        };
        let scale = (scale_dim as f32).powf(-0.5);
        // Context per (token, head): Σ_j softmax(q̃·c_j·scale)_j c_j.
        let mut ctx = vec![0f32; s * ha * rkv];
        ctx.par_chunks_mut(rkv).enumerate().for_each(|(th, out)| {
            let t = th / ha;
            let qv = &qt[th * rkv..(th + 1) * rkv];
            let toks: Vec<usize> = sel[t].iter().flat_map(|r| r.clone()).collect();
            if toks.is_empty() {
                return;
            }
            let mut sc: Vec<f32> = toks
                .iter()
                .map(|&j| dot_f32(qv, &latent[j * rkv..(j + 1) * rkv]) * scale)
                .collect();
            super::ops::softmax(&mut sc);
            for (&j, w) in toks.iter().zip(&sc) {
                for (o, cv) in out.iter_mut().zip(&latent[j * rkv..(j + 1) * rkv]) {
                    *o += w * cv;
                }
            }
        });
        // out_h = W_v,h · ctx_h  → [s, Ha·dv]
        let mut o = vec![0f32; s * ha * dv];
        {
            let mut ch = vec![0f32; s * rkv];
            let mut out = vec![0f32; s * dv];
            for h in 0..ha {
                for t in 0..s {
                    ch[t * rkv..(t + 1) * rkv]
                        .copy_from_slice(&ctx[(t * ha + h) * rkv..(t * ha + h + 1) * rkv]);
                }
                self.v_b[h].forward(&ch, s, &mut out);
                for t in 0..s {
                    o[(t * ha + h) * dv..(t * ha + h + 1) * dv]
                        .copy_from_slice(&out[t * dv..(t + 1) * dv]);
                }
            }
        }
        o
    }

    /// The reference's bf16 arithmetic (doc §10): keys and values expanded from the
    /// latents by the bf16 `kv_b_proj` (rounded), then PyTorch's SDPA math path, which
    /// upcasts bf16 inputs to f32 (scores, softmax, weighted sum in f32) and rounds the
    /// output once; this reproduces the fixtures' bf16 attention outputs bit for bit.
    /// Used only by bf16 models, whose CPU use is parity testing: it expands every
    /// cached latent per call.
    fn attend_expanded(
        &self,
        q: &[f32],
        latent: &[f32],
        sel: &[Selection],
        s: usize,
        p: &MlaParams,
    ) -> Vec<f32> {
        let (ha, dn, dv, rkv) = (p.heads, p.qk_nope_dim, p.v_head_dim, p.kv_lora_rank);
        let t_len = latent.len() / rkv;
        // k[j][h] = bf16(W_k,h c_j) with W_k,h = k_b[h]ᵀ, v[j][h] = bf16(W_v,h c_j).
        let mut k = vec![0f32; t_len * ha * dn];
        let mut v = vec![0f32; t_len * ha * dv];
        for h in 0..ha {
            let kb = self.k_b[h].to_f32();
            let mut vh = vec![0f32; t_len * dv];
            self.v_b[h].forward_exact(latent, t_len, &mut vh);
            for j in 0..t_len {
                let c = &latent[j * rkv..(j + 1) * rkv];
                for d in 0..dn {
                    let acc: f32 = (0..rkv).map(|cc| kb[cc * dn + d] * c[cc]).sum();
                    k[(j * ha + h) * dn + d] = p.prec.one(acc);
                }
                for e in 0..dv {
                    v[(j * ha + h) * dv + e] = p.prec.one(vh[j * dv + e]);
                }
            }
        }
        let scale_dim = if p.sw.on(Ablation::MlaScaleVHeadDim) {
            dv
        } else {
            dn
        };
        let scale = (scale_dim as f32).powf(-0.5);
        let mut o = vec![0f32; s * ha * dv];
        o.par_chunks_mut(dv).enumerate().for_each(|(th, out)| {
            let (t, h) = (th / ha, th % ha);
            let qv = &q[th * dn..(th + 1) * dn];
            let toks: Vec<usize> = sel[t].iter().flat_map(|r| r.clone()).collect();
            if toks.is_empty() {
                return;
            }
            let sc: Vec<f32> = toks
                .iter()
                .map(|&j| dot_f32(qv, &k[(j * ha + h) * dn..(j * ha + h + 1) * dn]) * scale)
                .collect();
            let m = sc.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut sum = 0f32;
            for (&j, &x) in toks.iter().zip(&sc) {
                let e = (x - m).exp();
                sum += e;
                let pe = e;
                for (o, vv) in out
                    .iter_mut()
                    .zip(&v[(j * ha + h) * dv..(j * ha + h + 1) * dv])
                {
                    *o += pe * vv;
                }
            }
            out.iter_mut().for_each(|x| *x /= sum);
        });
        o
    }
}
