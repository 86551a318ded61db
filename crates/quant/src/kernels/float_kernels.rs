//! Float weights (F32, F16, BF16) × float activations, AVX-512 and AVX2.
//!
//! The `formats::float` definition: 16 lanes, lane `k % 16` accumulates with fused
//! multiply-adds in increasing `k`, then a fixed pairwise reduction. One 512-bit
//! register (or two 256-bit ones) holds exactly those 16 lanes, so the kernels compute
//! the definition directly; a tile of rows × tokens shares each loaded vector.

use std::arch::x86_64::*;
use std::ops::Range;

use crate::acts::QuantizedActs;
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
    /// The definition's reduction: `l[i] + l[i+8]`, then `+4`, `+2`, `+1`.
    unsafe fn reduce(v: Self::V) -> f32;
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
    unsafe fn reduce(v: __m512) -> f32 {
        // SAFETY: AVX-512F enabled by the callers.
        unsafe {
            let lo = _mm512_castps512_ps256(v);
            let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
            reduce8(_mm256_add_ps(lo, hi))
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
    unsafe fn reduce(v: Self::V) -> f32 {
        // SAFETY: AVX enabled by the callers.
        unsafe { reduce8(_mm256_add_ps(v.0, v.1)) }
    }
}

/// `RT` rows × `NT` tokens over `k` elements.
#[inline(always)]
unsafe fn tile<L: Lanes16, const WT: u8, const RT: usize, const NT: usize>(
    w: &[&[u8]; RT],
    x: &[&[f32]; NT],
    k: usize,
) -> [[f32; NT]; RT] {
    let esz = if WT == W_F32 { 4 } else { 2 };
    // SAFETY: the main loop reads whole groups of 16 inside the rows; the tail goes
    // through zero-filled copies.
    unsafe {
        let mut acc = [[L::zero(); NT]; RT];
        let full = k / 16;
        for g in 0..full {
            let wv: [L::V; RT] = std::array::from_fn(|r| L::load_w::<WT>(w[r].as_ptr(), 16 * g));
            for t in 0..NT {
                let xv = L::load_x(x[t].as_ptr().add(16 * g));
                for r in 0..RT {
                    acc[r][t] = L::fma(wv[r], xv, acc[r][t]);
                }
            }
        }
        let rest = k - 16 * full;
        if rest > 0 {
            // Zero padding adds exact zeros to lanes that are never negative zero.
            let mut wt = [[0u8; 64]; RT];
            let mut xt = [[0f32; 16]; NT];
            for r in 0..RT {
                wt[r][..rest * esz].copy_from_slice(&w[r][16 * full * esz..k * esz]);
            }
            for t in 0..NT {
                xt[t][..rest].copy_from_slice(&x[t][16 * full..k]);
            }
            for t in 0..NT {
                let xv = L::load_x(xt[t].as_ptr());
                for r in 0..RT {
                    acc[r][t] = L::fma(L::load_w::<WT>(wt[r].as_ptr(), 0), xv, acc[r][t]);
                }
            }
        }
        let mut res = [[0f32; NT]; RT];
        for r in 0..RT {
            for t in 0..NT {
                res[r][t] = L::reduce(acc[r][t]);
            }
        }
        res
    }
}

/// Rows × tokens in tiles of `RT` rows and up to `NTMAX` tokens.
#[inline(always)]
unsafe fn run<L: Lanes16, const WT: u8, const RT: usize>(
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
                    let res = unsafe { tile::<L, WT, RT, $nt>(&wr, &xs, k) };
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
                1 => go!(1),
                2 => go!(2),
                3 => go!(3),
                _ => go!(4),
            }
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn run_avx512<const WT: u8>(
    w: &QMatrix,
    x: &QuantizedActs,
    rows: Range<usize>,
    tokens: Range<usize>,
    out: &Out,
) {
    // SAFETY: features enabled above.
    unsafe { run::<Avx512, WT, 4>(w, x, rows, tokens, out) }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn run_avx2<const WT: u8>(
    w: &QMatrix,
    x: &QuantizedActs,
    rows: Range<usize>,
    tokens: Range<usize>,
    out: &Out,
) {
    // SAFETY: features enabled above.
    unsafe { run::<Avx2, WT, 2>(w, x, rows, tokens, out) }
}

/// Runs the float kernel if `w.ty` is F32, F16 or BF16; returns false otherwise.
///
/// # Safety
/// `avx512` requires AVX-512 F/BW/VL, otherwise AVX2; both with FMA and F16C.
pub(crate) unsafe fn gemm(
    avx512: bool,
    w: &QMatrix,
    x: &QuantizedActs,
    rows: Range<usize>,
    tokens: Range<usize>,
    out: &Out,
) -> bool {
    macro_rules! go {
        ($wt:expr) => {
            // SAFETY: the caller guarantees the instruction set.
            unsafe {
                if avx512 {
                    run_avx512::<{ $wt }>(w, x, rows, tokens, out)
                } else {
                    run_avx2::<{ $wt }>(w, x, rows, tokens, out)
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
