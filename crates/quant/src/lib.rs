//! ggml block formats on the CPU: dequantize, quantize, and matrix products with
//! quantized activations.
//!
//! ggml (`ggml-common.h`, `ggml-quants.c`, `ggml-cpu/quants.c`) is the specification
//! of every format here. Supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
//! Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ2_XXS, MXFP4 as weights; Q8_0, Q8_1 and Q8_K as
//! activations (they also dequantize and quantize).
//!
//! # Matrix products
//!
//! ```
//! use ds4_quant::{GgmlType, QMatrix, QuantizedActs, matmul, quantize_row, vec_dot_type};
//! let (rows, cols, n_tokens) = (4, 64, 2);
//! let mut w = vec![0u8; rows * GgmlType::Q4_1.row_bytes(cols).unwrap()];
//! let x: Vec<f32> = (0..rows * cols).map(|i| (i % 7) as f32 - 3.0).collect();
//! quantize_row(GgmlType::Q4_1, &x, &mut w).unwrap();
//! let w = QMatrix::new(GgmlType::Q4_1, rows, cols, &w).unwrap();
//! let acts = QuantizedActs::new(vec_dot_type(w.ty), &x[..n_tokens * cols], n_tokens, cols);
//! let mut out = vec![0f32; n_tokens * rows]; // out[t * rows + r]
//! matmul(&w, &acts, &mut out);
//! ```
//!
//! As ggml's CPU backend does, the activations are quantized once per input to the
//! weight type's [`vec_dot_type`] (Q8_0, Q8_1 or Q8_K with ggml's x86 rounding; F16 or
//! BF16 for those float weights; F32 for F32) and the dot products are computed in
//! that form.
//!
//! # Exactly llama.cpp's arithmetic
//!
//! Every product gives the bits llama.cpp's CPU backend gives (x86 build with AVX-512,
//! llama.cpp 0c1e570, ggml's tiled K-quant kernels off as in the llama.cpp that recorded
//! this project's fixtures; `DS4_GGML_TILED=1` turns them on). ggml's result depends on
//! the kernel it picks: the type's `vec_dot` (eight f32 lanes per output), llamafile's
//! tinyBLAS for float weights, or the kernels of weights it repacks at load (Q4_0, Q4_K,
//! Q2_K, MXFP4 with a multiple of 8 rows: a GEMM for groups of 4 tokens, a GEMV for the rest).
//! Which one runs depends on the weight type, on [`Layout`] and on the number of tokens
//! in the product, so a prompt gives llama.cpp's results when it is split into products
//! as llama.cpp splits it (one product per batch of at most 512 tokens, then one per
//! generated token). The definitions, operation for operation, are in the private
//! module `order`; every kernel (scalar, AVX2, AVX-512) computes exactly them, so
//! results are the same whatever the CPU, the thread count or the row range.
//!
//! Kernels: few tokens (decode) stream the weight rows once (8 rows at a time, the next
//! 8 prefetched); from 4 tokens on (prefill) rows are decoded in panels of 16 (AVX-512)
//! or 8 (AVX2) int8 rows reused for every token (`vpdpbusd`/`vpmaddubsw` with
//! activations broadcast, no horizontal sums). The instruction set is detected at run
//! time ([`isa`]; `DS4_QUANT_ISA=avx2|scalar` forces a lower one).
//!
//! # Threads
//!
//! [`matmul`] splits rows across rayon's current pool (the global pool, or the pool of
//! an enclosing `ThreadPool::install`). For decode, where one product takes tens of
//! microseconds, call it from inside the pool (run the whole step in `install`) so the
//! calling thread works instead of sleeping; small products stay on the calling thread.
//! [`matmul_single_thread`] never leaves the calling thread.

// Format and kernel code indexes several arrays by the same element or block index,
// written as ggml's definitions are; iterator chains would hide that correspondence.
#![allow(clippy::needless_range_loop)]

mod acts;
mod error;
mod formats;
mod fp;
mod kernels;
mod matmul;
mod order;

pub use acts::QuantizedActs;
pub use ds4_gguf::GgmlType;
pub use error::QuantError;
pub use kernels::{Isa, isa};
pub use matmul::{
    Layout, matmul, matmul_as, matmul_rows, matmul_rows_as, matmul_single_thread, try_matmul,
    try_matmul_per_token,
};

/// Whether `ty` is supported as a matrix-product weight type (dequantize, quantize and
/// [`matmul`]).
pub fn is_supported(ty: GgmlType) -> bool {
    formats::can_dot(ty)
}

/// Dequantizes `dst.len()` elements from `src` (whole blocks of `ty`).
///
/// Bit-exact with ggml's `dequantize_row_*` (and the `gguf` Python package).
///
/// # Errors
/// [`QuantError::Unsupported`] for types other than the weight types and Q8_0/Q8_1/Q8_K;
/// [`QuantError::BadLength`] if `dst.len()` is not a multiple of the block size;
/// [`QuantError::ShapeMismatch`] if `src` is not exactly the bytes of `dst.len()`
/// elements.
pub fn dequantize_row(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    if !formats::can_dequantize(ty) {
        return Err(QuantError::Unsupported(ty));
    }
    let bytes = row_bytes_checked(ty, dst.len())?;
    if src.len() != bytes {
        return Err(QuantError::ShapeMismatch {
            what: "quantized row bytes",
            expected: bytes,
            got: src.len(),
        });
    }
    formats::dequantize(ty, src, dst);
    Ok(())
}

