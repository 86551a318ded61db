//! The engine worker: one thread owns the live session and runs jobs in FIFO order
//! from a bounded queue. Each job's tokens come back as text deltas over a channel;
//! a job whose receiver is gone (the client disconnected) is cancelled between
//! prefill chunks or within one decode step.
//!
//! Per job: pick the held session state that serves the prompt best (the live session
//! or a parked one, see [`crate::session_cache`]) and align the prompt with it
//! (text-keyed reuse, see [`crate::prompt_cache`]), sync (prefill only the new
//! suffix), generate, and turn tokens into text safely: incomplete UTF-8 is held back
//! and stop sequences never leak (see [`crate::utf8`], [`crate::stop`]). When the
//! queue closes, the held states are written to the cache directory.

use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use tokio::sync::mpsc::UnboundedSender;

use crate::backend::{BackendError, Engine, GenSettings, GenStop, Sampled, Vocab};
use crate::metrics::Metrics;
use crate::prompt_cache::{AlignedPrompt, PromptCache, token_offsets};
use crate::session_cache::{CacheConfig, Live, PromptText, SessionCache, Source};
use crate::stop::StopMatcher;
use crate::utf8::Utf8Assembler;

/// A prompt as the worker receives it.
#[derive(Debug, Clone)]
pub enum PromptInput {
    /// Rendered text and its canonical tokenization (with BOS as the vocabulary asks).
    Text { text: String, tokens: Vec<u32> },
    /// Token ids given by the client.
    Tokens(Vec<u32>),
}

impl PromptInput {
    /// The prompt's length in tokens before alignment.
    pub fn len(&self) -> usize {
        match self {
            PromptInput::Text { tokens, .. } | PromptInput::Tokens(tokens) => tokens.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One request for the engine.
pub struct Job {
    /// For logs.
    pub id: String,
    pub prompt: PromptInput,
    pub settings: GenSettings,
    /// Stop sequences (not part of the answer).
    pub stop: Vec<String>,
    /// Text after which generation ends, kept in the answer.
    pub end_after: Vec<String>,
    pub events: UnboundedSender<WorkerEvent>,
    pub enqueued: Instant,
}

/// A token's log-probability, for the API's `logprobs`.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    pub token: String,
    pub bytes: Vec<u8>,
    pub logprob: f64,
    /// The most likely alternatives: `(token, bytes, logprob)`.
    pub top: Vec<(String, Vec<u8>, f64)>,
}

/// Why a generation ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinishReason {
    /// The model ended its turn.
    Eog,
    /// `max_tokens` reached.
    Length,
    /// The context is full.
    ContextFull,
    /// This stop sequence matched.
    StopSequence(String),
    /// The client went away (a server-side cancel while the client waits is
    /// [`JobError::ShuttingDown`] instead).
    Cancelled,
}

impl FinishReason {
    /// Whether the answer was cut short (token limit, full context or a stop sequence),
    /// possibly in the middle of a tool call.
    pub fn is_cut(&self) -> bool {
        matches!(
            self,
            FinishReason::Length | FinishReason::ContextFull | FinishReason::StopSequence(_)
        )
    }
}

/// Token counts and timings of one request.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Usage {
    pub prompt_tokens: usize,
    /// Prompt tokens reused from the live session.
    pub cached_tokens: usize,
    /// Generated tokens, a final end-of-generation token excluded.
    pub completion_tokens: usize,
    /// Prompt tokens evaluated and the time spent on them at the engine's prefill
    /// boundary; `None` when nothing was evaluated (never a made-up 0).
    pub prefill_tokens: usize,
    pub prefill_ms: Option<f64>,
    /// Tokens sampled and the time from the first to the last; `None` with fewer than
    /// two.
    pub decode_tokens: usize,
    pub decode_ms: Option<f64>,
}

impl Usage {
    /// The `timings` extension object the APIs send next to `usage`.
    pub fn timings_json(&self) -> serde_json::Value {
        serde_json::json!({
            "prefill_tokens": self.prefill_tokens,
            "prefill_ms": self.prefill_ms,
            "decode_tokens": self.decode_tokens,
            "decode_ms": self.decode_ms,
        })
    }
}

