//! Multi-head latent attention without RoPE (`Glm5NextTextAttention`,
//! `modeling_glm5_next.py` `:1100-1276`; doc §5) over the tokens the DSA indexer
//! selects, and the indexer itself (`Glm5NextTextIndexer`, `:773-1061`; doc §6).
//!
//! ```text
//! q_lat = RMSNorm_qa(x·q_aᵀ)                 [S, rq]   (also the indexer's q input)
//! q     = q_lat·q_bᵀ                         [S, Ha, dn]
//! c     = RMSNorm_kva(x·kv_aᵀ)               [S, rkv]  appended to the latent cache
//! per head h and query t over its selected tokens j:
//!   score_j = (W_k,h c_j)·q_h · dn^-½ ,  out_h = softmax(score)·(W_v,h c_j)
//! ```
//!
//! The indexer caches `k_j = LayerNorm(x_j·wkᵀ)` and `gs_j = x_j·gateᵀ` (`[di]` each).
//! Tokens form pools of `P` from position 0; a complete pool's key is a per-channel
//! softmax-weighted sum `K_p[d] = Σ_s α_{p,s}[d]·k_{pP+s}[d]` with
//! `α = softmax_s(gs + ape)`. A query at position `t` scores every pool it sees (one
//! whose last token is `≤ t`) with `I(p) = Σ_h w_h·relu(q_h·K_p·di^-½)`, keeps the
//! `Ktop/P` best and adds the tail `[P·⌊(t+1)/P⌋, t]` (the incomplete pool). While at
//! most `Ktop/P` pools are visible the selection is every token `≤ t` (dense).

use crate::Result;
use crate::backend::{Backend, CompressShape, MlaShape, Prec, SelectShape};

use super::Scratch;
use super::state::{IndexerState, MlaLayer};

/// The indexer of a `full` MLA layer.
pub struct Indexer<B: Backend> {
    /// `[Hi·di, rq]`.
    pub wq_b: B::Weight,
    /// `[di, D]`.
    pub wk: B::Weight,
    /// LayerNorm weight and bias `[di]`.
    pub k_norm_w: B::Weight,
    pub k_norm_b: B::Weight,
    /// `[Hi, D]`.
    pub weights_proj: B::Weight,
    /// `index_kpool_compress_gate [di, D]`.
    pub gate: B::Weight,
    /// `index_kpool_compress_ape [P, di]`.
    pub ape: B::Weight,
}

/// One MLA layer's weights.
pub struct Attention<B: Backend> {
    pub q_a_proj: B::Weight,
    pub q_a_norm: B::Weight,
    pub q_b_proj: B::Weight,
    pub kv_a_proj: B::Weight,
    pub kv_a_norm: B::Weight,
    /// `[Ha, rkv, dn]`: `k_b[h][c][d] = kv_b_proj[h·(dn+dv) + d][c]`.
    pub k_b: B::Weight,
    /// `[Ha, dv, rkv]`: `v_b[h][e][c] = kv_b_proj[h·(dn+dv) + dn + e][c]`.
    pub v_b: B::Weight,
    pub o_proj: B::Weight,
    /// `Some` for a `full` layer.
    pub indexer: Option<Indexer<B>>,
}

/// The layer's settings.
pub(crate) struct MlaCall<'a, B: Backend> {
    pub step: &'a B::Step,
    pub s: usize,
    pub n_ctx: usize,
    pub rms_eps: f32,
    pub ln_eps: f32,
    pub shape: &'a MlaShape,
    pub select: &'a SelectShape,
    pub p: Prec,
    /// Which selection the layer attends with (see [`Selection`]).
    pub selection: Selection,
    /// The indexer's key norm is applied (off only for a test switch).
    pub k_norm: bool,
    /// q_a / kv_a norms applied (off only for test switches).
    pub q_a_norm: bool,
    pub kv_a_norm: bool,
}

/// Which tokens the layer attends to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Selection {
    /// Every token `≤ t` (no indexer before, or a test switch); a `full` layer still
    /// updates its indexer state.
    Dense,
    /// This layer's own indexer, written to `sc.sel`.
    Own,
    /// The previous `full` layer's selection in `sc.sel` (a `shared` layer).
    Shared,
}

