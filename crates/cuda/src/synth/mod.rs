//! Synthetic models: random, valid weights of a real model's shape, so that speed can
//! be measured (and compared with another engine on the identical file) without the
//! real weights.
//!
//! A name is `SHAPE:QUANT`:
//!
//! - dense shapes ([`dense::SHAPES`]): `llama3-8b`, `qwen2.5-7b`, `qwen2.5-1.5b` (the
//!   published configurations) and small ones for parity tests (`tiny-llama`,
//!   `tiny-qwen2`, `small-llama`), with `q4_k_m` (llama.cpp's Q4_K_M choice) or one
//!   type for every matrix ([`dense::QUANTS`]);
//! - `glm5-next` shapes ([`glm5_next::SHAPES`]): `glm53-flash` (GLM-5.3-Flash) and
//!   `tiny-glm5` (its structure at hidden 256, for CPU tests), with `q2`, the mix
//!   llama.cpp writes for it (`../shared/tools/synth_gguf.py --shape glm53-flash`, the
//!   layout's authority);
//! - `deepseek4` shapes ([`deepseek4::SHAPES`]): `deepseek4-flash` (DeepSeek-V4-Flash)
//!   and `tiny-deepseek4` (its structure at hidden 256), with ds4's `q2` mix
//!   (`synth_gguf.py --shape deepseek4-flash`).
//!
//! A [`Window`] keeps real layers `first..first + n_layer` with their real kinds (file
//! layer 0 is real layer `first`), as `synth_gguf.py --first-layer K --layers N` does.
//!
//! Every tensor has an [`Init`]: random quantized blocks, random floats, norm weights,
//! small biases or a constant the model needs ([`generate`] has the generators).
//! [`write_gguf`] writes the whole model; [`header_file`] writes the same file with only
//! the tensors the host generates ([`on_host`]: every F32 tensor and every tensor of at
//! most [`HOST_ELEMENTS`] elements) and the rest a sparse hole, for
//! [`crate::CudaBackend::synthetic`], which reads those from the file (the engine reads
//! some of them on the host) and generates the others in GPU memory with the device
//! twins of the same generators. Works without CUDA.

pub mod deepseek4;
pub mod dense;
pub mod generate;
mod gguf;
pub mod glm5_next;
mod vocab;

pub use gguf::{header_bytes, header_file, write_gguf};

use ds4_engine::partition::{Layout, PlanError};
use ds4_gguf::{GgmlType, Metadata, TensorInfo, Value};

use crate::error::{CudaError, Result};

/// Tensors of at most this many elements are generated on the host (see [`on_host`]).
pub const HOST_ELEMENTS: u64 = 1 << 20;

/// Whether a synthetic tensor of type `ty` with `n_elements` elements is generated on the
/// host (and so lies in [`header_file`]): every F32 tensor and every small one. The rest
/// (quantized matrices, large F16/BF16 matrices) is generated on the device.
pub fn on_host(ty: GgmlType, n_elements: u64) -> bool {
    ty == GgmlType::F32 || n_elements <= HOST_ELEMENTS
}

/// The default generator seed.
pub const DEFAULT_SEED: u64 = 0x05EE_DD54;

/// A model family with its shape and quantization.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Family {
    /// A dense `llama` / `qwen2` model.
    Dense {
        shape: &'static dense::Shape,
        recipe: dense::Recipe,
    },
    /// A `glm5-next` model in the `q2` mix.
    Glm5Next(&'static glm5_next::Shape),
    /// A `deepseek4` model in the `q2` mix.
    DeepSeek4(&'static deepseek4::Shape),
}

/// Real layers `first..first + n_layer` of the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub first: usize,
    pub n_layer: usize,
}

/// A synthetic model: family, shape and quantization, layer window and generator seed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spec {
    pub family: Family,
    pub window: Window,
    pub seed: u64,
}

/// How a tensor's values are made (see [`generate`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Init {
    /// Random quantized blocks ([`generate::blocks`]).
    Blocks,
    /// Random floats of standard deviation about 0.02 ([`generate::floats`]).
    Floats,
    /// Norm weights in [0.5, 1.5) ([`generate::norms`]).
    Norm,
    /// Biases in [-0.1, 0.1) ([`generate::biases`]).
    Bias,
    /// Every element this value.
    Const(f32),
    /// A hash-routing table: rows of distinct expert ids below this count
    /// ([`generate::expert_ids`]).
    ExpertIds(u32),
}

