//! The text configuration of a `glm5_next` checkpoint (`config.json`), with the
//! defaults and derived values of `transformers`' `Glm5NextTextConfig`
//! (`configuration_glm5_next.py`, `__post_init__` and `validate_architecture`; doc
//! `docs/glm5_next.md` §1).
//!
//! The composite `Glm5NextConfig` keeps the text keys under `text_config`; a flat
//! text-only config is accepted too.

use serde_json::Value;

use crate::ConvertError;

/// The hyperparameters the converter writes to GGUF.
#[derive(Debug, Clone, PartialEq)]
pub struct TextConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub moe_intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub n_shared_experts: usize,
    pub n_routed_experts: usize,
    pub routed_scaling_factor: f32,
    pub kv_lora_rank: usize,
    pub q_lora_rank: usize,
    pub qk_rope_head_dim: usize,
    pub qk_nope_head_dim: usize,
    pub v_head_dim: usize,
    pub n_group: usize,
    pub topk_group: usize,
    pub num_experts_per_tok: usize,
    pub norm_topk_prob: bool,
    pub max_position_embeddings: usize,
    pub rms_norm_eps: f32,
    pub attention_bias: bool,
    pub index_topk: usize,
    pub index_head_dim: usize,
    pub index_n_heads: usize,
    pub index_kpool: usize,
    pub index_kpool_always_select_tail: bool,
    /// `"linear_attention"` or `"indexed_attention"` per layer.
    pub layer_types: Vec<String>,
    /// `"full"` or `"shared"` per layer.
    pub indexer_types: Vec<String>,
    /// `"dense"` or `"sparse"` per layer.
    pub mlp_layer_types: Vec<String>,
    /// `None`: no clamp.
    pub swiglu_limit: Option<f32>,
    pub linear_head_dim: usize,
    pub linear_num_heads: usize,
    pub linear_conv_kernel_dim: usize,
    /// `None`: the softplus gate.
    pub linear_lower_bound: Option<f32>,
    pub hc_mult: usize,
    pub hc_eps: f32,
    pub hc_sinkhorn_iters: usize,
    pub hidden_act: String,
    pub tie_word_embeddings: bool,
    /// `expert_gating_func` when the config names the router's scoring function
    /// (`scoring_func` and the other keys llama.cpp's converter looks for); only
    /// sigmoid (2) is accepted. `None`: not written (sigmoid, llama.cpp's default for
    /// this architecture).
    pub expert_gating_func: Option<u32>,
}

/// The config keys llama.cpp's converter reads the router's scoring function from, in
/// its order.
const SCORE_KEYS: [&str; 6] = [
    "score_function",
    "scoring_func",
    "score_func",
    "moe_router_activation",
    "moe_router_activation_func",
    "expert_selection_fn",
];

fn get<'a>(c: &'a Value, k: &str) -> Option<&'a Value> {
    c.get(k).filter(|v| !v.is_null())
}

fn uint(c: &Value, k: &str, default: usize) -> Result<usize, ConvertError> {
    match get(c, k) {
        None => Ok(default),
        Some(v) => v.as_u64().map(|x| x as usize).ok_or_else(|| bad(k, v)),
    }
}

fn float(c: &Value, k: &str, default: f32) -> Result<f32, ConvertError> {
    match get(c, k) {
        None => Ok(default),
        Some(v) => v.as_f64().map(|x| x as f32).ok_or_else(|| bad(k, v)),
    }
}

fn boolean(c: &Value, k: &str, default: bool) -> Result<bool, ConvertError> {
    match get(c, k) {
        None => Ok(default),
        Some(v) => v.as_bool().ok_or_else(|| bad(k, v)),
    }
}

fn strings(c: &Value, k: &str) -> Result<Option<Vec<String>>, ConvertError> {
    match get(c, k) {
        None => Ok(None),
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| x.as_str().map(str::to_string).ok_or_else(|| bad(k, x)))
            .collect::<Result<_, _>>()
            .map(Some),
        Some(v) => Err(bad(k, v)),
    }
}

fn bad(k: &str, v: &Value) -> ConvertError {
    ConvertError::Config(format!("config.json: `{k}` has an unexpected value {v}"))
}

