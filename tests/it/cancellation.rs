//! Request cancellation that cleans up, against real PostgreSQL (a throwaway
//! cluster) and SQLite: a client that hangs up must leave no row, no open
//! transaction and no discarded connection behind.

use std::future::Future;
use std::net::SocketAddr;
use std::task::Poll;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use axum::{Json, Router};
use clap::Parser;
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::client::conn::http2;
use hyper::service::Service as _;
use hyper::Request;
use hyper_util::rt::{TokioExecutor, TokioIo};
use lameduck::config::{Cli, Command, ServerConfig};
use lameduck::exit::Exit;
use lameduck::lifecycle::{self, DrainOutcome, Lifecycle, Scoped, ServeConfig, Shutdown};
use lameduck::storage::{Storage, StorageMetrics, StoredLink};
use lameduck::App;
use lameduck_testkit::postgres::PgCluster;
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;
use tempfile::TempDir;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

fn server_config(database_url: Option<&str>, data_dir: &TempDir, pool: u32) -> ServerConfig {
    let mut argv = vec![
        "lameduck".to_owned(),
        "server".to_owned(),
        "--listen".to_owned(),
        "127.0.0.1:0".to_owned(),
        "--admin-listen".to_owned(),
        "127.0.0.1:0".to_owned(),
        "--data-dir".to_owned(),
        data_dir.path().display().to_string(),
        "--database-max-connections".to_owned(),
        pool.to_string(),
    ];
    if let Some(url) = database_url {
        argv.extend(["--database-url".to_owned(), url.to_owned()]);
    }
    match Cli::try_parse_from(argv).expect("valid arguments").command {
        Command::Server(config) => config,
        _ => unreachable!("server subcommand"),
    }
}

/// The service on `database_url` (SQLite in `data` when `None`) with a pool
/// of one connection, so that a leaked connection shows at once.
async fn app_with_pool_of_one(
    database_url: Option<&str>,
    data: &TempDir,
    lifecycle: Lifecycle,
) -> App {
    App::build(server_config(database_url, data, 1), lifecycle)
        .await
        .expect("app")
}

async fn admin_pool(cluster: &PgCluster) -> PgPool {
    PgPoolOptions::new()
        .max_connections(3)
        .connect(&cluster.url())
        .await
        .expect("admin connection")
}

/// Backends of the service's main pool, by state.
async fn app_backends(admin: &PgPool) -> Vec<(i32, String, Option<String>)> {
    sqlx::query_as(
        "SELECT pid, coalesce(state, ''), wait_event_type FROM pg_stat_activity \
         WHERE application_name = 'lameduck' ORDER BY pid",
    )
    .fetch_all(admin)
    .await
    .expect("pg_stat_activity")
}

async fn rows_for(admin: &PgPool, code: &str) -> (i64, i64) {
    let links: i64 = sqlx::query_scalar("SELECT count(*) FROM links WHERE code = $1")
        .bind(code)
        .fetch_one(admin)
        .await
        .expect("links");
    let audits: i64 = sqlx::query_scalar("SELECT count(*) FROM link_audit WHERE code = $1")
        .bind(code)
        .fetch_one(admin)
        .await
        .expect("audit");
    (links, audits)
}

