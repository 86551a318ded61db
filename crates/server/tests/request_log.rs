//! The request log line of a streamed completion counts the whole generation, not only
//! the time to its headers. (One test in this file: it installs the process's tracing
//! subscriber.)

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{fake_server, post_sse};
use ds4_http::ServerConfig;
use ds4_http::fake::FakeConfig;
use serde_json::json;

/// The log output, shared with the test.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
    type Writer = Captured;

    fn make_writer(&'a self) -> Captured {
        self.clone()
    }
}

/// The `ms` of the first `request` line for `path`, once it is written.
async fn logged_ms(log: &Captured, path: &str) -> u64 {
    let t0 = Instant::now();
    loop {
        let text = String::from_utf8_lossy(&log.0.lock().unwrap()).into_owned();
        let line = text
            .lines()
            .find(|l| l.contains("request") && l.contains(&format!("path={path}")));
        if let Some(l) = line {
            let ms = l.split("ms=").nth(1).expect("an ms field");
            return ms
                .split_whitespace()
                .next()
                .unwrap()
                .parse()
                .expect("whole ms");
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "no request line for {path}:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_completion_is_logged_after_its_last_token() {
    let log = Captured::default();
    tracing_subscriber::fmt()
        .with_writer(log.clone())
        .with_ansi(false)
        .init();
    // "Hello world", one token per 50 ms: at least 500 ms of generation after the headers.
    let fake = FakeConfig {
        token_delay: Duration::from_millis(50),
        ..Default::default()
    };
    let s = fake_server(fake, ServerConfig::default()).await;
    let url = format!("{}/v1/chat/completions", s.base_url());
    let body = json!({"messages": [{"role": "user", "content": "hi"}], "stream": true});
    let (status, events, _) = post_sse(&url, &body).await;
    assert_eq!(status, 200);
    let tokens = events.len() - 1;
    assert!(tokens >= 10, "{tokens} streamed events");
    let ms = logged_ms(&log, "/v1/chat/completions").await;
    assert!(
        ms >= 500,
        "logged {ms} ms for {tokens} tokens of 50 ms each"
    );
}
