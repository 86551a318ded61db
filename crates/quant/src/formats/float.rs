//! Plain float formats: F32, F16 (IEEE half) and BF16, and ggml's dot products of float
//! weights (AVX-512 build).
//!
//! Conversions follow ggml (`GGML_FP32_TO_FP16`: round to nearest even;
//! `ggml_compute_fp32_to_bf16`: nearest even, NaN made quiet). The activations are
//! rounded to the weight's type first, as ggml's `vec_dot_type` does. Two dot products,
//! as ggml runs them ([`Recipe`]):
//! - llamafile's tinyBLAS (products of 2 tokens or more, when the rows are a multiple of
//!   4 and the row length a multiple of 16, 32 for BF16): 16 f32 lanes; for F32 and F16
//!   lane `k % 16` accumulates `w[k]·x[k]` with fused multiply-adds in increasing `k`;
//!   for BF16 (`vdpbf16ps`) lane `j` of each step of 32 adds `w·x` of element `2j + 1`,
//!   then of `2j`, each product exact and each addition rounded. The lanes are added as
//!   `_mm512_reduce_add_ps` does: `l[i] + l[i+8]`, then `+4`, `+2`, `+1`.
//! - `ggml_vec_dot_f32`/`_f16` (one token): 64 lanes (four vectors of 16), lane `k % 64`
//!   accumulating with fused multiply-adds up to the last multiple of 64; vectors
//!   `(v0 + v2) + (v1 + v3)`, then the 16-lane reduction; the remaining elements are
//!   added one by one (F32: fused multiply-adds in f32; F16: in f64, rounded to f32 at
//!   the end; F32's exact grouping is in [`f32_leftovers`]). `ggml_vec_dot_bf16`: two
//!   `vdpbf16ps` accumulators (elements `64i..64i+32` and `64i+32..64i+64`), each
//!   reduced and added in f64 with the remaining products.
//!
//! `vdpbf16ps` flushes denormal inputs and results to zero; the emulation here does not
//! (bf16 denormals are below 1.2e-38).

use crate::GgmlType;
use crate::fp::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16, rd_u16};

/// Lanes of the striped float dot product.
pub(crate) const LANES: usize = 16;

/// Element `k` of a float row of type `ty` (F32, F16 or BF16), as f32.
#[inline]
pub(crate) fn load(ty: GgmlType, src: &[u8], k: usize) -> f32 {
    match ty {
        GgmlType::F16 => f16_to_f32(rd_u16(src, 2 * k)),
        GgmlType::BF16 => bf16_to_f32(rd_u16(src, 2 * k)),
        _ => f32::from_le_bytes([src[4 * k], src[4 * k + 1], src[4 * k + 2], src[4 * k + 3]]),
    }
}

/// Converts a float row to f32.
pub(crate) fn dequantize(ty: GgmlType, src: &[u8], dst: &mut [f32]) {
    for (k, y) in dst.iter_mut().enumerate() {
        *y = load(ty, src, k);
    }
}

/// Converts f32 to the float type's bytes.
pub(crate) fn quantize(ty: GgmlType, src: &[f32], dst: &mut [u8]) {
    match ty {
        GgmlType::F16 => {
            for (x, o) in src.iter().zip(dst.chunks_exact_mut(2)) {
                o.copy_from_slice(&f32_to_f16(*x).to_le_bytes());
            }
        }
        GgmlType::BF16 => {
            for (x, o) in src.iter().zip(dst.chunks_exact_mut(2)) {
                o.copy_from_slice(&f32_to_bf16(*x).to_le_bytes());
            }
        }
        _ => {
            for (x, o) in src.iter().zip(dst.chunks_exact_mut(4)) {
                o.copy_from_slice(&x.to_le_bytes());
            }
        }
    }
}

/// Rounds an activation to what the weight type's `vec_dot_type` can hold.
#[inline]
pub(crate) fn round_act(ty: GgmlType, x: f32) -> f32 {
    match ty {
        GgmlType::F16 => f16_to_f32(f32_to_f16(x)),
        GgmlType::BF16 => bf16_to_f32(f32_to_bf16(x)),
        _ => x,
    }
}

/// The two dot products of float weights (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Recipe {
    /// llamafile's tinyBLAS.
    TinyBlas,
    /// `ggml_vec_dot_f32`, `_f16`, `_bf16`.
    VecDot,
}

