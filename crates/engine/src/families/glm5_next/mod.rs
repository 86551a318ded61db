//! The `glm5_next` family (GLM-5.3-Flash) on the CPU, following the text model of
//! `transformers==5.23.0` `models/glm5_next` (`Glm5NextTextModel` + the untied
//! `lm_head`); `docs/glm5_next.md` writes its forward pass out and is the companion of
//! these files:
//!
//! ```text
//! X[t, n] = embed[tokens[t]]                      n < hc_mult streams       (mod.rs)
//! per layer:  post, C, x = attn_hc(X)                                       (mhc.rs)
//!             y = KDA(rms(x)) | MLA+DSA(rms(x))                (kda.rs, mla.rs, indexer.rs)
//!             X = post ⊗ y + Cᵀ X
//!             post, C, x = ffn_hc(X);  y = MLP | MoE(rms(x));  X = post ⊗ y + Cᵀ X   (moe.rs)
//! logits = lm_head · rms_final(mean_n X[t, n])
//! ```
//!
//! Weights come from a GGUF file (`load.rs`, `docs/glm5_next_gguf.md`); the
//! per-sequence state and its rewind journal are in `state.rs`, the versioned state
//! file in `state_file.rs`. A model whose token embedding is BF16 computes as the
//! reference's bf16 model (activations rounded at its cast points, `ops.rs`); any
//! other file computes in f32. Test switches that break one feature at a time are in
//! `ablation.rs`.

pub mod ablation;
pub mod config;
pub mod indexer;
pub mod kda;
pub mod linear;
pub mod load;
pub mod mhc;
pub mod mla;
pub mod moe;
pub mod ops;
pub mod state;
pub mod state_file;

use std::sync::Arc;

use ds4_gguf::{GgmlType, GgufFile};

use crate::model::{Cache, Logits, Model, ModelInfo};
use crate::{EngineError, Result};
use ablation::{Ablation, Switches};
use config::{AttnKind, Config, Dtype, Gate, MlpKind};
use indexer::{Indexer, IndexerParams, Selection};
use kda::{Capture, KdaParams, LinearAttention};
use linear::{Acts, Linear};
use load::Loader;
use mhc::{HcParams, HyperConnection};
use mla::{Attention, MlaParams};
use moe::{Mlp, Moe, MoeParams};
use ops::Prec;
use state::{CacheShape, LayerShape, LayerState, Plan};

pub use state::{Anchor, DEFAULT_ANCHORS, DEFAULT_REWIND_WINDOW, Glm5NextCache};

/// The GGUF architecture names accepted (`glm5next`, as llama.cpp and the published
/// GGUF files spell it, and `glm5-next` of llama.cpp PR 27773).
pub const ARCH_NAMES: &[&str] = &["glm5next", "glm5-next"];

/// Tokens per internal forward piece: a multiple of the KDA chunk (64), so splitting
/// a call changes nothing in the chunked kernel.
const PIECE: usize = 512;

enum Attn {
    Kda(LinearAttention),
    Mla(Attention),
}

enum Ffn {
    Dense(Mlp),
    Moe(Box<Moe>),
}

struct Layer {
    attn_hc: HyperConnection,
    ffn_hc: HyperConnection,
    attn_norm: Vec<f32>,
    ffn_norm: Vec<f32>,
    attn: Attn,
    ffn: Ffn,
}

/// A loaded `glm5_next` model.
pub struct Glm5Next {
    cfg: Config,
    info: ModelInfo,
    tok_embd: Linear,
    output_norm: Vec<f32>,
    output: Linear,
    layers: Vec<Layer>,
    sw: Switches,
    fingerprint: u64,
}

