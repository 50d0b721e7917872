//! Limits, faults and bad input, tested against the real binary: every
//! limit answers clearly (a status code and a JSON body, or a closed
//! connection), none of them starves well-behaved clients, and no bad
//! request changes what is stored.
//!
//! Each test runs `lameduck server` as a child process
//! (`testkit/src/binary/`) and talks to it over raw sockets, so it sees
//! exactly what went on the wire; the PostgreSQL tests use a throwaway
//! cluster (`testkit/src/postgres.rs`) that they lock, stop and start under
//! the service. Every wait is bounded; the few timing checks are generous
//! correctness bounds ("closed within a few seconds of its timeout", "not
//! answered while the limit holds"), never performance thresholds.

use std::convert::Infallible;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, Full, StreamBody};
use hyper::body::Bytes;
use hyper::client::conn::http2;
use hyper::header::{CONTENT_LENGTH, CONTENT_TYPE};
use hyper::Request;
use hyper_util::rt::{TokioExecutor, TokioIo};
use nix::sys::signal::Signal;
use sqlx::sqlite::SqliteConnection;
use sqlx::Connection;
use tempfile::TempDir;
use tokio::runtime::Runtime;

use lameduck_lifecycle::{draw, Draw};
use lameduck_testkit::binary::{
    assert_json_error, assert_told_in_order, connect, finish_slow_post_of, fresh_get, get,
    link_body, metric, metrics, post_json, post_links, read_response, start_slow_post_of,
    uninterrupted, until_told, wait_database, wait_for_eof, wait_metric, LameduckProcess,
    RawResponse, INTERNALS,
};
use lameduck_testkit::postgres::{PgCluster, Sql};

/// Generous bound on anything that should take milliseconds; reaching it is
/// a failure.
const PATIENCE: Duration = Duration::from_secs(15);
/// "Within a few seconds": how long after its timeout a limit may take to
/// act, or a probe to notice the database's state.
const FEW_SECONDS: Duration = Duration::from_secs(5);
/// "Quickly": the bound on an answer that must not wait for anything (a
/// shed request, a request failing fast while the database is down).
const QUICKLY: Duration = Duration::from_secs(2);
// === a server with its data directory ===

/// A server on SQLite in a data directory the test can open, to count what
/// is stored. Dropping it kills the child before the directory goes.
struct Server {
    process: LameduckProcess,
    data: TempDir,
}

impl Server {
    /// The admin listener's address (`/metrics`).
    fn admin(&self) -> SocketAddr {
        self.process.admin_addr()
    }

    fn start(args: &[&str]) -> Server {
        let data = tempfile::Builder::new()
            .prefix("lameduck-limits-")
            .tempdir()
            .expect("data directory");
        let data_arg = data.path().display().to_string();
        let mut all = vec!["--data-dir", data_arg.as_str()];
        all.extend_from_slice(args);
        let process = LameduckProcess::start(&all, &[]);
        Server { process, data }
    }

    fn addr(&self) -> SocketAddr {
        self.process.addr()
    }

    /// Rows in `links` and `link_audit`, read from the SQLite file.
    fn stored(&self) -> (i64, i64) {
        sqlite_rows(self.data.path())
    }

    /// The server still answers `/healthz` on a new connection.
    fn assert_serving(&mut self, after: &str) {
        assert!(
            self.process.is_running(),
            "lameduck exited after {after}; logs:\n{}",
            self.process.log_text()
        );
        let health = fresh_get(self.addr(), "/healthz");
        assert_eq!(health.status, 200, "after {after}: {health:?}");
    }
}

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

fn sqlite_rows(data_dir: &Path) -> (i64, i64) {
    let url = format!("sqlite://{}", data_dir.join("lameduck.db").display());
    runtime().block_on(async {
        let mut conn = SqliteConnection::connect(&url)
            .await
            .expect("open the SQLite database");
        let links: i64 = sqlx::query_scalar("SELECT count(*) FROM links")
            .fetch_one(&mut conn)
            .await
            .expect("count links");
        let audit: i64 = sqlx::query_scalar("SELECT count(*) FROM link_audit")
            .fetch_one(&mut conn)
            .await
            .expect("count audit rows");
        conn.close().await.expect("close");
        (links, audit)
    })
}

// === raw HTTP helpers ===

/// `GET path` with extra header lines on a new connection.
fn get_with(addr: SocketAddr, path: &str, headers: &str) -> RawResponse {
    let mut stream = connect(addr);
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: lameduck\r\n{headers}\r\n"
    )
    .expect("send");
    read_response(&mut stream).unwrap_or_else(|e| panic!("GET {path}: {e}"))
}

/// How the server ended a connection.
#[derive(Debug, PartialEq, Eq)]
enum Ending {
    Eof,
    Reset,
}

/// Writes `bytes` (a write error is fine: the server may close before it
/// has read everything) and reads until the server closes the connection.
///
/// # Panics
/// If the connection is still open after [`PATIENCE`].
fn send_until_closed(addr: SocketAddr, bytes: &[u8]) -> (Vec<u8>, Ending) {
    let mut stream = connect(addr);
    let _ = stream.write_all(bytes);
    stream
        .set_read_timeout(Some(PATIENCE))
        .expect("read timeout");
    let mut received = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    loop {
        match uninterrupted(|| stream.read(&mut buf)) {
            Ok(0) => return (received, Ending::Eof),
            Ok(n) => received.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {
                return (received, Ending::Reset)
            }
            Err(e) => panic!(
                "the connection was not closed within {PATIENCE:?} ({e}); received {:?}",
                String::from_utf8_lossy(&received)
            ),
        }
    }
}

/// Sends `bytes` and expects one response with `status`, then the end of
/// the connection. Returns the response.
fn expect_rejected(addr: SocketAddr, bytes: &[u8], status: u16, case: &str) -> RawResponse {
    let (received, ending) = send_until_closed(addr, bytes);
    let response = read_response(&mut received.as_slice()).unwrap_or_else(|e| {
        panic!(
            "{case}: no complete response before {ending:?} ({e}): {:?}",
            String::from_utf8_lossy(&received)
        )
    });
    assert_eq!(response.status, status, "{case}: {response:?}");
    assert_no_internals(&response, case);
    response
}

/// hyper answers requests it cannot parse itself, with an empty body (the
/// application never sees them); whatever the body, it says nothing of the
/// internals, and if it is not empty it is a JSON error.
fn assert_no_internals(response: &RawResponse, case: &str) {
    if response.body.is_empty() {
        return;
    }
    let body = String::from_utf8_lossy(&response.body).to_lowercase();
    assert!(
        response.json()["error"].is_string(),
        "{case}: not a JSON error: {body}"
    );
    for word in INTERNALS {
        assert!(!body.contains(word), "{case}: {word:?} in the body {body}");
    }
}

/// Whether nothing at all (no data, no EOF) arrives on `stream` within
/// `within`; consumes nothing.
fn silent_for(stream: &TcpStream, within: Duration) -> bool {
    stream.set_read_timeout(Some(within)).expect("read timeout");
    let mut byte = [0u8; 1];
    let silent = match uninterrupted(|| stream.peek(&mut byte)) {
        Ok(_) => false,
        Err(e) => matches!(
            e.kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
        ),
    };
    stream
        .set_read_timeout(Some(lameduck_testkit::binary::IO_TIMEOUT))
        .expect("read timeout");
    silent
}

// === metrics ===

/// Waits until `n` requests are in flight, asking the admin listener at
/// `admin` (whose own requests are not counted).
fn wait_in_flight(admin: SocketAddr, n: i64) {
    wait_metric(admin, "lameduck_requests_in_flight", |value| {
        value >= n as f64
    });
}

// === HTTP/2 frames ===

const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const H2_HEADERS: u8 = 0x1;
const H2_RST_STREAM: u8 = 0x3;
const H2_SETTINGS: u8 = 0x4;
const H2_PING: u8 = 0x6;
const H2_GOAWAY: u8 = 0x7;
const H2_CONTINUATION: u8 = 0x9;
const H2_ACK: u8 = 0x1;
const H2_END_STREAM: u8 = 0x1;
const H2_END_HEADERS: u8 = 0x4;
/// RST_STREAM's "the client no longer wants the stream".
const H2_CANCEL: u32 = 0x8;
/// GOAWAY's "the peer is generating excessive load".
const H2_ENHANCE_YOUR_CALM: u32 = 0xb;

/// One frame as the server sent it.
#[derive(Debug)]
struct Frame {
    kind: u8,
    flags: u8,
    payload: Vec<u8>,
}

/// Reads one frame; `Ok(None)` on EOF between frames.
fn read_frame(stream: &mut TcpStream) -> io::Result<Option<Frame>> {
    let mut header = [0u8; 9];
    let mut filled = 0;
    while filled < header.len() {
        match uninterrupted(|| stream.read(&mut header[filled..]))? {
            0 if filled == 0 => return Ok(None),
            0 => return Err(io::ErrorKind::UnexpectedEof.into()),
            n => filled += n,
        }
    }
    let length = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
    let mut payload = vec![0; length];
    stream.read_exact(&mut payload)?;
    Ok(Some(Frame {
        kind: header[3],
        flags: header[4],
        payload,
    }))
}

/// One frame: `kind` with `flags` on `stream`, carrying `payload`.
fn h2_frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let length = u32::try_from(payload.len()).expect("a small payload");
    let mut frame = length.to_be_bytes()[1..].to_vec();
    frame.extend_from_slice(&[kind, flags]);
    frame.extend_from_slice(&stream.to_be_bytes());
    frame.extend_from_slice(payload);
    frame
}

/// A raw HTTP/2 connection: preface and an empty SETTINGS frame sent.
fn h2_connect(addr: SocketAddr) -> TcpStream {
    let mut stream = connect(addr);
    stream.write_all(H2_PREFACE).expect("send the preface");
    let settings = h2_frame(H2_SETTINGS, 0, 0, &[]);
    stream.write_all(&settings).expect("send SETTINGS");
    stream
}

