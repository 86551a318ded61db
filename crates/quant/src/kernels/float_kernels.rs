//! Float weights (F32, F16, BF16) × float activations, AVX-512 and AVX2.
//!
//! The `formats::float` definitions: 16 lanes (tinyBLAS), or 64 lanes in four vectors
//! of 16 (`ggml_vec_dot_f32`/`_f16`), each accumulating with fused multiply-adds in
//! increasing `k`, then a fixed pairwise reduction; BF16 emulates `vdpbf16ps` (odd
//! element, then even, per lane). One 512-bit register (or two 256-bit ones) holds 16
//! lanes, so the kernels compute the definitions directly; a tile of rows × tokens
//! shares each loaded vector.

use std::arch::x86_64::*;
use std::ops::Range;

use crate::acts::QuantizedActs;
use crate::formats::float;
use crate::{GgmlType, QMatrix};

use super::out::Out;

/// Weight element encodings (const parameter of the kernels).
const W_F32: u8 = 0;
const W_F16: u8 = 1;
const W_BF16: u8 = 2;

/// 16 f32 lanes on one instruction set.
trait Lanes16 {
    type V: Copy;
    unsafe fn zero() -> Self::V;
    /// 16 activations at `p`.
    unsafe fn load_x(p: *const f32) -> Self::V;
    /// 16 weights of encoding `WT` starting at element `k` of the row at `p`.
    unsafe fn load_w<const WT: u8>(p: *const u8, k: usize) -> Self::V;
    unsafe fn fma(a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    unsafe fn add(a: Self::V, b: Self::V) -> Self::V;
    unsafe fn mul(a: Self::V, b: Self::V) -> Self::V;
    /// The definition's reduction: `l[i] + l[i+8]`, then `+4`, `+2`, `+1`.
    unsafe fn reduce(v: Self::V) -> f32;
    /// BF16 weights `k..k + 32` of the row at `p` as (even, odd) elements: lane `j`
    /// holds elements `2j` and `2j + 1`.
    unsafe fn load_bf16_pairs(p: *const u8, k: usize) -> (Self::V, Self::V);
    /// Activations `p[0..32]` as (even, odd) elements, as [`Lanes16::load_bf16_pairs`].
    unsafe fn load_x_pairs(p: *const f32) -> (Self::V, Self::V);
}

struct Avx512;
struct Avx2;

/// The 8-lane tail of the reduction, shared by both instruction sets.
#[inline(always)]
unsafe fn reduce8(s8: __m256) -> f32 {
    // SAFETY: AVX enabled by the callers.
    unsafe {
        let s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
        let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
        _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)))
    }
}

