//! Server metrics in the Prometheus text exposition format (version 0.0.4): request
//! counts by endpoint and status, prompt / cached / prefilled / generated tokens,
//! prefill and decode time and speed, queue depth, and time to first token.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds (seconds) of the time-to-first-token histogram buckets.
const TTFT_BUCKETS: [f64; 11] = [0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0];

#[derive(Default)]
struct Histogram {
    counts: [u64; TTFT_BUCKETS.len()],
    count: u64,
    sum: f64,
}

/// All counters; shared by the HTTP side and the worker.
#[derive(Default)]
pub struct Metrics {
    requests: Mutex<BTreeMap<(String, u16), u64>>,
    prompt_tokens: AtomicU64,
    cached_tokens: AtomicU64,
    prefill_tokens: AtomicU64,
    generated_tokens: AtomicU64,
    /// Microseconds.
    prefill_us: AtomicU64,
    decode_us: AtomicU64,
    /// f64 bits of the last measured speeds.
    last_prefill_tps: AtomicU64,
    last_decode_tps: AtomicU64,
    rejected: AtomicU64,
    cancelled: AtomicU64,
    ttft: Mutex<Histogram>,
}

/// Point-in-time values the metrics page reads from elsewhere.
#[derive(Debug, Clone, Copy, Default)]
pub struct Gauges {
    pub queue_depth: usize,
    pub busy: bool,
    pub session_tokens: usize,
    pub n_ctx: usize,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Metrics {
    pub fn new() -> Self {
        Self::default()
    }

    /// One finished HTTP request.
    pub fn record_request(&self, endpoint: &str, status: u16) {
        *lock(&self.requests)
            .entry((endpoint.to_string(), status))
            .or_insert(0) += 1;
    }

    /// A request refused because the queue was full.
    pub fn record_rejected(&self) {
        self.rejected.fetch_add(1, Ordering::Relaxed);
    }

    /// A generation cancelled (client gone or shutdown).
    pub fn record_cancelled(&self) {
        self.cancelled.fetch_add(1, Ordering::Relaxed);
    }

    /// A prompt brought into the session: its size, tokens reused, tokens evaluated and
    /// the evaluation time.
    pub fn record_prefill(
        &self,
        prompt: usize,
        cached: usize,
        evaluated: usize,
        time: Option<Duration>,
    ) {
        self.prompt_tokens
            .fetch_add(prompt as u64, Ordering::Relaxed);
        self.cached_tokens
            .fetch_add(cached as u64, Ordering::Relaxed);
        self.prefill_tokens
            .fetch_add(evaluated as u64, Ordering::Relaxed);
        if let Some(t) = time {
            self.prefill_us
                .fetch_add(t.as_micros() as u64, Ordering::Relaxed);
            if t.as_secs_f64() > 0.0 {
                let tps = evaluated as f64 / t.as_secs_f64();
                self.last_prefill_tps
                    .store(tps.to_bits(), Ordering::Relaxed);
            }
        }
    }

    /// Tokens generated and the decode time (first to last sampled token).
    pub fn record_decode(&self, generated: usize, time: Option<Duration>) {
        self.generated_tokens
            .fetch_add(generated as u64, Ordering::Relaxed);
        if let Some(t) = time {
            self.decode_us
                .fetch_add(t.as_micros() as u64, Ordering::Relaxed);
            if t.as_secs_f64() > 0.0 && generated > 1 {
                let tps = (generated - 1) as f64 / t.as_secs_f64();
                self.last_decode_tps.store(tps.to_bits(), Ordering::Relaxed);
            }
        }
    }

    /// Time from a request's arrival in the queue to its first generated token.
    pub fn record_ttft(&self, t: Duration) {
        let s = t.as_secs_f64();
        let mut h = lock(&self.ttft);
        for (i, b) in TTFT_BUCKETS.iter().enumerate() {
            if s <= *b {
                h.counts[i] += 1;
            }
        }
        h.count += 1;
        h.sum += s;
    }

    /// Total prompt tokens and cached prompt tokens so far.
    pub fn prompt_totals(&self) -> (u64, u64) {
        (
            self.prompt_tokens.load(Ordering::Relaxed),
            self.cached_tokens.load(Ordering::Relaxed),
        )
    }

    /// The exposition text.
    pub fn render(&self, g: Gauges) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "# HELP ds4_requests_total HTTP requests by endpoint and status.\n# TYPE ds4_requests_total counter"
        );
        for ((endpoint, status), n) in lock(&self.requests).iter() {
            let _ = writeln!(
                s,
                "ds4_requests_total{{endpoint=\"{endpoint}\",status=\"{status}\"}} {n}"
            );
        }
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64;
        let bits = |a: &AtomicU64| f64::from_bits(a.load(Ordering::Relaxed));
        #[rustfmt::skip]
        let series: [(&str, &str, &str, f64); 14] = [
            ("ds4_rejected_requests_total", "counter", "Requests refused because the queue was full.", load(&self.rejected)),
            ("ds4_cancelled_generations_total", "counter", "Generations cancelled by a disconnect or shutdown.", load(&self.cancelled)),
            ("ds4_prompt_tokens_total", "counter", "Prompt tokens of all requests.", load(&self.prompt_tokens)),
            ("ds4_cached_prompt_tokens_total", "counter", "Prompt tokens reused from the live session (not evaluated).", load(&self.cached_tokens)),
            ("ds4_prefill_tokens_total", "counter", "Prompt tokens evaluated.", load(&self.prefill_tokens)),
            ("ds4_generated_tokens_total", "counter", "Tokens generated.", load(&self.generated_tokens)),
            ("ds4_prefill_seconds_total", "counter", "Time spent evaluating prompt tokens.", load(&self.prefill_us) / 1e6),
            ("ds4_decode_seconds_total", "counter", "Time spent generating (first to last token of each request).", load(&self.decode_us) / 1e6),
            ("ds4_prefill_tokens_per_second", "gauge", "Prefill speed of the last request that evaluated prompt tokens.", bits(&self.last_prefill_tps)),
            ("ds4_decode_tokens_per_second", "gauge", "Decode speed of the last request that generated two or more tokens.", bits(&self.last_decode_tps)),
            ("ds4_queue_depth", "gauge", "Requests waiting for the engine.", g.queue_depth as f64),
            ("ds4_engine_busy", "gauge", "1 while the engine runs a request.", if g.busy { 1.0 } else { 0.0 }),
            ("ds4_session_tokens", "gauge", "Tokens held by the live session.", g.session_tokens as f64),
            ("ds4_context_size", "gauge", "Context size in tokens.", g.n_ctx as f64),
        ];
        for (name, kind, help, v) in series {
            let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}");
        }
        let h = lock(&self.ttft);
        let _ = writeln!(
            s,
            "# HELP ds4_time_to_first_token_seconds Time from queueing to the first generated token.\n# TYPE ds4_time_to_first_token_seconds histogram"
        );
        for (i, b) in TTFT_BUCKETS.iter().enumerate() {
            let _ = writeln!(
                s,
                "ds4_time_to_first_token_seconds_bucket{{le=\"{b}\"}} {}",
                h.counts[i]
            );
        }
        let _ = writeln!(
            s,
            "ds4_time_to_first_token_seconds_bucket{{le=\"+Inf\"}} {}",
            h.count
        );
        let _ = writeln!(s, "ds4_time_to_first_token_seconds_sum {}", h.sum);
        let _ = writeln!(s, "ds4_time_to_first_token_seconds_count {}", h.count);
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_and_histogram() {
        let m = Metrics::new();
        m.record_request("/v1/chat/completions", 200);
        m.record_request("/v1/chat/completions", 200);
        m.record_prefill(100, 90, 10, Some(Duration::from_millis(100)));
        m.record_ttft(Duration::from_millis(300));
        let text = m.render(Gauges {
            queue_depth: 2,
            ..Default::default()
        });
        assert!(
            text.contains("ds4_requests_total{endpoint=\"/v1/chat/completions\",status=\"200\"} 2")
        );
        assert!(text.contains("ds4_cached_prompt_tokens_total 90"));
        assert!(text.contains("ds4_prefill_tokens_per_second 100"));
        assert!(text.contains("ds4_time_to_first_token_seconds_bucket{le=\"0.25\"} 0"));
        assert!(text.contains("ds4_time_to_first_token_seconds_bucket{le=\"0.5\"} 1"));
        assert!(text.contains("ds4_queue_depth 2"));
    }
}
