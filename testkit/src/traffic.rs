//! Steady traffic to a server under test while the test changes it (a
//! reload, an in-place upgrade, a way out, a rolling replacement), counting
//! what every request met: one helper for every test that needs clients
//! that keep asking.
//!
//! [`Plan`] says what the clients ask and how they use connections;
//! [`Plan::start`] runs them on a thread and a runtime of their own, so
//! that a blocking test and an async one use them alike; [`Traffic::finish`]
//! stops them and hands back the [`Tally`]. A client on a new connection for
//! every request sees a refused or reset connection; a keep-alive one sees
//! `Connection: close` and a connection closed under it, and, as any
//! client's pool does, opens another when the server closed an idle one.
//!
//! Every client is bounded in requests and in time, whatever the test does.

use std::error::Error as _;
use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::client::conn::http1::{self, SendRequest};
use hyper::header::{CONNECTION, CONTENT_TYPE, HOST};
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;

pub use crate::fate::Fate;

/// One request, connection included, may take this long.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Pause after a failure, so that a refusing port is not hammered.
const PAUSE_AFTER_FAILURE: Duration = Duration::from_millis(10);
/// Failure messages kept for the report, per kind of client.
const SAMPLES: usize = 5;
/// How long [`Traffic::wait_for`] waits.
const PATIENCE: Duration = Duration::from_secs(15);

/// How a client uses connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A new connection for every request: a closed listener shows at once.
    NewConnection,
    /// One connection for as long as the server keeps it open.
    KeepAlive,
}

impl Kind {
    /// Both kinds, in the order of the report.
    pub const ALL: [Kind; 2] = [Kind::NewConnection, Kind::KeepAlive];

    /// The kind's name in the report.
    pub fn name(self) -> &'static str {
        match self {
            Kind::NewConnection => "new connection",
            Kind::KeepAlive => "keep-alive",
        }
    }
}

/// One request a client sends, and the status that answers it.
#[derive(Clone, Debug)]
struct Ask {
    method: Method,
    path: String,
    body: Option<&'static str>,
    status: u16,
}

/// What the clients ask, and how.
#[derive(Clone, Debug)]
pub struct Plan {
    addr: SocketAddr,
    asks: Vec<Ask>,
    clients: Vec<Kind>,
    pause: Duration,
    until_closed: bool,
    limit: Duration,
    max_requests: u64,
}

impl Plan {
    /// `GET /{code}`, answered 307, to `addr`: one client of each kind,
    /// 10 ms apart.
    pub fn redirects(addr: SocketAddr, code: &str) -> Plan {
        Plan::asking(addr, Method::GET, format!("/{code}"), None, 307)
    }

    /// `POST /api/links`, answered 201, to `addr`: one client of each kind,
    /// 10 ms apart.
    pub fn creating_links(addr: SocketAddr) -> Plan {
        let link = r#"{"url":"https://example.com/traffic"}"#;
        Plan::asking(addr, Method::POST, "/api/links".to_owned(), Some(link), 201)
    }

    fn asking(
        addr: SocketAddr,
        method: Method,
        path: String,
        body: Option<&'static str>,
        status: u16,
    ) -> Plan {
        Plan {
            addr,
            asks: vec![Ask {
                method,
                path,
                body,
                status,
            }],
            clients: Kind::ALL.to_vec(),
            pause: Duration::from_millis(10),
            until_closed: false,
            limit: Duration::from_secs(240),
            max_requests: 200_000,
        }
    }

    /// Every other request is `GET /healthz`, answered 200.
    pub fn and_health_checks(mut self) -> Plan {
        self.asks.push(Ask {
            method: Method::GET,
            path: "/healthz".to_owned(),
            body: None,
            status: 200,
        });
        self
    }

    /// `n` clients of each of `kinds`.
    pub fn clients(mut self, kinds: &[Kind], n: usize) -> Plan {
        self.clients = kinds
            .iter()
            .flat_map(|&kind| std::iter::repeat_n(kind, n))
            .collect();
        self
    }

    /// Each client waits `pause` between two requests.
    pub fn pause(mut self, pause: Duration) -> Plan {
        self.pause = pause;
        self
    }

