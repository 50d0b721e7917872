//! Restarts without a closed socket: socket activation and in-place upgrade.
//!
//! - **Socket activation.** Started with `LISTEN_FDS` (systemd, or
//!   `systemfd` in development), the server serves the inherited listener
//!   instead of binding: connections queue in the kernel while the process
//!   restarts, instead of being refused.
//! - **In-place upgrade.** On SIGHUP the running process starts a new copy
//!   of its binary, passing the listening sockets down as fds 3 and 4 (the
//!   same `LISTEN_FDS` protocol) and waiting for its `READY=1` on a private
//!   `NOTIFY_SOCKET` (the `sd_notify` protocol). Both accept from the one
//!   socket meanwhile, so nothing queued on it is lost; once the successor
//!   is ready the old process goes through a lame-duck period of at least
//!   [`UPGRADE_LAME_DUCK`], drains and exits. If the successor exits or
//!   is not ready within [`UPGRADE_READY_TIMEOUT`], it is killed and the old
//!   process keeps serving.

use std::ffi::OsString;
use std::io;
use std::net::TcpListener;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use command_fds::{CommandFdExt, FdMapping};
use tokio::net::UnixDatagram;
use tracing::{info, warn};

use crate::{Trigger, Watch, LOG_TARGET};

/// How long a successor may take to report ready (startup includes
/// migrations and spill replay) before the upgrade is abandoned.
pub const UPGRADE_READY_TIMEOUT: Duration = Duration::from_secs(30);

/// The shortest lame-duck period of a process retiring after an upgrade:
/// its keep-alive clients get `Connection: close` (or GOAWAY) on their next
/// request and reconnect — to either process, on the shared socket — before
/// idle connections are closed. Only a connection idle for this whole
/// period can still meet HTTP/1.1's keep-alive race at the drain.
pub const UPGRADE_LAME_DUCK: Duration = Duration::from_millis(500);

/// The name an in-place upgrade gives each socket it passes down
/// (`LISTEN_FDNAMES`) when the process owns them, so that the successor
/// knows it owns them in turn; [`MANAGED_FD_NAME`] when they came from a
/// service manager, which keeps them.
const OWNED_FD_NAME: &str = "upgrade";

/// See [`OWNED_FD_NAME`].
const MANAGED_FD_NAME: &str = "managed";

/// Whether this process owns its listening sockets: it bound them, or an
/// upgrade handed it sockets its predecessor owned. Set by
/// [`inherited_listeners`]; passed on by the upgrade.
static SOCKETS_OWNED: AtomicBool = AtomicBool::new(true);

/// The listening sockets of one process: the public one, and the admin one
/// (probes and metrics) that follows the same handoffs.
#[derive(Debug, Default)]
pub struct Listeners {
    /// The public socket: fd 3 under the `LISTEN_FDS` protocol.
    pub public: Option<Inherited>,
    /// The admin socket: fd 4, when passed.
    pub admin: Option<Inherited>,
    /// They were bound by this service (and handed down by in-place
    /// upgrades), not by a service manager: this process owns them, and a
    /// Unix socket's file is its to remove at exit. `true` when nothing
    /// was inherited.
    pub owned: bool,
}

/// One inherited listening socket.
#[derive(Debug)]
pub enum Inherited {
    /// A TCP listener.
    Tcp(TcpListener),
    /// A Unix stream listener.
    Unix(UnixListener),
}

/// The listeners passed down by a service manager or a predecessor: fd 3
/// is the public socket, fd 4 (if `LISTEN_FDS` is 2) the admin socket. Call
/// it before starting threads: it clears `LISTEN_FDS`, `LISTEN_PID` and
/// `LISTEN_FDNAMES` from the environment so that they are not passed on
/// again.
///
/// # Errors
/// If a passed descriptor is neither a TCP nor a Unix stream listener.
pub fn inherited_listeners() -> io::Result<Listeners> {
    let mut fds = listenfd::ListenFd::from_env();
    let names = std::env::var("LISTEN_FDNAMES").unwrap_or_default();
    std::env::remove_var("LISTEN_FDNAMES");
    let mut take = |index| -> io::Result<_> {
        match fds.take_tcp_listener(index) {
            Ok(tcp) => Ok(tcp.map(Inherited::Tcp)),
            Err(_) => Ok(fds.take_unix_listener(index)?.map(Inherited::Unix)),
        }
    };
    let (public, admin) = (take(0)?, take(1)?);
    let given = public.is_some() || admin.is_some();
    let owned = !given || names.split(':').next() == Some(OWNED_FD_NAME);
    SOCKETS_OWNED.store(owned, Ordering::Relaxed);
    Ok(Listeners {
        public,
        admin,
        owned,
    })
}

