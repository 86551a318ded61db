//! OpenAI Chat Completions, Completions and Responses against the toy model: answer
//! shapes, streaming event sequences, stop sequences, limits, logprobs, reasoning and
//! tool calls.

mod common;

use common::{assert_openai_error, fake_server, first_of_type, pieces, post, post_sse, streamed};
use ds4_http::ServerConfig;
use ds4_http::fake::{FakeConfig, last_user_message};
use serde_json::{Value, json};

fn replying(text: &'static str) -> FakeConfig {
    FakeConfig::replying(move |_| text.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_completion_answer_and_usage() {
    let s = fake_server(FakeConfig::default(), ServerConfig::default()).await;
    let url = format!("{}/v1/chat/completions", s.base_url());
    let body =
        json!({"model": "fake-model", "messages": [{"role": "user", "content": "Hi"}], "seed": 1});
    let (status, _, v) = post(&url, &body).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], "fake-model");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert_eq!(v["choices"][0]["message"]["content"], "Hello world");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    // "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n": 3 specials + 19 bytes.
    assert_eq!(
        v["usage"]["prompt_tokens"],
        3 + "user\nHi".len() + 1 + "assistant\n".len()
    );
    assert_eq!(v["usage"]["completion_tokens"], "Hello world".len());
    assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    // The same request again reuses all but the last prompt token.
    let (_, _, v2) = post(&url, &body).await;
    let prompt = v2["usage"]["prompt_tokens"].as_u64().unwrap();
    assert_eq!(
        v2["usage"]["prompt_tokens_details"]["cached_tokens"],
        prompt - 1
    );
    // The timings extension: what was evaluated and how long it took.
    assert_eq!(v["timings"]["prefill_tokens"], v["usage"]["prompt_tokens"]);
    assert!(v["timings"]["prefill_ms"].as_f64().is_some(), "{v}");
    assert_eq!(v2["timings"]["prefill_tokens"], 1);
    assert_eq!(
        v["timings"]["decode_tokens"].as_u64(),
        Some("Hello world".len() as u64 + 1)
    );
    // Other names answer too, under the served id.
    let (status, _, v3) = post(
        &url,
        &json!({"model": "FAKE MODEL 1B", "messages": [{"role": "user", "content": "x"}]}),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(v3["model"], "fake-model");
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_stream_chunks_usage_and_done() {
    let s = fake_server(FakeConfig::default(), ServerConfig::default()).await;
    let url = format!("{}/v1/chat/completions", s.base_url());
    let body = json!({"messages": [{"role": "user", "content": "Hi"}], "stream": true, "stream_options": {"include_usage": true}});
    let (status, events, _) = post_sse(&url, &body).await;
    assert_eq!(status, 200);
    assert_eq!(events.last().unwrap().data, "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| e.json())
        .collect();
    assert!(
        chunks
            .iter()
            .all(|c| c["object"] == "chat.completion.chunk")
    );
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, "Hello world");
    let finish = &chunks[chunks.len() - 2];
    assert_eq!(finish["choices"][0]["finish_reason"], "stop");
    let usage = chunks.last().unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 11);
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_sequences_never_leak_and_max_tokens_cuts() {
    let s = fake_server(
        replying("Hello world, how are you"),
        ServerConfig::default(),
    )
    .await;
    let url = format!("{}/v1/chat/completions", s.base_url());
    let msgs = json!([{"role": "user", "content": "Hi"}]);
    let (_, _, v) = post(&url, &json!({"messages": msgs, "stop": ", how"})).await;
    assert_eq!(v["choices"][0]["message"]["content"], "Hello world");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    // Streamed, no piece of the stop sequence shows (the first character of the stop
    // sequence, ",", would leak without hold-back).
    let (_, events, _) = post_sse(
        &url,
        &json!({"messages": msgs, "stop": [", how", "xyz"], "stream": true}),
    )
    .await;
    assert_eq!(streamed(&events, "/choices/0/delta/content"), "Hello world");
    let (_, _, v) = post(&url, &json!({"messages": msgs, "max_tokens": 5})).await;
    assert_eq!(v["choices"][0]["message"]["content"], "Hello");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 5);
    let (_, _, v) = post(
        &url,
        &json!({"messages": msgs, "max_completion_tokens": 3, "max_tokens": 9}),
    )
    .await;
    assert_eq!(v["choices"][0]["message"]["content"], "Hel");
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn incomplete_utf8_is_held_back() {
    // "é" is two byte tokens in the toy vocabulary; no chunk may carry half of it.
    let s = fake_server(replying("café €"), ServerConfig::default()).await;
    let url = format!("{}/v1/chat/completions", s.base_url());
    let (_, events, _) = post_sse(
        &url,
        &json!({"messages": [{"role": "user", "content": "Hi"}], "stream": true}),
    )
    .await;
    let pieces = pieces(&events, "/choices/0/delta/content");
    assert!(pieces.iter().all(|p| !p.contains('\u{fffd}')), "{pieces:?}");
    assert_eq!(pieces.concat(), "café €");
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_logprobs() {
    let s = fake_server(replying("ab"), ServerConfig::default()).await;
    let url = format!("{}/v1/chat/completions", s.base_url());
    let body = json!({"messages": [{"role": "user", "content": "Hi"}], "logprobs": true, "top_logprobs": 2});
    let (_, _, v) = post(&url, &body).await;
    let content = v["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(
        content.len(),
        2,
        "two letters (the end token has no text): {v}"
    );
    assert_eq!(content[0]["token"], "a");
    assert_eq!(content[0]["bytes"], json!([97]));
    assert_eq!(content[0]["logprob"], -0.25);
    assert_eq!(content[0]["top_logprobs"].as_array().unwrap().len(), 2);
    let (status, _, v) = post(&url, &json!({"messages": [{"role": "user", "content": "Hi"}], "logprobs": true, "top_logprobs": 21})).await;
    assert_eq!(status, 400);
    assert_eq!(v["error"]["param"], "top_logprobs");
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reasoning_is_split_off() {
    let s = fake_server(
        replying("<think>\nLet me think.\n</think>\n\nThe answer."),
        ServerConfig::default(),
    )
    .await;
    let url = format!("{}/v1/chat/completions", s.base_url());
    let (_, _, v) = post(
        &url,
        &json!({"messages": [{"role": "user", "content": "Hi"}]}),
    )
    .await;
    let m = &v["choices"][0]["message"];
    assert_eq!(m["reasoning_content"], "Let me think.\n");
    assert_eq!(m["content"], "The answer.");
    let (_, events, _) = post_sse(
        &url,
        &json!({"messages": [{"role": "user", "content": "Hi"}], "stream": true}),
    )
    .await;
    let reasoning = streamed(&events, "/choices/0/delta/reasoning_content");
    let content = streamed(&events, "/choices/0/delta/content");
    assert_eq!(
        (reasoning.as_str(), content.as_str()),
        ("Let me think.\n", "The answer.")
    );
    s.shutdown().await.unwrap();
}

const CALL: &str = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n</tool_call>";

fn tool_model(supports_tools: bool) -> FakeConfig {
    FakeConfig {
        supports_tools,
        ..FakeConfig::replying(|prompt| {
            if prompt.contains("<tool_response>") || prompt.contains("<|im_start|>tool") {
                "It is 18 degrees.".to_string()
            } else if prompt.contains("get_weather") {
                CALL.to_string()
            } else {
                "No tools.".to_string()
            }
        })
    }
}

fn weather_tools() -> Value {
    json!([{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"}}, "required": ["city"]}}}])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_call_round_trip_with_and_without_template_support() {
    for supports_tools in [true, false] {
        let s = fake_server(tool_model(supports_tools), ServerConfig::default()).await;
        let url = format!("{}/v1/chat/completions", s.base_url());
        let mut messages = json!([{"role": "user", "content": "Weather in Paris?"}]);
        let (status, _, v) = post(
            &url,
            &json!({"messages": messages, "tools": weather_tools()}),
        )
        .await;
        assert_eq!(status, 200, "{v}");
        let choice = &v["choices"][0];
        assert_eq!(choice["finish_reason"], "tool_calls");
        assert_eq!(choice["message"]["content"], Value::Null);
        let call = &choice["message"]["tool_calls"][0];
        assert_eq!(call["type"], "function");
        assert_eq!(call["function"]["name"], "get_weather");
        let args: Value =
            serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
        assert_eq!(args, json!({"city": "Paris", "unit": "celsius"}));
        assert!(call["id"].as_str().unwrap().starts_with("call_"));
        // Send the result back; the assistant turn has null content (the template
        // without tool support would fail on it unless the server fills it in).
        messages
            .as_array_mut()
            .unwrap()
            .push(choice["message"].clone());
        messages
            .as_array_mut()
            .unwrap()
            .push(json!({"role": "tool", "tool_call_id": call["id"], "content": "18C"}));
        let (status, _, v) = post(
            &url,
            &json!({"messages": messages, "tools": weather_tools()}),
        )
        .await;
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["choices"][0]["message"]["content"], "It is 18 degrees.");
        // Everything up to the end of the generated call was reused: only the new turn
        // is evaluated, "<|im_end|>\n" + the tool result turn + the generation prompt
        // (4 special tokens and 20 bytes with tool support, 4 and 53 without, where
        // the result is wrapped in <tool_response> tags in a user turn).
        let cached = v["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap();
        let prompt = v["usage"]["prompt_tokens"].as_u64().unwrap();
        let expected = if supports_tools { 4 + 20 } else { 4 + 53 };
        assert_eq!(
            prompt - cached,
            expected,
            "supports_tools={supports_tools}: {cached} of {prompt} cached"
        );
        // tool_choice none: tools not offered, calls not parsed.
        let (_, _, v) = post(&url, &json!({"messages": [{"role": "user", "content": "Hi"}], "tools": weather_tools(), "tool_choice": "none"})).await;
        assert_eq!(v["choices"][0]["message"]["content"], "No tools.");
        s.shutdown().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_call_streams_argument_deltas() {
    let s = fake_server(tool_model(true), ServerConfig::default()).await;
    let url = format!("{}/v1/chat/completions", s.base_url());
    let body = json!({"messages": [{"role": "user", "content": "Weather?"}], "tools": weather_tools(), "stream": true});
    let (_, events, _) = post_sse(&url, &body).await;
    let deltas: Vec<Value> = events
        .iter()
        .map(|e| e.json())
        .filter(|c| c["choices"][0]["delta"]["tool_calls"].is_array())
        .collect();
    assert!(
        deltas.len() > 5,
        "arguments were not streamed: {} tool-call chunks",
        deltas.len()
    );
    let first = &deltas[0]["choices"][0]["delta"]["tool_calls"][0];
    assert_eq!(first["index"], 0);
    assert_eq!(first["function"]["name"], "get_weather");
    assert!(first["id"].is_string());
    let args = streamed(&events, "/choices/0/delta/tool_calls/0/function/arguments");
    assert_eq!(
        serde_json::from_str::<Value>(&args).unwrap(),
        json!({"city": "Paris", "unit": "celsius"})
    );
    let finish = events.iter().rev().find_map(|e| {
        e.json()["choices"][0]["finish_reason"]
            .as_str()
            .map(String::from)
    });
    assert_eq!(finish.as_deref(), Some("tool_calls"));
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn legacy_completions() {
    let fake = FakeConfig::replying(|p| format!("<{}>", p.len()));
    let s = fake_server(fake, ServerConfig::default()).await;
    let url = format!("{}/v1/completions", s.base_url());
    let (status, _, v) = post(&url, &json!({"prompt": "Once upon"})).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["choices"][0]["text"], "<9>");
    assert_eq!(v["usage"]["prompt_tokens"], 9);
    // Token ids as the prompt; the default max_tokens is 16.
    let (_, _, v) = post(&url, &json!({"prompt": [65, 66], "logprobs": 1})).await;
    assert_eq!(v["choices"][0]["text"], "<2>");
    assert_eq!(
        v["choices"][0]["logprobs"]["tokens"],
        json!(["<", "2", ">"])
    );
    let (_, events, _) = post_sse(
        &url,
        &json!({"prompt": "abc", "stream": true, "max_tokens": 2}),
    )
    .await;
    assert_eq!(streamed(&events, "/choices/0/text"), "<3");
    assert_eq!(events.last().unwrap().data, "[DONE]");
    let (status, _, v) = post(&url, &json!({"prompt": [999999]})).await;
    assert_eq!(
        (status, v["error"]["param"].as_str()),
        (400, Some("prompt"))
    );
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_answer_and_stream() {
    let fake = FakeConfig::replying(|p| format!("You said {}", last_user_message(p)));
    let s = fake_server(fake, ServerConfig::default()).await;
    let url = format!("{}/v1/responses", s.base_url());
    let (status, _, v) = post(
        &url,
        &json!({"model": "fake-model", "input": "ping", "instructions": "Be terse."}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["object"], "response");
    assert_eq!(v["status"], "completed");
    let (created, completed) = (v["created_at"].as_u64(), v["completed_at"].as_u64());
    assert!(created.is_some() && completed >= created, "{v}");
    assert_eq!(v["output"][0]["type"], "message");
    assert_eq!(v["output"][0]["content"][0]["type"], "output_text");
    assert_eq!(v["output"][0]["content"][0]["text"], "You said ping");
    assert_eq!(v["usage"]["output_tokens"], "You said ping".len());
    assert!(v["usage"]["input_tokens_details"]["cached_tokens"].is_u64());
    let input = json!([
        {"role": "user", "content": [{"type": "input_text", "text": "first"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "You said first"}]},
        {"role": "user", "content": "second"}
    ]);
    let (_, events, _) = post_sse(
        &url,
        &json!({"input": input, "stream": true, "max_output_tokens": 4}),
    )
    .await;
    let names: Vec<&str> = events.iter().filter_map(|e| e.event.as_deref()).collect();
    assert_eq!(names.first(), Some(&"response.created"));
    assert_eq!(names.last(), Some(&"response.incomplete"));
    for n in [
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.output_item.done",
    ] {
        assert!(names.contains(&n), "missing {n} in {names:?}");
    }
    let seq: Vec<u64> = events
        .iter()
        .map(|e| e.json()["sequence_number"].as_u64().unwrap())
        .collect();
    assert_eq!(seq, (0..seq.len() as u64).collect::<Vec<_>>());
    let last = events.last().unwrap().json();
    assert_eq!(last["response"]["status"], "incomplete");
    assert_eq!(last["response"]["output"][0]["content"][0]["text"], "You ");
    // The message the limit cut is itself incomplete, in the final response and in its
    // `output_item.done` event, and keeps its text.
    assert_eq!(last["response"]["output"][0]["status"], "incomplete");
    let done: Vec<Value> = events
        .iter()
        .filter(|e| e.event.as_deref() == Some("response.output_item.done"))
        .map(|e| e.json())
        .collect();
    assert_eq!(done.len(), 1);
    assert_eq!(done[0]["item"]["status"], "incomplete");
    assert_eq!(done[0]["item"]["content"][0]["text"], "You ");
    assert_eq!(
        last["response"]["incomplete_details"]["reason"],
        "max_output_tokens"
    );
    // Not streamed: the same.
    let (_, _, v) = post(&url, &json!({"input": input, "max_output_tokens": 4})).await;
    assert_eq!(v["status"], "incomplete");
    assert_eq!(v["output"][0]["status"], "incomplete");
    assert_eq!(v["output"][0]["content"][0]["text"], "You ");
    // A complete answer's message is completed.
    let (_, _, v) = post(&url, &json!({"input": "ping"})).await;
    assert_eq!(
        (&v["status"], &v["output"][0]["status"]),
        (&json!("completed"), &json!("completed"))
    );
    let (status, _, v) = post(
        &url,
        &json!({"input": "x", "previous_response_id": "resp_1"}),
    )
    .await;
    assert_eq!(
        (status, v["error"]["param"].as_str()),
        (400, Some("previous_response_id"))
    );
    s.shutdown().await.unwrap();
}

/// A stop sequence that matches inside a tool call cuts the answer: not streamed, the
/// unfinished call is text and the finish reason `stop`; streamed, its deltas have gone
/// out, and the finish reason is still `stop`, never `tool_calls` for a broken call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_sequence_inside_a_call_cuts_it() {
    let s = fake_server(tool_model(true), ServerConfig::default()).await;
    let url = format!("{}/v1/chat/completions", s.base_url());
    let body = json!({"messages": [{"role": "user", "content": "Weather?"}], "tools": weather_tools(), "stop": ["unit"]});
    let (_, _, v) = post(&url, &body).await;
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "stop", "{v}");
    assert!(choice["message"]["tool_calls"].is_null(), "{v}");
    assert_eq!(
        choice["message"]["content"],
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"",
        "{v}"
    );
    let mut streamed_body = body.clone();
    streamed_body["stream"] = json!(true);
    let (_, events, _) = post_sse(&url, &streamed_body).await;
    let finish = events.iter().rev().find_map(|e| {
        e.json()["choices"][0]["finish_reason"]
            .as_str()
            .map(String::from)
    });
    assert_eq!(finish.as_deref(), Some("stop"));
    // Responses, streamed: the call's item is incomplete.
    let tools =
        json!([{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}]);
    let (_, events, _) = post_sse(
        &format!("{}/v1/responses", s.base_url()),
        &json!({"input": "Weather?", "tools": tools, "stop": ["unit"], "stream": true}),
    )
    .await;
    let last = events.last().unwrap().json();
    let call = first_of_type(&last["response"]["output"], "function_call");
    assert_eq!(call["status"], "incomplete", "{last}");
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_function_calls() {
    let s = fake_server(tool_model(true), ServerConfig::default()).await;
    let url = format!("{}/v1/responses", s.base_url());
    let tools = json!([{"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]);
    // Tools other than functions (Codex's custom `apply_patch`, hosted tools) are refused.
    for other in [
        json!({"type": "custom", "name": "apply_patch", "description": "Patch files"}),
        json!({"type": "web_search"}),
    ] {
        let (status, _, v) = post(&url, &json!({"input": "Hi", "tools": [other]})).await;
        assert_eq!(status, 400, "{v}");
        assert_openai_error(&v);
    }
    let (_, _, v) = post(&url, &json!({"input": "Weather?", "tools": tools})).await;
    let call = first_of_type(&v["output"], "function_call");
    assert_eq!(call["name"], "get_weather");
    assert_eq!(
        serde_json::from_str::<Value>(call["arguments"].as_str().unwrap()).unwrap()["city"],
        "Paris"
    );
    let input = json!([
        {"role": "user", "content": "Weather?"},
        {"type": "function_call", "call_id": call["call_id"], "name": "get_weather", "arguments": call["arguments"]},
        {"type": "function_call_output", "call_id": call["call_id"], "output": "18C"}
    ]);
    let (_, events, _) = post_sse(
        &url,
        &json!({"input": input, "tools": tools, "stream": true}),
    )
    .await;
    let last = events.last().unwrap().json();
    assert_eq!(last["type"], "response.completed");
    assert_eq!(
        last["response"]["output"][0]["content"][0]["text"],
        "It is 18 degrees."
    );
    s.shutdown().await.unwrap();
}
