//! The real `lameduck` binary as a child process, for the guarantees only a
//! process shows: real signals, exit codes, the listener's life and the logs.
//!
//! [`LameduckProcess::start`] runs `lameduck server` on `127.0.0.1:0` with a
//! fresh data directory, captures every line the child writes on stdout and
//! stderr, and returns once the server logs its address. [`run`] is for
//! invocations that end on their own (usage and startup errors). Dropping a
//! process that still runs kills it with SIGKILL.
//!
//! The raw HTTP/1 helpers ([`connect`], [`get`], [`read_response`],
//! [`wait_for_eof`]) work on blocking sockets with read and write timeouts,
//! so that a test sees exactly what the server put on the wire
//! (`Connection: close`, EOF) and never waits forever.
//!
//! Every wait here is bounded.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use command_fds::{CommandFdExt, FdMapping};
use nix::errno::Errno;
use nix::sys::signal::{kill, killpg, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use tempfile::TempDir;

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

// === process helpers for handoffs ===

/// `exe server --admin-listen ADMIN` with piped output, `RUST_LOG=info`,
/// none of the test's own `LAMEDUCK_*`, `DATABASE_URL`, `LISTEN_*` or
/// `NOTIFY_SOCKET` variables, and a process group of its own (inherited by
/// its successors).
pub fn server_command(exe: &Path, admin: &str) -> Command {
    let mut command = Command::new(exe);
    command.args(["server", "--admin-listen", admin]);
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy();
        if key.starts_with("LAMEDUCK_")
            || key.starts_with("LISTEN_")
            || key == "DATABASE_URL"
            || key == "NOTIFY_SOCKET"
        {
            command.env_remove(&*key);
        }
    }
    command.env("RUST_LOG", "info");
    command
}

/// Passes `listeners` as fds 3, 4, … with `LISTEN_FDS`, as systemd does.
pub fn pass_listeners(command: &mut Command, listeners: &[&impl AsFd]) {
    let mappings = (3..)
        .zip(listeners)
        .map(|(child_fd, listener)| FdMapping {
            parent_fd: listener
                .as_fd()
                .try_clone_to_owned()
                .expect("duplicate the socket"),
            child_fd,
        })
        .collect();
    command
        .env("LISTEN_FDS", listeners.len().to_string())
        .fd_mappings(mappings)
        .expect("the fds are free");
}

/// The pid in `path`, if it holds one.
pub fn read_pid(path: &Path) -> Option<Pid> {
    let text = std::fs::read_to_string(path).ok()?;
    text.trim().parse().ok().map(Pid::from_raw)
}

/// How long a [`Lineage`] waits for a process to start, hand over or exit.
const LINEAGE_PATIENCE: Duration = Duration::from_secs(15);

/// A server and the successors of its in-place upgrades, one process group.
/// Dropped before [`Lineage::stop`], the whole group is killed.
pub struct Lineage {
    /// The process the test started; every successor logs to its pipes.
    pub first: Process,
    /// The process serving now: the pid its pid file names.
    current: Pid,
    pid_file: PathBuf,
    stopped: bool,
}

impl Lineage {
    /// Takes over `first`, once it serves and has written `pid_file`. The
    /// test must have made itself a child subreaper
    /// (`nix::sys::prctl::set_child_subreaper`) so that successors can be
    /// waited for.
    pub fn start(first: Process, pid_file: PathBuf) -> Lineage {
        let current = first.pid();
        first.expect_log("listening on ", LINEAGE_PATIENCE);
        assert_eq!(read_pid(&pid_file), Some(current), "{}", first.log_text());
        Lineage {
            first,
            current,
            pid_file,
            stopped: false,
        }
    }

    /// SIGHUP to the current process; returns once the pid file names its
    /// successor and the old process has exited with code 0.
    pub fn upgrade(&mut self) {
        let old = self.current;
        kill(old, Signal::SIGHUP).expect("send SIGHUP");
        let deadline = Instant::now() + LINEAGE_PATIENCE;
        let new = loop {
            match read_pid(&self.pid_file) {
                Some(pid) if pid != old => break pid,
                _ if Instant::now() < deadline => thread::sleep(POLL_INTERVAL),
                other => panic!(
                    "no successor of {old} after {LINEAGE_PATIENCE:?} (pid file: {other:?}):\n{}",
                    self.first.log_text()
                ),
            }
        };
        let left = deadline.saturating_duration_since(Instant::now());
        assert_eq!(self.exit_code(old, left), 0, "{}", self.first.log_text());
        self.current = new;
    }

