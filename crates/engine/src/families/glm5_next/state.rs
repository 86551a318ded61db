//! One sequence's state for a `glm5_next` model (doc §11) and how it rewinds.
//!
//! | layer | state | truncatable |
//! | --- | --- | --- |
//! | KDA | conv rows `[Kc−1, 3·qkv]` (model dtype) + recurrent state `[Hk, dk, dv]` f32 | no: restored |
//! | MLA `full` | normalised latents `[T, rkv]`, indexer rows `k`, `gs` `[T, di]`, pooled keys `[T/P, di]` | yes |
//! | MLA `shared` | normalised latents `[T, rkv]` | yes |
//!
//! **Rewinding KDA.** The recurrence cannot be undone, so every KDA layer keeps its
//! state at a *base* position `b` plus a *journal* of the per-token kernel inputs since
//! then (pre-conv row, normalised `k`, `v`, log decay `g`, `beta`): about
//! `6·qkv` floats per token and layer. Truncating to any `n` with `b ≤ n ≤ len` restores
//! the base and replays `n − b` recurrent steps — no model evaluation, so a speculative
//! decoder can roll back one or several tokens cheaply. The base advances as the
//! sequence grows so that the journal holds between `window` and `2·window` tokens
//! (`window` = [`DEFAULT_REWIND_WINDOW`], settable): in a prefill call the base is taken
//! at a 64-token chunk boundary of the call (the chunked kernel's state there is exact),
//! in decode by replaying journal entries into the base every `window` tokens.
//!
//! **Anchors.** At the end of every prefill call (a multi-token call that does not ask
//! for every row) the base and journal are also kept as an [`Anchor`] (the last
//! [`DEFAULT_ANCHORS`]): a chat's next turn usually diverges a few tokens before the
//! previous prompt's end (the template renders the last assistant turn differently), and
//! such a position stays reachable after hundreds of generated tokens.
//! Truncating elsewhere below `b` fails with [`EngineError::Rewind`] naming the
//! reachable positions; [`Cache::rewind_point`] gives the nearest one below, from
//! which the caller re-evaluates (or it restores a snapshot).
//!
//! Replayed states use the recurrent form; the original may have used the chunked form.
//! The two agree to float rounding (doc §4.6), so rewind-then-replay reproduces the
//! logits within the f32 tolerance.

use std::any::Any;

use super::kda::{KernelInputs, delta_step};
use crate::model::Cache;
use crate::{EngineError, Result};

/// Tokens of KDA rewind the cache guarantees by default (see the module header).
pub const DEFAULT_REWIND_WINDOW: usize = 16;

/// A KDA layer's state at one position.
#[derive(Clone, Debug, PartialEq)]
pub struct KdaState {
    /// The last `Kc − 1` pre-conv rows `[Kc−1, 3·qkv]`, oldest first (zeros before the
    /// first token).
    pub conv: Vec<f32>,
    /// `[Hk, dk, dv]`, f32.
    pub s: Vec<f32>,
}

impl KdaState {
    fn new(conv_len: usize, s_len: usize) -> Self {
        KdaState {
            conv: vec![0.0; conv_len],
            s: vec![0.0; s_len],
        }
    }

    /// Copies `other` into `self` (same shapes).
    pub fn copy_from(&mut self, other: &KdaState) {
        self.conv.copy_from_slice(&other.conv);
        self.s.copy_from_slice(&other.s);
    }

    fn zero(&mut self) {
        self.conv.iter_mut().for_each(|v| *v = 0.0);
        self.s.iter_mut().for_each(|v| *v = 0.0);
    }
}

/// Per-token KDA kernel inputs since the base position (see the module header).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Journal {
    /// Pre-conv rows `[n, 3·qkv]`.
    pub pre: Vec<f32>,
    /// Normalised keys, values and log decays `[n, qkv]`.
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    pub g: Vec<f32>,
    /// `[n, Hk]`.
    pub beta: Vec<f32>,
}

impl Journal {
    /// Appends token `t` of a call's kernel inputs.
    pub fn push(&mut self, pre: &[f32], ki: &KernelInputs, t: usize, qkv: usize, heads: usize) {
        self.pre.extend_from_slice(pre);
        self.k.extend_from_slice(&ki.k[t * qkv..(t + 1) * qkv]);
        self.v.extend_from_slice(&ki.v[t * qkv..(t + 1) * qkv]);
        self.g.extend_from_slice(&ki.g[t * qkv..(t + 1) * qkv]);
        self.beta
            .extend_from_slice(&ki.beta[t * heads..(t + 1) * heads]);
    }

