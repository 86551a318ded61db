//! Each weight format as the SIMD kernels see it (256-bit, AVX2 level): how to read a
//! block's scales, decode 32 values into a vector, and dot a block with a token's int8
//! activations. The row kernels (`gemv_q`) and the panel filler (`panel_fill`) are
//! written once over this trait; the byte dot product is abstracted by [`Dot`] so the
//! same code runs with AVX-512 VNNI or plain AVX2.

use std::arch::x86_64::*;

use crate::acts::ActRow;
use crate::formats::iq2_grid::IQ2XXS_GRID;
use crate::formats::kquant_search::scale_min_k4;

/// Unsigned × signed byte dot product into 8 i32 lanes (4 products per lane).
pub(crate) trait Dot {
    /// Exact for any unsigned byte (`vpdpbusd`); otherwise pairs of products must fit
    /// in i16 (`u <= 128` with `|s| <= 127`).
    const WIDE: bool;
    /// `acc + Σ u·s` per group of 4 bytes.
    unsafe fn dot(acc: __m256i, u: __m256i, s: __m256i) -> __m256i;
}

/// AVX-512 VNNI (`vpdpbusd` on 256-bit vectors, AVX512VL).
pub(crate) struct Vnni;
/// AVX2 (`vpmaddubsw` then `vpmaddwd` with ones).
pub(crate) struct Madd;

impl Dot for Vnni {
    const WIDE: bool = true;
    #[inline(always)]
    unsafe fn dot(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        // SAFETY: callers run with AVX512VNNI and AVX512VL enabled.
        unsafe { _mm256_dpbusd_epi32(acc, u, s) }
    }
}

impl Dot for Madd {
    const WIDE: bool = false;
    #[inline(always)]
    unsafe fn dot(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        // SAFETY: callers run with AVX2 enabled.
        unsafe {
            _mm256_add_epi32(
                acc,
                _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)),
            )
        }
    }
}

/// The minimum (second-scale) term of a format, as ggml's `vec_dot` adds it.
#[derive(PartialEq, Eq)]
pub(crate) enum Mins {
    /// None.
    None,
    /// `summs = fma(m, s_a, summs)` (Q4_1, Q5_1 with Q8_1 activations).
    Float,
    /// Eight lanes `mn[2l]·bsum16[2l] + mn[2l+1]·bsum16[2l+1]`, added to the main lanes
    /// first (Q2_K).
    Q2K,
    /// Four lanes `mn[2k]·bsum32[2k] + mn[2k+1]·bsum32[2k+1]` of their own (Q4_K).
    Q4K,
    /// One scalar `Σ_j mn[j]·bsum32[j]` (Q5_K).
    Q5K,
}

/// A weight format as the SIMD kernels see it. All pointers point at a whole block.
pub(crate) trait RowFmt {
    /// Elements and bytes per scale block.
    const BLOCK: usize;
    const BYTES: usize;
    /// Elements per integer sub-block (K-quants; `BLOCK` otherwise).
    const SUB: usize;
    const MINS: Mins;
    /// Factor on the final result (IQ2_XXS: 1/8).
    const FINAL: f32;

    /// Offset of a 4-byte word inside the block holding `d` (high half if `D_HIGH`)
    /// and the second scale (`m`/`dmin`) in the other half, if the format has one.
    const SCALE_WORD: usize;
    const D_HIGH: bool;

    /// f16 bits of `d` and of the second scale (`m` or `dmin`; 0 if none).
    unsafe fn scales(w: *const u8) -> (u16, u16);

    /// Integer sub-block scales and minimums (K-quants; others keep the defaults).
    #[inline(always)]
    unsafe fn subs(_w: *const u8, _sub: &mut [i32; 16], _min: &mut [i32; 16]) {}

    /// The true (signed) values of elements `32c..32c + 32` of the block.
    unsafe fn vals32(w: *const u8, c: usize) -> __m256i;

