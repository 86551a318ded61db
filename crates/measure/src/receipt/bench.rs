//! Bench results inside a receipt: every run is kept (not only medians), so that
//! `compare` can judge spread.

use crate::stats::Summary;
use serde::{Deserialize, Serialize};

/// Results of one `bench` invocation.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BenchResults {
    /// Prompt length requested, tokens.
    pub prompt_tokens: u64,
    /// Tokens to generate per run.
    pub gen_tokens: u64,
    /// Warm-up runs done before the measured ones (not in `runs`).
    #[serde(default)]
    pub warmup_runs: u32,
    /// Every measured run, in execution order.
    pub runs: Vec<BenchRun>,
}

/// One measured bench run. Speeds in tokens/s, times in ms, bandwidth in GB/s;
/// `None` when not measured.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BenchRun {
    /// Tokens prefilled.
    pub prefill_tokens: u64,
    /// Prefill time, ms.
    #[serde(default)]
    pub prefill_ms: Option<f64>,
    /// Prefill speed, tokens/s.
    #[serde(default)]
    pub prefill_tok_s: Option<f64>,
    /// Tokens decoded.
    pub decode_tokens: u64,
    /// Decode time, ms.
    #[serde(default)]
    pub decode_ms: Option<f64>,
    /// Decode speed, tokens/s.
    #[serde(default)]
    pub decode_tok_s: Option<f64>,
    /// Achieved weight-read bandwidth during decode, GB/s (GPU backends).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decode_bandwidth_gbs: Option<f64>,
    /// `decode_bandwidth_gbs` over the measured device ceiling, a fraction (GPU backends).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bandwidth_fraction: Option<f64>,
    /// Further backend-specific numbers (free-form).
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl BenchRun {
    /// Prefill speed: `prefill_tok_s`, else derived from `prefill_ms`.
    pub fn prefill_rate(&self) -> Option<f64> {
        rate(self.prefill_tok_s, self.prefill_tokens, self.prefill_ms)
    }

    /// Decode speed: `decode_tok_s`, else derived from `decode_ms`.
    pub fn decode_rate(&self) -> Option<f64> {
        rate(self.decode_tok_s, self.decode_tokens, self.decode_ms)
    }
}

impl BenchResults {
    /// Median and spread of the prefill speeds of all runs; `None` without any.
    pub fn prefill_summary(&self) -> Option<Summary> {
        let v: Vec<f64> = self
            .runs
            .iter()
            .filter_map(BenchRun::prefill_rate)
            .collect();
        Summary::of(&v)
    }

    /// Median and spread of the decode speeds of all runs; `None` without any.
    pub fn decode_summary(&self) -> Option<Summary> {
        let v: Vec<f64> = self.runs.iter().filter_map(BenchRun::decode_rate).collect();
        Summary::of(&v)
    }
}

fn rate(reported: Option<f64>, tokens: u64, ms: Option<f64>) -> Option<f64> {
    reported.filter(|v| v.is_finite() && *v > 0.0).or_else(|| {
        let ms = ms.filter(|ms| *ms > 0.0)?;
        (tokens > 0).then(|| tokens as f64 * 1000.0 / ms)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summaries_use_all_runs() {
        let run = |tok_s: f64| BenchRun {
            decode_tokens: 100,
            decode_tok_s: Some(tok_s),
            prefill_tokens: 512,
            prefill_ms: Some(256.0),
            ..Default::default()
        };
        let r = BenchResults {
            runs: vec![run(10.0), run(30.0), run(20.0)],
            ..Default::default()
        };
        let d = r.decode_summary().unwrap();
        assert_eq!((d.n, d.median, d.min, d.max), (3, 20.0, 10.0, 30.0));
        assert_eq!(r.prefill_summary().unwrap().median, 2000.0);
    }
}
