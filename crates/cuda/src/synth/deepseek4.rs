//! Synthetic `deepseek4` models (DeepSeek-V4-Flash) in llama.cpp's layout, exactly as
//! `../shared/tools/synth_gguf.py --shape deepseek4-flash` writes them (`plan_deepseek4`,
//! which follows llama.cpp's `src/models/deepseek4.cpp`): the same metadata keys, value
//! types and order, tensor names, dims, types and order, and the same vocabulary
//! ([`super::vocab::minimal`]); `tests/synth_layout.rs` checks the header bytes against
//! a fixture made from the script.
//!
//! Layer schedule: real layers 0 and 1 attend over the sliding window only (compress
//! ratio 0), then even layers compress at ratio 4 (CSA, with the lightning indexer) and
//! odd ones at 128 (HCA); the first `hash_layers` real layers route by token id
//! (`tid2eid`). The `q2` mix (ds4's): routed gate/up IQ2_XXS, routed down Q2_K;
//! attention (`q_a`, `q_b`, `kv`, the grouped `output_a`, `output_b`), shared expert and
//! output Q8_0; embedding, router, mHC `fn`, compressors and indexer F16; vectors, `ape`
//! and the mHC `base` F32.
//!
//! Values: random floats for float matrices, norm weights in [0.5, 1.5), and the
//! constants the model needs: `hc_*_scale` 1, `attn_sinks` and `exp_probs_b.bias` 0;
//! `tid2eid` rows of distinct expert ids ([`Init::ExpertIds`]).

use ds4_gguf::{GgmlType, Value};

use super::{Init, Tensor, Window, add_hc_mixes, add_q2_experts, vocab};

/// The architecture name.
pub const ARCH: &str = "deepseek4";

/// The one quant name of this family.
pub const QUANT: &str = "q2";

/// A `deepseek4` configuration (DeepSeek-V4-Flash's, as `synth_gguf.py`'s
/// `DEEPSEEK4_FLASH` has it).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Shape {
    pub name: &'static str,
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_vocab: usize,
    pub n_ctx_train: usize,
    pub n_head: usize,
    pub head_dim: usize,
    /// Rotated dimensions per head (`qk_rope_head_dim`).
    pub n_rot: usize,
    pub q_lora: usize,
    /// Groups and rank of the grouped low-rank output projection.
    pub o_groups: usize,
    pub o_lora: usize,
    pub n_expert: usize,
    pub n_expert_used: usize,
    pub n_expert_shared: usize,
    pub n_ff_exp: usize,
    pub routed_scale: f32,
    pub swiglu_limit: f32,
    pub sliding_window: usize,
    /// Real layers `0..hash_layers` route by token id.
    pub hash_layers: usize,
    pub indexer_heads: usize,
    pub indexer_dim: usize,
    pub indexer_topk: usize,
    /// mHC streams, Sinkhorn iterations, eps.
    pub hc: usize,
    pub hc_sinkhorn: usize,
    pub hc_eps: f32,
    pub rope_base: f32,
    pub compress_rope_base: f32,
    pub yarn_factor: f32,
    pub yarn_orig_ctx: usize,
    pub yarn_beta_fast: f32,
    pub yarn_beta_slow: f32,
    pub rms_eps: f32,
}

