//! Locating the shared fixtures and the real models for the integration tests.
#![allow(dead_code)]

use std::path::PathBuf;

/// `$DS4_FIXTURES`, else `<workspace root>/../shared/fixtures`; `None` (with a printed
/// "skipped" line naming `what`) when absent.
pub fn fixtures(what: &str) -> Option<PathBuf> {
    let dir = std::env::var_os("DS4_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures")
        });
    if dir.is_dir() {
        Some(dir)
    } else {
        println!(
            "skipped: {what}: fixtures not found at {} (set DS4_FIXTURES)",
            dir.display()
        );
        None
    }
}

/// A real model file from `$DS4_MODELS` or `~/.cache/ds4-server/models`; `None` (with a
/// printed "skipped" line) when absent.
pub fn model(file: &str) -> Option<PathBuf> {
    let dir = std::env::var_os("DS4_MODELS")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/ds4-server/models"))
        })?;
    let path = dir.join(file);
    if path.is_file() {
        Some(path)
    } else {
        println!("skipped: model {file} not found in {}", dir.display());
        None
    }
}
