//! The lifecycle in process: `lifecycle::serve` on a port-0 listener with a
//! test router, sequenced with channels and paused time rather than sleeps.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::routing::get;
use axum::Router;
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper::{Request, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use lameduck_lifecycle::metrics::CloseReason;
use lameduck_lifecycle::{
    draw, serve, spread_moment, DrainOutcome, DrainReport, DrainSpread, Draw, Force, RequestScope,
    ServeConfig, Shutdown, Trigger, Watch, SETTLE,
};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Notify};
use tokio::task::JoinHandle;

/// What the test routes report back to the test.
#[derive(Clone)]
struct Probe {
    /// A handler has started.
    entered: mpsc::UnboundedSender<&'static str>,
    /// Releases `/hold`.
    release: Arc<Notify>,
    /// A request's token fired and its cleanup ran.
    cleaned_up: mpsc::UnboundedSender<&'static str>,
}

struct Harness {
    addr: std::net::SocketAddr,
    /// Starts the shutdown, as the first signal would.
    trigger: Trigger,
    /// Forces it, as the second signal would.
    force: Force,
    watch: Watch,
    serve: JoinHandle<DrainReport>,
    entered: mpsc::UnboundedReceiver<&'static str>,
    cleaned_up: mpsc::UnboundedReceiver<&'static str>,
    release: Arc<Notify>,
}

async fn hold(State(probe): State<Probe>) -> &'static str {
    let _ = probe.entered.send("hold");
    probe.release.notified().await;
    "released"
}

/// Cleanup runs on a tracked task: it survives the request future.
async fn until_cancelled(State(probe): State<Probe>, scope: RequestScope) -> &'static str {
    let _ = probe.entered.send("until_cancelled");
    let cleaned_up = probe.cleaned_up.clone();
    let _ = scope
        .run(move |token| async move {
            token.cancelled().await;
            let _ = cleaned_up.send("until_cancelled");
        })
        .await;
    "cancelled"
}

/// A response body that never ends: zeros, as fast as they are taken.
struct Endless;

impl hyper::body::Body for Endless {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        let zeros = Bytes::from_static(&[0; 16 * 1024]);
        std::task::Poll::Ready(Some(Ok(hyper::body::Frame::data(zeros))))
    }
}

async fn start(config: ServeConfig) -> Harness {
    let (entered_tx, entered) = mpsc::unbounded_channel();
    let (cleaned_tx, cleaned_up) = mpsc::unbounded_channel();
    let release = Arc::new(Notify::new());
    let probe = Probe {
        entered: entered_tx,
        release: Arc::clone(&release),
        cleaned_up: cleaned_tx,
    };
    let router = Router::new()
        .route("/ok", get(|| async { "ok" }))
        .route("/hold", get(hold))
        .route("/until-cancelled", get(until_cancelled))
        .route("/endless", get(|| async { axum::body::Body::new(Endless) }))
        .with_state(probe);
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let shutdown = Shutdown::new();
    let (trigger, force) = (shutdown.trigger_handle(), shutdown.force_handle());
    let watch = shutdown.watch().clone();
    let serve = tokio::spawn(async move { serve(listener, router, &shutdown, config).await });
    Harness {
        addr,
        trigger,
        force,
        watch,
        serve,
        entered,
        cleaned_up,
        release,
    }
}

type Sender = hyper::client::conn::http1::SendRequest<Empty<Bytes>>;

async fn connect(addr: std::net::SocketAddr) -> Sender {
    let stream = TcpStream::connect(addr).await.expect("connect");
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(connection);
    sender
}

fn get_request(path: &str) -> Request<Empty<Bytes>> {
    Request::get(path)
        .header("host", "lameduck.test")
        .body(Empty::new())
        .expect("request")
}

const LONG: Duration = Duration::from_secs(3600);

