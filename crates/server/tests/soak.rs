//! Soak: many mixed requests from concurrent clients on loopback — chat (plain and
//! streamed), Anthropic messages, Responses, completions, bad requests and clients
//! that disconnect mid-stream — bounded in request count. Every answer has the
//! expected status and shape, and the server is healthy at the end.
//!
//! The normal suite runs a short soak against the toy model, and one with 64 clients
//! whose prompt cache is under memory and disk pressure (every parked state evicted to
//! disk, files evicted past a small disk budget): no failure, resident memory bounded,
//! no 429 while the queue holds every client. `soak_long` (ignored) runs for a few
//! minutes: `cargo test -p ds4-http --release --test soak -- --ignored`.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{client, fake_server, health, parse_sse, post, post_text};
use ds4_http::fake::{FakeConfig, last_user_message};
use ds4_http::{ServerConfig, ServerHandle};
use futures_util::StreamExt;
use serde_json::{Value, json};

/// Sends request number `i` of the mix; panics on an unexpected answer. Returns the
/// status.
async fn one(base: &str, i: usize) -> u16 {
    let user = format!("request {i}");
    let chat = format!("{base}/v1/chat/completions");
    match i % 7 {
        0 => {
            let body = json!({"messages": [{"role": "user", "content": user}], "max_tokens": 24});
            let (status, _, v) = post(&chat, &body).await;
            assert!(
                status == 200 && v["choices"][0]["message"]["content"].is_string()
                    || status == 429 && v.is_object(),
                "{status} {v}"
            );
            status
        }
        1 => {
            let body = json!({"messages": [{"role": "user", "content": user}], "max_tokens": 24, "stream": true});
            let (status, _, text) = post_text(&chat, &body).await;
            assert!(
                status == 200 && parse_sse(&text).0.last().unwrap().data == "[DONE]"
                    || status == 429,
                "{status} {text}"
            );
            status
        }
        2 => {
            let body = json!({"max_tokens": 24, "stream": i.is_multiple_of(2), "messages": [{"role": "user", "content": user}]});
            let (status, _, _) = post_text(&format!("{base}/v1/messages"), &body).await;
            assert!(status == 200 || status == 429, "{status}");
            status
        }
        3 => {
            let body = json!({"input": user, "max_output_tokens": 24});
            let (status, _, v) = post(&format!("{base}/v1/responses"), &body).await;
            assert!(
                status == 200 && v["object"] == "response" || status == 429 && v.is_object(),
                "{status} {v}"
            );
            status
        }
        4 => {
            let body = json!({"prompt": user, "max_tokens": 8});
            let (status, _, _) = post_text(&format!("{base}/v1/completions"), &body).await;
            assert!(matches!(status, 200 | 429));
            status
        }
        5 => {
            // A bad request: 400 in the right shape, without touching the engine.
            let r = client()
                .post(&chat)
                .body("{\"messages\": 5}")
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 400);
            let v: Value = r.json().await.unwrap();
            assert!(v["error"]["message"].is_string());
            400
        }
        _ => {
            // A client that leaves after the first chunk.
            let body = json!({"messages": [{"role": "user", "content": user}], "max_tokens": 200, "stream": true});
            let r = client().post(&chat).json(&body).send().await.unwrap();
            let status = r.status().as_u16();
            if status == 200 {
                let mut s = r.bytes_stream();
                let _ = s.next().await;
            }
            status
        }
    }
}

