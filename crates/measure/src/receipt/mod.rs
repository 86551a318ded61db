//! Receipts: a JSON record of one `bench` or `eval` run holding its results plus
//! what is needed to trust them — which binary and model (sha256), settings,
//! backend, machine, start time and duration, git commit, and every failure.
//!
//! A failed run is recorded with its error, never discarded: build the receipt
//! with [`Receipt::start`] before the work, call [`Receipt::finish`] with the work's
//! `Result`, and write it whatever happened. [`Receipt::failed`] covers errors that
//! happen before anything could be measured.
//!
//! Schema: [`RECEIPT_SCHEMA`] is bumped on incompatible changes; readers refuse
//! receipts with a newer schema than they know.

mod bench;
mod eval;
mod machine;

pub use bench::{BenchResults, BenchRun};
pub use eval::{Counterexample, EvalResults, PrimeCheck, StopReason, TurnRecord};
pub use machine::{GpuInfo, Machine, parse_cpuinfo};

use crate::hash::sha256_file;
use serde::{Deserialize, Serialize};
use std::fmt::Display;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Version of the receipt layout written by this crate.
pub const RECEIPT_SCHEMA: u32 = 1;

/// Git commit this crate was built from: `DS4_GIT_COMMIT` from the build
/// environment, else `git rev-parse HEAD` at build time (see `build.rs`).
pub const BUILD_GIT_COMMIT: Option<&str> = option_env!("DS4_GIT_COMMIT");

/// Which command produced a receipt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReceiptKind {
    /// `ds4-server bench`.
    Bench,
    /// `ds4-server eval`.
    Eval,
}

/// Whether the run completed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    /// Completed with no failure recorded.
    Ok,
    /// At least one failure is recorded in `failures`.
    Failed,
}

/// A file the results depend on (the binary, the model).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Artifact {
    /// Path as given (the binary's is `std::env::current_exe`).
    pub path: String,
    /// SHA-256 of the file's bytes, hex; `None` when it could not be computed.
    pub sha256: Option<String>,
    /// File size in bytes, when the file could be read.
    #[serde(default)]
    pub size_bytes: Option<u64>,
    /// Why hashing failed, when it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hash_error: Option<String>,
}

impl Artifact {
    /// Describes the file at `path`, hashing it (streamed) unless `cached_sha256`
    /// is given — pass a hash cached earlier to skip reading a multi-GiB model.
    ///
    /// Never fails: an unreadable file gives `sha256: None` and `hash_error`.
    pub fn describe(path: &Path, cached_sha256: Option<String>) -> Artifact {
        let size_bytes = std::fs::metadata(path).ok().map(|m| m.len());
        let (sha256, hash_error) = match cached_sha256 {
            Some(h) => (Some(h.to_ascii_lowercase()), None),
            None => match sha256_file(path) {
                Ok(h) => (Some(h), None),
                Err(e) => (None, Some(e.to_string())),
            },
        };
        Artifact {
            path: path.display().to_string(),
            sha256,
            size_bytes,
            hash_error,
        }
    }

    /// The running executable (`std::env::current_exe`), hashed.
    pub fn current_exe() -> Artifact {
        match std::env::current_exe() {
            Ok(p) => Artifact::describe(&p, None),
            Err(e) => Artifact {
                path: String::new(),
                sha256: None,
                size_bytes: None,
                hash_error: Some(format!("current_exe: {e}")),
            },
        }
    }
}

/// One failure during a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Failure {
    /// Where it happened: `load`, `warmup`, `turn`, `prime_check`, `run`, …
    pub stage: String,
    /// The error, as displayed (with its sources).
    pub message: String,
    /// Turn index (eval), when the failure belongs to one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn: Option<usize>,
    /// Run index (bench), when the failure belongs to one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<usize>,
}

/// What the caller knows before a run starts; [`Receipt::start`] adds the rest.
#[derive(Debug, Clone, Default)]
pub struct ReceiptContext {
    /// Side label for `compare` (e.g. `A`, `baseline`, `2-threads`).
    pub label: Option<String>,
    /// Backend name, e.g. `cpu`, `cuda`.
    pub backend: String,
    /// Model file, hashed unless `model_sha256` is given.
    pub model_path: Option<PathBuf>,
    /// A cached SHA-256 of the model file (skips hashing it).
    pub model_sha256: Option<String>,
    /// Settings that shape the results (sampling, threads, token caps…): a JSON object.
    pub settings: serde_json::Map<String, serde_json::Value>,
    /// GPU facts, when running on one.
    pub gpu: Option<GpuInfo>,
    /// Git commit; defaults to [`BUILD_GIT_COMMIT`] when `None`.
    pub git_commit: Option<String>,
}

