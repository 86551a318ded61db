//! The `deepseek4` family (DeepSeek-V4-Flash), following `transformers==5.23.0`
//! `models/deepseek_v4` (`DeepseekV4ForCausalLM`), written once on the [`Backend`]
//! interface; `docs/deepseek4.md` writes its forward pass out and is the companion of
//! these files:
//!
//! ```text
//! X[t, n] = embed[tokens[t]]                                   n < hc_mult streams
//! per layer:  post, C, x = attn_hc(X)                                           (hc_pre)
//!             y = Attention(RMSNorm_attn(x))       sliding / CSA / HCA  (attention.rs)
//!             X = post ⊗ y + Cᵀ X                                               (hc_post)
//!             post, C, x = ffn_hc(X);  y = MoE(RMSNorm_ffn(x), tokens);  X = post ⊗ y + Cᵀ X  (moe.rs)
//! logits = head · RMSNorm_final(HyperHead(X))                                   (hc_head)
//! ```
//!
//! Weights come from a GGUF file in llama.cpp's `deepseek4` layout (`load.rs`,
//! `docs/deepseek4_gguf.md`); the per-sequence state (sliding-window and compressor
//! rings, compressed entries) is in `state.rs`, the versioned state file in
//! `state_file.rs`, the MTP head in `mtp.rs`. **Precision policy:** the reference is
//! PyTorch, so every operation runs in its arithmetic — a model whose token embedding
//! is BF16 computes as the reference's bf16 model ([`Prec::Bf16`]: activations rounded
//! at its cast points, doc §11), any other file in f32 ([`Prec::F32`]). Routed experts
//! in MXFP4 hold the checkpoint's FP4 values exactly and multiply as floats.

pub mod attention;
pub mod config;
pub mod load;
pub mod moe;
pub mod mtp;
pub mod state;
pub mod state_file;
#[cfg(test)]
mod tests;

use std::sync::Arc;

use ds4_gguf::{GgmlType, GgufFile};

use super::Tokens;
use crate::backend::{Backend, HcShape, Prec, Rope, Routing, Scoring, SelectShape, SinkAttnShape};
use crate::loader::{Hparams, TensorLoader};
use crate::model::{Cache, Logits, Model, ModelInfo};
use crate::{EngineError, Result};
use attention::{Attention, AttnCall};
use config::{AttnKind, Config, Dtype};
use load::HyperConnection;
use moe::{Moe, MoeCall};
use state::{CacheShape, LayerState};

pub use state::{DEFAULT_ANCHORS, DEFAULT_REWIND_WINDOW, DeepSeek4Cache};

/// The GGUF architecture name (llama.cpp's).
pub const ARCH: &str = "deepseek4";

/// The backend operations this family uses (checked at load).
pub(crate) const OPS: &[&str] = &[
    "embed",
    "rms_norm_cast_once",
    "matmul",
    "matmul_grouped",
    "rope",
    "swiglu",
    "add",
    "copy",
    "read",
    "read_ids",
    "write",
    "store_rows",
    "moe_route",
    "moe_experts",
    "hc_pre",
    "hc_post",
    "hc_head",
    "compress",
    "dsa_select",
    "sink_attention",
];

/// Rows of logits computed at once.
const LOGIT_ROWS: usize = 16;

struct Layer<B: Backend> {
    kind: AttnKind,
    attn_hc: HyperConnection<B>,
    ffn_hc: HyperConnection<B>,
    attn_norm: B::Weight,
    ffn_norm: B::Weight,
    attn: Attention<B>,
    ffn: Moe<B>,
}

/// A loaded `deepseek4` model on backend `B`.
pub struct DeepSeek4<B: Backend> {
    backend: Arc<B>,
    cfg: Config,
    info: ModelInfo,
    tok_embd: B::Weight,
    output_norm: B::Weight,
    output: B::Weight,
    hc_head: HyperConnection<B>,
    layers: Vec<Layer<B>>,
    mtp: Option<mtp::Mtp<B>>,
    fingerprint: u64,
}

