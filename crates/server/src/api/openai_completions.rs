//! `POST /v1/completions` (OpenAI legacy Completions): a raw prompt (text or token
//! ids, no chat template), the answer as one object or as `text_completion` chunks
//! ending in `[DONE]`.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::body::{parse_json, read_body};
use super::common::{Sampling, SeedIn, StopIn, max_tokens_field, new_id, resolve_model, unix_now};
use super::error::{ApiError, OpenAiError};
use super::openai_chat::{StreamOptions, usage_json};
use super::stream::{StreamFormat, collect, data_event, sse, submit};
use crate::output::{OutputEvent, OutputParser};
use crate::state::AppState;
use crate::worker::{FinishReason, Finished, PromptInput, TokenLogprob};

/// OpenAI's default `max_tokens` for completions.
const DEFAULT_MAX_TOKENS: usize = 16;

/// A completion request (fields not listed are ignored).
#[derive(Debug, Deserialize)]
pub struct CompletionRequest {
    pub model: Option<String>,
    pub prompt: PromptIn,
    pub max_tokens: Option<u64>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub seed: Option<SeedIn>,
    pub stop: Option<StopIn>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub logprobs: Option<u32>,
    pub echo: Option<bool>,
    pub n: Option<u32>,
}

/// `prompt`: text, token ids, or a batch of one of either.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum PromptIn {
    Text(String),
    Tokens(Vec<u32>),
    Texts(Vec<String>),
    TokenLists(Vec<Vec<u32>>),
}

fn prompt_input(state: &AppState, p: PromptIn) -> Result<PromptInput, ApiError> {
    let one = |n: usize| {
        if n == 1 {
            Ok(())
        } else {
            Err(ApiError::invalid_field(
                "prompt",
                "batches of prompts are not supported; send one prompt per request",
            ))
        }
    };
    let text = |t: String| {
        let tokens = state.vocab.tokenize(&t, true);
        PromptInput::Text { text: t, tokens }
    };
    let tokens = |t: Vec<u32>| {
        let n_vocab = state.vocab.n_vocab();
        match t.iter().find(|&&id| id as usize >= n_vocab) {
            Some(bad) => Err(ApiError::invalid_field(
                "prompt",
                format!("token id {bad} is outside the vocabulary ({n_vocab} tokens)"),
            )),
            None => Ok(PromptInput::Tokens(t)),
        }
    };
    match p {
        PromptIn::Text(t) => Ok(text(t)),
        PromptIn::Tokens(t) => tokens(t),
        PromptIn::Texts(mut v) => {
            one(v.len())?;
            Ok(text(v.remove(0)))
        }
        PromptIn::TokenLists(mut v) => {
            one(v.len())?;
            tokens(v.remove(0))
        }
    }
}

/// The handler.
pub async fn handler(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, OpenAiError> {
    let bytes = read_body(&headers, body, state.config.max_body_bytes).await?;
    let req: CompletionRequest = parse_json(&bytes)?;
    let model = resolve_model(&state, req.model.as_deref())?;
    if req.n.is_some_and(|n| n != 1) {
        return Err(ApiError::invalid_field("n", "only n = 1 is supported").into());
    }
    if req.echo == Some(true) {
        return Err(ApiError::invalid_field("echo", "echo is not supported").into());
    }
    if let Some(k) = req.logprobs
        && k > 20
    {
        return Err(ApiError::invalid_field("logprobs", "`logprobs` must be at most 20").into());
    }
    let max_tokens = max_tokens_field("max_tokens", req.max_tokens)?.unwrap_or(DEFAULT_MAX_TOKENS);
    let sampling = Sampling {
        temperature: req.temperature,
        top_p: req.top_p,
        top_k: req.top_k,
        min_p: req.min_p,
        seed: req.seed,
    };
    let top = req.logprobs.map(|k| k as usize);
    let st = state.clone();
    let prompt = tokio::task::spawn_blocking(move || prompt_input(&st, req.prompt))
        .await
        .map_err(|e| ApiError::internal(e.to_string()))??;
    let id = new_id("cmpl-");
    let stop = req.stop.map(StopIn::into_vec).unwrap_or_default();
    let rx = submit(
        &state,
        &id,
        prompt,
        Some(max_tokens),
        |m| sampling.settings(m, top),
        stop,
    )?;
    let meta = Meta {
        id,
        model,
        created: unix_now(),
        logprobs: top.is_some(),
    };
    if req.stream == Some(true) {
        let include_usage = req.stream_options.as_ref().and_then(|o| o.include_usage) == Some(true);
        let fmt = CompletionStream {
            meta,
            include_usage,
            pending: Vec::new(),
            offset: 0,
        };
        return Ok(sse(rx, OutputParser::plain(), fmt, state.config.keepalive));
    }
    let done = collect(rx, OutputParser::plain()).await?;
    let logprobs = meta.logprobs.then(|| logprobs_json(&done.logprobs, 0));
    Ok(axum::Json(json!({
        "id": meta.id,
        "object": "text_completion",
        "created": meta.created,
        "model": meta.model,
        "system_fingerprint": crate::SYSTEM_FINGERPRINT,
        "choices": [{"text": done.out.text, "index": 0, "logprobs": logprobs, "finish_reason": finish_reason(&done.finish)}],
        "usage": usage_json(&done.usage, 0),
        "timings": done.usage.timings_json(),
    }))
    .into_response())
}

struct Meta {
    id: String,
    model: String,
    created: u64,
    logprobs: bool,
}

fn finish_reason(r: &FinishReason) -> &'static str {
    match r {
        FinishReason::Length | FinishReason::ContextFull => "length",
        _ => "stop",
    }
}

