//! Synthetic `glm5-next` models (GLM-5.3-Flash) in llama.cpp's layout, exactly as
//! `../shared/tools/synth_gguf.py --shape glm53-flash` writes them (`plan_glm5_next`,
//! which follows llama.cpp's `src/models/glm5-next.cpp`): the same metadata keys, value
//! types and order, tensor names, dims, types and order, and the same vocabulary
//! ([`super::vocab::minimal`]); `tests/synth_layout.rs` checks the header bytes against
//! a fixture made from the script.
//!
//! Layer schedule: KDA (linear attention) where real layer `i % 4 != 3`, MLA with its
//! own DSA indexer where `i % 4 == 3`; a dense FFN in real layers `0..dense_lead`, MoE
//! after. The `q2` mix: routed gate/up IQ2_XXS, routed down Q2_K; attention, KDA
//! q/k/v/o, shared expert, dense FFN and output Q8_0; embedding F16; the matrices
//! llama-quantize leaves unquantized (low-rank KDA gates, `ssm_beta`, `attn_kv_a_mqa`,
//! `attn_k_b`, `attn_v_b`, indexer `attn_k`/`attn_q_b`) BF16; router, mHC, indexer
//! projection and k-pool compressor, conv and norms F32.
//!
//! Values: random floats for float matrices, norm weights in [0.5, 1.5), and the
//! constants the model needs: `hc_*_scale` 1, `ssm_a` −1 (it holds −exp(A_log), which
//! the loader checks is negative), `ssm_dt.bias`, `exp_probs_b.bias` and
//! `indexer.k_norm.bias` 0.

use ds4_gguf::{GgmlType, Value};

use super::{Init, Tensor, Window, add_hc_mixes, add_q2_experts, vocab};

/// The architecture name.
pub const ARCH: &str = "glm5-next";

/// The one quant name of this family.
pub const QUANT: &str = "q2";

/// A `glm5-next` configuration (GLM-5.3-Flash's: transformers' `Glm5NextTextConfig`
/// defaults as `synth_gguf.py`'s `GLM53_FLASH` reads them). No RoPE (`n_rot` 0),
/// sigmoid routing.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Shape {
    pub name: &'static str,
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_vocab: usize,
    pub n_ctx_train: usize,
    /// KDA heads and MLA heads.
    pub n_head: usize,
    pub kda_head_dim: usize,
    pub kda_conv: usize,
    pub kda_lower_bound: f32,
    pub q_lora: usize,
    pub kv_lora: usize,
    pub qk_nope: usize,
    pub v_head: usize,
    pub indexer_heads: usize,
    pub indexer_dim: usize,
    pub indexer_topk: usize,
    pub indexer_kpool: usize,
    pub indexer_tail: bool,
    pub n_expert: usize,
    pub n_expert_used: usize,
    pub n_expert_shared: usize,
    pub n_ff_exp: usize,
    /// The dense FFN of the leading layers.
    pub n_ff: usize,
    /// Real layers `0..dense_lead` have a dense FFN.
    pub dense_lead: usize,
    pub n_group: usize,
    pub topk_group: usize,
    pub routed_scale: f32,
    pub norm_topk: bool,
    pub swiglu_limit: f32,
    /// mHC streams, Sinkhorn iterations, eps.
    pub hc: usize,
    pub hc_sinkhorn: usize,
    pub hc_eps: f32,
    pub rms_eps: f32,
    /// The indexer's k LayerNorm eps (the converter's fixed value).
    pub norm_eps: f32,
}

