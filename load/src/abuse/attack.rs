//! One attack from start to end, phase by phase: a fresh server, the
//! attack ramping up until most of its connections are held, the
//! measurement (the normal client and the server's open connections side
//! by side), the attack stopped, the server's counters read again and its
//! exit after SIGTERM.

use std::path::Path;
use std::time::Duration;

use tokio::time::Instant;

use super::client::normal_client;
use super::figures::{counters, held, summarize};
use super::server::{self, sample_connections};
use super::slowhttptest::{plan, Slow};
use super::{most, Attack, AttackReport, Kind, Options, Record, RAMP_LIMIT, RAMP_POLL};
use crate::binaries::Binaries;

/// Runs `attack` against a fresh server.
pub(super) async fn one_attack(
    attack: Attack,
    options: &Options,
    binaries: &Binaries,
    scratch: &Path,
    out: &Path,
) -> anyhow::Result<AttackReport> {
    let server = server::start(attack, binaries, scratch, out).await?;
    let before = server::scrape(server.admin).await?;
    let ramp = ramp(attack, &server, options, out).await?;
    let measured = measure(&server, options).await;
    let mut processes = Vec::with_capacity(ramp.slow.len());
    for process in ramp.slow {
        processes.push(process.stop().await);
    }
    let after = server::scrape(server.admin).await?;
    let ended = server::stop(server).await?;

    let window = (
        (measured.start - ramp.started).as_secs_f64(),
        (measured.end - ramp.started).as_secs_f64(),
    );
    let mut held = held(&processes, window, &measured.open);
    held.failed_scrapes = measured.failed_scrapes;
    Ok(AttackReport {
        attack,
        target: attack.target(),
        processes,
        held,
        ramp: ramp.took,
        ramp_reached: ramp.reached,
        redirects: summarize(&measured.requests, Kind::Redirect),
        creations: summarize(&measured.requests, Kind::Creation),
        counters: counters(&before, &after),
        ended,
        requests: measured.requests,
    })
}

/// The attack under way.
struct Ramp {
    /// Its slowhttptest processes.
    slow: Vec<Slow>,
    /// When they were started.
    started: Instant,
    /// From their start to the end of the ramp.
    took: Duration,
    /// It ended because [`super::MOST`] of the target was reported up.
    reached: bool,
}

/// Starts the slowhttptest processes of `attack` and waits until they
/// report most of the target connected, at most [`RAMP_LIMIT`] (or until
/// every one has exited).
async fn ramp(
    attack: Attack,
    server: &server::Server,
    options: &Options,
    out: &Path,
) -> anyhow::Result<Ramp> {
    let plans = plan(attack, server.replica.addr, options.window);
    let started = Instant::now();
    let mut slow = Vec::with_capacity(plans.len());
    for (index, args) in plans.iter().enumerate() {
        slow.push(Slow::spawn(attack, index + 1, args, out)?);
    }
    let goal = most(attack.target());
    let mut reached = false;
    let deadline = started + RAMP_LIMIT;
    while Instant::now() < deadline {
        let connected: u64 = slow.iter().map(Slow::connected_now).sum();
        if connected >= goal {
            reached = true;
            break;
        }
        if slow.iter_mut().all(Slow::has_exited) {
            break;
        }
        tokio::time::sleep(RAMP_POLL).await;
    }
    Ok(Ramp {
        slow,
        started,
        took: started.elapsed(),
        reached,
    })
}

/// What the measurement saw.
struct Measured {
    /// When it started and ended.
    start: Instant,
    /// See `start`.
    end: Instant,
    /// Every normal request.
    requests: Vec<Record>,
    /// The server's open connections, once a [`super::SAMPLE_EVERY`].
    open: Vec<i64>,
    /// Reads of `/metrics` that failed meanwhile.
    failed_scrapes: usize,
}

/// The normal client for `--window`, the server's open connections read
/// alongside.
async fn measure(server: &server::Server, options: &Options) -> Measured {
    let start = Instant::now();
    let (requests, (open, failed_scrapes)) = tokio::join!(
        normal_client(server.replica.addr, options),
        sample_connections(server.admin, start + options.window)
    );
    Measured {
        start,
        end: Instant::now(),
        requests,
        open,
        failed_scrapes,
    }
}
