//! One sequence's state for a `glm5_next` model (doc §11), held in backend buffers, and
//! how it rewinds.
//!
//! | layer | state | truncatable |
//! | --- | --- | --- |
//! | KDA | conv rows `[Kc−1, 3·qkv]` (model dtype) + recurrent state `[Hk, dk, dv]` f32 | no: restored |
//! | MLA `full` | normalised latents `[n_ctx, rkv]`, indexer rows `k`, `gs` `[n_ctx, di]`, pooled keys `[n_ctx/P, di]` | yes |
//! | MLA `shared` | normalised latents `[n_ctx, rkv]` | yes |
//!
//! **Rewinding KDA.** The recurrence cannot be undone, so every KDA layer keeps its
//! state at a *base* position `b` plus a *journal*: a ring of the per-token kernel
//! inputs (pre-conv row, normalised `k`, `v`, log decay `g`, `beta`; about `6·qkv`
//! floats per token and layer), slot `pos mod cap`. Truncating to any `n` with
//! `b ≤ n ≤ len` restores the base and replays `n − b` recurrent steps
//! ([`crate::backend::Backend::delta_replay`]) — no model evaluation, so a speculative
//! decoder can roll back one or several tokens cheaply. The base advances as the
//! sequence grows so that the journal holds between `window` and `2·window` tokens
//! (`window` = [`DEFAULT_REWIND_WINDOW`], settable): in a prefill call the base is taken
//! at a 64-token chunk boundary of the call (the family splits the chunked kernel
//! there, which changes nothing), in decode by replaying journal entries into the base
//! every `window` tokens.
//!
//! **Anchors.** At the end of every prefill call (a multi-token call that does not ask
//! for every row) the base and journal are also kept as an [`Anchor`] (the last
//! [`DEFAULT_ANCHORS`]): a chat's next turn usually diverges a few tokens before the
//! previous prompt's end (the template renders the last assistant turn differently), and
//! such a position stays reachable after hundreds of generated tokens. Truncating
//! elsewhere below `b` fails with [`EngineError::Rewind`] naming the reachable
//! positions; [`Cache::rewind_point`] gives the nearest one below, from which the
//! caller re-evaluates (or it restores a snapshot).
//!
//! Replayed states use the recurrent form; the original may have used the chunked form.
//! The two agree to float rounding (doc §4.6), so rewind-then-replay reproduces the
//! logits within the f32 tolerance.

use std::any::Any;
use std::sync::Arc;

use super::kda::CHUNK;
use crate::backend::{Backend, DeltaJournal, DeltaReplay, DeltaShape, DeltaState};
use crate::model::Cache;
use crate::{EngineError, Result};

/// Tokens of KDA rewind the cache guarantees by default (see the module header).
pub const DEFAULT_REWIND_WINDOW: usize = 16;
/// Prefill-end anchors kept by default.
pub const DEFAULT_ANCHORS: usize = 2;

/// Journal slots for a rewind window: the journal holds at most `2·window` tokens after
/// a call, or `window` plus less than one chunk when the base is captured in a prefill.
pub fn journal_cap(window: usize) -> usize {
    (2 * window).max(window + CHUNK)
}

/// Shapes the cache needs from the model.
#[derive(Clone, Debug, PartialEq)]
pub struct CacheShape {
    pub layers: Vec<LayerShape>,
    /// The KDA layers' shape.
    pub delta: DeltaShape,
    pub rkv: usize,
    pub index_head_dim: usize,
    pub kpool: usize,
    /// A fingerprint of the model's hyperparameters (checked on restore and load).
    pub fingerprint: u64,
}

/// The shape of one layer's state.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum LayerShape {
    Kda,
    Mla { full_indexer: bool },
}

/// A KDA layer's state at one position.
pub struct KdaState<B: Backend> {
    /// The last `Kc − 1` pre-conv rows `[Kc−1, 3·qkv]`, oldest first.
    pub conv: B::Buf,
    /// `[Hk, dk, dv]`, f32.
    pub s: B::Buf,
}

/// A KDA layer: live state, base state, journal.
pub struct KdaLayer<B: Backend> {
    pub live: KdaState<B>,
    pub base: KdaState<B>,
    pub journal: DeltaJournal<B>,
}

