//! `POST /v1/chat/completions` (OpenAI Chat Completions): request parsing, the answer
//! as one object or as `chat.completion.chunk` events ending in `[DONE]`.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::body::{parse_json, read_body};
use super::common::{
    Conversation, Sampling, SeedIn, StopIn, ToolChoice, arguments_value, max_tokens_field, new_id,
    resolve_model, unix_now,
};
use super::error::{ApiError, OpenAiError};
use super::stream::{Completion, StreamFormat, collect, data_event, sse, submit};
use crate::backend::{ChatTurn, TurnToolCall};
use crate::output::{OutputEvent, OutputParser};
use crate::prompt::chat_prompt;
use crate::state::AppState;
use crate::worker::{FinishReason, Finished, PromptInput, TokenLogprob, Usage};

/// A chat completion request (fields not listed are ignored).
#[derive(Debug, Deserialize)]
pub struct ChatRequest {
    pub model: Option<String>,
    pub messages: Vec<MessageIn>,
    pub max_tokens: Option<u64>,
    pub max_completion_tokens: Option<u64>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub seed: Option<SeedIn>,
    pub stop: Option<StopIn>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<u32>,
    pub tools: Option<Vec<Value>>,
    pub tool_choice: Option<Value>,
    pub n: Option<u32>,
    pub reasoning_effort: Option<String>,
    pub chat_template_kwargs: Option<Map<String, Value>>,
}

#[derive(Debug, Deserialize)]
pub struct StreamOptions {
    pub include_usage: Option<bool>,
}

/// One message.
#[derive(Debug, Deserialize)]
pub struct MessageIn {
    pub role: String,
    #[serde(default)]
    pub content: Option<ContentIn>,
    pub name: Option<String>,
    pub tool_calls: Option<Vec<ToolCallIn>>,
    pub tool_call_id: Option<String>,
    #[serde(alias = "reasoning")]
    pub reasoning_content: Option<String>,
}

/// Content: a string or a list of parts.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum ContentIn {
    Text(String),
    Parts(Vec<PartIn>),
}

#[derive(Debug, Deserialize)]
pub struct PartIn {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct ToolCallIn {
    pub id: Option<String>,
    pub function: FunctionCallIn,
}

#[derive(Debug, Deserialize)]
pub struct FunctionCallIn {
    pub name: String,
    #[serde(default)]
    pub arguments: Option<ArgumentsIn>,
}

/// Arguments: JSON text (the API's form) or, leniently, a JSON value.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum ArgumentsIn {
    Text(String),
    Value(Value),
}

/// Joins text parts; other part types are refused (text-only models).
pub fn content_text(content: Option<ContentIn>, param: &str) -> Result<Option<String>, ApiError> {
    match content {
        None => Ok(None),
        Some(ContentIn::Text(t)) => Ok(Some(t)),
        Some(ContentIn::Parts(parts)) => {
            let mut texts = Vec::new();
            for (i, p) in parts.into_iter().enumerate() {
                match (p.kind.as_str(), p.text) {
                    ("text" | "input_text" | "output_text", Some(t)) => texts.push(t),
                    ("text" | "input_text" | "output_text", None) => {
                        return Err(ApiError::invalid_field(
                            &format!("{param}[{i}].text"),
                            "a text part needs `text`",
                        ));
                    }
                    (other, _) => {
                        return Err(ApiError::invalid_field(
                            &format!("{param}[{i}].type"),
                            format!(
                                "content parts of type '{other}' are not supported: this model reads text only"
                            ),
                        ));
                    }
                }
            }
            Ok(Some(texts.join("\n")))
        }
    }
}

/// Validates OpenAI function tool definitions.
pub fn check_tools(tools: Option<Vec<Value>>) -> Result<Vec<Value>, ApiError> {
    let tools = tools.unwrap_or_default();
    for (i, t) in tools.iter().enumerate() {
        let ok = t.get("type").and_then(Value::as_str) == Some("function")
            && t.pointer("/function/name")
                .and_then(Value::as_str)
                .is_some();
        if !ok {
            return Err(ApiError::invalid_field(
                &format!("tools[{i}]"),
                "each tool must be {\"type\": \"function\", \"function\": {\"name\": …, \"parameters\": …}}",
            ));
        }
    }
    Ok(tools)
}

/// Parses OpenAI's `tool_choice`.
pub fn tool_choice(v: Option<Value>) -> Result<ToolChoice, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(ToolChoice::Auto),
        Some(Value::String(s)) => match s.as_str() {
            "auto" => Ok(ToolChoice::Auto),
            "none" => Ok(ToolChoice::None),
            "required" => Ok(ToolChoice::Required),
            other => Err(ApiError::invalid_field(
                "tool_choice",
                format!("unknown tool_choice '{other}'"),
            )),
        },
        Some(v) => match v
            .pointer("/function/name")
            .or_else(|| v.get("name"))
            .and_then(Value::as_str)
        {
            Some(name) => Ok(ToolChoice::Function(name.to_string())),
            None => Err(ApiError::invalid_field(
                "tool_choice",
                "tool_choice must be a string or {\"type\": \"function\", \"function\": {\"name\": …}}",
            )),
        },
    }
}

