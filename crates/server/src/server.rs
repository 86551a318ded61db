//! The HTTP server: routes, API-key check, request metrics and logs, optional CORS,
//! start on a listener, and graceful shutdown (stop accepting, refuse queued work,
//! let the running request finish for up to the drain timeout, then cancel it).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use axum::Router;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderMap, Method, header};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{get, post};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tower_http::cors::CorsLayer;

use crate::api::error::{ApiError, ErrorNote, Flavor};
use crate::api::{anthropic, models, openai_chat, openai_completions, openai_responses};
use crate::backend::{Engine, Vocab};
use crate::config::ServerConfig;
use crate::metrics::Metrics;
use crate::output::ToolFormat;
use crate::request_log::log_on_drop;
use crate::state::{AppState, ModelNames};
use crate::worker::Worker;

/// Errors starting the server.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot listen on {addr}: {error}")]
    Bind {
        addr: String,
        /// In the message, not a separate `source` (an error chain would repeat it).
        error: std::io::Error,
    },
    #[error("server error: {0}")]
    Io(#[from] std::io::Error),
}

/// A running server.
pub struct ServerHandle {
    addr: SocketAddr,
    state: Arc<AppState>,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl ServerHandle {
    /// The bound address (the port is the real one when 0 was asked for).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The metrics (for tests and embedding).
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.state.metrics
    }

    /// Graceful shutdown: stop accepting, refuse queued requests (503), let the running
    /// request finish for up to the configured drain timeout, cancel it after that,
    /// wait for open connections and for the engine thread.
    pub async fn shutdown(self) -> Result<(), ServeError> {
        let ServerHandle {
            state, stop, task, ..
        } = self;
        tracing::info!("shutting down");
        state.shutting_down.store(true, Ordering::SeqCst);
        state.worker.close();
        let _ = stop.send(true);
        let worker = state.worker.clone();
        let drain = state.config.drain_timeout;
        let cancel = tokio::spawn(async move {
            tokio::time::sleep(drain).await;
            tracing::warn!("drain timeout: cancelling the running request");
            worker.cancel_all();
        });
        let served = task
            .await
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        let worker = state.worker.clone();
        let _ = tokio::task::spawn_blocking(move || worker.join()).await;
        cancel.abort();
        served?;
        Ok(())
    }

    /// Runs until SIGINT or SIGTERM, then shuts down gracefully; a second one cancels
    /// the running request at once instead of waiting out the drain time (the shutdown
    /// then ends as soon as the connections close and the parked states are written).
    pub async fn run_until_signal(self) -> Result<(), ServeError> {
        let (tx, rx) = mpsc::unbounded_channel();
        let signals = tokio::spawn(async move {
            loop {
                shutdown_signal().await;
                if tx.send(()).is_err() {
                    return;
                }
            }
        });
        let served = self.run_until(rx).await;
        signals.abort();
        served
    }

    /// Runs until the first message on `signals` (or until its senders are gone), then
    /// shuts down gracefully ([`ServerHandle::shutdown`]); a second message cancels the
    /// running request at once.
    pub async fn run_until(
        self,
        mut signals: mpsc::UnboundedReceiver<()>,
    ) -> Result<(), ServeError> {
        let _ = signals.recv().await;
        let worker = self.state.worker.clone();
        let again = tokio::spawn(async move {
            if signals.recv().await.is_some() {
                tracing::warn!("second signal: cancelling the running request now");
                worker.cancel_all();
            }
        });
        let served = self.shutdown().await;
        again.abort();
        served
    }
}

async fn shutdown_signal() {
    // A handler that cannot be installed waits forever (as SIGTERM's below), rather than
    // reporting a signal that never came.
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}

/// Binds `config`'s address (no runtime needed), so that a busy port or a bad host is
/// reported before a model is loaded.
pub fn bind(config: &ServerConfig) -> Result<std::net::TcpListener, ServeError> {
    let addr = format!("{}:{}", config.host, config.port);
    let bind_err = |error| ServeError::Bind {
        addr: addr.clone(),
        error,
    };
    let listener = std::net::TcpListener::bind(&addr).map_err(bind_err)?;
    listener.set_nonblocking(true).map_err(bind_err)?;
    Ok(listener)
}

