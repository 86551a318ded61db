//! The `deepseek_v4` mapping (DeepSeek-V4-Flash): a checkpoint in DeepSeek's original
//! tensor names (`embed.weight`, `layers.{i}.attn.wq_a.weight`,
//! `layers.{i}.ffn.experts.{e}.w1.weight`, `hc_head_fn`, `head.weight`, …: what the
//! published checkpoint, transformers' `conversion_mapping` and llama.cpp's converter
//! read; `docs/deepseek4.md` §10) to llama.cpp's `deepseek4` GGUF layout — the same
//! names, keys, shapes and types as llama.cpp's converter (`conversion/deepseek.py`,
//! `docs/deepseek4_gguf.md`), so files move both ways.
//!
//! Sources: F32/BF16/F16 tensors; FP8 (e4m3) matrices with a `.scale` per 128×128
//! block (E8M0, or f32), dequantized; the routed experts in DeepSeek's FP4 format
//! (e2m1 pairs per byte, E8M0 `.scale` per 32 inputs), repacked losslessly into ggml's
//! MXFP4 (or in float, quantized to MXFP4 by ggml's reference quantizer, which keeps
//! e2m1-exact values exactly); `tid2eid` as I32.
//!
//! Types: llama.cpp keeps every tensor in its source precision whatever `--outtype`
//! says; here the matrices take `--outtype` (so `--outtype f32` of an f32 checkpoint is
//! llama.cpp's file, `bf16` of the published BF16/FP8 checkpoint is lossless, `q8_0` is
//! what llama.cpp makes of FP8 matrices), the routed experts `--expert-type` (default
//! MXFP4, llama.cpp's only choice); vectors and what the reference keeps in float32 in
//! its bf16 model (`_keep_in_fp32_modules_strict`: the mHC `fn`/`base`/`scale`, the
//! compressors' `ape`, norms, sinks, the router bias) stay F32 and exact, so a BF16
//! output reproduces `from_pretrained(dtype=torch.bfloat16)`.

use std::collections::HashSet;

use ds4_gguf::{GgmlType, GgufWriter, Value};
use serde_json::Value as Json;

use crate::quantize::{OutType, encode, fit};
use crate::source::{Raw, TensorSource};
use crate::{ConvertError, ConvertReport};

/// The architecture name written (`general.architecture`), llama.cpp's.
pub const ARCH: &str = "deepseek4";

/// llama.cpp's `LLAMA_FTYPE_MOSTLY_MXFP4_MOE`, which its converter forces.
const FILE_TYPE_MXFP4_MOE: u32 = 38;

/// Conversion settings.
#[derive(Debug, Clone)]
pub struct Options {
    /// Type of the weight matrices.
    pub outtype: OutType,
    /// Type of the routed experts' matrices (default MXFP4).
    pub expert_type: Option<OutType>,
    /// `general.name`.
    pub name: String,
    /// Also write the MTP block(s) (`mtp.{k}.*` → `blk.{L+k}`, llama.cpp's `nextn`
    /// names) after the trunk.
    pub mtp: bool,
}

/// The attention of one layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerType {
    Sliding,
    /// Compressed sparse attention (overlapping windows + the lightning indexer).
    Csa,
    /// Heavily compressed attention.
    Hca,
}

/// YaRN of the compress rope.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Yarn {
    pub factor: f32,
    pub original_max_position_embeddings: usize,
    pub beta_fast: f32,
    pub beta_slow: f32,
}

/// The hyperparameters of a DeepSeek-V4 `config.json` (transformers 5's keys, or the
/// published checkpoint's legacy ones: `compress_ratios`, `compress_rate_csa/hca`,
/// `num_hash_layers`, `rope_scaling`), with `configuration_deepseek_v4.py`'s defaults
/// and derivations (doc §1).
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub moe_intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub qk_rope_head_dim: usize,
    pub q_lora_rank: usize,
    pub o_groups: usize,
    pub o_lora_rank: usize,
    pub n_routed_experts: usize,
    pub n_shared_experts: usize,
    pub num_experts_per_tok: usize,
    pub routed_scaling_factor: f32,
    pub norm_topk_prob: bool,
    pub max_position_embeddings: usize,
    pub rms_norm_eps: f32,
    pub rope_theta: f32,
    pub compress_rope_theta: f32,
    pub yarn: Option<Yarn>,
    pub layer_types: Vec<LayerType>,
    /// `[CSA rate, HCA rate]`.
    pub compress_rates: [usize; 2],
    /// The leading hash-routed layers (llama.cpp can express only leading ones).
    pub num_hash_layers: usize,
    pub hc_mult: usize,
    pub hc_sinkhorn_iters: usize,
    pub hc_eps: f32,
    pub swiglu_limit: f32,
    pub sliding_window: usize,
    pub index_n_heads: usize,
    pub index_head_dim: usize,
    pub index_topk: usize,
    pub num_nextn_predict_layers: usize,
}

fn get<'a>(c: &'a Json, k: &str) -> Option<&'a Json> {
    c.get(k).filter(|v| !v.is_null())
}

fn bad(k: &str, v: &Json) -> ConvertError {
    ConvertError::Config(format!("config.json: `{k}` has an unexpected value {v}"))
}

fn uint(c: &Json, k: &str, default: usize) -> Result<usize, ConvertError> {
    match get(c, k) {
        None => Ok(default),
        Some(v) => v.as_u64().map(|x| x as usize).ok_or_else(|| bad(k, v)),
    }
}

fn float(c: &Json, k: &str, default: f32) -> Result<f32, ConvertError> {
    match get(c, k) {
        None => Ok(default),
        Some(v) => v.as_f64().map(|x| x as f32).ok_or_else(|| bad(k, v)),
    }
}

