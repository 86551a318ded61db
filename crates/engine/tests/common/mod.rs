//! Test support: where the shared fixtures and the cached real models are.

#![allow(dead_code)]

use std::path::PathBuf;

/// `$DS4_FIXTURES`, else `<workspace>/../shared/fixtures`.
pub fn fixtures_dir() -> PathBuf {
    std::env::var_os("DS4_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures")
        })
}

/// `$DS4_MODELS`, else `$XDG_CACHE_HOME/ds4-server/models`, else
/// `~/.cache/ds4-server/models` (the same place `ds4-server pull` writes to).
pub fn models_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("DS4_MODELS") {
        return PathBuf::from(d);
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache")
        });
    cache.join("ds4-server/models")
}

/// The path of a cached model, or `None` (after printing why the test skips).
pub fn model(file: &str) -> Option<PathBuf> {
    let p = models_dir().join(file);
    if p.exists() {
        Some(p)
    } else {
        eprintln!(
            "skipped: model {} is absent (run scripts/fetch-test-models.sh)",
            p.display()
        );
        None
    }
}

/// A fixture file's path, or `None` (after printing why the test skips).
pub fn fixture(rel: &str) -> Option<PathBuf> {
    let p = fixtures_dir().join(rel);
    if p.exists() {
        Some(p)
    } else {
        eprintln!("skipped: fixture {} is absent", p.display());
        None
    }
}
