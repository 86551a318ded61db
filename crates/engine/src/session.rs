//! A session: one sequence's tokens (the frontier), its cache and the logits after the
//! last token. Prefill is chunked; decode appends one token; rewind cuts the frontier
//! back; snapshots copy the whole state in memory and can be written to and read from
//! a byte stream ([`Session::write_snapshot`]); [`Session::sync`] reuses the longest
//! common prefix with a new token sequence (what the server and chat do every turn).

use std::io::{Read, Write};
use std::ops::ControlFlow;
use std::ops::RangeInclusive;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::model::{Cache, Logits, Model, ModelInfo};
use crate::{EngineError, Result};

/// Tokens per prefill call, unless the model prefers otherwise
/// ([`crate::Model::prefill_chunk`]): the granularity of progress reports; the family
/// chunks internally as it needs.
pub const PREFILL_CHUNK: usize = 512;

/// One sequence of one model.
pub struct Session {
    model: Arc<dyn Model>,
    cache: Box<dyn Cache>,
    tokens: Vec<u32>,
    /// Logits after the last token; empty when unknown (after a rewind).
    logits: Vec<f32>,
}

/// A copy of a session's state, restorable with [`Session::restore`].
pub struct Snapshot {
    tokens: Vec<u32>,
    cache: Box<dyn Cache>,
    logits: Vec<f32>,
}

impl Snapshot {
    /// The frontier the snapshot holds.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Bytes of memory the snapshot holds (its cache, tokens and logits).
    pub fn bytes(&self) -> u64 {
        self.cache.bytes() + 4 * (self.tokens.len() + self.logits.len()) as u64
    }

    /// The frontier lengths a session restored from this snapshot can rewind to
    /// without re-evaluating ([`Cache::reachable`]).
    pub fn reachable(&self) -> Vec<RangeInclusive<usize>> {
        self.cache.reachable()
    }

    /// Whether the logits after the last token are held.
    pub fn logits_known(&self) -> bool {
        !self.logits.is_empty()
    }
}

/// The magic of [`Session::write_snapshot`]'s format.
const SNAPSHOT_MAGIC: &[u8; 8] = b"DS4SESS1";

/// Why [`Session::decode_greedy`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GreedyEnd {
    /// `on_pick` saw `max` choices and did not break at the last.
    Max,
    /// `on_pick` broke.
    Stopped,
    /// The context cannot hold the last choice.
    ContextFull,
}

/// What [`Session::sync`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SyncStats {
    /// Tokens of the request already held by the session (reused without evaluation).
    pub reused: usize,
    /// Tokens evaluated.
    pub evaluated: usize,
    /// Time spent evaluating them; `None` when nothing was evaluated.
    pub eval_time: Option<Duration>,
}

impl Session {
    /// Whether a session of `n_ctx` tokens is allowed for a model: not 0 and not longer
    /// than the context it was trained for (`ModelInfo::n_ctx_train`, when known).
    pub fn check_ctx(info: &ModelInfo, n_ctx: usize) -> Result<()> {
        let train = info.n_ctx_train;
        if n_ctx == 0 || (train > 0 && n_ctx > train) {
            return Err(EngineError::ContextSize {
                n_ctx,
                n_ctx_train: train,
            });
        }
        Ok(())
    }

    /// A new empty session holding up to `n_ctx` tokens.
    ///
    /// Errors: `n_ctx` is 0 or larger than the context the model was trained for
    /// (`ModelInfo::n_ctx_train`; positions past it are not modelled, and the cache is
    /// checked before it is allocated, so a mistyped `--ctx` cannot exhaust memory).
    pub fn new(model: Arc<dyn Model>, n_ctx: usize) -> Result<Self> {
        Self::check_ctx(model.info(), n_ctx)?;
        let cache = model.new_cache(n_ctx)?;
        Ok(Session {
            model,
            cache,
            tokens: Vec::new(),
            logits: Vec::new(),
        })
    }

    pub fn model(&self) -> &Arc<dyn Model> {
        &self.model
    }

    /// The tokens committed to the session.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// The context size in tokens.
    pub fn n_ctx(&self) -> usize {
        self.cache.capacity()
    }

