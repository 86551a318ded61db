//! Dense synthetic models (`llama`, `qwen2`): the published configurations of
//! Llama-3-8B, Qwen2.5-7B and Qwen2.5-1.5B and small shapes for parity tests, with
//! llama.cpp's Q4_K_M choice or one type for every matrix. Tensor names, dims and
//! metadata keys are llama.cpp's (`src/llama-arch.cpp`); the vocabulary is a
//! byte-level BPE of the model's size ([`super::vocab::byte_level`]).

use ds4_gguf::{GgmlType, Value};

use super::{Init, Read, Spec, Tensor, Window, vocab};
use crate::error::{CudaError, Result};

/// A model configuration (as in the published `config.json`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Shape {
    pub name: &'static str,
    /// `llama` or `qwen2`.
    pub arch: &'static str,
    pub n_embd: usize,
    pub n_ff: usize,
    pub n_layer: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub n_vocab: usize,
    pub rope_base: f32,
    pub eps: f32,
    pub n_ctx_train: usize,
    /// The output head is the embedding table (no `output.weight`).
    pub tied: bool,
    /// q/k/v projections have biases (qwen2).
    pub qkv_bias: bool,
}

/// The shapes known by name.
pub const SHAPES: &[Shape] = &[
    Shape {
        name: "llama3-8b",
        arch: "llama",
        n_embd: 4096,
        n_ff: 14336,
        n_layer: 32,
        n_head: 32,
        n_head_kv: 8,
        n_vocab: 128256,
        rope_base: 500000.0,
        eps: 1e-5,
        n_ctx_train: 8192,
        tied: false,
        qkv_bias: false,
    },
    Shape {
        name: "qwen2.5-7b",
        arch: "qwen2",
        n_embd: 3584,
        n_ff: 18944,
        n_layer: 28,
        n_head: 28,
        n_head_kv: 4,
        n_vocab: 152064,
        rope_base: 1000000.0,
        eps: 1e-6,
        n_ctx_train: 32768,
        tied: false,
        qkv_bias: true,
    },
    Shape {
        name: "qwen2.5-1.5b",
        arch: "qwen2",
        n_embd: 1536,
        n_ff: 8960,
        n_layer: 28,
        n_head: 12,
        n_head_kv: 2,
        n_vocab: 151936,
        rope_base: 1000000.0,
        eps: 1e-6,
        n_ctx_train: 32768,
        tied: true,
        qkv_bias: true,
    },
    Shape {
        name: "tiny-llama",
        arch: "llama",
        n_embd: 512,
        n_ff: 1536,
        n_layer: 2,
        n_head: 8,
        n_head_kv: 2,
        n_vocab: 2048,
        rope_base: 10000.0,
        eps: 1e-5,
        n_ctx_train: 2048,
        tied: false,
        qkv_bias: false,
    },
    Shape {
        name: "tiny-qwen2",
        arch: "qwen2",
        n_embd: 512,
        n_ff: 1024,
        n_layer: 2,
        n_head: 4,
        n_head_kv: 2,
        n_vocab: 1536,
        rope_base: 1000000.0,
        eps: 1e-6,
        n_ctx_train: 2048,
        tied: true,
        qkv_bias: true,
    },
    Shape {
        name: "small-llama",
        arch: "llama",
        n_embd: 1024,
        n_ff: 2816,
        n_layer: 4,
        n_head: 16,
        n_head_kv: 4,
        n_vocab: 4096,
        rope_base: 10000.0,
        eps: 1e-5,
        n_ctx_train: 4096,
        tied: false,
        qkv_bias: false,
    },
];

/// How matrices are quantized.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recipe {
    /// llama.cpp's Q4_K_M choice (with Q6_K for `attn_v` and `ffn_down` in every layer).
    Q4KM,
    /// One type for every matrix.
    Uniform(GgmlType),
}

