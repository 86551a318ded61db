//! Hyperparameters of a `deepseek4` model (DeepSeek-V4-Flash), read from the GGUF
//! metadata llama.cpp's converter writes (`docs/deepseek4_gguf.md`, keys
//! `deepseek4.*`), and the checks that reject files the reference cannot run or whose
//! metadata contradicts its tensors. Semantics: `configuration_deepseek_v4.py`
//! (`docs/deepseek4.md` §1).
//!
//! Layer kinds: `attention.compress_ratios[i]` 0 is a sliding-window layer; any other
//! rate is a compressed layer, CSA (overlapping windows and a lightning indexer) when
//! its compressor projects to `2·head_dim` (what llama.cpp derives from the rate 4) and
//! HCA (plain windows) when it projects to `head_dim`. MoE routing: the first
//! `hash_layer_count` layers route by the token-id table `ffn_gate_tid2eid`, the rest
//! by sqrt-softplus top-k with a correction bias.

use ds4_gguf::{GgufFile, Value};

use crate::backend::Yarn;
use crate::loader::Hparams;
use crate::{EngineError, Result};

/// The attention of one layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttnKind {
    /// Sliding-window attention only (`sliding_attention`, ratio 0).
    Sliding,
    /// Compressed sparse attention: overlapping windows of `rate` tokens and the
    /// lightning indexer's top-k (`compressed_sparse_attention`).
    Csa { rate: usize },
    /// Heavily compressed attention: every entry of windows of `rate` tokens
    /// (`heavily_compressed_attention`).
    Hca { rate: usize },
}

impl AttnKind {
    /// Source tokens per compressed entry (0 for sliding layers).
    pub fn rate(self) -> usize {
        match self {
            AttnKind::Sliding => 0,
            AttnKind::Csa { rate } | AttnKind::Hca { rate } => rate,
        }
    }
}

/// Compute precision of activations: the reference's model dtype.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dtype {
    F32,
    /// Activations rounded to bfloat16 at the reference's cast points (doc §11).
    Bf16,
}

/// Hyperparameters (symbols of `docs/deepseek4.md` in brackets).
#[derive(Debug, Clone)]
pub struct Config {
    /// `[D]`, `[V]`.
    pub n_embd: usize,
    pub n_vocab: usize,
    pub n_ctx_train: usize,
    /// Per trunk layer: attention kind and whether its MoE routes by hash.
    pub layers: Vec<(AttnKind, bool)>,
    pub rms_eps: f32,
    /// `[H]`, `[hd]`, `[rd]` (trailing rotated channels), `[rq]`.
    pub n_head: usize,
    pub head_dim: usize,
    pub rope_dim: usize,
    pub q_lora_rank: usize,
    /// `[G]`, `[ro]`.
    pub o_groups: usize,
    pub o_lora_rank: usize,
    /// `[W]`: tokens a query sees in the window, itself included.
    pub sliding_window: usize,
    /// The `main` rope (sliding layers) and the `compress` rope (CSA/HCA layers, their
    /// compressors and the indexer).
    pub rope_theta: f32,
    pub compress_rope_theta: f32,
    pub yarn: Option<Yarn>,
    /// Lightning indexer `[Hi]`, `[di]`, `[Ktop]`.
    pub index_heads: usize,
    pub index_head_dim: usize,
    pub index_topk: usize,
    /// MoE `[E]`, `[k]`, `[I]` (routed and shared experts), renormalise, scaling.
    pub n_expert: usize,
    pub n_expert_used: usize,
    pub n_ff_exp: usize,
    pub n_ff_shexp: usize,
    pub norm_topk_prob: bool,
    pub routed_scale: f32,
    /// SwiGLU clamps per layer (routed, shared; `f32::INFINITY` = none).
    pub swiglu_exp: Vec<f32>,
    pub swiglu_shexp: Vec<f32>,
    /// mHC `[N]`, Sinkhorn iterations, `hc_eps`.
    pub hc_mult: usize,
    pub hc_sinkhorn_iters: usize,
    pub hc_eps: f32,
    /// MTP layers after the trunk (`nextn_predict_layers`, counted in `block_count`).
    pub n_nextn: usize,
    pub dtype: Dtype,
}

