#![doc = include_str!("../README.md")]

mod detach;
pub mod reload;

use std::ffi::OsString;
use std::io;
use std::net::TcpListener;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use command_fds::{CommandFdExt, FdMapping};
use futures_util::future::BoxFuture;
use lameduck_lifecycle::{Handover, Trigger, Watch, LOG_TARGET};
use sd_notify::NotifyState;
use tokio::net::UnixDatagram;
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::task::JoinHandle;
use tracing::{info, warn};

pub use detach::detach;

/// How long a successor may take to report ready (startup includes
/// migrations and spill replay) before the upgrade is abandoned.
pub const UPGRADE_READY_TIMEOUT: Duration = Duration::from_secs(30);

/// The shortest lame-duck period of a process retiring after an upgrade:
/// its keep-alive clients get `Connection: close` (or GOAWAY) on their next
/// request and reconnect — to either process, on the shared socket — before
/// idle connections are closed. Only a connection idle for this whole
/// period can still meet HTTP/1.1's keep-alive race at the drain.
pub const UPGRADE_LAME_DUCK: Duration = Duration::from_millis(500);

/// How long a successor, at the end of its own shutdown, waits for the
/// predecessor it replaced to finish draining (it started earlier, so its
/// drain ends first unless it was held to its own deadline).
pub const PREDECESSOR_WAIT: Duration = Duration::from_secs(60);

/// The name an in-place upgrade gives each socket it passes down
/// (`LISTEN_FDNAMES`) when the process owns them, so that the successor
/// knows it owns them in turn; [`MANAGED_FD_NAME`] when they came from a
/// service manager, which keeps them.
const OWNED_FD_NAME: &str = "upgrade";

/// See [`OWNED_FD_NAME`].
const MANAGED_FD_NAME: &str = "managed";

/// The predecessor's private socket, where a successor reports `READY=1`
/// (and where [`detach`] reports the successor's pid as `MAINPID=`).
const HANDOFF_NOTIFY_SOCKET: &str = "HANDOFF_NOTIFY_SOCKET";

/// The pid of the process a successor replaces, which it waits for at the
/// end of its own shutdown.
const HANDOFF_PREDECESSOR_PID: &str = "HANDOFF_PREDECESSOR_PID";

/// Set on the process an upgrade under a service manager starts, to the
/// binary to start: that process only starts it, detached, and exits
/// ([`detach`]).
const HANDOFF_DETACH: &str = "HANDOFF_DETACH";

/// Whether this process owns its listening sockets: it bound them, or an
/// upgrade handed it sockets its predecessor owned. Set by
/// [`inherited_listeners`]; passed on by the upgrade.
static SOCKETS_OWNED: AtomicBool = AtomicBool::new(true);

/// What this process learned at startup of its place in a handoff; set by
/// [`inherited_listeners`].
static HANDOFF: OnceLock<Place> = OnceLock::new();

/// Upgrades attempted, for the manager's `STATUS=` (each says which).
static ATTEMPTS: AtomicU32 = AtomicU32::new(0);

#[derive(Debug, Default)]
struct Place {
    /// The predecessor's private socket, if an upgrade started this process.
    predecessor_socket: Option<PathBuf>,
    /// The predecessor's pid, likewise.
    predecessor: Option<u32>,
    /// A service manager supervises this process: `NOTIFY_SOCKET` is its.
    supervised: bool,
}

fn handoff() -> &'static Place {
    HANDOFF.get_or_init(Place::default)
}

/// The lifecycle's [`Handover`] to a service manager and to the processes
/// of an in-place upgrade; give it to
/// [`Lifecycle::with_handover`](lameduck_lifecycle::Lifecycle::with_handover).
///
/// - **Serving starts:** `READY=1` to the predecessor that started this
///   process in an upgrade, or else to the service manager (if
///   `NOTIFY_SOCKET` is set).
/// - **The shutdown starts:** `STOPPING=1` to the service manager.
/// - **SIGHUP** ([`with_upgrade`](Handoff::with_upgrade)): the in-place
///   upgrade, until the shutdown starts.
/// - **At exit** (not forced): a successor waits, at most
///   [`PREDECESSOR_WAIT`], for the predecessor it replaced to finish
///   draining.
#[derive(Debug, Default)]
pub struct Handoff {
    upgrade: Option<(Signal, Successor)>,
    predecessor: Option<JoinHandle<()>>,
}

