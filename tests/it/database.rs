//! When the database misbehaves, against the real binary and a real
//! PostgreSQL: the service stays ready, says what it knows of the database
//! beside its readiness, tells a saturated pool from a database that is
//! down, fails fast only behind an open circuit breaker, keeps serving what
//! needs no database, loses no hit, and says so when it cannot know
//! whether a commit was made.
//!
//! The same guarantees through a load balancer, with three replicas and
//! every kind of outage, are `load outage` (`load/src/outage/`); its smoke
//! run is in `load/tests/`.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use lameduck::storage::ACQUIRE_TIMEOUT;
use lameduck_testkit::binary::{
    assert_json_error, fresh_get, link_body, metric, metrics, post_json, read_response,
    send_create, wait_database, wait_metric, LameduckProcess, RawResponse,
};
use lameduck_testkit::postgres::{PgCluster, Sql};
use lameduck_testkit::relay::Relay;

/// Generous bound on anything that should take milliseconds.
const PATIENCE: Duration = Duration::from_secs(15);
/// The bound on an answer that must not wait for anything: a call failing
/// fast behind the open breaker. Well under [`ACQUIRE_TIMEOUT`], which is
/// what a call that waited would take.
const QUICKLY: Duration = Duration::from_secs(1);

/// Polls `/readyz` on an admin listener until dropped, keeping every answer
/// that was not 200: readiness must hold through what the test does.
struct ReadinessWatch {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<(usize, Vec<String>)>>,
}

impl ReadinessWatch {
    fn start(admin: SocketAddr) -> ReadinessWatch {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = thread::spawn({
            let stop = Arc::clone(&stop);
            move || {
                let (mut polls, mut not_ready) = (0, Vec::new());
                while !stop.load(Ordering::Acquire) {
                    let response = fresh_get(admin, "/readyz");
                    polls += 1;
                    if response.status != 200 {
                        not_ready.push(format!(
                            "{} {}",
                            response.status,
                            String::from_utf8_lossy(&response.body)
                        ));
                    }
                    thread::sleep(Duration::from_millis(50));
                }
                (polls, not_ready)
            }
        });
        ReadinessWatch {
            stop,
            thread: Some(thread),
        }
    }

    /// Stops polling; panics unless every answer was 200.
    fn assert_always_ready(mut self, during: &str) {
        self.stop.store(true, Ordering::Release);
        let (polls, not_ready) = self
            .thread
            .take()
            .expect("joined once")
            .join()
            .expect("the readiness poller");
        assert!(polls > 10, "only {polls} readiness polls during {during}");
        assert!(
            not_ready.is_empty(),
            "{} of {polls} /readyz answers during {during} were not 200: {not_ready:?}",
            not_ready.len()
        );
    }
}

impl Drop for ReadinessWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
    }
}

/// The value of the series `name{labels}` in a `/metrics` text.
fn labelled(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|value| value.trim().parse().ok())
}

/// Asserts a 503 that tells the client to come back: a JSON error that
/// mentions `mentions`, and `Retry-After: 1`.
fn assert_retry_later(response: &RawResponse, mentions: &str, case: &str) {
    let message = assert_json_error(response, 503, case);
    assert!(message.contains(mentions), "{case}: {message:?}");
    assert_eq!(
        response.header("retry-after"),
        Some("1"),
        "{case}: {response:?}"
    );
}

