//! The parameters of the backend operations: arithmetic policy, shapes and settings
//! that do not live in the weights. Each type names the reference it follows; the
//! operations of [`super::Backend`] document how they use them.

/// The arithmetic a family's operations follow (its precision policy, chosen by the
/// family and passed to every operation whose rounding depends on it).
///
/// - [`Prec::Ggml`]: ggml's CPU arithmetic, for the dense families whose reference is
///   llama.cpp (activations quantized per block for quantized weights, ggml's float
///   kernels and summation orders, f16 KV cache).
/// - [`Prec::F32`]: the PyTorch reference's float32 model (the MoE families): float
///   weights multiply f32 activations with f32 accumulation, results are not rounded.
///   Also the "f32 islands" of a bf16 model (products the reference runs on upcast
///   weights and f32 activations).
/// - [`Prec::Bf16`]: the reference's bfloat16 model: as `F32`, then the operation's
///   result is rounded to bfloat16 at the reference's cast point (each operation says
///   where).
///
/// Quantized weights have no PyTorch counterpart: under every policy their products
/// quantize the activations as ggml does (`ds4_quant`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Prec {
    Ggml,
    F32,
    Bf16,
}

impl Prec {
    /// Rounds `x` to the policy's activation type (a no-op except for `Bf16`).
    #[inline]
    pub fn round(self, x: f32) -> f32 {
        if self == Prec::Bf16 {
            half::bf16::from_f32(x).to_f32()
        } else {
            x
        }
    }

    /// Rounds every value of `v` (see [`Prec::round`]).
    #[inline]
    pub fn round_all(self, v: &mut [f32]) {
        if self == Prec::Bf16 {
            for x in v {
                *x = half::bf16::from_f32(*x).to_f32();
            }
        }
    }
}

/// Rotary position embedding.
///
/// ggml's `rope` (the dense families, [`Prec::Ggml`]) rotates the first `n_dims`
/// dimensions of each head with angles advanced by repeated f32 multiplication. The
/// PyTorch references ([`Prec::F32`]/[`Prec::Bf16`]) compute
/// `inv_freq = 1 / base^(2i/n_dims)` and `angle = pos · inv_freq` in f32, optionally
/// YaRN-scaled, on the leading (`Qwen`) or trailing (`DeepSeek-V4`, `[nope | rope]`)
/// `n_dims` dimensions of each head.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rope {
    /// Rotated dimensions per head (`{arch}.rope.dimension_count`, usually the head size).
    pub n_dims: usize,
    /// `{arch}.rope.freq_base`.
    pub freq_base: f32,
    /// Pair layout: interleaved `(2i, 2i+1)` (llama; GGUF permutes Q/K for this;
    /// DeepSeek-V4) or NEOX halves `(i, i + n_dims/2)` (qwen2, Qwen3.5).
    pub neox: bool,
    /// The rotated dimensions are the last `n_dims` of the head (DeepSeek-V4) instead
    /// of the first.
    pub trailing: bool,
    /// YaRN frequency scaling (DeepSeek-V4's `compress` rope), if any.
    pub yarn: Option<Yarn>,
    /// Rotate by `−angle` (DeepSeek-V4 un-rotates the attention output's rope slice).
    pub inverse: bool,
}

impl Rope {
    /// The PyTorch references' inverse frequencies (`n_dims / 2` values):
    /// `1 / base^(2i/n)` in f32, YaRN-blended as `_compute_yarn_parameters` does.
    pub fn inv_freq(&self) -> Vec<f32> {
        let dim = self.n_dims;
        let base = self.freq_base;
        // base ** (arange(0, dim, 2) / dim) in f32.
        let pos_freqs: Vec<f32> = (0..dim / 2)
            .map(|i| base.powf((2 * i) as f32 / dim as f32))
            .collect();
        let Some(y) = self.yarn else {
            return pos_freqs.iter().map(|p| 1.0 / p).collect();
        };
        let correction_dim = |rot: f64| {
            (dim as f64
                * (y.original_max_position as f64 / (rot * 2.0 * std::f64::consts::PI)).ln())
                / (2.0 * (base as f64).ln())
        };
        let (mut low, mut high) = (
            correction_dim(y.beta_fast as f64),
            correction_dim(y.beta_slow as f64),
        );
        if y.truncate {
            low = low.floor();
            high = high.ceil();
        }
        let (low, mut high) = (low.max(0.0), high.min(dim as f64 - 1.0));
        if low == high {
            high += 0.001;
        }
        let (low, high) = (low as f32, high as f32);
        pos_freqs
            .iter()
            .enumerate()
            .map(|(i, &p)| {
                let ramp = ((i as f32 - low) / (high - low)).clamp(0.0, 1.0);
                let extrapolation = 1.0 - ramp;
                let inter = 1.0 / (y.factor * p);
                let extra = 1.0 / p;
                inter * (1.0 - extrapolation) + extra * extrapolation
            })
            .collect()
    }

