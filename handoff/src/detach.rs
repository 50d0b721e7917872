//! Starting a successor that is not this process's child.
//!
//! A service manager supervises its main process as its own child: handed
//! a `MAINPID=` that is some other process's child, systemd warns that it
//! may not notice its exit, and a later `systemctl stop` kills it at once
//! instead of letting it drain. So under a manager an upgrade starts the
//! new binary with `HANDOFF_DETACH=<binary>`: that process (run just long enough
//! to call [`detach`] first thing in `main`) starts the real successor with
//! the same arguments, environment and listening sockets, reports its pid
//! on the predecessor's private socket as `MAINPID=`, and exits. The
//! successor, orphaned, is adopted by the manager (PID 1, or the nearest
//! subreaper: a user manager). No fork without exec, no shell.

use std::io;
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::{kill as send, Signal};
use nix::unistd::Pid;

use crate::{HANDOFF_DETACH, HANDOFF_NOTIFY_SOCKET};

/// How often a successor that is not this process's child is looked at:
/// whether it still runs (no `wait` tells), and a predecessor likewise.
pub(super) const LOOK_INTERVAL: Duration = Duration::from_millis(100);

/// If this process was started by an in-place upgrade only to start the
/// successor detached (`HANDOFF_DETACH`), does that and returns the
/// outcome: the caller exits at once (0 on `Ok`, with an error otherwise).
/// `None` in any other process. Call it first thing in `main`, before any
/// thread or runtime starts and before the listening sockets are taken.
///
/// # Errors
/// If the successor cannot be started or its pid cannot be reported.
pub fn detach() -> Option<io::Result<()>> {
    let exe = std::env::var_os(HANDOFF_DETACH)?;
    Some(start_detached(exe))
}

/// Starts `exe` (the binary the predecessor means to start, which need not
/// be this one's: a wrapper may have run first) with this process's
/// arguments, environment and sockets.
fn start_detached(exe: std::ffi::OsString) -> io::Result<()> {
    let report_to = std::env::var_os(HANDOFF_NOTIFY_SOCKET).ok_or_else(|| {
        io::Error::other(format!(
            "{HANDOFF_DETACH} is set without {HANDOFF_NOTIFY_SOCKET}"
        ))
    })?;
    // The listening sockets (fds 3, 4) and `LISTEN_*` pass through as they
    // came: nothing here marks them close-on-exec.
    let successor = std::process::Command::new(exe)
        .args(std::env::args_os().skip(1))
        .env_remove(HANDOFF_DETACH)
        .spawn()?;
    let report = format!("MAINPID={}\n", successor.id());
    std::os::unix::net::UnixDatagram::unbound()?.send_to(report.as_bytes(), report_to)?;
    // Not waited for: it outlives this process, and its new parent reaps it.
    drop(successor);
    Ok(())
}

/// Whether process `pid` still runs: it exists and is not a zombie (one
/// that exited and waits for its parent — the test or shell that started
/// a first process — to reap it).
pub(super) fn alive(pid: u32) -> bool {
    let Ok(raw) = i32::try_from(pid) else {
        return false;
    };
    if matches!(send(Pid::from_raw(raw), None), Err(Errno::ESRCH)) {
        return false;
    }
    // The state follows the command name, which may hold spaces.
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let state = stat
        .rfind(')')
        .and_then(|end| stat[end + 1..].split_whitespace().next());
    state != Some("Z")
}

/// Resolves once process `pid` is gone.
pub(super) async fn exited(pid: u32) {
    let mut look = tokio::time::interval(LOOK_INTERVAL);
    while alive(pid) {
        look.tick().await;
    }
}

/// Kills process `pid` (SIGKILL), if it is still there.
pub(super) fn kill(pid: u32) {
    if let Ok(pid) = i32::try_from(pid) {
        let _ = send(Pid::from_raw(pid), Signal::SIGKILL);
    }
}