/// The shapes known by name.
pub const SHAPES: &[Shape] = &[
    Shape {
        name: "glm53-flash",
        n_layer: 45,
        n_embd: 4096,
        n_vocab: 154880,
        n_ctx_train: 202752,
        n_head: 64,
        kda_head_dim: 128,
        kda_conv: 4,
        kda_lower_bound: -5.0,
        q_lora: 1536,
        kv_lora: 512,
        qk_nope: 256,
        v_head: 256,
        indexer_heads: 32,
        indexer_dim: 128,
        indexer_topk: 2048,
        indexer_kpool: 16,
        indexer_tail: true,
        n_expert: 288,
        n_expert_used: 8,
        n_expert_shared: 1,
        n_ff_exp: 2048,
        n_ff: 12288,
        dense_lead: 3,
        n_group: 1,
        topk_group: 1,
        routed_scale: 2.5,
        norm_topk: true,
        swiglu_limit: 10.0,
        hc: 4,
        hc_sinkhorn: 20,
        hc_eps: 1e-6,
        rms_eps: 1e-5,
        norm_eps: 1e-6,
    },
    // GLM-5.3-Flash's structure at hidden 256 (every quantized row whole 256-blocks),
    // 8 layers (3 dense, 2 MLA), 16 experts top-4: small enough for CPU tests, with a
    // top-k that the indexer exceeds after a few dozen tokens.
    Shape {
        name: "tiny-glm5",
        n_layer: 8,
        n_embd: 256,
        n_vocab: 1024,
        n_ctx_train: 4096,
        n_head: 4,
        kda_head_dim: 64,
        kda_conv: 4,
        kda_lower_bound: -5.0,
        q_lora: 256,
        kv_lora: 128,
        qk_nope: 64,
        v_head: 64,
        indexer_heads: 8,
        indexer_dim: 64,
        indexer_topk: 32,
        indexer_kpool: 8,
        indexer_tail: true,
        n_expert: 16,
        n_expert_used: 4,
        n_expert_shared: 1,
        n_ff_exp: 256,
        n_ff: 512,
        dense_lead: 3,
        n_group: 1,
        topk_group: 1,
        routed_scale: 2.5,
        norm_topk: true,
        swiglu_limit: 10.0,
        hc: 4,
        hc_sinkhorn: 20,
        hc_eps: 1e-6,
        rms_eps: 1e-5,
        norm_eps: 1e-6,
    },
];

/// llama.cpp's `LLAMA_FTYPE_MOSTLY_IQ2_XXS` (a label: the mix is not one type).
const FILE_TYPE: u32 = 19;
/// `LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID`.
const GATING_SIGMOID: u32 = 2;
/// ggml's `GGML_QNT_VERSION`.
const QUANTIZATION_VERSION: u32 = 2;

impl Shape {
    /// Whether real layer `i` is an MLA (+ indexer) layer; else KDA.
    pub fn is_mla(&self, i: usize) -> bool {
        i % 4 == 3
    }

    /// Whether real layer `i` has a dense FFN; else MoE.
    pub fn is_dense(&self, i: usize) -> bool {
        i < self.dense_lead
    }

    /// The kind of real layer `i`, as `synth_gguf.py` prints it.
    pub fn layer_kind(&self, i: usize) -> &'static str {
        match (self.is_mla(i), self.is_dense(i)) {
            (false, true) => "KDA, dense FFN",
            (false, false) => "KDA, MoE",
            (true, true) => "MLA+indexer, dense FFN",
            (true, false) => "MLA+indexer, MoE",
        }
    }
}