/// Per-layer outputs of one forward call, for locating a mismatch against the
/// reference's hidden states (fixture arrays `hidden_*`).
#[derive(Debug, Default, Clone)]
pub struct Trace {
    /// `[s, D]` token embeddings.
    pub embed: Vec<f32>,
    /// Per layer: the streams after the layer `[s, N, D]`.
    pub streams: Vec<Vec<f32>>,
    /// Per layer: the attention block's output `[s, D]`.
    pub attn_out: Vec<Vec<f32>>,
    /// Per layer: the MLP block's output `[s, D]`.
    pub mlp_out: Vec<Vec<f32>>,
    /// Per `full` MLA layer: the selections of the call's queries.
    pub selections: Vec<(usize, Vec<Selection>)>,
}

fn hc(l: &mut Loader, i: usize, which: &str, n: usize, d: usize) -> Result<HyperConnection> {
    let m = (2 + n) * n;
    let fn_ = l.matrix(
        &[
            &format!("blk.{i}.hc_{which}_fn.weight"),
            &format!("blk.{i}.hc_{which}_fn"),
        ],
        m,
        n * d,
    )?;
    let base = l.vector(
        &[
            &format!("blk.{i}.hc_{which}_base.weight"),
            &format!("blk.{i}.hc_{which}_base"),
        ],
        m,
    )?;
    let sc = l.vector(
        &[
            &format!("blk.{i}.hc_{which}_scale.weight"),
            &format!("blk.{i}.hc_{which}_scale"),
        ],
        3,
    )?;
    Ok(HyperConnection {
        fn_,
        base,
        scale: [sc[0], sc[1], sc[2]],
    })
}

fn load_kda(l: &mut Loader, i: usize, c: &Config) -> Result<LinearAttention> {
    let (d, h, dk, kc) = (c.n_embd, c.kda_heads, c.kda_head_dim, c.conv_kernel);
    let qkv = h * dk;
    let n = |s: &str| format!("blk.{i}.{s}");
    // Conv: three tensors {Kc, 1, qkv} (llama.cpp) or one {Kc, 1, 3·qkv}.
    let conv = if l.find(&[&n("ssm_conv1d_q.weight")]).is_some() {
        let mut w = Vec::with_capacity(3 * qkv * kc);
        for p in ["q", "k", "v"] {
            w.extend(l.values_any(
                &[&n(&format!("ssm_conv1d_{p}.weight"))],
                &[&[kc, 1, qkv], &[kc, qkv]],
            )?);
        }
        w
    } else {
        l.values_any(
            &[&n("ssm_conv1d.weight")],
            &[&[kc, 1, 3 * qkv], &[kc, 3 * qkv]],
        )?
    };
    // ssm_a holds −exp(A_log) (llama.cpp's kimi convention).
    let ssm_a = l.vector(&[&n("ssm_a"), &n("ssm_a.weight")], h)?;
    if let Some(bad) = ssm_a.iter().find(|v| v.is_nan() || **v >= 0.0) {
        return Err(EngineError::Config(format!(
            "tensor '{}' must hold −exp(A_log) (all negative), found {bad}",
            n("ssm_a")
        )));
    }
    Ok(LinearAttention {
        q_proj: l.matrix(&[&n("attn_q.weight")], qkv, d)?,
        k_proj: l.matrix(&[&n("attn_k.weight")], qkv, d)?,
        v_proj: l.matrix(&[&n("attn_v.weight")], qkv, d)?,
        conv,
        f_a_proj: l.matrix(&[&n("ssm_f_a.weight")], dk, d)?,
        f_b_proj: l.matrix(&[&n("ssm_f_b.weight")], qkv, dk)?,
        dt_bias: l.vector(&[&n("ssm_dt.bias")], qkv)?,
        decay_rate: ssm_a.iter().map(|v| -v).collect(),
        b_proj: l.matrix(&[&n("ssm_beta.weight")], h, d)?,
        g_a_proj: l.matrix(&[&n("ssm_g_a.weight")], dk, d)?,
        g_b_proj: l.matrix(&[&n("ssm_g_b.weight")], qkv, dk)?,
        o_norm: l.vector(&[&n("ssm_norm.weight")], dk)?,
        o_proj: l.matrix(&[&n("attn_output.weight")], d, qkv)?,
    })
}

