//! `POST /v1/messages` and `POST /v1/messages/count_tokens` (Anthropic Messages):
//! system text, messages with text / tool_use / tool_result / thinking blocks, tools
//! with `input_schema`, `thinking` on or off; the answer as one message or as the
//! `message_start` … `message_stop` event sequence with thinking, text and tool_use
//! blocks. Usage follows Anthropic's accounting: `input_tokens` excludes the prompt
//! tokens read from the cache, which are `cache_read_input_tokens`.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::body::{GenRequest, read_request};
use super::common::{Conversation, ToolChoice, joined_text, max_tokens_field, new_id, str_field};
use super::error::{AnthropicError, ApiError};
use super::stream::{Stops, StreamFormat, collect, named_event, render, sse, submit};
use crate::backend::{ChatTurn, TurnToolCall};
use crate::output::OutputEvent;
use crate::output::collect::Part;
use crate::state::AppState;
use crate::worker::{FinishReason, Finished, Usage};

/// A Messages request's own fields (besides [`GenFields`](super::common::GenFields);
/// fields not listed are ignored).
#[derive(Debug, Deserialize)]
pub struct MessagesRequest {
    pub messages: Vec<MessageIn>,
    pub system: Option<SystemIn>,
    pub max_tokens: Option<u64>,
    pub stop_sequences: Option<Vec<String>>,
    pub tools: Option<Vec<Value>>,
    pub tool_choice: Option<Value>,
    pub thinking: Option<Value>,
    pub chat_template_kwargs: Option<Map<String, Value>>,
}

#[derive(Debug, Deserialize)]
pub struct MessageIn {
    pub role: String,
    pub content: ContentIn,
}

/// Content: a string or a list of blocks.
#[derive(Debug, Deserialize)]
#[serde(untagged, expecting = "expected a string or a list of content blocks")]
pub enum ContentIn {
    Text(String),
    Blocks(Vec<Value>),
}

/// `system`: a string or a list of text blocks.
#[derive(Debug, Deserialize)]
#[serde(untagged, expecting = "expected a string or a list of text blocks")]
pub enum SystemIn {
    Text(String),
    Blocks(Vec<Value>),
}

fn block_type<'a>(b: &'a Value, at: &str) -> Result<&'a str, ApiError> {
    b.get("type").and_then(Value::as_str).ok_or_else(|| {
        ApiError::invalid_field(
            &format!("{at}.type"),
            "each content block needs a string `type`",
        )
    })
}

fn unsupported(kind: &str, at: &str) -> ApiError {
    ApiError::invalid_field(
        &format!("{at}.type"),
        format!("'{kind}' blocks are not supported: this model reads text only"),
    )
}

/// The text of text blocks (tool results may hold a string or text blocks).
fn blocks_text(v: Option<&Value>, at: &str) -> Result<String, ApiError> {
    joined_text(v, at, "blocks", |b, at| match block_type(b, at)? {
        "text" => Ok(str_field(b, "text", at)?.to_string()),
        other => Err(unsupported(other, at)),
    })
}