fn boolean(c: &Json, k: &str, default: bool) -> Result<bool, ConvertError> {
    match get(c, k) {
        None => Ok(default),
        Some(v) => v.as_bool().ok_or_else(|| bad(k, v)),
    }
}

impl Config {
    /// Parses `config.json` text.
    ///
    /// # Errors
    /// [`ConvertError::Config`] for malformed JSON, mistyped keys, an unknown layer or
    /// MLP type (naming the layer), per-layer lists of the wrong length, hash-routed
    /// layers that are not the leading ones (llama.cpp's layout cannot express them), a
    /// scoring function other than sqrt-softplus, a rope type other than YaRN.
    pub fn parse(text: &str) -> Result<Config, ConvertError> {
        let c: Json = serde_json::from_str(text)
            .map_err(|e| ConvertError::Config(format!("config.json: {e}")))?;
        let n = uint(&c, "num_hidden_layers", 43)?;
        let head_dim = uint(&c, "head_dim", 512)?;
        // compress rates: the modern dict, legacy scalars on top.
        let mut rates = [4usize, 128];
        if let Some(r) = get(&c, "compress_rates") {
            for (i, k) in [
                "compressed_sparse_attention",
                "heavily_compressed_attention",
            ]
            .into_iter()
            .enumerate()
            {
                if let Some(v) = r.get(k) {
                    rates[i] = v.as_u64().ok_or_else(|| bad("compress_rates", v))? as usize;
                }
            }
        }
        rates[0] = uint(&c, "compress_rate_csa", rates[0])?;
        rates[1] = uint(&c, "compress_rate_hca", rates[1])?;
        let layer_types = layer_types(&c, n, rates)?;
        let num_hash_layers = hash_layers(&c, n)?;
        if let Some(s) = get(&c, "scoring_func")
            && s.as_str() != Some("sqrtsoftplus")
        {
            return Err(ConvertError::Config(format!(
                "config.json: `scoring_func` {s}: DeepSeek-V4 (and llama.cpp's deepseek4) scores experts with \
                 \"sqrtsoftplus\""
            )));
        }
        let qk_rope_head_dim = match get(&c, "qk_rope_head_dim") {
            Some(v) => v.as_u64().ok_or_else(|| bad("qk_rope_head_dim", v))? as usize,
            None => {
                let f = float(&c, "partial_rotary_factor", 64.0 / 512.0)?;
                (head_dim as f32 * f) as usize
            }
        };
        let (rope_theta, compress_rope_theta, yarn) = rope(&c)?;
        Ok(Config {
            vocab_size: uint(&c, "vocab_size", 129280)?,
            hidden_size: uint(&c, "hidden_size", 4096)?,
            moe_intermediate_size: uint(&c, "moe_intermediate_size", 2048)?,
            num_hidden_layers: n,
            num_attention_heads: uint(&c, "num_attention_heads", 64)?,
            num_key_value_heads: uint(&c, "num_key_value_heads", 1)?,
            head_dim,
            qk_rope_head_dim,
            q_lora_rank: uint(&c, "q_lora_rank", 1024)?,
            o_groups: uint(&c, "o_groups", 8)?,
            o_lora_rank: uint(&c, "o_lora_rank", 1024)?,
            n_routed_experts: uint(&c, "n_routed_experts", 256)?,
            n_shared_experts: uint(&c, "n_shared_experts", 1)?,
            num_experts_per_tok: uint(&c, "num_experts_per_tok", 6)?,
            routed_scaling_factor: float(&c, "routed_scaling_factor", 1.5)?,
            norm_topk_prob: boolean(&c, "norm_topk_prob", true)?,
            max_position_embeddings: uint(&c, "max_position_embeddings", 1048576)?,
            rms_norm_eps: float(&c, "rms_norm_eps", 1e-6)?,
            rope_theta,
            compress_rope_theta,
            yarn,
            layer_types,
            compress_rates: rates,
            num_hash_layers,
            hc_mult: uint(&c, "hc_mult", 4)?,
            hc_sinkhorn_iters: uint(&c, "hc_sinkhorn_iters", 20)?,
            hc_eps: float(&c, "hc_eps", 1e-6)?,
            swiglu_limit: float(&c, "swiglu_limit", 10.0)?,
            sliding_window: uint(&c, "sliding_window", 128)?,
            index_n_heads: uint(&c, "index_n_heads", 64)?,
            index_head_dim: uint(&c, "index_head_dim", 128)?,
            index_topk: uint(&c, "index_topk", 512)?,
            num_nextn_predict_layers: uint(&c, "num_nextn_predict_layers", 1)?,
        })
    }

    /// The compression rate of layer `i` (0: sliding window).
    pub fn ratio(&self, i: usize) -> usize {
        match self.layer_types.get(i) {
            Some(LayerType::Csa) => self.compress_rates[0],
            Some(LayerType::Hca) => self.compress_rates[1],
            _ => 0,
        }
    }
}

