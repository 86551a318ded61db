//! The `glm5_next` family (GLM-5.3-Flash), following the text model of
//! `transformers==5.23.0` `models/glm5_next` (`Glm5NextTextModel` + the untied
//! `lm_head`), written once on the [`Backend`] interface; `docs/glm5_next.md` writes
//! its forward pass out and is the companion of these files:
//!
//! ```text
//! X[t, n] = embed[tokens[t]]                      n < hc_mult streams
//! per layer:  post, C, x = attn_hc(X)                                  (hc_pre)
//!             y = KDA(rms(x)) | MLA+DSA(rms(x))                (kda.rs, mla.rs)
//!             X = post ⊗ y + Cᵀ X                                      (hc_post)
//!             post, C, x = ffn_hc(X);  y = MLP | MoE(rms(x));  X = post ⊗ y + Cᵀ X   (moe.rs)
//! logits = lm_head · rms_final(mean_n X[t, n])                         (hc_head)
//! ```
//!
//! Weights come from a GGUF file (`load.rs`, `docs/glm5_next_gguf.md`); the
//! per-sequence state and its rewind journal are in `state.rs`, the versioned state
//! file in `state_file.rs`. **Precision policy:** the reference is PyTorch, so every
//! operation runs in its arithmetic — a model whose token embedding is BF16 computes as
//! the reference's bf16 model ([`Prec::Bf16`]: activations rounded at its cast points),
//! any other file in f32 ([`Prec::F32`]).

pub mod config;
pub mod kda;
pub mod load;
pub mod mla;
pub mod moe;
pub mod state;
pub mod state_file;
#[cfg(test)]
mod tests;

use std::sync::Arc;

use ds4_gguf::{GgmlType, GgufFile};

use super::Tokens;
use crate::backend::{
    Backend, DeltaShape, HcShape, MlaShape, OutGate, PoolSelect, Prec, Routing, Scoring,
    SelectShape,
};
use crate::loader::{Hparams, TensorLoader};
use crate::model::{Cache, Logits, Model, ModelInfo};
use crate::{EngineError, Result};
use config::{AttnKind, Config, Dtype};
use kda::{KdaCall, LinearAttention};
use load::{Ffn, HyperConnection};
use mla::{Attention, MlaCall, Selection};
use moe::MoeCall;
use state::{CacheShape, LayerShape, LayerState};

pub use state::{Anchor, DEFAULT_ANCHORS, DEFAULT_REWIND_WINDOW, Glm5NextCache};

/// The GGUF architecture names accepted: `glm5-next` (llama.cpp's) and `glm5next`
/// (files written by earlier versions of this project's converter).
pub const ARCH_NAMES: &[&str] = &["glm5-next", "glm5next"];

/// The backend operations this family uses (checked at load).
const OPS: &[&str] = &[
    "embed",
    "rms_norm",
    "layer_norm",
    "matmul",
    "swiglu",
    "add",
    "copy",
    "fill",
    "read",
    "read_ids",
    "write",
    "store_rows",
    "moe_route",
    "moe_experts",
    "hc_pre",
    "hc_post",
    "hc_head",
    "delta_net",
    "delta_replay",
    "gated_norm",
    "compress",
    "dsa_select",
    "mla_attention",
];

/// Tokens per internal forward piece: the backend's preferred prefill chunk rounded to
/// a multiple of the KDA chunk (64), so splitting a call changes nothing in the chunked
/// kernel.
fn piece<B: Backend>(b: &B) -> usize {
    b.prefill_chunk()
        .next_multiple_of(kda::CHUNK)
        .max(kda::CHUNK)
}
/// Rows of logits computed at once (bounds the logits buffer to `LOGIT_ROWS × n_vocab`).
const LOGIT_ROWS: usize = 16;

enum Attn<B: Backend> {
    Kda(LinearAttention<B>),
    Mla(Attention<B>),
}

struct Layer<B: Backend> {
    attn_hc: HyperConnection<B>,
    ffn_hc: HyperConnection<B>,
    attn_norm: B::Weight,
    ffn_norm: B::Weight,
    attn: Attn<B>,
    ffn: Ffn<B>,
}

/// A loaded `glm5_next` model on backend `B`.
pub struct Glm5Next<B: Backend> {
    backend: Arc<B>,
    cfg: Config,
    info: ModelInfo,
    tok_embd: B::Weight,
    output_norm: B::Weight,
    output: B::Weight,
    layers: Vec<Layer<B>>,
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
    /// Per layer: the MLP block's output `[s, D]`.
    pub mlp_out: Vec<Vec<f32>>,
    /// Per `full` MLA layer: each query's attended tokens (ascending).
    pub selections: Vec<(usize, Vec<Vec<usize>>)>,
}

