//! The lifecycle's guarantees, shown by the real binary as a child process:
//! readiness, a drain that answers the request in flight and exits 0, a
//! second signal that forces the exit, the health probe, usage errors, the
//! in-place upgrade, and the trace flush at exit. Every wait is bounded.

mod support;

use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use support::{connect, read_response, request, Server, BINARY, TIMEOUT};

/// What traces add to the shutdown budget: the last finalizer's
/// `TRACE_FLUSH_BUDGET`.
const TRACE_FLUSH_BUDGET: Duration = Duration::from_secs(2);

/// A loopback address nothing listens on: bound, then let go.
fn closed_port() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("its address")
}

const GREETING: &str = r#"{"name":"Ada"}"#;

/// Sends `POST /api/greetings` with only the first bytes of its body: the
/// request stays in flight until [`finish_greeting`].
fn start_greeting(addr: SocketAddr) -> TcpStream {
    let mut stream = connect(addr);
    write!(
        stream,
        "POST /api/greetings HTTP/1.1\r\nHost: lameduck\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{}",
        GREETING.len(),
        &GREETING[..5]
    )
    .expect("send the head");
    stream
}

fn finish_greeting(stream: &mut TcpStream) {
    stream
        .write_all(&GREETING.as_bytes()[5..])
        .expect("send the rest");
}

#[test]
fn greets_in_json_and_is_ready() {
    let mut server = Server::start(&[]);
    let (status, body) = request(server.admin, "GET", "/readyz", "").expect("GET /readyz");
    assert_eq!(status, 200, "{body}");
    let (status, body) = request(server.addr, "POST", "/api/greetings", GREETING).expect("POST");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(r#""greeting":"hello, Ada""#), "{body}");
    server.signal(Signal::SIGTERM);
    assert_eq!(server.exit_code(), 0);
}

#[test]
fn sigterm_answers_the_request_in_flight_then_exits_0() {
    let mut server = Server::start(&["--drain-delay", "200ms"]);
    let mut in_flight = start_greeting(server.addr);
    server.wait_in_flight(1);

    server.signal(Signal::SIGTERM);
    server.wait_for_log("shutdown started");
    let (status, _) = request(server.admin, "GET", "/readyz", "").expect("GET /readyz");
    assert_eq!(status, 503, "readiness turns false at the signal");

    finish_greeting(&mut in_flight);
    let (status, body) = read_response(&mut in_flight).expect("the answer");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("hello, Ada"), "{body}");
    assert_eq!(server.exit_code(), 0, "{}", server.log_lines().join("\n"));
    let logs = server.all_log_lines();
    assert!(
        logs.iter()
            .any(|line| line.contains("shutdown complete") && line.contains("exit_code=0")),
        "{}",
        logs.join("\n")
    );
}

#[test]
fn a_second_sigterm_forces_the_exit() {
    let mut server = Server::start(&[]);
    let _in_flight = start_greeting(server.addr);
    server.wait_in_flight(1);

    server.signal(Signal::SIGTERM);
    server.wait_for_log("shutdown started");
    server.signal(Signal::SIGTERM);
    assert_eq!(server.exit_code(), 4);
}

#[test]
fn healthcheck_probes_the_admin_listener() {
    let mut server = Server::start(&[]);
    let probe = |admin: SocketAddr| {
        Command::new(BINARY)
            .args(["healthcheck", "--admin-listen", &admin.to_string()])
            .stdin(Stdio::null())
            .output()
            .expect("run the healthcheck")
    };
    assert!(probe(server.admin).status.success());
    server.signal(Signal::SIGTERM);
    assert_eq!(server.exit_code(), 0);
    let after = probe(server.admin);
    assert_eq!(after.status.code(), Some(1), "{after:?}");
}

#[test]
fn an_invalid_option_exits_2_naming_it() {
    let output = Command::new(BINARY)
        .args(["server", "--drain-delay", "soon"])
        .stdin(Stdio::null())
        .output()
        .expect("run the server");
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--drain-delay"), "{stderr}");
}

