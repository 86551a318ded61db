//! Eval results inside a receipt: one record per chat turn, plus the separate
//! check of the `is_prime` answer (see issue 6: a turn's termination and the
//! correctness of its code are recorded independently).

use serde::{Deserialize, Serialize};

/// Results of one `eval` run: the warm-up session and the turns of the conversation.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EvalResults {
    /// The separate warm-up session's single turn, when one ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warmup: Option<TurnRecord>,
    /// The conversation's turns, in order (summarise, story, is_prime by default).
    pub turns: Vec<TurnRecord>,
    /// The extracted `is_prime` answer checked in a sandboxed subprocess; `None`
    /// when the check did not run (e.g. the run failed before that turn).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub is_prime: Option<PrimeCheck>,
}

impl EvalResults {
    /// Decode speed of the whole conversation, tokens/s: generated tokens over
    /// decode time, summed over the turns (not the warm-up) whose decode was
    /// measured; `None` when none was.
    pub fn decode_tok_s(&self) -> Option<f64> {
        let (tokens, ms) = self
            .turns
            .iter()
            .filter_map(|t| {
                Some((
                    t.generated_tokens,
                    t.decode_time_ms().filter(|ms| *ms > 0.0)?,
                ))
            })
            .fold((0u64, 0.0f64), |(n, ms), (tn, tms)| (n + tn, ms + tms));
        (ms > 0.0 && tokens > 0).then(|| tokens as f64 * 1000.0 / ms)
    }

    /// Prefill speed of the whole conversation, tokens/s: prefilled tokens over
    /// prefill time, summed over the turns whose prefill was measured.
    pub fn prefill_tok_s(&self) -> Option<f64> {
        let (tokens, ms) = self
            .turns
            .iter()
            .filter_map(|t| Some((t.prefilled_tokens(), t.prefill_ms.filter(|ms| *ms > 0.0)?)))
            .fold((0u64, 0.0f64), |(n, ms), (tn, tms)| (n + tn, ms + tms));
        (ms > 0.0 && tokens > 0).then(|| tokens as f64 * 1000.0 / ms)
    }
}

/// Why generation of a turn ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// The model emitted an end-of-generation token.
    Eos,
    /// The per-turn token cap was reached.
    Length,
    /// A stop string or stop token from the request matched.
    Stop,
    /// Generation failed; the receipt's `failures` says why.
    Error,
}

/// One turn of a conversation as measured.
///
/// Token counts are model tokens. `prompt_tokens` is the whole prompt of this turn
/// (the conversation so far plus the new user message, after the chat template);
/// `cached_tokens` is the prefix of it reused from the session or a cache, so
/// `prompt_tokens - cached_tokens` tokens were prefilled. Times are milliseconds
/// and `None` when the component was not measured — never 0 for "unmeasured".
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnRecord {
    /// Short name of the turn, e.g. `summarise`, `story`, `is_prime`.
    pub name: String,
    /// Tokens in the full prompt of this turn.
    pub prompt_tokens: u64,
    /// Prompt tokens reused without evaluation.
    pub cached_tokens: u64,
    /// Time to restore cached state (e.g. a disk KV checkpoint), ms.
    #[serde(default)]
    pub restore_ms: Option<f64>,
    /// Time evaluating the `prompt_tokens - cached_tokens` new tokens, ms, measured
    /// at the engine's prefill boundary.
    #[serde(default)]
    pub prefill_ms: Option<f64>,
    /// Tokens generated in this turn (including the stop token when one was sampled).
    pub generated_tokens: u64,
    /// Time from the first to the last generated token, ms.
    #[serde(default)]
    pub decode_ms: Option<f64>,
    /// Decode speed, tokens/s, as the engine reports it.
    #[serde(default)]
    pub decode_tok_s: Option<f64>,
    /// Why generation ended.
    pub stop_reason: StopReason,
    /// SHA-256 (hex) of the turn's visible text, UTF-8.
    pub text_sha256: String,
    /// SHA-256 (hex) of the turn's reasoning text; `None` when the model gave none.
    #[serde(default)]
    pub reasoning_sha256: Option<String>,
    /// Tokens committed to the session after this turn (its frontier).
    #[serde(default)]
    pub frontier_tokens: Option<u64>,
    /// SHA-256 of the frontier's token ids (see [`crate::hash::sha256_tokens`]).
    #[serde(default)]
    pub frontier_sha256: Option<String>,
}

impl TurnRecord {
    /// Tokens actually prefilled: `prompt_tokens - cached_tokens` (saturating).
    pub fn prefilled_tokens(&self) -> u64 {
        self.prompt_tokens.saturating_sub(self.cached_tokens)
    }

