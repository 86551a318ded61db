//! Request bodies: read with a size limit (413), parsed as JSON (400 on malformed
//! JSON), then deserialized with the path of a field of the wrong type in the message
//! (400). Unknown fields are ignored. A generation request is read as its API's own
//! fields plus the [`GenFields`] all APIs share, with the model name checked (404).

use axum::body::Body;
use axum::http::{HeaderMap, header};
use futures_util::StreamExt;
use serde::de::DeserializeOwned;

use super::common::{GenFields, resolve_model};
use super::constraints::Constraints;
use super::error::{ApiError, Flavor};
use crate::state::AppState;

/// A generation request type and the API it belongs to (whose documented ranges its
/// sampling fields are checked against).
pub trait ApiRequest: DeserializeOwned {
    const FLAVOR: Flavor;
}

impl ApiRequest for super::openai_chat::ChatRequest {
    const FLAVOR: Flavor = Flavor::OpenAi;
}

impl ApiRequest for super::openai_completions::CompletionRequest {
    const FLAVOR: Flavor = Flavor::OpenAi;
}

impl ApiRequest for super::openai_responses::ResponsesRequest {
    const FLAVOR: Flavor = Flavor::OpenAi;
}

impl ApiRequest for super::anthropic::MessagesRequest {
    const FLAVOR: Flavor = Flavor::Anthropic;
}

/// Bytes past the limit that are still read (and dropped) so the client, which is
/// still sending, sees the 413 instead of a reset connection.
const DRAIN_SLACK: usize = 256 << 20;

/// Reads the whole body, refusing more than `limit` bytes.
pub async fn read_body(headers: &HeaderMap, body: Body, limit: usize) -> Result<Vec<u8>, ApiError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let expects_continue = headers
        .get(header::EXPECT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("100-continue"));
    if declared.is_some_and(|n| n > limit as u64) && expects_continue {
        // The client waits for 100 Continue before sending: refuse without reading.
        return Err(ApiError::too_large(limit));
    }
    let mut stream = body.into_data_stream();
    let mut out = Vec::new();
    let mut seen = 0usize;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk
            .map_err(|e| ApiError::bad_request(format!("reading the request body failed: {e}")))?;
        seen += chunk.len();
        if seen > limit {
            if seen > limit + DRAIN_SLACK {
                break;
            }
            out = Vec::new();
            continue;
        }
        out.extend_from_slice(&chunk);
    }
    if seen > limit {
        return Err(ApiError::too_large(limit));
    }
    Ok(out)
}

/// A generation request: the API's own fields, the shared ones, and the model name to
/// answer with.
#[derive(Debug)]
pub struct GenRequest<T> {
    pub api: T,
    pub common: GenFields,
    pub model: String,
    /// `parallel_tool_calls: false`: at most one tool call.
    pub single_tool_call: bool,
}

/// Reads a generation request's body (the shared fields first, checked against the
/// ranges of `T`'s API, then those of `T`), refuses constraint fields the server does
/// not implement (see [`super::constraints`]) and resolves its model name.
pub async fn read_request<T: ApiRequest>(
    state: &AppState,
    headers: &HeaderMap,
    body: Body,
) -> Result<GenRequest<T>, ApiError> {
    let bytes = read_body(headers, body, state.config.max_body_bytes).await?;
    let value = json_object(&bytes)?;
    let common: GenFields = from_value(&value)?;
    common.check_api_ranges(T::FLAVOR)?;
    let constraints: Constraints = from_value(&value)?;
    constraints.check()?;
    let api = from_value(&value)?;
    let model = resolve_model(state, common.model.as_deref())?;
    Ok(GenRequest {
        api,
        common,
        model,
        single_tool_call: constraints.single_tool_call(),
    })
}

/// Parses a JSON object body into `T`.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    from_value(&json_object(bytes)?)
}

/// Parses a body that must hold a JSON object.
fn json_object(bytes: &[u8]) -> Result<serde_json::Value, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::bad_request(
            "the request body is empty; send a JSON object",
        ));
    }
    let value: serde_json::Value = serde_json::from_slice(bytes)
        .map_err(|e| ApiError::bad_request(format!("the request body is not valid JSON: {e}")))?;
    if !value.is_object() {
        return Err(ApiError::bad_request(
            "the request body must be a JSON object",
        ));
    }
    Ok(value)
}

