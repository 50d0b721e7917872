//! The replicas of one `load rotation` run behind their L4 balancer: how
//! one is added (started, ready, put into HAProxy, UP), how the oldest is
//! retired (SIGTERM, followed out of the balancer, waited for), and what
//! each one counted meanwhile ([`Scraper`]).

use std::collections::VecDeque;
use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use nix::sys::signal::Signal;
use tokio::time::Instant;

use super::scrape::{self, Reading, Scraper};
use crate::haproxy::{self, Checks, Haproxy};
use crate::raw;
use crate::replica::{Ended, Replica, Spec};
use crate::report::MarkKind;
use crate::tls;

/// Balancer slots: every replica of a run gets its own, never reused, so
/// that a slot names one process.
const SLOTS: usize = 16;

/// How long a new replica may take from its start to a 200 on `/readyz`.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// How long the balancer may take to see a ready replica as UP.
const LB_UP_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a replica may take, once the clients are gone, to have seen
/// every one of their connections close (through the balancer).
const CLOSES_SEEN_TIMEOUT: Duration = Duration::from_secs(2);

/// One replica in the balancer.
#[derive(Debug)]
struct Member {
    process: Replica,
    slot: usize,
    /// Reads its counters from the traffic's origin on.
    scraper: Option<Scraper>,
    admin: SocketAddr,
}

/// A replica added: when, and how long each step took.
#[derive(Clone, Debug)]
pub(super) struct Added {
    /// Its name (`r4`).
    pub(super) name: String,
    /// When the harness started it.
    pub(super) started: Instant,
    /// From its start to its first 200 on `/readyz`.
    pub(super) ready_after: Duration,
    /// From its start until the balancer had it UP.
    pub(super) up_after: Duration,
}

/// A replica retired.
#[derive(Clone, Debug)]
pub(super) struct Retired {
    /// Its name.
    pub(super) name: String,
    /// When it got SIGTERM.
    pub(super) sigterm: Instant,
    /// From SIGTERM until the balancer's checks had taken it out, if they
    /// did before it exited.
    pub(super) lb_out_after: Option<Duration>,
    /// How it ended; `after` is from SIGTERM.
    pub(super) ended: Ended,
}

/// One replica's counters over the run.
#[derive(Clone, Debug)]
pub(super) struct Trace {
    /// Its name.
    pub(super) name: String,
    /// Its readings, in tick order.
    pub(super) readings: Vec<Reading>,
}

/// What a fleet leaves when it is stopped.
#[derive(Debug)]
pub(super) struct Stopped {
    /// How the replicas left at the end exited.
    pub(super) exits: Vec<Ended>,
    /// Every replica's counters.
    pub(super) traces: Vec<Trace>,
    /// Every replica's moments.
    pub(super) marks: Vec<(Instant, MarkKind, String)>,
}

/// The replicas of a run, their balancer, and what happened to them.
pub(super) struct Fleet {
    lb: Haproxy,
    spec: Spec,
    /// Replica `rN` draws its connections' moments (in the drain spread,
    /// within the age's jitter) from `--connection-seed` this plus N, so a
    /// run can be repeated and no two replicas draw alike.
    seed: u64,
    logs: PathBuf,
    next_id: usize,
    next_slot: usize,
    /// Serving replicas, oldest first.
    members: VecDeque<Member>,
    /// The traffic's origin, once set: replicas' counters are read from it.
    origin: Option<Instant>,
    /// Counters of the replicas already gone.
    traces: Vec<Trace>,
    /// Every replica's moments: ready and UP, SIGTERM, out, exit.
    marks: Vec<(Instant, MarkKind, String)>,
}

