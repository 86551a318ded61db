//! `POST /v1/responses` (OpenAI Responses): `input` items (messages, function calls
//! and their outputs, reasoning) and `instructions` in; `output` items (reasoning,
//! message, function calls) out, whole or as `response.*` events from
//! `response.created` to `response.completed`. Stateless: `previous_response_id` is
//! refused; clients resend the conversation (as Codex does with `store: false`).

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
    Conversation, StopIn, arguments_value, joined_text, max_tokens_field, new_id, str_field,
    unix_now, unsupported_part,
};
use super::error::{ApiError, OpenAiError};
use super::openai_chat::{chat_role, reasoning_vars, tool_choice};
use super::stream::{Stops, StreamFormat, collect, named_event, render, sse, submit};
use crate::backend::{ChatTurn, TurnToolCall};
use crate::output::OutputEvent;
use crate::output::collect::Part;
use crate::state::AppState;
use crate::worker::{FinishReason, Finished, Usage};

/// A Responses request's own fields (besides [`GenFields`](super::common::GenFields);
/// fields not listed are ignored).
#[derive(Debug, Deserialize)]
pub struct ResponsesRequest {
    pub input: InputIn,
    pub instructions: Option<String>,
    pub max_output_tokens: Option<u64>,
    pub stop: Option<StopIn>,
    pub tools: Option<Vec<Value>>,
    pub tool_choice: Option<Value>,
    pub reasoning: Option<ReasoningIn>,
    pub previous_response_id: Option<String>,
    pub chat_template_kwargs: Option<Map<String, Value>>,
}

#[derive(Debug, Deserialize)]
pub struct ReasoningIn {
    pub effort: Option<String>,
}

/// `input`: text or a list of items.
#[derive(Debug, Deserialize)]
#[serde(untagged, expecting = "expected a string or a list of input items")]
pub enum InputIn {
    Text(String),
    Items(Vec<Value>),
}

/// The text of a `content` value: a string, or parts with `text` (or `refusal`).
fn content_of(v: Option<&Value>, at: &str) -> Result<String, ApiError> {
    joined_text(v, at, "parts", |p, at| {
        let kind = p.get("type").and_then(Value::as_str).unwrap_or("");
        match kind {
            "input_text" | "output_text" | "text" | "reasoning_text" | "summary_text" => {
                Ok(str_field(p, "text", at)?.to_string())
            }
            "refusal" => Ok(str_field(p, "refusal", at)?.to_string()),
            other => Err(unsupported_part(other, at)),
        }
    })
}

