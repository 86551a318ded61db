//! ggml's CPU matrix products, operation for operation: which kernel llama.cpp's CPU
//! backend runs for a product, and the exact f32 arithmetic of each, written as scalar
//! reference code that every SIMD kernel of this crate reproduces bit for bit.
//!
//! Followed: ggml at llama.cpp commit 0c1e570, x86 build with AVX-512 (F/BW/DQ/VL/VNNI;
//! `ggml-cpu/arch/x86/quants.c`, `ggml-cpu/tiled/`, `ggml-cpu/arch/x86/repack.cpp`,
//! `ggml-cpu/repack.cpp`, `ggml-cpu/ggml-cpu.c`, `ggml-cpu/llamafile/sgemm.cpp`).
//! Integer parts are exact in every kernel, so only the grouping of the integer sums and
//! the f32 operations on them matter. Notation below: `v` the weight values of a block
//! (signed true values; unsigned `q` for the formats with minimums), `a` the int8
//! activations, `d`/`dmin`/`m` the weight block's scales as f32, `da`/`sa` the
//! activation block's scale and (Q8_1) scaled sum; `fma` rounds once.
//!
//! # Which kernel ([`path`])
//!
//! - Weights that ggml repacks at load ([`repacks`]: Q4_0, Q4_K, Q2_K and MXFP4 with a
//!   multiple of 8 rows) use the repacked kernels: tokens `0..n - n % 4` of an
//!   `n`-token product go through the 4-token GEMM when `n > 3`, the others through
//!   the GEMV ([`Path::RepackGemm`], [`Path::RepackGemv`]).
//! - Otherwise, K-quants and IQ2_XXS with `n >= 8` tokens use the tiled kernels
//!   ([`Path::Tiled`]) in the llama.cpp versions that have them and when enabled
//!   ([`tiled_enabled`]; the fixtures' llama.cpp had none).
//! - Otherwise every (row, token) is the type's `vec_dot` ([`Path::VecDot`]). For
//!   Q8_0, Q4_0 and Q5_0 with `n >= 2`, llamafile's tinyBLAS runs instead, with the same
//!   arithmetic per output as `vec_dot`.
//! - Float weights (F32, F16, BF16) use tinyBLAS for `n >= 2` when the rows are a
//!   multiple of 4 and the row length a multiple of its step ([`Path::TinyBlas`]), else
//!   `vec_dot`; their arithmetic is in `formats::float`.
//!
//! # `vec_dot` (x86 AVX2 code, which the AVX-512 build runs)
//!
//! Eight f32 lanes per output. Lane `l` of 32-element chunk `c` covers elements
//! `32c + 4l .. 32c + 4l + 4`; `dot4(c, l)` is their integer dot product.
//! - 32-blocks: `acc[l] = fma(d·da, dot4(0, l), acc[l])`; Q4_1/Q5_1 also
//!   `summs = fma(m, sa, summs)` (a scalar, contracted by the compiler).
//! - Q3_K, IQ2_XXS: `acc[l] = fma(d·da, isum[l], acc[l])`, `isum[l] = Σ_c
//!   sc[sub of lane l in chunk c]·dot4(c, l)`.
//! - Q6_K: as Q3_K with unsigned `q = v + 32`, and `isum[l] -= 32·(bsum16[2l]·sc[2l] +
//!   bsum16[2l+1]·sc[2l+1])`.
//! - Q2_K: first `acc[l] = fma(-(da·dmin), mn[2l]·bsum16[2l] + mn[2l+1]·bsum16[2l+1],
//!   acc[l])`, then the `isum` term.
//! - Q4_K: the `isum` term, and four more lanes `accm[k] = fma(-(da·dmin),
//!   mn[2k]·bsum32[2k] + mn[2k+1]·bsum32[2k+1], accm[k])`.
//! - Q5_K: the `isum` term, and `summs = fma(-(da·dmin), Σ_j mn[j]·bsum32[j], summs)`.
//!
//! - MXFP4: two sets of lanes, even and odd blocks, added before the sum; an unpaired
//!   last block is added as a scalar (`vec_dot_mxfp4`).
//!
//! Result: `hsum(acc)` = `((acc0+acc4) + (acc2+acc6)) + ((acc1+acc5) + (acc3+acc7))`,
//! plus `summs` (Q4_1, Q5_1, Q5_K), plus `(accm0+accm2) + (accm1+accm3)` (Q4_K), times
//! 0.125 for IQ2_XXS.
//!
//! # Tiled (K-quants and IQ2_XXS, 8 tokens or more)
//!
//! Per 256-block, `s1 = Σ_j sc[j]·Σ_{e∈j} v·a`, `s2 = Σ_j mn[j]·bsum[j]`;
//! `r = s1·d0` (d0 = `d`, `d·0.125` for IQ2_XXS), `r = fma(-dmin, s2, r)` for types
//! with minimums, then `acc = fma(r, da, acc)` (ggml writes `acc + r·da`; GCC contracts
//! it).
//!
//! # Repacked
//!
//! One accumulator per output (plus one for the minimums): per group of `G` elements,
//! `acc = fma(isum_G, d·da, acc)` and `accm = fma(msum_G, dmin·da, accm)`; result
//! `acc - accm`. `G` = 256 for the GEMV of Q4_K and Q2_K, 64 for the GEMM of Q4_K, 128
//! for the GEMM of Q2_K, 32 for Q4_0 and MXFP4 (both; MXFP4 runs Q4_0's kernels with its
//! own values and scales).

