//! State that is never lost: the write-behind hit counters against the real
//! binary and real signals, on SQLite and on a throwaway PostgreSQL that the
//! tests stop and start under the service.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command as Process, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use lameduck::config::{Cli, Command, ServerConfig};
use lameduck::exit::Exit;
use lameduck::lifecycle::{BoxError, Lifecycle};
use lameduck::links::hits::{self, HitCounter, HitSink};
use lameduck::storage::{Storage, StorageMetrics, StoredLink};
use lameduck::App;
use lameduck_testkit::binary::{KeptAliveClients, LameduckProcess};
use lameduck_testkit::postgres::PgCluster;
use lameduck_writebehind::{Batch, Config, Durability, FinalFlush, Sink};
use nix::sys::signal::Signal;
use sqlx::postgres::PgPoolOptions;
use sqlx::sqlite::SqlitePoolOptions;
use tempfile::TempDir;
use tokio_util::sync::CancellationToken;

const CODES: usize = 10;
const EXIT_WITHIN: Duration = Duration::from_secs(30);

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(10))
        .build()
        .expect("client")
}

async fn create_links(addr: SocketAddr) -> Vec<String> {
    let client = client();
    let mut codes = Vec::new();
    for i in 0..CODES {
        let code = format!("link-{i}");
        let response = client
            .post(format!("http://{addr}/api/links"))
            .json(&serde_json::json!({ "url": format!("https://example.com/{i}"), "code": code }))
            .send()
            .await
            .expect("create");
        assert_eq!(response.status(), 201);
        codes.push(code);
    }
    codes
}

/// Sends up to `total` redirects from `clients` concurrent keep-alive
/// clients until the server stops answering; returns how many were answered
/// 307. Calls `at_half` once, when half have been answered.
async fn redirect_storm(
    addr: SocketAddr,
    codes: &[String],
    clients: usize,
    total: usize,
    at_half: impl FnOnce() + Send + 'static,
) -> u64 {
    let answered = Arc::new(AtomicU64::new(0));
    let at_half = Arc::new(std::sync::Mutex::new(Some(at_half)));
    let mut tasks = Vec::new();
    for c in 0..clients {
        let (answered, at_half) = (Arc::clone(&answered), Arc::clone(&at_half));
        let codes = codes.to_vec();
        tasks.push(tokio::spawn(async move {
            let client = client();
            for i in 0..total / clients {
                let code = &codes[(c + i) % codes.len()];
                let Ok(response) = client.get(format!("http://{addr}/{code}")).send().await else {
                    // Refused or reset: the server has stopped accepting.
                    return;
                };
                assert_eq!(response.status(), 307, "every answer is a redirect");
                let n = answered.fetch_add(1, Ordering::SeqCst) + 1;
                if n == (total / 2) as u64 {
                    if let Some(at_half) = at_half.lock().expect("lock").take() {
                        at_half();
                    }
                }
            }
        }));
    }
    for task in tasks {
        task.await.expect("client task");
    }
    answered.load(Ordering::SeqCst)
}

/// `GET /api/links/{code}`, answered 200, as JSON.
async fn link_info(addr: SocketAddr, code: &str) -> serde_json::Value {
    let response = client()
        .get(format!("http://{addr}/api/links/{code}"))
        .send()
        .await
        .expect("GET /api/links/{code}");
    let status = response.status();
    let body: serde_json::Value = response.json().await.expect("JSON");
    assert_eq!(status, reqwest::StatusCode::OK, "{body}");
    body
}

async fn sqlite_total(data_dir: &Path) -> i64 {
    let url = format!("sqlite://{}", data_dir.join("lameduck.db").display());
    let pool = SqlitePoolOptions::new()
        .connect(&url)
        .await
        .expect("open sqlite");
    let total = sqlx::query_scalar("SELECT COALESCE(SUM(hits), 0) FROM links")
        .fetch_one(&pool)
        .await
        .expect("sum");
    pool.close().await;
    total
}