    /// The eight integer lanes of ggml's `vec_dot` for this block with token `a` (lane
    /// `l` holds elements `32c + 4l..32c + 4l + 4` of every chunk `c`, weighted by their
    /// sub-block scales; see `order`). Their total is the block's integer sum `isum`.
    /// `b` is the block index in the row.
    #[inline(always)]
    unsafe fn block<D: Dot>(w: *const u8, a: &ActRow, b: usize) -> __m256i {
        // SAFETY: w points at a whole block, `b` is inside the activation row.
        unsafe {
            let mut sub = [1i32; 16];
            let mut min = [0i32; 16];
            Self::subs(w, &mut sub, &mut min);
            let mut isum = _mm256_setzero_si256();
            for c in 0..Self::BLOCK / 32 {
                let v = Self::vals32(w, c);
                let s = _mm256_sign_epi8(act32(a, Self::BLOCK * b + 32 * c), v);
                let d = D::dot(_mm256_setzero_si256(), _mm256_sign_epi8(v, v), s);
                isum = if Self::BLOCK == 32 {
                    d
                } else {
                    _mm256_add_epi32(isum, _mm256_mullo_epi32(d, sub_lanes::<Self>(&sub, c)))
                };
            }
            isum
        }
    }

    /// Lanes whose total is the block's `msum = Σ_j mn[j]·bsum[j]`, grouped as ggml's
    /// `vec_dot` needs them: Q2_K its eight lanes; Q4_K and Q5_K `mn[j]·bsum32[j]` in
    /// lane `j` (Q4_K's four lanes are the sums of lane pairs). Zero without minimums.
    #[inline(always)]
    unsafe fn mins(w: *const u8, a: &ActRow, b: usize) -> __m256i {
        // SAFETY: w points at a whole block, `b` is inside the activation row.
        unsafe {
            match Self::MINS {
                Mins::None | Mins::Float => _mm256_setzero_si256(),
                Mins::Q2K => {
                    let sc = _mm_loadu_si128(w as *const __m128i);
                    let mn = _mm256_cvtepu8_epi16(_mm_and_si128(
                        _mm_srli_epi16(sc, 4),
                        _mm_set1_epi8(0x0f),
                    ));
                    debug_assert!(a.sum16.len() >= 16 * b + 16);
                    let bs = _mm256_loadu_si256(a.sum16.as_ptr().add(16 * b) as *const __m256i);
                    _mm256_madd_epi16(mn, bs)
                }
                Mins::Q4K | Mins::Q5K => {
                    let mut sub = [0i32; 16];
                    let mut min = [0i32; 16];
                    Self::subs(w, &mut sub, &mut min);
                    debug_assert!(a.sum32.len() >= 8 * b + 8);
                    let bs = _mm256_loadu_si256(a.sum32.as_ptr().add(8 * b) as *const __m256i);
                    _mm256_mullo_epi32(_mm256_loadu_si256(min.as_ptr() as *const __m256i), bs)
                }
            }
        }
    }
}

/// The sub-block scale of each lane for 32-element chunk `c` of a 256-block: one scale
/// (sub-blocks of 32), or lanes 0–3 and 4–7 from two sub-blocks of 16.
#[inline(always)]
unsafe fn sub_lanes<F: RowFmt + ?Sized>(sub: &[i32; 16], c: usize) -> __m256i {
    // SAFETY: AVX2 enabled by every caller.
    unsafe {
        if F::SUB == 32 {
            _mm256_set1_epi32(sub[c])
        } else {
            let (sa, sb) = (sub[2 * c], sub[2 * c + 1]);
            _mm256_setr_epi32(sa, sa, sa, sa, sb, sb, sb, sb)
        }
    }
}

/// Unpacks 16 bytes of nibbles to 32 bytes: low nibbles first, then high nibbles.
#[inline(always)]
pub(crate) unsafe fn nibbles(p: *const u8) -> __m256i {
    // SAFETY: reads 16 bytes at p.
    unsafe {
        let q = _mm_loadu_si128(p as *const __m128i);
        let m = _mm_set1_epi8(0x0f);
        _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m), _mm_and_si128(q, m))
    }
}

/// Byte `i` is 0xff where bit `i` of the 32-bit word `x` is set, else 0.
#[inline(always)]
pub(crate) unsafe fn bit_mask(x: i32) -> __m256i {
    // SAFETY: AVX2 enabled by the callers.
    unsafe {
        let shuf = _mm256_set_epi64x(
            0x0303030303030303,
            0x0202020202020202,
            0x0101010101010101,
            0,
        );
        let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(x), shuf);
        let bit = _mm256_set1_epi64x(0x8040201008040201u64 as i64);
        _mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit)
    }
}