fn conversation_messages(
    system: Option<SystemIn>,
    messages: Vec<MessageIn>,
) -> Result<Vec<ChatTurn>, ApiError> {
    let mut out = Vec::new();
    match system {
        Some(SystemIn::Text(s)) => out.push(ChatTurn::text("system", &s)),
        Some(SystemIn::Blocks(b)) => out.push(ChatTurn::text(
            "system",
            &blocks_text(Some(&Value::Array(b)), "system")?,
        )),
        None => {}
    }
    if messages.is_empty() {
        return Err(ApiError::invalid_field(
            "messages",
            "`messages` must hold at least one message",
        ));
    }
    for (i, m) in messages.into_iter().enumerate() {
        let at = format!("messages[{i}]");
        let role = match m.role.as_str() {
            r @ ("user" | "assistant") => r,
            // Not in Anthropic's API, but some clients send it: system text at its
            // position.
            "system" => {
                let text = match m.content {
                    ContentIn::Text(t) => t,
                    ContentIn::Blocks(b) => {
                        blocks_text(Some(&Value::Array(b)), &format!("{at}.content"))?
                    }
                };
                out.push(ChatTurn::text("system", &text));
                continue;
            }
            other => {
                return Err(ApiError::invalid_field(
                    &format!("{at}.role"),
                    format!("role must be 'user' or 'assistant', got '{other}'"),
                ));
            }
        };
        let blocks = match m.content {
            ContentIn::Text(t) => {
                out.push(ChatTurn::text(role, &t));
                continue;
            }
            ContentIn::Blocks(b) => b,
        };
        let mut texts = Vec::new();
        let mut reasoning = Vec::new();
        let mut calls = Vec::new();
        for (j, b) in blocks.iter().enumerate() {
            let at = format!("{at}.content[{j}]");
            match block_type(b, &at)? {
                "text" => texts.push(str_field(b, "text", &at)?.to_string()),
                "thinking" => reasoning.push(str_field(b, "thinking", &at)?.to_string()),
                "redacted_thinking" => {}
                "tool_use" => calls.push(TurnToolCall {
                    id: str_field(b, "id", &at)?.to_string(),
                    name: str_field(b, "name", &at)?.to_string(),
                    arguments: b.get("input").cloned().unwrap_or(json!({})),
                }),
                "tool_result" => out.push(ChatTurn {
                    role: "tool".into(),
                    content: Some(blocks_text(b.get("content"), &format!("{at}.content"))?),
                    tool_call_id: Some(str_field(b, "tool_use_id", &at)?.to_string()),
                    ..Default::default()
                }),
                kind @ ("image" | "document" | "audio") => return Err(unsupported(kind, &at)),
                other => {
                    return Err(ApiError::invalid_field(
                        &format!("{at}.type"),
                        format!(
                            "content blocks of type '{other}' are not supported (text, thinking, redacted_thinking, tool_use and tool_result are)"
                        ),
                    ));
                }
            }
        }
        if role == "assistant" {
            out.push(ChatTurn {
                role: role.into(),
                content: if texts.is_empty() && !calls.is_empty() {
                    None
                } else {
                    Some(texts.join("\n"))
                },
                reasoning_content: (!reasoning.is_empty()).then(|| reasoning.join("\n")),
                tool_calls: calls,
                ..Default::default()
            });
        } else if !texts.is_empty() || out.last().is_none_or(|t| t.role != "tool") {
            out.push(ChatTurn::text("user", &texts.join("\n")));
        }
    }
    Ok(out)
}

/// The input schema and description of Anthropic's client-executed tools that come
/// without one (`bash_*`, `text_editor_*`: the client runs them, the model must be told
/// their inputs), after Anthropic's documentation of their parameters.
fn builtin_tool(ty: &str) -> Option<(Value, &'static str)> {
    if ty.starts_with("bash_") {
        return Some((
            json!({"type": "object", "properties": {
                "command": {"type": "string", "description": "The shell command to run."},
                "restart": {"type": "boolean", "description": "Restart the shell session."}},
            }),
            "Runs a shell command in a persistent bash session and returns its output.",
        ));
    }
    if ty.starts_with("text_editor_") {
        return Some((
            json!({"type": "object", "properties": {
                "command": {"type": "string", "enum": ["view", "create", "str_replace", "insert", "undo_edit"]},
                "path": {"type": "string", "description": "Absolute path of the file or directory."},
                "file_text": {"type": "string", "description": "create: the new file's text."},
                "old_str": {"type": "string", "description": "str_replace: the exact text to replace."},
                "new_str": {"type": "string", "description": "str_replace, insert: the new text."},
                "insert_line": {"type": "integer", "description": "insert: the line after which to insert."},
                "view_range": {"type": "array", "items": {"type": "integer"}, "description": "view: [first, last] lines."}},
              "required": ["command", "path"]}),
            "Views, creates and edits text files.",
        ));
    }
    None
}

/// Anthropic tools (`{name, description, input_schema}`) in chat form, and the
/// client-executed `bash` and `text_editor` tools with their documented inputs. Server
/// tools (web search, web fetch, code execution, …) are refused: this server runs no
/// tools, and a request that relies on one must not get an answer made without it.
fn chat_tools(tools: Option<Vec<Value>>) -> Result<Vec<Value>, ApiError> {
    let mut out = Vec::new();
    for (i, t) in tools.unwrap_or_default().into_iter().enumerate() {
        let name = t.get("name").and_then(Value::as_str).ok_or_else(|| {
            ApiError::invalid_field(&format!("tools[{i}].name"), "a tool needs a `name`")
        })?;
        let ty = t.get("type").and_then(Value::as_str).unwrap_or("custom");
        let (schema, description) = match (t.get("input_schema"), builtin_tool(ty)) {
            (Some(s), _) => (s.clone(), t.get("description").cloned()),
            (None, Some((s, d))) => (s, Some(json!(d))),
            (None, None) => {
                return Err(ApiError::invalid_field(
                    &format!("tools[{i}]"),
                    format!(
                        "tool '{name}' of type '{ty}' is not supported: this server runs no server tools; client tools need an `input_schema` (the bash and text_editor tools are known without one)"
                    ),
                ));
            }
        };
        let mut f = json!({"name": name, "parameters": schema});
        if let Some(d) = description {
            f["description"] = d;
        }
        out.push(json!({"type": "function", "function": f}));
    }
    Ok(out)
}

