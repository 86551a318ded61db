//! DeepSeek-V4's MTP (multi-token prediction) block as a next-token head, in
//! llama.cpp's layout and arithmetic (`src/models/deepseek4.cpp` `graph_mtp`; the
//! block is `blk.{L}` after the `L` trunk layers, `nextn_predict_layers = 1`, tensors
//! `blk.{L}.nextn.{eh_proj,enorm,hnorm}` plus an ordinary layer's attention, mHC and
//! MoE tensors, optional `nextn.{embed_tokens,shared_head_head,shared_head_norm}`).
//!
//! The transformers reference has no MTP module (it ignores `mtp.*` weights and
//! computes no MTP logits), so nothing here is checked against it; llama.cpp's
//! converter skips MTP tensors unless asked (`--mtp`).
//!
//! For the pair (trunk streams `h` after position `q − 1`, token `x_q`) at MTP position
//! `q`, predicting `x_{q+1}` (llama.cpp's speculative MTP pairs them so):
//!
//! ```text
//! e = RMSNorm_enorm(embed[x_q])                                 [D], the same for every stream
//! X[n] = eh_proj · [e ‖ RMSNorm_hnorm(h[n])]                    [N, D]
//! X = DecoderLayer_L(X)          sliding-window attention over earlier MTP positions, MoE
//! logits = head · RMSNorm(HyperHead(X))                         the trunk's hc head
//! ```
//!
//! The block keeps its own sliding window ([`MtpState`]), which rewinds like the trunk's
//! (any position at most `R` behind the furthest one written).

use crate::backend::{Backend, Prec};
use crate::loader::{Hparams, TensorLoader};
use crate::{EngineError, Result};

use super::config::{AttnKind, Config};
use super::moe::MoeCall;
use super::state::{CacheShape, LayerState};
use super::{DEFAULT_REWIND_WINDOW, DeepSeek4, Layer, Scratch, limit, load};

/// The MTP block's weights.
pub struct Mtp<B: Backend> {
    /// Index of the block (`L`).
    pub index: usize,
    /// `[D, 2D]`: `e_proj` and `h_proj` side by side along the input.
    pub eh_proj: B::Weight,
    pub enorm: B::Weight,
    pub hnorm: B::Weight,
    layer: Layer<B>,
    /// Own embedding, head norm and head (the trunk's when absent).
    embed: Option<B::Weight>,
    head_norm: Option<B::Weight>,
    head: Option<B::Weight>,
}

/// The MTP block's sequence state: its sliding window and activation buffers.
pub struct MtpState<B: Backend> {
    layer: LayerState<B>,
    len: usize,
    high: usize,
    window: usize,
    n_ctx: usize,
    scratch: Scratch<B>,
    /// `[P·N, 2D]` concatenated inputs and `[P·N, D]` normalised streams.
    cat: B::Buf,
    hn: B::Buf,
    fingerprint: u64,
}

/// Loads block `L = block_count − 1` (a single MTP layer, as llama.cpp supports).
pub(crate) fn load<B: Backend>(
    l: &mut TensorLoader<B>,
    hp: &Hparams,
    c: &Config,
) -> Result<Mtp<B>> {
    let i = c.n_layer();
    if c.n_nextn != 1 {
        return Err(EngineError::Config(format!(
            "{} MTP layers (deepseek4.nextn_predict_layers); one is supported, as in llama.cpp",
            c.n_nextn
        )));
    }
    let ratio = hp
        .get("attention.compress_ratios")
        .and_then(|v| v.as_array())
        .and_then(|a| a.get(i))
        .and_then(|v| v.as_i64())
        .unwrap_or(0);
    if ratio != 0 {
        return Err(EngineError::Config(format!(
            "the MTP block {i} has attention.compress_ratios[{i}] = {ratio}; only a sliding-window MTP \
             block (0, as DeepSeek-V4-Flash's) is supported"
        )));
    }
    let d = c.n_embd;
    let layer = Layer {
        kind: AttnKind::Sliding,
        attn_hc: load::hc(l, i, "attn", c)?,
        ffn_hc: load::hc(l, i, "ffn", c)?,
        attn_norm: l.vector(&load::n(i, "attn_norm.weight"), d)?,
        ffn_norm: l.vector(&load::n(i, "ffn_norm.weight"), d)?,
        attn: load::attention(l, i, AttnKind::Sliding, c)?,
        ffn: load::moe(l, i, false, c)?,
    };
    let opt_mat =
        |l: &mut TensorLoader<B>, s: &str| l.optional_matrix(&load::n(i, s), d, Some(c.n_vocab));
    Ok(Mtp {
        index: i,
        eh_proj: l.mat(&[&load::n(i, "nextn.eh_proj.weight")], d, 2 * d)?,
        enorm: l.vector(&load::n(i, "nextn.enorm.weight"), d)?,
        hnorm: l.vector(&load::n(i, "nextn.hnorm.weight"), d)?,
        layer,
        embed: opt_mat(l, "nextn.embed_tokens.weight")?,
        head_norm: l.optional_vector(&load::n(i, "nextn.shared_head_norm.weight"), d)?,
        head: opt_mat(l, "nextn.shared_head_head.weight")?,
    })
}