    /// Applies entries `range` to `st` (conv rows shift in, one delta step per head).
    fn replay(
        &self,
        st: &mut KdaState,
        range: std::ops::Range<usize>,
        heads: usize,
        head_dim: usize,
    ) {
        let qkv = heads * head_dim;
        let c = 3 * qkv;
        for t in range {
            if !st.conv.is_empty() {
                st.conv.rotate_left(c);
                let n = st.conv.len();
                st.conv[n - c..].copy_from_slice(&self.pre[t * c..(t + 1) * c]);
            }
            for h in 0..heads {
                let r = t * qkv + h * head_dim..t * qkv + (h + 1) * head_dim;
                let sh = &mut st.s[h * head_dim * head_dim..(h + 1) * head_dim * head_dim];
                delta_step(
                    sh,
                    &self.k[r.clone()],
                    &self.v[r.clone()],
                    &self.g[r],
                    self.beta[t * heads + h],
                );
            }
        }
    }

    /// Drops the first `n` entries.
    fn drop_front(&mut self, n: usize, heads: usize, qkv: usize) {
        self.pre.drain(..n * 3 * qkv);
        self.k.drain(..n * qkv);
        self.v.drain(..n * qkv);
        self.g.drain(..n * qkv);
        self.beta.drain(..n * heads);
    }

    /// Keeps the first `n` entries.
    fn truncate(&mut self, n: usize, heads: usize, qkv: usize) {
        self.pre.truncate(n * 3 * qkv);
        self.k.truncate(n * qkv);
        self.v.truncate(n * qkv);
        self.g.truncate(n * qkv);
        self.beta.truncate(n * heads);
    }
}

/// A KDA layer: live state, base state, journal.
#[derive(Clone, Debug, PartialEq)]
pub struct KdaLayer {
    pub live: KdaState,
    pub base: KdaState,
    pub journal: Journal,
    pub heads: usize,
    pub head_dim: usize,
}

/// The DSA indexer's cached rows of a `full` layer.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct IndexerState {
    /// `k_norm(wk x)` per token `[T, di]`.
    pub k: Vec<f32>,
    /// `gate x` per token `[T, di]`.
    pub gs: Vec<f32>,
    /// Keys of the complete pools `[⌊T/P⌋, di]` (a complete pool's key never changes).
    pub pooled: Vec<f32>,
}

/// An MLA layer: latents and, for `full` layers, the indexer rows.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MlaLayer {
    /// Normalised latents `[T, rkv]` (stored after `kv_a_layernorm`).
    pub latent: Vec<f32>,
    pub indexer: Option<IndexerState>,
}

/// One layer's state.
#[derive(Clone, Debug, PartialEq)]
pub enum LayerState {
    Kda(KdaLayer),
    Mla(MlaLayer),
}

/// Shapes the cache needs from the model.
#[derive(Clone, Debug, PartialEq)]
pub struct CacheShape {
    /// Per layer: `Some((heads, head_dim, conv_rows))` for KDA, `None` for MLA with
    /// `has_indexer` in the second tuple.
    pub layers: Vec<LayerShape>,
    pub rkv: usize,
    pub index_head_dim: usize,
    pub kpool: usize,
    /// A fingerprint of the model's hyperparameters (checked on restore and load).
    pub fingerprint: u64,
}

/// The shape of one layer's state.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum LayerShape {
    Kda {
        heads: usize,
        head_dim: usize,
        kernel: usize,
    },
    Mla {
        full_indexer: bool,
    },
}

/// The cache of a `glm5_next` sequence (see the module header).
#[derive(Clone, Debug, PartialEq)]
pub struct Glm5NextCache {
    pub(crate) shape: CacheShape,
    pub(crate) layers: Vec<LayerState>,
    pub(crate) len: usize,
    pub(crate) n_ctx: usize,
    /// Position of every KDA layer's base state.
    pub(crate) base: usize,
    pub(crate) window: usize,
    /// Rewind points kept from the ends of earlier prefill calls, oldest first.
    pub(crate) anchors: Vec<Anchor>,
}

/// The KDA base states and journals of all KDA layers as they were at the end of a
/// prefill call: positions `base..=end` stay reachable after the live journal has moved
/// on (a chat's next turn usually diverges a few tokens before the previous prompt's
/// end, where the template renders the last assistant turn differently).
#[derive(Clone, Debug, PartialEq)]
pub struct Anchor {
    pub base: usize,
    pub end: usize,
    /// Per KDA layer, in layer order.
    pub states: Vec<KdaState>,
    pub journals: Vec<Journal>,
}

/// Prefill-end anchors kept by default.
pub const DEFAULT_ANCHORS: usize = 2;

