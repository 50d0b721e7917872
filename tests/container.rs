//! The container image, built from the real Dockerfile and run for real.
//!
//! 1. `scripts/docker-base-images.sh` makes local stand-ins for the base
//!    images (no registry is reachable from the test machines), then the
//!    unmodified Dockerfile is built; its build time is printed. The image
//!    weighs at most 50 MB, and a panic in it (tokio's runtime builder,
//!    refusing `TOKIO_WORKER_THREADS=0`) prints a backtrace naming the
//!    service's functions; given the line tables from the `debuginfo`
//!    stage, next to the binary, the same backtrace names files and lines.
//! 2. One container: `/healthz` answers on the published port, Docker's
//!    HEALTHCHECK (`lameduck healthcheck`) turns it healthy, it runs as a
//!    non-root user, and `docker stop` in the middle of a slowly uploaded
//!    POST lets that request finish with 201 and the container exit 0 well
//!    inside Docker's 10 s stop timeout.
//! 3. A rolling replacement: two app containers behind an HAProxy container
//!    (health-checking `/readyz`) on a network of the test's own, constant
//!    traffic from the test through the load balancer, and each app replaced
//!    in turn (start the new one, wait until it is healthy, add it to the
//!    load balancer, stop the old one): not one request may fail.
//! 4. Spills cross containers: a container forced to exit (a second
//!    `docker kill --signal TERM` during its lame duck) spills its pending
//!    hits to the named volume on `/spill`; the next container, given the
//!    same named volumes, applies them: the hits are exact.
//!
//! Without a Docker engine the tests print one line and pass. Everything the
//! tests create (containers with their anonymous volumes, named volumes, the
//! network, temp files) is removed again, also when a test fails; the images stay, so the
//! next run reuses their layers. Traffic goes only to ports published on
//! 127.0.0.1 and, between containers, within the test's network; every loop
//! is bounded in count and time.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command as StdCommand, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::process::Command;
use tokio::sync::OnceCell;

use lameduck_testkit::binary::{assert_kill_bound, create_link, KeptAliveClients};
use lameduck_testkit::haproxy::{RuntimeApi, StatRow};
use lameduck_testkit::traffic::{Kind, Plan};

/// The tag the test builds the Dockerfile under (re-used run after run).
const IMAGE: &str = "lameduck:container-test";
/// The Dockerfile's build stage, tagged to keep it cached between runs.
const BUILD_STAGE_IMAGE: &str = "lameduck:container-test-build";
/// The Dockerfile's `debuginfo` stage: the binary's line tables alone.
const DEBUGINFO_IMAGE: &str = "lameduck:container-test-debuginfo";
/// The most the image may weigh: every deploy pulls it, every in-place
/// upgrade runs it.
const IMAGE_SIZE_LIMIT: u64 = 50_000_000;
/// The load balancer image `scripts/docker-base-images.sh haproxy` makes.
const HAPROXY_IMAGE: &str = "stand-in/haproxy:bookworm";
/// The port the image's server listens on (its `EXPOSE`).
const APP_PORT: u16 = 8080;
/// Docker's default `docker stop` timeout, after which it sends SIGKILL.
const DOCKER_STOP_TIMEOUT: Duration = Duration::from_secs(10);

// --- docker ------------------------------------------------------------------