/// `gguf` `LLAMA_EXPERT_GATING_FUNC_TYPE_SQRT_SOFTPLUS`.
pub const GATING_SQRT_SOFTPLUS: usize = 4;

impl Config {
    /// Reads and validates the hyperparameters of `file`. `n_vocab` comes from the token
    /// embedding's shape; `dtype` from its type.
    ///
    /// # Errors
    /// [`EngineError::Metadata`] for a missing or mistyped key (naming it);
    /// [`EngineError::Config`] for values the reference cannot run or metadata that
    /// contradicts the tensors (a compressed layer without compressor tensors is a
    /// [`EngineError::MissingTensor`]).
    pub fn from_gguf(m: &Hparams, n_vocab: usize, dtype: Dtype) -> Result<Config> {
        let file = m.file();
        let n_all = m.usize("block_count")?;
        let n_nextn = m.usize_or("nextn_predict_layers", 0)?;
        // llama.cpp drops the MTP layers when the file has none of their tensors.
        let n_nextn = if n_nextn > 0 && n_nextn < n_all && !has_nextn(file, n_all - n_nextn) {
            0
        } else {
            n_nextn
        };
        let n_layer = n_all
            .checked_sub(n_nextn)
            .filter(|&n| n > 0)
            .ok_or_else(|| {
                m.err(
                    "block_count",
                    format!(" ({n_all}, with {n_nextn} MTP layers: no trunk layer)"),
                )
            })?;
        let n_embd = m.usize("embedding_length")?;
        let head_dim = m.usize("attention.key_length")?;
        if let Some(v) = m.usize_opt("attention.value_length")?
            && v != head_dim
        {
            return Err(m.err(
                "attention.value_length",
                format!(
                    " ({v}; DeepSeek-V4's key is its value: it must equal attention.key_length = {head_dim})"
                ),
            ));
        }
        let ratios = compress_ratios(m, n_all)?;
        let hash_layers = m.usize_or("hash_layer_count", 0)?;
        let mut layers = Vec::with_capacity(n_layer);
        for (i, &r) in ratios.iter().enumerate().take(n_layer) {
            layers.push((layer_kind(file, i, r, head_dim)?, i < hash_layers));
        }
        if hash_layers > n_layer {
            return Err(m.err(
                "hash_layer_count",
                format!(" ({hash_layers}, more than the {n_layer} layers)"),
            ));
        }
        let per_layer = |k: &str| -> Result<Option<Vec<f32>>> {
            let as_limit = |v: &Value| {
                v.as_f64()
                    .map(|x| if x <= 0.0 { f32::INFINITY } else { x as f32 })
            };
            Ok(m.per_layer(k, n_all, as_limit)?.map(|mut v| {
                v.truncate(n_layer);
                v
            }))
        };
        let swiglu_exp = per_layer("swiglu_clamp_exp")?.unwrap_or(vec![f32::INFINITY; n_layer]);
        let swiglu_shexp = per_layer("swiglu_clamp_shexp")?.unwrap_or_else(|| swiglu_exp.clone());
        let gating = m.usize("expert_gating_func")?;
        if gating != GATING_SQRT_SOFTPLUS {
            return Err(m.err(
                "expert_gating_func",
                format!(" ({gating}; DeepSeek-V4 scores experts with sqrt(softplus) = {GATING_SQRT_SOFTPLUS})"),
            ));
        }
        let yarn = match m.get("rope.scaling.type").and_then(Value::as_str) {
            None | Some("none") => None,
            Some("yarn") => Some(Yarn {
                factor: m.f32("rope.scaling.factor")?,
                original_max_position: m.usize("rope.scaling.original_context_length")?,
                beta_fast: m.f32_or("rope.scaling.yarn_beta_fast", 32.0)?,
                beta_slow: m.f32_or("rope.scaling.yarn_beta_slow", 1.0)?,
                // The reference forces the attention factor to 1 (llama.cpp cancels
                // ggml's `1 + 0.1 ln(factor)` the same way).
                mscale: 1.0,
                truncate: true,
            }),
            Some(other) => {
                return Err(m.err(
                    "rope.scaling.type",
                    format!(" ('{other}'; DeepSeek-V4's compress rope is plain or 'yarn')"),
                ));
            }
        };
        let n_ff_exp = m.usize("expert_feed_forward_length")?;
        let cfg = Config {
            n_embd,
            n_vocab,
            n_ctx_train: m.usize_opt("context_length")?.unwrap_or(4096),
            layers,
            rms_eps: m.f32_or("attention.layer_norm_rms_epsilon", 1e-6)?,
            n_head: m.usize("attention.head_count")?,
            head_dim,
            rope_dim: m.usize("rope.dimension_count")?,
            q_lora_rank: m.usize("attention.q_lora_rank")?,
            o_groups: m.usize("attention.output_group_count")?,
            o_lora_rank: m.usize("attention.output_lora_rank")?,
            sliding_window: m.usize("attention.sliding_window")?,
            rope_theta: m.f32_or("rope.freq_base", 10000.0)?,
            compress_rope_theta: m.f32("attention.compress_rope_freq_base")?,
            yarn,
            index_heads: m.usize_or("attention.indexer.head_count", 0)?,
            index_head_dim: m.usize_or("attention.indexer.key_length", 0)?,
            index_topk: m.usize_or("attention.indexer.top_k", 0)?,
            n_expert: m.usize("expert_count")?,
            n_expert_used: m.usize("expert_used_count")?,
            n_ff_exp,
            n_ff_shexp: n_ff_exp * m.usize_or("expert_shared_count", 1)?,
            norm_topk_prob: m.bool_opt("expert_weights_norm")?.unwrap_or(true),
            routed_scale: m.f32_or("expert_weights_scale", 1.0)?,
            swiglu_exp,
            swiglu_shexp,
            hc_mult: m.usize("hyper_connection.count")?,
            hc_sinkhorn_iters: m.usize("hyper_connection.sinkhorn_iterations")?,
            hc_eps: m.f32_or("hyper_connection.epsilon", 1e-6)?,
            n_nextn,
            dtype,
        };
        cfg.validate(m)?;
        Ok(cfg)
    }

