//! Multi-head latent attention without RoPE on the CPU
//! ([`crate::backend::Backend::mla_attention`]), following `Glm5NextTextAttention`
//! over the tokens the DSA indexer selects.
//!
//! The reference expands `kv_b_proj` over the whole cache; under `Prec::F32` we absorb
//! it instead (the same math): `q̃_h = k_b[h]ᵀ q_h`, scores `q̃_h·c_j`, context
//! `Σ_j p_j c_j`, then `v_b[h]`. The bf16 reference's arithmetic (keys and values
//! expanded and rounded, PyTorch's SDPA math path in f32, one rounding of the output)
//! reproduces its fixtures bit for bit and runs under `Prec::Bf16`.

use rayon::prelude::*;

use super::torch_math::softmax;
use super::weight::{CpuWeight, dot_f32};
use crate::backend::{MlaShape, Prec};
use crate::{EngineError, Result};

/// The tokens query `t` attends to, ascending: the selected pools' tokens and the
/// tail, or every token `≤ t` without a selection.
pub fn tokens(t: usize, sel: Option<&[i32]>, shape: &MlaShape) -> Vec<usize> {
    match (sel, shape.select) {
        (Some(ids), Some(ps)) => {
            let mut toks = Vec::new();
            let mut last = None;
            for &id in ids {
                if id < 0 || Some(id) == last {
                    continue;
                }
                last = Some(id);
                let p0 = id as usize * ps.pool;
                toks.extend(p0..p0 + ps.pool);
            }
            if ps.tail {
                toks.extend(ps.pool * ((t + 1) / ps.pool)..t + 1);
            }
            toks
        }
        _ => (0..t + 1).collect(),
    }
}

/// See [`crate::backend::Backend::mla_attention`]; `latent` holds at least
/// `pos0 + rows` rows.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    pos0: usize,
    q: &[f32],
    latent: &[f32],
    k_b: &CpuWeight,
    v_b: &CpuWeight,
    sel: Option<&[i32]>,
    rows: usize,
    shape: &MlaShape,
    p: Prec,
    out: &mut [f32],
) -> Result<()> {
    let (ha, dn, dv, rkv) = (shape.heads, shape.qk_dim, shape.v_dim, shape.rank);
    if k_b.n != ha
        || k_b.rows != rkv
        || k_b.cols != dn
        || v_b.n != ha
        || v_b.rows != dv
        || v_b.cols != rkv
    {
        return Err(EngineError::Backend(format!(
            "mla_attention: '{}' / '{}' are not [{ha}, {rkv}, {dn}] / [{ha}, {dv}, {rkv}]",
            k_b.name, v_b.name
        )));
    }
    if latent.len() < (pos0 + rows) * rkv || q.len() < rows * ha * dn {
        return Err(EngineError::Backend(
            "mla_attention: buffers too short".into(),
        ));
    }
    let per_q = shape.select.map_or(0, |s| s.per_query);
    let sel_of = |t: usize| sel.map(|s| &s[t * per_q..(t + 1) * per_q]);
    let o = if p == Prec::Bf16 {
        expanded(pos0, q, latent, k_b, v_b, &sel_of, rows, shape, p)
    } else {
        absorbed(pos0, q, latent, k_b, v_b, &sel_of, rows, shape)?
    };
    let out = &mut out[..rows * ha * dv];
    out.copy_from_slice(&o);
    p.round_all(out);
    Ok(())
}

/// Per head, `out[t, h] = w[h] · x[t, h]` in f32 (`x [s, Ha, cols]`).
fn per_head(w: &CpuWeight, x: &[f32], s: usize, ha: usize, out_dim: usize) -> Result<Vec<f32>> {
    let cols = w.cols;
    let mut o = vec![0f32; s * ha * out_dim];
    let mut xh = vec![0f32; s * cols];
    let mut oh = vec![0f32; s * out_dim];
    for h in 0..ha {
        for t in 0..s {
            xh[t * cols..(t + 1) * cols]
                .copy_from_slice(&x[(t * ha + h) * cols..(t * ha + h + 1) * cols]);
        }
        w.matrix(h).forward(&xh, s, Prec::F32, &mut oh)?;
        for t in 0..s {
            o[(t * ha + h) * out_dim..(t * ha + h + 1) * out_dim]
                .copy_from_slice(&oh[t * out_dim..(t + 1) * out_dim]);
        }
    }
    Ok(o)
}