// The core promise (axum #1070's sibling): shutdown waits for the request
// already running, and answers it with `Connection: close`.
#[tokio::test(start_paused = true)]
async fn inflight_request_completes_after_shutdown_and_serve_resolves_only_afterwards() {
    let mut harness = start(ServeConfig {
        drain_delay: Duration::ZERO,
        shutdown_timeout: LONG,
        ..ServeConfig::default()
    })
    .await;
    let mut client = connect(harness.addr).await;
    let response = tokio::spawn(client.send_request(get_request("/hold")));
    assert_eq!(harness.entered.recv().await, Some("hold"));

    harness.trigger.trigger("test");
    // With time paused, this returns only once every task is idle: the
    // drain has started and is waiting for the held request.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        !harness.serve.is_finished(),
        "serve resolved while a request was in flight"
    );

    harness.release.notify_one();
    let response = response.await.expect("join").expect("response");
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["connection"], "close");
    let body = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    assert_eq!(&body[..], b"released");

    let report = harness.serve.await.expect("serve");
    assert_eq!(report.outcome, DrainOutcome::Clean);
    assert_eq!(report.requests_drained, 1);
    assert_eq!(report.closed_by_server, 1);
}

// A request that outlives the shutdown timeout has its token fired, gets to
// clean up, and the drain reports the deadline rather than hanging.
#[tokio::test(start_paused = true)]
async fn the_deadline_fires_request_tokens_lets_cleanup_run_and_reports_it() {
    let mut harness = start(ServeConfig {
        drain_delay: Duration::ZERO,
        shutdown_timeout: Duration::from_secs(5),
        ..ServeConfig::default()
    })
    .await;
    let mut client = connect(harness.addr).await;
    let response = tokio::spawn(client.send_request(get_request("/until-cancelled")));
    assert_eq!(harness.entered.recv().await, Some("until_cancelled"));

    harness.trigger.trigger("test");
    assert_eq!(harness.cleaned_up.recv().await, Some("until_cancelled"));
    let report = harness.serve.await.expect("serve");
    assert_eq!(report.outcome, DrainOutcome::DeadlineExceeded);
    assert!(report.drain >= Duration::from_secs(5), "{:?}", report.drain);
    // The deadline abandons requests only: workers and finalizers, which
    // watch `forced`, still run after it.
    assert!(!harness.watch.is_forced());
    // The handler itself returned after its cleanup: it was answered.
    let response = response.await.expect("join").expect("response");
    assert_eq!(response.status(), StatusCode::OK);
}

// The drop-guard pattern: a client that hangs up cancels its request's
// token, and the cleanup on the tracked task still runs to its end. Time is
// paused: the hang-up reaches the server over loopback at once, and if the
// guard were broken the timeout would fire as soon as nothing else can run,
// so the test fails at once instead of after ten seconds.
#[tokio::test(start_paused = true)]
async fn a_client_that_hangs_up_cancels_its_request_and_cleanup_runs() {
    let mut harness = start(ServeConfig {
        drain_delay: Duration::ZERO,
        shutdown_timeout: LONG,
        ..ServeConfig::default()
    })
    .await;
    let mut stream = TcpStream::connect(harness.addr).await.expect("connect");
    tokio::io::AsyncWriteExt::write_all(
        &mut stream,
        b"GET /until-cancelled HTTP/1.1\r\nhost: lameduck.test\r\n\r\n",
    )
    .await
    .expect("write");
    assert_eq!(harness.entered.recv().await, Some("until_cancelled"));
    drop(stream);

    let cleaned = tokio::time::timeout(Duration::from_secs(10), harness.cleaned_up.recv()).await;
    assert_eq!(
        cleaned.expect("token fired after hang-up"),
        Some("until_cancelled")
    );
    assert_eq!(harness.watch.metrics().snapshot().requests_aborted, 1);

    harness.trigger.trigger("test");
    let report = harness.serve.await.expect("serve");
    assert_eq!(report.outcome, DrainOutcome::Clean);
    assert_eq!(report.requests_aborted, 1);
}