/// `layer_types` (explicit) > legacy `compress_ratios` > the reference's default.
fn layer_types(c: &Json, n: usize, rates: [usize; 2]) -> Result<Vec<LayerType>, ConvertError> {
    if let Some(v) = get(c, "layer_types") {
        let a = v.as_array().ok_or_else(|| bad("layer_types", v))?;
        if a.len() != n {
            return Err(ConvertError::Config(format!(
                "config.json: `layer_types` has {} entries for num_hidden_layers = {n}",
                a.len()
            )));
        }
        return a
            .iter()
            .enumerate()
            .map(|(i, t)| match t.as_str() {
                Some("sliding_attention") => Ok(LayerType::Sliding),
                Some("compressed_sparse_attention") => Ok(LayerType::Csa),
                Some("heavily_compressed_attention") => Ok(LayerType::Hca),
                _ => Err(ConvertError::Config(format!(
                    "config.json: layer {i} has the unknown layer type {t} (DeepSeek-V4 has \
                     \"sliding_attention\", \"compressed_sparse_attention\", \"heavily_compressed_attention\")"
                ))),
            })
            .collect();
    }
    if let Some(v) = get(c, "compress_ratios") {
        let a = v.as_array().ok_or_else(|| bad("compress_ratios", v))?;
        if a.len() < n {
            return Err(ConvertError::Config(format!(
                "config.json: `compress_ratios` has {} entries for num_hidden_layers = {n}",
                a.len()
            )));
        }
        return a[..n]
            .iter()
            .enumerate()
            .map(|(i, r)| match r.as_u64() {
                Some(0) => Ok(LayerType::Sliding),
                Some(x) if x as usize == rates[0] => Ok(LayerType::Csa),
                Some(x) if x as usize == rates[1] => Ok(LayerType::Hca),
                _ => Err(ConvertError::Config(format!(
                    "config.json: layer {i} has the unknown compress ratio {r} (0, the CSA rate {} or the HCA \
                     rate {})",
                    rates[0], rates[1]
                ))),
            })
            .collect();
    }
    Ok((0..n)
        .map(|i| {
            if i < 2 || i % 2 == 0 {
                LayerType::Hca
            } else {
                LayerType::Csa
            }
        })
        .collect())
}

/// The number of leading `hash_moe` layers (`mlp_layer_types`, or legacy
/// `num_hash_layers`, default 3).
fn hash_layers(c: &Json, n: usize) -> Result<usize, ConvertError> {
    let Some(v) = get(c, "mlp_layer_types") else {
        return Ok(uint(c, "num_hash_layers", 3)?.min(n));
    };
    let a = v.as_array().ok_or_else(|| bad("mlp_layer_types", v))?;
    if a.len() != n {
        return Err(ConvertError::Config(format!(
            "config.json: `mlp_layer_types` has {} entries for num_hidden_layers = {n}",
            a.len()
        )));
    }
    let mut lead = 0;
    for (i, t) in a.iter().enumerate() {
        match t.as_str() {
            Some("hash_moe") if lead == i => lead += 1,
            Some("hash_moe") => {
                return Err(ConvertError::Config(format!(
                    "config.json: layer {i} is a `hash_moe` layer after a `moe` layer; llama.cpp's deepseek4 GGUF \
                     (hash_layer_count) can only express leading hash layers"
                )));
            }
            Some("moe") => {}
            _ => {
                return Err(ConvertError::Config(format!(
                    "config.json: layer {i} has the unknown MLP type {t} (\"hash_moe\" or \"moe\")"
                )));
            }
        }
    }
    Ok(lead)
}

/// `(rope_theta, compress_rope_theta, YaRN of the compress rope)` from the nested
/// `rope_parameters {main, compress}` or the legacy top-level keys and `rope_scaling`.
fn rope(c: &Json) -> Result<(f32, f32, Option<Yarn>), ConvertError> {
    let nested = get(c, "rope_parameters").filter(|r| r.get("compress").is_some());
    let (main_theta, comp_theta, scaling) = match nested {
        Some(r) => {
            let main = r.get("main").unwrap_or(&Json::Null);
            let comp = &r["compress"];
            (
                float(main, "rope_theta", float(c, "rope_theta", 10000.0)?)?,
                float(
                    comp,
                    "rope_theta",
                    float(c, "compress_rope_theta", 160000.0)?,
                )?,
                Some(comp.clone()),
            )
        }
        None => (
            float(c, "rope_theta", 10000.0)?,
            float(c, "compress_rope_theta", 160000.0)?,
            get(c, "rope_scaling")
                .or_else(|| get(c, "rope_parameters"))
                .cloned(),
        ),
    };
    let yarn = match scaling {
        None => None,
        Some(s) => {
            let ty = s
                .get("rope_type")
                .or_else(|| s.get("type"))
                .and_then(Json::as_str)
                .unwrap_or("default");
            match ty {
                "default" => None,
                "yarn" => Some(Yarn {
                    factor: float(&s, "factor", 1.0)?,
                    original_max_position_embeddings: uint(
                        &s,
                        "original_max_position_embeddings",
                        65536,
                    )?,
                    beta_fast: float(&s, "beta_fast", 32.0)?,
                    beta_slow: float(&s, "beta_slow", 1.0)?,
                }),
                other => {
                    return Err(ConvertError::Config(format!(
                        "config.json: the compress rope has type \"{other}\" (DeepSeek-V4 uses \"yarn\" or none)"
                    )));
                }
            }
        }
    };
    Ok((main_theta, comp_theta, yarn))
}

/// How a tensor's type is chosen.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Kept in float32 by the reference (vectors, mHC, `ape`): F32, exact.
    Keep,
    /// An ordinary matrix: `--outtype`.
    Matrix,
    /// A routed expert matrix: `--expert-type`.
    Expert,
}

struct Ctx<'a> {
    src: &'a dyn TensorSource,
    w: &'a mut GgufWriter,
    opts: &'a Options,
    report: &'a mut ConvertReport,
    used: HashSet<String>,
}

