//! Rotary position embedding in the two arithmetics of [`Rope`]:
//!
//! - ggml's (`Prec::Ggml`): angles `θ = pos · scale^i` advanced by repeated f32
//!   multiplication (ggml's rope cache), rotations `x0·cos − x1·sin` with one fused
//!   multiply-add each, as GCC compiles ggml's loop.
//! - PyTorch's (`Prec::F32`/`Bf16`, transformers' `*RotaryEmbedding`):
//!   `inv_freq = 1 / base^(2i/n)` (f32, YaRN-blended when configured),
//!   `angle = pos · inv_freq`, cos/sin in f32 times the attention factor, rounded to the
//!   model dtype, then `x·cos + rotate(x)·sin` in f32, rounded.

use crate::backend::{Prec, Rope};

/// ggml's `rope` of every row of `x` (rows of `n_head × head_dim`) at positions
/// `pos0 + row`.
pub fn ggml(rope: &Rope, pos0: usize, n_head: usize, head_dim: usize, x: &mut [f32]) {
    let row_len = n_head * head_dim;
    let theta_scale = rope.freq_base.powf(-2.0 / rope.n_dims as f32);
    let half = rope.n_dims / 2;
    let mut cs = Vec::with_capacity(half);
    for (i, row) in x.chunks_mut(row_len).enumerate() {
        // cos/sin per pair, as ggml's rope cache: theta advances by f32 products.
        cs.clear();
        let mut theta = (pos0 + i) as f32;
        for _ in 0..half {
            cs.push((theta.cos(), theta.sin()));
            theta *= theta_scale;
        }
        for head in row.chunks_mut(head_dim) {
            for (j, &(c, s)) in cs.iter().enumerate() {
                let (a, b) = if rope.neox {
                    (j, j + half)
                } else {
                    (2 * j, 2 * j + 1)
                };
                let (x0, x1) = (head[a], head[b]);
                // ggml's `x0*cos - x1*sin` as GCC fuses it (one fma each).
                head[a] = x0.mul_add(c, -(x1 * s));
                head[b] = x0.mul_add(s, x1 * c);
            }
        }
    }
}

/// transformers' rope of one head `h` (`head_dim` values) at position `pos` with
/// frequencies `inv`.
pub fn torch_head(rope: &Rope, inv: &[f32], pos: f32, p: Prec, h: &mut [f32]) {
    let n = rope.n_dims;
    let half = n / 2;
    let start = if rope.trailing { h.len() - n } else { 0 };
    let factor = rope.yarn.map_or(1.0, |y| y.mscale);
    let sign = if rope.inverse { -1.0 } else { 1.0 };
    let seg = &mut h[start..start + n];
    for (j, &f) in inv.iter().enumerate() {
        let angle = pos * f;
        let c = p.round(angle.cos() * factor);
        let s = p.round(angle.sin() * factor) * sign;
        let (a, b) = if rope.neox {
            (j, j + half)
        } else {
            (2 * j, 2 * j + 1)
        };
        let (x0, x1) = (seg[a], seg[b]);
        // x·cos + rotate_half(x)·sin with rotate_half(x) = (−x1, x0) per pair.
        seg[a] = p.round(x0 * c + (-x1) * s);
        seg[b] = p.round(x1 * c + x0 * s);
    }
}

/// transformers' rope of every row of `x` (rows of `n_head × head_dim`) at positions
/// `pos0 + row`.
pub fn torch(rope: &Rope, pos0: usize, n_head: usize, head_dim: usize, p: Prec, x: &mut [f32]) {
    let inv = rope.inv_freq();
    for (i, row) in x.chunks_mut(n_head * head_dim).enumerate() {
        for h in row.chunks_mut(head_dim) {
            torch_head(rope, &inv, (pos0 + i) as f32, p, h);
        }
    }
}
