//! One server as a child process: started on `127.0.0.1:0`, its address
//! read from its `listening on http://ADDR` (or `https://ADDR`) log line,
//! its output kept in a log file, signalled and waited for with a bound. Dropping a [`Replica`]
//! kills the process.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde::Serialize;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use crate::raw::{self, RawConn};

/// The servers log at `info`, or at what `LOAD_SERVER_LOG` says (a
/// `RUST_LOG` filter, e.g. `lameduck_lifecycle=debug`).
pub const LOG_ENV: &str = "LOAD_SERVER_LOG";

/// How long a server may take to log its listening address.
pub const LISTEN_TIMEOUT: Duration = Duration::from_secs(30);

/// How often readiness is polled while waiting for it.
const READY_POLL: Duration = Duration::from_millis(20);

/// How to start a server.
#[derive(Clone, Debug)]
pub struct Spec {
    /// The binary.
    pub program: PathBuf,
    /// Its arguments (`server --listen 127.0.0.1:0 …`). A `server` gets
    /// `--admin-listen 127.0.0.1:0` added unless it names its own.
    pub args: Vec<OsString>,
    /// Extra environment (the database URL goes here, not on the command
    /// line, so it never shows in `ps`).
    pub env: Vec<(String, String)>,
    /// CPUs to pin it to with `taskset -c`, if any.
    pub cpus: Option<String>,
}

/// How a server process ended.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Ended {
    /// Its exit code, if it exited.
    pub code: Option<i32>,
    /// The signal that ended it, if one did.
    pub signal: Option<i32>,
    /// The harness had to SIGKILL it after the wait bound.
    pub killed: bool,
    /// From the signal that asked it to stop to its exit.
    #[serde(with = "crate::report::millis")]
    pub after: Duration,
}

impl Ended {
    /// `"0"`, `"3"`, `"SIGKILL"`, …, for tables.
    pub fn describe(&self) -> String {
        match (self.code, self.signal) {
            (Some(code), _) => code.to_string(),
            (None, Some(signal)) => Signal::try_from(signal)
                .map_or_else(|_| format!("signal {signal}"), |s| s.as_str().to_owned()),
            (None, None) => "?".to_owned(),
        }
    }
}

/// A running server.
#[derive(Debug)]
pub struct Replica {
    /// Its name in logs and reports.
    pub name: String,
    /// Where it listens.
    pub addr: SocketAddr,
    /// Where its admin listener serves, once it logs it (`admin endpoints
    /// on http://ADDR`): see [`Replica::admin_addr`].
    admin: watch::Receiver<Option<SocketAddr>>,
    /// When it was started.
    pub started: Instant,
    child: Child,
    pid: i32,
    log: PathBuf,
}

