//! Running a job for a handler: rendering a conversation off the async threads,
//! queueing the job (400 for a prompt over the context, 429 when the queue is full), then either collecting the whole answer or streaming it as
//! server-sent events in the API's format, with keep-alive comments while the request
//! waits in the queue or its prompt prefills. A client that goes away drops the job's
//! receiver, which cancels it in the worker.

use std::convert::Infallible;
use std::time::{Duration, Instant};

use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use tokio::sync::mpsc::{self, UnboundedReceiver};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;

use super::common::{Conversation, GenFields};
use super::error::ApiError;
use crate::output::collect::Collected;
use crate::output::{OutputEvent, OutputParser};
use crate::prompt::{PromptPlan, chat_prompt};
use crate::state::AppState;
use crate::worker::{
    FinishReason, Finished, Job, PromptInput, SubmitError, TokenLogprob, Usage, WorkerEvent,
};

/// Runs `f` on tokio's blocking threads (tokenizing and template rendering are CPU
/// work).
pub async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?
}

/// Renders and tokenizes `conv` with the model's chat template.
pub async fn render(state: &AppState, conv: Conversation) -> Result<PromptPlan, ApiError> {
    let vocab = state.vocab.clone();
    let tool_format = state.tool_format;
    blocking(move || chat_prompt(&*vocab, &conv, tool_format)).await
}

/// Where generation ends besides the model and the token limit.
#[derive(Debug, Clone, Default)]
pub struct Stops {
    /// The client's stop sequences (not part of the answer).
    pub stop: Vec<String>,
    /// Text after which generation ends, kept in the answer
    /// ([`PromptPlan::end_after`]).
    pub end_after: Vec<String>,
}

/// Checks the prompt against the context and queues the job: at most `max_tokens`
/// (default: what the context leaves), sampled as `fields` say, with `top_logprobs`
/// alternatives per token when asked for.
pub fn submit(
    state: &AppState,
    id: &str,
    prompt: PromptInput,
    max_tokens: Option<usize>,
    fields: &GenFields,
    top_logprobs: Option<usize>,
    stops: Stops,
) -> Result<UnboundedReceiver<WorkerEvent>, ApiError> {
    let n_ctx = state.worker.n_ctx();
    if prompt.is_empty() {
        return Err(ApiError::bad_request("the prompt is empty"));
    }
    if prompt.len() >= n_ctx {
        return Err(ApiError::context_exceeded(prompt.len(), n_ctx));
    }
    let settings = fields.settings(max_tokens.unwrap_or(n_ctx - prompt.len()), top_logprobs)?;
    let (tx, rx) = mpsc::unbounded_channel();
    let job = Job {
        id: id.to_string(),
        prompt,
        settings,
        stop: stops.stop,
        end_after: stops.end_after,
        events: tx,
        enqueued: Instant::now(),
    };
    state.worker.submit(job).map_err(|e| match e {
        SubmitError::Full { depth } => {
            state.metrics.record_rejected();
            ApiError::queue_full(depth, state.worker.retry_after_secs())
        }
        SubmitError::ShuttingDown => ApiError::shutting_down(),
    })?;
    Ok(rx)
}

/// A whole answer.
#[derive(Debug, Clone)]
pub struct Completion {
    pub out: Collected,
    pub logprobs: Vec<TokenLogprob>,
    pub finish: FinishReason,
    pub usage: Usage,
    /// Tokens that produced only reasoning text.
    pub reasoning_tokens: usize,
}

/// Waits for the whole answer.
pub async fn collect(
    mut rx: UnboundedReceiver<WorkerEvent>,
    mut parser: OutputParser,
) -> Result<Completion, ApiError> {
    let mut out = Collected::default();
    let mut logprobs = Vec::new();
    let mut reasoning_tokens = 0;
    while let Some(ev) = rx.recv().await {
        match ev {
            WorkerEvent::Started { .. } => {}
            WorkerEvent::Delta { text, logprob } => {
                logprobs.extend(logprob);
                let events = parser.push(&text);
                if is_reasoning_only(&events) {
                    reasoning_tokens += 1;
                }
                out.extend(events);
            }
            WorkerEvent::Done(Finished { reason, usage }) => {
                if reason.is_cut() {
                    let (events, open) = parser.finish_cut();
                    out.extend(events);
                    if let Some(raw) = open {
                        out.cut_call(&raw);
                    }
                } else {
                    out.extend(parser.finish());
                }
                return Ok(Completion {
                    out,
                    logprobs,
                    finish: reason,
                    usage,
                    reasoning_tokens,
                });
            }
            WorkerEvent::Failed(e) => return Err(e.into()),
        }
    }
    Err(ApiError::internal("the engine worker stopped"))
}