/// Quantizes `src` into `dst` with ggml's reference quantizer for `ty`
/// (`quantize_row_*_ref`: no importance matrix), bit-exact with ggml for every type but
/// IQ2_XXS, which ggml only quantizes with an importance matrix: ours weighs the error
/// by `x²` instead (valid blocks, not ggml's bytes).
///
/// # Errors
/// As [`dequantize_row`], with `dst` the output bytes.
pub fn quantize_row(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<(), QuantError> {
    if !formats::can_quantize(ty) {
        return Err(QuantError::Unsupported(ty));
    }
    let bytes = row_bytes_checked(ty, src.len())?;
    if dst.len() != bytes {
        return Err(QuantError::ShapeMismatch {
            what: "quantized row bytes",
            expected: bytes,
            got: dst.len(),
        });
    }
    formats::quantize(ty, src, dst);
    Ok(())
}

/// The activation format ggml's CPU backend pairs with weights of type `ty`
/// (`type_traits_cpu[ty].vec_dot_type` in `ggml-cpu.c`): Q8_0 for Q4_0, Q5_0, Q8_0 and
/// MXFP4;
/// Q8_1 for Q4_1 and Q5_1; Q8_K for the K-quants and IQ2_XXS; the type itself for F32,
/// F16 and BF16. Other types (which this crate cannot multiply) map to themselves.
pub fn vec_dot_type(ty: GgmlType) -> GgmlType {
    use GgmlType::*;
    match ty {
        Q4_0 | Q5_0 | Q8_0 | MXFP4 => Q8_0,
        Q4_1 | Q5_1 => Q8_1,
        Q2_K | Q3_K | Q4_K | Q5_K | Q6_K | IQ2_XXS => Q8_K,
        other => other,
    }
}

/// Bytes of `n` elements of `ty`, or `BadLength`.
fn row_bytes_checked(ty: GgmlType, n: usize) -> Result<usize, QuantError> {
    ty.row_bytes(n).ok_or(QuantError::BadLength {
        ty,
        len: n,
        block: ty.block_size(),
    })
}

/// A row-major quantized matrix: `rows` rows of `cols` elements each, every row
/// `ty.row_bytes(cols)` bytes.
#[derive(Clone, Copy, Debug)]
pub struct QMatrix<'a> {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub data: &'a [u8],
}

impl<'a> QMatrix<'a> {
    /// A checked matrix view.
    ///
    /// # Errors
    /// [`QuantError::Unsupported`] if `ty` is not a weight type of this crate;
    /// [`QuantError::BadLength`] if `cols` is not a whole number of blocks;
    /// [`QuantError::ShapeMismatch`] if `data` is not exactly `rows` rows.
    pub fn new(ty: GgmlType, rows: usize, cols: usize, data: &'a [u8]) -> Result<Self, QuantError> {
        let m = QMatrix {
            ty,
            rows,
            cols,
            data,
        };
        m.validate()?;
        Ok(m)
    }

    /// Bytes of one row.
    pub fn row_bytes(&self) -> usize {
        self.ty.row_bytes(self.cols).unwrap_or(0)
    }

    /// The bytes of row `r`.
    ///
    /// # Panics
    /// If `r >= rows` or the matrix is malformed (see [`QMatrix::new`]).
    pub fn row(&self, r: usize) -> &'a [u8] {
        let rb = self.row_bytes();
        &self.data[r * rb..(r + 1) * rb]
    }

    /// Checks type, block alignment and data length.
    fn validate(&self) -> Result<(), QuantError> {
        if !formats::can_dot(self.ty) {
            return Err(QuantError::Unsupported(self.ty));
        }
        let rb = row_bytes_checked(self.ty, self.cols)?;
        if self.data.len() != rb * self.rows {
            return Err(QuantError::ShapeMismatch {
                what: "matrix data bytes",
                expected: rb * self.rows,
                got: self.data.len(),
            });
        }
        Ok(())
    }
}

/// ggml's `vec_dot` of one weight row (`w_row`: the bytes of `x.cols()` elements of
/// `ty`) with token `t` of `x`, bit for bit (what [`matmul`] gives for one token and
/// weights that are not repacked).
///
/// # Errors
/// [`QuantError::Unsupported`], [`QuantError::ActivationMismatch`] if `x` was quantized
/// for another weight type, [`QuantError::ShapeMismatch`] if `w_row` has the wrong size
/// or `t` is out of range.
pub fn vec_dot(ty: GgmlType, w_row: &[u8], x: &QuantizedActs, t: usize) -> Result<f32, QuantError> {
    let w = QMatrix::new(ty, 1, x.cols(), w_row)?;
    matmul::check_acts(&w, x)?;
    if t >= x.n_tokens() {
        return Err(QuantError::ShapeMismatch {
            what: "token index",
            expected: x.n_tokens(),
            got: t,
        });
    }
    Ok(kernels::dot_one(kernels::isa(), ty, w_row, x, t))
}
