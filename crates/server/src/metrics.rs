//! Server metrics in the Prometheus text exposition format (version 0.0.4): request
//! counts by endpoint and status, prompt / cached / prefilled / generated tokens,
//! prefill and decode time and speed, queue depth, time to first token, and the prompt
//! cache's hits (live session, memory, disk), evictions and held bytes.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
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
    /// The prompt cache's counters and gauges.
    pub cache: Arc<CacheStats>,
}

/// The prompt cache's counters (see `crate::session_cache`).
#[derive(Default)]
pub struct CacheStats {
    hits_live: AtomicU64,
    hits_memory: AtomicU64,
    hits_disk: AtomicU64,
    misses: AtomicU64,
    evictions: AtomicU64,
    disk_evictions: AtomicU64,
    bad_files: AtomicU64,
    entries_memory: AtomicU64,
    bytes_memory: AtomicU64,
    entries_disk: AtomicU64,
    bytes_disk: AtomicU64,
}

impl CacheStats {
    /// A request reused tokens of the live session.
    pub fn record_hit_live(&self) {
        self.hits_live.fetch_add(1, Ordering::Relaxed);
    }
    /// A request was served from a state parked in memory.
    pub fn record_hit_memory(&self) {
        self.hits_memory.fetch_add(1, Ordering::Relaxed);
    }
    /// A request was served from a disk checkpoint.
    pub fn record_hit_disk(&self) {
        self.hits_disk.fetch_add(1, Ordering::Relaxed);
    }
    /// A request reused nothing.
    pub fn record_miss(&self) {
        self.misses.fetch_add(1, Ordering::Relaxed);
    }
    /// A parked state left memory (to disk, or dropped).
    pub fn record_eviction(&self) {
        self.evictions.fetch_add(1, Ordering::Relaxed);
    }
    /// A disk checkpoint was deleted to stay within the disk budget.
    pub fn record_disk_eviction(&self) {
        self.disk_evictions.fetch_add(1, Ordering::Relaxed);
    }
    /// A disk checkpoint was found corrupted and ignored.
    pub fn record_bad_file(&self) {
        self.bad_files.fetch_add(1, Ordering::Relaxed);
    }
    /// What is held now: parked states in memory and on disk, and their bytes.
    pub fn set_held(&self, mem_entries: u64, mem_bytes: u64, disk_entries: u64, disk_bytes: u64) {
        self.entries_memory.store(mem_entries, Ordering::Relaxed);
        self.bytes_memory.store(mem_bytes, Ordering::Relaxed);
        self.entries_disk.store(disk_entries, Ordering::Relaxed);
        self.bytes_disk.store(disk_bytes, Ordering::Relaxed);
    }

    /// `(hits_memory, hits_disk, evictions, parked in memory, MiB in memory, on disk)`
    /// for log lines.
    pub fn summary(&self) -> String {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        format!(
            "cache hits live {} memory {} disk {}, misses {}, evictions {}, parked {} ({:.1} MiB) + {} on disk ({:.1} MiB)",
            l(&self.hits_live),
            l(&self.hits_memory),
            l(&self.hits_disk),
            l(&self.misses),
            l(&self.evictions),
            l(&self.entries_memory),
            l(&self.bytes_memory) as f64 / (1 << 20) as f64,
            l(&self.entries_disk),
            l(&self.bytes_disk) as f64 / (1 << 20) as f64,
        )
    }

    fn series(&self) -> [(&'static str, &'static str, &'static str, f64); 11] {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64;
        #[rustfmt::skip]
        let s = [
            ("ds4_cache_hits_live_total", "counter", "Requests that reused tokens of the live session.", l(&self.hits_live)),
            ("ds4_cache_hits_memory_total", "counter", "Requests served from a session state parked in memory.", l(&self.hits_memory)),
            ("ds4_cache_hits_disk_total", "counter", "Requests served from a disk checkpoint.", l(&self.hits_disk)),
            ("ds4_cache_misses_total", "counter", "Requests that reused no prompt token.", l(&self.misses)),
            ("ds4_cache_evictions_total", "counter", "Parked states moved out of memory (to disk, or dropped).", l(&self.evictions)),
            ("ds4_cache_disk_evictions_total", "counter", "Disk checkpoints deleted to stay within --cache-disk-max.", l(&self.disk_evictions)),
            ("ds4_cache_bad_files_total", "counter", "Disk checkpoints found corrupted and ignored.", l(&self.bad_files)),
            ("ds4_cache_memory_entries", "gauge", "Session states parked in memory.", l(&self.entries_memory)),
            ("ds4_cache_memory_bytes", "gauge", "Bytes of session states parked in memory.", l(&self.bytes_memory)),
            ("ds4_cache_disk_entries", "gauge", "Disk checkpoints of this model.", l(&self.entries_disk)),
            ("ds4_cache_disk_bytes", "gauge", "Bytes of disk checkpoints of this model.", l(&self.bytes_disk)),
        ];
        s
    }
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
            ("ds4_cached_prompt_tokens_total", "counter", "Prompt tokens reused from a held session state (not evaluated).", load(&self.cached_tokens)),
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
        for (name, kind, help, v) in series.into_iter().chain(self.cache.series()) {
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