    /// SIGTERM to the current process; its exit code.
    pub fn stop(&mut self) -> i32 {
        kill(self.current, Signal::SIGTERM).expect("send SIGTERM");
        let code = self.exit_code(self.current, LINEAGE_PATIENCE);
        self.stopped = true;
        code
    }

    /// Waits for `pid` (the first process, or a successor re-parented to
    /// this subreaper) to exit; its exit code.
    pub fn exit_code(&mut self, pid: Pid, timeout: Duration) -> i32 {
        if pid == self.first.pid() {
            return self.first.exit_code(timeout);
        }
        let deadline = Instant::now() + timeout;
        loop {
            match waitpid(pid, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(_, code)) => return code,
                Ok(WaitStatus::StillAlive) if Instant::now() < deadline => {
                    thread::sleep(POLL_INTERVAL);
                }
                other => panic!(
                    "process {pid} did not exit with a code within {timeout:?} ({other:?}):\n{}",
                    self.first.log_text()
                ),
            }
        }
    }
}

impl Drop for Lineage {
    fn drop(&mut self) {
        if !self.stopped {
            let _ = killpg(self.first.pid(), Signal::SIGKILL);
            for _ in 0..100 {
                match waitpid(Pid::from_raw(-self.first.pid().as_raw()), None) {
                    Ok(_) | Err(Errno::EINTR) => {}
                    Err(_) => break,
                }
            }
        }
    }
}

// === raw HTTP/1 ===

/// A response as it came off the wire.
#[derive(Debug)]
pub struct RawResponse {
    /// The status code.
    pub status: u16,
    /// Header names (lower-cased) and values, in order.
    pub headers: Vec<(String, String)>,
    /// The body, de-chunked.
    pub body: Vec<u8>,
}

impl RawResponse {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(key, _)| *key == name)
            .map(|(_, value)| value.as_str())
    }

    /// Whether the response carries `Connection: close`.
    pub fn closes_connection(&self) -> bool {
        self.header("connection")
            .is_some_and(|value| value.eq_ignore_ascii_case("close"))
    }

    /// The body parsed as JSON.
    ///
    /// # Panics
    /// If the body is not JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "body is not JSON ({e}): {}",
                String::from_utf8_lossy(&self.body)
            )
        })
    }
}

/// A fresh temporary directory whose name starts with `prefix`, removed
/// when dropped.
pub fn tempdir(prefix: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .expect("a temporary directory")
}

/// A complete, valid body for `POST /api/links`.
pub const LINK: &str = r#"{"url":"https://example.com/x"}"#;

/// Where [`start_slow_post`] splits [`LINK`]: the first part goes with the
/// request head, the rest when the test lets the request finish.
pub const LINK_SPLIT: usize = 10;

/// Sends the head of `POST /api/links` and the first [`LINK_SPLIT`] bytes
/// of [`LINK`]: the handler waits for the rest, which holds a request in
/// flight without any debug route.
pub fn start_slow_post(addr: SocketAddr) -> TcpStream {
    start_slow_post_of(addr, LINK)
}

/// Like [`start_slow_post`], for the JSON `body` (longer than
/// [`LINK_SPLIT`] bytes).
pub fn start_slow_post_of(addr: SocketAddr, body: &str) -> TcpStream {
    let mut stream = connect(addr);
    begin_slow_post(&mut stream, body);
    stream
}

/// Writes the head of `POST /api/links` and the first [`LINK_SPLIT`] bytes
/// of `body` to any stream (TCP, TLS, a Unix socket): the handler then
/// waits for the rest, which [`finish_slow_post_of`] sends.
pub fn begin_slow_post(stream: &mut impl Write, body: &str) {
    begin_slow_post_with(stream, body, "");
}