async fn postgres_total(cluster: &PgCluster) -> i64 {
    let pool = PgPoolOptions::new()
        .connect(&cluster.url())
        .await
        .expect("connect");
    let total = sqlx::query_scalar("SELECT CAST(COALESCE(SUM(hits), 0) AS BIGINT) FROM links")
        .fetch_one(&pool)
        .await
        .expect("sum");
    pool.close().await;
    total
}

fn sigterm_at_half(server: &LameduckProcess) -> impl FnOnce() + Send + 'static {
    let pid = server.pid();
    move || nix::sys::signal::kill(pid, Signal::SIGTERM).expect("SIGTERM")
}

/// 5,000 redirects, SIGTERM half-way while many are in flight: every
/// redirect answered 307 is in the database after exit, and nothing more.
async fn every_answered_redirect_is_stored(database_url: Option<&str>) -> (u64, TempDir) {
    let data = TempDir::new().expect("tempdir");
    let data_arg = data.path().display().to_string();
    let mut args = vec!["--data-dir", data_arg.as_str()];
    if let Some(url) = database_url {
        args.extend(["--database-url", url]);
    }
    let mut server = LameduckProcess::start(&args, &[]);
    let codes = create_links(server.addr()).await;
    let answered = redirect_storm(server.addr(), &codes, 50, 5_000, sigterm_at_half(&server)).await;
    assert_eq!(server.exit_code(EXIT_WITHIN), 0, "{}", server.log_text());
    assert!(answered >= 2_500, "only {answered} answered");
    (answered, data)
}

// The write-behind counter's promise on the default database.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_redirect_answered_before_sigterm_is_counted_exactly_on_sqlite() {
    let (answered, data) = every_answered_redirect_is_stored(None).await;
    assert_eq!(sqlite_total(data.path()).await, answered as i64);
}

// The same promise on PostgreSQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_redirect_answered_before_sigterm_is_counted_exactly_on_postgres() {
    let cluster = PgCluster::start();
    let (answered, _data) = every_answered_redirect_is_stored(Some(&cluster.url())).await;
    assert_eq!(postgres_total(&cluster).await, answered as i64);
}

/// Starts the server on `cluster` with hits held in memory (long flush
/// interval) and its spills going to `spill_dir`, serves `redirects`
/// redirects, stops PostgreSQL, then SIGTERM: the hits must be spilled.
/// Returns the spill files.
async fn spill_with_postgres_down(
    cluster: &PgCluster,
    data: &TempDir,
    spill_dir: &Path,
    redirects: usize,
) -> Vec<std::path::PathBuf> {
    let data_arg = data.path().display().to_string();
    let spill_arg = spill_dir.display().to_string();
    let url = cluster.url();
    let mut server = LameduckProcess::start(
        &[
            "--data-dir",
            &data_arg,
            "--spill-dir",
            &spill_arg,
            "--database-url",
            &url,
            "--flush-interval",
            "1h",
        ],
        &[],
    );
    let codes = create_links(server.addr()).await;
    let client = client();
    for i in 0..redirects {
        let response = client
            .get(format!(
                "http://{}/{}",
                server.addr(),
                codes[i % codes.len()]
            ))
            .send()
            .await
            .expect("redirect");
        assert_eq!(response.status(), 307);
    }
    cluster.stop();
    server.signal(Signal::SIGTERM);
    assert_eq!(
        server.exit_code(EXIT_WITHIN),
        i32::from(Exit::StateSpilled.code()),
        "{}",
        server.log_text()
    );
    assert!(
        server.has_logged("hits spilled to disk"),
        "{}",
        server.log_text()
    );
    let files = spill_files(spill_dir);
    assert_eq!(files.len(), 1, "one spill file");
    files
}

