//! One sequence's state for a `deepseek4` model (doc §8, §12), held in backend buffers,
//! and how it rewinds.
//!
//! | layer | state |
//! | --- | --- |
//! | all | the sliding window: a ring of raw keys `[wcap, hd]`, slot `pos mod wcap` |
//! | HCA | the compressor's source rows (`kv`, `gate`, `[ccap, hd]` rings) and its entries `[n_ctx/m, hd]` |
//! | CSA | the same with `2·hd`-wide rows (both halves of the overlapping windows), plus the indexer's rings `[ccap, 2·di]` and keys `[n_ctx/m, di]` |
//!
//! The reference keeps, instead of source rings, each compressor's partially filled
//! window and the last closed window's `Ca` half (`overlap_kv/gate`); both are the
//! source rows of the current and the previous window, which the rings hold, and an
//! entry is a pure function of them (doc §8), so our entries equal the reference's
//! however a prompt is split into calls.
//!
//! **Rewind.** Entries only depend on complete windows and are never overwritten by
//! another history before they are read again, so truncating to `n` needs the rows of
//! positions `n − W + 1 … n − 1` (window) and of the current and previous compressor
//! window (`n − 2m + 1 … n − 1`) to be intact in the rings. The rings hold `R` more
//! positions than that (`wcap = W − 1 + R`, `ccap = 2m + R`; `R` =
//! [`DEFAULT_REWIND_WINDOW`], settable on an empty cache), so any `n ≥ high − R` is
//! reachable, `high` being the furthest position written since the last reset (a
//! truncation leaves rows of the abandoned history in the rings until they are
//! overwritten). Forward calls are split into pieces of at most `R` tokens so that one
//! piece never overwrites rows it still reads.
//!
//! **Anchors.** At the end of every prefill call (a multi-token call that does not ask
//! for every row) the rings are also copied into an [`Anchor`] (the last
//! [`DEFAULT_ANCHORS`]): a chat's next turn usually diverges a few tokens before the
//! previous prompt's end, which stays reachable after any number of generated tokens.
//! Positions neither the rings nor an anchor reach fail with [`EngineError::Rewind`];
//! [`Cache::rewind_point`] gives the nearest reachable one below (0 at worst), from which
//! the session re-evaluates.

use std::any::Any;
use std::sync::Arc;

use super::config::AttnKind;
use crate::backend::Backend;
use crate::model::Cache;
use crate::{EngineError, Result};

/// Tokens of rewind the rings guarantee by default (see the module header); also the
/// largest forward piece.
pub const DEFAULT_REWIND_WINDOW: usize = 256;
/// Prefill-end anchors kept.
pub const DEFAULT_ANCHORS: usize = 2;

/// Shapes the cache needs from the model.
#[derive(Clone, Debug, PartialEq)]
pub struct CacheShape {
    pub layers: Vec<AttnKind>,
    pub head_dim: usize,
    pub index_head_dim: usize,
    /// `[W]`.
    pub sliding_window: usize,
    /// A fingerprint of the model's hyperparameters (checked on restore and load).
    pub fingerprint: u64,
}

/// A compressor's source rings and its entries.
pub struct CompState<B: Backend> {
    /// Ring slots.
    pub cap: usize,
    /// Source rows `[cap, row_len]` (kv and gate logits, without the position bias).
    pub kv: B::Buf,
    pub gate: B::Buf,
    /// Compressed entries `[n_ctx/m + 1, dim]` (entry `w` at row `w`).
    pub entries: B::Buf,
    /// `[row_len]`, `[dim]`, `[m]`.
    pub row_len: usize,
    pub dim: usize,
    pub rate: usize,
}

/// One layer's state.
pub struct LayerState<B: Backend> {
    /// Raw keys `[wcap, hd]`, slot `pos mod wcap`.
    pub wcap: usize,
    pub hd: usize,
    pub window: B::Buf,
    /// The attention compressor (CSA, HCA).
    pub comp: Option<CompState<B>>,
    /// The lightning indexer's compressor (CSA).
    pub index: Option<CompState<B>>,
}

/// The rings of every layer at the end of a prefill call: positions
/// `high − R … end` stay reachable after the live rings have moved on.
pub struct Anchor<B: Backend> {
    pub high: usize,
    pub end: usize,
    /// Per layer: the window ring, then the compressor's and indexer's kv and gate
    /// rings when present.
    pub rings: Vec<Vec<B::Buf>>,
}

