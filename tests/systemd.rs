//! The in-place upgrade under a real systemd: systemd 252 (Debian 12's) as
//! PID 1 in a container made by `scripts/docker-base-images.sh systemd`,
//! the unit files of `deploy/systemd/` installed as they are (one drop-in
//! makes the socket listen on the container's own address, so that the
//! ports published on 127.0.0.1 reach it), the binary under test copied in,
//! SQLite in the unit's state directory, and traffic from outside the
//! container.
//!
//! 1. `systemctl reload` twenty times under constant traffic (new
//!    connections and a keep-alive one) with a request of 2 s in flight at
//!    each: no request fails, `MainPID` changes every time, `NRestarts`
//!    stays 0; a reload to a binary that fails at startup fails (non-zero,
//!    "Reload failed" in the journal) and the old process serves on;
//!    `systemctl stop` right after a reload drains everything (every
//!    process logs exit code 0, nothing is killed) and every redirect
//!    answered is a hit stored.
//! 2. What a deploy costs a new connection, with a request of 5 s in
//!    flight: `systemctl restart` (the socket holds new connections until
//!    the old process has drained and the new one started) against
//!    `systemctl reload`: printed, and in docs/restarts.md.
//!
//! Without a Docker engine, or where systemd cannot run in a container,
//! the tests say so in one line and pass without checking anything.
//! Every container is removed at the end, also when a test fails.

use std::io::Write;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use sqlx::sqlite::SqliteConnection;
use sqlx::Connection;

use lameduck_testkit::binary::{
    binary, connect, finish_slow_post, get, read_response, request, start_slow_post, tempdir,
};
use lameduck_testkit::traffic::Plan;

/// The image `scripts/docker-base-images.sh systemd` makes.
const IMAGE: &str = "stand-in/systemd:bookworm";

/// The service's name: the unit, the binary, the state directory.
const NAME: &str = lameduck::NAME;

/// Generous bound on anything that should take a second or two.
const PATIENCE: Duration = Duration::from_secs(60);

/// Reloads in a row under traffic.
const RELOADS: usize = 20;

/// One container at a time: systemd, the service and the traffic share two
/// cores.
static MACHINE: Mutex<()> = Mutex::new(());

/// A container running systemd as PID 1, removed on drop.
struct Machine {
    name: String,
    /// The service's port, published on 127.0.0.1.
    http: SocketAddr,
    /// The admin port, likewise.
    admin: SocketAddr,
}

impl Machine {
    /// Starts the container, or says in one line why it cannot and returns
    /// `None`.
    fn start(label: &str) -> Option<Machine> {
        if !run("docker", &["info", "--format", "{{.ServerVersion}}"])
            .status
            .success()
        {
            println!("docker engine not available: systemd tests skipped");
            return None;
        }
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/docker-base-images.sh");
        let made = run(script.to_str().expect("a UTF-8 path"), &["systemd"]);
        if !made.status.success() {
            println!(
                "cannot make the systemd image ({}): systemd tests skipped",
                String::from_utf8_lossy(&made.stderr).trim()
            );
            return None;
        }
        let name = format!("{NAME}-systemd-{}-{label}", std::process::id());
        let started = run(
            "docker",
            &[
                "run",
                "-d",
                "--name",
                &name,
                "--cap-add",
                "SYS_ADMIN",
                "--cgroupns=host",
                "-v",
                "/sys/fs/cgroup:/sys/fs/cgroup:rw",
                "--tmpfs",
                "/run",
                "--tmpfs",
                "/run/lock",
                "--stop-signal",
                "SIGRTMIN+3",
                "-p",
                "127.0.0.1::8080",
                "-p",
                "127.0.0.1::9090",
                IMAGE,
            ],
        );
        if !started.status.success() {
            println!(
                "cannot start systemd in a container ({}): systemd tests skipped",
                String::from_utf8_lossy(&started.stderr).trim()
            );
            let _ = run("docker", &["rm", "-f", &name]);
            return None;
        }
        let port = |inner: &str| -> SocketAddr {
            let out = stdout(&run("docker", &["port", &name, inner]));
            out.lines()
                .find_map(|line| line.trim().parse().ok())
                .unwrap_or_else(|| panic!("no published address for {inner}: {out}"))
        };
        let machine = Machine {
            http: port("8080/tcp"),
            admin: port("9090/tcp"),
            name,
        };
        // systemctl answers once systemd has opened its own socket, a moment
        // after the container starts; `--wait` then waits out the boot.
        let deadline = Instant::now() + PATIENCE;
        loop {
            let state = stdout(&machine.exec(&["systemctl", "is-system-running", "--wait"]));
            match state.trim() {
                "running" | "degraded" => return Some(machine),
                _ if Instant::now() < deadline => thread::sleep(Duration::from_millis(200)),
                state => {
                    println!("systemd in the container stays {state:?}: systemd tests skipped");
                    return None;
                }
            }
        }
    }