// The same guard over HTTP/2, where a client cuts one request without
// closing the connection: RST_STREAM drops that stream's request future
// only. Its token fires, the cleanup runs, and the connection serves on.
// Real time: the reset takes more hops than a hang-up (the client's tasks,
// then its connection's write), and paused time, finding the runtime idle
// while the bytes cross loopback, would jump to the timeout. A passing run
// takes milliseconds; a broken guard fails at the timeout.
#[tokio::test]
async fn an_http2_stream_the_client_resets_cancels_its_request_and_the_connection_serves_on() {
    let mut harness = start(ServeConfig {
        drain_delay: Duration::ZERO,
        shutdown_timeout: LONG,
        ..ServeConfig::default()
    })
    .await;
    let stream = TcpStream::connect(harness.addr).await.expect("connect");
    let (sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .expect("handshake");
    tokio::spawn(connection);
    let request = |path: &str| {
        Request::get(format!("http://lameduck.test{path}"))
            .body(Empty::<Bytes>::new())
            .expect("request")
    };
    // Dropping the response future resets the stream (RST_STREAM CANCEL).
    let cut = tokio::spawn(sender.clone().send_request(request("/until-cancelled")));
    assert_eq!(harness.entered.recv().await, Some("until_cancelled"));
    cut.abort();

    let cleaned = tokio::time::timeout(Duration::from_secs(10), harness.cleaned_up.recv()).await;
    assert_eq!(
        cleaned.expect("token fired after the stream's reset"),
        Some("until_cancelled")
    );
    assert_eq!(harness.watch.metrics().snapshot().requests_aborted, 1);
    let response = sender
        .clone()
        .send_request(request("/ok"))
        .await
        .expect("the same connection, after the reset");
    assert_eq!(response.status(), StatusCode::OK);

    harness.trigger.trigger("test");
    let report = harness.serve.await.expect("serve");
    assert_eq!(report.outcome, DrainOutcome::Clean);
    assert_eq!(report.requests_aborted, 1);
    assert_eq!(report.requests_drained, 0);
}

// A client that stops reading an answer still streaming to it keeps its
// connection busy: no idle or head deadline applies, and the drain would
// wait for it until the deadline. The send timeout has the kernel close it
// once what the server sent goes unacknowledged. Real time: the kernel's
// timer, not tokio's, ends the connection.
#[tokio::test]
async fn a_client_that_stops_reading_loses_its_connection_at_the_send_timeout() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let harness = start(ServeConfig {
        drain_delay: Duration::ZERO,
        shutdown_timeout: LONG,
        idle_timeout: LONG,
        header_read_timeout: LONG,
        send_timeout: Duration::from_secs(1),
        ..ServeConfig::default()
    })
    .await;
    // Served once: the listener has its send timeout, which connections
    // inherit when the kernel accepts them.
    let response = connect(harness.addr).await.send_request(get_request("/ok"));
    assert_eq!(response.await.expect("GET /ok").status(), StatusCode::OK);

    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    // A small window, soon closed: the server's answer backs up at once.
    socket.set_recv_buffer_size(4096).expect("SO_RCVBUF");
    let mut client = socket.connect(harness.addr).await.expect("connect");
    client
        .write_all(b"GET /endless HTTP/1.1\r\nhost: lameduck.test\r\n\r\n")
        .await
        .expect("send the request");
    let mut head = [0; 12];
    client
        .read_exact(&mut head)
        .await
        .expect("the answer starts");
    assert_eq!(&head, b"HTTP/1.1 200");
    // From here on the client reads nothing.

    harness.trigger.trigger("test");
    let report = tokio::time::timeout(Duration::from_secs(60), harness.serve)
        .await
        .expect("the drain ended without waiting for the deadline")
        .expect("serve");
    assert_eq!(report.outcome, DrainOutcome::Clean);
    assert_eq!(report.connections_abandoned, 0);
    assert_eq!(harness.watch.metrics().open_connections(), 0);
}