impl Lanes16 for Avx512 {
    type V = __m512;
    #[inline(always)]
    unsafe fn zero() -> __m512 {
        // SAFETY: AVX-512F enabled by the callers.
        unsafe { _mm512_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn load_x(p: *const f32) -> __m512 {
        // SAFETY: reads 16 floats.
        unsafe { _mm512_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn load_w<const WT: u8>(p: *const u8, k: usize) -> __m512 {
        // SAFETY: reads 16 elements of the row.
        unsafe {
            match WT {
                W_F32 => _mm512_loadu_ps(p.add(4 * k) as *const f32),
                W_F16 => _mm512_cvtph_ps(_mm256_loadu_si256(p.add(2 * k) as *const __m256i)),
                _ => {
                    let h =
                        _mm512_cvtepu16_epi32(_mm256_loadu_si256(p.add(2 * k) as *const __m256i));
                    _mm512_castsi512_ps(_mm512_slli_epi32(h, 16))
                }
            }
        }
    }
    #[inline(always)]
    unsafe fn fma(a: __m512, b: __m512, c: __m512) -> __m512 {
        // SAFETY: AVX-512F enabled by the callers.
        unsafe { _mm512_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn add(a: __m512, b: __m512) -> __m512 {
        // SAFETY: AVX-512F enabled by the callers.
        unsafe { _mm512_add_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn mul(a: __m512, b: __m512) -> __m512 {
        // SAFETY: AVX-512F enabled by the callers.
        unsafe { _mm512_mul_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn reduce(v: __m512) -> f32 {
        // SAFETY: AVX-512F enabled by the callers.
        unsafe {
            let lo = _mm512_castps512_ps256(v);
            let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
            reduce8(_mm256_add_ps(lo, hi))
        }
    }
    #[inline(always)]
    unsafe fn load_bf16_pairs(p: *const u8, k: usize) -> (__m512, __m512) {
        // SAFETY: reads 32 elements of the row.
        unsafe {
            let v = _mm512_loadu_si512(p.add(2 * k) as *const _);
            let odd = _mm512_and_si512(v, _mm512_set1_epi32(0xffff_0000u32 as i32));
            (
                _mm512_castsi512_ps(_mm512_slli_epi32::<16>(v)),
                _mm512_castsi512_ps(odd),
            )
        }
    }
    #[inline(always)]
    unsafe fn load_x_pairs(p: *const f32) -> (__m512, __m512) {
        // SAFETY: reads 32 floats.
        unsafe {
            let (a, b) = (_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(16)));
            let even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
            let odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
            (
                _mm512_permutex2var_ps(a, even, b),
                _mm512_permutex2var_ps(a, odd, b),
            )
        }
    }
}

impl Lanes16 for Avx2 {
    type V = (__m256, __m256);
    #[inline(always)]
    unsafe fn zero() -> Self::V {
        // SAFETY: AVX enabled by the callers.
        unsafe { (_mm256_setzero_ps(), _mm256_setzero_ps()) }
    }
    #[inline(always)]
    unsafe fn load_x(p: *const f32) -> Self::V {
        // SAFETY: reads 16 floats.
        unsafe { (_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8))) }
    }
    #[inline(always)]
    unsafe fn load_w<const WT: u8>(p: *const u8, k: usize) -> Self::V {
        // SAFETY: reads 16 elements of the row.
        unsafe {
            match WT {
                W_F32 => {
                    let q = p.add(4 * k) as *const f32;
                    (_mm256_loadu_ps(q), _mm256_loadu_ps(q.add(8)))
                }
                W_F16 => {
                    let q = p.add(2 * k) as *const __m128i;
                    (
                        _mm256_cvtph_ps(_mm_loadu_si128(q)),
                        _mm256_cvtph_ps(_mm_loadu_si128(q.add(1))),
                    )
                }
                _ => {
                    let q = p.add(2 * k) as *const __m128i;
                    let a = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(q)), 16);
                    let b = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(q.add(1))), 16);
                    (_mm256_castsi256_ps(a), _mm256_castsi256_ps(b))
                }
            }
        }
    }
    #[inline(always)]
    unsafe fn fma(a: Self::V, b: Self::V, c: Self::V) -> Self::V {
        // SAFETY: FMA enabled by the callers.
        unsafe {
            (
                _mm256_fmadd_ps(a.0, b.0, c.0),
                _mm256_fmadd_ps(a.1, b.1, c.1),
            )
        }
    }
    #[inline(always)]
    unsafe fn add(a: Self::V, b: Self::V) -> Self::V {
        // SAFETY: AVX enabled by the callers.
        unsafe { (_mm256_add_ps(a.0, b.0), _mm256_add_ps(a.1, b.1)) }
    }
    #[inline(always)]
    unsafe fn mul(a: Self::V, b: Self::V) -> Self::V {
        // SAFETY: AVX enabled by the callers.
        unsafe { (_mm256_mul_ps(a.0, b.0), _mm256_mul_ps(a.1, b.1)) }
    }
    #[inline(always)]
    unsafe fn reduce(v: Self::V) -> f32 {
        // SAFETY: AVX enabled by the callers.
        unsafe { reduce8(_mm256_add_ps(v.0, v.1)) }
    }
    #[inline(always)]
    unsafe fn load_bf16_pairs(p: *const u8, k: usize) -> (Self::V, Self::V) {
        // SAFETY: reads 32 elements of the row.
        unsafe {
            let q = p.add(2 * k) as *const __m256i;
            let split = |v: __m256i| {
                let odd = _mm256_and_si256(v, _mm256_set1_epi32(0xffff_0000u32 as i32));
                (
                    _mm256_castsi256_ps(_mm256_slli_epi32::<16>(v)),
                    _mm256_castsi256_ps(odd),
                )
            };
            let (e0, o0) = split(_mm256_loadu_si256(q));
            let (e1, o1) = split(_mm256_loadu_si256(q.add(1)));
            ((e0, e1), (o0, o1))
        }
    }
    #[inline(always)]
    unsafe fn load_x_pairs(p: *const f32) -> (Self::V, Self::V) {
        // SAFETY: reads 32 floats.
        unsafe {
            let half = |q: *const f32| {
                let (a, b) = (_mm256_loadu_ps(q), _mm256_loadu_ps(q.add(8)));
                let e = _mm256_permute4x64_pd::<0xd8>(_mm256_castps_pd(_mm256_shuffle_ps::<0x88>(
                    a, b,
                )));
                let o = _mm256_permute4x64_pd::<0xd8>(_mm256_castps_pd(_mm256_shuffle_ps::<0xdd>(
                    a, b,
                )));
                (_mm256_castpd_ps(e), _mm256_castpd_ps(o))
            };
            let (e0, o0) = half(p);
            let (e1, o1) = half(p.add(16));
            ((e0, e1), (o0, o1))
        }
    }
}

/// `RT` rows × `NT` tokens over `k` elements, along `formats::float`'s tinyBLAS
/// recipe (`VEC` false) or `vec_dot` recipe (`VEC` true).
#[inline(always)]
unsafe fn tile<L: Lanes16, const WT: u8, const VEC: bool, const RT: usize, const NT: usize>(
    w: &[&[u8]; RT],
    x: &[&[f32]; NT],
    k: usize,
) -> [[f32; NT]; RT] {
    let esz = if WT == W_F32 { 4 } else { 2 };
    // Accumulators per (row, token): vec_dot has 4 of 16 lanes (2 for BF16).
    const ACC: usize = 4;
    let nacc = if !VEC {
        1
    } else if WT == W_BF16 {
        2
    } else {
        4
    };
    // Elements done with vectors: vec_dot stops at the last multiple of 64; tinyBLAS
    // only runs on whole steps.
    let step = if WT == W_BF16 { 32 } else { 16 };
    let np = if VEC { k / 64 * 64 } else { k / step * step };
    // SAFETY: the loops read whole groups inside the rows (`np <= k`); the scalar tail
    // reads single elements.
    unsafe {
        let mut acc = [[[L::zero(); ACC]; NT]; RT];
        for g in 0..np / step {
            let a = if nacc == 1 { 0 } else { g % nacc };
            if WT == W_BF16 {
                let wv: [(L::V, L::V); RT] =
                    std::array::from_fn(|r| L::load_bf16_pairs(w[r].as_ptr(), 32 * g));
                for t in 0..NT {
                    let (xe, xo) = L::load_x_pairs(x[t].as_ptr().add(32 * g));
                    for r in 0..RT {
                        let c = &mut acc[r][t][a];
                        *c = L::add(*c, L::mul(wv[r].1, xo));
                        *c = L::add(*c, L::mul(wv[r].0, xe));
                    }
                }
            } else {
                let wv: [L::V; RT] =
                    std::array::from_fn(|r| L::load_w::<WT>(w[r].as_ptr(), 16 * g));
                for t in 0..NT {
                    let xv = L::load_x(x[t].as_ptr().add(16 * g));
                    for r in 0..RT {
                        acc[r][t][a] = L::fma(wv[r], xv, acc[r][t][a]);
                    }
                }
            }
        }
        let mut res = [[0f32; NT]; RT];
        for r in 0..RT {
            for t in 0..NT {
                let c = &acc[r][t];
                res[r][t] = if !VEC {
                    L::reduce(c[0])
                } else if WT == W_BF16 {
                    let s = L::reduce(c[0]) as f64 + L::reduce(c[1]) as f64;
                    let wr = w[r];
                    (np..k).fold(s, |s, i| s + (bf16_at(wr, i) * x[t][i]) as f64) as f32
                } else {
                    let head = L::reduce(L::add(L::add(c[0], c[2]), L::add(c[1], c[3])));
                    let wr = w[r];
                    if WT == W_F32 {
                        let xt = x[t];
                        float::f32_leftovers(
                            head,
                            np,
                            k,
                            |i| f32_at(wr, i) * xt[i],
                            |i| (f32_at(wr, i), xt[i]),
                        )
                    } else {
                        (np..k).fold(head as f64, |s, i| s + (f16_at(wr, i) * x[t][i]) as f64)
                            as f32
                    }
                };
                let _ = esz;
            }
        }
        res
    }
}

/// Element `i` of an F32 row.
#[inline(always)]
fn f32_at(w: &[u8], i: usize) -> f32 {
    f32::from_le_bytes([w[4 * i], w[4 * i + 1], w[4 * i + 2], w[4 * i + 3]])
}

/// Element `i` of an F16 row.
#[inline(always)]
fn f16_at(w: &[u8], i: usize) -> f32 {
    crate::fp::f16_to_f32(u16::from_le_bytes([w[2 * i], w[2 * i + 1]]))
}

/// Element `i` of a BF16 row.
#[inline(always)]
fn bf16_at(w: &[u8], i: usize) -> f32 {
    crate::fp::bf16_to_f32(u16::from_le_bytes([w[2 * i], w[2 * i + 1]]))
}

/// Rows × tokens in tiles of `RT` rows and up to 4 tokens (1 for `vec_dot`).
#[inline(always)]
unsafe fn run<L: Lanes16, const WT: u8, const VEC: bool, const RT: usize>(
    w: &QMatrix,
    x: &QuantizedActs,
    rows: Range<usize>,
    tokens: Range<usize>,
    out: &Out,
) {
    let k = w.cols;
    for r0 in rows.clone().step_by(RT) {
        let wr: [&[u8]; RT] = std::array::from_fn(|i| w.row((r0 + i).min(rows.end - 1)));
        let nr = RT.min(rows.end - r0);
        let mut t0 = tokens.start;
        while t0 < tokens.end {
            let left = tokens.end - t0;
            let xr = |i: usize| x.row((t0 + i).min(tokens.end - 1)).f;
            macro_rules! go {
                ($nt:literal) => {{
                    let xs: [&[f32]; $nt] = std::array::from_fn(xr);
                    // SAFETY: forwarded.
                    let res = unsafe { tile::<L, WT, VEC, RT, $nt>(&wr, &xs, k) };
                    for (r, row) in res.iter().enumerate().take(nr) {
                        for (t, &v) in row.iter().enumerate().take(left.min($nt)) {
                            // SAFETY: the caller owns these rows.
                            unsafe { out.set(t0 + t, r0 + r, v) };
                        }
                    }
                    t0 += left.min($nt);
                }};
            }
            match left {
                _ if VEC => go!(1),
                1 => go!(1),
                2 => go!(2),
                3 => go!(3),
                _ => go!(4),
            }
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn run_avx512<const WT: u8, const VEC: bool>(
    w: &QMatrix,
    x: &QuantizedActs,
    rows: Range<usize>,
    tokens: Range<usize>,
    out: &Out,
) {
    // SAFETY: features enabled above.
    unsafe { run::<Avx512, WT, VEC, 4>(w, x, rows, tokens, out) }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn run_avx2<const WT: u8, const VEC: bool>(
    w: &QMatrix,
    x: &QuantizedActs,
    rows: Range<usize>,
    tokens: Range<usize>,
    out: &Out,
) {
    // SAFETY: features enabled above.
    unsafe { run::<Avx2, WT, VEC, 2>(w, x, rows, tokens, out) }
}

/// Runs the float kernel if `w.ty` is F32, F16 or BF16 (tinyBLAS's arithmetic if
/// `tinyblas`, else `vec_dot`'s); returns false otherwise.
///
/// # Safety
/// `avx512` requires AVX-512 F/BW/VL, otherwise AVX2; both with FMA and F16C.
pub(crate) unsafe fn gemm(
    avx512: bool,
    w: &QMatrix,
    x: &QuantizedActs,
    rows: Range<usize>,
    tokens: Range<usize>,
    tinyblas: bool,
    out: &Out,
) -> bool {
    macro_rules! go {
        ($wt:expr) => {
            // SAFETY: the caller guarantees the instruction set.
            unsafe {
                match (avx512, tinyblas) {
                    (true, true) => run_avx512::<{ $wt }, false>(w, x, rows, tokens, out),
                    (true, false) => run_avx512::<{ $wt }, true>(w, x, rows, tokens, out),
                    (false, true) => run_avx2::<{ $wt }, false>(w, x, rows, tokens, out),
                    (false, false) => run_avx2::<{ $wt }, true>(w, x, rows, tokens, out),
                }
            }
        };
    }
    match w.ty {
        GgmlType::F32 => go!(W_F32),
        GgmlType::F16 => go!(W_F16),
        GgmlType::BF16 => go!(W_BF16),
        _ => return false,
    }
    true
}
