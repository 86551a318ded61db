//! Reading the `glm5_next` tensors of a GGUF file onto a backend with shape checks
//! (`docs/glm5_next_gguf.md` has the name table). Names follow llama.cpp's
//! (`src/models/glm5-next.cpp`: `blk.{i}.ssm_*` for KDA as in `kimi-linear`,
//! `blk.{i}.hc_{attn,ffn}_{fn,base,scale}` as in `deepseek4`, `blk.{i}.indexer.*` /
//! `indexer_compressor_*` for the DSA indexer, `attn_k_b`/`attn_v_b` for MLA); accepted
//! alternatives are listed next to each.

use crate::backend::{Backend, HcWeights};
use crate::loader::TensorLoader;
use crate::{EngineError, Result};

use super::config::{Config, MlpKind};
use super::kda::LinearAttention;
use super::mla::{Attention, Indexer};
use super::moe::{Mlp, Moe};

/// One hyper-connection's weights: `fn [(2+N)·N, N·D]`, `base [(2+N)·N]`, `scale [3]`.
pub struct HyperConnection<B: Backend> {
    pub fn_: B::Weight,
    pub base: B::Weight,
    pub scale: B::Weight,
}

impl<B: Backend> HyperConnection<B> {
    /// The weights as the backend operations take them.
    pub fn weights(&self) -> HcWeights<'_, B::Weight> {
        HcWeights {
            fn_: &self.fn_,
            base: &self.base,
            scale: &self.scale,
        }
    }
}

/// Every `glm5_next` tensor name is `blk.{i}.{s}`.
fn n(i: usize, s: &str) -> String {
    format!("blk.{i}.{s}")
}

pub fn hc<B: Backend>(
    l: &mut TensorLoader<B>,
    i: usize,
    which: &str,
    c: &Config,
) -> Result<HyperConnection<B>> {
    let (hn, d) = (c.hc_mult, c.n_embd);
    let m = (2 + hn) * hn;
    let name = |part: &str| n(i, &format!("hc_{which}_{part}"));
    Ok(HyperConnection {
        fn_: l.mat(&[&format!("{}.weight", name("fn")), &name("fn")], m, hn * d)?,
        base: l.vec_any(&[&format!("{}.weight", name("base")), &name("base")], m)?,
        scale: l.vec_any(&[&format!("{}.weight", name("scale")), &name("scale")], 3)?,
    })
}

/// Checks the KDA width against the projections before anything else reads them, so
/// that a wrong or missing head count or head dimension is reported as the metadata key
/// it is: `ssm_f_a` has `dk` rows (`kda.head_dim`), `attn_q` `Hk·dk`
/// (`kda.head_count`, or `attention.head_count` when that key is absent, as llama.cpp
/// reads it).
fn check_kda_width<B: Backend>(l: &TensorLoader<B>, i: usize, c: &Config) -> Result<()> {
    let rows = |s: &str| {
        l.find(&[&n(i, s)])
            .and_then(|t| t.dims.get(1))
            .map(|&r| r as usize)
    };
    let dk = c.kda_head_dim;
    if let Some(r) = rows("ssm_f_a.weight")
        && r != dk
    {
        return Err(EngineError::Metadata {
            key: c.key("kda.head_dim"),
            detail: format!(
                " ({dk} contradicts blk.{i}.ssm_f_a.weight, whose {r} rows are the KDA head dimension)"
            ),
        });
    }
    if let Some(r) = rows("attn_q.weight")
        && r != c.qkv()
    {
        let width = if r.is_multiple_of(dk) {
            format!("{r} rows = {} heads × {dk} (kda.head_dim)", r / dk)
        } else {
            format!("{r} rows, not a multiple of kda.head_dim = {dk}")
        };
        let detail = if c.kda_heads_from_key {
            format!(
                " ({} contradicts blk.{i}.attn_q.weight: {width})",
                c.kda_heads
            )
        } else {
            format!(
                " (absent: the KDA head count is then {} = {}, as llama.cpp reads it, but \
                 blk.{i}.attn_q.weight has {width}; a model whose KDA and attention head \
                 counts differ needs this key)",
                c.key("attention.head_count"),
                c.kda_heads
            )
        };
        return Err(EngineError::Metadata {
            key: c.key("kda.head_count"),
            detail,
        });
    }
    Ok(())
}

