//! The backend interface: the operations every model family is written in.
//!
//! A family (e.g. [`crate::families::llama`], [`crate::families::glm5_next`]) calls
//! these operations in the order of its reference implementation; a backend (CPU,
//! CUDA) decides how they run. A backend never knows which family calls it, and a
//! family never knows which backend runs it.
//!
//! - Per-step inputs (token ids, positions) are handed over once per forward step as a
//!   [`Backend::Step`]; operations that depend on positions read them from the step, so
//!   a backend that records a step (a CUDA graph) reads them from its own memory on
//!   replay instead of baking them in.
//! - Buffers ([`Backend::Buf`]) hold f32 values, row-major: `rows × cols` with the row
//!   (token) index slowest. [`Backend::Ids`] hold `i32` (expert ids, selected entries;
//!   `-1` marks none).
//! - Every operation returns a [`Result`]: out of memory, a weight type the backend
//!   cannot multiply, a failed launch or an operation the backend does not implement
//!   are errors naming what failed, never panics and never a silent fallback.
//! - Operations whose rounding depends on the family's reference take a [`Prec`] (the
//!   family's precision policy; see there).
//!
//! The operations, by area (each documents shapes and the reference it follows):
//!
//! | area | operations |
//! | --- | --- |
//! | steps | [`step`](Backend::step), [`step_picked`](Backend::step_picked), [`pick`](Backend::pick), [`take_pick`](Backend::take_pick) |
//! | memory | [`buf`](Backend::buf), [`ids`](Backend::ids), [`copy`](Backend::copy), [`fill`](Backend::fill), [`read`](Backend::read), [`write`](Backend::write), [`read_ids`](Backend::read_ids), [`write_ids`](Backend::write_ids), [`store_rows`](Backend::store_rows) |
//! | dense | [`embed`](Backend::embed), [`rms_norm`](Backend::rms_norm), [`rms_norm_cast_once`](Backend::rms_norm_cast_once), [`layer_norm`](Backend::layer_norm), [`matmul`](Backend::matmul), [`matmul_grouped`](Backend::matmul_grouped), [`rope`](Backend::rope), [`attention`](Backend::attention), [`swiglu`](Backend::swiglu), [`add`](Backend::add), [`scale_sigmoid`](Backend::scale_sigmoid) |
//! | MoE | [`moe_route`](Backend::moe_route), [`moe_experts`](Backend::moe_experts) |
//! | mHC | [`hc_pre`](Backend::hc_pre), [`hc_post`](Backend::hc_post), [`hc_head`](Backend::hc_head) |
//! | linear attention | [`delta_net`](Backend::delta_net), [`delta_replay`](Backend::delta_replay), [`gated_norm`](Backend::gated_norm) |
//! | sparse attention | [`compress`](Backend::compress), [`dsa_select`](Backend::dsa_select), [`mla_attention`](Backend::mla_attention), [`sink_attention`](Backend::sink_attention) |

pub mod cpu;
mod shapes;

use std::ops::Range;
use std::sync::Arc;

use ds4_gguf::{GgufFile, TensorInfo};

use crate::Result;

pub use shapes::{
    AttnShape, CompressShape, DeltaForm, DeltaShape, Gate, HcShape, MlaShape, OutGate, PoolSelect,
    Prec, Rope, Routing, Scoring, SelectShape, SinkAttnShape, Yarn,
};

/// Refuses `family` on `backend` when the backend lacks any of `ops` in arithmetic `p`,
/// naming every missing operation.
pub fn require<B: Backend>(backend: &B, family: &str, ops: &[&'static str], p: Prec) -> Result<()> {
    let missing = backend.lacks(ops, p);
    if missing.is_empty() {
        return Ok(());
    }
    Err(crate::EngineError::Unsupported {
        backend: backend.name(),
        what: format!(
            "the {family} family: it needs the operations {} in {p:?} arithmetic",
            missing.join(", ")
        ),
    })
}

/// The weights of one hyper-connection: `fn [(2+N)·N, N·D]`, `base [(2+N)·N]`,
/// `scale [3]` (for [`Backend::hc_head`]: `fn [N, N·D]`, `base [N]`, `scale [1]`).
pub struct HcWeights<'a, W> {
    pub fn_: &'a W,
    pub base: &'a W,
    pub scale: &'a W,
}