/// The end of a job.
#[derive(Debug, Clone, PartialEq)]
pub struct Finished {
    pub reason: FinishReason,
    pub usage: Usage,
}

/// What the worker sends back for a job.
#[derive(Debug, Clone, PartialEq)]
pub enum WorkerEvent {
    /// The prompt is in the session; generation starts.
    Started {
        prompt_tokens: usize,
        cached_tokens: usize,
    },
    /// One sampled token: the text it releases (possibly empty) and its log-probability.
    Delta {
        text: String,
        logprob: Option<TokenLogprob>,
    },
    Done(Finished),
    Failed(JobError),
}

/// Why a job failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum JobError {
    #[error(
        "the prompt needs {needed} tokens but the context holds {n_ctx}; shorten the conversation or restart the server with a larger --ctx"
    )]
    ContextFull { needed: usize, n_ctx: usize },
    #[error("the server is shutting down")]
    ShuttingDown,
    #[error("{0}")]
    Engine(String),
}

/// Why a job was not queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    #[error("the request queue is full ({depth} waiting)")]
    Full { depth: usize },
    #[error("the server is shutting down")]
    ShuttingDown,
}

struct Shared {
    depth: AtomicUsize,
    busy: AtomicBool,
    session_tokens: AtomicUsize,
    /// Queued jobs are refused (shutdown has begun).
    closing: AtomicBool,
    /// The running job is cancelled too.
    cancel_all: AtomicBool,
    /// Mean job duration in ms (for Retry-After).
    mean_job_ms: AtomicUsize,
}

/// The handle the HTTP side holds.
pub struct Worker {
    tx: Mutex<Option<SyncSender<Job>>>,
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
    n_ctx: usize,
    /// Jobs that may wait (`--queue`).
    queue: usize,
}

impl Worker {
    /// Starts the worker thread with room for `queue` waiting jobs (0: a job is taken
    /// only while the engine is idle).
    pub fn spawn(
        engine: Box<dyn Engine>,
        vocab: Arc<dyn Vocab>,
        queue: usize,
        cache: CacheConfig,
        metrics: Arc<Metrics>,
    ) -> Self {
        let (tx, rx) = sync_channel(queue);
        let shared = Arc::new(Shared {
            depth: AtomicUsize::new(0),
            busy: AtomicBool::new(false),
            session_tokens: AtomicUsize::new(0),
            closing: AtomicBool::new(false),
            cancel_all: AtomicBool::new(false),
            mean_job_ms: AtomicUsize::new(1000),
        });
        let n_ctx = engine.n_ctx();
        let store = SessionCache::new(cache, engine.identity(), metrics.cache.clone());
        let state = WorkerState {
            engine,
            vocab,
            live: Live {
                text: PromptCache::new(),
                prompt_len: 0,
            },
            store,
            shared: shared.clone(),
            metrics,
        };
        let thread = std::thread::Builder::new()
            .name("ds4-engine".into())
            .spawn(move || state.run(rx))
            .expect("spawning the engine worker thread");
        Worker {
            tx: Mutex::new(Some(tx)),
            shared,
            thread: Mutex::new(Some(thread)),
            n_ctx,
            queue,
        }
    }

    /// The session's context size.
    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    /// Queues a job.
    pub fn submit(&self, job: Job) -> Result<(), SubmitError> {
        let guard = self.tx.lock().unwrap_or_else(|e| e.into_inner());
        let Some(tx) = guard.as_ref() else {
            return Err(SubmitError::ShuttingDown);
        };
        if self.shared.closing.load(Ordering::SeqCst) {
            return Err(SubmitError::ShuttingDown);
        }
        self.shared.depth.fetch_add(1, Ordering::SeqCst);
        match tx.try_send(job) {
            Ok(()) => Ok(()),
            Err(e) => {
                self.shared.depth.fetch_sub(1, Ordering::SeqCst);
                match e {
                    // Full: as many jobs wait as the queue holds.
                    TrySendError::Full(_) => Err(SubmitError::Full { depth: self.queue }),
                    TrySendError::Disconnected(_) => Err(SubmitError::ShuttingDown),
                }
            }
        }
    }

    /// Jobs waiting (not counting the running one).
    pub fn queue_depth(&self) -> usize {
        self.shared.depth.load(Ordering::SeqCst)
    }

