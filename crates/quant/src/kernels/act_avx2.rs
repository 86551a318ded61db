//! AVX2 activation quantizers (Q8_0/Q8_1 blocks of 32, Q8_K blocks of 256), the same
//! operations as ggml's `quantize_row_q8_0`/`q8_1` (`arch/x86/quants.c`) and
//! `quantize_row_q8_K_ref`, so the bytes equal the scalar versions in `formats`.
//! They also produce the sums of each 16 and 32 values the kernels use.

use std::arch::x86_64::*;

/// Quantizes one token row to Q8_0 (`s` empty) or Q8_1 (`s` one per block).
/// `x.len()` is a multiple of 32; `qs`, `d`, `s`, `sum16`, `sum32` match it.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn q8_0_row(
    x: &[f32],
    qs: &mut [i8],
    d: &mut [f32],
    s: &mut [f32],
    sum16: &mut [i16],
    sum32: &mut [i32],
) {
    let nb = x.len() / 32;
    assert!(qs.len() >= 32 * nb && d.len() >= nb && sum16.len() >= 2 * nb && sum32.len() >= nb);
    assert!(s.is_empty() || s.len() >= nb);
    let sign = _mm256_set1_ps(-0.0);
    for b in 0..nb {
        // SAFETY: block b is inside x and qs (asserted above).
        unsafe {
            let p = x.as_ptr().add(32 * b);
            let v = [
                _mm256_loadu_ps(p),
                _mm256_loadu_ps(p.add(8)),
                _mm256_loadu_ps(p.add(16)),
                _mm256_loadu_ps(p.add(24)),
            ];
            let mut m = _mm256_andnot_ps(sign, v[0]);
            for vi in &v[1..] {
                m = _mm256_max_ps(m, _mm256_andnot_ps(sign, *vi));
            }
            let amax = hmax(m);
            let dd = amax / 127.0;
            let dh = _mm_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm_set_ss(dd));
            d[b] = _mm_cvtss_f32(_mm_cvtph_ps(dh));
            let id = _mm256_set1_ps(if amax != 0.0 { 127.0 / amax } else { 0.0 });
            let i: [__m256i; 4] = std::array::from_fn(|k| {
                _mm256_cvtps_epi32(_mm256_round_ps::<
                    { _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC },
                >(_mm256_mul_ps(v[k], id)))
            });
            let s01 = _mm256_add_epi32(i[0], i[1]);
            let s23 = _mm256_add_epi32(i[2], i[3]);
            let (lo, hi) = (hsum(s01), hsum(s23));
            sum16[2 * b] = lo as i16;
            sum16[2 * b + 1] = hi as i16;
            sum32[b] = lo + hi;
            if !s.is_empty() {
                let sv =
                    _mm_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm_set_ss(dd * (lo + hi) as f32));
                s[b] = _mm_cvtss_f32(_mm_cvtph_ps(sv));
            }
            store_i8(qs.as_mut_ptr().add(32 * b), i);
        }
    }
}

/// Quantizes one token row to Q8_K: values, block scales `d` and the sums of 16 and 32.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn q8_k_row(
    x: &[f32],
    qs: &mut [i8],
    d: &mut [f32],
    sum16: &mut [i16],
    sum32: &mut [i32],
) {
    let nb = x.len() / 256;
    assert!(
        qs.len() >= 256 * nb && d.len() >= nb && sum16.len() >= 16 * nb && sum32.len() >= 8 * nb
    );
    let sign = _mm256_set1_ps(-0.0);
    let magic = _mm256_set1_ps(12_582_912.0);
    for b in 0..nb {
        let xb = &x[256 * b..256 * b + 256];
        // SAFETY: block b is inside x and qs (asserted above).
        unsafe {
            let mut m = _mm256_setzero_ps();
            for k in 0..32 {
                m = _mm256_max_ps(
                    m,
                    _mm256_andnot_ps(sign, _mm256_loadu_ps(xb.as_ptr().add(8 * k))),
                );
            }
            let amax = hmax(m);
            if amax == 0.0 {
                d[b] = 0.0;
                qs[256 * b..256 * b + 256].fill(0);
                sum16[16 * b..16 * b + 16].fill(0);
                sum32[8 * b..8 * b + 8].fill(0);
                continue;
            }
            let max = xb.iter().copied().find(|v| v.abs() == amax).unwrap_or(amax);
            let iscale = -127.0 / max;
            let is = _mm256_set1_ps(iscale);
            for c in 0..8 {
                let p = xb.as_ptr().add(32 * c);
                // nearest_int: (v + 1.5·2^23) - 1.5·2^23, exact ties-to-even for |v| < 2^22.
                let i: [__m256i; 4] = std::array::from_fn(|k| {
                    let v = _mm256_mul_ps(is, _mm256_loadu_ps(p.add(8 * k)));
                    _mm256_cvtps_epi32(_mm256_sub_ps(_mm256_add_ps(v, magic), magic))
                });
                let lo = hsum(_mm256_add_epi32(i[0], i[1]));
                let hi = hsum(_mm256_add_epi32(i[2], i[3]));
                sum16[16 * b + 2 * c] = lo as i16;
                sum16[16 * b + 2 * c + 1] = hi as i16;
                sum32[8 * b + c] = lo + hi;
                store_i8(qs.as_mut_ptr().add(256 * b + 32 * c), i);
            }
            d[b] = 1.0 / iscale;
        }
    }
}

/// Maximum of the 8 lanes.
#[inline(always)]
unsafe fn hmax(m: __m256) -> f32 {
    // SAFETY: AVX enabled by the callers.
    unsafe {
        let mut h = _mm_max_ps(_mm256_extractf128_ps(m, 1), _mm256_castps256_ps128(m));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_movehdup_ps(h));
        _mm_cvtss_f32(h)
    }
}

/// Sum of the 8 i32 lanes.
#[inline(always)]
unsafe fn hsum(v: __m256i) -> i32 {
    // SAFETY: AVX2 enabled by the callers.
    unsafe {
        let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
        let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
        _mm_cvtsi128_si32(s)
    }
}

/// Packs 4×8 i32 (each in -128..=127 after saturation) into 32 bytes at `p`, in order.
#[inline(always)]
unsafe fn store_i8(p: *mut i8, i: [__m256i; 4]) {
    // SAFETY: p points at 32 writable bytes; AVX2 enabled by the callers.
    unsafe {
        let a = _mm256_packs_epi32(i[0], i[1]);
        let b = _mm256_packs_epi32(i[2], i[3]);
        let c = _mm256_packs_epi16(a, b);
        let c = _mm256_permutevar8x32_epi32(c, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256(p as *mut __m256i, c);
    }
}