/// The cache of a `deepseek4` sequence (see the module header).
pub struct DeepSeek4Cache<B: Backend> {
    pub(crate) backend: Arc<B>,
    pub(crate) shape: CacheShape,
    pub(crate) layers: Vec<LayerState<B>>,
    pub(crate) len: usize,
    pub(crate) n_ctx: usize,
    /// The furthest position written into the rings since the last reset.
    pub(crate) high: usize,
    /// `R`: rewind reach of the rings.
    pub(crate) window: usize,
    pub(crate) anchors: Vec<Anchor<B>>,
    /// The forward pass's activation buffers (allocated at the first call).
    pub(crate) scratch: Option<super::Scratch<B>>,
    /// Greedy choices not read yet.
    pub(crate) picks: crate::families::Picks<B>,
}

/// Ring slots of a compressor of rate `m` for rewind reach `r`.
fn comp_cap(m: usize, r: usize) -> usize {
    2 * m + r
}

fn comp_state<B: Backend>(
    b: &B,
    rate: usize,
    dim: usize,
    overlap: bool,
    r: usize,
    n_ctx: usize,
) -> Result<CompState<B>> {
    let row_len = if overlap { 2 * dim } else { dim };
    let cap = comp_cap(rate, r);
    Ok(CompState {
        cap,
        kv: b.buf(cap * row_len)?,
        gate: b.buf(cap * row_len)?,
        entries: b.buf((n_ctx / rate + 1) * dim)?,
        row_len,
        dim,
        rate,
    })
}

impl<B: Backend> LayerState<B> {
    pub(crate) fn new(
        b: &B,
        kind: AttnKind,
        sh: &CacheShape,
        r: usize,
        n_ctx: usize,
    ) -> Result<Self> {
        let wcap = sh.sliding_window.saturating_sub(1) + r;
        let (comp, index) = match kind {
            AttnKind::Sliding => (None, None),
            AttnKind::Hca { rate } => (
                Some(comp_state(b, rate, sh.head_dim, false, r, n_ctx)?),
                None,
            ),
            AttnKind::Csa { rate } => (
                Some(comp_state(b, rate, sh.head_dim, true, r, n_ctx)?),
                Some(comp_state(b, rate, sh.index_head_dim, true, r, n_ctx)?),
            ),
        };
        Ok(LayerState {
            wcap,
            hd: sh.head_dim,
            window: b.buf(wcap * sh.head_dim)?,
            comp,
            index,
        })
    }

    /// The ring buffers of a layer with their lengths (window, then kv and gate of each
    /// compressor), in a fixed order shared by anchors and state files.
    pub(crate) fn rings(&self) -> Vec<(&B::Buf, usize)> {
        let mut v = vec![(&self.window, self.wcap * self.hd)];
        for c in [&self.comp, &self.index].into_iter().flatten() {
            v.push((&c.kv, c.cap * c.row_len));
            v.push((&c.gate, c.cap * c.row_len));
        }
        v
    }

    /// As [`LayerState::rings`], mutable.
    pub(crate) fn rings_mut(&mut self) -> Vec<(&mut B::Buf, usize)> {
        let mut v = vec![(&mut self.window, self.wcap * self.hd)];
        for c in [&mut self.comp, &mut self.index].into_iter().flatten() {
            let n = c.cap * c.row_len;
            v.push((&mut c.kv, n));
            v.push((&mut c.gate, n));
        }
        v
    }

    /// The compressors' entry buffers with their row sizes and rates.
    pub(crate) fn entries(&self) -> Vec<(&B::Buf, usize, usize)> {
        [&self.comp, &self.index]
            .into_iter()
            .flatten()
            .map(|c| (&c.entries, c.dim, c.rate))
            .collect()
    }

    pub(crate) fn entries_mut(&mut self) -> Vec<(&mut B::Buf, usize, usize)> {
        [&mut self.comp, &mut self.index]
            .into_iter()
            .flatten()
            .map(|c| (&mut c.entries, c.dim, c.rate))
            .collect()
    }
}

impl<B: Backend> DeepSeek4Cache<B> {
    /// An empty cache of `n_ctx` tokens with the default rewind window.
    pub fn new(backend: Arc<B>, shape: CacheShape, n_ctx: usize) -> Result<Self> {
        Self::with_window(backend, shape, n_ctx, DEFAULT_REWIND_WINDOW)
    }