/// Plays a well-behaved, idle HTTP/2 client on `stream` (acknowledges
/// SETTINGS and, if `answer_pings`, PINGs) until the server closes it or
/// `within` passes. Returns the error code of the last GOAWAY seen, if
/// any, and whether it closed.
fn h2_idle_until_closed(
    stream: &mut TcpStream,
    within: Duration,
    answer_pings: bool,
) -> (Option<u32>, bool) {
    let deadline = Instant::now() + within;
    let mut goaway = None;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return (goaway, false);
        }
        stream.set_read_timeout(Some(left)).expect("read timeout");
        let frame = match read_frame(stream) {
            Ok(Some(frame)) => frame,
            Ok(None) => return (goaway, true),
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => return (goaway, true),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return (goaway, false)
            }
            Err(e) => panic!("reading HTTP/2 frames: {e}"),
        };
        match frame.kind {
            H2_SETTINGS if frame.flags & H2_ACK == 0 => {
                let _ = stream.write_all(&h2_frame(H2_SETTINGS, H2_ACK, 0, &[]));
            }
            H2_PING if frame.flags & H2_ACK == 0 && answer_pings => {
                let _ = stream.write_all(&h2_frame(H2_PING, H2_ACK, 0, &frame.payload));
            }
            H2_GOAWAY => {
                let code = frame.payload.get(4..8).expect("a GOAWAY's error code");
                goaway = Some(u32::from_be_bytes(code.try_into().expect("four bytes")));
            }
            _ => {}
        }
    }
}

// === hyper's HTTP/2 client ===

/// A request body for [`h2_client`]'s requests.
type H2Body = BoxBody<Bytes, Infallible>;

/// A connection from hyper's HTTP/2 client (prior knowledge), as real
/// clients (reqwest, h2load) open it: every request carries `:authority`
/// when its URI has one. Runs on the caller's runtime.
async fn h2_client(addr: SocketAddr) -> http2::SendRequest<H2Body> {
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connect for HTTP/2");
    let (sender, connection) = tokio::time::timeout(
        PATIENCE,
        http2::handshake(TokioExecutor::new(), TokioIo::new(tcp)),
    )
    .await
    .expect("HTTP/2 handshake in time")
    .expect("HTTP/2 handshake");
    tokio::spawn(connection);
    sender
}

/// Sends `request` on `sender`; returns the status, the body and how long
/// the response head took. The whole exchange must end within [`PATIENCE`].
async fn h2_send(
    sender: &mut http2::SendRequest<H2Body>,
    request: Request<H2Body>,
) -> (u16, Vec<u8>, Duration) {
    let started = Instant::now();
    let response = tokio::time::timeout(PATIENCE, sender.send_request(request))
        .await
        .expect("an HTTP/2 response head in time")
        .expect("an HTTP/2 response");
    let took = started.elapsed();
    let status = response.status().as_u16();
    let body = tokio::time::timeout(PATIENCE, response.into_body().collect())
        .await
        .expect("the HTTP/2 response body in time")
        .expect("the HTTP/2 response body")
        .to_bytes()
        .to_vec();
    (status, body, took)
}

/// An HTTP/2 answer as a [`RawResponse`], for [`assert_json_error`]: the
/// JSON errors here are always `application/json`.
fn h2_as_raw(status: u16, body: Vec<u8>) -> RawResponse {
    RawResponse {
        status,
        headers: vec![("content-type".to_owned(), "application/json".to_owned())],
        body,
    }
}

// === body limit ===