/// The shapes known by name.
pub const SHAPES: &[Shape] = &[
    Shape {
        name: "deepseek4-flash",
        n_layer: 43,
        n_embd: 4096,
        n_vocab: 129280,
        n_ctx_train: 1048576,
        n_head: 64,
        head_dim: 512,
        n_rot: 64,
        q_lora: 1024,
        o_groups: 8,
        o_lora: 1024,
        n_expert: 256,
        n_expert_used: 6,
        n_expert_shared: 1,
        n_ff_exp: 2048,
        routed_scale: 1.5,
        swiglu_limit: 10.0,
        sliding_window: 128,
        hash_layers: 3,
        indexer_heads: 64,
        indexer_dim: 128,
        indexer_topk: 512,
        hc: 4,
        hc_sinkhorn: 20,
        hc_eps: 1e-6,
        rope_base: 10000.0,
        compress_rope_base: 160000.0,
        yarn_factor: 16.0,
        yarn_orig_ctx: 65536,
        yarn_beta_fast: 32.0,
        yarn_beta_slow: 1.0,
        rms_eps: 1e-6,
    },
    // DeepSeek-V4-Flash's structure at hidden 256 (every quantized row whole
    // 256-blocks), 6 layers (two sliding, two CSA, two HCA; three hash-routed), 16
    // experts top-4, a window of 16 and an indexer top-k of 8: small enough for CPU
    // tests, with windows closing and the indexer choosing after a few dozen tokens.
    Shape {
        name: "tiny-deepseek4",
        n_layer: 6,
        n_embd: 256,
        n_vocab: 1024,
        n_ctx_train: 4096,
        n_head: 4,
        head_dim: 128,
        n_rot: 64,
        q_lora: 256,
        o_groups: 2,
        o_lora: 128,
        n_expert: 16,
        n_expert_used: 4,
        n_expert_shared: 1,
        n_ff_exp: 256,
        routed_scale: 1.5,
        swiglu_limit: 10.0,
        sliding_window: 16,
        hash_layers: 3,
        indexer_heads: 4,
        indexer_dim: 64,
        indexer_topk: 8,
        hc: 4,
        hc_sinkhorn: 20,
        hc_eps: 1e-6,
        rope_base: 10000.0,
        compress_rope_base: 160000.0,
        yarn_factor: 16.0,
        yarn_orig_ctx: 65536,
        yarn_beta_fast: 32.0,
        yarn_beta_slow: 1.0,
        rms_eps: 1e-6,
    },
];

/// llama.cpp's `LLAMA_FTYPE_MOSTLY_IQ2_XXS` (a label: the mix is not one type).
const FILE_TYPE: u32 = 19;
/// `LLAMA_EXPERT_GATING_FUNC_TYPE_SQRT_SOFTPLUS`.
const GATING_SQRT_SOFTPLUS: u32 = 4;
/// ggml's `GGML_QNT_VERSION`.
const QUANTIZATION_VERSION: u32 = 2;

impl Shape {
    /// The compress ratio of real layer `i`: 0 (sliding window only), 4 or 128.
    pub fn ratio(&self, i: usize) -> usize {
        match i {
            0 | 1 => 0,
            _ if i.is_multiple_of(2) => 4,
            _ => 128,
        }
    }

    /// The kind of real layer `i`, as `synth_gguf.py` prints it.
    pub fn layer_kind(&self, i: usize) -> &'static str {
        match (self.ratio(i), i < self.hash_layers) {
            (0, true) => "compress ratio 0, hash routing",
            (0, false) => "compress ratio 0, score routing",
            (4, true) => "compress ratio 4, hash routing",
            (4, false) => "compress ratio 4, score routing",
            (_, true) => "compress ratio 128, hash routing",
            (_, false) => "compress ratio 128, score routing",
        }
    }
}

