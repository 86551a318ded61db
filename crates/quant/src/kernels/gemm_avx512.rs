//! AVX-512 VNNI panel kernel: 16 weight rows × a tile of tokens, one format-independent
//! integer kernel for every quantized type.
//!
//! One 512-bit vector holds 4 consecutive int8 values of each of the 16 rows of a
//! [`Panel`]; `vpdpbusd` multiplies it with 4 activation bytes of one token broadcast to
//! all lanes, so each i32 lane accumulates one row's sub-block sum with no horizontal
//! reduction, and each weight vector is reused for all tokens of the tile. `vpdpbusd`
//! wants unsigned weights: signed formats are flipped to `v + 128` and corrected with
//! `128·Σa` per sub-block. The float part is lane-parallel and follows the `formats`
//! definition operation for operation, so results equal the scalar kernel's.

use std::arch::x86_64::*;

use crate::acts::{ActRow, QuantizedActs};

use super::out::Out;
use super::panel::Panel;

/// Lanes (rows) of the panel this kernel reads.
pub(crate) const PR: usize = 16;

/// Runs the panel against every token of `x`, writing rows `r0..r0 + p.nrows`.
pub(crate) fn gemm(p: &Panel, r0: usize, x: &QuantizedActs, out: &Out) {
    assert_eq!(p.pr, PR, "panel width");
    let l = p.layout;
    // SAFETY (all arms): `isa()` selected this kernel only after detecting AVX-512
    // F/BW/VL/VNNI, AVX2, FMA and F16C.
    unsafe {
        match (l.block, l.sub, l.imin, l.fmin, l.signed) {
            (32, 32, false, false, true) => {
                tiles::<8, 32, 1, false, false, false, true>(p, r0, x, out)
            }
            (32, 32, false, true, false) => {
                tiles::<8, 32, 1, false, false, true, false>(p, r0, x, out)
            }
            (256, 16, true, false, false) => {
                tiles::<6, 16, 16, true, true, false, false>(p, r0, x, out)
            }
            (256, 32, true, false, false) => {
                tiles::<6, 32, 8, true, true, false, false>(p, r0, x, out)
            }
            (256, 16, false, false, true) => {
                tiles::<8, 16, 16, true, false, false, true>(p, r0, x, out)
            }
            (256, 32, false, false, true) => {
                tiles::<8, 32, 8, true, false, false, true>(p, r0, x, out)
            }
            _ => unreachable!("no AVX-512 panel kernel for layout {l:?}"),
        }
    }
}

/// All token tiles of `NT` tokens (the last tile repeats the last token and drops the
/// extra results).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn tiles<
    const NT: usize,
    const SUB: usize,
    const NSUB: usize,
    const SUBSCALE: bool,
    const IMIN: bool,
    const FMIN: bool,
    const SIGNED: bool,
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
        unsafe { tile::<NT, SUB, NSUB, SUBSCALE, IMIN, FMIN, SIGNED>(p, &acts, &mut res) };
        for (i, r) in res.iter().enumerate().take(n - t0) {
            for (lane, &v) in r.iter().enumerate().take(p.nrows) {
                // SAFETY: each thread owns its panels' rows.
                unsafe { out.set(t0 + i, r0 + lane, v) };
            }
        }
    }
}

/// One tile: `NT` tokens × 16 rows over all blocks of the panel.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn tile<
    const NT: usize,
    const SUB: usize,
    const NSUB: usize,
    const SUBSCALE: bool,
    const IMIN: bool,
    const FMIN: bool,
    const SIGNED: bool,
>(
    p: &Panel,
    acts: &[ActRow; NT],
    res: &mut [[f32; PR]; NT],
) {
    let block = SUB * NSUB;
    let final_scale = p.layout.final_scale;
    assert!(p.vals.len() >= p.nblk * block * PR && p.d.len() >= p.nblk * PR);
    assert!(p.sub.len() >= p.nblk * NSUB * PR && p.min.len() >= p.nblk * NSUB * PR);
    for a in acts {
        assert!(a.qs.len() >= p.nblk * block && a.d.len() >= p.nblk);
        assert!(a.sum16.len() >= p.nblk * block / 16 && a.sum32.len() >= p.nblk * block / 32);
        assert!(!FMIN || a.s.len() >= p.nblk);
    }
    let flip = _mm512_set1_epi8(-128);
    let mut facc = [_mm512_setzero_ps(); NT];
    // SAFETY: every pointer below stays inside the slices whose lengths are asserted
    // above (block `b < nblk`, sub-block `j < NSUB`, group `g < SUB/4`).
    unsafe {
        for b in 0..p.nblk {
            let mut isum = [_mm512_setzero_si512(); NT];
            let mut msum = [_mm512_setzero_si512(); NT];
            for j in 0..NSUB {
                let k0 = b * block + j * SUB;
                let mut iacc = [_mm512_setzero_si512(); NT];
                for g in 0..SUB / 4 {
                    let mut w =
                        _mm512_loadu_si512(p.vals.as_ptr().add((k0 + 4 * g) * PR) as *const _);
                    if SIGNED {
                        w = _mm512_xor_si512(w, flip);
                    }
                    for t in 0..NT {
                        let a4 =
                            (acts[t].qs.as_ptr().add(k0 + 4 * g) as *const i32).read_unaligned();
                        iacc[t] = _mm512_dpbusd_epi32(iacc[t], w, _mm512_set1_epi32(a4));
                    }
                }
                let sv = _mm512_loadu_si512(p.sub.as_ptr().add((b * NSUB + j) * PR) as *const _);
                let mv = _mm512_loadu_si512(p.min.as_ptr().add((b * NSUB + j) * PR) as *const _);
                for t in 0..NT {
                    let asum = if SUB == 16 {
                        *acts[t].sum16.get_unchecked(b * NSUB + j) as i32
                    } else {
                        *acts[t].sum32.get_unchecked(b * NSUB + j)
                    };
                    if SIGNED {
                        iacc[t] =
                            _mm512_sub_epi32(iacc[t], _mm512_set1_epi32(asum.wrapping_mul(128)));
                    }
                    if SUBSCALE {
                        isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(iacc[t], sv));
                    } else {
                        isum[t] = iacc[t];
                    }
                    if IMIN {
                        msum[t] = _mm512_add_epi32(
                            msum[t],
                            _mm512_mullo_epi32(mv, _mm512_set1_epi32(asum)),
                        );
                    }
                }
            }
            let dv = _mm512_loadu_ps(p.d.as_ptr().add(b * PR));
            let av = _mm512_loadu_ps(p.aux.as_ptr().add(b * PR));
            for t in 0..NT {
                let da = _mm512_set1_ps(*acts[t].d.get_unchecked(b));
                facc[t] =
                    _mm512_fmadd_ps(_mm512_mul_ps(dv, da), _mm512_cvtepi32_ps(isum[t]), facc[t]);
                if IMIN {
                    facc[t] = _mm512_fnmadd_ps(
                        _mm512_mul_ps(av, da),
                        _mm512_cvtepi32_ps(msum[t]),
                        facc[t],
                    );
                }
                if FMIN {
                    facc[t] =
                        _mm512_fmadd_ps(av, _mm512_set1_ps(*acts[t].s.get_unchecked(b)), facc[t]);
                }
            }
        }
        for t in 0..NT {
            _mm512_storeu_ps(
                res[t].as_mut_ptr(),
                _mm512_mul_ps(facc[t], _mm512_set1_ps(final_scale)),
            );
        }
    }
}
