//! The clients of `load rotation`: N keep-alive HTTPS clients over
//! HTTP/1.1, each one connection at a time, as services or browsers that
//! sit behind one L4 Service address. A client keeps its connection until
//! the server closes it, or answers with `Connection: close`, and opens the
//! next one for its next request, through the balancer, with a full TLS
//! handshake (no session resumption).
//!
//! Open loop: client `c` of `N` sends its `k`-th redirect (`GET /{code}`) at
//! `origin + (c + k·N) / rate`, so the clients together send `rate`
//! requests a second, evenly spread; a late answer delays the client's next
//! request but not its due time, and latency is measured from the due time
//! (no coordinated omission).
//!
//! What a real client does, this one does: while idle it watches its
//! connection, and drops it if the server closes it ([`RawConn::closed`]);
//! and a request that fails on a reused connection before any byte of an
//! answer came back is sent once more on a new connection (RFC 9112
//! §9.3.1), counted as [`Record::retried`]. That second chance covers the
//! race in which the server closes an idle connection while the request is
//! on its way.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

use crate::fate::Fate;
use crate::fleet::Stoppable;
use crate::raw;
use crate::tls::{self, TlsConn};

/// The shape of one run's traffic.
#[derive(Clone, Copy, Debug)]
pub(super) struct Load {
    /// Clients, each with one connection at a time.
    pub(super) clients: u32,
    /// Requests per second, all clients together.
    pub(super) rate: u32,
    /// Seed of each client's choice of link (mixed with its number).
    pub(super) seed: u64,
    /// A request without a whole answer this long after it was due (the
    /// connect and handshake included) is a timeout.
    pub(super) timeout: Duration,
    /// Hard limit on the traffic's duration, whatever the caller does.
    pub(super) max_duration: Duration,
}

/// One request's outcome.
#[derive(Clone, Copy, Debug)]
pub(super) struct Record {
    /// When it was due, from the traffic's origin.
    pub(super) due: Duration,
    /// From due to the end of the answer (or the error).
    pub(super) latency: Duration,
    /// What happened (success is a 307).
    pub(super) fate: Fate,
    /// Its first try failed on a reused connection with nothing answered,
    /// and it was sent again on a new one.
    pub(super) retried: bool,
}

/// The clients at work, from their origin until they are stopped
/// ([`Stoppable::stop`]).
#[derive(Debug)]
pub(super) struct Traffic {
    /// When the first request was due: the clock of every series.
    pub(super) origin: Instant,
    stop: watch::Sender<bool>,
    task: JoinHandle<Vec<Record>>,
    tls: tls::Client,
}

/// What the clients did.
#[derive(Debug)]
pub(super) struct Finished {
    /// Every request, in due order.
    pub(super) records: Vec<Record>,
    /// Seconds from the origin to the stop.
    pub(super) traffic_s: f64,
    /// TLS handshakes made.
    pub(super) handshakes: u64,
}

impl Traffic {
    /// Starts `load` against `target` now, with `tls`'s handshakes.
    pub(super) fn start(
        load: Load,
        target: SocketAddr,
        tls: tls::Client,
        codes: Arc<[String]>,
    ) -> Traffic {
        let (stop, stopped) = watch::channel(false);
        let origin = Instant::now();
        let task = tokio::spawn(run(load, target, tls.clone(), codes, origin, stopped));
        Traffic {
            origin,
            stop,
            task,
            tls,
        }
    }
}

impl Stoppable for Traffic {
    type Ran = Finished;

    /// Stops the clients and waits for the requests still out.
    async fn stop(self) -> anyhow::Result<Finished> {
        let _ = self.stop.send(true);
        let traffic_s = self.origin.elapsed().as_secs_f64();
        let records = self.task.await.context("the clients failed")?;
        Ok(Finished {
            records,
            traffic_s,
            handshakes: self.tls.handshakes().0,
        })
    }
}