/// The activation buffers of one forward piece ([`piece`] tokens; see the forward pass).
pub(crate) struct Scratch<B: Backend> {
    /// Streams `[P, N·D]`, the collapsed input `[P, D]`, its norm, block outputs.
    x: B::Buf,
    h: B::Buf,
    hn: B::Buf,
    y: B::Buf,
    y2: B::Buf,
    mix: B::Buf,
    // KDA
    q: B::Buf,
    k: B::Buf,
    v: B::Buf,
    g: B::Buf,
    z: B::Buf,
    fa: B::Buf,
    ga: B::Buf,
    beta: B::Buf,
    o: B::Buf,
    o2: B::Buf,
    // MLA and the indexer
    q_lat_len: usize,
    q_lat: B::Buf,
    q_lat_n: B::Buf,
    mq: B::Buf,
    lat: B::Buf,
    lat_n: B::Buf,
    attn: B::Buf,
    ik: B::Buf,
    ik_n: B::Buf,
    igs: B::Buf,
    iq: B::Buf,
    iw: B::Buf,
    /// Pool ids chosen by the last `full` layer's indexer.
    sel: B::Ids,
    // FFN
    router: B::Buf,
    expert_ids: B::Ids,
    expert_w: B::Buf,
    ff_gate: B::Buf,
    ff_up: B::Buf,
    ff_act: B::Buf,
    // Output rows
    xl: B::Buf,
    hl: B::Buf,
    hl2: B::Buf,
    logits: B::Buf,
}