// Gap: a body over `--max-body-bytes` must be refused with 413 and a JSON
// error whether its size is announced (Content-Length) or not (chunked),
// and must store nothing; a body under the limit still goes through.
#[test]
fn a_body_over_the_limit_gets_413_with_a_json_error() {
    let mut server = Server::start(&["--max-body-bytes", "1024"]);
    let addr = server.addr();
    // Valid JSON that would be stored if the limit did not hold: padding
    // with whitespace keeps it valid at any size.
    let padded = |code: &str, size: usize| {
        let head = format!(r#"{{"url":"https://example.com/{code}","code":"{code}""#);
        format!("{head}{}}}", " ".repeat(size - head.len() - 1))
    };

    let big = padded("too-big", 4096);
    let response = post_json(addr, &big);
    assert_json_error(&response, 413, "4 KiB body with Content-Length");

    let mut stream = connect(addr);
    write!(
        stream,
        "POST /api/links HTTP/1.1\r\nHost: lameduck\r\nContent-Type: application/json\r\n\
         Transfer-Encoding: chunked\r\n\r\n{:x}\r\n{big}\r\n0\r\n\r\n",
        big.len()
    )
    .expect("send a chunked body");
    let response = read_response(&mut stream).expect("an answer to the chunked body");
    assert_json_error(&response, 413, "4 KiB chunked body");

    let response = fresh_get(addr, "/api/links/too-big");
    assert_json_error(&response, 404, "the refused link");
    assert_eq!(server.stored(), (0, 0), "a refused body stored something");

    let response = post_json(addr, &padded("fits", 1000));
    assert_eq!(response.status, 201, "a body under the limit: {response:?}");
    assert_eq!(server.stored(), (1, 1));
    server.assert_serving("bodies over the limit");
}

// Gap: a body announced over `--max-body-bytes` was read until the limit
// tripped. `Content-Length: 10000000000` with no body went unanswered until
// `--request-timeout` (30 s), holding a slot under
// `--max-concurrent-requests` all along, so a handful of such clients shed
// every normal one; `Expect: 100-continue` with 10 MB got `100 Continue`.
// Both must get 413 with a JSON error at once, before any body is read: no
// `100 Continue`, `Connection: close` and the connection closed, over
// HTTP/1.1 and HTTP/2 alike, and a normal client sent meanwhile is served.
// A body under the limit with `Expect: 100-continue` still gets `100
// Continue` and is stored.
#[test]
fn a_body_announced_over_the_limit_gets_413_at_once_without_100_continue() {
    let mut server = Server::start(&[
        "--max-body-bytes",
        "1024",
        "--max-concurrent-requests",
        "2",
        "--request-timeout",
        "30s",
    ]);
    let addr = server.addr();
    let head = |expect: &str, length: u64| {
        format!(
            "POST /api/links HTTP/1.1\r\nHost: lameduck\r\nContent-Type: application/json\r\n\
             {expect}Content-Length: {length}\r\n\r\n"
        )
    };
    let cases = [
        ("10 GB announced, nothing sent", "", 10_000_000_000_u64),
        (
            "10 MB announced with Expect: 100-continue",
            "Expect: 100-continue\r\n",
            10 << 20,
        ),
    ];
    // Three of each, twice the concurrency limit, sent before any answer is
    // read; then a normal client.
    let mut waiting = Vec::new();
    for (case, expect, length) in cases.iter().cycle().take(6) {
        let mut stream = connect(addr);
        stream
            .write_all(head(expect, *length).as_bytes())
            .expect("send the head");
        waiting.push((*case, *length, stream, Instant::now()));
    }
    let normal = post_json(addr, &link_body("normal"));
    assert_eq!(normal.status, 201, "a normal client: {normal:?}");

    for (case, length, mut stream, sent) in waiting {
        let response = read_response(&mut stream).unwrap_or_else(|e| panic!("{case}: {e}"));
        let took = sent.elapsed();
        // A `100 Continue` would be the first response read here.
        let message = assert_json_error(&response, 413, case);
        assert!(
            message.contains(&format!("{length} bytes")) && message.contains("limit of 1024"),
            "{case}: {message}"
        );
        assert!(took < QUICKLY, "{case}: answered after {took:?}");
        assert!(response.closes_connection(), "{case}: {response:?}");
        assert!(
            wait_for_eof(&mut stream, FEW_SECONDS).expect("read"),
            "{case}: the connection stayed open"
        );
    }

    // HTTP/2: the same refusal, while the body never yields a byte.
    runtime().block_on(async {
        let mut sender = h2_client(addr).await;
        let never = StreamBody::new(futures_util::stream::pending::<
            Result<hyper::body::Frame<Bytes>, Infallible>,
        >())
        .boxed();
        let request = Request::post(format!("http://{addr}/api/links"))
            .header(CONTENT_TYPE, "application/json")
            .header(CONTENT_LENGTH, 10 << 20)
            .body(never)
            .expect("request");
        let (status, body, took) = h2_send(&mut sender, request).await;
        let message = assert_json_error(&h2_as_raw(status, body), 413, "HTTP/2, 10 MB");
        assert!(message.contains("limit of 1024"), "{message}");
        assert!(took < QUICKLY, "HTTP/2: answered after {took:?}");
    });

    // Under the limit, `Expect: 100-continue` works as before.
    let body = link_body("continued");
    let mut stream = connect(addr);
    stream
        .write_all(head("Expect: 100-continue\r\n", body.len() as u64).as_bytes())
        .expect("send the head");
    let interim = read_response(&mut stream).expect("100 Continue");
    assert_eq!(interim.status, 100, "{interim:?}");
    stream.write_all(body.as_bytes()).expect("send the body");
    let created = read_response(&mut stream).expect("the answer");
    assert_eq!(created.status, 201, "{created:?}");

    assert_eq!(server.stored(), (2, 2), "only the two normal links");
    server.assert_serving("bodies announced over the limit");
}

// === slow clients ===

/// One slowloris connection.
struct SlowClient {
    stream: TcpStream,
    /// When its partial head was sent: the server's header timer starts
    /// after that.
    sent_at: Instant,
    /// How long after `sent_at` the server closed it.
    closed_after: Option<Duration>,
    /// What the server sent before closing (a 408, if anything).
    received: Vec<u8>,
}

impl SlowClient {
    fn open(addr: SocketAddr, partial: &[u8]) -> SlowClient {
        let mut stream = connect(addr);
        stream.write_all(partial).expect("send the partial head");
        let sent_at = Instant::now();
        stream.set_nonblocking(true).expect("non-blocking");
        SlowClient {
            stream,
            sent_at,
            closed_after: None,
            received: Vec::new(),
        }
    }

    /// Reads whatever arrived; notes when the server closed the connection.
    fn poll(&mut self) {
        let mut buf = [0u8; 1024];
        while self.closed_after.is_none() {
            match self.stream.read(&mut buf) {
                Ok(0) => self.closed(),
                Ok(n) => self.received.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(_) => self.closed(),
            }
        }
    }

    /// Sends one more byte of header, as a slowloris client does.
    fn trickle(&mut self) {
        if self.closed_after.is_none() {
            match self.stream.write(b"a") {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(_) => self.closed(),
            }
        }
    }

    fn closed(&mut self) {
        self.closed_after = Some(self.sent_at.elapsed());
    }
}

/// Opens `n` connections, each sending one of `partials` and then, if
/// `trickle`, one more byte every 300 ms, against a server started with
/// `--header-read-timeout 1s`. Follows them until the server has closed
/// them all, or until [`FEW_SECONDS`] after the last one's timeout. Checks
/// that each was closed, not before its timeout, and that whatever the
/// server sent first was a 408.
fn slow_clients_are_cut_off(addr: SocketAddr, partials: &[&[u8]], n: usize, trickle: bool) {
    const TIMEOUT: Duration = Duration::from_secs(1);
    const TRICKLE_EVERY: Duration = Duration::from_millis(300);
    let mut slow: Vec<SlowClient> = (0..n)
        .map(|i| SlowClient::open(addr, partials[i % partials.len()]))
        .collect();
    let deadline =
        slow.last().map_or_else(Instant::now, |last| last.sent_at) + TIMEOUT + FEW_SECONDS;
    let mut next_trickle = Instant::now() + TRICKLE_EVERY;
    loop {
        slow.iter_mut().for_each(SlowClient::poll);
        if slow.iter().all(|client| client.closed_after.is_some()) || Instant::now() >= deadline {
            break;
        }
        if trickle && Instant::now() >= next_trickle {
            slow.iter_mut().for_each(SlowClient::trickle);
            next_trickle += TRICKLE_EVERY;
        }
        thread::sleep(Duration::from_millis(20));
    }

    let open: Vec<usize> = (0..n).filter(|&i| slow[i].closed_after.is_none()).collect();
    assert!(
        open.is_empty(),
        "{} of {n} slow connections still open {FEW_SECONDS:?} after their {TIMEOUT:?} header \
         timeout (for example #{}, which sent {:?})",
        open.len(),
        open[0],
        String::from_utf8_lossy(partials[open[0] % partials.len()])
    );
    for (i, client) in slow.iter().enumerate() {
        let closed_after = client.closed_after.unwrap_or_default();
        assert!(
            closed_after >= TIMEOUT.mul_f64(0.9),
            "slow connection #{i} closed after only {closed_after:?}"
        );
        assert!(
            client.received.is_empty() || client.received.starts_with(b"HTTP/1.1 408 "),
            "slow connection #{i} got {:?}",
            String::from_utf8_lossy(&client.received)
        );
    }
}

/// Sets a flag when dropped, even by a panic, so a helper thread stops.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

// Gap: slowloris. A thousand clients that send part of a request head and
// then one byte every 300 ms must each be cut off soon after
// `--header-read-timeout` (the timer is a deadline, not reset by each
// byte), while normal clients are served throughout and after.
#[test]
fn slow_header_clients_are_cut_off_and_do_not_starve_normal_clients() {
    const SLOW: usize = 1_000;
    let mut server = Server::start(&["--header-read-timeout", "1s"]);
    let addr = server.addr();
    let partials: [&[u8]; 2] = [
        b"GET /healthz HTTP/1.1\r\nHost: lameduck\r\nX-Slow: ",
        b"POST /api/links HTTP/1.1\r\nHost: lameduck\r\nContent-Type: applica",
    ];
    let stop = AtomicBool::new(false);
    let (served, failures) = thread::scope(|scope| {
        let normal = scope.spawn(|| {
            let started = Instant::now();
            let (mut served, mut failures) = (0u32, Vec::new());
            while !stop.load(Ordering::SeqCst) && started.elapsed() < 2 * PATIENCE {
                let mut stream = connect(addr);
                match get(&mut stream, "/healthz") {
                    Ok(response) if response.status == 200 => served += 1,
                    other => failures.push(format!("{other:?}")),
                }
                thread::sleep(Duration::from_millis(20));
            }
            (served, failures)
        });
        let stop_guard = StopOnDrop(&stop);
        slow_clients_are_cut_off(addr, &partials, SLOW, true);
        drop(stop_guard);
        normal.join().expect("the normal client thread")
    });
    assert!(
        failures.is_empty(),
        "normal clients failed while slow ones were held: {failures:?}"
    );
    assert!(served > 0, "no normal client was served");
    server.assert_serving("a thousand slow clients");
    assert_eq!(server.stored(), (0, 0));
}

// Gap: the header read timeout must hold from the moment a connection is
// accepted, not only once hyper has recognised HTTP/1: a client that sends
// nothing, or a partial HTTP/2 preface, is as much a slowloris as one that
// sends half a request line. (Fails today: hyper-util's protocol detection
// has no timeout and hyper's header timer starts after it, so such
// connections are held until `--idle-timeout`, 60 s by default.)
#[test]
fn silent_clients_and_partial_http2_prefaces_are_cut_off_by_the_header_read_timeout() {
    let mut server = Server::start(&["--header-read-timeout", "1s"]);
    let addr = server.addr();
    let partials: [&[u8]; 2] = [b"", b"PRI * HTTP/2.0\r\n"];
    slow_clients_are_cut_off(addr, &partials, 20, false);
    server.assert_serving("silent clients");
}

// === request timeout ===

// Gap: `--request-timeout` must answer 503 with a JSON error when a request
// is stuck in the database, and must fire the request's token so that its
// transaction is cancelled inside PostgreSQL and rolled back: no row, no
// session left idle in transaction, and the metrics say what happened.
#[test]
fn a_request_over_the_timeout_gets_503_and_its_transaction_rolls_back() {
    let cluster = PgCluster::start();
    let url = cluster.url();
    // Started first, so that its migrations have created the tables.
    let mut server =
        LameduckProcess::start(&["--database-url", &url, "--request-timeout", "1s"], &[]);
    let addr = server.addr();
    let admin = server.admin_addr();
    let mut locker = Sql::connect(&url);
    locker.execute("BEGIN; LOCK TABLE links IN ACCESS EXCLUSIVE MODE");

    let started = Instant::now();
    let response = post_json(addr, &link_body("timed-out"));
    let took = started.elapsed();
    let message = assert_json_error(&response, 503, "a request stuck on a lock");
    assert!(message.contains("timed out"), "{message}");
    assert!(
        took >= Duration::from_millis(900) && took < FEW_SECONDS,
        "answered after {took:?} with a 1 s request timeout"
    );

    // Still under the lock: the rollback can only come from the
    // cancellation, not from the statement finishing.
    wait_metric(admin, "lameduck_db_rollbacks_on_cancel_total", |n| n >= 1.0);
    let text = metrics(admin);
    assert_eq!(
        metric(&text, "lameduck_requests_timed_out_total"),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        metric(&text, "lameduck_db_rollbacks_on_cancel_total"),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        metric(&text, "lameduck_db_statements_cancelled_total"),
        Some(1.0),
        "{text}"
    );
    locker.execute("ROLLBACK");

    let response = fresh_get(addr, "/api/links/timed-out");
    assert_json_error(&response, 404, "the timed-out link");
    let mut observer = Sql::connect(&url);
    assert_eq!(
        observer.count("SELECT count(*) FROM links WHERE code = 'timed-out'"),
        0
    );
    assert_eq!(
        observer.count("SELECT count(*) FROM link_audit WHERE code = 'timed-out'"),
        0
    );
    assert_eq!(
        observer.count(
            "SELECT count(*) FROM pg_stat_activity \
             WHERE application_name = 'lameduck' AND state LIKE 'idle in transaction%'"
        ),
        0,
        "a service session was left idle in transaction"
    );
    // The pool is healthy: the next request goes through.
    let response = post_json(addr, &link_body("after-timeout"));
    assert_eq!(response.status, 201, "{response:?}");

    server.signal(Signal::SIGTERM);
    assert_eq!(server.exit_code(PATIENCE), 0, "{}", server.log_text());
}

// === connection limit ===

// Gap: at `--max-connections` the server must stop accepting and let new
// connections wait in the kernel backlog (back-pressure), not refuse or
// reset them: a fifth connection's request gets no answer while four are
// held, and is answered as soon as one of them closes.
#[test]
fn at_the_connection_limit_new_connections_wait_instead_of_failing() {
    let mut server = Server::start(&["--max-connections", "4"]);
    let addr = server.addr();
    let mut held: Vec<TcpStream> = (0..4)
        .map(|i| {
            let mut stream = connect(addr);
            let response = get(&mut stream, "/healthz").expect("GET /healthz");
            assert_eq!(response.status, 200, "held connection {i}: {response:?}");
            assert!(!response.closes_connection(), "{response:?}");
            stream
        })
        .collect();

    let mut waiting = connect(addr);
    write!(waiting, "GET /healthz HTTP/1.1\r\nHost: lameduck\r\n\r\n").expect("send");
    assert!(
        silent_for(&waiting, Duration::from_millis(500)),
        "a fifth connection was served (or closed) while four were held"
    );

    drop(held.pop());
    let response = read_response(&mut waiting).expect("the waiting request is answered");
    assert_eq!(response.status, 200, "{response:?}");
    for (i, stream) in held.iter_mut().enumerate() {
        let response = get(stream, "/healthz").expect("a held connection still serves");
        assert_eq!(response.status, 200, "held connection {i}: {response:?}");
    }
    // Free the slots: the check below needs a connection of its own.
    drop(held);
    drop(waiting);
    server.assert_serving("the connection limit");
}

// Gap: at `--max-connections`, header-phase slowloris connections used to
// keep kubelet probes from connecting for up to the header timeout, and
// `/metrics` was served to anyone who could reach the public port. Probes
// and metrics now have a listener of their own, outside the public cap.
#[test]
fn probes_and_metrics_answer_on_the_admin_listener_while_slowloris_fills_the_public_port() {
    let mut server = Server::start(&["--max-connections", "4"]);
    let (addr, admin) = (server.addr(), server.admin());
    let slowloris: Vec<TcpStream> = (0..4)
        .map(|_| {
            let mut stream = connect(addr);
            stream
                .write_all(b"GET /healthz HTTP/1.1\r\nHost: lame")
                .expect("a partial head");
            stream
        })
        .collect();
    let mut waiting = connect(addr);
    write!(waiting, "GET /readyz HTTP/1.1\r\nHost: lameduck\r\n\r\n").expect("send");
    assert!(
        silent_for(&waiting, Duration::from_millis(300)),
        "the public port is full: a fifth connection waits"
    );

    for path in ["/healthz", "/readyz", "/metrics"] {
        let started = Instant::now();
        let response = fresh_get(admin, path);
        assert_eq!(response.status, 200, "admin {path}: {response:?}");
        assert!(
            started.elapsed() < QUICKLY,
            "admin {path}: {:?}",
            started.elapsed()
        );
    }
    let text = metrics(admin);
    assert!(text.contains("lameduck_connections_open"), "{text}");

    drop(slowloris);
    let response = read_response(&mut waiting).expect("the waiting probe is answered");
    assert_eq!(response.status, 200, "{response:?}");
    let response = fresh_get(addr, "/metrics");
    assert_json_error(&response, 404, "/metrics on the public port");
    server.assert_serving("slowloris on the public port");
}

// === concurrency limit ===

// Gap: past `--max-concurrent-requests` API requests must be shed at once
// with 503 and `Retry-After`, never queued, while health, readiness and
// metrics keep answering. The slots are held by link creations blocked on
// a table lock (a slow body no longer holds one: see the next test).
#[test]
fn past_the_concurrency_limit_api_requests_are_shed_with_503_and_retry_after() {
    let cluster = PgCluster::start();
    let url = cluster.url();
    let mut server = LameduckProcess::start(
        &["--database-url", &url, "--max-concurrent-requests", "2"],
        &[],
    );
    let addr = server.addr();
    let admin = server.admin_addr();
    let mut locker = Sql::connect(&url);
    locker.execute("BEGIN; LOCK TABLE links IN ACCESS EXCLUSIVE MODE");
    let held: Vec<thread::JoinHandle<RawResponse>> = ["held-1", "held-2"]
        .into_iter()
        .map(|code| thread::spawn(move || post_json(addr, &link_body(code))))
        .collect();
    wait_in_flight(admin, 2);

    let started = Instant::now();
    let response = fresh_get(addr, "/api/links/x");
    let took = started.elapsed();
    assert_json_error(&response, 503, "a third API request");
    assert_eq!(response.header("retry-after"), Some("1"), "{response:?}");
    assert!(took < QUICKLY, "shedding took {took:?}");
    let response = post_json(addr, &link_body("shed"));
    assert_json_error(&response, 503, "a third API request (POST)");
    for (port, addr, path) in [
        ("public", addr, "/healthz"),
        ("public", addr, "/readyz"),
        ("admin", admin, "/healthz"),
        ("admin", admin, "/readyz"),
        ("admin", admin, "/metrics"),
    ] {
        let response = fresh_get(addr, path);
        assert_eq!(
            response.status, 200,
            "{port} {path} at the limit: {response:?}"
        );
    }

    locker.execute("ROLLBACK");
    for held in held {
        let response = held.join().expect("a held request is answered");
        assert_eq!(response.status, 201, "{response:?}");
    }
    let response = fresh_get(addr, "/api/links/held-1");
    assert_eq!(response.status, 200, "after the load: {response:?}");
    assert_json_error(&fresh_get(addr, "/api/links/shed"), 404, "the shed link");
    let shed = metric(&metrics(admin), "lameduck_requests_shed_total");
    assert!(
        shed.is_some_and(|n| n >= 2.0),
        "requests_shed_total: {shed:?}"
    );
    let mut observer = Sql::connect(&url);
    assert_eq!(observer.count("SELECT count(*) FROM links"), 2);
    server.signal(Signal::SIGTERM);
    assert_eq!(server.exit_code(PATIENCE), 0, "{}", server.log_text());
}

// Gap: slowhttptest -B (headers sent, body trickled) used to fill every
// concurrency slot with requests waiting for their bodies, and every API
// route answered 503. Bodies are now read before a request takes a slot:
// far more slow uploads than slots, and a normal client's redirects and
// link creations still succeed.
#[test]
fn slow_bodies_hold_no_concurrency_slot_and_normal_clients_keep_being_served() {
    let mut server = Server::start(&["--max-concurrent-requests", "2"]);
    let addr = server.addr();
    let admin = server.admin();
    let code = {
        let response = post_json(addr, &link_body("served"));
        assert_eq!(response.status, 201, "{response:?}");
        "served"
    };
    let slow: Vec<TcpStream> = (0..40)
        .map(|i| start_slow_post_of(addr, &link_body(&format!("slow-{i}"))))
        .collect();
    wait_in_flight(admin, 40);

    for i in 0..10 {
        let started = Instant::now();
        let response = fresh_get(addr, &format!("/{code}"));
        assert_eq!(
            response.status, 307,
            "redirect {i} under slow bodies: {response:?}"
        );
        let response = post_json(addr, &link_body(&format!("normal-{i}")));
        assert_eq!(
            response.status, 201,
            "creation {i} under slow bodies: {response:?}"
        );
        assert!(started.elapsed() < QUICKLY, "{:?}", started.elapsed());
    }
    let text = metrics(admin);
    assert_eq!(
        metric(&text, "lameduck_requests_shed_total"),
        Some(0.0),
        "{text}"
    );
    drop(slow);
    assert_eq!(server.stored(), (11, 11));
    server.assert_serving("40 slow bodies");
}

// Gap: a body that stops arriving was answered 503 after the 30 s request
// timeout, as if the server were at fault. The client is: it gets 408 with
// a JSON body after `--body-read-timeout`, the connection closes (the rest
// of the body must not be read as a request), and it is not a server error.
#[test]
fn a_stalled_body_gets_408_with_a_json_error_after_the_body_read_timeout() {
    let mut server = Server::start(&["--body-read-timeout", "1s"]);
    let addr = server.addr();
    let admin = server.admin();
    let body = link_body("stalled");
    let started = Instant::now();
    let mut stalled = start_slow_post_of(addr, &body);
    let response = read_response(&mut stalled).expect("an answer to the stalled body");
    let took = started.elapsed();
    let message = assert_json_error(&response, 408, "a stalled body");
    assert!(message.contains("not received within 1s"), "{message}");
    assert!(response.closes_connection(), "{response:?}");
    assert!(
        took >= Duration::from_millis(900) && took < FEW_SECONDS,
        "answered after {took:?} with a 1 s body read timeout"
    );
    assert!(
        wait_for_eof(&mut stalled, PATIENCE).expect("read to the end"),
        "the connection closes after the 408"
    );

    let text = metrics(admin);
    let server_errors: Vec<&str> = text
        .lines()
        .filter(|line| line.starts_with("lameduck_http_requests_total{"))
        .filter(|line| line.contains("status=\"5"))
        .collect();
    assert!(server_errors.is_empty(), "{server_errors:?}");
    assert!(
        text.lines()
            .any(|line| line.starts_with("lameduck_http_requests_total{")
                && line.contains("route=\"/api/links\",status=\"4xx\"")),
        "{text}"
    );
    assert_eq!(
        metric(&text, "lameduck_requests_timed_out_total"),
        Some(0.0),
        "{text}"
    );
    assert_eq!(server.stored(), (0, 0));
    server.assert_serving("a stalled body");
}

// === HTTP/2 ===

// Gap: `--h2-max-concurrent-streams` must reach the wire: the server's
// first SETTINGS frame advertises it, so clients never open more.
#[test]
fn http2_connections_advertise_the_max_concurrent_streams() {
    const SETTINGS_MAX_CONCURRENT_STREAMS: u16 = 0x3;
    let server = Server::start(&["--h2-max-concurrent-streams", "7"]);
    let mut stream = h2_connect(server.addr());
    let settings = (0..10)
        .find_map(|_| {
            let frame = read_frame(&mut stream)
                .expect("read a frame")
                .expect("a frame before EOF");
            (frame.kind == H2_SETTINGS && frame.flags & H2_ACK == 0).then_some(frame)
        })
        .expect("a SETTINGS frame among the first ten frames");
    let advertised: Vec<(u16, u32)> = settings
        .payload
        .chunks_exact(6)
        .map(|entry| {
            (
                u16::from_be_bytes([entry[0], entry[1]]),
                u32::from_be_bytes([entry[2], entry[3], entry[4], entry[5]]),
            )
        })
        .collect();
    let max_streams = advertised
        .iter()
        .find(|(id, _)| *id == SETTINGS_MAX_CONCURRENT_STREAMS)
        .map(|(_, value)| *value);
    assert_eq!(max_streams, Some(7), "settings: {advertised:?}");
}

// Gap: the two floods HTTP/2 is known for must cost the flooding client its
// connection and nobody else anything: streams opened and reset at once
// (rapid reset), and a header block that never ends (CONTINUATION flood).
// Each ends in a GOAWAY with ENHANCE_YOUR_CALM and a close; an HTTP/2
// connection opened before the floods, and new HTTP/1.1 and HTTP/2 clients
// after each, are served as usual.
#[test]
fn http2_floods_are_cut_off_with_goaway_and_other_clients_keep_being_served() {
    let mut server = Server::start(&[]);
    let addr = server.addr();
    let rt = runtime();
    let mut bystander = rt.block_on(h2_client(addr));
    let healthz = |sender: &mut http2::SendRequest<H2Body>, after: &str| {
        let request = Request::get(format!("http://{addr}/healthz"))
            .body(Empty::new().boxed())
            .expect("request");
        let (status, body, _) = rt.block_on(h2_send(sender, request));
        assert_eq!(status, 200, "HTTP/2 after {after}: {body:?}");
    };
    healthz(&mut bystander, "nothing");

    // `GET /healthz` as a header block: indexed `:method GET` and `:scheme
    // http`, then `:path` and `:authority` as literals with indexed names.
    let authority = addr.to_string();
    let mut block = vec![0x82, 0x86, 0x04, 8];
    block.extend_from_slice(b"/healthz");
    block.extend_from_slice(&[0x01, u8::try_from(authority.len()).expect("short")]);
    block.extend_from_slice(authority.as_bytes());

    let rapid_reset = (0..2_000_u32).flat_map(|n| {
        let stream = 2 * n + 1;
        let mut pair = h2_frame(H2_HEADERS, H2_END_STREAM | H2_END_HEADERS, stream, &block);
        pair.extend(h2_frame(H2_RST_STREAM, 0, stream, &H2_CANCEL.to_be_bytes()));
        pair
    });
    let code = h2_flood(addr, rapid_reset.collect());
    assert_eq!(code, Some(H2_ENHANCE_YOUR_CALM), "rapid reset");
    server.assert_serving("a rapid-reset flood");
    healthz(&mut bystander, "a rapid-reset flood");
    healthz(&mut rt.block_on(h2_client(addr)), "a rapid-reset flood");

    // One literal header of 100 bytes, new name, not indexed; eight a frame.
    let mut junk = vec![0x00, 7];
    junk.extend_from_slice(b"x-flood");
    junk.push(100);
    junk.extend_from_slice(&[b'a'; 100]);
    let mut continuation = h2_frame(H2_HEADERS, H2_END_STREAM, 1, &block);
    for _ in 0..2_000 {
        continuation.extend(h2_frame(H2_CONTINUATION, 0, 1, &junk.repeat(8)));
    }
    let code = h2_flood(addr, continuation);
    assert_eq!(code, Some(H2_ENHANCE_YOUR_CALM), "CONTINUATION flood");
    server.assert_serving("a CONTINUATION flood");
    healthz(&mut bystander, "a CONTINUATION flood");
    healthz(&mut rt.block_on(h2_client(addr)), "a CONTINUATION flood");
}

/// Opens an HTTP/2 connection, writes `flood` after the preface as fast as
/// the server takes it (stopping where the server closes or stops reading),
/// then reads until the server closes it, which it must within
/// [`PATIENCE`]. Returns the error code of the server's GOAWAY, if it sent
/// one.
fn h2_flood(addr: SocketAddr, flood: Vec<u8>) -> Option<u32> {
    let mut stream = h2_connect(addr);
    stream
        .set_write_timeout(Some(FEW_SECONDS))
        .expect("write timeout");
    // Cut short by the server's close (a broken pipe, a reset) or by a
    // server that stopped reading: either way the flood is over.
    let _ = stream.write_all(&flood);
    let (goaway, closed) = h2_idle_until_closed(&mut stream, PATIENCE, false);
    assert!(
        closed,
        "the flooded connection is still open after {PATIENCE:?}"
    );
    goaway
}

// === idle timeout ===

// Gap: `--idle-timeout` must close idle keep-alive connections (HTTP/1
// with EOF, HTTP/2 with GOAWAY and then EOF), and must not cut a connection
// whose request is in flight for longer than the timeout.
#[test]
fn idle_keepalive_connections_are_closed_after_the_idle_timeout() {
    const IDLE: Duration = Duration::from_secs(1);
    let mut server = Server::start(&["--idle-timeout", "1s"]);
    let addr = server.addr();
    let admin = server.admin();

    let body = link_body("long-request");
    let mut busy = start_slow_post_of(addr, &body);
    let busy_since = Instant::now();
    wait_in_flight(admin, 1);

    let mut idle = connect(addr);
    let response = get(&mut idle, "/healthz").expect("GET /healthz");
    assert_eq!(response.status, 200, "{response:?}");
    assert!(!response.closes_connection(), "{response:?}");
    let idle_since = Instant::now();
    assert!(
        wait_for_eof(&mut idle, IDLE + FEW_SECONDS).expect("EOF, not a reset"),
        "an idle HTTP/1 connection is still open {:?} after its last response",
        idle_since.elapsed()
    );
    let closed_after = idle_since.elapsed();
    assert!(
        closed_after >= IDLE.mul_f64(0.8),
        "closed after {closed_after:?}"
    );

    let mut h2 = h2_connect(addr);
    let (goaway, closed) = h2_idle_until_closed(&mut h2, IDLE + FEW_SECONDS, true);
    assert!(closed, "an idle HTTP/2 connection is still open");
    assert!(
        goaway.is_some(),
        "an idle HTTP/2 connection closed without GOAWAY"
    );

    // The request in flight has outlived the idle timeout twice over.
    let held_for = IDLE * 2 + Duration::from_millis(500);
    thread::sleep(held_for.saturating_sub(busy_since.elapsed()));
    assert!(
        silent_for(&busy, Duration::from_millis(1)),
        "the connection of a request in flight was closed"
    );
    finish_slow_post_of(&mut busy, &body);
    let response = read_response(&mut busy).expect("the long request is answered");
    assert_eq!(response.status, 201, "{response:?}");
    assert!(!response.closes_connection(), "{response:?}");
    // Then that connection is idle too.
    assert!(
        wait_for_eof(&mut busy, IDLE + FEW_SECONDS).expect("EOF"),
        "the connection stayed open after its request"
    );
    wait_metric(admin, &closed_for("idle"), |n| n >= 3.0);
    server.assert_serving("idle timeouts");
}

// Gap: the idle timeout is what load balancers are configured against
// (their own keep-alive must be shorter); an idle HTTP/1 keep-alive
// connection must stay open until `--idle-timeout`, not be closed by the
// header read timeout. (Fails today: hyper starts its header read timer as
// soon as it waits for the next request, so an idle keep-alive connection
// is closed after `--header-read-timeout`, 10 s by default, not 60 s.)
#[test]
fn idle_keepalive_connections_stay_open_until_the_idle_timeout_not_the_header_timeout() {
    let server = Server::start(&["--header-read-timeout", "1s", "--idle-timeout", "4s"]);
    let addr = server.addr();
    let mut idle = connect(addr);
    let response = get(&mut idle, "/healthz").expect("GET /healthz");
    assert_eq!(response.status, 200, "{response:?}");
    let since = Instant::now();
    let closed = wait_for_eof(&mut idle, Duration::from_millis(2_500)).expect("EOF");
    assert!(
        !closed,
        "an idle keep-alive connection was closed {:?} after its response, before the 4 s \
         idle timeout",
        since.elapsed()
    );
    let response = get(&mut idle, "/healthz").expect("the idle connection still serves");
    assert_eq!(response.status, 200, "{response:?}");
    assert!(
        wait_for_eof(&mut idle, Duration::from_secs(4) + FEW_SECONDS).expect("EOF"),
        "the connection outlived the idle timeout"
    );
}

// Gap: the idle timeout closes HTTP/2 connections with a graceful GOAWAY,
// which waits for the client's PING acknowledgement; a client that never
// answers must not keep the connection (and its slot under
// `--max-connections`, and later the drain) forever. (Fails today: the h2
// crate waits for the PONG with no bound, and serve.rs never escalates.)
#[test]
fn idle_http2_connections_are_closed_even_if_the_client_ignores_pings() {
    let server = Server::start(&["--idle-timeout", "1s"]);
    let mut h2 = h2_connect(server.addr());
    let (goaway, closed) =
        h2_idle_until_closed(&mut h2, Duration::from_secs(1) + FEW_SECONDS, false);
    assert!(goaway.is_some(), "no GOAWAY after the idle timeout");
    assert!(
        closed,
        "an idle HTTP/2 connection whose client ignores PINGs is still open {FEW_SECONDS:?} \
         after the idle timeout"
    );
}

// Gap: the same client at shutdown. The drain closes idle HTTP/2
// connections with a graceful GOAWAY; one peer that never acknowledges the
// PING (a frozen process, a half-open connection whose peer vanished) must
// not hold the drain until `--shutdown-timeout` and turn a clean shutdown
// into exit code 3. (Fails today: the drain waits for it until the
// deadline, abandons it and exits 3.)
#[test]
fn an_http2_client_that_ignores_pings_does_not_hold_the_drain_to_the_deadline() {
    let mut server = LameduckProcess::start(&["--shutdown-timeout", "10s"], &[]);
    let mut h2 = h2_connect(server.addr());
    // The connection is up: the server's SETTINGS came back.
    let frame = read_frame(&mut h2).expect("read").expect("SETTINGS");
    assert_eq!(frame.kind, H2_SETTINGS, "{frame:?}");

    let signalled = Instant::now();
    server.signal(Signal::SIGTERM);
    let status = server.wait_exit(FEW_SECONDS);
    let logs = server.log_text();
    let status = status.unwrap_or_else(|| {
        panic!(
            "still draining {FEW_SECONDS:?} after SIGTERM with one idle HTTP/2 connection \
             whose client ignores PINGs; logs:\n{logs}"
        )
    });
    assert_eq!(
        status.code(),
        Some(0),
        "after {:?}; logs:\n{logs}",
        signalled.elapsed()
    );
    drop(h2);
}

// Gap: a client that stops reading while answers are still owed to it —
// here requests pipelined behind a receive window it never opens — keeps
// its connection: the answers wait in the server's buffers, and only the
// idle and head deadlines (raised here to a minute) would end it.
// `--send-timeout` has the kernel close the connection once nothing the
// server sent has been acknowledged for that long; a normal client is
// served meanwhile. (Fails without it: the connection stays open until the
// one-minute deadlines.)
#[test]
fn a_client_that_stops_reading_is_cut_off_at_the_send_timeout() {
    const PIPELINED: usize = 20_000;
    const OPEN: &str = r#"lameduck_connections_open{protocol="http1"}"#;
    let mut server = Server::start(&[
        "--send-timeout",
        "2s",
        "--idle-timeout",
        "60s",
        "--header-read-timeout",
        "60s",
    ]);
    let (addr, admin) = (server.addr(), server.admin());
    let mut stalled = runtime().block_on(async {
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        // A small window, closed once it is full: the client never reads.
        socket.set_recv_buffer_size(4096).expect("SO_RCVBUF");
        let stream = socket.connect(addr).await.expect("connect");
        stream.into_std().expect("a std stream")
    });
    stalled.set_nonblocking(false).expect("blocking");
    let mut writer = stalled.try_clone().expect("clone");
    let requests = "GET /healthz HTTP/1.1\r\nHost: lameduck\r\n\r\n".repeat(PIPELINED);
    // The server stops reading once its answers back up: the write ends
    // when the server's kernel resets the connection, if not before.
    let writing = thread::spawn(move || writer.write_all(requests.as_bytes()));

    wait_metric(admin, OPEN, |open| open >= 1.0);
    let response = fresh_get(addr, "/healthz");
    assert_eq!(response.status, 200, "{response:?}");
    wait_metric(admin, OPEN, |open| open == 0.0);

    // What the client can still read ends early.
    stalled
        .set_read_timeout(Some(PATIENCE))
        .expect("read timeout");
    let mut received = Vec::new();
    let ended = stalled.read_to_end(&mut received);
    let answers = received
        .windows(12)
        .filter(|w| w == b"HTTP/1.1 200")
        .count();
    assert!(
        answers < PIPELINED,
        "all {answers} answers arrived ({ended:?}): the connection was not cut off"
    );
    let _ = writing.join().expect("the writer");
    server.assert_serving("a client that stopped reading");
}

// === connection age ===

/// Seed of the connections' draws: with it, each one's age is known.
const SEED: u64 = 45;

/// Closed connections counted for `reason`.
fn closed_for(reason: &str) -> String {
    format!("lameduck_connections_closed_total{{by=\"server\",reason=\"{reason}\"}}")
}

// Gap: behind an L4 balancer a keep-alive client stays on the replica it
// reached first, and a replica added later gets none of it. With
// `--max-connection-age`, each connection is told to close at its own age,
// drawn within the jitter: an idle HTTP/1 one is closed, a busy one's next
// answer says `Connection: close`, an HTTP/2 one gets GOAWAY. None before its
// age, in the order of their ages, no request failed, each counted.
#[test]
fn each_connection_is_told_to_close_at_its_own_age_within_the_jitter() {
    const N: u64 = 12;
    let age = Duration::from_secs(2);
    let mut server = Server::start(&[
        "--max-connection-age",
        "2s",
        "--max-connection-age-jitter",
        "25",
        "--connection-seed",
        &SEED.to_string(),
    ]);
    let addr = server.addr();
    let drawn = |n| age.mul_f64(1.0 + 0.25 * (2.0 * draw(SEED, n, Draw::Age) - 1.0));
    // Each served before the next opens: the server numbers them 0 to N.
    let clients: Vec<_> = (0..N)
        .map(|n| {
            let opened = Instant::now();
            let mut stream = connect(addr);
            let response = get(&mut stream, "/healthz").expect("GET /healthz");
            assert!(!response.closes_connection(), "{response:?}");
            let idle = n % 2 == 0;
            (
                drawn(n),
                thread::spawn(move || until_told(stream, idle, opened)),
            )
        })
        .collect();
    let runtime = runtime();
    let http2 = runtime.block_on(async {
        let opened = Instant::now();
        let mut sender = h2_client(addr).await;
        let healthz = || {
            let request = Request::get(format!("http://{addr}/healthz"));
            request.body(Empty::new().boxed()).expect("request")
        };
        assert_eq!(h2_send(&mut sender, healthz()).await.0, 200);
        // A pool opens a new connection once this one refuses streams.
        while sender.send_request(healthz()).await.is_ok() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        (drawn(N), opened.elapsed())
    });
    let mut moments: Vec<(Duration, Duration)> = clients
        .into_iter()
        .map(|(due, client)| (due, client.join().expect("client")))
        .collect();
    moments.push(http2);
    assert_told_in_order(&moments, Duration::from_millis(300));
    for (n, &(due, told)) in moments.iter().enumerate() {
        assert!(
            told < due + Duration::from_secs(1),
            "connection {n} due {due:?}, told {told:?}"
        );
    }
    wait_metric(server.admin(), &closed_for("age"), |n| n >= (N + 1) as f64);
    server.assert_serving("connection ages");
}

// Gap: a stream (server-sent events, over HTTP/1.1 and over HTTP/2)
// outlives its connection's age until the age's grace, and only then is
// cut, counted as such; a websocket, handed over from HTTP, is not cut by
// the age at all.
#[test]
fn a_stream_past_its_age_runs_until_the_grace_and_a_websocket_is_not_cut() {
    let grace = Duration::from_secs(3);
    let mut server = Server::start(&[
        "--max-connection-age",
        "1s",
        "--max-connection-age-jitter",
        "0",
        "--max-connection-age-grace",
        "3s",
    ]);
    let addr = server.addr();
    let code = lameduck_testkit::binary::create_link(addr, "https://example.com/streamed");
    let runtime = runtime();
    let (open_for, http2_for, websocket) = runtime.block_on(async {
        use futures_util::{SinkExt, StreamExt};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        use tokio_tungstenite::tungstenite::Message;
        let (mut socket, _) =
            tokio_tungstenite::connect_async(format!("ws://{addr}/api/links/{code}/ws"))
                .await
                .expect("websocket handshake");
        let opened = Instant::now();
        // The same stream over HTTP/2, on a connection opened just after.
        let mut http2 = h2_client(addr).await;
        let request = Request::get(format!("http://{addr}/api/links/{code}/events"))
            .header("accept", "text/event-stream")
            .body(Empty::new().boxed())
            .expect("request");
        let http2_stream = tokio::spawn(async move {
            let response = http2
                .send_request(request)
                .await
                .expect("the stream's head");
            let opened = Instant::now();
            let read = tokio::time::timeout(PATIENCE, response.into_body().collect()).await;
            assert!(read.is_ok(), "the HTTP/2 stream was never cut");
            opened.elapsed()
        });
        let mut sse = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let head = format!(
            "GET /api/links/{code}/events HTTP/1.1\r\nhost: t\r\naccept: text/event-stream\r\n\r\n"
        );
        sse.write_all(head.as_bytes()).await.expect("request");
        let mut received = Vec::new();
        let read = tokio::time::timeout(PATIENCE, sse.read_to_end(&mut received)).await;
        let open_for = opened.elapsed();
        assert!(read.is_ok(), "the stream was never cut");
        let text = String::from_utf8_lossy(&received);
        assert!(text.contains("event: hits"), "{text}");
        // The websocket, older than the stream's age and grace, still answers.
        socket
            .send(Message::Ping(b"age".to_vec().into()))
            .await
            .expect("ping");
        let pong = tokio::time::timeout(PATIENCE, async {
            loop {
                match socket.next().await {
                    Some(Ok(Message::Text(_))) => continue, // hit counts
                    other => return format!("{other:?}"),
                }
            }
        });
        let pong = pong.await.expect("an answer to the ping");
        (open_for, http2_stream.await.expect("HTTP/2 stream"), pong)
    });
    // Counted from before the stream's connection opened (HTTP/1) and from
    // its head (HTTP/2): the age and the grace, and at least the grace.
    assert!(
        http2_for >= grace,
        "the HTTP/2 stream cut after {http2_for:?}"
    );
    assert!(
        open_for >= Duration::from_secs(1) + grace,
        "cut after {open_for:?}"
    );
    assert!(websocket.contains("Pong"), "{websocket}");
    wait_metric(server.admin(), &closed_for("grace"), |n| n >= 2.0);
    server.assert_serving("a stream past its age");
}

// Gap: ages expiring under load fail no request of a client that honours
// `Connection: close` and GOAWAY (reqwest's pools, HTTP/1.1 and HTTP/2).
#[test]
fn ages_expiring_under_load_fail_no_request() {
    let mut server = Server::start(&["--max-connection-age", "300ms"]);
    let addr = server.addr();
    let runtime = runtime();
    let (answered, failed) = runtime.block_on(async {
        let http1 = reqwest::Client::builder().build().expect("client");
        let http2 = reqwest::Client::builder()
            .http2_prior_knowledge()
            .build()
            .expect("client");
        let until = Instant::now() + Duration::from_secs(4);
        let clients = (0..16).map(|i| {
            let client = if i % 2 == 0 {
                http1.clone()
            } else {
                http2.clone()
            };
            tokio::spawn(async move {
                let (mut answered, mut failed) = (0u64, Vec::new());
                while Instant::now() < until {
                    match client.get(format!("http://{addr}/healthz")).send().await {
                        Ok(response) if response.status() == 200 => answered += 1,
                        other => failed.push(format!("{other:?}")),
                    }
                }
                (answered, failed)
            })
        });
        let mut total = (0, Vec::new());
        for client in futures_util::future::join_all(clients).await {
            let (answered, failed) = client.expect("client");
            total.0 += answered;
            total.1.extend(failed);
        }
        total
    });
    assert!(
        failed.is_empty(),
        "{} of {answered} failed: {failed:?}",
        failed.len()
    );
    let aged = wait_metric(server.admin(), &closed_for("age"), |n| n >= 10.0);
    eprintln!("{answered} answered, {aged} connections closed by their age");
    server.assert_serving("ages under load");
}

// === bad input ===

// Gap: bytes that are not HTTP at all (binary junk, a TLS handshake, a
// broken HTTP/2 connection) must end that connection, with a 400 at most,
// and must neither crash the server nor store anything.
#[test]
fn garbage_bytes_on_the_socket_get_400_or_a_closed_connection() {
    let mut server = Server::start(&[]);
    let addr = server.addr();
    assert_eq!(post_json(addr, &link_body("before")).status, 201);
    let before = server.stored();

    // A deterministic pseudo-random megabyte.
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    let noise: Vec<u8> = (0..1 << 20)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state.to_le_bytes()[0]
        })
        .collect();
    let mut tls_hello = vec![
        0x16, 0x03, 0x01, 0x00, 0xa5, 0x01, 0x00, 0x00, 0xa1, 0x03, 0x03,
    ];
    tls_hello.extend([0u8; 64]);
    let mut broken_h2 = H2_PREFACE.to_vec();
    broken_h2.extend([0xff; 64]);
    let cases: [(&str, &[u8]); 5] = [
        ("binary junk", b"\x00\x01\x02\xff\xfe junk\r\n\r\n"),
        ("a TLS ClientHello", &tls_hello),
        ("an HTTP/2 preface and junk frames", &broken_h2),
        ("a megabyte of noise", &noise),
        ("a method of DEL bytes", b"\x7f\x7f\x7f / HTTP/1.1\r\n\r\n"),
    ];
    for (case, bytes) in cases {
        let (received, ending) = send_until_closed(addr, bytes);
        if received.starts_with(b"HTTP/") {
            let response =
                read_response(&mut received.as_slice()).unwrap_or_else(|e| panic!("{case}: {e}"));
            assert_eq!(response.status, 400, "{case}: {response:?} then {ending:?}");
            assert_no_internals(&response, case);
        } else if case.contains("HTTP/2") {
            // The server's SETTINGS, then GOAWAY with an error; then EOF.
            assert!(received.len() >= 9, "{case}: {received:?} then {ending:?}");
        } else {
            assert!(
                received.is_empty(),
                "{case}: the server sent something that is not HTTP: {:?}",
                String::from_utf8_lossy(&received)
            );
        }
        server.assert_serving(case);
    }
    assert_eq!(server.stored(), before, "garbage changed what is stored");
}