fn is_reasoning_only(events: &[OutputEvent]) -> bool {
    !events.is_empty()
        && events
            .iter()
            .all(|e| matches!(e, OutputEvent::Reasoning(_)))
}

/// One API's streaming format.
pub trait StreamFormat: Send + 'static {
    /// The prompt is in the session.
    fn started(&mut self, prompt_tokens: usize, cached_tokens: usize) -> Vec<Event>;
    /// A token's log-probability (before the output its text produces).
    fn logprob(&mut self, _lp: TokenLogprob) {}
    /// Structured output.
    fn output(&mut self, ev: OutputEvent) -> Vec<Event>;
    /// The end.
    fn finished(&mut self, fin: &Finished, reasoning_tokens: usize) -> Vec<Event>;
    /// A failure after the response began.
    fn failed(&mut self, err: &ApiError) -> Vec<Event>;
}

/// An SSE event with only `data:`.
pub fn data_event(v: &serde_json::Value) -> Event {
    Event::default().data(v.to_string())
}

/// An SSE event with `event:` and `data:`.
pub fn named_event(name: &str, v: &serde_json::Value) -> Event {
    Event::default().event(name).data(v.to_string())
}

/// Streams the job's answer as SSE in format `fmt`.
pub fn sse<F: StreamFormat>(
    mut rx: UnboundedReceiver<WorkerEvent>,
    mut parser: OutputParser,
    mut fmt: F,
    keepalive: Duration,
) -> Response {
    let (tx, out) = mpsc::channel::<Event>(64);
    tokio::spawn(async move {
        let mut reasoning_tokens = 0;
        loop {
            let ev = tokio::select! {
                _ = tx.closed() => return,
                ev = rx.recv() => ev,
            };
            let (batch, last) = match ev {
                None => (
                    fmt.failed(&ApiError::internal("the engine worker stopped")),
                    true,
                ),
                Some(WorkerEvent::Started {
                    prompt_tokens,
                    cached_tokens,
                }) => (fmt.started(prompt_tokens, cached_tokens), false),
                Some(WorkerEvent::Delta { text, logprob }) => {
                    if let Some(lp) = logprob {
                        fmt.logprob(lp);
                    }
                    let events = parser.push(&text);
                    if is_reasoning_only(&events) {
                        reasoning_tokens += 1;
                    }
                    (
                        events.into_iter().flat_map(|e| fmt.output(e)).collect(),
                        false,
                    )
                }
                Some(WorkerEvent::Done(fin)) => {
                    // A call the cut left open has sent its deltas: it is not ended here,
                    // and the format closes it as cut.
                    let events = if fin.reason.is_cut() {
                        parser.finish_cut().0
                    } else {
                        parser.finish()
                    };
                    let mut batch: Vec<Event> =
                        events.into_iter().flat_map(|e| fmt.output(e)).collect();
                    batch.extend(fmt.finished(&fin, reasoning_tokens));
                    (batch, true)
                }
                Some(WorkerEvent::Failed(e)) => (fmt.failed(&e.into()), true),
            };
            for e in batch {
                if tx.send(e).await.is_err() {
                    return;
                }
            }
            if last {
                return;
            }
        }
    });
    let stream = ReceiverStream::new(out).map(Ok::<_, Infallible>);
    let mut resp = Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(keepalive).text("keep-alive"))
        .into_response();
    resp.headers_mut().insert(
        "x-accel-buffering",
        axum::http::HeaderValue::from_static("no"),
    );
    resp
}
