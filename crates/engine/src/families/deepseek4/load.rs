//! Reading the `deepseek4` tensors of a GGUF file onto a backend with shape checks, in
//! llama.cpp's layout (`src/models/deepseek4.cpp` `load_arch_tensors`;
//! `docs/deepseek4_gguf.md` has the table with the checkpoint names): `blk.{i}.attn_*`,
//! `attn_compressor_*`, `indexer_compressor_*`, `indexer.*`, `hc_{attn,ffn}_*`,
//! `ffn_*` per layer; `token_embd`, `output`, `output_norm`, `output_hc_*` at the top;
//! the MTP block's `blk.{L}.nextn.*` (see `mtp.rs`).

use crate::backend::{Backend, CompressShape, HcWeights};
use crate::loader::TensorLoader;
use crate::{EngineError, Result};

use super::attention::{Attention, Compressor, Indexer};
use super::config::{AttnKind, Config};
use super::moe::{Mlp, Moe};

/// One hyper-connection's weights (kept f32): `fn [(2+N)·N, N·D]`, `base [(2+N)·N]`,
/// `scale [3]`; for the head `fn [N, N·D]`, `base [N]`, `scale [1]`.
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

/// `blk.{i}.{s}`.
pub(crate) fn n(i: usize, s: &str) -> String {
    format!("blk.{i}.{s}")
}

/// `hc_{which}_{fn,base,scale}.weight` of layer `i`.
pub fn hc<B: Backend>(
    l: &mut TensorLoader<B>,
    i: usize,
    which: &str,
    c: &Config,
) -> Result<HyperConnection<B>> {
    let (hn, d) = (c.hc_mult, c.n_embd);
    let m = (2 + hn) * hn;
    Ok(HyperConnection {
        fn_: l.mat(&[&n(i, &format!("hc_{which}_fn.weight"))], m, hn * d)?,
        base: l.vec_any(&[&n(i, &format!("hc_{which}_base.weight"))], m)?,
        scale: l.vec_any(&[&n(i, &format!("hc_{which}_scale.weight"))], 3)?,
    })
}

/// The output hyper-connection head.
pub fn hc_head<B: Backend>(l: &mut TensorLoader<B>, c: &Config) -> Result<HyperConnection<B>> {
    let (hn, d) = (c.hc_mult, c.n_embd);
    Ok(HyperConnection {
        fn_: l.mat(&["output_hc_fn.weight"], hn, hn * d)?,
        base: l.vec_any(&["output_hc_base.weight"], hn)?,
        scale: l.vec_any(&["output_hc_scale.weight"], 1)?,
    })
}

/// A compressor under `prefix` (`attn_compressor` or `indexer_compressor`) of width
/// `dim`, rate `rate`.
fn compressor<B: Backend>(
    l: &mut TensorLoader<B>,
    i: usize,
    prefix: &str,
    dim: usize,
    rate: usize,
    overlap: bool,
    c: &Config,
) -> Result<Compressor<B>> {
    let shape = CompressShape {
        rate,
        dim,
        overlap,
        norm_eps: c.rms_eps,
    };
    let rl = shape.row_len();
    let d = c.n_embd;
    Ok(Compressor {
        kv_proj: l.mat(&[&n(i, &format!("{prefix}_kv.weight"))], rl, d)?,
        gate_proj: l.mat(&[&n(i, &format!("{prefix}_gate.weight"))], rl, d)?,
        ape: l.small(&[&n(i, &format!("{prefix}_ape.weight"))], &[&[rl, rate]])?,
        norm: l.vec_any(&[&n(i, &format!("{prefix}_norm.weight"))], dim)?,
        shape,
    })
}

