//! The runner of every scenario of replicas behind HAProxy under traffic,
//! with phases: a throwaway PostgreSQL ([`Database`]), the balancer and
//! the replicas in its slots ([`Fleet`]: started from a [`Spec`], waited
//! UP, retired or killed and restarted), the moments of each on the
//! traffic's clock ([`Mark`]), the links the traffic picks among
//! ([`seed`]), and the traffic itself around the scenario's own actions
//! ([`phases`]). A scenario keeps only its options, its actions between
//! the phases, and its summary.

pub mod database;
mod kill;
pub mod phases;
pub mod seed;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use nix::sys::signal::Signal;
use tokio::time::Instant;

use crate::haproxy::{self, Haproxy};
use crate::replica::{Ended, Replica, Spec};
use crate::report::{Mark, MarkKind};
use crate::traffic::Targets;

pub use database::Database;
pub use kill::{Ports, Restart};
pub use phases::{phases, Ran, Steady, Stoppable, Traffic};

/// How long a replica may take from its start to a 200 on `/readyz`: a
/// restart's wait, the journal replay included.
pub const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// How long the balancer may take to see a ready replica as UP.
pub const LB_UP_TIMEOUT: Duration = Duration::from_secs(10);

/// Where the balancer checks a replica's `/readyz`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Probe {
    /// On its public listener, where the traffic goes.
    Public,
    /// On its admin listener, where a Kubernetes readiness probe goes.
    Admin,
}

/// One replica: a balancer slot and the process that serves it now.
#[derive(Debug)]
pub struct Member {
    /// `r1`, `r2`, …: the replica, whatever its process.
    pub name: String,
    /// Its balancer slot, in every backend.
    pub slot: usize,
    /// Processes started for it so far, the first included.
    pub starts: u32,
    /// The process serving it now.
    pub process: Replica,
    /// Its admin listener (`/readyz`, `/metrics`), where the balancer
    /// checks it ([`Probe::Admin`]); not looked for otherwise, since not
    /// every server has one.
    pub admin: Option<SocketAddr>,
}

impl Member {
    /// The name of its current process: the replica's for the first one,
    /// `r1-2` for its second, and so on, as a container restarts in its pod.
    fn process_name(name: &str, starts: u32) -> String {
        if starts <= 1 {
            name.to_owned()
        } else {
            format!("{name}-{starts}")
        }
    }
}

/// A replica started and ready, not yet in the balancer.
#[derive(Debug)]
pub struct Ready {
    /// The replica, its slot set aside.
    pub member: Member,
    /// From its start to its first 200 on `/readyz`.
    pub ready_after: Duration,
}

/// A replica added: when, and how long each step took.
#[derive(Clone, Debug)]
pub struct Added {
    /// Its name (`r4`).
    pub name: String,
    /// Its balancer slot.
    pub slot: usize,
    /// Its public address.
    pub addr: SocketAddr,
    /// Its admin address, with [`Probe::Admin`].
    pub admin: Option<SocketAddr>,
    /// When the harness started it.
    pub started: Instant,
    /// From its start to its first 200 on `/readyz`.
    pub ready_after: Duration,
    /// From its start until the balancer had it UP.
    pub up_after: Duration,
}

/// A replica retired.
#[derive(Clone, Debug)]
pub struct Retired {
    /// Its name.
    pub name: String,
    /// When it got SIGTERM.
    pub sigterm: Instant,
    /// From SIGTERM until the balancer's checks had taken it out of every
    /// backend (`None` if they never did within the bound, or, with
    /// [`Fleet::out_before_exit_only`], not before the exit).
    pub lb_out_after: Option<Duration>,
    /// How it ended; `after` is from SIGTERM.
    pub ended: Ended,
}

/// What a fleet leaves when it is stopped.
#[derive(Debug)]
pub struct Stopped {
    /// How the replicas left at the end exited, in their order.
    pub exits: Vec<Ended>,
    /// Every replica's moments on the traffic's clock, in time order.
    pub marks: Vec<Mark>,
}

/// The replicas of one run, their balancer, and what happened to them.
pub struct Fleet {
    lb: Haproxy,
    probe: Probe,
    logs: PathBuf,
    /// Free slots, each freed one to the back: a slot is used again only
    /// once every other has been, so that within a run a slot mostly
    /// names one process.
    free: VecDeque<usize>,
    next_id: usize,
    /// Serving replicas, oldest first.
    members: VecDeque<Member>,
    /// The traffic's origin, once set: the marks' zero.
    origin: Option<Instant>,
    /// Every replica's moments: ready, SIGTERM, out, exit, SIGKILL, in.
    moments: Vec<(Instant, MarkKind, String)>,
    /// Whether a balancer "out" seen after the exit is the exit's doing
    /// rather than the checks' (see [`Fleet::out_before_exit_only`]).
    out_before_exit_only: bool,
}