    /// Each client ends at its first request that meets no server (refused,
    /// reset, unanswered): the listener closed, the way out is under way.
    /// That request is not counted; a wrong status still is, as a failure.
    pub fn until_closed(mut self) -> Plan {
        self.until_closed = true;
        self
    }

    /// Starts the clients.
    ///
    /// # Panics
    /// If the runtime or its thread cannot be made.
    pub fn start(self) -> Traffic {
        let shared = Arc::new(Shared::default());
        let thread = thread::Builder::new()
            .name("traffic".to_owned())
            .spawn({
                let shared = Arc::clone(&shared);
                move || {
                    let runtime = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .expect("a runtime for the traffic");
                    runtime.block_on(self.run(&shared))
                }
            })
            .expect("a thread for the traffic");
        Traffic {
            shared,
            thread: Some(thread),
        }
    }

    async fn run(self, shared: &Shared) -> Tally {
        let plan = &self;
        let clients = self
            .clients
            .iter()
            .enumerate()
            .map(|(n, &kind)| async move { (kind, plan.client(n, kind, shared).await) });
        let mut tally = Tally::default();
        for (kind, counts) in futures_util::future::join_all(clients).await {
            tally.of_mut(kind).add(&counts);
        }
        tally
    }

    /// One client: requests until stopped, within its bounds.
    async fn client(&self, n: usize, kind: Kind, shared: &Shared) -> Counts {
        let mut counts = Counts::default();
        let mut connection = None;
        let started = Instant::now();
        for i in 0..self.max_requests {
            if shared.stop.load(Ordering::Acquire) || started.elapsed() > self.limit {
                break;
            }
            // Clients start on different asks.
            let ask = &self.asks[(n + usize::try_from(i).unwrap_or(0)) % self.asks.len()];
            let outcome = match tokio::time::timeout(
                REQUEST_TIMEOUT,
                self.exchange(&mut connection, kind, ask),
            )
            .await
            {
                Ok(outcome) => outcome,
                Err(_) => Err(Failure(Fate::Timeout, format!("{}: no answer", ask.path))),
            };
            let pause = match &outcome {
                Ok(()) => {
                    shared.answered.fetch_add(1, Ordering::AcqRel);
                    self.pause
                }
                Err(Failure(fate, _))
                    if self.until_closed
                        && !matches!(fate, Fate::Http5xx | Fate::UnexpectedStatus) =>
                {
                    break
                }
                Err(_) => {
                    connection = None;
                    PAUSE_AFTER_FAILURE
                }
            };
            counts.record(outcome);
            shared.sent.fetch_add(1, Ordering::AcqRel);
            tokio::time::sleep(pause).await;
        }
        counts
    }

    /// Sends `ask` on the client's connection (a new one if it has none,
    /// or the server closed it while idle) and reads the whole answer.
    async fn exchange(
        &self,
        connection: &mut Option<SendRequest<Full<Bytes>>>,
        kind: Kind,
        ask: &Ask,
    ) -> Result<(), Failure> {
        // A connection the server closed while idle (after `Connection:
        // close`, or at its drain) carried no request: open another one.
        if let Some(sender) = connection {
            if sender.ready().await.is_err() {
                *connection = None;
            }
        }
        let sender = match connection {
            Some(sender) => sender,
            None => connection.insert(open(self.addr).await?),
        };
        let mut request = Request::builder()
            .method(ask.method.clone())
            .uri(&ask.path)
            .header(HOST, "lameduck");
        if ask.body.is_some() {
            request = request.header(CONTENT_TYPE, "application/json");
        }
        let body = Full::new(Bytes::from_static(ask.body.unwrap_or("").as_bytes()));
        let request = request.body(body).expect("a valid request");
        let response = sender.send_request(request).await?;
        let status = response.status();
        let closes = response
            .headers()
            .get(CONNECTION)
            .is_some_and(|value| value.as_bytes().eq_ignore_ascii_case(b"close"));
        response.into_body().collect().await?;
        if closes || kind == Kind::NewConnection {
            *connection = None;
        }
        match Fate::of_status(status.as_u16(), ask.status) {
            Fate::Success => Ok(()),
            fate => Err(Failure(fate, format!("{}: {status}", ask.path))),
        }
    }
}

