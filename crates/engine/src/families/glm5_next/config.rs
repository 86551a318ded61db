//! Hyperparameters of a `glm5_next` model, read from GGUF metadata, and the checks that
//! reject models the reference cannot run.
//!
//! Keys are llama.cpp's for this architecture (`docs/glm5_next_gguf.md` has the full
//! table; `{arch}` is `glm5-next`, or `glm5next` in files of earlier versions of our
//! converter): `{arch}.attention.*` for MLA and the DSA indexer
//! (`attention.indexer.{head_count,key_length,top_k,kpool,kpool_select_tail,types}`),
//! `{arch}.kda.*` and `{arch}.ssm.conv_kernel` for KDA, `{arch}.hyper_connection.*` for
//! mHC, the DeepSeek-style `{arch}.expert_*` keys for the MoE. A per-layer
//! `attention.head_count_kv` array marks KDA layers with 0 (llama.cpp writes 1 for an
//! MLA layer, earlier files the head count: any non-zero value is MLA). Absent keys
//! take llama.cpp's defaults: `kda.head_count` — this project's one extension, written
//! only when the KDA head count differs from `attention.head_count` — defaults to
//! `attention.head_count`, `attention.indexer.kpool_select_tail` to true,
//! `swiglu_clamp_shexp` to `swiglu_clamp_exp`, `expert_gating_func` to sigmoid (0 is
//! read as sigmoid too), `nextn_predict_layers` (MTP layers counted in `block_count`)
//! to 0. The semantics are `configuration_glm5_next.py` (doc §1).

use ds4_gguf::Value;

pub use crate::backend::Gate;
use crate::loader::Hparams;
use crate::{EngineError, Result};

/// The attention of one layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttnKind {
    /// Kimi delta attention (`linear_attention`).
    Kda,
    /// MLA with the DSA indexer (`indexed_attention`); `full` runs its own indexer,
    /// otherwise (`shared`) it reuses the previous layer's selection.
    Mla { full_indexer: bool },
}

/// The MLP of one layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MlpKind {
    Dense,
    Moe,
}

/// Compute precision of activations: the reference's model dtype.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dtype {
    F32,
    /// Activations rounded to bfloat16 at the reference's cast points (doc §10).
    Bf16,
}

/// Hyperparameters (symbols of `docs/glm5_next.md` in brackets).
#[derive(Debug, Clone)]
pub struct Config {
    /// The file's architecture name (the prefix of its keys).
    pub arch: String,
    /// `[D]`
    pub n_embd: usize,
    /// `[V]`
    pub n_vocab: usize,
    pub n_ctx_train: usize,
    pub layers: Vec<(AttnKind, MlpKind)>,
    /// RMSNorm eps.
    pub rms_eps: f32,
    /// The indexer's `k_norm` LayerNorm eps (1e-6 in the reference).
    pub ln_eps: f32,
    /// mHC: streams `[N]`, Sinkhorn iterations, eps.
    pub hc_mult: usize,
    pub hc_sinkhorn_iters: usize,
    pub hc_eps: f32,
    /// KDA: heads `[Hk]`, head dim `[dk]` (= dv), conv kernel `[Kc]`, gate.
    pub kda_heads: usize,
    /// Whether `kda_heads` comes from `kda.head_count` (else `attention.head_count`).
    pub kda_heads_from_key: bool,
    pub kda_head_dim: usize,
    pub conv_kernel: usize,
    pub gate: Gate,
    /// MLA: heads `[Ha]`, LoRA ranks `[rq]`, `[rkv]`, `[dn]`, `[dv]`.
    pub mla_heads: usize,
    pub q_lora_rank: usize,
    pub kv_lora_rank: usize,
    pub qk_nope_dim: usize,
    pub v_head_dim: usize,
    /// DSA indexer: `[Hi]`, `[di]`, `[P]`, `[Ktop]`, tail.
    pub index_heads: usize,
    pub index_head_dim: usize,
    pub index_kpool: usize,
    pub index_topk: usize,
    pub index_select_tail: bool,
    /// Dense MLP `[Id]`.
    pub n_ff: usize,
    /// MoE: `[E]`, `[k]`, groups, kept groups, `[I]`, shared intermediate, renormalise,
    /// routed scaling.
    pub n_expert: usize,
    pub n_expert_used: usize,
    pub n_group: usize,
    pub topk_group: usize,
    pub n_ff_exp: usize,
    pub n_ff_shexp: usize,
    pub norm_topk_prob: bool,
    pub routed_scale: f32,
    /// SwiGLU clamp per layer for routed experts and for the dense MLP / shared expert
    /// (`swiglu_limit`; `f32::INFINITY` = none).
    pub swiglu_exp: Vec<f32>,
    pub swiglu_shexp: Vec<f32>,
    pub dtype: Dtype,
}

