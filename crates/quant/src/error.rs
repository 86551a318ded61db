//! Errors of this crate.

use crate::GgmlType;

/// Errors: unsupported types and mismatched lengths.
#[derive(Debug, thiserror::Error)]
pub enum QuantError {
    /// The operation does not support this tensor type.
    #[error("tensor type {0} is not supported")]
    Unsupported(GgmlType),
    /// A length is not a whole number of blocks.
    #[error("length {len} is not a multiple of the {ty} block size {block}")]
    BadLength {
        ty: GgmlType,
        len: usize,
        block: usize,
    },
    /// Two buffers that must correspond have inconsistent sizes.
    #[error("{what}: expected {expected} elements or bytes, got {got}")]
    ShapeMismatch {
        what: &'static str,
        expected: usize,
        got: usize,
    },
    /// `QuantizedActs` needs an activation type (F32, F16, BF16, Q8_0, Q8_1, Q8_K).
    #[error("{0} is not an activation type (use vec_dot_type of the weight type)")]
    NotActivationType(GgmlType),
    /// The activations were quantized for a different weight type.
    #[error("weights of type {weights} need {expected} activations, got {got}")]
    ActivationMismatch {
        weights: GgmlType,
        expected: GgmlType,
        got: GgmlType,
    },
}