// The database is down at the final flush: the hits go to disk, the exit
// code says so, and the next start applies them exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_down_at_shutdown_spills_and_the_next_start_applies_it_exactly_once() {
    let cluster = PgCluster::start();
    let data = TempDir::new().expect("tempdir");
    spill_with_postgres_down(&cluster, &data, &data.path().join("spill"), 300).await;

    cluster.start_again();
    let data_arg = data.path().display().to_string();
    let url = cluster.url();
    let args = [
        "--data-dir",
        data_arg.as_str(),
        "--database-url",
        url.as_str(),
    ];
    for run in 0..2 {
        let mut server = LameduckProcess::start(&args, &[]);
        // Ready means recovered: the replay happens before the listener.
        let info = link_info(server.addr(), "link-0").await;
        assert_eq!(info["hits"], 30, "run {run}");
        assert_eq!(postgres_total(&cluster).await, 300, "run {run}");
        assert!(
            spill_files(&data.path().join("spill")).is_empty(),
            "spill removed"
        );
        server.signal(Signal::SIGTERM);
        assert_eq!(server.exit_code(EXIT_WITHIN), 0);
    }
}

// A crash in the middle of the replay (SIGKILL while its transaction waits
// on a lock) must neither lose the spill nor count it twice later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_during_replay_still_ends_with_exact_totals() {
    let cluster = PgCluster::start();
    let data = TempDir::new().expect("tempdir");
    spill_with_postgres_down(&cluster, &data, &data.path().join("spill"), 200).await;
    cluster.start_again();

    let admin = PgPoolOptions::new()
        .max_connections(2)
        .connect(&cluster.url())
        .await
        .expect("admin");
    let mut lock = admin.begin().await.expect("begin");
    sqlx::query("LOCK TABLE links IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *lock)
        .await
        .expect("lock");

    let data_arg = data.path().display().to_string();
    let url = cluster.url();
    let mut replaying = Process::new(env!("CARGO_BIN_EXE_lameduck"))
        .args([
            "server",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
            "--data-dir",
            &data_arg,
            "--database-url",
            &url,
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    let started = Instant::now();
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'lameduck' AND wait_event_type = 'Lock'",
        )
        .fetch_one(&admin)
        .await
        .expect("activity");
        if waiting > 0 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "replay never blocked"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    replaying.kill().expect("SIGKILL mid-replay");
    replaying.wait().expect("reap");
    lock.rollback().await.expect("unlock");

    assert_eq!(
        spill_files(&data.path().join("spill")).len(),
        1,
        "spill kept"
    );
    let mut server =
        LameduckProcess::start(&["--data-dir", &data_arg, "--database-url", &url], &[]);
    assert_eq!(postgres_total(&cluster).await, 200);
    assert!(spill_files(&data.path().join("spill")).is_empty());
    server.signal(Signal::SIGTERM);
    assert_eq!(server.exit_code(EXIT_WITHIN), 0);
}

fn server_config(data: &TempDir) -> ServerConfig {
    let data_dir = data.path().display().to_string();
    let argv = [
        "lameduck",
        "server",
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
        "--data-dir",
        &data_dir,
    ];
    match Cli::try_parse_from(argv).expect("arguments").command {
        Command::Server(config) => config,
        _ => unreachable!("server"),
    }
}

// A spill file replayed after its batches already landed (a crash between
// the commit and the file's removal) changes nothing.
#[tokio::test]
async fn replaying_a_spill_whose_batches_already_landed_counts_nothing_twice() {
    let data = TempDir::new().expect("tempdir");
    let app = App::build(server_config(&data), Lifecycle::new())
        .await
        .expect("app");
    let storage = app.into_parts().storage;
    let link = StoredLink {
        code: "abc".to_owned(),
        url: "https://example.com/".to_owned(),
        hits: 0,
        created_at: "2026-01-01T00:00:00.000Z".to_owned(),
    };
    storage
        .insert_link(&link, &CancellationToken::new())
        .await
        .expect("insert");
    let batch = HashMap::from([("abc".to_owned(), 7)]);
    let path = write_spill(data.path(), std::slice::from_ref(&batch)).await;
    let copy = std::fs::read(&path).expect("read");

    let replay = || async {
        memory_counter(data.path())
            .replay(&HitSink(storage.clone()))
            .await
            .expect("replay")
    };
    let first = replay().await;
    assert_eq!(
        (first.files, first.batches, first.already_applied),
        (1, 1, 0)
    );
    std::fs::write(&path, copy).expect("put the file back, as if the removal never happened");
    let second = replay().await;
    assert_eq!(
        (second.files, second.batches, second.already_applied),
        (1, 0, 1)
    );
    assert_eq!(storage.total_hits().await.expect("total"), 7);
}

/// Batches over the same links applied at once, as two replicas' flushes
/// and a spill replay may be, each listing its rows in its own order:
/// every one lands (none is picked as a deadlock victim on PostgreSQL,
/// none times out on SQLite's write lock) and every link ends with exactly
/// its hits.
async fn batches_applied_at_once_all_land_exactly(database_url: Option<&str>) {
    const LINKS: usize = 300;
    const WRITERS: usize = 8;
    const BATCHES: u64 = 4;
    let data = TempDir::new().expect("tempdir");
    let storage = Storage::open(database_url, data.path(), 8, StorageMetrics::default())
        .await
        .expect("storage");
    let never = CancellationToken::new();
    for n in 0..LINKS {
        let link = StoredLink {
            code: format!("c{n}"),
            url: format!("https://example.com/{n}"),
            hits: 0,
            created_at: "2026-01-01T00:00:00.000Z".to_owned(),
        };
        storage.insert_link(&link, &never).await.expect("insert");
    }
    let start = Arc::new(tokio::sync::Barrier::new(WRITERS));
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let (storage, start) = (storage.clone(), Arc::clone(&start));
            tokio::spawn(async move {
                // Link n gets n + 1 hits from every batch; each writer lists
                // them from another place, half of them backwards.
                let mut rows: Vec<(String, u64)> = (0..LINKS)
                    .map(|n| (format!("c{n}"), n as u64 + 1))
                    .collect();
                rows.rotate_left(w * LINKS / WRITERS);
                if w % 2 == 1 {
                    rows.reverse();
                }
                start.wait().await;
                for b in 0..BATCHES {
                    let applied = storage.apply_hits(&format!("w{w}-b{b}"), &rows).await;
                    assert!(applied.expect("every batch lands"), "w{w}-b{b} was new");
                }
            })
        })
        .collect();
    for writer in writers {
        writer.await.expect("writer");
    }
    let batches = WRITERS as u64 * BATCHES;
    for n in 0..LINKS {
        let link = storage.find_link(&format!("c{n}")).await.expect("read");
        let hits = u64::try_from(link.expect("the link").hits).expect("hits ≥ 0");
        assert_eq!(hits, (n as u64 + 1) * batches, "c{n}");
    }
    storage.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_applied_at_once_all_land_exactly_on_sqlite() {
    batches_applied_at_once_all_land_exactly(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_applied_at_once_all_land_exactly_on_postgres() {
    let cluster = PgCluster::start();
    batches_applied_at_once_all_land_exactly(Some(&cluster.url())).await;
}

// A critical worker that fails takes the process down with its own exit
// code, and the final flush still runs after the drain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_critical_worker_shuts_down_with_its_code_and_the_final_flush_still_runs() {
    let data = TempDir::new().expect("tempdir");
    let mut config = server_config(&data);
    config.flush_interval = Duration::from_secs(3600);
    let mut app = App::build(config, Lifecycle::new()).await.expect("app");
    let (fail, failed) = tokio::sync::oneshot::channel::<()>();
    app.workers_mut()
        .spawn_critical("doomed", Duration::from_secs(1), |_token| async move {
            let _ = failed.await;
            Err::<(), BoxError>("the disk is on fire".into())
        });
    let addr = app.local_addr();
    let running = tokio::spawn(app.run());

    let codes = create_links(addr).await;
    let client = client();
    for code in &codes {
        let response = client
            .get(format!("http://{addr}/{code}"))
            .send()
            .await
            .expect("redirect");
        assert_eq!(response.status(), 307);
    }
    fail.send(()).expect("worker waiting");
    let report = running.await.expect("run");
    assert_eq!(Exit::from_report(&report), Exit::WorkerFailed);
    assert_eq!(
        report.drain.reason.as_deref(),
        Some("critical worker doomed failed")
    );
    assert_eq!(
        sqlite_total(data.path()).await,
        CODES as i64,
        "final flush ran"
    );
}

/// `--data-dir`, `--spill-dir`, `--database-url` and a long flush interval.
fn shared_spill_args(data: &TempDir, spill: &TempDir, cluster: &PgCluster) -> Vec<String> {
    [
        "--data-dir",
        &data.path().display().to_string(),
        "--spill-dir",
        &spill.path().display().to_string(),
        "--database-url",
        &cluster.url(),
        "--flush-interval",
        "1h",
    ]
    .iter()
    .map(|arg| (*arg).to_owned())
    .collect()
}

fn as_strs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

// Gap: in containers the replacement is a new pod with a new volume, so a
// spill is only safe if a process that will apply it can see it. Replica A
// spills into the shared directory (PostgreSQL down at its SIGTERM); B,
// already running, applies it once the database is back, with no restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_replica_applies_the_spill_another_replica_left_in_the_shared_directory() {
    let cluster = PgCluster::start();
    let shared = TempDir::new().expect("spill dir");
    let (data_a, data_b) = (TempDir::new().expect("a"), TempDir::new().expect("b"));
    let args_b = shared_spill_args(&data_b, &shared, &cluster);
    let mut b = LameduckProcess::start(&as_strs(&args_b), &[]);
    // Replica A: 200 redirects, PostgreSQL down at its SIGTERM, a spill.
    spill_with_postgres_down(&cluster, &data_a, shared.path(), 200).await;

    cluster.start_again();
    assert!(
        b.wait_for_log("applied spilled hits", Duration::from_secs(30)),
        "B never applied A's spill:\n{}",
        b.log_text()
    );
    assert!(spill_files(shared.path()).is_empty());
    assert_eq!(postgres_total(&cluster).await, 200);
    // B's health probe saw the database go away; the spill B applied
    // reached it, which marks it reachable at once: B reads it again
    // without waiting for its next probe.
    let info = link_info(b.addr(), "link-0").await;
    assert_eq!(info["hits"], 20);
    b.signal(Signal::SIGTERM);
    assert_eq!(b.exit_code(EXIT_WITHIN), 0, "{}", b.log_text());
}