fn messages_from_input(
    input: InputIn,
    instructions: Option<String>,
) -> Result<Vec<ChatTurn>, ApiError> {
    let mut out: Vec<ChatTurn> = Vec::new();
    if let Some(i) = instructions {
        out.push(ChatTurn::text("system", &i));
    }
    let items = match input {
        InputIn::Text(t) => {
            out.push(ChatTurn::text("user", &t));
            return Ok(out);
        }
        InputIn::Items(items) => items,
    };
    let mut reasoning: Option<String> = None;
    for (i, item) in items.iter().enumerate() {
        let at = format!("input[{i}]");
        if !item.is_object() {
            return Err(ApiError::invalid_field(
                &at,
                format!("`{at}` must be an object"),
            ));
        }
        let kind =
            item.get("type")
                .and_then(Value::as_str)
                .unwrap_or(if item.get("role").is_some() {
                    "message"
                } else {
                    ""
                });
        match kind {
            "message" => {
                let role = chat_role(str_field(item, "role", &at)?, &at, false)?;
                let content = content_of(item.get("content"), &format!("{at}.content"))?;
                let mut turn = ChatTurn::text(role, &content);
                if role == "assistant" {
                    turn.reasoning_content = reasoning.take();
                }
                out.push(turn);
            }
            "function_call" => {
                let call = TurnToolCall {
                    id: item
                        .get("call_id")
                        .or_else(|| item.get("id"))
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_string(),
                    name: str_field(item, "name", &at)?.to_string(),
                    arguments: arguments_value(
                        item.get("arguments")
                            .and_then(Value::as_str)
                            .unwrap_or("{}"),
                    ),
                };
                match out.last_mut() {
                    Some(last) if last.role == "assistant" && reasoning.is_none() => {
                        last.tool_calls.push(call)
                    }
                    _ => out.push(ChatTurn {
                        role: "assistant".into(),
                        content: None,
                        reasoning_content: reasoning.take(),
                        tool_calls: vec![call],
                        ..Default::default()
                    }),
                }
            }
            "function_call_output" => {
                let output = content_of(item.get("output"), &format!("{at}.output"))?;
                out.push(ChatTurn {
                    role: "tool".into(),
                    content: Some(output),
                    tool_call_id: item
                        .get("call_id")
                        .and_then(Value::as_str)
                        .map(str::to_string),
                    ..Default::default()
                });
            }
            "reasoning" => {
                let text = match item.get("content") {
                    Some(c) if c.is_array() => content_of(Some(c), &format!("{at}.content"))?,
                    _ => content_of(item.get("summary"), &format!("{at}.summary"))?,
                };
                if !text.is_empty() {
                    reasoning = Some(text);
                }
            }
            other => {
                tracing::warn!("ignoring input item of type '{other}'");
            }
        }
    }
    Ok(out)
}

/// Responses function tools (`{type, name, parameters}`) in chat form; other tool types
/// (custom, hosted: web search, file search, shell, …) are refused, as on Chat
/// Completions: a request that relies on one must not get an answer made without it.
fn chat_tools(tools: Option<Vec<Value>>) -> Result<Vec<Value>, ApiError> {
    let mut out = Vec::new();
    for (i, t) in tools.unwrap_or_default().into_iter().enumerate() {
        let ty = t.get("type").and_then(Value::as_str).unwrap_or("(none)");
        if ty != "function" {
            return Err(ApiError::invalid_field(
                &format!("tools[{i}].type"),
                format!("tools of type '{ty}' are not supported: only function tools are"),
            ));
        }
        let name = t.get("name").and_then(Value::as_str).ok_or_else(|| {
            ApiError::invalid_field(
                &format!("tools[{i}].name"),
                "a function tool needs a `name`",
            )
        })?;
        let mut f = json!({"name": name});
        if let Some(d) = t.get("description") {
            f["description"] = d.clone();
        }
        if let Some(p) = t.get("parameters") {
            f["parameters"] = p.clone();
        }
        out.push(json!({"type": "function", "function": f}));
    }
    Ok(out)
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
        single_tool_call,
    } = read_request::<ResponsesRequest>(&state, &headers, body).await?;
    if req.previous_response_id.is_some() {
        return Err(ApiError::invalid_field(
            "previous_response_id",
            "this server does not store responses; resend the conversation in `input` (store: false)",
        )
        .into());
    }
    let effort = req.reasoning.as_ref().and_then(|r| r.effort.clone());
    let echo = Echo {
        instructions: req.instructions.clone(),
        max_output_tokens: req.max_output_tokens,
        temperature: common.temperature,
        top_p: common.top_p,
        tools: req.tools.clone().unwrap_or_default(),
        tool_choice: req.tool_choice.clone().unwrap_or(json!("auto")),
        effort: effort.clone(),
    };
    let conv = Conversation {
        messages: messages_from_input(req.input, req.instructions)?,
        tools: chat_tools(req.tools)?,
        tool_choice: tool_choice(req.tool_choice)?,
        vars: reasoning_vars(
            effort.as_deref(),
            req.chat_template_kwargs.unwrap_or_default(),
        ),
        continue_final: false,
        single_tool_call,
    };
    if conv.messages.is_empty() {
        return Err(ApiError::invalid_field("input", "`input` must hold at least one item").into());
    }
    let max_tokens = max_tokens_field("max_output_tokens", req.max_output_tokens)?;
    let plan = render(&state, conv).await?;
    let id = new_id("resp_");
    let parser = plan.parser();
    let stops = Stops {
        stop: req.stop.map(StopIn::into_vec).unwrap_or_default(),
        end_after: plan.end_after(),
    };
    let rx = submit(
        &state,
        &id,
        plan.into_input(),
        max_tokens,
        &common,
        None,
        stops,
    )?;
    let meta = Meta {
        id,
        model,
        created: unix_now(),
        echo,
    };
    if common.streams() {
        let fmt = ResponseStream {
            meta,
            seq: 0,
            items: Vec::new(),
            open: None,
        };
        return Ok(sse(rx, parser, fmt, state.config.keepalive));
    }
    let done = collect(rx, parser).await?;
    let mut items = Vec::new();
    if !done.out.reasoning.is_empty() {
        items.push(reasoning_item(&new_id("rs_"), &done.out.reasoning));
    }
    // Messages and calls in the order they were generated.
    for part in &done.out.parts {
        match part {
            Part::Text(t) => items.push(message_item(&new_id("msg_"), t, "completed")),
            Part::Call(i) => {
                let c = &done.out.tool_calls[*i];
                items.push(call_item(
                    &new_id("fc_"),
                    &new_id("call_"),
                    &c.name,
                    &c.arguments,
                    "completed",
                ));
            }
        }
    }
    if done.out.parts.is_empty() {
        items.push(message_item(&new_id("msg_"), "", "completed"));
    }
    let status = status_of(&done.finish);
    if status == "incomplete" {
        // The item being written when the limit came is cut short, as OpenAI marks it.
        if let Some(last) = items
            .iter_mut()
            .rev()
            .find(|i| i["type"] == "message" || i["type"] == "function_call")
        {
            last["status"] = json!("incomplete");
        }
    }
    Ok(
        axum::Json(meta.response(status, items, Some((&done.usage, done.reasoning_tokens))))
            .into_response(),
    )
}