pub fn kda<B: Backend>(
    l: &mut TensorLoader<B>,
    i: usize,
    c: &Config,
) -> Result<LinearAttention<B>> {
    check_kda_width(l, i, c)?;
    let (d, h, dk, kc) = (c.n_embd, c.kda_heads, c.kda_head_dim, c.conv_kernel);
    let qkv = h * dk;
    // Conv: three tensors {Kc, 1, qkv[, 1]} (llama.cpp) or one {Kc, 1, 3·qkv}, split.
    let conv = if l.find(&[&n(i, "ssm_conv1d_q.weight")]).is_some() {
        let one = |l: &mut TensorLoader<B>, p: &str| {
            l.small(
                &[&n(i, &format!("ssm_conv1d_{p}.weight"))],
                &[&[kc, 1, qkv], &[kc, qkv]],
            )
        };
        [one(l, "q")?, one(l, "k")?, one(l, "v")?]
    } else {
        let all = l.host_values(
            &[&n(i, "ssm_conv1d.weight")],
            &[&[kc, 1, 3 * qkv], &[kc, 3 * qkv]],
        )?;
        let part = |l: &mut TensorLoader<B>, k: usize, p: &str| {
            l.derived(
                &n(i, &format!("ssm_conv1d.weight[{p}]")),
                &[kc, qkv],
                &all[k * qkv * kc..(k + 1) * qkv * kc],
            )
        };
        [part(l, 0, "q")?, part(l, 1, "k")?, part(l, 2, "v")?]
    };
    // ssm_a holds −exp(A_log) (llama.cpp's kimi convention); the decay rate is its negation.
    let ssm_a = l.host_values(&[&n(i, "ssm_a"), &n(i, "ssm_a.weight")], &[&[h]])?;
    if let Some(bad) = ssm_a.iter().find(|v| v.is_nan() || **v >= 0.0) {
        return Err(EngineError::Config(format!(
            "tensor '{}' must hold −exp(A_log) (all negative), found {bad}",
            n(i, "ssm_a")
        )));
    }
    let decay: Vec<f32> = ssm_a.iter().map(|v| -v).collect();
    Ok(LinearAttention {
        q_proj: l.mat(&[&n(i, "attn_q.weight")], qkv, d)?,
        k_proj: l.mat(&[&n(i, "attn_k.weight")], qkv, d)?,
        v_proj: l.mat(&[&n(i, "attn_v.weight")], qkv, d)?,
        conv,
        f_a_proj: l.mat(&[&n(i, "ssm_f_a.weight")], dk, d)?,
        f_b_proj: l.mat(&[&n(i, "ssm_f_b.weight")], qkv, dk)?,
        dt_bias: l.vec_any(&[&n(i, "ssm_dt.bias")], qkv)?,
        decay: l.derived(&n(i, "ssm_a[decay]"), &[h], &decay)?,
        b_proj: l.mat(&[&n(i, "ssm_beta.weight")], h, d)?,
        g_a_proj: l.mat(&[&n(i, "ssm_g_a.weight")], dk, d)?,
        g_b_proj: l.mat(&[&n(i, "ssm_g_b.weight")], qkv, dk)?,
        o_norm: l.vec_any(&[&n(i, "ssm_norm.weight")], dk)?,
        o_proj: l.mat(&[&n(i, "attn_output.weight")], d, qkv)?,
    })
}