impl<B: Backend> Attention<B> {
    /// Runs the layer on `sc.hn [s, D]` at the step's positions, appending to `st`,
    /// writing `sc.y [s, D]`.
    pub(crate) fn forward(
        &self,
        b: &B,
        sc: &mut Scratch<B>,
        st: &mut MlaLayer<B>,
        call: &MlaCall<'_, B>,
    ) -> Result<()> {
        let (s, p, sh) = (call.s, call.p, call.shape);
        let rq = sc.q_lat_len;
        // Every product of the input side by side (a backend may run them together).
        b.matmul(&self.q_a_proj, None, &sc.hn, s, p, &mut sc.q_lat)?;
        b.matmul(&self.kv_a_proj, None, &sc.hn, s, p, &mut sc.lat)?;
        if let Some(ix) = &self.indexer {
            ix.project(b, sc, call)?;
        }
        if call.q_a_norm {
            b.rms_norm(
                &sc.q_lat,
                Some(&self.q_a_norm),
                s,
                rq,
                call.rms_eps,
                p,
                &mut sc.q_lat_n,
            )?;
        } else {
            b.copy(&sc.q_lat, 0, &mut sc.q_lat_n, 0, s * rq)?;
        }
        b.matmul(&self.q_b_proj, None, &sc.q_lat_n, s, p, &mut sc.mq)?;
        if call.kv_a_norm {
            b.rms_norm(
                &sc.lat,
                Some(&self.kv_a_norm),
                s,
                sh.rank,
                call.rms_eps,
                p,
                &mut sc.lat_n,
            )?;
        } else {
            b.copy(&sc.lat, 0, &mut sc.lat_n, 0, s * sh.rank)?;
        }
        b.store_rows(call.step, &sc.lat_n, s, sh.rank, &mut st.latent, call.n_ctx)?;
        if let (Some(ix), Some(ist)) = (&self.indexer, st.indexer.as_mut()) {
            ix.forward(b, sc, ist, call)?;
        }
        let sel = match call.selection {
            Selection::Dense => None,
            Selection::Own | Selection::Shared => Some(&sc.sel),
        };
        b.mla_attention(
            call.step,
            &sc.mq,
            &st.latent,
            &self.k_b,
            &self.v_b,
            sel,
            s,
            sh,
            p,
            &mut sc.attn,
        )?;
        b.matmul(&self.o_proj, None, &sc.attn, s, p, &mut sc.y)
    }
}

impl<B: Backend> Indexer<B> {
    /// The products of the layer input: keys `wk x`, gates `gate x` and, when the layer
    /// selects, the head weights `weights_proj x` (all in the model dtype).
    fn project(&self, b: &B, sc: &mut Scratch<B>, call: &MlaCall<'_, B>) -> Result<()> {
        let (s, p) = (call.s, call.p);
        b.matmul(&self.wk, None, &sc.hn, s, p, &mut sc.ik)?;
        b.matmul(&self.gate, None, &sc.hn, s, p, &mut sc.igs)?;
        if call.selection == Selection::Own {
            b.matmul(&self.weights_proj, None, &sc.hn, s, p, &mut sc.iw)?;
        }
        Ok(())
    }

    /// Appends the step's rows to `st` (after [`Indexer::project`]), completes the
    /// pooled keys and, when the layer uses its own selection, writes each query's pool
    /// ids to `sc.sel`.
    fn forward(
        &self,
        b: &B,
        sc: &mut Scratch<B>,
        st: &mut IndexerState<B>,
        call: &MlaCall<'_, B>,
    ) -> Result<()> {
        let (s, p, sel) = (call.s, call.p, call.select);
        let di = sel.dim;
        // k = LayerNorm(wk x).
        if call.k_norm {
            b.layer_norm(
                &sc.ik,
                &self.k_norm_w,
                &self.k_norm_b,
                s,
                di,
                call.ln_eps,
                p,
                &mut sc.ik_n,
            )?;
        } else {
            b.copy(&sc.ik, 0, &mut sc.ik_n, 0, s * di)?;
        }
        let pool = CompressShape {
            rate: sel.rate,
            dim: di,
            overlap: false,
            norm_eps: 0.0,
        };
        b.compress(
            call.step,
            [&sc.ik_n, &sc.igs],
            [&mut st.k, &mut st.gs],
            call.n_ctx,
            &self.ape,
            None,
            None,
            &pool,
            p,
            &mut st.pooled,
        )?;
        if call.selection == Selection::Own {
            b.matmul(&self.wq_b, None, &sc.q_lat_n, s, p, &mut sc.iq)?;
            b.dsa_select(call.step, &sc.iq, &sc.iw, &st.pooled, s, sel, &mut sc.sel)?;
        }
        Ok(())
    }
}