fn tool_choice(v: Option<&Value>) -> Result<ToolChoice, ApiError> {
    let Some(v) = v else {
        return Ok(ToolChoice::Auto);
    };
    match v.get("type").and_then(Value::as_str) {
        Some("auto") => Ok(ToolChoice::Auto),
        Some("any") => Ok(ToolChoice::Required),
        Some("none") => Ok(ToolChoice::None),
        Some("tool") => match v.get("name").and_then(Value::as_str) {
            Some(n) => Ok(ToolChoice::Function(n.to_string())),
            None => Err(ApiError::invalid_field(
                "tool_choice.name",
                "tool_choice of type 'tool' needs a `name`",
            )),
        },
        _ => Err(ApiError::invalid_field(
            "tool_choice",
            "tool_choice.type must be 'auto', 'any', 'tool' or 'none'",
        )),
    }
}

fn conversation(
    req: &mut MessagesRequest,
    single_tool_call: bool,
) -> Result<Conversation, ApiError> {
    let mut vars = req.chat_template_kwargs.take().unwrap_or_default();
    if let Some(t) = &req.thinking {
        match t.get("type").and_then(Value::as_str) {
            Some("enabled") => {
                vars.entry("enable_thinking").or_insert(json!(true));
            }
            Some("disabled") => {
                vars.entry("enable_thinking").or_insert(json!(false));
            }
            _ => {}
        }
    }
    // A final assistant message is a prefill the answer continues (Anthropic's API).
    let continue_final = req.messages.last().is_some_and(|m| m.role == "assistant");
    Ok(Conversation {
        messages: conversation_messages(req.system.take(), std::mem::take(&mut req.messages))?,
        continue_final,
        single_tool_call,
        tools: chat_tools(req.tools.take())?,
        tool_choice: tool_choice(req.tool_choice.as_ref())?,
        vars,
    })
}