impl Glm5NextCache {
    /// An empty cache of `n_ctx` tokens.
    pub fn new(shape: CacheShape, n_ctx: usize) -> Self {
        let layers = shape
            .layers
            .iter()
            .map(|l| match *l {
                LayerShape::Kda {
                    heads,
                    head_dim,
                    kernel,
                } => {
                    let conv = (kernel - 1) * 3 * heads * head_dim;
                    let s = heads * head_dim * head_dim;
                    LayerState::Kda(KdaLayer {
                        live: KdaState::new(conv, s),
                        base: KdaState::new(conv, s),
                        journal: Journal::default(),
                        heads,
                        head_dim,
                    })
                }
                LayerShape::Mla { full_indexer } => LayerState::Mla(MlaLayer {
                    latent: Vec::new(),
                    indexer: full_indexer.then(IndexerState::default),
                }),
            })
            .collect();
        Glm5NextCache {
            shape,
            layers,
            len: 0,
            n_ctx,
            base: 0,
            window: DEFAULT_REWIND_WINDOW,
            anchors: Vec::new(),
        }
    }

    /// Sets how many tokens of KDA rewind are guaranteed (the journal holds up to twice
    /// as many). 0 keeps no journal: only the current length is reachable.
    pub fn set_rewind_window(&mut self, window: usize) {
        self.window = window;
    }

    /// The earliest length [`Cache::truncate`] can reach through the live journal
    /// (besides 0, always reachable, and the ranges of [`Glm5NextCache::anchors`]).
    pub fn earliest_rewind(&self) -> usize {
        if self.has_kda() { self.base } else { 0 }
    }

    /// Position ranges reachable through the prefill-end anchors.
    pub fn anchors(&self) -> Vec<std::ops::RangeInclusive<usize>> {
        self.anchors.iter().map(|a| a.base..=a.end).collect()
    }

    /// KDA heads and head size (every KDA layer of a model has the same).
    fn kda_dims(&self) -> (usize, usize) {
        self.shape
            .layers
            .iter()
            .find_map(|l| match *l {
                LayerShape::Kda {
                    heads, head_dim, ..
                } => Some((heads, head_dim)),
                LayerShape::Mla { .. } => None,
            })
            .unwrap_or((0, 0))
    }

    fn has_kda(&self) -> bool {
        self.layers.iter().any(|l| matches!(l, LayerState::Kda(_)))
    }

    /// Records the current KDA base and journal as an anchor (after a prefill call).
    pub(crate) fn push_anchor(&mut self) {
        if !self.has_kda() {
            return;
        }
        let (mut states, mut journals) = (Vec::new(), Vec::new());
        for l in &self.layers {
            if let LayerState::Kda(kl) = l {
                states.push(kl.base.clone());
                journals.push(kl.journal.clone());
            }
        }
        let end = self.len;
        self.anchors.retain(|a| a.end != end);
        self.anchors.push(Anchor {
            base: self.base,
            end,
            states,
            journals,
        });
        let excess = self.anchors.len().saturating_sub(DEFAULT_ANCHORS);
        self.anchors.drain(..excess);
    }

    /// Decides, before a call of `s` tokens at the current length, where the KDA base
    /// will be afterwards: `Plan::Keep`, `Plan::Capture(r)` (after `r` tokens of the
    /// call: a multiple of 64 or `s`), or `Plan::Fold(pos)` (replay the journal up to
    /// `pos ≤ len` first). `decode` calls can only capture after their token.
    pub(crate) fn plan(&self, s: usize, decode: bool) -> Plan {
        let e = self.len + s;
        let w = self.window;
        if e - self.base <= 2 * w {
            return Plan::Keep;
        }
        let target = e - w;
        let mut best = None;
        if decode {
            if self.len < target {
                best = Some(1);
            }
        } else {
            let mut r = super::kda::CHUNK;
            while r < s {
                if self.len + r <= target {
                    best = Some(r);
                }
                r += super::kda::CHUNK;
            }
            if e <= target {
                best = Some(s);
            }
        }
        match best {
            Some(r) => Plan::Capture(r),
            None => Plan::Fold(target.min(self.len)),
        }
    }

    /// Replays every KDA journal up to position `pos` into the base and drops those
    /// entries (the base moves to `pos`).
    pub(crate) fn fold(&mut self, pos: usize) {
        let k = pos.saturating_sub(self.base);
        if k == 0 {
            return;
        }
        for l in &mut self.layers {
            if let LayerState::Kda(kl) = l {
                kl.journal.replay(&mut kl.base, 0..k, kl.heads, kl.head_dim);
                kl.journal.drop_front(k, kl.heads, kl.heads * kl.head_dim);
            }
        }
        self.base = pos;
    }

    /// After a call that started at `s0` and captured the base after `r` of its tokens:
    /// the journal entries from before the call are dropped (the call recorded only
    /// its tokens from `r` on) and the base moves to `s0 + r`.
    pub(crate) fn after_capture(&mut self, s0: usize, r: usize) {
        let old = s0 - self.base;
        for l in &mut self.layers {
            if let LayerState::Kda(kl) = l {
                kl.journal.drop_front(old, kl.heads, kl.heads * kl.head_dim);
            }
        }
        self.base = s0 + r;
    }

