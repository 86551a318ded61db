//! The dense `llama` and `qwen2` families.
//!
//! Follows llama.cpp's graphs for these architectures (`src/models/llama.cpp`,
//! `src/models/qwen2.cpp`) over GGUF tensor names, which match Hugging Face's
//! `LlamaForCausalLM` / `Qwen2ForCausalLM` with Q/K rows permuted for interleaved RoPE
//! in llama files:
//!
//! ```text
//! x = token_embd[tokens]
//! per layer:  h = rms_norm(x) * attn_norm
//!             q, k, v = attn_q·h (+bq), attn_k·h (+bk), attn_v·h (+bv)   # biases: qwen2
//!             rope(q), rope(k)                 # interleaved (llama) / NEOX (qwen2)
//!             x += attn_output · attention(q, k, v)   # causal, grouped-query
//!             h = rms_norm(x) * ffn_norm
//!             x += ffn_down · (silu(ffn_gate·h) * ffn_up·h)
//! logits = output · (rms_norm(x) * output_norm)      # output = token_embd if tied
//! ```
//!
//! Shapes: `x` is `tokens × n_embd`; q is `tokens × n_head·head_dim`; k, v are
//! `tokens × n_head_kv·head_dim`.

use std::any::Any;
use std::io::{Read, Write};
use std::sync::Arc;

use ds4_gguf::GgufFile;

use super::{Picks, Tokens};
use crate::backend::{AttnShape, Backend, Prec, Rope};
use crate::loader::{Hparams, TensorLoader};
use crate::model::{Cache, Logits, Model, ModelInfo};
use crate::{EngineError, Result};

/// The precision policy: llama.cpp is these families' reference, so every operation
/// follows ggml's CPU arithmetic.
const PREC: Prec = Prec::Ggml;

/// Tokens evaluated per forward chunk (llama.cpp's default ubatch).
const CHUNK: usize = 512;
/// Rows of logits computed at once (bounds the logits buffer to `LOGIT_ROWS × n_vocab`).
const LOGIT_ROWS: usize = 16;

/// Which of the two dense architectures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    Llama,
    Qwen2,
}

struct Layer<B: Backend> {
    attn_norm: B::Weight,
    wq: B::Weight,
    wk: B::Weight,
    wv: B::Weight,
    bq: Option<B::Weight>,
    bk: Option<B::Weight>,
    bv: Option<B::Weight>,
    wo: B::Weight,
    ffn_norm: B::Weight,
    ffn_gate: B::Weight,
    ffn_up: B::Weight,
    ffn_down: B::Weight,
}

/// Hyperparameters of a dense model.
#[derive(Debug, Clone)]
struct Config {
    n_embd: usize,
    n_ff: usize,
    n_layer: usize,
    attn: AttnShape,
    rope: Rope,
    eps: f32,
    n_vocab: usize,
}

impl Config {
    /// K (or V) values per position of a layer.
    fn kv_dim(&self) -> usize {
        self.attn.n_head_kv * self.attn.head_dim
    }
}

/// A loaded dense model on backend `B`.
pub struct Llama<B: Backend> {
    backend: Arc<B>,
    cfg: Config,
    info: ModelInfo,
    tok_embd: B::Weight,
    output_norm: B::Weight,
    /// `None` when the output projection is tied to `tok_embd`.
    output: Option<B::Weight>,
    layers: Vec<Layer<B>>,
}

/// Scratch buffers for one chunk, sized for `CHUNK` tokens.
struct Scratch<B: Backend> {
    x: B::Buf,
    h: B::Buf,
    q: B::Buf,
    k: B::Buf,
    v: B::Buf,
    attn: B::Buf,
    o: B::Buf,
    gate: B::Buf,
    up: B::Buf,
    act: B::Buf,
    /// `LOGIT_ROWS × n_vocab`.
    logits: B::Buf,
}

/// One sequence's state: the KV cache and the scratch buffers.
pub struct LlamaCache<B: Backend> {
    backend: Arc<B>,
    kv: B::Kv,
    len: usize,
    n_ctx: usize,
    /// The KV cache's shape: layers and values per position.
    layers: usize,
    kv_dim: usize,
    scratch: Option<Scratch<B>>,
    /// Greedy choices not read yet.
    picks: Picks<B>,
}