/// The metadata of layers `w` of `s`, in `synth_gguf.py`'s order and value types.
pub fn metadata(s: &Shape, w: Window) -> Vec<(String, Value)> {
    let real = w.first..w.first + w.n_layer;
    let n_dense = real.clone().filter(|&i| s.is_dense(i)).count();
    let u = |x: usize| Value::U32(x as u32);
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
        ("block_count", u(w.n_layer)),
        ("vocab_size", u(s.n_vocab)),
        ("feed_forward_length", u(s.n_ff)),
        ("attention.head_count", u(s.n_head)),
        (
            // 0 marks a KDA layer, 1 an MLA layer.
            "attention.head_count_kv",
            Value::Array(real.map(|i| Value::I32(s.is_mla(i).into())).collect()),
        ),
        ("attention.key_length", u(s.kv_lora)),
        ("attention.value_length", u(s.kv_lora)),
        ("rope.dimension_count", u(0)),
        ("expert_count", u(s.n_expert)),
        ("expert_used_count", u(s.n_expert_used)),
        ("expert_group_count", u(s.n_group)),
        ("expert_group_used_count", u(s.topk_group)),
        ("attention.layer_norm_rms_epsilon", Value::F32(s.rms_eps)),
        ("attention.layer_norm_epsilon", Value::F32(s.norm_eps)),
        ("attention.key_length_mla", u(s.qk_nope)),
        ("attention.value_length_mla", u(s.v_head)),
        ("attention.q_lora_rank", u(s.q_lora)),
        ("attention.kv_lora_rank", u(s.kv_lora)),
        ("ssm.conv_kernel", u(s.kda_conv)),
        ("kda.head_dim", u(s.kda_head_dim)),
        ("kda.gate_lower_bound", Value::F32(s.kda_lower_bound)),
        ("leading_dense_block_count", u(n_dense)),
        ("expert_feed_forward_length", u(s.n_ff_exp)),
        ("expert_shared_count", u(s.n_expert_shared)),
        ("expert_weights_scale", Value::F32(s.routed_scale)),
        ("expert_weights_norm", Value::Bool(s.norm_topk)),
        ("expert_gating_func", Value::U32(GATING_SIGMOID)),
        ("swiglu_clamp_exp", per_layer(s.swiglu_limit)),
        ("swiglu_clamp_shexp", per_layer(s.swiglu_limit)),
        ("attention.indexer.head_count", u(s.indexer_heads)),
        ("attention.indexer.key_length", u(s.indexer_dim)),
        ("attention.indexer.top_k", u(s.indexer_topk)),
        ("attention.indexer.kpool", u(s.indexer_kpool)),
        (
            "attention.indexer.kpool_select_tail",
            Value::Bool(s.indexer_tail),
        ),
        ("hyper_connection.count", u(s.hc)),
        ("hyper_connection.sinkhorn_iterations", u(s.hc_sinkhorn)),
        ("hyper_connection.epsilon", Value::F32(s.hc_eps)),
    ];
    md.extend(keys.into_iter().map(|(k, v)| (format!("{ARCH}.{k}"), v)));
    md.extend(vocab::minimal(s.n_vocab));
    md
}

