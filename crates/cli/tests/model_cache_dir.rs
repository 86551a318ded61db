//! `ds4-server pull` stores models where the tests look for them: both take the
//! directory from `ds4_dirs::models_dir`, and for each environment the cache directory
//! `pull --list` names is the one that rule gives.

mod support;

use std::path::Path;

#[test]
fn pull_lists_the_model_cache_of_the_environment() {
    let cases: [(&[(&str, &str)], &str); 6] = [
        (&[("DS4_MODELS", "/m"), ("XDG_CACHE_HOME", "/x")], "/m"),
        (
            &[("DS4_MODELS", ""), ("XDG_CACHE_HOME", "/x")],
            "/x/ds4-server/models",
        ),
        (&[("XDG_CACHE_HOME", "/x")], "/x/ds4-server/models"),
        (
            &[("XDG_CACHE_HOME", "relative")],
            "/home/nobody-here/.cache/ds4-server/models",
        ),
        (
            &[("XDG_CACHE_HOME", "")],
            "/home/nobody-here/.cache/ds4-server/models",
        ),
        (&[], "/home/nobody-here/.cache/ds4-server/models"),
    ];
    for (vars, want) in cases {
        let mut cmd = support::bin();
        cmd.env_remove("DS4_MODELS")
            .env_remove("XDG_CACHE_HOME")
            .env("HOME", "/home/nobody-here")
            .args(["pull", "--list"]);
        for (k, v) in vars {
            cmd.env(k, v);
        }
        let out = cmd.output().expect("running ds4-server");
        assert!(out.status.success(), "{vars:?}: {}", support::show(&out));
        let text = String::from_utf8_lossy(&out.stdout);
        let listed = text
            .lines()
            .find_map(|l| l.strip_prefix("cache: "))
            .unwrap_or_else(|| panic!("{vars:?}: no `cache:` line in\n{text}"));
        assert_eq!(Path::new(listed), Path::new(want), "{vars:?}");
    }
}
