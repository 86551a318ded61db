//! The request log line, written when the response body is dropped: after its last byte
//! went out (a streamed completion's whole generation, not only its headers) or when the
//! client went away.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use axum::body::{Body, Bytes, HttpBody};
use axum::http::Method;
use axum::response::Response;

/// What the line says; logged on drop.
struct Line {
    method: Method,
    path: String,
    status: u16,
    error: Option<String>,
    t0: Instant,
}

impl Drop for Line {
    fn drop(&mut self) {
        let (method, path, status) = (&self.method, &self.path, self.status);
        let ms = self.t0.elapsed().as_millis() as u64;
        match &self.error {
            Some(why) => tracing::info!(%method, %path, status, ms, error = %why, "request"),
            None => tracing::info!(%method, %path, status, ms, "request"),
        }
    }
}

/// A response body that carries its request's log line.
struct Logged {
    inner: Body,
    _line: Line,
}

impl HttpBody for Logged {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.get_mut().inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// `resp` with a body that logs `method path status ms [error]` when it is dropped, `ms`
/// counted from `t0`.
pub fn log_on_drop(
    resp: Response,
    method: Method,
    path: String,
    error: Option<String>,
    t0: Instant,
) -> Response {
    let status = resp.status().as_u16();
    resp.map(|inner| {
        Body::new(Logged {
            inner,
            _line: Line {
                method,
                path,
                status,
                error,
                t0,
            },
        })
    })
}
