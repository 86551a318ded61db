//! `compare`: paired comparison of receipts.
//!
//! Receipts are grouped into sides (see [`sides`] for the rules); the first side
//! is the baseline A and every other side is compared with it. For each pair:
//! - outputs (eval): per turn, whether text and reasoning hashes, prompt, cached
//!   and generated token counts, frontier and stop reason are identical across all
//!   runs of both sides, naming the first differing turn and whether the
//!   difference is between the sides or already within one side;
//! - speeds: decode and prefill tokens/s per run (eval: over the whole
//!   conversation and per turn; bench: every run), summarised by median, range and
//!   MAD, the ratio of medians B/A, and a verdict by the rule in [`verdict`];
//! - the order the runs were made in (by start time), since only interleaved
//!   runs (A B B A …) protect against drift.
//!
//! Failed receipts are listed with their errors and left out of the statistics.

pub mod sides;
mod table;
pub mod verdict;

pub use sides::{Side, explicit_sides, group_sides};
pub use verdict::{ALPHA, Verdict, VerdictKind};

use crate::receipt::{Receipt, ReceiptError, ReceiptKind, TurnRecord};
use crate::stats::Summary;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

/// Default tolerance: 2 %.
pub const DEFAULT_TOLERANCE: f64 = 0.02;

/// Errors of `compare`.
#[derive(Debug, thiserror::Error)]
pub enum CompareError {
    /// A receipt could not be read.
    #[error(transparent)]
    Receipt(#[from] ReceiptError),
    /// No receipt was given.
    #[error("compare: no receipts given")]
    NoReceipts,
    /// Fewer than two sides.
    #[error("compare: need at least two sides, got {0}")]
    TooFewSides(usize),
    /// Sides could not be told apart.
    #[error(
        "compare: cannot tell sides apart: {files} receipts share one configuration; \
         group them with --a/--b or give each run a --label"
    )]
    AmbiguousSides { files: usize },
    /// Bench and eval receipts mixed.
    #[error("compare: receipts mix kinds ({first} in {first_file}, {other} in {other_file})")]
    MixedKinds {
        first: String,
        first_file: String,
        other: String,
        other_file: String,
    },
    /// Arguments that do not fit together.
    #[error("compare: {0}")]
    Usage(String),
    /// Writing the output failed.
    #[error("compare: writing output: {0}")]
    Io(#[from] std::io::Error),
}

/// Settings of a comparison.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CompareOptions {
    /// Relative difference of medians below which sides count as equal (0.02 = 2 %).
    pub tolerance: f64,
}

impl Default for CompareOptions {
    fn default() -> Self {
        CompareOptions {
            tolerance: DEFAULT_TOLERANCE,
        }
    }
}

/// The whole comparison (serialised as the `--json` output).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Comparison {
    /// Kind of all receipts.
    pub kind: ReceiptKind,
    /// Tolerance used, as a fraction.
    pub tolerance: f64,
    /// Largest chance of a complete separation accepted as significant.
    pub alpha: f64,
    /// One entry per side, baseline first.
    pub sides: Vec<SideSummary>,
    /// Baseline against each other side.
    pub pairs: Vec<PairComparison>,
}

/// What one side consists of and how fast it was.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SideSummary {
    pub label: String,
    pub files: Vec<String>,
    /// Runs that completed (used in statistics).
    pub runs: usize,
    /// Runs that recorded a failure (not used in statistics).
    pub failed: usize,
    /// `file: stage: message` for every recorded failure.
    pub failures: Vec<String>,
    pub binary_sha256: Option<String>,
    pub model_sha256: Option<String>,
    pub backend: String,
    /// Decode tokens/s over completed runs.
    pub decode_tok_s: Option<Summary>,
    /// Prefill tokens/s over completed runs.
    pub prefill_tok_s: Option<Summary>,
    /// `is_prime` checks (eval): runs checked and runs where every case passed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prime: Option<PrimeSummary>,
}

/// `is_prime` results of a side.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PrimeSummary {
    pub runs_checked: usize,
    pub runs_all_passed: usize,
    /// Fewest cases passed in any run, as `passed/total`.
    pub worst: String,
}

