//! Panel kernels: `PR` weight rows (one per SIMD lane) × a tile of tokens, one
//! format-independent integer kernel per float recipe of `order`, written once for
//! AVX-512 VNNI (16 lanes) and AVX2 (8 lanes) through [`Lanes`].
//!
//! One vector holds 4 consecutive int8 values of each row of a [`Panel`]; the integer
//! dot product with 4 activation bytes of one token broadcast to all lanes leaves one
//! row's partial sum per i32 lane, with no horizontal reduction, and each weight vector
//! is reused for all tokens of the tile. Recipes:
//! - sub-block kernels: the tiled kernels (one float step per block) and the repacked
//!   GEMM and GEMV arithmetic (one float step per `GROUP` sub-blocks), from exact
//!   sub-block sums;
//! - ggml's `vec_dot` of 32-blocks: eight f32 accumulators per (row, token), one per
//!   group of 4 values, added in `hsum_float_8`'s order at the end.
//!
//! The float part is lane-parallel and follows `order` operation for operation, so
//! results equal the scalar reference bit for bit.

use std::arch::x86_64::*;
use std::ops::Range;

use crate::GgmlType;
use crate::acts::{ActRow, QuantizedActs};
use crate::formats::Layout;
use crate::order::Path;

use super::out::Out;
use super::panel::Panel;
use super::rowfmt::Mins;

/// The integer and float vector operations the panel kernels need, for one instruction
/// set. All methods require that instruction set (callers run under its target
/// features).
pub(crate) trait Lanes {
    /// Rows per panel (lanes of a vector).
    const PR: usize;
    /// Signed weights are stored flipped to `v + 128` in the panel (for `vpdpbusd`);
    /// [`Lanes::dot`] then leaves `128·Σa` in each lane.
    const FLIP: bool;
    type I: Copy;
    type F: Copy;
    /// Prepared weights of one group for [`Lanes::dot`].
    type W: Copy;

    unsafe fn zero_i() -> Self::I;
    unsafe fn zero_f() -> Self::F;
    unsafe fn load_i(p: *const i8) -> Self::I;
    unsafe fn load_f(p: *const f32) -> Self::F;
    unsafe fn store_f(p: *mut f32, v: Self::F);
    unsafe fn set_i(v: i32) -> Self::I;
    unsafe fn set_f(v: f32) -> Self::F;
    unsafe fn add_i(a: Self::I, b: Self::I) -> Self::I;
    unsafe fn sub_i(a: Self::I, b: Self::I) -> Self::I;
    unsafe fn mullo_i(a: Self::I, b: Self::I) -> Self::I;
    unsafe fn cvt(a: Self::I) -> Self::F;
    unsafe fn add_f(a: Self::F, b: Self::F) -> Self::F;
    unsafe fn sub_f(a: Self::F, b: Self::F) -> Self::F;
    unsafe fn mul_f(a: Self::F, b: Self::F) -> Self::F;
    /// `a·b + c`, one rounding.
    unsafe fn fma(a: Self::F, b: Self::F, c: Self::F) -> Self::F;
    /// `-(a·b) + c`, one rounding.
    unsafe fn fnma(a: Self::F, b: Self::F, c: Self::F) -> Self::F;

    /// `acc + a_lo·b_lo + a_hi·b_hi` per lane, the i32 lanes read as pairs of i16.
    unsafe fn madd16(acc: Self::I, a: Self::I, b: Self::I) -> Self::I;
    /// Packs the low 16 bits of `lo` and `hi` into the i16 pairs of each lane.
    unsafe fn pack16(lo: Self::I, hi: Self::I) -> Self::I;

    /// Weights `w` (4 values per lane, as stored in the panel) prepared for
    /// [`Lanes::dot`].
    unsafe fn prep(w: Self::I) -> Self::W;
    /// `acc + Σ w·a` per lane (`a4`: 4 activation bytes), plus `128·Σa` for signed
    /// weights if [`Lanes::FLIP`].
    unsafe fn dot(acc: Self::I, w: Self::W, a4: i32) -> Self::I;
}

/// AVX-512 F/BW/VL/VNNI: `vpdpbusd`, unsigned × signed bytes.
pub(crate) struct Avx512;
/// AVX2: `vpmaddubsw` + `vpmaddwd`, with the sign trick for signed weights.
pub(crate) struct Avx2;