/// Request fields the response object repeats.
struct Echo {
    instructions: Option<String>,
    max_output_tokens: Option<u64>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    tools: Vec<Value>,
    tool_choice: Value,
    effort: Option<String>,
}

struct Meta {
    id: String,
    model: String,
    created: u64,
    echo: Echo,
}

fn status_of(r: &FinishReason) -> &'static str {
    match r {
        FinishReason::Length | FinishReason::ContextFull => "incomplete",
        _ => "completed",
    }
}

fn reasoning_item(id: &str, text: &str) -> Value {
    json!({"type": "reasoning", "id": id, "summary": [], "content": [{"type": "reasoning_text", "text": text}]})
}

fn text_part(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

/// A message item; `in_progress` ones (just opened) have no content yet, `completed`
/// and `incomplete` (cut by the token limit) ones hold their text.
fn message_item(id: &str, text: &str, status: &str) -> Value {
    let content = if status == "in_progress" {
        Vec::new()
    } else {
        vec![text_part(text)]
    };
    json!({"type": "message", "id": id, "status": status, "role": "assistant", "content": content})
}

fn call_item(id: &str, call_id: &str, name: &str, arguments: &str, status: &str) -> Value {
    json!({"type": "function_call", "id": id, "call_id": call_id, "name": name, "arguments": arguments, "status": status})
}

impl Meta {
    fn response(&self, status: &str, output: Vec<Value>, usage: Option<(&Usage, usize)>) -> Value {
        let e = &self.echo;
        json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "completed_at": if status == "completed" { json!(unix_now()) } else { Value::Null },
            "status": status,
            "error": null,
            "incomplete_details": if status == "incomplete" { json!({"reason": "max_output_tokens"}) } else { Value::Null },
            "instructions": e.instructions,
            "max_output_tokens": e.max_output_tokens,
            "model": self.model,
            "output": output,
            "parallel_tool_calls": true,
            "previous_response_id": null,
            "reasoning": {"effort": e.effort, "summary": null},
            "store": false,
            "temperature": e.temperature.unwrap_or(1.0),
            "text": {"format": {"type": "text"}},
            "tool_choice": e.tool_choice,
            "tools": e.tools,
            "top_p": e.top_p.unwrap_or(1.0),
            "truncation": "disabled",
            "timings": usage.map(|(u, _)| u.timings_json()),
            "usage": usage.map(|(u, r)| json!({
                "input_tokens": u.prompt_tokens,
                "input_tokens_details": {"cached_tokens": u.cached_tokens},
                "output_tokens": u.completion_tokens,
                "output_tokens_details": {"reasoning_tokens": r},
                "total_tokens": u.prompt_tokens + u.completion_tokens,
            })),
            "metadata": {},
        })
    }
}