/// Every tensor of layers `w` of `s`, in `synth_gguf.py`'s order.
pub fn tensors(s: &Shape, w: Window) -> Vec<Tensor> {
    use GgmlType::{BF16, F16, F32, Q8_0};
    let (e, v) = (s.n_embd as u64, s.n_vocab as u64);
    let (hc, ql, kvl) = (s.hc as u64, s.q_lora as u64, s.kv_lora as u64);
    let (h, hd) = (s.n_head as u64, s.kda_head_dim as u64);
    let d_inner = h * hd;
    let (ne, ff) = (s.n_expert as u64, s.n_ff_exp as u64);
    let mix = (2 + hc) * hc;
    let mut t = Vec::new();
    let nu = s.n_expert_used as u64;
    let mut add = |name: String, dims: &[u64], ty: GgmlType, init: Init| {
        t.push(Tensor::moe(name, dims, ty, init, nu, ne))
    };
    let (mat, flt, norm) = (Init::Blocks, Init::Floats, Init::Norm);
    add("token_embd.weight".into(), &[e, v], F16, flt);
    add("output_norm.weight".into(), &[e], F32, norm);
    add("output.weight".into(), &[e, v], Q8_0, mat);
    for (i, real) in (w.first..w.first + w.n_layer).enumerate() {
        let mut add = |x: &str, dims: &[u64], ty, init| add(format!("blk.{i}.{x}"), dims, ty, init);
        add("attn_norm.weight", &[e], F32, norm);
        add("ffn_norm.weight", &[e], F32, norm);
        add_hc_mixes(&mut add, hc * e, mix, F32);
        if !s.is_mla(real) {
            let kc = s.kda_conv as u64;
            for x in ["q", "k", "v"] {
                add(
                    &format!("ssm_conv1d_{x}.weight"),
                    &[kc, 1, d_inner, 1],
                    F32,
                    flt,
                );
            }
            for x in ["q", "k", "v"] {
                add(&format!("attn_{x}.weight"), &[e, d_inner], Q8_0, mat);
            }
            add("ssm_f_a.weight", &[e, hd], BF16, flt);
            add("ssm_f_b.weight", &[hd, d_inner], BF16, flt);
            add("ssm_beta.weight", &[e, h], BF16, flt);
            // −exp(A_log): a decay.
            add("ssm_a", &[h], F32, Init::Const(-1.0));
            add("ssm_dt.bias", &[d_inner], F32, Init::Const(0.0));
            add("ssm_g_a.weight", &[e, hd], BF16, flt);
            add("ssm_g_b.weight", &[hd, d_inner], BF16, flt);
            add("ssm_norm.weight", &[hd], F32, norm);
            add("attn_output.weight", &[d_inner, e], Q8_0, mat);
        } else {
            let (dn, dv) = (s.qk_nope as u64, s.v_head as u64);
            let (ih, idim) = (s.indexer_heads as u64, s.indexer_dim as u64);
            add("attn_q_a_norm.weight", &[ql], F32, norm);
            add("attn_kv_a_norm.weight", &[kvl], F32, norm);
            add("attn_q_a.weight", &[e, ql], Q8_0, mat);
            add("attn_q_b.weight", &[ql, h * dn], Q8_0, mat);
            add("attn_kv_a_mqa.weight", &[e, kvl], BF16, flt);
            add("attn_k_b.weight", &[dn, kvl, h], BF16, flt);
            add("attn_v_b.weight", &[kvl, dv, h], BF16, flt);
            add("attn_output.weight", &[h * dv, e], Q8_0, mat);
            add("indexer.k_norm.weight", &[idim], F32, norm);
            add("indexer.k_norm.bias", &[idim], F32, Init::Const(0.0));
            add("indexer.proj.weight", &[e, ih], F32, flt);
            add("indexer.attn_k.weight", &[e, idim], BF16, flt);
            add("indexer.attn_q_b.weight", &[ql, ih * idim], BF16, flt);
            add("indexer_compressor_gate.weight", &[e, idim], F32, flt);
            let kpool = s.indexer_kpool as u64;
            add("indexer_compressor_ape.weight", &[idim, kpool], F32, flt);
        }
        if s.is_dense(real) {
            let f = s.n_ff as u64;
            add("ffn_gate.weight", &[e, f], Q8_0, mat);
            add("ffn_down.weight", &[f, e], Q8_0, mat);
            add("ffn_up.weight", &[e, f], Q8_0, mat);
        } else {
            add("ffn_gate_inp.weight", &[e, ne], F32, flt);
            add("exp_probs_b.bias", &[ne], F32, Init::Const(0.0));
            add_q2_experts(&mut add, e, ff, ne, s.n_expert_shared as u64);
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::super::Spec;
    use super::*;

    #[test]
    fn glm53_flash_q2_has_the_issues_sizes() {
        // synth_gguf.py - --shape glm53-flash --dry-run: 1383 tensors, 96343618808
        // bytes of weights, 11838887160 read per decode token.
        let s = Spec::parse("glm53-flash:q2").unwrap();
        assert_eq!(s.tensors().len(), 1383);
        assert_eq!(s.weight_bytes(), 96_343_618_808);
        assert_eq!(s.decode_bytes(), 11_838_887_160);
        let kinds = s.layer_kinds();
        assert_eq!(kinds.iter().filter(|k| k.starts_with("MLA")).count(), 11);
        assert_eq!(kinds.iter().filter(|k| k.ends_with("dense FFN")).count(), 3);
    }

    #[test]
    fn tiny_random_blocks_are_whole_256_blocks() {
        for t in Spec::parse("tiny-glm5:q2").unwrap().tensors() {
            if t.init == Init::Blocks {
                assert_eq!(t.dims[0] % 256, 0, "{}", t.name);
            }
        }
    }
}
