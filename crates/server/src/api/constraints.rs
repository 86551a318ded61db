//! Request fields that constrain generation, read from every generation request: the
//! ones the server implements (`parallel_tool_calls`) and the ones it does not, which
//! are refused with a 400 naming the field rather than silently ignored (a client that
//! asks for JSON output or a token bias must not get unconstrained text back).
//!
//! A field set to its no-op value (`response_format: {"type": "text"}`, an empty
//! `logit_bias`, penalties of 0, `parallel_tool_calls: true`) is accepted.

use serde::Deserialize;
use serde_json::Value;

use super::error::ApiError;

/// The constraint fields of a request (any API; absent fields are `None`).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Constraints {
    /// OpenAI Chat Completions.
    pub response_format: Option<Value>,
    /// OpenAI Responses: `text.format`.
    pub text: Option<Value>,
    pub logit_bias: Option<Value>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    pub repetition_penalty: Option<f64>,
    pub parallel_tool_calls: Option<bool>,
}

fn unsupported(param: &str, what: &str) -> ApiError {
    ApiError::invalid_field(
        param,
        format!(
            "`{param}` {what} is not supported by this server (no constrained decoding or \
             logit processing); remove the field, or set it to its default"
        ),
    )
}

fn format_type(v: &Value) -> Option<&str> {
    v.get("type").and_then(Value::as_str)
}

impl Constraints {
    /// Refuses the fields the server does not implement (see the module header).
    pub fn check(&self) -> Result<(), ApiError> {
        if let Some(f) = self.response_format.as_ref().filter(|v| !v.is_null()) {
            match format_type(f) {
                Some("text") => {}
                Some(t) => return Err(unsupported("response_format", &format!("of type '{t}'"))),
                None => {
                    return Err(ApiError::invalid_field(
                        "response_format",
                        "`response_format` must be an object with a `type`",
                    ));
                }
            }
        }
        if let Some(f) = self.text.as_ref().and_then(|t| t.get("format")) {
            match format_type(f) {
                None | Some("text") => {}
                Some(t) => return Err(unsupported("text.format", &format!("of type '{t}'"))),
            }
        }
        match &self.logit_bias {
            None | Some(Value::Null) => {}
            Some(Value::Object(m)) if m.is_empty() => {}
            Some(_) => return Err(unsupported("logit_bias", "with entries")),
        }
        for (name, v, neutral) in [
            ("presence_penalty", self.presence_penalty, 0.0),
            ("frequency_penalty", self.frequency_penalty, 0.0),
            ("repetition_penalty", self.repetition_penalty, 1.0),
        ] {
            if let Some(x) = v
                && x != neutral
            {
                return Err(unsupported(name, &format!("= {x}")));
            }
        }
        Ok(())
    }

    /// Whether at most one tool call may be returned (`parallel_tool_calls: false`).
    pub fn single_tool_call(&self) -> bool {
        self.parallel_tool_calls == Some(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn check(v: Value) -> Result<(), ApiError> {
        serde_json::from_value::<Constraints>(v).unwrap().check()
    }

    #[test]
    fn no_op_values_pass_and_others_name_the_field() {
        for ok in [
            json!({}),
            json!({"response_format": {"type": "text"}, "logit_bias": {}, "presence_penalty": 0.0,
                   "frequency_penalty": 0, "parallel_tool_calls": true, "text": {"format": {"type": "text"}}}),
            json!({"response_format": null, "logit_bias": null}),
        ] {
            assert!(check(ok.clone()).is_ok(), "{ok}");
        }
        for (bad, param) in [
            (
                json!({"response_format": {"type": "json_object"}}),
                "response_format",
            ),
            (
                json!({"response_format": {"type": "json_schema", "json_schema": {}}}),
                "response_format",
            ),
            (
                json!({"text": {"format": {"type": "json_schema"}}}),
                "text.format",
            ),
            (json!({"logit_bias": {"50256": -100}}), "logit_bias"),
            (json!({"presence_penalty": 0.5}), "presence_penalty"),
            (json!({"frequency_penalty": -1}), "frequency_penalty"),
            (json!({"repetition_penalty": 1.1}), "repetition_penalty"),
        ] {
            let e = check(bad.clone()).unwrap_err();
            assert_eq!(e.status, 400, "{bad}");
            assert_eq!(e.param.as_deref(), Some(param), "{bad}");
            assert!(e.message.contains(param), "{}", e.message);
        }
    }
}