impl Ctx<'_> {
    fn has(&self, name: &str) -> bool {
        self.src.shape(name).is_some()
    }

    /// The values of `name` (shape checked), dequantizing FP8 with its `.scale`.
    fn read(&mut self, name: &str, shape: &[usize]) -> Result<Vec<f32>, ConvertError> {
        let got = self.src.shape(name).ok_or_else(|| {
            ConvertError::Tensor(format!("checkpoint tensor '{name}' is missing"))
        })?;
        let scale_name = format!("{}.scale", name.strip_suffix(".weight").unwrap_or(name));
        let v = match self.src.raw(name) {
            Some(raw) if raw.is_fp8() => {
                check_shape(name, &got, shape)?;
                let scale = self.src.raw(&scale_name).ok_or_else(|| {
                    ConvertError::Tensor(format!(
                        "checkpoint tensor '{name}' is FP8 but '{scale_name}' (its block scales) is missing"
                    ))
                })?;
                self.used.insert(scale_name);
                raw.dequantize_fp8(&scale, name)?
            }
            _ => {
                check_shape(name, &got, shape)?;
                self.src.read(name)?.unwrap_or_default()
            }
        };
        self.used.insert(name.to_string());
        Ok(v)
    }

    fn choose(&mut self, name: &str, cols: usize, kind: Kind) -> GgmlType {
        let want = match kind {
            Kind::Keep => GgmlType::F32,
            Kind::Matrix => self.opts.outtype.ggml(),
            Kind::Expert => self.opts.expert_type.map_or(GgmlType::MXFP4, OutType::ggml),
        };
        let ty = fit(want, cols);
        if ty != want {
            self.report.fallbacks.push((name.to_string(), want, ty));
        }
        ty
    }

    fn add(
        &mut self,
        name: &str,
        dims: &[usize],
        ty: GgmlType,
        bytes: Vec<u8>,
    ) -> Result<(), ConvertError> {
        let dims64: Vec<u64> = dims.iter().map(|&d| d as u64).collect();
        self.report.bytes += bytes.len() as u64;
        self.report.tensors += 1;
        self.w
            .add_tensor(name, &dims64, ty, bytes)
            .map_err(|e| ConvertError::Tensor(format!("{name}: {e}")))
    }

    /// Reads `src` `[rows, cols]` (ggml `{cols, rows}`) and writes it as `gguf`.
    fn tensor(
        &mut self,
        src: &str,
        gguf: &str,
        shape: &[usize],
        kind: Kind,
    ) -> Result<(), ConvertError> {
        let v = self.read(src, shape)?;
        let dims: Vec<usize> = shape.iter().rev().copied().collect();
        let ty = self.choose(gguf, dims[0], kind);
        let bytes = encode(ty, dims[0], &v, gguf)?;
        self.add(gguf, &dims, ty, bytes)
    }

    /// The routed experts `{p}ffn.experts.{e}.{w}` stacked into `gguf`
    /// (`{cols, rows, E}`): FP4 sources repacked into MXFP4 bit for bit, float sources
    /// encoded.
    #[allow(clippy::too_many_arguments)]
    fn experts(
        &mut self,
        p: &str,
        w: &str,
        gguf: &str,
        rows: usize,
        cols: usize,
        n: usize,
    ) -> Result<(), ConvertError> {
        let ty = self.choose(gguf, cols, Kind::Expert);
        let mut bytes = Vec::new();
        for e in 0..n {
            let name = format!("{p}ffn.experts.{e}.{w}.weight");
            let scale_name = format!("{p}ffn.experts.{e}.{w}.scale");
            match self.src.raw(&name) {
                Some(raw) if raw.is_fp4_packed(rows, cols) => {
                    let scale = self.src.raw(&scale_name).ok_or_else(|| {
                        ConvertError::Tensor(format!(
                            "checkpoint tensor '{name}' is FP4 but '{scale_name}' (its E8M0 scales) is missing"
                        ))
                    })?;
                    if ty == GgmlType::MXFP4 {
                        bytes.extend(raw.fp4_to_mxfp4(&scale, rows, cols, &name)?);
                    } else {
                        let v = raw.fp4_to_f32(&scale, rows, cols, &name)?;
                        bytes.extend(encode(ty, cols, &v, gguf)?);
                    }
                    self.used.insert(scale_name);
                    self.used.insert(name);
                }
                _ => {
                    let v = self.read(&name, &[rows, cols])?;
                    bytes.extend(encode(ty, cols, &v, gguf)?);
                }
            }
        }
        self.add(gguf, &[cols, rows, n], ty, bytes)
    }
}

fn check_shape(name: &str, got: &[usize], want: &[usize]) -> Result<(), ConvertError> {
    let squeeze = |s: &[usize]| s.iter().copied().filter(|&d| d != 1).collect::<Vec<_>>();
    if got != want && squeeze(got) != squeeze(want) {
        return Err(ConvertError::Tensor(format!(
            "checkpoint tensor '{name}' has shape {got:?}, expected {want:?}"
        )));
    }
    Ok(())
}

/// Converts the model in `src` into `w` (metadata and tensors).
///
/// # Errors
/// [`ConvertError::Tensor`] for missing tensors, tensors whose shape contradicts the
/// configuration or an FP8/FP4 tensor without its scales; [`ConvertError::Config`] for
/// configurations llama.cpp's layout cannot express.
pub fn convert(
    src: &dyn TensorSource,
    c: &Config,
    opts: &Options,
    w: &mut GgufWriter,
) -> Result<ConvertReport, ConvertError> {
    let n_mtp = if opts.mtp {
        c.num_nextn_predict_layers
    } else {
        0
    };
    if n_mtp > 0 && !src.names().iter().any(|n| n.starts_with("mtp.")) {
        return Err(ConvertError::Config(
            "--mtp: the checkpoint has no MTP tensors (mtp.*)".into(),
        ));
    }
    write_metadata(c, opts, n_mtp, w)?;
    let mut report = ConvertReport::default();
    let mut cx = Ctx {
        src,
        w,
        opts,
        report: &mut report,
        used: HashSet::new(),
    };
    let (d, v, hn) = (c.hidden_size, c.vocab_size, c.hc_mult);
    cx.tensor("embed.weight", "token_embd.weight", &[v, d], Kind::Matrix)?;
    cx.tensor("head.weight", "output.weight", &[v, d], Kind::Matrix)?;
    cx.tensor("norm.weight", "output_norm.weight", &[d], Kind::Keep)?;
    cx.tensor(
        "hc_head_fn",
        "output_hc_fn.weight",
        &[hn, hn * d],
        Kind::Keep,
    )?;
    cx.tensor("hc_head_base", "output_hc_base.weight", &[hn], Kind::Keep)?;
    cx.tensor("hc_head_scale", "output_hc_scale.weight", &[1], Kind::Keep)?;
    for i in 0..c.num_hidden_layers {
        layer(
            &mut cx,
            c,
            i,
            &format!("layers.{i}."),
            c.layer_types[i],
            i < c.num_hash_layers,
        )?;
    }
    for k in 0..n_mtp {
        mtp_block(&mut cx, c, k)?;
    }
    let mut unused: Vec<String> = src
        .names()
        .into_iter()
        .filter(|n| !cx.used.contains(n))
        // The MTP block unless asked for; the vision parts.
        .filter(|n| !(n.starts_with("mtp.") && n_mtp == 0))
        .filter(|n| !n.starts_with("aligner.") && !n.starts_with("image_"))
        .collect();
    unused.sort();
    report.unused = unused;
    Ok(report)
}

