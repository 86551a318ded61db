//! The prompt cache of many conversations: besides the live session (the one the
//! engine computes in), copies of earlier sessions are *parked* in memory within a
//! byte budget, and on disk when a cache directory is given.
//!
//! Per request the worker asks [`SessionCache::choose`] which held state serves the
//! prompt best: the live session or a parked one, whichever keeps the most prompt
//! tokens without evaluating them. That count is the text-aligned common prefix
//! ([`crate::prompt_cache`]) cut back to a point the state can rewind to without
//! re-evaluation ([`crate::backend::reach`]; for recurrent families such as GLM-5.3 the
//! family's checkpoints). When a parked state wins, the live session is parked first
//! (unless a parked state already covers it) and the winner restored into it. When the
//! live session wins but the prompt diverges inside its last prompt (another
//! conversation, or an edited turn), it is parked before the prefill overwrites it; a
//! prompt that diverges only in the last answer (the usual next turn) does not park.
//!
//! Parked states are evicted least recently used first when the memory budget is
//! exceeded: written to the cache directory when there is one ([`disk`]), dropped
//! otherwise; disk files past their budget are deleted least recently used first. At
//! shutdown the live session and every parked state are written to disk, so a
//! restarted server resumes the conversations.

pub mod disk;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use crate::backend::{BackendError, Engine, Parked, reach};
use crate::metrics::CacheStats;
use crate::prompt_cache::{AlignedPrompt, PromptCache};

/// Budgets and where disk checkpoints go.
#[derive(Debug, Clone)]
pub struct CacheConfig {
    /// Bytes of parked states held in memory (the live session not counted).
    pub mem_budget: u64,
    /// Directory of disk checkpoints (`None`: no disk tier).
    pub dir: Option<PathBuf>,
    /// Bytes of disk checkpoints kept.
    pub disk_max: u64,
}

impl CacheConfig {
    /// A quarter of the memory available now (Linux `MemAvailable`), else 2 GiB.
    pub fn default_mem_budget() -> u64 {
        std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| {
                m.lines()
                    .find_map(|l| l.strip_prefix("MemAvailable:"))
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            })
            .map_or(2 << 30, |kib| kib * 1024 / 4)
    }
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig {
            mem_budget: Self::default_mem_budget(),
            dir: None,
            disk_max: 16 << 30,
        }
    }
}

/// Where a parked state is.
enum Place {
    Memory(Box<dyn Parked>),
    Disk(disk::DiskEntry),
}

/// A parked state and what is known about it without loading it.
struct Entry {
    tokens: Vec<u32>,
    text: PromptCache,
    reachable: Vec<std::ops::RangeInclusive<usize>>,
    logits_known: bool,
    place: Place,
    /// Last use (a tick of [`SessionCache`]).
    used: u64,
}

impl Entry {
    fn bytes(&self) -> u64 {
        match &self.place {
            Place::Memory(p) => p.bytes(),
            Place::Disk(d) => d.bytes,
        }
    }

    fn in_memory(&self) -> bool {
        matches!(self.place, Place::Memory(_))
    }

    /// Whether this state can serve everything `tokens` (a prefix of its own) can.
    fn covers(&self, tokens: &[u32]) -> bool {
        self.tokens.starts_with(tokens)
            && (tokens.len() == self.tokens.len()
                || reach(&self.reachable, tokens.len()) == tokens.len())
    }
}

/// Which held state serves a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The live session.
    Live,
    /// A state parked in memory.
    Memory,
    /// A state checkpointed on disk.
    Disk,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Live => "live",
            Source::Memory => "memory",
            Source::Disk => "disk",
        }
    }
}

/// The live session's text alignment (its tokens are the engine's) and the length of
/// the last prompt brought into it.
pub struct Live {
    pub text: PromptCache,
    pub prompt_len: usize,
}

/// A prompt to bring in: its text, canonical tokens and their byte offsets.
pub struct PromptText<'a> {
    pub text: &'a str,
    pub canonical: &'a [u32],
    pub offsets: Option<&'a [usize]>,
}

