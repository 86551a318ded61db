//! The server's view of a model, as two small traits the engine worker drives:
//! [`Vocab`] (chat template, tokenizer, token pieces: shared, read-only) and [`Engine`]
//! (the live session: prefix sync, generation: owned by the worker thread).
//!
//! `crate::engine_adapter` implements both over `ds4_engine::LoadedModel` and
//! `ds4_engine::Session`; [`crate::fake`] implements them with a byte-level toy model so
//! the HTTP layer is testable without weights.

use std::any::Any;
use std::io::{Read, Write};
use std::ops::{ControlFlow, RangeInclusive};
use std::time::{Duration, Instant};

use serde_json::{Map, Value};

/// One message as the chat template sees it (the shape of `ds4_tokenizer::ChatMessage`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChatTurn {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// The text; `None` for an assistant turn that only calls tools.
    pub content: Option<String>,
    /// Reasoning text of an assistant turn, when the client resends it.
    pub reasoning_content: Option<String>,
    /// Tool calls of an assistant turn.
    pub tool_calls: Vec<TurnToolCall>,
    /// For a `tool` turn: the id of the call it answers.
    pub tool_call_id: Option<String>,
    /// For a `tool` turn: the function's name, when known.
    pub name: Option<String>,
}

impl ChatTurn {
    /// A turn with only a role and text.
    pub fn text(role: &str, content: &str) -> Self {
        ChatTurn {
            role: role.into(),
            content: Some(content.into()),
            ..Default::default()
        }
    }
}

/// A tool call inside an assistant turn.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnToolCall {
    pub id: String,
    pub name: String,
    /// The arguments as JSON (an object when the client's JSON text parsed; otherwise
    /// the raw text as a JSON string).
    pub arguments: Value,
}

/// What to render through the chat template.
#[derive(Debug, Clone, Copy)]
pub struct RenderRequest<'a> {
    pub messages: &'a [ChatTurn],
    /// Tool definitions in OpenAI's `{"type":"function","function":{...}}` form; empty
    /// for none.
    pub tools: &'a [Value],
    pub add_generation_prompt: bool,
    /// Extra template variables (`enable_thinking`, `reasoning_effort`, …).
    pub vars: &'a Map<String, Value>,
}

/// Errors from the model side.
#[derive(Debug, Clone, thiserror::Error)]
pub enum BackendError {
    /// The chat template failed to render these messages.
    #[error("the chat template failed to render the messages: {0}")]
    Template(String),
    /// The prompt does not fit the context.
    #[error(
        "the prompt needs {needed} tokens but the context holds {n_ctx}; shorten the conversation or restart the server with a larger --ctx"
    )]
    ContextFull { needed: usize, n_ctx: usize },
    /// The caller's cancel check fired.
    #[error("cancelled")]
    Cancelled,
    /// Anything else the engine reported.
    #[error("engine error: {0}")]
    Engine(String),
}

/// The read-only, shareable half of a model: chat template, tokenizer and token pieces.
pub trait Vocab: Send + Sync + 'static {
    /// The id the server lists and answers under: a slug (see [`crate::state::slug`]),
    /// by default of the GGUF file stem.
    fn model_id(&self) -> String;
    /// The model's human-readable name (for instance GGUF `general.name`), if it has
    /// one: shown as the display name, never as an id.
    fn model_display_name(&self) -> Option<String>;
    /// The model's training context length in tokens (for `/v1/models`), if known.
    fn n_ctx_train(&self) -> Option<usize>;
    /// Rows of the logits (valid token ids are below this).
    fn n_vocab(&self) -> usize;
    /// The chat template's source text (to pick the tool-call format).
    fn chat_template_source(&self) -> String;
    /// Whether the chat template renders `tools` (if not, the server describes tools in
    /// a system message itself).
    fn template_supports_tools(&self) -> bool;
    /// Renders messages with the chat template.
    fn render(&self, req: &RenderRequest<'_>) -> Result<String, BackendError>;
    /// Tokenizes text that may hold special-token text; `add_bos` adds BOS as the
    /// vocabulary asks (llama.cpp's `add_special`), off for a continuation.
    fn tokenize(&self, text: &str, add_bos: bool) -> Vec<u32>;
    /// The bytes of token `id`; control tokens give their text only with
    /// `render_special`.
    fn piece(&self, id: u32, render_special: bool) -> Vec<u8>;
    /// Whether `id` ends generation.
    fn is_eog(&self, id: u32) -> bool;
}

/// Sampling settings with ds4's semantics (see `ds4_engine::sampler::SamplerParams`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplerSettings {
    /// `<= 0`: greedy.
    pub temperature: f32,
    /// `<= 0`: off.
    pub top_k: i32,
    /// `1`: off.
    pub top_p: f32,
    /// `0`: off.
    pub min_p: f32,
}

impl SamplerSettings {
    /// ds4's defaults: temperature 1, top-p 1, min-p 0.05, top-k off.
    pub const DS4_DEFAULT: Self = SamplerSettings {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.05,
    };
}

/// Settings of one generation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GenSettings {
    /// Most tokens to sample (an end-of-generation token counts).
    pub max_tokens: usize,
    pub sampler: SamplerSettings,
    /// Initial RNG state (ds4: the state starts equal to the seed).
    pub seed: u64,
    /// `Some(k)`: report each sampled token's log-probability and the `k` most likely
    /// alternatives.
    pub top_logprobs: Option<usize>,
}

/// One sampled token.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampled {
    pub id: u32,
    /// `ln p(id)` under the full softmax (temperature 1), when asked for.
    pub logprob: Option<f64>,
    /// The most likely `(id, logprob)`, most likely first, when asked for.
    pub top: Vec<(u32, f64)>,
}