/// Tells the service manager (or the predecessor of an in-place upgrade)
/// that the server is ready: `READY=1` on `NOTIFY_SOCKET`, if set.
pub fn notify_ready() {
    if let Err(error) = sd_notify::notify(&[sd_notify::NotifyState::Ready]) {
        warn!(%error, "could not notify readiness");
    }
}

/// Tells the service manager that the server is stopping.
pub fn notify_stopping() {
    let _ = sd_notify::notify(&[sd_notify::NotifyState::Stopping]);
}

/// How to start a successor: this process's binary path (taken at startup,
/// so a binary replaced on disk since is the one started) and arguments.
#[derive(Clone, Debug)]
pub struct Successor {
    /// The binary.
    pub exe: PathBuf,
    /// Its arguments (without the program name).
    pub args: Vec<OsString>,
}

impl Successor {
    /// This process's own binary and arguments.
    ///
    /// # Errors
    /// If the binary's path cannot be found.
    pub fn current() -> io::Result<Successor> {
        Ok(Successor {
            exe: std::env::current_exe()?,
            args: std::env::args_os().skip(1).collect(),
        })
    }
}

/// Upgrades in place on every SIGHUP until shutdown starts: starts the
/// successor with `sockets` as fds 3, 4, … and triggers this process's
/// shutdown once the successor is ready. A failed upgrade is logged and the
/// process keeps serving. The sockets are closed when this returns, so that
/// a normal shutdown still refuses new connections once its own listeners
/// close.
pub(crate) async fn upgrade_on_hangup(
    (mut hangups, successor): (tokio::signal::unix::Signal, Successor),
    sockets: Vec<OwnedFd>,
    watch: Watch,
    trigger: Trigger,
) -> Option<u32> {
    loop {
        tokio::select! {
            Some(()) = hangups.recv() => {}
            () = watch.triggered() => return None,
        }
        info!(target: LOG_TARGET, exe = %successor.exe.display(), "SIGHUP: starting a new process on the same socket");
        match upgrade(&sockets, &successor).await {
            Ok(pid) => {
                info!(target: LOG_TARGET, pid, "the new process is ready; this one drains and exits");
                trigger.trigger_with_lame_duck(format!("upgraded to pid {pid}"), UPGRADE_LAME_DUCK);
                return Some(pid);
            }
            Err(error) => {
                warn!(target: LOG_TARGET, %error, "upgrade failed; this process keeps serving");
            }
        }
    }
}

/// Starts the successor with `sockets` as fds 3, 4, … and waits until it
/// is ready; returns its pid. The error says why not, in its message.
async fn upgrade(sockets: &[OwnedFd], successor: &Successor) -> io::Result<u32> {
    let cannot_start = |error: io::Error| {
        let exe = successor.exe.display();
        io::Error::new(error.kind(), format!("cannot start {exe}: {error}"))
    };
    // A private socket for the successor's `READY=1`, removed on return.
    let notify = tempfile::Builder::new()
        .prefix(concat!(env!("CARGO_PKG_NAME"), "-upgrade-"))
        .suffix(".sock")
        .make(|path| UnixDatagram::bind(path))
        .map_err(cannot_start)?;

    let mut mappings = Vec::new();
    for (child_fd, socket) in (3..).zip(sockets) {
        let parent_fd = socket.try_clone().map_err(cannot_start)?;
        mappings.push(FdMapping {
            parent_fd,
            child_fd,
        });
    }
    let owned = SOCKETS_OWNED.load(Ordering::Relaxed);
    let name = if owned {
        OWNED_FD_NAME
    } else {
        MANAGED_FD_NAME
    };
    let mut command = tokio::process::Command::new(&successor.exe);
    command
        .args(&successor.args)
        .env("LISTEN_FDS", mappings.len().to_string())
        .env("LISTEN_FDNAMES", vec![name; mappings.len()].join(":"))
        .env_remove("LISTEN_PID")
        .env("NOTIFY_SOCKET", notify.path())
        .fd_mappings(mappings)
        .map_err(|collision| cannot_start(io::Error::other(collision)))?;
    let mut child = command.spawn().map_err(cannot_start)?;
    let pid = child.id().unwrap_or_default();

    let ready = async {
        let mut buffer = [0u8; 256];
        while let Ok(len) = notify.as_file().recv(&mut buffer).await {
            let message = String::from_utf8_lossy(&buffer[..len]);
            if message.lines().any(|line| line == "READY=1") {
                return;
            }
        }
        std::future::pending().await
    };
    let outcome = tokio::select! {
        () = ready => Ok(pid),
        exited = child.wait() => Err(match exited {
            Ok(status) => io::Error::other(format!("the new process exited before it was ready ({status})")),
            Err(error) => cannot_start(error),
        }),
        () = tokio::time::sleep(UPGRADE_READY_TIMEOUT) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("the new process was not ready within {UPGRADE_READY_TIMEOUT:?}"),
        )),
    };
    if outcome.is_err() {
        let _ = child.kill().await;
    }
    outcome
}
