//! The runner every part shares: servers started from a [`Bench`]'s
//! settings, put under closed-loop load in turns ([`Bench::rounds`]), one
//! [`Turn`] a server a round, each run priced in the CPU time the server
//! and the load generator spent on it ([`CpuMark`]).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::Signal;
use tokio::time::Instant;

use super::{shutdown, Options, Run, Series};
use crate::binaries::Binaries;
use crate::raw::{self, RawConn};
use crate::replica::{self, Replica, Spec};
use crate::report::fmt_ms;

/// A server under HTTP/1.1 closed-loop load.
pub(super) struct Target {
    /// Its row's name.
    pub(super) name: &'static str,
    /// Where it listens.
    pub(super) addr: SocketAddr,
    /// Its process, whose CPU time each run reads.
    pub(super) pid: i32,
    /// The requests to cycle through.
    pub(super) requests: Arc<Vec<Vec<u8>>>,
    /// The status every answer should have.
    pub(super) expected: u16,
}

impl Target {
    /// `replica` under load as `name`, cycling through `requests`, each to
    /// be answered `expected`.
    pub(super) fn new(
        name: &'static str,
        replica: &Replica,
        requests: &Arc<Vec<Vec<u8>>>,
        expected: u16,
    ) -> Target {
        Target {
            name,
            addr: replica.addr,
            pid: replica.pid(),
            requests: Arc::clone(requests),
            expected,
        }
    }
}

/// Where a load generator's CPU time is read: this process (the closed
/// loop runs in it) or its exited children (h2load).
#[derive(Clone, Copy, Debug)]
pub(super) enum Harness {
    /// The closed loop, in this process.
    Own,
    /// h2load, a child that has exited.
    Children,
}

/// The CPU time a server and the load generator had used when a run
/// began, to price the run when it ends.
pub(super) struct CpuMark {
    pid: i32,
    harness: Harness,
    server: Option<Duration>,
    load: Option<Duration>,
}

/// What one run cost: CPU seconds, NaN where unreadable.
#[derive(Clone, Copy, Debug)]
pub(super) struct CpuSpent {
    /// The server's.
    pub(super) server: f64,
    /// The load generator's.
    pub(super) load: f64,
}

impl CpuMark {
    /// The CPU time process `pid` and the `harness` have used so far.
    pub(super) fn take(pid: i32, harness: Harness) -> CpuMark {
        CpuMark {
            pid,
            harness,
            server: replica::cpu_time(&pid.to_string()),
            load: harness.cpu_time(),
        }
    }

    /// The CPU time each side has used since the mark.
    pub(super) fn spent(&self) -> CpuSpent {
        let since = |before: Option<Duration>, after: Option<Duration>| match (before, after) {
            (Some(before), Some(after)) => after.saturating_sub(before).as_secs_f64(),
            _ => f64::NAN,
        };
        CpuSpent {
            server: since(self.server, replica::cpu_time(&self.pid.to_string())),
            load: since(self.load, self.harness.cpu_time()),
        }
    }
}

impl Harness {
    fn cpu_time(self) -> Option<Duration> {
        match self {
            Harness::Own => replica::cpu_time("self"),
            Harness::Children => replica::children_cpu_time(),
        }
    }
}

impl CpuSpent {
    /// Server CPU µs per answered request (NaN for none).
    #[allow(clippy::cast_precision_loss)]
    pub(super) fn server_us_per(self, answered: u64) -> f64 {
        if answered > 0 {
            self.server * 1e6 / answered as f64
        } else {
            f64::NAN
        }
    }
}

/// What every part runs its servers with.
pub(super) struct Bench<'a> {
    /// `load bench`'s options.
    pub(super) options: &'a Options,
    /// The servers' binaries.
    pub(super) binaries: &'a Binaries,
    /// The CPUs the servers are pinned to (`taskset -c`), if any.
    pub(super) cpus: Option<String>,
    /// Where the servers keep their data, removed after the run.
    pub(super) scratch: PathBuf,
    /// Where each server's log goes, `NAME.log`.
    pub(super) logs: PathBuf,
}

