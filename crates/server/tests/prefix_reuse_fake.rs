//! Prompt-prefix reuse across stateless requests, with the toy model whose tokenizer
//! merges "Hello" and " world" while the model generates them byte by byte — so a
//! re-tokenized answer never matches the generated ids, as with real BPE models.

mod common;

use common::{fake_server, metric, post};
use ds4_http::ServerConfig;
use ds4_http::fake::FakeConfig;
use serde_json::json;

/// A coding agent's system prompt (about 1.5 kB).
pub fn agent_system_prompt() -> String {
    let mut s = String::from(
        "You are a coding agent working in a git repository. Read files before editing them. \
         Prefer small, reviewable changes. Run the tests after every change and report failures \
         verbatim. Never invent file contents. When a command fails, read its output and fix the \
         cause rather than retrying blindly. Keep answers short.\n\nRules:\n",
    );
    for i in 1..=12 {
        s.push_str(&format!(
            "{i}. Rule number {i}: respect the project's style guide and its tests.\n"
        ));
    }
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_turn_agent_conversation_reuses_the_prefix() {
    let fake = FakeConfig {
        n_ctx: 32768,
        supports_tools: true,
        ..FakeConfig::replying(|p| {
            let turn = p.matches("<|im_start|>tool").count();
            if turn.is_multiple_of(2) {
                format!(
                    "<tool_call>\n{{\"name\": \"read_file\", \"arguments\": {{\"path\": \"src/f{turn}.rs\"}}}}\n</tool_call>"
                )
            } else {
                format!("Hello world: step {turn} looks fine.")
            }
        })
    };
    let s = fake_server(fake, ServerConfig::default()).await;
    let url = format!("{}/v1/chat/completions", s.base_url());
    let tools = json!([{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}]);
    let mut messages = vec![
        json!({"role": "system", "content": agent_system_prompt()}),
        json!({"role": "user", "content": "Fix the failing test."}),
    ];
    let mut previous: Option<(u64, u64)> = None;
    for turn in 0..20 {
        let (status, _, v) = post(
            &url,
            &json!({"model": "fake-model", "messages": messages, "tools": tools, "seed": turn}),
        )
        .await;
        assert_eq!(status, 200, "{v}");
        let usage = &v["usage"];
        let prompt = usage["prompt_tokens"].as_u64().unwrap();
        let cached = usage["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap();
        if let Some((prev_prompt, prev_completion)) = previous {
            let ratio = cached as f64 / prompt as f64;
            assert!(
                ratio >= 0.9,
                "turn {turn}: {cached} of {prompt} prompt tokens cached ({ratio:.3})"
            );
            // Everything the session held (the previous prompt and answer, but its end
            // token) was reused, although the answer re-tokenizes differently.
            assert!(
                cached >= prev_prompt + prev_completion,
                "turn {turn}: cached {cached} < {prev_prompt} + {prev_completion}"
            );
        }
        previous = Some((prompt, usage["completion_tokens"].as_u64().unwrap()));
        let msg = v["choices"][0]["message"].clone();
        let calls = msg["tool_calls"].as_array().cloned().unwrap_or_default();
        messages.push(msg);
        if let Some(call) = calls.first() {
            messages.push(json!({"role": "tool", "tool_call_id": call["id"], "content": format!("fn f{turn}() {{}}")}));
        } else {
            messages.push(json!({"role": "user", "content": "Continue."}));
        }
    }
    // The metrics show it too: cached tokens dominate the prompt tokens.
    let base = s.base_url();
    let (prompt, cached, prefilled) = (
        metric(&base, "ds4_prompt_tokens_total").await,
        metric(&base, "ds4_cached_prompt_tokens_total").await,
        metric(&base, "ds4_prefill_tokens_total").await,
    );
    assert!(cached / prompt > 0.9, "{cached} of {prompt}");
    assert!(
        prefilled < 0.1 * prompt + 1600.0,
        "prefilled {prefilled} of {prompt}"
    );
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resent_reasoning_and_edited_answers_degrade_gracefully() {
    let fake = FakeConfig::replying(|_| "<think>Short thought.</think>Hello world again".into());
    let s = fake_server(fake, ServerConfig::default()).await;
    let url = format!("{}/v1/chat/completions", s.base_url());
    let sys = json!({"role": "system", "content": agent_system_prompt()});
    let (_, _, v) = post(
        &url,
        &json!({"messages": [sys, {"role": "user", "content": "Hi"}]}),
    )
    .await;
    let m = &v["choices"][0]["message"];
    assert_eq!(m["content"], "Hello world again");
    let first_prompt = v["usage"]["prompt_tokens"].as_u64().unwrap();
    // The client resends the answer without its reasoning (the toy template drops it):
    // the rendered history differs from what was generated right after the prompt, so
    // the reuse stops there — and no further.
    let (_, _, v2) = post(
        &url,
        &json!({"messages": [sys, {"role": "user", "content": "Hi"}, {"role": "assistant", "content": m["content"], "reasoning_content": m["reasoning_content"]}, {"role": "user", "content": "More"}]}),
    )
    .await;
    let cached = v2["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert_eq!(cached, first_prompt, "{v2}");
    s.shutdown().await.unwrap();
}
