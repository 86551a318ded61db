//! Block formats: layouts, dequantization, reference quantizers, and each weight
//! block decoded to integers ([`unpack`]) for the matrix products.
//!
//! The arithmetic of the products (which kernel ggml's CPU backend runs and its exact
//! f32 operations) is defined in `order`, from the integers of [`Unpacked`]; the float
//! formats' products are in [`float`]. Weight values pair with activations quantized to
//! the weight type's `vec_dot_type` (ggml's CPU pairing: Q8_0 for Q4_0/Q5_0/Q8_0, Q8_1
//! for Q4_1/Q5_1, Q8_K for the K-quants and IQ2_XXS, Q8_0 for MXFP4).

pub(crate) mod float;
pub(crate) mod iq2_grid;
pub(crate) mod iq2_xxs;
pub(crate) mod kquant_search;
pub(crate) mod mxfp4;
pub(crate) mod q2_k;
pub(crate) mod q3_k;
pub(crate) mod q4_0;
pub(crate) mod q4_1;
pub(crate) mod q4_k;
pub(crate) mod q5_0;
pub(crate) mod q5_1;
pub(crate) mod q5_k;
pub(crate) mod q6_k;
pub(crate) mod q8_0;
pub(crate) mod q8_1;
pub(crate) mod q8_k;

use crate::GgmlType;

/// How a weight type's dot product is structured, as the generic matrix kernels see it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Layout {
    /// Elements per scale block (32 or 256).
    pub block: usize,
    /// Elements per integer sub-block (16 or 32; `block` when there are no sub-scales).
    pub sub: usize,
    /// Integer sub-block scales multiply the sub-block sums.
    pub subscale: bool,
    /// Integer sub-block minimums: `msum = Σ min_j · A_j`, weighted by `-(aux·d_a)`.
    pub imin: bool,
    /// Float block minimum: `+ aux · s_a` (Q4_1, Q5_1 with Q8_1 activations).
    pub fmin: bool,
    /// Values can be negative (kernels that need unsigned bytes add 128 and correct).
    pub signed: bool,
    /// Factor applied to the accumulated result (1/8 for IQ2_XXS, else 1).
    pub final_scale: f32,
}

/// One weight block decoded to integers: `vals[..block]` signed values, per sub-block
/// scales and minimums, and the f32 block scale `d` and second scale `aux` (`dmin` or
/// `m`).
#[derive(Clone, Debug)]
pub(crate) struct Unpacked {
    pub vals: [i8; 256],
    pub sub: [i32; 16],
    pub min: [i32; 16],
    pub d: f32,
    pub aux: f32,
}

impl Default for Unpacked {
    fn default() -> Self {
        Unpacked {
            vals: [0; 256],
            sub: [1; 16],
            min: [0; 16],
            d: 0.0,
            aux: 0.0,
        }
    }
}

/// The [`Layout`] of a quantized weight type (`None` for float and activation types).
pub(crate) fn layout(ty: GgmlType) -> Option<Layout> {
    use GgmlType::*;
    let b32 = |signed, fmin| Layout {
        block: 32,
        sub: 32,
        subscale: false,
        imin: false,
        fmin,
        signed,
        final_scale: 1.0,
    };
    let k = |sub, imin, signed, final_scale| Layout {
        block: 256,
        sub,
        subscale: true,
        imin,
        fmin: false,
        signed,
        final_scale,
    };
    Some(match ty {
        Q4_0 | Q5_0 | Q8_0 | MXFP4 => b32(true, false),
        Q4_1 | Q5_1 => b32(false, true),
        Q2_K => k(16, true, false, 1.0),
        Q3_K => k(16, false, true, 1.0),
        Q4_K | Q5_K => k(32, true, false, 1.0),
        Q6_K => k(16, false, true, 1.0),
        IQ2_XXS => k(32, false, true, 0.125),
        _ => return None,
    })
}

