//! Typed views of tensor data: [`TensorElement`] maps a Rust element type to the ggml type
//! whose data is an array of it (little-endian, as GGUF stores it).
//!
//! Quantized types have no element type: read their bytes with
//! [`GgufFile::tensor_data`](crate::GgufFile::tensor_data) and decode blocks.

use crate::GgmlType;

mod sealed {
    pub trait Sealed {}
}

/// A plain element type that a tensor's bytes can be viewed as.
///
/// Views reinterpret the bytes in place, so they are only correct on little-endian hosts.
pub trait TensorElement: sealed::Sealed + bytemuck::Pod {
    /// The ggml type whose data is an array of `Self`.
    const DTYPE: GgmlType;
}

macro_rules! element {
    ($($t:ty => $dtype:ident),*) => {$(
        impl sealed::Sealed for $t {}
        impl TensorElement for $t {
            const DTYPE: GgmlType = GgmlType::$dtype;
        }
    )*};
}
element!(
    f32 => F32,
    f64 => F64,
    i8 => I8,
    i16 => I16,
    i32 => I32,
    i64 => I64,
    half::f16 => F16,
    half::bf16 => BF16
);
