//! Anthropic Messages against the toy model: content blocks, the streaming event
//! sequence, thinking and tool_use blocks, usage with cache reads, count_tokens.

mod common;

use common::{fake_server, first_of_type, post, post_sse, streamed};
use ds4_http::ServerConfig;
use ds4_http::fake::FakeConfig;
use serde_json::{Value, json};

const CALL: &str =
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";

fn model() -> FakeConfig {
    FakeConfig::replying(|prompt| {
        if prompt.contains("<tool_response>") {
            "<think>Got it.</think>It is 18 degrees.".to_string()
        } else if prompt.contains("get_weather") {
            CALL.to_string()
        } else {
            "<think>Easy.</think>Hello!".to_string()
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn message_blocks_and_usage() {
    let s = fake_server(model(), ServerConfig::default()).await;
    let url = format!("{}/v1/messages", s.base_url());
    let body = json!({"model": "fake-model", "max_tokens": 100, "system": [{"type": "text", "text": "Be nice."}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi", "cache_control": {"type": "ephemeral"}}]}]});
    let (status, _, v) = post(&url, &body).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["type"], "message");
    assert_eq!(v["role"], "assistant");
    assert!(v["id"].as_str().unwrap().starts_with("msg_"));
    assert_eq!(
        v["content"],
        json!([{"type": "thinking", "thinking": "Easy.", "signature": ""}, {"type": "text", "text": "Hello!"}])
    );
    assert_eq!(v["stop_reason"], "end_turn");
    assert_eq!(v["usage"]["cache_read_input_tokens"], 0);
    let first_input = v["usage"]["input_tokens"].as_u64().unwrap();
    // Again: all but the last prompt token come from the cache and are not counted as
    // input_tokens (Anthropic's accounting).
    let (_, _, v) = post(&url, &body).await;
    assert_eq!(v["usage"]["cache_read_input_tokens"], first_input - 1);
    assert_eq!(v["usage"]["input_tokens"], 1);
    assert_eq!(
        v["usage"]["output_tokens"],
        "<think>Easy.</think>Hello!".len()
    );
    // max_tokens is required.
    let (status, _, v) = post(
        &url,
        &json!({"messages": [{"role": "user", "content": "Hi"}]}),
    )
    .await;
    assert_eq!(status, 400);
    common::assert_anthropic_error(&v, "invalid_request_error");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("max_tokens")
    );
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_event_sequence() {
    let s = fake_server(model(), ServerConfig::default()).await;
    let url = format!("{}/v1/messages", s.base_url());
    let body =
        json!({"max_tokens": 100, "stream": true, "messages": [{"role": "user", "content": "Hi"}]});
    let (status, events, _) = post_sse(&url, &body).await;
    assert_eq!(status, 200);
    let names: Vec<&str> = events.iter().map(|e| e.event.as_deref().unwrap()).collect();
    let mut expected = vec!["message_start", "ping", "content_block_start"];
    expected.extend(std::iter::repeat_n("content_block_delta", "Easy.".len()));
    expected.extend(["content_block_stop", "content_block_start"]);
    expected.extend(std::iter::repeat_n("content_block_delta", "Hello!".len()));
    expected.extend(["content_block_stop", "message_delta", "message_stop"]);
    assert_eq!(names, expected);
    for e in &events {
        assert_eq!(
            e.json()["type"],
            e.event.as_deref().unwrap(),
            "type field matches the event name"
        );
    }
    let j: Vec<Value> = events.iter().map(|e| e.json()).collect();
    assert_eq!(j[2]["content_block"]["type"], "thinking");
    assert_eq!(j[3]["delta"]["type"], "thinking_delta");
    let text_start = j
        .iter()
        .position(|e| e["content_block"]["type"] == "text")
        .unwrap();
    assert_eq!(j[text_start]["index"], 1);
    assert_eq!(streamed(&events, "/delta/text"), "Hello!");
    let delta = &j[j.len() - 2];
    assert_eq!(delta["delta"]["stop_reason"], "end_turn");
    assert_eq!(delta["usage"]["output_tokens"], 26);
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_use_round_trip() {
    let s = fake_server(model(), ServerConfig::default()).await;
    let url = format!("{}/v1/messages", s.base_url());
    let tools = json!([{"name": "get_weather", "description": "Weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]);
    let mut messages = json!([{"role": "user", "content": "Weather in Paris?"}]);
    let (_, _, v) = post(
        &url,
        &json!({"max_tokens": 200, "tools": tools, "messages": messages}),
    )
    .await;
    assert_eq!(v["stop_reason"], "tool_use", "{v}");
    let block = first_of_type(&v["content"], "tool_use");
    assert_eq!(block["name"], "get_weather");
    assert_eq!(block["input"], json!({"city": "Paris"}));
    assert!(block["id"].as_str().unwrap().starts_with("toolu_"));
    messages
        .as_array_mut()
        .unwrap()
        .push(json!({"role": "assistant", "content": v["content"]}));
    messages.as_array_mut().unwrap().push(json!({"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": block["id"], "content": [{"type": "text", "text": "18C"}]}]}));
    // Streamed: input_json_delta pieces rebuild the input.
    let (_, events, _) = post_sse(
        &url,
        &json!({"max_tokens": 200, "tools": tools, "messages": messages, "stream": true}),
    )
    .await;
    let j: Vec<Value> = events.iter().map(|e| e.json()).collect();
    assert_eq!(streamed(&events, "/delta/text"), "It is 18 degrees.");
    let start = &j[0]["message"]["usage"];
    assert!(
        start["cache_read_input_tokens"].as_u64().unwrap() > 50,
        "{start}"
    );
    // A streamed tool call.
    let (_, events, _) = post_sse(&url, &json!({"max_tokens": 200, "tools": tools, "messages": [{"role": "user", "content": "Weather?"}], "stream": true})).await;
    let j: Vec<Value> = events.iter().map(|e| e.json()).collect();
    let start = j
        .iter()
        .find(|e| e["content_block"]["type"] == "tool_use")
        .unwrap();
    assert_eq!(start["content_block"]["name"], "get_weather");
    let partial = streamed(&events, "/delta/partial_json");
    assert_eq!(
        serde_json::from_str::<Value>(&partial).unwrap(),
        json!({"city": "Paris"})
    );
    assert_eq!(j[j.len() - 2]["delta"]["stop_reason"], "tool_use");
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn count_tokens_and_stop_sequences() {
    let s = fake_server(model(), ServerConfig::default()).await;
    let base = s.base_url();
    let (status, _, v) = post(
        &format!("{base}/v1/messages/count_tokens"),
        &json!({"model": "fake-model", "messages": [{"role": "user", "content": "Hi"}]}),
    )
    .await;
    assert_eq!(status, 200);
    // "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert_eq!(
        v["input_tokens"],
        3 + "user\nHi".len() + 1 + "assistant\n".len()
    );
    let (_, _, v) = post(&format!("{base}/v1/messages"), &json!({"max_tokens": 50, "stop_sequences": ["llo"], "messages": [{"role": "user", "content": "Hi"}]})).await;
    assert_eq!(v["stop_reason"], "stop_sequence");
    assert_eq!(v["stop_sequence"], "llo");
    assert_eq!(
        v["content"].as_array().unwrap().last().unwrap()["text"],
        "He"
    );
    let (_, _, v) = post(
        &format!("{base}/v1/messages"),
        &json!({"max_tokens": 3, "messages": [{"role": "user", "content": "Hi"}]}),
    )
    .await;
    assert_eq!(v["stop_reason"], "max_tokens");
    let (status, _, v) = post(&format!("{base}/v1/messages"), &json!({"max_tokens": 3, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]})).await;
    assert_eq!(status, 400);
    common::assert_anthropic_error(&v, "invalid_request_error");
    s.shutdown().await.unwrap();
}

/// A stop sequence that matches inside a tool call cuts the answer like `max_tokens`
/// does: not streamed, the unfinished call comes back as text, never as a `tool_use`
/// with invented input; streamed, its deltas have gone out, and the stop reason says
/// `stop_sequence`, not `tool_use`. `disable_parallel_tool_use` keeps one call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_sequence_inside_a_call_cuts_it() {
    let s = fake_server(model(), ServerConfig::default()).await;
    let url = format!("{}/v1/messages", s.base_url());
    let tools = json!([{"name": "get_weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]);
    let req = json!({"max_tokens": 200, "tools": tools, "stop_sequences": ["Paris"],
                     "messages": [{"role": "user", "content": "Weather?"}]});
    let (_, _, v) = post(&url, &req).await;
    assert_eq!(v["stop_reason"], "stop_sequence", "{v}");
    let blocks = v["content"].as_array().unwrap();
    assert!(blocks.iter().all(|b| b["type"] != "tool_use"), "{v}");
    let text = first_of_type(&v["content"], "text");
    assert_eq!(
        text["text"], "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"",
        "{v}"
    );
    let mut streamed_req = req.clone();
    streamed_req["stream"] = json!(true);
    let (_, events, _) = post_sse(&url, &streamed_req).await;
    let j: Vec<Value> = events.iter().map(|e| e.json()).collect();
    assert_eq!(j[j.len() - 2]["delta"]["stop_reason"], "stop_sequence");

    // One call at most: the toy model's answer is two calls.
    let two = FakeConfig::replying(|_| format!("{CALL}\n{CALL}"));
    let s2 = fake_server(two, ServerConfig::default()).await;
    let url2 = format!("{}/v1/messages", s2.base_url());
    let mut req = json!({"max_tokens": 200, "tools": tools, "messages": [{"role": "user", "content": "Weather?"}]});
    let (_, _, v) = post(&url2, &req).await;
    let calls = |v: &Value| {
        v["content"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|b| b["type"] == "tool_use")
            .count()
    };
    assert_eq!(calls(&v), 2, "{v}");
    req["tool_choice"] = json!({"type": "auto", "disable_parallel_tool_use": true});
    let (_, _, v) = post(&url2, &req).await;
    assert_eq!(calls(&v), 1, "{v}");
    s.shutdown().await.unwrap();
    s2.shutdown().await.unwrap();
}

/// Server tools (web search, …) and content blocks the server cannot read are refused
/// with a 400 naming them, not dropped; the client-executed bash and text_editor tools,
/// which come without a schema, are described to the model with their inputs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_and_blocks_it_cannot_serve_are_refused() {
    let s = fake_server(model(), ServerConfig::default()).await;
    let base = s.base_url();
    let msg = json!([{"role": "user", "content": "Hi"}]);
    let (status, _, v) = post(
        &format!("{base}/v1/messages"),
        &json!({"max_tokens": 5, "messages": msg,
        "tools": [{"type": "web_search_20250305", "name": "web_search", "max_uses": 3}]}),
    )
    .await;
    assert_eq!(status, 400, "{v}");
    common::assert_anthropic_error(&v, "invalid_request_error");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("'web_search_20250305'"),
        "{v}"
    );
    let (status, _, v) = post(&format!("{base}/v1/messages"), &json!({"max_tokens": 5,
        "messages": [{"role": "user", "content": [{"type": "search_result", "source": "x", "title": "t", "content": []}]}]})).await;
    assert_eq!(status, 400, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("'search_result'"),
        "{v}"
    );
    let mut counts = Vec::new();
    for tools in [
        json!([]),
        json!([{"type": "bash_20250124", "name": "bash"}]),
        json!([{"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"}]),
    ] {
        let url = format!("{base}/v1/messages/count_tokens");
        let (status, _, v) = post(&url, &json!({"messages": msg, "tools": tools})).await;
        assert_eq!(status, 200, "{v}");
        counts.push(v["input_tokens"].as_u64().unwrap());
    }
    let [bare, with_bash, with_editor] = counts[..] else {
        unreachable!()
    };
    assert!(with_bash > bare + 20, "{bare} {with_bash}");
    assert!(with_editor > with_bash, "{with_bash} {with_editor}");
    s.shutdown().await.unwrap();
}