impl Fleet {
    /// A fleet behind `lb`, checked by `probe`, its replicas' logs in
    /// `logs`.
    pub fn new(lb: Haproxy, probe: Probe, logs: &Path) -> Fleet {
        Fleet {
            free: (1..=lb.slots).collect(),
            lb,
            probe,
            logs: logs.to_owned(),
            next_id: 1,
            members: VecDeque::new(),
            origin: None,
            moments: Vec::new(),
            out_before_exit_only: false,
        }
    }

    /// Counts the balancer taking a retired replica out only if it did
    /// before the exit: behind an L4 balancer an exit is seen at once, so
    /// what follows it says nothing of the checks.
    #[must_use]
    pub fn out_before_exit_only(mut self) -> Fleet {
        self.out_before_exit_only = true;
        self
    }

    /// The balancer.
    pub fn lb(&self) -> &Haproxy {
        &self.lb
    }

    /// Where the traffic goes: the balancer's HTTP/1.1 and HTTP/2 fronts.
    pub fn targets(&self) -> Targets {
        Targets {
            http1: self.lb.http1,
            http2: self.lb.http2,
        }
    }

    /// The serving replicas, oldest first.
    pub fn members(&self) -> impl Iterator<Item = &Member> {
        self.members.iter()
    }

    /// The serving replicas, to take a last look at before the stop.
    pub fn members_mut(&mut self) -> impl Iterator<Item = &mut Member> {
        self.members.iter_mut()
    }

    /// The first serving replica's public address, to seed links through.
    ///
    /// # Errors
    /// If there is none.
    pub fn first_addr(&self) -> anyhow::Result<SocketAddr> {
        self.members
            .front()
            .map(|m| m.process.addr)
            .context("no replica")
    }

    /// Sets the traffic's origin: marks count from it, those before it
    /// are dropped.
    pub fn begin(&mut self, origin: Instant) {
        self.origin = Some(origin);
    }

    /// Seconds from the origin to `instant` (0 before it).
    pub fn at(&self, instant: Instant) -> f64 {
        self.origin
            .and_then(|origin| instant.checked_duration_since(origin))
            .map_or(0.0, |d| d.as_secs_f64())
    }

    /// Notes a replica's moment for the timeline.
    pub fn mark(&mut self, instant: Instant, kind: MarkKind, replica: &str) {
        self.moments.push((instant, kind, replica.to_owned()));
    }

    /// Starts process `name` of `spec`, logging to `logs/NAME.log`, and
    /// waits until the probed listener answers 200 on `/readyz`; returns it
    /// with its admin address (with [`Probe::Admin`]) and the time from
    /// its start to ready.
    async fn spawn(
        &self,
        name: &str,
        spec: &Spec,
    ) -> anyhow::Result<(Replica, Option<SocketAddr>, Duration)> {
        let log = self.logs.join(format!("{name}.log"));
        let process = Replica::spawn(name, spec, &log).await?;
        let (probed, admin) = match self.probe {
            Probe::Public => (process.addr, None),
            Probe::Admin => {
                let admin = process.admin_addr().await?;
                (admin, Some(admin))
            }
        };
        let ready_after = process
            .wait_ready_at(probed, "/readyz", READY_TIMEOUT)
            .await?;
        Ok((process, admin, ready_after))
    }

    /// Points `slot` at `addr`, checked there or on `admin`.
    async fn enable(
        &self,
        slot: usize,
        addr: SocketAddr,
        admin: Option<SocketAddr>,
    ) -> anyhow::Result<()> {
        match admin {
            None => self.lb.enable(slot, addr).await,
            Some(admin) => self.lb.enable_checked_at(slot, addr, admin.port()).await,
        }
    }

    /// Starts a replica of `spec`, waits until it is ready, puts it into
    /// a free slot (marked ready then) and waits until the balancer has it
    /// UP.
    ///
    /// # Errors
    /// If it does not start, get ready or come UP in time, or no slot is
    /// free.
    pub async fn add(&mut self, spec: &Spec) -> anyhow::Result<Added> {
        let ready = self.start(spec).await?;
        self.enter(ready).await
    }