impl Config {
    /// Reads and validates the hyperparameters. `n_vocab` comes from the token
    /// embedding's shape; `dtype` from the type of the token embedding (BF16 → the
    /// bf16 model of the reference, anything else → f32 compute).
    ///
    /// # Errors
    /// [`EngineError::Metadata`] for a missing or mistyped key; [`EngineError::Config`]
    /// for values the reference rejects or cannot run (a `shared` indexer layer not
    /// directly after a `full` MLA layer, `index_topk` not a multiple of `index_kpool`,
    /// RoPE dimensions, …).
    pub fn from_gguf(m: &Hparams, n_vocab: usize, dtype: Dtype) -> Result<Config> {
        let file = m.file();
        // llama.cpp counts the MTP (NextN) layers in `block_count` and its per-layer
        // arrays; the trunk is the first `block_count − nextn_predict_layers`.
        let n_all = m.usize("block_count")?;
        let n_layer = n_all.saturating_sub(m.usize_or("nextn_predict_layers", 0)?);
        let per_layer =
            |k: &str, conv: &dyn Fn(&Value) -> Option<f32>| -> Result<Option<Vec<f32>>> {
                Ok(m.per_layer(k, n_all, conv)?.map(|mut v| {
                    v.truncate(n_layer);
                    v
                }))
            };
        if n_layer == 0 {
            return Err(m.err("block_count", " (must be at least 1)"));
        }
        let head_count_kv = m
            .per_layer("attention.head_count_kv", n_all, |v| v.as_u64())?
            .ok_or_else(|| {
                m.err(
                    "attention.head_count_kv",
                    " (a per-layer array: 0 marks a KDA layer)",
                )
            })?;
        let indexer_full = m
            .per_layer("attention.indexer.types", n_all, |v| v.as_bool())?
            .unwrap_or_else(|| vec![true; n_all]);
        let mut layers = Vec::with_capacity(n_layer);
        for i in 0..n_layer {
            let attn = if head_count_kv[i] == 0 {
                AttnKind::Kda
            } else {
                AttnKind::Mla {
                    full_indexer: indexer_full[i],
                }
            };
            let mlp = if file
                .tensor(&format!("blk.{i}.ffn_gate_inp.weight"))
                .is_some()
            {
                MlpKind::Moe
            } else {
                MlpKind::Dense
            };
            layers.push((attn, mlp));
        }
        let mla_heads = m.usize("attention.head_count")?;
        if let Some(lead) = m.usize_opt("leading_dense_block_count")?
            && let Some(i) = layers
                .iter()
                .take(lead.min(n_layer))
                .position(|l| l.1 == MlpKind::Moe)
        {
            return Err(m.err(
                "leading_dense_block_count",
                format!(" ({lead}, but layer {i} has router weights blk.{i}.ffn_gate_inp.weight)"),
            ));
        }
        let n_expert = m.usize_opt("expert_count")?.unwrap_or(0);
        let n_ff_exp = m.usize_opt("expert_feed_forward_length")?.unwrap_or(0);
        let n_shared = m.usize_opt("expert_shared_count")?.unwrap_or(1);
        let inf = |x: Option<Vec<f32>>| x.unwrap_or_else(|| vec![f32::INFINITY; n_layer]);
        let as_limit = |v: &Value| {
            v.as_f64()
                .map(|x| if x <= 0.0 { f32::INFINITY } else { x as f32 })
        };
        let swiglu_exp = inf(per_layer("swiglu_clamp_exp", &as_limit)?);
        // As llama.cpp: without its own key the shared expert takes the routed clamp.
        let swiglu_shexp =
            per_layer("swiglu_clamp_shexp", &as_limit)?.unwrap_or_else(|| swiglu_exp.clone());
        // 0 (none) means sigmoid for this architecture, as in llama.cpp.
        if let Some(f) = m.usize_opt("expert_gating_func")?
            && f != 2
            && f != 0
            && n_expert > 0
        {
            return Err(m.err(
                "expert_gating_func",
                format!(" ({f}; glm5_next routes with sigmoid = 2)"),
            ));
        }
        if let Some(r) = m.usize_opt("rope.dimension_count")?
            && r != 0
        {
            return Err(m.err(
                "rope.dimension_count",
                format!(" ({r}; glm5_next has no RoPE, qk_rope_head_dim must be 0)"),
            ));
        }
        let gate = match m.f32_opt("kda.gate_lower_bound")? {
            Some(lb) if lb < 0.0 => Gate::LowerBound(lb),
            Some(lb) => {
                return Err(m.err("kda.gate_lower_bound", format!(" ({lb}; must be negative)")));
            }
            None => Gate::Softplus,
        };
        let kda_head_count = m.usize_opt("kda.head_count")?;
        let cfg = Config {
            arch: m.arch().to_string(),
            n_embd: m.usize("embedding_length")?,
            n_vocab,
            n_ctx_train: m.usize_opt("context_length")?.unwrap_or(4096),
            layers,
            rms_eps: m
                .f32_opt("attention.layer_norm_rms_epsilon")?
                .unwrap_or(1e-5),
            ln_eps: m.f32_opt("attention.layer_norm_epsilon")?.unwrap_or(1e-6),
            hc_mult: m.usize("hyper_connection.count")?,
            hc_sinkhorn_iters: m.usize("hyper_connection.sinkhorn_iterations")?,
            hc_eps: m.f32_opt("hyper_connection.epsilon")?.unwrap_or(1e-6),
            kda_heads: kda_head_count.unwrap_or(mla_heads),
            kda_heads_from_key: kda_head_count.is_some(),
            kda_head_dim: m.usize("kda.head_dim")?,
            conv_kernel: m.usize("ssm.conv_kernel")?,
            gate,
            mla_heads,
            q_lora_rank: m.usize("attention.q_lora_rank")?,
            kv_lora_rank: m.usize("attention.kv_lora_rank")?,
            qk_nope_dim: m.usize("attention.key_length_mla")?,
            v_head_dim: m.usize("attention.value_length_mla")?,
            index_heads: m.usize("attention.indexer.head_count")?,
            index_head_dim: m.usize("attention.indexer.key_length")?,
            index_kpool: m.usize("attention.indexer.kpool")?,
            index_topk: m.usize("attention.indexer.top_k")?,
            index_select_tail: m
                .bool_opt("attention.indexer.kpool_select_tail")?
                .unwrap_or(true),
            n_ff: m.usize_opt("feed_forward_length")?.unwrap_or(0),
            n_expert,
            n_expert_used: m.usize_opt("expert_used_count")?.unwrap_or(0),
            n_group: m.usize_opt("expert_group_count")?.unwrap_or(1).max(1),
            topk_group: m.usize_opt("expert_group_used_count")?.unwrap_or(1).max(1),
            n_ff_exp,
            n_ff_shexp: m
                .usize_opt("expert_shared_feed_forward_length")?
                .unwrap_or(n_ff_exp * n_shared.max(1)),
            norm_topk_prob: m.bool_opt("expert_weights_norm")?.unwrap_or(true),
            routed_scale: m.f32_opt("expert_weights_scale")?.unwrap_or(1.0),
            swiglu_exp,
            swiglu_shexp,
            dtype,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// Checks what the reference checks (`validate_architecture`) and what it cannot
    /// run (doc §6.4): every `shared` indexer layer must directly follow a `full` MLA
    /// layer.
    pub fn validate(&self) -> Result<()> {
        let bad = |s: String| Err(EngineError::Config(s));
        for (i, (attn, _)) in self.layers.iter().enumerate() {
            if let AttnKind::Mla {
                full_indexer: false,
            } = attn
            {
                let prev = i.checked_sub(1).map(|p| self.layers[p].0);
                if prev != Some(AttnKind::Mla { full_indexer: true }) {
                    let what = match prev {
                        None => "it is the first layer".to_string(),
                        Some(AttnKind::Kda) => format!("layer {} is a KDA layer", i - 1),
                        Some(_) => format!("layer {} is itself a shared indexer layer", i - 1),
                    };
                    return bad(format!(
                        "layer {i} is an MLA layer with a `shared` DSA indexer, but {what}; a shared \
                         indexer reuses the selection of the directly preceding `full` MLA layer, and \
                         the reference (transformers glm5_next) cannot run this layout"
                    ));
                }
            }
        }
        let nz = |v: usize, what: &str| {
            if v == 0 {
                bad(format!("{what} must be positive"))
            } else {
                Ok(())
            }
        };
        nz(self.n_embd, "embedding_length")?;
        nz(self.hc_mult, "hyper_connection.count")?;
        nz(
            self.hc_sinkhorn_iters,
            "hyper_connection.sinkhorn_iterations",
        )?;
        let has_kda = self.layers.iter().any(|l| l.0 == AttnKind::Kda);
        let has_mla = self.layers.iter().any(|l| l.0 != AttnKind::Kda);
        if has_kda {
            nz(self.kda_heads, "kda.head_count")?;
            nz(self.kda_head_dim, "kda.head_dim")?;
            nz(self.conv_kernel, "ssm.conv_kernel")?;
        }
        if has_mla {
            nz(self.mla_heads, "attention.head_count")?;
            nz(self.index_kpool, "attention.indexer.kpool")?;
            nz(
                self.q_lora_rank,
                "attention.q_lora_rank (glm5_next requires a q LoRA)",
            )?;
            if !self.index_topk.is_multiple_of(self.index_kpool) || self.index_topk == 0 {
                return bad(format!(
                    "attention.indexer.top_k ({}) must be a positive multiple of attention.indexer.kpool ({})",
                    self.index_topk, self.index_kpool
                ));
            }
        }
        if self.layers.iter().any(|l| l.1 == MlpKind::Moe) {
            if self.n_expert == 0 || self.n_expert_used == 0 || self.n_expert_used > self.n_expert {
                return bad(format!(
                    "expert_used_count ({}) must be in 1..=expert_count ({})",
                    self.n_expert_used, self.n_expert
                ));
            }
            if !self.n_expert.is_multiple_of(self.n_group) || self.topk_group > self.n_group {
                return bad(format!(
                    "expert_group_count ({}) must divide expert_count ({}) and be at least expert_group_used_count ({})",
                    self.n_group, self.n_expert, self.topk_group
                ));
            }
            if self.n_group > 1 && self.n_expert / self.n_group < 2 {
                return bad(
                    "grouped routing scores each group by its top-2 experts: groups need 2 experts"
                        .into(),
                );
            }
            if self.topk_group * (self.n_expert / self.n_group) < self.n_expert_used {
                return bad(format!(
                    "the {} kept expert groups hold fewer experts than expert_used_count ({})",
                    self.topk_group, self.n_expert_used
                ));
            }
        }
        Ok(())
    }

    /// The full name of key `k` in this file (`{arch}.k`).
    pub fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.arch)
    }

    /// Number of layers `[L]`.
    pub fn n_layer(&self) -> usize {
        self.layers.len()
    }

    /// KDA channels `qkv = Hk·dk`.
    pub fn qkv(&self) -> usize {
        self.kda_heads * self.kda_head_dim
    }

    /// Whether layer `i`'s indexer selection must be handed to layer `i + 1`.
    pub fn passes_selection(&self, i: usize) -> bool {
        self.layers.get(i + 1).is_some_and(|l| {
            l.0 == AttnKind::Mla {
                full_indexer: false,
            }
        })
    }
}