/// Byte `i` is 0x10 where bit `i` of the little-endian u32 at `p` is set.
#[inline(always)]
unsafe fn high_bits(p: *const u8) -> __m256i {
    // SAFETY: reads 4 bytes at p.
    unsafe {
        _mm256_and_si256(
            bit_mask((p as *const i32).read_unaligned()),
            _mm256_set1_epi8(0x10),
        )
    }
}

/// Bit `k` of each of the 32 bytes at `p`, as 0 or 1.
#[inline(always)]
unsafe fn bit_of_bytes(p: *const u8, k: usize) -> __m256i {
    // SAFETY: reads 32 bytes at p.
    unsafe {
        let v = _mm256_loadu_si256(p as *const __m256i);
        _mm256_and_si256(
            _mm256_srl_epi16(v, _mm_cvtsi32_si128(k as i32)),
            _mm256_set1_epi8(1),
        )
    }
}

/// Two bits `2k, 2k + 1` of each of the 32 bytes at `p`, as 0..=3.
#[inline(always)]
unsafe fn crumb_of_bytes(p: *const u8, k: usize) -> __m256i {
    // SAFETY: reads 32 bytes at p.
    unsafe {
        let v = _mm256_loadu_si256(p as *const __m256i);
        _mm256_and_si256(
            _mm256_srl_epi16(v, _mm_cvtsi32_si128(2 * k as i32)),
            _mm256_set1_epi8(3),
        )
    }
}

/// Nibble `hi` (0 low, 1 high) of each of the 32 bytes at `p`.
#[inline(always)]
unsafe fn nibble_of_bytes(p: *const u8, hi: bool) -> __m256i {
    // SAFETY: reads 32 bytes at p.
    unsafe {
        let v = _mm256_loadu_si256(p as *const __m256i);
        let v = if hi { _mm256_srli_epi16(v, 4) } else { v };
        _mm256_and_si256(v, _mm256_set1_epi8(0x0f))
    }
}

/// The token's 32 activation bytes at element `k`.
#[inline(always)]
pub(crate) unsafe fn act32(a: &ActRow, k: usize) -> __m256i {
    debug_assert!(k + 32 <= a.qs.len());
    // SAFETY: the kernels only ask for blocks inside the row (lengths checked by matmul).
    unsafe { _mm256_loadu_si256(a.qs.as_ptr().add(k) as *const __m256i) }
}

#[inline(always)]
unsafe fn f16_at(w: *const u8, off: usize) -> u16 {
    // SAFETY: the field is inside the block.
    unsafe { (w.add(off) as *const u16).read_unaligned() }
}

/// Weight formats (unit types implementing [`RowFmt`]).
pub(crate) struct Q4_0;
pub(crate) struct Q4_1;
pub(crate) struct Q5_0;
pub(crate) struct Q5_1;
pub(crate) struct Q8_0;
pub(crate) struct Q2K;
pub(crate) struct Q3K;
pub(crate) struct Q4K;
pub(crate) struct Q5K;
pub(crate) struct Q6K;
pub(crate) struct Iq2Xxs;

/// Lanes of a signed 32-block from its values stored plus `2^(7 - SHIFT)` (unsigned
/// `u`): `Σ u·a` started at `-2^(7 - SHIFT)·Σa` per lane (the token's `-128·Σ` words
/// shifted), which is exactly `Σ v·a`.
#[inline(always)]
unsafe fn biased_block32<D: Dot, const SHIFT: i32>(u: __m256i, a: &ActRow, b: usize) -> __m256i {
    debug_assert!(a.c4.len() >= 8 * b + 8);
    // SAFETY: the block's 8 words are inside the token's (matmul checks the lengths).
    unsafe {
        let c = _mm256_loadu_si256(a.c4.as_ptr().add(8 * b) as *const __m256i);
        D::dot(_mm256_srai_epi32::<SHIFT>(c), u, act32(a, 32 * b))
    }
}

/// 32-blocks with unsigned values (Q4_1, Q5_1): no sign trick needed.
macro_rules! block32_unsigned {
    () => {
        #[inline(always)]
        unsafe fn block<D: Dot>(w: *const u8, a: &ActRow, b: usize) -> __m256i {
            // SAFETY: forwarded (see the trait).
            unsafe { D::dot(_mm256_setzero_si256(), Self::vals32(w, 0), act32(a, 32 * b)) }
        }
    };
}

