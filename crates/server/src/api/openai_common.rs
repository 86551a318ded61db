//! What OpenAI's Chat Completions and (legacy) Completions answers share: the object
//! envelope (`id`, `object`, `created`, `model`, `system_fingerprint`, `choices`),
//! `usage` next to the `timings` extension, `stream_options.include_usage`, and the
//! end of a stream (the last chunk, the usage chunk when asked for, `[DONE]`).

use axum::response::sse::Event;
use serde::Deserialize;
use serde_json::{Value, json};

use super::common::{new_id, unix_now};
use super::error::ApiError;
use super::stream::data_event;
use crate::worker::Usage;

/// `stream_options`.
#[derive(Debug, Deserialize)]
pub struct StreamOptions {
    pub include_usage: Option<bool>,
}

impl StreamOptions {
    /// Whether the stream ends with a usage chunk.
    pub fn include_usage(options: Option<&StreamOptions>) -> bool {
        options.and_then(|o| o.include_usage) == Some(true)
    }
}

/// `usage` with `prompt_tokens_details.cached_tokens`.
pub fn usage_json(u: &Usage, reasoning_tokens: usize) -> Value {
    json!({
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
        "completion_tokens_details": {"reasoning_tokens": reasoning_tokens},
    })
}

/// One answer's identity: what every object and chunk of it repeats.
#[derive(Debug, Clone)]
pub struct Envelope {
    pub id: String,
    /// `chat.completion`, `text_completion`, …
    pub object: &'static str,
    pub model: String,
    /// Unix seconds.
    pub created: u64,
    /// The request asked for log-probabilities.
    pub logprobs: bool,
}

impl Envelope {
    /// A fresh answer: an id from `id_prefix`, created now.
    pub fn new(id_prefix: &str, object: &'static str, model: String, logprobs: bool) -> Self {
        Envelope {
            id: new_id(id_prefix),
            object,
            model,
            created: unix_now(),
            logprobs,
        }
    }

    /// The object holding `choices`.
    pub fn body(&self, choices: Value) -> Value {
        json!({
            "id": self.id,
            "object": self.object,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": crate::SYSTEM_FINGERPRINT,
            "choices": choices,
        })
    }

    /// The object holding `choices`, then `usage` and `timings`.
    pub fn body_with_usage(&self, choices: Value, u: &Usage, reasoning_tokens: usize) -> Value {
        let mut v = self.body(choices);
        v["usage"] = usage_json(u, reasoning_tokens);
        v["timings"] = u.timings_json();
        v
    }

    /// A stream chunk holding `choices`.
    pub fn chunk(&self, choices: Value) -> Event {
        data_event(&self.body(choices))
    }

    /// The end of a stream: `last` (the chunk with the finish reason), the usage chunk
    /// (no choices) when `include_usage`, then `[DONE]`.
    pub fn stream_end(
        &self,
        last: Event,
        include_usage: bool,
        u: &Usage,
        reasoning_tokens: usize,
    ) -> Vec<Event> {
        let mut out = vec![last];
        if include_usage {
            out.push(data_event(&self.body_with_usage(
                json!([]),
                u,
                reasoning_tokens,
            )));
        }
        out.push(done_event());
        out
    }
}

/// `data: [DONE]`.
fn done_event() -> Event {
    Event::default().data("[DONE]")
}

/// A failure after the stream began: the error object, then `[DONE]`.
pub fn stream_failed(err: &ApiError) -> Vec<Event> {
    vec![data_event(&err.openai_body()), done_event()]
}