    fn exec(&self, args: &[&str]) -> Output {
        let mut all = vec!["exec", self.name.as_str()];
        all.extend_from_slice(args);
        run("docker", &all)
    }

    /// `systemctl ARGS`, which must succeed.
    fn systemctl(&self, args: &[&str]) -> String {
        let mut all = vec!["systemctl"];
        all.extend_from_slice(args);
        let output = self.exec(&all);
        assert!(
            output.status.success(),
            "systemctl {args:?} failed: {}\n{}\njournal:\n{}",
            String::from_utf8_lossy(&output.stderr),
            stdout(&output),
            self.journal()
        );
        stdout(&output)
    }

    /// One property of the service unit.
    fn show(&self, property: &str) -> String {
        self.systemctl(&["show", "--value", "--property", property, &unit()])
            .trim()
            .to_owned()
    }

    fn main_pid(&self) -> u32 {
        self.show("MainPID").parse().expect("MainPID is a number")
    }

    /// The service's journal, as written (its lines are JSON).
    fn journal(&self) -> String {
        stdout(&self.exec(&["journalctl", "--no-pager", "-o", "cat", "-u", &unit()]))
    }

    /// systemd's own journal lines about the service.
    fn manager_journal(&self) -> String {
        stdout(&self.exec(&["journalctl", "--no-pager", "-o", "cat", "_PID=1"]))
            .lines()
            .filter(|line| line.contains(NAME))
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn copy_in(&self, from: &Path, to: &str) {
        let to = format!("{}:{to}", self.name);
        let output = run("docker", &["cp", from.to_str().expect("UTF-8 path"), &to]);
        assert!(output.status.success(), "docker cp {from:?}: {output:?}");
    }

    fn write(&self, path: &str, contents: &str, mode: &str) {
        let mut child = Command::new("docker")
            .args(["exec", "-i", &self.name, "sh", "-c"])
            .arg(format!(
                "mkdir -p \"$(dirname {path})\" && cat > {path} && chmod {mode} {path}"
            ))
            .stdin(Stdio::piped())
            .spawn()
            .expect("docker exec");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(contents.as_bytes())
            .expect("write");
        assert!(child.wait().expect("wait").success(), "writing {path}");
    }

    /// The binary and the unit files as `deploy/systemd/` has them; the
    /// socket listens on every address of the container (a drop-in, the
    /// way to change where a unit listens without editing it).
    fn install(&self) {
        self.copy_in(Path::new(binary()), &format!("/usr/local/bin/{NAME}"));
        let units = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/systemd");
        for unit in [format!("{NAME}.service"), format!("{NAME}.socket")] {
            self.copy_in(&units.join(&unit), &format!("/etc/systemd/system/{unit}"));
        }
        self.write(
            &format!("/etc/systemd/system/{NAME}.socket.d/container.conf"),
            "[Socket]\nListenStream=\nListenStream=0.0.0.0:8080\nListenStream=0.0.0.0:9090\n",
            "0644",
        );
        self.systemctl(&["daemon-reload"]);
        self.systemctl(&["enable", "--now", &format!("{NAME}.socket"), &unit()]);
        wait_ready(self.admin);
    }

    /// `systemctl reload`, with how long it took; panics unless it
    /// succeeded.
    fn reload(&self) -> Duration {
        let started = Instant::now();
        self.systemctl(&["reload", &unit()]);
        started.elapsed()
    }
}

impl Drop for Machine {
    fn drop(&mut self) {
        if thread::panicking() {
            eprintln!("journal of {}:\n{}", unit(), self.journal());
        }
        let _ = run("docker", &["rm", "-f", "-v", &self.name]);
    }
}

fn unit() -> String {
    format!("{NAME}.service")
}

fn run(program: &str, args: &[&str]) -> Output {
    Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"))
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn lock(mutex: &Mutex<()>) -> MutexGuard<'_, ()> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Waits until `/readyz` answers 200 at `admin`.
fn wait_ready(admin: SocketAddr) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if request(admin, "GET", "/readyz", None).is_ok_and(|r| r.status == 200) {
            return;
        }
        assert!(Instant::now() < deadline, "{admin} never turned ready");
        thread::sleep(Duration::from_millis(100));
    }
}

