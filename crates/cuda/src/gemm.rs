//! Prefill matrix products on the tensor cores through cuBLAS: `out = x · wᵀ` with `w`
//! dequantized to bf16 (by `dequant_bf16`), `x` converted to bf16 and f32 accumulation.

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

impl Drop for Blas {
    fn drop(&mut self) {
        // SAFETY: our handle.
        let _ = unsafe { cb::cublasDestroy_v2(self.handle) };
    }
}