use crate::GgmlType;
use crate::acts::ActRow;
use crate::formats::float::Recipe;
use crate::formats::{self, Unpacked, layout};

/// A kernel family of ggml's CPU backend, as far as its arithmetic differs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Path {
    /// The type's `vec_dot` (or tinyBLAS with the same arithmetic).
    VecDot,
    /// The tiled K-quant kernels (`ggml-cpu/tiled/`).
    Tiled,
    /// Repacked weights, one token (`ggml_gemv_*_8x8`).
    RepackGemv,
    /// Repacked weights, groups of four tokens (`ggml_gemm_*_8x8`).
    RepackGemm,
    /// Float weights: llamafile's tinyBLAS (`formats::float`).
    TinyBlas,
}

/// Whether ggml's CPU backend (x86, AVX-512) repacks a weight matrix of `ty` with `rows`
/// rows when it loads a model (`ggml_repack_get_optimal_repack_type`).
pub(crate) fn repacks(ty: GgmlType, rows: usize) -> bool {
    use GgmlType::*;
    matches!(ty, Q4_0 | Q4_K | Q2_K | MXFP4) && rows.is_multiple_of(8)
}

/// Whether the tiled kernels take products of `ty` with 8 tokens or more.
fn tiled_type(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(ty, Q2_K | Q3_K | Q4_K | Q5_K | Q6_K | IQ2_XXS)
}

/// Whether products use ggml's tiled K-quant kernels: off unless the environment
/// variable `DS4_GGML_TILED` is `1` (read once). llama.cpp turns them on by default
/// since they were added (its switch is `GGML_CPU_TILED_MM`), but the llama.cpp that
/// recorded this project's fixtures had none.
pub(crate) fn tiled_enabled() -> bool {
    static TILED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *TILED.get_or_init(|| std::env::var("DS4_GGML_TILED").is_ok_and(|v| v == "1"))
}

/// The kernel ggml runs for token `t` of an `n`-token product with a `rows × cols`
/// matrix of `ty` (`repacked`: held in the repack buffer, see [`repacks`]; `tiled`:
/// the tiled kernels exist, see [`tiled_enabled`]).
pub(crate) fn path(
    (ty, rows, cols): (GgmlType, usize, usize),
    repacked: bool,
    tiled: bool,
    n: usize,
    t: usize,
) -> Path {
    if layout(ty).is_none() {
        let tinyblas = n >= 2
            && rows.is_multiple_of(4)
            && cols.is_multiple_of(formats::float::tinyblas_step(ty));
        return if tinyblas {
            Path::TinyBlas
        } else {
            Path::VecDot
        };
    }
    if repacked {
        if n > 3 && t < n - n % 4 {
            Path::RepackGemm
        } else {
            Path::RepackGemv
        }
    } else if tiled && n >= 8 && tiled_type(ty) {
        Path::Tiled
    } else {
        Path::VecDot
    }
}

/// Elements per accumulation group of the repacked kernels (see the module docs).
pub(crate) fn repack_group(ty: GgmlType, gemm: bool) -> usize {
    match (ty, gemm) {
        (GgmlType::Q4_0 | GgmlType::MXFP4, _) => 32,
        (GgmlType::Q4_K, true) => 64,
        (GgmlType::Q2_K, true) => 128,
        _ => 256,
    }
}

/// The horizontal sum of ggml's `hsum_float_8` (and tinyBLAS's `hsum` of 8 lanes).
#[inline]
pub(crate) fn hsum8(x: &[f32; 8]) -> f32 {
    let r = [x[0] + x[4], x[1] + x[5], x[2] + x[6], x[3] + x[7]];
    (r[0] + r[2]) + (r[1] + r[3])
}

