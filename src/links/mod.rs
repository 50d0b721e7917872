//! The example domain — a link shortener. This is the part users replace.
//!
//! `POST /api/links` shows the cancellation pattern: the transaction runs on
//! a task tracked by the lifecycle ([`RequestScope::run`]), so a client that
//! hangs up cancels it through its token instead of dropping it mid-query.

pub mod cache;
mod error;
pub mod hits;
pub mod live;
mod shard;
pub mod validate;

use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRef, Path, State};
use axum::http::header::LOCATION;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};

use self::error::{not_found, unconfirmed};
use crate::error::ApiError;
use crate::lifecycle::RequestScope;
use crate::storage::{Storage, StorageError, StoredLink};
use crate::telemetry::traces;
use cache::LinkCache;
use hits::HitCounter;
use live::LiveHits;

/// How many times a generated code is retried after a collision.
const GENERATE_ATTEMPTS: usize = 5;

/// The link routes, on any state the handlers' parts can be taken from.
pub fn routes<S>() -> Router<S>
where
    S: Clone + Send + Sync + 'static,
    Storage: FromRef<S>,
    HitCounter: FromRef<S>,
    LinkCache: FromRef<S>,
    LiveHits: FromRef<S>,
{
    Router::new()
        .route("/api/links", post(create))
        .route("/api/links/{code}", get(show))
        .route("/api/links/{code}/events", get(live::events))
        .route("/api/links/{code}/ws", get(live::websocket))
        .route("/{code}", get(redirect))
}

/// Body of `POST /api/links`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateLink {
    /// Absolute http(s) URL to redirect to.
    pub url: String,
    /// Custom code; generated when absent.
    pub code: Option<String>,
}

/// Answer of `POST /api/links`.
#[derive(Debug, Serialize, Deserialize)]
pub struct LinkCreated {
    /// Short code.
    pub code: String,
    /// Target URL.
    pub url: String,
    /// RFC 3339 creation time.
    pub created_at: String,
}

/// Answer of `GET /api/links/{code}`.
#[derive(Debug, Serialize, Deserialize)]
pub struct LinkInfo {
    /// Short code.
    pub code: String,
    /// Target URL.
    pub url: String,
    /// Redirects served so far.
    pub hits: i64,
    /// RFC 3339 creation time.
    pub created_at: String,
}

async fn create(
    State(storage): State<Storage>,
    State(cache): State<LinkCache>,
    scope: RequestScope,
    payload: Result<Json<CreateLink>, JsonRejection>,
) -> Result<Response, ApiError> {
    let Json(payload) = payload?;
    // Fault injection for the trace tests: a handler that ignores its
    // cancellation and never answers, as code stuck in a call that cannot
    // be cancelled would.
    #[cfg(feature = "failpoints")]
    if fail::eval("create-link-hangs", |_| ()).is_some() {
        std::future::pending::<()>().await;
    }
    let url = validate::url(&payload.url).map_err(ApiError::BadRequest)?;
    let custom = payload
        .code
        .as_deref()
        .map(validate::code)
        .transpose()
        .map_err(ApiError::BadRequest)?;

    // The transaction runs to its own end even if this future is dropped;
    // in the request's trace (its spans are children of the request's).
    let link = scope
        .run(move |token| {
            traces::carry(async move {
                let attempts = if custom.is_some() {
                    1
                } else {
                    GENERATE_ATTEMPTS
                };
                for _ in 0..attempts {
                    let link = StoredLink {
                        code: custom.clone().unwrap_or_else(validate::generate_code),
                        url: url.clone(),
                        hits: 0,
                        created_at: now_rfc3339(),
                    };
                    match storage.insert_link(&link, &token).await {
                        Ok(()) => return Ok(link),
                        Err(StorageError::Conflict) => {}
                        // The commit's answer was lost: the link may exist,
                        // and only its code tells the client where to look.
                        Err(StorageError::Unconfirmed(_)) => return Err(unconfirmed(&link.code)),
                        Err(other) => return Err(ApiError::from(other)),
                    }
                }
                Err(ApiError::from(StorageError::Conflict))
            })
        })
        .await
        .map_err(|error| ApiError::Internal(Box::new(error)))??;

    if let Ok(redirect) = HeaderValue::from_str(&link.url) {
        cache.insert(&link.code, redirect);
    }
    let location = format!("/api/links/{}", link.code);
    let body = LinkCreated {
        code: link.code,
        url: link.url,
        created_at: link.created_at,
    };
    Ok((StatusCode::CREATED, [(LOCATION, location)], Json(body)).into_response())
}

async fn show(
    State(storage): State<Storage>,
    State(hits): State<HitCounter>,
    Path(code): Path<String>,
) -> Result<Json<LinkInfo>, ApiError> {
    let link = hits::find_with_hits(&hits, &storage, &code)
        .await?
        .ok_or_else(|| not_found(&code))?;
    Ok(Json(LinkInfo {
        code: link.code,
        url: link.url,
        hits: link.hits,
        created_at: link.created_at,
    }))
}

/// The hot path: a cache lookup and an in-memory count; the database is
/// read only on a cache miss and written later, batched, by the flusher.
///
/// The cache holds only URLs in their normalised form: new links are
/// stored that way, and a link stored before the rule is normalised when it
/// is read. A stored URL that cannot be normalised (one with a control
/// character, which no `Location` header can carry) answers 500 and counts
/// no hit.
async fn redirect(
    State(storage): State<Storage>,
    State(hits): State<HitCounter>,
    State(cache): State<LinkCache>,
    Path(code): Path<String>,
) -> Result<Response, ApiError> {
    let location = match cache.get(&code) {
        Some(location) => location,
        None => {
            let link = storage
                .find_link(&code)
                .await?
                .ok_or_else(|| not_found(&code))?;
            let location = validate::normalise(&link.url)
                .and_then(|url| HeaderValue::from_str(&url).map_err(|error| error.to_string()));
            let location = location.map_err(|reason| {
                let code = link.code.clone();
                ApiError::Internal(UnredirectableLink { code, reason }.into())
            })?;
            cache.insert(&link.code, location.clone());
            location
        }
    };
    hits.record(code.as_str(), 1);
    Ok((StatusCode::TEMPORARY_REDIRECT, [(LOCATION, location)]).into_response())
}

/// A stored link whose URL cannot be sent in a `Location` header; logged as
/// the cause of a 500, never sent to the client.
#[derive(Debug, thiserror::Error)]
#[error("the stored URL of link '{code}' cannot be redirected to: {reason}")]
struct UnredirectableLink {
    code: String,
    reason: String,
}

fn now_rfc3339() -> String {
    crate::storage::rfc3339(chrono::Utc::now())
}