// Gap: readiness followed the database, so an outage took every replica
// out of its balancer at once, with the cached redirects they could still
// serve. Now readiness stays 200 and reports the database `down`; calls
// that need it fail fast with 503 and `Retry-After` once the breaker is
// open; cached redirects keep answering and counting; everything recovers
// without a restart and every hit is stored. A server started with
// `--readiness-follows-database` shows what that flag turns back on.
#[test]
fn when_the_database_goes_away_readiness_stays_200_calls_fail_fast_and_no_hit_is_lost() {
    const OUTAGE_REDIRECTS: i64 = 20;
    let cluster = PgCluster::start();
    let url = cluster.url();
    let mut server = LameduckProcess::start(&["--database-url", &url], &[]);
    let mut follower = LameduckProcess::start(
        &["--database-url", &url, "--readiness-follows-database"],
        &[],
    );
    let (addr, admin) = (server.addr(), server.admin_addr());
    let response = post_json(addr, &link_body("outage"));
    assert_eq!(response.status, 201, "{response:?}");
    let mut redirects = 0;
    for target in [addr, follower.addr()] {
        let response = fresh_get(target, "/outage");
        assert_eq!(response.status, 307, "{response:?}");
        redirects += 1;
    }
    // The follower's hit is in the database before it goes away, so this
    // server's reads count it.
    wait_metric(follower.admin_addr(), "lameduck_hits_pending", |n| n == 0.0);
    let watch = ReadinessWatch::start(admin);

    cluster.stop();
    let ready = wait_database(admin, "down");
    assert_eq!(ready.status, 200, "{ready:?}");
    assert_eq!(ready.json()["status"], "ready", "{:?}", ready.json());
    let health = fresh_get(admin, "/healthz");
    assert_eq!(health.status, 200, "{health:?}");
    assert_eq!(health.json()["database"], "down", "{:?}", health.json());
    let follower_ready = wait_database(follower.admin_addr(), "down");
    assert_eq!(follower_ready.status, 503, "{follower_ready:?}");
    assert_eq!(follower_ready.json()["status"], "database unavailable");

    for (case, request) in [
        (
            "POST during the outage",
            Box::new(|| post_json(addr, &link_body("during-outage"))) as Box<dyn Fn() -> _>,
        ),
        (
            "GET during the outage",
            Box::new(|| fresh_get(addr, "/api/links/outage")),
        ),
        (
            "a redirect that is not cached",
            Box::new(|| fresh_get(addr, "/not-cached")),
        ),
    ] {
        let started = Instant::now();
        let response = request();
        let took = started.elapsed();
        assert!(took < QUICKLY, "{case}: answered after {took:?}");
        assert_retry_later(&response, "database is unavailable", case);
    }
    for _ in 0..OUTAGE_REDIRECTS {
        let response = fresh_get(addr, "/outage");
        assert_eq!(response.status, 307, "a cached redirect: {response:?}");
        assert_eq!(
            response.header("location"),
            Some("https://example.com/outage")
        );
        redirects += 1;
    }
    let text = metrics(admin);
    assert_eq!(
        labelled(&text, r#"lameduck_db_breaker_state{state="open"}"#)
            .or_else(|| labelled(&text, r#"lameduck_db_breaker_state{state="half_open"}"#)),
        Some(1.0),
        "{text}"
    );
    assert!(
        metric(&text, "lameduck_db_failed_fast_total").is_some_and(|n| n >= 3.0),
        "{text}"
    );

    cluster.start_again();
    let ready = wait_database(admin, "up");
    assert_eq!(ready.status, 200, "{ready:?}");
    watch.assert_always_ready("the outage");
    assert_eq!(
        wait_database(follower.admin_addr(), "up").status,
        200,
        "the follower is ready again"
    );
    let response = fresh_get(addr, "/api/links/outage");
    assert_eq!(response.status, 200, "{response:?}");
    assert_eq!(response.json()["hits"], redirects, "{:?}", response.json());
    assert_json_error(
        &fresh_get(addr, "/api/links/during-outage"),
        404,
        "the refused link",
    );
    let text = metrics(admin);
    assert_eq!(
        labelled(&text, r#"lameduck_db_breaker_state{state="closed"}"#),
        Some(1.0),
        "{text}"
    );

    for process in [&mut server, &mut follower] {
        process.signal(Signal::SIGTERM);
        assert_eq!(process.exit_code(PATIENCE), 0, "{}", process.log_text());
    }
    let logs = server.logs();
    let count = |needle: &str| logs.iter().filter(|line| line.contains(needle)).count();
    assert_eq!(count("database unreachable"), 1, "one line per change");
    assert_eq!(count("database up again"), 1, "one line per change");
    let mut sql = Sql::connect(&url);
    assert_eq!(
        sql.count("SELECT CAST(COALESCE(SUM(hits), 0) AS BIGINT) FROM links"),
        redirects
    );
    assert_eq!(sql.count("SELECT count(*) FROM links"), 1);
}

// Gap: a saturated pool read as an outage. Calls that could not get a
// pooled connection marked the database down, and the health probe, which
// took its connection from the same pool, confirmed it: readiness 503 and
// "database unreachable" while the database answered every other session.
// Now a call that gets no connection within the acquire timeout answers
// 503 "busy" with `Retry-After` — only after that timeout — the database
// is reported `busy`, the breaker stays closed, readiness stays 200, and
// everything waiting completes once the lock is gone.
#[test]
fn a_saturated_pool_is_busy_not_down_and_the_service_stays_ready() {
    let cluster = PgCluster::start();
    let url = cluster.url();
    let mut server = LameduckProcess::start(
        &["--database-url", &url, "--database-max-connections", "2"],
        &[],
    );
    let (addr, admin) = (server.addr(), server.admin_addr());
    assert_eq!(post_json(addr, &link_body("busy")).status, 201);
    assert_eq!(fresh_get(addr, "/busy").status, 307);
    // The flusher takes a pooled connection too: let it be done first.
    wait_metric(admin, "lameduck_hits_pending", |pending| pending == 0.0);
    let watch = ReadinessWatch::start(admin);

    let mut lock = Sql::connect(&url);
    lock.execute("BEGIN");
    lock.execute("LOCK TABLE links IN ACCESS EXCLUSIVE MODE");
    let mut blocked = [
        send_create(addr, &link_body("blocked-1")),
        send_create(addr, &link_body("blocked-2")),
    ];
    Sql::connect(&url).wait_lock_waiters(2, PATIENCE, "the two creations");

    let started = Instant::now();
    let response = fresh_get(addr, "/api/links/busy");
    let waited = started.elapsed();
    assert_retry_later(&response, "busy", "a read with the pool saturated");
    assert!(
        waited >= ACQUIRE_TIMEOUT,
        "answered busy after {waited:?}, before the acquire timeout {ACQUIRE_TIMEOUT:?}"
    );
    let ready = fresh_get(admin, "/readyz");
    assert_eq!(ready.status, 200, "{ready:?}");
    assert_eq!(ready.json()["database"], "busy", "{:?}", ready.json());
    let redirect = fresh_get(addr, "/busy");
    assert_eq!(redirect.status, 307, "a cached redirect: {redirect:?}");
    let text = metrics(admin);
    assert_eq!(
        labelled(&text, r#"lameduck_db_breaker_state{state="closed"}"#),
        Some(1.0),
        "{text}"
    );
    assert!(
        metric(&text, "lameduck_db_busy_total").is_some_and(|n| n >= 1.0),
        "{text}"
    );
    assert_eq!(
        labelled(&text, r#"lameduck_db_state{state="busy"}"#),
        Some(1.0),
        "{text}"
    );

    lock.execute("COMMIT");
    for stream in &mut blocked {
        let response = read_response(stream).expect("the blocked creation's answer");
        assert_eq!(response.status, 201, "{response:?}");
    }
    wait_database(admin, "up");
    let response = fresh_get(addr, "/api/links/busy");
    assert_eq!(response.status, 200, "{response:?}");
    assert_eq!(response.json()["hits"], 2, "{:?}", response.json());
    watch.assert_always_ready("the saturated pool");

    server.signal(Signal::SIGTERM);
    assert_eq!(server.exit_code(PATIENCE), 0, "{}", server.log_text());
    let logs = server.log_text();
    assert!(
        !logs.contains("database unreachable"),
        "a saturated pool is not an outage:\n{logs}"
    );
    assert!(logs.contains("database busy"), "{logs}");
    assert_eq!(
        Sql::connect(&url).count("SELECT CAST(COALESCE(SUM(hits), 0) AS BIGINT) FROM links"),
        2
    );
}

// Gap: a creation whose COMMIT reached PostgreSQL and whose answer was lost
// on the way back (the network failed at that moment) was answered "the
// database is unavailable; retry later", though the link had been made: a
// client that retried made a second one, and `load outage` counted a link
// stored that no 201 had announced. Now the answer says the database did
// not confirm it and names where to read whether it exists; the link is
// there, audit row included, and the service goes on creating links.
#[test]
fn a_creation_whose_commit_answer_is_lost_says_so_and_names_the_link() {
    let cluster = PgCluster::start();
    let runtime = tokio::runtime::Runtime::new().expect("a runtime for the relay");
    let relay = runtime
        .block_on(Relay::start(SocketAddr::from((
            [127, 0, 0, 1],
            cluster.port(),
        ))))
        .expect("relay");
    let url = cluster.url().replace(
        &format!(":{}/", cluster.port()),
        &format!(":{}/", relay.addr.port()),
    );
    let mut server = LameduckProcess::start(&["--database-url", &url], &[]);
    let (addr, admin) = (server.addr(), server.admin_addr());
    assert_eq!(post_json(addr, &link_body("confirmed")).status, 201);

    relay.lose_next_commit_answer();
    let response = post_json(addr, r#"{"url":"https://example.com/unconfirmed"}"#);
    let message = assert_json_error(&response, 503, "a creation whose commit answer was lost");
    assert_eq!(relay.commit_answers_lost(), 1, "{response:?}");
    assert!(message.contains("did not confirm"), "{message:?}");
    assert_eq!(response.header("retry-after"), Some("1"), "{response:?}");
    let location = response.json()["location"]
        .as_str()
        .unwrap_or_else(|| panic!("no location: {response:?}"))
        .to_owned();
    let code = location
        .strip_prefix("/api/links/")
        .unwrap_or_else(|| panic!("not a link's path: {location:?}"));
    assert!(message.contains(&location), "{message:?}");

    let mut sql = Sql::connect(&cluster.url());
    assert_eq!(
        sql.count(&format!(
            "SELECT count(*) FROM links WHERE code = '{code}' AND url = 'https://example.com/unconfirmed'"
        )),
        1,
        "the link was committed"
    );
    assert_eq!(
        sql.count(&format!(
            "SELECT count(*) FROM link_audit WHERE code = '{code}'"
        )),
        1,
        "with its audit row, in the same transaction"
    );
    wait_database(admin, "up");
    let read = fresh_get(addr, &location);
    assert_eq!(read.status, 200, "{read:?}");
    assert_eq!(read.json()["url"], "https://example.com/unconfirmed");
    assert_eq!(post_json(addr, &link_body("after")).status, 201);

    server.signal(Signal::SIGTERM);
    assert_eq!(server.exit_code(PATIENCE), 0, "{}", server.log_text());
}