    /// The logits after the last token, if known (unknown after a rewind until the next
    /// token is evaluated).
    pub fn logits(&self) -> Option<&[f32]> {
        (!self.logits.is_empty()).then_some(&self.logits[..])
    }

    fn check_room(&self, extra: usize) -> Result<()> {
        let needed = self.tokens.len() + extra;
        if needed > self.n_ctx() {
            return Err(EngineError::ContextFull {
                needed,
                n_ctx: self.n_ctx(),
            });
        }
        Ok(())
    }

    /// Appends `tokens`, calling `progress(done, total)` after each chunk, and returns
    /// the logits after the last one. The whole prompt is checked against the context
    /// size before anything is evaluated.
    pub fn prefill(
        &mut self,
        tokens: &[u32],
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<&[f32]> {
        self.check_room(tokens.len())?;
        if tokens.is_empty() {
            return self.logits().ok_or(EngineError::Rewind {
                target: self.tokens.len(),
                reason: "no logits".into(),
            });
        }
        let mut done = 0;
        for chunk in tokens.chunks(self.model.prefill_chunk().max(1)) {
            let last = done + chunk.len() == tokens.len();
            let mode = if last { Logits::Last } else { Logits::None };
            self.evaluate(|m, c, logits| m.forward(c, chunk, mode, logits))?;
            self.tokens.extend_from_slice(chunk);
            done += chunk.len();
            progress(done, tokens.len());
        }
        Ok(&self.logits)
    }

    /// Appends one token and returns the logits after it.
    pub fn decode(&mut self, token: u32) -> Result<&[f32]> {
        self.prefill(&[token], &mut |_, _| {})
    }

    /// Greedy decoding with each step queued on the backend before the host has read the
    /// choice it evaluates ([`Logits::Pick`]: the backend chooses, and a device does not
    /// wait for the host between steps). Evaluates `token` (nothing when `max` is 0),
    /// then hands up to `max` greedy choices to `on_pick` in order — the tokens `decode`
    /// and [`crate::sampler::argmax`] would choose one after another — evaluating each
    /// one but the last, until `on_pick` breaks or the context is full.
    ///
    /// The session then holds `token` and the choices before the last; also the last
    /// when `on_pick` broke at a choice before the `max`-th while the context had room
    /// for it (its step was queued before the host read it). The logits after the last
    /// evaluated token are not read ([`Session::logits`] is `None`; [`Session::sync`]
    /// evaluates that token again when a request needs them).
    ///
    /// # Errors
    /// As [`Session::decode`]; the context must hold `token`. After an error the session
    /// holds what was evaluated before the failed step.
    pub fn decode_greedy(
        &mut self,
        token: u32,
        max: usize,
        on_pick: &mut dyn FnMut(u32) -> ControlFlow<()>,
    ) -> Result<GreedyEnd> {
        if max == 0 {
            return Ok(GreedyEnd::Max);
        }
        self.check_room(1)?;
        self.logits.clear();
        self.evaluate(|m, c, _| m.forward(c, &[token], Logits::Pick, &mut Vec::new()))?;
        self.tokens.push(token);
        let mut picked = 0;
        loop {
            picked += 1;
            // The step of the choice not read yet, queued before reading it while another
            // choice is wanted and fits.
            let ahead = picked < max && self.tokens.len() < self.n_ctx();
            if ahead {
                self.evaluate(|m, c, _| m.forward_picked(c))?;
            }
            let t = self.evaluate(|m, c, _| m.take_pick(c))?;
            if ahead {
                self.tokens.push(t);
            }
            if on_pick(t).is_break() {
                if ahead {
                    // The choice of the step queued ahead: nobody reads it.
                    self.evaluate(|m, c, _| m.take_pick(c))?;
                }
                return Ok(GreedyEnd::Stopped);
            }
            if !ahead {
                return Ok(if picked == max {
                    GreedyEnd::Max
                } else {
                    GreedyEnd::ContextFull
                });
            }
        }
    }

    /// Runs `f` on the model, the cache and the logits buffer. When it fails, the cache
    /// goes back to what the session's tokens say (a step queued or half done is undone,
    /// with the greedy choices not read; where the cache cannot truncate there, to its
    /// nearest earlier point, and the tokens follow) and the logits are forgotten.
    fn evaluate<R>(
        &mut self,
        f: impl FnOnce(&dyn Model, &mut dyn Cache, &mut Vec<f32>) -> Result<R>,
    ) -> Result<R> {
        let r = f(&*self.model, &mut *self.cache, &mut self.logits);
        if r.is_err() {
            let point = self.cache.rewind_point(self.tokens.len());
            let _ = self.cache.truncate(point);
            self.tokens.truncate(self.cache.len());
            self.logits.clear();
        }
        r
    }

    /// Appends `tokens` and returns the logits after each of them (`tokens.len()` rows of
    /// `n_vocab`), for teacher-forced replay and speculative verification.
    pub fn forward_all(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        self.check_room(tokens.len())?;
        let mut all = Vec::new();
        self.evaluate(|m, c, _| m.forward(c, tokens, Logits::All, &mut all))?;
        self.tokens.extend_from_slice(tokens);
        let n_vocab = self.model.info().n_vocab;
        self.logits.clear();
        self.logits.extend_from_slice(&all[all.len() - n_vocab..]);
        Ok(all)
    }

    /// Cuts the frontier back to its first `n` tokens. When the cache cannot truncate
    /// exactly there (recurrent state), it truncates at its nearest earlier
    /// [`Cache::rewind_point`] and re-evaluates the tokens between, leaving the logits
    /// after token `n - 1` known.
    pub fn rewind(&mut self, n: usize) -> Result<()> {
        if n > self.tokens.len() {
            return Err(EngineError::Rewind {
                target: n,
                reason: format!("the session holds only {} tokens", self.tokens.len()),
            });
        }
        if n == self.tokens.len() {
            return Ok(());
        }
        let point = self.cache.rewind_point(n);
        self.cache.truncate(point)?;
        let replay = self.tokens[point..n].to_vec();
        self.tokens.truncate(point);
        self.logits.clear();
        if !replay.is_empty() {
            self.prefill(&replay, &mut |_, _| {})?;
        }
        Ok(())
    }

    /// Empties the session.
    pub fn reset(&mut self) -> Result<()> {
        self.rewind(0)
    }

    /// A copy of the state.
    ///
    /// # Errors
    /// The backend cannot hold the copy (out of memory).
    pub fn snapshot(&self) -> Result<Snapshot> {
        Ok(Snapshot {
            tokens: self.tokens.clone(),
            cache: self.cache.snapshot()?,
            logits: self.logits.clone(),
        })
    }

    /// Returns to a snapshot taken from this session (or another of the same model and
    /// context size).
    pub fn restore(&mut self, snap: &Snapshot) -> Result<()> {
        self.cache.restore(&*snap.cache)?;
        self.tokens.clone_from(&snap.tokens);
        self.logits.clone_from(&snap.logits);
        Ok(())
    }

    /// The frontier lengths reachable by rewinding without re-evaluation
    /// ([`Cache::reachable`]).
    pub fn reachable(&self) -> Vec<RangeInclusive<usize>> {
        self.cache.reachable()
    }

    /// Writes `snap` (a snapshot of this session's model): `b"DS4SESS1"`, u64 token
    /// count, the tokens (u32), u64 logit count (0 or `n_vocab`), the logits (f32), then
    /// the family's cache state ([`Model::write_cache`]), all little-endian.
    ///
    /// # Errors
    /// I/O errors and families that cannot save their state ([`EngineError::State`]).
    pub fn write_snapshot(&self, snap: &Snapshot, out: &mut dyn Write) -> Result<()> {
        let mut head = Vec::with_capacity(24 + 4 * (snap.tokens.len() + snap.logits.len()));
        head.extend_from_slice(SNAPSHOT_MAGIC);
        head.extend_from_slice(&(snap.tokens.len() as u64).to_le_bytes());
        for t in &snap.tokens {
            head.extend_from_slice(&t.to_le_bytes());
        }
        head.extend_from_slice(&(snap.logits.len() as u64).to_le_bytes());
        for x in &snap.logits {
            head.extend_from_slice(&x.to_le_bytes());
        }
        out.write_all(&head)
            .map_err(|e| EngineError::State(format!("writing a snapshot: {e}")))?;
        self.model.write_cache(&*snap.cache, out)
    }

    /// Reads a snapshot written by [`Session::write_snapshot`] for this session's model
    /// and context size.
    ///
    /// # Errors
    /// [`EngineError::State`] for malformed, truncated or foreign data.
    pub fn read_snapshot(&self, input: &mut dyn Read) -> Result<Snapshot> {
        let bad = |what: String| EngineError::State(format!("snapshot: {what}"));
        let u64_of = |input: &mut dyn Read, what: &str| -> Result<u64> {
            let mut b = [0u8; 8];
            input
                .read_exact(&mut b)
                .map_err(|e| bad(format!("{what}: {e}")))?;
            Ok(u64::from_le_bytes(b))
        };
        let mut magic = [0u8; 8];
        input
            .read_exact(&mut magic)
            .map_err(|e| bad(format!("magic: {e}")))?;
        if &magic != SNAPSHOT_MAGIC {
            return Err(bad("bad magic".into()));
        }
        let n = u64_of(input, "token count")? as usize;
        if n > self.n_ctx() {
            return Err(bad(format!(
                "{n} tokens for a {}-token context",
                self.n_ctx()
            )));
        }
        let mut raw = vec![0u8; 4 * n];
        input
            .read_exact(&mut raw)
            .map_err(|e| bad(format!("tokens: {e}")))?;
        let tokens: Vec<u32> = raw
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        let n_logits = u64_of(input, "logit count")? as usize;
        let n_vocab = self.model.info().n_vocab;
        if n_logits != 0 && n_logits != n_vocab {
            return Err(bad(format!("{n_logits} logits, the model has {n_vocab}")));
        }
        let mut raw = vec![0u8; 4 * n_logits];
        input
            .read_exact(&mut raw)
            .map_err(|e| bad(format!("logits: {e}")))?;
        let logits = raw
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        let cache = self.model.read_cache(input)?;
        if cache.len() != n || cache.capacity() != self.n_ctx() {
            return Err(bad(format!(
                "a state of {} of {} positions for {n} tokens of a {}-token context",
                cache.len(),
                cache.capacity(),
                self.n_ctx()
            )));
        }
        Ok(Snapshot {
            tokens,
            cache,
            logits,
        })
    }

    /// The number of leading tokens `tokens` shares with the frontier.
    pub fn common_prefix(&self, tokens: &[u32]) -> usize {
        self.tokens
            .iter()
            .zip(tokens)
            .take_while(|(a, b)| a == b)
            .count()
    }

    /// Makes the session hold exactly `tokens` with known logits after the last one:
    /// keeps the longest common prefix, rewinds past it and evaluates the rest. When
    /// the whole request is already held but its logits are not, the last token is
    /// evaluated again. `reused` counts only the tokens not evaluated: a cache that
    /// rewinds to an earlier point ([`Cache::rewind_point`]) re-evaluates the tokens
    /// from there.
    pub fn sync(
        &mut self,
        tokens: &[u32],
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<SyncStats> {
        if tokens.is_empty() {
            self.reset()?;
            return Ok(SyncStats {
                reused: 0,
                evaluated: 0,
                eval_time: None,
            });
        }
        self.check_room_for(tokens.len())?;
        let mut keep = self.common_prefix(tokens);
        if keep == tokens.len() && (keep < self.tokens.len() || self.logits.is_empty()) {
            keep -= 1;
        }
        let reused = if keep < self.tokens.len() {
            self.cache.rewind_point(keep)
        } else {
            keep
        };
        let t0 = Instant::now();
        self.rewind(keep)?;
        let rest = &tokens[keep..];
        if rest.is_empty() {
            return Ok(SyncStats {
                reused,
                evaluated: 0,
                eval_time: None,
            });
        }
        self.prefill(rest, progress)?;
        Ok(SyncStats {
            reused,
            evaluated: tokens.len() - reused,
            eval_time: Some(t0.elapsed()),
        })
    }

    fn check_room_for(&self, total: usize) -> Result<()> {
        if total > self.n_ctx() {
            return Err(EngineError::ContextFull {
                needed: total,
                n_ctx: self.n_ctx(),
            });
        }
        Ok(())
    }
}
