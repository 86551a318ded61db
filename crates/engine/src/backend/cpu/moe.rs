//! MoE routing and the routed experts on the CPU ([`crate::backend::Backend::moe_route`],
//! [`crate::backend::Backend::moe_experts`]).
//!
//! Routing follows `Glm5NextTextTopkRouter` (sigmoid, correction bias, group-limited
//! top-k), `DeepseekV4TopKRouter`/`DeepseekV4HashRouter` (sqrt-softplus, hash table) and
//! `Qwen3_5MoeTopKRouter` (softmax); the experts the reference's `grouped_mm` path:
//! each expert's output in the model dtype, weighted in the routing weights' dtype,
//! summed in f32, rounded once.

use rayon::prelude::*;

use super::weight::{Acts, CpuWeight};
use super::{CpuBackend, torch_math};
use crate::backend::{Experts, Prec, Routing, Scoring};
use crate::{EngineError, Result};

/// The experts and weights of one token from its logits `[E]` (see
/// [`crate::backend::Backend::moe_route`]). `hashed` gives the experts directly.
#[allow(clippy::too_many_arguments)]
pub fn route(
    b: &CpuBackend,
    logits: &[f32],
    bias: Option<&[f32]>,
    hashed: Option<&[f32]>,
    r: &Routing,
    p: Prec,
    ids: &mut [i32],
    weights: &mut [f32],
) -> Result<()> {
    let e = logits.len();
    // Each score function is one tensor operation of the router's dtype `p`.
    let scores: Vec<f32> = match r.scoring {
        Scoring::Sigmoid => logits
            .iter()
            .map(|&l| p.round(torch_math::sigmoid(l)))
            .collect(),
        Scoring::SqrtSoftplus => logits
            .iter()
            .map(|&l| p.round(p.round(torch_math::softplus(l)).sqrt()))
            .collect(),
        Scoring::Softmax => {
            let mut s = logits.to_vec();
            torch_math::softmax(&mut s);
            p.round_all(&mut s);
            s
        }
    };
    let bias = if crate::ablated!(b, MoeBiasOff) {
        None
    } else {
        bias
    };
    let chosen: Vec<usize> = match hashed {
        Some(h) => h
            .iter()
            .map(|&x| x as usize)
            .take(r.n_used)
            .collect::<Vec<_>>(),
        None => {
            let mut choice: Vec<f32> = match bias {
                Some(bv) => scores.iter().zip(bv).map(|(s, b)| s + b).collect(),
                None => scores.clone(),
            };
            if r.n_group > 1 && !crate::ablated!(b, MoeGroupsOff) {
                let per = e / r.n_group;
                let mut gscore: Vec<(usize, f32)> = (0..r.n_group)
                    .map(|g| {
                        let mut v: Vec<f32> = choice[g * per..(g + 1) * per].to_vec();
                        v.sort_by(|a, b| b.total_cmp(a));
                        (g, v[0] + v[1])
                    })
                    .collect();
                gscore.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
                let keep: Vec<usize> = gscore[..r.topk_group].iter().map(|x| x.0).collect();
                for (g, chunk) in choice.chunks_mut(per).enumerate() {
                    if !keep.contains(&g) {
                        chunk.iter_mut().for_each(|v| *v = f32::NEG_INFINITY);
                    }
                }
            }
            let mut idx: Vec<usize> = (0..e).collect();
            idx.sort_by(|&a, &b| choice[b].total_cmp(&choice[a]).then(a.cmp(&b)));
            idx.truncate(r.n_used);
            idx
        }
    };
    if let Some(&bad) = chosen.iter().find(|&&i| i >= e) {
        return Err(EngineError::Backend(format!(
            "hash routing chose expert {bad} of {e}"
        )));
    }
    let mut w: Vec<f32> = chosen
        .iter()
        .map(|&i| match bias {
            Some(bv) if crate::ablated!(b, MoeWeightsWithBias) => scores[i] + bv[i],
            _ => scores[i],
        })
        .collect();
    if r.norm {
        // `w / (w.sum() + 1e-20)`: the sum accumulated in f32, each step a tensor of `p`.
        let sum = p.round(p.round(w.iter().sum::<f32>()) + 1e-20);
        w.iter_mut().for_each(|v| *v = p.round(*v / sum));
    }
    for (k, (&i, wv)) in chosen.iter().zip(w).enumerate() {
        ids[k] = i as i32;
        weights[k] = p.round(wv * r.scale);
    }
    Ok(())
}