// Two replicas replaying one spill file at the same moment: both are held
// at their first batch by a lock on `hit_batches`, released together, and
// then race through every batch. The batch ids make it exactly once: the
// total is the file's, and the two processes' applied counts add up to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_replaying_one_spill_at_the_same_moment_apply_it_exactly_once() {
    const BATCHES: u64 = 300;
    let cluster = PgCluster::start();
    let shared = TempDir::new().expect("spill dir");
    let data = [TempDir::new().expect("a"), TempDir::new().expect("b")];
    // The links, created by a first run (which also migrates).
    let args = shared_spill_args(&data[0], &shared, &cluster);
    let mut first = LameduckProcess::start(&as_strs(&args), &[]);
    let codes = create_links(first.addr()).await;
    first.signal(Signal::SIGTERM);
    assert_eq!(first.exit_code(EXIT_WITHIN), 0);

    let batches: Vec<HashMap<String, u64>> = (0..BATCHES)
        .map(|i| codes.iter().map(|code| (code.clone(), i % 3 + 1)).collect())
        .collect();
    let total: u64 = batches.iter().flat_map(HashMap::values).sum();
    write_spill(shared.path(), &batches).await;

    let admin = PgPoolOptions::new()
        .connect(&cluster.url())
        .await
        .expect("admin");
    let mut lock = admin.begin().await.expect("begin");
    sqlx::query("LOCK TABLE hit_batches IN EXCLUSIVE MODE")
        .execute(&mut *lock)
        .await
        .expect("lock");
    let replicas: Vec<_> = data
        .iter()
        .map(|dir| {
            let args = shared_spill_args(dir, &shared, &cluster);
            std::thread::spawn(move || LameduckProcess::start(&as_strs(&args), &[]))
        })
        .collect();
    let waiting = "SELECT count(*) FROM pg_stat_activity \
                   WHERE application_name = 'lameduck' AND wait_event_type = 'Lock'";
    let deadline = Instant::now() + Duration::from_secs(30);
    while sqlx::query_scalar::<_, i64>(waiting)
        .fetch_one(&admin)
        .await
        .expect("pg_stat_activity")
        < 2
    {
        assert!(Instant::now() < deadline, "both replays never waited");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    lock.rollback().await.expect("release both at once");

    let mut applied = 0;
    for replica in replicas {
        let mut replica = replica.join().expect("started");
        let line = replica
            .logs()
            .into_iter()
            .find(|line| line.contains("applied spilled hits"));
        if let Some(line) = line {
            applied += line
                .split_whitespace()
                .find_map(|field| field.strip_prefix("batches="))
                .and_then(|n| n.parse::<u64>().ok())
                .expect("batches=N");
        }
        replica.signal(Signal::SIGTERM);
        assert_eq!(replica.exit_code(EXIT_WITHIN), 0, "{}", replica.log_text());
    }
    assert_eq!(
        applied, BATCHES,
        "every batch applied by exactly one replica"
    );
    assert_eq!(
        postgres_total(&cluster).await,
        i64::try_from(total).expect("small")
    );
    assert!(spill_files(shared.path()).is_empty());
}