/// Deserializes `T` from a parsed body, naming the field at fault.
fn from_value<T: DeserializeOwned>(value: &serde_json::Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let inner = humanize(&e.into_inner().to_string());
        let inner = inner.replace("missing field", "missing required field");
        let missing = inner
            .strip_prefix("missing required field `")
            .and_then(|r| r.split('`').next());
        if let Some(field) = missing {
            let param = match path.as_str() {
                "." => field.to_string(),
                _ => format!("{path}.{field}"),
            };
            return ApiError::invalid_field(&param, format!("missing required field `{param}`"));
        }
        if path == "." {
            ApiError::bad_request(format!("invalid request: {inner}"))
        } else {
            ApiError::invalid_field(&path, format!("invalid value for `{path}`: {inner}"))
        }
    })
}

/// serde's `invalid type: string "10", expected u64` in a client's words: the expected
/// Rust type as the kind of JSON value wanted, then what was sent.
fn humanize(msg: &str) -> String {
    let Some(rest) = msg
        .strip_prefix("invalid value: ")
        .or_else(|| msg.strip_prefix("invalid type: "))
    else {
        return msg.to_string();
    };
    let Some((got, expected)) = rest.rsplit_once(", expected ") else {
        return msg.to_string();
    };
    let expected = match expected {
        "u8" | "u16" | "u32" | "u64" | "usize" => "a whole number of at least 0",
        "i8" | "i16" | "i32" | "i64" | "isize" => "a whole number",
        "f32" | "f64" => "a number",
        other => other,
    };
    format!("expected {expected}, got {}", got.replace('`', ""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_asked_for_in_words() {
        #[derive(serde::Deserialize, Debug)]
        #[allow(dead_code)]
        struct R {
            max_tokens: Option<u64>,
            temperature: Option<f32>,
        }
        let e = parse_json::<R>(br#"{"max_tokens": -5}"#).unwrap_err();
        assert_eq!(
            e.message,
            "invalid value for `max_tokens`: expected a whole number of at least 0, got integer -5"
        );
        let e = parse_json::<R>(br#"{"max_tokens": "10"}"#).unwrap_err();
        assert_eq!(
            e.message,
            r#"invalid value for `max_tokens`: expected a whole number of at least 0, got string "10""#
        );
        let e = parse_json::<R>(br#"{"temperature": "hot"}"#).unwrap_err();
        assert_eq!(
            e.message,
            r#"invalid value for `temperature`: expected a number, got string "hot""#
        );
    }

    #[derive(serde::Deserialize, Debug)]
    #[allow(dead_code)]
    struct Req {
        messages: Vec<Msg>,
        temperature: Option<f32>,
    }
    #[derive(serde::Deserialize, Debug)]
    #[allow(dead_code)]
    struct Msg {
        role: String,
    }

    #[test]
    fn errors_name_the_field() {
        let e = parse_json::<Req>(br#"{"messages": [{"role": 1}]}"#).unwrap_err();
        assert_eq!(e.status, 400);
        assert_eq!(e.param.as_deref(), Some("messages[0].role"));
        let e = parse_json::<Req>(br#"{"messages": [], "temperature": "hot"}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("temperature"));
        let e = parse_json::<Req>(br#"{"temperature": 1}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages"));
        assert_eq!(e.message, "missing required field `messages`");
        let e = parse_json::<Req>(br#"{"messages": [{}]}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[0].role"));
        assert_eq!(e.message, "missing required field `messages[0].role`");
        let e = parse_json::<Req>(b"{").unwrap_err();
        assert!(e.message.contains("not valid JSON"));
        let e = parse_json::<Req>(b"[]").unwrap_err();
        assert!(e.message.contains("JSON object"));
        assert!(parse_json::<Req>(br#"{"messages": [], "unknown": {"x": 1}}"#).is_ok());
    }
}