/// A request held in flight for `hold`: a link created with a body sent in
/// two halves, the second after `hold`; answers 201.
fn hold_a_request(addr: SocketAddr, hold: Duration) -> JoinHandle<u16> {
    let mut stream = start_slow_post(addr);
    thread::spawn(move || {
        thread::sleep(hold);
        finish_slow_post(&mut stream);
        read_response(&mut stream).map_or(0, |response| response.status)
    })
}

/// Creates a link and redirects it once; returns its code.
fn a_link(addr: SocketAddr) -> String {
    let body = r#"{"url":"https://example.com/systemd","code":"systemd"}"#;
    let created = request(addr, "POST", "/api/links", Some(body)).expect("POST /api/links");
    assert_eq!(created.status, 201, "{created:?}");
    "systemd".to_owned()
}

/// The hits stored in the unit's SQLite database, read from a copy taken
/// once the service has stopped.
fn stored_hits(machine: &Machine) -> i64 {
    let copy = tempdir("lameduck-systemd-db-");
    let state = format!("/var/lib/private/{NAME}/.");
    let out = run(
        "docker",
        &[
            "cp",
            &format!("{}:{state}", machine.name),
            copy.path().to_str().expect("UTF-8"),
        ],
    );
    assert!(
        out.status.success(),
        "docker cp the state directory: {out:?}"
    );
    let url = format!(
        "sqlite://{}",
        copy.path().join(format!("{NAME}.db")).display()
    );
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(async {
            let mut conn = SqliteConnection::connect(&url)
                .await
                .expect("open the copy");
            sqlx::query_scalar("SELECT CAST(COALESCE(SUM(hits), 0) AS BIGINT) FROM links")
                .fetch_one(&mut conn)
                .await
                .expect("sum the hits")
        })
}

// Gap: under systemd the in-place upgrade could not be used — the
// successor's readiness reached the old process, not systemd, which then
// stopped the unit when the old process exited — so deploys restarted the
// service, and every connection made meanwhile waited for the old
// process's whole drain. Now `systemctl reload` hands the sockets and the
// main PID to the new binary: no request fails across twenty reloads with
// a request in flight at each, a successor that cannot start makes the
// reload fail while the old process serves on, a stop right after a reload
// drains every process, and every hit answered is stored.
#[test]
fn systemctl_reload_upgrades_in_place_and_tells_the_truth_and_stop_keeps_every_hit() {
    let _one = lock(&MACHINE);
    let Some(machine) = Machine::start("reload") else {
        return;
    };
    machine.install();
    let code = a_link(machine.http);
    // Redirects of the link, on a new connection each and on one kept
    // alive: every answer that is not a 307 is a failure.
    let traffic = Plan::redirects(machine.http, &code).start();

    let mut pids = vec![machine.main_pid()];
    let mut took = Vec::new();
    for n in 1..=RELOADS {
        let held = hold_a_request(machine.http, Duration::from_secs(2));
        took.push(machine.reload());
        let pid = machine.main_pid();
        assert!(!pids.contains(&pid), "reload {n}: MainPID stayed {pid}");
        pids.push(pid);
        assert_eq!(
            held.join().expect("held request"),
            201,
            "reload {n}: the request in flight"
        );
        wait_ready(machine.admin);
    }
    assert_eq!(machine.show("NRestarts"), "0");
    assert_eq!(machine.show("ActiveState"), "active");

    // A binary that fails at startup: the reload fails, the old process
    // serves on.
    let good = format!("/usr/local/bin/{NAME}.good");
    machine.exec(&["cp", &format!("/usr/local/bin/{NAME}"), &good]);
    machine.write(
        &format!("/usr/local/bin/{NAME}.broken"),
        &format!(
            "#!/bin/sh\n# A build whose server cannot start.\n\
             if [ \"$1\" = server ] && [ -z \"$HANDOFF_DETACH\" ]; then echo 'broken build' >&2; exit 1; fi\n\
             exec {good} \"$@\"\n"
        ),
        "0755",
    );
    machine.exec(&[
        "mv",
        &format!("/usr/local/bin/{NAME}.broken"),
        &format!("/usr/local/bin/{NAME}"),
    ]);
    let before = machine.main_pid();
    let failed = machine.exec(&["systemctl", "reload", &unit()]);
    assert!(
        !failed.status.success(),
        "a reload to a broken build succeeded"
    );
    assert_eq!(machine.main_pid(), before, "the old process serves on");
    assert!(
        machine.manager_journal().contains("Reload failed"),
        "no \"Reload failed\" in the journal:\n{}",
        machine.manager_journal()
    );
    assert!(
        machine.show("StatusText").contains("failed"),
        "{}",
        machine.show("StatusText")
    );
    machine.exec(&["mv", &good, &format!("/usr/local/bin/{NAME}")]);

    // Stop right after a reload, its predecessor still draining a request.
    let held = hold_a_request(machine.http, Duration::from_secs(2));
    took.push(machine.reload());
    let tally = traffic.finish();
    tally.assert_none_failed("the reloads");
    let redirects = tally.answered();
    machine.systemctl(&["stop", &unit(), &format!("{NAME}.socket")]);
    assert_eq!(
        held.join().expect("held request"),
        201,
        "the request in flight at the stop"
    );
    assert_eq!(machine.show("Result"), "success");
    assert_eq!(machine.show("ExecMainStatus"), "0");

    let journal = machine.journal();
    let summaries: Vec<&str> = journal
        .lines()
        .filter(|line| line.contains("shutdown complete"))
        .collect();
    assert_eq!(
        summaries.len(),
        RELOADS + 2,
        "one summary per process that served:\n{journal}"
    );
    for line in &summaries {
        assert!(line.contains("\"exit_code\":0"), "{line}");
    }
    let manager = machine.manager_journal();
    for killed in ["SIGKILL", "Killing process"] {
        assert!(!manager.contains(killed), "{killed} in:\n{manager}");
    }
    assert_eq!(
        stored_hits(&machine),
        i64::try_from(redirects).expect("fits")
    );
    took.sort();
    println!(
        "{} reloads under systemd: `systemctl reload` took {:?} (median) to {:?} (max); \
         {redirects} redirects answered and stored, none failed",
        took.len(),
        took[took.len() / 2],
        took[took.len() - 1]
    );
}

