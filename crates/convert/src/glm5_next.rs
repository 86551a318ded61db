//! The `glm5_next` mapping: Hugging Face tensor names and layouts (the hub format
//! `save_pretrained` writes, doc `docs/glm5_next.md` §9, plus the in-memory names as
//! aliases) to GGUF names, layouts, types and metadata (`docs/glm5_next_gguf.md`).
//!
//! Layout changes: `kv_b_proj [Ha·(dn+dv), rkv]` is split per head into `attn_k_b`
//! (`{dn, rkv, Ha}`: each head's key block transposed, so that the absorbed query
//! `W_kᵀ q` is a row product) and `attn_v_b` (`{rkv, dv, Ha}`); `A_log` becomes
//! `ssm_a = −exp(A_log)` (llama.cpp's kimi convention); per-expert matrices are
//! stacked into `{cols, rows, E}` tensors.
//!
//! Names, metadata keys, value types, ggml shapes and tensor types are llama.cpp's for
//! `glm5-next` (its `convert_hf_to_gguf.py`, `conversion/glm.py` `Glm5NextModel`, at
//! commit 0c1e5709); `tools/reference/compare_gguf.py` and
//! `crates/convert/tests/glm5_next_llamacpp.rs` compare the two converters' files.
//!
//! Types (as llama.cpp's converter chooses them): matrices take `--outtype` (routed
//! experts `--expert-type`), falling back per [`crate::quantize::fit`] when a row is
//! not whole blocks; F32 in every output: vectors and norms, the conv weights, the mHC
//! `fn`/`base`/`scale`, the router, the indexer's head-weight projection and its
//! k-pool compressor (`gate`, `ape`). With `--outtype bf16`, F32-stored values are
//! rounded to bf16 except those the reference keeps in float32 in its bf16 model
//! (`_keep_in_fp32_modules_strict`: router bias, conv, `dt_bias`, `A_log`, mHC base
//! and scale), so the file reproduces `from_pretrained(dtype=torch.bfloat16)` (for a
//! checkpoint stored in bf16, as published, the rounding changes nothing and the
//! values are llama.cpp's too).

use std::collections::HashSet;

use ds4_gguf::{GgmlType, GgufWriter, Value};

use crate::hf_config::TextConfig;
use crate::quantize::{OutType, encode, fit, round_bf16};
use crate::source::TensorSource;
use crate::{ConvertError, ConvertReport};

/// The architecture name written (`general.architecture`): llama.cpp's.
pub const ARCH: &str = "glm5-next";

/// Conversion settings.
#[derive(Debug, Clone)]
pub struct Options {
    /// Type of the weight matrices.
    pub outtype: OutType,
    /// Type of the routed experts' matrices (default: `outtype`).
    pub expert_type: Option<OutType>,
    /// `general.name`.
    pub name: String,
}