/// A receipt: results of one run and how they were obtained.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Receipt {
    /// Layout version ([`RECEIPT_SCHEMA`] when written by this crate).
    pub schema: u32,
    /// Which command produced it.
    pub kind: ReceiptKind,
    /// Side label for `compare`, when given.
    #[serde(default)]
    pub label: Option<String>,
    /// Start time, RFC 3339 UTC with milliseconds.
    pub started_at: String,
    /// Wall time of the whole run, seconds; `None` if it never finished.
    #[serde(default)]
    pub duration_s: Option<f64>,
    /// `Ok` or `Failed` (then `failures` is non-empty).
    pub status: RunStatus,
    /// The executable that ran.
    pub binary: Artifact,
    /// Git commit of the binary, when known.
    #[serde(default)]
    pub git_commit: Option<String>,
    /// The model file, when one was loaded.
    #[serde(default)]
    pub model: Option<Artifact>,
    /// Backend name.
    pub backend: String,
    /// Where it ran.
    pub machine: Machine,
    /// Free-form settings object.
    #[serde(default)]
    pub settings: serde_json::Map<String, serde_json::Value>,
    /// Every failure, in order.
    #[serde(default)]
    pub failures: Vec<Failure>,
    /// Eval results (kind `eval`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eval: Option<EvalResults>,
    /// Bench results (kind `bench`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bench: Option<BenchResults>,
    #[serde(skip)]
    clock: Option<Instant>,
}

/// Errors reading or writing a receipt; each names the file.
#[derive(Debug, thiserror::Error)]
pub enum ReceiptError {
    /// The file could not be read or written.
    #[error("receipt {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The file is not a receipt in JSON.
    #[error("receipt {path}: invalid JSON receipt: {source}")]
    Json {
        path: PathBuf,
        source: serde_json::Error,
    },
    /// The receipt was written by a newer layout.
    #[error("receipt {path}: schema {found} is newer than the supported {supported}")]
    Schema {
        path: PathBuf,
        found: u32,
        supported: u32,
    },
}

impl Receipt {
    /// Starts a receipt now: records the start time, hashes the running binary and
    /// the model (unless a cached hash is given), and detects the machine.
    ///
    /// Results (`eval`/`bench`) start empty for the given kind.
    pub fn start(kind: ReceiptKind, ctx: &ReceiptContext) -> Receipt {
        let started_at = crate::time::now_rfc3339();
        let clock = Some(Instant::now());
        let model = ctx
            .model_path
            .as_deref()
            .map(|p| Artifact::describe(p, ctx.model_sha256.clone()));
        Receipt {
            schema: RECEIPT_SCHEMA,
            kind,
            label: ctx.label.clone(),
            started_at,
            duration_s: None,
            status: RunStatus::Ok,
            binary: Artifact::current_exe(),
            git_commit: ctx
                .git_commit
                .clone()
                .or_else(|| BUILD_GIT_COMMIT.map(str::to_string)),
            model,
            backend: ctx.backend.clone(),
            machine: Machine::detect(ctx.gpu.clone()),
            settings: ctx.settings.clone(),
            failures: Vec::new(),
            eval: (kind == ReceiptKind::Eval).then(EvalResults::default),
            bench: (kind == ReceiptKind::Bench).then(BenchResults::default),
            clock,
        }
    }

    /// A finished receipt for a run that failed at `stage` before producing results.
    pub fn failed(
        kind: ReceiptKind,
        ctx: &ReceiptContext,
        stage: &str,
        error: &dyn Display,
    ) -> Receipt {
        let mut r = Receipt::start(kind, ctx);
        r.record_failure(stage, error);
        r.finish_time();
        r
    }

    /// Records a failure at `stage` and marks the receipt failed.
    pub fn record_failure(&mut self, stage: &str, error: &dyn Display) -> &mut Failure {
        self.push_failure(Failure {
            stage: stage.to_string(),
            message: error.to_string(),
            turn: None,
            run: None,
        })
    }

    /// Records `failure` (with its turn or run index) and marks the receipt failed.
    pub fn push_failure(&mut self, failure: Failure) -> &mut Failure {
        self.status = RunStatus::Failed;
        self.failures.push(failure);
        self.failures.last_mut().expect("just pushed")
    }

    /// Ends the run: sets `duration_s` and, when `result` is an error, records it at
    /// `stage`. Returns the result unchanged so it can be propagated after writing.
    pub fn finish<T, E: Display>(&mut self, stage: &str, result: Result<T, E>) -> Result<T, E> {
        if let Err(e) = &result {
            self.record_failure(stage, e);
        }
        self.finish_time();
        result
    }

    /// Sets `duration_s` from the start of [`Receipt::start`] (no-op on a receipt
    /// read from disk).
    pub fn finish_time(&mut self) {
        if let Some(t0) = self.clock {
            self.duration_s = Some(t0.elapsed().as_secs_f64());
        }
    }

    /// True when a failure is recorded.
    pub fn is_failed(&self) -> bool {
        self.status == RunStatus::Failed || !self.failures.is_empty()
    }