/// The attention of layer `i`.
pub fn attention<B: Backend>(
    l: &mut TensorLoader<B>,
    i: usize,
    kind: AttnKind,
    c: &Config,
) -> Result<Attention<B>> {
    let (d, h, hd, rq) = (c.n_embd, c.n_head, c.head_dim, c.q_lora_rank);
    let (g, ro) = (c.o_groups, c.o_lora_rank);
    let n_in = h * hd / g;
    let (comp, indexer) = match kind {
        AttnKind::Sliding => (None, None),
        AttnKind::Hca { rate } => (
            Some(compressor(l, i, "attn_compressor", hd, rate, false, c)?),
            None,
        ),
        AttnKind::Csa { rate } => {
            let (hi, di) = (c.index_heads, c.index_head_dim);
            let ix = Indexer {
                compressor: compressor(l, i, "indexer_compressor", di, rate, true, c)?,
                q_b_proj: l.mat(&[&n(i, "indexer.attn_q_b.weight")], hi * di, rq)?,
                weights_proj: l.mat(&[&n(i, "indexer.proj.weight")], hi, d)?,
            };
            (
                Some(compressor(l, i, "attn_compressor", hd, rate, true, c)?),
                Some(ix),
            )
        }
    };
    Ok(Attention {
        q_a_proj: l.mat(&[&n(i, "attn_q_a.weight")], rq, d)?,
        q_a_norm: l.vec_any(&[&n(i, "attn_q_a_norm.weight")], rq)?,
        q_b_proj: l.mat(&[&n(i, "attn_q_b.weight")], h * hd, rq)?,
        kv_proj: l.mat(&[&n(i, "attn_kv.weight")], hd, d)?,
        kv_norm: l.vec_any(&[&n(i, "attn_kv_a_norm.weight")], hd)?,
        o_a_proj: l.reshaped(
            &n(i, "attn_output_a.weight"),
            &[n_in, g * ro],
            &[n_in, ro, g],
        )?,
        o_b_proj: l.mat(&[&n(i, "attn_output_b.weight")], d, g * ro)?,
        sinks: l.vec_any(&[&n(i, "attn_sinks.weight")], h)?,
        compressor: comp,
        indexer,
    })
}

/// The MoE of layer `i` (`hash`: routed by `tid2eid`).
pub fn moe<B: Backend>(
    l: &mut TensorLoader<B>,
    i: usize,
    hash: bool,
    c: &Config,
) -> Result<Moe<B>> {
    let (d, e, ff, k) = (c.n_embd, c.n_expert, c.n_ff_exp, c.n_expert_used);
    let tid2eid_name = n(i, "ffn_gate_tid2eid.weight");
    let bias_name = n(i, "exp_probs_b.bias");
    let (bias, tid2eid) = if hash {
        if l.find(&[&bias_name]).is_some() {
            return Err(EngineError::Config(format!(
                "layer {i} is a hash-routed layer (deepseek4.hash_layer_count) but has a selection bias '{bias_name}'"
            )));
        }
        let ids = l.i32_values(&tid2eid_name, &[k, c.n_vocab])?;
        if let Some((j, bad)) = ids
            .iter()
            .enumerate()
            .find(|&(_, &x)| x < 0 || x as usize >= e)
        {
            return Err(EngineError::Config(format!(
                "tensor '{tid2eid_name}': token {} routes to expert {bad}, outside 0..{e}",
                j / k
            )));
        }
        (None, Some(l.small(&[&tid2eid_name], &[&[k, c.n_vocab]])?))
    } else {
        if l.find(&[&tid2eid_name]).is_some() {
            return Err(EngineError::Config(format!(
                "layer {i} has a hash table '{tid2eid_name}' but is not among the leading \
                 deepseek4.hash_layer_count layers"
            )));
        }
        (Some(l.vec_any(&[&bias_name], e)?), None)
    };
    Ok(Moe {
        gate: l.mat(&[&n(i, "ffn_gate_inp.weight")], e, d)?,
        bias,
        tid2eid,
        gate_exps: l.stacked(&[&n(i, "ffn_gate_exps.weight")], e, ff, d, k)?,
        up_exps: l.stacked(&[&n(i, "ffn_up_exps.weight")], e, ff, d, k)?,
        down_exps: l.stacked(&[&n(i, "ffn_down_exps.weight")], e, d, ff, k)?,
        shared: Mlp {
            gate_proj: l.mat(&[&n(i, "ffn_gate_shexp.weight")], c.n_ff_shexp, d)?,
            up_proj: l.mat(&[&n(i, "ffn_up_shexp.weight")], c.n_ff_shexp, d)?,
            down_proj: l.mat(&[&n(i, "ffn_down_shexp.weight")], d, c.n_ff_shexp)?,
            ff: c.n_ff_shexp,
        },
    })
}
