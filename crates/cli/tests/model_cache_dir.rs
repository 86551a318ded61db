//! The tests look for models where `ds4-server pull` puts them: for the same
//! environment, the cache directory `pull --list` names is `ds4_testkit`'s.

mod support;

use std::ffi::OsString;
use std::path::{Path, PathBuf};

#[test]
fn tests_look_where_pull_writes() {
    let home = "/home/nobody-here";
    let cases: [&[(&str, &str)]; 5] = [
        &[("DS4_MODELS", "/m"), ("XDG_CACHE_HOME", "/x")],
        &[("DS4_MODELS", ""), ("XDG_CACHE_HOME", "/x")],
        &[("XDG_CACHE_HOME", "/x")],
        &[("XDG_CACHE_HOME", "relative")],
        &[],
    ];
    for vars in cases {
        let mut cmd = support::bin();
        cmd.env_remove("DS4_MODELS")
            .env_remove("XDG_CACHE_HOME")
            .env("HOME", home)
            .args(["pull", "--list"]);
        for (k, v) in vars {
            cmd.env(k, v);
        }
        let out = cmd.output().expect("running ds4-server");
        assert!(out.status.success(), "{vars:?}: {}", support::show(&out));
        let text = String::from_utf8_lossy(&out.stdout);
        let pull = text
            .lines()
            .find_map(|l| l.strip_prefix("cache: "))
            .unwrap_or_else(|| panic!("{vars:?}: no `cache:` line in\n{text}"));
        let env = |k: &str| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| OsString::from(v))
        };
        let tests = ds4_testkit::models_dir_from(env, Some(PathBuf::from(home)));
        assert_eq!(Path::new(pull), tests, "{vars:?}");
    }
}