// Gap: request lines and headers that break HTTP/1.1's grammar (or its
// framing rules, which request smuggling relies on) must get 400 and a
// closed connection, never a guess at what was meant.
#[test]
fn malformed_request_lines_and_headers_get_400() {
    let mut server = Server::start(&[]);
    let addr = server.addr();
    assert_eq!(post_json(addr, &link_body("before")).status, 201);
    let before = server.stored();
    let create = |headers: &str, body: &str| {
        format!("POST /api/links HTTP/1.1\r\nHost: lameduck\r\nContent-Type: application/json\r\n{headers}\r\n{body}")
    };
    let link = link_body("smuggled");
    let cases: Vec<(&str, String)> = vec![
        ("no target or version", "GET\r\n\r\n".to_owned()),
        (
            "an unknown HTTP version",
            "GET /healthz HTTP/9.9\r\nHost: lameduck\r\n\r\n".to_owned(),
        ),
        (
            "a method that is not a token",
            "G@T /healthz HTTP/1.1\r\nHost: lameduck\r\n\r\n".to_owned(),
        ),
        (
            "a space in the target",
            "GET /heal thz HTTP/1.1\r\nHost: lameduck\r\n\r\n".to_owned(),
        ),
        (
            "a header line without a colon",
            "GET /healthz HTTP/1.1\r\nHost lameduck\r\n\r\n".to_owned(),
        ),
        (
            "a space in a header name",
            "GET /healthz HTTP/1.1\r\nHost: lameduck\r\nBad Name: x\r\n\r\n".to_owned(),
        ),
        (
            "a NUL in a header value",
            "GET /healthz HTTP/1.1\r\nHost: lameduck\r\nX-Nul: a\0b\r\n\r\n".to_owned(),
        ),
        (
            "two different Content-Lengths",
            create(
                &format!("Content-Length: {}\r\nContent-Length: 5\r\n", link.len()),
                &link,
            ),
        ),
        (
            "a Content-Length that is not a number",
            create("Content-Length: lots\r\n", &link),
        ),
        (
            "a Transfer-Encoding that does not end in chunked",
            create("Transfer-Encoding: gzip\r\n", &link),
        ),
    ];
    for (case, request) in &cases {
        expect_rejected(addr, request.as_bytes(), 400, case);
        server.assert_serving(case);
    }
    assert_eq!(
        server.stored(),
        before,
        "a malformed request stored something"
    );
    assert_json_error(
        &fresh_get(addr, "/api/links/smuggled"),
        404,
        "the smuggled link",
    );
}

