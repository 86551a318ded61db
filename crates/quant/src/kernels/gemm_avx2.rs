//! AVX2 panel kernel: 8 weight rows × a tile of tokens, for CPUs without AVX-512 VNNI.
//!
//! Same structure as the AVX-512 kernel (one lane per row, activations broadcast, no
//! horizontal reduction), with `vpmaddubsw`: it multiplies unsigned by signed bytes and
//! saturates pairs to i16, so signed weights go in as `|w|` with the activation's sign
//! flipped where `w < 0` (pairs stay within ±2·128·127). Results equal the scalar
//! kernel's.

use std::arch::x86_64::*;

use crate::acts::{ActRow, QuantizedActs};

use super::out::Out;
use super::panel::Panel;

/// Lanes (rows) of the panel this kernel reads.
pub(crate) const PR: usize = 8;

/// Runs the panel against every token of `x`, writing rows `r0..r0 + p.nrows`.
pub(crate) fn gemm(p: &Panel, r0: usize, x: &QuantizedActs, out: &Out) {
    assert_eq!(p.pr, PR, "panel width");
    let l = p.layout;
    // SAFETY (all arms): `isa()` selected this kernel only after detecting AVX2, FMA
    // and F16C.
    unsafe {
        match (l.block, l.sub, l.imin, l.fmin) {
            (32, 32, false, false) => tiles::<4, 32, 1, false, false, false>(p, r0, x, out),
            (32, 32, false, true) => tiles::<4, 32, 1, false, false, true>(p, r0, x, out),
            (256, 16, true, false) => tiles::<3, 16, 16, true, true, false>(p, r0, x, out),
            (256, 32, true, false) => tiles::<3, 32, 8, true, true, false>(p, r0, x, out),
            (256, 16, false, false) => tiles::<4, 16, 16, true, false, false>(p, r0, x, out),
            (256, 32, false, false) => tiles::<4, 32, 8, true, false, false>(p, r0, x, out),
            _ => unreachable!("no AVX2 panel kernel for layout {l:?}"),
        }
    }
}

/// All token tiles of `NT` tokens (the last tile repeats the last token and drops the
/// extra results).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tiles<
    const NT: usize,
    const SUB: usize,
    const NSUB: usize,
    const SUBSCALE: bool,
    const IMIN: bool,
    const FMIN: bool,
>(
    p: &Panel,
    r0: usize,
    x: &QuantizedActs,
    out: &Out,
) {
    let n = x.n_tokens();
    let mut res = [[0f32; PR]; NT];
    for t0 in (0..n).step_by(NT) {
        let acts: [ActRow; NT] = std::array::from_fn(|i| x.row((t0 + i).min(n - 1)));
        // SAFETY: same target features as this function.
        unsafe { tile::<NT, SUB, NSUB, SUBSCALE, IMIN, FMIN>(p, &acts, &mut res) };
        for (i, r) in res.iter().enumerate().take(n - t0) {
            for (lane, &v) in r.iter().enumerate().take(p.nrows) {
                // SAFETY: each thread owns its panels' rows.
                unsafe { out.set(t0 + i, r0 + lane, v) };
            }
        }
    }
}

/// One tile: `NT` tokens × 8 rows over all blocks of the panel.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile<
    const NT: usize,
    const SUB: usize,
    const NSUB: usize,
    const SUBSCALE: bool,
    const IMIN: bool,
    const FMIN: bool,
>(
    p: &Panel,
    acts: &[ActRow; NT],
    res: &mut [[f32; PR]; NT],
) {
    let block = SUB * NSUB;
    let final_scale = p.layout.final_scale;
    assert!(
        p.vals.len() >= p.nblk * block * PR
            && p.d.len() >= p.nblk * PR
            && p.aux.len() >= p.nblk * PR
    );
    assert!(p.sub.len() >= p.nblk * NSUB * PR && p.min.len() >= p.nblk * NSUB * PR);
    for a in acts {
        assert!(a.qs.len() >= p.nblk * block && a.d.len() >= p.nblk);
        assert!(a.sum16.len() >= p.nblk * block / 16 && a.sum32.len() >= p.nblk * block / 32);
        assert!(!FMIN || a.s.len() >= p.nblk);
    }
    let ones = _mm256_set1_epi16(1);
    let mut facc = [_mm256_setzero_ps(); NT];
    // SAFETY: every pointer below stays inside the slices whose lengths are asserted
    // above (block `b < nblk`, sub-block `j < NSUB`, group `g < SUB/4`).
    unsafe {
        for b in 0..p.nblk {
            let mut isum = [_mm256_setzero_si256(); NT];
            let mut msum = [_mm256_setzero_si256(); NT];
            for j in 0..NSUB {
                let k0 = b * block + j * SUB;
                let mut iacc = [_mm256_setzero_si256(); NT];
                for g in 0..SUB / 4 {
                    let w = _mm256_loadu_si256(
                        p.vals.as_ptr().add((k0 + 4 * g) * PR) as *const __m256i
                    );
                    let aw = _mm256_sign_epi8(w, w);
                    for t in 0..NT {
                        let a4 =
                            (acts[t].qs.as_ptr().add(k0 + 4 * g) as *const i32).read_unaligned();
                        let s = _mm256_sign_epi8(_mm256_set1_epi32(a4), w);
                        let pr = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, s), ones);
                        iacc[t] = _mm256_add_epi32(iacc[t], pr);
                    }
                }
                let sv =
                    _mm256_loadu_si256(p.sub.as_ptr().add((b * NSUB + j) * PR) as *const __m256i);
                let mv =
                    _mm256_loadu_si256(p.min.as_ptr().add((b * NSUB + j) * PR) as *const __m256i);
                for t in 0..NT {
                    if SUBSCALE {
                        isum[t] = _mm256_add_epi32(isum[t], _mm256_mullo_epi32(iacc[t], sv));
                    } else {
                        isum[t] = iacc[t];
                    }
                    if IMIN {
                        let asum = if SUB == 16 {
                            *acts[t].sum16.get_unchecked(b * NSUB + j) as i32
                        } else {
                            *acts[t].sum32.get_unchecked(b * NSUB + j)
                        };
                        msum[t] = _mm256_add_epi32(
                            msum[t],
                            _mm256_mullo_epi32(mv, _mm256_set1_epi32(asum)),
                        );
                    }
                }
            }
            let dv = _mm256_loadu_ps(p.d.as_ptr().add(b * PR));
            let av = _mm256_loadu_ps(p.aux.as_ptr().add(b * PR));
            for t in 0..NT {
                let da = _mm256_set1_ps(*acts[t].d.get_unchecked(b));
                facc[t] =
                    _mm256_fmadd_ps(_mm256_mul_ps(dv, da), _mm256_cvtepi32_ps(isum[t]), facc[t]);
                if IMIN {
                    facc[t] = _mm256_fnmadd_ps(
                        _mm256_mul_ps(av, da),
                        _mm256_cvtepi32_ps(msum[t]),
                        facc[t],
                    );
                }
                if FMIN {
                    facc[t] =
                        _mm256_fmadd_ps(av, _mm256_set1_ps(*acts[t].s.get_unchecked(b)), facc[t]);
                }
            }
        }
        for t in 0..NT {
            _mm256_storeu_ps(
                res[t].as_mut_ptr(),
                _mm256_mul_ps(facc[t], _mm256_set1_ps(final_scale)),
            );
        }
    }
}
