//! The admin listener: probes and metrics on a socket of their own, open
//! from startup until after the finalizers, so that a probe during the
//! drain is answered, never refused.

use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::config::ACCEPT_ERROR_BACKOFF;
use crate::listener::{is_connection_error, Listener};
use crate::task::HttpService;
use crate::LOG_TARGET;

/// How long the admin listener, closed after the finalizers, lets the probe
/// and scrape requests in flight finish.
pub const ADMIN_CLOSE_GRACE: Duration = Duration::from_millis(500);

/// How long an admin client may take to send a request's headers.
const ADMIN_HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves `service` on `listener` until `closing` fires, then waits for
/// the connections to finish their requests (the caller bounds the wait).
pub(crate) async fn serve_admin<L, S>(mut listener: L, service: S, closing: CancellationToken)
where
    L: Listener,
    S: HttpService,
{
    info!("admin endpoints on {}", listener.describe());
    let graceful = GracefulShutdown::new();
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(ADMIN_HEADER_TIMEOUT);
    while let Some(accepted) = closing.run_until_cancelled(listener.accept()).await {
        match accepted {
            Ok((io, _peer)) => {
                let service = TowerToHyperService::new(service.clone());
                let connection = builder.serve_connection_with_upgrades(TokioIo::new(io), service);
                let connection = graceful.watch(connection.into_owned());
                tokio::spawn(async move {
                    if let Err(error) = connection.await {
                        debug!(%error, "admin connection ended with an error");
                    }
                });
            }
            Err(error) if is_connection_error(&error) => {}
            Err(error) => {
                warn!(%error, "admin accept failed; backing off");
                tokio::time::sleep(ACCEPT_ERROR_BACKOFF).await;
            }
        }
    }
    drop(listener);
    graceful.shutdown().await;
    info!(target: LOG_TARGET, "admin listener closed");
}