impl<B: Backend> Scratch<B> {
    fn new(b: &B, c: &Config) -> Result<Self> {
        let p = piece(b);
        let (d, n) = (c.n_embd, c.hc_mult);
        let ff = c.n_ff.max(c.n_ff_shexp);
        let per_q = c.index_topk / c.index_kpool.max(1);
        Ok(Scratch {
            x: b.buf(p * n * d)?,
            h: b.buf(p * d)?,
            hn: b.buf(p * d)?,
            y: b.buf(p * d)?,
            y2: b.buf(p * d)?,
            mix: b.buf(p * (n + n * n))?,
            q: b.buf(p * c.qkv())?,
            k: b.buf(p * c.qkv())?,
            v: b.buf(p * c.qkv())?,
            g: b.buf(p * c.qkv())?,
            z: b.buf(p * c.qkv())?,
            fa: b.buf(p * c.kda_head_dim)?,
            ga: b.buf(p * c.kda_head_dim)?,
            beta: b.buf(p * c.kda_heads)?,
            o: b.buf(p * c.qkv())?,
            o2: b.buf(p * c.qkv())?,
            q_lat_len: c.q_lora_rank,
            q_lat: b.buf(p * c.q_lora_rank)?,
            q_lat_n: b.buf(p * c.q_lora_rank)?,
            mq: b.buf(p * c.mla_heads * c.qk_nope_dim)?,
            lat: b.buf(p * c.kv_lora_rank)?,
            lat_n: b.buf(p * c.kv_lora_rank)?,
            attn: b.buf(p * c.mla_heads * c.v_head_dim)?,
            ik: b.buf(p * c.index_head_dim)?,
            ik_n: b.buf(p * c.index_head_dim)?,
            igs: b.buf(p * c.index_head_dim)?,
            iq: b.buf(p * c.index_heads * c.index_head_dim)?,
            iw: b.buf(p * c.index_heads)?,
            sel: b.ids(p * per_q)?,
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

    /// Bytes of the buffers for config `c`, pieces of `p` tokens.
    fn bytes(c: &Config, p: usize) -> u64 {
        let (d, n) = (c.n_embd, c.hc_mult);
        let ff = c.n_ff.max(c.n_ff_shexp);
        let per_tok = n * d
            + 4 * d
            + n * (n + 1)
            + 7 * c.qkv()
            + c.kda_head_dim
            + c.kda_heads
            + 2 * c.q_lora_rank
            + c.mla_heads * (c.qk_nope_dim + c.v_head_dim)
            + 2 * c.kv_lora_rank
            + 3 * c.index_head_dim
            + c.index_heads * (c.index_head_dim + 1)
            + 2 * c.index_topk / c.index_kpool.max(1)
            + c.n_expert
            + 2 * c.n_expert_used
            + 3 * ff;
        4 * (p * per_tok + LOGIT_ROWS * (n * d + 2 * d + c.n_vocab)) as u64
    }
}

/// A stable hash of the hyperparameters that shape the state (FNV-1a of their text).
fn fingerprint(c: &Config) -> u64 {
    let text = format!(
        "{:?}|{}|{}|{}|{}|{}|{}|{}|{}|{}",
        c.layers,
        c.n_embd,
        c.hc_mult,
        c.kda_heads,
        c.kda_head_dim,
        c.conv_kernel,
        c.kv_lora_rank,
        c.index_head_dim,
        c.index_kpool,
        c.n_vocab
    );
    text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
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

impl<B: Backend> Glm5Next<B> {
    /// Loads a `glm5_next` model from a GGUF file (`general.architecture` `glm5-next` or
    /// `glm5next`) onto `backend`.
    ///
    /// # Errors
    /// [`EngineError::Metadata`]/[`EngineError::Config`] for bad or unrunnable
    /// hyperparameters (see [`Config::from_gguf`]), [`EngineError::MissingTensor`],
    /// [`EngineError::TensorShape`] when a tensor contradicts the metadata,
    /// [`EngineError::UnsupportedTensorType`].
    pub fn load(backend: Arc<B>, file: &Arc<GgufFile>, name: String) -> Result<Self> {
        let hp = Hparams::new(file)?;
        if !ARCH_NAMES.contains(&hp.arch()) {
            return Err(EngineError::Metadata {
                key: "general.architecture".into(),
                detail: format!(" (expected one of {ARCH_NAMES:?}, found {})", hp.arch()),
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
        crate::backend::require(&*backend, "glm5_next", OPS, prec(dtype))?;
        let n_embd = hp.usize("embedding_length")?;
        let tok_embd = l.embedding("token_embd.weight", n_embd)?;
        let n_vocab = l.rows_of("token_embd.weight")?;
        let cfg = Config::from_gguf(&hp, n_vocab, dtype)?;
        let d = cfg.n_embd;
        let output_norm = l.vector("output_norm.weight", d)?;
        let output = l.matrix("output.weight", d, Some(n_vocab))?;
        let mut layers = Vec::with_capacity(cfg.n_layer());
        for (i, &(attn, mlp)) in cfg.layers.iter().enumerate() {
            let attn = match attn {
                AttnKind::Kda => Attn::Kda(load::kda(&mut l, i, &cfg)?),
                AttnKind::Mla { full_indexer } => {
                    Attn::Mla(load::mla(&mut l, i, &cfg, full_indexer)?)
                }
            };
            layers.push(Layer {
                attn_hc: load::hc(&mut l, i, "attn", &cfg)?,
                ffn_hc: load::hc(&mut l, i, "ffn", &cfg)?,
                attn_norm: l.vector(&format!("blk.{i}.attn_norm.weight"), d)?,
                ffn_norm: l.vector(&format!("blk.{i}.ffn_norm.weight"), d)?,
                attn,
                ffn: load::ffn(&mut l, i, &cfg, mlp)?,
            });
        }
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
        Ok(Glm5Next {
            backend,
            cfg,
            info,
            tok_embd,
            output_norm,
            output,
            layers,
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

    /// A new empty cache of this model, as its concrete type.
    pub fn new_glm_cache(&self, n_ctx: usize) -> Result<Glm5NextCache<B>> {
        let shape = self.cache_shape();
        let bytes = Glm5NextCache::<B>::bytes(&shape, n_ctx)
            + Scratch::<B>::bytes(&self.cfg, piece(&*self.backend));
        crate::model::check_memory(&*self.backend, bytes, n_ctx)?;
        Glm5NextCache::new(self.backend.clone(), shape, n_ctx)
    }

    /// The precision policy (see the module header).
    fn prec(&self) -> Prec {
        prec(self.cfg.dtype)
    }

    fn delta_shape(&self) -> DeltaShape {
        let c = &self.cfg;
        DeltaShape {
            k_heads: c.kda_heads,
            k_dim: c.kda_head_dim,
            v_heads: c.kda_heads,
            v_dim: c.kda_head_dim,
            kernel: c.conv_kernel,
            gate: c.gate,
            gate_channels: c.kda_head_dim,
            out_gate: OutGate::Sigmoid,
            eps: c.rms_eps,
        }
    }

    fn cache_shape(&self) -> CacheShape {
        let c = &self.cfg;
        CacheShape {
            layers: c
                .layers
                .iter()
                .map(|l| match l.0 {
                    AttnKind::Kda => LayerShape::Kda,
                    AttnKind::Mla { full_indexer } => LayerShape::Mla { full_indexer },
                })
                .collect(),
            delta: self.delta_shape(),
            rkv: c.kv_lora_rank,
            index_head_dim: c.index_head_dim,
            kpool: c.index_kpool,
            fingerprint: self.fingerprint,
        }
    }

    fn hc_shape(&self) -> HcShape {
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

    fn mla_shape(&self) -> MlaShape {
        let c = &self.cfg;
        let scale_dim = if crate::ablated!(self.backend, MlaScaleVHeadDim) {
            c.v_head_dim
        } else {
            c.qk_nope_dim
        };
        MlaShape {
            heads: c.mla_heads,
            qk_dim: c.qk_nope_dim,
            v_dim: c.v_head_dim,
            rank: c.kv_lora_rank,
            scale: (scale_dim as f32).powf(-0.5),
            select: Some(PoolSelect {
                pool: c.index_kpool,
                per_query: c.index_topk / c.index_kpool,
                tail: c.index_select_tail && !crate::ablated!(self.backend, DsaNoTail),
            }),
        }
    }

    fn select_shape(&self) -> SelectShape {
        let c = &self.cfg;
        SelectShape {
            heads: c.index_heads,
            dim: c.index_head_dim,
            rate: c.index_kpool,
            top_k: c.index_topk / c.index_kpool,
            scale: (c.index_head_dim as f32).powf(-0.5),
            weights_scale: (c.index_heads as f32).powf(-0.5),
        }
    }

    fn routing(&self) -> Routing {
        let c = &self.cfg;
        Routing {
            scoring: Scoring::Sigmoid,
            n_expert: c.n_expert,
            n_used: c.n_expert_used,
            n_group: c.n_group,
            topk_group: c.topk_group,
            norm: c.norm_topk_prob != crate::ablated!(self.backend, MoeRenormFlipped),
            scale: if crate::ablated!(self.backend, MoeRoutedScaling1) {
                1.0
            } else {
                c.routed_scale
            },
        }
    }

    /// Evaluates `tokens` on `cache` and appends the logits rows `want` asks for,
    /// optionally recording per-layer outputs.
    fn forward_inner(
        &self,
        cache: &mut Glm5NextCache<B>,
        tokens: Tokens<'_>,
        want: Logits,
        out: &mut Vec<f32>,
        mut trace: Option<&mut Trace>,
    ) -> Result<()> {
        out.clear();
        if cache.scratch.is_none() {
            cache.scratch = Some(Scratch::new(&*self.backend, &self.cfg)?);
        }
        for (piece, w) in tokens.pieces(piece(&*self.backend), want) {
            let mut sc = cache.scratch.take().expect("allocated above");
            let r = self
                .backend
                .run(|| self.forward_piece(cache, &mut sc, piece, w, out, trace.as_deref_mut()));
            cache.scratch = Some(sc);
            if r.is_err() {
                // The state may be half-updated: only a reset is consistent.
                let _ = cache.truncate(0);
            }
            r?;
        }
        Ok(())
    }

    fn forward_piece(
        &self,
        cache: &mut Glm5NextCache<B>,
        sc: &mut Scratch<B>,
        tokens: Tokens<'_>,
        want: Logits,
        out: &mut Vec<f32>,
        mut trace: Option<&mut Trace>,
    ) -> Result<()> {
        let _span =
            tracing::debug_span!("glm5_next_forward", tokens = tokens.len(), pos = cache.len)
                .entered();
        let b = &*self.backend;
        let c = &self.cfg;
        let s = tokens.len();
        let d = c.n_embd;
        let p = self.prec();
        let hcs = self.hc_shape();
        let nd = hcs.n * d;
        let pos0 = cache.len;
        let decode = s == 1 && pos0 > 0;
        let plan = cache.plan(s, decode);
        if let state::Plan::Fold(pos) = plan {
            cache.fold(pos)?;
        }
        let step = tokens.step(b, &cache.picks, pos0)?;
        b.region("embedding");
        b.embed(&step, &self.tok_embd, hcs.n, p, &mut sc.x)?;
        if let Some(tr) = trace.as_deref_mut() {
            // Stream 0 of each token is its embedding.
            for t in 0..s {
                b.read(&sc.x, t * nd, d, &mut tr.embed)?;
            }
        }
        let delta = self.delta_shape();
        let (mla_shape, sel_shape) = (self.mla_shape(), self.select_shape());
        // Whether `sc.sel` holds the previous layer's choice for a `shared` layer.
        let mut passed = false;
        for (i, layer) in self.layers.iter().enumerate() {
            let _l = tracing::trace_span!("layer", i).entered();
            b.region(match layer.attn {
                Attn::Kda(_) => "KDA attention",
                Attn::Mla(_) => "MLA + DSA attention",
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
            b.rms_norm(
                &sc.h,
                Some(&layer.attn_norm),
                s,
                d,
                c.rms_eps,
                p,
                &mut sc.hn,
            )?;
            match (&layer.attn, &mut cache.layers[i]) {
                (Attn::Kda(a), LayerState::Kda(st)) => {
                    let call = KdaCall {
                        step: &step,
                        s,
                        decode,
                        plan,
                        shape: &delta,
                        p,
                    };
                    a.forward(b, sc, st, &call)?;
                }
                (Attn::Mla(a), LayerState::Mla(st)) => {
                    let full = a.indexer.is_some();
                    let all_dense = crate::ablated!(self.backend, DsaDense);
                    let shared_dense = crate::ablated!(self.backend, DsaSharedDense);
                    let dense = all_dense || (shared_dense && !full);
                    let selection = match (full, passed) {
                        _ if dense => Selection::Dense,
                        (true, _) => Selection::Own,
                        (false, true) => Selection::Shared,
                        (false, false) => Selection::Dense,
                    };
                    let call = MlaCall {
                        step: &step,
                        s,
                        n_ctx: cache.n_ctx,
                        rms_eps: c.rms_eps,
                        ln_eps: c.ln_eps,
                        shape: &mla_shape,
                        select: &sel_shape,
                        p,
                        selection,
                        k_norm: !crate::ablated!(self.backend, DsaKNormOff),
                        q_a_norm: !crate::ablated!(self.backend, MlaQANormOff),
                        kv_a_norm: !crate::ablated!(self.backend, MlaKvANormOff),
                    };
                    a.forward(b, sc, st, &call)?;
                    if let (Some(tr), true) = (trace.as_deref_mut(), full) {
                        tr.selections.push((
                            i,
                            self.traced_selection(sc, selection, pos0, s, &mla_shape)?,
                        ));
                    }
                    passed = selection == Selection::Own && c.passes_selection(i);
                }
                _ => unreachable!("cache layers are built from the same config"),
            }
            b.hc_post(&mut sc.x, &sc.y, &sc.mix, s, &hcs, p)?;
            if let Some(tr) = trace.as_deref_mut() {
                let mut v = Vec::new();
                b.read(&sc.y, 0, s * d, &mut v)?;
                tr.attn_out.push(v);
            }
            b.region(match layer.ffn {
                Ffn::Dense(_) => "dense FFN",
                Ffn::Moe(_) => "MoE FFN",
            });
            b.hc_pre(
                &sc.x,
                s,
                &layer.ffn_hc.weights(),
                &hcs,
                p,
                &mut sc.h,
                &mut sc.mix,
            )?;
            b.rms_norm(&sc.h, Some(&layer.ffn_norm), s, d, c.rms_eps, p, &mut sc.hn)?;
            match &layer.ffn {
                Ffn::Dense(m) => m.forward(
                    b,
                    &sc.hn,
                    s,
                    limit(c.swiglu_shexp[i]),
                    p,
                    [&mut sc.ff_gate, &mut sc.ff_up, &mut sc.ff_act],
                    &mut sc.y,
                )?,
                Ffn::Moe(m) => {
                    let call = MoeCall {
                        step: &step,
                        s,
                        d,
                        routing: self.routing(),
                        limit_exp: if crate::ablated!(self.backend, SwigluClampOff) {
                            None
                        } else {
                            limit(c.swiglu_exp[i])
                        },
                        limit_shexp: limit(c.swiglu_shexp[i]),
                        p,
                        shared: !crate::ablated!(self.backend, MoeSharedExpertOff),
                    };
                    m.forward(b, sc, &call)?;
                }
            }
            b.hc_post(&mut sc.x, &sc.y, &sc.mix, s, &hcs, p)?;
            if let Some(tr) = trace.as_deref_mut() {
                let mut v = Vec::new();
                b.read(&sc.y, 0, s * d, &mut v)?;
                tr.mlp_out.push(v);
                let mut v = Vec::new();
                b.read(&sc.x, 0, s * nd, &mut v)?;
                tr.streams.push(v);
            }
        }
        cache.len += s;
        if let state::Plan::Capture(r) = plan {
            cache.base = pos0 + r;
        }
        let Some(first) = want.first_row(s) else {
            return Ok(());
        };
        b.region("head");
        let mut row = first;
        while row < s {
            let rows = (s - row).min(LOGIT_ROWS);
            b.copy(&sc.x, row * nd, &mut sc.xl, 0, rows * nd)?;
            b.hc_head(&sc.xl, rows, None, &hcs, p, &mut sc.hl)?;
            let normed = if crate::ablated!(self.backend, FinalNormOff) {
                &sc.hl
            } else {
                b.rms_norm(
                    &sc.hl,
                    Some(&self.output_norm),
                    rows,
                    d,
                    c.rms_eps,
                    p,
                    &mut sc.hl2,
                )?;
                &sc.hl2
            };
            b.matmul(&self.output, None, normed, rows, p, &mut sc.logits)?;
            cache
                .picks
                .emit(b, &step, want, &sc.logits, rows, c.n_vocab, out)?;
            row += rows;
        }
        Ok(())
    }

    /// The attended tokens of each query of a `full` layer, for [`Trace`].
    fn traced_selection(
        &self,
        sc: &Scratch<B>,
        selection: Selection,
        pos0: usize,
        s: usize,
        shape: &MlaShape,
    ) -> Result<Vec<Vec<usize>>> {
        let per_q = shape.select.map_or(0, |p| p.per_query);
        let ids = match selection {
            Selection::Own | Selection::Shared => {
                let mut v = Vec::new();
                self.backend.read_ids(&sc.sel, 0, s * per_q, &mut v)?;
                Some(v)
            }
            Selection::Dense => None,
        };
        Ok((0..s)
            .map(|t| {
                let pos = pos0 + t;
                match (&ids, shape.select) {
                    (Some(ids), Some(ps)) => {
                        let mut toks: Vec<usize> = ids[t * per_q..(t + 1) * per_q]
                            .iter()
                            .filter(|&&x| x >= 0)
                            .flat_map(|&x| x as usize * ps.pool..(x as usize + 1) * ps.pool)
                            .collect();
                        if ps.tail {
                            toks.extend(ps.pool * ((pos + 1) / ps.pool)..pos + 1);
                        }
                        toks
                    }
                    _ => (0..=pos).collect(),
                }
            })
            .collect())
    }

    fn check(&self, cache: &dyn Cache, tokens: Tokens<'_>) -> Result<()> {
        tokens.check(cache.len(), cache.capacity(), self.cfg.n_vocab)
    }

    fn downcast<'c>(&self, cache: &'c mut dyn Cache) -> Result<&'c mut Glm5NextCache<B>> {
        let c = cache
            .as_any_mut()
            .downcast_mut::<Glm5NextCache<B>>()
            .ok_or_else(|| EngineError::Config("cache belongs to another model family".into()))?;
        if c.shape.fingerprint != self.fingerprint {
            return Err(EngineError::Config(
                "cache belongs to another glm5_next model".into(),
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
        self.forward_inner(c, Tokens::Given(tokens), Logits::All, &mut out, Some(trace))?;
        Ok(out)
    }
}

impl<B: Backend> Model for Glm5Next<B> {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn prefill_chunk(&self) -> usize {
        piece(&*self.backend)
    }

    fn memory_available(&self) -> Option<u64> {
        self.backend.memory_available()
    }

    fn state_parts(&self, n_ctx: usize) -> Vec<(&'static str, u64)> {
        let mut v = Glm5NextCache::<B>::parts(&self.cache_shape(), n_ctx).to_vec();
        v.push((
            "activations",
            Scratch::<B>::bytes(&self.cfg, piece(&*self.backend)),
        ));
        v
    }

    fn new_cache(&self, n_ctx: usize) -> Result<Box<dyn Cache>> {
        Ok(Box::new(self.new_glm_cache(n_ctx)?))
    }

    fn write_cache(&self, cache: &dyn Cache, out: &mut dyn std::io::Write) -> Result<()> {
        super::state_file::write_cache(cache, out, |c: &Glm5NextCache<B>, w| {
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
        self.forward_inner(c, Tokens::Given(tokens), logits, out, None)?;
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
        self.forward_inner(c, Tokens::Picked, Logits::Pick, &mut Vec::new(), None)
    }

    fn take_pick(&self, cache: &mut dyn Cache) -> Result<u32> {
        self.downcast(cache)?.picks.take(&*self.backend)
    }
}
