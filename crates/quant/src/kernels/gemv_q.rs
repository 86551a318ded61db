//! Row-streaming kernels for quantized weights and few tokens (decode), AVX2 and AVX-512.
//!
//! Eight rows are processed together: each row's block is unpacked to 32 bytes and
//! multiplied with the token's 32 activation bytes (`vpdpbusd` with AVX-512 VNNI,
//! `vpmaddubsw` + `vpmaddwd` with AVX2), giving 8 partial sums per row. Two float
//! parts, as `order` defines them: ggml's `vec_dot` keeps those eight lanes per row in
//! eight f32 accumulators (one vector per row) and adds them up at the end; the GEMV of
//! repacked weights reduces them to the block sums (one transposing reduction for the
//! eight rows) and accumulates with one row per lane. The formats differ only in how a
//! block is unpacked ([`RowFmt`]); the instruction set only in the byte dot product
//! ([`Dot`]).

use std::arch::x86_64::*;
use std::ops::Range;

use crate::QMatrix;
use crate::acts::{ActRow, QuantizedActs};

use super::out::Out;
use super::rowfmt::{self as f, Dot, Madd, Mins, RowFmt, Vnni};
use crate::order::Path;

/// Sums each of 8 vectors: lane `i` of the result is the total of `v[i]`.
#[inline(always)]
unsafe fn reduce8(v: &[__m256i; 8]) -> __m256i {
    // SAFETY: AVX2 is enabled by every caller.
    unsafe {
        let t0 = _mm256_hadd_epi32(v[0], v[1]);
        let t1 = _mm256_hadd_epi32(v[2], v[3]);
        let t2 = _mm256_hadd_epi32(v[4], v[5]);
        let t3 = _mm256_hadd_epi32(v[6], v[7]);
        let u0 = _mm256_hadd_epi32(t0, t1);
        let u1 = _mm256_hadd_epi32(t2, t3);
        let lo = _mm256_permute2x128_si256(u0, u1, 0x20);
        let hi = _mm256_permute2x128_si256(u0, u1, 0x31);
        _mm256_add_epi32(lo, hi)
    }
}

/// Eight f16 values in the low halves of eight i32 lanes, as f32.
#[inline(always)]
unsafe fn halves_to_f32(v: __m256i) -> __m256 {
    // SAFETY: AVX2 and F16C enabled by every caller.
    unsafe {
        let p = _mm256_packus_epi32(v, v);
        let p = _mm256_permute4x64_epi64::<0b1000>(p);
        _mm256_cvtph_ps(_mm256_castsi256_si128(p))
    }
}

/// The eight rows of a row group and their scales, block by block.
struct Rows8 {
    rows: [*const u8; 8],
    next: [*const u8; 8],
    offs: __m256i,
}

impl Rows8 {
    /// Rows `r0..r0 + 8` of `w` (clamped to `r_end - 1`), and the next group's rows for
    /// prefetching.
    #[inline(always)]
    unsafe fn new<F: RowFmt>(w: &QMatrix, r0: usize, r_end: usize) -> Self {
        let rb = w.cols / F::BLOCK * F::BYTES;
        assert!(r_end <= w.rows && w.data.len() >= w.rows * rb && 8 * rb < i32::MAX as usize);
        let base = w.data.as_ptr();
        let rows: [*const u8; 8] =
            std::array::from_fn(|i| base.wrapping_add((r0 + i).min(r_end - 1) * rb));
        // The same rows of the next group of 8, prefetched block by block: the hardware
        // prefetchers do not follow eight interleaved short streams well.
        let next: [*const u8; 8] =
            std::array::from_fn(|i| base.wrapping_add((r0 + 8 + i).min(w.rows - 1) * rb));
        let off = |i: usize| (rows[i] as usize - rows[0] as usize) as i32;
        // SAFETY: AVX enabled by every caller.
        let offs =
            unsafe { _mm256_setr_epi32(0, off(1), off(2), off(3), off(4), off(5), off(6), off(7)) };
        Rows8 { rows, next, offs }
    }