/// The DSA indexer's cached rows of a `full` layer.
pub struct IndexerState<B: Backend> {
    /// `k_norm(wk x)` and `gate x` per token `[n_ctx, di]`.
    pub k: B::Buf,
    pub gs: B::Buf,
    /// Keys of the complete pools `[n_ctx/P, di]` (a complete pool's key never changes).
    pub pooled: B::Buf,
}

/// An MLA layer: latents and, for `full` layers, the indexer rows.
pub struct MlaLayer<B: Backend> {
    /// Normalised latents `[n_ctx, rkv]` (stored after `kv_a_layernorm`).
    pub latent: B::Buf,
    pub indexer: Option<IndexerState<B>>,
}

/// One layer's state.
pub enum LayerState<B: Backend> {
    Kda(KdaLayer<B>),
    Mla(MlaLayer<B>),
}

/// The KDA layers among `layers`, in order.
fn kdas<B: Backend>(layers: &[LayerState<B>]) -> impl Iterator<Item = &KdaLayer<B>> {
    layers.iter().filter_map(|l| match l {
        LayerState::Kda(k) => Some(k),
        LayerState::Mla(_) => None,
    })
}

/// The KDA layers among `layers`, in order, to change.
fn kdas_mut<B: Backend>(layers: &mut [LayerState<B>]) -> impl Iterator<Item = &mut KdaLayer<B>> {
    layers.iter_mut().filter_map(|l| match l {
        LayerState::Kda(k) => Some(k),
        LayerState::Mla(_) => None,
    })
}

/// The KDA base states and journals of all KDA layers as they were at the end of a
/// prefill call: positions `base..=end` stay reachable after the live journal has moved
/// on (see the module header).
pub struct Anchor<B: Backend> {
    pub base: usize,
    pub end: usize,
    /// Per KDA layer, in layer order.
    pub states: Vec<KdaState<B>>,
    pub journals: Vec<DeltaJournal<B>>,
}

/// Where the KDA base goes during a call (see [`Glm5NextCache::plan`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Plan {
    Keep,
    /// Capture the base after this many tokens of the call (a multiple of 64 or the
    /// call's length).
    Capture(usize),
    /// Replay the journal up to this position first.
    Fold(usize),
}

/// The cache of a `glm5_next` sequence (see the module header).
pub struct Glm5NextCache<B: Backend> {
    pub(crate) backend: Arc<B>,
    pub(crate) shape: CacheShape,
    pub(crate) layers: Vec<LayerState<B>>,
    pub(crate) len: usize,
    pub(crate) n_ctx: usize,
    /// Position of every KDA layer's base state.
    pub(crate) base: usize,
    pub(crate) window: usize,
    /// Rewind points kept from the ends of earlier prefill calls, oldest first.
    pub(crate) anchors: Vec<Anchor<B>>,
    /// The forward pass's activation buffers (allocated at the first call).
    pub(crate) scratch: Option<super::Scratch<B>>,
    /// Greedy choices not read yet.
    pub(crate) picks: crate::families::Picks<B>,
}

fn kda_state<B: Backend>(b: &B, d: &DeltaShape) -> Result<KdaState<B>> {
    Ok(KdaState {
        conv: b.buf(d.conv_len())?,
        s: b.buf(d.state_len())?,
    })
}

fn journal<B: Backend>(b: &B, d: &DeltaShape, cap: usize) -> Result<DeltaJournal<B>> {
    Ok(DeltaJournal {
        cap,
        pre: b.buf(cap * (2 * d.qk_len() + d.v_len()))?,
        k: b.buf(cap * d.qk_len())?,
        v: b.buf(cap * d.v_len())?,
        g: b.buf(cap * d.g_len())?,
        beta: b.buf(cap * d.v_heads)?,
    })
}

/// Values per journal slot `(pre, k, v, g, beta)`.
pub(crate) fn journal_widths(d: &DeltaShape) -> [usize; 5] {
    [
        2 * d.qk_len() + d.v_len(),
        d.qk_len(),
        d.v_len(),
        d.g_len(),
        d.v_heads,
    ]
}

fn journal_bufs<B: Backend>(j: &DeltaJournal<B>) -> [&B::Buf; 5] {
    [&j.pre, &j.k, &j.v, &j.g, &j.beta]
}