// A spill directory that cannot take a file fails the start, naming it,
// instead of failing the exit that would need it.
#[test]
fn an_unwritable_spill_directory_fails_the_start_and_names_it() {
    let holder = TempDir::new().expect("tempdir");
    let file = holder.path().join("a-file");
    std::fs::write(&file, b"not a directory").expect("write");
    let spill_dir = file.join("spill");
    let spill_arg = spill_dir.display().to_string();
    let finished =
        lameduck_testkit::binary::run(&["--spill-dir", &spill_arg], &[], Duration::from_secs(30));
    assert_eq!(
        finished.status.code(),
        Some(i32::from(Exit::Startup.code()))
    );
    assert!(
        finished
            .output()
            .contains(&format!("the spill directory {spill_arg} is not writable")),
        "{}",
        finished.output()
    );
}

/// The spill files in `dir`.
fn spill_files(dir: &Path) -> Vec<PathBuf> {
    files_ending(dir, "spill")
}

/// The files in `dir` whose extension is `extension`, sorted.
fn files_ending(dir: &Path, extension: &str) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<_> = entries
        .map(|entry| entry.expect("entry").path())
        .filter(|path| path.extension().is_some_and(|e| e == extension))
        .collect();
    files.sort();
    files
}

/// `n` redirects on one keep-alive connection, each answered 307.
fn redirects(addr: SocketAddr, codes: &[String], n: usize) {
    let mut stream = lameduck_testkit::binary::connect(addr);
    for i in 0..n {
        let response =
            lameduck_testkit::binary::get(&mut stream, &format!("/{}", codes[i % codes.len()]))
                .expect("a redirect");
        assert_eq!(response.status, 307);
    }
}

