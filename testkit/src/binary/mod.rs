//! The real `lameduck` binary as a child process, for the guarantees only a
//! process shows: real signals, exit codes, the listener's life and the logs.
//!
//! [`LameduckProcess::start`] runs `lameduck server` on `127.0.0.1:0` with a
//! fresh data directory, captures every line the child writes on stdout and
//! stderr, and returns once the server logs its address. [`run`] is for
//! invocations that end on their own (usage and startup errors). Dropping a
//! process that still runs kills it with SIGKILL.
//!
//! The rest, one module each, all re-exported here:
//! - `lineage`: a server and its successors across in-place upgrades (the
//!   command, the listeners passed on, the pid file);
//! - `raw`: raw HTTP/1 ([`connect`], [`get`], [`read_response`],
//!   [`wait_for_eof`]) on blocking sockets with read and write timeouts, so
//!   that a test sees exactly what the server put on the wire
//!   (`Connection: close`, EOF) and never waits forever;
//! - `answers`: the requests and checks the suites share (a link created,
//!   an error's JSON, metrics, the database's state);
//! - `clients`: keep-alive clients until the server lets them go, and the
//!   bound a kill leaves on a count.
//!
//! Every wait here is bounded.

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;
use tempfile::TempDir;

mod answers;
mod clients;
mod lineage;
mod raw;

pub use answers::*;
pub use clients::*;
pub use lineage::*;
pub use raw::*;

/// The binary under test, as Cargo builds it for the integration tests and
/// names it in their environment when it runs them.
///
/// # Panics
/// Outside `cargo test`, which sets `CARGO_BIN_EXE_lameduck`.
pub fn binary() -> &'static Path {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(|| {
        std::env::var_os("CARGO_BIN_EXE_lameduck")
            .map(PathBuf::from)
            .expect("CARGO_BIN_EXE_lameduck: run the tests with `cargo test`")
    })
}

/// How long [`LameduckProcess::start`] waits for the `listening on` line
/// (the child opens its database and runs migrations first).
pub const START_TIMEOUT: Duration = Duration::from_secs(20);

/// Read and write timeout of the sockets [`connect`] opens: the longest a
/// single raw HTTP exchange may stall before the test fails.
pub const IO_TIMEOUT: Duration = Duration::from_secs(10);

/// How often the `wait_*` loops poll the child.
const POLL_INTERVAL: Duration = Duration::from_millis(10);

/// What the server logs once it listens, followed by `://ADDR` (plain
/// HTTP) or `s://ADDR` (TLS).
const LISTENING: &str = "listening on http";

/// What the server logs once its admin listener serves, followed by its
/// address.
const ADMIN: &str = "admin endpoints on http";

/// Which pipe a captured line came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    /// The child's stdout (where its logs go).
    Stdout,
    /// The child's stderr (usage errors).
    Stderr,
}

/// Lines captured from the child, in arrival order, shared with the reader
/// threads; `grew` is notified on every new line and when a pipe closes.
#[derive(Default)]
struct Captured {
    lines: Mutex<Vec<(Stream, String)>>,
    grew: Condvar,
}

impl Captured {
    fn lock(&self) -> MutexGuard<'_, Vec<(Stream, String)>> {
        // A reader thread cannot panic while holding the lock; recover anyway.
        self.lines
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn all(&self) -> Vec<String> {
        self.lock().iter().map(|(_, line)| line.clone()).collect()
    }

    fn of(&self, stream: Stream) -> Vec<String> {
        self.lock()
            .iter()
            .filter(|(from, _)| *from == stream)
            .map(|(_, line)| line.clone())
            .collect()
    }