#[test]
fn sighup_hands_the_sockets_to_a_new_process() {
    let dir = std::env::temp_dir().join(format!("lameduck-upgrade-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let pid_file = dir.join("lameduck.pid");
    let pid_arg = pid_file.to_str().expect("a UTF-8 path");
    let mut old = Server::start(&["--pid-file", pid_arg]);
    let old_pid = old.child.id().to_string();
    let read_pid = || std::fs::read_to_string(&pid_file).unwrap_or_default();
    let deadline = Instant::now() + TIMEOUT;
    while read_pid().trim() != old_pid && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(10));
    }

    old.signal(Signal::SIGHUP);
    assert_eq!(old.exit_code(), 0, "{}", old.log_lines().join("\n"));
    let new_pid = read_pid();
    let new_pid = new_pid.trim();
    assert!(
        !new_pid.is_empty() && new_pid != old_pid,
        "pid file: {new_pid:?}"
    );
    let successor = KillOnPanic(Pid::from_raw(new_pid.parse().expect("a pid")));

    // The successor serves the same sockets.
    let (status, _) = request(old.addr, "POST", "/api/greetings", GREETING).expect("POST");
    assert_eq!(status, 200);
    let (status, _) = request(old.admin, "GET", "/readyz", "").expect("GET /readyz");
    assert_eq!(status, 200);

    // It removes its own pid file at exit.
    kill(successor.0, Signal::SIGTERM).expect("stop the successor");
    let deadline = Instant::now() + TIMEOUT;
    while pid_file.exists() && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(10));
    }
    assert!(!pid_file.exists(), "the successor did not exit");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Kills a process that is not our child (a successor) if the test fails.
struct KillOnPanic(Pid);

impl Drop for KillOnPanic {
    fn drop(&mut self) {
        if thread::panicking() {
            let _ = kill(self.0, Signal::SIGKILL);
        }
    }
}

// Traces are exported by a batch on a thread of its own: at exit the last
// finalizer flushes it. A collector that is down must cost a warning that
// counts what was lost, not the exit code, and no more time than the
// budget the supervisor was told.
#[test]
fn a_collector_that_is_down_costs_a_warning_not_the_exit_code() {
    let endpoint = format!("http://{}", closed_port());
    let env = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
        // No export before the signal, however slow this machine: the
        // request's span is still in the batch when the last flush runs.
        ("OTEL_BSP_SCHEDULE_DELAY", "600000"),
    ];
    let mut server = Server::start_with(&[], &env);
    let budget = server.shutdown_budget();
    let (status, body) = request(server.addr, "POST", "/api/greetings", GREETING).expect("POST");
    assert_eq!(status, 200, "{body}");

    let signalled = Instant::now();
    server.signal(Signal::SIGTERM);
    assert_eq!(server.exit_code(), 0, "{}", server.log_lines().join("\n"));
    let took = signalled.elapsed();
    let logs = server.all_log_lines();
    assert!(
        took < budget,
        "exited after {took:?}, past its budget of {budget:?}:\n{}",
        logs.join("\n")
    );
    let warning = logs
        .iter()
        .find(|line| line.contains("traces not flushed; spans dropped"))
        .unwrap_or_else(|| panic!("no warning about the traces:\n{}", logs.join("\n")));
    let dropped = warning
        .split("spans_dropped=")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|count| count.parse::<u64>().ok());
    assert!(dropped.is_some_and(|n| n >= 1), "{warning}");
}

// The budget a supervisor must wait covers the trace flush when traces are
// on, and does not charge for it when they are off.
#[test]
fn the_shutdown_budget_counts_the_trace_flush_only_with_traces_on() {
    let mut plain = Server::start(&[]);
    let without = plain.shutdown_budget();
    plain.signal(Signal::SIGTERM);
    assert_eq!(plain.exit_code(), 0);

    let endpoint = format!("http://{}", closed_port());
    let mut traced = Server::start_with(&[], &[("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)]);
    let with = traced.shutdown_budget();
    traced.signal(Signal::SIGTERM);
    assert_eq!(traced.exit_code(), 0);
    assert_eq!(with, without + TRACE_FLUSH_BUDGET);
}
