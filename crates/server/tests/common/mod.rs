//! Helpers for the HTTP tests: a server on an ephemeral loopback port, JSON posts, and
//! an SSE reader.

#![allow(dead_code)]

use std::time::Duration;

use ds4_http::fake::{FakeConfig, fake_model};
use ds4_http::{ServerConfig, ServerHandle, start};
use serde_json::Value;

/// Starts the toy model on 127.0.0.1:0.
pub async fn fake_server(fake: FakeConfig, mut config: ServerConfig) -> ServerHandle {
    config.host = "127.0.0.1".into();
    config.port = 0;
    let (vocab, engine) = fake_model(fake);
    start(config, vocab, engine).await.expect("server starts")
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .expect("client")
}

/// POSTs JSON; returns status, headers and the body parsed as JSON (Null if not JSON).
pub async fn post(url: &str, body: &Value) -> (u16, reqwest::header::HeaderMap, Value) {
    let r = client().post(url).json(body).send().await.expect("request");
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    let text = r.text().await.expect("body");
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
    let r = client().post(url).json(body).send().await.expect("request");
    let status = r.status().as_u16();
    let text = r.text().await.expect("body");
    let (events, comments) = parse_sse(&text);
    (status, events, comments)
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

/// Where the real models live: `$DS4_MODELS` or `~/.cache/ds4-server/models`.
pub fn model_path(file: &str) -> Option<std::path::PathBuf> {
    let dir = std::env::var_os("DS4_MODELS")
        .map(std::path::PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .map(|h| std::path::PathBuf::from(h).join(".cache/ds4-server/models"))
        })?;
    let p = dir.join(file);
    p.exists().then_some(p)
}