    /// Writes the receipt as pretty JSON to `path`, atomically (temporary file in
    /// the same directory, then rename).
    pub fn write(&self, path: &Path) -> Result<(), ReceiptError> {
        let io = |source| ReceiptError::Io {
            path: path.to_path_buf(),
            source,
        };
        let mut text = serde_json::to_string_pretty(self).map_err(|source| ReceiptError::Json {
            path: path.to_path_buf(),
            source,
        })?;
        text.push('\n');
        let tmp = temporary(path);
        std::fs::write(&tmp, text).map_err(io)?;
        std::fs::rename(&tmp, path).map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            io(e)
        })
    }

    /// Reads a receipt from `path`, refusing a newer schema.
    pub fn read(path: &Path) -> Result<Receipt, ReceiptError> {
        let text = std::fs::read_to_string(path).map_err(|source| ReceiptError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Receipt::from_json(&text, path)
    }

    /// Parses a receipt from JSON text; `path` is only used in error messages.
    pub fn from_json(text: &str, path: &Path) -> Result<Receipt, ReceiptError> {
        let r: Receipt = serde_json::from_str(text).map_err(|source| ReceiptError::Json {
            path: path.to_path_buf(),
            source,
        })?;
        if r.schema > RECEIPT_SCHEMA {
            return Err(ReceiptError::Schema {
                path: path.to_path_buf(),
                found: r.schema,
                supported: RECEIPT_SCHEMA,
            });
        }
        Ok(r)
    }
}

/// The temporary file a receipt at `path` is written to before its rename.
fn temporary(path: &Path) -> PathBuf {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".tmp{}", std::process::id()));
    PathBuf::from(tmp)
}

/// Whether a receipt could be written at `path` now: its temporary file is created and
/// removed (the error [`Receipt::write`] would give).
pub fn check_writable(path: &Path) -> Result<(), ReceiptError> {
    let tmp = temporary(path);
    std::fs::write(&tmp, b"").map_err(|source| ReceiptError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let _ = std::fs::remove_file(&tmp);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::sha256_bytes;

    fn tmpdir(tag: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("ds4-measure-receipt-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn start_hashes_model_and_binary() {
        let dir = tmpdir("start");
        let model = dir.join("m.gguf");
        std::fs::write(&model, b"abc").unwrap();
        let ctx = ReceiptContext {
            backend: "cpu".into(),
            model_path: Some(model.clone()),
            ..Default::default()
        };
        let r = Receipt::start(ReceiptKind::Bench, &ctx);
        let m = r.model.as_ref().unwrap();
        assert_eq!(m.sha256.as_deref(), Some(sha256_bytes(b"abc").as_str()));
        assert_eq!(m.size_bytes, Some(3));
        let exe = std::env::current_exe().unwrap();
        assert_eq!(
            r.binary.sha256,
            Some(crate::hash::sha256_file(&exe).unwrap())
        );
        assert!(r.bench.is_some() && r.eval.is_none());
        // Built inside the repository: the commit is known and is a full hash.
        if let Some(c) = &r.git_commit {
            assert_eq!(c.len(), 40);
        }
        // A cached hash is taken as given (not recomputed).
        let ctx = ReceiptContext {
            model_sha256: Some("AB12".into()),
            ..ctx
        };
        let r = Receipt::start(ReceiptKind::Eval, &ctx);
        assert_eq!(r.model.unwrap().sha256.as_deref(), Some("ab12"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn failure_is_kept_and_round_trips() {
        let dir = tmpdir("fail");
        let path = dir.join("r.json");
        let ctx = ReceiptContext {
            backend: "cpu".into(),
            model_path: Some(dir.join("absent.gguf")),
            ..Default::default()
        };
        let mut r = Receipt::start(ReceiptKind::Eval, &ctx);
        let res: Result<(), String> = r.finish("load", Err("no such model".to_string()));
        assert!(res.is_err());
        r.write(&path).unwrap();
        let back = Receipt::read(&path).unwrap();
        assert_eq!(back.status, RunStatus::Failed);
        assert_eq!(back.failures[0].stage, "load");
        assert_eq!(back.failures[0].message, "no such model");
        assert!(back.duration_s.is_some());
        assert!(
            back.model
                .unwrap()
                .hash_error
                .unwrap()
                .contains("absent.gguf")
        );
        let f = Receipt::failed(ReceiptKind::Bench, &ctx, "args", &"bad flag");
        assert!(f.is_failed() && f.duration_s.is_some());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn newer_schema_is_refused() {
        let r = Receipt::failed(ReceiptKind::Bench, &ReceiptContext::default(), "x", &"y");
        let mut v = serde_json::to_value(&r).unwrap();
        v["schema"] = serde_json::json!(RECEIPT_SCHEMA + 1);
        let err = Receipt::from_json(&v.to_string(), Path::new("new.json")).unwrap_err();
        assert!(matches!(err, ReceiptError::Schema { .. }));
        assert!(err.to_string().contains("new.json"));
    }
}