/// Reference result of one weight row with one token's activations along `path`.
pub(crate) fn dot(path: Path, ty: GgmlType, w: &[u8], a: &ActRow) -> f32 {
    if layout(ty).is_none() {
        let recipe = match path {
            Path::TinyBlas => Recipe::TinyBlas,
            _ => Recipe::VecDot,
        };
        return formats::float::dot(recipe, ty, w, a.f);
    }
    match path {
        Path::VecDot if ty == GgmlType::MXFP4 => vec_dot_mxfp4(w, a),
        Path::VecDot => vec_dot(ty, w, a),
        Path::Tiled => tiled(ty, w, a),
        Path::RepackGemv => repacked(ty, w, a, repack_group(ty, false)),
        Path::RepackGemm => repacked(ty, w, a, repack_group(ty, true)),
        Path::TinyBlas => unreachable!("tinyBLAS path for {ty}"),
    }
}

/// Integer dot product of elements `e0..e0 + len` of a block with its activations.
#[inline]
fn idot(v: &[i8], a: &[i8], e0: usize, len: usize) -> i32 {
    (e0..e0 + len).map(|e| v[e] as i32 * a[e] as i32).sum()
}

/// Activation sum of sub-block `j` (of `sub` elements) of block `b`.
#[inline]
fn asum(a: &ActRow, b: usize, block: usize, sub: usize, j: usize) -> i32 {
    let e0 = b * block + j * sub;
    if sub == 16 {
        a.sum16[e0 / 16] as i32
    } else {
        a.sum32[e0 / 32]
    }
}

/// The eight integer lanes of `vec_dot` for one block (`isum[l]` of the module docs,
/// Q6_K's correction included).
fn vec_lanes(ty: GgmlType, u: &Unpacked, a: &ActRow, b: usize) -> [i32; 8] {
    let lay = layout(ty).expect("quantized type");
    let qa = &a.qs[b * lay.block..(b + 1) * lay.block];
    let mut lanes = [0i32; 8];
    if lay.block == 32 {
        for (l, o) in lanes.iter_mut().enumerate() {
            *o = idot(&u.vals, qa, 4 * l, 4);
        }
        return lanes;
    }
    let q6 = ty == GgmlType::Q6_K;
    for c in 0..8 {
        for (l, o) in lanes.iter_mut().enumerate() {
            let e0 = 32 * c + 4 * l;
            let d4: i32 = if q6 {
                (e0..e0 + 4)
                    .map(|e| (u.vals[e] as i32 + 32) * qa[e] as i32)
                    .sum()
            } else {
                idot(&u.vals, qa, e0, 4)
            };
            *o += u.sub[e0 / lay.sub] * d4;
        }
    }
    if q6 {
        for (l, o) in lanes.iter_mut().enumerate() {
            let s = &a.sum16[16 * b..];
            *o -= 32 * (s[2 * l] as i32 * u.sub[2 * l] + s[2 * l + 1] as i32 * u.sub[2 * l + 1]);
        }
    }
    lanes
}

/// ggml's `vec_dot` of the weight row `w` with `a`.
fn vec_dot(ty: GgmlType, w: &[u8], a: &ActRow) -> f32 {
    use GgmlType::*;
    let bytes = ty.type_size();
    let mut u = Unpacked::default();
    let mut acc = [0f32; 8];
    let mut accm = [0f32; 4];
    let mut summs = 0f32;
    for (b, blk) in w.chunks_exact(bytes).enumerate() {
        formats::unpack(ty, blk, &mut u);
        let da = a.d[b];
        let dd = u.d * da;
        let dm = -(da * u.aux);
        if ty == Q2_K {
            let s = &a.sum16[16 * b..];
            for (l, o) in acc.iter_mut().enumerate() {
                let p = u.min[2 * l] * s[2 * l] as i32 + u.min[2 * l + 1] * s[2 * l + 1] as i32;
                *o = dm.mul_add(p as f32, *o);
            }
        }
        let lanes = vec_lanes(ty, &u, a, b);
        for (o, &v) in acc.iter_mut().zip(&lanes) {
            *o = dd.mul_add(v as f32, *o);
        }
        match ty {
            Q4_1 | Q5_1 => summs = u.aux.mul_add(a.s[b], summs),
            Q4_K => {
                let s = &a.sum32[8 * b..];
                for (k, o) in accm.iter_mut().enumerate() {
                    let p = u.min[2 * k] * s[2 * k] + u.min[2 * k + 1] * s[2 * k + 1];
                    *o = dm.mul_add(p as f32, *o);
                }
            }
            Q5_K => {
                let msum: i32 = (0..8).map(|j| u.min[j] * a.sum32[8 * b + j]).sum();
                summs = dm.mul_add(msum as f32, summs);
            }
            _ => {}
        }
    }
    match ty {
        Q4_1 | Q5_1 | Q5_K => hsum8(&acc) + summs,
        Q4_K => hsum8(&acc) + ((accm[0] + accm[2]) + (accm[1] + accm[3])),
        IQ2_XXS => 0.125 * hsum8(&acc),
        _ => hsum8(&acc),
    }
}

