//! Restarts that never close the socket, tested against the real binary:
//! socket activation (`LISTEN_FDS`) and the in-place upgrade on SIGHUP
//! (`handoff/src/`).
//!
//! The processes here are started as a bare [`Process`] rather than a
//! `LameduckProcess`: they need a listening socket mapped to fd 3, a binary
//! other than Cargo's, and a process group of their own, so that a failing
//! test kills the successors a server started, not only the server.

mod support;

use std::error::Error as _;
use std::io::{self, Write};
use std::net::{SocketAddr, TcpListener};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper::client::conn::http1::{self, SendRequest};
use hyper::header::{CONNECTION, HOST};
use hyper::Request;
use hyper_util::rt::TokioIo;
use nix::sys::signal::Signal;

use support::binary::{
    connect, create_link, get, pass_listeners, read_pid, read_response, server_command, tempdir,
    Lineage, Process, BINARY,
};

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
        let mut command = server_command(Path::new(BINARY), &taken_addr);
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
    let mut command = server_command(Path::new(BINARY), &admin.to_string());
    command
        .args(["--listen", "127.0.0.1:0", "--data-dir"])
        .arg(&data)
        .arg("--pid-file")
        .arg(&pid_file);
    let mut lineage = Lineage::start(Process::spawn_group(&mut command), pid_file);
    let addr = lineage.first.listening_addr();
    let code = create_link(addr, "https://example.com/handoff");

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime for the clients");

    // In-place upgrades.
    let traffic = Traffic::start(&runtime, addr, &code);
    let started = Instant::now();
    for _ in 0..UPGRADES {
        lineage.upgrade();
    }
    let upgrades_took = started.elapsed();
    let upgrades = traffic.finish(&runtime);
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
        let mut command = server_command(Path::new(BINARY), ANY_PORT);
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
    let traffic = Traffic::start(&runtime, addr, &code);
    let started = Instant::now();
    for _ in 0..RESTARTS {
        server.signal(Signal::SIGTERM);
        assert_eq!(server.exit_code(PATIENCE), 0, "{}", server.log_text());
        server = fresh();
    }
    let restarts_took = started.elapsed();
    let restarts = traffic.finish(&runtime);
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
    std::fs::copy(BINARY, &exe).expect("copy the binary");
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

/// Client tasks of each kind.
const TASKS_PER_KIND: usize = 3;
/// Pause between two requests of one task, so that the clients leave the
/// two CPUs of a CI runner to the servers starting up.
const PAUSE: Duration = Duration::from_millis(2);
/// Pause after a failure, so that a refusing port is not hammered.
const PAUSE_AFTER_FAILURE: Duration = Duration::from_millis(10);
/// One request, connection included, may take this long.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Hard bounds on one task, in case the test never stops it.
const TASK_LIMIT: Duration = Duration::from_secs(120);
const TASK_MAX_REQUESTS: u64 = 200_000;

/// How a client task uses connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// A new connection for every request.
    NewConnection,
    /// One connection for as long as the server keeps it open.
    KeepAlive,
}

impl Kind {
    const ALL: [Kind; 2] = [Kind::NewConnection, Kind::KeepAlive];

    fn name(self) -> &'static str {
        match self {
            Kind::NewConnection => "new connection",
            Kind::KeepAlive => "keep-alive",
        }
    }
}

/// What happened to one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fate {
    /// A 2xx or 3xx status.
    Ok,
    /// The connection was refused.
    Refused,
    /// Reset, broken pipe, or closed before the response was complete.
    Reset,
    /// No complete response within [`REQUEST_TIMEOUT`].
    Timeout,
    /// A status other than 2xx or 3xx.
    Status,
    /// Any other error.
    Other,
}

impl Fate {
    const ALL: [Fate; 6] = [
        Fate::Ok,
        Fate::Refused,
        Fate::Reset,
        Fate::Timeout,
        Fate::Status,
        Fate::Other,
    ];