/// Template variables for a reasoning-effort request.
pub fn reasoning_vars(effort: Option<&str>, mut vars: Map<String, Value>) -> Map<String, Value> {
    if let Some(e) = effort {
        vars.entry("reasoning_effort").or_insert(json!(e));
        vars.entry("enable_thinking")
            .or_insert(json!(!matches!(e, "none" | "minimal")));
    }
    vars
}

fn conversation(req: &mut ChatRequest) -> Result<Conversation, ApiError> {
    if req.messages.is_empty() {
        return Err(ApiError::invalid_field(
            "messages",
            "`messages` must hold at least one message",
        ));
    }
    let mut messages = Vec::with_capacity(req.messages.len());
    for (i, m) in std::mem::take(&mut req.messages).into_iter().enumerate() {
        let role = match m.role.as_str() {
            "system" | "developer" => "system",
            "user" => "user",
            "assistant" => "assistant",
            "tool" | "function" => "tool",
            other => {
                return Err(ApiError::invalid_field(
                    &format!("messages[{i}].role"),
                    format!("unknown role '{other}'"),
                ));
            }
        };
        let content = content_text(m.content, &format!("messages[{i}].content"))?;
        let tool_calls = m
            .tool_calls
            .unwrap_or_default()
            .into_iter()
            .map(|c| TurnToolCall {
                id: c.id.unwrap_or_default(),
                name: c.function.name,
                arguments: match c.function.arguments {
                    Some(ArgumentsIn::Text(t)) => arguments_value(&t),
                    Some(ArgumentsIn::Value(v)) => v,
                    None => json!({}),
                },
            })
            .collect();
        messages.push(ChatTurn {
            role: role.into(),
            content,
            reasoning_content: m.reasoning_content,
            tool_calls,
            tool_call_id: m.tool_call_id,
            name: m.name,
        });
    }
    Ok(Conversation {
        messages,
        tools: check_tools(req.tools.take())?,
        tool_choice: tool_choice(req.tool_choice.take())?,
        vars: reasoning_vars(
            req.reasoning_effort.as_deref(),
            req.chat_template_kwargs.take().unwrap_or_default(),
        ),
    })
}