/// Attention with `k_b` absorbed into the query (see the module header).
#[allow(clippy::too_many_arguments)]
fn absorbed<'a>(
    pos0: usize,
    q: &[f32],
    latent: &[f32],
    k_b: &CpuWeight,
    v_b: &CpuWeight,
    sel_of: &(dyn Fn(usize) -> Option<&'a [i32]> + Sync),
    s: usize,
    shape: &MlaShape,
) -> Result<Vec<f32>> {
    let (ha, dv, rkv) = (shape.heads, shape.v_dim, shape.rank);
    // Absorbed queries q̃ [s, Ha, rkv].
    let qt = per_head(k_b, q, s, ha, rkv)?;
    // Context per (token, head): Σ_j softmax(q̃·c_j·scale)_j c_j.
    let mut ctx = vec![0f32; s * ha * rkv];
    ctx.par_chunks_mut(rkv).enumerate().for_each(|(th, out)| {
        let t = th / ha;
        let qv = &qt[th * rkv..(th + 1) * rkv];
        let toks = tokens(pos0 + t, sel_of(t), shape);
        if toks.is_empty() {
            return;
        }
        let mut sc: Vec<f32> = toks
            .iter()
            .map(|&j| dot_f32(qv, &latent[j * rkv..(j + 1) * rkv]) * shape.scale)
            .collect();
        softmax(&mut sc);
        for (&j, w) in toks.iter().zip(&sc) {
            for (o, cv) in out.iter_mut().zip(&latent[j * rkv..(j + 1) * rkv]) {
                *o += w * cv;
            }
        }
    });
    // out_h = v_b[h] · ctx_h → [s, Ha·dv]
    per_head(v_b, &ctx, s, ha, dv)
}

/// The bf16 reference's arithmetic (see the module header). Used only by bf16 models,
/// whose CPU use is parity testing: it expands every needed latent per call.
#[allow(clippy::too_many_arguments)]
fn expanded<'a>(
    pos0: usize,
    q: &[f32],
    latent: &[f32],
    k_b: &CpuWeight,
    v_b: &CpuWeight,
    sel_of: &(dyn Fn(usize) -> Option<&'a [i32]> + Sync),
    s: usize,
    shape: &MlaShape,
    p: Prec,
) -> Vec<f32> {
    let (ha, dn, dv, rkv) = (shape.heads, shape.qk_dim, shape.v_dim, shape.rank);
    let t_len = pos0 + s;
    // k[j][h] = round(W_k,h c_j) with W_k,h = k_b[h]ᵀ, v[j][h] = round(W_v,h c_j).
    let mut k = vec![0f32; t_len * ha * dn];
    let mut v = vec![0f32; t_len * ha * dv];
    let mut vh = vec![0f32; t_len * dv];
    for h in 0..ha {
        let kb = k_b.matrix(h).to_f32();
        v_b.matrix(h)
            .forward_upcast(&latent[..t_len * rkv], t_len, &mut vh);
        for j in 0..t_len {
            let c = &latent[j * rkv..(j + 1) * rkv];
            for d in 0..dn {
                let acc: f32 = (0..rkv).map(|cc| kb[cc * dn + d] * c[cc]).sum();
                k[(j * ha + h) * dn + d] = p.round(acc);
            }
            for e in 0..dv {
                v[(j * ha + h) * dv + e] = p.round(vh[j * dv + e]);
            }
        }
    }
    let mut o = vec![0f32; s * ha * dv];
    o.par_chunks_mut(dv).enumerate().for_each(|(th, out)| {
        let (t, h) = (th / ha, th % ha);
        let qv = &q[th * dn..(th + 1) * dn];
        let toks = tokens(pos0 + t, sel_of(t), shape);
        if toks.is_empty() {
            return;
        }
        let sc: Vec<f32> = toks
            .iter()
            .map(|&j| dot_f32(qv, &k[(j * ha + h) * dn..(j * ha + h + 1) * dn]) * shape.scale)
            .collect();
        let m = sc.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0f32;
        for (&j, &x) in toks.iter().zip(&sc) {
            let e = (x - m).exp();
            sum += e;
            for (o, vv) in out
                .iter_mut()
                .zip(&v[(j * ha + h) * dv..(j * ha + h + 1) * dv])
            {
                *o += e * vv;
            }
        }
        out.iter_mut().for_each(|x| *x /= sum);
    });
    o
}
