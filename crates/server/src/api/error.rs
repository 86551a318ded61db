//! API errors, rendered in each API's own shape:
//! OpenAI `{"error":{"message","type","param","code"}}` and
//! Anthropic `{"type":"error","error":{"type","message"}}`.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::worker::{JobError, SubmitError};

/// The kind of an error, mapped to each API's type names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    InvalidRequest,
    Authentication,
    NotFound,
    TooLarge,
    RateLimit,
    Unavailable,
    Internal,
}

/// An error response, independent of the API's shape.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub kind: ErrorKind,
    pub message: String,
    /// The request field at fault (OpenAI `param`).
    pub param: Option<String>,
    /// A machine-readable code (OpenAI `code`).
    pub code: Option<&'static str>,
    /// Seconds for the `Retry-After` header.
    pub retry_after: Option<u64>,
    /// The message in Anthropic's wording, where it differs.
    pub anthropic_message: Option<String>,
}

impl ApiError {
    fn new(status: StatusCode, kind: ErrorKind, message: impl Into<String>) -> Self {
        ApiError {
            status,
            kind,
            message: message.into(),
            param: None,
            code: None,
            retry_after: None,
            anthropic_message: None,
        }
    }

    /// 400.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, ErrorKind::InvalidRequest, message)
    }

    /// 400 for a prompt of `prompt_tokens` that a context of `n_ctx` cannot hold (with
    /// room for one generated token), in each API's wording — OpenAI's code
    /// `context_length_exceeded` and "maximum context length", Anthropic's "prompt is too
    /// long: N tokens > M maximum" — which clients (LiteLLM, Claude Code) match to tell
    /// it from other invalid requests and trim the conversation.
    pub fn context_exceeded(prompt_tokens: usize, n_ctx: usize) -> Self {
        const HINT: &str = "shorten the conversation or restart the server with a larger --ctx";
        let mut e = Self::bad_request(format!(
            "This model's maximum context length is {n_ctx} tokens, but the prompt is {prompt_tokens} tokens and the answer needs at least one more; {HINT}"
        ));
        e.code = Some("context_length_exceeded");
        e.anthropic_message = Some(format!(
            "prompt is too long: {prompt_tokens} tokens > {} maximum; {HINT}",
            n_ctx.saturating_sub(1)
        ));
        e
    }

    /// 400 about field `param`.
    pub fn invalid_field(param: &str, message: impl Into<String>) -> Self {
        let mut e = Self::bad_request(message);
        e.param = Some(param.to_string());
        e
    }

    /// 401.
    pub fn unauthorized() -> Self {
        let mut e = Self::new(
            StatusCode::UNAUTHORIZED,
            ErrorKind::Authentication,
            "invalid or missing API key: send it as `Authorization: Bearer KEY` or `x-api-key: KEY`",
        );
        e.code = Some("invalid_api_key");
        e
    }

    /// 404 for a model name the server does not serve.
    pub fn model_not_found(name: &str, served: &str) -> Self {
        let mut e = Self::new(
            StatusCode::NOT_FOUND,
            ErrorKind::NotFound,
            format!(
                "model '{name}' is not served here (this server serves '{served}'; without --strict-model it accepts any name)"
            ),
        );
        e.param = Some("model".into());
        e.code = Some("model_not_found");
        e
    }

    /// 404 for an unknown path.
    pub fn route_not_found(method: &str, path: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            ErrorKind::NotFound,
            format!("no route for {method} {path}"),
        )
    }

    /// 405: a known route asked with another method.
    pub fn method_not_allowed(method: &str, path: &str) -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            ErrorKind::InvalidRequest,
            format!("{path} does not take {method}"),
        )
    }

    /// 413.
    pub fn too_large(limit: usize) -> Self {
        let mut e = Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            ErrorKind::TooLarge,
            format!(
                "the request body exceeds the server's limit of {limit} bytes (--max-body-bytes)"
            ),
        );
        e.code = Some("request_too_large");
        e
    }

    /// 429 with Retry-After.
    pub fn queue_full(depth: usize, retry_after: u64) -> Self {
        let waiting = match depth {
            0 => "a request is running and --queue 0 lets none wait".to_string(),
            1 => "1 request is waiting for the engine".to_string(),
            n => format!("{n} requests are waiting for the engine"),
        };
        let mut e = Self::new(
            StatusCode::TOO_MANY_REQUESTS,
            ErrorKind::RateLimit,
            format!("the server is busy: {waiting}; retry after {retry_after} s"),
        );
        e.code = Some("rate_limit_exceeded");
        e.retry_after = Some(retry_after);
        e
    }

    /// 503.
    pub fn shutting_down() -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorKind::Unavailable,
            "the server is shutting down",
        )
    }

    /// 500.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            ErrorKind::Internal,
            message,
        )
    }

    /// The OpenAI body.
    pub fn openai_body(&self) -> Value {
        let ty = match self.kind {
            ErrorKind::InvalidRequest
            | ErrorKind::NotFound
            | ErrorKind::TooLarge
            | ErrorKind::Authentication => "invalid_request_error",
            ErrorKind::RateLimit => "rate_limit_error",
            ErrorKind::Unavailable | ErrorKind::Internal => "server_error",
        };
        json!({"error": {"message": self.message, "type": ty, "param": self.param, "code": self.code}})
    }

    /// The Anthropic body.
    pub fn anthropic_body(&self) -> Value {
        let ty = match self.kind {
            ErrorKind::InvalidRequest => "invalid_request_error",
            ErrorKind::Authentication => "authentication_error",
            ErrorKind::NotFound => "not_found_error",
            ErrorKind::TooLarge => "request_too_large",
            ErrorKind::RateLimit => "rate_limit_error",
            ErrorKind::Unavailable => "overloaded_error",
            ErrorKind::Internal => "api_error",
        };
        let message = self.anthropic_message.as_ref().unwrap_or(&self.message);
        json!({"type": "error", "error": {"type": ty, "message": message}})
    }

    /// The response in the given API's shape.
    pub fn into_response_as(self, flavor: Flavor) -> Response {
        let body = match flavor {
            Flavor::OpenAi => self.openai_body(),
            Flavor::Anthropic => self.anthropic_body(),
        };
        let mut resp = (self.status, axum::Json(body)).into_response();
        resp.extensions_mut()
            .insert(ErrorNote(self.message.clone()));
        if let Some(s) = self.retry_after
            && let Ok(v) = HeaderValue::from_str(&s.to_string())
        {
            resp.headers_mut().insert(header::RETRY_AFTER, v);
        }
        resp
    }
}