    /// Whether a job is running.
    pub fn busy(&self) -> bool {
        self.shared.busy.load(Ordering::SeqCst)
    }

    /// Tokens the live session holds (as of the last job).
    pub fn session_tokens(&self) -> usize {
        self.shared.session_tokens.load(Ordering::SeqCst)
    }

    /// A Retry-After estimate in seconds for a refused request.
    pub fn retry_after_secs(&self) -> u64 {
        let mean = self.shared.mean_job_ms.load(Ordering::Relaxed) as u64;
        ((self.queue_depth() as u64 + 1) * mean)
            .div_ceil(1000)
            .clamp(1, 600)
    }

    /// Begins shutdown: no new jobs; queued jobs fail with
    /// [`JobError::ShuttingDown`]; the running job finishes unless [`Worker::cancel_all`]
    /// follows.
    pub fn close(&self) {
        self.shared.closing.store(true, Ordering::SeqCst);
        self.tx.lock().unwrap_or_else(|e| e.into_inner()).take();
    }

    /// Cancels the running job within one decode step.
    pub fn cancel_all(&self) {
        self.shared.cancel_all.store(true, Ordering::SeqCst);
    }

    /// Closes the queue and waits for the thread to end.
    pub fn join(&self) {
        self.close();
        if let Some(t) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = t.join();
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.cancel_all();
        self.join();
    }
}

struct WorkerState {
    engine: Box<dyn Engine>,
    vocab: Arc<dyn Vocab>,
    /// The live session's text alignment.
    live: Live,
    /// Parked session states.
    store: SessionCache,
    shared: Arc<Shared>,
    metrics: Arc<Metrics>,
}

impl WorkerState {
    fn run(mut self, rx: Receiver<Job>) {
        while let Ok(job) = rx.recv() {
            self.shared.depth.fetch_sub(1, Ordering::SeqCst);
            if self.shared.closing.load(Ordering::SeqCst) {
                let _ = job.events.send(WorkerEvent::Failed(JobError::ShuttingDown));
                continue;
            }
            if job.events.is_closed() {
                tracing::info!(id = %job.id, "client left while queued; skipped");
                self.metrics.record_cancelled();
                continue;
            }
            self.shared.busy.store(true, Ordering::SeqCst);
            let t0 = Instant::now();
            self.run_job(job);
            let ms = t0.elapsed().as_millis() as usize;
            let old = self.shared.mean_job_ms.load(Ordering::Relaxed);
            self.shared
                .mean_job_ms
                .store((old * 7 + ms) / 8, Ordering::Relaxed);
            self.shared
                .session_tokens
                .store(self.engine.tokens().len(), Ordering::SeqCst);
            self.shared.busy.store(false, Ordering::SeqCst);
        }
        self.store.persist(&*self.engine, &self.live);
    }

    /// The prompt as token ids for the session state that serves it best (restored
    /// into the engine when it is a parked one).
    fn align(&mut self, prompt: PromptInput) -> (AlignedPrompt, Source) {
        match prompt {
            PromptInput::Tokens(t) => (AlignedPrompt::from_tokens(t), Source::Live),
            PromptInput::Text { text, tokens } => {
                let vocab = &self.vocab;
                let offsets = token_offsets(text.as_bytes(), &tokens, &|id| vocab.piece(id, true));
                self.store.choose(
                    &mut *self.engine,
                    &mut self.live,
                    &PromptText {
                        text: &text,
                        canonical: &tokens,
                        offsets: offsets.as_deref(),
                    },
                )
            }
        }
    }

    fn commit(&mut self, prompt: &AlignedPrompt, generated: &[u32]) {
        let vocab = &self.vocab;
        self.live.text.commit(
            prompt,
            generated,
            &|id| vocab.piece(id, true),
            self.engine.tokens(),
        );
    }

