//! Pieces shared by the API adapters: the API-neutral conversation, the fields every
//! generation request has and their validation, content text, model-name resolution,
//! ids and time.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Deserialize;
use serde_json::{Map, Value};

use super::error::{ApiError, Flavor};
use crate::backend::{ChatTurn, GenSettings, SamplerSettings};
use crate::state::AppState;

/// Which tools the model may call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    Auto,
    /// Tools are not offered and calls are not parsed.
    None,
    /// Some tool must be called: the answer starts with the format's opening of a call
    /// (see `ToolFormat::forced_lead`).
    Required,
    /// This function must be called: the answer starts with a call of it.
    Function(String),
}

/// A chat request with the API's shape removed.
#[derive(Debug, Clone)]
pub struct Conversation {
    pub messages: Vec<ChatTurn>,
    /// OpenAI function definitions.
    pub tools: Vec<Value>,
    pub tool_choice: ToolChoice,
    /// Extra chat-template variables.
    pub vars: Map<String, Value>,
    /// The last message is an assistant message to continue (a prefill): the answer
    /// goes on from its text instead of opening a new turn.
    pub continue_final: bool,
    /// At most one tool call (`parallel_tool_calls: false`).
    pub single_tool_call: bool,
}

/// An integer seed: any JSON integer (negative ones wrap).
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(untagged, expecting = "expected an integer")]
pub enum SeedIn {
    Unsigned(u64),
    Signed(i64),
}

impl SeedIn {
    pub fn value(self) -> u64 {
        match self {
            SeedIn::Unsigned(v) => v,
            SeedIn::Signed(v) => v as u64,
        }
    }
}

/// `stop`: one string or a list.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged, expecting = "expected a string or a list of strings")]
pub enum StopIn {
    One(String),
    Many(Vec<String>),
}

impl StopIn {
    pub fn into_vec(self) -> Vec<String> {
        match self {
            StopIn::One(s) => vec![s],
            StopIn::Many(v) => v,
        }
    }
}

/// The fields every generation request has whatever its API: the model name, whether
/// to stream, and the sampling settings (missing ones take ds4's defaults). Read from
/// the same body as the API's own fields (see [`super::body::read_request`]).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct GenFields {
    pub model: Option<String>,
    pub stream: Option<bool>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub seed: Option<SeedIn>,
}

fn check_range(name: &str, v: Option<f32>, lo: f32, hi: f32) -> Result<(), ApiError> {
    match v {
        Some(x) if !(x.is_finite() && x >= lo && x <= hi) => Err(ApiError::invalid_field(
            name,
            format!("`{name}` must be between {lo} and {hi}, got {x}"),
        )),
        _ => Ok(()),
    }
}

/// A seed from the clock, for requests without one (like the CLI).
pub fn clock_seed() -> u64 {
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    t.as_nanos() as u64 | 1
}

impl GenFields {
    /// Checks the sampling fields against the ranges the official API documents:
    /// `temperature` 0 to 2 (OpenAI) or 0 to 1 (Anthropic), `top_p` 0 to 1. The
    /// extensions (`top_k`, `min_p`) are checked by [`GenFields::settings`].
    pub fn check_api_ranges(&self, api: Flavor) -> Result<(), ApiError> {
        let max_temperature = match api {
            Flavor::OpenAi => 2.0,
            Flavor::Anthropic => 1.0,
        };
        check_range("temperature", self.temperature, 0.0, max_temperature)?;
        check_range("top_p", self.top_p, 0.0, 1.0)
    }

    /// Whether the answer is to be streamed.
    pub fn streams(&self) -> bool {
        self.stream == Some(true)
    }

    /// Validated generation settings.
    pub fn settings(
        &self,
        max_tokens: usize,
        top_logprobs: Option<usize>,
    ) -> Result<GenSettings, ApiError> {
        check_range("temperature", self.temperature, 0.0, 100.0)?;
        check_range("top_p", self.top_p, 0.0, 1.0)?;
        check_range("min_p", self.min_p, 0.0, 1.0)?;
        if let Some(k) = self.top_k
            && k < 0
        {
            return Err(ApiError::invalid_field(
                "top_k",
                format!("`top_k` must be 0 (off) or positive, got {k}"),
            ));
        }
        let d = SamplerSettings::DS4_DEFAULT;
        let sampler = SamplerSettings {
            temperature: self.temperature.unwrap_or(d.temperature),
            top_k: self
                .top_k
                .map_or(d.top_k, |k| k.min(i32::MAX as i64) as i32),
            top_p: self.top_p.unwrap_or(d.top_p),
            min_p: self.min_p.unwrap_or(d.min_p),
        };
        let seed = self.seed.map_or_else(clock_seed, SeedIn::value);
        Ok(GenSettings {
            max_tokens,
            sampler,
            seed,
            top_logprobs,
        })
    }
}

