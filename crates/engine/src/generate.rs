//! The generation loop shared by the CLI and the server: bring the session to the
//! prompt (reusing the common prefix), then sample and evaluate one token at a time
//! until an end-of-generation token, the token limit, or the caller stops it.

use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use crate::Result;
use crate::sampler::{Rng, SamplerParams, sample};
use crate::session::{GreedyEnd, Session, SyncStats};

/// Settings of one generation.
#[derive(Debug, Clone, Copy)]
pub struct GenerateParams {
    /// Most tokens to generate.
    pub max_tokens: usize,
    pub sampler: SamplerParams,
    /// Initial RNG state (ds4: the state starts equal to the seed).
    pub seed: u64,
    /// Whether `on_token` reads the logits row (log-probabilities). Without it a greedy
    /// generation lets the backend choose each token after the first
    /// ([`Session::decode_greedy`]: the device never waits for the host between steps)
    /// and hands `on_token` an empty row for those.
    pub needs_logits: bool,
}

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// An end-of-generation token was sampled (it is reported to the callback).
    Eog,
    /// `max_tokens` were generated.
    Length,
    /// The callback asked to stop.
    Stopped,
    /// The context is full.
    ContextFull,
}

impl StopReason {
    /// The short name used in stats and receipts (`eog`, `length`, `stop`, `context`).
    pub fn as_str(self) -> &'static str {
        match self {
            StopReason::Eog => "eog",
            StopReason::Length => "length",
            StopReason::Stopped => "stop",
            StopReason::ContextFull => "context",
        }
    }
}

/// Measurements of one generation.
#[derive(Debug, Clone, Copy)]
pub struct GenerateStats {
    pub prompt_tokens: usize,
    /// Prompt tokens reused from the session (not evaluated).
    pub cached_tokens: usize,
    /// Time evaluating the new prompt tokens; `None` when none were evaluated.
    pub prefill_time: Option<Duration>,
    /// Tokens sampled (including a final end-of-generation token).
    pub generated_tokens: usize,
    /// Time from the first sampled token to the last one (sampling and evaluation of
    /// every token but the last); `None` with fewer than two generated tokens.
    pub decode_time: Option<Duration>,
    pub stop: StopReason,
}

impl GenerateStats {
    /// Prefill tokens per second, when measured.
    pub fn prefill_tps(&self) -> Option<f64> {
        let t = self.prefill_time?.as_secs_f64();
        (t > 0.0).then(|| (self.prompt_tokens - self.cached_tokens) as f64 / t)
    }

    /// Decode tokens per second (tokens after the first over the decode time).
    pub fn decode_tps(&self) -> Option<f64> {
        let t = self.decode_time?.as_secs_f64();
        (t > 0.0).then(|| (self.generated_tokens - 1) as f64 / t)
    }
}

/// Brings `session` to `prompt` and generates. `on_token(id, logits)` sees every sampled
/// token (including a final EOG token) with the logits row it was sampled from (empty
/// for the backend's greedy choices, see [`GenerateParams::needs_logits`]), and may break
/// to stop; `is_eog` tells which tokens end generation. `progress(done, total)` reports
/// prefill progress. The last sampled token is not evaluated — except when the backend
/// chooses the tokens ([`GenerateParams::needs_logits`] off, greedy) and generation stops
/// at a later token than the first by `on_token`'s break or an end-of-generation token
/// before `max_tokens`, with room in the context: its step was queued before it was read
/// ([`Session::decode_greedy`]). The session holds the prompt and every evaluated token;
/// the next request's [`Session::sync`] evaluates what it needs.
pub fn generate(
    session: &mut Session,
    prompt: &[u32],
    params: &GenerateParams,
    is_eog: &dyn Fn(u32) -> bool,
    progress: &mut dyn FnMut(usize, usize),
    on_token: &mut dyn FnMut(u32, &[f32]) -> ControlFlow<()>,
) -> Result<GenerateStats> {
    let SyncStats {
        reused, eval_time, ..
    } = session.sync(prompt, progress)?;
    let mut rng = Rng(params.seed);
    let mut stats = GenerateStats {
        prompt_tokens: prompt.len(),
        cached_tokens: reused,
        prefill_time: eval_time,
        generated_tokens: 0,
        decode_time: None,
        stop: StopReason::Length,
    };
    let mut t_first = None;
    // Counts a sampled token and says whether generation ends with it.
    let mut accept = |token: u32, logits: &[f32], stats: &mut GenerateStats| {
        stats.generated_tokens += 1;
        let t = *t_first.get_or_insert_with(Instant::now);
        if stats.generated_tokens > 1 {
            stats.decode_time = Some(t.elapsed());
        }
        if on_token(token, logits).is_break() {
            ControlFlow::Break(StopReason::Stopped)
        } else if is_eog(token) {
            ControlFlow::Break(StopReason::Eog)
        } else if stats.generated_tokens == params.max_tokens {
            ControlFlow::Break(StopReason::Length)
        } else {
            ControlFlow::Continue(())
        }
    };
    let pipelined = params.sampler.is_greedy() && !params.needs_logits;
    while stats.generated_tokens < params.max_tokens {
        let logits = session.logits().expect("sync and decode leave logits");
        let token = sample(logits, &params.sampler, &mut rng);
        if let ControlFlow::Break(stop) = accept(token, logits, &mut stats) {
            stats.stop = stop;
            break;
        }
        if session.tokens().len() + 1 > session.n_ctx() {
            stats.stop = StopReason::ContextFull;
            break;
        }
        if pipelined {
            let mut stop = StopReason::Length;
            let left = params.max_tokens - stats.generated_tokens;
            let end = session.decode_greedy(token, left, &mut |t| {
                accept(t, &[], &mut stats).map_break(|s| stop = s)
            })?;
            stats.stop = match end {
                GreedyEnd::ContextFull => StopReason::ContextFull,
                GreedyEnd::Max | GreedyEnd::Stopped => stop,
            };
            break;
        }
        session.decode(token)?;
    }
    Ok(stats)
}