    fn run_job(&mut self, job: Job) {
        let Job {
            id,
            prompt,
            settings,
            stop,
            end_after,
            events,
            enqueued,
        } = job;
        let shared = self.shared.clone();
        let cancel = || events.is_closed() || shared.cancel_all.load(Ordering::SeqCst);
        let (aligned, source) = self.align(prompt);
        let n_ctx = self.engine.n_ctx();
        if aligned.tokens.len() >= n_ctx {
            let _ = events.send(WorkerEvent::Failed(JobError::ContextFull {
                needed: aligned.tokens.len() + 1,
                n_ctx,
            }));
            return;
        }
        let sync = match self.engine.sync(&aligned.tokens, &cancel) {
            Ok(s) => s,
            Err(e) => {
                self.commit(&aligned, &[]);
                match e {
                    BackendError::Cancelled => {
                        tracing::info!(%id, "cancelled during prefill");
                        self.metrics.record_cancelled();
                        let _ = events.send(WorkerEvent::Failed(JobError::ShuttingDown));
                    }
                    BackendError::ContextFull { needed, n_ctx } => {
                        let _ = events
                            .send(WorkerEvent::Failed(JobError::ContextFull { needed, n_ctx }));
                    }
                    other => {
                        tracing::error!(%id, "prefill failed: {other}");
                        let _ =
                            events.send(WorkerEvent::Failed(JobError::Engine(other.to_string())));
                    }
                }
                return;
            }
        };
        let prompt_tokens = aligned.tokens.len();
        self.live.prompt_len = prompt_tokens;
        self.metrics
            .record_prefill(prompt_tokens, sync.reused, sync.evaluated, sync.time);
        match (source, sync.reused) {
            (_, 0) => self.metrics.cache.record_miss(),
            (Source::Live, _) => self.metrics.cache.record_hit_live(),
            _ => {}
        }
        let prefill_ms = sync.time.map_or(0.0, |t| t.as_secs_f64() * 1e3);
        tracing::info!(
            %id,
            prompt_tokens,
            cached = sync.reused,
            from = source.as_str(),
            spliced = aligned.spliced,
            prefilled = sync.evaluated,
            prefill_ms = format!("{prefill_ms:.1}"),
            "prompt in session: {} of {} tokens reused ({}), prefilled the {}-token suffix; {}",
            sync.reused,
            prompt_tokens,
            source.as_str(),
            sync.evaluated,
            self.metrics.cache.summary()
        );
        let _ = events.send(WorkerEvent::Started {
            prompt_tokens,
            cached_tokens: sync.reused,
        });

        let mut text = TextPipeline::new(&stop, end_after);
        let mut generated = Vec::new();
        let mut completion = 0;
        let mut cancelled = false;
        let mut stopped_by: Option<String> = None;
        let vocab = self.vocab.clone();
        let metrics = self.metrics.clone();
        let result = self
            .engine
            .generate(&aligned.tokens, &settings, &mut |s: Sampled| {
                if generated.is_empty() {
                    metrics.record_ttft(enqueued.elapsed());
                }
                generated.push(s.id);
                if cancel() {
                    cancelled = true;
                    return ControlFlow::Break(());
                }
                if vocab.is_eog(s.id) {
                    return ControlFlow::Continue(());
                }
                completion += 1;
                let (delta, hit) = text.push(&vocab.piece(s.id, false));
                let logprob = s.logprob.map(|lp| token_logprob(&*vocab, s.id, lp, &s.top));
                if events
                    .send(WorkerEvent::Delta {
                        text: delta,
                        logprob,
                    })
                    .is_err()
                {
                    cancelled = true;
                    return ControlFlow::Break(());
                }
                if let Some(hit) = hit {
                    stopped_by = Some(hit);
                    return ControlFlow::Break(());
                }
                if text.ended() {
                    return ControlFlow::Break(());
                }
                ControlFlow::Continue(())
            });
        self.commit(&aligned, &generated);
        let outcome = match result {
            Ok(o) => o,
            Err(e) => {
                tracing::error!(%id, "generation failed: {e}");
                let _ = events.send(WorkerEvent::Failed(JobError::Engine(e.to_string())));
                return;
            }
        };
        self.metrics
            .record_decode(outcome.generated, outcome.decode_time);
        let reason = if cancelled {
            self.metrics.record_cancelled();
            FinishReason::Cancelled
        } else if let Some(s) = stopped_by {
            FinishReason::StopSequence(s)
        } else {
            match outcome.stop {
                GenStop::Eog | GenStop::Stopped => FinishReason::Eog,
                GenStop::Length => FinishReason::Length,
                GenStop::ContextFull => FinishReason::ContextFull,
            }
        };
        if !matches!(
            reason,
            FinishReason::StopSequence(_) | FinishReason::Cancelled
        ) {
            let rest = text.finish();
            if !rest.is_empty() {
                let _ = events.send(WorkerEvent::Delta {
                    text: rest,
                    logprob: None,
                });
            }
        }
        let decode_tps = outcome
            .decode_time
            .filter(|t| t.as_secs_f64() > 0.0 && outcome.generated > 1)
            .map_or(0.0, |t| (outcome.generated - 1) as f64 / t.as_secs_f64());
        tracing::info!(%id, generated = outcome.generated, decode_tps = format!("{decode_tps:.1}"), finish = ?reason, total_ms = enqueued.elapsed().as_millis() as u64, "done");
        let usage = Usage {
            prompt_tokens,
            cached_tokens: sync.reused,
            completion_tokens: completion,
            prefill_tokens: sync.evaluated,
            prefill_ms: sync.time.map(|t| t.as_secs_f64() * 1e3),
            decode_tokens: outcome.generated,
            decode_ms: outcome.decode_time.map(|t| t.as_secs_f64() * 1e3),
        };
        if reason == FinishReason::Cancelled && !events.is_closed() {
            // The server cancelled it (shutdown: the drain time ran out, or a second
            // signal) while the client still waits: its answer was cut, which a finish
            // reason would pass off as complete.
            let _ = events.send(WorkerEvent::Failed(JobError::ShuttingDown));
            return;
        }
        let _ = events.send(WorkerEvent::Done(Finished { reason, usage }));
    }
}