fn load_mla(l: &mut Loader, i: usize, c: &Config, full: bool) -> Result<Attention> {
    let (d, ha, rq, rkv, dn, dv) = (
        c.n_embd,
        c.mla_heads,
        c.q_lora_rank,
        c.kv_lora_rank,
        c.qk_nope_dim,
        c.v_head_dim,
    );
    let n = |s: &str| format!("blk.{i}.{s}");
    let (k_b, v_b) = if l.find(&[&n("attn_k_b.weight")]).is_some() {
        (
            l.stacked(&[&n("attn_k_b.weight")], ha, rkv, dn, ha)?,
            l.stacked(&[&n("attn_v_b.weight")], ha, dv, rkv, ha)?,
        )
    } else {
        // Alias: the unsplit kv_b_proj {rkv, Ha·(dn+dv)}, re-laid-out per head.
        let kv_b = l.matrix(&[&n("attn_kv_b.weight")], ha * (dn + dv), rkv)?;
        let w = kv_b.to_f32();
        let mut kb = Vec::with_capacity(ha);
        let mut vb = Vec::with_capacity(ha);
        for h in 0..ha {
            let mut k = vec![0f32; rkv * dn];
            for dd in 0..dn {
                for cc in 0..rkv {
                    k[cc * dn + dd] = w[(h * (dn + dv) + dd) * rkv + cc];
                }
            }
            kb.push(Linear::from_f32(rkv, dn, &k));
            let v = &w[(h * (dn + dv) + dn) * rkv..(h * (dn + dv) + dn + dv) * rkv];
            vb.push(Linear::from_f32(dv, rkv, v));
        }
        (kb, vb)
    };
    let indexer = if full {
        let (hi, di, p) = (c.index_heads, c.index_head_dim, c.index_kpool);
        Some(Indexer {
            wq_b: l.matrix(&[&n("indexer.attn_q_b.weight")], hi * di, rq)?,
            wk: l.matrix(&[&n("indexer.attn_k.weight")], di, d)?,
            k_norm_w: l.vector(&[&n("indexer.k_norm.weight")], di)?,
            k_norm_b: l.vector(&[&n("indexer.k_norm.bias")], di)?,
            weights_proj: l.matrix(&[&n("indexer.proj.weight")], hi, d)?,
            gate: l.matrix(&[&n("indexer_compressor_gate.weight")], di, d)?,
            ape: l.values_any(&[&n("indexer_compressor_ape.weight")], &[&[di, p]])?,
        })
    } else {
        None
    };
    Ok(Attention {
        q_a_proj: l.matrix(&[&n("attn_q_a.weight")], rq, d)?,
        q_a_norm: l.vector(&[&n("attn_q_a_norm.weight")], rq)?,
        q_b_proj: l.matrix(&[&n("attn_q_b.weight")], ha * dn, rq)?,
        kv_a_proj: l.matrix(&[&n("attn_kv_a_mqa.weight")], rkv, d)?,
        kv_a_norm: l.vector(&[&n("attn_kv_a_norm.weight")], rkv)?,
        k_b,
        v_b,
        o_proj: l.matrix(&[&n("attn_output.weight")], d, ha * dv)?,
        indexer,
    })
}

