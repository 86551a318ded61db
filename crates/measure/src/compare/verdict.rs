//! The rule that decides whether a speed difference between two sides is real.
//!
//! Given per-run values of a speed (higher is better) on sides A and B, with
//! `r = median(B) / median(A)`, the difference is called significant only when
//! all of these hold:
//! 1. both sides have at least two runs — one run per side can never show that
//!    a difference exceeds run-to-run noise;
//! 2. `r` lies outside `1 ± tolerance` — smaller differences are not worth a claim
//!    whatever the statistics say;
//! 3. the ranges `[min, max]` of the two sides do not overlap — when the spread
//!    covers the difference, it is not called real;
//! 4. that complete separation is unlikely by chance: under "both sides draw from
//!    one distribution" every ordering of the pooled runs is equally likely, and
//!    only 2 of `C(n_a + n_b, n_a)` orderings separate the sides completely
//!    (exact Mann–Whitney at U = 0). We require that probability `<=` [`ALPHA`],
//!    which needs e.g. 4 + 4 runs (p = 0.029) or 3 + 5 (p = 0.036); 3 + 3 gives
//!    p = 0.1 and is refused.
//!
//! The rule is deliberately conservative: it refuses to call a difference real
//! rather than risk a false speedup. It assumes runs were interleaved (A B B A …)
//! so that drift of the machine affects both sides alike; `compare` reports the
//! order it saw.

use crate::stats::{Summary, separation_p_value};
use serde::{Deserialize, Serialize};

/// Largest chance of a complete separation we accept as significant.
pub const ALPHA: f64 = 0.05;

/// Outcome class of the rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VerdictKind {
    /// Significant, B has the higher value.
    BFaster,
    /// Significant, B has the lower value.
    BSlower,
    /// The ratio of medians lies within `1 ± tolerance`.
    WithinTolerance,
    /// A difference beyond tolerance that the data cannot support.
    NotSignificant,
    /// A side has no measurement of this metric.
    NoData,
}

/// A verdict with its reason in words.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    pub kind: VerdictKind,
    /// True only for `BFaster` / `BSlower`.
    pub significant: bool,
    /// Why, e.g. `not significant: one run per side`.
    pub reason: String,
}

/// Applies the module's rule to summaries of sides A and B (`tolerance` as a fraction).
pub fn verdict(a: Option<&Summary>, b: Option<&Summary>, tolerance: f64) -> Verdict {
    let mk = |kind, reason: String| Verdict {
        kind,
        significant: matches!(kind, VerdictKind::BFaster | VerdictKind::BSlower),
        reason,
    };
    let Some(a) = a.filter(|a| a.median > 0.0) else {
        return mk(
            VerdictKind::NoData,
            "no data: not measured on side A".into(),
        );
    };
    let Some(b) = b else {
        return mk(
            VerdictKind::NoData,
            "no data: not measured on side B".into(),
        );
    };
    let ratio = b.median / a.median;
    let pct = tolerance * 100.0;
    if a.n < 2 || b.n < 2 {
        let what = if a.n < 2 && b.n < 2 {
            "one run per side".to_string()
        } else {
            format!("runs per side {} and {}", a.n, b.n)
        };
        let reason = if (ratio - 1.0).abs() <= tolerance {
            format!("within tolerance (±{pct:.1}%), but not significant: {what}")
        } else {
            format!("not significant: {what}")
        };
        return mk(VerdictKind::NotSignificant, reason);
    }
    if (ratio - 1.0).abs() <= tolerance {
        return mk(
            VerdictKind::WithinTolerance,
            format!("within tolerance: B/A = {ratio:.3} inside 1 ± {pct:.1}%"),
        );
    }
    if a.overlaps(b) {
        return mk(
            VerdictKind::NotSignificant,
            "not significant: the spread covers the difference (ranges overlap)".into(),
        );
    }
    let p = separation_p_value(a.n, b.n);
    if p > ALPHA {
        return mk(
            VerdictKind::NotSignificant,
            format!(
                "not significant: ranges separate but {} + {} runs could do that by chance (p = {p:.3} > {ALPHA})",
                a.n, b.n
            ),
        );
    }
    let (kind, word) = if ratio > 1.0 {
        (VerdictKind::BFaster, "faster")
    } else {
        (VerdictKind::BSlower, "slower")
    };
    mk(
        kind,
        format!("significant: B {word}, B/A = {ratio:.3}, ranges separate (p = {p:.3})"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[f64]) -> Summary {
        Summary::of(v).unwrap()
    }

    #[test]
    fn one_run_per_side_is_never_significant() {
        let v = verdict(Some(&s(&[10.0])), Some(&s(&[20.0])), 0.02);
        assert_eq!(v.kind, VerdictKind::NotSignificant);
        assert!(v.reason.contains("one run per side"));
    }

    #[test]
    fn overlap_refuses() {
        let v = verdict(
            Some(&s(&[10.0, 12.0, 14.0, 9.0])),
            Some(&s(&[13.0, 15.0, 16.0, 14.5])),
            0.02,
        );
        assert_eq!(v.kind, VerdictKind::NotSignificant);
        assert!(v.reason.contains("overlap"));
    }

    #[test]
    fn separation_needs_enough_runs() {
        let three = verdict(
            Some(&s(&[10.0, 10.1, 10.2])),
            Some(&s(&[12.0, 12.1, 12.2])),
            0.02,
        );
        assert_eq!(three.kind, VerdictKind::NotSignificant);
        let four = verdict(
            Some(&s(&[10.0, 10.1, 10.2, 10.3])),
            Some(&s(&[12.0, 12.1, 12.2, 12.3])),
            0.02,
        );
        assert_eq!(four.kind, VerdictKind::BFaster);
        assert!(four.significant);
        let slower = verdict(
            Some(&s(&[12.0, 12.1, 12.2, 12.3])),
            Some(&s(&[10.0, 10.1, 10.2, 10.3])),
            0.02,
        );
        assert_eq!(slower.kind, VerdictKind::BSlower);
    }

    #[test]
    fn small_differences_are_within_tolerance() {
        let v = verdict(
            Some(&s(&[100.0, 100.1, 100.2, 100.3])),
            Some(&s(&[101.0, 101.1, 101.2, 101.3])),
            0.02,
        );
        assert_eq!(v.kind, VerdictKind::WithinTolerance);
        assert!(!v.significant);
    }

    #[test]
    fn missing_side_is_no_data() {
        assert_eq!(
            verdict(None, Some(&s(&[1.0])), 0.02).kind,
            VerdictKind::NoData
        );
        assert_eq!(
            verdict(Some(&s(&[1.0])), None, 0.02).kind,
            VerdictKind::NoData
        );
    }
}