/// Runs `load` against `target` from `origin` until `stop` turns true (or
/// [`Load::max_duration`] passes); waits for the requests still out (each
/// ends within [`Load::timeout`]) and returns every outcome in due order.
/// Redirects pick their code from `codes`, which must not be empty.
async fn run(
    load: Load,
    target: SocketAddr,
    tls: tls::Client,
    codes: Arc<[String]>,
    origin: Instant,
    stop: watch::Receiver<bool>,
) -> Vec<Record> {
    let mut tasks = JoinSet::new();
    for id in 0..load.clients {
        let client = Client {
            id,
            load,
            origin,
            target,
            tls: tls.clone(),
            codes: Arc::clone(&codes),
            rng: StdRng::seed_from_u64(
                load.seed ^ u64::from(id).wrapping_mul(0x9E37_79B9_7F4A_7C15),
            ),
            conn: None,
        };
        tasks.spawn(client.run(stop.clone()));
    }
    let mut records = Vec::new();
    while let Some(done) = tasks.join_next().await {
        if let Ok(part) = done {
            records.extend(part);
        }
    }
    records.sort_by_key(|record| record.due);
    records
}

/// What ended a client's wait for its next due time.
enum Woke {
    Due,
    ServerClosed,
    Stopped,
}

/// One client: its schedule, its link choices and its connection.
struct Client {
    id: u32,
    load: Load,
    origin: Instant,
    target: SocketAddr,
    tls: tls::Client,
    codes: Arc<[String]>,
    rng: StdRng,
    /// The kept-alive connection, if one is open.
    conn: Option<TlsConn>,
}

impl Client {
    /// When request `k` is due: `origin + (id + k·clients) / rate`.
    fn due(&self, k: u64) -> Instant {
        let slot = u64::from(self.id) + k * u64::from(self.load.clients);
        #[allow(
            clippy::cast_precision_loss,
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss
        )]
        let ns = (slot as f64 * 1e9 / f64::from(self.load.rate.max(1))) as u64;
        self.origin + Duration::from_nanos(ns)
    }

    async fn run(mut self, mut stop: watch::Receiver<bool>) -> Vec<Record> {
        let deadline = self.origin + self.load.max_duration;
        let mut records = Vec::new();
        for k in 0u64.. {
            let due = self.due(k);
            if due >= deadline || !self.wait(due, &mut stop).await {
                break;
            }
            let code = &self.codes[self.rng.random_range(0..self.codes.len())];
            let request = raw::get(&format!("/{code}"));
            let (fate, retried) =
                match tokio::time::timeout_at(due + self.load.timeout, self.send(&request)).await {
                    Err(_elapsed) => (Fate::Timeout, false),
                    Ok(sent) => sent,
                };
            records.push(Record {
                due: due - self.origin,
                latency: due.elapsed(),
                fate,
                retried,
            });
        }
        records
    }

    /// Waits until `due`, dropping the connection if the server closes it
    /// meanwhile; `false` once `stop` says so.
    async fn wait(&mut self, due: Instant, stop: &mut watch::Receiver<bool>) -> bool {
        loop {
            if *stop.borrow() {
                return false;
            }
            if Instant::now() >= due {
                return true;
            }
            let woke = match self.conn.as_mut() {
                Some(conn) => tokio::select! {
                    () = tokio::time::sleep_until(due) => Woke::Due,
                    _ = conn.closed() => Woke::ServerClosed,
                    changed = stop.changed() => if changed.is_err() { Woke::Stopped } else { continue },
                },
                None => tokio::select! {
                    () = tokio::time::sleep_until(due) => Woke::Due,
                    changed = stop.changed() => if changed.is_err() { Woke::Stopped } else { continue },
                },
            };
            match woke {
                Woke::Due => return !*stop.borrow(),
                Woke::ServerClosed => self.conn = None,
                Woke::Stopped => return false,
            }
        }
    }

    /// Sends `request` on the kept-alive connection or a new one; once
    /// more on a new one if a reused connection failed with nothing
    /// answered. Returns the fate, and whether it was sent twice.
    async fn send(&mut self, request: &[u8]) -> (Fate, bool) {
        for attempt in 0..2 {
            let retried = attempt > 0;
            let (mut conn, reused) = match self.conn.take() {
                Some(conn) => (conn, true),
                None => match self.tls.connect(self.target).await {
                    Ok(conn) => (conn, false),
                    Err(error) => return (fate_of(&error), retried),
                },
            };
            match conn.exchange(request).await {
                Ok(head) => {
                    if !head.close {
                        self.conn = Some(conn);
                    }
                    return (Fate::of_status(head.status, 307), retried);
                }
                Err(_) if reused && !retried && conn.received_nothing() => {}
                Err(error) => return (fate_of(&error), retried),
            }
        }
        unreachable!("the second try returns")
    }
}

fn fate_of(error: &io::Error) -> Fate {
    Fate::of_io(error).unwrap_or(Fate::OtherError)
}