/// How much of a tensor one decode token reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Read {
    /// All of it.
    All,
    /// One row (a token embedding table).
    Row,
    /// `used` of its `n` stacked expert matrices.
    Experts { used: u64, n: u64 },
}

/// One tensor of a synthetic model.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    pub name: String,
    /// ggml order: `dims[0]` is the row length.
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    pub init: Init,
    pub read: Read,
}

impl Tensor {
    /// A tensor of a synthetic MoE model, what a decode step reads of it following from
    /// its llama.cpp name: a token's row of the embedding and of `tid2eid`, `used` of the
    /// `n` stacked experts, all of any other.
    fn moe(name: String, dims: &[u64], ty: GgmlType, init: Init, used: u64, n: u64) -> Tensor {
        let read = if name.ends_with("_exps.weight") {
            Read::Experts { used, n }
        } else if name == "token_embd.weight" || name.ends_with("tid2eid.weight") {
            Read::Row
        } else {
            Read::All
        };
        Tensor {
            name,
            dims: dims.to_vec(),
            ty,
            init,
            read,
        }
    }

    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }

    /// Bytes in the file (without padding).
    pub fn n_bytes(&self) -> u64 {
        self.n_elements() / self.ty.block_size() as u64 * self.ty.type_size() as u64
    }

    /// Bytes one decode token reads.
    pub fn decode_bytes(&self) -> u64 {
        let b = self.n_bytes();
        match self.read {
            Read::All => b,
            Read::Row => b / self.dims.get(1).copied().unwrap_or(1).max(1),
            Read::Experts { used, n } => b / n * used,
        }
    }
}

impl Spec {
    /// Parses `SHAPE:QUANT` (see the module docs); the window is the whole model.
    ///
    /// Errors: [`CudaError::Unsupported`] listing the valid names.
    pub fn parse(name: &str) -> Result<Spec> {
        let bad = |what: String| {
            CudaError::Unsupported(format!("{what}; valid names: {}", valid_names()))
        };
        let (s, q) = name
            .split_once(':')
            .ok_or_else(|| bad(format!("synthetic model '{name}' is not SHAPE:QUANT")))?;
        let family = if let Some(shape) = dense::SHAPES
            .iter()
            .find(|x| x.name.eq_ignore_ascii_case(s))
        {
            let recipe = dense::Recipe::parse(q).ok_or_else(|| {
                bad(format!(
                    "'{q}' is not a quant of the dense shape {}",
                    shape.name
                ))
            })?;
            dense::check(shape, recipe, q)?;
            Family::Dense { shape, recipe }
        } else if let Some(shape) = glm5_next::SHAPES
            .iter()
            .find(|x| x.name.eq_ignore_ascii_case(s))
        {
            if !q.eq_ignore_ascii_case(glm5_next::QUANT) {
                return Err(bad(format!(
                    "'{q}' is not a quant of the glm5-next shape {}",
                    shape.name
                )));
            }
            Family::Glm5Next(shape)
        } else if let Some(shape) = deepseek4::SHAPES
            .iter()
            .find(|x| x.name.eq_ignore_ascii_case(s))
        {
            if !q.eq_ignore_ascii_case(deepseek4::QUANT) {
                return Err(bad(format!(
                    "'{q}' is not a quant of the deepseek4 shape {}",
                    shape.name
                )));
            }
            Family::DeepSeek4(shape)
        } else {
            return Err(bad(format!("unknown synthetic shape '{s}'")));
        };
        let spec = Spec {
            family,
            window: Window {
                first: 0,
                n_layer: 0,
            },
            seed: DEFAULT_SEED,
        };
        spec.window(0, None)
    }

