//! Every test that can skip shows its `skipped:` line: each test binary that calls one of
//! `ds4_testkit`'s skipping functions (directly, or through a helper of its
//! `tests/support` or `tests/common` module that calls one) and each source file whose
//! unit tests call one is named in the filter of `.config/nextest.toml` whose passing
//! output is shown.

use std::path::{Path, PathBuf};

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The `.rs` files under `dir`, recursively.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// `ds4_testkit`'s functions that skip a test (or fail it under CI).
const SKIPPING: [&str; 5] = ["model(", "fixture(", "python3(", "require(", "missing("];

/// Whether `text` calls one of [`SKIPPING`].
fn calls_skipping(text: &str) -> bool {
    SKIPPING
        .iter()
        .any(|f| text.contains(&format!("ds4_testkit::{f}")))
}

/// The public functions of a helper module whose bodies call one of [`SKIPPING`].
fn wrappers(module: &str) -> Vec<String> {
    let mut out = Vec::new();
    for part in module.split("\npub fn ").skip(1) {
        let name: String = part
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let body = part.split("\n}\n").next().unwrap_or("");
        if calls_skipping(body) {
            out.push(name);
        }
    }
    out
}

/// The section of `.config/nextest.toml` that shows passing output: its `filter`.
fn shown_filter(config: &str) -> String {
    let section = config
        .split("[[profile.default.overrides]]")
        .find(|s| s.contains("success-output = \"final\""))
        .expect("an override with success-output = \"final\"");
    let start = section.find("filter = '''").expect("a ''' filter") + 12;
    let end = start + section[start..].find("'''").expect("the filter's end");
    section[start..end].to_string()
}

#[test]
fn every_test_that_can_skip_shows_its_output() {
    let root = ds4_testkit::workspace_dir();
    let filter = shown_filter(&read(&root.join(".config/nextest.toml")));
    let mut missing = Vec::new();
    let mut crates: Vec<PathBuf> = std::fs::read_dir(root.join("crates"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    crates.sort();
    for krate in crates {
        let Some(manifest) = std::fs::read_to_string(krate.join("Cargo.toml")).ok() else {
            continue;
        };
        let package = manifest
            .lines()
            .find_map(|l| l.strip_prefix("name = \""))
            .and_then(|l| l.strip_suffix('"'))
            .unwrap_or_else(|| panic!("{}: package name", krate.display()))
            .to_string();
        // Helpers of the integration tests that call the testkit.
        let mut helpers = Vec::new();
        for dir in ["support", "common"] {
            if let Ok(m) = std::fs::read_to_string(krate.join("tests").join(dir).join("mod.rs")) {
                helpers.extend(wrappers(&m).into_iter().map(|f| (dir, f)));
            }
        }
        let mut tests = Vec::new();
        if let Ok(entries) = std::fs::read_dir(krate.join("tests")) {
            tests.extend(
                entries
                    .flatten()
                    .map(|e| e.path())
                    .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "rs")),
            );
        }
        for t in tests {
            let text = read(&t);
            let uses_helper = helpers.iter().any(|(dir, f)| {
                text.contains(&format!("{dir}::{f}("))
                    || text.lines().any(|l| {
                        l.starts_with(&format!("use {dir}::"))
                            && l.split(|c: char| !c.is_alphanumeric() && c != '_')
                                .any(|w| w == f)
                    })
            });
            if calls_skipping(&text) || uses_helper {
                let stem = t.file_stem().unwrap().to_string_lossy();
                let id = format!("binary_id({package}::{stem})");
                if !filter.contains(&id) {
                    missing.push(id);
                }
            }
        }
        // Unit tests in the sources: the module's tests, by path.
        let mut sources = Vec::new();
        rust_files(&krate.join("src"), &mut sources);
        sources.sort();
        for s in sources {
            if !calls_skipping(&read(&s)) {
                continue;
            }
            let rel = s
                .strip_prefix(krate.join("src"))
                .unwrap()
                .with_extension("");
            let module = rel.to_string_lossy().replace('/', "::");
            let module = module.trim_end_matches("::mod");
            let needle = format!("package({package}) & test(/^{module}::/)");
            if !filter.contains(&needle) {
                missing.push(needle);
            }
        }
    }
    assert!(
        missing.is_empty(),
        "tests that can skip but whose output .config/nextest.toml hides; add to its \
         filter:\n{}",
        missing.join("\n")
    );
}
