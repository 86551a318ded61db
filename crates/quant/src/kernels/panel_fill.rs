//! SIMD panel filling: decodes each row's blocks with the format's [`RowFmt`] (AVX2)
//! and scatters them into the panel's interleaved layout. Same result as
//! [`Panel::fill`], faster by an order of magnitude.

use std::arch::x86_64::*;

use crate::QMatrix;

use super::panel::Panel;
use super::rowfmt::{self as f, RowFmt};

/// Fills `p` with rows `r0..r0 + nrows` of `w` if `w.ty` has a [`RowFmt`]; returns
/// false otherwise.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
pub(crate) unsafe fn fill(p: &mut Panel, w: &QMatrix, r0: usize, nrows: usize) -> bool {
    use crate::GgmlType as T;
    // SAFETY (all arms): the caller guarantees the instruction set.
    unsafe {
        match w.ty {
            T::Q4_0 => fill_rows::<f::Q4_0>(p, w, r0, nrows),
            T::Q4_1 => fill_rows::<f::Q4_1>(p, w, r0, nrows),
            T::Q5_0 => fill_rows::<f::Q5_0>(p, w, r0, nrows),
            T::Q5_1 => fill_rows::<f::Q5_1>(p, w, r0, nrows),
            T::Q8_0 => fill_rows::<f::Q8_0>(p, w, r0, nrows),
            T::Q2_K => fill_rows::<f::Q2K>(p, w, r0, nrows),
            T::Q3_K => fill_rows::<f::Q3K>(p, w, r0, nrows),
            T::Q4_K => fill_rows::<f::Q4K>(p, w, r0, nrows),
            T::Q5_K => fill_rows::<f::Q5K>(p, w, r0, nrows),
            T::Q6_K => fill_rows::<f::Q6K>(p, w, r0, nrows),
            T::IQ2_XXS => fill_rows::<f::Iq2Xxs>(p, w, r0, nrows),
            _ => return false,
        }
    }
    true
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn fill_rows<F: RowFmt>(p: &mut Panel, w: &QMatrix, r0: usize, nrows: usize) {
    p.prepare(w, nrows);
    let (pr, nblk, nsub) = (p.pr, p.nblk, p.nsub());
    let groups = F::BLOCK / 4;
    assert!(p.vals.len() >= nblk * F::BLOCK * pr && p.sub.len() >= nblk * nsub * pr && nrows <= pr);
    for lane in 0..nrows {
        let row = w.row(r0 + lane);
        assert!(row.len() >= nblk * F::BYTES);
        for b in 0..nblk {
            // SAFETY: the block is inside the row and every panel index below is inside
            // the lengths asserted above.
            unsafe {
                let blk = row.as_ptr().add(b * F::BYTES);
                let (dh, ah) = F::scales(blk);
                let dv = _mm_cvtph_ps(_mm_setr_epi16(dh as i16, ah as i16, 0, 0, 0, 0, 0, 0));
                let mut da = [0f32; 4];
                _mm_storeu_ps(da.as_mut_ptr(), dv);
                *p.d.get_unchecked_mut(b * pr + lane) = da[0];
                *p.aux.get_unchecked_mut(b * pr + lane) = da[1];
                let mut sub = [1i32; 16];
                let mut min = [0i32; 16];
                F::subs(blk, &mut sub, &mut min);
                for j in 0..nsub {
                    *p.sub.get_unchecked_mut((b * nsub + j) * pr + lane) = sub[j];
                    *p.min.get_unchecked_mut((b * nsub + j) * pr + lane) = min[j];
                }
                for c in 0..F::BLOCK / 32 {
                    let mut tmp = [0u32; 8];
                    let v = _mm256_add_epi8(F::vals32(blk, c), _mm256_set1_epi8(p.offset));
                    _mm256_storeu_si256(tmp.as_mut_ptr() as *mut __m256i, v);
                    for (g, &v) in tmp.iter().enumerate() {
                        let o = ((b * groups + 8 * c + g) * pr + lane) * 4;
                        (p.vals.as_mut_ptr().add(o) as *mut u32).write_unaligned(v);
                    }
                }
            }
        }
    }
}
