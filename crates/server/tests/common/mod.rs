//! Helpers for the HTTP tests: servers on an ephemeral loopback port (the toy model,
//! or a real model), JSON posts, an SSE reader, `/health` and
//! `/metrics` readers, and the error-shape checks.

#![allow(dead_code)]

use std::time::Duration;

use ds4_http::backend::ModelParts;
use ds4_http::fake::{FakeConfig, fake_model};
use ds4_http::{ServerConfig, ServerHandle, start};
use serde_json::{Value, json};

/// Starts `model` on 127.0.0.1 and a free port.
pub async fn serve(mut config: ServerConfig, (vocab, engine): ModelParts) -> ServerHandle {
    config.host = "127.0.0.1".into();
    config.port = 0;
    start(config, vocab, engine).await.expect("server starts")
}

/// Starts the toy model on 127.0.0.1:0.
pub async fn fake_server(fake: FakeConfig, config: ServerConfig) -> ServerHandle {
    serve(config, fake_model(fake)).await
}

/// Loads the cached real model `file` (located by `ds4_testkit`: a failure under CI when
/// absent, a visible skip elsewhere).
#[cfg(feature = "engine")]
pub fn open_model(file: &str) -> Option<ds4_engine::LoadedModel> {
    let path = ds4_testkit::model(file)?;
    Some(ds4_engine::LoadedModel::open(&path).expect("model loads"))
}

/// Serves a real model with a session of `n_ctx` tokens.
#[cfg(feature = "engine")]
pub async fn engine_server(
    model: ds4_engine::LoadedModel,
    n_ctx: usize,
    config: ServerConfig,
) -> ServerHandle {
    let parts = ds4_http::engine_model(model, n_ctx, None).expect("session");
    serve(config, parts).await
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .expect("client")
}

/// A chat body with one user message.
pub fn user_chat(content: &str) -> Value {
    json!({"messages": [{"role": "user", "content": content}]})
}

/// POSTs JSON; returns status, headers and the body text.
pub async fn post_text(url: &str, body: &Value) -> (u16, reqwest::header::HeaderMap, String) {
    let r = client().post(url).json(body).send().await.expect("request");
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    (status, headers, r.text().await.expect("body"))
}

/// POSTs JSON; returns status, headers and the body parsed as JSON (Null if not JSON).
pub async fn post(url: &str, body: &Value) -> (u16, reqwest::header::HeaderMap, Value) {
    let (status, headers, text) = post_text(url, body).await;
    (
        status,
        headers,
        serde_json::from_str(&text).unwrap_or(Value::Null),
    )
}

/// POSTs raw bytes as JSON content.
pub async fn post_raw(url: &str, body: Vec<u8>) -> (u16, Value) {
    let r = client()
        .post(url)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .expect("request");
    let status = r.status().as_u16();
    let text = r.text().await.expect("body");
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// GETs `url` and parses the body as JSON.
pub async fn get_json(url: &str) -> Value {
    let r = client().get(url).send().await.expect("request");
    r.json().await.expect("a JSON body")
}

/// `GET /health`.
pub async fn health(base: &str) -> Value {
    get_json(&format!("{base}/health")).await
}

/// The value of the unlabelled series `name` on the server's `/metrics` page.
pub async fn metric(base: &str, name: &str) -> f64 {
    let text = client()
        .get(format!("{base}/metrics"))
        .send()
        .await
        .expect("request")
        .text()
        .await
        .expect("body");
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in /metrics:\n{text}"))
}

/// One SSE event.
#[derive(Debug, Clone)]
pub struct Sse {
    pub event: Option<String>,
    pub data: String,
}

impl Sse {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.data).unwrap_or(Value::Null)
    }
}

/// Parses an SSE body; returns the events and the number of comment lines.
pub fn parse_sse(text: &str) -> (Vec<Sse>, usize) {
    let mut events = Vec::new();
    let mut comments = 0;
    for block in text.split("\n\n") {
        let mut event = None;
        let mut data = Vec::new();
        for line in block.lines() {
            if line.starts_with(':') {
                comments += 1;
            } else if let Some(e) = line.strip_prefix("event:") {
                event = Some(e.trim().to_string());
            } else if let Some(d) = line.strip_prefix("data:") {
                data.push(d.strip_prefix(' ').unwrap_or(d).to_string());
            }
        }
        if !data.is_empty() {
            events.push(Sse {
                event,
                data: data.join("\n"),
            });
        }
    }
    (events, comments)
}

/// POSTs and reads a whole SSE response.
pub async fn post_sse(url: &str, body: &Value) -> (u16, Vec<Sse>, usize) {
    let (status, _, text) = post_text(url, body).await;
    let (events, comments) = parse_sse(&text);
    (status, events, comments)
}

/// The first item of JSON array `items` whose `type` is `ty`.
pub fn first_of_type(items: &Value, ty: &str) -> Value {
    items
        .as_array()
        .expect("an array")
        .iter()
        .find(|i| i["type"] == ty)
        .cloned()
        .unwrap_or_else(|| panic!("no item of type {ty} in {items}"))
}

/// Sends a request; its status.
pub async fn status_of(request: reqwest::RequestBuilder) -> u16 {
    request.send().await.expect("request").status().as_u16()
}

/// The strings at JSON pointer `ptr` in the events' data, in order (events without
/// one are skipped).
pub fn pieces(events: &[Sse], ptr: &str) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| e.json().pointer(ptr)?.as_str().map(String::from))
        .collect()
}

/// The text streamed at JSON pointer `ptr`: [`pieces`] joined.
pub fn streamed(events: &[Sse], ptr: &str) -> String {
    pieces(events, ptr).concat()
}

/// The OpenAI error shape.
pub fn assert_openai_error(body: &Value) {
    let e = &body["error"];
    assert!(
        e["message"].as_str().is_some_and(|m| !m.is_empty()),
        "no error.message in {body}"
    );
    assert!(e["type"].is_string(), "no error.type in {body}");
    assert!(
        e.get("param").is_some() && e.get("code").is_some(),
        "missing param/code in {body}"
    );
}

/// The Anthropic error shape.
pub fn assert_anthropic_error(body: &Value, ty: &str) {
    assert_eq!(body["type"], "error", "{body}");
    assert_eq!(body["error"]["type"], ty, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "{body}"
    );
}
