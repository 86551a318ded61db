//! Prefill matrix products through cuBLAS: `out = x · wᵀ` on the tensor cores with `w`
//! dequantized to bf16 (by `dequant_bf16`), `x` converted to bf16 and f32 accumulation
//! ([`Blas::gemm_bf16`]); and f32 products ([`Sgemm`], the reference policies' float
//! weights and MLA's attention over many queries) in f32 arithmetic (no TF32).

use std::ffi::c_void;

use cudarc::cublas::sys as cb;

use crate::driver::{DPtr, Gpu};
use crate::error::{CudaError, Result};

/// A cuBLAS handle bound to the backend's stream.
pub struct Blas {
    handle: cb::cublasHandle_t,
}

// SAFETY: the handle is only used under the backend's state lock.
unsafe impl Send for Blas {}

fn check(r: cb::cublasStatus_t, call: &'static str) -> Result<()> {
    if r == cb::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(CudaError::Cublas {
            call,
            detail: format!("{r:?}"),
        })
    }
}

impl Blas {
    pub fn new(gpu: &Gpu) -> Result<Blas> {
        // SAFETY: only tries to open the library.
        if !unsafe { cb::is_culib_present() } {
            return Err(CudaError::MissingLibrary { lib: "libcublas" });
        }
        gpu.bind()?;
        let mut handle = std::ptr::null_mut();
        // SAFETY: out-pointer to a local; the stream is live for the backend's lifetime.
        unsafe {
            check(cb::cublasCreate_v2(&mut handle), "cublasCreate")?;
            check(
                cb::cublasSetStream_v2(handle, gpu.stream() as _),
                "cublasSetStream",
            )?;
        }
        Ok(Blas { handle })
    }

    /// `out[r][o] = Σ_i x[r][i] · w[o][i]` for `rows` × `n_out` outputs, `x` and `w`
    /// bf16 row-major, `out` f32 row-major.
    pub fn gemm_bf16(
        &self,
        w: DPtr,
        x: DPtr,
        out: DPtr,
        n_out: usize,
        n_in: usize,
        rows: usize,
    ) -> Result<()> {
        let (alpha, beta) = (1.0f32, 0.0f32);
        // Column-major view: outᵀ (n_out × rows) = wᵀᵀ · xᵀ, i.e. op(A) = Aᵀ with A = w
        // seen as n_in × n_out, B = x seen as n_in × rows.
        // SAFETY: the pointers hold the sizes described; the handle is live.
        unsafe {
            check(
                cb::cublasGemmEx(
                    self.handle,
                    cb::cublasOperation_t::CUBLAS_OP_T,
                    cb::cublasOperation_t::CUBLAS_OP_N,
                    n_out as i32,
                    rows as i32,
                    n_in as i32,
                    &alpha as *const f32 as *const c_void,
                    w as *const c_void,
                    cb::cudaDataType_t::CUDA_R_16BF,
                    n_in as i32,
                    x as *const c_void,
                    cb::cudaDataType_t::CUDA_R_16BF,
                    n_in as i32,
                    &beta as *const f32 as *const c_void,
                    out as *mut c_void,
                    cb::cudaDataType_t::CUDA_R_32F,
                    n_out as i32,
                    cb::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                    cb::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                ),
                "cublasGemmEx",
            )
        }
    }
}

/// A strided-batched f32 product in cuBLAS's column-major terms:
/// `C_b = op(A_b) · B_b` for `b < batch` with `op(A) = Aᵀ` when `trans_a`; `A_b` is
/// `m × k` after `op`, `B_b` `k × n`, `C_b` `m × n`; leading dimensions and batch strides
/// in elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sgemm {
    pub trans_a: bool,
    pub m: i32,
    pub n: i32,
    pub k: i32,
    pub a: DPtr,
    pub lda: i32,
    pub stride_a: i64,
    pub b: DPtr,
    pub ldb: i32,
    pub stride_b: i64,
    pub c: DPtr,
    pub ldc: i32,
    pub stride_c: i64,
    pub batch: i32,
}

impl Blas {
    /// Runs `g` (f32 compute, the handle's default math mode: no TF32).
    pub fn sgemm(&self, g: &Sgemm) -> Result<()> {
        let (alpha, beta) = (1.0f32, 0.0f32);
        let op_a = if g.trans_a {
            cb::cublasOperation_t::CUBLAS_OP_T
        } else {
            cb::cublasOperation_t::CUBLAS_OP_N
        };
        // SAFETY: the pointers hold the described matrices; the handle is live.
        unsafe {
            check(
                cb::cublasSgemmStridedBatched(
                    self.handle,
                    op_a,
                    cb::cublasOperation_t::CUBLAS_OP_N,
                    g.m,
                    g.n,
                    g.k,
                    &alpha,
                    g.a as *const f32,
                    g.lda,
                    g.stride_a,
                    g.b as *const f32,
                    g.ldb,
                    g.stride_b,
                    &beta,
                    g.c as *mut f32,
                    g.ldc,
                    g.stride_c,
                    g.batch,
                ),
                "cublasSgemmStridedBatched",
            )
        }
    }
}

impl Drop for Blas {
    fn drop(&mut self) {
        // SAFETY: our handle.
        let _ = unsafe { cb::cublasDestroy_v2(self.handle) };
    }
}