impl<B: Backend> Llama<B> {
    /// Loads the model from `file` onto `backend`.
    pub fn load(
        backend: Arc<B>,
        file: &Arc<GgufFile>,
        variant: Variant,
        name: String,
    ) -> Result<Self> {
        let hp = Hparams::new(file)?;
        let n_embd = hp.usize("embedding_length")?;
        let n_head = hp.usize("attention.head_count")?;
        let n_head_kv = hp.usize_or("attention.head_count_kv", n_head)?;
        if n_head == 0 || n_head_kv == 0 || n_head % n_head_kv != 0 || n_embd % n_head != 0 {
            return Err(EngineError::Config(format!(
                "head counts {n_head}/{n_head_kv} do not divide embedding length {n_embd}"
            )));
        }
        let head_dim = hp.usize_or("attention.key_length", n_embd / n_head)?;
        let cfg = Config {
            n_embd,
            n_ff: hp.usize("feed_forward_length")?,
            n_layer: hp.usize("block_count")?,
            attn: AttnShape {
                n_head,
                n_head_kv,
                head_dim,
            },
            rope: Rope::plain(
                hp.usize_or("rope.dimension_count", head_dim)?,
                hp.f32_or("rope.freq_base", 10000.0)?,
                variant == Variant::Qwen2,
            ),
            eps: hp.f32("attention.layer_norm_rms_epsilon")?,
            n_vocab: 0,
        };
        let mut t = TensorLoader::new(backend.clone(), file);
        let q_dim = n_head * head_dim;
        let kv_dim = n_head_kv * head_dim;
        let tok_embd = t.embedding("token_embd.weight", n_embd)?;
        let n_vocab = t.rows_of("token_embd.weight")?;
        let output_norm = t.vector("output_norm.weight", n_embd)?;
        let output = t.optional_matrix("output.weight", n_embd, Some(n_vocab))?;
        if output.is_none() {
            t.count_reuse("token_embd.weight");
        }
        let bias = variant == Variant::Qwen2;
        let mut layers = Vec::with_capacity(cfg.n_layer);
        for i in 0..cfg.n_layer {
            let n = |s: &str| format!("blk.{i}.{s}");
            let opt_bias =
                |t: &mut TensorLoader<B>, s: &str, len: usize| -> Result<Option<B::Weight>> {
                    if bias {
                        t.optional_vector(&n(s), len)
                    } else {
                        Ok(None)
                    }
                };
            layers.push(Layer {
                attn_norm: t.vector(&n("attn_norm.weight"), n_embd)?,
                wq: t.matrix(&n("attn_q.weight"), n_embd, Some(q_dim))?,
                wk: t.matrix(&n("attn_k.weight"), n_embd, Some(kv_dim))?,
                wv: t.matrix(&n("attn_v.weight"), n_embd, Some(kv_dim))?,
                bq: opt_bias(&mut t, "attn_q.bias", q_dim)?,
                bk: opt_bias(&mut t, "attn_k.bias", kv_dim)?,
                bv: opt_bias(&mut t, "attn_v.bias", kv_dim)?,
                wo: t.matrix(&n("attn_output.weight"), q_dim, Some(n_embd))?,
                ffn_norm: t.vector(&n("ffn_norm.weight"), n_embd)?,
                ffn_gate: t.matrix(&n("ffn_gate.weight"), n_embd, Some(cfg.n_ff))?,
                ffn_up: t.matrix(&n("ffn_up.weight"), n_embd, Some(cfg.n_ff))?,
                ffn_down: t.matrix(&n("ffn_down.weight"), cfg.n_ff, Some(n_embd))?,
            });
        }
        let cfg = Config { n_vocab, ..cfg };
        let info = ModelInfo {
            architecture: hp.arch().to_string(),
            name,
            n_vocab,
            n_ctx_train: hp.usize_or("context_length", 4096)?,
            n_layer: cfg.n_layer,
            decode_weight_bytes: t.decode_bytes(),
            n_params: t.n_params(),
            backend: backend.name().to_string(),
        };
        Ok(Llama {
            backend,
            cfg,
            info,
            tok_embd,
            output_norm,
            output,
            layers,
        })
    }

