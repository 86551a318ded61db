//! Server settings (what `ds4-server serve` flags turn into).

use std::time::Duration;

use crate::session_cache::CacheConfig;

/// Everything the server needs to know besides the model.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Address to bind (loopback by default).
    pub host: String,
    /// Port to bind; 0 picks a free one.
    pub port: u16,
    /// When set, requests must carry `Authorization: Bearer KEY` or `x-api-key: KEY`.
    pub api_key: Option<String>,
    /// Answer CORS preflights and add CORS headers (any origin).
    pub cors: bool,
    /// Answer 404 to requests naming another model (by default any name is accepted
    /// and answered under the served id, as llama-server does).
    pub strict_model: bool,
    /// Requests that may wait for the engine; more get 429.
    pub queue: usize,
    /// Largest request body in bytes; larger gets 413.
    pub max_body_bytes: usize,
    /// Extra names the model answers to.
    pub aliases: Vec<String>,
    /// Interval of SSE keep-alive comments while nothing else is sent (queue, prefill).
    pub keepalive: Duration,
    /// On shutdown, how long the running request may take before it is cancelled.
    pub drain_timeout: Duration,
    /// The prompt cache's budgets and disk directory.
    pub cache: CacheConfig,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            host: "127.0.0.1".into(),
            port: 8000,
            api_key: None,
            cors: false,
            strict_model: false,
            queue: 16,
            max_body_bytes: 32 << 20,
            aliases: Vec::new(),
            keepalive: Duration::from_secs(10),
            drain_timeout: Duration::from_secs(30),
            cache: CacheConfig::default(),
        }
    }
}