impl<B: Backend> MtpState<B> {
    /// MTP positions held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no position is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Drops every MTP position at `n` and later; positions at most the rewind window
    /// behind the furthest one written are reachable (and 0).
    ///
    /// # Errors
    /// [`EngineError::Rewind`] past the window or past the end.
    pub fn truncate(&mut self, n: usize) -> Result<()> {
        if n > self.len {
            return Err(EngineError::Rewind {
                target: n,
                reason: format!("the MTP state holds only {} positions", self.len),
            });
        }
        if n == 0 {
            self.len = 0;
            self.high = 0;
            return Ok(());
        }
        if n + self.window < self.high {
            return Err(EngineError::Rewind {
                target: n,
                reason: format!(
                    "the MTP block's sliding window reaches back to {}",
                    self.high - self.window
                ),
            });
        }
        self.len = n;
        Ok(())
    }
}

impl<B: Backend> DeepSeek4<B> {
    /// A new MTP state of `n_ctx` positions, when the model has an MTP block.
    ///
    /// # Errors
    /// [`EngineError::Config`] without an MTP block; allocation failures.
    pub fn new_mtp_state(&self, n_ctx: usize) -> Result<MtpState<B>> {
        if self.mtp.is_none() {
            return Err(EngineError::Config(
                "this deepseek4 file has no MTP block (blk.L.nextn.*)".into(),
            ));
        }
        let b = &*self.backend;
        let c = &self.cfg;
        let shape = CacheShape {
            layers: vec![AttnKind::Sliding],
            ..self.cache_shape()
        };
        let r = DEFAULT_REWIND_WINDOW;
        let (n, d) = (c.hc_mult, c.n_embd);
        Ok(MtpState {
            layer: LayerState::new(b, AttnKind::Sliding, &shape, r, n_ctx)?,
            len: 0,
            high: 0,
            window: r,
            n_ctx,
            scratch: Scratch::new(b, c, r)?,
            cat: b.buf(r * n * 2 * d)?,
            hn: b.buf(r * n * d)?,
            fingerprint: self.fingerprint,
        })
    }

    /// Runs the MTP head for `tokens` at MTP positions `state.len()…`: row `i` pairs
    /// token `tokens[i]` (the token at main position `q`) with the trunk's streams after
    /// position `q − 1` (`hidden[i]`, `N·D` values from
    /// [`DeepSeek4::forward_with_hidden`]) and predicts the token at `q + 1`. Appends
    /// `tokens.len()` rows of logits to `out` (cleared first).
    ///
    /// # Errors
    /// A state of another model, `hidden` of the wrong size, a full context, a token
    /// outside the vocabulary, backend failures.
    pub fn mtp_forward(
        &self,
        state: &mut MtpState<B>,
        tokens: &[u32],
        hidden: &[f32],
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let mtp = self
            .mtp
            .as_ref()
            .ok_or_else(|| EngineError::Config("this deepseek4 file has no MTP block".into()))?;
        let c = &self.cfg;
        let nd = c.hc_mult * c.n_embd;
        if state.fingerprint != self.fingerprint {
            return Err(EngineError::Config(
                "MTP state belongs to another model".into(),
            ));
        }
        if hidden.len() != tokens.len() * nd {
            return Err(EngineError::Backend(format!(
                "mtp_forward: {} hidden values for {} tokens of {nd}",
                hidden.len(),
                tokens.len()
            )));
        }
        if state.len + tokens.len() > state.n_ctx {
            return Err(EngineError::ContextFull {
                needed: state.len + tokens.len(),
                n_ctx: state.n_ctx,
            });
        }
        if let Some(&id) = tokens.iter().find(|&&t| t as usize >= c.n_vocab) {
            return Err(EngineError::BadToken {
                id,
                n_vocab: c.n_vocab,
            });
        }
        out.clear();
        let piece = state.window;
        for (toks, h) in tokens.chunks(piece).zip(hidden.chunks(piece * nd)) {
            self.backend
                .run(|| self.mtp_piece(mtp, state, toks, h, out))?;
        }
        Ok(())
    }

