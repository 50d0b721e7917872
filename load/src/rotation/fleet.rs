//! The replicas of one `load rotation` run behind their L4 balancer: the
//! runner's [`fleet::Fleet`] in HAProxy's `mode tcp`, each replica's
//! connections seeded apart, and what each one counted meanwhile
//! ([`Scraper`]), read from the traffic's origin until it leaves.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use tokio::time::Instant;

use super::scrape::{self, Reading, Scraper};
use crate::fleet::{self, Added, Probe, Retired};
use crate::haproxy::{Checks, Haproxy};
use crate::replica::{Ended, Spec};
use crate::report::Mark;
use crate::tls;

/// Balancer slots: every replica of a run gets its own (a run adds at most
/// 2R of them), so that a slot names one process.
const SLOTS: usize = 16;

/// How long a replica may take, once the clients are gone, to have seen
/// every one of their connections close (through the balancer).
const CLOSES_SEEN_TIMEOUT: Duration = Duration::from_secs(2);

/// One serving replica's counters, read until it leaves.
struct Reader {
    name: String,
    admin: SocketAddr,
    scraper: Option<Scraper>,
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
    /// Every replica's moments on the traffic's clock.
    pub(super) marks: Vec<Mark>,
}

/// The replicas of a run, their balancer, and what they counted.
pub(super) struct Fleet {
    fleet: fleet::Fleet,
    spec: Spec,
    /// Replica `rN` draws its connections' moments (in the drain spread,
    /// within the age's jitter) from `--connection-seed` this plus N, so a
    /// run can be repeated and no two replicas draw alike.
    seed: u64,
    /// Replicas added so far: the last one's N.
    added: u64,
    /// The traffic's origin, once set: replicas' counters are read from it.
    origin: Option<Instant>,
    /// The serving replicas' readers, oldest first.
    readers: Vec<Reader>,
    /// Counters of the replicas already gone.
    traces: Vec<Trace>,
}

impl Fleet {
    /// Starts an L4 HAProxy (its files in `scratch`, its log in `logs`)
    /// for replicas started from `spec`, checked on their admin port,
    /// their connections' draws seeded from `seed`.
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
            fleet: fleet::Fleet::new(lb, Probe::Admin, logs).out_before_exit_only(),
            spec,
            seed,
            added: 0,
            origin: None,
            readers: Vec::new(),
            traces: Vec::new(),
        })
    }

    /// The balancer's one address, where the clients connect.
    pub(super) fn target(&self) -> SocketAddr {
        self.fleet.lb().http1
    }

    /// A serving replica's public (TLS) address, to seed links through.
    pub(super) fn first_addr(&self) -> anyhow::Result<SocketAddr> {
        self.fleet.first_addr()
    }

    /// Starts reading every replica's counters on the grid from `origin`,
    /// those added later's too; marks count from it.
    pub(super) fn begin(&mut self, origin: Instant) {
        self.origin = Some(origin);
        self.fleet.begin(origin);
        for reader in &mut self.readers {
            reader.scraper = Some(Scraper::spawn(reader.admin, origin));
        }
    }

    /// Adds a replica with its own connection seed and reads its counters
    /// from then on, once the traffic has begun.
    ///
    /// # Errors
    /// If it does not start, get ready or come UP in time.
    pub(super) async fn add(&mut self) -> anyhow::Result<Added> {
        self.added += 1;
        let mut spec = self.spec.clone();
        spec.args.push("--connection-seed".into());
        spec.args
            .push(self.seed.wrapping_add(self.added).to_string().into());
        let ready = self.fleet.start(&spec).await?;
        // Its first reading, before the balancer has it, is its baseline.
        let admin = ready.member.admin.context("checked on the admin port")?;
        self.readers.push(Reader {
            name: ready.member.name.clone(),
            admin,
            scraper: self.origin.map(|origin| Scraper::spawn(admin, origin)),
        });
        self.fleet.enter(ready).await
    }

    /// Retires the oldest replica (see [`fleet::Fleet::retire_oldest`])
    /// and keeps what it counted.
    ///
    /// # Errors
    /// If there is none, or it cannot be signalled.
    pub(super) async fn retire_oldest(&mut self, bound: Duration) -> anyhow::Result<Retired> {
        let retired = self.fleet.retire_oldest(bound).await?;
        if let Some(index) = self.readers.iter().position(|r| r.name == retired.name) {
            let reader = self.readers.remove(index);
            self.keep_trace(reader).await;
        }
        Ok(retired)
    }

    /// Takes every replica's last reading once it has seen its clients go,
    /// then stops the fleet (see [`fleet::Fleet::stop`]).
    ///
    /// # Errors
    /// If a replica cannot be signalled.
    pub(super) async fn stop(mut self, bound: Duration) -> anyhow::Result<Stopped> {
        // The clients are gone: once each replica has seen them go, a last
        // reading counts every close, and nothing moves after it.
        for reader in std::mem::take(&mut self.readers) {
            scrape::wait_closed(reader.admin, CLOSES_SEEN_TIMEOUT).await;
            self.keep_trace(reader).await;
        }
        let stopped = self.fleet.stop(bound).await?;
        Ok(Stopped {
            exits: stopped.exits,
            traces: self.traces,
            marks: stopped.marks,
        })
    }

    async fn keep_trace(&mut self, reader: Reader) {
        if let Some(scraper) = reader.scraper {
            self.traces.push(Trace {
                name: reader.name,
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