fn load_ffn(l: &mut Loader, i: usize, c: &Config, kind: MlpKind) -> Result<Ffn> {
    let d = c.n_embd;
    let n = |s: &str| format!("blk.{i}.{s}");
    Ok(match kind {
        MlpKind::Dense => Ffn::Dense(Mlp {
            gate: l.matrix(&[&n("ffn_gate.weight")], c.n_ff, d)?,
            up: l.matrix(&[&n("ffn_up.weight")], c.n_ff, d)?,
            down: l.matrix(&[&n("ffn_down.weight")], d, c.n_ff)?,
        }),
        MlpKind::Moe => {
            let (e, ff, k) = (c.n_expert, c.n_ff_exp, c.n_expert_used);
            Ffn::Moe(Box::new(Moe {
                router: l.matrix(&[&n("ffn_gate_inp.weight")], e, d)?,
                bias: l.vector(&[&n("exp_probs_b.bias"), &n("ffn_exp_probs_b.bias")], e)?,
                gate_exps: l.stacked(&[&n("ffn_gate_exps.weight")], e, ff, d, k)?,
                up_exps: l.stacked(&[&n("ffn_up_exps.weight")], e, ff, d, k)?,
                down_exps: l.stacked(&[&n("ffn_down_exps.weight")], e, d, ff, k)?,
                shared: Mlp {
                    gate: l.matrix(&[&n("ffn_gate_shexp.weight")], c.n_ff_shexp, d)?,
                    up: l.matrix(&[&n("ffn_up_shexp.weight")], c.n_ff_shexp, d)?,
                    down: l.matrix(&[&n("ffn_down_shexp.weight")], d, c.n_ff_shexp)?,
                },
            }))
        }
    })
}