/// Elements per step of tinyBLAS for `ty` (its `KN`): the row length must be a multiple.
pub(crate) fn tinyblas_step(ty: GgmlType) -> usize {
    if ty == GgmlType::BF16 { 32 } else { 16 }
}

/// Adds the 16 lanes as `_mm512_reduce_add_ps`.
#[inline]
pub(crate) fn reduce_lanes(l: &[f32; LANES]) -> f32 {
    let mut s8 = [0f32; 8];
    for i in 0..8 {
        s8[i] = l[i] + l[i + 8];
    }
    let mut s4 = [0f32; 4];
    for i in 0..4 {
        s4[i] = s8[i] + s8[i + 4];
    }
    let s2 = [s4[0] + s4[2], s4[1] + s4[3]];
    s2[0] + s2[1]
}

/// One `vdpbf16ps` step on 16 lanes: elements `k0..k0 + 32` of a BF16 row with `x`.
#[inline]
fn dpbf16(lanes: &mut [f32; LANES], w: &[u8], x: &[f32], k0: usize) {
    for (j, l) in lanes.iter_mut().enumerate() {
        let (e, o) = (k0 + 2 * j, k0 + 2 * j + 1);
        *l += load(GgmlType::BF16, w, o) * x[o];
        *l += load(GgmlType::BF16, w, e) * x[e];
    }
}

/// The leftover elements `np..n` (fewer than 64) of `ggml_vec_dot_f32` added to `sum`
/// as GCC compiled its loop `sumf += x[i]*y[i]`: groups of 16, then one of 8 if 8 are
/// left, with rounded products added in order; the last fewer than 8 with fused
/// multiply-adds. `prod(k)` is the rounded product, `pair(k)` the two factors.
#[inline]
pub(crate) fn f32_leftovers(
    mut sum: f32,
    np: usize,
    n: usize,
    prod: impl Fn(usize) -> f32,
    pair: impl Fn(usize) -> (f32, f32),
) -> f32 {
    let left = n - np;
    let mut rounded = left / 16 * 16;
    if left - rounded >= 8 {
        rounded += 8;
    }
    for k in np..np + rounded {
        sum += prod(k);
    }
    for k in np + rounded..n {
        let (a, b) = pair(k);
        sum = a.mul_add(b, sum);
    }
    sum
}

/// Reference dot product of a float weight row with rounded f32 activations.
pub(crate) fn dot(recipe: Recipe, ty: GgmlType, w: &[u8], x: &[f32]) -> f32 {
    let n = x.len();
    match (recipe, ty) {
        (Recipe::TinyBlas, GgmlType::BF16) => {
            let mut lanes = [0f32; LANES];
            for k0 in (0..n).step_by(32) {
                dpbf16(&mut lanes, w, x, k0);
            }
            reduce_lanes(&lanes)
        }
        (Recipe::TinyBlas, _) => {
            let mut lanes = [0f32; LANES];
            for (k, &xk) in x.iter().enumerate() {
                lanes[k % LANES] = load(ty, w, k).mul_add(xk, lanes[k % LANES]);
            }
            reduce_lanes(&lanes)
        }
        (Recipe::VecDot, GgmlType::BF16) => {
            let np = n / 64 * 64;
            let (mut c1, mut c2) = ([0f32; LANES], [0f32; LANES]);
            for k0 in (0..np).step_by(64) {
                dpbf16(&mut c1, w, x, k0);
                dpbf16(&mut c2, w, x, k0 + 32);
            }
            let mut sum = reduce_lanes(&c1) as f64 + reduce_lanes(&c2) as f64;
            for k in np..n {
                sum += (load(ty, w, k) * x[k]) as f64;
            }
            sum as f32
        }
        (Recipe::VecDot, _) => {
            let np = n / 64 * 64;
            let mut v = [[0f32; LANES]; 4];
            for k in 0..np {
                let l = &mut v[(k / 16) % 4][k % 16];
                *l = load(ty, w, k).mul_add(x[k], *l);
            }
            let mut s = [0f32; LANES];
            for i in 0..LANES {
                s[i] = (v[0][i] + v[2][i]) + (v[1][i] + v[3][i]);
            }
            let head = reduce_lanes(&s);
            if ty == GgmlType::F32 {
                f32_leftovers(
                    head,
                    np,
                    n,
                    |k| load(ty, w, k) * x[k],
                    |k| (load(ty, w, k), x[k]),
                )
            } else {
                let sum = (np..n).fold(head as f64, |acc, k| acc + (load(ty, w, k) * x[k]) as f64);
                sum as f32
            }
        }
    }
}
