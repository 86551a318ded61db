//! Locating shared fixtures and development models for the integration tests.
#![allow(dead_code)]

use std::path::PathBuf;

/// `$DS4_FIXTURES`, else `<workspace root>/../shared/fixtures`; `None` (with a visible
/// "skipped" line) when absent.
pub fn fixtures_dir(test: &str) -> Option<PathBuf> {
    let dir = match std::env::var_os("DS4_FIXTURES") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures"),
    };
    if dir.is_dir() {
        Some(dir)
    } else {
        eprintln!("skipped: {test}: fixtures not found at {}", dir.display());
        None
    }
}

/// The model `file` in `$DS4_MODELS`, else `~/.cache/ds4-server/models`; `None` (with a
/// visible "skipped" line) when absent.
pub fn model_path(test: &str, file: &str) -> Option<PathBuf> {
    let dir = match std::env::var_os("DS4_MODELS") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
            .join(".cache/ds4-server/models"),
    };
    let path = dir.join(file);
    if path.is_file() {
        Some(path)
    } else {
        eprintln!("skipped: {test}: model not found at {}", path.display());
        None
    }
}

pub mod arb;
pub mod exercise;