/// Connects and completes the HTTP/1 handshake.
async fn open(addr: SocketAddr) -> Result<SendRequest<Full<Bytes>>, Failure> {
    let stream = tokio::net::TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    let (sender, connection) = http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(sender)
}

/// What the clients and the test share.
#[derive(Debug, Default)]
struct Shared {
    stop: AtomicBool,
    /// Requests answered with the status asked for.
    answered: AtomicU64,
    /// Requests counted, whatever their fate.
    sent: AtomicU64,
}

/// Clients running; [`Traffic::finish`] stops them.
#[derive(Debug)]
#[must_use = "the traffic runs until finished"]
pub struct Traffic {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<Tally>>,
}

impl Traffic {
    /// Requests answered so far with the status asked for.
    pub fn answered(&self) -> u64 {
        self.shared.answered.load(Ordering::Acquire)
    }

    /// Waits until `n` requests were answered.
    ///
    /// # Panics
    /// If the clients ended, or did not get there within 15 s.
    pub fn wait_for(&self, n: u64) {
        self.wait_until(&self.shared.answered, n, "answers");
    }

    /// Waits until `n` requests were counted, whatever their fate.
    ///
    /// # Panics
    /// As [`Traffic::wait_for`].
    pub fn wait_for_requests(&self, n: u64) {
        self.wait_until(&self.shared.sent, n, "requests");
    }

    fn wait_until(&self, count: &AtomicU64, n: u64, what: &str) {
        let deadline = Instant::now() + PATIENCE;
        while count.load(Ordering::Acquire) < n {
            let ended = self.thread.as_ref().is_none_or(JoinHandle::is_finished);
            assert!(
                !ended && Instant::now() < deadline,
                "traffic stalled at {} of {n} {what}",
                count.load(Ordering::Acquire)
            );
            thread::sleep(Duration::from_millis(5));
        }
    }

    /// Stops the clients (the requests under way finish) and counts.
    pub fn finish(mut self) -> Tally {
        self.shared.stop.store(true, Ordering::Release);
        self.join_thread()
    }

    /// Waits for the clients to end on their own ([`Plan::until_closed`])
    /// and counts.
    pub fn join(mut self) -> Tally {
        self.join_thread()
    }

    fn join_thread(&mut self) -> Tally {
        let thread = self.thread.take().expect("joined once");
        thread.join().expect("the traffic's thread panicked")
    }
}

impl Drop for Traffic {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
    }
}

/// A failed request: its fate and what the client said.
struct Failure(Fate, String);

impl From<io::Error> for Failure {
    fn from(error: io::Error) -> Failure {
        Failure(Fate::of_error(&error), error.to_string())
    }
}

impl From<hyper::Error> for Failure {
    fn from(error: hyper::Error) -> Failure {
        let mut message = error.to_string();
        let mut source = error.source();
        while let Some(cause) = source {
            message.push_str(&format!(": {cause}"));
            source = cause.source();
        }
        Failure(Fate::of_error(&error), message)
    }
}

/// Requests by fate, and the first few failures.
#[derive(Clone, Debug, Default)]
pub struct Counts {
    by_fate: [u64; Fate::ALL.len()],
    samples: Vec<String>,
}

impl Counts {
    fn record(&mut self, outcome: Result<(), Failure>) {
        let fate = match outcome {
            Ok(()) => Fate::Success,
            Err(Failure(fate, message)) => {
                if self.samples.len() < SAMPLES {
                    self.samples.push(format!("{}: {message}", fate.as_str()));
                }
                fate
            }
        };
        self.by_fate[fate as usize] += 1;
    }

    fn add(&mut self, other: &Counts) {
        for (sum, n) in self.by_fate.iter_mut().zip(other.by_fate) {
            *sum += n;
        }
        let room = SAMPLES.saturating_sub(self.samples.len());
        self.samples
            .extend(other.samples.iter().take(room).cloned());
    }

    /// Requests that met `fate`.
    pub fn count(&self, fate: Fate) -> u64 {
        self.by_fate[fate as usize]
    }

    /// Requests answered with the status asked for.
    pub fn ok(&self) -> u64 {
        self.count(Fate::Success)
    }

    /// Requests sent.
    pub fn requests(&self) -> u64 {
        self.by_fate.iter().sum()
    }

