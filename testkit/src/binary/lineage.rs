//! A server and its successors across in-place upgrades: the command that
//! starts one, the listeners passed on, the pid file, and the lineage of
//! processes a test follows until the last exits.

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use command_fds::{CommandFdExt, FdMapping};
use nix::errno::Errno;
use nix::sys::signal::{kill, killpg, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

use super::{Process, POLL_INTERVAL};

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