/// One decoder layer whose checkpoint names start with `p` (`layers.{i}.` or
/// `mtp.{k}.`), written as `blk.{i}`.
fn layer(
    cx: &mut Ctx,
    c: &Config,
    i: usize,
    p: &str,
    ty: LayerType,
    hash: bool,
) -> Result<(), ConvertError> {
    let (d, hn, h, hd, rq) = (
        c.hidden_size,
        c.hc_mult,
        c.num_attention_heads,
        c.head_dim,
        c.q_lora_rank,
    );
    let m = (2 + hn) * hn;
    let s = |x: &str| format!("{p}{x}");
    let g = |x: &str| format!("blk.{i}.{x}");
    cx.tensor(
        &s("attn_norm.weight"),
        &g("attn_norm.weight"),
        &[d],
        Kind::Keep,
    )?;
    cx.tensor(
        &s("ffn_norm.weight"),
        &g("ffn_norm.weight"),
        &[d],
        Kind::Keep,
    )?;
    for which in ["attn", "ffn"] {
        cx.tensor(
            &s(&format!("hc_{which}_fn")),
            &g(&format!("hc_{which}_fn.weight")),
            &[m, hn * d],
            Kind::Keep,
        )?;
        cx.tensor(
            &s(&format!("hc_{which}_base")),
            &g(&format!("hc_{which}_base.weight")),
            &[m],
            Kind::Keep,
        )?;
        cx.tensor(
            &s(&format!("hc_{which}_scale")),
            &g(&format!("hc_{which}_scale.weight")),
            &[3],
            Kind::Keep,
        )?;
    }
    // Attention.
    cx.tensor(
        &s("attn.attn_sink"),
        &g("attn_sinks.weight"),
        &[h],
        Kind::Keep,
    )?;
    cx.tensor(
        &s("attn.wq_a.weight"),
        &g("attn_q_a.weight"),
        &[rq, d],
        Kind::Matrix,
    )?;
    cx.tensor(
        &s("attn.q_norm.weight"),
        &g("attn_q_a_norm.weight"),
        &[rq],
        Kind::Keep,
    )?;
    cx.tensor(
        &s("attn.wq_b.weight"),
        &g("attn_q_b.weight"),
        &[h * hd, rq],
        Kind::Matrix,
    )?;
    cx.tensor(
        &s("attn.wkv.weight"),
        &g("attn_kv.weight"),
        &[hd, d],
        Kind::Matrix,
    )?;
    cx.tensor(
        &s("attn.kv_norm.weight"),
        &g("attn_kv_a_norm.weight"),
        &[hd],
        Kind::Keep,
    )?;
    let (go, ro) = (c.o_groups, c.o_lora_rank);
    cx.tensor(
        &s("attn.wo_a.weight"),
        &g("attn_output_a.weight"),
        &[go * ro, h * hd / go],
        Kind::Matrix,
    )?;
    cx.tensor(
        &s("attn.wo_b.weight"),
        &g("attn_output_b.weight"),
        &[d, go * ro],
        Kind::Matrix,
    )?;
    if ty != LayerType::Sliding {
        let (cw, rate) = match ty {
            LayerType::Csa => (2, c.compress_rates[0]),
            _ => (1, c.compress_rates[1]),
        };
        compressor(
            cx,
            &s("attn.compressor."),
            &g("attn_compressor"),
            cw * hd,
            hd,
            rate,
            d,
        )?;
        if ty == LayerType::Csa {
            let (hi, di) = (c.index_n_heads, c.index_head_dim);
            compressor(
                cx,
                &s("attn.indexer.compressor."),
                &g("indexer_compressor"),
                2 * di,
                di,
                rate,
                d,
            )?;
            cx.tensor(
                &s("attn.indexer.wq_b.weight"),
                &g("indexer.attn_q_b.weight"),
                &[hi * di, rq],
                Kind::Matrix,
            )?;
            cx.tensor(
                &s("attn.indexer.weights_proj.weight"),
                &g("indexer.proj.weight"),
                &[hi, d],
                Kind::Matrix,
            )?;
        }
    }
    // MoE.
    let (e, ff, k) = (
        c.n_routed_experts,
        c.moe_intermediate_size,
        c.num_experts_per_tok,
    );
    cx.tensor(
        &s("ffn.gate.weight"),
        &g("ffn_gate_inp.weight"),
        &[e, d],
        Kind::Matrix,
    )?;
    if hash {
        let name = s("ffn.gate.tid2eid");
        let ids = cx.read(&name, &[c.vocab_size, k])?;
        if let Some((j, bad)) = ids
            .iter()
            .enumerate()
            .find(|&(_, &x)| x < 0.0 || x as usize >= e || x.fract() != 0.0)
        {
            return Err(ConvertError::Tensor(format!(
                "checkpoint tensor '{name}': token {} routes to expert {bad}, outside 0..{e}",
                j / k
            )));
        }
        let bytes: Vec<u8> = ids.iter().flat_map(|&x| (x as i32).to_le_bytes()).collect();
        cx.add(
            &g("ffn_gate_tid2eid.weight"),
            &[k, c.vocab_size],
            GgmlType::I32,
            bytes,
        )?;
        // Hash layers select by the table; a router bias there is unused (llama.cpp drops it).
        let b = s("ffn.gate.bias");
        if cx.has(&b) {
            cx.used.insert(b);
        }
    } else {
        cx.tensor(
            &s("ffn.gate.bias"),
            &g("exp_probs_b.bias"),
            &[e],
            Kind::Keep,
        )?;
    }
    cx.experts(p, "w1", &g("ffn_gate_exps.weight"), ff, d, e)?;
    cx.experts(p, "w3", &g("ffn_up_exps.weight"), ff, d, e)?;
    cx.experts(p, "w2", &g("ffn_down_exps.weight"), d, ff, e)?;
    let sh = ff * c.n_shared_experts;
    cx.tensor(
        &s("ffn.shared_experts.w1.weight"),
        &g("ffn_gate_shexp.weight"),
        &[sh, d],
        Kind::Matrix,
    )?;
    cx.tensor(
        &s("ffn.shared_experts.w3.weight"),
        &g("ffn_up_shexp.weight"),
        &[sh, d],
        Kind::Matrix,
    )?;
    cx.tensor(
        &s("ffn.shared_experts.w2.weight"),
        &g("ffn_down_shexp.weight"),
        &[d, sh],
        Kind::Matrix,
    )
}

