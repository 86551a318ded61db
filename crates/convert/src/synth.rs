//! Random-weight `glm5_next` models for benchmarks and quantization measurements,
//! produced as a checkpoint in the hub format ([`SynthSource`], values generated on
//! demand from the tensor name and a seed) and converted like a real one.
//!
//! Presets:
//! - `bench`: GLM-5.3-Flash's geometry (hidden 4096; KDA 64×128 heads, conv 4; MLA 64
//!   heads, q/kv LoRA 1536/512, 256/256 head dims; indexer 32×128, kpool 16, top-k
//!   2048; experts of 2048, top-8 with a shared expert; dense MLP 12288; 4 streams,
//!   20 Sinkhorn iterations) scaled down to 8 layers (the 3:1 KDA/MLA pattern twice,
//!   layer 0 dense) and 32 routed experts, to fit a 24 GiB machine.
//! - `small`: the same layer pattern at hidden 256 (every matrix a whole number of
//!   256-blocks, so every quantized type applies), for quantization-error measurements.

use std::collections::BTreeMap;

use crate::ConvertError;
use crate::hf_config::TextConfig;
use crate::source::TensorSource;

/// A synthetic model preset.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Preset {
    /// GLM-5.3-Flash geometry, 8 layers, 32 experts.
    Bench,
    /// Hidden 256, 8 layers, 8 experts.
    Small,
}

impl Preset {
    /// The preset's name.
    pub fn name(self) -> &'static str {
        match self {
            Preset::Bench => "bench",
            Preset::Small => "small",
        }
    }

    fn config_json(self, vocab: usize) -> String {
        let layer_types = r#"["linear_attention","linear_attention","linear_attention","indexed_attention",
            "linear_attention","linear_attention","linear_attention","indexed_attention"]"#;
        let mlp = r#"["dense","sparse","sparse","sparse","sparse","sparse","sparse","sparse"]"#;
        match self {
            Preset::Bench => format!(
                r#"{{"vocab_size": {vocab}, "hidden_size": 4096, "intermediate_size": 12288, "moe_intermediate_size": 2048,
                "num_hidden_layers": 8, "num_attention_heads": 64, "num_key_value_heads": 64, "n_routed_experts": 32,
                "num_experts_per_tok": 8, "layer_types": {layer_types}, "mlp_layer_types": {mlp},
                "index_kpool": 16, "max_position_embeddings": 1048576}}"#
            ),
            Preset::Small => format!(
                r#"{{"vocab_size": {vocab}, "hidden_size": 256, "intermediate_size": 512, "moe_intermediate_size": 256,
                "num_hidden_layers": 8, "num_attention_heads": 4, "num_key_value_heads": 4, "n_routed_experts": 8,
                "num_experts_per_tok": 2, "n_group": 4, "topk_group": 2, "layer_types": {layer_types}, "mlp_layer_types": {mlp},
                "linear_num_heads": 4, "linear_head_dim": 64, "q_lora_rank": 256, "kv_lora_rank": 256,
                "qk_nope_head_dim": 64, "v_head_dim": 64, "index_n_heads": 16, "index_head_dim": 64,
                "index_topk": 64, "index_kpool": 8, "swiglu_limit": 3.0, "max_position_embeddings": 4096}}"#
            ),
        }
    }
}

/// A checkpoint whose values are generated from each tensor's name.
pub struct SynthSource {
    shapes: BTreeMap<String, Vec<usize>>,
    seed: u64,
}