    /// The same model cut to real layers `first..first + n_layer` (`None`: to the last).
    ///
    /// Errors: [`CudaError::Unsupported`] for a window outside the model's layers.
    pub fn window(self, first: usize, n_layer: Option<usize>) -> Result<Spec> {
        let total = self.n_layer_real();
        let n_layer = n_layer.unwrap_or(total.saturating_sub(first));
        if n_layer == 0 || first + n_layer > total {
            return Err(CudaError::Unsupported(format!(
                "layers {first}..{} are outside {}'s layers 0..{}",
                first + n_layer.max(1) - 1,
                self.name(),
                total - 1
            )));
        }
        Ok(Spec {
            window: Window { first, n_layer },
            ..self
        })
    }

    /// The canonical name (`llama3-8b:q4_k_m`, `glm53-flash:q2`), without the window.
    pub fn name(&self) -> String {
        match self.family {
            Family::Dense { shape, recipe } => format!("{}:{}", shape.name, recipe.name()),
            Family::Glm5Next(shape) => format!("{}:{}", shape.name, glm5_next::QUANT),
            Family::DeepSeek4(shape) => format!("{}:{}", shape.name, deepseek4::QUANT),
        }
    }

    /// The GGUF architecture name.
    pub fn arch(&self) -> &'static str {
        match self.family {
            Family::Dense { shape, .. } => shape.arch,
            Family::Glm5Next(_) => glm5_next::ARCH,
            Family::DeepSeek4(_) => deepseek4::ARCH,
        }
    }

    /// Layers of the real model.
    pub fn n_layer_real(&self) -> usize {
        match self.family {
            Family::Dense { shape, .. } => shape.n_layer,
            Family::Glm5Next(shape) => shape.n_layer,
            Family::DeepSeek4(shape) => shape.n_layer,
        }
    }

    /// Vocabulary size.
    pub fn n_vocab(&self) -> usize {
        match self.family {
            Family::Dense { shape, .. } => shape.n_vocab,
            Family::Glm5Next(shape) => shape.n_vocab,
            Family::DeepSeek4(shape) => shape.n_vocab,
        }
    }

    /// The kind of each layer of the file (`KDA, dense FFN`, …).
    pub fn layer_kinds(&self) -> Vec<&'static str> {
        let w = self.window;
        (w.first..w.first + w.n_layer)
            .map(|real| match self.family {
                Family::Dense { .. } => "attention, FFN",
                Family::Glm5Next(shape) => shape.layer_kind(real),
                Family::DeepSeek4(shape) => shape.layer_kind(real),
            })
            .collect()
    }

    /// Every tensor, in file order.
    pub fn tensors(&self) -> Vec<Tensor> {
        match self.family {
            Family::Dense { shape, recipe } => dense::tensors(shape, recipe, self.window),
            Family::Glm5Next(shape) => glm5_next::tensors(shape, self.window),
            Family::DeepSeek4(shape) => deepseek4::tensors(shape, self.window),
        }
    }

    /// Every metadata key and value, in file order (tokenizer included).
    pub fn metadata(&self) -> Vec<(String, Value)> {
        match self.family {
            Family::Dense { shape, recipe } => dense::metadata(self, shape, recipe),
            Family::Glm5Next(shape) => glm5_next::metadata(shape, self.window),
            Family::DeepSeek4(shape) => deepseek4::metadata(shape, self.window),
        }
    }

    /// Bytes of all tensors (the GGUF data section without padding).
    pub fn weight_bytes(&self) -> u64 {
        self.tensors().iter().map(Tensor::n_bytes).sum()
    }

    /// Weight bytes one decode token reads (one embedding row, `used` of each expert
    /// bank, everything else whole).
    pub fn decode_bytes(&self) -> u64 {
        self.tensors().iter().map(Tensor::decode_bytes).sum()
    }

    /// The multi-GPU partition layout ([`ds4_engine::partition`]) of this model, from its
    /// metadata and tensor directory (no weights are generated).
    pub fn layout(&self) -> std::result::Result<Layout, PlanError> {
        let mut md = Metadata::new();
        for (k, v) in self.metadata() {
            md.insert(k, v);
        }
        let tensors: Vec<TensorInfo> = self
            .tensors()
            .into_iter()
            .map(|t| TensorInfo {
                name: t.name,
                dims: t.dims,
                dtype: t.ty,
                offset: 0,
            })
            .collect();
        Layout::from_directory(&md, &tensors)
    }
}