/// A compressor's `wkv`, `wgate` (`[row, D]`), `ape` (`[m, row]`) and `norm` (`[dim]`).
fn compressor(
    cx: &mut Ctx,
    src: &str,
    gguf: &str,
    row: usize,
    dim: usize,
    rate: usize,
    d: usize,
) -> Result<(), ConvertError> {
    cx.tensor(
        &format!("{src}wkv.weight"),
        &format!("{gguf}_kv.weight"),
        &[row, d],
        Kind::Matrix,
    )?;
    cx.tensor(
        &format!("{src}wgate.weight"),
        &format!("{gguf}_gate.weight"),
        &[row, d],
        Kind::Matrix,
    )?;
    cx.tensor(
        &format!("{src}ape"),
        &format!("{gguf}_ape.weight"),
        &[rate, row],
        Kind::Keep,
    )?;
    cx.tensor(
        &format!("{src}norm.weight"),
        &format!("{gguf}_norm.weight"),
        &[dim],
        Kind::Keep,
    )
}

/// MTP block `k` (`mtp.{k}.*`) as `blk.{L+k}` in llama.cpp's `nextn` names: a sliding
/// layer with score routing, plus `nextn.eh_proj` (`e_proj` and `h_proj` side by side
/// along the input), `enorm`, `hnorm`, `shared_head_norm` (`mtp.{k}.norm`).
fn mtp_block(cx: &mut Ctx, c: &Config, k: usize) -> Result<(), ConvertError> {
    let i = c.num_hidden_layers + k;
    let p = format!("mtp.{k}.");
    let d = c.hidden_size;
    layer(cx, c, i, &p, LayerType::Sliding, false)?;
    let e = cx.read(&format!("{p}e_proj.weight"), &[d, d])?;
    let h = cx.read(&format!("{p}h_proj.weight"), &[d, d])?;
    let mut eh = Vec::with_capacity(2 * d * d);
    for r in 0..d {
        eh.extend_from_slice(&e[r * d..(r + 1) * d]);
        eh.extend_from_slice(&h[r * d..(r + 1) * d]);
    }
    let name = format!("blk.{i}.nextn.eh_proj.weight");
    let ty = cx.choose(&name, 2 * d, Kind::Matrix);
    let bytes = encode(ty, 2 * d, &eh, &name)?;
    cx.add(&name, &[2 * d, d], ty, bytes)?;
    cx.tensor(
        &format!("{p}enorm.weight"),
        &format!("blk.{i}.nextn.enorm.weight"),
        &[d],
        Kind::Keep,
    )?;
    cx.tensor(
        &format!("{p}hnorm.weight"),
        &format!("blk.{i}.nextn.hnorm.weight"),
        &[d],
        Kind::Keep,
    )?;
    cx.tensor(
        &format!("{p}norm.weight"),
        &format!("blk.{i}.nextn.shared_head_norm.weight"),
        &[d],
        Kind::Keep,
    )?;
    // The MTP block's own copy of the hyper-head is the trunk's in llama.cpp's graph.
    for x in ["hc_head_fn", "hc_head_base", "hc_head_scale"] {
        let n = format!("{p}{x}");
        if cx.has(&n) {
            cx.used.insert(n);
        }
    }
    Ok(())
}