/// The routed experts of an MoE layer: stacked `gate`, `up` `[E, I, D]` and `down`
/// `[E, D, I]` in their file types.
pub struct Experts<'a, W> {
    pub gate: &'a W,
    pub up: &'a W,
    pub down: &'a W,
}

/// The weights of a delta-rule layer's core (see [`Backend::delta_net`]).
pub struct DeltaWeights<'a, W> {
    /// Depthwise causal conv kernels `[C, Kc]` for the q, k and v channels.
    pub conv: [&'a W; 3],
    /// `dt_bias [Hv · gate_channels]`.
    pub dt_bias: &'a W,
    /// The decay rate `a = exp(A_log)` per value head `[Hv]` (positive).
    pub decay: &'a W,
}

/// The per-token inputs of a delta-rule layer (pre-conv projections), `rows` rows each.
pub struct DeltaIn<'a, B: Buffers + ?Sized> {
    /// `[rows, Hk·dk]`, `[rows, Hk·dk]`, `[rows, Hv·dv]` (model dtype).
    pub q: &'a B::Buf,
    pub k: &'a B::Buf,
    pub v: &'a B::Buf,
    /// The forget-gate projection before `dt_bias` `[rows, Hv·gate_channels]`.
    pub g: &'a B::Buf,
    /// Beta logits `[rows, Hv]`.
    pub beta: &'a B::Buf,
}

/// One delta-rule layer's recurrent state.
pub struct DeltaState<'a, B: Buffers + ?Sized> {
    /// The last `Kc − 1` pre-conv rows `[Kc−1, 2·Hk·dk + Hv·dv]` (q, k, v channels),
    /// oldest first.
    pub conv: &'a mut B::Buf,
    /// `[Hv, dk, dv]`, f32.
    pub s: &'a mut B::Buf,
}

/// A ring of per-token delta-rule kernel inputs, slot `pos mod cap` for the token at
/// position `pos`, from which [`Backend::delta_replay`] re-applies the recurrence.
pub struct DeltaJournal<B: Buffers + ?Sized> {
    /// Slots.
    pub cap: usize,
    /// Pre-conv rows `[cap, 2·Hk·dk + Hv·dv]`.
    pub pre: B::Buf,
    /// L2-normalised keys `[cap, Hk·dk]`, values `[cap, Hv·dv]`, log decays
    /// `[cap, Hv·gate_channels]`, betas `[cap, Hv]`.
    pub k: B::Buf,
    pub v: B::Buf,
    pub g: B::Buf,
    pub beta: B::Buf,
}

/// One layer of a journal replay ([`Backend::delta_replay`]): the journal and the state
/// its tokens are re-applied to.
pub struct DeltaReplay<'a, B: Buffers + ?Sized> {
    pub journal: &'a DeltaJournal<B>,
    pub state: DeltaState<'a, B>,
}

/// The buffer types of a backend (split from [`Backend`] so that helper structs can
/// name them).
pub trait Buffers {
    /// An f32 buffer on the backend.
    type Buf: Send;
    /// An `i32` buffer on the backend.
    type Ids: Send;
}

