//! Where `ds4-server` keeps files outside the repository, one rule for the binary and
//! the tests:
//!
//! - the model cache ([`models_dir`]): `$DS4_MODELS`, else
//!   `$XDG_CACHE_HOME/ds4-server/models`, else `~/.cache/ds4-server/models`. Empty
//!   variables count as unset; a relative `$XDG_CACHE_HOME` is ignored, as the XDG spec
//!   says. `ds4-server pull` writes there and the tests (`ds4-testkit`) look there.

use std::ffi::OsString;
use std::path::PathBuf;

/// The model cache directory (see the crate header); it may not exist.
pub fn models_dir() -> PathBuf {
    models_dir_from(|key| std::env::var_os(key), std::env::home_dir())
}

/// [`models_dir`] with the environment and home directory given explicitly.
pub fn models_dir_from(env: impl Fn(&str) -> Option<OsString>, home: Option<PathBuf>) -> PathBuf {
    let var = |key: &str| env(key).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(dir) = var("DS4_MODELS") {
        return dir;
    }
    // The XDG spec says relative values are invalid and must be ignored.
    let cache = var("XDG_CACHE_HOME")
        .filter(|p| p.is_absolute())
        .or_else(|| home.map(|h| h.join(".cache")))
        .unwrap_or_else(|| PathBuf::from(".cache"));
    cache.join("ds4-server").join("models")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn models_dir_resolution_order() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| OsString::from(v))
            }
        };
        let home = Some(PathBuf::from("/home/u"));
        let cases: [(&'static [(&str, &str)], &str); 6] = [
            (&[("DS4_MODELS", "/m"), ("XDG_CACHE_HOME", "/x")], "/m"),
            (&[("DS4_MODELS", "rel/m")], "rel/m"),
            (
                &[("DS4_MODELS", ""), ("XDG_CACHE_HOME", "/x")],
                "/x/ds4-server/models",
            ),
            (
                &[("XDG_CACHE_HOME", "rel")],
                "/home/u/.cache/ds4-server/models",
            ),
            (
                &[("XDG_CACHE_HOME", "")],
                "/home/u/.cache/ds4-server/models",
            ),
            (&[], "/home/u/.cache/ds4-server/models"),
        ];
        for (vars, want) in cases {
            assert_eq!(
                models_dir_from(env(vars), home.clone()),
                PathBuf::from(want),
                "{vars:?}"
            );
        }
        assert_eq!(
            models_dir_from(env(&[]), None),
            PathBuf::from(".cache/ds4-server/models")
        );
    }
}