/// Per-layer outputs of one forward call, for locating a mismatch against the
/// reference's hidden states (fixture arrays `hidden_*`).
#[derive(Debug, Default, Clone)]
pub struct Trace {
    /// `[s, D]` token embeddings.
    pub embed: Vec<f32>,
    /// Per layer: the streams after the layer `[s, N, D]`.
    pub streams: Vec<Vec<f32>>,
    /// Per layer: the attention block's output `[s, D]`.
    pub attn_out: Vec<Vec<f32>>,
    /// Per layer: the MoE block's output `[s, D]`.
    pub mlp_out: Vec<Vec<f32>>,
    /// Per CSA layer: each query's selected entries (ascending).
    pub selections: Vec<(usize, Vec<Vec<usize>>)>,
}

/// The activation buffers of one forward piece.
pub(crate) struct Scratch<B: Backend> {
    pub(crate) rq: usize,
    pub(crate) x: B::Buf,
    pub(crate) h: B::Buf,
    pub(crate) hn: B::Buf,
    pub(crate) y: B::Buf,
    pub(crate) y2: B::Buf,
    pub(crate) mix: B::Buf,
    // attention
    pub(crate) qa: B::Buf,
    pub(crate) qr: B::Buf,
    pub(crate) q0: B::Buf,
    pub(crate) q: B::Buf,
    pub(crate) kv0: B::Buf,
    pub(crate) kv: B::Buf,
    /// The compressor's source rows (kv, gate), then the indexer compressor's.
    pub(crate) cc: B::Buf,
    pub(crate) cg: B::Buf,
    pub(crate) ic: B::Buf,
    pub(crate) ig: B::Buf,
    pub(crate) iq: B::Buf,
    pub(crate) iw: B::Buf,
    pub(crate) sel: B::Ids,
    pub(crate) o: B::Buf,
    pub(crate) og: B::Buf,
    // MoE
    pub(crate) router: B::Buf,
    pub(crate) expert_ids: B::Ids,
    pub(crate) expert_w: B::Buf,
    pub(crate) ff_gate: B::Buf,
    pub(crate) ff_up: B::Buf,
    pub(crate) ff_act: B::Buf,
    // output rows
    pub(crate) xl: B::Buf,
    pub(crate) hl: B::Buf,
    pub(crate) hl2: B::Buf,
    pub(crate) logits: B::Buf,
}

impl<B: Backend> Scratch<B> {
    fn new(b: &B, c: &Config, p: usize) -> Result<Self> {
        let (d, n) = (c.n_embd, c.hc_mult);
        let hq = c.n_head * c.head_dim;
        let ff = c.n_ff_exp.max(c.n_ff_shexp);
        Ok(Scratch {
            rq: c.q_lora_rank,
            x: b.buf(p * n * d)?,
            h: b.buf(p * d)?,
            hn: b.buf(p * d)?,
            y: b.buf(p * d)?,
            y2: b.buf(p * d)?,
            mix: b.buf(p * (n + n * n))?,
            qa: b.buf(p * c.q_lora_rank)?,
            qr: b.buf(p * c.q_lora_rank)?,
            q0: b.buf(p * hq)?,
            q: b.buf(p * hq)?,
            kv0: b.buf(p * c.head_dim)?,
            kv: b.buf(p * c.head_dim)?,
            cc: b.buf(p * 2 * c.head_dim)?,
            cg: b.buf(p * 2 * c.head_dim)?,
            ic: b.buf(p * 2 * c.index_head_dim)?,
            ig: b.buf(p * 2 * c.index_head_dim)?,
            iq: b.buf(p * c.index_heads * c.index_head_dim)?,
            iw: b.buf(p * c.index_heads)?,
            sel: b.ids(p * c.index_topk)?,
            o: b.buf(p * hq)?,
            og: b.buf(p * c.o_groups * c.o_lora_rank)?,
            router: b.buf(p * c.n_expert)?,
            expert_ids: b.ids(p * c.n_expert_used)?,
            expert_w: b.buf(p * c.n_expert_used)?,
            ff_gate: b.buf(p * ff)?,
            ff_up: b.buf(p * ff)?,
            ff_act: b.buf(p * ff)?,
            xl: b.buf(LOGIT_ROWS * n * d)?,
            hl: b.buf(LOGIT_ROWS * d)?,
            hl2: b.buf(LOGIT_ROWS * d)?,
            logits: b.buf(LOGIT_ROWS * c.n_vocab)?,
        })
    }