/// Baseline A against side B.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PairComparison {
    pub a: String,
    pub b: String,
    /// Configuration differences between the first runs of A and B.
    pub config_differences: Vec<String>,
    /// Side labels of the runs in start-time order, e.g. `A B B A`.
    pub order: String,
    /// Whether runs alternated (at least two switches between sides); `None` when
    /// a side has a single run.
    pub interleaved: Option<bool>,
    /// Output identity (eval only; `None` when a side has no completed run).
    pub outputs: Option<OutputComparison>,
    pub decode: MetricComparison,
    pub prefill: MetricComparison,
    /// Per-turn identity and speeds (eval only).
    pub turns: Vec<TurnComparison>,
}

/// A speed metric on both sides.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetricComparison {
    pub a: Option<Summary>,
    pub b: Option<Summary>,
    /// `median(B) / median(A)`.
    pub ratio: Option<f64>,
    pub verdict: Verdict,
}

/// Whether outputs agree across all runs of both sides.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutputComparison {
    pub identical: bool,
    pub turns_compared: usize,
    /// Index (0-based) of the first turn where any field differs.
    pub first_differing_turn: Option<usize>,
    pub first_differing_name: Option<String>,
    /// The fields that differ at that turn.
    pub first_differing_fields: Vec<FieldDiff>,
}

/// One differing field and where it differs.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct FieldDiff {
    pub field: String,
    pub scope: DiffScope,
}

/// Where a field differs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DiffScope {
    /// Each side is self-consistent but the sides disagree.
    BetweenSides,
    /// Runs of side A disagree among themselves.
    WithinA,
    /// Runs of side B disagree among themselves.
    WithinB,
}

/// One turn of an eval pair.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnComparison {
    pub index: usize,
    pub name: String,
    pub identical: bool,
    pub differing: Vec<FieldDiff>,
    pub decode: MetricComparison,
    pub prefill: MetricComparison,
}

/// Reads one compared field of a turn as text.
type FieldReader = fn(&TurnRecord) -> String;

/// Fields compared per turn, with how to read them from a turn.
const TURN_FIELDS: &[(&str, FieldReader)] = &[
    ("text_sha256", |t| t.text_sha256.clone()),
    ("reasoning_sha256", |t| format!("{:?}", t.reasoning_sha256)),
    ("prompt_tokens", |t| t.prompt_tokens.to_string()),
    ("cached_tokens", |t| t.cached_tokens.to_string()),
    ("generated_tokens", |t| t.generated_tokens.to_string()),
    ("frontier_tokens", |t| format!("{:?}", t.frontier_tokens)),
    ("frontier_sha256", |t| format!("{:?}", t.frontier_sha256)),
    ("stop_reason", |t| format!("{:?}", t.stop_reason)),
];

/// Compares `sides` (baseline first) under `opts`.
///
/// Errors: fewer than two sides, or receipts of different kinds.
pub fn compare(sides: &[Side], opts: &CompareOptions) -> Result<Comparison, CompareError> {
    if sides.len() < 2 {
        return Err(CompareError::TooFewSides(sides.len()));
    }
    let kind = check_kinds(sides)?;
    let summaries: Vec<SideSummary> = sides.iter().map(summarise_side).collect();
    let pairs = sides[1..]
        .iter()
        .map(|b| compare_pair(&sides[0], b, kind, opts))
        .collect();
    Ok(Comparison {
        kind,
        tolerance: opts.tolerance,
        alpha: ALPHA,
        sides: summaries,
        pairs,
    })
}

impl Comparison {
    /// The comparison as a text table (see `table.rs` for the layout).
    pub fn to_table(&self) -> String {
        table::render(self)
    }

    /// The comparison as pretty JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }
}

fn check_kinds(sides: &[Side]) -> Result<ReceiptKind, CompareError> {
    let mut all = sides.iter().flat_map(|s| s.receipts.iter().zip(&s.files));
    let (first, first_file) = all.next().ok_or(CompareError::NoReceipts)?;
    for (r, f) in all {
        if r.kind != first.kind {
            return Err(CompareError::MixedKinds {
                first: format!("{:?}", first.kind).to_lowercase(),
                first_file: first_file.clone(),
                other: format!("{:?}", r.kind).to_lowercase(),
                other_file: f.clone(),
            });
        }
    }
    Ok(first.kind)
}