/// The metadata of layers `w` of `s`, in `synth_gguf.py`'s order and value types.
pub fn metadata(s: &Shape, w: Window) -> Vec<(String, Value)> {
    let real = w.first..w.first + w.n_layer;
    let u = |x: usize| Value::U32(x as u32);
    let f = Value::F32;
    let per_layer = |v: f32| Value::Array(vec![Value::F32(v); w.n_layer]);
    let mut md: Vec<(String, Value)> = vec![
        ("general.architecture".into(), Value::String(ARCH.into())),
        (
            "general.name".into(),
            Value::String(format!("synthetic-{ARCH}-{}L", w.n_layer)),
        ),
        (
            "general.quantization_version".into(),
            Value::U32(QUANTIZATION_VERSION),
        ),
        ("general.file_type".into(), Value::U32(FILE_TYPE)),
    ];
    let keys: Vec<(&str, Value)> = vec![
        ("context_length", u(s.n_ctx_train)),
        ("embedding_length", u(s.n_embd)),
        ("embedding_length_out", u(s.hc * s.n_embd)),
        ("block_count", u(w.n_layer)),
        ("attention.head_count", u(s.n_head)),
        ("attention.head_count_kv", u(1)),
        ("attention.key_length", u(s.head_dim)),
        ("attention.value_length", u(s.head_dim)),
        ("rope.dimension_count", u(s.n_rot)),
        ("rope.freq_base", f(s.rope_base)),
        ("rope.scaling.type", Value::String("yarn".into())),
        ("rope.scaling.factor", f(s.yarn_factor)),
        ("rope.scaling.original_context_length", u(s.yarn_orig_ctx)),
        ("rope.scaling.yarn_beta_fast", f(s.yarn_beta_fast)),
        ("rope.scaling.yarn_beta_slow", f(s.yarn_beta_slow)),
        ("expert_count", u(s.n_expert)),
        ("expert_used_count", u(s.n_expert_used)),
        ("attention.layer_norm_rms_epsilon", f(s.rms_eps)),
        ("attention.q_lora_rank", u(s.q_lora)),
        ("attention.sliding_window", u(s.sliding_window)),
        ("expert_feed_forward_length", u(s.n_ff_exp)),
        ("expert_shared_count", u(s.n_expert_shared)),
        ("expert_weights_scale", f(s.routed_scale)),
        ("expert_weights_norm", Value::Bool(true)),
        ("expert_gating_func", Value::U32(GATING_SQRT_SOFTPLUS)),
        ("swiglu_clamp_exp", per_layer(s.swiglu_limit)),
        ("swiglu_clamp_shexp", per_layer(s.swiglu_limit)),
        ("attention.indexer.head_count", u(s.indexer_heads)),
        ("attention.indexer.key_length", u(s.indexer_dim)),
        ("attention.indexer.top_k", u(s.indexer_topk)),
        ("attention.output_group_count", u(s.o_groups)),
        ("attention.output_lora_rank", u(s.o_lora)),
        ("attention.compress_rope_freq_base", f(s.compress_rope_base)),
        (
            "attention.compress_ratios",
            Value::Array(real.map(|i| Value::U32(s.ratio(i) as u32)).collect()),
        ),
        ("hyper_connection.count", u(s.hc)),
        ("hyper_connection.sinkhorn_iterations", u(s.hc_sinkhorn)),
        ("hyper_connection.epsilon", f(s.hc_eps)),
        ("hash_layer_count", u(s.hash_layers.saturating_sub(w.first))),
    ];
    md.extend(keys.into_iter().map(|(k, v)| (format!("{ARCH}.{k}"), v)));
    md.extend(vocab::minimal(s.n_vocab));
    md
}