// The same on HTTP/2, where the kernel sees nothing wrong: the client
// reads its socket but never opens its flow-control window, so an answer
// waits to be taken. The send timeout closes the connection (looked at once
// the head deadline has told the protocol) instead of the deadline.
#[tokio::test(start_paused = true)]
async fn an_http2_client_that_never_opens_its_window_loses_its_connection_at_the_send_timeout() {
    let harness = start(ServeConfig {
        drain_delay: Duration::ZERO,
        shutdown_timeout: LONG,
        idle_timeout: LONG,
        send_timeout: Duration::from_secs(1),
        ..ServeConfig::default()
    })
    .await;
    let stream = TcpStream::connect(harness.addr).await.expect("connect");
    let (mut sender, connection) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .initial_stream_window_size(0)
        .handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(connection);
    let request = Request::get("http://lameduck.test/ok")
        .body(Empty::<Bytes>::new())
        .expect("request");
    let response = sender.send_request(request).await.expect("the head");
    assert_eq!(response.status(), StatusCode::OK);

    harness.trigger.trigger("test");
    let report = harness.serve.await.expect("serve");
    assert_eq!(report.outcome, DrainOutcome::Clean);
    assert_eq!(report.connections_abandoned, 0);
    let body = response.into_body().collect().await;
    assert!(body.is_err(), "the body never came: {body:?}");
}

// Lame duck: the server still accepts and serves new connections after the
// signal (a balancer may not have noticed yet), but tells them to close.
#[tokio::test(start_paused = true)]
async fn during_the_drain_delay_new_connections_are_served_and_told_to_close() {
    let harness = start(ServeConfig {
        drain_delay: Duration::from_secs(5),
        shutdown_timeout: LONG,
        drain_spread: DrainSpread::Immediate,
        ..ServeConfig::default()
    })
    .await;
    let mut idle = connect(harness.addr).await;
    let response = idle.send_request(get_request("/ok")).await.expect("before");
    assert!(response.headers().get("connection").is_none());

    harness.trigger.trigger("test");
    let mut late = connect(harness.addr).await;
    let response = late.send_request(get_request("/ok")).await.expect("late");
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["connection"], "close");

    // The idle keep-alive connection was not cut; its next answer says close.
    idle.ready().await.expect("idle connection still open");
    let response = idle.send_request(get_request("/ok")).await.expect("idle");
    assert_eq!(response.headers()["connection"], "close");

    let report = harness.serve.await.expect("serve");
    assert_eq!(report.outcome, DrainOutcome::Clean);
    assert!(
        report.lame_duck >= Duration::from_secs(5),
        "{:?}",
        report.lame_duck
    );
}

// The request scope's own `Connection: close`: a request in flight at the
// signal and answered during the lame duck is told to close. (During the
// drain hyper adds the header anyway, so only the lame duck shows it.)
#[tokio::test(start_paused = true)]
async fn a_request_answered_during_the_lame_duck_is_told_to_close() {
    let mut harness = start(ServeConfig {
        drain_delay: Duration::from_secs(5),
        shutdown_timeout: LONG,
        drain_spread: DrainSpread::Immediate,
        ..ServeConfig::default()
    })
    .await;
    let mut client = connect(harness.addr).await;
    let response = tokio::spawn(client.send_request(get_request("/hold")));
    assert_eq!(harness.entered.recv().await, Some("hold"));
    harness.trigger.trigger("test");
    harness.release.notify_one();
    let response = response.await.expect("join").expect("response");
    assert_eq!(response.headers()["connection"], "close");
    assert_eq!(
        harness.watch.phase(),
        lameduck_lifecycle::Phase::LameDuck,
        "answered during the lame duck"
    );
    let report = harness.serve.await.expect("serve");
    assert_eq!(report.outcome, DrainOutcome::Clean);
}

