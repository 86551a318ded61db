//! Row-streaming kernels for quantized weights and few tokens (decode), AVX2 and AVX-512.
//!
//! Eight rows are processed together: each row's block is unpacked to 32 bytes and
//! multiplied with the token's 32 activation bytes (`vpdpbusd` with AVX-512 VNNI,
//! `vpmaddubsw` + `vpmaddwd` with AVX2), giving 8 partial sums per row; one transposing
//! reduction turns the eight rows' partials into the eight exact block sums, and the
//! float part of the `formats` definition then runs with one row per lane. The formats
//! differ only in how a block is unpacked ([`RowFmt`]); the instruction set only in the
//! byte dot product ([`Dot`]).

use std::arch::x86_64::*;
use std::ops::Range;

use crate::QMatrix;
use crate::acts::{ActRow, QuantizedActs};

use super::out::Out;
use super::rowfmt::{self as f, Dot, Kind, Madd, RowFmt, Vnni};

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

/// Eight rows from `r0` (clamped to the matrix) × `NT` tokens from `t0` (clamped).
#[inline(always)]
unsafe fn rows8<F: RowFmt, D: Dot, const NT: usize>(
    w: &QMatrix,
    x: &QuantizedActs,
    r0: usize,
    r_end: usize,
    t0: usize,
    t_end: usize,
    out: &Out,
) {
    let rb = w.cols / F::BLOCK * F::BYTES;
    assert!(r_end <= w.rows && w.data.len() >= w.rows * rb && 8 * rb < i32::MAX as usize);
    let base = w.data.as_ptr();
    let rows: [*const u8; 8] =
        std::array::from_fn(|i| base.wrapping_add((r0 + i).min(r_end - 1) * rb));
    // The same rows of the next group of 8, prefetched block by block: the hardware
    // prefetchers do not follow eight interleaved short streams well.
    let next: [*const u8; 8] =
        std::array::from_fn(|i| base.wrapping_add((r0 + 8 + i).min(w.rows - 1) * rb));
    // Byte offsets of the eight rows from the first, for gathering their scales.
    // SAFETY: AVX enabled by every caller.
    let offs = unsafe {
        _mm256_setr_epi32(
            0,
            (rows[1] as usize - rows[0] as usize) as i32,
            (rows[2] as usize - rows[0] as usize) as i32,
            (rows[3] as usize - rows[0] as usize) as i32,
            (rows[4] as usize - rows[0] as usize) as i32,
            (rows[5] as usize - rows[0] as usize) as i32,
            (rows[6] as usize - rows[0] as usize) as i32,
            (rows[7] as usize - rows[0] as usize) as i32,
        )
    };
    let acts: [ActRow; NT] = std::array::from_fn(|i| x.row((t0 + i).min(t_end - 1)));
    let nblk = w.cols / F::BLOCK;
    // SAFETY: every block pointer is `row + b·BYTES` with `b < nblk`, inside its row;
    // the activation rows hold `w.cols` elements (checked by matmul).
    unsafe {
        let mut acc = [_mm256_setzero_ps(); NT];
        for b in 0..nblk {
            for p in next {
                let blk = p.add(b * F::BYTES);
                for line in (0..F::BYTES).step_by(64) {
                    _mm_prefetch::<_MM_HINT_T0>(blk.add(line) as *const i8);
                }
                _mm_prefetch::<_MM_HINT_T0>(blk.add(F::BYTES - 1) as *const i8);
            }
            let g = _mm256_i32gather_epi32::<1>(
                rows[0].add(b * F::BYTES + F::SCALE_WORD) as *const i32,
                offs,
            );
            let lo = halves_to_f32(_mm256_and_si256(g, _mm256_set1_epi32(0xffff)));
            let hi = halves_to_f32(_mm256_srli_epi32(g, 16));
            let (dv, av) = if F::D_HIGH { (hi, lo) } else { (lo, hi) };
            for t in 0..NT {
                let mut v = [_mm256_setzero_si256(); 8];
                let mut ms = [0i32; 8];
                for i in 0..8 {
                    (v[i], ms[i]) = F::block::<D>(rows[i].add(b * F::BYTES), &acts[t], b);
                }
                let mut isum = reduce8(&v);
                if F::BIAS != 0 {
                    let asum = *acts[t].sum32.get_unchecked(b);
                    isum = _mm256_sub_epi32(isum, _mm256_set1_epi32(F::BIAS * asum));
                }
                let da = _mm256_set1_ps(*acts[t].d.get_unchecked(b));
                acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(dv, da), _mm256_cvtepi32_ps(isum), acc[t]);
                match F::KIND {
                    Kind::Sym => {}
                    Kind::FloatMin => {
                        let sa = _mm256_set1_ps(*acts[t].s.get_unchecked(b));
                        acc[t] = _mm256_fmadd_ps(av, sa, acc[t]);
                    }
                    Kind::IntMin => {
                        let msum = _mm256_loadu_si256(ms.as_ptr() as *const __m256i);
                        acc[t] = _mm256_fnmadd_ps(
                            _mm256_mul_ps(av, da),
                            _mm256_cvtepi32_ps(msum),
                            acc[t],
                        );
                    }
                }
            }
        }
        for (t, acc) in acc.iter().enumerate().take(t_end - t0) {
            let mut res = [0f32; 8];
            _mm256_storeu_ps(
                res.as_mut_ptr(),
                _mm256_mul_ps(*acc, _mm256_set1_ps(F::FINAL)),
            );
            for (i, &v) in res.iter().enumerate().take(r_end - r0) {
                // SAFETY: the caller owns rows r0..r_end.
                out.set(t0 + t, r0 + i, v);
            }
        }
    }
}

