//! Open-loop mixed traffic: requests go out on a fixed schedule (request `i`
//! is due at `start + i / rate`) whether or not earlier ones have answered,
//! and latency is measured from the time a request was due, so a stalled
//! server shows up as latency instead of hiding behind a slower sender
//! (no coordinated omission).
//!
//! The mix: redirects (`GET /{code}`), link creations (`POST /api/links`)
//! and link reads (`GET /api/links/{code}`),
//! over a pool of HTTP/1.1 keep-alive connections and an HTTP/2
//! prior-knowledge connection, chosen per request by a seeded generator, so
//! two runs with the same seed and rate send the same sequence.

use std::error::Error as StdError;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::{CONTENT_TYPE, HOST, RETRY_AFTER};
use hyper::{Method, Request};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::fate::Fate;
use crate::haproxy;

/// How long an idle pooled HTTP/1.1 connection is kept by the client;
/// shorter than the balancer's keep-alive timeout, so the client, not the
/// balancer, closes idle connections and never reuses a closing one.
pub const CLIENT_IDLE_TIMEOUT: Duration = Duration::from_secs(5);

/// The kind of request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// `GET /{code}`, expecting 307 (and a hit counted).
    Redirect,
    /// `POST /api/links`, expecting 201.
    Create,
    /// `GET /api/links/{code}`, expecting 200.
    Read,
}

impl Kind {
    /// The status that means success.
    pub fn expected(self) -> u16 {
        match self {
            Kind::Redirect => 307,
            Kind::Create => 201,
            Kind::Read => 200,
        }
    }

    /// Whether the request needs the database (a redirect of a link the
    /// server has cached does not).
    pub fn needs_database(self) -> bool {
        self != Kind::Redirect
    }
}

/// The protocol a request used.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Proto {
    /// HTTP/1.1 keep-alive.
    Http1,
    /// HTTP/2 with prior knowledge (h2c).
    Http2,
}

/// The shape of the traffic.
#[derive(Clone, Debug, Serialize)]
pub struct Mix {
    /// Requests per second, constant.
    pub rate: u32,
    /// Seed of the generator choosing kind, protocol and code per request.
    pub seed: u64,
    /// Share of requests sent over HTTP/2 (0 to 1).
    pub h2_share: f64,
    /// Share of requests that create a link (0 to 1).
    pub create_share: f64,
    /// Share of requests that read a link (0 to 1); the rest redirect.
    pub read_share: f64,
    /// How long one request may take before it counts as a timeout.
    #[serde(with = "crate::report::millis")]
    pub timeout: Duration,
    /// Hard limit on the traffic's duration, whatever the caller does.
    #[serde(with = "crate::report::millis")]
    pub max_duration: Duration,
}

/// Where to send the traffic.
#[derive(Clone, Copy, Debug)]
pub struct Targets {
    /// Address accepting HTTP/1.1.
    pub http1: SocketAddr,
    /// Address accepting HTTP/2 with prior knowledge.
    pub http2: SocketAddr,
}

/// One request's outcome.
#[derive(Clone, Copy, Debug)]
pub struct Record {
    /// When it was due, from the traffic's origin.
    pub due: Duration,
    /// From due to the end of the response body (or the error).
    pub latency: Duration,
    /// What happened.
    pub fate: Fate,
    /// Redirect or creation.
    pub kind: Kind,
    /// HTTP/1.1 or HTTP/2.
    pub proto: Proto,
    /// The response status, 0 if there was none.
    pub status: u16,
    /// The response carried `Retry-After`.
    pub retry_after: bool,
    /// A 503 to a creation that says the database did not confirm it and
    /// names the link (`location`): it may have been stored.
    pub unconfirmed: bool,
    /// The balancer's slot of the server that answered (its `x-served-by`
    /// header), if a balancer said.
    pub server: Option<u8>,
}

type Body = Full<Bytes>;

/// Sends `mix` to `targets` from `origin` until `stop` turns true (or
/// [`Mix::max_duration`] passes), waits for the requests still out (each
/// ends within [`Mix::timeout`]), and returns every outcome in due order.
///
/// Redirects pick their code from `codes`, which must not be empty.
pub async fn run(
    mix: Mix,
    targets: Targets,
    codes: Arc<[String]>,
    origin: Instant,
    mut stop: watch::Receiver<bool>,
) -> Vec<Record> {
    let clients = Clients::new(mix.timeout);
    let (tx, mut rx) = mpsc::unbounded_channel();
    let collector = tokio::spawn(async move {
        let mut records = Vec::new();
        while let Some(record) = rx.recv().await {
            records.push(record);
        }
        records
    });

    let mut rng = StdRng::seed_from_u64(mix.seed);
    let period_ns = 1e9 / f64::from(mix.rate.max(1));
    let deadline = origin + mix.max_duration;
    for i in 0u64.. {
        #[allow(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            clippy::cast_precision_loss
        )]
        let due = origin + Duration::from_nanos((i as f64 * period_ns) as u64);
        let stopped = *stop.borrow();
        if stopped || due >= deadline || !wait_until(due, &mut stop).await {
            break;
        }
        let (proto, kind) = draw(&mut rng, &mix);
        let code = &codes[rng.random_range(0..codes.len())];
        let (client, addr) = clients.for_proto(proto, targets);
        let request = build_request(kind, addr, code, mix.seed, i);
        let tx = tx.clone();
        let timeout = mix.timeout;
        tokio::spawn(async move {
            let answer = send(&client, request, kind, timeout).await;
            let _ = tx.send(answer.record(due - origin, due.elapsed(), kind, proto));
        });
    }
    drop(tx);
    let mut records = collector.await.unwrap_or_default();
    records.sort_by_key(|record| record.due);
    records
}