/// Runs `docker ARGS`; its trimmed stdout, or a message with its stderr.
async fn try_docker(args: &[&str]) -> Result<String, String> {
    let output = Command::new("docker")
        .args(args)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|e| format!("cannot run docker {}: {e}", args.join(" ")))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
    } else {
        Err(format!(
            "docker {} failed ({}): {}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

async fn docker(args: &[&str]) -> String {
    try_docker(args).await.unwrap_or_else(|e| panic!("{e}"))
}

/// Whether a Docker engine answers; prints the skip line (once) when not.
async fn engine_available() -> bool {
    static AVAILABLE: OnceCell<bool> = OnceCell::const_new();
    *AVAILABLE
        .get_or_init(|| async {
            let info = Command::new("docker")
                .args(["info", "--format", "{{.ServerVersion}}"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .kill_on_drop(true)
                .status();
            let answers = matches!(
                tokio::time::timeout(Duration::from_secs(30), info).await,
                Ok(Ok(status)) if status.success()
            );
            if !answers {
                println!("docker engine not available: container tests skipped");
            }
            answers
        })
        .await
}

/// A name no other run's resources have.
fn unique(label: &str) -> String {
    format!("lameduck-test-{}-{label}", std::process::id())
}

/// What a test created, removed on drop, also when the test panics (with
/// the containers' last log lines printed first, to show why).
#[derive(Default)]
struct Resources {
    containers: Mutex<Vec<String>>,
    networks: Mutex<Vec<String>>,
    volumes: Mutex<Vec<String>>,
}

impl Resources {
    /// Registers a container name before it is created, so that a half
    /// created container is removed too.
    fn container(&self, name: &str) -> String {
        self.containers
            .lock()
            .expect("resource list")
            .push(name.to_owned());
        name.to_owned()
    }

    fn network(&self, name: &str) -> String {
        self.networks
            .lock()
            .expect("resource list")
            .push(name.to_owned());
        name.to_owned()
    }

    /// A named volume, created by the first `docker run` that mounts it.
    fn volume(&self, name: &str) -> String {
        self.volumes
            .lock()
            .expect("resource list")
            .push(name.to_owned());
        name.to_owned()
    }
}

impl Drop for Resources {
    fn drop(&mut self) {
        let run = |args: &[&str]| {
            StdCommand::new("docker")
                .args(args)
                .stdin(Stdio::null())
                .output()
        };
        let containers =
            std::mem::take(&mut *self.containers.lock().unwrap_or_else(|e| e.into_inner()));
        for name in containers.iter().rev() {
            if std::thread::panicking() {
                if let Ok(output) = run(&["logs", "--tail", "25", name]) {
                    eprintln!(
                        "--- last log lines of {name} ---\n{}{}",
                        String::from_utf8_lossy(&output.stdout),
                        String::from_utf8_lossy(&output.stderr)
                    );
                }
            }
            // -v: the anonymous volume the image's VOLUME /data made.
            let _ = run(&["rm", "--force", "--volumes", name]);
        }
        let networks =
            std::mem::take(&mut *self.networks.lock().unwrap_or_else(|e| e.into_inner()));
        for name in networks.iter().rev() {
            let _ = run(&["network", "rm", name]);
        }
        let volumes = std::mem::take(&mut *self.volumes.lock().unwrap_or_else(|e| e.into_inner()));
        for name in &volumes {
            let _ = run(&["volume", "rm", "--force", name]);
        }
    }
}

/// Everything the container wrote, stdout and stderr.
async fn container_logs(name: &str) -> String {
    let output = Command::new("docker")
        .args(["logs", name])
        .stdin(Stdio::null())
        .output()
        .await
        .expect("docker logs");
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// `docker port NAME PORT/tcp` as an address on 127.0.0.1.
async fn published(name: &str, port: u16) -> SocketAddr {
    let mapping = docker(&["port", name, &format!("{port}/tcp")]).await;
    let addr: SocketAddr = mapping
        .lines()
        .find_map(|line| line.trim().parse().ok())
        .unwrap_or_else(|| panic!("cannot read the published port of {name}: {mapping:?}"));
    assert!(
        addr.ip().is_loopback(),
        "{name} must publish on 127.0.0.1 only: {addr}"
    );
    addr
}

async fn inspect(name: &str, format: &str) -> String {
    docker(&["inspect", "--format", format, name]).await
}

/// Waits (bounded) until Docker's health check reports the container healthy.
async fn wait_healthy(name: &str, limit: Duration) -> Duration {
    let start = Instant::now();
    loop {
        let state = inspect(
            name,
            "{{.State.Status}} {{if .State.Health}}{{.State.Health.Status}}{{else}}none{{end}}",
        )
        .await;
        match state.as_str() {
            "running healthy" => return start.elapsed(),
            "running starting" | "running unhealthy" | "created none" | "created starting" => {}
            other => panic!("{name} is not coming up: {other}"),
        }
        assert!(
            start.elapsed() < limit,
            "{name} not healthy after {limit:?} (state: {state}); last health check: {}",
            inspect(name, "{{json .State.Health}}").await
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// `docker stop` with Docker's default timeout, timed; asserts exit code 0.
async fn stop_cleanly(name: &str) -> Duration {
    let start = Instant::now();
    docker(&[
        "stop",
        "--time",
        &DOCKER_STOP_TIMEOUT.as_secs().to_string(),
        name,
    ])
    .await;
    let took = start.elapsed();
    let exit = inspect(name, "{{.State.ExitCode}} {{.State.OOMKilled}}").await;
    assert_eq!(
        exit,
        "0 false",
        "{name} should exit 0 on SIGTERM (took {took:?}); logs:\n{}",
        container_logs(name).await
    );
    assert!(
        took < DOCKER_STOP_TIMEOUT,
        "{name} took {took:?} to stop: Docker's SIGKILL deadline is {DOCKER_STOP_TIMEOUT:?}"
    );
    took
}

// --- the image ---------------------------------------------------------------

fn repo() -> &'static str {
    env!("CARGO_MANIFEST_DIR")
}

/// The ID of an image, if it exists.
fn image_id(image: &str) -> Option<String> {
    let output = StdCommand::new("docker")
        .args(["image", "inspect", "--format", "{{.Id}}", image])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

static IMAGE_BUILT: OnceCell<Result<(), String>> = OnceCell::const_new();
/// The two tests share the engine and the two cores: one at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A test's turn with the engine and the built image; `None` (the test
/// passes) without an engine.
async fn take_turn() -> Option<tokio::sync::MutexGuard<'static, ()>> {
    if !engine_available().await {
        return None;
    }
    let turn = ONE_AT_A_TIME.lock().await;
    image().await;
    Some(turn)
}

/// Base images, then the Dockerfile, once per test binary.
async fn image() {
    let built = IMAGE_BUILT.get_or_init(build_image).await;
    if let Err(e) = built {
        panic!("{e}");
    }
}

async fn build_image() -> Result<(), String> {
    // Local stand-ins for the Dockerfile's base images, and the load balancer.
    let start = Instant::now();
    let output = Command::new("bash")
        .args([
            "scripts/docker-base-images.sh",
            "builder",
            "runtime",
            "haproxy",
        ])
        .current_dir(repo())
        .stdin(Stdio::null())
        .output()
        .await
        .map_err(|e| format!("cannot run scripts/docker-base-images.sh: {e}"))?;
    print!("{}", String::from_utf8_lossy(&output.stdout));
    if !output.status.success() {
        return Err(format!(
            "scripts/docker-base-images.sh failed ({}):\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    println!("base images ready in {:.1?}", start.elapsed());

    // The Dockerfile builds with the classic builder and with BuildKit; a
    // client without the buildx plugin can only use the classic one.
    let buildx = Command::new("docker")
        .args(["buildx", "version"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .await
        .is_ok_and(|status| status.success());
    // The build stage is tagged too, so that it (and the dependency layer
    // under it) stays cached, and what a previous run built can be removed
    // instead of piling up as untagged images.
    let previous: Vec<String> = [IMAGE, BUILD_STAGE_IMAGE, DEBUGINFO_IMAGE]
        .iter()
        .filter_map(|image| image_id(image))
        .collect();
    let start = Instant::now();
    for (target, tag) in [
        ("build", BUILD_STAGE_IMAGE),
        ("debuginfo", DEBUGINFO_IMAGE),
        ("", IMAGE),
    ] {
        let mut args = vec!["build", "--tag", tag, "--file", "Dockerfile"];
        if !target.is_empty() {
            args.extend(["--target", target]);
        }
        args.push(".");
        let output = Command::new("docker")
            .args(&args)
            .env("DOCKER_BUILDKIT", if buildx { "1" } else { "0" })
            .current_dir(repo())
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output()
            .await
            .map_err(|e| format!("cannot run docker build: {e}"))?;
        if !output.status.success() {
            let log = String::from_utf8_lossy(&output.stdout);
            let tail: Vec<&str> = log.lines().rev().take(60).collect();
            return Err(format!(
                "docker {} failed ({}) after {:.1?}:\n{}\n{}",
                args.join(" "),
                output.status,
                start.elapsed(),
                tail.into_iter().rev().collect::<Vec<_>>().join("\n"),
                String::from_utf8_lossy(&output.stderr)
            ));
        }
    }
    let took = start.elapsed();
    let current: Vec<String> = [IMAGE, BUILD_STAGE_IMAGE, DEBUGINFO_IMAGE]
        .iter()
        .filter_map(|image| image_id(image))
        .collect();
    for old in previous.iter().filter(|id| !current.contains(id)) {
        // Fails harmlessly if something still uses it.
        let _ = try_docker(&["image", "rm", old]).await;
    }
    let size: u64 = try_docker(&["image", "inspect", "--format", "{{.Size}}", IMAGE])
        .await?
        .parse()
        .map_err(|e| format!("image size: {e}"))?;
    println!(
        "built {IMAGE} in {took:.1?} ({} builder): {:.1} MB",
        if buildx { "BuildKit" } else { "classic" },
        size as f64 / 1_000_000.0
    );
    Ok(())
}

/// A panic's backtrace, from the image's binary run as the image runs it:
/// `TOKIO_WORKER_THREADS=0` makes tokio's runtime builder panic in `main`,
/// before anything else starts. `debuginfo`, a directory holding
/// `lameduck.debug`, is mounted next to the binary, where its
/// `.gnu_debuglink` is looked for.
async fn panic_backtrace(resources: &Resources, debuginfo: Option<&Path>) -> String {
    let name = resources.container(&unique(if debuginfo.is_some() {
        "backtrace-lines"
    } else {
        "backtrace"
    }));
    let mut args = vec![
        "run".to_owned(),
        "--name".to_owned(),
        name.clone(),
        "--env".to_owned(),
        "TOKIO_WORKER_THREADS=0".to_owned(),
        "--env".to_owned(),
        "RUST_BACKTRACE=1".to_owned(),
    ];
    if let Some(dir) = debuginfo {
        let file = dir.join("lameduck.debug");
        args.extend([
            "--volume".to_owned(),
            format!("{}:/usr/local/bin/lameduck.debug:ro", file.display()),
        ]);
    }
    args.extend([IMAGE.to_owned(), "server".to_owned()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let outcome = try_docker(&args).await;
    let Err(message) = outcome else {
        panic!("the server started with TOKIO_WORKER_THREADS=0; it should have panicked");
    };
    assert!(
        message.contains("(exit status: 101)"),
        "not a panic's exit status: {message}"
    );
    container_logs(&name).await
}

// --- HTTP --------------------------------------------------------------------

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("HTTP client")
}

/// Polls `url` until it answers 200 (bounded).
async fn wait_ok(client: &reqwest::Client, url: &str, limit: Duration) {
    let start = Instant::now();
    loop {
        match client.get(url).send().await {
            Ok(response) if response.status() == reqwest::StatusCode::OK => return,
            Ok(response) if start.elapsed() >= limit => {
                panic!("{url} answers {} after {limit:?}", response.status())
            }
            Err(e) if start.elapsed() >= limit => panic!("{url} unreachable after {limit:?}: {e}"),
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

async fn status_of(client: &reqwest::Client, url: &str) -> Option<u16> {
    client
        .get(url)
        .send()
        .await
        .ok()
        .map(|r| r.status().as_u16())
}

// --- 1: one container ----------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_image_is_small_and_a_panic_in_it_is_named_then_placed_by_its_line_tables() {
    let Some(_turn) = take_turn().await else {
        return;
    };
    let size: u64 = docker(&["image", "inspect", "--format", "{{.Size}}", IMAGE])
        .await
        .parse()
        .expect("image size");
    println!("{IMAGE}: {:.1} MB", size as f64 / 1e6);
    assert!(
        size <= IMAGE_SIZE_LIMIT,
        "the image is {size} bytes, over {IMAGE_SIZE_LIMIT}"
    );

    // The symbol table stayed: the backtrace names the service's functions.
    let resources = Resources::default();
    let backtrace = panic_backtrace(&resources, None).await;
    assert!(
        backtrace.contains("cannot be set to 0") && backtrace.contains("stack backtrace:"),
        "no panic with a backtrace:\n{backtrace}"
    );
    assert!(
        backtrace.contains("lameduck::main"),
        "the backtrace does not name the service's main:\n{backtrace}"
    );
    assert!(
        !backtrace.contains("src/main.rs:"),
        "the image still carries line tables:\n{backtrace}"
    );

    // The line tables went to the `debuginfo` stage; given back, next to
    // the binary, they place each frame in its file and line.
    let stage = resources.container(&unique("debuginfo"));
    docker(&["create", "--name", &stage, DEBUGINFO_IMAGE, "/none"]).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let to = dir.path().display().to_string();
    docker(&["cp", &format!("{stage}:/lameduck.debug"), &to]).await;
    let debuginfo = std::fs::metadata(dir.path().join("lameduck.debug")).expect("lameduck.debug");
    println!("line tables: {:.1} MB", debuginfo.len() as f64 / 1e6);
    let placed = panic_backtrace(&resources, Some(dir.path())).await;
    assert!(
        placed.contains("src/main.rs:"),
        "with its line tables, the backtrace does not place main in src/main.rs:\n{placed}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn container_is_healthy_non_root_and_drains_on_docker_stop() {
    let Some(_turn) = take_turn().await else {
        return;
    };

    // What the image says about itself.
    let config = inspect(
        IMAGE,
        "{{.Config.User}}|{{.Config.StopSignal}}|{{json .Config.Entrypoint}}|{{json .Config.Cmd}}|{{json .Config.Healthcheck.Test}}",
    )
    .await;
    assert_eq!(
        config,
        r#"65532:65532|SIGTERM|["/usr/local/bin/lameduck"]|["server"]|["CMD","/usr/local/bin/lameduck","healthcheck"]"#
    );

    let resources = Resources::default();
    let name = resources.container(&unique("single"));
    let drain_delay = Duration::from_secs(2);
    let started = Instant::now();
    docker(&[
        "run",
        "--detach",
        "--name",
        &name,
        "--publish",
        &format!("127.0.0.1:0:{APP_PORT}"),
        "--env",
        &format!("LAMEDUCK_DRAIN_DELAY={}s", drain_delay.as_secs()),
        "--env",
        "LAMEDUCK_SHUTDOWN_TIMEOUT=5s",
        IMAGE,
    ])
    .await;
    let addr = published(&name, APP_PORT).await;
    let base = format!("http://{addr}");
    let http = client();

    wait_ok(&http, &format!("{base}/healthz"), Duration::from_secs(30)).await;
    println!(
        "/healthz answered 200 {:.1?} after docker run",
        started.elapsed()
    );
    let logs = container_logs(&name).await;
    assert!(
        logs.contains(&format!("listening on http://0.0.0.0:{APP_PORT}")),
        "the server should log where it listens:\n{logs}"
    );

    // The image's own HEALTHCHECK (interval 10s) runs `lameduck healthcheck`.
    let healthy_after = wait_healthy(&name, Duration::from_secs(60)).await;
    println!("docker reports {name} healthy after {healthy_after:.1?}");

    // Non-root: the configured user and the uid the process really runs as.
    assert_eq!(inspect(&name, "{{.Config.User}}").await, "65532:65532");
    let top = docker(&["top", &name, "-eo", "uid,pid,args"]).await;
    let uids: Vec<&str> = top
        .lines()
        .skip(1)
        .filter_map(|line| line.split_whitespace().next())
        .collect();
    assert!(!uids.is_empty(), "docker top shows no process:\n{top}");
    assert!(
        uids.iter().all(|uid| *uid == "65532"),
        "every process in the container runs as uid 65532:\n{top}"
    );
    println!("processes run as uid 65532:\n{top}");

    assert_eq!(status_of(&http, &format!("{base}/readyz")).await, Some(200));

    // A POST whose body arrives slowly, in flight across `docker stop`.
    let body = br#"{"url":"https://example.com/uploaded-while-the-container-stopped"}"#;
    let mut upload = TcpStream::connect(addr).await.expect("connect");
    let head = format!(
        "POST /api/links HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    upload.write_all(head.as_bytes()).await.expect("send head");
    upload.write_all(&body[..1]).await.expect("send first byte");
    // Let the request reach the server through Docker's port proxy.
    tokio::time::sleep(Duration::from_millis(500)).await;

    let stopping = {
        let name = name.clone();
        tokio::spawn(async move { stop_cleanly(&name).await })
    };

    // Lame duck: readiness is 503 while the server still answers.
    let lame_duck_start = Instant::now();
    let mut saw_503 = false;
    while lame_duck_start.elapsed() < drain_delay * 3 / 4 {
        if status_of(&http, &format!("{base}/readyz")).await == Some(503) {
            saw_503 = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        saw_503,
        "/readyz should answer 503 during the lame-duck period"
    );
    println!(
        "/readyz answered 503 {:.1?} after docker stop",
        lame_duck_start.elapsed()
    );

    // The rest of the body, spread past the end of the drain delay, when the
    // listener has closed and only in-flight requests are left.
    let rest = &body[1..];
    let pieces = 12;
    let piece = rest.len().div_ceil(pieces);
    for chunk in rest.chunks(piece) {
        tokio::time::sleep(Duration::from_millis(250)).await;
        upload
            .write_all(chunk)
            .await
            .expect("send a piece of the body");
    }
    let upload_done = lame_duck_start.elapsed();
    let mut response = Vec::new();
    tokio::time::timeout(Duration::from_secs(15), upload.read_to_end(&mut response))
        .await
        .expect("the response within 15s")
        .expect("read the response");
    let response = String::from_utf8_lossy(&response);
    let status_line = response.lines().next().unwrap_or_default();
    assert!(
        status_line.starts_with("HTTP/1.1 201"),
        "the in-flight POST should complete with 201 Created, got:\n{response}"
    );
    assert!(
        upload_done > drain_delay,
        "the upload should have outlasted the drain delay ({upload_done:?} <= {drain_delay:?})"
    );

    let took = stopping.await.expect("docker stop task");
    println!(
        "docker stop: the upload finished {upload_done:.1?} after SIGTERM with {status_line:?}; \
         the container exited 0 after {took:.1?}"
    );
}

// --- 2: rolling replacement behind a load balancer ------------------------------

/// One command on HAProxy's runtime API (its admin socket, published on
/// 127.0.0.1); the answer. A `set` command it refuses fails the test.
async fn haproxy_command(admin: SocketAddr, command: &str) -> String {
    RuntimeApi::tcp(admin)
        .command(command)
        .await
        .unwrap_or_else(|error| panic!("{error}"))
}

/// The load balancer's view of the app slots (`slot1`…) of `apps`, from
/// `show stat`.
async fn haproxy_servers(admin: SocketAddr) -> Vec<StatRow> {
    let rows = RuntimeApi::tcp(admin)
        .show_stat()
        .await
        .unwrap_or_else(|error| panic!("{error}"));
    rows.into_iter()
        .filter(|row| row.proxy == "apps" && row.server.starts_with("slot"))
        .collect()
}

async fn haproxy_server(admin: SocketAddr, slot: &str) -> StatRow {
    haproxy_servers(admin)
        .await
        .into_iter()
        .find(|row| row.server == slot)
        .unwrap_or_else(|| panic!("HAProxy has no server {slot}"))
}

/// Waits (bounded) until the load balancer reports `slot` up, its last
/// health check (`/readyz` at the server's current address) passed.
async fn wait_server_up(admin: SocketAddr, slot: &str, limit: Duration) -> Duration {
    let start = Instant::now();
    loop {
        let stat = haproxy_server(admin, slot).await;
        if stat.status == "UP" && stat.check_status == "L7OK" {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < limit,
            "HAProxy still reports {slot} {stat:?} after {limit:?}, waiting for it to be UP"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The app container's address on the test's network.
async fn network_ip(name: &str, network: &str) -> String {
    let ip = inspect(
        name,
        &format!("{{{{(index .NetworkSettings.Networks \"{network}\").IPAddress}}}}"),
    )
    .await;
    assert!(
        ip.parse::<std::net::IpAddr>().is_ok(),
        "{name} has no address on {network}: {ip:?}"
    );
    ip
}

/// The app as the rolling test runs it: on the test's network only (no
/// published port), health-checked every second instead of every ten.
async fn start_app(
    resources: &Resources,
    network: &str,
    label: &str,
    drain_delay: Duration,
) -> String {
    let name = resources.container(&unique(label));
    docker(&[
        "run",
        "--detach",
        "--name",
        &name,
        "--network",
        network,
        "--health-interval",
        "1s",
        "--health-start-period",
        "10s",
        "--env",
        &format!("LAMEDUCK_DRAIN_DELAY={}ms", drain_delay.as_millis()),
        "--env",
        "LAMEDUCK_SHUTDOWN_TIMEOUT=5s",
        IMAGE,
    ])
    .await;
    name
}

/// HAProxy: checks `/readyz` every 500 ms and takes a server out after two
/// failures, so it notices a draining app within about 1 s. No retries and
/// no redispatch: a request sent to a server that cannot take it fails, and
/// the test sees it. Four server slots: two for the first apps, two (in
/// maintenance) for their replacements.
fn haproxy_config(first: &str, second: &str) -> String {
    format!(
        "global
    maxconn 1024
    stats socket ipv4@0.0.0.0:9999 level admin
    stats timeout 10s

defaults
    mode http
    timeout connect 2s
    timeout client 30s
    timeout server 30s
    timeout http-request 10s
    retries 0

frontend web
    bind 0.0.0.0:8080
    default_backend apps

backend apps
    balance roundrobin
    option httpchk GET /readyz
    http-check expect status 200
    default-server check inter 500ms fastinter 250ms downinter 500ms rise 2 fall 2
    server slot1 {first}:{APP_PORT}
    server slot2 {second}:{APP_PORT}
    server slot3 127.0.0.1:{APP_PORT} disabled
    server slot4 127.0.0.1:{APP_PORT} disabled
"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolling_replacement_behind_a_load_balancer_drops_no_request() {
    let Some(_turn) = take_turn().await else {
        return;
    };
    let test_start = Instant::now();

    let resources = Resources::default();
    let network = resources.network(&unique("net"));
    docker(&["network", "create", "--driver", "bridge", &network]).await;

    // Longer than HAProxy needs to notice the 503 (2 checks 500 ms apart).
    let drain_delay = Duration::from_millis(3000);
    let a1 = start_app(&resources, &network, "a1", drain_delay).await;
    let a2 = start_app(&resources, &network, "a2", drain_delay).await;
    wait_healthy(&a1, Duration::from_secs(60)).await;
    wait_healthy(&a2, Duration::from_secs(60)).await;

    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("haproxy.cfg");
    std::fs::write(
        &config,
        haproxy_config(
            &network_ip(&a1, &network).await,
            &network_ip(&a2, &network).await,
        ),
    )
    .expect("write haproxy.cfg");
    let lb = resources.container(&unique("lb"));
    docker(&[
        "run",
        "--detach",
        "--name",
        &lb,
        "--network",
        &network,
        "--publish",
        &format!("127.0.0.1:0:{APP_PORT}"),
        "--publish",
        "127.0.0.1:0:9999",
        "--volume",
        &format!("{}:/usr/local/etc/haproxy/haproxy.cfg:ro", config.display()),
        HAPROXY_IMAGE,
    ])
    .await;
    let front = published(&lb, APP_PORT).await;
    let admin = published(&lb, 9999).await;
    let http = client();
    wait_ok(
        &http,
        &format!("http://{front}/healthz"),
        Duration::from_secs(30),
    )
    .await;
    wait_server_up(admin, "slot1", Duration::from_secs(15)).await;
    wait_server_up(admin, "slot2", Duration::from_secs(15)).await;
    println!("HAProxy up with {a1} and {a2} behind it");

    // Constant traffic through the load balancer: links created by four
    // clients keeping their connections, a few hundred a second in all.
    let traffic = Plan::creating_links(front)
        .clients(&[Kind::KeepAlive], 4)
        .pause(Duration::from_millis(5))
        .start();
    tokio::time::sleep(Duration::from_secs(2)).await;

    for (old, old_slot, label, new_slot) in
        [(&a1, "slot1", "b1", "slot3"), (&a2, "slot2", "b2", "slot4")]
    {
        let before = traffic.answered();
        // 1. The new app, healthy.
        let new = start_app(&resources, &network, label, drain_delay).await;
        let healthy = wait_healthy(&new, Duration::from_secs(60)).await;
        // 2. Into the load balancer, and up there.
        let ip = network_ip(&new, &network).await;
        // A refusal fails in `haproxy_command`.
        haproxy_command(
            admin,
            &format!("set server apps/{new_slot} addr {ip} port {APP_PORT}"),
        )
        .await;
        let answer =
            haproxy_command(admin, &format!("set server apps/{new_slot} state ready")).await;
        assert!(answer.trim().is_empty(), "set server state ready: {answer}");
        let up = wait_server_up(admin, new_slot, Duration::from_secs(15)).await;
        // 3. The old app stops: lame duck (HAProxy sees the 503 and takes it
        //    out while it still serves), drain, exit 0.
        let sigterm = Instant::now();
        let stopping = {
            let old = old.clone();
            tokio::spawn(async move { stop_cleanly(&old).await })
        };
        let mut taken_out = None;
        while !stopping.is_finished() && sigterm.elapsed() < DOCKER_STOP_TIMEOUT {
            let stat = haproxy_server(admin, old_slot).await;
            if stat.status.starts_with("DOWN") {
                taken_out = Some(sigterm.elapsed());
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let stopped = stopping.await.expect("docker stop task");
        let old_stat = haproxy_server(admin, old_slot).await;
        let taken_out = taken_out.unwrap_or_else(|| {
            panic!("HAProxy did not take {old_slot} out before {old} exited: {old_stat:?}")
        });
        assert!(
            taken_out < drain_delay,
            "HAProxy took {old_slot} out {taken_out:?} after SIGTERM, after the drain delay \
             ({drain_delay:?}) had ended: requests may have met a closed listener"
        );
        haproxy_command(admin, &format!("set server apps/{old_slot} state maint")).await;
        // Traffic on the new app before the next round.
        tokio::time::sleep(Duration::from_secs(1)).await;
        println!(
            "replaced {old} by {new}: healthy in {healthy:.1?}, up in HAProxy {up:.1?} later; \
             old one out of HAProxy {taken_out:.1?} after SIGTERM, exited 0 after {stopped:.1?}; \
             {} requests served meanwhile",
            traffic.answered() - before,
        );
    }

    let tally = tokio::task::block_in_place(|| traffic.finish());
    let per_server = haproxy_servers(admin).await;
    println!(
        "rolling replacement in {:.1?}:\n{tally}\nper server: {}",
        test_start.elapsed(),
        per_server
            .iter()
            .map(|stat| {
                let total = stat.sessions.unwrap_or(0);
                format!("{} {total} ({})", stat.server, stat.status)
            })
            .collect::<Vec<_>>()
            .join(", ")
    );
    tally.assert_none_failed("the rolling replacement");
    let ok = tally.answered();
    assert!(
        ok >= 200,
        "too little traffic to mean anything: {ok} requests"
    );
    for stat in &per_server {
        assert!(
            stat.sessions.unwrap_or(0) > 0,
            "{} served no request: the traffic never reached it",
            stat.server
        );
    }
}

// --- 4: a spill crosses containers on a named volume ------------------------------

// Gap: `docker run` replaces a container with a new one, whose anonymous
// volumes are new too; a spill left on the old one's would never be applied.
// With the named volumes of the `docker run` in docs/deployment.md, the
// next container applies what the last one spilled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spill_reaches_the_next_container_through_a_named_volume() {
    const REDIRECTS: u64 = 50;
    let Some(_turn) = take_turn().await else {
        return;
    };

    let resources = Resources::default();
    let data = resources.volume(&unique("data"));
    let spill = resources.volume(&unique("spill"));
    let run = |label: &str, drain_delay: &str| {
        let name = resources.container(&unique(label));
        let drain_delay = format!("LAMEDUCK_DRAIN_DELAY={drain_delay}");
        let (data, spill) = (format!("{data}:/data"), format!("{spill}:/spill"));
        async move {
            docker(&[
                "run",
                "--detach",
                "--name",
                &name,
                "--publish",
                &format!("127.0.0.1:0:{APP_PORT}"),
                "--volume",
                &data,
                "--volume",
                &spill,
                // Hits stay in memory until the exit.
                "--env",
                "LAMEDUCK_FLUSH_INTERVAL=1h",
                "--env",
                &drain_delay,
                IMAGE,
            ])
            .await;
            let base = format!("http://{}", published(&name, APP_PORT).await);
            wait_ok(
                &client(),
                &format!("{base}/healthz"),
                Duration::from_secs(30),
            )
            .await;
            (name, base)
        }
    };
    // Redirects are counted, not followed.
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(10))
        .build()
        .expect("client");

    // A lame duck long enough for the second signal to arrive in it.
    let (first, base) = run("spills", "30s").await;
    let created: serde_json::Value = http
        .post(format!("{base}/api/links"))
        .json(&serde_json::json!({ "url": "https://example.com/container-spill" }))
        .send()
        .await
        .expect("create")
        .json()
        .await
        .expect("json");
    let code = created["code"].as_str().expect("a code").to_owned();
    for _ in 0..REDIRECTS {
        let response = http
            .get(format!("{base}/{code}"))
            .send()
            .await
            .expect("redirect");
        assert_eq!(response.status(), 307);
    }
    docker(&["kill", "--signal", "TERM", &first]).await;
    let lame_duck = Instant::now();
    while status_of(&http, &format!("{base}/readyz")).await != Some(503) {
        assert!(
            lame_duck.elapsed() < Duration::from_secs(10),
            "no lame duck"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // What `docker stop` does not do but an impatient operator (or a second
    // `docker kill`) does: the second signal forces the exit.
    docker(&["kill", "--signal", "TERM", &first]).await;
    let exit = docker(&["wait", &first]).await;
    let logs = container_logs(&first).await;
    assert_eq!(exit.trim(), "4", "a forced exit; logs:\n{logs}");
    assert!(logs.contains("hits spilled to disk"), "{logs}");

    let (second, base) = run("applies", "0s").await;
    let logs = container_logs(&second).await;
    assert!(logs.contains("applied spilled hits"), "{logs}");
    let info: serde_json::Value = http
        .get(format!("{base}/api/links/{code}"))
        .send()
        .await
        .expect("info")
        .json()
        .await
        .expect("json");
    assert_eq!(
        info["hits"], REDIRECTS,
        "every hit answered before the forced exit"
    );
    stop_cleanly(&second).await;
    println!(
        "a forced exit spilled {REDIRECTS} hits to a named volume; the next container applied them"
    );
}

// --- 5: the OOM killer -----------------------------------------------------------

/// The OOM test's memory limit (swap included): room for the server at
/// rest and under its redirect load, not for a thousand request bodies
/// held at once.
const OOM_MEMORY_LIMIT: &str = "48m";
/// Uploads in the burst that takes the memory: each declares a 64 KiB body
/// (the default `--max-body-bytes`), sends 60 KiB of it and waits, as a
/// burst of large uploads on a slow network does. 90 MB in all.
const OOM_UPLOADS: usize = 1_500;
const OOM_UPLOAD_PART: usize = 60 * 1024;

// SIGKILL's everyday form in Kubernetes: a container over its memory limit
// is killed by the kernel's OOM killer, with no signal it can handle. The
// image with a memory limit, redirects on keep-alive connections, and a
// burst of large uploads that takes the server over its limit: the kernel
// kills it (`OOMKilled: true`, exit 137). Restarted in place, on its
// volumes, as the kubelet restarts a container: every redirect answered
// before the kill is counted, and the only excess is requests the kill cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_oom_killer_loses_no_answered_hit() {
    const CODES: usize = 10;
    let Some(_turn) = take_turn().await else {
        return;
    };

    let resources = Resources::default();
    let name = resources.container(&unique("oom"));
    let data = format!("{}:/data", resources.volume(&unique("oom-data")));
    let spill = format!("{}:/spill", resources.volume(&unique("oom-spill")));
    docker(&[
        "run",
        "--detach",
        "--name",
        &name,
        "--memory",
        OOM_MEMORY_LIMIT,
        "--memory-swap",
        OOM_MEMORY_LIMIT,
        "--publish",
        &format!("127.0.0.1:0:{APP_PORT}"),
        "--volume",
        &data,
        "--volume",
        &spill,
        // Hits stay in memory, and in the journal, until the kill.
        "--env",
        "LAMEDUCK_FLUSH_INTERVAL=1h",
        IMAGE,
    ])
    .await;
    let addr = published(&name, APP_PORT).await;
    wait_ok(
        &client(),
        &format!("http://{addr}/healthz"),
        Duration::from_secs(30),
    )
    .await;
    let codes: Vec<String> = (0..CODES)
        .map(|n| create_link(addr, &format!("https://example.com/oom-{n}")))
        .collect();

    let clients = KeptAliveClients::start(addr, &codes, 4);
    let warm = Instant::now();
    while clients.answered() < 500 {
        assert!(warm.elapsed() < Duration::from_secs(60), "too slow");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let uploads = hold_uploads(addr, &name).await;
    let exit = docker(&["wait", &name]).await;
    let oom_killed = inspect(&name, "{{.State.OOMKilled}}").await;
    let logs = container_logs(&name).await;
    assert_eq!(
        (exit.as_str(), oom_killed.as_str()),
        ("137", "true"),
        "killed by the OOM killer after {uploads} uploads; logs:\n{logs}"
    );
    let (answered, cut) = tokio::task::spawn_blocking(|| clients.join())
        .await
        .expect("clients");

    // The kubelet restarts the container in its pod: same volumes.
    docker(&["start", &name]).await;
    let addr = published(&name, APP_PORT).await;
    wait_ok(
        &client(),
        &format!("http://{addr}/healthz"),
        Duration::from_secs(30),
    )
    .await;
    let logs = container_logs(&name).await;
    assert!(
        logs.contains("applied spilled hits"),
        "the killed process's journal is applied at the restart:\n{logs}"
    );
    let mut stored = 0;
    for code in &codes {
        let info: serde_json::Value = client()
            .get(format!("http://{addr}/api/links/{code}"))
            .send()
            .await
            .expect("info")
            .json()
            .await
            .expect("json");
        stored += info["hits"].as_u64().expect("hits");
    }
    docker(&["stop", &name]).await;
    assert_eq!(inspect(&name, "{{.State.ExitCode}}").await, "0");
    assert_kill_bound(stored, answered, cut);
    println!(
        "OOM kill after {uploads} uploads: {answered} redirects answered, {cut} cut, {stored} hits stored"
    );
}

/// Opens uploads that each hold [`OOM_UPLOAD_PART`] bytes of a body in
/// the server, until the container `name` stops running; bounded by
/// [`OOM_UPLOADS`] and a minute. Returns how many were opened.
async fn hold_uploads(addr: SocketAddr, name: &str) -> usize {
    let head = format!(
        "POST /api/links HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n",
        64 * 1024
    );
    let part = vec![b' '; OOM_UPLOAD_PART];
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut held = Vec::new();
    for n in 0..OOM_UPLOADS {
        if n % 100 == 0 && inspect(name, "{{.State.Running}}").await != "true" {
            return n;
        }
        assert!(Instant::now() < deadline, "{n} uploads and still running");
        let Ok(mut upload) = TcpStream::connect(addr).await else {
            return n;
        };
        // A server (or proxy) that stops reading leaves a write pending:
        // the part is held in a buffer on the way either way.
        let sent = tokio::time::timeout(Duration::from_secs(5), async {
            upload.write_all(head.as_bytes()).await?;
            upload.write_all(&part).await
        })
        .await;
        if let Ok(Err(_)) = sent {
            return n;
        }
        held.push(upload);
    }
    // Every upload is out: the server has them, or the kernel its memory.
    while Instant::now() < deadline {
        if inspect(name, "{{.State.Running}}").await != "true" {
            return OOM_UPLOADS;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("{OOM_UPLOADS} uploads held and {name} still runs");
}