fn write_metadata(
    c: &Config,
    opts: &Options,
    n_mtp: usize,
    w: &mut GgufWriter,
) -> Result<(), ConvertError> {
    let n = c.num_hidden_layers + n_mtp;
    let k = |s: &str| format!("{ARCH}.{s}");
    let u = |x: usize| Value::U32(x as u32);
    let mxfp4 = opts.expert_type.is_none_or(|t| t == OutType::Mxfp4);
    let file_type = if mxfp4 {
        FILE_TYPE_MXFP4_MOE
    } else {
        crate::glm5_next::file_type(opts.outtype)
    };
    // Per layer, plus the MTP layers (llama.cpp's list has one more entry than the trunk).
    let ratios: Vec<Value> = (0..c.num_hidden_layers + c.num_nextn_predict_layers)
        .map(|i| Value::I32(c.ratio(i) as i32))
        .collect();
    let mut kv: Vec<(String, Value)> = vec![
        ("general.architecture".into(), Value::String(ARCH.into())),
        ("general.name".into(), Value::String(opts.name.clone())),
        ("general.file_type".into(), Value::U32(file_type)),
        ("general.quantization_version".into(), Value::U32(2)),
        (k("block_count"), u(n)),
        (k("context_length"), u(c.max_position_embeddings)),
        (k("embedding_length"), u(c.hidden_size)),
        (k("embedding_length_out"), u(c.hidden_size * c.hc_mult)),
        (k("attention.head_count"), u(c.num_attention_heads)),
        (k("attention.head_count_kv"), u(c.num_key_value_heads)),
        (k("attention.key_length"), u(c.head_dim)),
        (k("attention.value_length"), u(c.head_dim)),
        (k("rope.dimension_count"), u(c.qk_rope_head_dim)),
        (k("rope.freq_base"), Value::F32(c.rope_theta)),
        (
            k("attention.compress_rope_freq_base"),
            Value::F32(c.compress_rope_theta),
        ),
        (
            k("attention.layer_norm_rms_epsilon"),
            Value::F32(c.rms_norm_eps),
        ),
        (k("attention.q_lora_rank"), u(c.q_lora_rank)),
        (k("attention.sliding_window"), u(c.sliding_window)),
        (k("attention.output_group_count"), u(c.o_groups)),
        (k("attention.output_lora_rank"), u(c.o_lora_rank)),
        (k("attention.compress_ratios"), Value::Array(ratios)),
        (k("attention.indexer.head_count"), u(c.index_n_heads)),
        (k("attention.indexer.key_length"), u(c.index_head_dim)),
        (k("attention.indexer.top_k"), u(c.index_topk)),
        (k("expert_count"), u(c.n_routed_experts)),
        (k("expert_used_count"), u(c.num_experts_per_tok)),
        (k("expert_feed_forward_length"), u(c.moe_intermediate_size)),
        (k("expert_shared_count"), u(c.n_shared_experts)),
        (
            k("expert_weights_scale"),
            Value::F32(c.routed_scaling_factor),
        ),
        (k("expert_weights_norm"), Value::Bool(c.norm_topk_prob)),
        (k("expert_gating_func"), u(4)),
        (
            k("swiglu_clamp_exp"),
            Value::Array(vec![Value::F32(c.swiglu_limit); n]),
        ),
        (
            k("swiglu_clamp_shexp"),
            Value::Array(vec![Value::F32(c.swiglu_limit); n]),
        ),
        (k("hyper_connection.count"), u(c.hc_mult)),
        (
            k("hyper_connection.sinkhorn_iterations"),
            u(c.hc_sinkhorn_iters),
        ),
        (k("hyper_connection.epsilon"), Value::F32(c.hc_eps)),
        (k("hash_layer_count"), u(c.num_hash_layers)),
    ];
    if let Some(y) = c.yarn {
        kv.push((k("rope.scaling.type"), Value::String("yarn".into())));
        kv.push((k("rope.scaling.factor"), Value::F32(y.factor)));
        kv.push((
            k("rope.scaling.original_context_length"),
            u(y.original_max_position_embeddings),
        ));
        kv.push((k("rope.scaling.yarn_beta_fast"), Value::F32(y.beta_fast)));
        kv.push((k("rope.scaling.yarn_beta_slow"), Value::F32(y.beta_slow)));
    }
    if n_mtp > 0 {
        kv.push((k("nextn_predict_layers"), u(n_mtp)));
    }
    for (key, v) in kv {
        w.add_metadata(key.clone(), v)
            .map_err(|e| ConvertError::Tensor(format!("metadata {key}: {e}")))?;
    }
    Ok(())
}

/// DeepSeek-V4's FP8 and FP4 tensors as the converter reads them.
impl Raw {
    fn is_fp8(&self) -> bool {
        self.dtype == safetensors::Dtype::F8_E4M3
    }

    /// FP4 experts: one byte per two values (`[rows, cols/2]` of a byte type) or
    /// safetensors' own F4 (`[rows, cols]`).
    fn is_fp4_packed(&self, rows: usize, cols: usize) -> bool {
        use safetensors::Dtype::*;
        match self.dtype {
            U8 | I8 => self.shape == [rows, cols / 2],
            F4 => self.shape == [rows, cols],
            _ => false,
        }
    }

    /// `w · scale` with one scale per 128×128 block (E8M0 bytes or floats).
    fn dequantize_fp8(&self, scale: &Raw, name: &str) -> Result<Vec<f32>, ConvertError> {
        let (rows, cols) = match self.shape[..] {
            [r, c] => (r, c),
            _ => {
                return Err(ConvertError::Tensor(format!(
                    "FP8 tensor '{name}' has shape {:?} (a matrix expected)",
                    self.shape
                )));
            }
        };
        let (sr, sc) = (rows.div_ceil(128), cols.div_ceil(128));
        let s = scale.scales(sr * sc, name)?;
        Ok(self
            .bytes
            .iter()
            .enumerate()
            .map(|(k, &b)| e4m3(b) * s[(k / cols / 128) * sc + (k % cols) / 128])
            .collect())
    }

