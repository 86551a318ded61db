//! Q5_K: as Q4_K with a fifth bit per value.
//!
//! Layout (`block_q5_K`, 176 bytes): `d: f16`, `dmin: f16`, `scales[12]`, `qh[32]`,
//! `qs[128]`. Element `e`: low 4 bits as Q4_K (`qs` at offset 48), fifth bit = bit
//! `e/32` of `qh[e % 32]`. Value = `d·sc·q - dmin·m`. Dot product pairs with Q8_K.

use super::Unpacked;
use super::kquant_search::{Qkx2, scale_min_k4};
use super::q4_k::{search_sub_blocks, store_scales_and_requantize};
use crate::fp::rd_f16;

pub(crate) const BYTES: usize = 176;

/// The 5-bit value of element `e`.
#[inline]
pub(crate) fn value(b: &[u8], e: usize) -> u8 {
    let q = b[48 + 32 * (e / 64) + e % 32];
    let low = if e % 64 < 32 { q & 0x0f } else { q >> 4 };
    low | (((b[16 + e % 32] >> (e / 32)) & 1) << 4)
}

/// Dequantizes whole blocks (`dequantize_row_q5_K`).
pub(crate) fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(BYTES).zip(dst.chunks_exact_mut(256)) {
        let d = rd_f16(b, 0);
        let dmin = rd_f16(b, 2);
        for j in 0..8 {
            let (sc, m) = scale_min_k4(j, &b[4..16]);
            let d1 = d * sc as f32;
            let m1 = dmin * m as f32;
            for e in 32 * j..32 * j + 32 {
                y[e] = d1 * value(b, e) as f32 - m1;
            }
        }
    }
}

/// ggml's `quantize_row_q5_K_ref`.
pub(crate) fn quantize(src: &[f32], dst: &mut [u8]) {
    let p = Qkx2 {
        nmax: 31,
        rmin: -0.5,
        rdelta: 0.1,
        nstep: 15,
        use_mad: false,
    };
    for (x, b) in src.chunks_exact(256).zip(dst.chunks_exact_mut(BYTES)) {
        let mut l = [0u8; 256];
        let (scales, mins) = search_sub_blocks(x, &p, &mut l);
        store_scales_and_requantize(x, &scales, &mins, 31, b, &mut l);
        b[16..48].fill(0);
        for c in 0..4 {
            for k in 0..32 {
                let (mut l1, mut l2) = (l[64 * c + k], l[64 * c + k + 32]);
                if l1 > 15 {
                    l1 -= 16;
                    b[16 + k] |= 1 << (2 * c);
                }
                if l2 > 15 {
                    l2 -= 16;
                    b[16 + k] |= 2 << (2 * c);
                }
                b[48 + 32 * c + k] = l1 | (l2 << 4);
            }
        }
    }
}

/// Decodes a block: values `0..=31`, 6-bit sub-block scales and minimums, `d`, `dmin`.
pub(crate) fn unpack(b: &[u8], u: &mut Unpacked) {
    u.d = rd_f16(b, 0);
    u.aux = rd_f16(b, 2);
    for j in 0..8 {
        let (sc, m) = scale_min_k4(j, &b[4..16]);
        u.sub[j] = sc as i32;
        u.min[j] = m as i32;
    }
    for (e, v) in u.vals.iter_mut().enumerate() {
        *v = value(b, e) as i8;
    }
}