/// Every tensor of layers `w` of `s`, in `synth_gguf.py`'s order.
pub fn tensors(s: &Shape, w: Window) -> Vec<Tensor> {
    use GgmlType::{F16, F32, I32, Q8_0};
    let (e, v) = (s.n_embd as u64, s.n_vocab as u64);
    let (h, hd, hc, ql) = (
        s.n_head as u64,
        s.head_dim as u64,
        s.hc as u64,
        s.q_lora as u64,
    );
    let (ne, nu, ff) = (s.n_expert as u64, s.n_expert_used as u64, s.n_ff_exp as u64);
    let (groups, ol) = (s.o_groups as u64, s.o_lora as u64);
    let mix = (2 + hc) * hc;
    let mut t = Vec::new();
    let mut add = |name: String, dims: &[u64], ty: GgmlType, init: Init| {
        t.push(Tensor::moe(name, dims, ty, init, nu, ne))
    };
    let (mat, flt, norm) = (Init::Blocks, Init::Floats, Init::Norm);
    add("token_embd.weight".into(), &[e, v], F16, flt);
    add("output_norm.weight".into(), &[e], F32, norm);
    add("output.weight".into(), &[e, v], Q8_0, mat);
    add("output_hc_fn.weight".into(), &[hc * e, hc], F16, flt);
    add("output_hc_base.weight".into(), &[hc], F32, flt);
    add("output_hc_scale.weight".into(), &[1], F32, Init::Const(1.0));
    for (i, real) in (w.first..w.first + w.n_layer).enumerate() {
        let mut add = |x: &str, dims: &[u64], ty, init| add(format!("blk.{i}.{x}"), dims, ty, init);
        let r = s.ratio(real) as u64;
        add("attn_norm.weight", &[e], F32, norm);
        add("attn_sinks.weight", &[h], F32, Init::Const(0.0));
        add("attn_q_a.weight", &[e, ql], Q8_0, mat);
        add("attn_q_a_norm.weight", &[ql], F32, norm);
        add("attn_q_b.weight", &[ql, h * hd], Q8_0, mat);
        add("attn_kv.weight", &[e, hd], Q8_0, mat);
        add("attn_kv_a_norm.weight", &[hd], F32, norm);
        // Stored 2-D; the loader reshapes it to {H·hd/G, o_lora, G}.
        add(
            "attn_output_a.weight",
            &[h * hd / groups, ol * groups],
            Q8_0,
            mat,
        );
        add("attn_output_b.weight", &[groups * ol, e], Q8_0, mat);
        add_hc_mixes(&mut add, hc * e, mix, F16);
        if r > 0 {
            let coff = if r == 4 { 2 } else { 1 };
            add("attn_compressor_kv.weight", &[e, coff * hd], F16, flt);
            add("attn_compressor_gate.weight", &[e, coff * hd], F16, flt);
            add("attn_compressor_ape.weight", &[coff * hd, r], F32, flt);
            add("attn_compressor_norm.weight", &[hd], F32, norm);
            if r == 4 {
                let (ih, idim) = (s.indexer_heads as u64, s.indexer_dim as u64);
                add("indexer.proj.weight", &[e, ih], F16, flt);
                add("indexer.attn_q_b.weight", &[ql, ih * idim], F16, flt);
                add("indexer_compressor_kv.weight", &[e, 2 * idim], F16, flt);
                add("indexer_compressor_gate.weight", &[e, 2 * idim], F16, flt);
                add("indexer_compressor_ape.weight", &[2 * idim, r], F32, flt);
                add("indexer_compressor_norm.weight", &[idim], F32, norm);
            }
        }
        add("ffn_gate_inp.weight", &[e, ne], F16, flt);
        if real < s.hash_layers {
            add(
                "ffn_gate_tid2eid.weight",
                &[nu, v],
                I32,
                Init::ExpertIds(s.n_expert as u32),
            );
        } else {
            add("exp_probs_b.bias", &[ne], F32, Init::Const(0.0));
        }
        add("ffn_norm.weight", &[e], F32, norm);
        add_q2_experts(&mut add, e, ff, ne, s.n_expert_shared as u64);
    }
    t
}

#[cfg(test)]
mod tests {
    use super::super::Spec;

    #[test]
    fn deepseek4_flash_q2_has_the_scripts_sizes() {
        // synth_gguf.py - --shape deepseek4-flash --dry-run: 1328 tensors, 86717612380
        // bytes of weights, 9561954724 read per decode token.
        let s = Spec::parse("deepseek4-flash:q2").unwrap();
        assert_eq!(s.tensors().len(), 1328);
        assert_eq!(s.weight_bytes(), 86_717_612_380);
        assert_eq!(s.decode_bytes(), 9_561_954_724);
        let kinds = s.layer_kinds();
        assert_eq!(kinds.iter().filter(|k| k.contains("ratio 4,")).count(), 21);
        assert_eq!(kinds.iter().filter(|k| k.contains("ratio 128")).count(), 20);
        assert_eq!(
            kinds.iter().filter(|k| k.ends_with("hash routing")).count(),
            3
        );
    }
}