impl Handoff {
    /// Notifications and the wait for a predecessor; no upgrade.
    pub fn new() -> Handoff {
        Handoff::default()
    }

    /// Upgrades in place on SIGHUP: starts `successor` with the listening
    /// sockets and, once it is ready, triggers this process's shutdown.
    /// Installs the SIGHUP handler now (a SIGHUP before serving starts is
    /// kept, not fatal). Needs a runtime.
    ///
    /// # Errors
    /// If the OS refuses the handler.
    pub fn with_upgrade(mut self, successor: Successor) -> io::Result<Handoff> {
        self.upgrade = Some((signal(SignalKind::hangup())?, successor));
        Ok(self)
    }
}

impl Handover for Handoff {
    fn serving(
        &mut self,
        sockets: io::Result<Vec<OwnedFd>>,
        watch: &Watch,
        trigger: Trigger,
    ) -> BoxFuture<'static, Option<u32>> {
        let upgrade = match (self.upgrade.take(), sockets) {
            (Some(upgrade), Ok(sockets)) => {
                Some(upgrade_on_hangup(upgrade, sockets, watch.clone(), trigger))
            }
            (Some(_), Err(error)) => {
                warn!(target: LOG_TARGET, %error, "in-place upgrade unavailable");
                None
            }
            (None, _) => None,
        };
        let stopping = watch.clone();
        tokio::spawn(async move {
            stopping.triggered().await;
            notify_stopping();
        });
        self.predecessor = Some(tokio::spawn(predecessor_gone()));
        notify_ready();
        let watch = watch.clone();
        Box::pin(async move {
            match upgrade {
                Some(upgrade) => upgrade.await,
                None => {
                    watch.triggered().await;
                    None
                }
            }
        })
    }

    fn exiting(&mut self) -> BoxFuture<'static, ()> {
        let gone = self.predecessor.take();
        Box::pin(async move {
            if let Some(gone) = gone {
                wait_for_predecessor(gone).await;
            }
        })
    }
}

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
/// it before starting threads: it clears `LISTEN_FDS`, `LISTEN_PID`,
/// `LISTEN_FDNAMES` and the handoff's own variables from the environment so
/// that they are not passed on again, and notes whether a service manager
/// supervises the process.
///
/// # Errors
/// If a passed descriptor is neither a TCP nor a Unix stream listener.
pub fn inherited_listeners() -> io::Result<Listeners> {
    take_handoff_environment();
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

/// Reads (and clears) the handoff's variables: a `NOTIFY_SOCKET` that is
/// the predecessor's private socket (a predecessor run without a service
/// manager sets both, for successors that only know `NOTIFY_SOCKET`) is
/// not a service manager's.
fn take_handoff_environment() {
    let predecessor_socket = std::env::var_os(HANDOFF_NOTIFY_SOCKET).map(PathBuf::from);
    let predecessor = std::env::var(HANDOFF_PREDECESSOR_PID)
        .ok()
        .and_then(|pid| pid.parse().ok());
    std::env::remove_var(HANDOFF_NOTIFY_SOCKET);
    std::env::remove_var(HANDOFF_PREDECESSOR_PID);
    let manager = std::env::var_os("NOTIFY_SOCKET");
    if manager.is_some() && manager.as_deref() == predecessor_socket.as_deref().map(Path::as_os_str)
    {
        std::env::remove_var("NOTIFY_SOCKET");
    }
    let supervised = std::env::var_os("NOTIFY_SOCKET").is_some();
    let _ = HANDOFF.set(Place {
        predecessor_socket,
        predecessor,
        supervised,
    });
}

/// Tells whoever started this process that it is ready: the predecessor of
/// an in-place upgrade (which tells the service manager, if any, once it
/// has handed over), or else the service manager: `READY=1` on
/// `NOTIFY_SOCKET`, if set.
fn notify_ready() {
    let sent = match &handoff().predecessor_socket {
        Some(path) => std::os::unix::net::UnixDatagram::unbound()
            .and_then(|socket| socket.send_to(b"READY=1\n", path))
            .map(drop),
        None => sd_notify::notify(&[NotifyState::Ready]),
    };
    if let Err(error) = sent {
        warn!(%error, "could not notify readiness");
    }
}

/// Tells the service manager that the server is stopping.
fn notify_stopping() {
    tell_manager(&[NotifyState::Stopping]);
}

/// Sends `states` to the service manager, if one supervises this process.
fn tell_manager(states: &[NotifyState<'_>]) {
    if handoff().supervised {
        if let Err(error) = sd_notify::notify(states) {
            warn!(target: LOG_TARGET, %error, "could not notify the service manager");
        }
    }
}

/// Resolves once the predecessor this process replaced (in an in-place
/// upgrade) has exited; at once in any other process. Spawned when the
/// process starts serving, it looks only while the predecessor lives, so a
/// pid reused long after cannot hold it.
async fn predecessor_gone() {
    if let Some(pid) = handoff().predecessor {
        detach::exited(pid).await;
    }
}

/// Waits, at the end of a successor's shutdown, for `gone` (its
/// [`predecessor_gone`] task) at most [`PREDECESSOR_WAIT`]: a service
/// manager that sees its main process exit stops what is left of the unit,
/// and the predecessor may still be draining.
async fn wait_for_predecessor(gone: JoinHandle<()>) {
    if gone.is_finished() {
        return;
    }
    let pid = handoff().predecessor.unwrap_or_default();
    info!(target: LOG_TARGET, pid, "waiting for the process this one replaced to finish draining");
    if tokio::time::timeout(PREDECESSOR_WAIT, gone).await.is_err() {
        warn!(target: LOG_TARGET, pid, wait = ?PREDECESSOR_WAIT, "the process this one replaced still runs; exiting anyway");
    }
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
/// shutdown once the successor is ready. A failed upgrade is logged (and
/// reported to the service manager) and the process keeps serving. The
/// sockets are closed when this returns, so that a normal shutdown still
/// refuses new connections once its own listeners close.
async fn upgrade_on_hangup(
    (mut hangups, successor): (Signal, Successor),
    sockets: Vec<OwnedFd>,
    watch: Watch,
    trigger: Trigger,
) -> Option<u32> {
    loop {
        tokio::select! {
            Some(()) = hangups.recv() => {}
            () = watch.triggered() => return None,
        }
        let attempt = ATTEMPTS.fetch_add(1, Ordering::Relaxed) + 1;
        let this = std::process::id();
        info!(target: LOG_TARGET, exe = %successor.exe.display(), attempt, "SIGHUP: starting a new process on the same socket");
        report(attempt, reload::Outcome::Upgrading);
        let reloading = NotifyState::monotonic_usec_now()
            .inspect_err(
                |error| warn!(target: LOG_TARGET, %error, "cannot read the monotonic clock"),
            )
            .ok();
        let status = format!("upgrade #{attempt}: starting a new process");
        let mut states = vec![NotifyState::Reloading, NotifyState::Status(&status)];
        states.extend(reloading);
        tell_manager(&states);
        match upgrade(&sockets, &successor).await {
            Ok(pid) => {
                info!(target: LOG_TARGET, pid, "the new process is ready; this one drains and exits");
                let status =
                    format!("serving; upgrade #{attempt} replaced pid {this} with pid {pid}");
                tell_manager(&[
                    NotifyState::MainPid(pid),
                    NotifyState::Ready,
                    NotifyState::Status(&status),
                ]);
                report(attempt, reload::Outcome::Replaced(pid));
                trigger.trigger_with_lame_duck(format!("upgraded to pid {pid}"), UPGRADE_LAME_DUCK);
                return Some(pid);
            }
            Err(error) => {
                warn!(target: LOG_TARGET, %error, "upgrade failed; this process keeps serving");
                let status = format!("upgrade #{attempt} failed: {error}; pid {this} serves on");
                tell_manager(&[NotifyState::Ready, NotifyState::Status(&status)]);
                report(attempt, reload::Outcome::Failed(error.to_string()));
            }
        }
    }
}

/// Writes how upgrade `attempt` stands where [`reload::reload`] (the unit's
/// `ExecReload=`) reads it, if the process runs in a unit with a runtime
/// directory.
fn report(attempt: u32, outcome: reload::Outcome) {
    let Some(path) = reload::status_path() else {
        return;
    };
    let status = reload::Status {
        pid: std::process::id(),
        attempt,
        outcome,
    };
    if let Err(error) = reload::write_status(&path, &status) {
        warn!(target: LOG_TARGET, %error, path = %path.display(), "cannot write the upgrade's status");
    }
}

/// Starts the successor with `sockets` as fds 3, 4, … and waits until it
/// is ready; returns its pid. The error says why not, in its message.
///
/// Under a service manager the successor is started detached (through
/// [`detach`]), so that it is not this process's child; otherwise it is
/// started directly.
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
    let detached = handoff().supervised;
    let mut command = tokio::process::Command::new(&successor.exe);
    command
        .args(&successor.args)
        .env("LISTEN_FDS", mappings.len().to_string())
        .env("LISTEN_FDNAMES", vec![name; mappings.len()].join(":"))
        .env_remove("LISTEN_PID")
        .env(HANDOFF_NOTIFY_SOCKET, notify.path())
        .env(HANDOFF_PREDECESSOR_PID, std::process::id().to_string());
    if detached {
        // NOTIFY_SOCKET stays the manager's: the successor will be its main
        // process, and say so there from its next SIGHUP or shutdown on.
        command.env(HANDOFF_DETACH, &successor.exe);
    } else {
        // Also where successors that only know `NOTIFY_SOCKET` report.
        command.env("NOTIFY_SOCKET", notify.path());
    }
    command
        .fd_mappings(mappings)
        .map_err(|collision| cannot_start(io::Error::other(collision)))?;
    let mut child = command.spawn().map_err(cannot_start)?;

    // Directly started, the successor is the child; started detached, the
    // child only starts it, reports its pid as `MAINPID=` and exits.
    let mut successor_pid = if detached { None } else { child.id() };
    let mut child_exited = false;
    let mut buffer = [0u8; 256];
    let mut look = tokio::time::interval(detach::LOOK_INTERVAL);
    let deadline = tokio::time::sleep(UPGRADE_READY_TIMEOUT);
    tokio::pin!(deadline);
    let outcome = loop {
        tokio::select! {
            // A pid reported just before its sender exited is read first.
            biased;
            received = notify.as_file().recv(&mut buffer) => {
                let Ok(len) = received else { continue };
                let message = String::from_utf8_lossy(&buffer[..len]);
                if let Some(pid) = message.lines().find_map(|line| line.strip_prefix("MAINPID=")) {
                    successor_pid = pid.trim().parse().ok().filter(|_| detached).or(successor_pid);
                }
                if message.lines().any(|line| line == "READY=1") {
                    break successor_pid.ok_or_else(|| io::Error::other("the new process reported ready without its pid"));
                }
            }
            status = child.wait(), if !child_exited => {
                child_exited = true;
                match status {
                    Ok(status) if detached && status.success() => {}
                    Ok(status) if detached => break Err(io::Error::other(format!("the new process could not be started detached ({status})"))),
                    Ok(status) => break Err(io::Error::other(format!("the new process exited before it was ready ({status})"))),
                    Err(error) => break Err(cannot_start(error)),
                }
            }
            _ = look.tick(), if detached && child_exited => match successor_pid {
                Some(pid) if !detach::alive(pid) => break Err(io::Error::other(format!("the new process (pid {pid}) exited before it was ready"))),
                Some(_) => {}
                None => break Err(io::Error::other("the new process was started detached, but its pid never came")),
            },
            () = &mut deadline => break Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the new process was not ready within {UPGRADE_READY_TIMEOUT:?}"),
            )),
        }
    };
    if outcome.is_err() {
        if detached {
            if let Some(pid) = successor_pid {
                detach::kill(pid);
            }
        }
        let _ = child.kill().await;
    }
    outcome
}