impl Replica {
    /// Starts `spec`, writing its output to `log`, and waits for its
    /// `listening on http://ADDR` line.
    ///
    /// # Errors
    /// If it cannot start, exits, or does not log an address in time.
    pub async fn spawn(name: &str, spec: &Spec, log: &Path) -> anyhow::Result<Replica> {
        let mut command = match &spec.cpus {
            Some(cpus) => {
                let mut command = Command::new("taskset");
                command.arg("-c").arg(cpus).arg(&spec.program);
                command
            }
            None => Command::new(&spec.program),
        };
        command.args(&spec.args);
        // Replicas run side by side: each admin listener on a port of its
        // own, unless the spec names one.
        let serves = spec.args.first().is_some_and(|arg| arg == "server");
        if serves && !spec.args.iter().any(|arg| arg == "--admin-listen") {
            command.args(["--admin-listen", "127.0.0.1:0"]);
        }
        command
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .env(
                "RUST_LOG",
                std::env::var(LOG_ENV).unwrap_or_else(|_| "info".to_owned()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let started = Instant::now();
        let mut child = command
            .spawn()
            .with_context(|| format!("cannot start {}", spec.program.display()))?;
        let pid = child
            .id()
            .and_then(|pid| i32::try_from(pid).ok())
            .ok_or_else(|| anyhow!("{name} has no pid"))?;

        let file = tokio::fs::File::create(log)
            .await
            .with_context(|| format!("cannot create {}", log.display()))?;
        let (lines_tx, lines_rx) = mpsc::unbounded_channel();
        let (addr_tx, addr_rx) = oneshot::channel();
        if let Some(stdout) = child.stdout.take() {
            tokio::spawn(forward_lines(stdout, lines_tx.clone()));
        }
        if let Some(stderr) = child.stderr.take() {
            tokio::spawn(forward_lines(stderr, lines_tx));
        }

        let (admin_tx, admin) = watch::channel(None);
        tokio::spawn(write_log(file, lines_rx, addr_tx, admin_tx));

        let addr = tokio::select! {
            addr = tokio::time::timeout(LISTEN_TIMEOUT, addr_rx) => match addr {
                Ok(Ok(addr)) => addr,
                Ok(Err(_)) => bail!("{name} ended its output without a listening address (see {})", log.display()),
                Err(_) => bail!("{name} logged no listening address in {LISTEN_TIMEOUT:?} (see {})", log.display()),
            },
            status = child.wait() => bail!("{name} exited at startup with {status:?} (see {})", log.display()),
        };
        Ok(Replica {
            name: name.to_owned(),
            addr,
            admin,
            started,
            child,
            pid,
            log: log.to_owned(),
        })
    }

    /// Where its admin listener serves `/healthz`, `/readyz` and
    /// `/metrics`, waiting up to [`LISTEN_TIMEOUT`] for its `admin endpoints
    /// on http://ADDR` line (the public and admin listeners start side by
    /// side and log in either order).
    ///
    /// # Errors
    /// If it logs none in time.
    pub async fn admin_addr(&self) -> anyhow::Result<SocketAddr> {
        let mut admin = self.admin.clone();
        let found = tokio::time::timeout(LISTEN_TIMEOUT, admin.wait_for(Option::is_some)).await;
        match found {
            Ok(Ok(addr)) => addr.ok_or_else(|| anyhow!("unreachable: waited for Some")),
            _ => bail!(
                "{} logged no admin address in {LISTEN_TIMEOUT:?} (see {})",
                self.name,
                self.log.display()
            ),
        }
    }

    /// The process id.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// The log file.
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// Polls `GET path` until it answers 200; returns the time since start.
    ///
    /// # Errors
    /// If it is not ready within `timeout`.
    pub async fn wait_ready(&self, path: &str, timeout: Duration) -> anyhow::Result<Duration> {
        self.wait_ready_at(self.addr, path, timeout).await
    }

    /// [`Replica::wait_ready`] on another of its plain-HTTP listeners (the
    /// admin listener of a server whose public one speaks TLS).
    ///
    /// # Errors
    /// If it is not ready within `timeout`.
    pub async fn wait_ready_at(
        &self,
        addr: SocketAddr,
        path: &str,
        timeout: Duration,
    ) -> anyhow::Result<Duration> {
        let request = raw::get(path);
        let deadline = Instant::now() + timeout;
        let mut conn: Option<RawConn> = None;
        while Instant::now() < deadline {
            if conn.is_none() {
                conn = RawConn::connect(addr).await.ok();
            }
            if let Some(mut current) = conn.take() {
                if let Ok(Ok(head)) =
                    tokio::time::timeout(Duration::from_secs(1), current.exchange(&request)).await
                {
                    if head.status == 200 {
                        return Ok(self.started.elapsed());
                    }
                    if !head.close {
                        conn = Some(current);
                    }
                }
            }
            tokio::time::sleep(READY_POLL).await;
        }
        bail!(
            "{} at {addr} not ready within {timeout:?} (see {})",
            self.name,
            self.log.display()
        )
    }

    /// Sends `signal` to the process.
    ///
    /// # Errors
    /// If the process cannot be signalled.
    pub fn signal(&self, signal: Signal) -> anyhow::Result<()> {
        kill(Pid::from_raw(self.pid), signal)
            .with_context(|| format!("cannot send {signal} to {}", self.name))
    }

    /// Waits for the process to exit; kills it if it has not after
    /// `timeout`. `since` is when it was asked to stop.
    pub async fn wait_exit(&mut self, since: Instant, timeout: Duration) -> Ended {
        let (status, killed) = match tokio::time::timeout(timeout, self.child.wait()).await {
            Ok(status) => (status.ok(), false),
            Err(_) => {
                let _ = self.child.start_kill();
                (self.child.wait().await.ok(), true)
            }
        };
        Ended {
            code: status.and_then(|s| s.code()),
            signal: status.and_then(|s| s.signal()),
            killed,
            after: since.elapsed(),
        }
    }

    /// Resident set size in KiB, from `/proc/PID/status`.
    pub fn rss_kib(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid)).ok()?;
        status
            .lines()
            .find_map(|line| line.strip_prefix("VmRSS:"))?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    }
}

/// CPU time (user + system) of process `pid` (`self` for this one), from
/// `/proc/PID/stat`.
pub fn cpu_time(pid: &str) -> Option<Duration> {
    // utime and stime are fields 14 and 15.
    stat_ticks(&format!("/proc/{pid}/stat"), 14)
}

/// CPU time (user + system) of this process's children that have exited
/// and been waited for, from `/proc/self/stat`.
pub fn children_cpu_time() -> Option<Duration> {
    // cutime and cstime are fields 16 and 17.
    stat_ticks("/proc/self/stat", 16)
}

