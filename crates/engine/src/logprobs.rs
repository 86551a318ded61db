//! Log-probabilities of a logits row: log-softmax in f64 (non-finite logits have
//! probability 0) and the k most likely tokens, ties by increasing id.

/// `log(sum(exp(row)))` over the finite values, in f64.
pub fn log_sum_exp(row: &[f32]) -> f64 {
    let max = row
        .iter()
        .copied()
        .filter(|v| v.is_finite())
        .fold(f32::NEG_INFINITY, f32::max) as f64;
    max + row
        .iter()
        .filter(|v| v.is_finite())
        .map(|&v| (v as f64 - max).exp())
        .sum::<f64>()
        .ln()
}

/// The log-probability of token `id` under `row`.
pub fn logprob(row: &[f32], id: u32) -> f64 {
    row[id as usize] as f64 - log_sum_exp(row)
}

/// The `k` most likely `(id, logprob)` of a logits row, most likely first, ties by
/// increasing id.
pub fn top_logprobs(row: &[f32], k: usize) -> Vec<(u32, f64)> {
    let lse = log_sum_exp(row);
    let mut ids: Vec<u32> = (0..row.len() as u32)
        .filter(|&i| row[i as usize].is_finite())
        .collect();
    let k = k.min(ids.len());
    let cmp = |a: &u32, b: &u32| row[*b as usize].total_cmp(&row[*a as usize]).then(a.cmp(b));
    if k > 0 && k < ids.len() {
        ids.select_nth_unstable_by(k - 1, cmp);
    }
    ids.truncate(k);
    ids.sort_by(cmp);
    ids.into_iter()
        .map(|i| (i, row[i as usize] as f64 - lse))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_a_hand_computed_softmax() {
        // softmax([0, ln 3]) = [1/4, 3/4]
        let row = [0.0f32, 3f32.ln(), f32::NEG_INFINITY];
        let top = top_logprobs(&row, 5);
        assert_eq!(top.len(), 2);
        assert_eq!(top[0].0, 1);
        assert!((top[0].1 - 0.75f64.ln()).abs() < 1e-6);
        assert!((top[1].1 - 0.25f64.ln()).abs() < 1e-6);
    }

    #[test]
    fn ties_keep_increasing_id() {
        let row = [1.0f32, 2.0, 2.0, 0.5];
        let ids: Vec<u32> = top_logprobs(&row, 3).iter().map(|p| p.0).collect();
        assert_eq!(ids, [1, 2, 0]);
    }
}