/// The `SHAPE:QUANT` names of the MoE shapes (each family has one quant mix).
fn moe_names() -> impl Iterator<Item = String> {
    glm5_next::SHAPES
        .iter()
        .map(|s| format!("{}:{}", s.name, glm5_next::QUANT))
        .chain(
            deepseek4::SHAPES
                .iter()
                .map(|s| format!("{}:{}", s.name, deepseek4::QUANT)),
        )
}

/// Every valid `SHAPE:QUANT`, for error messages.
pub fn valid_names() -> String {
    let dense: Vec<&str> = dense::SHAPES.iter().map(|s| s.name).collect();
    let quants: Vec<&str> = dense::QUANTS.iter().map(|q| q.0).collect();
    let moe: Vec<String> = moe_names().collect();
    format!(
        "a dense shape ({}) with a quant ({}), or {}",
        dense.join(", "),
        quants.join(", "),
        moe.join(", ")
    )
}

/// Adds a layer's tensor (name within the layer, dims, type, init).
type AddFn<'a> = dyn FnMut(&str, &[u64], GgmlType, Init) + 'a;

/// The mHC mixing of a layer's two sublayers (llama.cpp's `hc_{attn,ffn}_{fn,base,scale}`):
/// `fn` [`hc_e`, `mix`] of type `fn_ty`, `base` [`mix`], `scale` 1.
fn add_hc_mixes(add: &mut AddFn, hc_e: u64, mix: u64, fn_ty: GgmlType) {
    for part in ["attn", "ffn"] {
        add(
            &format!("hc_{part}_fn.weight"),
            &[hc_e, mix],
            fn_ty,
            Init::Floats,
        );
        add(
            &format!("hc_{part}_base.weight"),
            &[mix],
            GgmlType::F32,
            Init::Floats,
        );
        add(
            &format!("hc_{part}_scale.weight"),
            &[3],
            GgmlType::F32,
            Init::Const(1.0),
        );
    }
}

/// The "q2" mix's experts of a layer of width `e`: `ne` routed experts of `ff` (gate/up
/// IQ2_XXS, down Q2_K) and `shared` shared ones (Q8_0).
fn add_q2_experts(add: &mut AddFn, e: u64, ff: u64, ne: u64, shared: u64) {
    use GgmlType::{IQ2_XXS, Q2_K, Q8_0};
    let mat = Init::Blocks;
    add("ffn_gate_exps.weight", &[e, ff, ne], IQ2_XXS, mat);
    add("ffn_down_exps.weight", &[ff, e, ne], Q2_K, mat);
    add("ffn_up_exps.weight", &[e, ff, ne], IQ2_XXS, mat);
    let sh = ff * shared;
    add("ffn_gate_shexp.weight", &[e, sh], Q8_0, mat);
    add("ffn_down_shexp.weight", &[sh, e], Q8_0, mat);
    add("ffn_up_shexp.weight", &[e, sh], Q8_0, mat);
}

#[cfg(test)]
mod tests {
    use super::*;
    use ds4_engine::partition::{Attention, Budget, attention_break_even, plan};

    #[test]
    fn every_quantized_row_of_the_moe_shapes_is_whole_blocks() {
        for name in moe_names() {
            for t in Spec::parse(&name).unwrap().tensors() {
                assert_eq!(
                    t.dims[0] % t.ty.block_size() as u64,
                    0,
                    "{name}: {}",
                    t.name
                );
            }
        }
    }

