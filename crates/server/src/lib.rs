//! `ds4-http`: an OpenAI- and Anthropic-compatible HTTP server over one engine worker.
//!
//! Endpoints: `GET /v1/models`, `POST /v1/chat/completions`, `POST /v1/completions`,
//! `POST /v1/responses`, `POST /v1/messages`, `POST /v1/messages/count_tokens`,
//! `GET /health`, `GET /metrics` (also without the `/v1` prefix).
//!
//! Shape: HTTP handlers ([`api`], axum on tokio) parse a request into a conversation,
//! render it with the chat template ([`prompt`]) and queue a [`worker::Job`]. One
//! engine thread ([`worker`]) owns the live session and the parked states of other
//! conversations ([`session_cache`]), runs jobs in FIFO order, reuses the prompt prefix
//! a held state already holds ([`prompt_cache`]) and streams text back; handlers parse it into reasoning, answer text and tool calls ([`output`]) and
//! answer in their API's JSON or SSE format.
//!
//! The model is reached through two small traits ([`backend::Vocab`],
//! [`backend::Engine`]); `engine_adapter` implements them for `ds4_engine` (feature
//! `engine`), [`fake`] with a toy model for tests.

pub mod api;
pub mod args;
pub mod backend;
pub mod config;
#[cfg(feature = "engine")]
pub mod engine_adapter;
pub mod fake;
pub mod holdback;
pub mod metrics;
pub mod output;
pub mod prompt;
pub mod prompt_cache;
pub mod pyjson;
pub mod request_log;
pub mod server;
pub mod session_cache;
pub mod state;
pub mod stop;
pub mod tools_prompt;
pub mod utf8;
pub mod worker;

pub use args::ServeArgs;
pub use config::ServerConfig;
#[cfg(feature = "engine")]
pub use engine_adapter::{PhaseHook, engine_model, serve, serve_with};
pub use server::{ServeError, ServerHandle, bind, start, start_on};

/// `system_fingerprint` of OpenAI responses: the crate and its version.
pub const SYSTEM_FINGERPRINT: &str = concat!("ds4-server-", env!("CARGO_PKG_VERSION"));