impl RowFmt for Q4_0 {
    const BLOCK: usize = 32;
    const BYTES: usize = 18;
    const SUB: usize = 32;
    const MINS: Mins = Mins::None;
    const FINAL: f32 = 1.0;
    const SCALE_WORD: usize = 0;
    const D_HIGH: bool = false;
    #[inline(always)]
    unsafe fn scales(w: *const u8) -> (u16, u16) {
        // SAFETY: see the trait.
        unsafe { (f16_at(w, 0), 0) }
    }
    #[inline(always)]
    unsafe fn vals32(w: *const u8, _c: usize) -> __m256i {
        // SAFETY: see the trait.
        unsafe { _mm256_sub_epi8(nibbles(w.add(2)), _mm256_set1_epi8(8)) }
    }
    /// The nibbles are `v + 8`.
    #[inline(always)]
    unsafe fn block<D: Dot>(w: *const u8, a: &ActRow, b: usize) -> __m256i {
        // SAFETY: see the trait.
        unsafe { biased_block32::<D, 4>(nibbles(w.add(2)), a, b) }
    }
}

impl RowFmt for Q4_1 {
    const BLOCK: usize = 32;
    const BYTES: usize = 20;
    const SUB: usize = 32;
    const MINS: Mins = Mins::Float;
    const FINAL: f32 = 1.0;
    const SCALE_WORD: usize = 0;
    const D_HIGH: bool = false;
    #[inline(always)]
    unsafe fn scales(w: *const u8) -> (u16, u16) {
        // SAFETY: see the trait.
        unsafe { (f16_at(w, 0), f16_at(w, 2)) }
    }
    #[inline(always)]
    unsafe fn vals32(w: *const u8, _c: usize) -> __m256i {
        // SAFETY: see the trait.
        unsafe { nibbles(w.add(4)) }
    }
    block32_unsigned!();
}

impl RowFmt for Q5_0 {
    const BLOCK: usize = 32;
    const BYTES: usize = 22;
    const SUB: usize = 32;
    const MINS: Mins = Mins::None;
    const FINAL: f32 = 1.0;
    const SCALE_WORD: usize = 0;
    const D_HIGH: bool = false;
    #[inline(always)]
    unsafe fn scales(w: *const u8) -> (u16, u16) {
        // SAFETY: see the trait.
        unsafe { (f16_at(w, 0), 0) }
    }
    #[inline(always)]
    unsafe fn vals32(w: *const u8, _c: usize) -> __m256i {
        // SAFETY: see the trait.
        unsafe {
            let u = _mm256_or_si256(nibbles(w.add(6)), high_bits(w.add(2)));
            _mm256_sub_epi8(u, _mm256_set1_epi8(16))
        }
    }
    /// The 5-bit values are `v + 16`.
    #[inline(always)]
    unsafe fn block<D: Dot>(w: *const u8, a: &ActRow, b: usize) -> __m256i {
        // SAFETY: see the trait.
        unsafe {
            let u = _mm256_or_si256(nibbles(w.add(6)), high_bits(w.add(2)));
            biased_block32::<D, 3>(u, a, b)
        }
    }
}

impl RowFmt for Q5_1 {
    const BLOCK: usize = 32;
    const BYTES: usize = 24;
    const SUB: usize = 32;
    const MINS: Mins = Mins::Float;
    const FINAL: f32 = 1.0;
    const SCALE_WORD: usize = 0;
    const D_HIGH: bool = false;
    #[inline(always)]
    unsafe fn scales(w: *const u8) -> (u16, u16) {
        // SAFETY: see the trait.
        unsafe { (f16_at(w, 0), f16_at(w, 2)) }
    }
    #[inline(always)]
    unsafe fn vals32(w: *const u8, _c: usize) -> __m256i {
        // SAFETY: see the trait.
        unsafe { _mm256_or_si256(nibbles(w.add(8)), high_bits(w.add(4))) }
    }
    block32_unsigned!();
}