// Gap: heads too large to buffer must be refused by status (431 for
// headers, a 4xx for the target), not by a reset that a client cannot tell
// from a crash, and must not hurt the server.
#[test]
fn oversized_headers_get_431_and_oversized_urls_a_4xx() {
    let mut server = Server::start(&[]);
    let addr = server.addr();
    assert_eq!(post_json(addr, &link_body("before")).status, 201);
    let before = server.stored();

    let many: String = (0..200)
        .map(|i| format!("X-Header-{i}: value\r\n"))
        .collect();
    let cases = [
        (
            "two hundred headers",
            format!("GET /healthz HTTP/1.1\r\nHost: lameduck\r\n{many}\r\n"),
        ),
        (
            "a one-megabyte header",
            format!(
                "GET /healthz HTTP/1.1\r\nHost: lameduck\r\nX-Big: {}\r\n\r\n",
                "a".repeat(1 << 20)
            ),
        ),
    ];
    for (case, request) in &cases {
        expect_rejected(addr, request.as_bytes(), 431, case);
        server.assert_serving(case);
    }
    for (case, length) in [("a 70 KB URL", 70_000), ("a one-megabyte URL", 1 << 20)] {
        let request = format!(
            "GET /api/links/{} HTTP/1.1\r\nHost: lameduck\r\n\r\n",
            "a".repeat(length)
        );
        let (received, ending) = send_until_closed(addr, request.as_bytes());
        let response = read_response(&mut received.as_slice())
            .unwrap_or_else(|e| panic!("{case}: no response before {ending:?}: {e}"));
        assert!(
            (400..500).contains(&response.status),
            "{case}: {response:?}"
        );
        assert_no_internals(&response, case);
        server.assert_serving(case);
    }
    assert_eq!(
        server.stored(),
        before,
        "an oversized request stored something"
    );
}