/// An error response's message, kept on the response for the request log.
#[derive(Clone, Debug)]
pub struct ErrorNote(pub String);

impl From<SubmitError> for ApiError {
    fn from(e: SubmitError) -> Self {
        match e {
            SubmitError::Full { depth } => ApiError::queue_full(depth, 1),
            SubmitError::ShuttingDown => ApiError::shutting_down(),
        }
    }
}

impl From<JobError> for ApiError {
    fn from(e: JobError) -> Self {
        match e {
            JobError::ContextFull { needed, n_ctx } => {
                ApiError::context_exceeded(needed.saturating_sub(1), n_ctx)
            }
            JobError::ShuttingDown => ApiError::shutting_down(),
            JobError::Engine(m) => ApiError::internal(m),
        }
    }
}

/// Which API's error shape to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    OpenAi,
    Anthropic,
}

impl Flavor {
    /// The API a request path belongs to.
    pub fn of_path(path: &str) -> Flavor {
        let p = path.strip_prefix("/v1").unwrap_or(path);
        if p == "/messages" || p.starts_with("/messages/") {
            Flavor::Anthropic
        } else {
            Flavor::OpenAi
        }
    }
}

/// An error answered in OpenAI's shape.
#[derive(Debug)]
pub struct OpenAiError(pub ApiError);

impl From<ApiError> for OpenAiError {
    fn from(e: ApiError) -> Self {
        OpenAiError(e)
    }
}

impl IntoResponse for OpenAiError {
    fn into_response(self) -> Response {
        self.0.into_response_as(Flavor::OpenAi)
    }
}

/// An error answered in Anthropic's shape.
#[derive(Debug)]
pub struct AnthropicError(pub ApiError);

impl From<ApiError> for AnthropicError {
    fn from(e: ApiError) -> Self {
        AnthropicError(e)
    }
}

impl IntoResponse for AnthropicError {
    fn into_response(self) -> Response {
        self.0.into_response_as(Flavor::Anthropic)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_queue_says_how_many_wait() {
        let said = |depth| ApiError::queue_full(depth, 2).message;
        assert_eq!(
            said(0),
            "the server is busy: a request is running and --queue 0 lets none wait; retry after 2 s"
        );
        assert_eq!(
            said(1),
            "the server is busy: 1 request is waiting for the engine; retry after 2 s"
        );
        assert_eq!(
            said(16),
            "the server is busy: 16 requests are waiting for the engine; retry after 2 s"
        );
    }
}
