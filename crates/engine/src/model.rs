//! The model interface every family implements (dense llama/qwen2 now; GLM-5.3,
//! DeepSeek-V4 and Qwen-next MoE families later), and the per-sequence cache interface.
//!
//! A [`Model`] holds immutable weights on a backend. A [`Cache`] holds one sequence's
//! state (KV rows, recurrent state). [`Model::forward`] appends tokens to a cache and
//! returns logits; everything else (rewind, snapshots, prefix reuse, sampling) is built
//! on top by [`crate::Session`].

use std::any::Any;
use std::io::{Read, Write};
use std::ops::RangeInclusive;

use crate::backend::Backend;
use crate::{EngineError, Result};

/// What a loaded model is, as the session and the CLI/server need to know it.
#[derive(Debug, Clone)]
pub struct ModelInfo {
    /// `general.architecture` (`llama`, `qwen2`, …).
    pub architecture: String,
    /// `general.name`, or the file stem when absent.
    pub name: String,
    /// Rows of the logits (the output projection's size).
    pub n_vocab: usize,
    /// The training context length (`{arch}.context_length`).
    pub n_ctx_train: usize,
    /// Number of layers, for display.
    pub n_layer: usize,
    /// Bytes of weights read per decode token (every weight tensor a step touches; of
    /// the embedding table only one row) — the numerator of achieved bandwidth.
    pub decode_weight_bytes: u64,
    /// Total parameter count (elements of all weight tensors).
    pub n_params: u64,
    /// The backend's name (`cpu`, `cuda`).
    pub backend: String,
}

/// Which logits a forward pass returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logits {
    /// None (pure prefill of a chunk whose logits nobody reads).
    None,
    /// The row of the last token only.
    Last,
    /// One row per input token, in order.
    All,
    /// None written to `out`: the last row's greedy choice is made on the backend and
    /// kept there, the token of a following [`Model::forward_picked`] on the same cache,
    /// and the host reads it with [`Model::take_pick`] (pipelined greedy decoding,
    /// [`crate::Session::decode_greedy`]).
    Pick,
}

impl Logits {
    /// The first of a step's `rows` rows whose logits are asked for (`None`: none).
    pub(crate) fn first_row(self, rows: usize) -> Option<usize> {
        match self {
            Logits::None => None,
            Logits::Last | Logits::Pick => Some(rows - 1),
            Logits::All => Some(0),
        }
    }
}

/// One sequence's state for one model.
pub trait Cache: Send {
    /// Tokens held (the frontier length).
    fn len(&self) -> usize;
    /// Whether the cache is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Capacity in tokens.
    fn capacity(&self) -> usize;
    /// Drops every token at position `n` and later. Families with state that cannot be
    /// truncated (recurrent layers) return [`crate::EngineError::Rewind`] when they hold no
    /// checkpoint at `n`; the session then re-evaluates from an earlier snapshot.
    fn truncate(&mut self, n: usize) -> Result<()>;
    /// The largest position `<= n` that [`Cache::truncate`] can reach (`n` itself for
    /// caches that truncate anywhere, such as a KV cache; a recurrent state reaches only
    /// its checkpoints). The session truncates there and re-evaluates the rest.
    fn rewind_point(&self, n: usize) -> usize {
        n
    }
    /// The position ranges [`Cache::truncate`] can reach (every `n` in a range), so a
    /// caller can tell how much of a stored state a new sequence can reuse without
    /// holding the state: `[0..=len]` for caches that truncate anywhere.
    fn reachable(&self) -> Vec<RangeInclusive<usize>> {
        vec![0..=self.len()]
    }
    /// Bytes of memory (host or device) the state holds.
    fn bytes(&self) -> u64;
    /// A deep copy of the state (only the first `len()` positions need be copied).
    fn snapshot(&self) -> Result<Box<dyn Cache>>;
    /// Replaces this state by `from` (a snapshot of a cache of the same model).
    fn restore(&mut self, from: &dyn Cache) -> Result<()>;
    /// For the owning family's downcast.
    fn as_any(&self) -> &dyn Any;
    fn as_any_mut(&mut self) -> &mut dyn Any;
}