/// The records of a journal segment, as its documented format lays them
/// out: after a 16-byte header, `len:u32 crc:u32 body`, up to a zero
/// length. Returns each record's offset and body length.
fn journal_records(bytes: &[u8]) -> Vec<(usize, usize)> {
    let mut records = Vec::new();
    let mut at = 16;
    while at + 4 <= bytes.len() {
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes")) as usize;
        if len == 0 {
            break;
        }
        records.push((at, len));
        at += 8 + len;
    }
    records
}

/// Hit counters in `dir` that keep nothing on disk but spills.
fn memory_counter(dir: &Path) -> HitCounter {
    let mut config = Config::new(hits::NAME, dir);
    config.durability = Durability::Memory;
    HitCounter::open(config).expect("open the counters")
}

/// A store that is down.
struct Refusing;

impl Sink<String, u64> for Refusing {
    type Error = std::io::Error;

    async fn apply(
        &self,
        _: &Batch<String, u64>,
    ) -> Result<lameduck_writebehind::Applied, Self::Error> {
        Err(std::io::Error::other("the store is down"))
    }
}

/// Writes a spill file of `batches` (hits per code) into `dir` as a process
/// does at exit with the database down: each batch sealed by a flush the
/// store refused, then every batch spilled. Returns the file.
async fn write_spill(dir: &Path, batches: &[HashMap<String, u64>]) -> std::path::PathBuf {
    let counter = memory_counter(dir);
    for batch in batches {
        for (code, n) in batch {
            counter.record(code.as_str(), *n);
        }
        counter.flush(&Refusing).await.expect_err("refused");
    }
    match counter.spill_now() {
        Ok(Some(FinalFlush::Spilled { path, .. })) => path,
        other => panic!("spilled: {other:?}"),
    }
}