/// A stable hash of the hyperparameters that shape the state (FNV-1a of their text).
fn fingerprint(c: &Config) -> u64 {
    let text = format!(
        "{:?}|{}|{}|{}|{}|{}|{}|{}|{}|{}",
        c.layers,
        c.n_embd,
        c.hc_mult,
        c.kda_heads,
        c.kda_head_dim,
        c.conv_kernel,
        c.kv_lora_rank,
        c.index_head_dim,
        c.index_kpool,
        c.n_vocab
    );
    text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

impl Glm5Next {
    /// Loads a `glm5_next` model from a GGUF file (`general.architecture` `glm5next` or
    /// `glm5-next`).
    ///
    /// # Errors
    /// [`EngineError::Metadata`]/[`EngineError::Config`] for bad or unrunnable
    /// hyperparameters (see [`Config::from_gguf`]), [`EngineError::MissingTensor`],
    /// [`EngineError::TensorShape`] when a tensor contradicts the metadata,
    /// [`EngineError::UnsupportedTensorType`].
    pub fn load(file: &Arc<GgufFile>, name: String) -> Result<Self> {
        let arch = match file.get("general.architecture") {
            Some(ds4_gguf::Value::String(a)) if ARCH_NAMES.contains(&a.as_str()) => a.clone(),
            other => {
                return Err(EngineError::Metadata {
                    key: "general.architecture".into(),
                    detail: format!(" (expected one of {ARCH_NAMES:?}, found {other:?})"),
                });
            }
        };
        let mut l = Loader::new(file);
        let embd_ty = l
            .type_of("token_embd.weight")
            .ok_or_else(|| EngineError::MissingTensor("token_embd.weight".into()))?;
        let n_embd = file
            .get(&format!("{arch}.embedding_length"))
            .and_then(|v| v.as_u64())
            .unwrap_or(0) as usize;
        let tok_embd = l.embedding("token_embd.weight", n_embd)?;
        let n_vocab = tok_embd.rows;
        let dtype = if embd_ty == GgmlType::BF16 {
            Dtype::Bf16
        } else {
            Dtype::F32
        };
        let cfg = Config::from_gguf(file, &arch, n_vocab, dtype)?;
        let d = cfg.n_embd;
        let output_norm = l.vector(&["output_norm.weight"], d)?;
        let output = l.matrix(&["output.weight"], n_vocab, d)?;
        let mut layers = Vec::with_capacity(cfg.n_layer());
        for (i, &(attn, mlp)) in cfg.layers.iter().enumerate() {
            let attn = match attn {
                AttnKind::Kda => Attn::Kda(load_kda(&mut l, i, &cfg)?),
                AttnKind::Mla { full_indexer } => {
                    Attn::Mla(load_mla(&mut l, i, &cfg, full_indexer)?)
                }
            };
            layers.push(Layer {
                attn_hc: hc(&mut l, i, "attn", cfg.hc_mult, d)?,
                ffn_hc: hc(&mut l, i, "ffn", cfg.hc_mult, d)?,
                attn_norm: l.vector(&[&format!("blk.{i}.attn_norm.weight")], d)?,
                ffn_norm: l.vector(&[&format!("blk.{i}.ffn_norm.weight")], d)?,
                attn,
                ffn: load_ffn(&mut l, i, &cfg, mlp)?,
            });
        }
        let info = ModelInfo {
            architecture: arch,
            name,
            n_vocab,
            n_ctx_train: cfg.n_ctx_train,
            n_layer: cfg.n_layer(),
            decode_weight_bytes: l.decode_bytes,
            n_params: l.n_params,
            backend: "cpu".into(),
        };
        let fingerprint = fingerprint(&cfg);
        Ok(Glm5Next {
            cfg,
            info,
            tok_embd,
            output_norm,
            output,
            layers,
            sw: Switches::default(),
            fingerprint,
        })
    }

    /// The hyperparameters.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Turns one feature off for tests (see [`ablation`]); `None` restores the model.
    pub fn set_ablation(&mut self, a: Option<Ablation>) {
        self.sw = Switches(a);
    }

    /// A new empty cache of this model, as its concrete type.
    pub fn new_glm_cache(&self, n_ctx: usize) -> Glm5NextCache {
        Glm5NextCache::new(self.cache_shape(), n_ctx)
    }

    fn cache_shape(&self) -> CacheShape {
        let c = &self.cfg;
        CacheShape {
            layers: c
                .layers
                .iter()
                .map(|l| match l.0 {
                    AttnKind::Kda => LayerShape::Kda {
                        heads: c.kda_heads,
                        head_dim: c.kda_head_dim,
                        kernel: c.conv_kernel,
                    },
                    AttnKind::Mla { full_indexer } => LayerShape::Mla { full_indexer },
                })
                .collect(),
            rkv: c.kv_lora_rank,
            index_head_dim: c.index_head_dim,
            kpool: c.index_kpool,
            fingerprint: self.fingerprint,
        }
    }

    fn prec(&self) -> Prec {
        Prec(self.cfg.dtype)
    }

    fn hc_params(&self) -> HcParams {
        let c = &self.cfg;
        HcParams {
            n: c.hc_mult,
            d: c.n_embd,
            iters: c.hc_sinkhorn_iters,
            eps: c.hc_eps,
            rms_eps: c.rms_eps,
            prec: self.prec(),
            sw: self.sw,
        }
    }

    /// Evaluates `tokens` on `cache` and returns the logits rows `want` asks for,
    /// optionally recording per-layer outputs.
    fn forward_inner(
        &self,
        cache: &mut Glm5NextCache,
        tokens: &[u32],
        want: Logits,
        out: &mut Vec<f32>,
        mut trace: Option<&mut Trace>,
    ) {
        out.clear();
        let n_pieces = tokens.len().div_ceil(PIECE);
        for (pi, piece) in tokens.chunks(PIECE).enumerate() {
            let w = match want {
                Logits::Last if pi + 1 < n_pieces => Logits::None,
                other => other,
            };
            self.forward_piece(cache, piece, w, out, trace.as_deref_mut());
        }
    }

    fn forward_piece(
        &self,
        cache: &mut Glm5NextCache,
        tokens: &[u32],
        want: Logits,
        out: &mut Vec<f32>,
        mut trace: Option<&mut Trace>,
    ) {
        let _span =
            tracing::debug_span!("glm5_next_forward", tokens = tokens.len(), pos = cache.len)
                .entered();
        let c = &self.cfg;
        let s = tokens.len();
        let (n, d) = (c.hc_mult, c.n_embd);
        let p = self.prec();
        let hp = self.hc_params();
        let pos0 = cache.len;
        let decode = s == 1 && pos0 > 0;
        let plan = cache.plan(s, decode);
        if let Plan::Fold(pos) = plan {
            cache.fold(pos);
        }
        let capture_at = match plan {
            Plan::Capture(r) => Some(r),
            _ => None,
        };
        let journal_from = cache.journal_from(plan);
        // Embeddings copied into every stream.
        let mut x = vec![0f32; s * n * d];
        let mut row = Vec::with_capacity(d);
        for (t, &tok) in tokens.iter().enumerate() {
            self.tok_embd.row_f32(tok as usize, &mut row);
            for k in 0..n {
                x[(t * n + k) * d..(t * n + k + 1) * d].copy_from_slice(&row);
            }
            if let Some(tr) = trace.as_deref_mut() {
                tr.embed.extend_from_slice(&row);
            }
        }
        let mut sel: Option<Vec<Selection>> = None;
        for (i, layer) in self.layers.iter().enumerate() {
            let _l = tracing::trace_span!("layer", i).entered();
            let (mut h, mixes) = layer.attn_hc.pre(&x, s, &hp);
            ops::rms_norm(&mut h, Some(&layer.attn_norm), c.rms_eps, d, p);
            let y = match (&layer.attn, &mut cache.layers[i]) {
                (Attn::Kda(a), LayerState::Kda(st)) => {
                    let kp = KdaParams {
                        heads: c.kda_heads,
                        head_dim: c.kda_head_dim,
                        kernel: c.conv_kernel,
                        gate: c.gate,
                        rms_eps: c.rms_eps,
                        prec: p,
                        sw: self.sw,
                    };
                    let cap = Capture {
                        at: capture_at,
                        base: &mut st.base,
                        from: journal_from,
                        journal: &mut st.journal,
                    };
                    sel = None;
                    a.forward(&h, s, &mut st.live, decode, cap, &kp)
                }
                (Attn::Mla(a), LayerState::Mla(st)) => {
                    let mp = self.mla_params();
                    let (y, this_sel) = a.forward(&h, s, pos0, st, sel.as_deref(), &mp);
                    if let Some(tr) = trace.as_deref_mut()
                        && a.indexer.is_some()
                    {
                        tr.selections.push((i, this_sel.clone()));
                    }
                    sel = c.passes_selection(i).then_some(this_sel);
                    y
                }
                _ => unreachable!("cache layers are built from the same config"),
            };
            HyperConnection::post(&mut x, &y, &mixes, &hp);
            if let Some(tr) = trace.as_deref_mut() {
                tr.attn_out.push(y);
            }
            let (mut h, mixes) = layer.ffn_hc.pre(&x, s, &hp);
            ops::rms_norm(&mut h, Some(&layer.ffn_norm), c.rms_eps, d, p);
            let y = match &layer.ffn {
                Ffn::Dense(m) => m.forward(&Acts::new(&h, s, d), c.swiglu_shexp[i], p, self.sw),
                Ffn::Moe(m) => m.forward(&h, s, &self.moe_params(i)),
            };
            HyperConnection::post(&mut x, &y, &mixes, &hp);
            if let Some(tr) = trace.as_deref_mut() {
                tr.mlp_out.push(y);
                tr.streams.push(x.clone());
            }
        }
        cache.len += s;
        if let Some(r) = capture_at {
            cache.after_capture(pos0, r);
        }
        let first = match want {
            Logits::None => return,
            Logits::Last => s - 1,
            Logits::All => 0,
        };
        let rows = s - first;
        let mut h = mhc::head(&x[first * n * d..], rows, &hp);
        if !self.sw.on(Ablation::FinalNormOff) {
            ops::rms_norm(&mut h, Some(&self.output_norm), c.rms_eps, d, p);
        }
        let v = c.n_vocab;
        let start = out.len();
        out.resize(start + rows * v, 0.0);
        self.output.forward(&h, rows, &mut out[start..]);
        p.cast(&mut out[start..]);
    }

    fn mla_params(&self) -> MlaParams {
        let c = &self.cfg;
        MlaParams {
            heads: c.mla_heads,
            qk_nope_dim: c.qk_nope_dim,
            v_head_dim: c.v_head_dim,
            kv_lora_rank: c.kv_lora_rank,
            rms_eps: c.rms_eps,
            prec: self.prec(),
            sw: self.sw,
            index: IndexerParams {
                heads: c.index_heads,
                head_dim: c.index_head_dim,
                kpool: c.index_kpool,
                topk: c.index_topk,
                select_tail: c.index_select_tail,
                ln_eps: c.ln_eps,
                prec: self.prec(),
                sw: self.sw,
            },
        }
    }

    fn moe_params(&self, i: usize) -> MoeParams {
        let c = &self.cfg;
        MoeParams {
            n_used: c.n_expert_used,
            n_group: c.n_group,
            topk_group: c.topk_group,
            norm_topk_prob: c.norm_topk_prob,
            routed_scale: c.routed_scale,
            limit_exp: c.swiglu_exp[i],
            limit_shexp: c.swiglu_shexp[i],
            prec: self.prec(),
            sw: self.sw,
        }
    }

    fn check(&self, cache: &dyn Cache, tokens: &[u32]) -> Result<()> {
        if cache.len() + tokens.len() > cache.capacity() {
            return Err(EngineError::ContextFull {
                needed: cache.len() + tokens.len(),
                n_ctx: cache.capacity(),
            });
        }
        if let Some(&id) = tokens.iter().find(|&&t| t as usize >= self.cfg.n_vocab) {
            return Err(EngineError::BadToken {
                id,
                n_vocab: self.cfg.n_vocab,
            });
        }
        Ok(())
    }

    fn downcast<'c>(&self, cache: &'c mut dyn Cache) -> Result<&'c mut Glm5NextCache> {
        let c = cache
            .as_any_mut()
            .downcast_mut::<Glm5NextCache>()
            .ok_or_else(|| EngineError::Config("cache belongs to another model family".into()))?;
        if c.shape.fingerprint != self.fingerprint {
            return Err(EngineError::Config(
                "cache belongs to another glm5_next model".into(),
            ));
        }
        Ok(c)
    }

    /// As [`Model::forward`] with every row of logits, also recording per-layer outputs.
    ///
    /// # Errors
    /// As [`Model::forward`].
    pub fn forward_traced(
        &self,
        cache: &mut dyn Cache,
        tokens: &[u32],
        trace: &mut Trace,
    ) -> Result<Vec<f32>> {
        self.check(cache, tokens)?;
        let c = self.downcast(cache)?;
        let mut out = Vec::new();
        self.forward_inner(c, tokens, Logits::All, &mut out, Some(trace));
        Ok(out)
    }

    /// The forget-gate form in use (for diagnostics).
    pub fn gate(&self) -> Gate {
        self.cfg.gate
    }
}

impl Model for Glm5Next {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn new_cache(&self, n_ctx: usize) -> Result<Box<dyn Cache>> {
        Ok(Box::new(self.new_glm_cache(n_ctx)))
    }

    fn forward(
        &self,
        cache: &mut dyn Cache,
        tokens: &[u32],
        logits: Logits,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        self.check(cache, tokens)?;
        let c = self.downcast(cache)?;
        if tokens.is_empty() {
            out.clear();
            return Ok(());
        }
        self.forward_inner(c, tokens, logits, out, None);
        // A prefill (not a verification block, which asks for every row) leaves a rewind
        // anchor: the next chat turn usually diverges a few tokens before its end.
        if tokens.len() > 1 && logits != Logits::All {
            c.push_anchor();
        }
        Ok(())
    }
}