/// Starts serving `vocab` + `engine` as `config` says. Must be called inside a tokio
/// runtime (multi-threaded); the engine runs on its own thread.
pub async fn start(
    config: ServerConfig,
    vocab: Arc<dyn Vocab>,
    engine: Box<dyn Engine>,
) -> Result<ServerHandle, ServeError> {
    let listener = bind(&config)?;
    start_on(listener, config, vocab, engine).await
}

/// [`start`] on a listener from [`bind`].
pub async fn start_on(
    listener: std::net::TcpListener,
    config: ServerConfig,
    vocab: Arc<dyn Vocab>,
    engine: Box<dyn Engine>,
) -> Result<ServerHandle, ServeError> {
    let listener = TcpListener::from_std(listener)?;
    let local = listener.local_addr()?;
    let metrics = Arc::new(Metrics::new());
    let worker = Arc::new(Worker::spawn(
        engine,
        vocab.clone(),
        config.queue,
        config.cache.clone(),
        metrics.clone(),
    ));
    let id = vocab.model_id();
    let mut aliases: Vec<String> = Vec::new();
    for a in &config.aliases {
        if !a.eq_ignore_ascii_case(&id) && !aliases.iter().any(|x| x.eq_ignore_ascii_case(a)) {
            aliases.push(a.clone());
        }
    }
    let names = ModelNames {
        id,
        aliases,
        display_name: vocab.model_display_name(),
    };
    let tool_format = ToolFormat::detect(&vocab.chat_template_source());
    let state = Arc::new(AppState {
        vocab,
        worker,
        metrics,
        config,
        names,
        tool_format,
        started: crate::api::common::unix_now(),
        shutting_down: Default::default(),
    });
    let app = router(state.clone());
    let (stop, mut stopped) = watch::channel(false);
    let task = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                let _ = stopped.wait_for(|s| *s).await;
            })
            .await
    });
    tracing::debug!("serving '{}' on http://{local}", state.names.id);
    Ok(ServerHandle {
        addr: local,
        state,
        stop,
        task,
    })
}

/// All routes, with and without the `/v1` prefix.
pub fn router(state: Arc<AppState>) -> Router {
    let api = Router::new()
        .route("/models", get(models::list))
        .route("/models/{id}", get(models::get))
        .route("/chat/completions", post(openai_chat::handler))
        .route("/completions", post(openai_completions::handler))
        .route("/responses", post(openai_responses::handler))
        .route("/messages", post(anthropic::messages))
        .route("/messages/count_tokens", post(anthropic::count_tokens));
    let mut app = Router::new()
        .route("/health", get(models::health))
        .route("/metrics", get(models::metrics))
        .nest("/v1", api.clone())
        .merge(api)
        .fallback(not_found)
        .method_not_allowed_fallback(wrong_method)
        .layer(middleware::from_fn_with_state(state.clone(), auth))
        .layer(middleware::from_fn_with_state(state.clone(), observe));
    if state.config.cors {
        app = app.layer(CorsLayer::very_permissive());
    }
    app.with_state(state)
}

async fn not_found(method: Method, uri: axum::http::Uri) -> Response {
    ApiError::route_not_found(method.as_str(), uri.path())
        .into_response_as(Flavor::of_path(uri.path()))
}

async fn wrong_method(method: Method, uri: axum::http::Uri) -> Response {
    ApiError::method_not_allowed(method.as_str(), uri.path())
        .into_response_as(Flavor::of_path(uri.path()))
}

/// Constant-time comparison of secrets.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn presented_key(headers: &HeaderMap) -> Option<&str> {
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        });
    bearer
        .or_else(|| headers.get("x-api-key").and_then(|v| v.to_str().ok()))
        .map(str::trim)
}

async fn auth(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    if let Some(key) = &state.config.api_key
        && req.uri().path() != "/health"
        && req.method() != Method::OPTIONS
        && !presented_key(req.headers()).is_some_and(|k| same_secret(k.as_bytes(), key.as_bytes()))
    {
        return ApiError::unauthorized().into_response_as(Flavor::of_path(req.uri().path()));
    }
    next.run(req).await
}

async fn observe(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let endpoint = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_string(), |p| p.as_str().to_string());
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let t0 = Instant::now();
    let resp = next.run(req).await;
    state
        .metrics
        .record_request(&endpoint, resp.status().as_u16());
    let error = resp.extensions().get::<ErrorNote>().map(|n| n.0.clone());
    log_on_drop(resp, method, path, error, t0)
}
