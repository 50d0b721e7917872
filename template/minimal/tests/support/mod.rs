//! The harness of the tests that run the real binary: a server started as
//! a child process on free ports, its logs, its signals and exit code, and
//! plain HTTP/1.1 requests. Every wait is bounded.

// Each test binary uses part of it.
#![allow(dead_code)]

use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tempfile::TempDir;

pub(crate) const BINARY: &str = env!("CARGO_BIN_EXE_lameduck");

/// The longest any single wait here may take.
pub(crate) const TIMEOUT: Duration = Duration::from_secs(20);

/// A running `lameduck server` on loopback, killed if the test fails.
pub(crate) struct Server {
    pub(crate) child: Child,
    logs: Arc<Mutex<Vec<String>>>,
    /// The threads reading its stdout and stderr, until their end.
    readers: Vec<thread::JoinHandle<()>>,
    pub(crate) addr: SocketAddr,
    pub(crate) admin: SocketAddr,
    /// Its own state directory, unless the test gave one (`--state-dir`):
    /// removed when the test ends.
    _state: Option<TempDir>,
}

impl Server {
    /// Starts `lameduck server` on free ports with `args`, and waits until
    /// it logs both addresses. Its state goes to a directory of its own,
    /// unless `args` name one.
    pub(crate) fn start(args: &[&str]) -> Server {
        Server::start_with(args, &[])
    }

    /// [`Server::start`], with the environment variables `env` set.
    pub(crate) fn start_with(args: &[&str], env: &[(&str, &str)]) -> Server {
        let state = (!args.contains(&"--state-dir"))
            .then(|| tempfile::tempdir().expect("a state directory"));
        let mut command = Command::new(BINARY);
        command
            .args([
                "server",
                "--listen",
                "127.0.0.1:0",
                "--admin-listen",
                "127.0.0.1:0",
            ])
            .args(args)
            .args(
                state
                    .iter()
                    .flat_map(|dir| [OsStr::new("--state-dir"), dir.path().as_os_str()]),
            )
            .env("RUST_LOG", "info")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // The test's own configuration must not leak into the child: nor
        // its service's, nor a collector it exports its own traces to.
        for (key, _) in std::env::vars() {
            let own = env.iter().any(|(name, _)| *name == key);
            if !own && (key.starts_with("LAMEDUCK_") || key.starts_with("OTEL_")) {
                command.env_remove(key);
            }
        }
        let mut child = command.spawn().expect("start the server");
        let logs = Arc::new(Mutex::new(Vec::new()));
        let readers = vec![
            capture(child.stdout.take().expect("piped"), Arc::clone(&logs)),
            capture(child.stderr.take().expect("piped"), Arc::clone(&logs)),
        ];
        let mut server = Server {
            child,
            logs,
            readers,
            addr: ([0, 0, 0, 0], 0).into(),
            admin: ([0, 0, 0, 0], 0).into(),
            _state: state,
        };
        server.addr = server.address("listening on http://");
        server.admin = server.address("admin endpoints on http://");
        server
    }

    /// The address logged after `prefix`.
    fn address(&mut self, prefix: &str) -> SocketAddr {
        let line = self.wait_for_log(prefix);
        let rest = &line[line.find(prefix).expect("found") + prefix.len()..];
        let end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == ':'))
            .unwrap_or(rest.len());
        rest[..end].parse().expect("an address")
    }

    /// Waits until a log line contains `needle`, and returns it.
    pub(crate) fn wait_for_log(&mut self, needle: &str) -> String {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            let found = self.log_lines().into_iter().find(|l| l.contains(needle));
            if let Some(line) = found {
                return line;
            }
            let running = matches!(self.child.try_wait(), Ok(None));
            assert!(
                running && Instant::now() < deadline,
                "no `{needle}` in the logs:\n{}",
                self.log_lines().join("\n")
            );
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// The shutdown budget logged at startup (`shutdown_budget=24.5s`).
    pub(crate) fn shutdown_budget(&mut self) -> Duration {
        let line = self.wait_for_log("shutdown_budget=");
        let value = line
            .split("shutdown_budget=")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .unwrap_or_default();
        let seconds = match value.strip_suffix("ms") {
            Some(ms) => ms.parse::<f64>().map(|ms| ms / 1000.0),
            None => value.trim_end_matches('s').parse::<f64>(),
        };
        let seconds = seconds.unwrap_or_else(|_| panic!("no duration in {line:?}"));
        Duration::from_secs_f64(seconds)
    }

    pub(crate) fn log_lines(&self) -> Vec<String> {
        self.logs.lock().expect("logs").clone()
    }

    /// Every line the exited server wrote: its pipes read to their end
    /// (the last lines may still be in them when the exit is seen). Not
    /// after an upgrade, whose successor holds the pipes open.
    pub(crate) fn all_log_lines(&mut self) -> Vec<String> {
        for reader in self.readers.drain(..) {
            reader.join().expect("the log reader");
        }
        self.log_lines()
    }

    pub(crate) fn signal(&self, signal: Signal) {
        let pid = Pid::from_raw(i32::try_from(self.child.id()).expect("pid"));
        kill(pid, signal).expect("send the signal");
    }

    /// Waits for the exit and returns its code.
    pub(crate) fn exit_code(&mut self) -> i32 {
        let status = wait(&mut self.child, TIMEOUT);
        let status = status
            .unwrap_or_else(|| panic!("still running; logs:\n{}", self.log_lines().join("\n")));
        status.code().expect("exited, not killed by a signal")
    }

    /// Waits until the server counts `n` requests in flight.
    pub(crate) fn wait_in_flight(&self, n: u32) {
        let deadline = Instant::now() + TIMEOUT;
        let prefix = env!("CARGO_PKG_NAME").replace('-', "_");
        let wanted = format!("{prefix}_requests_in_flight {n}");
        while Instant::now() < deadline {
            let metrics = request(self.admin, "GET", "/metrics", "").expect("GET /metrics");
            if metrics.1.lines().any(|line| line == wanted) {
                return;
            }
            thread::sleep(Duration::from_millis(10));
        }
        panic!("never saw `{wanted}`");
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn capture(
    pipe: impl Read + Send + 'static,
    logs: Arc<Mutex<Vec<String>>>,
) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        for line in BufReader::new(pipe).lines() {
            let Ok(line) = line else { break };
            logs.lock().expect("logs").push(line);
        }
    })
}

pub(crate) fn wait(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait().expect("wait for the child") {
            return Some(status);
        }
        thread::sleep(Duration::from_millis(10));
    }
    None
}

pub(crate) fn connect(addr: SocketAddr) -> TcpStream {
    let stream = TcpStream::connect_timeout(&addr, TIMEOUT).expect("connect");
    stream.set_read_timeout(Some(TIMEOUT)).expect("timeout");
    stream.set_write_timeout(Some(TIMEOUT)).expect("timeout");
    stream
}

/// Sends one request on a new connection and reads the whole response
/// (status, body); the request asks the server to close the connection.
pub(crate) fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
) -> std::io::Result<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&addr, TIMEOUT)?;
    stream.set_read_timeout(Some(TIMEOUT))?;
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: lameduck\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )?;
    read_response(&mut stream)
}

/// Reads a response up to the end of the connection.
pub(crate) fn read_response(stream: &mut TcpStream) -> std::io::Result<(u16, String)> {
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let status = response
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    let body = response
        .split_once("\r\n\r\n")
        .map_or("", |(_, body)| body)
        .to_owned();
    Ok((status, body))
}
