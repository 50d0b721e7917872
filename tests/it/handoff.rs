//! Restarts that never close the socket, tested against the real binary:
//! socket activation (`LISTEN_FDS`) and the in-place upgrade on SIGHUP
//! (`handoff/src/`).
//!
//! The processes here are started as a bare [`Process`] rather than a
//! `LameduckProcess`: they need a listening socket mapped to fd 3, a binary
//! other than Cargo's, and a process group of their own, so that a failing
//! test kills the successors a server started, not only the server.

use std::io::Write;
use std::net::{SocketAddr, TcpListener};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use lameduck_testkit::binary::{
    binary, connect, create_link, get, pass_listeners, read_pid, read_response, server_command,
    tempdir, Lineage, Process,
};
use lameduck_testkit::traffic::{Fate, Kind, Plan, Traffic};

/// Generous bound on anything that should take well under a second: a log
/// line to appear, a process to start, get ready or exit. Reaching it is a
/// failure.
const PATIENCE: Duration = Duration::from_secs(15);

/// `--admin-listen` for a process whose admin port does not matter.
const ANY_PORT: &str = "127.0.0.1:0";

/// What the server logs when it serves a socket it was given.
const INHERITED: &str = "serving an inherited listening socket";

// === tests ===

// Gap: socket activation end to end. The server serves the sockets it is
// given (fd 3 public, fd 4 admin) instead of binding `--listen` and
// `--admin-listen` (an address already taken, so binding it would fail),
// and connections made while no process runs wait in the sockets' backlogs
// and are answered by the next process given them. That is what
// `systemctl restart` relies on with a `.socket` unit.
#[test]
fn socket_activation_serves_the_inherited_listener() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind the activation socket");
    let addr = listener.local_addr().expect("its address");
    let admin_listener = TcpListener::bind("127.0.0.1:0").expect("bind the admin socket");
    let admin = admin_listener.local_addr().expect("its address");
    // `--listen` names a port somebody else holds: if the server tried to
    // bind it instead of using fd 3, it would fail to start.
    let taken = TcpListener::bind("127.0.0.1:0").expect("bind a blocker");
    let taken_addr = taken.local_addr().expect("its address").to_string();
    let data = tempdir("lameduck-activation-");

    let activated = |listener: &TcpListener| {
        let mut command = server_command(Path::new(binary()), &taken_addr);
        command
            .args(["--listen", &taken_addr, "--data-dir"])
            .arg(data.path());
        pass_listeners(&mut command, &[listener, &admin_listener]);
        Process::spawn_group(&mut command)
    };

    let mut first = activated(&listener);
    first.expect_log(INHERITED, PATIENCE);
    assert_eq!(first.listening_addr(), addr, "{}", first.log_text());
    let mut client = connect(addr);
    let response = get(&mut client, "/healthz").expect("GET /healthz");
    assert_eq!(response.status, 200, "{response:?}");
    drop(client);
    let mut probe = connect(admin);
    let response = get(&mut probe, "/metrics").expect("GET /metrics on the admin socket");
    assert_eq!(response.status, 200, "{response:?}");
    drop(probe);
    first.signal(Signal::SIGTERM);
    assert_eq!(first.exit_code(PATIENCE), 0, "{}", first.log_text());

    // No process serves now, but the socket is still open (this test holds
    // it, as systemd would): the connection is queued, not refused.
    let mut queued = connect(addr);
    write!(queued, "GET /healthz HTTP/1.1\r\nHost: lameduck\r\n\r\n").expect("send a request");
    let mut queued_probe = connect(admin);
    write!(
        queued_probe,
        "GET /readyz HTTP/1.1\r\nHost: lameduck\r\n\r\n"
    )
    .expect("send a probe");

    let mut second = activated(&listener);
    let response = read_response(&mut queued).expect("the queued request is answered");
    assert_eq!(response.status, 200, "{response:?}");
    let response = read_response(&mut queued_probe).expect("the queued probe is answered");
    assert_eq!(response.status, 200, "{response:?}");
    second.expect_log(INHERITED, PATIENCE);
    second.signal(Signal::SIGTERM);
    assert_eq!(second.exit_code(PATIENCE), 0, "{}", second.log_text());
}