fn completed(side: &Side) -> impl Iterator<Item = &Receipt> {
    side.receipts.iter().filter(|r| !r.is_failed())
}

/// Per-run decode speeds (eval: whole conversation; bench: every run).
fn decode_values(side: &Side) -> Vec<f64> {
    completed(side)
        .flat_map(|r| {
            let eval = r.eval.as_ref().and_then(|e| e.decode_tok_s());
            let bench = r
                .bench
                .iter()
                .flat_map(|b| b.runs.iter().filter_map(|x| x.decode_rate()));
            eval.into_iter().chain(bench).collect::<Vec<_>>()
        })
        .collect()
}

/// Per-run prefill speeds (eval: whole conversation; bench: every run).
fn prefill_values(side: &Side) -> Vec<f64> {
    completed(side)
        .flat_map(|r| {
            let eval = r.eval.as_ref().and_then(|e| e.prefill_tok_s());
            let bench = r
                .bench
                .iter()
                .flat_map(|b| b.runs.iter().filter_map(|x| x.prefill_rate()));
            eval.into_iter().chain(bench).collect::<Vec<_>>()
        })
        .collect()
}

fn turn_of(r: &Receipt, i: usize) -> Option<&TurnRecord> {
    r.eval.as_ref()?.turns.get(i)
}

fn summarise_side(side: &Side) -> SideSummary {
    let mut failures = Vec::new();
    for (r, f) in side.receipts.iter().zip(&side.files) {
        for x in &r.failures {
            failures.push(format!("{f}: {}: {}", x.stage, x.message));
        }
        if r.is_failed() && r.failures.is_empty() {
            failures.push(format!("{f}: marked failed without a recorded error"));
        }
    }
    let first = side.receipts.first();
    let checks: Vec<(u32, u32, bool)> = completed(side)
        .filter_map(|r| r.eval.as_ref()?.is_prime.as_ref())
        .map(|p| (p.passed, p.total, p.all_passed()))
        .collect();
    let prime = (!checks.is_empty()).then(|| {
        let worst = checks.iter().min_by_key(|(p, _, _)| *p).expect("non-empty");
        PrimeSummary {
            runs_checked: checks.len(),
            runs_all_passed: checks.iter().filter(|c| c.2).count(),
            worst: format!("{}/{}", worst.0, worst.1),
        }
    });
    SideSummary {
        label: side.label.clone(),
        files: side.files.clone(),
        runs: completed(side).count(),
        failed: side.receipts.iter().filter(|r| r.is_failed()).count(),
        failures,
        binary_sha256: first.and_then(|r| r.binary.sha256.clone()),
        model_sha256: first.and_then(|r| r.model.as_ref()?.sha256.clone()),
        backend: first.map(|r| r.backend.clone()).unwrap_or_default(),
        decode_tok_s: Summary::of(&decode_values(side)),
        prefill_tok_s: Summary::of(&prefill_values(side)),
        prime,
    }
}

fn metric(a: Vec<f64>, b: Vec<f64>, opts: &CompareOptions) -> MetricComparison {
    let (a, b) = (Summary::of(&a), Summary::of(&b));
    let ratio = match (&a, &b) {
        (Some(a), Some(b)) if a.median > 0.0 => Some(b.median / a.median),
        _ => None,
    };
    let verdict = verdict::verdict(a.as_ref(), b.as_ref(), opts.tolerance);
    MetricComparison {
        a,
        b,
        ratio,
        verdict,
    }
}

fn compare_pair(a: &Side, b: &Side, kind: ReceiptKind, opts: &CompareOptions) -> PairComparison {
    let config_differences = match (a.receipts.first(), b.receipts.first()) {
        (Some(x), Some(y)) => sides::config_differences(x, y),
        _ => Vec::new(),
    };
    let (order, interleaved) = run_order(a, b);
    let decode = metric(decode_values(a), decode_values(b), opts);
    let prefill = metric(prefill_values(a), prefill_values(b), opts);
    let (outputs, turns) = if kind == ReceiptKind::Eval {
        compare_turns(a, b, opts)
    } else {
        (None, Vec::new())
    };
    PairComparison {
        a: a.label.clone(),
        b: b.label.clone(),
        config_differences,
        order,
        interleaved,
        outputs,
        decode,
        prefill,
        turns,
    }
}