/// ggml's `ggml_vec_dot_mxfp4_q8_0` (x86 AVX2 code): blocks in pairs, the even block of
/// each pair into one set of eight lanes and the odd block into another
/// (`acc[l] = fma(da·d, dot4(l), acc[l])`), the two sets added lane by lane and summed
/// by `hsum8`; a last unpaired block is added as a scalar `fma(da·d, Σ v·a, sum)`.
fn vec_dot_mxfp4(w: &[u8], a: &ActRow) -> f32 {
    let ty = GgmlType::MXFP4;
    let bytes = ty.type_size();
    let nb = w.len() / bytes;
    let mut u = Unpacked::default();
    let mut acc = [[0f32; 8]; 2];
    let pairs = nb / 2 * 2;
    for b in 0..pairs {
        formats::unpack(ty, &w[b * bytes..(b + 1) * bytes], &mut u);
        let dd = a.d[b] * u.d;
        let lanes = vec_lanes(ty, &u, a, b);
        for (o, &v) in acc[b % 2].iter_mut().zip(&lanes) {
            *o = dd.mul_add(v as f32, *o);
        }
    }
    let both: [f32; 8] = std::array::from_fn(|l| acc[0][l] + acc[1][l]);
    let mut sum = hsum8(&both);
    if pairs < nb {
        let b = pairs;
        formats::unpack(ty, &w[b * bytes..(b + 1) * bytes], &mut u);
        let qa = &a.qs[32 * b..32 * (b + 1)];
        let s = idot(&u.vals, qa, 0, 32);
        sum = (a.d[b] * u.d).mul_add(s as f32, sum);
    }
    sum
}

/// Sums of one group of `g` elements starting at block element `e0`:
/// `(Σ_j sc[j]·Σ v·a, Σ_j mn[j]·bsum[j])` over its sub-blocks.
fn group_sums(ty: GgmlType, u: &Unpacked, a: &ActRow, b: usize, e0: usize, g: usize) -> (i32, i32) {
    let lay = layout(ty).expect("quantized type");
    let qa = &a.qs[b * lay.block..(b + 1) * lay.block];
    let (mut isum, mut msum) = (0i32, 0i32);
    for j in e0 / lay.sub..(e0 + g) / lay.sub {
        let s = idot(&u.vals, qa, j * lay.sub, lay.sub);
        isum += if lay.subscale { u.sub[j] * s } else { s };
        if lay.imin {
            msum += u.min[j] * asum(a, b, lay.block, lay.sub, j);
        }
    }
    (isum, msum)
}

/// The tiled kernels' result (see the module docs).
fn tiled(ty: GgmlType, w: &[u8], a: &ActRow) -> f32 {
    let lay = layout(ty).expect("quantized type");
    let mut u = Unpacked::default();
    let mut acc = 0f32;
    for (b, blk) in w.chunks_exact(ty.type_size()).enumerate() {
        formats::unpack(ty, blk, &mut u);
        let (s1, s2) = group_sums(ty, &u, a, b, 0, lay.block);
        let mut r = s1 as f32 * (u.d * lay.final_scale);
        if lay.imin {
            r = (-u.aux).mul_add(s2 as f32, r);
        }
        acc = r.mul_add(a.d[b], acc);
    }
    acc
}

/// The repacked kernels' result with accumulation groups of `g` elements.
fn repacked(ty: GgmlType, w: &[u8], a: &ActRow, g: usize) -> f32 {
    let lay = layout(ty).expect("quantized type");
    let mut u = Unpacked::default();
    let (mut acc, mut accm) = (0f32, 0f32);
    for (b, blk) in w.chunks_exact(ty.type_size()).enumerate() {
        formats::unpack(ty, blk, &mut u);
        let da = a.d[b];
        for e0 in (0..lay.block).step_by(g) {
            let (isum, msum) = group_sums(ty, &u, a, b, e0, g);
            acc = (isum as f32).mul_add(u.d * da, acc);
            if lay.imin {
                accm = (msum as f32).mul_add(u.aux * da, accm);
            }
        }
    }
    acc - accm
}
