//! `ds4-server serve` flags (the model and context flags come from the CLI's
//! `ModelArgs`).

use std::time::Duration;

use ds4_args::int;

use crate::config::ServerConfig;

/// Environment variable read for the API key when `--api-key` is not given (keeps the
/// key out of process listings).
pub const API_KEY_ENV: &str = "DS4_SERVER_API_KEY";

/// Server flags.
#[derive(clap::Args, Debug, Clone)]
pub struct ServeArgs {
    /// Address to bind. Loopback by default; 0.0.0.0 listens on every interface.
    #[arg(long = "host", default_value = "127.0.0.1")]
    pub host: String,
    /// Port to bind (0: any free port).
    #[arg(long = "port", default_value_t = 8000, allow_negative_numbers = true,
          value_parser = int::<u16>(..))]
    pub port: u16,
    /// Require this key as `Authorization: Bearer KEY` or `x-api-key: KEY` (also read
    /// from DS4_SERVER_API_KEY).
    #[arg(long = "api-key", value_name = "KEY")]
    pub api_key: Option<String>,
    /// Allow cross-origin requests from browsers (any origin).
    #[arg(long = "cors")]
    pub cors: bool,
    /// Answer 404 to requests that name another model (by default any name is accepted
    /// and answered under the served id).
    #[arg(long = "strict-model")]
    pub strict_model: bool,
    /// Accept any model name (the default now; kept so that old command lines work).
    #[arg(long = "any-model", hide = true, conflicts_with = "strict_model")]
    pub any_model: bool,
    /// Requests that may wait while one runs; more get 429 with Retry-After.
    #[arg(long = "queue", value_name = "N", default_value_t = 16, allow_negative_numbers = true,
          value_parser = int::<usize>(0..))]
    pub queue: usize,
    /// Largest accepted request body in bytes.
    #[arg(long = "max-body-bytes", value_name = "BYTES", default_value_t = 32 << 20,
          allow_negative_numbers = true, value_parser = int::<usize>(1..))]
    pub max_body_bytes: usize,
    /// Another name the model answers to (repeatable).
    #[arg(long = "alias", value_name = "NAME")]
    pub aliases: Vec<String>,
    /// Seconds between SSE keep-alive comments while a request waits or prefills.
    #[arg(long = "keepalive", value_name = "SECS", default_value_t = 10,
          allow_negative_numbers = true, value_parser = int::<u64>(1..))]
    pub keepalive_secs: u64,
    /// On SIGINT/SIGTERM, seconds the running request may take before it is cancelled.
    #[arg(long = "shutdown-timeout", value_name = "SECS", default_value_t = 30,
          allow_negative_numbers = true, value_parser = int::<u64>(0..))]
    pub shutdown_timeout_secs: u64,
}

impl ServeArgs {
    /// The server settings these flags give.
    pub fn config(&self) -> ServerConfig {
        ServerConfig {
            host: self.host.clone(),
            port: self.port,
            api_key: self
                .api_key
                .clone()
                .or_else(|| std::env::var(API_KEY_ENV).ok().filter(|k| !k.is_empty())),
            cors: self.cors,
            strict_model: self.strict_model,
            queue: self.queue,
            max_body_bytes: self.max_body_bytes,
            aliases: self.aliases.clone(),
            keepalive: Duration::from_secs(self.keepalive_secs.max(1)),
            drain_timeout: Duration::from_secs(self.shutdown_timeout_secs),
        }
    }
}