impl TextConfig {
    /// Parses `config.json` text.
    ///
    /// # Errors
    /// [`ConvertError::Config`] for malformed JSON, mistyped keys, per-layer lists of
    /// the wrong length, and what `validate_architecture` rejects (`num_attention_heads
    /// != num_key_value_heads`, RoPE dimensions, `index_topk` not a multiple of
    /// `index_kpool`).
    pub fn parse(text: &str) -> Result<TextConfig, ConvertError> {
        let root: Value = serde_json::from_str(text)
            .map_err(|e| ConvertError::Config(format!("config.json: {e}")))?;
        let c = root.get("text_config").unwrap_or(&root);
        let n_layer = uint(c, "num_hidden_layers", 45)?;
        let heads = uint(c, "num_attention_heads", 64)?;
        let mut cfg = TextConfig {
            vocab_size: uint(c, "vocab_size", 154880)?,
            hidden_size: uint(c, "hidden_size", 4096)?,
            intermediate_size: uint(c, "intermediate_size", 12288)?,
            moe_intermediate_size: uint(c, "moe_intermediate_size", 2048)?,
            num_hidden_layers: n_layer,
            num_attention_heads: heads,
            num_key_value_heads: uint(c, "num_key_value_heads", heads)?,
            n_shared_experts: uint(c, "n_shared_experts", 1)?,
            n_routed_experts: uint(c, "n_routed_experts", uint(c, "num_local_experts", 288)?)?,
            routed_scaling_factor: float(c, "routed_scaling_factor", 2.5)?,
            kv_lora_rank: uint(c, "kv_lora_rank", 512)?,
            q_lora_rank: uint(c, "q_lora_rank", 1536)?,
            qk_rope_head_dim: uint(c, "qk_rope_head_dim", 0)?,
            qk_nope_head_dim: uint(c, "qk_nope_head_dim", 256)?,
            v_head_dim: uint(c, "v_head_dim", 256)?,
            n_group: uint(c, "n_group", 1)?,
            topk_group: uint(c, "topk_group", 1)?,
            num_experts_per_tok: uint(c, "num_experts_per_tok", 8)?,
            norm_topk_prob: boolean(c, "norm_topk_prob", true)?,
            max_position_embeddings: uint(c, "max_position_embeddings", 1_048_576)?,
            rms_norm_eps: float(c, "rms_norm_eps", 1e-5)?,
            attention_bias: boolean(c, "attention_bias", false)?,
            index_topk: uint(c, "index_topk", 2048)?,
            index_head_dim: uint(c, "index_head_dim", 128)?,
            index_n_heads: uint(c, "index_n_heads", 32)?,
            index_kpool: uint(c, "index_kpool", 16)?,
            index_kpool_always_select_tail: boolean(c, "index_kpool_always_select_tail", true)?,
            layer_types: Vec::new(),
            indexer_types: Vec::new(),
            mlp_layer_types: Vec::new(),
            swiglu_limit: match get(c, "swiglu_limit") {
                None if c.get("swiglu_limit").is_some() => None,
                None => Some(10.0),
                Some(v) => Some(v.as_f64().ok_or_else(|| bad("swiglu_limit", v))? as f32),
            },
            linear_head_dim: uint(c, "linear_head_dim", 128)?,
            linear_num_heads: uint(c, "linear_num_heads", 64)?,
            linear_conv_kernel_dim: uint(c, "linear_conv_kernel_dim", 4)?,
            linear_lower_bound: match c.get("linear_lower_bound") {
                None => Some(-5.0),
                Some(Value::Null) => None,
                Some(v) => Some(v.as_f64().ok_or_else(|| bad("linear_lower_bound", v))? as f32),
            },
            hc_mult: uint(c, "hc_mult", 4)?,
            hc_eps: float(c, "hc_eps", 1e-6)?,
            hc_sinkhorn_iters: uint(c, "hc_sinkhorn_iters", 20)?,
            hidden_act: get(c, "hidden_act")
                .and_then(Value::as_str)
                .unwrap_or("silu")
                .to_string(),
            tie_word_embeddings: boolean(
                c,
                "tie_word_embeddings",
                boolean(&root, "tie_word_embeddings", false)?,
            )?,
            expert_gating_func: None,
        };
        if let Some((k, v)) = SCORE_KEYS
            .iter()
            .find_map(|k| get(c, k).or_else(|| get(&root, k)).map(|v| (*k, v)))
        {
            cfg.expert_gating_func = match v.as_str() {
                Some("sigmoid") => Some(2),
                _ => {
                    return Err(ConvertError::Config(format!(
                        "config.json: `{k}` is {v}; glm5_next routes with sigmoid"
                    )));
                }
            };
        }
        // Per-layer schedules (`__post_init__`).
        cfg.mlp_layer_types = strings(c, "mlp_layer_types")?.unwrap_or_else(|| {
            (0..n_layer)
                .map(|i| if i < 3 { "dense" } else { "sparse" }.to_string())
                .collect()
        });
        cfg.layer_types = strings(c, "layer_types")?
            .unwrap_or_else(|| {
                (0..n_layer)
                    .map(|i| {
                        if i % 4 != 3 {
                            "linear_attention"
                        } else {
                            "indexed_attention"
                        }
                        .to_string()
                    })
                    .collect()
            })
            .into_iter()
            .map(|t| {
                if t == "full_attention" {
                    "indexed_attention".to_string()
                } else {
                    t
                }
            })
            .collect();
        cfg.indexer_types = match strings(c, "indexer_types")? {
            Some(v) => v,
            None => match get(c, "index_topk_pattern") {
                Some(Value::String(p)) => p
                    .chars()
                    .map(|ch| match ch {
                        'F' => Ok("full".to_string()),
                        'S' => Ok("shared".to_string()),
                        _ => Err(ConvertError::Config(format!(
                            "config.json: index_topk_pattern has '{ch}'"
                        ))),
                    })
                    .collect::<Result<_, _>>()?,
                _ => {
                    let freq = uint(c, "index_topk_freq", 1)?.max(1);
                    let offset = uint(c, "index_skip_topk_offset", 2)? as i64;
                    (0..n_layer as i64)
                        .map(|i| {
                            if ((i - offset + 1).max(0) as usize).is_multiple_of(freq) {
                                "full"
                            } else {
                                "shared"
                            }
                            .to_string()
                        })
                        .collect()
                }
            },
        };
        if let Some(d) = get(c, "linear_attn_config") {
            cfg.linear_head_dim = uint(d, "head_dim", cfg.linear_head_dim)?;
            cfg.linear_num_heads = uint(d, "num_heads", cfg.linear_num_heads)?;
            cfg.linear_conv_kernel_dim =
                uint(d, "short_conv_kernel_size", cfg.linear_conv_kernel_dim)?;
            if let Some(v) = d.get("gate_lower_bound") {
                cfg.linear_lower_bound = v.as_f64().map(|x| x as f32);
            }
            if boolean(d, "safe_gate", true)? && cfg.linear_lower_bound.is_none() {
                cfg.linear_lower_bound = Some(-5.0);
            }
        }
        cfg.validate()?;
        Ok(cfg)
    }