/// `POST /v1/messages`.
pub async fn messages(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, AnthropicError> {
    let GenRequest {
        api: mut req,
        common,
        model,
        single_tool_call,
    } = read_request::<MessagesRequest>(&state, &headers, body).await?;
    let Some(max_tokens) = max_tokens_field("max_tokens", req.max_tokens)? else {
        return Err(ApiError::invalid_field("max_tokens", "`max_tokens` is required").into());
    };
    // Anthropic's own switch for one call at most.
    let single_tool_call = single_tool_call
        || req
            .tool_choice
            .as_ref()
            .and_then(|c| c.get("disable_parallel_tool_use"))
            .and_then(Value::as_bool)
            == Some(true);
    let plan = render(&state, conversation(&mut req, single_tool_call)?).await?;
    let id = new_id("msg_");
    let parser = plan.parser();
    let stops = Stops {
        stop: req.stop_sequences.take().unwrap_or_default(),
        end_after: plan.end_after(),
    };
    let rx = submit(
        &state,
        &id,
        plan.into_input(),
        Some(max_tokens),
        &common,
        None,
        stops,
    )?;
    if common.streams() {
        let fmt = MessageStream {
            id,
            model,
            index: 0,
            open: None,
            tool_use: false,
        };
        return Ok(sse(rx, parser, fmt, state.config.keepalive));
    }
    let done = collect(rx, parser).await?;
    let mut content = Vec::new();
    if !done.out.reasoning.is_empty() {
        content.push(json!({"type": "thinking", "thinking": done.out.reasoning, "signature": ""}));
    }
    // Text and tool_use blocks in the order they were generated.
    for part in &done.out.parts {
        match part {
            Part::Text(t) => content.push(json!({"type": "text", "text": t})),
            Part::Call(i) => {
                let c = &done.out.tool_calls[*i];
                content.push(json!({"type": "tool_use", "id": new_id("toolu_"), "name": c.name, "input": input_object(&c.arguments)}));
            }
        }
    }
    if done.out.parts.is_empty() {
        content.push(json!({"type": "text", "text": ""}));
    }
    let (reason, seq) = stop_reason(&done.finish, !done.out.tool_calls.is_empty());
    Ok(axum::Json(json!({
        "id": id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": seq,
        "usage": usage_json(&done.usage),
        "timings": done.usage.timings_json(),
    }))
    .into_response())
}

/// `POST /v1/messages/count_tokens`: the prompt's size in tokens.
pub async fn count_tokens(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, AnthropicError> {
    let mut req = read_request::<MessagesRequest>(&state, &headers, body)
        .await?
        .api;
    let plan = render(&state, conversation(&mut req, false)?).await?;
    Ok(axum::Json(json!({"input_tokens": plan.tokens.len()})).into_response())
}

fn input_object(arguments: &str) -> Value {
    match serde_json::from_str::<Value>(arguments) {
        Ok(v @ Value::Object(_)) => v,
        _ => {
            tracing::warn!("tool call arguments are not a JSON object: {arguments}");
            json!({})
        }
    }
}

fn stop_reason(r: &FinishReason, tool_use: bool) -> (&'static str, Value) {
    match r {
        FinishReason::StopSequence(s) => ("stop_sequence", json!(s)),
        FinishReason::Length => ("max_tokens", Value::Null),
        FinishReason::ContextFull => ("model_context_window_exceeded", Value::Null),
        _ if tool_use => ("tool_use", Value::Null),
        FinishReason::Eog | FinishReason::Cancelled => ("end_turn", Value::Null),
    }
}

fn usage_json(u: &Usage) -> Value {
    json!({
        "input_tokens": u.prompt_tokens - u.cached_tokens,
        "output_tokens": u.completion_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": u.cached_tokens,
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Block {
    Thinking,
    Text,
    ToolUse,
}

struct MessageStream {
    id: String,
    model: String,
    /// Index of the next block.
    index: usize,
    open: Option<Block>,
    tool_use: bool,
}

impl MessageStream {
    fn ev(name: &str, mut v: Value) -> Event {
        v["type"] = json!(name);
        named_event(name, &v)
    }

    fn close(&mut self) -> Vec<Event> {
        match self.open.take() {
            Some(_) => {
                let e = Self::ev("content_block_stop", json!({"index": self.index}));
                self.index += 1;
                vec![e]
            }
            None => Vec::new(),
        }
    }

    fn open(&mut self, kind: Block, block: Value) -> Vec<Event> {
        let mut out = self.close();
        out.push(Self::ev(
            "content_block_start",
            json!({"index": self.index, "content_block": block}),
        ));
        self.open = Some(kind);
        out
    }

    fn delta(&self, delta: Value) -> Event {
        Self::ev(
            "content_block_delta",
            json!({"index": self.index, "delta": delta}),
        )
    }
}

impl StreamFormat for MessageStream {
    fn started(&mut self, prompt_tokens: usize, cached_tokens: usize) -> Vec<Event> {
        let usage = usage_json(&Usage {
            prompt_tokens,
            cached_tokens,
            ..Usage::default()
        });
        let message = json!({
            "id": self.id, "type": "message", "role": "assistant", "content": [], "model": self.model,
            "stop_reason": null, "stop_sequence": null, "usage": usage,
        });
        vec![
            Self::ev("message_start", json!({"message": message})),
            Self::ev("ping", json!({})),
        ]
    }

    fn output(&mut self, ev: OutputEvent) -> Vec<Event> {
        let mut out = Vec::new();
        match ev {
            OutputEvent::Reasoning(t) => {
                if self.open != Some(Block::Thinking) {
                    out.extend(self.open(
                        Block::Thinking,
                        json!({"type": "thinking", "thinking": "", "signature": ""}),
                    ));
                }
                out.push(self.delta(json!({"type": "thinking_delta", "thinking": t})));
            }
            OutputEvent::Text(t) => {
                if self.open != Some(Block::Text) {
                    out.extend(self.open(Block::Text, json!({"type": "text", "text": ""})));
                }
                out.push(self.delta(json!({"type": "text_delta", "text": t})));
            }
            OutputEvent::ToolCallBegin { name, .. } => {
                self.tool_use = true;
                out.extend(self.open(
                    Block::ToolUse,
                    json!({"type": "tool_use", "id": new_id("toolu_"), "name": name, "input": {}}),
                ));
            }
            OutputEvent::ToolCallArgs { delta, .. } => {
                if self.open == Some(Block::ToolUse) {
                    out.push(
                        self.delta(json!({"type": "input_json_delta", "partial_json": delta})),
                    );
                }
            }
            OutputEvent::ToolCallEnd { .. } => out.extend(self.close()),
        }
        out
    }

    fn finished(&mut self, fin: &Finished, _: usize) -> Vec<Event> {
        let mut out = self.close();
        if self.index == 0 {
            out.extend(self.open(Block::Text, json!({"type": "text", "text": ""})));
            out.extend(self.close());
        }
        let (reason, seq) = stop_reason(&fin.reason, self.tool_use);
        out.push(Self::ev(
            "message_delta",
            json!({"delta": {"stop_reason": reason, "stop_sequence": seq}, "usage": usage_json(&fin.usage), "timings": fin.usage.timings_json()}),
        ));
        out.push(Self::ev("message_stop", json!({})));
        out
    }

    fn failed(&mut self, err: &ApiError) -> Vec<Event> {
        let body = err.anthropic_body();
        vec![named_event("error", &body)]
    }
}
