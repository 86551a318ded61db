//! Engine errors: one clear message naming the file, tensor or field at fault.

use ds4_gguf::GgmlType;

/// Errors from loading a model or running it.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Gguf(#[from] ds4_gguf::GgufError),
    #[error(transparent)]
    Tokenizer(#[from] ds4_tokenizer::TokenizerError),
    #[error("unknown model architecture '{0}' (supported: {supported})", supported = crate::loader::SUPPORTED_ARCHITECTURES.join(", "))]
    UnknownArchitecture(String),
    #[error("metadata key '{key}' is missing or has the wrong type{detail}")]
    Metadata { key: String, detail: String },
    #[error("tensor '{0}' is missing")]
    MissingTensor(String),
    #[error("tensor '{name}' has shape {got:?}, expected {expected:?}")]
    TensorShape {
        name: String,
        got: Vec<u64>,
        expected: Vec<u64>,
    },
    #[error("tensor '{name}' has type {ty}, which this backend does not support")]
    UnsupportedTensorType { name: String, ty: GgmlType },
    #[error(
        "the prompt needs {needed} tokens but the context holds {n_ctx} (raise --ctx or shorten the prompt)"
    )]
    ContextFull { needed: usize, n_ctx: usize },
    #[error(
        "--ctx {n_ctx}: longer than the {n_ctx_train} tokens this model was trained for (use 1 to {n_ctx_train})"
    )]
    ContextSize { n_ctx: usize, n_ctx_train: usize },
    #[error("token id {id} is outside the vocabulary (n_vocab = {n_vocab})")]
    BadToken { id: u32, n_vocab: usize },
    #[error("cannot rewind to {target} tokens: {reason}")]
    Rewind { target: usize, reason: String },
    #[error("backend error: {0}")]
    Backend(String),
    #[error("out of memory allocating {what}: {} needed{}", human_bytes(*needed), available.map(|a| format!(", {} available", human_bytes(a))).unwrap_or_default())]
    OutOfMemory {
        what: String,
        needed: u64,
        available: Option<u64>,
    },
    #[error("the {backend} backend does not support {what} yet")]
    Unsupported { backend: &'static str, what: String },
    #[error("invalid model configuration: {0}")]
    Config(String),
    /// A saved session state that cannot be read (malformed, truncated, or of another
    /// model).
    #[error("session state: {0}")]
    State(String),
}

/// `n` bytes for people: `1.5 GiB`, `320 MiB`, `12 KiB`.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// Result alias for the engine.
pub type Result<T, E = EngineError> = std::result::Result<T, E>;