/// Polls `check` every 10 ms until it holds or `within` passes; returns how
/// long it took.
async fn eventually<F, Fut>(within: Duration, mut check: F) -> Option<Duration>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let started = Instant::now();
    while started.elapsed() < within {
        if check().await {
            return Some(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    None
}

async fn metric(addr: SocketAddr, name: &str) -> f64 {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n")
        .await
        .expect("write");
    let mut body = Vec::new();
    tokio::io::AsyncReadExt::read_to_end(&mut stream, &mut body)
        .await
        .expect("read");
    let body = String::from_utf8_lossy(&body);
    body.lines()
        .find_map(|line| line.strip_prefix(&format!("{name} ")))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or_else(|| panic!("metric {name} missing in:\n{body}"))
}

/// What one "client leaves while the insert waits on a lock" run observed.
#[derive(Debug)]
struct LockedInsert {
    /// How soon after the hang-up the app's backend stopped waiting on the
    /// lock; `None` if it still waited a second later.
    released_after: Option<Duration>,
    /// The app's backend was seen idle inside a transaction afterwards.
    idle_in_transaction: bool,
    /// (links, audit rows) written for the code, after the lock is released.
    rows: (i64, i64),
    /// Same backend PIDs before and after: the connection was reused.
    same_backends: bool,
}

/// How the client leaves a request it no longer wants.
#[derive(Clone, Copy, Debug)]
enum Leave {
    /// HTTP/1.1: it closes the connection.
    HangUp,
    /// HTTP/2: it resets the request's stream (RST_STREAM) and keeps the
    /// connection.
    ResetStream,
}

/// A client with a `POST` in flight.
enum Posting {
    Http1(TcpStream),
    Http2 {
        sender: http2::SendRequest<Full<Bytes>>,
        response: tokio::task::JoinHandle<hyper::Result<hyper::Response<Incoming>>>,
    },
}

impl Posting {
    /// Sends `POST path` with the JSON `body`, over HTTP/1.1 or HTTP/2 as
    /// `leave` will need.
    async fn start(addr: SocketAddr, path: &str, body: String, leave: Leave) -> Posting {
        let mut tcp = TcpStream::connect(addr).await.expect("connect");
        match leave {
            Leave::HangUp => {
                let head = format!(
                    "POST {path} HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                    body.len()
                );
                tcp.write_all(format!("{head}{body}").as_bytes())
                    .await
                    .expect("send");
                Posting::Http1(tcp)
            }
            Leave::ResetStream => {
                let (sender, connection) =
                    http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
                        .await
                        .expect("HTTP/2 handshake");
                tokio::spawn(connection);
                let request = Request::post(format!("http://t{path}"))
                    .header("content-type", "application/json")
                    .body(Full::new(Bytes::from(body)))
                    .expect("request");
                let response = tokio::spawn(sender.clone().send_request(request));
                Posting::Http2 { sender, response }
            }
        }
    }

    /// Leaves the request. Over HTTP/2 the connection stays, and is
    /// returned: dropping the response resets only the stream.
    fn leave(self) -> Option<http2::SendRequest<Full<Bytes>>> {
        match self {
            Posting::Http1(tcp) => {
                drop(tcp);
                None
            }
            Posting::Http2 { sender, response } => {
                response.abort();
                Some(sender)
            }
        }
    }
}

/// Holds `ACCESS EXCLUSIVE` on `links`, sends `POST path` for `code`, waits
/// until the app's statement blocks on the lock, leaves as `leave` says, and
/// watches.
async fn insert_blocked_then_client_leaves(
    admin: &PgPool,
    addr: SocketAddr,
    path: &str,
    code: &str,
    leave: Leave,
) -> LockedInsert {
    let before: Vec<i32> = app_backends(admin).await.iter().map(|b| b.0).collect();
    assert_eq!(before.len(), 1, "pool of one, already connected");

    let mut lock = admin.begin().await.expect("begin");
    sqlx::query("LOCK TABLE links IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *lock)
        .await
        .expect("lock");

    let body = format!(r#"{{"url":"https://example.com/{code}","code":"{code}"}}"#);
    let posting = Posting::start(addr, path, body, leave).await;
    let blocked = eventually(Duration::from_secs(10), || async {
        app_backends(admin)
            .await
            .iter()
            .any(|(_, state, wait)| state == "active" && wait.as_deref() == Some("Lock"))
    })
    .await;
    assert!(blocked.is_some(), "the insert never blocked on the lock");

    let kept = posting.leave();
    let released_after = eventually(Duration::from_secs(1), || async {
        !app_backends(admin)
            .await
            .iter()
            .any(|(_, _, wait)| wait.as_deref() == Some("Lock"))
    })
    .await;
    // Give the rollback a moment to land, then look for a leaked transaction.
    let settled = eventually(Duration::from_secs(2), || async {
        app_backends(admin)
            .await
            .iter()
            .all(|(_, state, _)| state == "idle")
    })
    .await;
    let idle_in_transaction = app_backends(admin)
        .await
        .iter()
        .any(|(_, state, _)| state.starts_with("idle in transaction"));

    lock.rollback().await.expect("release the lock");
    // Whatever the app does once the lock is gone has a moment to happen.
    let _ = eventually(Duration::from_secs(2), || async {
        app_backends(admin)
            .await
            .iter()
            .all(|(_, state, _)| state == "idle")
    })
    .await;
    let after: Vec<i32> = app_backends(admin).await.iter().map(|b| b.0).collect();
    // The HTTP/2 connection whose stream was reset still serves.
    if let Some(mut sender) = kept {
        let request = Request::get("http://t/healthz")
            .body(Full::new(Bytes::new()))
            .expect("request");
        let response = sender
            .send_request(request)
            .await
            .expect("the same connection");
        assert_eq!(response.status(), StatusCode::OK);
    }
    LockedInsert {
        released_after,
        idle_in_transaction: idle_in_transaction || settled.is_none(),
        rows: rows_for(admin, code).await,
        same_backends: before == after,
    }
}

async fn create_via_http(addr: SocketAddr, code: &str) -> u16 {
    let body = format!(r#"{{"url":"https://example.com/{code}","code":"{code}"}}"#);
    let mut client = TcpStream::connect(addr).await.expect("connect");
    client
        .write_all(
            format!(
                "POST /api/links HTTP/1.1\r\nhost: t\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            )
            .as_bytes(),
        )
        .await
        .expect("send");
    let mut answer = Vec::new();
    tokio::io::AsyncReadExt::read_to_end(&mut client, &mut answer)
        .await
        .expect("read");
    String::from_utf8_lossy(&answer)
        .split_whitespace()
        .nth(1)
        .and_then(|status| status.parse().ok())
        .expect("status line")
}

// The seed's promise (sqlx #2054 territory): a client that hangs up while
// its INSERT waits on a lock gets the statement cancelled inside PostgreSQL
// at once, the transaction rolled back, and the same connection reused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_leaving_a_blocked_insert_cancels_it_and_returns_the_connection_clean() {
    leaving_a_blocked_insert_cancels_it_and_returns_the_connection_clean(Leave::HangUp).await;
}

// The same over HTTP/2, where a client cuts one request and keeps the
// connection: the stream's reset alone cancels the statement and rolls back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_client_resetting_a_blocked_insert_cancels_it_and_returns_the_connection_clean() {
    leaving_a_blocked_insert_cancels_it_and_returns_the_connection_clean(Leave::ResetStream).await;
}

async fn leaving_a_blocked_insert_cancels_it_and_returns_the_connection_clean(leave: Leave) {
    let cluster = PgCluster::start();
    let data = TempDir::new().expect("tempdir");
    let lifecycle = Lifecycle::new();
    let trigger = lifecycle.trigger_handle();
    let app = app_with_pool_of_one(Some(&cluster.url()), &data, lifecycle).await;
    let (addr, admin_addr) = (app.local_addr(), app.admin_addr());
    let serving = tokio::spawn(app.run());
    let admin = admin_pool(&cluster).await;
    assert_eq!(create_via_http(addr, "warmup").await, 201);

    let seen =
        insert_blocked_then_client_leaves(&admin, addr, "/api/links", "blocked", leave).await;

    let released = seen
        .released_after
        .expect("blocked statement still waiting 1 s after the client left");
    assert!(released < Duration::from_secs(1), "{released:?}");
    assert!(!seen.idle_in_transaction, "{seen:?}");
    assert_eq!(seen.rows, (0, 0), "no link and no audit row");
    assert!(
        seen.same_backends,
        "the connection was reconnected, not reused"
    );
    assert_eq!(
        metric(admin_addr, "lameduck_db_connections_discarded_total").await,
        0.0
    );
    assert_eq!(
        metric(
            admin_addr,
            "lameduck_db_connections_in_transaction_at_release_total"
        )
        .await,
        0.0
    );
    assert_eq!(
        metric(admin_addr, "lameduck_db_rollbacks_on_cancel_total").await,
        1.0
    );
    assert_eq!(
        metric(admin_addr, "lameduck_db_statements_cancelled_total").await,
        1.0
    );
    assert_eq!(
        metric(admin_addr, "lameduck_requests_aborted_total").await,
        1.0
    );
    // And the pool of one still serves.
    assert_eq!(create_via_http(addr, "after").await, 201);

    trigger.trigger("test over");
    serving.await.expect("serve");
}

/// The same insert, written the way most handlers are: the database work
/// runs inside the request future, which hyper drops when the client leaves.
async fn unguarded_create(
    State(storage): State<Storage>,
    Json(body): Json<serde_json::Value>,
) -> StatusCode {
    let link = StoredLink {
        code: body["code"].as_str().unwrap_or_default().to_owned(),
        url: body["url"].as_str().unwrap_or_default().to_owned(),
        hits: 0,
        created_at: "2026-01-01T00:00:00Z".to_owned(),
    };
    match storage.insert_link(&link, &CancellationToken::new()).await {
        Ok(()) => StatusCode::CREATED,
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

// Shows the previous test can fail: without the drop guard and the tracked
// task, the statement keeps waiting on the lock after the client has gone,
// holding the pool's only connection inside a transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_guard_the_same_scenario_leaves_the_bad_state_the_test_detects() {
    let cluster = PgCluster::start();
    let data = TempDir::new().expect("tempdir");
    let lifecycle = Lifecycle::new();
    let trigger = lifecycle.trigger_handle();
    let app = app_with_pool_of_one(Some(&cluster.url()), &data, lifecycle).await;
    let parts = app.into_parts();
    let addr = parts.listener.local_addr().expect("addr");
    let router = Router::new()
        .route("/unguarded", post(unguarded_create))
        .with_state(parts.storage.clone())
        .merge(parts.router);
    let config = ServeConfig {
        drain_delay: Duration::ZERO,
        shutdown_timeout: Duration::from_secs(5),
        ..ServeConfig::default()
    };
    let (shutdown, _workers) = parts.lifecycle.into_parts();
    let serving =
        tokio::spawn(
            async move { lifecycle::serve(parts.listener, router, &shutdown, config).await },
        );
    let admin = admin_pool(&cluster).await;
    assert_eq!(create_via_http(addr, "warmup").await, 201);

    let seen =
        insert_blocked_then_client_leaves(&admin, addr, "/unguarded", "unguarded", Leave::HangUp)
            .await;

    assert_eq!(seen.released_after, None, "{seen:?}");
    assert!(seen.idle_in_transaction, "{seen:?}");

    trigger.trigger("test over");
    let _ = serving.await;
}

/// Counts how many polls `future` needs, waking between polls.
async fn polls_to_complete<F: Future>(future: F) -> usize {
    let mut task = tokio_test::task::spawn(future);
    let mut polls = 0;
    loop {
        polls += 1;
        if task.poll().is_ready() {
            return polls;
        }
        wait_for_wake(&task).await;
    }
}

/// The most polls any of a few runs of `run(attempt)` took, stopping at
/// the first that took two or more. Each step usually leaves the future
/// waiting on the database; on a fast loopback an answer can be there
/// before it is read, and a run then takes fewer polls than it has await
/// points.
async fn most_polls_to_complete<F: Future>(mut run: impl FnMut(usize) -> F) -> usize {
    let mut most = 0;
    for attempt in 0..5 {
        most = most.max(polls_to_complete(run(attempt)).await);
        if most >= 2 {
            break;
        }
    }
    most
}

async fn wait_for_wake<F>(task: &tokio_test::task::Spawn<F>) {
    let woken = eventually(Duration::from_secs(10), || {
        let woken = task.is_woken();
        async move { woken }
    })
    .await;
    assert!(woken.is_some(), "the future was never woken");
}

/// Polls `task` to completion, waking between polls.
async fn finish<F: Future>(task: &mut tokio_test::task::Spawn<F>) -> F::Output {
    loop {
        if let Poll::Ready(output) = task.poll() {
            return output;
        }
        wait_for_wake(task).await;
    }
}

/// Polls `future` `k` times (waking between polls), then stops; returns
/// its output instead if it finished first.
async fn poll_times<F: Future>(
    future: F,
    k: usize,
) -> Result<F::Output, tokio_test::task::Spawn<F>> {
    let mut task = tokio_test::task::spawn(future);
    for _ in 0..k {
        if let Poll::Ready(output) = task.poll() {
            return Ok(output);
        }
        wait_for_wake(&task).await;
    }
    Err(task)
}

fn link(code: &str) -> StoredLink {
    StoredLink {
        code: code.to_owned(),
        url: format!("https://example.com/{code}"),
        hits: 0,
        created_at: "2026-01-01T00:00:00Z".to_owned(),
    }
}

/// Link and audit row counts for `code`, through the service's own pool.
async fn storage_rows(storage: &Storage, code: &str) -> (i64, i64) {
    let count = |table: &'static str| {
        let sql = format!("SELECT count(*) AS n FROM {table} WHERE code = $1");
        async move {
            let row = sqlx::query(&sql)
                .bind(code)
                .fetch_one(storage.pool())
                .await
                .expect("count");
            sqlx::Row::get::<i64, _>(&row, "n")
        }
    };
    (count("links").await, count("link_audit").await)
}

/// Cancellation at every await point: the token fires after the insert
/// was polled k times, for every k up to a full run; after each, the pool of
/// one is clean — the next transaction works and nothing half-written stays.
async fn cancel_at_every_await_point(database_url: Option<&str>, admin: Option<&PgPool>) {
    let data = TempDir::new().expect("tempdir");
    // The storage alone, without the app's workers: its health probe would
    // compete for the pool's one connection and, on a loaded machine, time
    // out and mark the database down.
    let storage = Storage::open(database_url, data.path(), 1, StorageMetrics::default())
        .await
        .expect("storage");

    let never = CancellationToken::new();
    let full = most_polls_to_complete(|attempt| {
        let (storage, never) = (&storage, &never);
        let new = link(&format!("full-{attempt}"));
        async move { storage.insert_link(&new, never).await }
    })
    .await;
    assert!(full >= 2, "a transaction takes several polls, got {full}");

    for k in 0..=full {
        let code = format!("cancel-{k}");
        let token = CancellationToken::new();
        let new = link(&code);
        let result = match poll_times(storage.insert_link(&new, &token), k).await {
            Ok(finished) => finished,
            Err(mut task) => {
                token.cancel();
                // The work runs to its own clean end after the cancel, as it
                // does on the lifecycle's tracked task.
                finish(&mut task).await
            }
        };
        let rows = storage_rows(&storage, &code).await;
        match result {
            Ok(()) => assert_eq!(rows, (1, 1), "k={k}: committed before the cancel"),
            Err(_) => assert_eq!(rows, (0, 0), "k={k}: rolled back"),
        }
        if let Some(admin) = admin {
            let leaked = app_backends(admin)
                .await
                .into_iter()
                .filter(|(_, state, _)| state.starts_with("idle in transaction"))
                .count();
            assert_eq!(leaked, 0, "k={k}: a session idle in transaction");
        }
        // The only connection is free and clean: a full transaction works.
        storage
            .insert_link(&link(&format!("next-{k}")), &never)
            .await
            .unwrap_or_else(|error| panic!("k={k}: next transaction failed: {error}"));
    }
    assert_eq!(storage.metrics().connections_discarded(), 0);
    assert_eq!(
        storage.metrics().connections_opened(),
        1,
        "reused, never reconnected"
    );
    storage.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancellation_at_every_await_point_leaves_postgres_clean() {
    let cluster = PgCluster::start();
    let admin = admin_pool(&cluster).await;
    cancel_at_every_await_point(Some(&cluster.url()), Some(&admin)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancellation_at_every_await_point_leaves_sqlite_clean() {
    cancel_at_every_await_point(None, None).await;
}

/// How a request is cut part-way.
#[derive(Clone, Copy, Debug)]
enum Cut {
    /// The client hangs up: hyper drops the request future, whose drop
    /// guard fires the token.
    ClientHangsUp,
    /// The shutdown deadline fires every request's token; the request
    /// future keeps running and answers.
    Deadline,
}

/// The request-level half of "cancellation at every await point": a link
/// creation on PostgreSQL is cut after k polls, for every k up to a full
/// run. After each cut: both statements' effects exist together or not at
/// all; a 201 was answered only for a committed link (and a committed link
/// answered 201 unless the client had gone); no session is left idle in a
/// transaction; and the next request on the pool of one succeeds, on the
/// same connection, never discarded.
async fn cut_link_creation_at_every_await_point(cut: Cut) {
    let cluster = PgCluster::start();
    let admin = admin_pool(&cluster).await;
    let data = TempDir::new().expect("tempdir");
    let app = app_with_pool_of_one(Some(&cluster.url()), &data, Lifecycle::new()).await;
    let parts = app.into_parts();
    let create = |code: &str| {
        Request::post("/api/links")
            .header("host", "lameduck.test")
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(format!(
                r#"{{"url":"https://example.com/{code}","code":"{code}"}}"#
            ))))
            .expect("request")
    };
    // Each cut gets a timeline of its own: after a deadline, every request
    // on that timeline is born cancelled.
    let timeline = || {
        let shutdown = Shutdown::new();
        let service = Scoped::new(parts.router.clone(), shutdown.watch().clone());
        (shutdown, service)
    };

    let full =
        most_polls_to_complete(|attempt| timeline().1.call(create(&format!("full-{attempt}"))))
            .await;
    assert!(full >= 2, "a request takes several polls, got {full}");
    for k in 0..=full {
        let code = format!("{cut:?}-{k}").to_lowercase();
        let (shutdown, service) = timeline();
        let answered = match (poll_times(service.call(create(&code)), k).await, cut) {
            (Ok(finished), _) => Some(finished.expect("infallible").status()),
            (Err(task), Cut::ClientHangsUp) => {
                drop(task);
                None
            }
            (Err(mut task), Cut::Deadline) => {
                shutdown.cancel_requests();
                Some(finish(&mut task).await.expect("infallible").status())
            }
        };
        // Shutdown waits for the tracked clean-up; so does this check.
        let tracker = shutdown.watch().tracker();
        tracker.close();
        tokio::time::timeout(Duration::from_secs(10), tracker.wait())
            .await
            .expect("cleanup finished");

        let rows = rows_for(&admin, &code).await;
        assert!(
            rows == (0, 0) || rows == (1, 1),
            "{cut:?} k={k}: half-written {rows:?}"
        );
        match answered {
            Some(StatusCode::CREATED) => assert_eq!(rows, (1, 1), "{cut:?} k={k}: 201"),
            Some(status) => assert_eq!(rows, (0, 0), "{cut:?} k={k}: {status} but committed"),
            // The client left: a commit that had passed its point may
            // stand, a partial one never (checked above).
            None => {}
        }
        let idle_in_transaction = app_backends(&admin)
            .await
            .iter()
            .any(|(_, state, _)| state.starts_with("idle in transaction"));
        assert!(!idle_in_transaction, "{cut:?} k={k}");
        let response = timeline()
            .1
            .call(create(&format!("after-{k}")))
            .await
            .expect("infallible");
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .expect("body")
            .to_bytes();
        assert_eq!(status, StatusCode::CREATED, "{cut:?} k={k}: {body:?}");
    }
    assert_eq!(parts.storage.metrics().connections_discarded(), 0);
    assert_eq!(parts.storage.metrics().connections_opened(), 1);
}

// A client hang-up at any moment (hyper dropping the request future after
// k polls) fires the token through the drop guard; the tracked task rolls
// back, and the next request on the pool of one works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_request_after_k_polls_rolls_back_and_the_next_request_succeeds() {
    cut_link_creation_at_every_await_point(Cut::ClientHangsUp).await;
}

// The shutdown deadline at any moment of a link creation: the request is
// answered, 201 only if it committed, and nothing half-written stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deadline_after_k_polls_answers_201_only_for_a_committed_link() {
    cut_link_creation_at_every_await_point(Cut::Deadline).await;
}

// The deadline while the INSERT waits on a lock: the token fires, the
// statement is cancelled inside PostgreSQL, the transaction rolls back
// within the deadline's clean-up grace, the client gets no 201, and the
// connection goes back to the pool clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deadline_cancels_an_insert_blocked_on_a_lock_and_returns_the_connection_clean() {
    let cluster = PgCluster::start();
    let admin = admin_pool(&cluster).await;
    let data = TempDir::new().expect("tempdir");
    let mut config = server_config(Some(&cluster.url()), &data, 1);
    config.serve.shutdown_timeout = Duration::from_millis(500);
    let lifecycle = Lifecycle::new();
    let trigger = lifecycle.trigger_handle();
    let app = App::build(config, lifecycle).await.expect("app");
    let (addr, storage) = (app.local_addr(), app.storage().clone());
    let serving = tokio::spawn(app.run());
    assert_eq!(create_via_http(addr, "warmup").await, 201);
    assert_eq!(
        app_backends(&admin).await.len(),
        1,
        "pool of one, connected"
    );

    let mut lock = admin.begin().await.expect("begin");
    sqlx::query("LOCK TABLE links IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *lock)
        .await
        .expect("lock");
    let body = r#"{"url":"https://example.com/blocked","code":"blocked"}"#;
    let mut client = TcpStream::connect(addr).await.expect("connect");
    client
        .write_all(
            format!(
                "POST /api/links HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            )
            .as_bytes(),
        )
        .await
        .expect("send");
    let blocked = eventually(Duration::from_secs(10), || async {
        app_backends(&admin)
            .await
            .iter()
            .any(|(_, state, wait)| state == "active" && wait.as_deref() == Some("Lock"))
    })
    .await;
    assert!(blocked.is_some(), "the insert never blocked on the lock");

    trigger.trigger("SIGTERM");
    let mut answer = Vec::new();
    tokio::time::timeout(
        Duration::from_secs(10),
        tokio::io::AsyncReadExt::read_to_end(&mut client, &mut answer),
    )
    .await
    .expect("answered or closed within the deadline's grace")
    .expect("read");
    let answer = String::from_utf8_lossy(&answer);
    assert!(!answer.starts_with("HTTP/1.1 201"), "{answer}");
    let report = serving.await.expect("run");
    assert_eq!(report.drain.outcome, DrainOutcome::DeadlineExceeded);
    assert_eq!(Exit::from_report(&report), Exit::DeadlineExceeded);
    let idle_in_transaction = app_backends(&admin)
        .await
        .iter()
        .any(|(_, state, _)| state.starts_with("idle in transaction"));
    lock.rollback().await.expect("release the lock");

    assert!(!idle_in_transaction, "a session idle in transaction");
    assert_eq!(rows_for(&admin, "blocked").await, (0, 0));
    assert_eq!(storage.metrics().connections_discarded(), 0);
    assert_eq!(storage.metrics().connections_opened(), 1, "reused");
}