/// The legacy logprobs object; `offset` is the text offset of the first token.
fn logprobs_json(lps: &[TokenLogprob], mut offset: usize) -> Value {
    let mut tokens = Vec::new();
    let mut token_logprobs = Vec::new();
    let mut top = Vec::new();
    let mut offsets = Vec::new();
    for lp in lps {
        tokens.push(json!(lp.token));
        token_logprobs.push(json!(lp.logprob));
        let mut m = Map::new();
        for (t, _, l) in &lp.top {
            m.entry(t.clone()).or_insert(json!(l));
        }
        top.push(Value::Object(m));
        offsets.push(json!(offset));
        offset += lp.token.len();
    }
    json!({"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top, "text_offset": offsets})
}

struct CompletionStream {
    meta: Meta,
    include_usage: bool,
    pending: Vec<TokenLogprob>,
    offset: usize,
}

impl CompletionStream {
    fn chunk(&mut self, text: &str, finish: Option<&str>) -> Event {
        let logprobs = if self.meta.logprobs && !self.pending.is_empty() {
            let v = logprobs_json(&self.pending, self.offset);
            self.offset += self.pending.iter().map(|l| l.token.len()).sum::<usize>();
            self.pending.clear();
            v
        } else {
            Value::Null
        };
        data_event(&json!({
            "id": self.meta.id,
            "object": "text_completion",
            "created": self.meta.created,
            "model": self.meta.model,
            "system_fingerprint": crate::SYSTEM_FINGERPRINT,
            "choices": [{"text": text, "index": 0, "logprobs": logprobs, "finish_reason": finish}],
        }))
    }
}

impl StreamFormat for CompletionStream {
    fn started(&mut self, _: usize, _: usize) -> Vec<Event> {
        Vec::new()
    }

    fn logprob(&mut self, lp: TokenLogprob) {
        self.pending.push(lp);
    }

    fn output(&mut self, ev: OutputEvent) -> Vec<Event> {
        match ev {
            OutputEvent::Text(t) => vec![self.chunk(&t, None)],
            _ => Vec::new(),
        }
    }

    fn finished(&mut self, fin: &Finished, _: usize) -> Vec<Event> {
        let mut out = vec![self.chunk("", Some(finish_reason(&fin.reason)))];
        if self.include_usage {
            out.push(data_event(&json!({
                "id": self.meta.id,
                "object": "text_completion",
                "created": self.meta.created,
                "model": self.meta.model,
                "choices": [],
                "usage": usage_json(&fin.usage, 0),
                "timings": fin.usage.timings_json(),
            })));
        }
        out.push(Event::default().data("[DONE]"));
        out
    }

    fn failed(&mut self, err: &ApiError) -> Vec<Event> {
        vec![
            data_event(&err.openai_body()),
            Event::default().data("[DONE]"),
        ]
    }
}