/// The output item being streamed.
enum Open {
    Reasoning {
        id: String,
        text: String,
    },
    Message {
        id: String,
        text: String,
    },
    Call {
        id: String,
        call_id: String,
        name: String,
        arguments: String,
    },
}

struct ResponseStream {
    meta: Meta,
    seq: u64,
    /// Completed items.
    items: Vec<Value>,
    open: Option<Open>,
}

impl ResponseStream {
    fn event(&mut self, name: &str, mut v: Value) -> Event {
        v["type"] = json!(name);
        v["sequence_number"] = json!(self.seq);
        self.seq += 1;
        named_event(name, &v)
    }

    fn index(&self) -> usize {
        self.items.len()
    }

    /// Closes the open item, if any, as completed.
    fn close(&mut self) -> Vec<Event> {
        self.close_as("completed")
    }

    /// Closes the open item, if any, with `status` (`completed`, or `incomplete` when
    /// the token limit cut it).
    fn close_as(&mut self, status: &str) -> Vec<Event> {
        let Some(open) = self.open.take() else {
            return Vec::new();
        };
        let idx = self.index();
        let (events, item) = match open {
            Open::Reasoning { id, text } => {
                let item = reasoning_item(&id, &text);
                let done =
                    json!({"item_id": id, "output_index": idx, "content_index": 0, "text": text});
                (vec![self.event("response.reasoning_text.done", done)], item)
            }
            Open::Message { id, text } => {
                let item = message_item(&id, &text, status);
                let a = self.event(
                    "response.output_text.done",
                    json!({"item_id": id, "output_index": idx, "content_index": 0, "text": text, "logprobs": []}),
                );
                let b = self.event(
                    "response.content_part.done",
                    json!({"item_id": id, "output_index": idx, "content_index": 0, "part": text_part(&text)}),
                );
                (vec![a, b], item)
            }
            Open::Call {
                id,
                call_id,
                name,
                arguments,
            } => {
                let item = call_item(&id, &call_id, &name, &arguments, status);
                let done = json!({"item_id": id, "output_index": idx, "name": name, "arguments": arguments});
                (
                    vec![self.event("response.function_call_arguments.done", done)],
                    item,
                )
            }
        };
        let mut events = events;
        events.push(self.event(
            "response.output_item.done",
            json!({"output_index": idx, "item": item.clone()}),
        ));
        self.items.push(item);
        events
    }

    fn open_item(&mut self, open: Open) -> Vec<Event> {
        let mut events = self.close();
        let idx = self.index();
        let added = match &open {
            Open::Reasoning { id, .. } => {
                json!({"type": "reasoning", "id": id, "summary": [], "content": []})
            }
            Open::Message { id, .. } => message_item(id, "", "in_progress"),
            Open::Call {
                id, call_id, name, ..
            } => call_item(id, call_id, name, "", "in_progress"),
        };
        events.push(self.event(
            "response.output_item.added",
            json!({"output_index": idx, "item": added}),
        ));
        if let Open::Message { id, .. } = &open {
            let part = json!({"item_id": id, "output_index": idx, "content_index": 0, "part": text_part("")});
            events.push(self.event("response.content_part.added", part));
        }
        self.open = Some(open);
        events
    }
}