// Phase 3, deterministically: the accept loop is held at the connection
// limit by one idle connection, so the clients below complete their TCP
// handshake in the kernel and wait in the listen backlog with their request
// sent. When accepting stops, every one of them is taken and answered
// (served past the limit), not reset by the listener's close.
#[tokio::test]
async fn clients_waiting_in_the_backlog_when_accepting_stops_are_served() {
    // Under the listen backlog of `TcpListener::bind` (128).
    const WAITING: usize = 100;
    let harness = start(ServeConfig {
        drain_delay: Duration::ZERO,
        shutdown_timeout: LONG,
        max_connections: 1,
        ..ServeConfig::default()
    })
    .await;
    let mut holder = connect(harness.addr).await;
    holder
        .send_request(get_request("/ok"))
        .await
        .expect("served");
    let mut waiting = Vec::new();
    for _ in 0..WAITING {
        let mut stream = TcpStream::connect(harness.addr)
            .await
            .expect("into the backlog");
        tokio::io::AsyncWriteExt::write_all(&mut stream, b"GET /ok HTTP/1.1\r\nhost: t\r\n\r\n")
            .await
            .expect("request sent");
        waiting.push(stream);
    }
    harness.trigger.trigger("test");
    for (i, mut stream) in waiting.into_iter().enumerate() {
        let mut answer = String::new();
        tokio::io::AsyncReadExt::read_to_string(&mut stream, &mut answer)
            .await
            .unwrap_or_else(|error| panic!("client {i}: {error}"));
        assert!(answer.starts_with("HTTP/1.1 200"), "client {i}: {answer:?}");
    }
    let report = harness.serve.await.expect("serve");
    assert_eq!(report.backlog_accepted, WAITING);
    assert_eq!(report.outcome, DrainOutcome::Clean);
}

// An idle server with no drain delay stops at once: no polling interval.
#[tokio::test(start_paused = true)]
async fn an_idle_server_finishes_the_drain_without_waiting() {
    let harness = start(ServeConfig {
        drain_delay: Duration::ZERO,
        shutdown_timeout: LONG,
        ..ServeConfig::default()
    })
    .await;
    let mut idle = connect(harness.addr).await;
    idle.send_request(get_request("/ok")).await.expect("served");
    let started = tokio::time::Instant::now();
    harness.trigger.trigger("test");
    let report = harness.serve.await.expect("serve");
    assert_eq!(report.outcome, DrainOutcome::Clean);
    // Paused time only moves when something sleeps: nothing did.
    assert_eq!(started.elapsed(), Duration::ZERO);
    assert_eq!(report.closed_by_server, 1);
}

// A forced shutdown (second signal) does not wait for anything.
#[tokio::test(start_paused = true)]
async fn force_abandons_inflight_work_at_once() {
    let mut harness = start(ServeConfig {
        drain_delay: Duration::from_secs(30),
        shutdown_timeout: LONG,
        ..ServeConfig::default()
    })
    .await;
    let mut client = connect(harness.addr).await;
    let response = tokio::spawn(client.send_request(get_request("/hold")));
    assert_eq!(harness.entered.recv().await, Some("hold"));

    harness.trigger.trigger("first");
    harness.force.force("second");
    let report = harness.serve.await.expect("serve");
    assert_eq!(report.outcome, DrainOutcome::Forced);
    assert_eq!(report.requests_abandoned, 1);
    assert!(
        response.await.expect("join").is_err(),
        "the held request was dropped"
    );
}

/// Seed of the connections' draws in the tests below: with it, each
/// connection's moment is known in advance.
const SEED: u64 = 45;

/// `n` HTTP/1.1 connections, each served once before the next opens, so
/// that the server numbers them 0 to n - 1 in its draws.
async fn numbered(addr: std::net::SocketAddr, n: usize) -> Vec<Sender> {
    let mut connections = Vec::new();
    for _ in 0..n {
        let mut connection = connect(addr).await;
        let response = connection.send_request(get_request("/ok")).await;
        assert_eq!(response.expect("first request").status(), StatusCode::OK);
        connections.push(connection);
    }
    connections
}

/// What a connection shows when probed.
#[derive(Debug, PartialEq)]
enum Seen {
    /// Served, not asked to close.
    Open,
    /// Served, with `Connection: close`.
    Told,
    /// Closed by the server.
    Closed,
}

async fn probe(connection: &mut Sender) -> Seen {
    if std::future::poll_fn(|cx| connection.poll_ready(cx))
        .await
        .is_err()
    {
        return Seen::Closed;
    }
    let response = connection.send_request(get_request("/ok")).await;
    let response = response.expect("an open connection serves");
    match response.headers().get("connection") {
        None => Seen::Open,
        Some(close) if close == "close" => Seen::Told,
        Some(other) => panic!("connection: {other:?}"),
    }
}