    fn name(self) -> &'static str {
        match self {
            Fate::Ok => "ok",
            Fate::Refused => "refused",
            Fate::Reset => "reset",
            Fate::Timeout => "timeout",
            Fate::Status => "status",
            Fate::Other => "other",
        }
    }

    fn of_io(error: &io::Error) -> Fate {
        match error.kind() {
            io::ErrorKind::ConnectionRefused => Fate::Refused,
            io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::UnexpectedEof => Fate::Reset,
            io::ErrorKind::TimedOut => Fate::Timeout,
            _ => Fate::Other,
        }
    }

    fn of_hyper(error: &hyper::Error) -> Fate {
        let mut source = error.source();
        while let Some(cause) = source {
            if let Some(io) = cause.downcast_ref::<io::Error>() {
                return Fate::of_io(io);
            }
            source = cause.source();
        }
        if error.is_incomplete_message() || error.is_canceled() || error.is_closed() {
            Fate::Reset
        } else {
            Fate::Other
        }
    }
}

/// A failed request: its class and what the client said.
struct Failure(Fate, String);

impl From<io::Error> for Failure {
    fn from(error: io::Error) -> Failure {
        Failure(Fate::of_io(&error), error.to_string())
    }
}

impl From<hyper::Error> for Failure {
    fn from(error: hyper::Error) -> Failure {
        let mut message = error.to_string();
        let mut source = error.source();
        while let Some(cause) = source {
            message.push_str(&format!(": {cause}"));
            source = cause.source();
        }
        Failure(Fate::of_hyper(&error), message)
    }
}

/// Requests by fate, and the first few failure messages.
#[derive(Clone, Debug, Default)]
struct Counts {
    by_fate: [u64; Fate::ALL.len()],
    samples: Vec<String>,
}

impl Counts {
    fn record(&mut self, outcome: Result<(), Failure>) {
        let fate = match outcome {
            Ok(()) => Fate::Ok,
            Err(Failure(fate, message)) => {
                if self.samples.len() < 5 {
                    self.samples.push(format!("{}: {message}", fate.name()));
                }
                fate
            }
        };
        self.by_fate[fate as usize] += 1;
    }

    fn add(&mut self, other: &Counts) {
        for (sum, n) in self.by_fate.iter_mut().zip(other.by_fate) {
            *sum += n;
        }
        let room = 5usize.saturating_sub(self.samples.len());
        self.samples
            .extend(other.samples.iter().take(room).cloned());
    }

    fn count(&self, fate: Fate) -> u64 {
        self.by_fate[fate as usize]
    }

    fn ok(&self) -> u64 {
        self.count(Fate::Ok)
    }

    fn requests(&self) -> u64 {
        self.by_fate.iter().sum()
    }

    fn failures(&self) -> u64 {
        self.requests() - self.ok()
    }
}

/// The counts of one phase, by kind of client.
struct Tally([Counts; Kind::ALL.len()]);

impl Tally {
    fn of(&self, kind: Kind) -> &Counts {
        &self.0[kind as usize]
    }

    fn total(&self) -> Counts {
        let mut total = Counts::default();
        for counts in &self.0 {
            total.add(counts);
        }
        total
    }

    fn failures(&self) -> u64 {
        self.total().failures()
    }
}

impl std::fmt::Display for Tally {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "  {:<15}{:>9}", "clients", "requests")?;
        for fate in Fate::ALL {
            write!(f, "{:>9}", fate.name())?;
        }
        let total = self.total();
        let rows = Kind::ALL
            .iter()
            .map(|kind| (kind.name(), self.of(*kind)))
            .chain([("all", &total)]);
        for (name, counts) in rows {
            write!(f, "\n  {name:<15}{:>9}", counts.requests())?;
            for n in counts.by_fate {
                write!(f, "{n:>9}")?;
            }
        }
        for sample in &total.samples {
            write!(f, "\n  e.g. {sample}")?;
        }
        Ok(())
    }
}

