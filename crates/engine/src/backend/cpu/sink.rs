//! DeepSeek-V4's attention on the CPU ([`crate::backend::Backend::sink_attention`]):
//! shared-KV multi-query attention (`num_key_value_heads = 1`, the same tensor is key
//! and value) over a sliding window plus compressed entries, with one learned sink
//! logit per head in the softmax (`eager_attention_forward` of
//! `modeling_deepseek_v4.py`): `scores = round(round(q·k)·scale)`, the sink appended,
//! softmax in f32, the sink's probability dropped, probabilities rounded,
//! `out = round(Σ p_j k_j)`.

use rayon::prelude::*;

use super::weight::dot_f32;
use crate::backend::{Prec, SinkAttnShape};
use crate::{EngineError, Result};

/// Compressed entries and, optionally, a selection of `per_q` ids per query.
pub type Entries<'a> = Option<(&'a [f32], Option<(&'a [i32], usize)>)>;

/// The keys of query `i` at position `t`: window positions (from `kv` for this step's
/// tokens, else the ring) and compressed entries.
#[allow(clippy::too_many_arguments)]
fn keys<'a>(
    t: usize,
    pos0: usize,
    kv: &'a [f32],
    window: &'a [f32],
    cap: usize,
    entries: Option<(&'a [f32], Option<&[i32]>)>,
    sh: &SinkAttnShape,
    out: &mut Vec<&'a [f32]>,
) {
    let hd = sh.head_dim;
    out.clear();
    for pos in (t + 1).saturating_sub(sh.window)..=t {
        out.push(if pos >= pos0 {
            &kv[(pos - pos0) * hd..(pos - pos0 + 1) * hd]
        } else {
            let s = pos % cap;
            &window[s * hd..(s + 1) * hd]
        });
    }
    if let Some((e, sel)) = entries {
        let visible = (t + 1).checked_div(sh.rate).unwrap_or(0);
        match sel {
            None => out.extend((0..visible).map(|j| &e[j * hd..(j + 1) * hd])),
            Some(ids) => out.extend(
                ids.iter()
                    .filter(|&&j| j >= 0 && (j as usize) < visible)
                    .map(|&j| &e[j as usize * hd..(j as usize + 1) * hd]),
            ),
        }
    }
}

/// See [`crate::backend::Backend::sink_attention`]; `sel` rows hold `per_q` ids.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    pos0: usize,
    q: &[f32],
    kv: &[f32],
    window: &[f32],
    cap: usize,
    entries: Entries<'_>,
    sinks: &[f32],
    rows: usize,
    sh: &SinkAttnShape,
    p: Prec,
    out: &mut [f32],
) -> Result<()> {
    let (h, hd) = (sh.heads, sh.head_dim);
    if sinks.len() != h || q.len() < rows * h * hd || kv.len() < rows * hd {
        return Err(EngineError::Backend(
            "sink_attention: buffers too short".into(),
        ));
    }
    if cap + 1 < sh.window && pos0 > 0 {
        return Err(EngineError::Backend(format!(
            "sink_attention: a ring of {cap} rows cannot hold a window of {}",
            sh.window
        )));
    }
    out[..rows * h * hd]
        .par_chunks_mut(hd)
        .enumerate()
        .for_each(|(th, o)| {
            let (i, head) = (th / h, th % h);
            let t = pos0 + i;
            let ent = entries.map(|(e, sel)| (e, sel.map(|(ids, k)| &ids[i * k..(i + 1) * k])));
            let mut ks = Vec::new();
            keys(t, pos0, kv, window, cap, ent, sh, &mut ks);
            let qv = &q[th * hd..(th + 1) * hd];
            let mut sc: Vec<f32> = ks
                .iter()
                .map(|k| p.round(p.round(dot_f32(qv, k)) * sh.scale))
                .collect();
            let m = sc.iter().copied().fold(sinks[head], f32::max);
            let mut sum = ((sinks[head] - m).exp()) as f64;
            for v in sc.iter_mut() {
                *v = (*v - m).exp();
                sum += *v as f64;
            }
            let inv = (1.0 / sum) as f32;
            o.iter_mut().for_each(|x| *x = 0.0);
            for (k, w) in ks.iter().zip(&sc) {
                let pw = p.round(w * inv);
                for (x, kv) in o.iter_mut().zip(*k) {
                    *x += pw * kv;
                }
            }
            p.round_all(o);
        });
    Ok(())
}