/// Steps through `span` in `steps`, checking at each that the connections
/// whose moment (`dues`, from `start`) has come have been told to close,
/// and the others not. Even-numbered connections stay idle after `opened`:
/// each is closed at its moment, or once idle `SETTLE` if that is later,
/// and not before. Odd ones ask at every step: served as usual before
/// their moment, answered with `Connection: close` at the first step after.
/// How many had been told at each step.
async fn check_told_at_their_moments(
    connections: &mut [Sender],
    dues: &[Duration],
    (opened, start): (tokio::time::Instant, tokio::time::Instant),
    span: Duration,
    steps: u32,
) -> Vec<usize> {
    let mut counts = Vec::new();
    let mut done = vec![false; connections.len()];
    for step in 1..=steps {
        let at = start + span * step / steps;
        tokio::time::sleep_until(at).await;
        for (n, connection) in connections.iter_mut().enumerate() {
            if done[n] {
                continue;
            }
            let due = start + dues[n];
            let seen = if n % 2 == 0 {
                let closed = std::future::poll_fn(|cx| connection.poll_ready(cx))
                    .await
                    .is_err();
                assert_eq!(
                    closed,
                    at >= due.max(opened + SETTLE),
                    "idle connection {n} at {step}/{steps}"
                );
                closed
            } else {
                let expected = if at < due { Seen::Open } else { Seen::Told };
                assert_eq!(
                    probe(connection).await,
                    expected,
                    "connection {n} at {step}/{steps}"
                );
                expected == Seen::Told
            };
            done[n] = seen;
        }
        counts.push(done.iter().filter(|&&d| d).count());
    }
    counts
}

// The gradual drain, exactly: each idle keep-alive connection is closed at
// its own drawn moment of the lame duck (from the seed and its number),
// none before it, every one by the lame duck's end; a connection whose
// moment has not come is served without `Connection: close`.
#[tokio::test(start_paused = true)]
async fn a_gradual_drain_closes_each_idle_connection_at_its_drawn_moment() {
    const N: usize = 16;
    let window = Duration::from_secs(10);
    let harness = start(ServeConfig {
        drain_delay: window,
        shutdown_timeout: LONG,
        drain_spread: DrainSpread::Gradual,
        connection_seed: SEED,
        ..ServeConfig::default()
    })
    .await;
    let opened = tokio::time::Instant::now();
    let mut connections = numbered(harness.addr, N).await;
    let dues: Vec<Duration> = (0..N as u64)
        .map(|n| spread_moment(draw(SEED, n, Draw::Spread), window))
        .collect();

    let signalled = tokio::time::Instant::now();
    harness.trigger.trigger("test");
    let counts =
        check_told_at_their_moments(&mut connections, &dues, (opened, signalled), window, 20).await;
    // Few at the start, all by the end, and growing in between.
    assert!(counts[0] <= 2 && counts[19] == N, "{counts:?}");
    assert!(counts.windows(2).all(|w| w[0] <= w[1]) && counts[9] > 2 && counts[9] < N - 2);

    let report = harness.serve.await.expect("serve");
    assert_eq!(report.outcome, DrainOutcome::Clean);
    assert_eq!(report.closed_by_server, N as u64);
    let snapshot = harness.watch.metrics().snapshot();
    assert_eq!(snapshot.closed_for(CloseReason::Drain), N as u64);
}

