//! `make chat` (`cargo build --release --bin ds4-server`) and `make test` (`cargo
//! nextest run --workspace --release`) must share one build: every dependency of the
//! binary must be resolved with the same features in both, or the second command
//! compiles it (and everything above it) again. Dev-dependencies (reqwest, proptest,
//! criterion, rexpect) turn on extra features of crates the binary uses; the
//! `ds4-workspace-hack` crate (kept by `cargo hakari generate`) asks for them in the
//! binary's build too. This test compares the two feature resolutions with `cargo tree`.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

/// `cargo tree ARGS` as `name version [proc-macro]` → the feature lists it appears with.
fn features(args: &[&str]) -> BTreeMap<String, BTreeSet<String>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["tree", "--locked", "--offline", "--prefix", "none"])
        .args(["--format", "{p}|{f}"])
        .args(args)
        .output()
        .expect("running cargo tree");
    assert!(
        out.status.success(),
        "cargo tree {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut map: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in String::from_utf8(out.stdout).unwrap().lines() {
        let Some((pkg, feats)) = line.split_once('|') else {
            continue;
        };
        // `{p}` is `name vX.Y.Z`, then `(path)` for workspace crates and `(proc-macro)`
        // for proc macros; `(*)` marks a repeat.
        let mut words = pkg.split_whitespace();
        let (Some(name), Some(version)) = (words.next(), words.next()) else {
            continue;
        };
        let macro_mark = if pkg.contains("(proc-macro)") {
            " proc-macro"
        } else {
            ""
        };
        let feats = feats.trim_end_matches(" (*)").trim().to_string();
        map.entry(format!("{name} {version}{macro_mark}"))
            .or_default()
            .insert(feats);
    }
    map
}

#[test]
fn the_binary_and_the_test_suite_resolve_the_same_features() {
    let binary = features(&["-p", "ds4-cli", "--edges", "normal,build"]);
    let suite = features(&["--workspace", "--edges", "normal,build,dev"]);
    assert!(
        binary.len() > 100 && binary.keys().any(|k| k.starts_with("tokio v")),
        "cargo tree output not understood: {binary:?}"
    );
    let differ: Vec<String> = binary
        .iter()
        .filter(|(pkg, f)| suite.get(*pkg) != Some(f))
        .map(|(pkg, f)| format!("{pkg}: binary {f:?}, tests {:?}", suite.get(pkg)))
        .collect();
    assert!(
        differ.is_empty(),
        "`make test` would recompile these dependencies of `make chat`'s build; \
         run `cargo hakari generate` (cargo install cargo-hakari):\n{}",
        differ.join("\n")
    );
}