    /// The first relative token of a call starting now that the journal must record,
    /// given the plan.
    pub(crate) fn journal_from(&self, plan: Plan) -> usize {
        match plan {
            Plan::Capture(r) => r,
            _ => 0,
        }
    }

    fn reset(&mut self) {
        for l in &mut self.layers {
            match l {
                LayerState::Kda(kl) => {
                    kl.live.zero();
                    kl.base.zero();
                    kl.journal = Journal::default();
                }
                LayerState::Mla(m) => {
                    m.latent.clear();
                    if let Some(ix) = &mut m.indexer {
                        *ix = IndexerState::default();
                    }
                }
            }
        }
        self.len = 0;
        self.base = 0;
        self.anchors.clear();
    }

    fn truncate_rows(&mut self, n: usize) {
        let rkv = self.shape.rkv;
        let di = self.shape.index_head_dim;
        let p = self.shape.kpool;
        for l in &mut self.layers {
            if let LayerState::Mla(m) = l {
                m.latent.truncate(n * rkv);
                if let Some(ix) = &mut m.indexer {
                    ix.k.truncate(n * di);
                    ix.gs.truncate(n * di);
                    ix.pooled.truncate((n / p) * di);
                }
            }
        }
    }
}

/// Where the KDA base goes during a call (see [`Glm5NextCache::plan`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Plan {
    Keep,
    Capture(usize),
    Fold(usize),
}

impl Cache for Glm5NextCache {
    fn len(&self) -> usize {
        self.len
    }

    fn capacity(&self) -> usize {
        self.n_ctx
    }

    /// The largest length `≤ n` that [`Cache::truncate`] can reach (0 at worst): a caller
    /// wanting `n` truncates there and re-evaluates the tokens in between.
    fn rewind_point(&self, n: usize) -> usize {
        let n = n.min(self.len);
        if !self.has_kda() || n >= self.base {
            return n;
        }
        self.anchors
            .iter()
            .filter(|a| a.base <= n)
            .map(|a| a.end.min(n))
            .max()
            .unwrap_or(0)
    }

    fn truncate(&mut self, n: usize) -> Result<()> {
        if n > self.len {
            return Err(EngineError::Rewind {
                target: n,
                reason: format!("the cache holds only {} tokens", self.len),
            });
        }
        if n == self.len {
            return Ok(());
        }
        if n == 0 {
            self.reset();
            return Ok(());
        }
        if n < self.base {
            // Back to the anchor that reaches n, if any: its base and journal become live.
            let Some(i) = self.anchors.iter().rposition(|a| a.base <= n && n <= a.end) else {
                return Err(EngineError::Rewind {
                    target: n,
                    reason: format!(
                        "the KDA recurrent state can be rewound only to positions {}..={} and {:?} (and 0); \
                         truncate to rewind_point({n}) = {} and re-evaluate, or restore a snapshot",
                        self.base,
                        self.len,
                        self.anchors(),
                        self.rewind_point(n)
                    ),
                });
            };
            let a = self.anchors[i].clone();
            let mut k = 0;
            for l in &mut self.layers {
                if let LayerState::Kda(kl) = l {
                    kl.base = a.states[k].clone();
                    kl.journal = a.journals[k].clone();
                    k += 1;
                }
            }
            self.base = a.base;
        }
        self.anchors.retain(|a| a.base <= n);
        let (heads, head_dim) = self.kda_dims();
        for a in &mut self.anchors {
            if a.end > n {
                for j in &mut a.journals {
                    j.truncate(n - a.base, heads, heads * head_dim);
                }
                a.end = n;
            }
        }
        let k = n - self.base;
        for l in &mut self.layers {
            if let LayerState::Kda(kl) = l {
                kl.live.copy_from(&kl.base);
                kl.journal.replay(&mut kl.live, 0..k, kl.heads, kl.head_dim);
                kl.journal.truncate(k, kl.heads, kl.heads * kl.head_dim);
            }
        }
        self.truncate_rows(n);
        self.len = n;
        Ok(())
    }

    fn snapshot(&self) -> Box<dyn Cache> {
        Box::new(self.clone())
    }

    fn restore(&mut self, from: &dyn Cache) -> Result<()> {
        let from = from
            .as_any()
            .downcast_ref::<Glm5NextCache>()
            .ok_or_else(|| {
                EngineError::Config("snapshot belongs to another model family".into())
            })?;
        if from.shape != self.shape {
            return Err(EngineError::Config(
                "snapshot belongs to a glm5_next model of another shape".into(),
            ));
        }
        let n_ctx = self.n_ctx;
        *self = from.clone();
        self.n_ctx = n_ctx.max(from.len);
        Ok(())
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}