// A connection busy when its moment comes is not cut: the answer in flight
// says `Connection: close` (HTTP/1), and the connection then closes. An
// HTTP/2 connection gets its GOAWAY at its moment and no earlier: a new
// stream before it is served, the one in flight finishes after it.
#[tokio::test(start_paused = true)]
async fn a_connection_busy_at_its_moment_finishes_its_request_and_is_told_to_close() {
    let window = Duration::from_secs(10);
    let mut harness = start(ServeConfig {
        drain_delay: window,
        shutdown_timeout: LONG,
        drain_spread: DrainSpread::Gradual,
        connection_seed: SEED,
        ..ServeConfig::default()
    })
    .await;
    let mut http1 = numbered(harness.addr, 1).await.remove(0);
    let stream = TcpStream::connect(harness.addr).await.expect("connect");
    let (mut http2, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .expect("handshake");
    tokio::spawn(connection);
    let first = http2.send_request(get_request("/ok")).await.expect("h2");
    assert_eq!(first.status(), StatusCode::OK);
    let due = |n| spread_moment(draw(SEED, n, Draw::Spread), window);
    let (http1_due, http2_due) = (due(0), due(1));

    let held = tokio::spawn(http1.send_request(get_request("/hold")));
    assert_eq!(harness.entered.recv().await, Some("hold"));
    let signalled = tokio::time::Instant::now();
    harness.trigger.trigger("test");

    // HTTP/2, just before its moment: served; just after: no new stream.
    tokio::time::sleep_until(signalled + http2_due - Duration::from_millis(1)).await;
    let before = http2.send_request(get_request("/ok")).await;
    assert_eq!(before.expect("before its moment").status(), StatusCode::OK);
    tokio::time::sleep_until(signalled + http2_due + Duration::from_millis(1)).await;
    let after = http2.send_request(get_request("/ok")).await;
    assert!(after.is_err(), "a new stream after GOAWAY: {after:?}");

    // HTTP/1, past its moment: the held answer says close.
    tokio::time::sleep_until(signalled + http1_due.max(http2_due) + Duration::from_millis(1)).await;
    harness.release.notify_one();
    let response = held.await.expect("join").expect("the held request");
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["connection"], "close");
    assert_eq!(harness.watch.phase(), lameduck_lifecycle::Phase::LameDuck);
    let report = harness.serve.await.expect("serve");
    assert_eq!(
        (report.outcome, report.closed_by_server),
        (DrainOutcome::Clean, 2)
    );
}

// The connection age, exactly: each idle connection is closed at its own
// age, drawn within ±20 % of the limit, and none before; a stream longer
// than the age runs on through the grace, then is dropped and counted.
#[tokio::test(start_paused = true)]
async fn connections_close_at_their_drawn_age_and_a_stream_at_the_end_of_its_grace() {
    const N: usize = 8;
    let age = Duration::from_secs(10);
    let grace = Duration::from_secs(5);
    let harness = start(ServeConfig {
        shutdown_timeout: LONG,
        idle_timeout: LONG,
        max_connection_age: Some(age),
        max_connection_age_jitter: 0.2,
        max_connection_age_grace: grace,
        connection_seed: SEED,
        ..ServeConfig::default()
    })
    .await;
    let opened = tokio::time::Instant::now();
    let mut connections = numbered(harness.addr, N).await;
    let mut streaming = connect(harness.addr).await;
    let endless = streaming.send_request(get_request("/endless")).await;
    let _body = endless.expect("the stream's head").into_body();
    let ages: Vec<Duration> = (0..=N as u64)
        .map(|n| age.mul_f64(1.0 + 0.2 * (2.0 * draw(SEED, n, Draw::Age) - 1.0)))
        .collect();
    assert!(ages
        .iter()
        .all(|a| *a >= age * 8 / 10 && *a < age * 12 / 10));

    let counts =
        check_told_at_their_moments(&mut connections, &ages, (opened, opened), age * 12 / 10, 24)
            .await;
    assert_eq!((counts[0], counts[23]), (0, N), "{counts:?}");

    // The stream (connection N) outlives its age and stays until its grace.
    let over = opened + ages[N] + grace;
    tokio::time::sleep_until(over - Duration::from_millis(1)).await;
    let metrics = harness.watch.metrics();
    assert_eq!(metrics.snapshot().closed_for(CloseReason::Grace), 0);
    tokio::time::sleep_until(over + Duration::from_millis(1)).await;
    let snapshot = metrics.snapshot();
    assert_eq!(snapshot.closed_for(CloseReason::Grace), 1);
    assert_eq!(snapshot.closed_for(CloseReason::Age), N as u64);
    assert_eq!(metrics.open_connections(), 0);
}