impl RowFmt for Q8_0 {
    const BLOCK: usize = 32;
    const BYTES: usize = 34;
    const SUB: usize = 32;
    const MINS: Mins = Mins::None;
    const FINAL: f32 = 1.0;
    const SCALE_WORD: usize = 0;
    const D_HIGH: bool = false;
    #[inline(always)]
    unsafe fn scales(w: *const u8) -> (u16, u16) {
        // SAFETY: see the trait.
        unsafe { (f16_at(w, 0), 0) }
    }
    #[inline(always)]
    unsafe fn vals32(w: *const u8, _c: usize) -> __m256i {
        // SAFETY: see the trait.
        unsafe { _mm256_loadu_si256(w.add(2) as *const __m256i) }
    }
    /// `vpdpbusd` takes `v + 128`; `vpmaddubsw` would overflow, so it keeps the sign
    /// trick.
    #[inline(always)]
    unsafe fn block<D: Dot>(w: *const u8, a: &ActRow, b: usize) -> __m256i {
        // SAFETY: see the trait.
        unsafe {
            let v = Self::vals32(w, 0);
            if D::WIDE {
                biased_block32::<D, 0>(_mm256_xor_si256(v, _mm256_set1_epi8(-128)), a, b)
            } else {
                let s = _mm256_sign_epi8(act32(a, 32 * b), v);
                D::dot(_mm256_setzero_si256(), _mm256_sign_epi8(v, v), s)
            }
        }
    }
}

impl RowFmt for Q2K {
    const BLOCK: usize = 256;
    const BYTES: usize = 84;
    const SUB: usize = 16;
    const MINS: Mins = Mins::Q2K;
    const FINAL: f32 = 1.0;
    const SCALE_WORD: usize = 80;
    const D_HIGH: bool = false;
    #[inline(always)]
    unsafe fn scales(w: *const u8) -> (u16, u16) {
        // SAFETY: see the trait.
        unsafe { (f16_at(w, 80), f16_at(w, 82)) }
    }
    #[inline(always)]
    unsafe fn subs(w: *const u8, sub: &mut [i32; 16], min: &mut [i32; 16]) {
        for j in 0..16 {
            // SAFETY: scales are the first 16 bytes.
            let s = unsafe { *w.add(j) };
            sub[j] = (s & 0x0f) as i32;
            min[j] = (s >> 4) as i32;
        }
    }
    #[inline(always)]
    unsafe fn vals32(w: *const u8, c: usize) -> __m256i {
        // SAFETY: see the trait (qs at 16).
        unsafe { crumb_of_bytes(w.add(16 + 32 * (c / 4)), c % 4) }
    }
}

impl RowFmt for Q3K {
    const BLOCK: usize = 256;
    const BYTES: usize = 110;
    const SUB: usize = 16;
    const MINS: Mins = Mins::None;
    const FINAL: f32 = 1.0;
    const SCALE_WORD: usize = 106;
    const D_HIGH: bool = true;
    #[inline(always)]
    unsafe fn scales(w: *const u8) -> (u16, u16) {
        // SAFETY: see the trait.
        unsafe { (f16_at(w, 108), 0) }
    }
    #[inline(always)]
    unsafe fn subs(w: *const u8, sub: &mut [i32; 16], _min: &mut [i32; 16]) {
        // SAFETY: scales at bytes 96..108.
        let sc = unsafe { std::slice::from_raw_parts(w.add(96), 12) };
        for (s, o) in sub.iter_mut().enumerate() {
            let low = if s < 8 { sc[s] & 0x0f } else { sc[s - 8] >> 4 };
            let high = (sc[8 + s % 4] >> (2 * (s / 4))) & 3;
            *o = (low | (high << 4)) as i32 - 32;
        }
    }
    #[inline(always)]
    unsafe fn vals32(w: *const u8, c: usize) -> __m256i {
        // SAFETY: see the trait (hmask at 0, qs at 32).
        unsafe {
            let low = crumb_of_bytes(w.add(32 + 32 * (c / 4)), c % 4);
            let high = bit_of_bytes(w, c);
            // value = low - 4 where the high bit is clear.
            _mm256_sub_epi8(
                low,
                _mm256_slli_epi16(_mm256_xor_si256(high, _mm256_set1_epi8(1)), 2),
            )
        }
    }
}

/// Sub-block scales and minimums of Q4_K and Q5_K.
#[inline(always)]
unsafe fn k4_subs(w: *const u8, sub: &mut [i32; 16], min: &mut [i32; 16]) {
    // SAFETY: scales at bytes 4..16.
    let sc = unsafe { std::slice::from_raw_parts(w.add(4), 12) };
    for j in 0..8 {
        let (s, m) = scale_min_k4(j, sc);
        sub[j] = s as i32;
        min[j] = m as i32;
    }
}