impl ResponseStream {
    /// Reasoning (`reasoning`) or answer text: appended to the open item of its kind,
    /// which is opened first when another kind (or none) is open.
    fn text_delta(&mut self, reasoning: bool, t: String) -> Vec<Event> {
        let mut events = Vec::new();
        let open_kind = match self.open {
            Some(Open::Reasoning { .. }) => Some(true),
            Some(Open::Message { .. }) => Some(false),
            _ => None,
        };
        if open_kind != Some(reasoning) {
            let (id, text) = (
                new_id(if reasoning { "rs_" } else { "msg_" }),
                String::new(),
            );
            events.extend(self.open_item(if reasoning {
                Open::Reasoning { id, text }
            } else {
                Open::Message { id, text }
            }));
        }
        let idx = self.index();
        let (Some(Open::Reasoning { id, text }) | Some(Open::Message { id, text })) =
            &mut self.open
        else {
            return events;
        };
        text.push_str(&t);
        let mut v =
            json!({"item_id": id.clone(), "output_index": idx, "content_index": 0, "delta": t});
        let name = if reasoning {
            "response.reasoning_text.delta"
        } else {
            v["logprobs"] = json!([]);
            "response.output_text.delta"
        };
        events.push(self.event(name, v));
        events
    }
}

impl StreamFormat for ResponseStream {
    fn started(&mut self, _: usize, _: usize) -> Vec<Event> {
        let r = self.meta.response("in_progress", Vec::new(), None);
        vec![
            self.event("response.created", json!({"response": r.clone()})),
            self.event("response.in_progress", json!({"response": r})),
        ]
    }

    fn output(&mut self, ev: OutputEvent) -> Vec<Event> {
        let mut events = Vec::new();
        match ev {
            OutputEvent::Reasoning(t) => events.extend(self.text_delta(true, t)),
            OutputEvent::Text(t) => events.extend(self.text_delta(false, t)),
            OutputEvent::ToolCallBegin { name, .. } => {
                events.extend(self.open_item(Open::Call {
                    id: new_id("fc_"),
                    call_id: new_id("call_"),
                    name,
                    arguments: String::new(),
                }));
            }
            OutputEvent::ToolCallArgs { delta, .. } => {
                let idx = self.index();
                let v = match &mut self.open {
                    Some(Open::Call { id, arguments, .. }) => {
                        arguments.push_str(&delta);
                        Some(json!({"item_id": id.clone(), "output_index": idx, "delta": delta}))
                    }
                    _ => None,
                };
                if let Some(v) = v {
                    events.push(self.event("response.function_call_arguments.delta", v));
                }
            }
            OutputEvent::ToolCallEnd { .. } => events.extend(self.close()),
        }
        events
    }

    fn finished(&mut self, fin: &Finished, reasoning_tokens: usize) -> Vec<Event> {
        let status = status_of(&fin.reason);
        // A call still open was cut (by a stop sequence too): its item is incomplete.
        let cut_call = matches!(self.open, Some(Open::Call { .. }));
        let mut events = self.close_as(if cut_call { "incomplete" } else { status });
        if self.items.is_empty() {
            // An empty answer is still one (empty) message.
            events.extend(self.open_item(Open::Message {
                id: new_id("msg_"),
                text: String::new(),
            }));
            events.extend(self.close_as(status));
        }
        let r = self.meta.response(
            status,
            self.items.clone(),
            Some((&fin.usage, reasoning_tokens)),
        );
        let name = if status == "completed" {
            "response.completed"
        } else {
            "response.incomplete"
        };
        events.push(self.event(name, json!({"response": r})));
        events
    }

    fn failed(&mut self, err: &ApiError) -> Vec<Event> {
        let v = json!({"code": err.code, "message": err.message, "param": err.param});
        vec![self.event("error", v)]
    }
}