    /// Waits until a line contains `needle`; returns that line.
    fn wait_for(&self, needle: &str, timeout: Duration) -> Option<String> {
        let deadline = Instant::now() + timeout;
        let mut lines = self.lock();
        loop {
            if let Some((_, line)) = lines.iter().find(|(_, line)| line.contains(needle)) {
                return Some(line.clone());
            }
            let left = deadline.checked_duration_since(Instant::now())?;
            // Wake up now and then even without news, so the deadline holds.
            let wait = left.min(Duration::from_millis(100));
            lines = self
                .grew
                .wait_timeout(lines, wait)
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
    }
}

/// A child process whose stdout and stderr are captured line by line.
/// Dropped while it runs, it is killed (with its process group, if it
/// leads one).
pub struct Process {
    child: Child,
    captured: Arc<Captured>,
    /// It leads a process group of its own (its successors join it).
    group: bool,
}

impl Process {
    /// Starts `command` with its output piped and captured. A binary just
    /// copied may still be open for writing in a process another test
    /// thread is forking: ETXTBSY is retried a few times.
    ///
    /// # Panics
    /// If the command cannot be started.
    pub fn spawn(command: &mut Command) -> Process {
        command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut attempts = 0;
        let mut child = loop {
            match command.spawn() {
                Ok(child) => break child,
                Err(e) if e.raw_os_error() == Some(nix::libc::ETXTBSY) && attempts < 50 => {
                    attempts += 1;
                    thread::sleep(Duration::from_millis(20));
                }
                Err(e) => panic!("cannot run {command:?}: {e}"),
            }
        };
        let captured = Arc::new(Captured::default());
        capture(
            child.stdout.take().expect("piped"),
            Stream::Stdout,
            Arc::clone(&captured),
        );
        capture(
            child.stderr.take().expect("piped"),
            Stream::Stderr,
            Arc::clone(&captured),
        );
        Process {
            child,
            captured,
            group: false,
        }
    }

    /// Like [`Process::spawn`], as the leader of a new process group that
    /// its successors inherit; dropped while it runs, the group is killed.
    pub fn spawn_group(command: &mut Command) -> Process {
        let mut process = Process::spawn(command.process_group(0));
        process.group = true;
        process
    }

    /// The child's process id.
    pub fn pid(&self) -> Pid {
        Pid::from_raw(i32::try_from(self.child.id()).expect("a pid fits in i32"))
    }

    /// Sends `signal` to the child.
    ///
    /// # Panics
    /// If the child has already been reaped (its pid may belong to another
    /// process by now), or if the signal cannot be sent.
    pub fn signal(&mut self, signal: Signal) {
        // Until `try_wait` reaps it, the pid stays ours, even as a zombie.
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!(
                "cannot send {signal}: the child already exited ({status}); logs:\n{}",
                self.log_text()
            );
        }
        kill(self.pid(), signal).unwrap_or_else(|e| panic!("cannot send {signal}: {e}"));
    }

    /// Waits up to `timeout` for the child to exit; `None` if it still runs.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        wait_child(&mut self.child, timeout)
    }

    /// Waits up to `within` for the child to exit and returns its exit
    /// code.
    ///
    /// # Panics
    /// With the child's logs, if it still runs after `within` or was ended
    /// by a signal.
    pub fn exit_code(&mut self, within: Duration) -> i32 {
        let Some(status) = self.wait_exit(within) else {
            panic!(
                "the child still runs after {within:?}; logs:\n{}",
                self.log_text()
            );
        };
        status.code().unwrap_or_else(|| {
            panic!(
                "the child was ended by a signal ({status}); logs:\n{}",
                self.log_text()
            )
        })
    }

    /// Whether the child is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Every line the child wrote so far, stdout and stderr, in order.
    pub fn logs(&self) -> Vec<String> {
        self.captured.all()
    }

    /// The child's logs as one string, for assertion messages.
    pub fn log_text(&self) -> String {
        self.logs().join("\n")
    }

    /// Waits up to `timeout` until a line contains `needle`.
    pub fn wait_for_log(&self, needle: &str, timeout: Duration) -> bool {
        self.captured.wait_for(needle, timeout).is_some()
    }

    /// Whether a line captured so far contains `needle`.
    pub fn has_logged(&self, needle: &str) -> bool {
        self.captured.wait_for(needle, Duration::ZERO).is_some()
    }

    /// The first line containing `needle`, waiting up to `timeout`.
    ///
    /// # Panics
    /// With the logs, if no line contains it in time.
    pub fn expect_log(&self, needle: &str, timeout: Duration) -> String {
        self.captured
            .wait_for(needle, timeout)
            .unwrap_or_else(|| panic!("no line contains {needle:?}:\n{}", self.log_text()))
    }

    /// The address of the first `listening on http://ADDR` line, waiting up
    /// to [`START_TIMEOUT`].
    pub fn listening_addr(&self) -> SocketAddr {
        let line = self.expect_log(LISTENING, START_TIMEOUT);
        parse_address(&line, LISTENING).unwrap_or_else(|| panic!("no address in {line:?}"))
    }

    /// The first line containing `needle`, parsed as JSON (for
    /// `--log-format json`).
    pub fn json_log(&self, needle: &str) -> Option<serde_json::Value> {
        let line = self.captured.wait_for(needle, Duration::ZERO)?;
        serde_json::from_str(&line).ok()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if self.is_running() {
            let _ = if self.group {
                killpg(self.pid(), Signal::SIGKILL)
            } else {
                kill(self.pid(), Signal::SIGKILL)
            };
            let _ = self.child.wait();
        }
    }
}