    /// Prefill speed in tokens/s; `None` when unmeasured, zero-length or nothing
    /// was prefilled.
    pub fn prefill_tok_s(&self) -> Option<f64> {
        let ms = self.prefill_ms.filter(|ms| *ms > 0.0)?;
        let n = self.prefilled_tokens();
        (n > 0).then(|| n as f64 * 1000.0 / ms)
    }

    /// Decode speed in tokens/s: `decode_tok_s` when reported, else
    /// `generated_tokens / decode_ms`; `None` when neither is measured.
    pub fn decode_rate(&self) -> Option<f64> {
        self.decode_tok_s
            .filter(|v| v.is_finite() && *v > 0.0)
            .or_else(|| {
                let ms = self.decode_ms.filter(|ms| *ms > 0.0)?;
                (self.generated_tokens > 0).then(|| self.generated_tokens as f64 * 1000.0 / ms)
            })
    }

    /// Decode time in ms: `decode_ms` when measured, else derived from `decode_tok_s`.
    pub fn decode_time_ms(&self) -> Option<f64> {
        self.decode_ms.or_else(|| {
            let rate = self.decode_tok_s.filter(|v| *v > 0.0)?;
            Some(self.generated_tokens as f64 * 1000.0 / rate)
        })
    }
}

/// Result of running the extracted `is_prime(n)` against the truth for every
/// integer in the checked range (-10..=5000 by default: 5011 cases).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PrimeCheck {
    /// Whether a Python function could be extracted from the answer.
    pub extracted: bool,
    /// Cases where the function returned the right truth value.
    pub passed: u32,
    /// Cases checked.
    pub total: u32,
    /// The first failing case in ascending `n`, if any.
    #[serde(default)]
    pub first_counterexample: Option<Counterexample>,
    /// Why the check could not complete (syntax error, timeout, memory limit…).
    #[serde(default)]
    pub error: Option<String>,
}

impl PrimeCheck {
    /// True when the function was extracted, ran, and every case passed.
    pub fn all_passed(&self) -> bool {
        self.extracted && self.error.is_none() && self.total > 0 && self.passed == self.total
    }
}

/// One input on which the extracted function was wrong.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Counterexample {
    /// The argument.
    pub n: i64,
    /// Whether `n` is prime.
    pub expected: bool,
    /// What the function gave: `True`/`False`, another value's `repr`, or the
    /// exception it raised.
    pub got: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn turn() -> TurnRecord {
        TurnRecord {
            name: "t".into(),
            prompt_tokens: 120,
            cached_tokens: 20,
            restore_ms: None,
            prefill_ms: Some(50.0),
            generated_tokens: 30,
            decode_ms: Some(1500.0),
            decode_tok_s: None,
            stop_reason: StopReason::Eos,
            text_sha256: String::new(),
            reasoning_sha256: None,
            frontier_tokens: None,
            frontier_sha256: None,
        }
    }

    #[test]
    fn rates_from_times() {
        let t = turn();
        assert_eq!(t.prefilled_tokens(), 100);
        assert_eq!(t.prefill_tok_s(), Some(2000.0));
        assert_eq!(t.decode_rate(), Some(20.0));
        let unmeasured = TurnRecord {
            prefill_ms: None,
            decode_ms: None,
            ..turn()
        };
        assert_eq!(unmeasured.prefill_tok_s(), None);
        assert_eq!(unmeasured.decode_rate(), None);
        assert_eq!(unmeasured.decode_time_ms(), None);
    }

    #[test]
    fn conversation_rates_sum_tokens_and_times() {
        // Turn 1: 100 prefilled in 50 ms, 30 generated in 1500 ms.
        // Turn 2: 40 prefilled in 30 ms, 10 generated at 20 tok/s (= 500 ms).
        // Turn 3: unmeasured, ignored. Totals: 140 / 80 ms, 40 / 2000 ms.
        let second = TurnRecord {
            prompt_tokens: 200,
            cached_tokens: 160,
            prefill_ms: Some(30.0),
            generated_tokens: 10,
            decode_ms: None,
            decode_tok_s: Some(20.0),
            ..turn()
        };
        let third = TurnRecord {
            prefill_ms: None,
            decode_ms: None,
            ..turn()
        };
        let r = EvalResults {
            warmup: None,
            turns: vec![turn(), second, third],
            is_prime: None,
        };
        assert_eq!(r.prefill_tok_s(), Some(1750.0));
        assert_eq!(r.decode_tok_s(), Some(20.0));
        assert_eq!(EvalResults::default().decode_tok_s(), None);
    }

    #[test]
    fn unmeasured_serialises_as_null() {
        let t = TurnRecord {
            prefill_ms: None,
            ..turn()
        };
        let v = serde_json::to_value(&t).unwrap();
        assert!(v["prefill_ms"].is_null());
        assert_eq!(v["stop_reason"], "eos");
    }
}
