//! The CUDA backend of the engine (crate `ds4-cuda`).
//!
//! - [`CudaBackend`] implements [`ds4_engine::backend::Backend`] on one device: weights
//!   stay quantized in GPU memory (ggml blocks split into aligned field planes,
//!   [`layout`]); decode steps run fused quantized GEMV kernels (int8 `dp4a` dot
//!   products against the activation quantized on the fly, as ggml's CPU backend
//!   quantizes it), fused RMSNorm / bias / SwiGLU / residual epilogues, RoPE with the KV
//!   store, and split-K attention, captured once as a chain of CUDA graphs and replayed
//!   per token while the next one is recorded;
//!   prefill uses cuBLAS bf16 GEMMs on dequantized weights and a tensor-core
//!   flash-attention kernel.
//! - Kernels are `.cu` files under `kernels/`, compiled at run time by NVRTC for the
//!   device's architecture and cached on disk ([`compile`]).
//! - [`synth`]: synthetic models of real shapes (`llama3-8b:q4_k_m`, `glm53-flash:q2`
//!   …), as GGUF files or generated directly in GPU memory; works without CUDA.
//! - [`bench`]: the copy-bandwidth probe and the derived decode figures.
//! - [`parity`] and [`reference`]: CUDA-versus-CPU comparison against an f64 reference
//!   forward pass (docs/parity.md).
//!
//! - [`nccl`]: NCCL communicators for several GPUs of one host (`docs/multi_gpu.md`).
//!
//! CUDA libraries (NCCL included) are loaded dynamically: the crate builds and its
//! CPU-side tests run on machines without CUDA. [`gpu_available`] tells whether a device can be opened.

pub mod backend;
pub mod bench;
pub mod compile;
pub mod driver;
mod error;
mod gemm;
mod graph;
pub mod kernels;
pub mod layout;
pub mod lower;
mod moe_ops;
pub mod nccl;
pub mod ops;
pub mod parity;
mod pick;
pub mod probe;
pub mod reference;
pub mod synth;
pub mod weights;

use std::path::Path;
use std::sync::Arc;

pub use backend::{CudaBackend, PartTime, ProfileRow, Stats, by_part};
pub use error::{CudaError, Result};
pub use graph::Graph;

use ds4_engine::Model;
use ds4_gguf::GgufFile;

/// Whether a CUDA device can be used here: the driver loads and device 0 opens.
/// Returns the reason when not (for "skipped: …" messages).
pub fn gpu_available() -> std::result::Result<(), String> {
    if !driver::driver_present() {
        return Err("the CUDA driver library is not installed".into());
    }
    if !compile::nvrtc_present() {
        return Err(
            "libnvrtc is not on the library path (set LD_LIBRARY_PATH to CUDA's lib64)".into(),
        );
    }
    driver::Gpu::new(0).map(|_| ()).map_err(|e| e.to_string())
}

/// Loads the model in `file` (opened from `path`) on `backend`.
pub fn load_model(
    backend: Arc<CudaBackend>,
    file: &Arc<GgufFile>,
    path: &Path,
) -> ds4_engine::Result<Arc<dyn Model>> {
    ds4_engine::loader::load_model_with(backend, file, path)
}

/// A synthetic model built in GPU memory (see [`load_synthetic`]).
pub struct Synthetic {
    /// The header-only GGUF: metadata (vocabulary, hyperparameters) and tensor directory.
    pub file: Arc<GgufFile>,
    pub backend: Arc<CudaBackend>,
    pub model: Arc<dyn Model>,
}

/// A synthetic model (`SHAPE:QUANT` and a layer window, see [`synth`]) built directly in
/// GPU memory on device `ordinal`. The weights equal those `synth::write_gguf` writes for
/// the same spec.
pub fn load_synthetic(spec: &synth::Spec, ordinal: usize) -> Result<Synthetic> {
    let file = Arc::new(synth::header_file(spec)?);
    let backend = Arc::new(CudaBackend::synthetic(ordinal, spec.seed)?);
    let model = load_model(backend.clone(), &file, Path::new(&spec.name()))
        .map_err(|e| CudaError::Unsupported(format!("loading synthetic {}: {e}", spec.name())))?;
    Ok(Synthetic {
        file,
        backend,
        model,
    })
}