/// The operations of the model families (see the module header).
pub trait Backend: Buffers + Send + Sync + 'static {
    /// A weight tensor resident on the backend, in its file type.
    type Weight: Send + Sync;
    /// One sequence's f16 KV cache of a dense family (ggml's default cache).
    type Kv: Send;
    /// One forward step's inputs (token ids and their positions).
    type Step;
    /// A greedy choice made on the backend ([`Backend::pick`]), not yet read by the host.
    type Pick: Send;

    /// Short name (`cpu`, `cuda`).
    fn name(&self) -> &'static str;
    /// Labels the operations that follow (a model part such as `"KDA attention"`), for
    /// profiles that report time per part. No effect on results.
    fn region(&self, _name: &'static str) {}
    /// Tokens per forward call a long prompt is best split into (see
    /// [`crate::Model::prefill_chunk`]): large where per-call costs are high (weights
    /// converted per call on a GPU).
    fn prefill_chunk(&self) -> usize {
        crate::session::PREFILL_CHUNK
    }
    /// Bytes of memory the backend can still allocate, when it knows (a device's free
    /// memory); `None` when unbounded or unknown (the CPU).
    fn memory_available(&self) -> Option<u64> {
        None
    }
    /// The operations of `ops` (by their names in this trait) the backend does not
    /// implement in the arithmetic `p`. Families check the operations they use when
    /// they load ([`require`]), so a model the backend cannot run is refused with one
    /// clear error before any memory is allocated, never run elsewhere.
    fn lacks(&self, ops: &[&'static str], p: Prec) -> Vec<&'static str> {
        let _ = (ops, p);
        Vec::new()
    }
    /// The feature a test turned off (see `crate::ablation`); test builds only.
    #[cfg(test)]
    fn ablation(&self) -> Option<crate::ablation::Ablation> {
        None
    }

    // ---- weights ----

    /// Makes a tensor of `file` available (quantized matrices stay in their type; the
    /// backend may decode small float tensors). Errors name the tensor when its type is
    /// not supported.
    fn weight(&self, file: &Arc<GgufFile>, info: &TensorInfo) -> Result<Self::Weight>;
    /// An F32 weight built from `values` (a tensor re-laid-out at load time), with
    /// ggml dims `dims` (`{cols, rows[, n]}`), named `name` in errors.
    fn weight_f32(&self, name: &str, dims: &[usize], values: &[f32]) -> Result<Self::Weight>;

    // ---- memory ----

    /// A buffer of `len` f32 zeros.
    fn buf(&self, len: usize) -> Result<Self::Buf>;
    /// A buffer of `len` i32 zeros.
    fn ids(&self, len: usize) -> Result<Self::Ids>;
    /// Copies `len` values from `src[src_off..]` to `dst[dst_off..]`.
    fn copy(
        &self,
        src: &Self::Buf,
        src_off: usize,
        dst: &mut Self::Buf,
        dst_off: usize,
        len: usize,
    ) -> Result<()>;
    /// Sets `len` values of `buf` from `off` to `value`.
    fn fill(&self, buf: &mut Self::Buf, off: usize, len: usize, value: f32) -> Result<()>;
    /// Reads `len` values from `buf[off..]` back to the host, appending to `out`.
    fn read(&self, buf: &Self::Buf, off: usize, len: usize, out: &mut Vec<f32>) -> Result<()>;
    /// Writes host values into `buf[off..off + data.len()]`.
    fn write(&self, buf: &mut Self::Buf, off: usize, data: &[f32]) -> Result<()>;
    /// Reads `len` ids from `ids[off..]`, appending to `out`.
    fn read_ids(&self, ids: &Self::Ids, off: usize, len: usize, out: &mut Vec<i32>) -> Result<()>;
    /// Writes host ids into `ids[off..off + data.len()]`.
    fn write_ids(&self, ids: &mut Self::Ids, off: usize, data: &[i32]) -> Result<()>;
    /// Stores the step's rows: `dst[(pos0 + i) mod cap] = src[i]` for `i < rows`, rows of
    /// `row_len` values (a latent or indexer cache with `cap = n_ctx`, or a ring).
    fn store_rows(
        &self,
        step: &Self::Step,
        src: &Self::Buf,
        rows: usize,
        row_len: usize,
        dst: &mut Self::Buf,
        cap: usize,
    ) -> Result<()>;

    // ---- steps ----

    /// Runs one forward step (every operation `f` issues) on the backend's workers. The
    /// CPU backend runs it inside its thread pool, whose other threads spin until the
    /// step ends, so the operations' parallel loops wake nobody.
    fn run<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        f()
    }
    /// Hands over the inputs of one step: `tokens[i]` sits at position `pos0 + i`.
    fn step(&self, tokens: &[u32], pos0: usize) -> Result<Self::Step>;
    /// Hands over a one-token step at `pos0` whose token is `last`, the choice of this
    /// sequence's previous step, which the host need not have read: a backend that runs
    /// ahead of the host (a device) takes it from its own memory, so the step can be
    /// queued before `last` is known (pipelined greedy decoding,
    /// [`crate::Session::decode_greedy`]). `last` is the latest [`Backend::pick`] of the
    /// previous step of the same sequence, made on the same thread.
    fn step_picked(&self, last: &Self::Pick, pos0: usize) -> Result<Self::Step>;
    /// The greedy choice of a step: the argmax of `logits[..n]`, the step's last row
    /// (the lowest id whose value is strictly greatest and above −1e30, 0 when none:
    /// [`crate::sampler::argmax`]), made on the backend without reading the logits back.
    /// It is the token of a following [`Backend::step_picked`], and the host reads it with
    /// [`Backend::take_pick`].
    fn pick(&self, step: &Self::Step, logits: &Self::Buf, n: usize) -> Result<Self::Pick>;
    /// The token chosen by `pick`, waiting for the step that chose it (and no later one).
    fn take_pick(&self, pick: Self::Pick) -> Result<u32>;

    // ---- dense operations ----

    /// `out[i, n] = table[tokens[i]]` for `n < streams` (dequantized rows, rounded by
    /// `p`; `streams` copies per token start the hyper-connection streams, 1 otherwise).
    fn embed(
        &self,
        step: &Self::Step,
        table: &Self::Weight,
        streams: usize,
        p: Prec,
        out: &mut Self::Buf,
    ) -> Result<()>;
    /// RMSNorm of `rows` rows of `cols` values: `y = x · rsqrt(mean(x²) + eps)`, times `w`
    /// when given. ggml (`Prec::Ggml`): squares in f32 summed in f64, `(x·r)·w` in f32.
    /// Reference (`*RMSNorm` of GLM-5.3): squares and sum in f64,
    /// `round(round(x·r)·w)`.
    #[allow(clippy::too_many_arguments)]
    fn rms_norm(
        &self,
        x: &Self::Buf,
        w: Option<&Self::Weight>,
        rows: usize,
        cols: usize,
        eps: f32,
        p: Prec,
        out: &mut Self::Buf,
    ) -> Result<()>;
    /// RMSNorm computed in f32 and cast once, `r = rsqrt(mean(x²) + eps)` (sum of squares
    /// in f64) over `rows` rows of `cols` values: with `w`, `round(w · (x·r))` (the weight,
    /// kept f32 by the reference, multiplies the f32 normalised values before the one
    /// rounding: DeepSeek-V4's `DeepseekV4RMSNorm`); without, `round(x · round(r))` (the
    /// scale factor is cast to the activations' dtype first: `DeepseekV4UnweightedRMSNorm`,
    /// e.g. per head with `cols` the head size). Equal to [`Backend::rms_norm`] under
    /// `Prec::F32`; the two differ in where a bf16 model rounds.
    #[allow(clippy::too_many_arguments)]
    fn rms_norm_cast_once(
        &self,
        x: &Self::Buf,
        w: Option<&Self::Weight>,
        rows: usize,
        cols: usize,
        eps: f32,
        p: Prec,
        out: &mut Self::Buf,
    ) -> Result<()>;
    /// `nn.LayerNorm`: `round((x − mean)·rsqrt(var + eps)·w + b)` per row of `cols`
    /// (statistics in f64; the GLM-5.3 DSA indexer's key norm).
    #[allow(clippy::too_many_arguments)]
    fn layer_norm(
        &self,
        x: &Self::Buf,
        w: &Self::Weight,
        b: &Self::Weight,
        rows: usize,
        cols: usize,
        eps: f32,
        p: Prec,
        out: &mut Self::Buf,
    ) -> Result<()>;
    /// `out[t] = w · x[t] (+ bias)` for `rows` rows of `x`; `w` is `n_out × n_in`
    /// (`nn.Linear`: `y = x Wᵀ`). Quantized weights quantize the activations per block
    /// (ggml); float weights: ggml's kernels under `Prec::Ggml`, otherwise f32 products
    /// of the activations as given with the upcast weights (f32 accumulation), the
    /// result rounded by `p`.
    fn matmul(
        &self,
        w: &Self::Weight,
        bias: Option<&Self::Weight>,
        x: &Self::Buf,
        rows: usize,
        p: Prec,
        out: &mut Self::Buf,
    ) -> Result<()>;
    /// Per group `g`: `out[t, g] = w[g] · x[t, g]` for a stacked weight `[G, n_out, n_in]`
    /// (`x` is `[rows, G, n_in]`, `out` `[rows, G, n_out]`): MLA's per-head `k_b`/`v_b`,
    /// DeepSeek-V4's grouped output projection `o_a`. Arithmetic as [`Backend::matmul`].
    fn matmul_grouped(
        &self,
        w: &Self::Weight,
        x: &Self::Buf,
        rows: usize,
        p: Prec,
        out: &mut Self::Buf,
    ) -> Result<()>;
    /// Rotates `n_head` heads of `head_dim` values of every row of `x` in place at the
    /// step's positions (see [`Rope`] for the two arithmetics).
    fn rope(
        &self,
        step: &Self::Step,
        rope: &Rope,
        n_head: usize,
        head_dim: usize,
        p: Prec,
        x: &mut Self::Buf,
    ) -> Result<()>;
    /// A KV cache of `n_layer` layers × `n_ctx` positions × `kv_dim` values for K and V
    /// (f16, ggml's default cache).
    fn kv(&self, n_layer: usize, n_ctx: usize, kv_dim: usize) -> Result<Self::Kv>;
    /// A copy of the first `len` positions of `kv` (a backend may keep only those).
    fn kv_snapshot(&self, kv: &Self::Kv, len: usize) -> Result<Self::Kv>;
    /// Copies the first `len` positions of `src` (a cache or a [`Backend::kv_snapshot`])
    /// into `dst`, a cache of the same shape with room for them. By default `dst`
    /// becomes a snapshot of `src` (for backends whose snapshots keep every position).
    fn kv_restore(&self, dst: &mut Self::Kv, src: &Self::Kv, len: usize) -> Result<()> {
        *dst = self.kv_snapshot(src, len)?;
        Ok(())
    }
    /// Positions `kv` has room for, when the backend tells (a snapshot may hold fewer
    /// than its cache).
    fn kv_capacity(&self, kv: &Self::Kv) -> Option<usize> {
        let _ = kv;
        None
    }
    /// The f16 bits of positions `0..len` of `kv`, appended to `out` layer by layer, the
    /// layer's K rows then its V rows (`len × kv_dim` values each).
    fn kv_read(&self, kv: &Self::Kv, len: usize, out: &mut Vec<u16>) -> Result<()> {
        let _ = (kv, len, out);
        Err(crate::EngineError::Unsupported {
            backend: self.name(),
            what: "reading a KV cache back (saving session states)".into(),
        })
    }
    /// Writes positions `0..len` of `kv` from `data` laid out as [`Backend::kv_read`]
    /// gives it.
    fn kv_write(&self, kv: &mut Self::Kv, len: usize, data: &[u16]) -> Result<()> {
        let _ = (kv, len, data);
        Err(crate::EngineError::Unsupported {
            backend: self.name(),
            what: "writing a KV cache (loading session states)".into(),
        })
    }
    /// Stores the step's `k`, `v` rows in layer `layer` of `kv` at the step's positions,
    /// then computes causal grouped-query attention of `q` over positions `0..=pos`
    /// (softmax scaled by `1/sqrt(head_dim)`), writing `n_head × head_dim` per row, in
    /// llama.cpp's arithmetic (f16 cache, flash attention off).
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
    ) -> Result<()>;
    /// `out = silu(gate) · up` over `len` values. ggml's under `Prec::Ggml`; otherwise the
    /// reference's clamped SwiGLU `round(round(silu(min(gate, lim))) · clamp(up, −lim,
    /// lim))` (`limit` `None`: no clamp).
    fn swiglu(
        &self,
        gate: &Self::Buf,
        up: &Self::Buf,
        len: usize,
        limit: Option<f32>,
        p: Prec,
        out: &mut Self::Buf,
    ) -> Result<()>;
    /// `x = round(x + y)` over `len` values.
    fn add(&self, x: &mut Self::Buf, y: &Self::Buf, len: usize, p: Prec) -> Result<()>;
    /// `x[r, c] = round(x[r, c] · sigmoid(gate[r, c or 0]))` for `rows` rows of `cols`;
    /// `gate` has `gate_cols` = `cols` (an elementwise output gate, Qwen3.5's gated
    /// attention) or 1 (one scalar per row, Qwen3.5's shared-expert gate).
    #[allow(clippy::too_many_arguments)]
    fn scale_sigmoid(
        &self,
        x: &mut Self::Buf,
        gate: &Self::Buf,
        rows: usize,
        cols: usize,
        gate_cols: usize,
        p: Prec,
    ) -> Result<()>;

    // ---- MoE ----

    /// Routes `rows` tokens from their router logits `[rows, E]`: scores by `r.scoring`;
    /// choice scores `s + bias` (`e_score_correction_bias`, f32, when given) in f32;
    /// with `n_group > 1` only the `topk_group` groups with the largest sums of their two
    /// best choice scores stay; the `n_used` best choice scores win (ties: lower id).
    /// With `hash` (DeepSeek-V4's `tid2eid [vocab, k]`), the experts are
    /// `hash[token]` instead. Weights are the unbiased scores of the chosen experts,
    /// renormalised when `r.norm` (`/ (Σ + 1e-20)`), times `r.scale`.
    /// `p` is the router's dtype: under `Prec::F32` everything is f32 and only the final
    /// weights are rounded (GLM-5.3's f32 router); under `Prec::Bf16` (a router in the
    /// model dtype, DeepSeek-V4's) every step is a bf16 tensor operation: each score
    /// function's result, the weight sum (accumulated in f32), the quotient and the
    /// scaled weight are rounded. Writes `ids [rows, k]` and `weights [rows, k]`.
    #[allow(clippy::too_many_arguments)]
    fn moe_route(
        &self,
        step: &Self::Step,
        logits: &Self::Buf,
        rows: usize,
        bias: Option<&Self::Weight>,
        hash: Option<&Self::Weight>,
        r: &Routing,
        p: Prec,
        ids: &mut Self::Ids,
        weights: &mut Self::Buf,
    ) -> Result<()>;
    /// The routed experts' output `out [rows, D]` for `x [rows, D]`: per token and
    /// chosen expert `e` (`ids`, `weights` from [`Backend::moe_route`], `k` per token),
    /// `y_e = down_e · swiglu(gate_e · x, up_e · x)` (each product rounded by `p`, the
    /// SwiGLU as [`Backend::swiglu`] with `limit`), `out = round(Σ_e wp(w_e · y_e))`
    /// summed in f32 (the reference's `grouped_mm` path), where `wp` is the routing
    /// weights' dtype: each weighted expert output is rounded by it (`Prec::F32`: f32
    /// weights promote the product, GLM-5.3; `Prec::Bf16`: bf16 weights times bf16
    /// outputs, DeepSeek-V4). Reads the quantized expert weights directly.
    #[allow(clippy::too_many_arguments)]
    fn moe_experts(
        &self,
        x: &Self::Buf,
        rows: usize,
        ids: &Self::Ids,
        weights: &Self::Buf,
        k: usize,
        experts: &Experts<'_, Self::Weight>,
        limit: Option<f32>,
        wp: Prec,
        p: Prec,
        out: &mut Self::Buf,
    ) -> Result<()>;

    // ---- manifold hyper-connections (mHC) ----

    /// The input side of a hyper-connection for `rows` tokens of streams
    /// `x [rows, N, D]`: `xn = x · rsqrt(mean(x²) + norm_eps)` over `N·D` (f32),
    /// `m = fn · xn` (f32 island), `pre = sigmoid(m[:N]·scale₀ + base) + eps`,
    /// `post = 2·sigmoid(m[N:2N]·scale₁ + base)`, `comb = m[2N:]·scale₂ + base`
    /// (`[N, N]`) Sinkhorn-normalised (row softmax + eps, one column normalisation, then
    /// `iters − 1` row/column pairs, denominators `sum + eps`). Writes the collapsed input
    /// `out [rows, D] = round(Σₙ preₙ·x[n])` and `mix [rows, N + N²]` = rounded `post`,
    /// `comb` (GLM-5.3 `Glm5NextTextHyperConnection`, DeepSeek-V4
    /// `DeepseekV4HyperConnection`).
    #[allow(clippy::too_many_arguments)]
    fn hc_pre(
        &self,
        x: &Self::Buf,
        rows: usize,
        w: &HcWeights<'_, Self::Weight>,
        shape: &HcShape,
        p: Prec,
        out: &mut Self::Buf,
        mix: &mut Self::Buf,
    ) -> Result<()>;
    /// The output side: `x[j] = round(round(post[j]·y) + round(Σᵢ comb[i][j]·x[i]))` for
    /// every stream `j` (note the transpose: stream `j` takes column `j`).
    fn hc_post(
        &self,
        x: &mut Self::Buf,
        y: &Self::Buf,
        mix: &Self::Buf,
        rows: usize,
        shape: &HcShape,
        p: Prec,
    ) -> Result<()>;
    /// The final collapse `[rows, N, D] → [rows, D]`: the mean of the streams (GLM-5.3
    /// `Glm5NextTextHyperHead`, `w` `None`) or DeepSeek-V4's `DeepseekV4HyperHead`
    /// (`pre = sigmoid(fn·xn · scale + base) + eps`, `round(Σₙ preₙ·x[n])`).
    fn hc_head(
        &self,
        x: &Self::Buf,
        rows: usize,
        w: Option<&HcWeights<'_, Self::Weight>>,
        shape: &HcShape,
        p: Prec,
        out: &mut Self::Buf,
    ) -> Result<()>;

    // ---- linear attention ----

    /// The core of a delta-rule layer (Kimi delta attention, GLM-5.3; gated delta net,
    /// Qwen3.5) for input rows `rows` (token `i` at position `pos0 + i`):
    ///
    /// 1. causal depthwise conv of the pre-conv q, k, v rows continuing `state.conv`
    ///    (updated), SiLU, rounded;
    /// 2. q, k L2-normalised (`x / sqrt(Σx² + 1e-6)`, f32), q times `dk^-½`;
    /// 3. log decays `g` from `in.g + dt_bias` by `shape.gate`, betas
    ///    `round(sigmoid(in.beta))`;
    /// 4. the delta rule on `state.s [Hv, dk, dv]`: `S ← S·exp(g)`, `δ = (v − kᵀS)·β`,
    ///    `S ← S + k⊗δ`, `o = qᵀS`, in `form` (chunked: the reference's chunk algorithm,
    ///    chunks counted from `rows.start`), f32;
    /// 5. `out` rows `[Hv·dv]` rounded.
    ///
    /// With `journal`, the kernel inputs of each token are also written to its slot.
    #[allow(clippy::too_many_arguments)]
    fn delta_net(
        &self,
        step: &Self::Step,
        rows: Range<usize>,
        x: &DeltaIn<'_, Self>,
        w: &DeltaWeights<'_, Self::Weight>,
        state: &mut DeltaState<'_, Self>,
        journal: Option<&mut DeltaJournal<Self>>,
        shape: &DeltaShape,
        form: DeltaForm,
        p: Prec,
        out: &mut Self::Buf,
    ) -> Result<()>;
    /// Re-applies each layer's journal tokens at positions `range` to its state (conv
    /// rows shifted in, one recurrent step per head), without outputs. The layers are
    /// independent of one another (a backend may replay them side by side).
    fn delta_replay(
        &self,
        layers: &mut [DeltaReplay<'_, Self>],
        range: Range<usize>,
        shape: &DeltaShape,
    ) -> Result<()>;
    /// The gated output norm per value head: `round(w · o·rsqrt(mean(o²) + eps) ·
    /// act(z))` (KDA: sigmoid, rounded once; gated delta net: `silu`, the reference's
    /// order), over `rows` rows of `[Hv, dv]`.
    #[allow(clippy::too_many_arguments)]
    fn gated_norm(
        &self,
        o: &Self::Buf,
        z: &Self::Buf,
        w: &Self::Weight,
        rows: usize,
        shape: &DeltaShape,
        p: Prec,
        out: &mut Self::Buf,
    ) -> Result<()>;

    // ---- compressed and sparse attention ----

    /// One step of a softmax-gated window compressor. First the step's source rows
    /// `rows = [kv, gate]` (`[n, row_len]`) go into the rings `ring = [kv, gate]`
    /// (`[cap, row_len]`, slot `pos mod cap`, as [`Backend::store_rows`]); then for each
    /// window `w` completed by this step's tokens (its last source position in
    /// `pos0..pos0+n`), writes `entries[w] = round(Σⱼ round(round(softmax_j(gate_j +
    /// ape_j)) · kv_j))` per channel over the window's `m` source rows (with
    /// `shape.overlap`: the first halves of window `w−1`'s rows and the second halves of
    /// window `w`'s, `2m` slots; window `w−1 < 0` contributes nothing), then when given an
    /// RMS norm with weight `norm` (rounded) and `rope` at position `w·m`; `ape [m,
    /// row_len]`. The rings must hold every position a window reads besides the step's
    /// (`cap ≥ n +` the window's span). GLM-5.3's k-pool keys (`overlap` off, no norm, no
    /// rope) and DeepSeek-V4's compressors.
    #[allow(clippy::too_many_arguments)]
    fn compress(
        &self,
        step: &Self::Step,
        rows: [&Self::Buf; 2],
        ring: [&mut Self::Buf; 2],
        cap: usize,
        ape: &Self::Weight,
        norm: Option<&Self::Weight>,
        rope: Option<&Rope>,
        shape: &CompressShape,
        p: Prec,
        entries: &mut Self::Buf,
    ) -> Result<()>;
    /// The DSA indexer's choice for `rows` queries: query `t` (its position) sees the
    /// entries `e < (t+1)/rate`; each scores `I(e) = Σ_h w_h·ws · relu(q_h·K_e · scale)`
    /// (`q [rows, Hi·di]`, head weights `w [rows, Hi]`, `ws = shape.weights_scale`,
    /// `entries [·, di]`, f32); the `top_k` best
    /// (ties: lower id) are written sorted ascending to `ids [rows, top_k]`, `-1`-padded;
    /// a query seeing at most `top_k` entries takes all of them.
    #[allow(clippy::too_many_arguments)]
    fn dsa_select(
        &self,
        step: &Self::Step,
        q: &Self::Buf,
        w: &Self::Buf,
        entries: &Self::Buf,
        rows: usize,
        shape: &SelectShape,
        ids: &mut Self::Ids,
    ) -> Result<()>;
    /// Multi-head latent attention (GLM-5.3, no RoPE) of `q [rows, Ha·dn]` over the
    /// cached normalised latents `latent [n_ctx, rkv]` (this step's rows already
    /// stored), per head `h`: keys `k_b[h]ᵀ`-projected and values `v_b[h]`-projected
    /// latents (`k_b [Ha, rkv, dn]`, `v_b [Ha, dv, rkv]`), softmax scaled by
    /// `shape.scale`, writing `out [rows, Ha·dv]` (rounded). Query `t` attends to every
    /// token `≤ t`, or with `sel` (pool ids from [`Backend::dsa_select`]) to the tokens of
    /// its selected pools plus, when `shape.select.tail`, the incomplete pool
    /// `[P·⌊(t+1)/P⌋, t]`. `Prec::F32` may absorb `k_b` into the query and `v_b` into the
    /// output or expand the keys and values (the same math, another order); the bf16
    /// reference expands keys and values (rounded) as PyTorch does.
    #[allow(clippy::too_many_arguments)]
    fn mla_attention(
        &self,
        step: &Self::Step,
        q: &Self::Buf,
        latent: &Self::Buf,
        k_b: &Self::Weight,
        v_b: &Self::Weight,
        sel: Option<&Self::Ids>,
        rows: usize,
        shape: &MlaShape,
        p: Prec,
        out: &mut Self::Buf,
    ) -> Result<()>;
    /// DeepSeek-V4's attention of `q [rows, H·hd]`: shared-KV multi-query attention
    /// (`kv` is both key and value) over the sliding window — this step's rows `kv
    /// [rows, hd]` and earlier ones from `window [cap, hd]` (slot `pos mod cap`) — plus,
    /// with `entries`, the compressed entries `e < (t+1)/rate` (all of them, or only the
    /// ids of `sel`), and one learned sink logit per head (`sinks [H]`, f32) in the
    /// softmax denominator. Writes `out [rows, H·hd]` (rounded). The ring may already
    /// hold this step's rows (slots of positions `cap` back, so `cap ≥ window − 1 + rows`
    /// when they were stored first).
    #[allow(clippy::too_many_arguments)]
    fn sink_attention(
        &self,
        step: &Self::Step,
        q: &Self::Buf,
        kv: &Self::Buf,
        window: &Self::Buf,
        cap: usize,
        entries: Option<(&Self::Buf, Option<&Self::Ids>)>,
        sinks: &Self::Weight,
        rows: usize,
        shape: &SinkAttnShape,
        p: Prec,
        out: &mut Self::Buf,
    ) -> Result<()>;
}