impl Bench<'_> {
    /// The command of a server `program` keeping its data in `data` under
    /// the scratch folder, with `extra` arguments.
    pub(super) fn spec(&self, program: &Path, data: &str, extra: &[&str]) -> Spec {
        let mut args: Vec<std::ffi::OsString> = [
            "server",
            "--listen",
            "127.0.0.1:0",
            "--log-format",
            "text",
            "--data-dir",
        ]
        .iter()
        .map(Into::into)
        .collect();
        args.push(self.scratch.join(data).into_os_string());
        args.extend(extra.iter().map(Into::into));
        Spec {
            program: program.to_owned(),
            args,
            env: Vec::new(),
            cpus: self.cpus.clone(),
        }
    }

    /// Where the servers of a part run in turn: on one core (CPU 0) when
    /// pinning, then on all cores.
    pub(super) fn placements(&self) -> Vec<(String, Option<String>)> {
        let mut placements = Vec::new();
        if let Some(cpus) = &self.cpus {
            placements.push((
                format!("one core (`taskset -c {cpus}`)"),
                Some(cpus.clone()),
            ));
        }
        placements.push((shutdown::ALL_CORES.to_owned(), None));
        placements
    }

    /// `GET /bench-{n}` for each of the `--links` links.
    pub(super) fn redirect_requests(&self) -> Arc<Vec<Vec<u8>>> {
        Arc::new(
            (0..self.options.links)
                .map(|n| raw::get(&format!("/bench-{n}")))
                .collect(),
        )
    }

    /// Bare hyper on a free port; it takes no other argument.
    pub(super) fn bare_spec(&self) -> Spec {
        Spec {
            program: self.binaries.bare_hyper.clone(),
            args: vec!["127.0.0.1:0".into()],
            env: Vec::new(),
            cpus: self.cpus.clone(),
        }
    }

    /// Starts server `name` from `spec` and waits until `ready` answers.
    pub(super) async fn start(
        &self,
        name: &str,
        spec: &Spec,
        ready: &str,
    ) -> anyhow::Result<Replica> {
        let replica = Replica::spawn(name, spec, &self.logs.join(format!("{name}.log"))).await?;
        replica.wait_ready(ready, Duration::from_secs(30)).await?;
        Ok(replica)
    }

    /// Closed-loop runs of every target, `--connections` connections of
    /// one request at a time, taking turns, the order rotating each round.
    pub(super) async fn rounds(&self, targets: &[Target]) -> Vec<Series> {
        self.rounds_counted(targets).await.0
    }

    /// [`Bench::rounds`], with every answer each target gave, warm-ups
    /// included.
    pub(super) async fn rounds_counted(&self, targets: &[Target]) -> (Vec<Series>, Vec<u64>) {
        let mut runs: Vec<Vec<Run>> = vec![Vec::new(); targets.len()];
        let mut answered = vec![0; targets.len()];
        for round in 0..self.options.rounds as usize {
            for turn in 0..targets.len() {
                let index = (turn + round) % targets.len();
                let turn = self.turn(&targets[index], round).await;
                answered[index] += turn.answered;
                runs[index].push(turn.run);
            }
        }
        let series = targets
            .iter()
            .zip(runs)
            .map(|(target, runs)| Series::new(target.name, runs))
            .collect();
        (series, answered)
    }

    /// One turn of `target` in round `round`: the `--warmup`, then the
    /// measured `--duration`. Around the measured run the server's CPU time
    /// and the harness's own are read: CPU a request prices the server
    /// alone, and a harness near a whole core says the client, not only the
    /// server, set the pace.
    pub(super) async fn turn(&self, target: &Target, round: usize) -> Turn {
        let connections = usize::try_from(self.options.connections).unwrap_or(64);
        let load = |duration| {
            raw::closed_loop(
                target.addr,
                Arc::clone(&target.requests),
                target.expected,
                connections,
                duration,
            )
        };
        let warmup = load(self.options.warmup).await;
        let mark = CpuMark::take(target.pid, Harness::Own);
        let result = load(self.options.duration).await;
        let spent = mark.spent();
        let run = Run::measured(&result, spent);
        eprintln!(
            "load:   round {}/{} {}: {:.0} req/s, p50 {} ms, p99 {} ms, server CPU {:.2} µs a request, load generator {:.0} % of a core{}",
            round + 1,
            self.options.rounds,
            target.name,
            run.rps,
            fmt_ms(run.p50_ms),
            fmt_ms(run.p99_ms),
            run.cpu_us,
            run.client_busy * 100.0,
            if run.unexpected + run.errors > 0 {
                format!(", {} unexpected, {} errors", run.unexpected, run.errors)
            } else {
                String::new()
            }
        );
        Turn {
            run,
            answered: warmup.ok + warmup.unexpected + result.ok + result.unexpected,
            elapsed: result.elapsed,
        }
    }

    /// Creates the `--links` links `bench-0`… on `replica`, which the
    /// redirect runs follow.
    ///
    /// # Errors
    /// If a creation fails or is not answered 201.
    pub(super) async fn create_links(&self, replica: &Replica) -> anyhow::Result<()> {
        let mut conn = RawConn::connect(replica.addr).await?;
        for n in 0..self.options.links {
            let head = conn.exchange(&create_bench_link(n)).await?;
            if head.status != 201 {
                anyhow::bail!(
                    "{}: creating link bench-{n} answered {}",
                    replica.name,
                    head.status
                );
            }
        }
        Ok(())
    }
}

/// What one turn of a target did.
pub(super) struct Turn {
    /// The measured run.
    pub(super) run: Run,
    /// Every answer of the warm-up and the run, whatever its status: each
    /// was a request the server handled.
    pub(super) answered: u64,
    /// How long the measured run took.
    pub(super) elapsed: Duration,
}

/// `POST /api/links` creating `bench-{n}`, the links the redirect
/// benchmarks follow.
pub(super) fn create_bench_link(n: u32) -> Vec<u8> {
    let body = format!(r#"{{"url":"https://example.com/bench/{n}","code":"bench-{n}"}}"#);
    raw::post_json("/api/links", &body)
}

/// Stops `replica` with SIGTERM and waits (bounded) for its exit.
pub(super) async fn stop(replica: &mut Replica) {
    let _ = replica.signal(Signal::SIGTERM);
    replica
        .wait_exit(Instant::now(), Duration::from_secs(30))
        .await;
}
