//! Shared helpers of the CLI integration tests: the binary, model lookup, temp dirs.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The `ds4-server` binary under test.
pub fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ds4-server"))
}

/// Runs `ds4-server ARGS…` and returns its output.
pub fn run(args: &[&str]) -> Output {
    bin().args(args).output().expect("running ds4-server")
}

/// A test model from `$DS4_MODELS` or `~/.cache/ds4-server/models`; prints a
/// `skipped:` line and returns `None` when absent.
pub fn model(file: &str) -> Option<PathBuf> {
    let dir = std::env::var_os("DS4_MODELS")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache/ds4-server/models"))
        })?;
    let p = dir.join(file);
    if p.exists() {
        Some(p)
    } else {
        eprintln!(
            "skipped: {} not found (run scripts/fetch-test-models.sh)",
            p.display()
        );
        None
    }
}

/// Whether `python3` runs here (prints a `skipped:` line when not).
pub fn have_python() -> bool {
    let ok = Command::new("python3")
        .args(["-c", "pass"])
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!("skipped: python3 is not available");
    }
    ok
}

/// Reads a JSON file.
pub fn json(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// stdout and stderr of an output, for assertion messages.
pub fn show(o: &Output) -> String {
    format!(
        "status {}\n--- stdout\n{}\n--- stderr\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}