fn journal_bufs_mut<B: Backend>(j: &mut DeltaJournal<B>) -> [&mut B::Buf; 5] {
    [&mut j.pre, &mut j.k, &mut j.v, &mut j.g, &mut j.beta]
}

impl<B: Backend> KdaState<B> {
    fn copy_from(&mut self, b: &B, o: &KdaState<B>, d: &DeltaShape) -> Result<()> {
        b.copy(&o.conv, 0, &mut self.conv, 0, d.conv_len())?;
        b.copy(&o.s, 0, &mut self.s, 0, d.state_len())
    }

    fn zero(&mut self, b: &B, d: &DeltaShape) -> Result<()> {
        b.fill(&mut self.conv, 0, d.conv_len(), 0.0)?;
        b.fill(&mut self.s, 0, d.state_len(), 0.0)
    }

    pub(crate) fn as_delta(&mut self) -> DeltaState<'_, B> {
        DeltaState {
            conv: &mut self.conv,
            s: &mut self.s,
        }
    }
}

/// Copies every slot of `src` to `dst` (same capacity; a few large copies rather than
/// one per position).
fn copy_journal<B: Backend>(
    b: &B,
    src: &DeltaJournal<B>,
    dst: &mut DeltaJournal<B>,
    d: &DeltaShape,
) -> Result<()> {
    for ((s, t), w) in journal_bufs(src)
        .into_iter()
        .zip(journal_bufs_mut(dst))
        .zip(journal_widths(d))
    {
        b.copy(s, 0, t, 0, src.cap * w)?;
    }
    Ok(())
}

impl<B: Backend> Glm5NextCache<B> {
    /// An empty cache of `n_ctx` tokens with the default rewind window.
    pub fn new(backend: Arc<B>, shape: CacheShape, n_ctx: usize) -> Result<Self> {
        let b = &*backend;
        let cap = journal_cap(DEFAULT_REWIND_WINDOW);
        let mut layers = Vec::with_capacity(shape.layers.len());
        for l in &shape.layers {
            layers.push(match *l {
                LayerShape::Kda => LayerState::Kda(KdaLayer {
                    live: kda_state(b, &shape.delta)?,
                    base: kda_state(b, &shape.delta)?,
                    journal: journal(b, &shape.delta, cap)?,
                }),
                LayerShape::Mla { full_indexer } => {
                    let di = shape.index_head_dim;
                    LayerState::Mla(MlaLayer {
                        latent: b.buf(n_ctx * shape.rkv)?,
                        indexer: if full_indexer {
                            Some(IndexerState {
                                k: b.buf(n_ctx * di)?,
                                gs: b.buf(n_ctx * di)?,
                                pooled: b.buf((n_ctx / shape.kpool.max(1) + 1) * di)?,
                            })
                        } else {
                            None
                        },
                    })
                }
            });
        }
        Ok(Glm5NextCache {
            backend,
            shape,
            layers,
            len: 0,
            n_ctx,
            base: 0,
            window: DEFAULT_REWIND_WINDOW,
            anchors: Vec::new(),
            scratch: None,
            picks: Default::default(),
        })
    }

    /// Bytes of a cache of `n_ctx` tokens (with its anchors, without the activation
    /// buffers).
    pub fn bytes(shape: &CacheShape, n_ctx: usize) -> u64 {
        Self::parts(shape, n_ctx).iter().map(|p| p.1).sum()
    }

