//! Bad input and hard conditions against the toy model: malformed JSON, wrong types,
//! empty messages, unknown models, prompts over the context, oversized bodies, API
//! keys, CORS, a client that disconnects mid-stream, 64 concurrent clients, keep-alive
//! during a long prefill, graceful shutdown. Every error comes in the API's own shape
//! and the server keeps serving.

mod common;

use std::time::{Duration, Instant};

use common::{
    assert_anthropic_error, assert_openai_error, client, fake_server, get_json, health, metric,
    parse_sse, post, post_raw, post_sse, post_text, status_of, streamed, user_chat as chat,
};
use ds4_http::fake::FakeConfig;
use ds4_http::{ServerConfig, ServerHandle};
use futures_util::StreamExt;
use serde_json::{Value, json};

/// The toy model answering a prompt with "long" in it with 4000 tokens, 5 ms each.
fn long_on_request() -> FakeConfig {
    FakeConfig {
        token_delay: Duration::from_millis(5),
        ..FakeConfig::replying(|p| {
            if p.contains("long") {
                "z".repeat(4000)
            } else {
                "Hello world".into()
            }
        })
    }
}

async fn still_serving(base: &str) {
    let (status, _, v) = post(
        &format!("{base}/v1/chat/completions"),
        &chat("still there?"),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"][0]["message"]["content"], "Hello world");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_and_mistyped_requests() {
    let s = fake_server(FakeConfig::default(), ServerConfig::default()).await;
    let base = s.base_url();
    let chat_url = format!("{base}/v1/chat/completions");
    let msg_url = format!("{base}/v1/messages");

    let (status, v) = post_raw(&chat_url, b"{\"messages\": [".to_vec()).await;
    assert_eq!(status, 400);
    assert_openai_error(&v);
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("not valid JSON")
    );
    let (status, v) = post_raw(&msg_url, b"not json".to_vec()).await;
    assert_eq!(status, 400);
    assert_anthropic_error(&v, "invalid_request_error");
    let (status, v) = post_raw(&chat_url, Vec::new()).await;
    assert_eq!(status, 400);
    assert_openai_error(&v);

    let cases = [
        (json!({"messages": "hello"}), "messages"),
        (
            json!({"messages": [{"role": "user", "content": 5}]}),
            "messages[0].content",
        ),
        (
            json!({"messages": [{"role": 7, "content": "x"}]}),
            "messages[0].role",
        ),
        (
            json!({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}),
            "temperature",
        ),
        (
            json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": -1}),
            "max_tokens",
        ),
        (
            json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}),
            "max_tokens",
        ),
        (
            json!({"messages": [{"role": "user", "content": "x"}], "stream": "yes"}),
            "stream",
        ),
        (
            json!({"messages": [{"role": "user", "content": "x"}], "stop": [1, 2]}),
            "stop",
        ),
        (
            json!({"messages": [{"role": "user", "content": "x"}], "top_p": 3}),
            "top_p",
        ),
        (
            json!({"messages": [{"role": "wizard", "content": "x"}]}),
            "messages[0].role",
        ),
        (
            json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}),
            "messages[0].content[0].type",
        ),
        (json!({"messages": []}), "messages"),
        (json!({"model": "gpt-4"}), "messages"),
        (
            json!({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"}),
            "tool_choice",
        ),
        (
            json!({"messages": [{"role": "user", "content": "x"}],
                   "tools": [{"type": "function", "function": {"name": "a", "parameters": {"type": "object"}}}],
                   "tool_choice": {"type": "function", "function": {"name": "zzz"}}}),
            "tool_choice",
        ),
    ];
    for (body, param) in cases {
        let (status, _, v) = post(&chat_url, &body).await;
        assert_eq!(status, 400, "{body} -> {v}");
        assert_openai_error(&v);
        let got = v["error"]["param"].as_str().unwrap_or("");
        assert!(
            got == param || v["error"]["message"].as_str().unwrap().contains(param),
            "{body}: param {got:?}, wanted {param}: {v}"
        );
    }
    // Unknown fields are ignored.
    let (status, _, _) = post(&chat_url, &json!({"messages": [{"role": "user", "content": "x", "extra": 1}], "frobnicate": {"a": [1]}})).await;
    assert_eq!(status, 200);

    let anthropic_cases = [
        json!({"max_tokens": 5, "messages": []}),
        json!({"max_tokens": "5", "messages": [{"role": "user", "content": "x"}]}),
        json!({"max_tokens": 5, "messages": [{"role": "robot", "content": "x"}]}),
        json!({"max_tokens": 5, "messages": [{"role": "user", "content": [{"text": "no type"}]}]}),
        json!({"max_tokens": 5, "messages": [{"role": "user"}]}),
    ];
    for body in anthropic_cases {
        let (status, _, v) = post(&msg_url, &body).await;
        assert_eq!(status, 400, "{body} -> {v}");
        assert_anthropic_error(&v, "invalid_request_error");
    }
    still_serving(&base).await;
    s.shutdown().await.unwrap();
}

