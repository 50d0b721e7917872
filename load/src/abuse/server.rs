//! The server under attack: a fresh `lameduck server` with default
//! settings, the link the normal client's redirects ask for, its admin
//! listener's `/metrics` (counters before and after, open connections
//! while measuring), and its exit after SIGTERM.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context};
use nix::sys::signal::Signal;
use tokio::time::Instant;

use super::{Attack, EXIT_LIMIT, LINK_CODE, SAMPLE_EVERY, SCRAPE_TIMEOUT};
use crate::binaries::Binaries;
use crate::metrics::{self, Metrics};
use crate::raw::{self, RawConn};
use crate::replica::{Ended, Replica, Spec};
use crate::{metric, SERVICE};

/// How long the server may take to answer `/readyz` after its start.
const READY_LIMIT: Duration = Duration::from_secs(30);

/// A running server and its admin listener.
pub(super) struct Server {
    /// The child process; its `addr` is the main listener.
    pub(super) replica: Replica,
    /// The admin listener (`/metrics`).
    pub(super) admin: SocketAddr,
}

/// Starts a server for `attack` (default settings, SQLite in `scratch`,
/// its log in `out/logs`), waits for it to be ready and creates the link
/// [`LINK_CODE`].
pub(super) async fn start(
    attack: Attack,
    binaries: &Binaries,
    scratch: &Path,
    out: &Path,
) -> anyhow::Result<Server> {
    let data = scratch.join(attack.name());
    let spec = Spec {
        program: binaries.service.clone(),
        args: [
            "server",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            &data.display().to_string(),
        ]
        .iter()
        .map(Into::into)
        .collect(),
        env: Vec::new(),
        cpus: None,
    };
    let log = out
        .join("logs")
        .join(format!("{}-{SERVICE}.log", attack.name()));
    let replica = Replica::spawn(attack.name(), &spec, &log).await?;
    replica.wait_ready("/readyz", READY_LIMIT).await?;
    let admin = replica.admin_addr().await?;
    create_link(replica.addr).await?;
    Ok(Server { replica, admin })
}

/// `POST /api/links` of the link [`LINK_CODE`].
async fn create_link(addr: SocketAddr) -> anyhow::Result<()> {
    let mut conn = RawConn::connect(addr).await?;
    let created = conn
        .exchange(&raw::post_json(
            "/api/links",
            &format!(r#"{{"url":"https://example.com/{LINK_CODE}","code":"{LINK_CODE}"}}"#),
        ))
        .await?;
    if created.status != 201 {
        bail!("creating the link answered {}", created.status);
    }
    Ok(())
}

/// SIGTERM, then its exit (killed after [`EXIT_LIMIT`]).
pub(super) async fn stop(mut server: Server) -> anyhow::Result<Ended> {
    let signalled = Instant::now();
    server.replica.signal(Signal::SIGTERM)?;
    Ok(server.replica.wait_exit(signalled, EXIT_LIMIT).await)
}

/// `GET /metrics` on a new connection, parsed, within [`SCRAPE_TIMEOUT`].
pub(super) async fn scrape(admin: SocketAddr) -> anyhow::Result<Metrics> {
    tokio::time::timeout(SCRAPE_TIMEOUT, metrics::scrape(admin))
        .await
        .context("GET /metrics timed out")?
}

/// `lameduck_connections_open` (every protocol) every [`SAMPLE_EVERY`]
/// until `until`, and how many reads failed: a failure is counted, not
/// fatal (the admin listener failing under the attack is a finding).
pub(super) async fn sample_connections(admin: SocketAddr, until: Instant) -> (Vec<i64>, usize) {
    let open = metric("connections_open");
    let mut samples = Vec::new();
    let mut failed = 0;
    while Instant::now() < until {
        match scrape(admin).await {
            #[allow(clippy::cast_possible_truncation)]
            Ok(metrics) => samples.push(metrics.sum(&open) as i64),
            Err(_) => failed += 1,
        }
        tokio::time::sleep(SAMPLE_EVERY.min(until.saturating_duration_since(Instant::now()))).await;
    }
    (samples, failed)
}