    /// Prefetches block `b` of the next group and returns the eight rows' `d` and second
    /// scale of block `b` (f32 lanes).
    ///
    /// # Safety
    /// `b` must be a block of the rows.
    #[inline(always)]
    unsafe fn scales<F: RowFmt>(&self, b: usize) -> (__m256, __m256) {
        // SAFETY: block `b` is inside every row (caller).
        unsafe {
            for p in self.next {
                let blk = p.add(b * F::BYTES);
                for line in (0..F::BYTES).step_by(64) {
                    _mm_prefetch::<_MM_HINT_T0>(blk.add(line) as *const i8);
                }
                _mm_prefetch::<_MM_HINT_T0>(blk.add(F::BYTES - 1) as *const i8);
            }
            let g = _mm256_i32gather_epi32::<1>(
                self.rows[0].add(b * F::BYTES + F::SCALE_WORD) as *const i32,
                self.offs,
            );
            let lo = halves_to_f32(_mm256_and_si256(g, _mm256_set1_epi32(0xffff)));
            let hi = halves_to_f32(_mm256_srli_epi32(g, 16));
            if F::D_HIGH { (hi, lo) } else { (lo, hi) }
        }
    }

    /// Block `b` of row `i`.
    #[inline(always)]
    unsafe fn block<F: RowFmt>(&self, i: usize, b: usize) -> *const u8 {
        // SAFETY: the caller asks for blocks inside the rows.
        unsafe { self.rows[i].add(b * F::BYTES) }
    }
}

/// ggml's `hsum_float_8`: `((x0 + x4) + (x2 + x6)) + ((x1 + x5) + (x3 + x7))`.
#[inline(always)]
unsafe fn hsum8(x: __m256) -> f32 {
    // SAFETY: AVX enabled by every caller.
    unsafe {
        let r = _mm_add_ps(_mm256_extractf128_ps::<1>(x), _mm256_castps256_ps128(x));
        let r = _mm_add_ps(r, _mm_movehl_ps(r, r));
        _mm_cvtss_f32(_mm_add_ss(r, _mm_movehdup_ps(r)))
    }
}

/// ggml's `vec_dot` for eight rows from `r0` (clamped to the matrix) × `NT` tokens from
/// `t0` (clamped): eight f32 lanes per (row, token), as `order` defines.
#[inline(always)]
unsafe fn rows8_vec<F: RowFmt, D: Dot, const NT: usize>(
    w: &QMatrix,
    x: &QuantizedActs,
    (r0, r_end): (usize, usize),
    (t0, t_end): (usize, usize),
    out: &Out,
) {
    // SAFETY: every block pointer is `row + b·BYTES` with `b < nblk`, inside its row;
    // the activation rows hold `w.cols` elements (checked by matmul).
    unsafe {
        let g = Rows8::new::<F>(w, r0, r_end);
        let acts: [ActRow; NT] = std::array::from_fn(|i| x.row((t0 + i).min(t_end - 1)));
        let mut acc = [[_mm256_setzero_ps(); 8]; NT];
        // Q4_K's four minimum lanes, two rows per vector; Q4_1/Q5_1/Q5_K's scalar, one
        // row per lane.
        let mut accm = [[_mm256_setzero_ps(); 4]; NT];
        let mut summs = [_mm256_setzero_ps(); NT];
        let mut dd = [0f32; 8];
        let mut dm = [0f32; 8];
        for b in 0..w.cols / F::BLOCK {
            let (dv, av) = g.scales::<F>(b);
            for t in 0..NT {
                let a = &acts[t];
                let da = _mm256_set1_ps(*a.d.get_unchecked(b));
                _mm256_storeu_ps(dd.as_mut_ptr(), _mm256_mul_ps(dv, da));
                let dmv = _mm256_xor_ps(_mm256_mul_ps(av, da), _mm256_set1_ps(-0.0));
                _mm256_storeu_ps(dm.as_mut_ptr(), dmv);
                for i in 0..8 {
                    let blk = g.block::<F>(i, b);
                    if F::MINS == Mins::Q2K {
                        let m = _mm256_cvtepi32_ps(F::mins(blk, a, b));
                        acc[t][i] = _mm256_fmadd_ps(_mm256_set1_ps(dm[i]), m, acc[t][i]);
                    }
                    let lanes = _mm256_cvtepi32_ps(F::block::<D>(blk, a, b));
                    acc[t][i] = _mm256_fmadd_ps(_mm256_set1_ps(dd[i]), lanes, acc[t][i]);
                }
                match F::MINS {
                    Mins::Float => {
                        let sa = _mm256_set1_ps(*a.s.get_unchecked(b));
                        summs[t] = _mm256_fmadd_ps(av, sa, summs[t]);
                    }
                    Mins::Q4K => {
                        // (No closures here: they would not inherit the instruction set.)
                        let mut pairs = [_mm_setzero_si128(); 8];
                        for (i, o) in pairs.iter_mut().enumerate() {
                            let m = F::mins(g.block::<F>(i, b), a, b);
                            *o = _mm_hadd_epi32(
                                _mm256_castsi256_si128(m),
                                _mm256_extracti128_si256::<1>(m),
                            );
                        }
                        for p in 0..4 {
                            let m = _mm256_set_m128i(pairs[2 * p + 1], pairs[2 * p]);
                            let s =
                                _mm256_set_m128(_mm_set1_ps(dm[2 * p + 1]), _mm_set1_ps(dm[2 * p]));
                            accm[t][p] = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(m), accm[t][p]);
                        }
                    }
                    Mins::Q5K => {
                        let mut ms = [0i32; 8];
                        for (i, o) in ms.iter_mut().enumerate() {
                            *o = hsum_i32(F::mins(g.block::<F>(i, b), a, b));
                        }
                        let m = _mm256_loadu_si256(ms.as_ptr() as *const __m256i);
                        summs[t] = _mm256_fmadd_ps(dmv, _mm256_cvtepi32_ps(m), summs[t]);
                    }
                    Mins::None | Mins::Q2K => {}
                }
            }
        }
        for (t, acc) in acc.iter().enumerate().take(t_end - t0) {
            let mut sm = [0f32; 8];
            _mm256_storeu_ps(sm.as_mut_ptr(), summs[t]);
            let mut am = [0f32; 32];
            for p in 0..4 {
                _mm256_storeu_ps(am.as_mut_ptr().add(8 * p), accm[t][p]);
            }
            for (i, &acc) in acc.iter().enumerate().take(r_end - r0) {
                let h = hsum8(acc);
                let v = match F::MINS {
                    Mins::Float | Mins::Q5K => h + sm[i],
                    Mins::Q4K => {
                        let m = &am[4 * i..4 * i + 4];
                        h + ((m[0] + m[2]) + (m[1] + m[3]))
                    }
                    Mins::None | Mins::Q2K => F::FINAL * h,
                };
                // SAFETY: the caller owns rows r0..r_end.
                out.set(t0 + t, r0 + i, v);
            }
        }
    }
}

