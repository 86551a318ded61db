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

/// A cached test model (located by `ds4_testkit`, as `ds4-server pull` stores it): a
/// failure under CI when absent, a visible `skipped:` line and `None` elsewhere.
pub fn model(file: &str) -> Option<PathBuf> {
    ds4_testkit::model(file)
}

/// Whether `python3` runs here (as [`model`] when it does not).
pub fn have_python() -> bool {
    ds4_testkit::python3().is_some()
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