pub fn mla<B: Backend>(
    l: &mut TensorLoader<B>,
    i: usize,
    c: &Config,
    full: bool,
) -> Result<Attention<B>> {
    let (d, ha, rq, rkv, dn, dv) = (
        c.n_embd,
        c.mla_heads,
        c.q_lora_rank,
        c.kv_lora_rank,
        c.qk_nope_dim,
        c.v_head_dim,
    );
    let (k_b, v_b) = if l.find(&[&n(i, "attn_k_b.weight")]).is_some() {
        (
            l.stacked(&[&n(i, "attn_k_b.weight")], ha, rkv, dn, ha)?,
            l.stacked(&[&n(i, "attn_v_b.weight")], ha, dv, rkv, ha)?,
        )
    } else {
        // Alias: the unsplit kv_b_proj {rkv, Ha·(dn+dv)}, re-laid-out per head.
        let w = l.host_values(&[&n(i, "attn_kv_b.weight")], &[&[rkv, ha * (dn + dv)]])?;
        let mut kb = vec![0f32; ha * rkv * dn];
        let mut vb = vec![0f32; ha * dv * rkv];
        for h in 0..ha {
            for dd in 0..dn {
                for cc in 0..rkv {
                    kb[(h * rkv + cc) * dn + dd] = w[(h * (dn + dv) + dd) * rkv + cc];
                }
            }
            let v = &w[(h * (dn + dv) + dn) * rkv..(h * (dn + dv) + dn + dv) * rkv];
            vb[h * dv * rkv..(h + 1) * dv * rkv].copy_from_slice(v);
        }
        (
            l.derived(&n(i, "attn_kv_b.weight[k_b]"), &[dn, rkv, ha], &kb)?,
            l.derived(&n(i, "attn_kv_b.weight[v_b]"), &[rkv, dv, ha], &vb)?,
        )
    };
    let indexer = if full {
        let (hi, di, p) = (c.index_heads, c.index_head_dim, c.index_kpool);
        Some(Indexer {
            wq_b: l.mat(&[&n(i, "indexer.attn_q_b.weight")], hi * di, rq)?,
            wk: l.mat(&[&n(i, "indexer.attn_k.weight")], di, d)?,
            k_norm_w: l.vec_any(&[&n(i, "indexer.k_norm.weight")], di)?,
            k_norm_b: l.vec_any(&[&n(i, "indexer.k_norm.bias")], di)?,
            weights_proj: l.mat(&[&n(i, "indexer.proj.weight")], hi, d)?,
            gate: l.mat(&[&n(i, "indexer_compressor_gate.weight")], di, d)?,
            ape: l.small(&[&n(i, "indexer_compressor_ape.weight")], &[&[di, p]])?,
        })
    } else {
        None
    };
    Ok(Attention {
        q_a_proj: l.mat(&[&n(i, "attn_q_a.weight")], rq, d)?,
        q_a_norm: l.vec_any(&[&n(i, "attn_q_a_norm.weight")], rq)?,
        q_b_proj: l.mat(&[&n(i, "attn_q_b.weight")], ha * dn, rq)?,
        kv_a_proj: l.mat(&[&n(i, "attn_kv_a_mqa.weight")], rkv, d)?,
        kv_a_norm: l.vec_any(&[&n(i, "attn_kv_a_norm.weight")], rkv)?,
        k_b,
        v_b,
        o_proj: l.mat(&[&n(i, "attn_output.weight")], d, ha * dv)?,
        indexer,
    })
}

/// The feed-forward part of layer `i`.
pub enum Ffn<B: Backend> {
    Dense(Mlp<B>),
    Moe(Box<Moe<B>>),
}

pub fn ffn<B: Backend>(
    l: &mut TensorLoader<B>,
    i: usize,
    c: &Config,
    kind: MlpKind,
) -> Result<Ffn<B>> {
    let d = c.n_embd;
    Ok(match kind {
        MlpKind::Dense => Ffn::Dense(Mlp {
            gate: l.mat(&[&n(i, "ffn_gate.weight")], c.n_ff, d)?,
            up: l.mat(&[&n(i, "ffn_up.weight")], c.n_ff, d)?,
            down: l.mat(&[&n(i, "ffn_down.weight")], d, c.n_ff)?,
            ff: c.n_ff,
        }),
        MlpKind::Moe => {
            let (e, ff, k) = (c.n_expert, c.n_ff_exp, c.n_expert_used);
            Ffn::Moe(Box::new(Moe {
                router: l.mat(&[&n(i, "ffn_gate_inp.weight")], e, d)?,
                bias: l.vec_any(
                    &[&n(i, "exp_probs_b.bias"), &n(i, "ffn_exp_probs_b.bias")],
                    e,
                )?,
                gate_exps: l.stacked(&[&n(i, "ffn_gate_exps.weight")], e, ff, d, k)?,
                up_exps: l.stacked(&[&n(i, "ffn_up_exps.weight")], e, ff, d, k)?,
                down_exps: l.stacked(&[&n(i, "ffn_down_exps.weight")], e, d, ff, k)?,
                shared: Mlp {
                    gate: l.mat(&[&n(i, "ffn_gate_shexp.weight")], c.n_ff_shexp, d)?,
                    up: l.mat(&[&n(i, "ffn_up_shexp.weight")], c.n_ff_shexp, d)?,
                    down: l.mat(&[&n(i, "ffn_down_shexp.weight")], d, c.n_ff_shexp)?,
                    ff: c.n_ff_shexp,
                },
            }))
        }
    })
}
