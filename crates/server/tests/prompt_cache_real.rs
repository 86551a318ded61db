//! The multi-conversation prompt cache with the real models (SmolLM2-135M,
//! Qwen2.5-Coder-0.5B): interleaved conversations from concurrent clients reuse their
//! own prefixes; a temperature-0 request gives the same tokens cold, after a rewind,
//! after other conversations ran in between, and after a restart restores it from disk;
//! corrupted, truncated and foreign checkpoints are ignored (prefill, same answer).
//!
//! Skips (with a message) when a model file is absent.

#![cfg(feature = "engine")]

mod common;

use std::path::{Path, PathBuf};

use common::{engine_server, metric, open_model, post};
use ds4_http::session_cache::CacheConfig;
use ds4_http::{ServerConfig, ServerHandle};
use serde_json::{Value, json};

const SMOLLM2: &str = "smollm2-135m-instruct-q4_1.gguf";
const QWEN: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf";
const N_CTX: usize = 2048;

fn config(mem: u64, dir: Option<&Path>) -> ServerConfig {
    ServerConfig {
        queue: 16,
        cache: CacheConfig {
            mem_budget: mem,
            dir: dir.map(Path::to_path_buf),
            disk_max: 1 << 30,
        },
        ..Default::default()
    }
}

async fn serve(file: &str, config: ServerConfig) -> Option<ServerHandle> {
    let lm = open_model(file)?;
    Some(engine_server(lm, N_CTX, config).await)
}