// Gap: the JSON API's own rejections must each say what is wrong, with the
// right 4xx and a JSON body: a syntax error, the wrong or no content type,
// bytes that are not UTF-8 in the body, a JSON value of the wrong shape,
// and a path whose percent-encoding decodes to invalid UTF-8.
#[test]
fn invalid_json_wrong_content_type_and_invalid_utf8_get_clear_4xx_json_errors() {
    let mut server = Server::start(&[]);
    let addr = server.addr();
    assert_eq!(post_json(addr, &link_body("before")).status, 201);
    let before = server.stored();
    let valid = link_body("not-stored");

    let cases: [(&str, &[u8], Option<&str>, u16); 8] = [
        (
            "a JSON syntax error",
            br#"{"url":"#,
            Some("application/json"),
            400,
        ),
        ("no content type", valid.as_bytes(), None, 415),
        ("text/plain", valid.as_bytes(), Some("text/plain"), 415),
        (
            "form encoding",
            b"url=https%3A%2F%2Fexample.com",
            Some("application/x-www-form-urlencoded"),
            415,
        ),
        (
            "invalid UTF-8 in the body",
            b"{\"url\":\"https://example.com/\xff\xfe\",\"code\":\"not-stored\"}",
            Some("application/json"),
            400,
        ),
        (
            "a number for the URL",
            br#"{"url":5}"#,
            Some("application/json"),
            400,
        ),
        (
            "an unknown field",
            br#"{"url":"https://example.com/","code":"not-stored","extra":1}"#,
            Some("application/json"),
            400,
        ),
        ("an empty body", b"", Some("application/json"), 400),
    ];
    for (case, body, content_type, status) in cases {
        let response = post_links(addr, body, content_type);
        assert_json_error(&response, status, case);
        server.assert_serving(case);
    }
    for path in ["/api/links/%FF%FE", "/%FF%FE", "/api/links/%C3%28"] {
        let response = fresh_get(addr, path);
        assert!(
            (400..500).contains(&response.status),
            "{path}: {response:?}"
        );
        assert_json_error(&response, response.status, path);
        server.assert_serving(path);
    }
    assert_eq!(
        server.stored(),
        before,
        "a rejected request stored something"
    );
    assert_json_error(
        &fresh_get(addr, "/api/links/not-stored"),
        404,
        "the rejected link",
    );
}