    pub(crate) fn with_window(
        backend: Arc<B>,
        shape: CacheShape,
        n_ctx: usize,
        window: usize,
    ) -> Result<Self> {
        let window = window.max(1);
        let layers = shape
            .layers
            .iter()
            .map(|&k| LayerState::new(&*backend, k, &shape, window, n_ctx))
            .collect::<Result<_>>()?;
        Ok(DeepSeek4Cache {
            backend,
            shape,
            layers,
            len: 0,
            n_ctx,
            high: 0,
            window,
            anchors: Vec::new(),
            scratch: None,
            picks: Default::default(),
        })
    }

    /// Bytes of a cache of `n_ctx` tokens with rewind reach `r` (with its anchors,
    /// without the activation buffers).
    pub fn bytes(shape: &CacheShape, n_ctx: usize, r: usize) -> u64 {
        let hd = shape.head_dim;
        let di = shape.index_head_dim;
        let mut rings = 0usize;
        let mut entries = 0usize;
        for k in &shape.layers {
            rings += (shape.sliding_window.saturating_sub(1) + r) * hd;
            match *k {
                AttnKind::Sliding => {}
                AttnKind::Hca { rate } => {
                    rings += 2 * comp_cap(rate, r) * hd;
                    entries += (n_ctx / rate + 1) * hd;
                }
                AttnKind::Csa { rate } => {
                    rings += 2 * comp_cap(rate, r) * 2 * (hd + di);
                    entries += (n_ctx / rate + 1) * (hd + di);
                }
            }
        }
        4 * ((1 + DEFAULT_ANCHORS) * rings + entries) as u64
    }

    /// Sets how many tokens of rewind the rings guarantee (at least 1; also the largest
    /// forward piece). The rings are reallocated, so this is possible only while the
    /// cache is empty.
    pub fn set_rewind_window(&mut self, window: usize) -> Result<()> {
        if self.len > 0 {
            return Err(EngineError::Config(
                "the rewind window can only be set on an empty cache".into(),
            ));
        }
        *self = Self::with_window(self.backend.clone(), self.shape.clone(), self.n_ctx, window)?;
        Ok(())
    }

    /// The rewind reach `R` of the rings.
    pub fn rewind_window(&self) -> usize {
        self.window
    }

    /// Tokens per forward piece.
    pub(crate) fn piece(&self) -> usize {
        self.window
    }

    /// The earliest length [`Cache::truncate`] reaches through the live rings (0 is
    /// always reachable, and the ranges of [`DeepSeek4Cache::anchors`]).
    pub fn earliest_rewind(&self) -> usize {
        self.high.saturating_sub(self.window)
    }

    /// Position ranges reachable through the prefill-end anchors.
    pub fn anchors(&self) -> Vec<std::ops::RangeInclusive<usize>> {
        self.anchors
            .iter()
            .map(|a| a.high.saturating_sub(self.window)..=a.end)
            .collect()
    }

    /// Records the current rings as an anchor (after a prefill call).
    pub(crate) fn push_anchor(&mut self) -> Result<()> {
        let end = self.len;
        self.anchors.retain(|a| a.end != end);
        let b = &*self.backend;
        let mut anchor = if self.anchors.len() >= DEFAULT_ANCHORS {
            self.anchors.remove(0)
        } else {
            let rings = self
                .layers
                .iter()
                .map(|l| {
                    l.rings()
                        .into_iter()
                        .map(|(_, n)| b.buf(n))
                        .collect::<Result<Vec<_>>>()
                })
                .collect::<Result<_>>()?;
            Anchor {
                high: 0,
                end: 0,
                rings,
            }
        };
        for (l, dst) in self.layers.iter().zip(anchor.rings.iter_mut()) {
            for ((src, n), d) in l.rings().into_iter().zip(dst.iter_mut()) {
                b.copy(src, 0, d, 0, n)?;
            }
        }
        anchor.high = self.high;
        anchor.end = end;
        self.anchors.push(anchor);
        Ok(())
    }

    /// The largest position `≤ n` an anchor reaches, and that anchor.
    fn anchor_for(&self, n: usize) -> Option<(usize, usize)> {
        self.anchors
            .iter()
            .enumerate()
            .filter_map(|(i, a)| {
                let top = a.end.min(n);
                (top + self.window >= a.high).then_some((top, i))
            })
            .max()
    }

    fn reset(&mut self) {
        self.len = 0;
        self.high = 0;
        self.anchors.clear();
    }