/// The parked states (see the module header).
pub struct SessionCache {
    config: CacheConfig,
    entries: Vec<Entry>,
    tick: u64,
    identity: String,
    stats: Arc<CacheStats>,
    disk: Option<disk::DiskStore>,
}

/// How many prompt tokens a state holding `held` keeps for `prompt` (see the module
/// header): the common prefix, one less when that is the whole prompt and the logits
/// after it are not held (or the state holds more), cut back to a reachable point.
fn usable(
    held: &[u32],
    reachable: &[std::ops::RangeInclusive<usize>],
    logits_known: bool,
    prompt: &[u32],
) -> usize {
    let mut keep = held.iter().zip(prompt).take_while(|(a, b)| a == b).count();
    if keep == prompt.len() && keep > 0 && (keep < held.len() || !logits_known) {
        keep -= 1;
    }
    if keep < held.len() {
        reach(reachable, keep)
    } else {
        keep
    }
}

impl SessionCache {
    /// An empty cache for an engine of `identity`; with a cache directory, the
    /// checkpoints found there for this identity are indexed (others are ignored with
    /// one log line each).
    pub fn new(config: CacheConfig, identity: String, stats: Arc<CacheStats>) -> Self {
        let mut cache = SessionCache {
            entries: Vec::new(),
            tick: 0,
            disk: config
                .dir
                .as_ref()
                .map(|d| disk::DiskStore::new(d.clone(), &identity)),
            identity,
            stats,
            config,
        };
        if let Some(store) = &mut cache.disk {
            for found in store.scan() {
                let Some(text) = PromptCache::from_parts(found.text.clone(), found.marks.clone())
                else {
                    continue;
                };
                cache.entries.push(Entry {
                    tokens: found.tokens.clone(),
                    text,
                    reachable: found.reachable.clone(),
                    logits_known: found.logits_known,
                    used: 0,
                    place: Place::Disk(found),
                });
            }
            // The newest files count as the most recently used.
            cache.entries.sort_by_key(|e| match &e.place {
                Place::Disk(d) => d.modified,
                Place::Memory(_) => std::time::SystemTime::UNIX_EPOCH,
            });
            for (i, e) in cache.entries.iter_mut().enumerate() {
                e.used = i as u64;
            }
            cache.tick = cache.entries.len() as u64;
            if !cache.entries.is_empty() {
                tracing::info!(
                    "prompt cache: {} disk checkpoints found in {}",
                    cache.entries.len(),
                    cache
                        .config
                        .dir
                        .as_ref()
                        .map_or(String::new(), |d| d.display().to_string())
                );
            }
        }
        cache.publish();
        cache
    }

    /// The engine identity the cache was made for.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// Aligns `prompt` with the live session and every parked state and picks the one
    /// that keeps the most tokens; if it is a parked state, parks the live session and
    /// restores the winner into the engine (`live.text` follows). A state that cannot be
    /// restored (a corrupted disk file) is dropped with one log line and the live
    /// session serves. Returns the aligned prompt and where it came from.
    pub fn choose(
        &mut self,
        engine: &mut dyn Engine,
        live: &mut Live,
        prompt: &PromptText<'_>,
    ) -> (AlignedPrompt, Source) {
        let live_aligned = live.text.align(
            engine.tokens(),
            prompt.text,
            prompt.canonical,
            prompt.offsets,
        );
        let live_use = usable(
            engine.tokens(),
            &engine.reachable(),
            engine.logits_known(),
            &live_aligned.tokens,
        );
        let mut best: Option<(usize, AlignedPrompt, usize)> = None;
        for (i, e) in self.entries.iter().enumerate() {
            let a = e
                .text
                .align(&e.tokens, prompt.text, prompt.canonical, prompt.offsets);
            let u = usable(&e.tokens, &e.reachable, e.logits_known, &a.tokens);
            let better = match &best {
                None => true,
                Some((bu, _, bi)) => {
                    let b = &self.entries[*bi];
                    (u, e.in_memory(), e.used) > (*bu, b.in_memory(), b.used)
                }
            };
            if better {
                best = Some((u, a, i));
            }
        }
        if let Some((u, aligned, i)) = best
            && u > live_use
        {
            match self.restore(engine, live, i) {
                Ok(source) => return (aligned, source),
                Err(e) => tracing::warn!(
                    "prompt cache: restoring a parked state failed ({e}); prefilling instead"
                ),
            }
            let aligned = live.text.align(
                engine.tokens(),
                prompt.text,
                prompt.canonical,
                prompt.offsets,
            );
            return (aligned, Source::Live);
        }
        // The prefill will overwrite part of the last prompt: keep a copy.
        if live_use + 1 < live.prompt_len
            && let Err(e) = self.park_live(&*engine, live)
        {
            tracing::warn!("prompt cache: parking the live session failed: {e}");
        }
        (live_aligned, Source::Live)
    }