/// Sum of the eight i32 lanes (exact).
#[inline(always)]
unsafe fn hsum_i32(v: __m256i) -> i32 {
    // SAFETY: AVX2 enabled by every caller.
    unsafe {
        let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
        let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
        _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32::<1>(s)))
    }
}

/// The repacked kernels' GEMV (`ggml_gemv_*_8x8`): eight rows from `r0` × `NT` tokens
/// from `t0`, one accumulator per (row, token) and one for the minimums.
#[inline(always)]
unsafe fn rows8_repacked<F: RowFmt, D: Dot, const NT: usize>(
    w: &QMatrix,
    x: &QuantizedActs,
    (r0, r_end): (usize, usize),
    (t0, t_end): (usize, usize),
    out: &Out,
) {
    // SAFETY: as `rows8_vec`.
    unsafe {
        let g = Rows8::new::<F>(w, r0, r_end);
        let acts: [ActRow; NT] = std::array::from_fn(|i| x.row((t0 + i).min(t_end - 1)));
        let mut acc = [_mm256_setzero_ps(); NT];
        let mut accm = [_mm256_setzero_ps(); NT];
        for b in 0..w.cols / F::BLOCK {
            let (dv, av) = g.scales::<F>(b);
            for t in 0..NT {
                let a = &acts[t];
                let mut v = [_mm256_setzero_si256(); 8];
                let mut m = [_mm256_setzero_si256(); 8];
                for i in 0..8 {
                    let blk = g.block::<F>(i, b);
                    v[i] = F::block::<D>(blk, a, b);
                    if F::MINS != Mins::None {
                        m[i] = F::mins(blk, a, b);
                    }
                }
                let da = _mm256_set1_ps(*a.d.get_unchecked(b));
                let isum = _mm256_cvtepi32_ps(reduce8(&v));
                acc[t] = _mm256_fmadd_ps(isum, _mm256_mul_ps(dv, da), acc[t]);
                if F::MINS != Mins::None {
                    let msum = _mm256_cvtepi32_ps(reduce8(&m));
                    accm[t] = _mm256_fmadd_ps(msum, _mm256_mul_ps(av, da), accm[t]);
                }
            }
        }
        for t in 0..t_end - t0 {
            let mut res = [0f32; 8];
            _mm256_storeu_ps(res.as_mut_ptr(), _mm256_sub_ps(acc[t], accm[t]));
            for (i, &v) in res.iter().enumerate().take(r_end - r0) {
                // SAFETY: the caller owns rows r0..r_end.
                out.set(t0 + t, r0 + i, v);
            }
        }
    }
}