    /// A new cache with copies of this one's buffers (rings whole, entries up to `len`).
    fn deep_copy(&self) -> Result<Self> {
        let mut c = Self::with_window(
            self.backend.clone(),
            self.shape.clone(),
            self.n_ctx,
            self.window,
        )?;
        c.copy_state_from(self)?;
        Ok(c)
    }

    /// Copies `o`'s state (same shape and rewind window) into this cache's buffers.
    fn copy_state_from(&mut self, o: &DeepSeek4Cache<B>) -> Result<()> {
        let b = &*self.backend;
        for (l, ol) in self.layers.iter_mut().zip(&o.layers) {
            for ((d, _), (s, n)) in l.rings_mut().into_iter().zip(ol.rings()) {
                b.copy(s, 0, d, 0, n)?;
            }
            for ((d, _, _), (s, dim, rate)) in l.entries_mut().into_iter().zip(ol.entries()) {
                b.copy(s, 0, d, 0, o.len / rate * dim)?;
            }
        }
        self.anchors.clear();
        for a in &o.anchors {
            let mut rings = Vec::with_capacity(a.rings.len());
            for (l, ar) in o.layers.iter().zip(&a.rings) {
                let mut v = Vec::with_capacity(ar.len());
                for ((_, n), src) in l.rings().into_iter().zip(ar) {
                    let mut d = b.buf(n)?;
                    b.copy(src, 0, &mut d, 0, n)?;
                    v.push(d);
                }
                rings.push(v);
            }
            self.anchors.push(Anchor {
                high: a.high,
                end: a.end,
                rings,
            });
        }
        self.len = o.len;
        self.high = o.high;
        Ok(())
    }
}

impl<B: Backend> Cache for DeepSeek4Cache<B> {
    fn len(&self) -> usize {
        self.len
    }

    fn capacity(&self) -> usize {
        self.n_ctx
    }

    /// The largest length `≤ n` that [`Cache::truncate`] can reach (0 at worst).
    fn rewind_point(&self, n: usize) -> usize {
        let n = n.min(self.len);
        if n + self.window >= self.high {
            return n;
        }
        self.anchor_for(n).map_or(0, |(top, _)| top)
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
            self.reset();
            return Ok(());
        }
        if n + self.window < self.high {
            // Back to the anchor that reaches n, if any: its rings become live.
            let Some((top, i)) = self.anchor_for(n).filter(|&(top, _)| top == n) else {
                return Err(EngineError::Rewind {
                    target: n,
                    reason: format!(
                        "the sliding window and compressor rings reach back to {} (and the prefill ends                          {:?}, and 0); truncate to rewind_point({n}) = {} and re-evaluate, or restore a                          snapshot",
                        self.earliest_rewind(),
                        self.anchors(),
                        self.rewind_point(n)
                    ),
                });
            };
            debug_assert_eq!(top, n);
            let b = self.backend.clone();
            let a = &self.anchors[i];
            for (l, ar) in self.layers.iter_mut().zip(&a.rings) {
                for ((d, len), src) in l.rings_mut().into_iter().zip(ar) {
                    b.copy(src, 0, d, 0, len)?;
                }
            }
            self.high = a.high;
        }
        let w = self.window;
        self.anchors.retain(|a| n.min(a.end) + w >= a.high);
        for a in &mut self.anchors {
            a.end = a.end.min(n);
        }
        // Ring rows and entries past `n` are overwritten as the sequence regrows.
        self.len = n;
        Ok(())
    }

    fn reachable(&self) -> Vec<std::ops::RangeInclusive<usize>> {
        let mut r = vec![0..=0, self.earliest_rewind()..=self.len];
        r.extend(self.anchors());
        r
    }

    fn bytes(&self) -> u64 {
        Self::bytes(&self.shape, self.n_ctx, self.window)
    }

    fn snapshot(&self) -> Result<Box<dyn Cache>> {
        Ok(Box::new(self.deep_copy()?))
    }

    fn restore(&mut self, from: &dyn Cache) -> Result<()> {
        let from = from
            .as_any()
            .downcast_ref::<DeepSeek4Cache<B>>()
            .ok_or_else(|| {
                EngineError::Config("snapshot belongs to another model family".into())
            })?;
        if from.shape != self.shape {
            return Err(EngineError::Config(
                "snapshot belongs to a deepseek4 model of another shape".into(),
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
