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

use super::body::{GenRequest, read_request};
use super::common::{StopIn, logprobs_field, max_tokens_field};
use super::error::{ApiError, OpenAiError};
use super::openai_common::{Envelope, StreamOptions, stream_failed};
use super::stream::{Stops, StreamFormat, blocking, collect, sse, submit};
use crate::output::{OutputEvent, OutputParser};
use crate::state::AppState;
use crate::worker::{FinishReason, Finished, PromptInput, TokenLogprob};

/// OpenAI's default `max_tokens` for completions.
const DEFAULT_MAX_TOKENS: usize = 16;

/// A completion request's own fields (besides
/// [`GenFields`](super::common::GenFields); fields not listed are ignored).
#[derive(Debug, Deserialize)]
pub struct CompletionRequest {
    pub prompt: PromptIn,
    pub max_tokens: Option<u64>,
    pub stop: Option<StopIn>,
    pub stream_options: Option<StreamOptions>,
    pub logprobs: Option<u32>,
    pub echo: Option<bool>,
    pub n: Option<u32>,
}

/// `prompt`: text, token ids, or a batch of one of either.
#[derive(Debug, Deserialize)]
#[serde(
    untagged,
    expecting = "expected a string, a list of token ids, or a list of one of either"
)]
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
    let GenRequest {
        api: req,
        common,
        model,
        ..
    } = read_request::<CompletionRequest>(&state, &headers, body).await?;
    if req.n.is_some_and(|n| n != 1) {
        return Err(ApiError::invalid_field("n", "only n = 1 is supported").into());
    }
    if req.echo == Some(true) {
        return Err(ApiError::invalid_field("echo", "echo is not supported").into());
    }
    let top = logprobs_field("logprobs", req.logprobs)?;
    let max_tokens = max_tokens_field("max_tokens", req.max_tokens)?.unwrap_or(DEFAULT_MAX_TOKENS);
    let st = state.clone();
    let prompt = blocking(move || prompt_input(&st, req.prompt)).await?;
    let env = Envelope::new("cmpl-", "text_completion", model, top.is_some());
    let stops = Stops {
        stop: req.stop.map(StopIn::into_vec).unwrap_or_default(),
        end_after: Vec::new(),
    };
    let rx = submit(
        &state,
        &env.id,
        prompt,
        Some(max_tokens),
        &common,
        top,
        stops,
    )?;
    if common.streams() {
        let fmt = CompletionStream {
            env,
            include_usage: StreamOptions::include_usage(req.stream_options.as_ref()),
            pending: Vec::new(),
            offset: 0,
        };
        return Ok(sse(rx, OutputParser::plain(), fmt, state.config.keepalive));
    }
    let done = collect(rx, OutputParser::plain()).await?;
    let logprobs = env.logprobs.then(|| logprobs_json(&done.logprobs, 0));
    let choice = json!({"text": done.out.text, "index": 0, "logprobs": logprobs, "finish_reason": finish_reason(&done.finish)});
    Ok(axum::Json(env.body_with_usage(json!([choice]), &done.usage, 0)).into_response())
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
    env: Envelope,
    include_usage: bool,
    pending: Vec<TokenLogprob>,
    offset: usize,
}

impl CompletionStream {
    fn chunk(&mut self, text: &str, finish: Option<&str>) -> Event {
        let logprobs = if self.env.logprobs && !self.pending.is_empty() {
            let v = logprobs_json(&self.pending, self.offset);
            self.offset += self.pending.iter().map(|l| l.token.len()).sum::<usize>();
            self.pending.clear();
            v
        } else {
            Value::Null
        };
        self.env.chunk(
            json!([{"text": text, "index": 0, "logprobs": logprobs, "finish_reason": finish}]),
        )
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
        let last = self.chunk("", Some(finish_reason(&fin.reason)));
        self.env.stream_end(last, self.include_usage, &fin.usage, 0)
    }

    fn failed(&mut self, err: &ApiError) -> Vec<Event> {
        stream_failed(err)
    }
}
