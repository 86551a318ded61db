//! ggml block formats on the CPU.
//!
//! ggml (`ggml-common.h`, `ggml-quants.c`) is the specification of every format here.
//!
//! API CONTRACT (stub written by the lead; the quant helper implements it and may extend
//! it, but keeps these names and signatures):
//! - `dequantize_row`, `quantize_row`, `vec_dot_type`, `QMatrix`, `QuantizedActs`, `matmul`.
//!
//! Matrix products follow ggml's CPU arithmetic: the activations are quantized per
//! block to the weight type's `vec_dot_type` (Q8_0, Q8_1 or Q8_K; F16 for F16 weights,
//! F32 for F32) and the dot products are done in that form, so results match llama.cpp's
//! CPU backend closely.

pub use ds4_gguf::GgmlType;

/// Errors: unsupported types and mismatched lengths.
#[derive(Debug, thiserror::Error)]
pub enum QuantError {
    #[error("tensor type {0} is not supported")]
    Unsupported(GgmlType),
    #[error("length {len} is not a multiple of the {ty} block size {block}")]
    BadLength { ty: GgmlType, len: usize, block: usize },
}

/// Dequantizes `dst.len()` elements from `src` (whole blocks of `ty`).
pub fn dequantize_row(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    let _ = (ty, src, dst);
    todo!()
}

/// Quantizes `src` into `dst` with ggml's reference quantizer for `ty` (`quantize_row_*_ref`).
pub fn quantize_row(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<(), QuantError> {
    let _ = (ty, src, dst);
    todo!()
}

/// The activation format ggml's CPU backend pairs with weights of type `ty`.
pub fn vec_dot_type(ty: GgmlType) -> GgmlType {
    let _ = ty;
    todo!()
}

/// A row-major quantized matrix: `rows` rows of `cols` elements each.
#[derive(Clone, Copy)]
pub struct QMatrix<'a> {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub data: &'a [u8],
}

/// Activations (`n_tokens` rows of `cols` f32) quantized once to a weight type's
/// `vec_dot_type`, so several matrices with the same input reuse them.
pub struct QuantizedActs {
    _private: (),
}

impl QuantizedActs {
    pub fn new(dot_ty: GgmlType, x: &[f32], n_tokens: usize, cols: usize) -> Self {
        let _ = (dot_ty, x, n_tokens, cols);
        todo!()
    }
}

/// `out[t * w.rows + r] = dot(w.row(r), x.row(t))` for every token `t` and row `r`,
/// multi-threaded with rayon.
pub fn matmul(w: &QMatrix, x: &QuantizedActs, out: &mut [f32]) {
    let _ = (w, x, out);
    todo!()
}