    /// The dense families' rope: the first `n_dims` dimensions, no scaling.
    pub fn plain(n_dims: usize, freq_base: f32, neox: bool) -> Self {
        Rope {
            n_dims,
            freq_base,
            neox,
            trailing: false,
            yarn: None,
            inverse: false,
        }
    }
}

/// YaRN parameters (`transformers` `_compute_yarn_parameters`): frequencies below
/// `beta_slow` rotations over the original context are interpolated by `factor`,
/// above `beta_fast` kept, linearly ramped between; cos/sin scaled by `mscale`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Yarn {
    pub factor: f32,
    pub original_max_position: usize,
    pub beta_fast: f32,
    pub beta_slow: f32,
    /// The attention factor multiplying cos and sin (`0.1·ln(factor) + 1` by default).
    pub mscale: f32,
    /// Round the correction range outwards to whole dimensions (the default).
    pub truncate: bool,
}

/// Shape of a grouped-query attention layer over a [`super::Backend::Kv`] cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttnShape {
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
}

/// How router logits become expert scores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scoring {
    /// `sigmoid(l)` (GLM-5.3, DeepSeek-V3).
    Sigmoid,
    /// `softmax(l)` over all experts (Qwen3.5-MoE).
    Softmax,
    /// `sqrt(softplus(l))` (DeepSeek-V4).
    SqrtSoftplus,
}

/// Router settings of an MoE layer (see [`super::Backend::moe_route`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Routing {
    pub scoring: Scoring,
    /// Experts in the layer `[E]`.
    pub n_expert: usize,
    /// Experts per token `[k]`.
    pub n_used: usize,
    /// Expert groups and how many stay (group-limited routing: a group scores the sum
    /// of its two best biased scores; 1 = ungrouped).
    pub n_group: usize,
    pub topk_group: usize,
    /// Renormalise the selected weights to sum 1 (`/ (Σ + 1e-20)`).
    pub norm: bool,
    /// `routed_scaling_factor`.
    pub scale: f32,
}

/// Manifold hyper-connection settings (mHC; GLM-5.3 and DeepSeek-V4).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HcShape {
    /// Streams `[N]` (`hc_mult`).
    pub n: usize,
    /// Hidden size `[D]`.
    pub d: usize,
    /// Sinkhorn iterations.
    pub iters: usize,
    /// `hc_eps`.
    pub eps: f32,
    /// Epsilon of the unweighted RMS norm of the flattened streams.
    pub norm_eps: f32,
}

impl HcShape {
    /// Mixing values per token: `post [N]` then `comb [N, N]`.
    pub fn mix_len(&self) -> usize {
        self.n + self.n * self.n
    }
}

/// The forget-gate form of a delta-rule layer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Gate {
    /// `g = lb · sigmoid(a · (x + dt_bias))` (KDA with `linear_lower_bound`).
    LowerBound(f32),
    /// `g = −a · softplus(x + dt_bias)` (KDA without a bound; gated delta net).
    Softplus,
}

/// The activation of a delta-rule layer's gated output norm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutGate {
    /// `sigmoid(z)` (KDA).
    Sigmoid,
    /// `silu(z)` (gated delta net, Qwen3.5).
    Silu,
}

/// Shape of a delta-rule linear-attention layer (KDA, gated delta net).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DeltaShape {
    /// Query/key heads `[Hk]` and their size `[dk]`.
    pub k_heads: usize,
    pub k_dim: usize,
    /// Value heads `[Hv]` (a multiple of `Hk`; queries and keys are shared by
    /// `Hv / Hk` value heads) and their size `[dv]`.
    pub v_heads: usize,
    pub v_dim: usize,
    /// Causal conv kernel `[Kc]`.
    pub kernel: usize,
    pub gate: Gate,
    /// Log-decay channels per value head: `dk` (KDA: per channel) or 1 (gated delta net:
    /// one per head).
    pub gate_channels: usize,
    pub out_gate: OutGate,
    /// Epsilon of the gated output norm.
    pub eps: f32,
}