    fn scratch(&self) -> Result<Scratch<B>> {
        let c = &self.cfg;
        let b = &self.backend;
        let q_dim = c.attn.n_head * c.attn.head_dim;
        let kv_dim = c.attn.n_head_kv * c.attn.head_dim;
        Ok(Scratch {
            x: b.buf(CHUNK * c.n_embd)?,
            h: b.buf(CHUNK * c.n_embd)?,
            q: b.buf(CHUNK * q_dim)?,
            k: b.buf(CHUNK * kv_dim)?,
            v: b.buf(CHUNK * kv_dim)?,
            attn: b.buf(CHUNK * q_dim)?,
            o: b.buf(CHUNK * c.n_embd)?,
            gate: b.buf(CHUNK * c.n_ff)?,
            up: b.buf(CHUNK * c.n_ff)?,
            act: b.buf(CHUNK * c.n_ff)?,
            logits: b.buf(LOGIT_ROWS * c.n_vocab)?,
        })
    }

    /// Bytes of one sequence's state at `n_ctx` tokens (the f16 KV cache and the
    /// scratch buffers).
    fn cache_bytes(&self, n_ctx: usize) -> u64 {
        self.cache_parts(n_ctx).iter().map(|p| p.1).sum()
    }

    /// [`Self::cache_bytes`] by part.
    fn cache_parts(&self, n_ctx: usize) -> [(&'static str, u64); 2] {
        let c = &self.cfg;
        let kv = 2 * c.n_layer * n_ctx * c.attn.n_head_kv * c.attn.head_dim * 2;
        let q_dim = c.attn.n_head * c.attn.head_dim;
        let kv_dim = c.attn.n_head_kv * c.attn.head_dim;
        let scratch =
            CHUNK * (3 * c.n_embd + 2 * q_dim + 2 * kv_dim + 3 * c.n_ff) + LOGIT_ROWS * c.n_vocab;
        [
            ("KV cache (f16)", kv as u64),
            ("activations", 4 * scratch as u64),
        ]
    }

    fn downcast(cache: &mut dyn Cache) -> Result<&mut LlamaCache<B>> {
        cache
            .as_any_mut()
            .downcast_mut::<LlamaCache<B>>()
            .ok_or_else(|| EngineError::Config("cache belongs to another model".into()))
    }

    /// [`Model::forward`] of given or picked tokens.
    fn forward_tokens(
        &self,
        cache: &mut dyn Cache,
        tokens: Tokens<'_>,
        logits: Logits,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let cache = Self::downcast(cache)?;
        tokens.check(cache.len, cache.n_ctx, self.cfg.n_vocab)?;
        out.clear();
        for (chunk, want) in tokens.pieces(CHUNK, logits) {
            self.backend
                .run(|| self.forward_chunk(cache, chunk, want, out))?;
        }
        Ok(())
    }

    /// Evaluates one chunk of at most `CHUNK` tokens at position `pos0`.
    fn forward_chunk(
        &self,
        cache: &mut LlamaCache<B>,
        tokens: Tokens<'_>,
        logits: Logits,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let b = &*self.backend;
        let c = &self.cfg;
        let d = c.n_embd;
        let n = tokens.len();
        if cache.scratch.is_none() {
            cache.scratch = Some(self.scratch()?);
        }
        let s = cache.scratch.as_mut().expect("allocated above");
        let step = tokens.step(b, &cache.picks, cache.len)?;
        b.embed(&step, &self.tok_embd, 1, PREC, &mut s.x)?;
        for (il, l) in self.layers.iter().enumerate() {
            b.rms_norm(&s.x, Some(&l.attn_norm), n, d, c.eps, PREC, &mut s.h)?;
            b.matmul(&l.wq, l.bq.as_ref(), &s.h, n, PREC, &mut s.q)?;
            b.matmul(&l.wk, l.bk.as_ref(), &s.h, n, PREC, &mut s.k)?;
            b.matmul(&l.wv, l.bv.as_ref(), &s.h, n, PREC, &mut s.v)?;
            b.rope(
                &step,
                &c.rope,
                c.attn.n_head,
                c.attn.head_dim,
                PREC,
                &mut s.q,
            )?;
            b.rope(
                &step,
                &c.rope,
                c.attn.n_head_kv,
                c.attn.head_dim,
                PREC,
                &mut s.k,
            )?;
            b.attention(
                &step,
                &mut cache.kv,
                il,
                &c.attn,
                &s.q,
                &s.k,
                &s.v,
                &mut s.attn,
            )?;
            b.matmul(&l.wo, None, &s.attn, n, PREC, &mut s.o)?;
            b.add(&mut s.x, &s.o, n * d, PREC)?;
            b.rms_norm(&s.x, Some(&l.ffn_norm), n, d, c.eps, PREC, &mut s.h)?;
            b.matmul(&l.ffn_gate, None, &s.h, n, PREC, &mut s.gate)?;
            b.matmul(&l.ffn_up, None, &s.h, n, PREC, &mut s.up)?;
            b.swiglu(&s.gate, &s.up, n * c.n_ff, None, PREC, &mut s.act)?;
            b.matmul(&l.ffn_down, None, &s.act, n, PREC, &mut s.o)?;
            b.add(&mut s.x, &s.o, n * d, PREC)?;
        }
        cache.len += n;
        let Some(first) = logits.first_row(n) else {
            return Ok(());
        };
        let w_out = self.output.as_ref().unwrap_or(&self.tok_embd);
        let mut row = first;
        while row < n {
            let rows = (n - row).min(LOGIT_ROWS);
            b.copy(&s.x, row * d, &mut s.o, 0, rows * d)?;
            b.rms_norm(
                &s.o,
                Some(&self.output_norm),
                rows,
                d,
                c.eps,
                PREC,
                &mut s.h,
            )?;
            b.matmul(w_out, None, &s.h, rows, PREC, &mut s.logits)?;
            cache
                .picks
                .emit(b, &step, logits, &s.logits, rows, c.n_vocab, out)?;
            row += rows;
        }
        Ok(())
    }
}

impl<B: Backend> Model for Llama<B> {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn memory_available(&self) -> Option<u64> {
        self.backend.memory_available()
    }

