//! Errors of the CUDA backend: a missing driver or library, a failed driver call, a
//! kernel that does not compile, and inputs this backend cannot run.

/// Errors from the CUDA backend.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// No usable GPU: the driver library is absent, no device is present, or the device
    /// is older than this backend needs.
    #[error("no usable CUDA device: {0}")]
    NoDevice(String),
    /// A CUDA library (`libnvrtc`, `libcublas`) could not be loaded.
    #[error(
        "the CUDA library {lib} could not be loaded (set LD_LIBRARY_PATH to the CUDA lib64 folder)"
    )]
    MissingLibrary { lib: &'static str },
    /// NCCL could not be loaded (multi-GPU runs need it): what was tried and how to
    /// install it.
    #[error("NCCL could not be loaded: {0}")]
    NcclMissing(String),
    /// An NCCL call failed.
    #[error("NCCL call {call} failed: {detail}")]
    Nccl { call: &'static str, detail: String },
    /// A driver call failed.
    #[error("CUDA driver call {call} failed: {detail}")]
    Driver { call: &'static str, detail: String },
    /// A cuBLAS call failed.
    #[error("cuBLAS call {call} failed: {detail}")]
    Cublas { call: &'static str, detail: String },
    /// NVRTC rejected a kernel source.
    #[error("kernel source {file} failed to compile for {arch}:\n{log}")]
    Compile {
        file: String,
        arch: String,
        log: String,
    },
    /// A model shape or type this backend does not implement.
    #[error("{0}")]
    Unsupported(String),
    /// Disk I/O (the kernel cache, synthetic files).
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    /// A GGUF error (synthetic files).
    #[error(transparent)]
    Gguf(#[from] ds4_gguf::GgufError),
}

impl CudaError {
    pub(crate) fn driver(call: &'static str, e: cudarc::driver::DriverError) -> Self {
        CudaError::Driver {
            call,
            detail: format!("{e:?}"),
        }
    }
}

/// Result alias for the CUDA backend.
pub type Result<T, E = CudaError> = std::result::Result<T, E>;
