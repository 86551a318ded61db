//! Plain float formats: F32, F16 (IEEE half) and BF16.
//!
//! Conversions follow ggml (`GGML_FP32_TO_FP16`: round to nearest even;
//! `ggml_compute_fp32_to_bf16`: nearest even, NaN made quiet). The dot product of a
//! weight row with the activations (which are rounded to the weight's type first, as
//! ggml's `vec_dot_type` does) is defined as a 16-lane striped sum: lane `k % 16`
//! accumulates `w[k]·x[k]` with fused multiply-adds in increasing `k`, then the lanes
//! are added pairwise (`l + 8`, then `l + 4`, `l + 2`, `l + 1`). Every kernel (scalar,
//! AVX2, AVX-512) computes exactly this, so results do not depend on the CPU.

use crate::GgmlType;
use crate::fp::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16, rd_u16};

/// Lanes of the striped float dot product.
pub(crate) const LANES: usize = 16;

/// Element `k` of a float row of type `ty` (F32, F16 or BF16), as f32.
#[inline]
pub(crate) fn load(ty: GgmlType, src: &[u8], k: usize) -> f32 {
    match ty {
        GgmlType::F16 => f16_to_f32(rd_u16(src, 2 * k)),
        GgmlType::BF16 => bf16_to_f32(rd_u16(src, 2 * k)),
        _ => f32::from_le_bytes([src[4 * k], src[4 * k + 1], src[4 * k + 2], src[4 * k + 3]]),
    }
}

/// Converts a float row to f32.
pub(crate) fn dequantize(ty: GgmlType, src: &[u8], dst: &mut [f32]) {
    for (k, y) in dst.iter_mut().enumerate() {
        *y = load(ty, src, k);
    }
}

/// Converts f32 to the float type's bytes.
pub(crate) fn quantize(ty: GgmlType, src: &[f32], dst: &mut [u8]) {
    match ty {
        GgmlType::F16 => {
            for (x, o) in src.iter().zip(dst.chunks_exact_mut(2)) {
                o.copy_from_slice(&f32_to_f16(*x).to_le_bytes());
            }
        }
        GgmlType::BF16 => {
            for (x, o) in src.iter().zip(dst.chunks_exact_mut(2)) {
                o.copy_from_slice(&f32_to_bf16(*x).to_le_bytes());
            }
        }
        _ => {
            for (x, o) in src.iter().zip(dst.chunks_exact_mut(4)) {
                o.copy_from_slice(&x.to_le_bytes());
            }
        }
    }
}

/// Rounds an activation to what the weight type's `vec_dot_type` can hold.
#[inline]
pub(crate) fn round_act(ty: GgmlType, x: f32) -> f32 {
    match ty {
        GgmlType::F16 => f16_to_f32(f32_to_f16(x)),
        GgmlType::BF16 => bf16_to_f32(f32_to_bf16(x)),
        _ => x,
    }
}

/// Adds the 16 lanes in the fixed order of the definition.
#[inline]
pub(crate) fn reduce_lanes(l: &[f32; LANES]) -> f32 {
    let mut s8 = [0f32; 8];
    for i in 0..8 {
        s8[i] = l[i] + l[i + 8];
    }
    let mut s4 = [0f32; 4];
    for i in 0..4 {
        s4[i] = s8[i] + s8[i + 4];
    }
    let s2 = [s4[0] + s4[2], s4[1] + s4[3]];
    s2[0] + s2[1]
}

/// Reference dot product of a float weight row with rounded f32 activations.
pub(crate) fn dot(ty: GgmlType, w: &[u8], x: &[f32]) -> f32 {
    let mut lanes = [0f32; LANES];
    for (k, &xk) in x.iter().enumerate() {
        lanes[k % LANES] = load(ty, w, k).mul_add(xk, lanes[k % LANES]);
    }
    reduce_lanes(&lanes)
}