/// A fresh directory under the target's temporary directory.
fn temp_dir(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("prompt-cache-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// An agent-style system prompt shared by nothing else (about 200 tokens).
fn system(i: usize) -> String {
    let mut s = format!(
        "You are assistant number {i}, a careful coding agent in repository {i}. Read files before \
         editing them, prefer small reviewable changes, explain each change in one sentence, run \
         the tests after every change and report failures verbatim.\n"
    );
    for r in 0..7 {
        s.push_str(&format!(
            "Rule {r} for agent {i}: keep the formatting and lint rules of module {r}; never \
             invent file contents.\n"
        ));
    }
    s
}

/// Eight conversations of four turns, one client each, all at once: after each
/// conversation's first turn, at least 85% of the prompt tokens are reused (each
/// conversation's state survives the others in between).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn interleaved_conversations_reuse_their_own_prefixes() {
    let Some(s) = serve(SMOLLM2, config(1 << 30, None)).await else {
        return;
    };
    let url = format!("{}/v1/chat/completions", s.base_url());
    let tasks: Vec<_> = (0..8)
        .map(|c| {
            let url = url.clone();
            tokio::spawn(async move {
                let mut messages = vec![json!({"role": "system", "content": system(c)})];
                let mut later = (0u64, 0u64);
                for turn in 0..4 {
                    messages.push(
                        json!({"role": "user", "content": format!("Turn {turn}: what next?")}),
                    );
                    let (status, _, v) = post(
                        &url,
                        &json!({"messages": messages, "max_tokens": 8, "temperature": 0}),
                    )
                    .await;
                    assert_eq!(status, 200, "{v}");
                    if turn > 0 {
                        later.0 += v["usage"]["prompt_tokens"].as_u64().unwrap();
                        later.1 += v["usage"]["prompt_tokens_details"]["cached_tokens"]
                            .as_u64()
                            .unwrap();
                    }
                    let mut reply = v["choices"][0]["message"].clone();
                    if reply["content"].is_null() {
                        reply["content"] = json!("");
                    }
                    messages.push(reply);
                }
                later
            })
        })
        .collect();
    let (mut prompt, mut cached) = (0, 0);
    for t in tasks {
        let (p, c) = t.await.unwrap();
        prompt += p;
        cached += c;
    }
    let share = cached as f64 / prompt as f64;
    let base = s.base_url();
    eprintln!(
        "turns 2-4 of 8 interleaved conversations: {cached} of {prompt} prompt tokens reused ({:.1}%); memory hits {}, evictions {}",
        100.0 * share,
        metric(&base, "ds4_cache_hits_memory_total").await,
        metric(&base, "ds4_cache_evictions_total").await
    );
    assert!(share >= 0.85, "{:.3} reused", share);
    assert!(metric(&base, "ds4_cache_hits_memory_total").await > 0.0);
    assert!(metric(&base, "ds4_cache_memory_bytes").await > 0.0);
    s.shutdown().await.unwrap();
}

/// The request every determinism check sends: a two-turn conversation.
fn request() -> Value {
    json!({"messages": [
        {"role": "system", "content": "You are a concise assistant."},
        {"role": "user", "content": "Name three colors."},
        {"role": "assistant", "content": "Red, green and blue."},
        {"role": "user", "content": "And three fruits?"}],
        "max_tokens": 24, "temperature": 0, "logprobs": true})
}

/// Another conversation, to run in between.
fn other(i: usize) -> Value {
    json!({"messages": [{"role": "user", "content": format!("Write a haiku about the number {i}.")}],
        "max_tokens": 8, "temperature": 0})
}

/// The answer's tokens (and cached count) of `body`.
async fn tokens_of(base: &str, body: &Value) -> (Vec<String>, u64) {
    let (status, _, v) = post(&format!("{base}/v1/chat/completions"), body).await;
    assert_eq!(status, 200, "{v}");
    let tokens = v["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["token"].as_str().unwrap().to_string())
        .collect();
    let cached = v["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    (tokens, cached)
}

/// The same temperature-0 request gives the same tokens cold, after a rewind (the
/// same request again: the session holds more, so it rewinds and evaluates the last
/// prompt token alone), after other conversations in between (restored from memory)
/// and after a restart (restored from disk), on both models.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_request_gives_the_same_tokens_however_it_is_served() {
    for file in [SMOLLM2, QWEN] {
        let dir = temp_dir(&format!("same-{}", &file[..6]));
        let Some(s) = serve(file, config(1 << 30, Some(&dir))).await else {
            return;
        };
        let base = s.base_url();
        let (cold, c0) = tokens_of(&base, &request()).await;
        assert_eq!(c0, 0);
        let (rewound, c1) = tokens_of(&base, &request()).await;
        assert!(c1 > 0);
        assert_eq!(rewound, cold, "{file}: after a rewind");
        for i in 0..3 {
            let (status, _, v) = post(&format!("{base}/v1/chat/completions"), &other(i)).await;
            assert_eq!(status, 200, "{v}");
        }
        let (restored, c2) = tokens_of(&base, &request()).await;
        assert!(c2 > 0);
        assert_eq!(restored, cold, "{file}: restored from memory");
        assert!(metric(&base, "ds4_cache_hits_memory_total").await >= 1.0);
        // Another conversation last, then a restart: the request's state comes from
        // disk.
        let (status, _, _) = post(&format!("{base}/v1/chat/completions"), &other(9)).await;
        assert_eq!(status, 200);
        s.shutdown().await.unwrap();
        let s = serve(file, config(1 << 30, Some(&dir))).await.unwrap();
        let base = s.base_url();
        let t0 = std::time::Instant::now();
        let (from_disk, c3) = tokens_of(&base, &request()).await;
        let warm = t0.elapsed();
        assert_eq!(from_disk, cold, "{file}: restored from disk");
        assert!(c3 > 0, "{file}: nothing reused after the restart");
        assert_eq!(metric(&base, "ds4_cache_hits_disk_total").await, 1.0);
        eprintln!("{file}: {c3} prompt tokens restored from disk, request {warm:.2?}");
        s.shutdown().await.unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// The checkpoint files of a directory.
fn checkpoints(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "ds4c"))
        .collect();
    v.sort();
    v
}

fn copy_dir(from: &Path, name: &str) -> PathBuf {
    let to = temp_dir(name);
    for p in checkpoints(from) {
        std::fs::copy(&p, to.join(p.file_name().unwrap())).unwrap();
    }
    to
}

/// A checkpoint with a flipped byte, a truncated one, and one of another model are
/// ignored: the request is prefilled and answered as cold, and the server goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupted_and_foreign_checkpoints_fall_back_to_prefill() {
    let dir = temp_dir("good");
    let Some(s) = serve(SMOLLM2, config(1 << 30, Some(&dir))).await else {
        return;
    };
    let (cold, _) = tokens_of(&s.base_url(), &request()).await;
    s.shutdown().await.unwrap();
    assert_eq!(checkpoints(&dir).len(), 1);

    let flipped = copy_dir(&dir, "flipped");
    let f = &checkpoints(&flipped)[0];
    let mut bytes = std::fs::read(f).unwrap();
    let at = bytes.len() - 100;
    bytes[at] ^= 0x40;
    std::fs::write(f, bytes).unwrap();

    let truncated = copy_dir(&dir, "truncated");
    let f = &checkpoints(&truncated)[0];
    let bytes = std::fs::read(f).unwrap();
    std::fs::write(f, &bytes[..bytes.len() / 2]).unwrap();

    let header = copy_dir(&dir, "header");
    let f = &checkpoints(&header)[0];
    let mut bytes = std::fs::read(f).unwrap();
    bytes[40] ^= 0x01;
    std::fs::write(f, bytes).unwrap();

    for (name, d) in [
        ("flipped byte", &flipped),
        ("truncated", &truncated),
        ("header byte", &header),
    ] {
        let s = serve(SMOLLM2, config(1 << 30, Some(d))).await.unwrap();
        let (tokens, cached) = tokens_of(&s.base_url(), &request()).await;
        assert_eq!(cached, 0, "{name}: nothing may come from a corrupted file");
        assert_eq!(tokens, cold, "{name}");
        assert_eq!(common::health(&s.base_url()).await["status"], "ok");
        s.shutdown().await.unwrap();
    }

    // Checkpoints of another model in the directory: ignored, and left alone.
    let foreign = temp_dir("foreign");
    if let Some(q) = serve(QWEN, config(1 << 30, Some(&foreign))).await {
        let _ = tokens_of(&q.base_url(), &request()).await;
        q.shutdown().await.unwrap();
        let qwen_files = checkpoints(&foreign);
        assert_eq!(qwen_files.len(), 1);
        let s = serve(SMOLLM2, config(1 << 30, Some(&foreign)))
            .await
            .unwrap();
        let (tokens, cached) = tokens_of(&s.base_url(), &request()).await;
        assert_eq!(cached, 0);
        assert_eq!(tokens, cold, "foreign checkpoint");
        s.shutdown().await.unwrap();
        assert!(
            qwen_files.iter().all(|p| p.exists()),
            "foreign files are kept"
        );
    }
    for d in [dir, flipped, truncated, header, foreign] {
        let _ = std::fs::remove_dir_all(d);
    }
}

/// Restoring a long conversation's state from memory and from disk against
/// evaluating its prompt again (printed; the test asserts only that restores are
/// faster than re-prefilling).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restoring_beats_prefilling() {
    let dir = temp_dir("timing");
    let Some(s) = serve(SMOLLM2, config(1 << 30, Some(&dir))).await else {
        return;
    };
    let base = s.base_url();
    let long = json!({"messages": [{"role": "system", "content": system(0).repeat(3)},
        {"role": "user", "content": "Summarize the rules."}], "max_tokens": 1, "temperature": 0});
    let url = format!("{base}/v1/chat/completions");
    let timing = |v: &Value| v["timings"]["prefill_ms"].as_f64().unwrap_or(0.0);
    let (_, _, cold) = post(&url, &long).await;
    let prompt = cold["usage"]["prompt_tokens"].as_u64().unwrap();
    let (_, _, _) = post(&url, &other(1)).await;
    let t0 = std::time::Instant::now();
    let (_, _, warm) = post(&url, &long).await;
    let memory_ms = t0.elapsed().as_secs_f64() * 1e3;
    s.shutdown().await.unwrap();
    let s = serve(SMOLLM2, config(1 << 30, Some(&dir))).await.unwrap();
    let url = format!("{}/v1/chat/completions", s.base_url());
    let t0 = std::time::Instant::now();
    let (_, _, disk) = post(&url, &long).await;
    let disk_ms = t0.elapsed().as_secs_f64() * 1e3;
    eprintln!(
        "{prompt}-token prompt: prefill {:.1} ms; request restored from memory {memory_ms:.1} ms (prefill {:.1} ms), from disk {disk_ms:.1} ms (prefill {:.1} ms)",
        timing(&cold),
        timing(&warm),
        timing(&disk)
    );
    assert!(
        warm["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
            + 1
            >= prompt
    );
    assert!(
        disk["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
            + 1
            >= prompt
    );
    assert!(memory_ms < timing(&cold) && disk_ms < timing(&cold));
    s.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
