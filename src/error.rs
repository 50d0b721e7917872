//! The HTTP error boundary: every error a handler returns becomes a status
//! code and a JSON body `{"error": "..."}` that says what is wrong, and
//! nothing about the internals.

use axum::extract::rejection::JsonRejection;
use axum::http::header::RETRY_AFTER;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

/// An error answered to the client.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The request is malformed or fails validation (400).
    #[error("{0}")]
    BadRequest(String),
    /// The body is not JSON (415).
    #[error("expected a JSON body with content-type application/json")]
    UnsupportedMediaType,
    /// Nothing here (404).
    #[error("{0}")]
    NotFound(String),
    /// The method is not allowed on this path (405).
    #[error("method not allowed")]
    MethodNotAllowed,
    /// The resource exists already (409).
    #[error("{0}")]
    Conflict(String),
    /// The request was cancelled before it finished (the client is gone;
    /// 499 in nginx's convention, never seen by the client).
    #[error("request cancelled")]
    Cancelled,
    /// The server gave up on the request (503): its timeout passed.
    #[error("{0}")]
    Unavailable(String),
    /// The server cannot take the request now but expects to soon (503 with
    /// `Retry-After`): it is at capacity, or a dependency is busy or down.
    #[error("{message}")]
    RetryLater {
        /// What is wrong, for the client.
        message: String,
        /// Seconds the client should wait before retrying.
        retry_after_secs: u32,
    },
    /// A write the server may or may not have made (503 with
    /// `Retry-After`): its database commit was sent and the answer lost.
    /// The body names what to read to learn whether it was made, as
    /// `location`; retrying blindly could make it twice.
    #[error("{message}")]
    Unconfirmed {
        /// What happened, for the client.
        message: String,
        /// The path that tells whether the write was made.
        location: String,
        /// Seconds the client should wait before reading it.
        retry_after_secs: u32,
    },
    /// The request announces a body (Content-Length) larger than the limit
    /// (413), refused before any of it is read.
    #[error("request body of {announced} bytes is larger than the limit of {limit} bytes")]
    BodyTooLarge {
        /// The size the request announced.
        announced: u64,
        /// `--max-body-bytes`.
        limit: usize,
    },
    /// The request was refused before the handler ran (payload too large,
    /// unreadable body): the extractor's status and message.
    #[error("{message}")]
    Rejected {
        /// The status chosen by the extractor.
        status: StatusCode,
        /// What was wrong.
        message: String,
    },
    /// A bug or an unexpected failure (500). The cause is logged, not sent.
    #[error("internal error")]
    Internal(#[source] Box<dyn std::error::Error + Send + Sync>),
}

impl ApiError {
    /// The status code this error answers with.
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::Conflict(_) => StatusCode::CONFLICT,
            ApiError::Cancelled => {
                StatusCode::from_u16(499).unwrap_or(StatusCode::SERVICE_UNAVAILABLE)
            }
            ApiError::Unavailable(_)
            | ApiError::RetryLater { .. }
            | ApiError::Unconfirmed { .. } => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::Rejected { status, .. } => *status,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        if let ApiError::Internal(cause) = &self {
            tracing::error!(error = %cause, "internal error");
        }
        let retry_after = match &self {
            ApiError::RetryLater {
                retry_after_secs, ..
            }
            | ApiError::Unconfirmed {
                retry_after_secs, ..
            } => Some(HeaderValue::from(*retry_after_secs)),
            _ => None,
        };
        let body = match &self {
            ApiError::Unconfirmed { location, .. } => {
                json!({ "error": self.to_string(), "location": location })
            }
            _ => json!({ "error": self.to_string() }),
        };
        let mut response = (status, Json(body)).into_response();
        if let Some(seconds) = retry_after {
            response.headers_mut().insert(RETRY_AFTER, seconds);
        }
        response
    }
}

impl From<JsonRejection> for ApiError {
    fn from(rejection: JsonRejection) -> ApiError {
        match rejection {
            JsonRejection::MissingJsonContentType(_) => ApiError::UnsupportedMediaType,
            JsonRejection::JsonSyntaxError(error) => {
                ApiError::BadRequest(format!("invalid JSON: {}", error.body_text()))
            }
            JsonRejection::JsonDataError(error) => ApiError::BadRequest(error.body_text()),
            other => ApiError::Rejected {
                status: other.status(),
                message: other.body_text(),
            },
        }
    }
}
