//! Request bodies are read in full before a request takes a slot under the
//! API's concurrency limit, within a deadline of their own.
//!
//! Why: the concurrency limit (`--max-concurrent-requests`) protects the
//! handlers and the database pool. A client that sends its headers and
//! then trickles its body (slowhttptest `-B`) costs neither, but while the
//! handler's JSON extractor waits for the body it holds a slot: 1,024 such
//! clients took every slot and every API route answered 503. Reading the
//! body here, outside the limit, leaves the slots to requests that are
//! ready to run. Slow bodies then cost only what they really hold — a
//! connection (bounded by `--max-connections`) and at most
//! `--max-body-bytes` of memory — for at most `--body-read-timeout`, after
//! which the client gets 408.

use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper::body::Body as _;

use crate::error::ApiError;

/// When the request timeout fires, set by the stack on a request that has
/// a body: the body is read within it too, so a body still arriving then
/// gets 408 — a stall in the client's own body is the client's, whichever
/// timeout fires first — and not the stack's 503, which blames the server.
/// Both timers share the instant: the stack polls the route before its own
/// timer, so the 408 wins.
#[derive(Clone, Copy, Debug)]
pub struct RequestDeadline(pub tokio::time::Instant);

/// How request bodies are read before the concurrency limit.
#[derive(Clone, Copy, Debug)]
pub struct BodyReading {
    /// Largest body, in bytes (413 past it).
    pub max_bytes: usize,
    /// Time to receive the whole body, counted from the end of the request
    /// head (408 past it): what a slow upload may hold a connection for.
    pub timeout: Duration,
}

/// Reads the request body in full, within [`BodyReading::timeout`] (and the
/// request's [`RequestDeadline`], if sooner) and up to
/// [`BodyReading::max_bytes`], and gives the request back with the body in
/// memory.
///
/// Answers 408 (JSON body, `Connection: close`) when the body does not
/// arrive in time, 413 when it is larger than the limit, and 400 when the
/// client breaks the body off (a malformed chunk, a reset).
pub async fn read_first(request: Request, reading: BodyReading) -> Result<Request, Response> {
    if request.body().is_end_stream() {
        // No body (a redirect, a read): nothing to wait for.
        return Ok(request);
    }
    let started = tokio::time::Instant::now();
    let mut deadline = started + reading.timeout;
    if let Some(RequestDeadline(request_deadline)) = request.extensions().get() {
        deadline = deadline.min(*request_deadline);
    }
    let (parts, body) = request.into_parts();
    let limited = Limited::new(body, reading.max_bytes);
    match tokio::time::timeout_at(deadline, limited.collect()).await {
        Ok(Ok(collected)) => Ok(Request::from_parts(parts, Body::from(collected.to_bytes()))),
        Ok(Err(error)) if error.downcast_ref::<LengthLimitError>().is_some() => {
            Err(ApiError::Rejected {
                status: StatusCode::PAYLOAD_TOO_LARGE,
                message: format!(
                    "request body is larger than the limit of {} bytes",
                    reading.max_bytes
                ),
            }
            .into_response())
        }
        Ok(Err(error)) => Err(ApiError::BadRequest(format!(
            "request body could not be read: {error}"
        ))
        .into_response()),
        Err(_elapsed) => {
            let mut response = ApiError::Rejected {
                status: StatusCode::REQUEST_TIMEOUT,
                message: format!(
                    "request body not received within {}",
                    humantime::format_duration(round_to_millis(deadline - started))
                ),
            }
            .into_response();
            // The rest of the body may still come: it must not be read as
            // the next request on this connection.
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
            Err(response)
        }
    }
}

/// To the nearest millisecond: the request deadline was set a few
/// microseconds before the read began.
fn round_to_millis(duration: Duration) -> Duration {
    let millis = (duration.as_micros() + 500) / 1000;
    Duration::from_millis(u64::try_from(millis).unwrap_or(u64::MAX))
}
