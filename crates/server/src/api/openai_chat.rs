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

use super::body::{GenRequest, read_request};
use super::common::{
    Conversation, StopIn, ToolChoice, arguments_value, logprobs_field, max_tokens_field, new_id,
    unsupported_part,
};
use super::error::{ApiError, OpenAiError};
use super::openai_common::{Envelope, StreamOptions, stream_failed};
use super::stream::{Completion, Stops, StreamFormat, collect, render, sse, submit};
use crate::backend::{ChatTurn, TurnToolCall};
use crate::output::OutputEvent;
use crate::state::AppState;
use crate::worker::{FinishReason, Finished, TokenLogprob};

/// A chat completion request's own fields (besides
/// [`GenFields`](super::common::GenFields); fields not listed are ignored).
#[derive(Debug, Deserialize)]
pub struct ChatRequest {
    pub messages: Vec<MessageIn>,
    pub max_tokens: Option<u64>,
    pub max_completion_tokens: Option<u64>,
    pub stop: Option<StopIn>,
    pub stream_options: Option<StreamOptions>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<u32>,
    pub tools: Option<Vec<Value>>,
    pub tool_choice: Option<Value>,
    pub n: Option<u32>,
    pub reasoning_effort: Option<String>,
    pub chat_template_kwargs: Option<Map<String, Value>>,
    /// vLLM's `continue_final_message`: continue the final assistant message. When
    /// absent, a final assistant message with text and no tool calls is continued, as
    /// llama.cpp's server does; `false` opens a new turn after it.
    pub continue_final_message: Option<bool>,
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
#[serde(untagged, expecting = "expected a string or a list of content parts")]
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
                    (other, _) => return Err(unsupported_part(other, &format!("{param}[{i}]"))),
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

/// The chat-template role of OpenAI role `role` (of the message at path `at`);
/// `tool_turns`: whether tool results may come as messages.
pub fn chat_role(role: &str, at: &str, tool_turns: bool) -> Result<&'static str, ApiError> {
    match role {
        "system" | "developer" => Ok("system"),
        "user" => Ok("user"),
        "assistant" => Ok("assistant"),
        "tool" | "function" if tool_turns => Ok("tool"),
        other => Err(ApiError::invalid_field(
            &format!("{at}.role"),
            format!("unknown role '{other}'"),
        )),
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

fn conversation(req: &mut ChatRequest, single_tool_call: bool) -> Result<Conversation, ApiError> {
    if req.messages.is_empty() {
        return Err(ApiError::invalid_field(
            "messages",
            "`messages` must hold at least one message",
        ));
    }
    let mut messages = Vec::with_capacity(req.messages.len());
    for (i, m) in std::mem::take(&mut req.messages).into_iter().enumerate() {
        let role = chat_role(&m.role, &format!("messages[{i}]"), true)?;
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
    let prefill_shaped = messages.last().is_some_and(|m| {
        m.role == "assistant"
            && m.tool_calls.is_empty()
            && m.content.as_deref().is_some_and(|c| !c.is_empty())
    });
    let continue_final = match req.continue_final_message {
        Some(true) => true,
        Some(false) => false,
        None => prefill_shaped,
    };
    Ok(Conversation {
        continue_final,
        single_tool_call,
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
    let GenRequest {
        api: mut req,
        common,
        model,
        single_tool_call,
    } = read_request::<ChatRequest>(&state, &headers, body).await?;
    if req.n.is_some_and(|n| n != 1) {
        return Err(ApiError::invalid_field("n", "only n = 1 is supported").into());
    }
    let conv = conversation(&mut req, single_tool_call)?;
    let max_tokens = max_tokens_field("max_completion_tokens", req.max_completion_tokens)?
        .or(max_tokens_field("max_tokens", req.max_tokens)?);
    let top = logprobs_field("top_logprobs", req.top_logprobs)?;
    let top_logprobs = (req.logprobs == Some(true)).then(|| top.unwrap_or(0));
    let plan = render(&state, conv).await?;
    let object = if common.streams() {
        "chat.completion.chunk"
    } else {
        "chat.completion"
    };
    let env = Envelope::new("chatcmpl-", object, model, top_logprobs.is_some());
    let parser = plan.parser();
    let stops = Stops {
        stop: req.stop.take().map(StopIn::into_vec).unwrap_or_default(),
        end_after: plan.end_after(),
    };
    let rx = submit(
        &state,
        &env.id,
        plan.into_input(),
        max_tokens,
        &common,
        top_logprobs,
        stops,
    )?;
    if common.streams() {
        let fmt = ChatStream {
            env,
            include_usage: StreamOptions::include_usage(req.stream_options.as_ref()),
            calls: 0,
            pending_logprobs: Vec::new(),
        };
        return Ok(sse(rx, parser, fmt, state.config.keepalive));
    }
    let done = collect(rx, parser).await?;
    Ok(axum::Json(response_body(&env, &done)).into_response())
}

/// `tool_calls` only when the model ended its turn after its calls: a stop sequence or
/// a limit that cut the answer (perhaps inside a call, whose streamed deltas cannot be
/// taken back) says so instead.
fn finish_reason(reason: &FinishReason, tool_calls: bool) -> &'static str {
    match reason {
        FinishReason::Length | FinishReason::ContextFull => "length",
        FinishReason::StopSequence(_) => "stop",
        _ if tool_calls => "tool_calls",
        FinishReason::Eog | FinishReason::Cancelled => "stop",
    }
}

fn logprob_json(lp: &TokenLogprob) -> Value {
    json!({
        "token": lp.token,
        "logprob": lp.logprob,
        "bytes": lp.bytes,
        "top_logprobs": lp.top.iter().map(|(t, b, l)| json!({"token": t, "logprob": l, "bytes": b})).collect::<Vec<_>>(),
    })
}

fn response_body(env: &Envelope, done: &Completion) -> Value {
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
    let logprobs = if env.logprobs {
        json!({"content": done.logprobs.iter().map(logprob_json).collect::<Vec<_>>()})
    } else {
        Value::Null
    };
    let choice = json!({
        "index": 0,
        "message": message,
        "logprobs": logprobs,
        "finish_reason": finish_reason(&done.finish, !calls.is_empty()),
    });
    env.body_with_usage(json!([choice]), &done.usage, done.reasoning_tokens)
}

struct ChatStream {
    env: Envelope,
    include_usage: bool,
    calls: usize,
    pending_logprobs: Vec<TokenLogprob>,
}

impl ChatStream {
    fn chunk(&mut self, delta: Value, finish: Option<&str>) -> Event {
        let logprobs = if self.env.logprobs && !self.pending_logprobs.is_empty() {
            json!({"content": self.pending_logprobs.drain(..).map(|l| logprob_json(&l)).collect::<Vec<_>>()})
        } else {
            Value::Null
        };
        self.env.chunk(
            json!([{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]),
        )
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
        let last = self.chunk(json!({}), Some(finish_reason(&fin.reason, self.calls > 0)));
        self.env
            .stream_end(last, self.include_usage, &fin.usage, reasoning_tokens)
    }

    fn failed(&mut self, err: &ApiError) -> Vec<Event> {
        stream_failed(err)
    }
}