/// The reference's SwiGLU with clamp, in place over `gate` (result) and `up`.
pub fn swiglu(b: &CpuBackend, gate: &mut [f32], up: &[f32], limit: Option<f32>, p: Prec) {
    let lim = limit.unwrap_or(f32::INFINITY);
    let below = crate::ablated!(b, SwigluGateClampedBelow);
    for (g, u) in gate.iter_mut().zip(up) {
        let mut gv = g.min(lim);
        if below {
            gv = gv.max(-lim);
        }
        let uv = u.clamp(-lim, lim);
        *g = p.round(p.round(torch_math::silu(gv)) * uv);
    }
}

/// `out [rows, D]` of the routed experts (see the module header).
#[allow(clippy::too_many_arguments)]
pub fn experts(
    b: &CpuBackend,
    x: &[f32],
    rows: usize,
    ids: &[i32],
    weights: &[f32],
    k: usize,
    ex: &Experts<'_, CpuWeight>,
    limit: Option<f32>,
    wp: Prec,
    p: Prec,
    out: &mut [f32],
) -> Result<()> {
    let (gate, up, down) = (ex.gate, ex.up, ex.down);
    let d = gate.cols;
    let n_expert = gate.n;
    if up.n != n_expert || down.n != n_expert || down.rows != d || down.cols != gate.rows {
        return Err(EngineError::Backend(format!(
            "experts '{}', '{}', '{}' have mismatched shapes",
            gate.name, up.name, down.name
        )));
    }
    // Per expert, the tokens (and their weights) routed to it.
    let mut per_expert: Vec<Vec<(usize, f32)>> = vec![Vec::new(); n_expert];
    for t in 0..rows {
        for j in 0..k {
            let e = ids[t * k + j];
            if e < 0 || e as usize >= n_expert {
                return Err(EngineError::Backend(format!(
                    "expert id {e} outside 0..{n_expert}"
                )));
            }
            per_expert[e as usize].push((t, weights[t * k + j]));
        }
    }
    let ff = gate.rows;
    let results: Vec<Result<(usize, Vec<f32>)>> = per_expert
        .par_iter()
        .enumerate()
        .filter(|(_, toks)| !toks.is_empty())
        .map(|(e, toks)| {
            let m = toks.len();
            let mut xs = Vec::with_capacity(m * d);
            for &(t, _) in toks {
                xs.extend_from_slice(&x[t * d..(t + 1) * d]);
            }
            let acts = Acts::new(&xs, m, d);
            let mut g = vec![0f32; m * ff];
            let mut u = vec![0f32; m * ff];
            gate.matrix(e).forward_acts(&acts, p, &mut g)?;
            up.matrix(e).forward_acts(&acts, p, &mut u)?;
            swiglu(b, &mut g, &u, limit, p);
            let mut y = vec![0f32; m * d];
            down.matrix(e).forward(&g, m, p, &mut y)?;
            Ok((e, y))
        })
        .collect();
    let acc = &mut out[..rows * d];
    acc.iter_mut().for_each(|v| *v = 0.0);
    // Sum in expert order (the reference's grouped_mm accumulates experts in order).
    for r in results {
        let (e, y) = r?;
        for (row, &(t, w)) in per_expert[e].iter().enumerate() {
            for (a, v) in acc[t * d..(t + 1) * d]
                .iter_mut()
                .zip(&y[row * d..(row + 1) * d])
            {
                *a += wp.round(v * w);
            }
        }
    }
    p.round_all(acc);
    Ok(())
}