/// The quant names accepted after the colon.
pub const QUANTS: &[(&str, Option<GgmlType>)] = &[
    ("q4_k_m", None),
    ("q4_0", Some(GgmlType::Q4_0)),
    ("q4_1", Some(GgmlType::Q4_1)),
    ("q5_0", Some(GgmlType::Q5_0)),
    ("q8_0", Some(GgmlType::Q8_0)),
    ("q4_k", Some(GgmlType::Q4_K)),
    ("q5_k", Some(GgmlType::Q5_K)),
    ("q6_k", Some(GgmlType::Q6_K)),
    ("iq2_xxs", Some(GgmlType::IQ2_XXS)),
];

impl Recipe {
    /// The recipe of quant name `q` (see [`QUANTS`]).
    pub fn parse(q: &str) -> Option<Recipe> {
        QUANTS
            .iter()
            .find(|x| x.0.eq_ignore_ascii_case(q))
            .map(|(_, t)| t.map_or(Recipe::Q4KM, Recipe::Uniform))
    }

    /// The quant name (`q4_k_m`, `q8_0`, …).
    pub fn name(self) -> String {
        match self {
            Recipe::Q4KM => "q4_k_m".to_string(),
            Recipe::Uniform(t) => t.name().to_ascii_lowercase(),
        }
    }

    /// llama.cpp's `llama_ftype` (`general.file_type`).
    fn file_type(self) -> u32 {
        use GgmlType::*;
        match self {
            Recipe::Q4KM => 15,
            Recipe::Uniform(t) => match t {
                Q4_0 => 2,
                Q4_1 => 3,
                Q8_0 => 7,
                Q5_0 => 8,
                Q4_K => 14,
                Q5_K => 16,
                Q6_K => 18,
                IQ2_XXS => 19,
                _ => 0,
            },
        }
    }

    fn ty(self, shape: &Shape, role: Role) -> GgmlType {
        match self {
            Recipe::Uniform(t) => t,
            Recipe::Q4KM => match role {
                Role::AttnV | Role::FfnDown | Role::Output => GgmlType::Q6_K,
                // A tied table is the output head too: llama.cpp gives it the output's type.
                Role::Embedding if shape.tied => GgmlType::Q6_K,
                _ => GgmlType::Q4_K,
            },
        }
    }
}

/// Checks that `recipe`'s blocks divide the rows of `shape` (`q` names the quant).
///
/// Errors: [`CudaError::Unsupported`].
pub fn check(shape: &Shape, recipe: Recipe, q: &str) -> Result<()> {
    let block = match recipe {
        Recipe::Q4KM => 256,
        Recipe::Uniform(t) => t.block_size(),
    };
    for d in [shape.n_embd, shape.n_ff] {
        if d % block != 0 {
            return Err(CudaError::Unsupported(format!(
                "shape {} has a dimension {d} that {q} blocks do not divide",
                shape.name
            )));
        }
    }
    Ok(())
}

#[derive(Clone, Copy)]
enum Role {
    Embedding,
    AttnV,
    FfnDown,
    Output,
    Other,
}