    /// Scale values: E8M0 bytes (`2^(b−127)`), or F32/BF16 floats.
    fn scales(&self, n: usize, name: &str) -> Result<Vec<f32>, ConvertError> {
        use safetensors::Dtype::*;
        let v: Vec<f32> = match self.dtype {
            U8 | I8 | F8_E8M0 => self.bytes.iter().map(|&b| e8m0(b)).collect(),
            F32 | BF16 | F16 => crate::source::to_f32(self.dtype, &self.bytes, name)?,
            other => {
                return Err(ConvertError::Tensor(format!(
                    "the scales of '{name}' have dtype {other:?} (E8M0 or float expected)"
                )));
            }
        };
        if v.len() != n {
            return Err(ConvertError::Tensor(format!(
                "the scales of '{name}' hold {} values, expected {n}",
                v.len()
            )));
        }
        Ok(v)
    }

    /// ggml `block_mxfp4` rows from DeepSeek's FP4 (element `2j` in the low nibble of
    /// byte `j`, one E8M0 scale per 32): per block the scale byte, then 16 bytes holding
    /// elements `j` and `j + 16`. The codes index the same table on both sides.
    fn fp4_to_mxfp4(
        &self,
        scale: &Raw,
        rows: usize,
        cols: usize,
        name: &str,
    ) -> Result<Vec<u8>, ConvertError> {
        let e = self.fp4_scales(scale, rows, cols, name)?;
        let nb = cols / 32;
        let mut out = Vec::with_capacity(rows * nb * 17);
        for r in 0..rows {
            for b in 0..nb {
                out.push(e[r * nb + b]);
                let code = |j: usize| {
                    let x = self.bytes[r * cols / 2 + b * 16 + j / 2];
                    if j.is_multiple_of(2) {
                        x & 0x0f
                    } else {
                        x >> 4
                    }
                };
                for j in 0..16 {
                    out.push(code(j) | (code(j + 16) << 4));
                }
            }
        }
        Ok(out)
    }

    /// The FP4 values as f32 (`e2m1 · 2^(e−127)`).
    fn fp4_to_f32(
        &self,
        scale: &Raw,
        rows: usize,
        cols: usize,
        name: &str,
    ) -> Result<Vec<f32>, ConvertError> {
        let packed = self.fp4_to_mxfp4(scale, rows, cols, name)?;
        let mut out = vec![0f32; rows * cols];
        for (o, blk) in out
            .chunks_exact_mut(cols)
            .zip(packed.chunks_exact(cols / 32 * 17))
        {
            ds4_quant::dequantize_row(GgmlType::MXFP4, blk, o)
                .map_err(|e| ConvertError::Tensor(format!("'{name}': {e}")))?;
        }
        Ok(out)
    }

    fn fp4_scales(
        &self,
        scale: &Raw,
        rows: usize,
        cols: usize,
        name: &str,
    ) -> Result<Vec<u8>, ConvertError> {
        use safetensors::Dtype::*;
        if !cols.is_multiple_of(32)
            || !matches!(scale.dtype, U8 | I8 | F8_E8M0)
            || scale.bytes.len() != rows * cols / 32
        {
            return Err(ConvertError::Tensor(format!(
                "the FP4 scales of '{name}' ({:?}, {:?}) are not one E8M0 byte per 32 of {rows} × {cols}",
                scale.dtype, scale.shape
            )));
        }
        Ok(scale.bytes.clone())
    }
}

/// An E8M0 byte: `2^(b−127)` (255 is NaN).
fn e8m0(b: u8) -> f32 {
    if b == 255 {
        f32::NAN
    } else {
        2f32.powi(b as i32 - 127)
    }
}

/// An FP8 e4m3fn byte (no infinities; `S.1111.111` is NaN).
fn e4m3(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let e = ((b >> 3) & 0x0f) as i32;
    let m = (b & 0x07) as f32;
    if e == 0x0f && b & 0x07 == 0x07 {
        return f32::NAN;
    }
    sign * if e == 0 {
        m / 8.0 * 2f32.powi(-6)
    } else {
        (1.0 + m / 8.0) * 2f32.powi(e - 7)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fp8_e4m3_values() {
        assert_eq!(e4m3(0x38), 1.0);
        assert_eq!(e4m3(0x7e), 448.0);
        assert_eq!(e4m3(0xb8), -1.0);
        assert_eq!(e4m3(0x01), 2f32.powi(-9));
        assert!(e4m3(0x7f).is_nan());
        assert_eq!(e8m0(127), 1.0);
        assert_eq!(e8m0(120), 2f32.powi(-7));
    }

    #[test]
    fn unknown_layer_type_is_named() {
        let text =
            r#"{"num_hidden_layers": 2, "layer_types": ["sliding_attention", "full_attention"]}"#;
        let e = Config::parse(text).unwrap_err().to_string();
        assert!(e.contains("layer 1") && e.contains("full_attention"), "{e}");
        let text =
            r#"{"num_hidden_layers": 3, "mlp_layer_types": ["hash_moe", "moe", "hash_moe"]}"#;
        let e = Config::parse(text).unwrap_err().to_string();
        assert!(e.contains("layer 2") && e.contains("leading"), "{e}");
    }

    #[test]
    fn legacy_keys_fold_in() {
        let text = r#"{"num_hidden_layers": 4, "compress_ratios": [0, 0, 4, 128, 0], "num_hash_layers": 3,
            "qk_rope_head_dim": 64, "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
            "beta_fast": 32, "beta_slow": 1}}"#;
        let c = Config::parse(text).unwrap();
        assert_eq!(
            c.layer_types,
            [
                LayerType::Sliding,
                LayerType::Sliding,
                LayerType::Csa,
                LayerType::Hca
            ]
        );
        assert_eq!(c.num_hash_layers, 3);
        assert_eq!(c.yarn.unwrap().factor, 16.0);
        assert_eq!(
            (0..5).map(|i| c.ratio(i)).collect::<Vec<_>>(),
            [0, 0, 4, 128, 0]
        );
    }
}
