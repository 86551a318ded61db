//! Deciding which receipts belong to which side of a comparison.
//!
//! Explicit grouping (`--a FILES… --b FILES…`) is used as given. For plain
//! positional files:
//! 1. if every receipt carries a `label`, receipts with the same label form a side;
//! 2. otherwise receipts with the same configuration fingerprint (kind, binary
//!    sha256, model sha256, backend, settings) form a side;
//! 3. if that yields a single side and there are exactly two files, each file is
//!    a side (two runs of the same binary compared against each other);
//! 4. otherwise the grouping is ambiguous and the caller must say (`--a/--b` or
//!    `--label` when producing receipts).
//!
//! Sides keep the order in which their first receipt was given; the first side is
//! the baseline ("A").

use super::CompareError;
use crate::receipt::Receipt;
use serde_json::Value;

/// One side of a comparison: its runs and the files they came from.
#[derive(Debug, Clone)]
pub struct Side {
    /// Display label (`A`, `B`, … or the receipts' label).
    pub label: String,
    /// The runs, in the order given.
    pub receipts: Vec<Receipt>,
    /// Where each receipt came from (same order).
    pub files: Vec<String>,
}

/// Letters for unlabeled sides: A, B, …, Z, then S27, S28, ….
pub fn side_letter(i: usize) -> String {
    match u8::try_from(i) {
        Ok(i) if i < 26 => char::from(b'A' + i).to_string(),
        _ => format!("S{}", i + 1),
    }
}

/// Groups positional receipts `(file name, receipt)` into sides by the module's rules.
///
/// Errors: [`CompareError::NoReceipts`], [`CompareError::AmbiguousSides`].
pub fn group_sides(files: Vec<(String, Receipt)>) -> Result<Vec<Side>, CompareError> {
    if files.is_empty() {
        return Err(CompareError::NoReceipts);
    }
    let all_labeled = files.iter().all(|(_, r)| r.label.is_some());
    let key = |r: &Receipt| {
        if all_labeled {
            r.label.clone().unwrap_or_default()
        } else {
            fingerprint(r)
        }
    };
    let mut sides: Vec<(String, Side)> = Vec::new();
    for (file, r) in files {
        let k = key(&r);
        let pos = match sides.iter().position(|(sk, _)| *sk == k) {
            Some(p) => p,
            None => {
                let label = if all_labeled {
                    k.clone()
                } else {
                    side_letter(sides.len())
                };
                sides.push((
                    k,
                    Side {
                        label,
                        receipts: Vec::new(),
                        files: Vec::new(),
                    },
                ));
                sides.len() - 1
            }
        };
        sides[pos].1.receipts.push(r);
        sides[pos].1.files.push(file);
    }
    let mut sides: Vec<Side> = sides.into_iter().map(|(_, s)| s).collect();
    if sides.len() == 1 {
        let only = sides.pop().expect("one side");
        if only.receipts.len() != 2 {
            return Err(CompareError::AmbiguousSides {
                files: only.files.len(),
            });
        }
        sides = only
            .receipts
            .into_iter()
            .zip(only.files)
            .enumerate()
            .map(|(i, (r, f))| Side {
                label: side_letter(i),
                receipts: vec![r],
                files: vec![f],
            })
            .collect();
    }
    Ok(sides)
}

/// Sides given explicitly: `(label, [(file, receipt)…])` per side.
pub fn explicit_sides(groups: Vec<(String, Vec<(String, Receipt)>)>) -> Vec<Side> {
    groups
        .into_iter()
        .map(|(label, rs)| {
            let (files, receipts) = rs.into_iter().unzip();
            Side {
                label,
                receipts,
                files,
            }
        })
        .collect()
}

/// The configuration identity of a receipt: kind, binary and model sha256 (paths
/// when unhashed), backend and canonical settings.
pub fn fingerprint(r: &Receipt) -> String {
    let art = |a: Option<&crate::receipt::Artifact>| {
        a.map_or(String::new(), |a| {
            a.sha256.clone().unwrap_or_else(|| a.path.clone())
        })
    };
    format!(
        "{:?}|{}|{}|{}|{}",
        r.kind,
        art(Some(&r.binary)),
        art(r.model.as_ref()),
        r.backend,
        canonical_json(&Value::Object(r.settings.clone()))
    )
}

/// JSON text with object keys sorted at every level (stable whatever map order
/// serde_json was built with).
pub fn canonical_json(v: &Value) -> String {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            let parts: Vec<String> = keys
                .into_iter()
                .map(|k| format!("{}:{}", Value::String(k.clone()), canonical_json(&m[k])))
                .collect();
            format!("{{{}}}", parts.join(","))
        }
        Value::Array(a) => format!(
            "[{}]",
            a.iter().map(canonical_json).collect::<Vec<_>>().join(",")
        ),
        other => other.to_string(),
    }
}

/// Human-readable configuration differences between two receipts (`what: a → b`).
pub fn config_differences(a: &Receipt, b: &Receipt) -> Vec<String> {
    let mut out = Vec::new();
    let mut diff = |what: &str, x: String, y: String| {
        if x != y {
            out.push(format!("{what}: {x} → {y}"));
        }
    };
    let sha = |a: Option<&crate::receipt::Artifact>| {
        a.and_then(|a| a.sha256.clone())
            .map_or("-".to_string(), |s| short(&s))
    };
    diff("binary sha256", sha(Some(&a.binary)), sha(Some(&b.binary)));
    diff("model sha256", sha(a.model.as_ref()), sha(b.model.as_ref()));
    diff("backend", a.backend.clone(), b.backend.clone());
    let opt = |s: &Option<String>| s.clone().unwrap_or_else(|| "-".into());
    diff("git commit", opt(&a.git_commit), opt(&b.git_commit));
    diff("cpu", opt(&a.machine.cpu_model), opt(&b.machine.cpu_model));
    let gpu = |r: &Receipt| {
        r.machine
            .gpu
            .as_ref()
            .map_or("-".to_string(), |g| g.name.clone())
    };
    diff("gpu", gpu(a), gpu(b));
    let mut keys: Vec<&String> = a.settings.keys().chain(b.settings.keys()).collect();
    keys.sort();
    keys.dedup();
    for k in keys {
        let val = |r: &Receipt| r.settings.get(k).map_or("-".to_string(), canonical_json);
        diff(&format!("settings.{k}"), val(a), val(b));
    }
    out
}

/// First 12 hex digits of a digest.
pub fn short(sha: &str) -> String {
    sha.chars().take(12).collect()
}