/// A loaded model.
pub trait Model: Send + Sync {
    fn info(&self) -> &ModelInfo;
    /// A new, empty cache holding up to `n_ctx` tokens.
    fn new_cache(&self, n_ctx: usize) -> Result<Box<dyn Cache>>;
    /// Writes `cache` (a cache or snapshot of this model) in the family's state format:
    /// everything [`Model::read_cache`] needs to rebuild a cache that continues,
    /// rewinds and snapshots exactly as this one.
    ///
    /// # Errors
    /// [`EngineError::State`] for I/O errors of `out`, or when the family or backend
    /// cannot export its state.
    fn write_cache(&self, cache: &dyn Cache, out: &mut dyn Write) -> Result<()> {
        let _ = (cache, out);
        Err(state_unsupported(self.info(), "saving"))
    }
    /// Reads a state written by [`Model::write_cache`] of this model.
    ///
    /// # Errors
    /// [`EngineError::State`] for malformed or foreign data, I/O errors, or when
    /// unsupported.
    fn read_cache(&self, input: &mut dyn Read) -> Result<Box<dyn Cache>> {
        let _ = input;
        Err(state_unsupported(self.info(), "loading"))
    }
    /// Evaluates `tokens` at positions `cache.len()..cache.len() + tokens.len()`, appends
    /// them to the cache and writes the requested logits into `out` (resized to
    /// `rows × n_vocab`, row-major). `tokens` may be of any length up to the remaining
    /// capacity; families split it into chunks themselves.
    fn forward(
        &self,
        cache: &mut dyn Cache,
        tokens: &[u32],
        logits: Logits,
        out: &mut Vec<f32>,
    ) -> Result<()>;
    /// Evaluates one token at position `cache.len()`, the greedy choice of the cache's
    /// latest [`Logits::Pick`] step, which the host need not have read (a device backend
    /// takes it from its own memory), and appends it; its own choice is made as
    /// [`Logits::Pick`] makes it. The cache's previous step must have been a
    /// [`Logits::Pick`] step.
    fn forward_picked(&self, cache: &mut dyn Cache) -> Result<()>;
    /// The oldest greedy choice of `cache`'s [`Logits::Pick`] steps not taken yet,
    /// waiting for the step that made it (not for later ones).
    fn take_pick(&self, cache: &mut dyn Cache) -> Result<u32>;
    /// The memory one sequence of `n_ctx` tokens takes, by part (for the load report);
    /// empty when the family does not say.
    fn state_parts(&self, _n_ctx: usize) -> Vec<(&'static str, u64)> {
        Vec::new()
    }
    /// Bytes its backend can still allocate ([`crate::backend::Backend::memory_available`]):
    /// a device's free memory, `None` on the CPU.
    fn memory_available(&self) -> Option<u64> {
        None
    }
    /// Tokens per forward call a long prompt is best split into (`Session::prefill`):
    /// its backend's preference.
    fn prefill_chunk(&self) -> usize {
        crate::session::PREFILL_CHUNK
    }
}

/// The error of a family or backend that cannot save or load session states.
fn state_unsupported(info: &ModelInfo, what: &str) -> EngineError {
    EngineError::State(format!(
        "{what} session states is not implemented for the {} family on the {} backend",
        info.architecture, info.backend
    ))
}

/// Refuses a sequence state of `needed` bytes (for `n_ctx` tokens) that the backend
/// cannot hold, before anything is allocated, naming both sizes.
pub fn check_memory<B: Backend>(backend: &B, needed: u64, n_ctx: usize) -> Result<()> {
    match backend.memory_available() {
        Some(avail) if needed > avail => Err(EngineError::OutOfMemory {
            what: format!(
                "the state of a {n_ctx}-token context on the {} backend (lower --ctx)",
                backend.name()
            ),
            needed,
            available: Some(avail),
        }),
        _ => Ok(()),
    }
}