/// Client tasks sending `GET /healthz` and `GET /{code}` (a redirect) to
/// the server in turns, until [`Traffic::finish`].
struct Traffic {
    stop: Arc<AtomicBool>,
    tasks: Vec<(Kind, tokio::task::JoinHandle<Counts>)>,
}

impl Traffic {
    fn start(runtime: &tokio::runtime::Runtime, addr: SocketAddr, code: &str) -> Traffic {
        let stop = Arc::new(AtomicBool::new(false));
        let redirect = format!("/{code}");
        let tasks = Kind::ALL
            .iter()
            .flat_map(|kind| std::iter::repeat_n(*kind, TASKS_PER_KIND))
            .map(|kind| {
                let task = client(kind, addr, redirect.clone(), Arc::clone(&stop));
                (kind, runtime.spawn(task))
            })
            .collect();
        // Let every task reach the server before the test changes anything.
        thread::sleep(Duration::from_millis(200));
        Traffic { stop, tasks }
    }

    fn finish(self, runtime: &tokio::runtime::Runtime) -> Tally {
        self.stop.store(true, Ordering::Relaxed);
        let mut tally = Tally(Default::default());
        for (kind, task) in self.tasks {
            let counts = runtime.block_on(task).expect("a client task panicked");
            tally.0[kind as usize].add(&counts);
        }
        tally
    }
}

/// One client task: requests until `stop`, within its hard bounds.
async fn client(kind: Kind, addr: SocketAddr, redirect: String, stop: Arc<AtomicBool>) -> Counts {
    let mut counts = Counts::default();
    let mut connection: Option<SendRequest<Empty<Bytes>>> = None;
    let started = Instant::now();
    for i in 0..TASK_MAX_REQUESTS {
        if stop.load(Ordering::Relaxed) || started.elapsed() > TASK_LIMIT {
            break;
        }
        let path = if i % 2 == 0 { "/healthz" } else { &redirect };
        let attempt = async {
            // A connection the server closed while idle (after
            // `Connection: close`, or at its drain) carried no request:
            // open another one, as any client pool does.
            if let Some(sender) = &mut connection {
                if sender.ready().await.is_err() {
                    connection = None;
                }
            }
            let sender = match &mut connection {
                Some(sender) => sender,
                None => connection.insert(open(addr).await?),
            };
            let keep = exchange(sender, path).await?;
            if !keep || kind == Kind::NewConnection {
                connection = None;
            }
            Ok(())
        };
        let outcome = match tokio::time::timeout(REQUEST_TIMEOUT, attempt).await {
            Ok(outcome) => outcome,
            Err(_) => Err(Failure(Fate::Timeout, format!("{path}: no answer"))),
        };
        let pause = if outcome.is_ok() {
            PAUSE
        } else {
            connection = None;
            PAUSE_AFTER_FAILURE
        };
        counts.record(outcome);
        tokio::time::sleep(pause).await;
    }
    counts
}

/// Connects and completes the HTTP/1 handshake.
async fn open(addr: SocketAddr) -> Result<SendRequest<Empty<Bytes>>, Failure> {
    let stream = tokio::net::TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    let (sender, connection) = http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(sender)
}

/// Sends `GET path` and reads the whole response; whether the connection
/// may be used again.
async fn exchange(sender: &mut SendRequest<Empty<Bytes>>, path: &str) -> Result<bool, Failure> {
    let request = Request::get(path)
        .header(HOST, "lameduck")
        .body(Empty::new())
        .expect("a valid request");
    let response = sender.send_request(request).await?;
    let status = response.status();
    let closes = response
        .headers()
        .get(CONNECTION)
        .is_some_and(|value| value.as_bytes().eq_ignore_ascii_case(b"close"));
    response.into_body().collect().await?;
    if status.is_success() || status.is_redirection() {
        Ok(!closes)
    } else {
        Err(Failure(Fate::Status, format!("{path}: {status}")))
    }
}
