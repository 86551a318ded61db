//! Synthetic models: random, valid quantized weights of a real model's shape, so that
//! speed can be measured (and compared with another engine on the identical file)
//! without the real weights.
//!
//! A name is `SHAPE:QUANT`, e.g. `llama3-8b:q4_k_m`:
//!
//! - shapes ([`SHAPES`]): `llama3-8b`, `qwen2.5-7b`, `qwen2.5-1.5b` (the published
//!   configurations), and small ones for parity tests (`tiny-llama`, `tiny-qwen2`,
//!   `small-llama`);
//! - quants: `q4_k_m` (llama.cpp's Q4_K_M choice: Q4_K for most matrices, Q6_K for
//!   `attn_v`, `ffn_down` and the output head) or one type for every matrix (`q4_0`,
//!   `q4_1`, `q5_0`, `q8_0`, `q4_k`, `q5_k`, `q6_k`, `iq2_xxs`).
//!
//! [`write_gguf`] writes the model as a GGUF file with a byte-level BPE vocabulary of
//! the right size (256 byte tokens, filler tokens, BOS and EOS); [`header_file`] opens
//! the same tensor directory over a sparse file with no data, for
//! [`crate::CudaBackend::synthetic`], which generates the weights in GPU memory with the
//! same generator ([`generate`]). Works without CUDA.

pub mod generate;
mod gguf;

pub use gguf::{header_file, write_gguf};

use ds4_gguf::GgmlType;

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

/// A synthetic model: shape, quantization and generator seed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spec {
    pub shape: Shape,
    pub recipe: Recipe,
    pub seed: u64,
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

/// The default generator seed.
pub const DEFAULT_SEED: u64 = 0x05EE_DD54;

impl Spec {
    /// Parses `SHAPE:QUANT` (see the module docs).
    ///
    /// Errors: [`CudaError::Unsupported`] naming the known shapes and quants.
    pub fn parse(name: &str) -> Result<Spec> {
        let known = || {
            let shapes: Vec<&str> = SHAPES.iter().map(|s| s.name).collect();
            let quants: Vec<&str> = QUANTS.iter().map(|q| q.0).collect();
            format!(
                "shapes: {}; quants: {}",
                shapes.join(", "),
                quants.join(", ")
            )
        };
        let (s, q) = name.split_once(':').ok_or_else(|| {
            CudaError::Unsupported(format!(
                "synthetic model '{name}' is not SHAPE:QUANT ({})",
                known()
            ))
        })?;
        let shape = SHAPES
            .iter()
            .find(|x| x.name.eq_ignore_ascii_case(s))
            .ok_or_else(|| {
                CudaError::Unsupported(format!("unknown synthetic shape '{s}' ({})", known()))
            })?;
        let recipe = match QUANTS.iter().find(|x| x.0.eq_ignore_ascii_case(q)) {
            Some((_, None)) => Recipe::Q4KM,
            Some((_, Some(t))) => Recipe::Uniform(*t),
            None => {
                return Err(CudaError::Unsupported(format!(
                    "unknown synthetic quant '{q}' ({})",
                    known()
                )));
            }
        };
        for &d in [shape.n_embd, shape.n_ff].iter() {
            let ty_block = match recipe {
                Recipe::Q4KM => 256,
                Recipe::Uniform(t) => t.block_size(),
            };
            if d % ty_block != 0 {
                return Err(CudaError::Unsupported(format!(
                    "shape {s} has a dimension {d} that {q} blocks do not divide"
                )));
            }
        }
        Ok(Spec {
            shape: *shape,
            recipe,
            seed: DEFAULT_SEED,
        })
    }

    /// The canonical name (`llama3-8b:q4_k_m`).
    pub fn name(&self) -> String {
        let q = match self.recipe {
            Recipe::Q4KM => "q4_k_m".to_string(),
            Recipe::Uniform(t) => t.name().to_ascii_lowercase(),
        };
        format!("{}:{q}", self.shape.name)
    }

    fn ty(&self, role: Role) -> GgmlType {
        match self.recipe {
            Recipe::Uniform(t) => t,
            Recipe::Q4KM => match role {
                Role::AttnV | Role::FfnDown | Role::Output => GgmlType::Q6_K,
                // A tied table is the output head too: llama.cpp gives it the output's type.
                Role::Embedding if self.shape.tied => GgmlType::Q6_K,
                _ => GgmlType::Q4_K,
            },
        }
    }

    /// Every tensor: name, dims (ggml order, `dims[0]` the row length) and type.
    pub fn tensors(&self) -> Vec<(String, Vec<u64>, GgmlType)> {
        let s = &self.shape;
        let hd = s.n_embd / s.n_head;
        let (q_dim, kv_dim) = ((s.n_head * hd) as u64, (s.n_head_kv * hd) as u64);
        let (e, f, v) = (s.n_embd as u64, s.n_ff as u64, s.n_vocab as u64);
        let mut t = vec![(
            "token_embd.weight".to_string(),
            vec![e, v],
            self.ty(Role::Embedding),
        )];
        for i in 0..s.n_layer {
            let n = |x: &str| format!("blk.{i}.{x}");
            t.push((n("attn_norm.weight"), vec![e], GgmlType::F32));
            t.push((n("attn_q.weight"), vec![e, q_dim], self.ty(Role::Other)));
            t.push((n("attn_k.weight"), vec![e, kv_dim], self.ty(Role::Other)));
            t.push((n("attn_v.weight"), vec![e, kv_dim], self.ty(Role::AttnV)));
            if s.qkv_bias {
                t.push((n("attn_q.bias"), vec![q_dim], GgmlType::F32));
                t.push((n("attn_k.bias"), vec![kv_dim], GgmlType::F32));
                t.push((n("attn_v.bias"), vec![kv_dim], GgmlType::F32));
            }
            t.push((
                n("attn_output.weight"),
                vec![q_dim, e],
                self.ty(Role::Other),
            ));
            t.push((n("ffn_norm.weight"), vec![e], GgmlType::F32));
            t.push((n("ffn_gate.weight"), vec![e, f], self.ty(Role::Other)));
            t.push((n("ffn_up.weight"), vec![e, f], self.ty(Role::Other)));
            t.push((n("ffn_down.weight"), vec![f, e], self.ty(Role::FfnDown)));
        }
        t.push(("output_norm.weight".to_string(), vec![e], GgmlType::F32));
        if !s.tied {
            t.push((
                "output.weight".to_string(),
                vec![e, v],
                self.ty(Role::Output),
            ));
        }
        t
    }

    /// Bytes of all tensors (the GGUF data section without padding).
    pub fn weight_bytes(&self) -> u64 {
        self.tensors()
            .iter()
            .map(|(_, d, ty)| {
                d.iter().product::<u64>() / ty.block_size() as u64 * ty.type_size() as u64
            })
            .sum()
    }
}

#[derive(Clone, Copy)]
enum Role {
    Embedding,
    AttnV,
    FfnDown,
    Output,
    Other,
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
    }

    #[test]
    fn names_parse_and_round_trip() {
        for n in [
            "tiny-llama:q4_0",
            "tiny-qwen2:iq2_xxs",
            "qwen2.5-7b:q4_k_m",
            "small-llama:q6_k",
        ] {
            assert_eq!(Spec::parse(n).unwrap().name(), n);
        }
        assert!(Spec::parse("llama3-8b").is_err());
        assert!(Spec::parse("nope:q4_0").is_err());
        assert!(Spec::parse("llama3-8b:q3_k").is_err());
    }
}