/// [`begin_slow_post`] with more `headers` (`Name: value\r\n` each).
pub fn begin_slow_post_with(stream: &mut impl Write, body: &str, headers: &str) {
    write!(
        stream,
        "POST /api/links HTTP/1.1\r\nHost: lameduck\r\nContent-Type: application/json\r\n\
         {headers}Content-Length: {}\r\n\r\n{}",
        body.len(),
        &body[..LINK_SPLIT]
    )
    .expect("send the request head");
    stream.flush().expect("flush the request head");
}

/// Sends the rest of the body [`start_slow_post`] began.
pub fn finish_slow_post(stream: &mut impl Write) {
    finish_slow_post_of(stream, LINK);
}

/// Sends the rest of the `body` [`begin_slow_post`] began.
pub fn finish_slow_post_of(stream: &mut impl Write, body: &str) {
    stream
        .write_all(&body.as_bytes()[LINK_SPLIT..])
        .expect("send the rest of the body");
    stream.flush().expect("flush the body");
}

/// Sends `method path` with a JSON `body` (or none) on a new connection
/// that the request closes, and reads the response.
///
/// # Errors
/// Any I/O error, including a refused connection.
pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> io::Result<RawResponse> {
    request_with(addr, method, path, "", body)
}

/// [`request`] with more `headers` (`Name: value\r\n` each).
///
/// # Errors
/// Any I/O error, including a refused connection.
pub fn request_with(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &str,
    body: Option<&str>,
) -> io::Result<RawResponse> {
    let mut stream = TcpStream::connect_timeout(&addr, IO_TIMEOUT)?;
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    let body = body.unwrap_or_default();
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: lameduck\r\nConnection: close\r\n\
         Content-Type: application/json\r\n{headers}Content-Length: {}\r\n\r\n{body}",
        body.len()
    )?;
    read_response(&mut stream)
}

/// Sends a whole `POST /api/links` with the JSON `body` on a new
/// connection and returns it unread: the answer is the test's to wait for.
///
/// # Panics
/// If the request cannot be sent.
pub fn send_create(addr: SocketAddr, body: &str) -> TcpStream {
    let mut stream = connect(addr);
    write!(
        stream,
        "POST /api/links HTTP/1.1\r\nHost: lameduck\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .expect("send POST /api/links");
    stream
}

/// Creates a link to `url` and returns its code.
///
/// # Panics
/// Unless the server answers 201 with a code.
pub fn create_link(addr: SocketAddr, url: &str) -> String {
    let body = serde_json::json!({ "url": url }).to_string();
    let response = request(addr, "POST", "/api/links", Some(&body)).expect("POST /api/links");
    assert_eq!(response.status, 201, "{response:?}");
    response.json()["code"]
        .as_str()
        .expect("the new link's code")
        .to_owned()
}

/// Opens a connection to `addr` with [`IO_TIMEOUT`] on reads and writes.
///
/// # Panics
/// If the connection cannot be made.
pub fn connect(addr: SocketAddr) -> TcpStream {
    let stream = TcpStream::connect_timeout(&addr, IO_TIMEOUT)
        .unwrap_or_else(|e| panic!("cannot connect to {addr}: {e}"));
    stream
        .set_read_timeout(Some(IO_TIMEOUT))
        .and_then(|()| stream.set_write_timeout(Some(IO_TIMEOUT)))
        .and_then(|()| stream.set_nodelay(true))
        .expect("socket options");
    stream
}

/// Sends `GET path` (keep-alive) on `stream` and reads the response.
///
/// # Errors
/// Any I/O error, including EOF before a complete response.
pub fn get(stream: &mut TcpStream, path: &str) -> io::Result<RawResponse> {
    // One write: `write!` would send each piece as a segment of its own,
    // and Nagle's algorithm hold the last for the server's delayed ACK.
    stream.write_all(format!("GET {path} HTTP/1.1\r\nHost: lameduck\r\n\r\n").as_bytes())?;
    read_response(stream)
}

/// Reads one complete response (head, then a `Content-Length` or chunked
/// body, or a body up to EOF) from `stream`, reading no further.
///
/// # Errors
/// Any I/O error, or `UnexpectedEof` if the server closed mid-response.
pub fn read_response(stream: &mut impl Read) -> io::Result<RawResponse> {
    let head = read_head(stream)?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| invalid(format!("bad status line {status_line:?}")))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(key, value)| (key.trim().to_ascii_lowercase(), value.trim().to_owned()))
        .collect();
    let mut response = RawResponse {
        status,
        headers,
        body: Vec::new(),
    };
    if let Some(length) = response.header("content-length") {
        let length = length
            .parse()
            .map_err(|_| invalid(format!("bad content-length {length:?}")))?;
        response.body = vec![0; length];
        stream.read_exact(&mut response.body)?;
    } else if response
        .header("transfer-encoding")
        .is_some_and(|value| value.eq_ignore_ascii_case("chunked"))
    {
        response.body = read_chunked(stream)?;
    } else if !(status == 204 || status == 304 || (100..200).contains(&status)) {
        stream.read_to_end(&mut response.body)?;
    }
    Ok(response)
}