// SIGKILL under redirect load, ten times, with the default durability (the
// journal): every redirect answered before the kill is counted after the
// restarts, and the only excess is requests the kill cut (recorded, then
// killed before the response went out). Each start applies the journal
// its killed predecessor left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_under_redirect_load_loses_no_answered_hit() {
    const ROUNDS: u64 = 10;
    let data = TempDir::new().expect("data dir");
    let data_arg = data.path().display().to_string();
    let args = ["--data-dir", data_arg.as_str()];
    let mut codes = Vec::new();
    let (mut answered, mut cut) = (0, 0);
    for round in 0..ROUNDS {
        let mut server = LameduckProcess::start(&args, &[]);
        if round == 0 {
            codes = create_links(server.addr()).await;
        } else {
            assert!(
                server.has_logged("applied spilled hits"),
                "round {round}: the killed process's journal was not applied:\n{}",
                server.log_text()
            );
        }
        let clients = KeptAliveClients::start(server.addr(), &codes, 4);
        // A different moment of the flush interval each round.
        let target = 1_000 + round * 701;
        let deadline = Instant::now() + Duration::from_secs(60);
        while clients.answered() < target {
            assert!(Instant::now() < deadline, "round {round}: too slow");
            std::thread::sleep(Duration::from_millis(5));
        }
        server.signal(Signal::SIGKILL);
        let _ = server.wait_exit(EXIT_WITHIN).expect("killed");
        let (round_answered, round_cut) = clients.join();
        answered += round_answered;
        cut += round_cut;
    }
    let mut last = LameduckProcess::start(&args, &[]);
    assert!(
        last.has_logged("applied spilled hits"),
        "{}",
        last.log_text()
    );
    last.signal(Signal::SIGTERM);
    assert_eq!(last.exit_code(EXIT_WITHIN), 0, "{}", last.log_text());
    let stored = u64::try_from(sqlite_total(data.path()).await).expect("positive");
    lameduck_testkit::binary::assert_kill_bound(stored, answered, cut);
}