/// The handler.
pub async fn handler(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, OpenAiError> {
    let bytes = read_body(&headers, body, state.config.max_body_bytes).await?;
    let mut req: ChatRequest = parse_json(&bytes)?;
    let model = resolve_model(&state, req.model.as_deref())?;
    if req.n.is_some_and(|n| n != 1) {
        return Err(ApiError::invalid_field("n", "only n = 1 is supported").into());
    }
    let conv = conversation(&mut req)?;
    let max_tokens = max_tokens_field("max_completion_tokens", req.max_completion_tokens)?
        .or(max_tokens_field("max_tokens", req.max_tokens)?);
    let top_logprobs = match (req.logprobs, req.top_logprobs) {
        (_, Some(k)) if k > 20 => {
            return Err(ApiError::invalid_field(
                "top_logprobs",
                "`top_logprobs` must be at most 20",
            )
            .into());
        }
        (Some(true), k) => Some(k.unwrap_or(0) as usize),
        _ => None,
    };
    let sampling = Sampling {
        temperature: req.temperature,
        top_p: req.top_p,
        top_k: req.top_k,
        min_p: req.min_p,
        seed: req.seed,
    };
    let vocab = state.vocab.clone();
    let tool_format = state.tool_format;
    let plan = tokio::task::spawn_blocking(move || chat_prompt(&*vocab, &conv, tool_format))
        .await
        .map_err(|e| ApiError::internal(e.to_string()))??;
    let id = new_id("chatcmpl-");
    let parser = OutputParser::new(plan.starts_in_reasoning, plan.tool_format);
    let stop = req.stop.take().map(StopIn::into_vec).unwrap_or_default();
    let rx = submit(
        &state,
        &id,
        PromptInput::Text {
            text: plan.text,
            tokens: plan.tokens,
        },
        max_tokens,
        |m| sampling.settings(m, top_logprobs),
        stop,
    )?;
    let meta = Meta {
        id,
        model,
        created: unix_now(),
        logprobs: top_logprobs.is_some(),
    };
    if req.stream == Some(true) {
        let include_usage = req.stream_options.as_ref().and_then(|o| o.include_usage) == Some(true);
        let fmt = ChatStream {
            meta,
            include_usage,
            calls: 0,
            pending_logprobs: Vec::new(),
        };
        return Ok(sse(rx, parser, fmt, state.config.keepalive));
    }
    let done = collect(rx, parser).await?;
    Ok(axum::Json(response_body(&meta, &done)).into_response())
}

struct Meta {
    id: String,
    model: String,
    created: u64,
    logprobs: bool,
}

fn finish_reason(reason: &FinishReason, tool_calls: bool) -> &'static str {
    match reason {
        _ if tool_calls => "tool_calls",
        FinishReason::Length | FinishReason::ContextFull => "length",
        FinishReason::Eog | FinishReason::StopSequence(_) | FinishReason::Cancelled => "stop",
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

fn logprob_json(lp: &TokenLogprob) -> Value {
    json!({
        "token": lp.token,
        "logprob": lp.logprob,
        "bytes": lp.bytes,
        "top_logprobs": lp.top.iter().map(|(t, b, l)| json!({"token": t, "logprob": l, "bytes": b})).collect::<Vec<_>>(),
    })
}

fn response_body(meta: &Meta, done: &Completion) -> Value {
    let out = &done.out;
    let calls: Vec<Value> = out
        .tool_calls
        .iter()
        .map(|c| json!({"id": new_id("call_"), "type": "function", "function": {"name": c.name, "arguments": c.arguments}}))
        .collect();
    let mut message = json!({
        "role": "assistant",
        "content": if out.text.is_empty() && !calls.is_empty() { Value::Null } else { json!(out.text) },
    });
    if !out.reasoning.is_empty() {
        message["reasoning_content"] = json!(out.reasoning);
    }
    if !calls.is_empty() {
        message["tool_calls"] = json!(calls);
    }
    let logprobs = if meta.logprobs {
        json!({"content": done.logprobs.iter().map(logprob_json).collect::<Vec<_>>()})
    } else {
        Value::Null
    };
    json!({
        "id": meta.id,
        "object": "chat.completion",
        "created": meta.created,
        "model": meta.model,
        "system_fingerprint": crate::SYSTEM_FINGERPRINT,
        "choices": [{
            "index": 0,
            "message": message,
            "logprobs": logprobs,
            "finish_reason": finish_reason(&done.finish, !calls.is_empty()),
        }],
        "usage": usage_json(&done.usage, done.reasoning_tokens),
        "timings": done.usage.timings_json(),
    })
}

struct ChatStream {
    meta: Meta,
    include_usage: bool,
    calls: usize,
    pending_logprobs: Vec<TokenLogprob>,
}

impl ChatStream {
    fn chunk(&mut self, delta: Value, finish: Option<&str>) -> Event {
        let logprobs = if self.meta.logprobs && !self.pending_logprobs.is_empty() {
            json!({"content": self.pending_logprobs.drain(..).map(|l| logprob_json(&l)).collect::<Vec<_>>()})
        } else {
            Value::Null
        };
        data_event(&json!({
            "id": self.meta.id,
            "object": "chat.completion.chunk",
            "created": self.meta.created,
            "model": self.meta.model,
            "system_fingerprint": crate::SYSTEM_FINGERPRINT,
            "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}],
        }))
    }
}

impl StreamFormat for ChatStream {
    fn started(&mut self, _prompt_tokens: usize, _cached_tokens: usize) -> Vec<Event> {
        vec![self.chunk(json!({"role": "assistant", "content": ""}), None)]
    }

    fn logprob(&mut self, lp: TokenLogprob) {
        self.pending_logprobs.push(lp);
    }

    fn output(&mut self, ev: OutputEvent) -> Vec<Event> {
        let delta = match ev {
            OutputEvent::Text(t) => json!({"content": t}),
            OutputEvent::Reasoning(t) => json!({"reasoning_content": t}),
            OutputEvent::ToolCallBegin { index, name } => {
                self.calls = self.calls.max(index + 1);
                json!({"tool_calls": [{"index": index, "id": new_id("call_"), "type": "function", "function": {"name": name, "arguments": ""}}]})
            }
            OutputEvent::ToolCallArgs { index, delta } => {
                json!({"tool_calls": [{"index": index, "function": {"arguments": delta}}]})
            }
            OutputEvent::ToolCallEnd { .. } => return Vec::new(),
        };
        vec![self.chunk(delta, None)]
    }

    fn finished(&mut self, fin: &Finished, reasoning_tokens: usize) -> Vec<Event> {
        let reason = finish_reason(&fin.reason, self.calls > 0);
        let mut out = vec![self.chunk(json!({}), Some(reason))];
        if self.include_usage {
            out.push(data_event(&json!({
                "id": self.meta.id,
                "object": "chat.completion.chunk",
                "created": self.meta.created,
                "model": self.meta.model,
                "system_fingerprint": crate::SYSTEM_FINGERPRINT,
                "choices": [],
                "usage": usage_json(&fin.usage, reasoning_tokens),
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