// Gap: the promise of the in-place upgrade, measured. Under constant load
// (new connections and keep-alive ones), fifty SIGHUP upgrades in a row
// must fail no request at all; and ten plain stop-then-start restarts under
// the same load must fail some, or this test could not see a drop. The
// keep-alive clients are the hard part: a retiring process that closes a
// keep-alive connection between two requests races the client's next
// request on it, and that request is lost.
#[test]
fn in_place_upgrades_under_constant_load_drop_nothing() {
    const UPGRADES: usize = 50;
    const RESTARTS: usize = 10;
    // Successors are children of the process they replace; once that one
    // exits they are re-parented to this process, which can then reap them
    // and read their exit codes.
    nix::sys::prctl::set_child_subreaper(true).expect("become a child subreaper");

    let dir = tempdir("lameduck-upgrade-");
    let data = dir.path().join("data");
    let pid_file = dir.path().join("lameduck.pid");
    // A fixed admin port, held by each process until its successor runs: a
    // successor that bound it instead of inheriting it would fail to start.
    let admin = TcpListener::bind("127.0.0.1:0")
        .and_then(|probe| probe.local_addr())
        .expect("a free port");
    let mut command = server_command(Path::new(binary()), &admin.to_string());
    command
        .args(["--listen", "127.0.0.1:0", "--data-dir"])
        .arg(&data)
        .arg("--pid-file")
        .arg(&pid_file);
    let mut lineage = Lineage::start(Process::spawn_group(&mut command), pid_file);
    let addr = lineage.first.listening_addr();
    let code = create_link(addr, "https://example.com/handoff");

    // In-place upgrades.
    let traffic = clients(addr, &code);
    let started = Instant::now();
    for _ in 0..UPGRADES {
        lineage.upgrade();
    }
    let upgrades_took = started.elapsed();
    let upgrades = traffic.finish();
    // The last successor serves the admin endpoints on the port the first
    // process bound: the admin socket was handed down every time.
    let mut probe = connect(admin);
    let ready = get(&mut probe, "/readyz").expect("GET /readyz on the admin port");
    assert_eq!(ready.status, 200, "{ready:?}");
    drop(probe);
    let admin_lines = lineage.first.log_text();
    assert_eq!(
        admin_lines
            .lines()
            .filter(|line| line.contains(&format!("admin endpoints on http://{admin}")))
            .count(),
        UPGRADES + 1,
        "every process served the inherited admin socket:\n{admin_lines}"
    );
    assert_eq!(lineage.stop(), 0, "{}", log_excerpt(&lineage.first));

    // The comparison: stop, then start a fresh process on the same port.
    let fresh = || {
        let mut command = server_command(Path::new(binary()), ANY_PORT);
        command
            .arg("--listen")
            .arg(addr.to_string())
            .arg("--data-dir")
            .arg(&data);
        let server = Process::spawn_group(&mut command);
        assert_eq!(server.listening_addr(), addr, "{}", server.log_text());
        server
    };
    let mut server = fresh();
    let traffic = clients(addr, &code);
    let started = Instant::now();
    for _ in 0..RESTARTS {
        server.signal(Signal::SIGTERM);
        assert_eq!(server.exit_code(PATIENCE), 0, "{}", server.log_text());
        server = fresh();
    }
    let restarts_took = started.elapsed();
    let restarts = traffic.finish();
    server.signal(Signal::SIGTERM);
    assert_eq!(server.exit_code(PATIENCE), 0, "{}", server.log_text());

    println!("{UPGRADES} in-place upgrades (SIGHUP) in {upgrades_took:.1?}:\n{upgrades}");
    println!("{RESTARTS} stop-then-start restarts in {restarts_took:.1?}:\n{restarts}");
    // The instrument first: it must see what a closed socket does.
    assert!(
        restarts.total().count(Fate::Refused) > 0,
        "stop-then-start restarts refused no connection, so this test cannot \
         see a drop:\n{restarts}"
    );
    for kind in Kind::ALL {
        assert!(
            upgrades.of(kind).ok() >= 5 * UPGRADES as u64,
            "too little {} traffic to mean anything:\n{upgrades}",
            kind.name()
        );
    }
    assert_eq!(
        upgrades.failures(),
        0,
        "in-place upgrades failed requests:\n{upgrades}\nwarnings and summaries:\n{}",
        log_excerpt(&lineage.first)
    );
}

// Gap: a broken release must not take the service down. The binary on disk
// is replaced by one that fails at startup; SIGHUP starts it, sees it exit,
// and the running process keeps its pid (file) and keeps serving.
#[test]
fn an_upgrade_to_a_binary_that_fails_at_startup_leaves_the_old_process_serving() {
    let dir = tempdir("lameduck-broken-");
    let exe = dir.path().join("lameduck");
    std::fs::copy(binary(), &exe).expect("copy the binary");
    let pid_file = dir.path().join("lameduck.pid");
    let mut command = server_command(&exe, ANY_PORT);
    command
        .args(["--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path().join("data"))
        .arg("--pid-file")
        .arg(&pid_file);
    let mut server = Process::spawn_group(&mut command);
    let addr = server.listening_addr();
    assert_eq!(read_pid(&pid_file), Some(server.pid()));

    // A new release that cannot start, installed the way package managers
    // do: written next to the binary, then renamed over it.
    let staged = dir.path().join("lameduck.new");
    std::fs::write(&staged, "#!/bin/sh\necho broken >&2\nexit 1\n").expect("write the script");
    std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    std::fs::rename(&staged, &exe).expect("install the script");

    server.signal(Signal::SIGHUP);
    let failed = server.expect_log("upgrade failed", PATIENCE);
    assert!(
        failed.contains("exited before it was ready"),
        "{}",
        server.log_text()
    );
    assert!(server.has_logged("broken"), "the new binary did not run");
    assert!(server.is_running(), "{}", server.log_text());
    assert_eq!(read_pid(&pid_file), Some(server.pid()));
    let mut client = connect(addr);
    for _ in 0..3 {
        let response = get(&mut client, "/healthz").expect("GET /healthz");
        assert_eq!(response.status, 200, "{response:?}");
    }
    drop(client);

    server.signal(Signal::SIGTERM);
    assert_eq!(server.exit_code(PATIENCE), 0, "{}", server.log_text());
}

// === processes ===

/// Warnings, errors and shutdown summaries: the logs of fifty processes in
/// a few lines each.
fn log_excerpt(server: &Process) -> String {
    let wanted = ["WARN", "ERROR", "shutdown complete"];
    let lines: Vec<String> = server
        .logs()
        .into_iter()
        .filter(|line| wanted.iter().any(|word| line.contains(word)))
        .collect();
    lines.join("\n")
}

// === traffic ===

/// `GET /healthz` and `GET /{code}` in turns, from three clients on a new
/// connection for each request and three kept alive, 2 ms apart (the two
/// CPUs of a CI runner are the servers'), with a few answers in before the
/// test changes anything.
fn clients(addr: SocketAddr, code: &str) -> Traffic {
    let traffic = Plan::redirects(addr, code)
        .and_health_checks()
        .clients(&Kind::ALL, 3)
        .pause(Duration::from_millis(2))
        .start();
    traffic.wait_for(6);
    traffic
}