impl Fleet {
    /// Starts an L4 HAProxy (its files in `scratch`, its log in `logs`)
    /// for replicas started from `spec`, their connections' draws seeded
    /// from `seed`.
    ///
    /// # Errors
    /// If HAProxy does not start.
    pub(super) async fn start(
        checks: Checks,
        spec: Spec,
        seed: u64,
        scratch: &Path,
        logs: &Path,
    ) -> anyhow::Result<Fleet> {
        let lb = Haproxy::start_tcp(checks, SLOTS, scratch, &logs.join("haproxy.log")).await?;
        Ok(Fleet {
            lb,
            spec,
            seed,
            logs: logs.to_owned(),
            next_id: 1,
            next_slot: 1,
            members: VecDeque::new(),
            origin: None,
            traces: Vec::new(),
            marks: Vec::new(),
        })
    }

    /// The balancer's one address, where the clients connect.
    pub(super) fn target(&self) -> SocketAddr {
        self.lb.http1
    }

    /// A serving replica's public (TLS) address, to seed links through.
    pub(super) fn first_addr(&self) -> Option<SocketAddr> {
        self.members.front().map(|m| m.process.addr)
    }

    /// Starts reading every replica's counters on the grid from `origin`,
    /// those added later's too.
    pub(super) fn begin(&mut self, origin: Instant) {
        self.origin = Some(origin);
        for member in &mut self.members {
            member.scraper = Some(Scraper::spawn(member.admin, origin));
        }
    }

    /// Starts a replica, waits until its admin listener says ready, puts it
    /// into the balancer, checked on its admin port (where a Kubernetes
    /// readiness probe goes), and waits until the balancer has it UP.
    ///
    /// # Errors
    /// If it does not start, get ready or come UP in time.
    pub(super) async fn add(&mut self) -> anyhow::Result<Added> {
        let id = self.next_id;
        let name = format!("r{id}");
        self.next_id += 1;
        let slot = self.next_slot;
        self.next_slot += 1;
        if slot > SLOTS {
            bail!("no free balancer slot (raise SLOTS)");
        }
        let log = self.logs.join(format!("{name}.log"));
        let mut spec = self.spec.clone();
        spec.args.push("--connection-seed".into());
        spec.args
            .push(self.seed.wrapping_add(id as u64).to_string().into());
        let process = Replica::spawn(&name, &spec, &log).await?;
        let started = process.started;
        let admin = process.admin_addr().await?;
        let ready_after = process
            .wait_ready_at(admin, "/readyz", READY_TIMEOUT)
            .await?;
        let scraper = self.origin.map(|origin| Scraper::spawn(admin, origin));
        self.lb
            .enable_checked_at(slot, process.addr, admin.port())
            .await?;
        self.lb
            .wait_status(slot, "up", haproxy::is_up, LB_UP_TIMEOUT)
            .await?;
        let up = Instant::now();
        self.marks.push((up, MarkKind::Ready, name.clone()));
        self.members.push_back(Member {
            process,
            slot,
            scraper,
            admin,
        });
        Ok(Added {
            name,
            started,
            ready_after,
            up_after: up - started,
        })
    }

    /// SIGTERMs the oldest replica and waits both for its exit and for the
    /// balancer's checks to take it out (within `bound`), then empties its
    /// slot, as the endpoints controller removes a pod that is gone.
    ///
    /// # Errors
    /// If there is none, or it cannot be signalled.
    pub(super) async fn retire_oldest(&mut self, bound: Duration) -> anyhow::Result<Retired> {
        let Some(mut member) = self.members.pop_front() else {
            bail!("no replica to retire");
        };
        let name = member.process.name.clone();
        let sigterm = Instant::now();
        member.process.signal(Signal::SIGTERM)?;
        self.marks.push((sigterm, MarkKind::Sigterm, name.clone()));
        let lb = &self.lb;
        let slot = member.slot;
        let watch_lb = async {
            lb.wait_status(slot, "out", haproxy::is_out, bound)
                .await
                .ok()
                .map(|_| sigterm.elapsed())
        };
        let (lb_out_after, ended) =
            tokio::join!(watch_lb, member.process.wait_exit(sigterm, bound));
        // Out after the exit is the exit's doing, not the checks'.
        let lb_out_after = lb_out_after.filter(|after| *after <= ended.after);
        if let Some(after) = lb_out_after {
            self.marks
                .push((sigterm + after, MarkKind::LbOut, name.clone()));
        }
        self.marks
            .push((sigterm + ended.after, MarkKind::Exit, name.clone()));
        self.lb.disable(slot).await?;
        self.keep_trace(&name, member.scraper).await;
        Ok(Retired {
            name,
            sigterm,
            lb_out_after,
            ended,
        })
    }

