//! The backend interface: the operations model families are written in.
//!
//! A family (e.g. [`crate::families::llama`]) calls these operations in the order of
//! its reference implementation; a backend (CPU now, CUDA later) decides how they run.
//! A backend never knows which family calls it. Per-step inputs (token ids,
//! positions) are handed over once per forward step as a [`Backend::Step`], so a
//! backend that records a step (a CUDA graph) reads them from its own memory on replay
//! instead of baking them in.
//!
//! Buffers hold f32 activations, row-major: `rows × cols` with the row (token) index
//! slowest.

pub mod cpu;

use std::sync::Arc;

use ds4_gguf::{GgufFile, TensorInfo};

use crate::Result;

/// Rotary position embedding parameters (ggml `rope` with no context extension).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rope {
    /// Rotated dimensions per head (`{arch}.rope.dimension_count`, usually the head size).
    pub n_dims: usize,
    /// `{arch}.rope.freq_base`.
    pub freq_base: f32,
    /// Pair layout: interleaved `(2i, 2i+1)` (llama; GGUF permutes Q/K for this) or
    /// NEOX halves `(i, i + n_dims/2)` (qwen2).
    pub neox: bool,
}

/// Shape of a grouped-query attention layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttnShape {
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
}

/// The operations the dense transformer families need.
pub trait Backend: Send + Sync + 'static {
    /// A weight tensor resident on the backend, in its file type.
    type Weight: Send + Sync;
    /// An f32 activation buffer.
    type Buf: Send;
    /// One sequence's KV cache for all layers.
    type Kv: Send;
    /// One forward step's inputs (token ids and their positions).
    type Step;

    /// Short name (`cpu`, `cuda`).
    fn name(&self) -> &'static str;
    /// Makes a weight available to the backend. Errors name the tensor when its type is
    /// not supported.
    fn weight(&self, file: &Arc<GgufFile>, info: &TensorInfo) -> Result<Self::Weight>;
    /// A buffer of `len` f32 values.
    fn buf(&self, len: usize) -> Self::Buf;
    /// A KV cache of `n_layer` layers × `n_ctx` positions × `kv_dim` values for K and V.
    fn kv(&self, n_layer: usize, n_ctx: usize, kv_dim: usize) -> Self::Kv;
    /// A copy of the first `len` positions of `kv`.
    fn kv_snapshot(&self, kv: &Self::Kv, len: usize) -> Self::Kv;
    /// Runs one forward step (every operation `f` issues) on the backend's workers. The
    /// CPU backend runs it inside its thread pool so the operations' parallel loops do
    /// not have to wake a caller outside the pool once per operation.
    fn run<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        f()
    }
    /// Hands over the inputs of one step: `tokens[i]` sits at position `pos0 + i`.
    fn step(&self, tokens: &[u32], pos0: usize) -> Self::Step;

    /// `out[i] = table[tokens[i]]` (dequantized rows).
    fn embed(&self, step: &Self::Step, table: &Self::Weight, out: &mut Self::Buf);
    /// RMSNorm of `rows` rows of `x` (row length = `w`'s length), times `w`.
    fn rms_norm(&self, x: &Self::Buf, w: &Self::Weight, eps: f32, rows: usize, out: &mut Self::Buf);
    /// `out[t] = w · x[t] (+ bias)` for `rows` rows of `x`; `w` is `n_out × n_in`.
    fn matmul(
        &self,
        w: &Self::Weight,
        bias: Option<&Self::Weight>,
        x: &Self::Buf,
        rows: usize,
        out: &mut Self::Buf,
    );
    /// Rotates `n_head` heads of every row of `x` in place at the step's positions.
    fn rope(
        &self,
        step: &Self::Step,
        rope: &Rope,
        n_head: usize,
        head_dim: usize,
        x: &mut Self::Buf,
    );
    /// Stores the step's `k`, `v` rows in layer `layer` of `kv` at the step's positions,
    /// then computes causal grouped-query attention of `q` over positions `0..=pos`
    /// (softmax scaled by `1/sqrt(head_dim)`), writing `n_head × head_dim` per row.
    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        step: &Self::Step,
        kv: &mut Self::Kv,
        layer: usize,
        shape: &AttnShape,
        q: &Self::Buf,
        k: &Self::Buf,
        v: &Self::Buf,
        out: &mut Self::Buf,
    );
    /// `out = silu(gate) * up` over `len` values.
    fn swiglu(&self, gate: &Self::Buf, up: &Self::Buf, len: usize, out: &mut Self::Buf);
    /// `x += y` over `len` values.
    fn add(&self, x: &mut Self::Buf, y: &Self::Buf, len: usize);
    /// Copies `len` values from `src[src_off..]` to `dst[dst_off..]`.
    fn copy(
        &self,
        src: &Self::Buf,
        src_off: usize,
        dst: &mut Self::Buf,
        dst_off: usize,
        len: usize,
    );
    /// Reads `len` values from `buf[off..]` back to the host, appending to `out`.
    fn read(&self, buf: &Self::Buf, off: usize, len: usize, out: &mut Vec<f32>);
}
