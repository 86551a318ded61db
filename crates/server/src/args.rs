//! `ds4-server serve` flags (the model and context flags come from the CLI's
//! `ModelArgs`).

use std::path::PathBuf;
use std::time::Duration;

use ds4_args::int;

use crate::config::ServerConfig;
use crate::session_cache::CacheConfig;

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
    /// Largest accepted request body (bytes; K, M, G suffixes).
    #[arg(long = "max-body-bytes", value_name = "BYTES", default_value = "32M",
          allow_negative_numbers = true, value_parser = parse_body_bytes)]
    pub max_body_bytes: usize,
    /// Another name the model answers to (repeatable).
    #[arg(long = "alias", value_name = "NAME")]
    pub aliases: Vec<String>,
    /// Seconds between SSE keep-alive comments while a request waits or prefills.
    #[arg(long = "keepalive", value_name = "SECS", default_value_t = 10,
          allow_negative_numbers = true, value_parser = int::<u64>(1..))]
    pub keepalive_secs: u64,
    /// On SIGINT/SIGTERM, seconds the running request may take before it is cancelled
    /// (a second signal cancels it at once).
    #[arg(long = "shutdown-timeout", value_name = "SECS", default_value_t = 30,
          allow_negative_numbers = true, value_parser = int::<u64>(0..))]
    pub shutdown_timeout_secs: u64,
    /// Memory for parked conversation states (bytes; K, M, G suffixes). Default: a
    /// quarter of the memory available at start.
    #[arg(long = "cache-mem", value_name = "BYTES", allow_negative_numbers = true, value_parser = parse_bytes)]
    pub cache_mem: Option<u64>,
    /// Directory for disk checkpoints of conversation states (evicted ones, and all of
    /// them at shutdown); off by default.
    #[arg(long = "cache-dir", value_name = "DIR", value_parser = parse_cache_dir)]
    pub cache_dir: Option<PathBuf>,
    /// Disk space for checkpoints in --cache-dir (bytes; K, M, G suffixes).
    #[arg(long = "cache-disk-max", value_name = "BYTES", allow_negative_numbers = true, value_parser = parse_bytes, default_value = "16G")]
    pub cache_disk_max: u64,
}

/// What a byte count must be (the message of every bad one, worded as `ds4_args` words
/// numbers).
const BYTES: &str = "must be a whole number of bytes, at least 0, with an optional K, M, G or T suffix (e.g. 512M, 8G)";

/// A byte count: digits with an optional K, M, G or T suffix (powers of 1024, an
/// optional `B` or `iB` after it).
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let t = t
        .strip_suffix("iB")
        .or_else(|| t.strip_suffix('B'))
        .unwrap_or(t);
    let (digits, shift) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let shift = match c.to_ascii_uppercase() {
                'K' => 10,
                'M' => 20,
                'G' => 30,
                'T' => 40,
                _ => return Err(BYTES.to_string()),
            };
            (&t[..i], shift)
        }
        _ => (t, 0),
    };
    let n: u64 = digits.trim().parse().map_err(|_| BYTES.to_string())?;
    n.checked_shl(shift)
        .filter(|v| v >> shift == n)
        .ok_or_else(|| format!("{BYTES}, at most 2^64 - 1 bytes"))
}

/// A request body limit: a byte count of at least 1.
fn parse_body_bytes(s: &str) -> Result<usize, String> {
    let min1 = || BYTES.replace("at least 0", "at least 1");
    match parse_bytes(s) {
        Ok(0) => Err(min1()),
        Ok(n) => usize::try_from(n).map_err(|_| min1()),
        Err(_) => Err(min1()),
    }
}

/// The checkpoint directory, created if needed and checked writable now, so that a
/// server asked to keep conversations on disk does not start without it.
fn parse_cache_dir(s: &str) -> Result<PathBuf, String> {
    let dir = PathBuf::from(s);
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create the directory: {e}"))?;
    let probe = dir.join(format!(".ds4-write-test-{}", std::process::id()));
    std::fs::write(&probe, b"")
        .and_then(|()| std::fs::remove_file(&probe))
        .map_err(|e| format!("cannot write in it: {e}"))?;
    Ok(dir)
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
            cache: CacheConfig {
                mem_budget: self
                    .cache_mem
                    .unwrap_or_else(CacheConfig::default_mem_budget),
                dir: self.cache_dir.clone(),
                disk_max: self.cache_disk_max,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{parse_body_bytes, parse_bytes, parse_cache_dir};

    #[test]
    fn body_limits_take_suffixes_and_refuse_zero() {
        assert_eq!(parse_body_bytes("32M"), Ok(32 << 20));
        assert_eq!(parse_body_bytes("4096"), Ok(4096));
        let e = parse_body_bytes("0").unwrap_err();
        assert!(e.contains("at least 1"), "{e}");
        assert!(parse_body_bytes("-5").is_err());
    }

    #[test]
    fn cache_dirs_are_created_or_refused() {
        let base = std::env::temp_dir().join(format!("ds4-cache-dir-{}", std::process::id()));
        let dir = base.join("a/b");
        assert_eq!(parse_cache_dir(dir.to_str().unwrap()), Ok(dir.clone()));
        assert!(dir.is_dir());
        let file = base.join("file");
        std::fs::write(&file, b"x").unwrap();
        let e = parse_cache_dir(file.to_str().unwrap()).unwrap_err();
        assert!(e.starts_with("cannot create the directory"), "{e}");
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn byte_counts_with_suffixes() {
        assert_eq!(parse_bytes("1024"), Ok(1024));
        assert_eq!(parse_bytes("512M"), Ok(512 << 20));
        assert_eq!(parse_bytes("8G"), Ok(8 << 30));
        assert_eq!(parse_bytes("2GiB"), Ok(2 << 30));
        assert_eq!(parse_bytes("3kB"), Ok(3 << 10));
        assert!(parse_bytes("8X").is_err());
        assert!(parse_bytes("lots").is_err());
        assert!(parse_bytes("99999999999T").is_err());
    }
}