    /// The first half of [`Fleet::add`]: starts a replica of `spec` and
    /// waits until it is ready, a slot set aside for it; the balancer does
    /// not know it yet.
    ///
    /// # Errors
    /// If it does not start or get ready in time, or no slot is free.
    pub async fn start(&mut self, spec: &Spec) -> anyhow::Result<Ready> {
        let name = format!("r{}", self.next_id);
        self.next_id += 1;
        let Some(slot) = self.free.pop_front() else {
            bail!("no free balancer slot (start the balancer with more)");
        };
        let (process, admin, ready_after) = self.spawn(&name, spec).await?;
        Ok(Ready {
            member: Member {
                name,
                slot,
                starts: 1,
                process,
                admin,
            },
            ready_after,
        })
    }

    /// The second half of [`Fleet::add`]: puts a ready replica into its
    /// slot (marked ready then) and waits until the balancer has it UP.
    ///
    /// # Errors
    /// If the balancer rejects it or does not have it UP in time.
    pub async fn enter(&mut self, ready: Ready) -> anyhow::Result<Added> {
        let Ready {
            member,
            ready_after,
        } = ready;
        let (addr, started) = (member.process.addr, member.process.started);
        self.enable(member.slot, addr, member.admin).await?;
        self.mark(Instant::now(), MarkKind::Ready, &member.name);
        self.lb
            .wait_status(member.slot, "up", haproxy::is_up, LB_UP_TIMEOUT)
            .await?;
        let added = Added {
            name: member.name.clone(),
            slot: member.slot,
            addr,
            admin: member.admin,
            started,
            ready_after,
            up_after: started.elapsed(),
        };
        self.members.push_back(member);
        Ok(added)
    }

    /// SIGTERMs the oldest replica and waits both for its exit and for the
    /// balancer's checks to take it out (within `bound`), then empties its
    /// slot: the endpoint is removed neither before the process is gone
    /// nor before the balancer's lag has passed, as in a cluster whose
    /// endpoint removal trails the SIGTERM.
    ///
    /// # Errors
    /// If there is none, it cannot be signalled, or the slot cannot be
    /// emptied.
    pub async fn retire_oldest(&mut self, bound: Duration) -> anyhow::Result<Retired> {
        let Some(mut member) = self.members.pop_front() else {
            bail!("no replica to retire");
        };
        let sigterm = Instant::now();
        member.process.signal(Signal::SIGTERM)?;
        self.mark(sigterm, MarkKind::Sigterm, &member.name);
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
        let lb_out_after =
            lb_out_after.filter(|after| !self.out_before_exit_only || *after <= ended.after);
        if let Some(after) = lb_out_after {
            self.mark(sigterm + after, MarkKind::LbOut, &member.name);
        }
        self.mark(sigterm + ended.after, MarkKind::Exit, &member.name);
        self.lb.disable(slot).await?;
        self.free.push_back(slot);
        Ok(Retired {
            name: member.name,
            sigterm,
            lb_out_after,
            ended,
        })
    }

    /// SIGTERMs every replica at once (no traffic is left to drain: their
    /// exit flushes what they hold), waits for each within `bound`, and
    /// stops the balancer.
    ///
    /// # Errors
    /// If a replica cannot be signalled.
    pub async fn stop(mut self, bound: Duration) -> anyhow::Result<Stopped> {
        let sigterm = Instant::now();
        for member in &self.members {
            member.process.signal(Signal::SIGTERM)?;
        }
        let mut exits = Vec::new();
        while let Some(mut member) = self.members.pop_front() {
            exits.push(member.process.wait_exit(sigterm, bound).await);
        }
        let marks = self.marks();
        self.lb.stop().await;
        Ok(Stopped { exits, marks })
    }

    /// The moments on the traffic's clock, to the millisecond, in time
    /// order; those before the origin dropped.
    fn marks(&self) -> Vec<Mark> {
        let Some(origin) = self.origin else {
            return Vec::new();
        };
        let mut marks: Vec<Mark> = self
            .moments
            .iter()
            .filter_map(|(at, kind, replica)| {
                let after = at.checked_duration_since(origin)?;
                Some(Mark {
                    at_s: (after.as_secs_f64() * 1000.0).round() / 1000.0,
                    kind: *kind,
                    replica: replica.clone(),
                })
            })
            .collect();
        marks.sort_by(|a, b| a.at_s.total_cmp(&b.at_s));
        marks
    }
}