/// Decodes one block of a quantized weight type (one with a [`layout`]).
pub(crate) fn unpack(ty: GgmlType, b: &[u8], u: &mut Unpacked) {
    use GgmlType::*;
    match ty {
        Q4_0 => q4_0::unpack(b, u),
        Q4_1 => q4_1::unpack(b, u),
        Q5_0 => q5_0::unpack(b, u),
        Q5_1 => q5_1::unpack(b, u),
        Q8_0 => q8_0::unpack(b, u),
        Q2_K => q2_k::unpack(b, u),
        Q3_K => q3_k::unpack(b, u),
        Q4_K => q4_k::unpack(b, u),
        Q5_K => q5_k::unpack(b, u),
        Q6_K => q6_k::unpack(b, u),
        IQ2_XXS => iq2_xxs::unpack(b, u),
        MXFP4 => mxfp4::unpack(b, u),
        _ => unreachable!("unpack called for {ty}, which has no integer layout"),
    }
}

/// Whether `dequantize` supports `ty`.
pub(crate) fn can_dequantize(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(
        ty,
        F32 | F16
            | BF16
            | Q4_0
            | Q4_1
            | Q5_0
            | Q5_1
            | Q8_0
            | Q8_1
            | Q2_K
            | Q3_K
            | Q4_K
            | Q5_K
            | Q6_K
            | Q8_K
            | IQ2_XXS
            | MXFP4
    )
}

/// Whether `quantize` supports `ty` (every dequantizable type).
pub(crate) fn can_quantize(ty: GgmlType) -> bool {
    can_dequantize(ty)
}

/// Whether `ty` can be a matrix-product weight type (everything but the activation-only
/// Q8_1 and Q8_K).
pub(crate) fn can_dot(ty: GgmlType) -> bool {
    can_dequantize(ty) && !matches!(ty, GgmlType::Q8_1 | GgmlType::Q8_K)
}

/// Dequantizes whole blocks; lengths are checked by the caller.
pub(crate) fn dequantize(ty: GgmlType, src: &[u8], dst: &mut [f32]) {
    use GgmlType::*;
    match ty {
        Q4_0 => q4_0::dequantize(src, dst),
        Q4_1 => q4_1::dequantize(src, dst),
        Q5_0 => q5_0::dequantize(src, dst),
        Q5_1 => q5_1::dequantize(src, dst),
        Q8_0 => q8_0::dequantize(src, dst),
        Q8_1 => q8_1::dequantize(src, dst),
        Q2_K => q2_k::dequantize(src, dst),
        Q3_K => q3_k::dequantize(src, dst),
        Q4_K => q4_k::dequantize(src, dst),
        Q5_K => q5_k::dequantize(src, dst),
        Q6_K => q6_k::dequantize(src, dst),
        Q8_K => q8_k::dequantize(src, dst),
        IQ2_XXS => iq2_xxs::dequantize(src, dst),
        MXFP4 => mxfp4::dequantize(src, dst),
        _ => float::dequantize(ty, src, dst),
    }
}

/// Quantizes whole blocks with the reference quantizer; lengths are checked by the
/// caller.
pub(crate) fn quantize(ty: GgmlType, src: &[f32], dst: &mut [u8]) {
    use GgmlType::*;
    match ty {
        Q4_0 => q4_0::quantize(src, dst),
        Q4_1 => q4_1::quantize(src, dst),
        Q5_0 => q5_0::quantize(src, dst),
        Q5_1 => q5_1::quantize(src, dst),
        Q8_0 => q8_0::quantize(src, dst),
        Q8_1 => q8_1::quantize(src, dst),
        Q2_K => q2_k::quantize(src, dst),
        Q3_K => q3_k::quantize(src, dst),
        Q4_K => q4_k::quantize(src, dst),
        Q5_K => q5_k::quantize(src, dst),
        Q6_K => q6_k::quantize(src, dst),
        Q8_K => q8_k::quantize(src, dst),
        IQ2_XXS => iq2_xxs::quantize(src, dst),
        MXFP4 => mxfp4::quantize(src, dst),
        _ => float::quantize(ty, src, dst),
    }
}