/// A running `lameduck server`; everything of [`Process`] through `Deref`.
pub struct LameduckProcess {
    process: Process,
    addr: SocketAddr,
    admin_addr: SocketAddr,
    /// The `--data-dir` (SQLite database); removed on drop, after the child.
    _data_dir: TempDir,
}

impl std::ops::Deref for LameduckProcess {
    type Target = Process;

    fn deref(&self) -> &Process {
        &self.process
    }
}

impl std::ops::DerefMut for LameduckProcess {
    fn deref_mut(&mut self) -> &mut Process {
        &mut self.process
    }
}

impl LameduckProcess {
    /// Runs `lameduck server ARGS` with `ENVS` and waits until it listens.
    ///
    /// Adds `--listen 127.0.0.1:0` and `--data-dir <fresh temporary
    /// directory>` unless `args` (or `envs`, for the listen address) set
    /// them. The child gets `RUST_LOG=info` unless `envs` sets it, and none
    /// of the test's own `LAMEDUCK_*`, `OTEL_*` or `DATABASE_URL` variables.
    ///
    /// # Panics
    /// With everything the child wrote, if it does not log `listening on
    /// http://ADDR` within [`START_TIMEOUT`].
    pub fn start(args: &[&str], envs: &[(&str, &str)]) -> LameduckProcess {
        LameduckProcess::start_exe(binary(), args, envs)
    }

    /// Like [`LameduckProcess::start`], running the binary at `exe` (a copy
    /// that a test may later replace, as a broken release would).
    pub fn start_exe(exe: &Path, args: &[&str], envs: &[(&str, &str)]) -> LameduckProcess {
        let (mut process, data_dir) = spawn(exe, args, envs);
        let deadline = Instant::now() + START_TIMEOUT;
        let captured = Arc::clone(&process.captured);
        let addr = loop {
            let public = captured.wait_for(LISTENING, Duration::from_millis(100));
            let admin = captured.wait_for(ADMIN, Duration::ZERO);
            if let (Some(public), Some(admin)) = (public, admin) {
                break parse_address(&public, LISTENING).zip(parse_address(&admin, ADMIN));
            }
            if Instant::now() > deadline || !process.is_running() {
                break None;
            }
        };
        let Some(addr) = addr else {
            let _ = process.child.kill();
            let status = process.child.wait();
            panic!(
                "lameduck did not log `{LISTENING}://ADDR` within {START_TIMEOUT:?} \
                 (exit: {status:?}); it wrote:\n{}",
                captured.all().join("\n")
            );
        };
        let (addr, admin_addr) = addr;
        LameduckProcess {
            process,
            addr,
            admin_addr,
            _data_dir: data_dir,
        }
    }

    /// The address the server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The admin listener's address: `/healthz`, `/readyz`, `/metrics`.
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin_addr
    }

    /// Waits until the server's own `lameduck_requests_in_flight` gauge,
    /// read on the admin listener (whose requests it does not count), shows
    /// `n` requests, so that a signal sent next is known to find them.
    ///
    /// # Panics
    /// With the last `/metrics`, if they never show up within
    /// [`START_TIMEOUT`].
    pub fn wait_in_flight(&self, n: i64) {
        let deadline = Instant::now() + START_TIMEOUT;
        let mut last = String::new();
        while Instant::now() < deadline {
            if let Ok(metrics) = request(self.admin_addr, "GET", "/metrics", None) {
                last = String::from_utf8_lossy(&metrics.body).into_owned();
                let in_flight = last
                    .lines()
                    .find_map(|line| line.strip_prefix("lameduck_requests_in_flight "))
                    .and_then(|value| value.trim().parse::<i64>().ok());
                if in_flight.is_some_and(|count| count >= n) {
                    return;
                }
            }
            thread::sleep(POLL_INTERVAL);
        }
        panic!("{n} request(s) never showed up in flight; last /metrics:\n{last}");
    }
}

