//! Window compression and the DSA indexer's selection on the CPU
//! ([`crate::backend::Backend::compress`], [`crate::backend::Backend::dsa_select`]).
//!
//! GLM-5.3's k-pool indexer (`Glm5NextTextIndexer`): pools of `P` tokens from position
//! 0; a complete pool's key is a per-channel softmax-weighted sum of its tokens' keys,
//! `α = softmax_s(gate + ape)`; a query scores the pools it sees with
//! `Σ_h w_h·relu(q_h·K·di^-½)` and keeps the best. DeepSeek-V4's compressors
//! (`DeepseekV4CSACompressor`, `DeepseekV4HCACompressor`, `DeepseekV4Indexer`) pool
//! windows the same way (CSA with overlapping windows), then normalise and rotate the
//! entry; its lightning indexer scores entries with the same formula.

use rayon::prelude::*;

use super::CpuBackend;
use super::rope;
use super::torch_math::{rms_scale, softmax};
use super::weight::dot_f32;
use crate::backend::{CompressShape, Prec, Rope, SelectShape};
use crate::{EngineError, Result};

/// The windows completed by positions `pos0..pos0 + n` of windows of `m`.
pub fn completed(pos0: usize, n: usize, m: usize) -> std::ops::Range<usize> {
    pos0 / m..(pos0 + n) / m
}

/// See [`crate::backend::Backend::compress`].
#[allow(clippy::too_many_arguments)]
pub fn compress(
    b: &CpuBackend,
    pos0: usize,
    n: usize,
    kv: &[f32],
    gate: &[f32],
    cap: usize,
    ape: &[f32],
    norm: Option<&[f32]>,
    rope_: Option<&Rope>,
    sh: &CompressShape,
    p: Prec,
    entries: &mut [f32],
) -> Result<()> {
    let (m, c, rl) = (sh.rate, sh.dim, sh.row_len());
    if ape.len() != m * rl || kv.len() < cap * rl || gate.len() < cap * rl {
        return Err(EngineError::Backend(format!(
            "compress: ape of {} values for [{m}, {rl}], sources of {}/{} for [{cap}, {rl}]",
            ape.len(),
            kv.len(),
            gate.len()
        )));
    }
    let ape_off = crate::ablated!(b, DsaApeOff);
    let plain_mean = crate::ablated!(b, DsaPoolPlainMean);
    let inv = rope_.map(Rope::inv_freq);
    let windows = completed(pos0, n, m);
    if entries.len() < windows.end * c {
        return Err(EngineError::Backend(format!(
            "compress: {} entry values for {} windows of {c}",
            entries.len(),
            windows.end
        )));
    }
    // One window's `(kv, gate logit)` slots for channel `d`.
    let slots = |w: usize, d: usize, out: &mut Vec<(f32, f32)>| {
        out.clear();
        let mut push = |pos: usize, j: usize, col: usize| {
            let slot = (pos % cap) * rl + col;
            let a = if ape_off { 0.0 } else { ape[j * rl + col] };
            let logit = if plain_mean { 0.0 } else { gate[slot] + a };
            out.push((kv[slot], logit));
        };
        if sh.overlap {
            if w > 0 {
                for j in 0..m {
                    push((w - 1) * m + j, j, d);
                }
            }
            for j in 0..m {
                push(w * m + j, j, c + d);
            }
        } else {
            for j in 0..m {
                push(w * m + j, j, d);
            }
        }
    };
    let mut sl = Vec::with_capacity(2 * m);
    let mut logits = Vec::with_capacity(2 * m);
    for w in windows {
        let e = &mut entries[w * c..(w + 1) * c];
        for (d, ev) in e.iter_mut().enumerate() {
            slots(w, d, &mut sl);
            logits.clear();
            logits.extend(sl.iter().map(|s| s.1));
            softmax(&mut logits);
            let mut acc = 0f32;
            for (a, (x, _)) in logits.iter().zip(&sl) {
                acc += p.round(p.round(*a) * x);
            }
            *ev = p.round(acc);
        }
        if let Some(nw) = norm {
            // DeepSeek-V4's RMSNorm: f32 weight, one rounding.
            let r = rms_scale(e, sh.norm_eps);
            for (v, w) in e.iter_mut().zip(nw) {
                *v = p.round(w * (*v * r));
            }
        }
        if let (Some(r), Some(inv)) = (rope_, inv.as_ref()) {
            rope::torch_head(r, inv, (w * m) as f32, p, e);
        }
    }
    Ok(())
}

/// See [`crate::backend::Backend::dsa_select`].
#[allow(clippy::too_many_arguments)]
pub fn select(
    b: &CpuBackend,
    pos0: usize,
    q: &[f32],
    w: &[f32],
    entries: &[f32],
    rows: usize,
    sh: &SelectShape,
    ids: &mut [i32],
) -> Result<()> {
    let (hi, di, k) = (sh.heads, sh.dim, sh.top_k);
    let n_entries = (pos0 + rows) / sh.rate;
    if q.len() < rows * hi * di || w.len() < rows * hi || entries.len() < n_entries * di {
        return Err(EngineError::Backend("dsa_select: buffers too short".into()));
    }
    if ids.len() < rows * k {
        return Err(EngineError::Backend("dsa_select: ids too short".into()));
    }
    let relu_off = crate::ablated!(b, DsaReluOff);
    let ones = crate::ablated!(b, DsaHeadWeightsOnes);
    let score = |qi: &[f32], wi: &[f32], key: &[f32]| -> f32 {
        let mut acc = 0f32;
        for h in 0..hi {
            let wh = if ones {
                sh.weights_scale
            } else {
                wi[h] * sh.weights_scale
            };
            let s = dot_f32(&qi[h * di..(h + 1) * di], key) * sh.scale;
            acc += wh * if relu_off { s } else { s.max(0.0) };
        }
        acc
    };
    ids[..rows * k]
        .par_chunks_mut(k)
        .enumerate()
        .for_each(|(i, out)| {
            let t = pos0 + i;
            let visible = ((t + 1) / sh.rate).min(n_entries);
            let mut chosen: Vec<usize> = if visible <= k {
                (0..visible).collect()
            } else {
                let qi = &q[i * hi * di..(i + 1) * hi * di];
                let wi = &w[i * hi..(i + 1) * hi];
                let scores: Vec<f32> = (0..visible)
                    .map(|e| score(qi, wi, &entries[e * di..(e + 1) * di]))
                    .collect();
                let mut order: Vec<usize> = (0..visible).collect();
                order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
                order.truncate(k);
                order.sort_unstable();
                order
            };
            chosen.dedup();
            for (j, o) in out.iter_mut().enumerate() {
                *o = chosen.get(j).map_or(-1, |&e| e as i32);
            }
        });
    Ok(())
}