/// The hub-format tensor names and shapes of a configuration.
pub fn hub_tensors(c: &TextConfig) -> BTreeMap<String, Vec<usize>> {
    let mut t = BTreeMap::new();
    let (d, v) = (c.hidden_size, c.vocab_size);
    let mut add = |n: String, s: Vec<usize>| {
        t.insert(format!("model.language_model.{n}"), s);
    };
    add("embed_tokens.weight".into(), vec![v, d]);
    add("norm.weight".into(), vec![d]);
    let n = c.hc_mult;
    let m = (2 + n) * n;
    for i in 0..c.num_hidden_layers {
        let p = |s: &str| format!("layers.{i}.{s}");
        add(p("input_layernorm.weight"), vec![d]);
        add(p("post_attention_layernorm.weight"), vec![d]);
        for w in ["attn", "ffn"] {
            add(p(&format!("hc_{w}_fn")), vec![m, n * d]);
            add(p(&format!("hc_{w}_base")), vec![m]);
            add(p(&format!("hc_{w}_scale")), vec![3]);
        }
        if c.is_kda(i) {
            let (h, dk, kc) = (
                c.linear_num_heads,
                c.linear_head_dim,
                c.linear_conv_kernel_dim,
            );
            let qkv = h * dk;
            for x in ["q", "k", "v"] {
                add(p(&format!("self_attn.{x}_proj.weight")), vec![qkv, d]);
                add(p(&format!("self_attn.{x}_conv1d.weight")), vec![qkv, 1, kc]);
            }
            add(p("self_attn.f_a_proj.weight"), vec![dk, d]);
            add(p("self_attn.f_b_proj.weight"), vec![qkv, dk]);
            add(p("self_attn.dt_bias"), vec![qkv]);
            add(p("self_attn.A_log"), vec![h]);
            add(p("self_attn.b_proj.weight"), vec![h, d]);
            add(p("self_attn.g_a_proj.weight"), vec![dk, d]);
            add(p("self_attn.g_b_proj.weight"), vec![qkv, dk]);
            add(p("self_attn.o_norm.weight"), vec![dk]);
            add(p("self_attn.o_proj.weight"), vec![d, qkv]);
        } else {
            let (ha, rq, rkv, dn, dv) = (
                c.num_attention_heads,
                c.q_lora_rank,
                c.kv_lora_rank,
                c.qk_nope_head_dim,
                c.v_head_dim,
            );
            add(p("self_attn.q_a_proj.weight"), vec![rq, d]);
            add(p("self_attn.q_a_layernorm.weight"), vec![rq]);
            add(p("self_attn.q_b_proj.weight"), vec![ha * dn, rq]);
            add(p("self_attn.kv_a_proj_with_mqa.weight"), vec![rkv, d]);
            add(p("self_attn.kv_a_layernorm.weight"), vec![rkv]);
            add(p("self_attn.kv_b_proj.weight"), vec![ha * (dn + dv), rkv]);
            add(p("self_attn.o_proj.weight"), vec![d, ha * dv]);
            if c.full_indexer(i) {
                let (hi, di, kp) = (c.index_n_heads, c.index_head_dim, c.index_kpool);
                add(p("self_attn.indexer.wq_b.weight"), vec![hi * di, rq]);
                add(p("self_attn.indexer.wk.weight"), vec![di, d]);
                add(p("self_attn.indexer.k_norm.weight"), vec![di]);
                add(p("self_attn.indexer.k_norm.bias"), vec![di]);
                add(p("self_attn.indexer.weights_proj.weight"), vec![hi, d]);
                add(
                    p("self_attn.indexer.index_kpool_compress_gate"),
                    vec![di, d],
                );
                add(
                    p("self_attn.indexer.index_kpool_compress_ape"),
                    vec![kp, di],
                );
            }
        }
        if c.is_moe(i) {
            let (e, ff) = (c.n_routed_experts, c.moe_intermediate_size);
            let sh = ff * c.n_shared_experts;
            add(p("mlp.gate.weight"), vec![e, d]);
            add(p("mlp.gate.e_score_correction_bias"), vec![e]);
            for x in 0..e {
                add(p(&format!("mlp.experts.{x}.gate_proj.weight")), vec![ff, d]);
                add(p(&format!("mlp.experts.{x}.up_proj.weight")), vec![ff, d]);
                add(p(&format!("mlp.experts.{x}.down_proj.weight")), vec![d, ff]);
            }
            add(p("mlp.shared_experts.gate_proj.weight"), vec![sh, d]);
            add(p("mlp.shared_experts.up_proj.weight"), vec![sh, d]);
            add(p("mlp.shared_experts.down_proj.weight"), vec![d, sh]);
        } else {
            let ff = c.intermediate_size;
            add(p("mlp.gate_proj.weight"), vec![ff, d]);
            add(p("mlp.up_proj.weight"), vec![ff, d]);
            add(p("mlp.down_proj.weight"), vec![d, ff]);
        }
    }
    t.insert("lm_head.weight".into(), vec![v, d]);
    t
}

/// The preset's configuration and weights (`n_vocab` overrides the vocabulary size,
/// e.g. to match a tokenizer copied from another GGUF).
///
/// # Errors
/// [`ConvertError::Config`] if the preset's configuration is invalid (a bug).
pub fn model(
    preset: Preset,
    n_vocab: Option<usize>,
    seed: u64,
) -> Result<(TextConfig, SynthSource), ConvertError> {
    let vocab = n_vocab.unwrap_or(match preset {
        Preset::Bench => 154880,
        Preset::Small => 512,
    });
    let cfg = TextConfig::parse(&preset.config_json(vocab))?;
    let shapes = hub_tensors(&cfg);
    Ok((cfg, SynthSource { shapes, seed }))
}

/// FNV-1a of a name, mixed with the seed.
fn name_seed(name: &str, seed: u64) -> u64 {
    let h = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    });
    (h ^ seed.wrapping_mul(0x9e37_79b9_7f4a_7c15)) | 1
}

/// `n` uniform values in `[-1, 1)` from an xorshift64* stream.
fn uniform(n: usize, mut s: u64) -> Vec<f32> {
    (0..n)
        .map(|_| {
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            let r = s.wrapping_mul(0x2545_f491_4f6c_dd1d);
            ((r >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

impl TensorSource for SynthSource {
    fn shape(&self, name: &str) -> Option<Vec<usize>> {
        self.shapes.get(name).cloned()
    }

    fn read(&self, name: &str) -> Result<Option<Vec<f32>>, ConvertError> {
        let Some(shape) = self.shapes.get(name) else {
            return Ok(None);
        };
        let n: usize = shape.iter().product();
        let u = uniform(n, name_seed(name, self.seed));
        let cols = *shape.last().unwrap_or(&1) as f32;
        // Scales that keep activations of order 1 through the layers.
        let v = if name.ends_with("norm.weight") || name.ends_with("layernorm.weight") {
            u.iter().map(|x| 1.0 + 0.1 * x).collect()
        } else if name.ends_with("A_log") {
            u.iter().map(|x| (1.0 + 7.5 * (x + 1.0)).ln()).collect()
        } else if name.ends_with("_base")
            || name.ends_with("dt_bias")
            || name.ends_with("k_norm.bias")
        {
            u.iter().map(|x| 0.5 * x).collect()
        } else if name.ends_with("_scale") {
            u.iter().map(|x| 0.5 + 0.25 * x).collect()
        } else if name.ends_with("e_score_correction_bias") || name.ends_with("compress_ape") {
            u.iter().map(|x| 0.05 * x).collect()
        } else if name.contains("conv1d") {
            u.iter().map(|x| 0.5 * x).collect()
        } else {
            let a = (3.0 / cols).sqrt();
            u.iter().map(|x| a * x).collect()
        };
        Ok(Some(v))
    }

    fn names(&self) -> Vec<String> {
        self.shapes.keys().cloned().collect()
    }
}