    /// Bytes of the buffers for config `c` and pieces of `p` tokens.
    fn bytes(c: &Config, p: usize) -> u64 {
        let (d, n) = (c.n_embd, c.hc_mult);
        let hq = c.n_head * c.head_dim;
        let ff = c.n_ff_exp.max(c.n_ff_shexp);
        let per_tok = n * d
            + 4 * d
            + n * (n + 1)
            + 2 * c.q_lora_rank
            + 3 * hq
            + 2 * c.head_dim
            + 4 * (c.head_dim + c.index_head_dim)
            + c.index_heads * (c.index_head_dim + 1)
            + c.index_topk
            + c.o_groups * c.o_lora_rank
            + c.n_expert
            + 2 * c.n_expert_used
            + 3 * ff;
        4 * (p * per_tok + LOGIT_ROWS * (n * d + 2 * d + c.n_vocab)) as u64
    }
}

/// A stable hash of the hyperparameters that shape the state (FNV-1a of their text).
fn fingerprint(c: &Config) -> u64 {
    let text = format!(
        "{:?}|{}|{}|{}|{}|{}|{}|{}",
        c.layers,
        c.n_embd,
        c.hc_mult,
        c.head_dim,
        c.index_head_dim,
        c.sliding_window,
        c.n_vocab,
        c.n_nextn
    );
    text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

/// Layer `i`'s array of a [`Trace`] (created at the first piece of a call).
fn layer_row(v: &mut Vec<Vec<f32>>, i: usize) -> &mut Vec<f32> {
    if v.len() <= i {
        v.resize(i + 1, Vec::new());
    }
    &mut v[i]
}

/// The precision policy of a model dtype (see the module header).
fn prec(d: Dtype) -> Prec {
    match d {
        Dtype::F32 => Prec::F32,
        Dtype::Bf16 => Prec::Bf16,
    }
}

fn limit(x: f32) -> Option<f32> {
    x.is_finite().then_some(x)
}

impl<B: Backend> DeepSeek4<B> {
    /// Loads a `deepseek4` model from a GGUF file (`general.architecture` `deepseek4`)
    /// onto `backend`; an MTP block in the file is loaded as [`DeepSeek4::mtp`].
    ///
    /// # Errors
    /// [`EngineError::Metadata`]/[`EngineError::Config`] for bad, contradicting or
    /// unrunnable hyperparameters (see [`Config::from_gguf`]),
    /// [`EngineError::MissingTensor`], [`EngineError::TensorShape`] when a tensor
    /// contradicts the metadata, [`EngineError::UnsupportedTensorType`],
    /// [`EngineError::Unsupported`] when the backend lacks an operation.
    pub fn load(backend: Arc<B>, file: &Arc<GgufFile>, name: String) -> Result<Self> {
        let hp = Hparams::new(file)?;
        if hp.arch() != ARCH {
            return Err(EngineError::Metadata {
                key: "general.architecture".into(),
                detail: format!(" (expected {ARCH}, found {})", hp.arch()),
            });
        }
        let mut l = TensorLoader::new(backend.clone(), file);
        let embd_ty = l
            .type_of("token_embd.weight")
            .ok_or_else(|| EngineError::MissingTensor("token_embd.weight".into()))?;
        let dtype = if embd_ty == GgmlType::BF16 {
            Dtype::Bf16
        } else {
            Dtype::F32
        };
        crate::backend::require(&*backend, "deepseek4", OPS, prec(dtype))?;
        let n_embd = hp.usize("embedding_length")?;
        let tok_embd = l.embedding("token_embd.weight", n_embd)?;
        let n_vocab = l.rows_of("token_embd.weight")?;
        if hp.usize_or("nextn_predict_layers", 0)? > 0
            && l.find(&["blk.0.attn_norm.weight"]).is_none()
        {
            return Err(EngineError::Config(format!(
                "{}: an MTP-only file (llama.cpp's `--mtp` output: the nextn block without the trunk's \
                 layers); convert the checkpoint with `ds4-server convert --mtp` to get the trunk and \
                 its MTP block in one file",
                file.label()
            )));
        }
        let cfg = Config::from_gguf(&hp, n_vocab, dtype)?;
        let d = cfg.n_embd;
        let output_norm = l.vector("output_norm.weight", d)?;
        let output = l.matrix("output.weight", d, Some(n_vocab))?;
        let hc_head = load::hc_head(&mut l, &cfg)?;
        let mut layers = Vec::with_capacity(cfg.n_layer());
        for (i, &(kind, hash)) in cfg.layers.iter().enumerate() {
            layers.push(Layer {
                kind,
                attn_hc: load::hc(&mut l, i, "attn", &cfg)?,
                ffn_hc: load::hc(&mut l, i, "ffn", &cfg)?,
                attn_norm: l.vector(&load::n(i, "attn_norm.weight"), d)?,
                ffn_norm: l.vector(&load::n(i, "ffn_norm.weight"), d)?,
                attn: load::attention(&mut l, i, kind, &cfg)?,
                ffn: load::moe(&mut l, i, hash, &cfg)?,
            });
        }
        let mtp = if cfg.n_nextn > 0 {
            Some(mtp::load(&mut l, &hp, &cfg)?)
        } else {
            None
        };
        let info = ModelInfo {
            architecture: hp.arch().to_string(),
            name,
            n_vocab,
            n_ctx_train: cfg.n_ctx_train,
            n_layer: cfg.n_layer(),
            decode_weight_bytes: l.decode_bytes(),
            n_params: l.n_params(),
            backend: backend.name().into(),
        };
        let fingerprint = fingerprint(&cfg);
        Ok(DeepSeek4 {
            backend,
            cfg,
            info,
            tok_embd,
            output_norm,
            output,
            hc_head,
            layers,
            mtp,
            fingerprint,
        })
    }

    /// The hyperparameters.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The backend the model runs on.
    pub fn backend(&self) -> &Arc<B> {
        &self.backend
    }

    /// The MTP (multi-token prediction) head, when the file has one.
    pub fn mtp(&self) -> Option<&mtp::Mtp<B>> {
        self.mtp.as_ref()
    }

    pub(crate) fn cache_shape(&self) -> CacheShape {
        let c = &self.cfg;
        CacheShape {
            layers: c.layers.iter().map(|l| l.0).collect(),
            head_dim: c.head_dim,
            index_head_dim: c.index_head_dim,
            sliding_window: c.sliding_window,
            fingerprint: self.fingerprint,
        }
    }

    /// A new empty cache of this model, as its concrete type.
    pub fn new_ds4_cache(&self, n_ctx: usize) -> Result<DeepSeek4Cache<B>> {
        let shape = self.cache_shape();
        let r = DEFAULT_REWIND_WINDOW;
        let bytes =
            DeepSeek4Cache::<B>::bytes(&shape, n_ctx, r) + Scratch::<B>::bytes(&self.cfg, r);
        crate::model::check_memory(&*self.backend, bytes, n_ctx)?;
        DeepSeek4Cache::new(self.backend.clone(), shape, n_ctx)
    }

    /// The precision policy (see the module header).
    pub(crate) fn prec(&self) -> Prec {
        prec(self.cfg.dtype)
    }

    pub(crate) fn hc_shape(&self) -> HcShape {
        let c = &self.cfg;
        let mut iters = c.hc_sinkhorn_iters;
        if crate::ablated!(self.backend, HcSinkhorn1) {
            iters = 1;
        }
        if crate::ablated!(self.backend, HcSinkhorn19) {
            iters = iters.saturating_sub(1).max(1);
        }
        HcShape {
            n: c.hc_mult,
            d: c.n_embd,
            iters,
            eps: if crate::ablated!(self.backend, HcEps0) {
                0.0
            } else {
                c.hc_eps
            },
            norm_eps: c.rms_eps,
        }
    }

    /// The `main` and `compress` rope tables (doc §3).
    pub(crate) fn ropes(&self) -> (Rope, Rope) {
        let c = &self.cfg;
        let neox = crate::ablated!(self.backend, RopeNeoxPairs);
        let trailing = !crate::ablated!(self.backend, RopeLeadingDims);
        let main = Rope {
            n_dims: c.rope_dim,
            freq_base: c.rope_theta,
            neox,
            trailing,
            yarn: None,
            inverse: false,
        };
        let mut compress = Rope {
            freq_base: c.compress_rope_theta,
            yarn: c.yarn,
            ..main
        };
        if crate::ablated!(self.backend, CompressRopeNoYarn) {
            compress.yarn = None;
        }
        if crate::ablated!(self.backend, CompressRopeMainTheta) {
            compress = main;
        }
        if crate::ablated!(self.backend, MainRopeCompressTheta) {
            return (compress, compress);
        }
        (main, compress)
    }

    fn routing(&self) -> Routing {
        let c = &self.cfg;
        Routing {
            scoring: if crate::ablated!(self.backend, MoeScoreSigmoid) {
                Scoring::Sigmoid
            } else {
                Scoring::SqrtSoftplus
            },
            n_expert: c.n_expert,
            n_used: c.n_expert_used,
            n_group: 1,
            topk_group: 1,
            // The reference always renormalises (`norm_topk_prob` is not read).
            norm: !crate::ablated!(self.backend, MoeNoRenorm),
            scale: if crate::ablated!(self.backend, MoeRoutedScaling1) {
                1.0
            } else {
                c.routed_scale
            },
        }
    }

    /// The attention settings of layer `kind` for a call.
    fn attn_call<'a>(&self, step: &'a B::Step, s: usize, kind: AttnKind) -> AttnCall<'a, B> {
        let c = &self.cfg;
        let (main, compress) = self.ropes();
        let rope = if kind == AttnKind::Sliding {
            main
        } else {
            compress
        };
        let b = &self.backend;
        let mut window = c.sliding_window;
        if crate::ablated!(b, SlidingWindowMinus1) {
            window -= 1;
        }
        AttnCall {
            step,
            s,
            rms_eps: c.rms_eps,
            rope,
            rope_inv: Rope {
                inverse: true,
                ..rope
            },
            compress_rope: compress,
            shape: SinkAttnShape {
                heads: c.n_head,
                head_dim: c.head_dim,
                window,
                scale: (c.head_dim as f32).powf(-0.5),
                rate: kind.rate(),
                per_query: c.index_topk,
            },
            select: SelectShape {
                heads: c.index_heads,
                dim: c.index_head_dim,
                rate: kind.rate().max(1),
                top_k: c.index_topk,
                scale: (c.index_head_dim as f32).powf(-0.5),
                weights_scale: (c.index_heads as f32).powf(-0.5),
            },
            o_groups: c.o_groups,
            p: self.prec(),
            q_b_norm: !crate::ablated!(b, QBNormOff),
            kv_norm: !crate::ablated!(b, KvNormOff),
            inverse_rope: !crate::ablated!(b, NoInverseRopeOnOutput),
            use_entries: !crate::ablated!(b, CompressionOff),
            compressor_norm: !crate::ablated!(b, CompressorNormOff),
            indexer_select: !crate::ablated!(b, IndexerSelectAll),
            indexer_rope: !crate::ablated!(b, IndexerNoRope),
            indexer_norm: !crate::ablated!(b, IndexerNormOff),
            groups_swapped: crate::ablated!(b, WoAGroupsSwapped),
        }
    }

    /// Evaluates `tokens` on `cache` and appends the logits rows `want` asks for,
    /// optionally recording per-layer outputs.
    fn forward_inner(
        &self,
        cache: &mut DeepSeek4Cache<B>,
        tokens: Tokens<'_>,
        want: Logits,
        out: &mut Vec<f32>,
        mut trace: Option<&mut Trace>,
        mut hidden: Option<&mut Vec<f32>>,
    ) -> Result<()> {
        out.clear();
        let piece = cache.piece();
        if cache.scratch.is_none() {
            cache.scratch = Some(Scratch::new(&*self.backend, &self.cfg, piece)?);
        }
        for (chunk, w) in tokens.pieces(piece, want) {
            let mut sc = cache.scratch.take().expect("allocated above");
            let r = self.backend.run(|| {
                self.forward_piece(
                    cache,
                    &mut sc,
                    chunk,
                    w,
                    out,
                    trace.as_deref_mut(),
                    hidden.as_deref_mut(),
                )
            });
            cache.scratch = Some(sc);
            if r.is_err() {
                // The state may be half-updated: only a reset is consistent.
                let _ = cache.truncate(0);
            }
            r?;
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn forward_piece(
        &self,
        cache: &mut DeepSeek4Cache<B>,
        sc: &mut Scratch<B>,
        tokens: Tokens<'_>,
        want: Logits,
        out: &mut Vec<f32>,
        mut trace: Option<&mut Trace>,
        hidden: Option<&mut Vec<f32>>,
    ) -> Result<()> {
        let _span =
            tracing::debug_span!("deepseek4_forward", tokens = tokens.len(), pos = cache.len)
                .entered();
        let b = &*self.backend;
        let c = &self.cfg;
        let s = tokens.len();
        let d = c.n_embd;
        let p = self.prec();
        let hcs = self.hc_shape();
        let nd = hcs.n * d;
        let pos0 = cache.len;
        let step = tokens.step(b, &cache.picks, pos0)?;
        b.region("embedding");
        b.embed(&step, &self.tok_embd, hcs.n, p, &mut sc.x)?;
        if let Some(tr) = trace.as_deref_mut() {
            for t in 0..s {
                b.read(&sc.x, t * nd, d, &mut tr.embed)?;
            }
        }
        let clamp_off = crate::ablated!(b, SwigluClampOff);
        for (i, (layer, st)) in self.layers.iter().zip(cache.layers.iter_mut()).enumerate() {
            let _l = tracing::trace_span!("layer", i).entered();
            b.region(match layer.kind {
                AttnKind::Sliding => "sliding attention",
                AttnKind::Csa { .. } => "CSA attention",
                AttnKind::Hca { .. } => "HCA attention",
            });
            b.hc_pre(
                &sc.x,
                s,
                &layer.attn_hc.weights(),
                &hcs,
                p,
                &mut sc.h,
                &mut sc.mix,
            )?;
            b.rms_norm_cast_once(
                &sc.h,
                Some(&layer.attn_norm),
                s,
                d,
                c.rms_eps,
                p,
                &mut sc.hn,
            )?;
            let call = self.attn_call(&step, s, layer.kind);
            layer.attn.forward(b, sc, st, &call)?;
            if let (Some(tr), AttnKind::Csa { .. }) = (trace.as_deref_mut(), layer.kind) {
                let rows = self.traced_selection(sc, st, pos0, s, &call)?;
                match tr.selections.iter_mut().find(|(l, _)| *l == i) {
                    Some((_, v)) => v.extend(rows),
                    None => tr.selections.push((i, rows)),
                }
            }
            b.hc_post(&mut sc.x, &sc.y, &sc.mix, s, &hcs, p)?;
            if let Some(tr) = trace.as_deref_mut() {
                b.read(&sc.y, 0, s * d, layer_row(&mut tr.attn_out, i))?;
            }
            b.region("MoE FFN");
            b.hc_pre(
                &sc.x,
                s,
                &layer.ffn_hc.weights(),
                &hcs,
                p,
                &mut sc.h,
                &mut sc.mix,
            )?;
            b.rms_norm_cast_once(&sc.h, Some(&layer.ffn_norm), s, d, c.rms_eps, p, &mut sc.hn)?;
            let call = MoeCall {
                step: &step,
                s,
                d,
                routing: self.routing(),
                limit_exp: limit(c.swiglu_exp[i]).filter(|_| !clamp_off),
                limit_shexp: limit(c.swiglu_shexp[i]).filter(|_| !clamp_off),
                p,
                hash: !crate::ablated!(b, HashRoutingAsScore),
                shared: !crate::ablated!(b, MoeSharedExpertOff),
            };
            layer.ffn.forward(b, sc, &call)?;
            b.hc_post(&mut sc.x, &sc.y, &sc.mix, s, &hcs, p)?;
            if let Some(tr) = trace.as_deref_mut() {
                b.read(&sc.y, 0, s * d, layer_row(&mut tr.mlp_out, i))?;
                b.read(&sc.x, 0, s * nd, layer_row(&mut tr.streams, i))?;
            }
        }
        cache.len += s;
        cache.high = cache.high.max(cache.len);
        if let Some(h) = hidden {
            b.read(&sc.x, 0, s * nd, h)?;
        }
        let Some(first) = want.first_row(s) else {
            return Ok(());
        };
        let mut row = first;
        while row < s {
            let rows = (s - row).min(LOGIT_ROWS);
            b.copy(&sc.x, row * nd, &mut sc.xl, 0, rows * nd)?;
            self.head(sc, rows, &hcs)?;
            cache
                .picks
                .emit(b, &step, want, &sc.logits, rows, c.n_vocab, out)?;
            row += rows;
        }
        Ok(())
    }

    /// Logits of `rows` rows of streams in `sc.xl` into `sc.logits`: the hyper-head, the
    /// final norm and the output projection.
    fn head(&self, sc: &mut Scratch<B>, rows: usize, hcs: &HcShape) -> Result<()> {
        let b = &*self.backend;
        b.region("head");
        let (c, p) = (&self.cfg, self.prec());
        let w = self.hc_head.weights();
        let w = (!crate::ablated!(b, HcHeadMean)).then_some(&w);
        b.hc_head(&sc.xl, rows, w, hcs, p, &mut sc.hl)?;
        let normed = if crate::ablated!(b, FinalNormOff) {
            &sc.hl
        } else {
            b.rms_norm_cast_once(
                &sc.hl,
                Some(&self.output_norm),
                rows,
                c.n_embd,
                c.rms_eps,
                p,
                &mut sc.hl2,
            )?;
            &sc.hl2
        };
        b.matmul(&self.output, None, normed, rows, p, &mut sc.logits)
    }

    /// The entries each query of a CSA layer attended to, for [`Trace`].
    fn traced_selection(
        &self,
        sc: &Scratch<B>,
        st: &LayerState<B>,
        pos0: usize,
        s: usize,
        call: &AttnCall<'_, B>,
    ) -> Result<Vec<Vec<usize>>> {
        let k = call.select.top_k;
        let rate = call.select.rate;
        let mut ids = Vec::new();
        if call.indexer_select && st.index.is_some() {
            self.backend.read_ids(&sc.sel, 0, s * k, &mut ids)?;
        }
        Ok((0..s)
            .map(|t| {
                let visible = (pos0 + t + 1) / rate;
                if ids.is_empty() {
                    return (0..visible).collect();
                }
                let mut v: Vec<usize> = ids[t * k..(t + 1) * k]
                    .iter()
                    .filter(|&&x| x >= 0 && (x as usize) < visible)
                    .map(|&x| x as usize)
                    .collect();
                v.sort_unstable();
                v.dedup();
                v
            })
            .collect())
    }

    fn check(&self, cache: &dyn Cache, tokens: Tokens<'_>) -> Result<()> {
        tokens.check(cache.len(), cache.capacity(), self.cfg.n_vocab)
    }

    pub(crate) fn downcast<'c>(
        &self,
        cache: &'c mut dyn Cache,
    ) -> Result<&'c mut DeepSeek4Cache<B>> {
        let c = cache
            .as_any_mut()
            .downcast_mut::<DeepSeek4Cache<B>>()
            .ok_or_else(|| EngineError::Config("cache belongs to another model family".into()))?;
        if c.shape.fingerprint != self.fingerprint {
            return Err(EngineError::Config(
                "cache belongs to another deepseek4 model".into(),
            ));
        }
        Ok(c)
    }

    /// As [`Model::forward`] with every row of logits, also recording per-layer outputs.
    ///
    /// # Errors
    /// As [`Model::forward`].
    pub fn forward_traced(
        &self,
        cache: &mut dyn Cache,
        tokens: &[u32],
        trace: &mut Trace,
    ) -> Result<Vec<f32>> {
        self.check(cache, Tokens::Given(tokens))?;
        let c = self.downcast(cache)?;
        let mut out = Vec::new();
        self.forward_inner(
            c,
            Tokens::Given(tokens),
            Logits::All,
            &mut out,
            Some(trace),
            None,
        )?;
        Ok(out)
    }

    /// As [`Model::forward`], also appending the final streams `[N·D]` of every token
    /// (before the hyper-head: the input [`DeepSeek4::mtp_forward`] pairs with the next
    /// token) to `hidden`.
    ///
    /// # Errors
    /// As [`Model::forward`].
    pub fn forward_with_hidden(
        &self,
        cache: &mut dyn Cache,
        tokens: &[u32],
        want: Logits,
        out: &mut Vec<f32>,
        hidden: &mut Vec<f32>,
    ) -> Result<()> {
        self.check(cache, Tokens::Given(tokens))?;
        let c = self.downcast(cache)?;
        out.clear();
        if tokens.is_empty() {
            return Ok(());
        }
        self.forward_inner(c, Tokens::Given(tokens), want, out, None, Some(hidden))
    }
}

