//! `GET /v1/models` (OpenAI's list, or Anthropic's when the request carries
//! `anthropic-version`), `GET /v1/models/{id}`, `GET /health`, `GET /metrics`.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::error::{ApiError, Flavor};
use crate::metrics::Gauges;
use crate::state::AppState;

fn is_anthropic(headers: &HeaderMap) -> bool {
    headers.contains_key("anthropic-version")
}

fn openai_model(state: &AppState, id: &str) -> Value {
    let mut m = json!({"id": id, "object": "model", "created": state.started, "owned_by": "ds4-server",
                       "display_name": state.names.display()});
    // The context this server accepts (vLLM's meaning of `max_model_len`); the
    // trained one apart, as llama-server's `n_ctx_train`.
    let n_ctx = state.worker.n_ctx();
    m["context_length"] = json!(n_ctx);
    m["max_model_len"] = json!(n_ctx);
    if let Some(n) = state.vocab.n_ctx_train() {
        m["n_ctx_train"] = json!(n);
    }
    m
}

fn anthropic_model(state: &AppState, id: &str) -> Value {
    json!({"type": "model", "id": id, "display_name": state.names.display(), "created_at": ds4_measure::time::rfc3339_utc_secs(state.started)})
}

/// `GET /v1/models`.
pub async fn list(State(state): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    let names: Vec<&String> = state.names.ids().collect();
    if is_anthropic(&headers) {
        let data: Vec<Value> = names.iter().map(|n| anthropic_model(&state, n)).collect();
        let first = names.first().map(|s| s.as_str());
        let last = names.last().map(|s| s.as_str());
        return axum::Json(
            json!({"data": data, "has_more": false, "first_id": first, "last_id": last}),
        )
        .into_response();
    }
    let data: Vec<Value> = names.iter().map(|n| openai_model(&state, n)).collect();
    axum::Json(json!({"object": "list", "data": data})).into_response()
}

/// `GET /v1/models/{id}`: the served model for any id (under the id asked for when it
/// is one of the listed ids, else under the served id), or 404 for another name with
/// `--strict-model`.
pub async fn get(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    let anthropic = is_anthropic(&headers);
    if state.config.strict_model && !state.names.matches(&id) {
        let flavor = if anthropic {
            Flavor::Anthropic
        } else {
            Flavor::OpenAi
        };
        return ApiError::model_not_found(&id, &state.names.id).into_response_as(flavor);
    }
    let id = state
        .names
        .ids()
        .find(|n| n.eq_ignore_ascii_case(&id))
        .unwrap_or(&state.names.id)
        .clone();
    let body = if anthropic {
        anthropic_model(&state, &id)
    } else {
        openai_model(&state, &id)
    };
    axum::Json(body).into_response()
}

/// `GET /health`: 200 while serving, 503 once shutdown began.
pub async fn health(State(state): State<Arc<AppState>>) -> Response {
    let closing = state.shutting_down.load(Ordering::SeqCst);
    let body = json!({
        "status": if closing { "shutting_down" } else { "ok" },
        "model": state.names.id,
        "n_ctx": state.worker.n_ctx(),
        "queue_depth": state.worker.queue_depth(),
        "busy": state.worker.busy(),
        "session_tokens": state.worker.session_tokens(),
    });
    let status = if closing {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::OK
    };
    (status, axum::Json(body)).into_response()
}

/// `GET /metrics`.
pub async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    let g = Gauges {
        queue_depth: state.worker.queue_depth(),
        busy: state.worker.busy(),
        session_tokens: state.worker.session_tokens(),
        n_ctx: state.worker.n_ctx(),
    };
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        state.metrics.render(g),
    )
        .into_response()
}