// Gap: hyper answers HTTP/1.1 requests without a Host header, or with two,
// like any other (RFC 9112 §3.2 requires 400): `GET /healthz` answered 200,
// and a POST could store a link, for a request no client sends and that a
// confused proxy or a smuggling attempt produces. Every route must refuse
// it with a JSON 400 and count and store nothing, while HTTP/1.0 without
// Host, and HTTP/2 from hyper's client (which sends :authority, not Host),
// are served; an HTTP/2 request with neither is refused too.
#[test]
fn http11_requests_without_exactly_one_host_get_400_on_every_route() {
    let mut server = Server::start(&[]);
    let addr = server.addr();
    assert_eq!(post_json(addr, &link_body("before")).status, 201);
    let before = server.stored();
    let exchange = |request: &str, case: &str| {
        let mut stream = connect(addr);
        stream.write_all(request.as_bytes()).expect("send");
        read_response(&mut stream).unwrap_or_else(|e| panic!("{case}: {e}"))
    };
    let link = link_body("hostless");
    let hosts = [
        ("no Host", ""),
        ("two Hosts", "Host: a\r\nHost: b\r\n"),
        (
            "the same Host twice",
            "Host: lameduck\r\nHost: lameduck\r\n",
        ),
        ("a Host with userinfo", "Host: user@lameduck\r\n"),
    ];
    let paths = [
        "/healthz",
        "/readyz",
        "/metrics",
        "/api/links/before",
        "/before",
        "/nope/nope",
    ];
    for (hosts_case, host_lines) in hosts {
        for path in paths {
            let case = format!("GET {path} with {hosts_case}");
            let response = exchange(&format!("GET {path} HTTP/1.1\r\n{host_lines}\r\n"), &case);
            let message = assert_json_error(&response, 400, &case);
            assert!(message.contains("Host header"), "{case}: {message}");
        }
        let case = format!("POST /api/links with {hosts_case}");
        let request = format!(
            "POST /api/links HTTP/1.1\r\n{host_lines}Content-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n{link}",
            link.len()
        );
        assert_json_error(&exchange(&request, &case), 400, &case);
    }
    assert_eq!(server.stored(), before, "a request without a Host stored");
    let info = fresh_get(addr, "/api/links/before");
    assert_eq!(info.json()["hits"], 0, "a refused redirect counted a hit");

    let response = exchange("GET /healthz HTTP/1.0\r\n\r\n", "HTTP/1.0");
    assert_eq!(response.status, 200, "HTTP/1.0 without Host: {response:?}");

    runtime().block_on(async {
        let mut sender = h2_client(addr).await;
        let get = |uri: String| {
            Request::get(uri)
                .body(Empty::new().boxed())
                .expect("request")
        };
        let (status, body, _) = h2_send(&mut sender, get(format!("http://{addr}/healthz"))).await;
        assert_eq!(status, 200, "HTTP/2 with :authority: {body:?}");
        let create = Request::post(format!("http://{addr}/api/links"))
            .header(CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(link_body("over-h2"))).boxed())
            .expect("request");
        let (status, body, _) = h2_send(&mut sender, create).await;
        assert_eq!(status, 201, "HTTP/2 POST: {body:?}");
        // A relative URI: hyper's client sends no :authority.
        let (status, body, _) = h2_send(&mut sender, get("/healthz".to_owned())).await;
        let message = assert_json_error(&h2_as_raw(status, body), 400, "HTTP/2 without host");
        assert!(message.contains(":authority"), "{message}");
    });
    server.assert_serving("requests without a Host");
}