impl<B: Backend> Model for DeepSeek4<B> {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn memory_available(&self) -> Option<u64> {
        self.backend.memory_available()
    }

    fn state_parts(&self, n_ctx: usize) -> Vec<(&'static str, u64)> {
        let r = DEFAULT_REWIND_WINDOW;
        vec![
            (
                "window and compressed entries",
                DeepSeek4Cache::<B>::bytes(&self.cache_shape(), n_ctx, r),
            ),
            ("activations", Scratch::<B>::bytes(&self.cfg, r)),
        ]
    }

    fn new_cache(&self, n_ctx: usize) -> Result<Box<dyn Cache>> {
        Ok(Box::new(self.new_ds4_cache(n_ctx)?))
    }

    fn write_cache(&self, cache: &dyn Cache, out: &mut dyn std::io::Write) -> Result<()> {
        super::state_file::write_cache(cache, out, |c: &DeepSeek4Cache<B>, w| {
            state_file::write_state(c, w)
        })
    }

    fn read_cache(&self, input: &mut dyn std::io::Read) -> Result<Box<dyn Cache>> {
        super::state_file::read_cache(input, |r, label| state_file::read_state(self, r, label))
    }

    fn forward(
        &self,
        cache: &mut dyn Cache,
        tokens: &[u32],
        logits: Logits,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        self.check(cache, Tokens::Given(tokens))?;
        let c = self.downcast(cache)?;
        if tokens.is_empty() {
            out.clear();
            return Ok(());
        }
        self.forward_inner(c, Tokens::Given(tokens), logits, out, None, None)?;
        // A prefill (not a verification block, which asks for every row) leaves a rewind
        // anchor: the next chat turn usually diverges a few tokens before its end.
        if tokens.len() > 1 && logits != Logits::All {
            c.push_anchor()?;
        }
        Ok(())
    }

    fn forward_picked(&self, cache: &mut dyn Cache) -> Result<()> {
        self.check(cache, Tokens::Picked)?;
        let c = self.downcast(cache)?;
        self.forward_inner(c, Tokens::Picked, Logits::Pick, &mut Vec::new(), None, None)
    }

    fn take_pick(&self, cache: &mut dyn Cache) -> Result<u32> {
        self.downcast(cache)?.picks.take(&*self.backend)
    }
}