    fn state_parts(&self, n_ctx: usize) -> Vec<(&'static str, u64)> {
        self.cache_parts(n_ctx).to_vec()
    }

    fn new_cache(&self, n_ctx: usize) -> Result<Box<dyn Cache>> {
        let c = &self.cfg;
        crate::model::check_memory(&*self.backend, self.cache_bytes(n_ctx), n_ctx)?;
        Ok(Box::new(LlamaCache::<B> {
            backend: self.backend.clone(),
            kv: self.backend.kv(c.n_layer, n_ctx, c.kv_dim())?,
            len: 0,
            n_ctx,
            layers: c.n_layer,
            kv_dim: c.kv_dim(),
            scratch: None,
            picks: Picks::default(),
        }))
    }

    fn forward(
        &self,
        cache: &mut dyn Cache,
        tokens: &[u32],
        logits: Logits,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        self.forward_tokens(cache, Tokens::Given(tokens), logits, out)
    }

    fn forward_picked(&self, cache: &mut dyn Cache) -> Result<()> {
        self.forward_tokens(cache, Tokens::Picked, Logits::Pick, &mut Vec::new())
    }

    fn take_pick(&self, cache: &mut dyn Cache) -> Result<u32> {
        Self::downcast(cache)?.picks.take(&*self.backend)
    }

    /// The state format: `b"DS4LLMKV"`, u32 version 1, u64 `n_layer`, `kv_dim`, `n_ctx`,
    /// `len`, then the f16 bits of the cache's first `len` positions as
    /// [`Backend::kv_read`] lays them out (little-endian).
    fn write_cache(&self, cache: &dyn Cache, out: &mut dyn Write) -> Result<()> {
        let cache = cache
            .as_any()
            .downcast_ref::<LlamaCache<B>>()
            .ok_or_else(|| EngineError::State("the cache belongs to another model".into()))?;
        let c = &self.cfg;
        let mut bits = Vec::new();
        self.backend.kv_read(&cache.kv, cache.len, &mut bits)?;
        let mut buf = Vec::with_capacity(48 + 2 * bits.len());
        buf.extend_from_slice(STATE_MAGIC);
        buf.extend_from_slice(&STATE_VERSION.to_le_bytes());
        for v in [c.n_layer, c.kv_dim(), cache.n_ctx, cache.len] {
            buf.extend_from_slice(&(v as u64).to_le_bytes());
        }
        for b in bits {
            buf.extend_from_slice(&b.to_le_bytes());
        }
        out.write_all(&buf)
            .map_err(|e| EngineError::State(format!("writing the KV cache: {e}")))
    }