impl RowFmt for Q4K {
    const BLOCK: usize = 256;
    const BYTES: usize = 144;
    const SUB: usize = 32;
    const MINS: Mins = Mins::Q4K;
    const FINAL: f32 = 1.0;
    const SCALE_WORD: usize = 0;
    const D_HIGH: bool = false;
    #[inline(always)]
    unsafe fn scales(w: *const u8) -> (u16, u16) {
        // SAFETY: see the trait.
        unsafe { (f16_at(w, 0), f16_at(w, 2)) }
    }
    #[inline(always)]
    unsafe fn subs(w: *const u8, sub: &mut [i32; 16], min: &mut [i32; 16]) {
        // SAFETY: forwarded.
        unsafe { k4_subs(w, sub, min) }
    }
    #[inline(always)]
    unsafe fn vals32(w: *const u8, c: usize) -> __m256i {
        // SAFETY: see the trait (qs at 16).
        unsafe { nibble_of_bytes(w.add(16 + 32 * (c / 2)), c % 2 == 1) }
    }
    #[inline(always)]
    unsafe fn block<D: Dot>(w: *const u8, a: &ActRow, b: usize) -> __m256i {
        // SAFETY: forwarded (see the trait).
        unsafe { unsigned_block::<Self, D>(w, a, b) }
    }
}

impl RowFmt for Q5K {
    const BLOCK: usize = 256;
    const BYTES: usize = 176;
    const SUB: usize = 32;
    const MINS: Mins = Mins::Q5K;
    const FINAL: f32 = 1.0;
    const SCALE_WORD: usize = 0;
    const D_HIGH: bool = false;
    #[inline(always)]
    unsafe fn scales(w: *const u8) -> (u16, u16) {
        // SAFETY: see the trait.
        unsafe { (f16_at(w, 0), f16_at(w, 2)) }
    }
    #[inline(always)]
    unsafe fn subs(w: *const u8, sub: &mut [i32; 16], min: &mut [i32; 16]) {
        // SAFETY: forwarded.
        unsafe { k4_subs(w, sub, min) }
    }
    #[inline(always)]
    unsafe fn vals32(w: *const u8, c: usize) -> __m256i {
        // SAFETY: see the trait (qh at 16, qs at 48).
        unsafe {
            let low = nibble_of_bytes(w.add(48 + 32 * (c / 2)), c % 2 == 1);
            _mm256_or_si256(low, _mm256_slli_epi16(bit_of_bytes(w.add(16), c), 4))
        }
    }
    #[inline(always)]
    unsafe fn block<D: Dot>(w: *const u8, a: &ActRow, b: usize) -> __m256i {
        // SAFETY: forwarded (see the trait).
        unsafe { unsigned_block::<Self, D>(w, a, b) }
    }
}

/// Lanes of a 256-block with unsigned values (`0..=63`, as `u`) times the activations,
/// weighted by the sub-block scales (Q4_K, Q5_K; Q6_K before its correction).
#[inline(always)]
unsafe fn unsigned_lanes<F: RowFmt, D: Dot>(
    w: *const u8,
    a: &ActRow,
    b: usize,
    u: impl Fn(usize) -> __m256i,
) -> __m256i {
    // SAFETY: w points at a whole block; activations in range.
    unsafe {
        let mut sub = [0i32; 16];
        let mut min = [0i32; 16];
        F::subs(w, &mut sub, &mut min);
        let mut isum = _mm256_setzero_si256();
        for c in 0..8 {
            let d = D::dot(_mm256_setzero_si256(), u(c), act32(a, 256 * b + 32 * c));
            isum = _mm256_add_epi32(isum, _mm256_mullo_epi32(d, sub_lanes::<F>(&sub, c)));
        }
        isum
    }
}

/// [`RowFmt::block`] of Q4_K and Q5_K (unsigned values, no sign trick).
#[inline(always)]
unsafe fn unsigned_block<F: RowFmt, D: Dot>(w: *const u8, a: &ActRow, b: usize) -> __m256i {
    // SAFETY: forwarded.
    unsafe { unsigned_lanes::<F, D>(w, a, b, |c| F::vals32(w, c)) }
}