/// Why [`Engine::generate`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GenStop {
    /// An end-of-generation token was sampled (and reported).
    Eog,
    /// `max_tokens` were sampled.
    Length,
    /// The callback broke.
    Stopped,
    /// The context is full.
    ContextFull,
}

/// What [`Engine::generate`] did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GenOutcome {
    /// Tokens sampled (a final end-of-generation token included).
    pub generated: usize,
    /// Time from the first sampled token to the last; `None` with fewer than two.
    pub decode_time: Option<Duration>,
    pub stop: GenStop,
}

/// What [`Engine::sync`] did.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct SyncOutcome {
    /// Prompt tokens the session already held.
    pub reused: usize,
    /// Prompt tokens evaluated.
    pub evaluated: usize,
    /// Time spent evaluating; `None` when nothing was evaluated.
    pub time: Option<Duration>,
}

impl SyncOutcome {
    /// `evaluated` tokens evaluated since `started` after `reused` kept; no time when
    /// nothing was evaluated.
    pub fn timed(reused: usize, evaluated: usize, started: Instant) -> Self {
        SyncOutcome {
            reused,
            evaluated,
            time: (evaluated > 0).then(|| started.elapsed()),
        }
    }
}

/// The leading tokens of `prompt` a session holding `held` keeps in [`Engine::sync`]:
/// the common prefix, but one less when that is the whole prompt and the logits after
/// it are not at hand (the session holds more, or `logits_known` is false), so that
/// the last token is evaluated again. A prompt over `n_ctx` tokens is refused.
pub fn reusable_prefix(
    held: &[u32],
    prompt: &[u32],
    n_ctx: usize,
    logits_known: bool,
) -> Result<usize, BackendError> {
    if prompt.len() > n_ctx {
        return Err(BackendError::ContextFull {
            needed: prompt.len(),
            n_ctx,
        });
    }
    let keep = held.iter().zip(prompt).take_while(|(a, b)| a == b).count();
    if keep == prompt.len() && (keep < held.len() || !logits_known) {
        return Ok(keep.saturating_sub(1));
    }
    Ok(keep)
}

/// The largest frontier length `<= keep` in one of the `reachable` ranges (0 when none
/// is): how much of a held state a prompt sharing `keep` tokens with it can reuse
/// without re-evaluating anything.
pub fn reach(reachable: &[RangeInclusive<usize>], keep: usize) -> usize {
    reachable
        .iter()
        .filter(|r| *r.start() <= keep)
        .map(|r| (*r.end()).min(keep))
        .max()
        .unwrap_or(0)
}

/// A copy of a session's state parked by the worker (in memory; written to disk when
/// evicted), opaque to it.
pub trait Parked: Send {
    /// The tokens the state holds.
    fn tokens(&self) -> &[u32];
    /// Bytes of memory it holds.
    fn bytes(&self) -> u64;
    /// Frontier lengths reachable without re-evaluation (see [`reach`]).
    fn reachable(&self) -> Vec<RangeInclusive<usize>>;
    /// Whether the logits after the last token are held.
    fn logits_known(&self) -> bool;
    /// For the engine's downcast.
    fn as_any(&self) -> &dyn Any;
}

/// The live session, owned by the engine worker thread.
pub trait Engine: Send + 'static {
    /// Context size in tokens.
    fn n_ctx(&self) -> usize;
    /// The tokens the session holds.
    fn tokens(&self) -> &[u32];
    /// Brings the session to hold exactly `prompt` with logits after its last token,
    /// reusing the longest common prefix. `cancel` is polled between prefill chunks;
    /// when it returns true the sync stops with [`BackendError::Cancelled`], leaving
    /// the session holding a prefix of `prompt`.
    fn sync(
        &mut self,
        prompt: &[u32],
        cancel: &dyn Fn() -> bool,
    ) -> Result<SyncOutcome, BackendError>;
    /// Generates after `prompt` (which [`Engine::sync`] has just brought in). Every
    /// sampled token goes to `on_token`, which may break. The last sampled token is not
    /// evaluated: afterwards the session holds `prompt` plus every sampled token but
    /// the last — or every one when the backend chose the tokens (greedy, no
    /// log-probabilities) and generation stopped after the first at an end token or a
    /// break before its token limit (the last step was queued before the token was read).
    fn generate(
        &mut self,
        prompt: &[u32],
        settings: &GenSettings,
        on_token: &mut dyn FnMut(Sampled) -> ControlFlow<()>,
    ) -> Result<GenOutcome, BackendError>;
    /// Whether the logits after the live session's last token are held.
    fn logits_known(&self) -> bool;
    /// Frontier lengths of the live session reachable without re-evaluation.
    fn reachable(&self) -> Vec<RangeInclusive<usize>>;
    /// A copy of the live session's state.
    fn park(&self) -> Result<Box<dyn Parked>, BackendError>;
    /// Makes the live session hold a parked state (of this engine).
    fn unpark(&mut self, parked: &dyn Parked) -> Result<(), BackendError>;
    /// Writes a parked state (for disk checkpoints).
    fn write_parked(&self, parked: &dyn Parked, out: &mut dyn Write) -> Result<(), BackendError>;
    /// Reads a state written by [`Engine::write_parked`] of an engine of the same
    /// [`Engine::identity`].
    fn read_parked(&self, input: &mut dyn Read) -> Result<Box<dyn Parked>, BackendError>;
    /// The model file's identity and the settings that change the numbers (backend,
    /// context size, build): states written under another identity are foreign.
    fn identity(&self) -> String;
}

/// A model as the server drives it: the shared text side and the session.
pub type ModelParts = (std::sync::Arc<dyn Vocab>, Box<dyn Engine>);
