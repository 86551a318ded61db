//! Agent-loop regressions, each driven as a coding agent would drive the server, with
//! the real models: SmolLM2-135M (no tool template; tools inlined in Hermes format) and
//! Qwen2.5-Coder-0.5B (tools in its template). Greedy decoding throughout.
//!
//! Skips (with a message) when a model file is absent. One test (generation order of
//! text and calls) uses the toy model, because no small real model writes text after
//! a tool call on demand.

#![cfg(feature = "engine")]

mod common;

use common::{engine_server, fake_server, open_model, post, post_sse};
use ds4_engine::generate::{GenerateParams, generate};
use ds4_engine::sampler::SamplerParams;
use ds4_engine::{LoadedModel, Session};
use ds4_http::fake::FakeConfig;
use ds4_http::{ServerConfig, ServerHandle};
use ds4_tokenizer::{ChatMessage, RenderOptions, StreamDecoder};
use serde_json::{Value, json};

const SMOLLM2: &str = "smollm2-135m-instruct-q4_1.gguf";
const QWEN: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf";
const N_CTX: usize = 2048;

async fn serve(file: &str) -> Option<ServerHandle> {
    let lm = open_model(file)?;
    Some(engine_server(lm, N_CTX, ServerConfig::default()).await)
}

fn weather_tool() -> Value {
    json!({"type": "function", "function": {"name": "get_weather", "description": "Current weather of a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}})
}

/// A history holding assistant tool calls whose arguments are not valid JSON is
/// rendered (the raw text), not refused: OpenAI chat, Anthropic `tool_use.input` given
/// as a string, Responses `function_call`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_tool_call_arguments_in_history_are_accepted() {
    let Some(s) = serve(QWEN).await else { return };
    let base = s.base_url();
    for bad in ["{not json", "", "{\"city\": \"Par"] {
        let body = json!({"messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": bad}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "error: arguments are not JSON"}],
            "tools": [weather_tool()], "max_tokens": 4, "temperature": 0});
        let (status, _, v) = post(&format!("{base}/v1/chat/completions"), &body).await;
        assert_eq!(status, 200, "arguments {bad:?}: {v}");
    }
    let body = json!({"max_tokens": 4, "temperature": 0, "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}],
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": "{bad json"}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "error"}]}]});
    let (status, _, v) = post(&format!("{base}/v1/messages"), &body).await;
    assert_eq!(status, 200, "{v}");
    let body = json!({"max_output_tokens": 4, "temperature": 0, "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}],
        "input": [
            {"role": "user", "content": "Weather in Paris?"},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{not json"},
            {"type": "function_call_output", "call_id": "c1", "output": "error"}]});
    let (status, _, v) = post(&format!("{base}/v1/responses"), &body).await;
    assert_eq!(status, 200, "{v}");
    s.shutdown().await.unwrap();
}

/// A conversation without a user message, which Qwen's template cannot render: a 400
/// on `messages` that says so (in each API's shape), not only the template's own error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_without_a_user_message_is_refused_with_the_reason() {
    let Some(s) = serve(QWEN).await else { return };
    let base = s.base_url();
    let messages = json!([{"role": "assistant", "content": "hi"}]);
    for (path, body) in [
        (
            "/v1/chat/completions",
            json!({"max_tokens": 4, "messages": messages}),
        ),
        (
            "/v1/messages",
            json!({"max_tokens": 4, "messages": messages}),
        ),
    ] {
        let (status, _, v) = post(&format!("{base}{path}"), &body).await;
        assert_eq!(status, 400, "{path}: {v}");
        let message = v["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("no user message"), "{path}: {v}");
    }
    s.shutdown().await.unwrap();
}

/// `max_tokens` ending inside a (forced) tool call: the answer is cut, so the finish
/// reason is `length` / `max_tokens`, no incomplete call is reported, and the text
/// generated so far — the forced opening and every sampled token — is all there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_call_cut_by_max_tokens_reports_length_and_keeps_its_text() {
    let Some(s) = serve(QWEN).await else { return };
    let base = s.base_url();
    let body = json!({"messages": [{"role": "user", "content": "What is the weather in Paris and in London?"}],
        "tools": [weather_tool()], "tool_choice": "required", "max_tokens": 6, "temperature": 0,
        "logprobs": true});
    let (status, _, v) = post(&format!("{base}/v1/chat/completions"), &body).await;
    assert_eq!(status, 200, "{v}");
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "length", "{v}");
    assert!(choice["message"]["tool_calls"].is_null(), "{v}");
    // The forced opening (one tool: named), then the sampled tokens' text.
    let sampled: String = choice["logprobs"]["content"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["token"].as_str().unwrap())
        .collect();
    assert_eq!(v["usage"]["completion_tokens"], 6);
    let lead = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\":";
    assert_eq!(
        choice["message"]["content"].as_str().unwrap(),
        format!("{lead}{sampled}")
    );

    let (_, stream, _) = post_sse(
        &format!("{base}/v1/chat/completions"),
        &json!({"stream": true, "logprobs": false, "messages": body["messages"], "tools": body["tools"],
            "tool_choice": "required", "max_tokens": 6, "temperature": 0}),
    )
    .await;
    let finish: Vec<Value> = stream
        .iter()
        .filter_map(|e| e.json().pointer("/choices/0/finish_reason").cloned())
        .filter(|f| !f.is_null())
        .collect();
    assert_eq!(finish, vec![json!("length")]);

    let body = json!({"max_tokens": 6, "temperature": 0, "tool_choice": {"type": "any"},
        // The OpenAI request's tool, so that the rendered prompt and the greedy tokens are
        // the same.
        "tools": [{"name": "get_weather", "description": "Current weather of a city.",
            "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}],
        "messages": [{"role": "user", "content": "What is the weather in Paris and in London?"}]});
    let (status, _, v) = post(&format!("{base}/v1/messages"), &body).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["stop_reason"], "max_tokens", "{v}");
    let blocks = v["content"].as_array().unwrap();
    assert!(blocks.iter().all(|b| b["type"] == "text"), "{v}");
    assert_eq!(
        blocks[0]["text"].as_str().unwrap(),
        format!("{lead}{sampled}")
    );
    s.shutdown().await.unwrap();
}

/// Text generated after a tool call comes after the `tool_use` block (Anthropic) and
/// the `function_call` item (Responses). The toy model writes text, a call, text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_after_a_tool_call_stays_after_it() {
    let s = fake_server(
        FakeConfig::replying(|_| {
            "Checking.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>Then I will answer.".into()
        }),
        ServerConfig::default(),
    )
    .await;
    let base = s.base_url();
    let body = json!({"max_tokens": 200, "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}],
        "messages": [{"role": "user", "content": "Weather?"}]});
    let (status, _, v) = post(&format!("{base}/v1/messages"), &body).await;
    assert_eq!(status, 200, "{v}");
    let kinds: Vec<&str> = v["content"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["type"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["text", "tool_use", "text"], "{v}");
    assert_eq!(v["content"][2]["text"], "Then I will answer.");
    let body = json!({"max_output_tokens": 200, "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}],
        "input": "Weather?"});
    let (status, _, v) = post(&format!("{base}/v1/responses"), &body).await;
    assert_eq!(status, 200, "{v}");
    let kinds: Vec<&str> = v["output"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["type"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["message", "function_call", "message"], "{v}");
    s.shutdown().await.unwrap();
}

/// What the engine generates greedily after `messages` rendered with the generation
/// prompt followed by `prefill`: the reference for a continued final message.
fn continuation(lm: &LoadedModel, user: &str, prefill: &str, n: usize) -> String {
    let (text, _) = lm
        .chat_prompt(&[ChatMessage::new("user", user)], &RenderOptions::default())
        .unwrap();
    let prompt = lm.tokenize_rendered(&format!("{text}{prefill}"));
    let mut session = Session::new(lm.model.clone(), N_CTX).unwrap();
    let mut decoder = StreamDecoder::new();
    let mut out = String::new();
    let tok = lm.tokenizer.clone();
    generate(
        &mut session,
        &prompt,
        &GenerateParams {
            max_tokens: n,
            sampler: SamplerParams::GREEDY,
            seed: 1,
            needs_logits: false,
        },
        &|t| tok.is_eog(t),
        &mut |_, _| {},
        &mut |t, _| {
            if !tok.is_eog(t) {
                out.push_str(&decoder.push(&tok.piece(t, false)));
            }
            std::ops::ControlFlow::Continue(())
        },
    )
    .unwrap();
    out
}

/// A final assistant message is continued (Anthropic's prefill; OpenAI
/// `continue_final_message`): the answer is what the model writes after the rendered
/// history plus that message's text, not a new turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_final_assistant_message_is_continued() {
    let (Some(reference), Some(served)) = (open_model(SMOLLM2), open_model(SMOLLM2)) else {
        return;
    };
    let user = "Count from 1 to 10, separated by commas.";
    let prefill = "1, 2, 3,";
    let want = continuation(&reference, user, prefill, 12);
    drop(reference);
    assert!(!want.is_empty());
    let s = engine_server(served, N_CTX, ServerConfig::default()).await;
    let base = s.base_url();
    let messages =
        json!([{"role": "user", "content": user}, {"role": "assistant", "content": prefill}]);
    let (status, _, v) = post(
        &format!("{base}/v1/messages"),
        &json!({"max_tokens": 12, "temperature": 0, "messages": messages}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["content"][0]["text"].as_str().unwrap(), want, "{v}");
    let (status, _, v) = post(
        &format!("{base}/v1/chat/completions"),
        &json!({"max_tokens": 12, "temperature": 0, "messages": messages, "continue_final_message": true}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        v["choices"][0]["message"]["content"].as_str().unwrap(),
        want
    );
    s.shutdown().await.unwrap();
}

/// `max_tokens` ending inside a multi-byte character: the incomplete character is
/// dropped, never returned as U+FFFD.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_character_cut_by_max_tokens_is_dropped() {
    let Some(s) = serve(SMOLLM2).await else {
        return;
    };
    let url = format!("{}/v1/chat/completions", s.base_url());
    // Prompts whose greedy answers hold characters the English-centric vocabulary
    // splits into byte tokens; the first one that does is used.
    let candidates = [
        json!([{"role": "user", "content": "Write one sentence in Japanese."}, {"role": "assistant", "content": "日本語:"}]),
        json!([{"role": "user", "content": "Write one sentence in Chinese."}, {"role": "assistant", "content": "中文:"}]),
        json!([{"role": "user", "content": "Reply with five emoji about the sea, nothing else."}]),
    ];
    let mut found = None;
    for messages in candidates {
        let (status, _, v) = post(
            &url,
            &json!({"messages": messages, "max_tokens": 24, "temperature": 0, "logprobs": true}),
        )
        .await;
        assert_eq!(status, 200, "{v}");
        let bytes: Vec<Vec<u8>> = v["choices"][0]["logprobs"]["content"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| {
                t["bytes"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|b| b.as_u64().unwrap() as u8)
                    .collect()
            })
            .collect();
        // The first token count that ends inside a character.
        let mut acc = Vec::new();
        let cut = bytes.iter().enumerate().find_map(|(i, b)| {
            acc.extend_from_slice(b);
            std::str::from_utf8(&acc)
                .is_err_and(|e| e.error_len().is_none())
                .then_some((i + 1, acc.clone()))
        });
        if let Some(cut) = cut {
            found = Some((messages, cut));
            break;
        }
    }
    let (messages, cut) =
        found.expect("an answer with a character split across tokens (the test needs one)");
    let (n, prefix) = cut;
    let valid = match std::str::from_utf8(&prefix) {
        Ok(s) => s.to_string(),
        Err(e) => String::from_utf8(prefix[..e.valid_up_to()].to_vec()).unwrap(),
    };
    let (status, _, v) = post(
        &url,
        &json!({"messages": messages, "max_tokens": n, "temperature": 0}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    let text = v["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(!text.contains('\u{fffd}'), "{text:?}");
    assert_eq!(text, valid, "cut after {n} tokens");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    s.shutdown().await.unwrap();
}

/// A forced call's opening ends where the template's rendering of the call goes on
/// with the value, so the next turn (the call resent in the history) reuses every
/// token the session holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_tool_call_is_reused_on_the_next_turn() {
    let Some(s) = serve(QWEN).await else { return };
    let url = format!("{}/v1/chat/completions", s.base_url());
    let mut messages = vec![json!({"role": "user", "content": "What is the weather in Paris?"})];
    let choice = json!({"type": "function", "function": {"name": "get_weather"}});
    let (status, _, v) = post(
        &url,
        &json!({"messages": messages, "tools": [weather_tool()], "tool_choice": choice, "max_tokens": 40, "temperature": 0}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    let msg = &v["choices"][0]["message"];
    let call = &msg["tool_calls"][0];
    assert_eq!(call["function"]["name"], "get_weather", "{v}");
    let (p1, c1) = (
        v["usage"]["prompt_tokens"].as_u64().unwrap(),
        v["usage"]["completion_tokens"].as_u64().unwrap(),
    );
    messages.push(msg.clone());
    messages.push(json!({"role": "tool", "tool_call_id": call["id"], "content": "Sunny, 21 °C."}));
    let (status, _, v) = post(
        &url,
        &json!({"messages": messages, "tools": [weather_tool()], "max_tokens": 8, "temperature": 0}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    let cached = v["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(
        cached >= p1 + c1 - 1,
        "turn 2 reused {cached} tokens; the session held {p1} + {c1}: {v}"
    );
    s.shutdown().await.unwrap();
}

/// Anthropic messages with `role: "system"` are system text at their position: the
/// prompt equals OpenAI chat's for the same messages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_system_messages_are_system_text() {
    let Some(s) = serve(SMOLLM2).await else {
        return;
    };
    let base = s.base_url();
    let messages = json!([{"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Hello!"},
        {"role": "system", "content": "From now on, answer in French."}, {"role": "user", "content": "How are you?"}]);
    let (status, _, a) = post(
        &format!("{base}/v1/messages"),
        &json!({"max_tokens": 4, "temperature": 0, "messages": messages}),
    )
    .await;
    assert_eq!(status, 200, "{a}");
    let (status, _, o) = post(
        &format!("{base}/v1/chat/completions"),
        &json!({"max_tokens": 4, "temperature": 0, "messages": messages}),
    )
    .await;
    assert_eq!(status, 200, "{o}");
    let anthropic_prompt = a["usage"]["input_tokens"].as_u64().unwrap()
        + a["usage"]["cache_read_input_tokens"].as_u64().unwrap();
    assert_eq!(
        anthropic_prompt,
        o["usage"]["prompt_tokens"].as_u64().unwrap()
    );
    assert_eq!(
        a["content"][0]["text"], o["choices"][0]["message"]["content"],
        "the same prompt, the same greedy answer"
    );
    s.shutdown().await.unwrap();
}

/// Constraints the server does not implement are refused with a 400 naming the field;
/// their no-op values pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unimplemented_constraints_are_refused_by_name() {
    let Some(s) = serve(SMOLLM2).await else {
        return;
    };
    let base = s.base_url();
    let chat = |extra: Value| {
        let mut b = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b
    };
    for (extra, param) in [
        (
            json!({"response_format": {"type": "json_object"}}),
            "response_format",
        ),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}}),
            "response_format",
        ),
        (json!({"logit_bias": {"42": 5}}), "logit_bias"),
        (json!({"presence_penalty": 0.5}), "presence_penalty"),
        (json!({"frequency_penalty": 1.0}), "frequency_penalty"),
    ] {
        let (status, _, v) =
            post(&format!("{base}/v1/chat/completions"), &chat(extra.clone())).await;
        assert_eq!(status, 400, "{extra}: {v}");
        assert_eq!(v["error"]["param"], param, "{v}");
    }
    let (status, _, v) = post(
        &format!("{base}/v1/responses"),
        &json!({"input": "Hi", "text": {"format": {"type": "json_schema", "name": "x", "schema": {}}}}),
    )
    .await;
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["param"], "text.format");
    let (status, _, v) = post(
        &format!("{base}/v1/chat/completions"),
        &chat(json!({"response_format": {"type": "text"}, "logit_bias": {}, "presence_penalty": 0, "parallel_tool_calls": true})),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    s.shutdown().await.unwrap();
}

/// `parallel_tool_calls: false`: one call at most, and generation ends after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_tool_calls_false_returns_one_call() {
    let Some(s) = serve(QWEN).await else { return };
    let url = format!("{}/v1/chat/completions", s.base_url());
    let body = |parallel: bool| {
        json!({"messages": [{"role": "user", "content": "Get the weather in Paris, in London and in Rome."}],
            "tools": [weather_tool()], "tool_choice": "required", "max_tokens": 120, "temperature": 0,
            "parallel_tool_calls": parallel})
    };
    let (status, _, many) = post(&url, &body(true)).await;
    assert_eq!(status, 200, "{many}");
    let (status, _, one) = post(&url, &body(false)).await;
    assert_eq!(status, 200, "{one}");
    let calls = one["choices"][0]["message"]["tool_calls"]
        .as_array()
        .unwrap();
    assert_eq!(calls.len(), 1, "{one}");
    assert_eq!(one["choices"][0]["finish_reason"], "tool_calls");
    // The same first call as without the limit, and no tokens after it.
    assert_eq!(
        calls[0]["function"],
        many["choices"][0]["message"]["tool_calls"][0]["function"]
    );
    let n_many = many["choices"][0]["message"]["tool_calls"]
        .as_array()
        .unwrap()
        .len();
    eprintln!(
        "parallel: {n_many} calls in {} tokens; single: 1 call in {} tokens",
        many["usage"]["completion_tokens"], one["usage"]["completion_tokens"]
    );
    assert!(
        one["usage"]["completion_tokens"].as_u64() <= many["usage"]["completion_tokens"].as_u64()
    );
    s.shutdown().await.unwrap();
}

/// An answer beginning with "<" (a reasoning block does) resent as empty text diverges
/// from the session inside a special token (`<|im_end|>` right after the assistant
/// header). The reused prefix must end at a canonical token boundary: the prompt is
/// the canonical one (its size equals `count_tokens`), and `<|im_end|>` stays a special
/// token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_resent_as_empty_text_keeps_the_canonical_prompt() {
    for file in [SMOLLM2, QWEN] {
        let Some(s) = serve(file).await else { return };
        let base = s.base_url();
        // The answer begins with "<" (a prefill), as a reasoning block would: the
        // session's text then shares "<" with the resent "<|im_end|>".
        let first = json!([{"role": "user", "content": "Write an HTML tag."}, {"role": "assistant", "content": "<"}]);
        let (status, _, v) = post(
            &format!("{base}/v1/messages"),
            &json!({"max_tokens": 6, "temperature": 0, "messages": first}),
        )
        .await;
        assert_eq!(status, 200, "{v}");
        let second = json!([{"role": "user", "content": "Write an HTML tag."},
            {"role": "assistant", "content": ""}, {"role": "user", "content": "Thanks. Now say no."}]);
        let (status, _, count) = post(
            &format!("{base}/v1/messages/count_tokens"),
            &json!({"messages": second}),
        )
        .await;
        assert_eq!(status, 200, "{count}");
        let (status, _, v) = post(
            &format!("{base}/v1/messages"),
            &json!({"max_tokens": 6, "temperature": 0, "messages": second}),
        )
        .await;
        assert_eq!(status, 200, "{v}");
        let prompt = v["usage"]["input_tokens"].as_u64().unwrap()
            + v["usage"]["cache_read_input_tokens"].as_u64().unwrap();
        assert_eq!(
            prompt,
            count["input_tokens"].as_u64().unwrap(),
            "{file}: {v}"
        );
        assert!(v["usage"]["cache_read_input_tokens"].as_u64().unwrap() > 0);
        let text = v["content"][0]["text"].as_str().unwrap();
        assert!(!text.contains("<|im_end|>"), "{file}: {text:?}");
        s.shutdown().await.unwrap();
    }
}