    /// Requests not answered with the status asked for.
    pub fn failures(&self) -> u64 {
        self.requests() - self.ok()
    }
}

/// What the clients met, by kind of client.
#[derive(Clone, Debug, Default)]
pub struct Tally([Counts; Kind::ALL.len()]);

impl Tally {
    /// The counts of one kind of client.
    pub fn of(&self, kind: Kind) -> &Counts {
        &self.0[kind as usize]
    }

    fn of_mut(&mut self, kind: Kind) -> &mut Counts {
        &mut self.0[kind as usize]
    }

    /// Every client's counts together.
    pub fn total(&self) -> Counts {
        let mut total = Counts::default();
        for counts in &self.0 {
            total.add(counts);
        }
        total
    }

    /// Requests answered with the status asked for.
    pub fn answered(&self) -> u64 {
        self.total().ok()
    }

    /// Requests not answered with the status asked for.
    pub fn failures(&self) -> u64 {
        self.total().failures()
    }

    /// # Panics
    /// With the report, if any request failed `during` what the test did.
    pub fn assert_none_failed(&self, during: &str) {
        assert_eq!(
            self.failures(),
            0,
            "requests failed during {during}:\n{self}"
        );
    }
}

impl fmt::Display for Tally {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "  {:<15}{:>9}", "clients", "requests")?;
        for fate in Fate::ALL {
            write!(f, "{:>18}", fate.as_str())?;
        }
        let total = self.total();
        let rows = Kind::ALL
            .iter()
            .map(|kind| (kind.name(), self.of(*kind)))
            .chain([("all", &total)]);
        for (name, counts) in rows {
            write!(f, "\n  {name:<15}{:>9}", counts.requests())?;
            for n in counts.by_fate {
                write!(f, "{n:>18}")?;
            }
        }
        for sample in &total.samples {
            write!(f, "\n  e.g. {sample}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use axum::http::StatusCode;
    use axum::routing::get;
    use axum::Router;

    use super::*;

    /// A server on loopback answering `GET /x` with a redirect and
    /// `GET /healthz` with 200, on a runtime of its own.
    fn server() -> (SocketAddr, tokio::runtime::Runtime) {
        let runtime = tokio::runtime::Runtime::new().expect("a runtime");
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .expect("bind");
        let addr = listener.local_addr().expect("its address");
        let app = Router::new()
            .route(
                "/x",
                get(|| async { (StatusCode::TEMPORARY_REDIRECT, [("location", "/")]) }),
            )
            .route("/healthz", get(|| async { "ok" }));
        runtime.spawn(async move { axum::serve(listener, app).await });
        (addr, runtime)
    }

    #[test]
    fn every_request_is_counted_by_kind_and_fate() {
        let (addr, _server) = server();
        let traffic = Plan::redirects(addr, "x")
            .and_health_checks()
            .clients(&Kind::ALL, 2)
            .pause(Duration::from_millis(1))
            .start();
        traffic.wait_for(40);
        let tally = traffic.finish();
        tally.assert_none_failed("a steady server");
        for kind in Kind::ALL {
            assert!(tally.of(kind).ok() >= 4, "{tally}");
        }
        assert_eq!(tally.answered(), tally.total().requests());

        // A wrong status is a failure, with its path in the report.
        let traffic = Plan::creating_links(addr).start();
        traffic.wait_for_requests(2);
        let tally = traffic.finish();
        assert_eq!(tally.answered(), 0, "{tally}");
        assert_eq!(
            tally.total().count(Fate::UnexpectedStatus),
            tally.total().requests()
        );
        assert!(tally.to_string().contains("/api/links: 404"), "{tally}");
    }

    #[test]
    fn a_closed_port_is_refused_and_ends_clients_that_wait_for_it() {
        let addr = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a port nobody listens on");
        let traffic = Plan::redirects(addr, "x").start();
        traffic.wait_for_requests(2);
        let tally = traffic.finish();
        assert!(tally.total().count(Fate::Refused) > 0, "{tally}");
        assert_eq!(tally.failures(), tally.total().requests(), "{tally}");

        let tally = Plan::redirects(addr, "x").until_closed().start().join();
        assert_eq!(tally.total().requests(), 0, "{tally}");
    }
}