    /// [`Self::bytes`] by part: the KDA layers' state with its rewind journal and
    /// anchors, the MLA latent cache, the DSA indexer's keys, gates and pooled keys.
    pub fn parts(shape: &CacheShape, n_ctx: usize) -> [(&'static str, u64); 3] {
        let d = &shape.delta;
        let cap = journal_cap(DEFAULT_REWIND_WINDOW);
        let state = d.conv_len() + d.state_len();
        let journal: usize = journal_widths(d).iter().sum::<usize>() * cap;
        let kda = 2 * state + journal + DEFAULT_ANCHORS * (state + journal);
        let di = shape.index_head_dim;
        let (mut k, mut m, mut x) = (0usize, 0usize, 0usize);
        for l in &shape.layers {
            match l {
                LayerShape::Kda => k += kda,
                LayerShape::Mla { full_indexer } => {
                    m += n_ctx * shape.rkv;
                    if *full_indexer {
                        x += 2 * n_ctx * di + (n_ctx / shape.kpool.max(1) + 1) * di;
                    }
                }
            }
        }
        [
            ("KDA state and rewind journal", 4 * k as u64),
            ("MLA latent cache", 4 * m as u64),
            ("DSA indexer keys", 4 * x as u64),
        ]
    }

    /// Sets how many tokens of KDA rewind are guaranteed (the journal holds up to twice
    /// as many). 0 keeps no journal: only the current length is reachable. The journals
    /// are reallocated, so this is possible only while the cache is empty.
    pub fn set_rewind_window(&mut self, window: usize) -> Result<()> {
        if self.len > 0 {
            return Err(EngineError::Config(
                "the rewind window can only be set on an empty cache".into(),
            ));
        }
        let cap = journal_cap(window);
        for kl in kdas_mut(&mut self.layers) {
            kl.journal = journal(&*self.backend, &self.shape.delta, cap)?;
        }
        self.anchors.clear();
        self.window = window;
        Ok(())
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

    pub(crate) fn has_kda(&self) -> bool {
        kdas(&self.layers).next().is_some()
    }

    /// Records the current KDA base and journal as an anchor (after a prefill call).
    pub(crate) fn push_anchor(&mut self) -> Result<()> {
        if !self.has_kda() {
            return Ok(());
        }
        let end = self.len;
        self.anchors.retain(|a| a.end != end);
        let b = &*self.backend;
        let d = &self.shape.delta;
        // Reuse the oldest anchor's buffers when the list is full.
        let mut anchor = if self.anchors.len() >= DEFAULT_ANCHORS {
            self.anchors.remove(0)
        } else {
            let n_kda = kdas(&self.layers).count();
            let cap = journal_cap(self.window);
            Anchor {
                base: 0,
                end: 0,
                states: (0..n_kda).map(|_| kda_state(b, d)).collect::<Result<_>>()?,
                journals: (0..n_kda)
                    .map(|_| journal(b, d, cap))
                    .collect::<Result<_>>()?,
            }
        };
        for ((st, j), kl) in anchor
            .states
            .iter_mut()
            .zip(anchor.journals.iter_mut())
            .zip(kdas(&self.layers))
        {
            st.copy_from(b, &kl.base, d)?;
            copy_journal(b, &kl.journal, j, d)?;
        }
        anchor.base = self.base;
        anchor.end = end;
        self.anchors.push(anchor);
        Ok(())
    }

    /// Decides, before a call of `s` tokens at the current length, where the KDA base
    /// will be afterwards (see [`Plan`]). `decode` calls can only capture after their
    /// token.
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
            let mut r = CHUNK;
            while r < s {
                if self.len + r <= target {
                    best = Some(r);
                }
                r += CHUNK;
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

    /// Replays every KDA journal up to position `pos` into the base (the base moves to
    /// `pos`).
    pub(crate) fn fold(&mut self, pos: usize) -> Result<()> {
        if pos <= self.base {
            return Ok(());
        }
        let (b, d) = (&*self.backend, &self.shape.delta);
        let mut layers: Vec<_> = kdas_mut(&mut self.layers)
            .map(|KdaLayer { base, journal, .. }| DeltaReplay {
                journal,
                state: base.as_delta(),
            })
            .collect();
        b.delta_replay(&mut layers, self.base..pos, d)?;
        self.base = pos;
        Ok(())
    }

    fn reset(&mut self) -> Result<()> {
        let (b, d) = (&*self.backend, &self.shape.delta);
        for kl in kdas_mut(&mut self.layers) {
            kl.live.zero(b, d)?;
            kl.base.zero(b, d)?;
        }
        self.len = 0;
        self.base = 0;
        self.anchors.clear();
        Ok(())
    }

    /// A new cache with copies of this one's buffers (the used parts).
    fn deep_copy(&self) -> Result<Self> {
        let mut c = Glm5NextCache::new(self.backend.clone(), self.shape.clone(), self.n_ctx)?;
        if self.window != c.window {
            c.set_rewind_window(self.window)?;
        }
        c.copy_state_from(self)?;
        Ok(c)
    }

    /// Copies `o`'s state (same shape and rewind window) into this cache's buffers.
    fn copy_state_from(&mut self, o: &Glm5NextCache<B>) -> Result<()> {
        let b = &*self.backend;
        let sh = &self.shape;
        let d = &sh.delta;
        let (len, di) = (o.len, sh.index_head_dim);
        for (l, ol) in self.layers.iter_mut().zip(&o.layers) {
            match (l, ol) {
                (LayerState::Kda(k), LayerState::Kda(ok)) => {
                    k.live.copy_from(b, &ok.live, d)?;
                    k.base.copy_from(b, &ok.base, d)?;
                    copy_journal(b, &ok.journal, &mut k.journal, d)?;
                }
                (LayerState::Mla(m), LayerState::Mla(om)) => {
                    b.copy(&om.latent, 0, &mut m.latent, 0, len * sh.rkv)?;
                    if let (Some(ix), Some(oix)) = (&mut m.indexer, &om.indexer) {
                        b.copy(&oix.k, 0, &mut ix.k, 0, len * di)?;
                        b.copy(&oix.gs, 0, &mut ix.gs, 0, len * di)?;
                        b.copy(&oix.pooled, 0, &mut ix.pooled, 0, len / sh.kpool * di)?;
                    }
                }
                _ => unreachable!("caches of one shape"),
            }
        }
        self.anchors.clear();
        for a in &o.anchors {
            let mut states = Vec::with_capacity(a.states.len());
            let mut journals = Vec::with_capacity(a.journals.len());
            for (s, j) in a.states.iter().zip(&a.journals) {
                let mut ns = kda_state(b, d)?;
                ns.copy_from(b, s, d)?;
                let mut nj = journal(b, d, j.cap)?;
                copy_journal(b, j, &mut nj, d)?;
                states.push(ns);
                journals.push(nj);
            }
            self.anchors.push(Anchor {
                base: a.base,
                end: a.end,
                states,
                journals,
            });
        }
        self.len = o.len;
        self.base = o.base;
        Ok(())
    }
}

impl<B: Backend> Cache for Glm5NextCache<B> {
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
        // Greedy choices not read are of steps this undoes, or stale.
        self.picks.clear();
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
            return self.reset();
        }
        let b = self.backend.clone();
        let d = self.shape.delta;
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
            let a = &self.anchors[i];
            for ((st, j), kl) in a
                .states
                .iter()
                .zip(&a.journals)
                .zip(kdas_mut(&mut self.layers))
            {
                kl.base.copy_from(&*b, st, &d)?;
                copy_journal(&*b, j, &mut kl.journal, &d)?;
            }
            self.base = a.base;
        }
        self.anchors.retain(|a| a.base <= n);
        for a in &mut self.anchors {
            a.end = a.end.min(n);
        }
        let mut layers = Vec::new();
        for KdaLayer {
            live,
            base,
            journal,
        } in kdas_mut(&mut self.layers)
        {
            live.copy_from(&*b, base, &d)?;
            layers.push(DeltaReplay {
                journal,
                state: live.as_delta(),
            });
        }
        b.delta_replay(&mut layers, self.base..n, &d)?;
        // MLA rows and pooled keys past `n` are overwritten as the sequence regrows.
        self.len = n;
        Ok(())
    }

    fn reachable(&self) -> Vec<std::ops::RangeInclusive<usize>> {
        let mut r = vec![0..=0, self.earliest_rewind()..=self.len];
        r.extend(self.anchors());
        r
    }

    fn bytes(&self) -> u64 {
        Self::bytes(&self.shape, self.n_ctx)
    }

    fn snapshot(&self) -> Result<Box<dyn Cache>> {
        Ok(Box::new(self.deep_copy()?))
    }

    fn restore(&mut self, from: &dyn Cache) -> Result<()> {
        let from = from
            .as_any()
            .downcast_ref::<Glm5NextCache<B>>()
            .ok_or_else(|| {
                EngineError::Config("snapshot belongs to another model family".into())
            })?;
        if from.shape != self.shape {
            return Err(EngineError::Config(
                "snapshot belongs to a glm5_next model of another shape".into(),
            ));
        }
        if from.len > self.n_ctx {
            return Err(EngineError::ContextFull {
                needed: from.len,
                n_ctx: self.n_ctx,
            });
        }
        if from.window != self.window {
            self.len = 0;
            self.set_rewind_window(from.window)?;
        }
        self.copy_state_from(from)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}