/// Side labels by start time, and whether the runs alternated.
fn run_order(a: &Side, b: &Side) -> (String, Option<bool>) {
    let mut runs: Vec<(&str, &str)> = a
        .receipts
        .iter()
        .map(|r| (r.started_at.as_str(), a.label.as_str()))
        .chain(
            b.receipts
                .iter()
                .map(|r| (r.started_at.as_str(), b.label.as_str())),
        )
        .collect();
    // RFC 3339 UTC strings of one format sort chronologically.
    runs.sort();
    let labels: Vec<&str> = runs.iter().map(|(_, l)| *l).collect();
    let switches = labels.windows(2).filter(|w| w[0] != w[1]).count();
    let interleaved = (a.receipts.len() >= 2 && b.receipts.len() >= 2).then_some(switches >= 2);
    (labels.join(" "), interleaved)
}

fn compare_turns(
    a: &Side,
    b: &Side,
    opts: &CompareOptions,
) -> (Option<OutputComparison>, Vec<TurnComparison>) {
    let (ra, rb): (Vec<&Receipt>, Vec<&Receipt>) = (completed(a).collect(), completed(b).collect());
    if ra.is_empty() || rb.is_empty() {
        return (None, Vec::new());
    }
    let n_turns = ra
        .iter()
        .chain(&rb)
        .filter_map(|r| r.eval.as_ref())
        .map(|e| e.turns.len())
        .max()
        .unwrap_or(0);
    let mut turns = Vec::with_capacity(n_turns);
    for i in 0..n_turns {
        let mut differing = BTreeSet::new();
        for (field, get) in TURN_FIELDS {
            let values = |rs: &[&Receipt]| -> BTreeSet<String> {
                rs.iter()
                    .map(|r| turn_of(r, i).map_or_else(|| "<missing turn>".to_string(), get))
                    .collect()
            };
            let (va, vb) = (values(&ra), values(&rb));
            if va.len() > 1 {
                differing.insert(FieldDiff {
                    field: field.to_string(),
                    scope: DiffScope::WithinA,
                });
            }
            if vb.len() > 1 {
                differing.insert(FieldDiff {
                    field: field.to_string(),
                    scope: DiffScope::WithinB,
                });
            }
            if va.len() == 1 && vb.len() == 1 && va != vb {
                differing.insert(FieldDiff {
                    field: field.to_string(),
                    scope: DiffScope::BetweenSides,
                });
            }
        }
        let name = ra
            .iter()
            .chain(&rb)
            .find_map(|r| turn_of(r, i))
            .map(|t| t.name.clone())
            .unwrap_or_default();
        let per_run = |rs: &[&Receipt], f: fn(&TurnRecord) -> Option<f64>| -> Vec<f64> {
            rs.iter()
                .filter_map(|r| turn_of(r, i).and_then(f))
                .collect()
        };
        turns.push(TurnComparison {
            index: i,
            name,
            identical: differing.is_empty(),
            differing: differing.into_iter().collect(),
            decode: metric(
                per_run(&ra, TurnRecord::decode_rate),
                per_run(&rb, TurnRecord::decode_rate),
                opts,
            ),
            prefill: metric(
                per_run(&ra, TurnRecord::prefill_tok_s),
                per_run(&rb, TurnRecord::prefill_tok_s),
                opts,
            ),
        });
    }
    let first = turns.iter().find(|t| !t.identical);
    let outputs = OutputComparison {
        identical: first.is_none(),
        turns_compared: n_turns,
        first_differing_turn: first.map(|t| t.index),
        first_differing_name: first.map(|t| t.name.clone()),
        first_differing_fields: first.map(|t| t.differing.clone()).unwrap_or_default(),
    };
    (Some(outputs), turns)
}