    /// Checks the values the forward pass relies on, naming the key at fault.
    fn validate(&self, m: &Hparams) -> Result<()> {
        let pos = |v: usize, k: &str| {
            if v == 0 {
                Err(m.err(k, " (must be positive)"))
            } else {
                Ok(())
            }
        };
        pos(self.n_embd, "embedding_length")?;
        pos(self.n_head, "attention.head_count")?;
        pos(self.head_dim, "attention.key_length")?;
        pos(self.q_lora_rank, "attention.q_lora_rank")?;
        pos(self.sliding_window, "attention.sliding_window")?;
        pos(self.hc_mult, "hyper_connection.count")?;
        pos(
            self.hc_sinkhorn_iters,
            "hyper_connection.sinkhorn_iterations",
        )?;
        pos(self.o_groups, "attention.output_group_count")?;
        pos(self.o_lora_rank, "attention.output_lora_rank")?;
        if self.rope_dim > self.head_dim || !self.rope_dim.is_multiple_of(2) {
            return Err(m.err(
                "rope.dimension_count",
                format!(
                    " ({}; the rotated channels must be an even number of at most attention.key_length = {})",
                    self.rope_dim, self.head_dim
                ),
            ));
        }
        if !self.n_head.is_multiple_of(self.o_groups) {
            return Err(m.err(
                "attention.output_group_count",
                format!(
                    " ({}; it must divide attention.head_count = {})",
                    self.o_groups, self.n_head
                ),
            ));
        }
        if self.n_expert_used == 0 || self.n_expert_used > self.n_expert {
            return Err(m.err(
                "expert_used_count",
                format!(
                    " ({}; must be in 1..=expert_count = {})",
                    self.n_expert_used, self.n_expert
                ),
            ));
        }
        if self
            .layers
            .iter()
            .any(|l| matches!(l.0, AttnKind::Csa { .. }))
        {
            pos(self.index_heads, "attention.indexer.head_count")?;
            pos(self.index_head_dim, "attention.indexer.key_length")?;
            pos(self.index_topk, "attention.indexer.top_k")?;
            if self.rope_dim > self.index_head_dim {
                return Err(m.err(
                    "attention.indexer.key_length",
                    format!(
                        " ({}; the indexer rotates rope.dimension_count = {} channels of each head)",
                        self.index_head_dim, self.rope_dim
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Number of trunk layers `[L]`.
    pub fn n_layer(&self) -> usize {
        self.layers.len()
    }
}

/// Whether the MTP block `blk.{i}` of a file is present (llama.cpp's probe).
fn has_nextn(file: &GgufFile, i: usize) -> bool {
    file.tensor(&format!("blk.{i}.nextn.eh_proj.weight"))
        .is_some()
}

/// `attention.compress_ratios`: one integer per block (at least `block_count`).
fn compress_ratios(m: &Hparams, n_all: usize) -> Result<Vec<i64>> {
    let k = "attention.compress_ratios";
    let items = m
        .get(k)
        .ok_or_else(|| m.err(k, " (one compression rate per layer: 0 = sliding window)"))?;
    let items = items.as_array().ok_or_else(|| {
        m.err(
            k,
            format!(" (expected an integer array, found {})", items.describe()),
        )
    })?;
    if items.len() < n_all {
        return Err(m.err(
            k,
            format!(
                " ({} entries, shorter than block_count = {n_all})",
                items.len()
            ),
        ));
    }
    items
        .iter()
        .map(|v| {
            v.as_i64()
                .ok_or_else(|| m.err(k, format!(" (bad element {})", v.describe())))
        })
        .collect()
}

/// The attention kind of layer `i` with compression rate `r`, checked against its
/// tensors (the compressor's width tells CSA from HCA).
fn layer_kind(file: &GgufFile, i: usize, r: i64, head_dim: usize) -> Result<AttnKind> {
    let comp = format!("blk.{i}.attn_compressor_kv.weight");
    let info = file.tensor(&comp);
    if r == 0 {
        if info.is_some() {
            return Err(EngineError::Config(format!(
                "layer {i}: attention.compress_ratios[{i}] is 0 (a sliding-window layer) but the file has \
                 compressor tensors ({comp})"
            )));
        }
        return Ok(AttnKind::Sliding);
    }
    let rate = usize::try_from(r).map_err(|_| {
        EngineError::Config(format!(
            "layer {i}: unknown layer type (attention.compress_ratios[{i}] = {r}; 0 is a sliding-window \
             layer, a positive rate a compressed one)"
        ))
    })?;
    let info = info.ok_or_else(|| EngineError::MissingTensor(comp.clone()))?;
    let width = info.dims.get(1).copied().unwrap_or(1) as usize;
    let indexer = file
        .tensor(&format!("blk.{i}.indexer.proj.weight"))
        .is_some();
    match (width / head_dim.max(1), width % head_dim.max(1), indexer) {
        (2, 0, true) => Ok(AttnKind::Csa { rate }),
        (1, 0, false) => Ok(AttnKind::Hca { rate }),
        (2, 0, false) => Err(EngineError::Config(format!(
            "layer {i}: tensor 'blk.{i}.indexer.proj.weight' is missing: the compressor '{comp}' has \
             2·head_dim outputs (CSA), whose lightning indexer needs it"
        ))),
        (1, 0, true) => Err(EngineError::Config(format!(
            "layer {i}: the compressor '{comp}' has head_dim = {head_dim} outputs (HCA) but the file has indexer \
             tensors (CSA)"
        ))),
        _ => Err(EngineError::Config(format!(
            "layer {i}: unknown layer type: the compressor '{comp}' has {width} outputs, neither head_dim = \
             {head_dim} (HCA) nor 2·head_dim (CSA)"
        ))),
    }
}