/// Sampling ranges follow each official API: OpenAI's `temperature` is 0 to 2,
/// Anthropic's 0 to 1; `top_p` is 0 to 1 in both. Out of range is a 400 naming the
/// field, in the API's error shape; the ends of each range are accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sampling_ranges_follow_each_api() {
    let s = fake_server(FakeConfig::default(), ServerConfig::default()).await;
    let base = s.base_url();
    let openai = |extra: Value| {
        let mut b = json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 3});
        b.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        b
    };
    let anthropic = |extra: Value| {
        let mut b = json!({"max_tokens": 3, "messages": [{"role": "user", "content": "x"}]});
        b.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        b
    };
    let responses = |extra: Value| {
        let mut b = json!({"input": "x", "max_output_tokens": 3});
        b.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        b
    };
    for (path, body, ok) in [
        (
            "/v1/chat/completions",
            openai(json!({"temperature": 2})),
            true,
        ),
        (
            "/v1/chat/completions",
            openai(json!({"temperature": 0})),
            true,
        ),
        (
            "/v1/chat/completions",
            openai(json!({"temperature": 2.01})),
            false,
        ),
        (
            "/v1/chat/completions",
            openai(json!({"temperature": 5})),
            false,
        ),
        (
            "/v1/chat/completions",
            openai(json!({"temperature": -0.1})),
            false,
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "max_tokens": 3, "temperature": 5}),
            false,
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "max_tokens": 3, "temperature": 1.5}),
            true,
        ),
        ("/v1/responses", responses(json!({"temperature": 5})), false),
        (
            "/v1/responses",
            responses(json!({"temperature": 1.5})),
            true,
        ),
        ("/v1/messages", anthropic(json!({"temperature": 1})), true),
        (
            "/v1/messages",
            anthropic(json!({"temperature": 1.5})),
            false,
        ),
        ("/v1/messages", anthropic(json!({"top_p": 1.1})), false),
        (
            "/v1/messages/count_tokens",
            anthropic(json!({"temperature": 1.5})),
            false,
        ),
    ] {
        let (status, _, v) = post(&format!("{base}{path}"), &body).await;
        if ok {
            assert_eq!(status, 200, "{path} {body} -> {v}");
            continue;
        }
        assert_eq!(status, 400, "{path} {body} -> {v}");
        let field = if body.get("top_p").is_some() {
            "top_p"
        } else {
            "temperature"
        };
        if path.starts_with("/v1/messages") {
            assert_anthropic_error(&v, "invalid_request_error");
            let msg = v["error"]["message"].as_str().unwrap();
            assert!(
                msg.contains(&format!("`{field}` must be between 0 and 1")),
                "{v}"
            );
        } else {
            assert_openai_error(&v);
            assert_eq!(v["error"]["param"], field, "{v}");
            let msg = v["error"]["message"].as_str().unwrap();
            assert!(msg.contains("`temperature` must be between 0 and 2"), "{v}");
        }
    }
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_routes() {
    let s = fake_server(FakeConfig::default(), ServerConfig::default()).await;
    let base = s.base_url();
    let (status, _, v) = post(&format!("{base}/v1/nope"), &json!({})).await;
    assert_eq!(status, 404);
    assert_openai_error(&v);
    // A known route with the wrong method: 405 in the API's error shape.
    let (status, _, v) = post(&format!("{base}/v1/models"), &json!({})).await;
    assert_eq!(status, 405);
    assert_openai_error(&v);
    let r = client()
        .get(format!("{base}/chat/completions"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 405);
    assert_openai_error(&r.json().await.unwrap());
    let r = client()
        .get(format!("{base}/v1/messages"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 405);
    assert_anthropic_error(&r.json().await.unwrap(), "invalid_request_error");
    s.shutdown().await.unwrap();
}

/// `GET /v1/models` (OpenAI's shape, or Anthropic's with `anthropic-version`).
async fn models(base: &str, anthropic: bool) -> Value {
    let mut r = client().get(format!("{base}/v1/models"));
    if anthropic {
        r = r.header("anthropic-version", "2023-06-01");
    }
    r.send().await.unwrap().json().await.unwrap()
}

/// Model names, as llama-server does them: the served model answers to any name (agents
/// send their own) under its id; `/v1/models` lists ids (slugs) and shows the GGUF's
/// `general.name` as the display name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_model_name_is_answered_under_the_served_id() {
    let s = fake_server(FakeConfig::default(), ServerConfig::default()).await;
    let base = s.base_url();
    for name in [
        "gpt-5",
        "claude-sonnet-4-5",
        "Fake Model 1B",
        "fake-model",
        "",
    ] {
        let (status, _, v) = post(
            &format!("{base}/v1/chat/completions"),
            &json!({"model": name, "messages": [{"role": "user", "content": "x"}]}),
        )
        .await;
        assert_eq!(status, 200, "{name}: {v}");
        assert_eq!(v["model"], "fake-model", "{name}");
    }
    let (status, _, v) = post(&format!("{base}/v1/messages"), &json!({"model": "claude-x", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]})).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["model"], "fake-model");
    let (status, _, v) = post(
        &format!("{base}/v1/responses"),
        &json!({"model": "gpt-4.1", "input": "x", "max_output_tokens": 5}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["model"], "fake-model");

    let v = models(&base, false).await;
    assert_eq!(v["object"], "list");
    let data = v["data"].as_array().unwrap();
    assert_eq!(data.len(), 1, "{v}");
    assert_eq!(data[0]["id"], "fake-model");
    assert_eq!(data[0]["display_name"], "Fake Model 1B");
    // `max_model_len` is the context this server accepts (vLLM's meaning).
    assert!(data[0]["context_length"].as_u64().unwrap() > 0, "{v}");
    assert_eq!(data[0]["max_model_len"], data[0]["context_length"], "{v}");
    let v = models(&base, true).await;
    assert_eq!(v["data"][0]["type"], "model");
    assert_eq!(v["data"][0]["id"], "fake-model");
    assert_eq!(v["data"][0]["display_name"], "Fake Model 1B");
    assert_eq!(v["has_more"], false);
    let v = get_json(&format!("{base}/v1/models/gpt-5")).await;
    assert_eq!(v["id"], "fake-model");
    s.shutdown().await.unwrap();
}

