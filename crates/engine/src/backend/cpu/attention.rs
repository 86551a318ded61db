//! Causal grouped-query attention over the f16 KV cache, in llama.cpp's arithmetic
//! (`llm_graph_context::build_attn_mha` with flash attention off): `kq = K·q` with the
//! query rounded to f16, `softmax(kq · scale + mask)`, the weights rounded to f16,
//! `out = V·p`. ggml computes both products with `tinyBLAS` when the step has at least
//! two tokens and with `ggml_vec_dot_f16` for a single token; the two accumulate in
//! different orders (one 16-lane accumulator; [`ggml_math::dot_f16_vec`]). We use
//! the single-token order for every row, so a position's result does not depend on how
//! the prompt was split into steps (decode matches ggml; a prefill differs from ggml's
//! in the last bits, see docs/parity.md).
//!
//! Shapes: `q` is `n_tok × n_head·head_dim`; the cache holds `n_ctx × n_head_kv·head_dim`
//! f16 values per layer for K and for V; `out` is `n_tok × n_head·head_dim`.

use half::f16;
use half::slice::HalfFloatSliceExt;
use rayon::prelude::*;

use super::ggml_math::{LANES, dot_f16_vec, softmax};
use crate::backend::AttnShape;

/// ggml pads the KV length of the attention products; padding with zero weights does
/// not change any sum, so a multiple of the 64-element step is enough here.
const KV_PAD: usize = 64;

/// Attention of `n_tok` query rows at positions `p0..p0 + n_tok` over cache rows
/// `0..=p0 + t` (row `t` sees its own position and earlier ones).
#[allow(clippy::too_many_arguments)]
pub fn attention(
    shape: &AttnShape,
    p0: usize,
    n_tok: usize,
    q: &[f32],
    kc: &[f16],
    vc: &[f16],
    kv_dim: usize,
    out: &mut [f32],
) {
    let hd = shape.head_dim;
    let q_dim = shape.n_head * hd;
    let group = shape.n_head / shape.n_head_kv;
    let scale = 1.0 / (hd as f32).sqrt();
    let len_max = (p0 + n_tok).next_multiple_of(KV_PAD);
    out[..n_tok * q_dim]
        .par_chunks_mut(hd)
        .enumerate()
        .for_each_init(
            || Scratch::new(hd, len_max),
            |s, (idx, o)| {
                let (t, h) = (idx / shape.n_head, idx % shape.n_head);
                let g = h / group;
                let n = p0 + t + 1;
                let len = n.next_multiple_of(KV_PAD);
                // The query is converted to f16 for the f16 product.
                for (d, &x) in s.q.iter_mut().zip(&q[t * q_dim + h * hd..][..hd]) {
                    *d = f16::from_f32(x).to_f32();
                }
                let scores = &mut s.scores[..len];
                for (j, sc) in scores[..n].iter_mut().enumerate() {
                    kc[j * kv_dim + g * hd..][..hd].convert_to_f32_slice(&mut s.row);
                    let kq = dot_f16_vec(&s.row, &s.q);
                    *sc = kq * scale;
                }
                scores[n..].fill(f32::NEG_INFINITY);
                softmax(scores);
                weighted_sum(s, vc, kv_dim, g * hd, n, o);
            },
        );
}

/// Per-task buffers.
struct Scratch {
    q: Vec<f32>,
    row: Vec<f32>,
    scores: Vec<f32>,
    /// Accumulators `[group][lane][head_dim]` of the `V·p` product.
    acc: Vec<f32>,
}

impl Scratch {
    fn new(hd: usize, len: usize) -> Self {
        Scratch {
            q: vec![0.0; hd],
            row: vec![0.0; hd],
            scores: vec![0.0; len],
            acc: vec![0.0; 4 * LANES * hd],
        }
    }
}

/// `o[d] = Σ_j f16(p_j) · V[j][off + d]` for `j < n`, accumulated per output element in
/// the order of ggml's `vec_dot` (four 16-lane accumulators over 64-element steps).
/// Vectorised across `d`.
fn weighted_sum(s: &mut Scratch, vc: &[f16], kv_dim: usize, off: usize, n: usize, o: &mut [f32]) {
    let hd = o.len();
    let acc = &mut s.acc[..4 * LANES * hd];
    acc.fill(0.0);
    for j in 0..n {
        let p = f16::from_f32(s.scores[j]).to_f32();
        if p == 0.0 {
            // Exact zeros add nothing to any lane (every term is finite).
            continue;
        }
        vc[j * kv_dim + off..][..hd].convert_to_f32_slice(&mut s.row);
        let g = (j / LANES) % 4;
        let a = &mut acc[(g * LANES + j % LANES) * hd..][..hd];
        for (x, &v) in a.iter_mut().zip(&s.row) {
            *x = v.mul_add(p, *x);
        }
    }
    // The reduction of every output element at once (vectorised across `d`), in the
    // order of `vec_dot`'s: the four accumulators `(a0 + a2) + (a1 + a3)` into the first,
    // then its 16 lanes as `reduce_add_16` adds them.
    let (a0, rest) = acc.split_at_mut(LANES * hd);
    let (a1, rest) = rest.split_at_mut(LANES * hd);
    let (a2, a3) = rest.split_at_mut(LANES * hd);
    for (((x0, &x1), &x2), &x3) in a0.iter_mut().zip(&*a1).zip(&*a2).zip(&*a3) {
        *x0 = (*x0 + x2) + (x1 + x3);
    }
    for half in [8, 4] {
        let (low, high) = a0.split_at_mut(half * hd);
        for (x, &y) in low.iter_mut().zip(&high[..half * hd]) {
            *x += y;
        }
    }
    let (t0, rest) = a0.split_at(hd);
    let (t1, rest) = rest.split_at(hd);
    let (t2, t3) = rest.split_at(hd);
    for ((((od, &x0), &x1), &x2), &x3) in o.iter_mut().zip(t0).zip(t1).zip(t2).zip(t3) {
        *od = (x0 + x2) + (x1 + x3);
    }
}