// Gap: `POST /api/links` accepted a URL with a control character (CR LF,
// NUL, VT, DEL...) with 201, after which every `GET /{code}` answered 500,
// and URLs with spaces or non-ASCII characters went out raw in
// `Location`, which is then no URI at all. A control character anywhere
// must get a JSON 400 that says so and store nothing; other URLs are stored
// normalised, and the redirect on the wire carries that ASCII form.
#[test]
fn urls_with_control_characters_get_400_and_others_redirect_in_normalised_form() {
    let mut server = Server::start(&[]);
    let addr = server.addr();
    for control in ['\r', '\n', '\t', '\0', '\u{1}', '\u{b}', '\u{7f}', '\u{85}'] {
        let body = serde_json::json!({ "url": format!("https://example.com/a{control}b") });
        let case = format!("a URL with U+{:04X}", u32::from(control));
        let response = post_json(addr, &body.to_string());
        let message = assert_json_error(&response, 400, &case);
        assert!(message.contains("control characters"), "{case}: {message}");
    }
    assert_eq!(server.stored(), (0, 0), "a refused URL was stored");

    let body = serde_json::json!({ "url": "https://Bücher.example/a b|ü?q=x y#frag ment" });
    let created = post_json(addr, &body.to_string());
    assert_eq!(created.status, 201, "{created:?}");
    let normalised = "https://xn--bcher-kva.example/a%20b%7C%C3%BC?q=x%20y#frag%20ment";
    let json = created.json();
    assert_eq!(json["url"], normalised);
    let code = json["code"].as_str().expect("code");
    let redirect = fresh_get(addr, &format!("/{code}"));
    assert_eq!(redirect.status, 307, "{redirect:?}");
    assert_eq!(
        redirect.header("location"),
        Some(normalised),
        "{redirect:?}"
    );
    server.assert_serving("URLs with control characters");
}

// === secrets ===

// Gap: the database URL carries the password; it must not leak through
// any channel an operator or a client can read, even at debug level and
// through an outage, when connection errors are most verbose.
#[test]
fn the_database_password_never_appears_in_logs_errors_or_metrics() {
    let cluster = PgCluster::start();
    let url = cluster.url();
    let password = cluster.password().to_owned();
    let mut server = LameduckProcess::start(
        &["--log-format", "json"],
        &[("DATABASE_URL", url.as_str()), ("RUST_LOG", "debug")],
    );
    let addr = server.addr();
    let admin = server.admin_addr();
    let mut seen: Vec<String> = Vec::new();
    let mut keep = |response: RawResponse| {
        seen.push(format!(
            "{response:?} {}",
            String::from_utf8_lossy(&response.body)
        ));
        response
    };

    assert_eq!(keep(post_json(addr, &link_body("secret"))).status, 201);
    assert_eq!(keep(fresh_get(addr, "/secret")).status, 307);
    assert_eq!(keep(fresh_get(addr, "/api/links/secret")).status, 200);
    keep(fresh_get(addr, "/api/links/missing"));
    keep(post_links(addr, b"{", Some("application/json")));

    cluster.stop();
    wait_database(admin, "down");
    keep(fresh_get(addr, "/readyz"));
    keep(post_json(addr, &link_body("down")));
    keep(fresh_get(addr, "/api/links/secret"));
    keep(fresh_get(addr, "/api/links/unknown"));
    keep(fresh_get(addr, "/unknown"));
    keep(fresh_get(addr, "/secret"));
    keep(fresh_get(admin, "/metrics"));
    cluster.start_again();
    wait_database(admin, "up");
    keep(fresh_get(addr, "/api/links/secret"));
    keep(fresh_get(admin, "/metrics"));

    server.signal(Signal::SIGTERM);
    assert_eq!(server.exit_code(PATIENCE), 0, "{}", server.log_text());
    let logs = server.logs();
    let leaks: Vec<&str> = logs
        .iter()
        .chain(&seen)
        .map(String::as_str)
        .filter(|text| text.contains(&password))
        .collect();
    assert!(
        leaks.is_empty(),
        "the password appears in {} log lines or responses:\n{}",
        leaks.len(),
        leaks.join("\n")
    );
    // The search covered the chatty channels: statement logging at debug
    // level, and the outage.
    for needle in ["sqlx::query", "database unreachable"] {
        assert!(
            logs.iter().any(|line| line.contains(needle)),
            "no log line contains {needle:?}; logs:\n{}",
            logs.join("\n")
        );
    }
}

// === request ids ===

// Gap: a request id ties a client's report to the server's log line:
// one the client sends is kept and echoed, one is generated otherwise, and
// the per-request log line carries it in its span.
#[test]
fn request_ids_are_accepted_or_generated_returned_and_logged() {
    let server = LameduckProcess::start(
        &["--log-format", "json"],
        &[("RUST_LOG", "info,lameduck::http=debug")],
    );
    let addr = server.addr();

    let generated = fresh_get(addr, "/healthz");
    assert_eq!(generated.status, 200, "{generated:?}");
    let generated_id = generated
        .header("x-request-id")
        .unwrap_or_else(|| panic!("no x-request-id generated: {generated:?}"))
        .to_owned();
    assert_eq!(generated_id.len(), 36, "not a UUID: {generated_id}");
    let other = fresh_get(addr, "/healthz");
    assert_ne!(other.header("x-request-id"), Some(generated_id.as_str()));

    let echoed = get_with(addr, "/healthz", "x-request-id: test-123\r\n");
    assert_eq!(echoed.status, 200, "{echoed:?}");
    assert_eq!(
        echoed.header("x-request-id"),
        Some("test-123"),
        "{echoed:?}"
    );
    let error = get_with(addr, "/nope/nope", "x-request-id: test-404\r\n");
    assert_json_error(&error, 404, "an unknown route");
    assert_eq!(error.header("x-request-id"), Some("test-404"), "{error:?}");

    for (id, status) in [
        ("test-123", 200),
        ("test-404", 404),
        (generated_id.as_str(), 200),
    ] {
        let deadline = Instant::now() + PATIENCE;
        let line = loop {
            let found = server.logs().into_iter().find_map(|line| {
                let json: serde_json::Value = serde_json::from_str(&line).ok()?;
                let finished = json["message"] == "request finished"
                    || json["fields"]["message"] == "request finished";
                let span = &json["span"];
                (finished && span["request_id"] == id).then_some(json)
            });
            if let Some(json) = found {
                break json;
            }
            assert!(
                Instant::now() < deadline,
                "no \"request finished\" line with request_id {id} in its span; logs:\n{}",
                server.log_text()
            );
            thread::sleep(Duration::from_millis(20));
        };
        assert_eq!(line["status"], status, "{line}");
        assert_eq!(line["span"]["name"], "request", "{line}");
    }
}