/// All rows of `rows` × tokens of `tokens`, in groups of 8 rows and up to 3 tokens.
#[inline(always)]
unsafe fn run<F: RowFmt, D: Dot>(
    w: &QMatrix,
    x: &QuantizedActs,
    rows: Range<usize>,
    tokens: Range<usize>,
    out: &Out,
) {
    for r0 in rows.clone().step_by(8) {
        let r_end = (r0 + 8).min(rows.end);
        let mut t0 = tokens.start;
        while t0 < tokens.end {
            let left = tokens.end - t0;
            // SAFETY: forwarded; row and token ranges are in bounds.
            unsafe {
                match left {
                    1 => rows8::<F, D, 1>(w, x, r0, r_end, t0, t0 + 1, out),
                    2 => rows8::<F, D, 2>(w, x, r0, r_end, t0, t0 + 2, out),
                    _ => rows8::<F, D, 3>(w, x, r0, r_end, t0, t0 + 3, out),
                }
            }
            t0 += left.min(3);
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn run_vnni<F: RowFmt>(
    w: &QMatrix,
    x: &QuantizedActs,
    rows: Range<usize>,
    tokens: Range<usize>,
    out: &Out,
) {
    // SAFETY: features enabled above.
    unsafe { run::<F, Vnni>(w, x, rows, tokens, out) }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn run_avx2<F: RowFmt>(
    w: &QMatrix,
    x: &QuantizedActs,
    rows: Range<usize>,
    tokens: Range<usize>,
    out: &Out,
) {
    // SAFETY: features enabled above.
    unsafe { run::<F, Madd>(w, x, rows, tokens, out) }
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
    out: &Out,
) -> bool {
    use crate::GgmlType as T;
    macro_rules! go {
        ($f:ty) => {
            // SAFETY: the caller guarantees the instruction set.
            unsafe {
                if vnni {
                    run_vnni::<$f>(w, x, rows, tokens, out)
                } else {
                    run_avx2::<$f>(w, x, rows, tokens, out)
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

/// One row with one token, with the row kernel (for `vec_dot`); `None` if the type has
/// no row kernel.
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
    unsafe { gemv(vnni, &m, x, 0..1, t..t + 1, &out) }.then_some(v[0])
}