/// All rows of `rows` × tokens of `tokens`, in groups of 8 rows and up to `NT` tokens,
/// along `path` (`VecDot` or `RepackGemv`).
#[inline(always)]
unsafe fn run<F: RowFmt, D: Dot, const NT: usize>(
    w: &QMatrix,
    x: &QuantizedActs,
    rows: Range<usize>,
    tokens: Range<usize>,
    path: Path,
    out: &Out,
) {
    for r0 in rows.clone().step_by(8) {
        let rr = (r0, (r0 + 8).min(rows.end));
        let mut t0 = tokens.start;
        while t0 < tokens.end {
            let cap = if path == Path::RepackGemv {
                NT
            } else {
                NT.min(2)
            };
            let left = (tokens.end - t0).min(cap);
            // SAFETY: forwarded; row and token ranges are in bounds.
            unsafe {
                match (path, left) {
                    (Path::RepackGemv, 1) => rows8_repacked::<F, D, 1>(w, x, rr, (t0, t0 + 1), out),
                    (Path::RepackGemv, 2) => rows8_repacked::<F, D, 2>(w, x, rr, (t0, t0 + 2), out),
                    (Path::RepackGemv, _) => rows8_repacked::<F, D, 3>(w, x, rr, (t0, t0 + 3), out),
                    (_, 1) => rows8_vec::<F, D, 1>(w, x, rr, (t0, t0 + 1), out),
                    _ => rows8_vec::<F, D, 2>(w, x, rr, (t0, t0 + 2), out),
                }
            }
            t0 += left;
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn run_vnni<F: RowFmt>(
    w: &QMatrix,
    x: &QuantizedActs,
    rows: Range<usize>,
    tokens: Range<usize>,
    path: Path,
    out: &Out,
) {
    // SAFETY: features enabled above.
    unsafe { run::<F, Vnni, 3>(w, x, rows, tokens, path, out) }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn run_avx2<F: RowFmt>(
    w: &QMatrix,
    x: &QuantizedActs,
    rows: Range<usize>,
    tokens: Range<usize>,
    path: Path,
    out: &Out,
) {
    // SAFETY: features enabled above.
    unsafe { run::<F, Madd, 1>(w, x, rows, tokens, path, out) }
}

/// Runs the row kernel for `w.ty` if there is one; returns false otherwise.
///
/// # Safety
/// `vnni` requires AVX-512 F/BW/VL/VNNI, otherwise AVX2; both with FMA and F16C.
pub(crate) unsafe fn gemv(
    vnni: bool,
    w: &QMatrix,
    x: &QuantizedActs,
    rows: Range<usize>,
    tokens: Range<usize>,
    path: Path,
    out: &Out,
) -> bool {
    use crate::GgmlType as T;
    macro_rules! go {
        ($f:ty) => {
            // SAFETY: the caller guarantees the instruction set.
            unsafe {
                if vnni {
                    run_vnni::<$f>(w, x, rows, tokens, path, out)
                } else {
                    run_avx2::<$f>(w, x, rows, tokens, path, out)
                }
            }
        };
    }
    match w.ty {
        T::Q4_0 => go!(f::Q4_0),
        T::Q4_1 => go!(f::Q4_1),
        T::Q5_0 => go!(f::Q5_0),
        T::Q5_1 => go!(f::Q5_1),
        T::Q8_0 => go!(f::Q8_0),
        T::Q2_K => go!(f::Q2K),
        T::Q3_K => go!(f::Q3K),
        T::Q4_K => go!(f::Q4K),
        T::Q5_K => go!(f::Q5K),
        T::Q6_K => go!(f::Q6K),
        T::IQ2_XXS => go!(f::Iq2Xxs),
        _ => return false,
    }
    true
}

/// ggml's `vec_dot` of one row with one token, with the row kernel; `None` if the type
/// has no row kernel.
///
/// # Safety
/// As [`gemv`].
pub(crate) unsafe fn dot_one(
    vnni: bool,
    ty: crate::GgmlType,
    w_row: &[u8],
    x: &QuantizedActs,
    t: usize,
) -> Option<f32> {
    let m = QMatrix {
        ty,
        rows: 1,
        cols: x.cols(),
        data: w_row,
    };
    let mut v = [0f32];
    let out = Out::new(&mut v, 1, 0).starting_at_token(t);
    // SAFETY: forwarded.
    unsafe { gemv(vnni, &m, x, 0..1, t..t + 1, Path::VecDot, &out) }.then_some(v[0])
}