    /// Takes every replica's last reading once it has seen its clients go,
    /// then SIGTERMs them all at once (no traffic is left to drain), waits
    /// for each within `bound`, and stops the balancer.
    ///
    /// # Errors
    /// If a replica cannot be signalled.
    pub(super) async fn stop(mut self, bound: Duration) -> anyhow::Result<Stopped> {
        // The clients are gone: once each replica has seen them go, a last
        // reading counts every close, and nothing moves after it.
        for member in &mut self.members {
            scrape::wait_closed(member.admin, CLOSES_SEEN_TIMEOUT).await;
            let name = member.process.name.clone();
            let scraper = member.scraper.take();
            if let Some(scraper) = scraper {
                self.traces.push(Trace {
                    name,
                    readings: scraper.finish().await,
                });
            }
        }
        let sigterm = Instant::now();
        for member in &self.members {
            member.process.signal(Signal::SIGTERM)?;
        }
        let mut exits = Vec::new();
        while let Some(mut member) = self.members.pop_front() {
            exits.push(member.process.wait_exit(sigterm, bound).await);
        }
        self.lb.stop().await;
        Ok(Stopped {
            exits,
            traces: self.traces,
            marks: self.marks,
        })
    }

    async fn keep_trace(&mut self, name: &str, scraper: Option<Scraper>) {
        if let Some(scraper) = scraper {
            self.traces.push(Trace {
                name: name.to_owned(),
                readings: scraper.finish().await,
            });
        }
    }
}

/// Every replica's arguments: TLS on the public listener with the run's
/// certificate, plain HTTP on the admin one, one database (in the
/// environment), one data directory, and `extra`.
pub(super) fn spec(
    program: &Path,
    certificates: &tls::Certificates,
    data: &Path,
    url: &str,
    extra: &[String],
) -> Spec {
    let mut args: Vec<OsString> = [
        "server",
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
        "--log-format",
        "text",
        "--tls-cert",
    ]
    .iter()
    .map(Into::into)
    .collect();
    args.push(certificates.cert.clone().into_os_string());
    args.push("--tls-key".into());
    args.push(certificates.key.clone().into_os_string());
    args.push("--data-dir".into());
    args.push(data.into());
    args.extend(extra.iter().map(Into::into));
    Spec {
        program: program.to_owned(),
        args,
        env: vec![("DATABASE_URL".to_owned(), url.to_owned())],
        cpus: None,
    }
}

/// Creates `count` links through `addr` over TLS and returns their codes
/// (`seed-0`, `seed-1`, …).
///
/// # Errors
/// If a creation fails or answers other than 201.
pub(super) async fn seed_links(
    addr: SocketAddr,
    client: &tls::Client,
    count: u32,
    seed: u64,
) -> anyhow::Result<Arc<[String]>> {
    let mut conn = client.connect(addr).await.context("TLS to a replica")?;
    let mut codes = Vec::new();
    for n in 0..count {
        let code = format!("seed-{n}");
        let body = format!(r#"{{"url":"https://example.com/seed/{seed}/{n}","code":"{code}"}}"#);
        let head = conn.exchange(&raw::post_json("/api/links", &body)).await?;
        if head.status != 201 {
            bail!("creating link {code} answered {}", head.status);
        }
        if head.close {
            conn = client.connect(addr).await?;
        }
        codes.push(code);
    }
    Ok(codes.into())
}