    /// Parks the live session (unless a parked state covers it) and restores entry `i`.
    fn restore(
        &mut self,
        engine: &mut dyn Engine,
        live: &mut Live,
        i: usize,
    ) -> Result<Source, BackendError> {
        let t0 = Instant::now();
        // Out of the list while the live session is parked, so it cannot be evicted.
        let mut target = self.entries.remove(i);
        let loaded = match &target.place {
            Place::Memory(_) => None,
            Place::Disk(d) => {
                let store = self
                    .disk
                    .as_mut()
                    .ok_or_else(|| BackendError::Engine("no cache directory".into()))?;
                match store.load(d, &*engine) {
                    Ok(p) => Some(p),
                    Err(e) => {
                        store.forget(&d.path);
                        self.stats.record_bad_file();
                        self.publish();
                        return Err(BackendError::Engine(format!("{}: {e}", d.path.display())));
                    }
                }
            }
        };
        if !target.covers(engine.tokens()) {
            self.park_live(&*engine, live)?;
        }
        let (state, source) = match (&target.place, &loaded) {
            (Place::Memory(p), _) => (&**p, Source::Memory),
            (Place::Disk(_), Some(p)) => (&**p, Source::Disk),
            (Place::Disk(_), None) => {
                return Err(BackendError::Engine(
                    "a checkpoint that was not loaded".into(),
                ));
            }
        };
        let restored = engine.unpark(state);
        self.tick += 1;
        target.used = self.tick;
        if restored.is_ok() {
            live.text = target.text.clone();
            // Its tokens are in the parked copy: nothing to save before the prefill.
            live.prompt_len = 0;
        }
        self.entries.push(target);
        if let Err(e) = restored {
            // The live state may be half replaced: start it over.
            let _ = engine.sync(&[], &|| false);
            live.text = PromptCache::new();
            return Err(e);
        }
        match source {
            Source::Memory => self.stats.record_hit_memory(),
            _ => self.stats.record_hit_disk(),
        }
        self.enforce(&*engine);
        tracing::info!(
            "prompt cache: restored {} tokens from {} in {:.1} ms",
            engine.tokens().len(),
            source.as_str(),
            t0.elapsed().as_secs_f64() * 1e3
        );
        Ok(source)
    }

    /// Parks a copy of the live session, unless it is empty or a parked state covers
    /// it; parked states it covers are dropped. Evicts past the memory budget.
    pub fn park_live(&mut self, engine: &dyn Engine, live: &Live) -> Result<(), BackendError> {
        let tokens = engine.tokens();
        if tokens.is_empty() || self.entries.iter().any(|e| e.covers(tokens)) {
            return Ok(());
        }
        let parked = engine.park()?;
        let entry = Entry {
            tokens: tokens.to_vec(),
            text: live.text.clone(),
            reachable: parked.reachable(),
            logits_known: parked.logits_known(),
            place: Place::Memory(parked),
            used: {
                self.tick += 1;
                self.tick
            },
        };
        let mut dropped = Vec::new();
        self.entries.retain(|e| {
            let covered = entry.covers(&e.tokens);
            if covered && let Place::Disk(d) = &e.place {
                dropped.push(d.path.clone());
            }
            !covered
        });
        if let Some(store) = &mut self.disk {
            for p in dropped {
                store.delete(&p);
            }
        }
        self.entries.push(entry);
        self.enforce(engine);
        Ok(())
    }