impl Lanes for Avx512 {
    const PR: usize = 16;
    const FLIP: bool = true;
    type I = __m512i;
    type F = __m512;
    type W = __m512i;
    #[inline(always)]
    unsafe fn zero_i() -> __m512i {
        // SAFETY (all methods): the caller runs with AVX-512 F/BW/VL/VNNI.
        unsafe { _mm512_setzero_si512() }
    }
    #[inline(always)]
    unsafe fn zero_f() -> __m512 {
        unsafe { _mm512_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn load_i(p: *const i8) -> __m512i {
        unsafe { _mm512_loadu_si512(p as *const _) }
    }
    #[inline(always)]
    unsafe fn load_f(p: *const f32) -> __m512 {
        unsafe { _mm512_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn store_f(p: *mut f32, v: __m512) {
        unsafe { _mm512_storeu_ps(p, v) }
    }
    #[inline(always)]
    unsafe fn set_i(v: i32) -> __m512i {
        unsafe { _mm512_set1_epi32(v) }
    }
    #[inline(always)]
    unsafe fn set_f(v: f32) -> __m512 {
        unsafe { _mm512_set1_ps(v) }
    }
    #[inline(always)]
    unsafe fn add_i(a: __m512i, b: __m512i) -> __m512i {
        unsafe { _mm512_add_epi32(a, b) }
    }
    #[inline(always)]
    unsafe fn sub_i(a: __m512i, b: __m512i) -> __m512i {
        unsafe { _mm512_sub_epi32(a, b) }
    }
    #[inline(always)]
    unsafe fn mullo_i(a: __m512i, b: __m512i) -> __m512i {
        unsafe { _mm512_mullo_epi32(a, b) }
    }
    #[inline(always)]
    unsafe fn cvt(a: __m512i) -> __m512 {
        unsafe { _mm512_cvtepi32_ps(a) }
    }
    #[inline(always)]
    unsafe fn add_f(a: __m512, b: __m512) -> __m512 {
        unsafe { _mm512_add_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn sub_f(a: __m512, b: __m512) -> __m512 {
        unsafe { _mm512_sub_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn mul_f(a: __m512, b: __m512) -> __m512 {
        unsafe { _mm512_mul_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn fma(a: __m512, b: __m512, c: __m512) -> __m512 {
        unsafe { _mm512_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn fnma(a: __m512, b: __m512, c: __m512) -> __m512 {
        unsafe { _mm512_fnmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn madd16(acc: __m512i, a: __m512i, b: __m512i) -> __m512i {
        unsafe { _mm512_dpwssd_epi32(acc, a, b) }
    }
    #[inline(always)]
    unsafe fn pack16(lo: __m512i, hi: __m512i) -> __m512i {
        unsafe { _mm512_mask_blend_epi16(0xaaaa_aaaa, lo, _mm512_slli_epi32::<16>(hi)) }
    }
    #[inline(always)]
    unsafe fn prep(w: __m512i) -> __m512i {
        w
    }
    #[inline(always)]
    unsafe fn dot(acc: __m512i, w: __m512i, a4: i32) -> __m512i {
        unsafe { _mm512_dpbusd_epi32(acc, w, _mm512_set1_epi32(a4)) }
    }
}

impl Lanes for Avx2 {
    const PR: usize = 8;
    const FLIP: bool = false;
    type I = __m256i;
    type F = __m256;
    type W = (__m256i, __m256i);
    #[inline(always)]
    unsafe fn zero_i() -> __m256i {
        // SAFETY (all methods): the caller runs with AVX2 and FMA.
        unsafe { _mm256_setzero_si256() }
    }
    #[inline(always)]
    unsafe fn zero_f() -> __m256 {
        unsafe { _mm256_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn load_i(p: *const i8) -> __m256i {
        unsafe { _mm256_loadu_si256(p as *const __m256i) }
    }
    #[inline(always)]
    unsafe fn load_f(p: *const f32) -> __m256 {
        unsafe { _mm256_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn store_f(p: *mut f32, v: __m256) {
        unsafe { _mm256_storeu_ps(p, v) }
    }
    #[inline(always)]
    unsafe fn set_i(v: i32) -> __m256i {
        unsafe { _mm256_set1_epi32(v) }
    }
    #[inline(always)]
    unsafe fn set_f(v: f32) -> __m256 {
        unsafe { _mm256_set1_ps(v) }
    }
    #[inline(always)]
    unsafe fn add_i(a: __m256i, b: __m256i) -> __m256i {
        unsafe { _mm256_add_epi32(a, b) }
    }
    #[inline(always)]
    unsafe fn sub_i(a: __m256i, b: __m256i) -> __m256i {
        unsafe { _mm256_sub_epi32(a, b) }
    }
    #[inline(always)]
    unsafe fn mullo_i(a: __m256i, b: __m256i) -> __m256i {
        unsafe { _mm256_mullo_epi32(a, b) }
    }
    #[inline(always)]
    unsafe fn cvt(a: __m256i) -> __m256 {
        unsafe { _mm256_cvtepi32_ps(a) }
    }
    #[inline(always)]
    unsafe fn add_f(a: __m256, b: __m256) -> __m256 {
        unsafe { _mm256_add_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn sub_f(a: __m256, b: __m256) -> __m256 {
        unsafe { _mm256_sub_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn mul_f(a: __m256, b: __m256) -> __m256 {
        unsafe { _mm256_mul_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn fma(a: __m256, b: __m256, c: __m256) -> __m256 {
        unsafe { _mm256_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn fnma(a: __m256, b: __m256, c: __m256) -> __m256 {
        unsafe { _mm256_fnmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn madd16(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
        unsafe { _mm256_add_epi32(acc, _mm256_madd_epi16(a, b)) }
    }
    #[inline(always)]
    unsafe fn pack16(lo: __m256i, hi: __m256i) -> __m256i {
        unsafe { _mm256_blend_epi16::<0xaa>(lo, _mm256_slli_epi32::<16>(hi)) }
    }
    /// `(|v|, v)`: `vpmaddubsw` multiplies `|v|` with the activations signed like `v`
    /// (pairs stay within ±2·128·127).
    #[inline(always)]
    unsafe fn prep(w: __m256i) -> (__m256i, __m256i) {
        unsafe { (_mm256_sign_epi8(w, w), w) }
    }
    #[inline(always)]
    unsafe fn dot(acc: __m256i, w: (__m256i, __m256i), a4: i32) -> __m256i {
        unsafe {
            let s = _mm256_sign_epi8(_mm256_set1_epi32(a4), w.1);
            let p = _mm256_madd_epi16(_mm256_maddubs_epi16(w.0, s), _mm256_set1_epi16(1));
            _mm256_add_epi32(acc, p)
        }
    }
}

/// Float recipe of a sub-block kernel: `GROUP` sub-blocks per float step of the repacked
/// GEMM, or [`TILED`] for the tiled kernels (one float step per block).
const TILED: usize = 0;

/// The offset the panel of `ty` needs along `path` (see `Panel`): signed values flipped
/// for `vpdpbusd` (if [`Lanes::FLIP`]), Q6_K's unsigned `q` for its `vec_dot`.
pub(crate) fn panel_offset(avx512: bool, ty: GgmlType, l: &Layout, path: Path) -> i8 {
    if ty == GgmlType::Q6_K && path == Path::VecDot {
        32
    } else if avx512 && l.signed {
        -128
    } else {
        0
    }
}

/// Whether the panel kernels handle `path` for weights of this layout.
pub(crate) fn supports(path: Path, l: &Layout) -> bool {
    match path {
        Path::VecDot | Path::Tiled => true,
        Path::RepackGemm | Path::RepackGemv => {
            matches!((l.block, l.sub), (32, 32) | (256, 32) | (256, 16))
        }
        Path::TinyBlas => false,
    }
}

/// Runs the panel against tokens `tokens` of `x` along `path`, writing rows
/// `r0..r0 + p.nrows` (the instruction set's dispatch).
///
/// # Safety
/// The CPU must support `L`'s instruction set, and the caller must run under its target
/// features.
#[inline(always)]
pub(crate) unsafe fn gemm<L: Lanes>(
    p: &Panel,
    r0: usize,
    x: &QuantizedActs,
    tokens: Range<usize>,
    path: Path,
    out: &Out,
) {
    assert_eq!(p.pr, L::PR, "panel width");
    let l = p.layout;
    let k = Kernel {
        p,
        r0,
        x,
        tokens,
        out,
    };
    // Tokens per tile: as many as the registers hold.
    const V: usize = 3;
    const S: usize = 6;
    const Y: usize = 8;
    // SAFETY (all arms): forwarded.
    unsafe {
        match (path, l.block, l.sub, l.imin, l.fmin, l.signed) {
            (Path::VecDot, 32, 32, false, false, true) => k.vec::<L, V, false, true>(),
            (Path::VecDot, 32, 32, false, true, false) => k.vec::<L, V, true, false>(),
            (Path::VecDot, 256, ..) => match p.ty {
                GgmlType::Q2_K => k.vec256::<L, 2, 16, { Mins::Q2K as u8 }, false, false>(),
                GgmlType::Q3_K => k.vec256::<L, 2, 16, { Mins::None as u8 }, true, false>(),
                GgmlType::Q4_K => k.vec256::<L, 1, 32, { Mins::Q4K as u8 }, false, false>(),
                GgmlType::Q5_K => k.vec256::<L, 2, 32, { Mins::Q5K as u8 }, false, false>(),
                GgmlType::Q6_K => k.vec256::<L, 2, 16, { Mins::None as u8 }, false, true>(),
                GgmlType::IQ2_XXS => k.vec256::<L, 2, 32, { Mins::None as u8 }, true, false>(),
                ty => unreachable!("no vec_dot panel kernel for {ty}"),
            },
            (Path::Tiled, 256, 16, true, false, false) => {
                k.subs::<L, S, 16, 16, true, true, false, TILED>()
            }
            (Path::Tiled, 256, 32, true, false, false) => {
                k.subs::<L, S, 32, 8, true, true, false, TILED>()
            }
            (Path::Tiled, 256, 16, false, false, true) => {
                k.subs::<L, Y, 16, 16, true, false, true, TILED>()
            }
            (Path::Tiled, 256, 32, false, false, true) => {
                k.subs::<L, Y, 32, 8, true, false, true, TILED>()
            }
            // Repacked GEMM: Q4_0 per block, Q4_K per 64 values, Q2_K per 128 values.
            (Path::RepackGemm, 32, 32, false, false, true) => {
                k.subs::<L, Y, 32, 1, false, false, true, 1>()
            }
            (Path::RepackGemm, 256, 32, true, false, false) => {
                k.subs::<L, S, 32, 8, true, true, false, 2>()
            }
            (Path::RepackGemm, 256, 16, true, false, false) => {
                k.subs::<L, S, 16, 16, true, true, false, 8>()
            }
            // Repacked GEMV arithmetic on many tokens (`order::repack_group`): Q4_0 per
            // block as the GEMM, Q4_K and Q2_K per 256 values.
            (Path::RepackGemv, 32, 32, false, false, true) => {
                k.subs::<L, Y, 32, 1, false, false, true, 1>()
            }
            (Path::RepackGemv, 256, 32, true, false, false) => {
                k.subs::<L, S, 32, 8, true, true, false, 8>()
            }
            (Path::RepackGemv, 256, 16, true, false, false) => {
                k.subs::<L, S, 16, 16, true, true, false, 16>()
            }
            _ => unreachable!("no panel kernel for {path:?} and layout {l:?}"),
        }
    }
}

/// One panel product: the panel, its first row, the tokens and the output.
struct Kernel<'a> {
    p: &'a Panel,
    r0: usize,
    x: &'a QuantizedActs,
    tokens: Range<usize>,
    out: &'a Out<'a>,
}

impl Kernel<'_> {
    /// The activations of the tile of `NT` tokens from `t0` (the last tile repeats the
    /// last token; [`Kernel::write`] drops the extra results). Kernels loop over tiles
    /// themselves rather than through closures: a closure would not inherit the
    /// instruction set, and its intrinsics would not be inlined.
    #[inline(always)]
    fn acts<const NT: usize>(&self, t0: usize) -> [ActRow<'_>; NT] {
        let t_end = self.tokens.end;
        std::array::from_fn(|i| self.x.row((t0 + i).min(t_end - 1)))
    }

    /// Writes the results of the tile from `t0` (`pr` per token).
    #[inline(always)]
    fn write<const NT: usize>(&self, t0: usize, pr: usize, res: &[f32]) {
        for i in 0..NT.min(self.tokens.end - t0) {
            for lane in 0..self.p.nrows {
                // SAFETY: each thread owns its panels' rows.
                unsafe { self.out.set(t0 + i, self.r0 + lane, res[i * pr + lane]) };
            }
        }
    }

    /// Sub-block kernels (tiled, or the repacked GEMM or GEMV arithmetic with `GROUP`
    /// sub-blocks per float step).
    ///
    /// # Safety
    /// As [`gemm`].
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    unsafe fn subs<
        L: Lanes,
        const NT: usize,
        const SUB: usize,
        const NSUB: usize,
        const SUBSCALE: bool,
        const IMIN: bool,
        const SIGNED: bool,
        const GROUP: usize,
    >(
        &self,
    ) {
        let p = self.p;
        let block = SUB * NSUB;
        let final_scale = p.layout.final_scale;
        let pr = L::PR;
        assert!(p.vals.len() >= p.nblk * block * pr && p.d.len() >= p.nblk * pr);
        assert!(p.aux.len() >= p.nblk * pr);
        assert!(p.sub.len() >= p.nblk * NSUB * pr && p.min.len() >= p.nblk * NSUB * pr);
        assert!(NT * pr <= 16 * 8);
        let mut res = [0f32; 16 * 8];
        for t0 in self.tokens.clone().step_by(NT) {
            let acts = self.acts::<NT>(t0);
            for a in &acts {
                assert!(a.qs.len() >= p.nblk * block && a.d.len() >= p.nblk);
                assert!(
                    a.sum16.len() >= p.nblk * block / 16 && a.sum32.len() >= p.nblk * block / 32
                );
            }
            // SAFETY: every pointer below stays inside the slices whose lengths are
            // asserted above (block `b < nblk`, sub-block `j < NSUB`, group
            // `g < SUB/4`); the instruction set is the caller's.
            unsafe {
                let mut facc = [L::zero_f(); NT];
                let mut faccm = [L::zero_f(); NT];
                for b in 0..p.nblk {
                    let dv = L::load_f(p.d.as_ptr().add(b * pr));
                    let av = L::load_f(p.aux.as_ptr().add(b * pr));
                    let mut isum = [L::zero_i(); NT];
                    let mut msum = [L::zero_i(); NT];
                    for j in 0..NSUB {
                        let k0 = b * block + j * SUB;
                        let mut iacc = [L::zero_i(); NT];
                        for g in 0..SUB / 4 {
                            let w = L::prep(L::load_i(p.vals.as_ptr().add((k0 + 4 * g) * pr)));
                            for t in 0..NT {
                                let a4 = (acts[t].qs.as_ptr().add(k0 + 4 * g) as *const i32)
                                    .read_unaligned();
                                iacc[t] = L::dot(iacc[t], w, a4);
                            }
                        }
                        let sv = L::load_i(p.sub.as_ptr().add((b * NSUB + j) * pr) as *const i8);
                        let mv = L::load_i(p.min.as_ptr().add((b * NSUB + j) * pr) as *const i8);
                        for t in 0..NT {
                            let asum = if SUB == 16 {
                                *acts[t].sum16.get_unchecked(b * NSUB + j) as i32
                            } else {
                                *acts[t].sum32.get_unchecked(b * NSUB + j)
                            };
                            if SIGNED && L::FLIP {
                                iacc[t] = L::sub_i(iacc[t], L::set_i(asum.wrapping_mul(128)));
                            }
                            let s = if SUBSCALE {
                                L::mullo_i(iacc[t], sv)
                            } else {
                                iacc[t]
                            };
                            isum[t] = L::add_i(isum[t], s);
                            if IMIN {
                                msum[t] = L::add_i(msum[t], L::mullo_i(mv, L::set_i(asum)));
                            }
                        }
                        // Repacked GEMM: one float step per GROUP sub-blocks.
                        if GROUP != TILED && (j + 1) % GROUP == 0 {
                            for t in 0..NT {
                                let da = L::set_f(*acts[t].d.get_unchecked(b));
                                facc[t] = L::fma(L::cvt(isum[t]), L::mul_f(dv, da), facc[t]);
                                isum[t] = L::zero_i();
                                if IMIN {
                                    faccm[t] = L::fma(L::cvt(msum[t]), L::mul_f(av, da), faccm[t]);
                                    msum[t] = L::zero_i();
                                }
                            }
                        }
                    }
                    if GROUP == TILED {
                        let d0 = L::mul_f(dv, L::set_f(final_scale));
                        for t in 0..NT {
                            let da = L::set_f(*acts[t].d.get_unchecked(b));
                            let mut r = L::mul_f(L::cvt(isum[t]), d0);
                            if IMIN {
                                r = L::fnma(av, L::cvt(msum[t]), r);
                            }
                            facc[t] = L::fma(r, da, facc[t]);
                        }
                    }
                }
                for t in 0..NT {
                    L::store_f(res.as_mut_ptr().add(t * pr), L::sub_f(facc[t], faccm[t]));
                }
            }
            self.write::<NT>(t0, pr, &res);
        }
    }

    /// ggml's `vec_dot` of 32-blocks (Q4_0, Q5_0, Q8_0 signed; Q4_1, Q5_1 with `m`):
    /// eight f32 accumulators per (row, token), one per group of 4 values.
    ///
    /// # Safety
    /// As [`gemm`].
    #[inline(always)]
    unsafe fn vec<L: Lanes, const NT: usize, const FMIN: bool, const SIGNED: bool>(&self) {
        let p = self.p;
        let pr = L::PR;
        let per_token = self.x.cols() / 4;
        assert!(p.vals.len() >= p.nblk * 32 * pr && p.d.len() >= p.nblk * pr);
        assert!(p.aux.len() >= p.nblk * pr && per_token >= p.nblk * 8);
        assert!(NT * pr <= 16 * 8);
        let mut res = [0f32; 16 * 8];
        for t0 in self.tokens.clone().step_by(NT) {
            let acts = self.acts::<NT>(t0);
            for a in &acts {
                assert!(a.d.len() >= p.nblk && (!FMIN || a.s.len() >= p.nblk));
            }
            let a4: [*const i32; NT] = std::array::from_fn(|i| acts[i].qs.as_ptr() as *const i32);
            let c4: [&[i32]; NT] = std::array::from_fn(|i| acts[i].c4);
            // SAFETY: every pointer below stays inside the slices whose lengths are
            // asserted above (block `b < nblk`, group `g < 8`); the instruction set is
            // the caller's.
            unsafe {
                let mut acc = [[L::zero_f(); 8]; NT];
                let mut summs = [L::zero_f(); NT];
                for b in 0..p.nblk {
                    let dv = L::load_f(p.d.as_ptr().add(b * pr));
                    let mut dd = [L::zero_f(); NT];
                    for t in 0..NT {
                        dd[t] = L::mul_f(dv, L::set_f(*acts[t].d.get_unchecked(b)));
                    }
                    for g in 0..8 {
                        let w = L::prep(L::load_i(p.vals.as_ptr().add((32 * b + 4 * g) * pr)));
                        for t in 0..NT {
                            let k = 8 * b + g;
                            let lane = L::dot(
                                start::<L, SIGNED>(c4[t], k),
                                w,
                                a4[t].add(k).read_unaligned(),
                            );
                            acc[t][g] = L::fma(dd[t], L::cvt(lane), acc[t][g]);
                        }
                    }
                    if FMIN {
                        let av = L::load_f(p.aux.as_ptr().add(b * pr));
                        for t in 0..NT {
                            let sa = L::set_f(*acts[t].s.get_unchecked(b));
                            summs[t] = L::fma(av, sa, summs[t]);
                        }
                    }
                }
                for t in 0..NT {
                    let a = &acc[t];
                    let h = L::add_f(
                        L::add_f(L::add_f(a[0], a[4]), L::add_f(a[2], a[6])),
                        L::add_f(L::add_f(a[1], a[5]), L::add_f(a[3], a[7])),
                    );
                    let v = if FMIN { L::add_f(h, summs[t]) } else { h };
                    L::store_f(res.as_mut_ptr().add(t * pr), v);
                }
            }
            self.write::<NT>(t0, pr, &res);
        }
    }
}

impl Kernel<'_> {
    /// ggml's `vec_dot` of 256-blocks: per block and token, the eight integer lanes of
    /// `order` (sub-block sums weighted by their scales, per group of 4 values of every
    /// 32-value chunk), then eight f32 accumulators per (row, token) and the minimum
    /// terms of `MINS`. `SIGNED`: the values are signed; `Q6`: Q6_K, whose lanes ggml
    /// computes from `q = v + 32` (the panel holds `q`) with a correction.
    ///
    /// # Safety
    /// As [`gemm`].
    #[inline(always)]
    unsafe fn vec256<
        L: Lanes,
        const NT: usize,
        const SUB: usize,
        const MINS: u8,
        const SIGNED: bool,
        const Q6: bool,
    >(
        &self,
    ) {
        const NSUBMAX: usize = 16;
        let p = self.p;
        let pr = L::PR;
        let nsub = 256 / SUB;
        let per_token = self.x.cols() / 4;
        let (q2k, q4k, q5k) = (
            MINS == Mins::Q2K as u8,
            MINS == Mins::Q4K as u8,
            MINS == Mins::Q5K as u8,
        );
        assert!(p.vals.len() >= p.nblk * 256 * pr && p.d.len() >= p.nblk * pr);
        assert!(p.aux.len() >= p.nblk * pr && per_token >= p.nblk * 64);
        assert!(p.sub.len() >= p.nblk * nsub * pr && p.min.len() >= p.nblk * nsub * pr);
        assert!(NT * pr <= 16 * 8 && nsub <= NSUBMAX);
        let mut res = [0f32; 16 * 8];
        for t0 in self.tokens.clone().step_by(NT) {
            let acts = self.acts::<NT>(t0);
            for a in &acts {
                assert!(a.d.len() >= p.nblk);
                assert!(a.sum16.len() >= p.nblk * 16 && a.sum32.len() >= p.nblk * 8);
            }
            let a4: [*const i32; NT] = std::array::from_fn(|i| acts[i].qs.as_ptr() as *const i32);
            let c4: [&[i32]; NT] = std::array::from_fn(|i| acts[i].c4);
            // SAFETY: every pointer below stays inside the slices whose lengths are
            // asserted above (block `b < nblk`, chunk `c < 8`, group `g < 8`,
            // sub-block `< nsub`); the instruction set is the caller's.
            unsafe {
                let mut acc = [[L::zero_f(); 8]; NT];
                let mut accm = [[L::zero_f(); 4]; NT];
                let mut summs = [L::zero_f(); NT];
                for b in 0..p.nblk {
                    let dv = L::load_f(p.d.as_ptr().add(b * pr));
                    let av = L::load_f(p.aux.as_ptr().add(b * pr));
                    let sub = p.sub.as_ptr().add(b * nsub * pr);
                    let min = p.min.as_ptr().add(b * nsub * pr);
                    // Scales as i16 (high halves zero) for each sub-block.
                    let mut sc16 = [L::zero_i(); NSUBMAX];
                    for (j, o) in sc16.iter_mut().enumerate().take(nsub) {
                        *o = L::pack16(load32::<L>(sub, j, pr), L::zero_i());
                    }
                    // Q6_K: `-32·sc` pairs; Q2_K: minimum pairs (per lane l: sub-blocks
                    // 2l and 2l + 1).
                    let mut pairs = [L::zero_i(); 8];
                    if Q6 || q2k {
                        for (l, o) in pairs.iter_mut().enumerate() {
                            *o = if Q6 {
                                let m32 = L::set_i(-32);
                                L::pack16(
                                    L::mullo_i(load32::<L>(sub, 2 * l, pr), m32),
                                    L::mullo_i(load32::<L>(sub, 2 * l + 1, pr), m32),
                                )
                            } else {
                                L::pack16(
                                    load32::<L>(min, 2 * l, pr),
                                    load32::<L>(min, 2 * l + 1, pr),
                                )
                            };
                        }
                    }
                    for t in 0..NT {
                        let a = &acts[t];
                        let mut lanes = [L::zero_i(); 8];
                        for c in 0..8 {
                            for g in 0..8 {
                                let w = L::prep(L::load_i(
                                    p.vals.as_ptr().add((256 * b + 32 * c + 4 * g) * pr),
                                ));
                                let k = 64 * b + 8 * c + g;
                                let d = L::dot(
                                    start::<L, SIGNED>(c4[t], k),
                                    w,
                                    a4[t].add(k).read_unaligned(),
                                );
                                lanes[g] = L::madd16(lanes[g], d, sc16[(32 * c + 4 * g) / SUB]);
                            }
                        }
                        // Words of two i16 activation sums of 16, per lane l.
                        let bs = a.sum16.as_ptr().add(16 * b) as *const i32;
                        if Q6 {
                            for (l, o) in lanes.iter_mut().enumerate() {
                                *o = L::madd16(*o, pairs[l], L::set_i(bs.add(l).read_unaligned()));
                            }
                        }
                        let da = L::set_f(*a.d.get_unchecked(b));
                        let dd = L::mul_f(dv, da);
                        // -(dmin·da) exactly, signed zeros included.
                        let dm = L::sub_f(L::set_f(-0.0), L::mul_f(av, da));
                        for (l, o) in acc[t].iter_mut().enumerate() {
                            if q2k {
                                let m = L::madd16(
                                    L::zero_i(),
                                    pairs[l],
                                    L::set_i(bs.add(l).read_unaligned()),
                                );
                                *o = L::fma(dm, L::cvt(m), *o);
                            }
                            *o = L::fma(dd, L::cvt(lanes[l]), *o);
                        }
                        let s32 = a.sum32.as_ptr().add(8 * b);
                        if q4k {
                            for (k, o) in accm[t].iter_mut().enumerate() {
                                let m = L::add_i(
                                    L::mullo_i(
                                        load32::<L>(min, 2 * k, pr),
                                        L::set_i(*s32.add(2 * k)),
                                    ),
                                    L::mullo_i(
                                        load32::<L>(min, 2 * k + 1, pr),
                                        L::set_i(*s32.add(2 * k + 1)),
                                    ),
                                );
                                *o = L::fma(dm, L::cvt(m), *o);
                            }
                        }
                        if q5k {
                            let mut m = L::zero_i();
                            for j in 0..8 {
                                m = L::add_i(
                                    m,
                                    L::mullo_i(load32::<L>(min, j, pr), L::set_i(*s32.add(j))),
                                );
                            }
                            summs[t] = L::fma(dm, L::cvt(m), summs[t]);
                        }
                    }
                }
                let final_scale = L::set_f(p.layout.final_scale);
                for t in 0..NT {
                    let a = &acc[t];
                    let mut h = L::add_f(
                        L::add_f(L::add_f(a[0], a[4]), L::add_f(a[2], a[6])),
                        L::add_f(L::add_f(a[1], a[5]), L::add_f(a[3], a[7])),
                    );
                    if q4k {
                        let m = &accm[t];
                        h = L::add_f(h, L::add_f(L::add_f(m[0], m[2]), L::add_f(m[1], m[3])));
                    } else if q5k {
                        h = L::add_f(h, summs[t]);
                    } else {
                        h = L::mul_f(final_scale, h);
                    }
                    L::store_f(res.as_mut_ptr().add(t * pr), h);
                }
            }
            self.write::<NT>(t0, pr, &res);
        }
    }
}

/// The `j`-th vector of `pr` i32 lanes at `p`.
#[inline(always)]
unsafe fn load32<L: Lanes>(p: *const i32, j: usize, pr: usize) -> L::I {
    // SAFETY: the caller's vector is inside its slice; the instruction set is the
    // caller's.
    unsafe { L::load_i(p.add(j * pr) as *const i8) }
}

/// The start of a signed `vec_dot` lane for activation word `k` of a token (`c4`: its
/// `-128·Σ` words): what [`Lanes::dot`] over-counts with flipped weights, else zero.
#[inline(always)]
unsafe fn start<L: Lanes, const SIGNED: bool>(c4: &[i32], k: usize) -> L::I {
    // SAFETY: `k` is inside the token's words (callers' assertions); the instruction
    // set is the caller's.
    unsafe {
        if SIGNED && L::FLIP {
            L::set_i(*c4.get_unchecked(k))
        } else {
            L::zero_i()
        }
    }
}

/// [`gemm`] with AVX-512 VNNI.
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn gemm_avx512(
    p: &Panel,
    r0: usize,
    x: &QuantizedActs,
    tokens: Range<usize>,
    path: Path,
    out: &Out,
) {
    // SAFETY: features enabled above.
    unsafe { gemm::<Avx512>(p, r0, x, tokens, path, out) }
}

/// [`gemm`] with AVX2.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn gemm_avx2(
    p: &Panel,
    r0: usize,
    x: &QuantizedActs,
    tokens: Range<usize>,
    path: Path,
    out: &Out,
) {
    // SAFETY: features enabled above.
    unsafe { gemm::<Avx2>(p, r0, x, tokens, path, out) }
}