/// Waits up to `timeout` for the server to close `stream`: `Ok(true)` on EOF,
/// `Ok(false)` if it stays open (or sends data instead).
///
/// # Errors
/// Any other I/O error, such as a reset.
pub fn wait_for_eof(stream: &mut TcpStream, timeout: Duration) -> io::Result<bool> {
    stream.set_read_timeout(Some(timeout.max(Duration::from_millis(1))))?;
    let mut byte = [0; 1];
    let result = match uninterrupted(|| stream.read(&mut byte)) {
        Ok(0) => Ok(true),
        Ok(_) => Ok(false),
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) =>
        {
            Ok(false)
        }
        Err(e) => Err(e),
    };
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    result
}

/// Runs the socket call `op` again while it fails with EINTR. A socket
/// call with a timeout (`SO_RCVTIMEO`, as every client here sets) is never
/// restarted by the kernel: it fails with EINTR when a signal handler runs
/// or the process is stopped and continued (signal(7)), neither of which is
/// the server's doing.
///
/// # Errors
/// Any other error of `op`.
pub fn uninterrupted<T>(mut op: impl FnMut() -> io::Result<T>) -> io::Result<T> {
    loop {
        match op() {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            result => return result,
        }
    }
}

/// Reads up to and including the blank line that ends a response head.
fn read_head(stream: &mut impl Read) -> io::Result<String> {
    const MAX_HEAD: usize = 64 * 1024;
    let mut head = Vec::new();
    let mut byte = [0; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() > MAX_HEAD {
            return Err(invalid("response head too long".to_owned()));
        }
        if uninterrupted(|| stream.read(&mut byte))? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "connection closed after {} bytes of response head",
                    head.len()
                ),
            ));
        }
        head.push(byte[0]);
    }
    String::from_utf8(head).map_err(|_| invalid("response head is not UTF-8".to_owned()))
}

fn read_chunked(stream: &mut impl Read) -> io::Result<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let size_line = read_line(stream)?;
        let size = size_line.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size, 16)
            .map_err(|_| invalid(format!("bad chunk size {size_line:?}")))?;
        if size == 0 {
            // Trailers, if any, end with an empty line.
            while !read_line(stream)?.is_empty() {}
            return Ok(body);
        }
        let start = body.len();
        body.resize(start + size, 0);
        stream.read_exact(&mut body[start..])?;
        read_line(stream)?;
    }
}

fn read_line(stream: &mut impl Read) -> io::Result<String> {
    let mut line = Vec::new();
    let mut byte = [0; 1];
    while !line.ends_with(b"\r\n") {
        stream.read_exact(&mut byte)?;
        line.push(byte[0]);
    }
    line.truncate(line.len() - 2);
    String::from_utf8(line).map_err(|_| invalid("chunk line is not UTF-8".to_owned()))
}

fn invalid(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}

// === answers, metrics and readiness (shared by the suites) ===

/// Words that would betray internals in an error body.
pub const INTERNALS: [&str; 6] = [
    "sqlx",
    "panicked",
    "src/",
    ".rs:",
    "backtrace",
    "postgres://",
];

/// `GET path` on a new connection.
pub fn fresh_get(addr: SocketAddr, path: &str) -> RawResponse {
    let mut stream = connect(addr);
    get(&mut stream, path).unwrap_or_else(|e| panic!("GET {path}: {e}"))
}