/// `--strict-model`: only the served names answer; others get 404 in each API's shape.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_model_names() {
    let s = fake_server(
        FakeConfig::default(),
        ServerConfig {
            strict_model: true,
            aliases: vec!["my-alias".into()],
            ..Default::default()
        },
    )
    .await;
    let base = s.base_url();
    let (status, _, v) = post(
        &format!("{base}/v1/chat/completions"),
        &json!({"model": "gpt-5", "messages": [{"role": "user", "content": "x"}]}),
    )
    .await;
    assert_eq!(status, 404);
    assert_openai_error(&v);
    assert_eq!(v["error"]["code"], "model_not_found");
    let (status, _, v) = post(&format!("{base}/v1/messages"), &json!({"model": "claude-x", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]})).await;
    assert_eq!(status, 404);
    assert_anthropic_error(&v, "not_found_error");
    // The id, an alias, the display name (any case) and no name at all answer.
    for name in ["fake-model", "MY-ALIAS", "fake model 1b"] {
        let (status, _, v) = post(
            &format!("{base}/v1/chat/completions"),
            &json!({"model": name, "messages": [{"role": "user", "content": "x"}]}),
        )
        .await;
        assert_eq!(status, 200, "{name}: {v}");
        assert_eq!(v["model"], "fake-model");
    }
    let v = models(&base, false).await;
    let ids: Vec<&str> = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["fake-model", "my-alias"]);
    let r = client()
        .get(format!("{base}/v1/models/gpt-5"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    assert_eq!(
        get_json(&format!("{base}/v1/models/my-alias")).await["id"],
        "my-alias"
    );
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompt_over_the_context_and_huge_bodies() {
    let s = fake_server(
        FakeConfig {
            n_ctx: 64,
            ..Default::default()
        },
        ServerConfig::default(),
    )
    .await;
    let base = s.base_url();
    let (status, _, v) = post(
        &format!("{base}/v1/chat/completions"),
        &chat(&"x".repeat(100)),
    )
    .await;
    assert_eq!(status, 400);
    assert_openai_error(&v);
    // OpenAI's code and wording for it, so that a client can tell it from other invalid
    // requests and trim the conversation.
    let message = v["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("This model's maximum context length is 64 tokens"),
        "{v}"
    );
    assert_eq!(v["error"]["code"], "context_length_exceeded", "{v}");
    let (status, _, v) = post(
        &format!("{base}/v1/messages"),
        &json!({"max_tokens": 5, "messages": [{"role": "user", "content": "x".repeat(100)}]}),
    )
    .await;
    assert_eq!(status, 400);
    assert_anthropic_error(&v, "invalid_request_error");
    // Anthropic's wording (what Claude Code and LiteLLM match).
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.starts_with("prompt is too long: "), "{v}");
    assert!(message.contains(" tokens > 63 maximum"), "{v}");
    // A 50 MB body (the default limit is 32 MiB).
    let big = format!(
        "{{\"messages\": [{{\"role\": \"user\", \"content\": \"{}\"}}]}}",
        "a".repeat(50 << 20)
    );
    let (status, v) = post_raw(
        &format!("{base}/v1/chat/completions"),
        big.clone().into_bytes(),
    )
    .await;
    assert_eq!(status, 413);
    assert_openai_error(&v);
    let (status, v) = post_raw(&format!("{base}/v1/messages"), big.into_bytes()).await;
    assert_eq!(status, 413);
    assert_anthropic_error(&v, "request_too_large");
    // Generation stops when the context fills.
    let (status, _, v) = post(&format!("{base}/v1/chat/completions"), &chat("hi")).await;
    assert_eq!(status, 200);
    let (_, _, v2) = post(
        &format!("{base}/v1/completions"),
        &json!({"prompt": "y".repeat(60), "max_tokens": 50}),
    )
    .await;
    assert_eq!(v2["choices"][0]["finish_reason"], "length", "{v2}");
    assert_eq!(v["choices"][0]["message"]["content"], "Hello world");
    s.shutdown().await.unwrap();
}

/// A reply that runs into the end of the context says so: `length` for OpenAI (it has no
/// other reason), `model_context_window_exceeded` for Anthropic (not `max_tokens`, which
/// would tell the client to raise a limit it did not reach).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reply_cut_by_the_context() {
    let s = fake_server(
        FakeConfig {
            n_ctx: 64,
            ..FakeConfig::replying(|_| "z".repeat(200))
        },
        ServerConfig::default(),
    )
    .await;
    let base = s.base_url();
    let (status, _, v) = post(
        &format!("{base}/v1/messages"),
        &json!({"max_tokens": 500, "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["stop_reason"], "model_context_window_exceeded", "{v}");
    // A reply that ends at max_tokens first is still `max_tokens`.
    let (_, _, v) = post(
        &format!("{base}/v1/messages"),
        &json!({"max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(v["stop_reason"], "max_tokens", "{v}");
    let (status, _, v) = post(&format!("{base}/v1/chat/completions"), &chat("hi")).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "length", "{v}");
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_key_and_cors() {
    let s = fake_server(
        FakeConfig::default(),
        ServerConfig {
            api_key: Some("sekret".into()),
            ..Default::default()
        },
    )
    .await;
    let base = s.base_url();
    let (status, _, v) = post(&format!("{base}/v1/chat/completions"), &chat("x")).await;
    assert_eq!(status, 401);
    assert_openai_error(&v);
    let (status, _, v) = post(
        &format!("{base}/v1/messages"),
        &json!({"max_tokens": 5, "messages": []}),
    )
    .await;
    assert_eq!(status, 401);
    assert_anthropic_error(&v, "authentication_error");
    let chat_url = format!("{base}/v1/chat/completions");
    let as_chat = |key: &str| client().post(&chat_url).bearer_auth(key).json(&chat("x"));
    assert_eq!(status_of(as_chat("wrong")).await, 401);
    assert_eq!(status_of(as_chat("sekret")).await, 200);
    let r = client()
        .post(format!("{base}/v1/messages"))
        .header("x-api-key", "sekret")
        .json(&json!({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}));
    assert_eq!(status_of(r).await, 200);
    assert_eq!(status_of(client().get(format!("{base}/health"))).await, 200);
    assert_eq!(
        status_of(client().get(format!("{base}/metrics"))).await,
        401
    );
    // No CORS headers unless --cors.
    let preflight = |base: String| async move {
        client()
            .request(
                reqwest::Method::OPTIONS,
                format!("{base}/v1/chat/completions"),
            )
            .header("origin", "http://example.com")
            .header("access-control-request-method", "POST")
            .send()
            .await
            .unwrap()
    };
    let r = preflight(base.clone()).await;
    assert!(r.headers().get("access-control-allow-origin").is_none());
    s.shutdown().await.unwrap();
    let s = fake_server(
        FakeConfig::default(),
        ServerConfig {
            cors: true,
            ..Default::default()
        },
    )
    .await;
    let r = preflight(s.base_url()).await;
    assert_eq!(
        r.headers().get("access-control-allow-origin").unwrap(),
        "http://example.com"
    );
    s.shutdown().await.unwrap();
}

/// Waits (up to about 5 s) until `/health` shows `done`; panics saying it never `what`.
async fn wait_for_health(base: &str, what: &str, done: impl Fn(&Value) -> bool) {
    // A deadline, not a count of polls: generous for a loaded machine.
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if done(&health(base).await) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{what}");
}

/// Waits until `/health` reports `n` requests waiting.
async fn wait_for_queue(base: &str, n: u64) {
    let what = format!("the queue never held {n} requests");
    wait_for_health(base, &what, |v| v["queue_depth"] == n).await;
}

/// Waits until the engine runs a request.
async fn wait_busy(base: &str) {
    wait_for_health(base, "the engine never became busy", |v| v["busy"] == true).await;
}

/// After a client of [`long_on_request`] left, the engine is free within a few steps
/// (the 4000-token answer would take 20 s; the bound leaves room for a loaded machine)
/// and one generation counts as cancelled.
async fn freed_by_the_disconnect(base: &str) {
    let t0 = Instant::now();
    still_serving(base).await;
    assert!(
        t0.elapsed() < Duration::from_secs(10),
        "the next request waited {:?}",
        t0.elapsed()
    );
    assert_eq!(metric(base, "ds4_cancelled_generations_total").await, 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disconnect_mid_stream_cancels_within_a_step() {
    let s = fake_server(long_on_request(), ServerConfig::default()).await;
    let base = s.base_url();
    let mut body = chat("long please");
    body["stream"] = json!(true);
    let r = client()
        .post(format!("{base}/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    let mut stream = r.bytes_stream();
    let mut got = 0;
    while got < 10 {
        let chunk = stream.next().await.unwrap().unwrap();
        got += chunk.iter().filter(|&&b| b == b'z').count();
    }
    drop(stream);
    freed_by_the_disconnect(&base).await;
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_concurrent_clients() {
    let fake = FakeConfig {
        // Each answer takes about 1.3 s, so the 64 requests arrive while 9 are held, even
        // on a loaded machine (9 answers: 12 s to send them).
        token_delay: Duration::from_millis(100),
        ..Default::default()
    };
    let s = fake_server(
        fake,
        ServerConfig {
            queue: 8,
            ..Default::default()
        },
    )
    .await;
    let base = s.base_url();
    let tasks: Vec<_> = (0..64)
        .map(|i| {
            let base = base.clone();
            tokio::spawn(async move {
                if i % 2 == 0 {
                    let (status, headers, v) = post(&format!("{base}/v1/chat/completions"), &chat(&format!("client {i}"))).await;
                    let retry = headers.get("retry-after").map(|v| v.to_str().unwrap().parse::<u64>().unwrap());
                    match status {
                        200 => assert_eq!(v["choices"][0]["message"]["content"], "Hello world"),
                        429 => {
                            assert_openai_error(&v);
                            assert!(retry.is_some_and(|s| s >= 1));
                            let message = v["error"]["message"].as_str().unwrap_or_default();
                            assert!(message.starts_with("the server is busy: 8 requests are waiting"), "{v}");
                        }
                        other => panic!("status {other}: {v}"),
                    }
                    status
                } else {
                    let body = json!({"max_tokens": 50, "stream": true, "messages": [{"role": "user", "content": format!("client {i}")}]});
                    let (status, _, text) = post_text(&format!("{base}/v1/messages"), &body).await;
                    match status {
                        200 => {
                            let (events, _) = parse_sse(&text);
                            assert_eq!(events.last().unwrap().event.as_deref(), Some("message_stop"));
                        }
                        429 => assert_anthropic_error(&serde_json::from_str(&text).unwrap(), "rate_limit_error"),
                        other => panic!("status {other}: {text}"),
                    }
                    status
                }
            })
        })
        .collect();
    let mut ok = 0;
    let mut limited = 0;
    for t in tasks {
        match t.await.unwrap() {
            200 => ok += 1,
            _ => limited += 1,
        }
    }
    assert_eq!(ok + limited, 64);
    assert!(
        ok >= 9,
        "at least the running request and a full queue succeed: {ok}"
    );
    assert!(limited > 0, "a queue of 8 cannot hold 64 clients");
    still_serving(&base).await;
    assert_eq!(
        metric(&base, "ds4_rejected_requests_total").await,
        limited as f64
    );
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_comments_during_a_long_prefill() {
    let fake = FakeConfig {
        prefill_delay: Duration::from_micros(700),
        ..Default::default()
    };
    let keepalive = Duration::from_millis(200);
    let s = fake_server(
        fake,
        ServerConfig {
            keepalive,
            ..Default::default()
        },
    )
    .await;
    let mut body = chat(&"p".repeat(3000));
    body["stream"] = json!(true);
    let (_, _, text) = post_text(&format!("{}/v1/chat/completions", s.base_url()), &body).await;
    let before_data = &text[..text.find("data:").unwrap()];
    let comments = before_data.lines().filter(|l| l.starts_with(':')).count();
    assert!(
        comments >= 4,
        "{comments} keep-alive comments during a ~2 s prefill: {before_data:?}"
    );
    let (events, _) = parse_sse(&text);
    assert_eq!(events.last().unwrap().data, "[DONE]");
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_finishes_running_work_and_refuses_queued() {
    let fake = FakeConfig {
        token_delay: Duration::from_millis(5),
        ..FakeConfig::replying(|_| "w".repeat(300))
    };
    let s = fake_server(fake, ServerConfig::default()).await;
    let base = s.base_url();
    let mut body = chat("go");
    body["stream"] = json!(true);
    let running = tokio::spawn({
        let (base, body) = (base.clone(), body.clone());
        async move { post_sse(&format!("{base}/v1/chat/completions"), &body).await }
    });
    wait_busy(&base).await;
    let queued = tokio::spawn({
        let base = base.clone();
        async move {
            post(
                &format!("{base}/v1/messages"),
                &json!({"max_tokens": 5, "messages": [{"role": "user", "content": "q"}]}),
            )
            .await
        }
    });
    wait_for_queue(&base, 1).await;
    s.shutdown().await.unwrap();
    let (status, events, _) = running.await.unwrap();
    assert_eq!(status, 200);
    let text = streamed(&events, "/choices/0/delta/content");
    assert_eq!(text.len(), 300, "the running request finished");
    assert_eq!(events.last().unwrap().data, "[DONE]");
    let (status, _, v) = queued.await.unwrap();
    assert_eq!(status, 503, "{v}");
    assert_anthropic_error(&v, "overloaded_error");
    assert!(
        client().get(format!("{base}/health")).send().await.is_err(),
        "no longer listening"
    );
}

/// A server whose every answer is 10,000 tokens, 5 ms each (50 s), and whose shutdown
/// lets the running request go on for `drain`.
async fn long_answer_server(drain: Duration) -> ServerHandle {
    let fake = FakeConfig {
        token_delay: Duration::from_millis(5),
        ..FakeConfig::replying(|_| "w".repeat(10_000))
    };
    let config = ServerConfig {
        drain_timeout: drain,
        ..Default::default()
    };
    fake_server(fake, config).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_cancels_after_the_drain_timeout() {
    let s = long_answer_server(Duration::from_millis(300)).await;
    let base = s.base_url();
    let url = format!("{base}/v1/chat/completions");
    let running = tokio::spawn(async move { post(&url, &chat("go")).await });
    wait_busy(&base).await;
    let t0 = Instant::now();
    s.shutdown().await.unwrap();
    // The 10,000-token answer would take 50 s; the drain timeout is 0.3 s.
    assert!(
        t0.elapsed() < Duration::from_secs(20),
        "shutdown took {:?}",
        t0.elapsed()
    );
    // The cut answer is not passed off as complete (a finish reason of "stop").
    let (status, _, v) = running.await.unwrap();
    assert_eq!(status, 503, "{v}");
    assert_eq!(v["error"]["message"], "the server is shutting down", "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_signal_cancels_the_running_request_at_once() {
    // A drain time the test would notice.
    let s = long_answer_server(Duration::from_secs(120)).await;
    let base = s.base_url();
    let url = format!("{base}/v1/chat/completions");
    let running = tokio::spawn(async move { post(&url, &chat("go")).await });
    wait_busy(&base).await;
    let (signal, signals) = tokio::sync::mpsc::unbounded_channel();
    let served = tokio::spawn(s.run_until(signals));
    signal.send(()).unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !served.is_finished(),
        "the first signal waits for the running request"
    );
    let t0 = Instant::now();
    signal.send(()).unwrap();
    served.await.unwrap().unwrap();
    assert!(
        t0.elapsed() < Duration::from_secs(20),
        "shutdown took {:?} after the second signal",
        t0.elapsed()
    );
    let (status, _, v) = running.await.unwrap();
    assert_eq!(status, 503, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_cut_by_shutdown_ends_with_an_error() {
    let s = long_answer_server(Duration::from_millis(300)).await;
    let base = s.base_url();
    let mut body = chat("go");
    body["stream"] = json!(true);
    let url = format!("{base}/v1/chat/completions");
    let running = tokio::spawn(async move { post_sse(&url, &body).await });
    wait_busy(&base).await;
    s.shutdown().await.unwrap();
    let (status, events, _) = running.await.unwrap();
    assert_eq!(status, 200);
    assert!(!streamed(&events, "/choices/0/delta/content").is_empty());
    let n = events.len();
    assert_eq!(events[n - 1].data, "[DONE]");
    let last: Value = serde_json::from_str(&events[n - 2].data).unwrap();
    assert_eq!(
        last["error"]["message"], "the server is shutting down",
        "{last}"
    );
    assert!(
        events
            .iter()
            .all(|e| !e.data.contains("finish_reason\":\"stop")),
        "no chunk says the answer ended"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_and_metrics() {
    let s = fake_server(FakeConfig::default(), ServerConfig::default()).await;
    let base = s.base_url();
    let v = health(&base).await;
    assert_eq!(v["status"], "ok");
    assert_eq!(v["model"], "fake-model");
    post(&format!("{base}/v1/chat/completions"), &chat("a")).await;
    let (_, _, v) = post(&format!("{base}/v1/chat/completions"), &chat("a")).await;
    let text = client()
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        text.contains("ds4_requests_total{endpoint=\"/v1/chat/completions\",status=\"200\"} 2"),
        "{text}"
    );
    let prompt = v["usage"]["prompt_tokens"].as_f64().unwrap();
    assert_eq!(metric(&base, "ds4_prompt_tokens_total").await, 2.0 * prompt);
    assert_eq!(
        metric(&base, "ds4_cached_prompt_tokens_total").await,
        prompt - 1.0
    );
    assert_eq!(
        metric(&base, "ds4_prefill_tokens_total").await,
        prompt + 1.0
    );
    assert_eq!(metric(&base, "ds4_generated_tokens_total").await, 24.0);
    assert_eq!(
        metric(&base, "ds4_time_to_first_token_seconds_count").await,
        2.0
    );
    assert_eq!(metric(&base, "ds4_queue_depth").await, 0.0);
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disconnect_while_waiting_for_a_whole_answer_cancels() {
    let s = fake_server(long_on_request(), ServerConfig::default()).await;
    let base = s.base_url();
    // The client leaves once its request runs (not after a fixed time, which on a
    // loaded machine could pass before the request even arrived).
    let waiting = tokio::spawn({
        let base = base.clone();
        async move {
            client()
                .post(format!("{base}/v1/chat/completions"))
                .json(&chat("long please"))
                .send()
                .await
        }
    });
    wait_busy(&base).await;
    waiting.abort();
    assert!(
        waiting.await.unwrap_err().is_cancelled(),
        "the client gave up"
    );
    freed_by_the_disconnect(&base).await;
    s.shutdown().await.unwrap();
}