/// The two clients: a pool of HTTP/1.1 keep-alive connections and an
/// HTTP/2 prior-knowledge connection.
struct Clients {
    http1: Client<HttpConnector, Body>,
    http2: Client<HttpConnector, Body>,
}

impl Clients {
    /// Both, connecting within `timeout`, with `TCP_NODELAY`.
    fn new(timeout: Duration) -> Clients {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(timeout));
        Clients {
            http1: Client::builder(TokioExecutor::new())
                .pool_idle_timeout(CLIENT_IDLE_TIMEOUT)
                .build(connector.clone()),
            http2: Client::builder(TokioExecutor::new())
                .http2_only(true)
                .build(connector),
        }
    }

    /// The client of `proto`, and where it sends.
    fn for_proto(
        &self,
        proto: Proto,
        targets: Targets,
    ) -> (Client<HttpConnector, Body>, SocketAddr) {
        match proto {
            Proto::Http1 => (self.http1.clone(), targets.http1),
            Proto::Http2 => (self.http2.clone(), targets.http2),
        }
    }
}

/// Sleeps until `due` unless `stop` turns true first; whether to go on.
async fn wait_until(due: Instant, stop: &mut watch::Receiver<bool>) -> bool {
    if due <= Instant::now() {
        return true;
    }
    tokio::select! {
        () = tokio::time::sleep_until(due) => true,
        changed = stop.changed() => changed.is_ok() && !*stop.borrow(),
    }
}

/// The next request's protocol and kind, drawn from `rng` in this order
/// (the order keeps a seed's sequence).
fn draw(rng: &mut StdRng, mix: &Mix) -> (Proto, Kind) {
    let proto = if rng.random::<f64>() < mix.h2_share {
        Proto::Http2
    } else {
        Proto::Http1
    };
    let draw = rng.random::<f64>();
    let kind = if draw < mix.create_share {
        Kind::Create
    } else if draw < mix.create_share + mix.read_share {
        Kind::Read
    } else {
        Kind::Redirect
    };
    (proto, kind)
}

fn build_request(kind: Kind, addr: SocketAddr, code: &str, seed: u64, i: u64) -> Request<Body> {
    let builder = Request::builder().header(HOST, addr.to_string());
    let request = match kind {
        Kind::Redirect => builder
            .method(Method::GET)
            .uri(format!("http://{addr}/{code}"))
            .body(Body::default()),
        Kind::Read => builder
            .method(Method::GET)
            .uri(format!("http://{addr}/api/links/{code}"))
            .body(Body::default()),
        Kind::Create => builder
            .method(Method::POST)
            .uri(format!("http://{addr}/api/links"))
            .header(CONTENT_TYPE, "application/json")
            .body(Body::from(format!(
                r#"{{"url":"https://example.com/load/{seed}/{i}"}}"#
            ))),
    };
    request.unwrap_or_else(|error| unreachable!("a well-formed request: {error}"))
}

/// What came back for one request.
struct Answer {
    fate: Fate,
    status: u16,
    retry_after: bool,
    unconfirmed: bool,
    server: Option<u8>,
}

impl Answer {
    /// The record of a request of `kind` over `proto`, due at `due` from
    /// the origin, that took `latency` from then.
    fn record(self, due: Duration, latency: Duration, kind: Kind, proto: Proto) -> Record {
        Record {
            due,
            latency,
            fate: self.fate,
            kind,
            proto,
            status: self.status,
            retry_after: self.retry_after,
            unconfirmed: self.unconfirmed,
            server: self.server,
        }
    }
}

async fn send(
    client: &Client<HttpConnector, Body>,
    request: Request<Body>,
    kind: Kind,
    timeout: Duration,
) -> Answer {
    let exchange = async {
        let response = client
            .request(request)
            .await
            .map_err(|error| Box::new(error) as Box<dyn StdError + Send + Sync>)?;
        let status = response.status().as_u16();
        let headers = response.headers();
        let retry_after = headers.contains_key(RETRY_AFTER);
        let server = headers
            .get("x-served-by")
            .and_then(|value| value.to_str().ok())
            .and_then(haproxy::served_by);
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|error| Box::new(error) as Box<dyn StdError + Send + Sync>)?
            .to_bytes();
        let unconfirmed = kind == Kind::Create && status == 503 && names_a_location(&body);
        Ok::<_, Box<dyn StdError + Send + Sync>>((status, retry_after, unconfirmed, server))
    };
    let failed = |fate| Answer {
        fate,
        status: 0,
        retry_after: false,
        unconfirmed: false,
        server: None,
    };
    match tokio::time::timeout(timeout, exchange).await {
        Err(_elapsed) => failed(Fate::Timeout),
        Ok(Err(error)) => failed(Fate::of_error(&*error)),
        Ok(Ok((status, retry_after, unconfirmed, server))) => Answer {
            fate: Fate::of_status(status, kind.expected()),
            status,
            retry_after,
            unconfirmed,
            server,
        },
    }
}

/// The error body names a `location`: the write may have been made.
fn names_a_location(body: &[u8]) -> bool {
    serde_json::from_slice::<serde_json::Value>(body).is_ok_and(|error| {
        error
            .get("location")
            .is_some_and(serde_json::Value::is_string)
    })
}
