//! Output types and the encoding of f32 tensors into them with `ds4-quant`'s reference
//! quantizers (ggml's `quantize_row_*_ref`, MXFP4 included; IQ2_XXS without an importance matrix weighs
//! the error by `x²`, i.e. by weight magnitude).

use ds4_gguf::GgmlType;
use rayon::prelude::*;

use crate::ConvertError;

/// A tensor type the converter writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum OutType {
    #[value(name = "f32")]
    F32,
    #[value(name = "bf16")]
    Bf16,
    #[value(name = "f16")]
    F16,
    #[value(name = "q8_0")]
    Q8_0,
    #[value(name = "q4_k")]
    Q4K,
    #[value(name = "q2_k")]
    Q2K,
    #[value(name = "iq2_xxs")]
    Iq2Xxs,
    /// MXFP4 (32-value blocks, an E8M0 scale): DeepSeek-V4's routed experts.
    #[value(name = "mxfp4")]
    Mxfp4,
}

impl OutType {
    /// The ggml type.
    pub fn ggml(self) -> GgmlType {
        match self {
            OutType::F32 => GgmlType::F32,
            OutType::Bf16 => GgmlType::BF16,
            OutType::F16 => GgmlType::F16,
            OutType::Q8_0 => GgmlType::Q8_0,
            OutType::Q4K => GgmlType::Q4_K,
            OutType::Q2K => GgmlType::Q2_K,
            OutType::Iq2Xxs => GgmlType::IQ2_XXS,
            OutType::Mxfp4 => GgmlType::MXFP4,
        }
    }

    /// Whether this is a block-quantized type.
    pub fn is_quantized(self) -> bool {
        !matches!(self, OutType::F32 | OutType::Bf16 | OutType::F16)
    }
}

/// The type a row of `cols` values can take when `want` is asked: `want` when `cols`
/// is a whole number of its blocks, else Q8_0 when `want` is a coarser block type and
/// `cols` is a multiple of 32, else F16 — what llama.cpp's converter writes when a row
/// cannot be quantized (`QuantError` → F16).
pub fn fit(want: GgmlType, cols: usize) -> GgmlType {
    if cols.is_multiple_of(want.block_size()) {
        want
    } else if want != GgmlType::Q8_0 && cols.is_multiple_of(GgmlType::Q8_0.block_size()) {
        GgmlType::Q8_0
    } else {
        GgmlType::F16
    }
}

/// Encodes `rows × cols` values (row-major) as `ty`, rows in parallel.
///
/// # Errors
/// [`ConvertError::Tensor`] when `ty` cannot be quantized or `cols` is not a whole
/// number of its blocks (use [`fit`] first).
pub fn encode(
    ty: GgmlType,
    cols: usize,
    data: &[f32],
    name: &str,
) -> Result<Vec<u8>, ConvertError> {
    let rb = ty.row_bytes(cols).ok_or_else(|| {
        ConvertError::Tensor(format!(
            "tensor '{name}': {cols} columns are not whole {ty} blocks"
        ))
    })?;
    let rows = data.len() / cols.max(1);
    let mut out = vec![0u8; rows * rb];
    out.par_chunks_mut(rb.max(1))
        .zip(data.par_chunks(cols.max(1)))
        .try_for_each(|(o, x)| {
            ds4_quant::quantize_row(ty, x, o)
                .map_err(|e| ConvertError::Tensor(format!("tensor '{name}': {e}")))
        })?;
    Ok(out)
}

/// Rounds values to bfloat16 (what loading a checkpoint as bf16 does to them).
pub fn round_bf16(v: &mut [f32]) {
    for x in v {
        *x = half::bf16::from_f32(*x).to_f32();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fallback_types() {
        assert_eq!(fit(GgmlType::Q4_K, 512), GgmlType::Q4_K);
        assert_eq!(fit(GgmlType::Q4_K, 64), GgmlType::Q8_0);
        assert_eq!(fit(GgmlType::Q8_0, 40), GgmlType::F16);
        assert_eq!(fit(GgmlType::Q4_K, 40), GgmlType::F16);
        assert_eq!(fit(GgmlType::BF16, 40), GgmlType::BF16);
    }

    #[test]
    fn f32_encoding_is_exact() {
        let x = [1.5f32, -2.25, 3.0];
        let b = encode(GgmlType::F32, 3, &x, "t").unwrap();
        assert_eq!(b.len(), 12);
        assert_eq!(f32::from_le_bytes([b[4], b[5], b[6], b[7]]), -2.25);
    }
}
