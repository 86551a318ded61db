//! Text rendering of a [`Comparison`]: a sides table, then per pair the
//! configuration differences, run order, output identity, per-turn rows (eval)
//! and the metric verdicts, then failures.

use super::{Comparison, DiffScope, FieldDiff, MetricComparison, PairComparison};
use crate::compare::sides::short;
use crate::stats::Summary;
use std::fmt::Write;

pub(super) fn render(c: &Comparison) -> String {
    let mut s = String::new();
    let kind = format!("{:?}", c.kind).to_lowercase();
    let _ = writeln!(
        s,
        "compare {kind}: tolerance ±{:.1}%; significant only beyond tolerance with non-overlapping ranges (p ≤ {})",
        c.tolerance * 100.0,
        c.alpha
    );
    let mut rows = vec![cells(&[
        "side",
        "receipts",
        "failed",
        "binary",
        "model",
        "backend",
        "decode tok/s",
        "prefill tok/s",
    ])];
    for side in &c.sides {
        rows.push(vec![
            side.label.clone(),
            side.runs.to_string(),
            side.failed.to_string(),
            side.binary_sha256.as_deref().map_or("-".into(), short),
            side.model_sha256.as_deref().map_or("-".into(), short),
            side.backend.clone(),
            summary_cell(side.decode_tok_s.as_ref()),
            summary_cell(side.prefill_tok_s.as_ref()),
        ]);
    }
    push_table(&mut s, &rows, "");
    for side in &c.sides {
        if let Some(p) = &side.prime {
            let _ = writeln!(
                s,
                "is_prime {}: all cases passed in {}/{} runs (worst {})",
                side.label, p.runs_all_passed, p.runs_checked, p.worst
            );
        }
    }
    for pair in &c.pairs {
        render_pair(&mut s, pair);
    }
    let failures: Vec<String> = c
        .sides
        .iter()
        .flat_map(|side| {
            side.failures
                .iter()
                .map(move |f| format!("  {} {f}", side.label))
        })
        .collect();
    if !failures.is_empty() {
        let _ = writeln!(s, "\nfailed runs (kept, not in statistics):");
        for f in failures {
            let _ = writeln!(s, "{f}");
        }
    }
    s
}

fn render_pair(s: &mut String, p: &PairComparison) {
    let _ = writeln!(s, "\n{} vs {}", p.a, p.b);
    if p.config_differences.is_empty() {
        let _ = writeln!(s, "  config: no difference recorded");
    } else {
        let _ = writeln!(s, "  config: {}", p.config_differences.join("; "));
    }
    let inter = match p.interleaved {
        Some(true) => "interleaved",
        Some(false) => "NOT interleaved: drift can pass for a difference",
        None => "single run on a side",
    };
    let _ = writeln!(s, "  order: {} ({inter})", p.order);
    if let Some(o) = &p.outputs {
        match o.first_differing_turn {
            None => {
                let _ = writeln!(s, "  outputs: identical over {} turns", o.turns_compared);
            }
            Some(t) => {
                let _ = writeln!(
                    s,
                    "  outputs: DIFFER — first differing turn {t} ({}): {}",
                    o.first_differing_name.as_deref().unwrap_or("?"),
                    diffs(&o.first_differing_fields)
                );
            }
        }
    }
    if !p.turns.is_empty() {
        let mut rows = vec![cells(&[
            "turn",
            "name",
            "same",
            "decode A",
            "decode B",
            "B/A",
            "prefill A",
            "prefill B",
            "B/A",
        ])];
        for t in &p.turns {
            rows.push(vec![
                t.index.to_string(),
                t.name.clone(),
                if t.identical {
                    "yes".into()
                } else {
                    "NO".into()
                },
                median_cell(t.decode.a.as_ref()),
                median_cell(t.decode.b.as_ref()),
                ratio_cell(t.decode.ratio),
                median_cell(t.prefill.a.as_ref()),
                median_cell(t.prefill.b.as_ref()),
                ratio_cell(t.prefill.ratio),
            ]);
        }
        push_table(s, &rows, "  ");
    }
    let mut rows = vec![cells(&[
        "metric",
        "A median [min–max] MAD",
        "B median [min–max] MAD",
        "B/A",
        "verdict",
    ])];
    for (name, m) in [("decode tok/s", &p.decode), ("prefill tok/s", &p.prefill)] {
        rows.push(metric_row(name, m));
    }
    push_table(s, &rows, "  ");
}

fn metric_row(name: &str, m: &MetricComparison) -> Vec<String> {
    let cell = |x: Option<&Summary>| {
        x.map_or("-".into(), |x| {
            format!("{} mad {:.2}", summary_cell(Some(x)), x.mad)
        })
    };
    vec![
        name.into(),
        cell(m.a.as_ref()),
        cell(m.b.as_ref()),
        ratio_cell(m.ratio),
        m.verdict.reason.clone(),
    ]
}

fn diffs(d: &[FieldDiff]) -> String {
    d.iter()
        .map(|f| {
            let scope = match f.scope {
                DiffScope::BetweenSides => "between sides",
                DiffScope::WithinA => "within A",
                DiffScope::WithinB => "within B",
            };
            format!("{} ({scope})", f.field)
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn cells(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

fn summary_cell(x: Option<&Summary>) -> String {
    x.map_or("-".into(), |x| {
        format!("{:.2} [{:.2}–{:.2}] n={}", x.median, x.min, x.max, x.n)
    })
}

fn median_cell(x: Option<&Summary>) -> String {
    x.map_or("-".into(), |x| format!("{:.2}", x.median))
}

fn ratio_cell(r: Option<f64>) -> String {
    r.map_or("-".into(), |r| format!("{r:.3}"))
}

/// Appends rows with columns padded to their widest cell (by characters).
fn push_table(s: &mut String, rows: &[Vec<String>], indent: &str) {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..cols)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|x| x.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    for row in rows {
        let mut line = String::from(indent);
        for (c, cell) in row.iter().enumerate() {
            if c + 1 == row.len() {
                line.push_str(cell);
            } else {
                let pad = widths[c] - cell.chars().count();
                line.push_str(cell);
                line.push_str(&" ".repeat(pad + 2));
            }
        }
        let _ = writeln!(s, "{}", line.trim_end());
    }
}