/// Latency of new connections made every 20 ms while `deploy` runs, with
/// a request of 5 s in flight when it starts: p50, p99 and max.
fn new_connections_during(machine: &Machine, deploy: &[&str]) -> (Duration, Duration, Duration) {
    let held = hold_a_request(machine.http, Duration::from_secs(5));
    let stop = Arc::new(AtomicBool::new(false));
    let prober = thread::spawn({
        let (stop, addr) = (Arc::clone(&stop), machine.http);
        move || {
            let mut latencies = Vec::new();
            while !stop.load(Ordering::Acquire) {
                let started = Instant::now();
                let mut stream = connect(addr);
                let response = get(&mut stream, "/healthz").expect("a new connection is answered");
                assert_eq!(response.status, 200, "{response:?}");
                latencies.push(started.elapsed());
                thread::sleep(Duration::from_millis(20));
            }
            latencies
        }
    });
    thread::sleep(Duration::from_millis(500));
    machine.systemctl(deploy);
    wait_ready(machine.admin);
    assert_eq!(held.join().expect("held request"), 201);
    thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Release);
    let mut latencies = prober.join().expect("the prober");
    latencies.sort();
    let at = |q: f64| {
        #[allow(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            clippy::cast_precision_loss
        )]
        let index = ((latencies.len() as f64 * q).ceil() as usize).clamp(1, latencies.len()) - 1;
        latencies[index]
    };
    (at(0.50), at(0.99), at(1.0))
}

// What `systemctl reload` buys over `systemctl restart` (socket activation,
// the unit's deploy before), with a request of 5 s in flight: a restart
// holds new connections in the socket's backlog until the old process has
// drained and the new one started; a reload makes none wait. No timing is
// asserted (the figures go to docs/restarts.md); every connection must
// succeed.
#[test]
fn a_deploy_by_reload_holds_no_new_connection_where_a_restart_holds_them_for_the_drain() {
    let _one = lock(&MACHINE);
    let Some(machine) = Machine::start("latency") else {
        return;
    };
    machine.install();
    let restart = new_connections_during(&machine, &["restart", &unit()]);
    let reload = new_connections_during(&machine, &["reload", &unit()]);
    machine.systemctl(&["stop", &unit()]);
    let ms = |d: Duration| format!("{:.1}", d.as_secs_f64() * 1000.0);
    println!(
        "new connections during a deploy with a 5 s request in flight, p50 / p99 / max (ms):\n\
         | deploy | p50 | p99 | max |\n|---|--:|--:|--:|\n\
         | `systemctl restart` (socket activation) | {} | {} | {} |\n\
         | `systemctl reload` (in-place upgrade) | {} | {} | {} |",
        ms(restart.0),
        ms(restart.1),
        ms(restart.2),
        ms(reload.0),
        ms(reload.1),
        ms(reload.2)
    );
}