impl DeltaShape {
    /// Channels of the query and key rows `Hk·dk`.
    pub fn qk_len(&self) -> usize {
        self.k_heads * self.k_dim
    }

    /// Channels of the value rows `Hv·dv`.
    pub fn v_len(&self) -> usize {
        self.v_heads * self.v_dim
    }

    /// Values of one head's recurrent state `[dk, dv]`.
    pub fn state_len(&self) -> usize {
        self.v_heads * self.k_dim * self.v_dim
    }

    /// Values of the conv state `[Kc − 1, 2·Hk·dk + Hv·dv]`.
    pub fn conv_len(&self) -> usize {
        (self.kernel - 1) * (2 * self.qk_len() + self.v_len())
    }

    /// Log-decay values per token `[Hv · gate_channels]`.
    pub fn g_len(&self) -> usize {
        self.v_heads * self.gate_channels
    }
}

/// Which form of the delta rule runs (the reference picks by call shape).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeltaForm {
    /// One token at a time (`recurrent_*`).
    Recurrent,
    /// Chunks of `n` tokens counted from the first row of the call (`chunk_*`).
    Chunked(usize),
}

/// Shape of a multi-head latent attention layer without RoPE (GLM-5.3).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MlaShape {
    /// Heads `[Ha]`, query/key head size `[dn]`, value head size `[dv]`, latent rank
    /// `[rkv]`.
    pub heads: usize,
    pub qk_dim: usize,
    pub v_dim: usize,
    pub rank: usize,
    /// Softmax scale (`qk_head_dim^-½`).
    pub scale: f32,
    /// Token selection by pools (see [`super::Backend::mla_attention`]).
    pub select: Option<PoolSelect>,
}

/// How pool ids from [`super::Backend::dsa_select`] become attended tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolSelect {
    /// Tokens per pool `[P]`.
    pub pool: usize,
    /// Pool ids per query (the `-1`-padded width of the selection rows).
    pub per_query: usize,
    /// Also attend to the incomplete pool's tokens `[P·⌊(t+1)/P⌋, t]`.
    pub tail: bool,
}

/// Settings of the DSA indexer's selection (GLM-5.3's k-pool indexer and DeepSeek-V4's
/// lightning indexer).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SelectShape {
    /// Indexer heads `[Hi]` and head size `[di]`.
    pub heads: usize,
    pub dim: usize,
    /// Source tokens per compressed entry (`index_kpool` / `compress_rate`): the query at
    /// position `t` sees entries `e < (t+1) / rate`.
    pub rate: usize,
    /// Entries kept per query.
    pub top_k: usize,
    /// The score scale applied to each head's `q·K` (`di^-½`).
    pub scale: f32,
    /// The scale of the head weights `w` (`Hi^-½`).
    pub weights_scale: f32,
}

/// Settings of softmax-gated window compression (GLM-5.3's k-pool keys, DeepSeek-V4's
/// compressors; see [`super::Backend::compress`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CompressShape {
    /// Source tokens per window `[m]`.
    pub rate: usize,
    /// Entry size `[c]`.
    pub dim: usize,
    /// Overlapping windows (DeepSeek-V4 CSA): source rows are `2c` wide, window `w`
    /// combines the first halves of window `w−1` with the second halves of window `w`.
    pub overlap: bool,
    /// Epsilon of the entry's RMS norm (when a norm weight is given).
    pub norm_eps: f32,
}

impl CompressShape {
    /// Values per source row (`2c` with overlap, else `c`).
    pub fn row_len(&self) -> usize {
        if self.overlap { 2 * self.dim } else { self.dim }
    }

    /// Source rows the ring of [`super::Backend::compress`] keeps: two windows.
    pub fn ring_rows(&self) -> usize {
        2 * self.rate
    }
}

/// Shape of DeepSeek-V4's attention: shared-KV multi-query attention over a sliding
/// window of raw entries plus compressed entries, with a learned sink per head.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SinkAttnShape {
    pub heads: usize,
    pub head_dim: usize,
    /// Tokens a query sees in the window, itself included.
    pub window: usize,
    /// Softmax scale.
    pub scale: f32,
    /// Source tokens per compressed entry (0: no compressed entries).
    pub rate: usize,
    /// Entry ids per query in a selection (`-1`-padded rows).
    pub per_query: usize,
}