// A journal damaged after a SIGKILL, both ways a record can be: one with a
// bad checksum, and the segment cut in the middle of its last record. The
// next start skips those two, says where (file and offset) in a log line
// and in a metric, and applies every other record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn torn_journal_records_are_skipped_counted_and_logged_and_the_rest_applied() {
    const REDIRECTS: usize = 200;
    let data = TempDir::new().expect("data dir");
    let data_arg = data.path().display().to_string();
    let args = [
        "--data-dir",
        &data_arg,
        "--log-format",
        "json",
        "--flush-interval",
        "1h",
    ];
    let mut server = LameduckProcess::start(&args, &[]);
    let codes = create_links(server.addr()).await;
    redirects(server.addr(), &codes, REDIRECTS);
    server.signal(Signal::SIGKILL);
    let _ = server.wait_exit(EXIT_WITHIN).expect("killed");

    // The segment with the most records: its first gets a bad checksum,
    // its last is cut in half.
    let segments = files_ending(&data.path().join("spill"), "seg");
    let (segment, bytes, records) = segments
        .iter()
        .map(|path| {
            let bytes = std::fs::read(path).expect("read a segment");
            let records = journal_records(&bytes);
            (path, bytes, records)
        })
        .max_by_key(|(_, _, records)| records.len())
        .expect("the killed process's journal");
    assert!(records.len() >= 2, "{segment:?}: {records:?}");
    let (first, first_len) = records[0];
    let (last, _) = records[records.len() - 1];
    let mut damaged = bytes;
    damaged[first + 8 + first_len - 1] ^= 0xff;
    damaged.truncate(last + 10);
    std::fs::write(segment, &damaged).expect("damage the segment");

    let mut restarted = LameduckProcess::start(&args, &[]);
    let torn: Vec<serde_json::Value> = restarted
        .logs()
        .iter()
        .filter(|line| line.contains("a torn record was skipped"))
        .map(|line| serde_json::from_str(line).expect("JSON"))
        .collect();
    let mut offsets: Vec<u64> = torn
        .iter()
        .map(|line| line["offset"].as_u64().expect("offset"))
        .collect();
    offsets.sort_unstable();
    assert_eq!(offsets, [first as u64, last as u64], "{torn:?}");
    for line in &torn {
        assert_eq!(line["path"], segment.display().to_string(), "{line}");
    }
    let metrics = lameduck_testkit::binary::metrics(restarted.admin_addr());
    assert_eq!(
        lameduck_testkit::binary::metric(&metrics, "lameduck_hits_journal_torn_records_total"),
        Some(2.0),
        "{metrics}"
    );
    restarted.signal(Signal::SIGTERM);
    assert_eq!(
        restarted.exit_code(EXIT_WITHIN),
        0,
        "{}",
        restarted.log_text()
    );
    // One hit a record: the two skipped ones are the only ones missing.
    assert_eq!(sqlite_total(data.path()).await, REDIRECTS as i64 - 2);
}

// Two replicas sharing the spill directory, one SIGKILLed: the other, still
// running, finds the dead one's journal at its next scan and applies it;
// the killed replica, restarted on the same directory, finds nothing left
// to apply. Exactly once, whoever gets there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_replica_applies_the_journal_of_one_killed_beside_it_exactly_once() {
    const REDIRECTS: usize = 300;
    let cluster = PgCluster::start();
    let shared = TempDir::new().expect("spill dir");
    let (data_a, data_b) = (TempDir::new().expect("a"), TempDir::new().expect("b"));
    let args_a = shared_spill_args(&data_a, &shared, &cluster);
    let args_b = shared_spill_args(&data_b, &shared, &cluster);
    let mut a = LameduckProcess::start(&as_strs(&args_a), &[]);
    // A's instance: the name of the one ledger, made as it started.
    let [ledger] = &files_ending(shared.path(), "ledger")[..] else {
        panic!("one ledger: A's");
    };
    let a_instance = ledger
        .file_stem()
        .and_then(|stem| stem.to_str()?.strip_prefix("hits."))
        .expect("hits.<instance>.ledger")
        .to_owned();
    let mut b = LameduckProcess::start(&as_strs(&args_b), &[]);
    let codes = create_links(a.addr()).await;
    redirects(a.addr(), &codes, REDIRECTS);
    a.signal(Signal::SIGKILL);
    let _ = a.wait_exit(EXIT_WITHIN).expect("killed");

    assert!(
        b.wait_for_log("applied spilled hits", Duration::from_secs(30)),
        "B never applied A's journal:\n{}",
        b.log_text()
    );
    assert_eq!(postgres_total(&cluster).await, REDIRECTS as i64);
    let left: Vec<_> = std::fs::read_dir(shared.path())
        .expect("the spill dir")
        .map(|entry| entry.expect("entry").file_name())
        .filter(|name| name.to_string_lossy().contains(&a_instance))
        .collect();
    assert!(
        left.is_empty(),
        "A's journal is gone once applied: {left:?}"
    );

    let mut restarted = LameduckProcess::start(&as_strs(&args_a), &[]);
    assert!(
        !restarted.has_logged("applied spilled hits"),
        "{}",
        restarted.log_text()
    );
    for replica in [&mut restarted, &mut b] {
        replica.signal(Signal::SIGTERM);
        assert_eq!(replica.exit_code(EXIT_WITHIN), 0, "{}", replica.log_text());
    }
    assert_eq!(postgres_total(&cluster).await, REDIRECTS as i64);
}