    #[test]
    fn glm53_flash_plan_matches_the_synthetic_byte_counts() {
        let spec = Spec::parse("glm53-flash:q2").unwrap();
        let layout = spec.layout().unwrap();
        assert_eq!(layout.total_bytes(), spec.weight_bytes());
        assert_eq!((layout.n_expert, layout.n_expert_used), (288, 8));
        let h200 = Budget {
            mem_per_gpu: 141_000_000_000,
            reserve: 8 << 30,
        };
        // On one GPU every token reads what `synth` counts: one embedding row, 8 of 288
        // experts per MoE layer, everything else whole.
        let one = plan(&layout, 1, h200, Attention::Replicated).unwrap();
        assert_eq!(one.gpus[0].read_max, spec.decode_bytes());
        assert_eq!(one.gpus[0].read_expected, spec.decode_bytes() as f64);
        let two = plan(&layout, 2, h200, Attention::Replicated).unwrap();
        assert_eq!(two.attention, Attention::Replicated);
        for (i, ranges) in two.experts.iter().enumerate() {
            // Real layers 0..3 have a dense FFN, the rest 288 experts.
            let want = if i < 3 {
                vec![0..0, 0..0]
            } else {
                vec![0..144, 144..288]
            };
            assert_eq!(ranges, &want, "layer {i}");
        }
        assert_eq!(two.gpus[0], two.gpus[1]);
        // Attention is most of what a token reads at this quantization: replicated, two
        // GPUs still read 80 % of it each; split by heads, 53 %.
        let ratio =
            |p: &ds4_engine::partition::Plan| p.gpus[0].read_expected / spec.decode_bytes() as f64;
        assert!((ratio(&two) - 0.803).abs() < 1e-3, "{}", ratio(&two));
        let heads = plan(&layout, 2, h200, Attention::Heads).unwrap();
        assert!((ratio(&heads) - 0.530).abs() < 1e-3, "{}", ratio(&heads));
        // At 4.1 TB/s that pays while one all-reduce takes less than about 17 µs.
        let even = attention_break_even(&layout, 2, 4.1e12).unwrap();
        assert!((even - 17e-6).abs() < 1e-6, "{even}");
        // The layouts of the names every synthetic MoE model has also come out whole.
        let tiny = Spec::parse("tiny-glm5:q2").unwrap();
        assert_eq!(tiny.layout().unwrap().total_bytes(), tiny.weight_bytes());
        let dense = Spec::parse("tiny-llama:q4_0")
            .unwrap()
            .layout()
            .unwrap_err();
        assert!(
            dense
                .to_string()
                .starts_with("the llama family has no multi-GPU plan")
        );
    }

    #[test]
    fn names_parse_and_round_trip() {
        for n in [
            "tiny-llama:q4_0",
            "tiny-qwen2:iq2_xxs",
            "qwen2.5-7b:q4_k_m",
            "small-llama:q6_k",
            "glm53-flash:q2",
            "tiny-glm5:q2",
            "deepseek4-flash:q2",
            "tiny-deepseek4:q2",
        ] {
            assert_eq!(Spec::parse(n).unwrap().name(), n);
        }
        for bad in [
            "llama3-8b",
            "nope:q4_0",
            "llama3-8b:q3_k",
            "llama3-8b:q2",
            "glm53-flash:q4_0",
            "deepseek4-flash:q4_k_m",
        ] {
            let e = Spec::parse(bad).unwrap_err().to_string();
            assert!(
                e.contains("llama3-8b")
                    && e.contains("q4_k_m")
                    && e.contains("glm53-flash")
                    && e.contains("deepseek4-flash:q2"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn windows_stay_inside_the_model() {
        let s = Spec::parse("glm53-flash:q2").unwrap();
        assert_eq!(s.window.n_layer, 45);
        let w = s.window(2, Some(2)).unwrap();
        assert_eq!(
            w.window,
            Window {
                first: 2,
                n_layer: 2
            }
        );
        assert_eq!(w.layer_kinds(), ["KDA, dense FFN", "MLA+indexer, MoE"]);
        assert_eq!(s.window(40, None).unwrap().window.n_layer, 5);
        assert!(s.window(44, Some(2)).is_err());
        assert!(s.window(45, None).is_err());
        assert!(s.window(0, Some(0)).is_err());
    }

    #[test]
    fn the_device_generates_only_blocks_and_16_bit_floats() {
        for name in [
            "glm53-flash:q2",
            "tiny-glm5:q2",
            "deepseek4-flash:q2",
            "tiny-deepseek4:q2",
            "llama3-8b:q4_k_m",
            "qwen2.5-7b:q8_0",
        ] {
            for t in Spec::parse(name).unwrap().tensors() {
                if on_host(t.ty, t.n_elements()) {
                    continue;
                }
                let ok = match t.init {
                    Init::Blocks => generate::supported(t.ty),
                    Init::Floats => matches!(t.ty, GgmlType::F16 | GgmlType::BF16),
                    _ => false,
                };
                assert!(ok, "{name}: {} ({}, {:?})", t.name, t.ty, t.init);
            }
        }
    }
}