/// How a [`run`] ended.
#[derive(Debug)]
pub struct Finished {
    /// The exit status.
    pub status: ExitStatus,
    /// Lines written on stdout.
    pub stdout: Vec<String>,
    /// Lines written on stderr.
    pub stderr: Vec<String>,
}

impl Finished {
    /// Both streams, for assertion messages and searches.
    pub fn output(&self) -> String {
        let mut all = self.stdout.clone();
        all.extend(self.stderr.iter().cloned());
        all.join("\n")
    }
}

/// Runs `lameduck server ARGS` (with the defaults of
/// [`LameduckProcess::start`]) for a run expected to end on its own, and
/// returns how it ended.
///
/// # Panics
/// If it still runs after `timeout` (it is killed first).
pub fn run(args: &[&str], envs: &[(&str, &str)], timeout: Duration) -> Finished {
    let (mut process, _data_dir) = spawn(binary(), args, envs);
    let captured = Arc::clone(&process.captured);
    let Some(status) = process.wait_exit(timeout) else {
        panic!(
            "lameduck {args:?} did not exit within {timeout:?}; it wrote:\n{}",
            process.log_text()
        );
    };
    drop(process);
    // The pipes close with the child; give the readers a moment to finish.
    let deadline = Instant::now() + Duration::from_secs(2);
    while Arc::strong_count(&captured) > 1 && Instant::now() < deadline {
        thread::sleep(POLL_INTERVAL);
    }
    Finished {
        status,
        stdout: captured.of(Stream::Stdout),
        stderr: captured.of(Stream::Stderr),
    }
}

fn spawn(exe: &Path, args: &[&str], envs: &[(&str, &str)]) -> (Process, TempDir) {
    let data_dir = tempfile::Builder::new()
        .prefix("lameduck-bin-")
        .tempdir()
        .unwrap_or_else(|e| panic!("cannot create a data directory: {e}"));
    let mut command = Command::new(exe);
    command.arg("server");
    let sets_env = |name: &str| envs.iter().any(|(key, _)| *key == name);
    if !args.contains(&"--listen") && !sets_env("LAMEDUCK_LISTEN") {
        command.args(["--listen", "127.0.0.1:0"]);
    }
    if !args.contains(&"--admin-listen") && !sets_env("LAMEDUCK_ADMIN_LISTEN") {
        command.args(["--admin-listen", "127.0.0.1:0"]);
    }
    if !args.contains(&"--data-dir") && !sets_env("LAMEDUCK_DATA_DIR") {
        command.arg("--data-dir").arg(data_dir.path());
    }
    command.args(args);
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy();
        // `OTEL_*` too: a shell's collector must not catch a test's spans.
        if key.starts_with("LAMEDUCK_") || key.starts_with("OTEL_") || key == "DATABASE_URL" {
            command.env_remove(&*key);
        }
    }
    command.env("RUST_LOG", "info").envs(envs.iter().copied());
    (Process::spawn(&mut command), data_dir)
}

/// Copies `pipe` line by line into `captured` until the child closes it.
fn capture(pipe: impl Read + Send + 'static, stream: Stream, captured: Arc<Captured>) {
    thread::spawn(move || {
        let mut reader = BufReader::new(pipe);
        let mut line = Vec::new();
        loop {
            line.clear();
            match reader.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    let text = String::from_utf8_lossy(&line).trim_end().to_owned();
                    captured.lock().push((stream, text));
                    captured.grew.notify_all();
                }
            }
        }
        captured.grew.notify_all();
    });
}

fn wait_child(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) if Instant::now() < deadline => thread::sleep(POLL_INTERVAL),
            Ok(None) => return None,
            Err(e) => panic!("cannot wait for lameduck: {e}"),
        }
    }
}

/// The address in a `listening on http://ADDR` (or `https://ADDR`) line,
/// text or JSON.
fn parse_address(line: &str, prefix: &str) -> Option<SocketAddr> {
    let rest = &line[line.find(prefix)? + prefix.len()..];
    let rest = rest.strip_prefix("s").unwrap_or(rest).strip_prefix("://")?;
    let end = rest
        .find(|c: char| !(c.is_ascii_hexdigit() || matches!(c, '.' | ':' | '[' | ']')))
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}