/// Token bytes → safe text: UTF-8 assembly, then stop sequences; and whether text
/// after which generation ends (`end_after`) was released.
struct TextPipeline {
    utf8: Utf8Assembler,
    stop: StopMatcher,
    end_after: Vec<String>,
    /// The end of the released text, long enough to hold any `end_after` sequence.
    tail: String,
    ended: bool,
}

impl TextPipeline {
    fn new(stops: &[String], end_after: Vec<String>) -> Self {
        TextPipeline {
            utf8: Utf8Assembler::new(),
            stop: StopMatcher::new(stops),
            end_after: end_after.into_iter().filter(|s| !s.is_empty()).collect(),
            tail: String::new(),
            ended: false,
        }
    }

    /// Text released by one token's bytes, and the stop sequence it completed.
    fn push(&mut self, bytes: &[u8]) -> (String, Option<String>) {
        let text = self.utf8.push(bytes);
        let r = self.stop.push(&text);
        self.watch(&r.text);
        (r.text, r.stopped)
    }

    fn watch(&mut self, released: &str) {
        if self.end_after.is_empty() || released.is_empty() {
            return;
        }
        self.tail.push_str(released);
        self.ended |= self
            .end_after
            .iter()
            .any(|e| self.tail.contains(e.as_str()));
        let keep = self.end_after.iter().map(String::len).max().unwrap_or(0);
        if self.tail.len() > keep {
            let mut cut = self.tail.len() - keep;
            while !self.tail.is_char_boundary(cut) {
                cut -= 1;
            }
            self.tail.drain(..cut);
        }
    }

    /// Whether an `end_after` sequence has been released.
    fn ended(&self) -> bool {
        self.ended
    }

    /// Held text at the end of generation (no stop sequence matched); an incomplete
    /// character is dropped.
    fn finish(&mut self) -> String {
        self.utf8.finish();
        self.stop.finish()
    }
}

fn token_logprob(vocab: &dyn Vocab, id: u32, logprob: f64, top: &[(u32, f64)]) -> TokenLogprob {
    let entry = |id: u32| {
        let bytes = vocab.piece(id, true);
        (String::from_utf8_lossy(&bytes).into_owned(), bytes)
    };
    let (token, bytes) = entry(id);
    TokenLogprob {
        token,
        bytes,
        logprob,
        top: top
            .iter()
            .map(|&(t, lp)| {
                let (s, b) = entry(t);
                (s, b, lp)
            })
            .collect(),
    }
}