    fn validate(&self) -> Result<(), ConvertError> {
        let err = |s: String| Err(ConvertError::Config(format!("config.json: {s}")));
        let n = self.num_hidden_layers;
        for (k, v) in [
            ("layer_types", &self.layer_types),
            ("indexer_types", &self.indexer_types),
            ("mlp_layer_types", &self.mlp_layer_types),
        ] {
            if v.len() < n {
                return err(format!("`{k}` has {} entries for {n} layers", v.len()));
            }
        }
        for (i, t) in self.layer_types.iter().take(n).enumerate() {
            if t != "linear_attention" && t != "indexed_attention" {
                return err(format!(
                    "layer_types[{i}] = \"{t}\" (expected linear_attention or indexed_attention)"
                ));
            }
        }
        for (i, t) in self.mlp_layer_types.iter().take(n).enumerate() {
            if t != "dense" && t != "sparse" {
                return err(format!(
                    "mlp_layer_types[{i}] = \"{t}\" (expected dense or sparse)"
                ));
            }
        }
        if self.num_attention_heads != self.num_key_value_heads {
            return err(format!(
                "num_attention_heads ({}) must equal num_key_value_heads ({})",
                self.num_attention_heads, self.num_key_value_heads
            ));
        }
        if self.qk_rope_head_dim != 0 {
            return err(format!(
                "qk_rope_head_dim is {}; glm5_next is NoPE (0)",
                self.qk_rope_head_dim
            ));
        }
        if self.index_kpool == 0 || !self.index_topk.is_multiple_of(self.index_kpool) {
            return err(format!(
                "index_topk ({}) must be divisible by index_kpool ({})",
                self.index_topk, self.index_kpool
            ));
        }
        if self.attention_bias {
            return err(
                "attention_bias = true is not supported (GLM-5.3-Flash has no attention biases)"
                    .into(),
            );
        }
        if self.hidden_act != "silu" {
            return err(format!("hidden_act \"{}\" (only silu)", self.hidden_act));
        }
        Ok(())
    }

    /// Whether layer `i` is a KDA layer.
    pub fn is_kda(&self, i: usize) -> bool {
        self.layer_types[i] == "linear_attention"
    }

    /// Whether layer `i` has a MoE.
    pub fn is_moe(&self, i: usize) -> bool {
        self.mlp_layer_types[i] == "sparse"
    }

    /// Whether MLA layer `i` runs its own indexer.
    pub fn full_indexer(&self, i: usize) -> bool {
        self.indexer_types[i] == "full"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_glm_5_3_flash() {
        let c = TextConfig::parse("{\"text_config\": {}}").unwrap();
        assert_eq!(c.num_hidden_layers, 45);
        assert_eq!(
            c.layer_types
                .iter()
                .filter(|t| *t == "linear_attention")
                .count(),
            34
        );
        assert_eq!(c.layer_types[3], "indexed_attention");
        assert!(c.indexer_types.iter().all(|t| t == "full"));
        assert_eq!(
            &c.mlp_layer_types[..4],
            ["dense", "dense", "dense", "sparse"]
        );
        assert_eq!(c.linear_lower_bound, Some(-5.0));
        assert_eq!(c.swiglu_limit, Some(10.0));
    }

    #[test]
    fn null_lower_bound_is_softplus_and_pattern_sets_indexers() {
        let c = TextConfig::parse(
            r#"{"num_hidden_layers": 4, "linear_lower_bound": null, "index_topk_pattern": "FFSF"}"#,
        )
        .unwrap();
        assert_eq!(c.linear_lower_bound, None);
        assert_eq!(c.indexer_types, ["full", "full", "shared", "full"]);
    }

    #[test]
    fn rejects_rope() {
        let e = TextConfig::parse(r#"{"qk_rope_head_dim": 64}"#).unwrap_err();
        assert!(e.to_string().contains("qk_rope_head_dim"), "{e}");
    }
}