    /// Evicts least recently used parked states past the budgets.
    fn enforce(&mut self, engine: &dyn Engine) {
        loop {
            let mem: u64 = self
                .entries
                .iter()
                .filter(|e| e.in_memory())
                .map(Entry::bytes)
                .sum();
            if mem <= self.config.mem_budget {
                break;
            }
            let Some(i) = self
                .entries
                .iter()
                .enumerate()
                .filter(|(_, e)| e.in_memory())
                .min_by_key(|(_, e)| e.used)
                .map(|(i, _)| i)
            else {
                break;
            };
            self.stats.record_eviction();
            self.spill(engine, i);
        }
        if let Some(store) = &mut self.disk {
            loop {
                let on_disk: u64 = self
                    .entries
                    .iter()
                    .filter(|e| !e.in_memory())
                    .map(Entry::bytes)
                    .sum();
                if on_disk <= self.config.disk_max {
                    break;
                }
                let Some(i) = self
                    .entries
                    .iter()
                    .enumerate()
                    .filter(|(_, e)| !e.in_memory())
                    .min_by_key(|(_, e)| e.used)
                    .map(|(i, _)| i)
                else {
                    break;
                };
                if let Place::Disk(d) = &self.entries.remove(i).place {
                    store.delete(&d.path);
                }
                self.stats.record_disk_eviction();
            }
        }
        self.publish();
    }

    /// Moves memory entry `i` to disk (or drops it without a cache directory).
    fn spill(&mut self, engine: &dyn Engine, i: usize) {
        let e = self.entries.remove(i);
        let (Some(store), Place::Memory(p)) = (&mut self.disk, &e.place) else {
            return;
        };
        match store.save(
            engine,
            &**p,
            &e.tokens,
            &e.text,
            &e.reachable,
            e.logits_known,
        ) {
            Ok(d) => self.entries.push(Entry {
                place: Place::Disk(d),
                ..e
            }),
            Err(err) => tracing::warn!("prompt cache: writing a checkpoint failed: {err}"),
        }
    }

    /// At shutdown: parks the live session and writes every parked state to disk.
    pub fn persist(&mut self, engine: &dyn Engine, live: &Live) {
        if self.disk.is_none() {
            return;
        }
        if let Err(e) = self.park_live(engine, live) {
            tracing::warn!("prompt cache: parking the live session failed: {e}");
        }
        while let Some(i) = self.entries.iter().position(Entry::in_memory) {
            self.spill(engine, i);
        }
        self.enforce(engine);
    }

    /// Updates the gauges.
    fn publish(&self) {
        let (mut mem, mut mem_n, mut disk, mut disk_n) = (0, 0, 0, 0);
        for e in &self.entries {
            if e.in_memory() {
                mem += e.bytes();
                mem_n += 1;
            } else {
                disk += e.bytes();
                disk_n += 1;
            }
        }
        self.stats.set_held(mem_n, mem, disk_n, disk);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usable_counts_the_reachable_common_prefix() {
        let held = [1, 2, 3, 4, 5];
        let all = [0..=5];
        assert_eq!(usable(&held, &all, true, &[1, 2, 3, 9]), 3);
        // The whole prompt held with its logits: all of it; without: one less.
        assert_eq!(usable(&held, &all, true, &[1, 2, 3, 4, 5]), 5);
        assert_eq!(usable(&held, &all, false, &[1, 2, 3, 4, 5]), 4);
        assert_eq!(usable(&held, &all, true, &[1, 2, 3]), 2);
        // A recurrent state reaching only 0 and 4..=5 (and an anchor at 1..=2).
        let ckpt = [0..=0, 4..=5, 1..=2];
        assert_eq!(usable(&held, &ckpt, true, &[1, 2, 3, 9]), 2);
        assert_eq!(usable(&held, &ckpt, true, &[1, 2, 3, 4, 5, 6]), 5);
        assert_eq!(usable(&held, &[0..=0, 4..=5], true, &[1, 2, 3]), 0);
    }
}