/// Every tensor of layers `w` of `shape` under `recipe`.
pub fn tensors(shape: &Shape, recipe: Recipe, w: Window) -> Vec<Tensor> {
    let s = shape;
    let hd = s.n_embd / s.n_head;
    let (q_dim, kv_dim) = ((s.n_head * hd) as u64, (s.n_head_kv * hd) as u64);
    let (e, f, v) = (s.n_embd as u64, s.n_ff as u64, s.n_vocab as u64);
    let ty = |role| recipe.ty(s, role);
    let mut t = Vec::new();
    let mut add = |name: String, dims: Vec<u64>, ty: GgmlType, init: Init, read: Read| {
        t.push(Tensor {
            name,
            dims,
            ty,
            init,
            read,
        })
    };
    // A tied table is read whole as the output head.
    let embd_read = if s.tied { Read::All } else { Read::Row };
    let (mat, all) = (Init::Blocks, Read::All);
    add(
        "token_embd.weight".into(),
        vec![e, v],
        ty(Role::Embedding),
        mat,
        embd_read,
    );
    for i in 0..w.n_layer {
        let n = |x: &str| format!("blk.{i}.{x}");
        add(
            n("attn_norm.weight"),
            vec![e],
            GgmlType::F32,
            Init::Norm,
            all,
        );
        add(
            n("attn_q.weight"),
            vec![e, q_dim],
            ty(Role::Other),
            mat,
            all,
        );
        add(
            n("attn_k.weight"),
            vec![e, kv_dim],
            ty(Role::Other),
            mat,
            all,
        );
        add(
            n("attn_v.weight"),
            vec![e, kv_dim],
            ty(Role::AttnV),
            mat,
            all,
        );
        if s.qkv_bias {
            add(
                n("attn_q.bias"),
                vec![q_dim],
                GgmlType::F32,
                Init::Bias,
                all,
            );
            add(
                n("attn_k.bias"),
                vec![kv_dim],
                GgmlType::F32,
                Init::Bias,
                all,
            );
            add(
                n("attn_v.bias"),
                vec![kv_dim],
                GgmlType::F32,
                Init::Bias,
                all,
            );
        }
        add(
            n("attn_output.weight"),
            vec![q_dim, e],
            ty(Role::Other),
            mat,
            all,
        );
        add(
            n("ffn_norm.weight"),
            vec![e],
            GgmlType::F32,
            Init::Norm,
            all,
        );
        add(n("ffn_gate.weight"), vec![e, f], ty(Role::Other), mat, all);
        add(n("ffn_up.weight"), vec![e, f], ty(Role::Other), mat, all);
        add(
            n("ffn_down.weight"),
            vec![f, e],
            ty(Role::FfnDown),
            mat,
            all,
        );
    }
    add(
        "output_norm.weight".into(),
        vec![e],
        GgmlType::F32,
        Init::Norm,
        all,
    );
    if !s.tied {
        add(
            "output.weight".into(),
            vec![e, v],
            ty(Role::Output),
            mat,
            all,
        );
    }
    t
}

/// The metadata of `spec` (a dense model of `shape` under `recipe`).
pub fn metadata(spec: &Spec, shape: &Shape, recipe: Recipe) -> Vec<(String, Value)> {
    let s = shape;
    let a = s.arch;
    let hd = s.n_embd / s.n_head;
    let u = |x: usize| Value::U32(x as u32);
    let mut md = vec![
        ("general.architecture".into(), Value::String(a.into())),
        (
            "general.name".into(),
            Value::String(format!("synthetic {}", spec.name())),
        ),
        ("general.file_type".into(), Value::U32(recipe.file_type())),
        (format!("{a}.vocab_size"), u(s.n_vocab)),
        (format!("{a}.context_length"), u(s.n_ctx_train)),
        (format!("{a}.embedding_length"), u(s.n_embd)),
        (format!("{a}.block_count"), u(spec.window.n_layer)),
        (format!("{a}.feed_forward_length"), u(s.n_ff)),
        (format!("{a}.attention.head_count"), u(s.n_head)),
        (format!("{a}.attention.head_count_kv"), u(s.n_head_kv)),
        (format!("{a}.rope.dimension_count"), u(hd)),
        (format!("{a}.rope.freq_base"), Value::F32(s.rope_base)),
        (
            format!("{a}.attention.layer_norm_rms_epsilon"),
            Value::F32(s.eps),
        ),
    ];
    md.extend(vocab::byte_level(s.n_vocab, a == "llama"));
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama3_8b_q4_k_m_matches_llama_cpp_file_size() {
        // The peer file: Llama-3-8B Q4_K_M, 4.82 GiB.
        let s = Spec::parse("llama3-8b:q4_k_m").unwrap();
        let gib = s.weight_bytes() as f64 / (1u64 << 30) as f64;
        assert!((gib - 4.82).abs() < 0.02, "{gib} GiB");
        assert_eq!(s.tensors().len(), 2 + 9 * 32 + 1);
        let w = s.window(30, None).unwrap();
        assert_eq!(w.tensors().len(), 2 + 9 * 2 + 1);
    }
}
