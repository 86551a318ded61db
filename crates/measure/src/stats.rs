//! Small, exact statistics for repeated measurements: median, spread, and the
//! significance of a complete separation between two samples.
//!
//! Used by `compare` (receipts) and by `bench` (runs). Samples are plain `f64`
//! values in whatever unit the caller measures (tokens/s, ms); non-finite values
//! (NaN, ±inf) are not measurements and are dropped before any statistic is taken.
//!
//! The separation test is the exact Mann–Whitney U test at its extreme (U = 0):
//! under the null hypothesis that both sides draw from one distribution, every
//! interleaving of the `n_a + n_b` sorted values is equally likely, and exactly two
//! of the `C(n_a + n_b, n_a)` interleavings put one side entirely above the other.

use serde::{Deserialize, Serialize};

/// Summary of one sample: size, median, extremes and median absolute deviation.
///
/// All fields are in the unit of the input values, except `rel_spread` (a fraction).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Number of finite values summarised (>= 1).
    pub n: usize,
    /// Median (mean of the two middle values for an even count).
    pub median: f64,
    /// Smallest value.
    pub min: f64,
    /// Largest value.
    pub max: f64,
    /// Median absolute deviation from the median (unscaled).
    pub mad: f64,
    /// `(max - min) / median`, the full range relative to the median; 0 when the
    /// median is 0.
    pub rel_spread: f64,
}

impl Summary {
    /// Summarises the finite values of `values`; `None` when there are none.
    pub fn of(values: &[f64]) -> Option<Summary> {
        let sorted = sorted_finite(values);
        let median = median_sorted(&sorted)?;
        let deviations: Vec<f64> = sorted.iter().map(|v| (v - median).abs()).collect();
        let mad = median_sorted(&sorted_finite(&deviations))?;
        let (min, max) = (sorted[0], sorted[sorted.len() - 1]);
        let rel_spread = if median == 0.0 {
            0.0
        } else {
            (max - min) / median.abs()
        };
        Some(Summary {
            n: sorted.len(),
            median,
            min,
            max,
            mad,
            rel_spread,
        })
    }

    /// Whether the closed ranges `[min, max]` of the two samples share a point.
    pub fn overlaps(&self, other: &Summary) -> bool {
        self.min <= other.max && other.min <= self.max
    }
}

/// Median of the finite values of `values`; `None` when there are none.
pub fn median(values: &[f64]) -> Option<f64> {
    median_sorted(&sorted_finite(values))
}

/// Median absolute deviation (unscaled) of the finite values; `None` when there are none.
pub fn mad(values: &[f64]) -> Option<f64> {
    Summary::of(values).map(|s| s.mad)
}

/// Two-sided exact p-value of a complete separation (Mann–Whitney U = 0) between
/// samples of sizes `n_a` and `n_b` with no ties: `2 / C(n_a + n_b, n_a)`, capped at 1.
///
/// Examples: 1 vs 1 gives 1.0, 2 vs 2 gives 1/3, 3 vs 3 gives 0.1, 4 vs 4 gives
/// 2/70 ≈ 0.029. Returns 1.0 when either side is empty.
pub fn separation_p_value(n_a: usize, n_b: usize) -> f64 {
    if n_a == 0 || n_b == 0 {
        return 1.0;
    }
    // C(n_a + n_b, k) computed incrementally in f64; exact for the sizes we meet
    // (it stays an integer-valued product while it is below 2^53).
    let k = n_a.min(n_b);
    let n = n_a + n_b;
    let mut c = 1.0f64;
    for i in 0..k {
        c = c * (n - i) as f64 / (i + 1) as f64;
    }
    (2.0 / c).min(1.0)
}

fn sorted_finite(values: &[f64]) -> Vec<f64> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    v.sort_by(f64::total_cmp);
    v
}

fn median_sorted(sorted: &[f64]) -> Option<f64> {
    let n = sorted.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(sorted[n / 2]),
        _ => Some((sorted[n / 2 - 1] + sorted[n / 2]) / 2.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_odd_even_and_unsorted() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[f64::NAN, 5.0]), Some(5.0));
    }

    #[test]
    fn summary_of_known_sample() {
        // Values 1,2,3,4,100: median 3, deviations 2,1,0,1,97 -> MAD 1.
        let s = Summary::of(&[100.0, 1.0, 2.0, 3.0, 4.0]).unwrap();
        assert_eq!(s.n, 5);
        assert_eq!(s.median, 3.0);
        assert_eq!(s.min, 1.0);
        assert_eq!(s.max, 100.0);
        assert_eq!(s.mad, 1.0);
        assert_eq!(s.rel_spread, 33.0);
    }

    #[test]
    fn overlap_of_ranges() {
        let a = Summary::of(&[1.0, 2.0]).unwrap();
        let b = Summary::of(&[2.0, 3.0]).unwrap();
        let c = Summary::of(&[2.5, 3.0]).unwrap();
        assert!(a.overlaps(&b));
        assert!(!a.overlaps(&c));
        assert!(!c.overlaps(&a));
    }

    #[test]
    fn separation_p_values_match_binomials() {
        // 2 / C(n, k) by hand: C(2,1)=2, C(4,2)=6, C(6,3)=20, C(8,4)=70, C(8,3)=56.
        assert_eq!(separation_p_value(1, 1), 1.0);
        assert!((separation_p_value(2, 2) - 2.0 / 6.0).abs() < 1e-12);
        assert!((separation_p_value(3, 3) - 0.1).abs() < 1e-12);
        assert!((separation_p_value(4, 4) - 2.0 / 70.0).abs() < 1e-12);
        assert!((separation_p_value(3, 5) - 2.0 / 56.0).abs() < 1e-12);
        assert_eq!(separation_p_value(0, 5), 1.0);
    }
}
