//! Where the tests find what the repository does not hold, and what a test does when it
//! is missing. One locator for every test crate:
//!
//! - real models: [`models_dir`] (`ds4-dirs`' rule, which `ds4-server pull` writes by:
//!   `$DS4_MODELS`, else `$XDG_CACHE_HOME/ds4-server/models`, else
//!   `~/.cache/ds4-server/models`);
//! - shared fixtures: `$DS4_FIXTURES`, else `<workspace>/../shared/fixtures`.
//!
//! A test that needs a model, a fixture or a tool that is absent calls [`missing`] (or
//! gets `None` from [`model`] / [`fixture`]): under CI (`$CI` set, as CI services set it,
//! to anything but empty, `0` or `false`) that is a failure naming the path and how to get
//! it; elsewhere the test prints one `skipped: …` line and returns, and
//! `.config/nextest.toml` shows that line in the run's output.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

pub use ds4_dirs::models_dir;

/// What makes the test models appear in [`models_dir`].
pub const FETCH_MODELS: &str = "run `make test-setup` (scripts/fetch-test-models.sh)";

/// Whether this is a CI run: `$CI` set to anything but empty, `0` or `false`.
pub fn in_ci() -> bool {
    ci_from(std::env::var_os("CI"))
}

fn ci_from(v: Option<OsString>) -> bool {
    v.is_some_and(|v| !matches!(v.to_str(), Some("" | "0" | "false" | "FALSE" | "False")))
}

/// A prerequisite of the calling test is unavailable (`why` names it and how to get it):
/// panics under CI, otherwise prints `skipped: {why}` for the caller to return.
#[track_caller]
pub fn missing(why: &str) {
    if in_ci() {
        panic!("required under CI (CI is set): {why}");
    }
    eprintln!("skipped: {why}");
}

/// `Some(v)`, or `None` after [`missing`] with the error.
#[track_caller]
pub fn require<T>(r: Result<T, String>) -> Option<T> {
    match r {
        Ok(v) => Some(v),
        Err(why) => {
            missing(&why);
            None
        }
    }
}

/// The workspace root of this source tree.
pub fn workspace_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("the workspace root exists")
}

/// The shared fixtures (see the module header); they may not exist.
pub fn fixtures_dir() -> PathBuf {
    match std::env::var_os("DS4_FIXTURES").filter(|v| !v.is_empty()) {
        Some(d) => PathBuf::from(d),
        None => workspace_dir().join("../shared/fixtures"),
    }
}

/// The cached model `file`, or `None` after [`missing`].
#[track_caller]
pub fn model(file: &str) -> Option<PathBuf> {
    let p = models_dir().join(file);
    if p.is_file() {
        return Some(p);
    }
    missing(&format!("model {} is absent ({FETCH_MODELS})", p.display()));
    None
}

/// The shared fixture `rel` (a file or folder under [`fixtures_dir`]), or `None` after
/// [`missing`].
#[track_caller]
pub fn fixture(rel: &str) -> Option<PathBuf> {
    let p = fixtures_dir().join(rel);
    if p.exists() {
        return Some(p);
    }
    missing(&format!(
        "fixture {} is absent (the shared fixtures live in ../shared/fixtures beside the \
         workspace, or where $DS4_FIXTURES points)",
        p.display()
    ));
    None
}

/// `python3`, or `None` after [`missing`].
#[track_caller]
pub fn python3() -> Option<&'static str> {
    let ok = std::process::Command::new("python3")
        .args(["-c", "pass"])
        .output()
        .is_ok_and(|o| o.status.success());
    if ok {
        return Some("python3");
    }
    missing("python3 is not available (the tests need Python 3, as the README says)");
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ci_values() {
        for (v, want) in [
            (None, false),
            (Some(""), false),
            (Some("0"), false),
            (Some("false"), false),
            (Some("true"), true),
            (Some("1"), true),
            (Some("yes"), true),
        ] {
            assert_eq!(ci_from(v.map(OsString::from)), want, "CI={v:?}");
        }
    }
}