    fn mtp_piece(
        &self,
        mtp: &Mtp<B>,
        st: &mut MtpState<B>,
        tokens: &[u32],
        hidden: &[f32],
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let b = &*self.backend;
        let c = &self.cfg;
        let (s, d, n) = (tokens.len(), c.n_embd, c.hc_mult);
        let p: Prec = self.prec();
        let hcs = self.hc_shape();
        let eps = c.rms_eps;
        let step = b.step(tokens, st.len)?;
        let sc = &mut st.scratch;
        // e = enorm(embed[x]); h = hnorm(h) per stream.
        b.embed(
            &step,
            mtp.embed.as_ref().unwrap_or(&self.tok_embd),
            1,
            p,
            &mut sc.h,
        )?;
        b.rms_norm_cast_once(&sc.h, Some(&mtp.enorm), s, d, eps, p, &mut sc.hn)?;
        b.write(&mut sc.x, 0, hidden)?;
        b.rms_norm_cast_once(&sc.x, Some(&mtp.hnorm), s * n, d, eps, p, &mut st.hn)?;
        for t in 0..s {
            for k in 0..n {
                let row = (t * n + k) * 2 * d;
                b.copy(&sc.hn, t * d, &mut st.cat, row, d)?;
                b.copy(&st.hn, (t * n + k) * d, &mut st.cat, row + d, d)?;
            }
        }
        b.matmul(&mtp.eh_proj, None, &st.cat, s * n, p, &mut sc.x)?;
        // One decoder layer, as the trunk's.
        let layer = &mtp.layer;
        b.hc_pre(
            &sc.x,
            s,
            &layer.attn_hc.weights(),
            &hcs,
            p,
            &mut sc.h,
            &mut sc.mix,
        )?;
        b.rms_norm_cast_once(&sc.h, Some(&layer.attn_norm), s, d, eps, p, &mut sc.hn)?;
        let call = self.attn_call(&step, s, AttnKind::Sliding);
        layer.attn.forward(b, sc, &mut st.layer, &call)?;
        b.hc_post(&mut sc.x, &sc.y, &sc.mix, s, &hcs, p)?;
        b.hc_pre(
            &sc.x,
            s,
            &layer.ffn_hc.weights(),
            &hcs,
            p,
            &mut sc.h,
            &mut sc.mix,
        )?;
        b.rms_norm_cast_once(&sc.h, Some(&layer.ffn_norm), s, d, eps, p, &mut sc.hn)?;
        let i = mtp.index;
        let call = MoeCall {
            step: &step,
            s,
            d,
            routing: self.routing(),
            limit_exp: limit(*c.swiglu_exp.get(i).unwrap_or(&f32::INFINITY)),
            limit_shexp: limit(*c.swiglu_shexp.get(i).unwrap_or(&f32::INFINITY)),
            p,
            hash: false,
            shared: true,
        };
        layer.ffn.forward(b, sc, &call)?;
        b.hc_post(&mut sc.x, &sc.y, &sc.mix, s, &hcs, p)?;
        st.len += s;
        st.high = st.high.max(st.len);
        // The trunk's hyper-head, then the block's (or the trunk's) norm and head.
        let nd = n * d;
        let mut row = 0;
        while row < s {
            let rows = (s - row).min(super::LOGIT_ROWS);
            b.copy(&sc.x, row * nd, &mut sc.xl, 0, rows * nd)?;
            b.hc_head(
                &sc.xl,
                rows,
                Some(&self.hc_head.weights()),
                &hcs,
                p,
                &mut sc.hl,
            )?;
            let norm = mtp.head_norm.as_ref().unwrap_or(&self.output_norm);
            b.rms_norm_cast_once(&sc.hl, Some(norm), rows, d, eps, p, &mut sc.hl2)?;
            let head = mtp.head.as_ref().unwrap_or(&self.output);
            b.matmul(head, None, &sc.hl2, rows, p, &mut sc.logits)?;
            b.read(&sc.logits, 0, rows * c.n_vocab, out)?;
            row += rows;
        }
        Ok(())
    }
}