/// The sum of fields `field` and `field + 1` (numbered from 1, as in
/// proc(5)) of the `stat` file at `path`, read as the kernel's clock ticks
/// of 10 ms (`USER_HZ` is 100 on Linux whatever the kernel's own tick).
fn stat_ticks(path: &str, field: usize) -> Option<Duration> {
    let stat = std::fs::read_to_string(path).ok()?;
    // After the command name (field 2), which may hold spaces: the state
    // (field 3), then the rest.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(field - 3);
    let first: u64 = fields.next()?.parse().ok()?;
    let second: u64 = fields.next()?.parse().ok()?;
    Some(Duration::from_millis((first + second) * 10))
}

async fn forward_lines(output: impl AsyncRead + Unpin, lines: mpsc::UnboundedSender<String>) {
    let mut reader = BufReader::new(output).lines();
    while let Ok(Some(line)) = reader.next_line().await {
        if lines.send(line).is_err() {
            break;
        }
    }
}

/// Writes the child's lines to `file`; sends its public address and its
/// admin address as it logs them.
async fn write_log(
    file: tokio::fs::File,
    mut lines: mpsc::UnboundedReceiver<String>,
    addr: oneshot::Sender<SocketAddr>,
    admin: watch::Sender<Option<SocketAddr>>,
) {
    let mut file = tokio::io::BufWriter::new(file);
    let mut addr = Some(addr);
    while let Some(line) = lines.recv().await {
        if let Some(found) = addr_after(&line, "admin endpoints on ") {
            admin.send_if_modified(|admin| admin.replace(found).is_none());
        } else if let Some(found) = listening_addr(&line) {
            if let Some(tx) = addr.take() {
                let _ = tx.send(found);
            }
        }
        let _ = file.write_all(line.as_bytes()).await;
        let _ = file.write_all(b"\n").await;
        if lines.is_empty() {
            let _ = file.flush().await;
        }
    }
    let _ = file.flush().await;
}

/// The address in a `listening on http://ADDR` (or `https://ADDR`, a TLS
/// listener) log line.
fn listening_addr(line: &str) -> Option<SocketAddr> {
    addr_after(line, "listening on ")
}

/// The `http://ADDR` or `https://ADDR` that follows `what` in a log line.
fn addr_after(line: &str, what: &str) -> Option<SocketAddr> {
    let rest = line.split(what).nth(1)?;
    let rest = rest
        .strip_prefix("http://")
        .or_else(|| rest.strip_prefix("https://"))?;
    rest.split(|c: char| c.is_whitespace() || c == '"')
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listening_addresses_are_found_in_text_and_json_lines() {
        let text = "2025-01-01T00:00:00Z  INFO lameduck_lifecycle::serve: listening on http://127.0.0.1:4242";
        assert_eq!(
            listening_addr(text),
            Some(SocketAddr::from(([127, 0, 0, 1], 4242)))
        );
        let json = r#"{"message":"listening on http://127.0.0.1:4243","level":"INFO"}"#;
        assert_eq!(
            listening_addr(json),
            Some(SocketAddr::from(([127, 0, 0, 1], 4243)))
        );
        let tls = "2025-01-01T00:00:00Z  INFO lameduck_lifecycle::serve: listening on https://127.0.0.1:4244";
        assert_eq!(
            listening_addr(tls),
            Some(SocketAddr::from(([127, 0, 0, 1], 4244)))
        );
        assert_eq!(listening_addr("listening on unix:/run/x.sock"), None);
        let admin =
            "2025-01-01T00:00:00Z  INFO lameduck::app: admin endpoints on http://127.0.0.1:9191";
        assert_eq!(listening_addr(admin), None);
        assert_eq!(
            addr_after(admin, "admin endpoints on "),
            Some(SocketAddr::from(([127, 0, 0, 1], 9191)))
        );
        assert_eq!(listening_addr("nothing here"), None);
    }

    #[test]
    fn cpu_time_is_read_from_proc() {
        let spent = cpu_time("self").expect("/proc/self/stat");
        assert!(spent < Duration::from_secs(3600), "{spent:?}");
        assert_eq!(cpu_time("0"), None);
    }

    #[test]
    fn children_cpu_time_counts_a_child_once_it_is_waited_for() {
        let before = children_cpu_time().expect("/proc/self/stat");
        // Busy children until the kernel's 10 ms ticks show one: the first
        // usually does; the bound keeps a broken reading from looping.
        let grew = (0..50).any(|_| {
            let status = std::process::Command::new("sh")
                .args(["-c", "i=0; while [ $i -lt 100000 ]; do i=$((i+1)); done"])
                .status()
                .expect("sh runs");
            assert!(status.success());
            children_cpu_time().expect("/proc/self/stat") > before
        });
        assert!(grew, "children's CPU time stayed at {before:?}");
    }
}