    fn read_cache(&self, input: &mut dyn Read) -> Result<Box<dyn Cache>> {
        let bad = |what: String| EngineError::State(format!("llama KV state: {what}"));
        let mut head = [0u8; 44];
        input
            .read_exact(&mut head)
            .map_err(|e| bad(format!("header: {e}")))?;
        if &head[..8] != STATE_MAGIC {
            return Err(bad("bad magic".into()));
        }
        let version = u32::from_le_bytes(head[8..12].try_into().expect("4 bytes"));
        if version != STATE_VERSION {
            return Err(bad(format!("version {version}, expected {STATE_VERSION}")));
        }
        let field = |i: usize| {
            u64::from_le_bytes(head[12 + 8 * i..20 + 8 * i].try_into().expect("8 bytes")) as usize
        };
        let (n_layer, kv_dim, n_ctx, len) = (field(0), field(1), field(2), field(3));
        let c = &self.cfg;
        if n_layer != c.n_layer || kv_dim != c.kv_dim() {
            return Err(bad(format!(
                "{n_layer} layers × {kv_dim} KV values, the model has {} × {}",
                c.n_layer,
                c.kv_dim()
            )));
        }
        if len > n_ctx || n_ctx > self.info.n_ctx_train.max(1) {
            return Err(bad(format!("{len} positions of a {n_ctx}-token context")));
        }
        let mut cache = self.new_cache(n_ctx)?;
        let llama = cache
            .as_any_mut()
            .downcast_mut::<LlamaCache<B>>()
            .expect("this model's cache");
        let mut raw = vec![0u8; 2 * 2 * n_layer * len * kv_dim];
        input
            .read_exact(&mut raw)
            .map_err(|e| bad(format!("{len} positions: {e}")))?;
        let bits: Vec<u16> = raw
            .chunks_exact(2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
            .collect();
        self.backend.kv_write(&mut llama.kv, len, &bits)?;
        llama.len = len;
        Ok(cache)
    }
}

const STATE_MAGIC: &[u8; 8] = b"DS4LLMKV";
const STATE_VERSION: u32 = 1;

impl<B: Backend> Cache for LlamaCache<B> {
    fn len(&self) -> usize {
        self.len
    }

    fn capacity(&self) -> usize {
        self.n_ctx
    }

    fn truncate(&mut self, n: usize) -> Result<()> {
        // Greedy choices not read are of steps this undoes, or stale.
        self.picks.clear();
        if n > self.len {
            return Err(EngineError::Rewind {
                target: n,
                reason: format!("the cache holds only {} tokens", self.len),
            });
        }
        // KV rows past `n` are simply overwritten by later steps.
        self.len = n;
        Ok(())
    }

    fn bytes(&self) -> u64 {
        let rows = self.backend.kv_capacity(&self.kv).unwrap_or(self.n_ctx);
        // K and V, f16, per layer (the layer count is in the cache's shape).
        let kv = self.layers * rows * self.kv_dim * 2 * 2;
        kv as u64
    }

    fn snapshot(&self) -> Result<Box<dyn Cache>> {
        Ok(Box::new(LlamaCache::<B> {
            backend: self.backend.clone(),
            kv: self.backend.kv_snapshot(&self.kv, self.len)?,
            len: self.len,
            n_ctx: self.n_ctx,
            layers: self.layers,
            kv_dim: self.kv_dim,
            scratch: None,
            picks: Picks::default(),
        }))
    }

    fn restore(&mut self, from: &dyn Cache) -> Result<()> {
        let from = from
            .as_any()
            .downcast_ref::<LlamaCache<B>>()
            .ok_or_else(|| EngineError::Config("snapshot belongs to another model".into()))?;
        if from.n_ctx != self.n_ctx {
            return Err(EngineError::Config(
                "snapshot has another context size".into(),
            ));
        }
        self.backend.kv_restore(&mut self.kv, &from.kv, from.len)?;
        self.len = from.len;
        Ok(())
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}