/// How a tensor's type is chosen.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A vector or small table stored F32; `keep` = kept f32 in the bf16 reference.
    Small { keep: bool },
    /// A matrix llama.cpp keeps F32 in every output (mHC `fn`, router, indexer head
    /// weights and k-pool gate); bf16 values in the bf16 reference.
    Island,
    /// An ordinary matrix.
    Matrix,
    /// A routed expert matrix.
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
    /// Finds `rest` under the checkpoint's prefixes (`model.language_model.`, `model.`,
    /// none).
    fn find(&self, rests: &[&str]) -> Option<String> {
        for rest in rests {
            for pre in ["model.language_model.", "model.", ""] {
                let n = format!("{pre}{rest}");
                if self.src.shape(&n).is_some() {
                    return Some(n);
                }
            }
        }
        None
    }

    /// Reads the first present of `rests`, checking its shape.
    fn read(&mut self, rests: &[&str], shape: &[usize]) -> Result<Vec<f32>, ConvertError> {
        let name = self.find(rests).ok_or_else(|| {
            ConvertError::Tensor(format!("checkpoint tensor '{}' is missing", rests[0]))
        })?;
        let got = self.src.shape(&name).unwrap_or_default();
        let squeeze = |s: &[usize]| s.iter().copied().filter(|&d| d != 1).collect::<Vec<_>>();
        if got != shape && squeeze(&got) != squeeze(shape) {
            return Err(ConvertError::Tensor(format!(
                "checkpoint tensor '{name}' has shape {got:?}, expected {shape:?}"
            )));
        }
        let v = self.src.read(&name)?.unwrap_or_default();
        self.used.insert(name);
        Ok(v)
    }

    fn has(&self, rests: &[&str]) -> bool {
        self.find(rests).is_some()
    }

    /// The type a tensor of `kind` with rows of `cols` gets (recording a fallback),
    /// rounding `data` to bf16 where the bf16 reference would.
    fn choose(&mut self, name: &str, cols: usize, kind: Kind, data: &mut [f32]) -> GgmlType {
        let o = self.opts.outtype;
        let want = match kind {
            Kind::Small { keep } => {
                if o == OutType::Bf16 && !keep {
                    round_bf16(data);
                }
                GgmlType::F32
            }
            Kind::Island => {
                if o == OutType::Bf16 {
                    round_bf16(data);
                }
                GgmlType::F32
            }
            Kind::Matrix => o.ggml(),
            Kind::Expert => self.opts.expert_type.unwrap_or(o).ggml(),
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

    /// Writes `data` (row-major, `dims` in ggml order: `dims[0]` = row length).
    fn emit(
        &mut self,
        name: &str,
        dims: &[usize],
        mut data: Vec<f32>,
        kind: Kind,
    ) -> Result<(), ConvertError> {
        let ty = self.choose(name, dims[0], kind, &mut data);
        let bytes = encode(ty, dims[0], &data, name)?;
        self.add(name, dims, ty, bytes)
    }

    /// Writes a stacked tensor `dims = {cols, rows, n}` whose `n` slices come from
    /// `part(self, x)`, encoding each slice as it is read (peak memory: one slice).
    fn emit_stacked(
        &mut self,
        name: &str,
        dims: [usize; 3],
        kind: Kind,
        mut part: impl FnMut(&mut Self, usize) -> Result<Vec<f32>, ConvertError>,
    ) -> Result<(), ConvertError> {
        let mut bytes = Vec::new();
        let mut ty = None;
        for x in 0..dims[2] {
            let mut v = part(self, x)?;
            let t = match ty {
                Some(t) => t,
                None => {
                    let t = self.choose(name, dims[0], kind, &mut v);
                    ty = Some(t);
                    t
                }
            };
            bytes.extend(encode(t, dims[0], &v, name)?);
        }
        self.add(name, &dims, ty.unwrap_or(GgmlType::F32), bytes)
    }

    /// Reads a per-layer matrix and writes it under `gguf` with `[rows, cols]`.
    fn matrix(
        &mut self,
        i: usize,
        rests: &[&str],
        gguf: &str,
        rows: usize,
        cols: usize,
        kind: Kind,
    ) -> Result<(), ConvertError> {
        let names: Vec<String> = rests.iter().map(|r| format!("layers.{i}.{r}")).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let v = self.read(&refs, &[rows, cols])?;
        self.emit(&format!("blk.{i}.{gguf}"), &[cols, rows], v, kind)
    }

    fn vector(
        &mut self,
        i: usize,
        rests: &[&str],
        gguf: &str,
        len: usize,
        keep: bool,
    ) -> Result<(), ConvertError> {
        let names: Vec<String> = rests.iter().map(|r| format!("layers.{i}.{r}")).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let v = self.read(&refs, &[len])?;
        self.emit(&format!("blk.{i}.{gguf}"), &[len], v, Kind::Small { keep })
    }
}

/// Converts the text model in `src` into `w` (metadata and tensors).
///
/// # Errors
/// [`ConvertError::Tensor`] for missing tensors or tensors whose shape contradicts the
/// configuration; [`ConvertError::Config`] for layouts the engine cannot run.
pub fn convert(
    src: &dyn TensorSource,
    c: &TextConfig,
    opts: &Options,
    w: &mut GgufWriter,
) -> Result<ConvertReport, ConvertError> {
    check_layout(c)?;
    let mut report = ConvertReport::default();
    let mut cx = Ctx {
        src,
        w: &mut *w,
        opts,
        report: &mut report,
        used: HashSet::new(),
    };
    let d = c.hidden_size;
    let v = c.vocab_size;
    let emb = cx.read(&["embed_tokens.weight"], &[v, d])?;
    cx.emit("token_embd.weight", &[d, v], emb, Kind::Matrix)?;
    for i in 0..c.num_hidden_layers {
        layer(&mut cx, c, i)?;
    }
    let norm = cx.read(&["norm.weight"], &[d])?;
    cx.emit(
        "output_norm.weight",
        &[d],
        norm,
        Kind::Small { keep: false },
    )?;
    let head = if cx.has(&["lm_head.weight"]) || !c.tie_word_embeddings {
        cx.read(&["lm_head.weight"], &[v, d])?
    } else {
        cx.read(&["embed_tokens.weight"], &[v, d])?
    };
    cx.emit("output.weight", &[d, v], head, Kind::Matrix)?;
    let n_layer = c.num_hidden_layers;
    let mut unused: Vec<String> = src
        .names()
        .into_iter()
        .filter(|n| !cx.used.contains(n))
        .filter(|n| !n.contains("visual.") && !n.contains("shared_head.") && !is_mtp(n, n_layer))
        .collect();
    unused.sort();
    report.unused = unused;
    let label = size_label(&w.tensor_infos());
    write_metadata(c, opts, label, w)?;
    Ok(report)
}

/// Whether `name` belongs to a layer at or past `n_layer` (the MTP layer).
fn is_mtp(name: &str, n_layer: usize) -> bool {
    name.split("layers.")
        .nth(1)
        .and_then(|r| r.split('.').next())
        .and_then(|x| x.parse::<usize>().ok())
        .is_some_and(|i| i >= n_layer)
}

/// Rejects the layout the reference cannot run (doc §6.4).
fn check_layout(c: &TextConfig) -> Result<(), ConvertError> {
    for i in 0..c.num_hidden_layers {
        if !c.is_kda(i) && !c.full_indexer(i) {
            let ok = i > 0 && !c.is_kda(i - 1) && c.full_indexer(i - 1);
            if !ok {
                return Err(ConvertError::Config(format!(
                    "layer {i} is an MLA layer with a `shared` DSA indexer that does not directly follow a \
                     `full` MLA layer; the reference (transformers glm5_next) cannot run this layout"
                )));
            }
        }
    }
    Ok(())
}

fn layer(cx: &mut Ctx, c: &TextConfig, i: usize) -> Result<(), ConvertError> {
    let d = c.hidden_size;
    let n = c.hc_mult;
    let m = (2 + n) * n;
    cx.vector(i, &["input_layernorm.weight"], "attn_norm.weight", d, false)?;
    cx.vector(
        i,
        &["post_attention_layernorm.weight"],
        "ffn_norm.weight",
        d,
        false,
    )?;
    for (hub, mem) in [("attn", "attn_hc"), ("ffn", "ffn_hc")] {
        cx.matrix(
            i,
            &[&format!("hc_{hub}_fn"), &format!("{mem}.fn")],
            &format!("hc_{hub}_fn.weight"),
            m,
            n * d,
            Kind::Island,
        )?;
        cx.vector(
            i,
            &[&format!("hc_{hub}_base"), &format!("{mem}.base")],
            &format!("hc_{hub}_base.weight"),
            m,
            true,
        )?;
        cx.vector(
            i,
            &[&format!("hc_{hub}_scale"), &format!("{mem}.scale")],
            &format!("hc_{hub}_scale.weight"),
            3,
            true,
        )?;
    }
    if c.is_kda(i) {
        kda(cx, c, i)?;
    } else {
        mla(cx, c, i)?;
    }
    if c.is_moe(i) {
        moe(cx, c, i)
    } else {
        dense(cx, c, i)
    }
}

fn kda(cx: &mut Ctx, c: &TextConfig, i: usize) -> Result<(), ConvertError> {
    let (d, h, dk, kc) = (
        c.hidden_size,
        c.linear_num_heads,
        c.linear_head_dim,
        c.linear_conv_kernel_dim,
    );
    let qkv = h * dk;
    let sa = |s: &str| format!("self_attn.{s}");
    for p in ["q", "k", "v"] {
        cx.matrix(
            i,
            &[&sa(&format!("{p}_proj.weight"))],
            &format!("attn_{p}.weight"),
            qkv,
            d,
            Kind::Matrix,
        )?;
    }
    // Conv: hub format has q/k/v separately; the in-memory format one fused tensor.
    if cx.has(&[&format!("layers.{i}.self_attn.q_conv1d.weight")]) {
        for p in ["q", "k", "v"] {
            let v = cx.read(
                &[&format!("layers.{i}.self_attn.{p}_conv1d.weight")],
                &[qkv, 1, kc],
            )?;
            cx.emit(
                &format!("blk.{i}.ssm_conv1d_{p}.weight"),
                &[kc, 1, qkv, 1],
                v,
                Kind::Small { keep: true },
            )?;
        }
    } else {
        let v = cx.read(
            &[&format!("layers.{i}.self_attn.conv1d.weight")],
            &[3 * qkv, 1, kc],
        )?;
        for (j, p) in ["q", "k", "v"].into_iter().enumerate() {
            let part = v[j * qkv * kc..(j + 1) * qkv * kc].to_vec();
            cx.emit(
                &format!("blk.{i}.ssm_conv1d_{p}.weight"),
                &[kc, 1, qkv, 1],
                part,
                Kind::Small { keep: true },
            )?;
        }
    }
    cx.matrix(
        i,
        &[&sa("f_a_proj.weight"), &sa("forget_gate.f_a_proj.weight")],
        "ssm_f_a.weight",
        dk,
        d,
        Kind::Matrix,
    )?;
    cx.matrix(
        i,
        &[&sa("f_b_proj.weight"), &sa("forget_gate.f_b_proj.weight")],
        "ssm_f_b.weight",
        qkv,
        dk,
        Kind::Matrix,
    )?;
    cx.vector(
        i,
        &[&sa("dt_bias"), &sa("forget_gate.dt_bias")],
        "ssm_dt.bias",
        qkv,
        true,
    )?;
    let a_log = cx.read(
        &[
            &format!("layers.{i}.self_attn.A_log"),
            &format!("layers.{i}.self_attn.forget_gate.A_log"),
        ],
        &[h],
    )?;
    let ssm_a: Vec<f32> = a_log.iter().map(|&x| -x.exp()).collect();
    cx.emit(
        &format!("blk.{i}.ssm_a"),
        &[h],
        ssm_a,
        Kind::Small { keep: true },
    )?;
    cx.matrix(
        i,
        &[&sa("b_proj.weight")],
        "ssm_beta.weight",
        h,
        d,
        Kind::Matrix,
    )?;
    cx.matrix(
        i,
        &[&sa("g_a_proj.weight")],
        "ssm_g_a.weight",
        dk,
        d,
        Kind::Matrix,
    )?;
    cx.matrix(
        i,
        &[&sa("g_b_proj.weight")],
        "ssm_g_b.weight",
        qkv,
        dk,
        Kind::Matrix,
    )?;
    cx.vector(i, &[&sa("o_norm.weight")], "ssm_norm.weight", dk, false)?;
    cx.matrix(
        i,
        &[&sa("o_proj.weight")],
        "attn_output.weight",
        d,
        qkv,
        Kind::Matrix,
    )
}

fn mla(cx: &mut Ctx, c: &TextConfig, i: usize) -> Result<(), ConvertError> {
    let (d, ha, rq, rkv, dn, dv) = (
        c.hidden_size,
        c.num_attention_heads,
        c.q_lora_rank,
        c.kv_lora_rank,
        c.qk_nope_head_dim,
        c.v_head_dim,
    );
    let sa = |s: &str| format!("self_attn.{s}");
    cx.matrix(
        i,
        &[&sa("q_a_proj.weight")],
        "attn_q_a.weight",
        rq,
        d,
        Kind::Matrix,
    )?;
    cx.vector(
        i,
        &[&sa("q_a_layernorm.weight")],
        "attn_q_a_norm.weight",
        rq,
        false,
    )?;
    cx.matrix(
        i,
        &[&sa("q_b_proj.weight")],
        "attn_q_b.weight",
        ha * dn,
        rq,
        Kind::Matrix,
    )?;
    cx.matrix(
        i,
        &[&sa("kv_a_proj_with_mqa.weight")],
        "attn_kv_a_mqa.weight",
        rkv,
        d,
        Kind::Matrix,
    )?;
    cx.vector(
        i,
        &[&sa("kv_a_layernorm.weight")],
        "attn_kv_a_norm.weight",
        rkv,
        false,
    )?;
    let kv_b = cx.read(
        &[&format!("layers.{i}.self_attn.kv_b_proj.weight")],
        &[ha * (dn + dv), rkv],
    )?;
    let mut kb = Vec::with_capacity(ha * rkv * dn);
    let mut vb = Vec::with_capacity(ha * dv * rkv);
    for h in 0..ha {
        for cc in 0..rkv {
            for dd in 0..dn {
                kb.push(kv_b[(h * (dn + dv) + dd) * rkv + cc]);
            }
        }
        vb.extend_from_slice(&kv_b[(h * (dn + dv) + dn) * rkv..(h * (dn + dv) + dn + dv) * rkv]);
    }
    cx.emit(
        &format!("blk.{i}.attn_k_b.weight"),
        &[dn, rkv, ha],
        kb,
        Kind::Matrix,
    )?;
    cx.emit(
        &format!("blk.{i}.attn_v_b.weight"),
        &[rkv, dv, ha],
        vb,
        Kind::Matrix,
    )?;
    cx.matrix(
        i,
        &[&sa("o_proj.weight")],
        "attn_output.weight",
        d,
        ha * dv,
        Kind::Matrix,
    )?;
    if c.full_indexer(i) {
        let (hi, di, p) = (c.index_n_heads, c.index_head_dim, c.index_kpool);
        let ix = |s: &str| format!("self_attn.indexer.{s}");
        cx.matrix(
            i,
            &[&ix("wq_b.weight")],
            "indexer.attn_q_b.weight",
            hi * di,
            rq,
            Kind::Matrix,
        )?;
        cx.matrix(
            i,
            &[&ix("wk.weight")],
            "indexer.attn_k.weight",
            di,
            d,
            Kind::Matrix,
        )?;
        cx.vector(
            i,
            &[&ix("k_norm.weight")],
            "indexer.k_norm.weight",
            di,
            false,
        )?;
        cx.vector(i, &[&ix("k_norm.bias")], "indexer.k_norm.bias", di, false)?;
        cx.matrix(
            i,
            &[&ix("weights_proj.weight")],
            "indexer.proj.weight",
            hi,
            d,
            Kind::Island,
        )?;
        cx.matrix(
            i,
            &[&ix("index_kpool_compress_gate")],
            "indexer_compressor_gate.weight",
            di,
            d,
            Kind::Island,
        )?;
        let ape = cx.read(
            &[&format!(
                "layers.{i}.self_attn.indexer.index_kpool_compress_ape"
            )],
            &[p, di],
        )?;
        cx.emit(
            &format!("blk.{i}.indexer_compressor_ape.weight"),
            &[di, p],
            ape,
            Kind::Small { keep: false },
        )?;
    }
    Ok(())
}

fn dense(cx: &mut Ctx, c: &TextConfig, i: usize) -> Result<(), ConvertError> {
    let (d, ff) = (c.hidden_size, c.intermediate_size);
    cx.matrix(
        i,
        &["mlp.gate_proj.weight"],
        "ffn_gate.weight",
        ff,
        d,
        Kind::Matrix,
    )?;
    cx.matrix(
        i,
        &["mlp.up_proj.weight"],
        "ffn_up.weight",
        ff,
        d,
        Kind::Matrix,
    )?;
    cx.matrix(
        i,
        &["mlp.down_proj.weight"],
        "ffn_down.weight",
        d,
        ff,
        Kind::Matrix,
    )
}

fn moe(cx: &mut Ctx, c: &TextConfig, i: usize) -> Result<(), ConvertError> {
    let (d, e, ff) = (c.hidden_size, c.n_routed_experts, c.moe_intermediate_size);
    let sh = ff * c.n_shared_experts;
    cx.matrix(
        i,
        &["mlp.gate.weight"],
        "ffn_gate_inp.weight",
        e,
        d,
        Kind::Island,
    )?;
    cx.vector(
        i,
        &["mlp.gate.e_score_correction_bias"],
        "exp_probs_b.bias",
        e,
        true,
    )?;
    // Routed experts: per-expert hub tensors (streamed), or the fused in-memory ones.
    if cx.has(&[&format!("layers.{i}.mlp.experts.0.gate_proj.weight")]) {
        for (which, gguf, shape) in [
            ("gate_proj", "gate", [ff, d]),
            ("up_proj", "up", [ff, d]),
            ("down_proj", "down", [d, ff]),
        ] {
            let dims = [shape[1], shape[0], e];
            cx.emit_stacked(
                &format!("blk.{i}.ffn_{gguf}_exps.weight"),
                dims,
                Kind::Expert,
                |cx, x| {
                    cx.read(
                        &[&format!("layers.{i}.mlp.experts.{x}.{which}.weight")],
                        &shape,
                    )
                },
            )?;
        }
    } else {
        let gu = cx.read(
            &[&format!("layers.{i}.mlp.experts.gate_up_proj")],
            &[e, 2 * ff, d],
        )?;
        let half = |off: usize| -> Vec<f32> {
            (0..e)
                .flat_map(|x| {
                    gu[x * 2 * ff * d + off..x * 2 * ff * d + off + ff * d]
                        .iter()
                        .copied()
                })
                .collect()
        };
        let (gate, up) = (half(0), half(ff * d));
        drop(gu);
        cx.emit(
            &format!("blk.{i}.ffn_gate_exps.weight"),
            &[d, ff, e],
            gate,
            Kind::Expert,
        )?;
        cx.emit(
            &format!("blk.{i}.ffn_up_exps.weight"),
            &[d, ff, e],
            up,
            Kind::Expert,
        )?;
        let down = cx.read(&[&format!("layers.{i}.mlp.experts.down_proj")], &[e, d, ff])?;
        cx.emit(
            &format!("blk.{i}.ffn_down_exps.weight"),
            &[ff, d, e],
            down,
            Kind::Expert,
        )?;
    }
    cx.matrix(
        i,
        &["mlp.shared_experts.gate_proj.weight"],
        "ffn_gate_shexp.weight",
        sh,
        d,
        Kind::Matrix,
    )?;
    cx.matrix(
        i,
        &["mlp.shared_experts.up_proj.weight"],
        "ffn_up_shexp.weight",
        sh,
        d,
        Kind::Matrix,
    )?;
    cx.matrix(
        i,
        &["mlp.shared_experts.down_proj.weight"],
        "ffn_down_shexp.weight",
        d,
        sh,
        Kind::Matrix,
    )
}

/// llama.cpp's `general.file_type` for the main output type.
pub(crate) fn file_type(o: OutType) -> u32 {
    match o {
        OutType::F32 => 0,
        OutType::F16 => 1,
        OutType::Q8_0 => 7,
        OutType::Q2K => 10,
        OutType::Q4K => 15,
        OutType::Iq2Xxs => 19,
        OutType::Bf16 => 32,
        OutType::Mxfp4 => 38,
    }
}

/// llama.cpp's `general.size_label` (gguf-py `size_label` over the written tensors):
/// `{E}x{params of the non-expert tensors + one expert's}`, e.g. `288x18B`, or the plain
/// parameter count without routed experts; `K`/`M`/`B`/`T` with at least two digits.
pub fn size_label(tensors: &[ds4_gguf::TensorInfo]) -> String {
    let (mut shared, mut per_expert, mut e_sum, mut e_tensors) = (0u64, 0u64, 0u64, 0u64);
    for t in tensors {
        let n = t.n_elements();
        if t.name.contains("_exps.") && t.dims.len() >= 3 {
            let e = t.dims[t.dims.len() - 1].max(1);
            per_expert += n / e;
            e_sum += e;
            e_tensors += 1;
        } else {
            shared += n;
        }
    }
    let rounded = |n: u64| {
        let x = n as f64;
        let (v, suffix) = if x > 1e12 {
            (x * 1e-12, "T")
        } else if x > 1e9 {
            (x * 1e-9, "B")
        } else if x > 1e6 {
            (x * 1e-6, "M")
        } else {
            (x * 1e-3, "K")
        };
        // Python's round() is half-to-even; the digit count of a half case is the same.
        let int_digits = format!("{}", v.round()).trim_start_matches('0').len();
        format!("{v:.*}{suffix}", 2usize.saturating_sub(int_digits))
    };
    match e_sum.checked_div(e_tensors) {
        Some(e) => format!("{e}x{}", rounded(shared + per_expert)),
        None => rounded(shared + per_expert),
    }
}

/// The metadata llama.cpp's converter writes for `glm5-next` (same keys and value
/// types), plus this project's extension `kda.head_count` only when the KDA head count
/// differs from `attention.head_count` (llama.cpp's `glm5-next` has one head count).
fn write_metadata(
    c: &TextConfig,
    opts: &Options,
    size_label: String,
    w: &mut GgufWriter,
) -> Result<(), ConvertError> {
    let n = c.num_hidden_layers;
    let k = |s: &str| format!("{ARCH}.{s}");
    let u = |x: usize| Value::U32(x as u32);
    let per_layer_f32 = |x: f32| Value::Array(vec![Value::F32(x); n]);
    let mut kv: Vec<(String, Value)> = vec![
        ("general.architecture".into(), Value::String(ARCH.into())),
        ("general.type".into(), Value::String("model".into())),
        ("general.name".into(), Value::String(opts.name.clone())),
        ("general.size_label".into(), Value::String(size_label)),
        (
            "general.file_type".into(),
            Value::U32(file_type(opts.outtype)),
        ),
        ("general.quantization_version".into(), Value::U32(2)),
        (k("block_count"), u(n)),
        (k("context_length"), u(c.max_position_embeddings)),
        (k("embedding_length"), u(c.hidden_size)),
        (k("feed_forward_length"), u(c.intermediate_size)),
        (k("attention.head_count"), u(c.num_attention_heads)),
        // 0 marks a KDA layer, 1 an MLA layer (one latent shared by the heads), as INT32
        // (what gguf-py writes for a list of Python ints).
        (
            k("attention.head_count_kv"),
            Value::Array(
                (0..n)
                    .map(|i| Value::I32(if c.is_kda(i) { 0 } else { 1 }))
                    .collect(),
            ),
        ),
        (
            k("attention.layer_norm_rms_epsilon"),
            Value::F32(c.rms_norm_eps),
        ),
        (k("expert_count"), u(c.n_routed_experts)),
        (k("expert_used_count"), u(c.num_experts_per_tok)),
        (k("expert_group_count"), u(c.n_group)),
        (k("expert_group_used_count"), u(c.topk_group)),
        (k("vocab_size"), u(c.vocab_size)),
        (k("attention.layer_norm_epsilon"), Value::F32(1e-6)),
        (k("ssm.conv_kernel"), u(c.linear_conv_kernel_dim)),
        (k("kda.head_dim"), u(c.linear_head_dim)),
        (k("attention.q_lora_rank"), u(c.q_lora_rank)),
        (k("attention.kv_lora_rank"), u(c.kv_lora_rank)),
        (k("rope.dimension_count"), u(c.qk_rope_head_dim)),
        (
            k("attention.key_length"),
            u(c.kv_lora_rank + c.qk_rope_head_dim),
        ),
        (k("attention.value_length"), u(c.kv_lora_rank)),
        (
            k("attention.key_length_mla"),
            u(c.qk_nope_head_dim + c.qk_rope_head_dim),
        ),
        (k("attention.value_length_mla"), u(c.v_head_dim)),
        (k("attention.indexer.head_count"), u(c.index_n_heads)),
        (k("attention.indexer.key_length"), u(c.index_head_dim)),
        (k("attention.indexer.top_k"), u(c.index_topk)),
        (k("attention.indexer.kpool"), u(c.index_kpool)),
        (
            k("attention.indexer.kpool_select_tail"),
            Value::Bool(c.index_kpool_always_select_tail),
        ),
        (
            k("attention.indexer.types"),
            Value::Array((0..n).map(|i| Value::Bool(c.full_indexer(i))).collect()),
        ),
        (k("hyper_connection.count"), u(c.hc_mult)),
        (
            k("hyper_connection.sinkhorn_iterations"),
            u(c.hc_sinkhorn_iters),
        ),
        (k("hyper_connection.epsilon"), Value::F32(c.hc_eps)),
        (
            k("leading_dense_block_count"),
            u(c.mlp_layer_types
                .iter()
                .take(n)
                .take_while(|t| *t == "dense")
                .count()),
        ),
        (k("expert_feed_forward_length"), u(c.moe_intermediate_size)),
        (k("expert_shared_count"), u(c.n_shared_experts)),
        (
            k("expert_weights_scale"),
            Value::F32(c.routed_scaling_factor),
        ),
        (k("expert_weights_norm"), Value::Bool(c.norm_topk_prob)),
    ];
    if let Some(lb) = c.linear_lower_bound {
        kv.push((k("kda.gate_lower_bound"), Value::F32(lb)));
    }
    if c.linear_num_heads != c.num_attention_heads {
        kv.push((k("kda.head_count"), u(c.linear_num_heads)));
    }
    if let Some(f) = c.expert_gating_func {
        kv.push((k("expert_gating_func"), Value::U32(f)));
    }
    if let Some(l) = c.swiglu_limit {
        kv.push((k("swiglu_clamp_exp"), per_layer_f32(l)));
        kv.push((k("swiglu_clamp_shexp"), per_layer_f32(l)));
    }
    for (key, v) in kv {
        w.add_metadata(key.clone(), v)
            .map_err(|e| ConvertError::Tensor(format!("metadata {key}: {e}")))?;
    }
    Ok(())
}