/// A `top_logprobs`-like field (alternatives per token): at most 20.
pub fn logprobs_field(name: &str, v: Option<u32>) -> Result<Option<usize>, ApiError> {
    match v {
        Some(k) if k > 20 => Err(ApiError::invalid_field(
            name,
            format!("`{name}` must be at most 20"),
        )),
        k => Ok(k.map(|k| k as usize)),
    }
}

/// A `max_tokens`-like field: at least 1.
pub fn max_tokens_field(name: &str, v: Option<u64>) -> Result<Option<usize>, ApiError> {
    match v {
        Some(0) => Err(ApiError::invalid_field(
            name,
            format!("`{name}` must be at least 1"),
        )),
        Some(n) => Ok(Some(n.min(usize::MAX as u64) as usize)),
        None => Ok(None),
    }
}

/// The model name to answer with: always the served id. Any requested name is
/// accepted (agents send their own, `claude-…`, `gpt-…`), unless the server runs with
/// `--strict-model`, where only its names are (else 404).
pub fn resolve_model(state: &AppState, requested: Option<&str>) -> Result<String, ApiError> {
    match requested {
        Some(name)
            if state.config.strict_model && !name.is_empty() && !state.names.matches(name) =>
        {
            Err(ApiError::model_not_found(name, &state.names.id))
        }
        _ => Ok(state.names.id.clone()),
    }
}

/// A fresh id: `prefix` then 24 characters `[0-9a-zA-Z]`, unique in this process.
pub fn new_id(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    const ALPHABET: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    // SplitMix64 over clock and counter: unique per process, unpredictable enough for
    // ids (they are not secrets).
    let mut x = clock_seed() ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let mut out = String::from(prefix);
    for _ in 0..2 {
        x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        for _ in 0..12 {
            out.push(ALPHABET[(z % 62) as usize] as char);
            z /= 62;
        }
    }
    out
}

/// Seconds since the Unix epoch.
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The string field `key` of JSON object `item` found at path `at`.
pub fn str_field<'a>(item: &'a Value, key: &str, at: &str) -> Result<&'a str, ApiError> {
    item.get(key).and_then(Value::as_str).ok_or_else(|| {
        ApiError::invalid_field(
            &format!("{at}.{key}"),
            format!("`{at}.{key}` must be a string"),
        )
    })
}

/// The error for a content part of a type other than text, at path `at`.
pub fn unsupported_part(kind: &str, at: &str) -> ApiError {
    ApiError::invalid_field(
        &format!("{at}.type"),
        format!("content parts of type '{kind}' are not supported: this model reads text only"),
    )
}

/// The text of content `v` at path `at`: a string, or a list whose items `part` turns
/// into text (given the item and its path), joined by newlines; missing or null is
/// empty text. `noun` names the items in the error for any other JSON type.
pub fn joined_text(
    v: Option<&Value>,
    at: &str,
    noun: &str,
    part: impl Fn(&Value, &str) -> Result<String, ApiError>,
) -> Result<String, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(items)) => {
            let texts = items
                .iter()
                .enumerate()
                .map(|(i, p)| part(p, &format!("{at}[{i}]")))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(texts.join("\n"))
        }
        Some(_) => Err(ApiError::invalid_field(
            at,
            format!("`{at}` must be a string or a list of {noun}"),
        )),
    }
}

/// Parses tool-call arguments text into JSON for the template (the raw text as a JSON
/// string when it does not parse).
pub fn arguments_value(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique_and_shaped() {
        let a = new_id("call_");
        let b = new_id("call_");
        assert_ne!(a, b);
        assert_eq!(a.len(), 5 + 24);
        assert!(a[5..].chars().all(|c| c.is_ascii_alphanumeric()));
    }

    #[test]
    fn sampling_defaults_are_ds4s() {
        let s = GenFields {
            seed: Some(SeedIn::Unsigned(7)),
            ..Default::default()
        }
        .settings(10, None)
        .unwrap();
        assert_eq!(
            s.sampler,
            SamplerSettings {
                temperature: 1.0,
                top_k: 0,
                top_p: 1.0,
                min_p: 0.05
            }
        );
        assert_eq!(s.seed, 7);
        assert!(
            GenFields {
                top_p: Some(1.5),
                ..Default::default()
            }
            .settings(1, None)
            .is_err()
        );
        assert!(
            GenFields {
                temperature: Some(f32::NAN),
                ..Default::default()
            }
            .settings(1, None)
            .is_err()
        );
    }
}