/// `POST /api/links` with `body` and, if given, a `Content-Type`, on a new
/// connection.
pub fn post_links(addr: SocketAddr, body: &[u8], content_type: Option<&str>) -> RawResponse {
    let mut stream = connect(addr);
    let mut head = format!(
        "POST /api/links HTTP/1.1\r\nHost: lameduck\r\nContent-Length: {}\r\n",
        body.len()
    );
    if let Some(content_type) = content_type {
        head.push_str(&format!("Content-Type: {content_type}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).expect("send the head");
    stream.write_all(body).expect("send the body");
    read_response(&mut stream).unwrap_or_else(|e| panic!("POST /api/links: {e}"))
}

/// `POST /api/links` of a JSON `body` on a new connection.
pub fn post_json(addr: SocketAddr, body: &str) -> RawResponse {
    post_links(addr, body.as_bytes(), Some("application/json"))
}

/// The body of a link with a custom `code`.
pub fn link_body(code: &str) -> String {
    format!(r#"{{"url":"https://example.com/{code}","code":"{code}"}}"#)
}

/// Asserts an error answer: `status`, a JSON body `{"error": "..."}` with a
/// message, and nothing of the internals. Returns the message.
pub fn assert_json_error(response: &RawResponse, status: u16, case: &str) -> String {
    let body = String::from_utf8_lossy(&response.body);
    assert_eq!(response.status, status, "{case}: {response:?} {body}");
    let content_type = response.header("content-type").unwrap_or_default();
    assert!(
        content_type.starts_with("application/json"),
        "{case}: content-type {content_type:?}, body {body}"
    );
    let json = response.json();
    let message = json["error"]
        .as_str()
        .unwrap_or_else(|| panic!("{case}: no \"error\" string in {json}"));
    assert!(!message.trim().is_empty(), "{case}: empty error message");
    let lower = body.to_lowercase();
    for word in INTERNALS {
        assert!(!lower.contains(word), "{case}: {word:?} in the body {body}");
    }
    message.to_owned()
}

/// `GET /metrics` on a new connection.
pub fn metrics(addr: SocketAddr) -> String {
    let response = fresh_get(addr, "/metrics");
    assert_eq!(response.status, 200, "{response:?}");
    String::from_utf8_lossy(&response.body).into_owned()
}

/// The value of the unlabelled series `name` in a `/metrics` text.
pub fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|value| value.trim().parse().ok())
}

/// Waits until the series `name` satisfies `wanted`; returns its value.
pub fn wait_metric(addr: SocketAddr, name: &str, wanted: impl Fn(f64) -> bool) -> f64 {
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        let text = metrics(addr);
        if let Some(value) = metric(&text, name).filter(|value| wanted(*value)) {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "{name} never reached the expected value; last /metrics:\n{text}"
        );
        thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until `/readyz` at `admin` reports the database `state` (`up`,
/// `busy`, `down`); returns the answer. Readiness itself does not follow
/// the database: the caller asserts what it should be.
pub fn wait_database(admin: SocketAddr, state: &str) -> RawResponse {
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        let response = fresh_get(admin, "/readyz");
        if response.json()["database"] == state {
            return response;
        }
        assert!(
            Instant::now() < deadline,
            "the database never turned {state}; last /readyz: {response:?} {}",
            String::from_utf8_lossy(&response.body)
        );
        thread::sleep(POLL_INTERVAL);
    }
}

/// Redirect clients on keep-alive connections until the server goes away:
/// each counts the redirects answered 307, and the requests cut (sent,
/// never answered: recorded or not, the client cannot tell). Any other
/// answer (a request shed with 503) counts as neither, and the client goes on.
pub struct KeptAliveClients {
    answered: Arc<AtomicU64>,
    cut: Arc<AtomicU64>,
    threads: Vec<thread::JoinHandle<()>>,
}

impl KeptAliveClients {
    /// `clients` connections to `addr`, each asking for `codes` in turn.
    pub fn start(addr: SocketAddr, codes: &[String], clients: usize) -> KeptAliveClients {
        let (answered, cut) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let threads = (0..clients)
            .map(|client| {
                let (answered, cut) = (Arc::clone(&answered), Arc::clone(&cut));
                let codes = codes.to_vec();
                thread::spawn(move || {
                    let Ok(mut stream) = TcpStream::connect(addr) else {
                        return;
                    };
                    stream
                        .set_read_timeout(Some(Duration::from_secs(10)))
                        .and_then(|()| stream.set_nodelay(true))
                        .expect("socket options");
                    for i in client.. {
                        let path = format!("/{}", codes[i % codes.len()]);
                        match get(&mut stream, &path) {
                            Ok(response) if response.status == 307 => {
                                answered.fetch_add(1, Ordering::Relaxed);
                            }
                            Ok(_) => {}
                            Err(_) => {
                                cut.fetch_add(1, Ordering::Relaxed);
                                return;
                            }
                        }
                    }
                })
            })
            .collect();
        KeptAliveClients {
            answered,
            cut,
            threads,
        }
    }

    /// The redirects answered so far.
    pub fn answered(&self) -> u64 {
        self.answered.load(Ordering::Relaxed)
    }

    /// Waits for every client to meet the closed server; `(answered, cut)`.
    pub fn join(self) -> (u64, u64) {
        for thread in self.threads {
            thread.join().expect("client");
        }
        (
            self.answered.load(Ordering::Relaxed),
            self.cut.load(Ordering::Relaxed),
        )
    }
}

/// The bound a kill leaves on a count: every redirect answered is stored
/// (`stored ≥ answered`), and the only excess is requests the kill cut —
/// recorded, then killed before their response went out.
pub fn assert_kill_bound(stored: u64, answered: u64, cut: u64) {
    assert!(
        stored >= answered,
        "{stored} hits stored, {answered} redirects answered: {} lost",
        answered - stored
    );
    assert!(
        stored - answered <= cut,
        "{stored} hits stored, {answered} answered, {cut} cut by the kills"
    );
}

/// How often a polling keep-alive client asks (`until_told`).
const TOLD_POLL: Duration = Duration::from_millis(50);

/// Plays one keep-alive client on `stream` until the server wants it gone,
/// and returns when that was, counted from `since`. An `idle` client sends
/// nothing and waits for the server to close the connection; a busy one
/// asks for `/healthz` every 50 ms until an answer says `Connection:
/// close`, then sees the connection closed. A request that fails is a
/// failure of the server: a client honouring `Connection: close` must
/// never see one.
pub fn until_told(mut stream: TcpStream, idle: bool, since: Instant) -> Duration {
    const LONGEST: Duration = Duration::from_secs(60);
    if idle {
        let closed = wait_for_eof(&mut stream, LONGEST).expect("EOF, not a reset");
        assert!(closed, "still open after {LONGEST:?}");
        return since.elapsed();
    }
    let deadline = Instant::now() + LONGEST;
    loop {
        let response = get(&mut stream, "/healthz").expect("a request on an open connection");
        assert_eq!(response.status, 200, "{response:?}");
        if response.closes_connection() {
            let told = since.elapsed();
            assert!(
                wait_for_eof(&mut stream, LONGEST).expect("EOF"),
                "open after close"
            );
            return told;
        }
        assert!(Instant::now() < deadline, "never told to close");
        thread::sleep(TOLD_POLL);
    }
}

/// Connections told to close at their drawn moments, as `(due, told)` from
/// the same instant: none before its moment, and in the order of their
/// moments wherever two are `apart` or more apart.
pub fn assert_told_in_order(moments: &[(Duration, Duration)], apart: Duration) {
    for (n, &(due, told)) in moments.iter().enumerate() {
        assert!(
            told >= due,
            "connection {n} told at {told:?}, before its moment {due:?}"
        );
    }
    for (a, &(due_a, told_a)) in moments.iter().enumerate() {
        for (b, &(due_b, told_b)) in moments.iter().enumerate() {
            if due_a + apart <= due_b {
                assert!(
                    told_a < told_b,
                    "connection {a} (due {due_a:?}) told at {told_a:?}, after connection {b} (due {due_b:?}) at {told_b:?}"
                );
            }
        }
    }
}