impl RowFmt for Q6K {
    const BLOCK: usize = 256;
    const BYTES: usize = 210;
    const SUB: usize = 16;
    const MINS: Mins = Mins::None;
    const FINAL: f32 = 1.0;
    const SCALE_WORD: usize = 206;
    const D_HIGH: bool = true;
    #[inline(always)]
    unsafe fn scales(w: *const u8) -> (u16, u16) {
        // SAFETY: see the trait.
        unsafe { (f16_at(w, 208), 0) }
    }
    #[inline(always)]
    unsafe fn subs(w: *const u8, sub: &mut [i32; 16], _min: &mut [i32; 16]) {
        for (j, s) in sub.iter_mut().enumerate() {
            // SAFETY: scales at 192..208.
            *s = unsafe { *w.add(192 + j) } as i8 as i32;
        }
    }
    #[inline(always)]
    unsafe fn vals32(w: *const u8, c: usize) -> __m256i {
        // SAFETY: see the trait (ql at 0, qh at 128).
        unsafe {
            let (h, g) = (c / 4, c % 4);
            let low = nibble_of_bytes(w.add(64 * h + 32 * (g & 1)), g >= 2);
            let high = crumb_of_bytes(w.add(128 + 32 * h), g);
            _mm256_sub_epi8(
                _mm256_or_si256(low, _mm256_slli_epi16(high, 4)),
                _mm256_set1_epi8(32),
            )
        }
    }
    /// ggml's lanes: the unsigned values `q = v + 32`, then
    /// `32·(bsum16[2l]·sc[2l] + bsum16[2l+1]·sc[2l+1])` off lane `l`.
    #[inline(always)]
    unsafe fn block<D: Dot>(w: *const u8, a: &ActRow, b: usize) -> __m256i {
        // SAFETY: w points at a whole block; activations in range.
        unsafe {
            let lanes = unsigned_lanes::<Self, D>(w, a, b, |c| {
                _mm256_add_epi8(Self::vals32(w, c), _mm256_set1_epi8(32))
            });
            debug_assert!(a.sum16.len() >= 16 * b + 16);
            let bs = _mm256_loadu_si256(a.sum16.as_ptr().add(16 * b) as *const __m256i);
            let sc = _mm256_cvtepi8_epi16(_mm_loadu_si128(w.add(192) as *const __m128i));
            _mm256_sub_epi32(lanes, _mm256_slli_epi32(_mm256_madd_epi16(bs, sc), 5))
        }
    }
}

impl RowFmt for Iq2Xxs {
    const BLOCK: usize = 256;
    const BYTES: usize = 66;
    const SUB: usize = 32;
    const MINS: Mins = Mins::None;
    const FINAL: f32 = 0.125;
    const SCALE_WORD: usize = 0;
    const D_HIGH: bool = false;
    #[inline(always)]
    unsafe fn scales(w: *const u8) -> (u16, u16) {
        // SAFETY: see the trait.
        unsafe { (f16_at(w, 0), 0) }
    }
    #[inline(always)]
    unsafe fn subs(w: *const u8, sub: &mut [i32; 16], _min: &mut [i32; 16]) {
        for (ib, s) in sub.iter_mut().enumerate().take(8) {
            // SAFETY: the sign/scale word of group ib is at 2 + 8ib + 4.
            let aux1 = unsafe { (w.add(6 + 8 * ib) as *const u32).read_unaligned() };
            *s = 2 * (aux1 >> 28) as i32 + 1;
        }
    }
    #[inline(always)]
    unsafe fn vals32(w: *const u8, c: usize) -> __m256i {
        // SAFETY: see the trait; grid indices are bytes (< 256).
        unsafe {
            let aux0 = (w.add(2 + 8 * c) as *const u32).read_unaligned();
            let aux1 = (w.add(6 + 8 * c) as *const u32).read_unaligned();
            let g = |l: u32| *IQ2XXS_GRID.get_unchecked(((aux0 >> (8 * l)) & 0xff) as usize) as i64;
            let mag = _mm256_setr_epi64x(g(0), g(1), g(2), g(3));
            let mut signs = 0u32;
            for l in 0..4 {
                let s7 = (aux1 >> (7 * l)) & 127;
                signs |= (s7 | ((s7.count_ones() & 1) << 7)) << (8 * l);
            }
            let neg = bit_mask(signs as i32);
            // Negate where the sign bit is set: (m ^ neg) - neg.
            _mm256_sub_epi8(_mm256_xor_si256(mag, neg), neg)
        }
    }
}
