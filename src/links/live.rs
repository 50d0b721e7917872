//! Live hit counts: `GET /api/links/{code}/events` (Server-Sent Events) and
//! `GET /api/links/{code}/ws` (websocket). Both end on time when the drain
//! starts — SSE with a final `event: shutdown` and a `retry:` hint, the
//! websocket with close code 1001 (going away) — instead of holding the
//! process until the deadline.
//!
//! One poller per watched link feeds every subscriber through a `watch`
//! channel, so a thousand streams on one link cost one query per tick.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, State};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::Stream;
use tokio::sync::watch;

use super::error::not_found;
use super::hits::HitCounter;
use crate::error::ApiError;
use crate::lifecycle::RequestScope;
use crate::storage::Storage;

/// How often a watched link's count is read.
pub const LIVE_TICK: Duration = Duration::from_secs(1);

/// The reconnect delay SSE clients are told to use after `event: shutdown`.
pub const SSE_RETRY: Duration = Duration::from_secs(1);

/// How long a websocket waits for the client's reply to its close frame.
const CLOSE_REPLY_TIMEOUT: Duration = Duration::from_secs(1);

/// Close code 1001: the endpoint is going away (server shutting down).
const GOING_AWAY: u16 = 1001;

/// The registry of watched links. Cloning shares it.
#[derive(Clone, Debug, Default)]
pub struct LiveHits {
    watched: Arc<Mutex<HashMap<String, watch::Receiver<i64>>>>,
}

impl LiveHits {
    /// A receiver of `code`'s hit count, starting a poller if none runs.
    fn subscribe(
        &self,
        code: &str,
        current: i64,
        storage: &Storage,
        hits: &HitCounter,
    ) -> watch::Receiver<i64> {
        let mut watched = self.watched.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(receiver) = watched.get(code) {
            return receiver.clone();
        }
        let (sender, receiver) = watch::channel(current);
        watched.insert(code.to_owned(), receiver.clone());
        tokio::spawn(poll(
            self.clone(),
            code.to_owned(),
            sender,
            storage.clone(),
            hits.clone(),
        ));
        receiver
    }
}

/// Publishes `code`'s count every [`LIVE_TICK`] while anyone listens (the
/// registry's own receiver does not count).
async fn poll(
    live: LiveHits,
    code: String,
    sender: watch::Sender<i64>,
    storage: Storage,
    hits: HitCounter,
) {
    let mut ticker = tokio::time::interval(LIVE_TICK);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        {
            let mut watched = live.watched.lock().unwrap_or_else(PoisonError::into_inner);
            if sender.receiver_count() <= 1 {
                watched.remove(&code);
                return;
            }
        }
        if let Ok(Some(link)) = super::hits::find_with_hits(&hits, &storage, &code).await {
            sender.send_if_modified(|count| std::mem::replace(count, link.hits) != link.hits);
        }
    }
}

async fn watch_link(
    live: &LiveHits,
    storage: &Storage,
    hits: &HitCounter,
    code: &str,
) -> Result<watch::Receiver<i64>, ApiError> {
    let link = super::hits::find_with_hits(hits, storage, code)
        .await?
        .ok_or_else(|| not_found(code))?;
    Ok(live.subscribe(code, link.hits, storage, hits))
}

/// `GET /api/links/{code}/events`: `event: hits` with the count on every
/// change; `event: shutdown` with a `retry:` hint when the drain starts.
pub(super) async fn events(
    State(storage): State<Storage>,
    State(hits): State<HitCounter>,
    State(live): State<LiveHits>,
    scope: RequestScope,
    Path(code): Path<String>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let mut counts = watch_link(&live, &storage, &hits, &code).await?;
    counts.mark_changed();
    let stream = futures_util::stream::unfold(Some((counts, scope)), |state| async move {
        let (mut counts, scope) = state?;
        tokio::select! {
            biased;
            () = scope.draining() => {
                let goodbye = Event::default()
                    .event("shutdown")
                    .retry(SSE_RETRY)
                    .data("server shutting down; reconnect");
                Some((Ok(goodbye), None))
            }
            // The deadline passed: end without a goodbye.
            () = scope.token().cancelled() => None,
            changed = counts.changed() => {
                changed.ok()?;
                let count = *counts.borrow_and_update();
                Some((Ok(Event::default().event("hits").data(count.to_string())), Some((counts, scope))))
            }
        }
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()))
}

/// `GET /api/links/{code}/ws`: a text message with the count on every
/// change; close code 1001 when the drain starts.
pub(super) async fn websocket(
    upgrade: WebSocketUpgrade,
    State(storage): State<Storage>,
    State(hits): State<HitCounter>,
    State(live): State<LiveHits>,
    scope: RequestScope,
    Path(code): Path<String>,
) -> Result<Response, ApiError> {
    let counts = watch_link(&live, &storage, &hits, &code).await?;
    // hyper stops tracking the connection once it is upgraded: hold the
    // drain until this websocket has said goodbye.
    let hold = scope.hold_drain();
    Ok(upgrade
        .on_upgrade(move |socket| async move {
            let _hold = hold;
            serve_websocket(socket, counts, scope).await;
        })
        .into_response())
}

async fn serve_websocket(
    mut socket: WebSocket,
    mut counts: watch::Receiver<i64>,
    scope: RequestScope,
) {
    counts.mark_changed();
    loop {
        tokio::select! {
            biased;
            () = scope.draining() => {
                let close = Message::Close(Some(CloseFrame {
                    code: GOING_AWAY,
                    reason: "server shutting down".into(),
                }));
                if socket.send(close).await.is_ok() {
                    // Let the client answer the close handshake, briefly.
                    let _ = tokio::time::timeout(CLOSE_REPLY_TIMEOUT, async {
                        while let Some(Ok(message)) = socket.recv().await {
                            if matches!(message, Message::Close(_)) {
                                break;
                            }
                        }
                    })
                    .await;
                }
                return;
            }
            () = scope.token().cancelled() => return,
            changed = counts.changed() => {
                if changed.is_err() {
                    return;
                }
                let count = *counts.borrow_and_update();
                if socket.send(Message::Text(count.to_string().into())).await.is_err() {
                    return;
                }
            }
            received = socket.recv() => match received {
                Some(Ok(Message::Close(_)) | Err(_)) | None => return,
                Some(Ok(_)) => {}
            },
        }
    }
}