/// Runs the mix; returns (requests sent, answered 200).
async fn soak(
    server: &ServerHandle,
    clients: usize,
    requests: usize,
    budget: Duration,
) -> (usize, usize) {
    let base = server.base_url();
    let t0 = Instant::now();
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let ok = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let (base, next, ok) = (base.clone(), next.clone(), ok.clone());
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if i >= requests || t0.elapsed() > budget {
                        return;
                    }
                    match one(&base, i).await {
                        200 => {
                            ok.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                        // Back off like a client honouring Retry-After (shortened).
                        429 => tokio::time::sleep(Duration::from_millis(50)).await,
                        _ => {}
                    }
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(health(&base).await["status"], "ok");
    let (status, _, _) = post(
        &format!("{base}/v1/chat/completions"),
        &json!({"messages": [{"role": "user", "content": "final"}], "max_tokens": 8}),
    )
    .await;
    assert_eq!(status, 200);
    (
        next.load(std::sync::atomic::Ordering::Relaxed)
            .min(requests),
        ok.load(std::sync::atomic::Ordering::Relaxed),
    )
}

fn toy() -> FakeConfig {
    FakeConfig {
        token_delay: Duration::from_micros(300),
        ..FakeConfig::replying(|p| format!("Answer to {}.", last_user_message(p)).repeat(3))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn soak_short() {
    // The queue holds every client, so only the deliberate bad requests (1 in 7) fail.
    let s = fake_server(
        toy(),
        ServerConfig {
            queue: 8,
            ..Default::default()
        },
    )
    .await;
    // The budget only bounds a hung run; a loaded machine may need minutes.
    let (done, ok) = soak(&s, 8, 350, Duration::from_secs(600)).await;
    assert_eq!(done, 350);
    assert_eq!(ok, 300, "every request but the 50 bad ones answered 200");
    s.shutdown().await.unwrap();
}

/// Resident memory of this process in KiB (Linux), if known.
fn rss_kib() -> Option<u64> {
    std::fs::read_to_string("/proc/self/status")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn soak_cache_pressure() {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("soak-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let s = fake_server(
        toy(),
        ServerConfig {
            queue: 64,
            cache: ds4_http::session_cache::CacheConfig {
                mem_budget: 1024,
                dir: Some(dir.clone()),
                disk_max: 16 << 10,
            },
            ..Default::default()
        },
    )
    .await;
    // A first round to reach a steady state, then the measured one.
    let (done, ok) = soak(&s, 64, 140, Duration::from_secs(120)).await;
    assert_eq!((done, ok), (140, 120));
    let before = rss_kib();
    let (done, ok) = soak(&s, 64, 700, Duration::from_secs(300)).await;
    let after = rss_kib();
    assert_eq!(done, 700);
    assert_eq!(
        ok, 600,
        "every request but the 100 bad ones answered 200, no 429"
    );
    let base = s.base_url();
    let evictions = common::metric(&base, "ds4_cache_evictions_total").await;
    let disk_evictions = common::metric(&base, "ds4_cache_disk_evictions_total").await;
    let disk_bytes = common::metric(&base, "ds4_cache_disk_bytes").await;
    eprintln!(
        "cache pressure: {evictions} evictions to disk, {disk_evictions} files deleted, {disk_bytes} bytes on disk; RSS {before:?} -> {after:?} KiB"
    );
    assert!(evictions > 100.0 && disk_evictions > 100.0);
    assert!(disk_bytes <= (16 << 10) as f64);
    if let (Some(b), Some(a)) = (before, after) {
        assert!(
            a < b + 64 * 1024,
            "resident memory grew from {b} to {a} KiB"
        );
    }
    s.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// The long soak's server: SmolLM2 when it is available (and the `engine` feature is
/// on), else the toy model with a realistic token delay.
async fn long_soak_server(config: ServerConfig) -> ServerHandle {
    #[cfg(feature = "engine")]
    {
        let path = ds4_testkit::models_dir().join("smollm2-135m-instruct-q4_1.gguf");
        if path.is_file() {
            let lm = ds4_engine::LoadedModel::open(&path).expect("model loads");
            eprintln!("soak: SmolLM2-135M on the CPU engine");
            return common::engine_server(lm, 4096, config).await;
        }
    }
    eprintln!("soak: the toy model (SmolLM2 not available)");
    fake_server(
        FakeConfig {
            token_delay: Duration::from_millis(2),
            ..toy()
        },
        config,
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "minutes long; run with --ignored"]
async fn soak_long() {
    // The queue holds every client, so only the deliberate bad requests (1 in 7) fail.
    let s = long_soak_server(ServerConfig {
        queue: 16,
        ..Default::default()
    })
    .await;
    let t0 = Instant::now();
    let (done, ok) = soak(&s, 12, 700, Duration::from_secs(600)).await;
    eprintln!(
        "soak: {done} requests in {:.0} s, {ok} answered 200",
        t0.elapsed().as_secs_f64()
    );
    assert_eq!(done, 700, "the time budget ran out");
    assert_eq!(ok, 600, "every request but the 100 bad ones answered 200");
    s.shutdown().await.unwrap();
}
