//! [`Lifecycle`]: the one owner of the whole timeline. Signals → lame duck
//! → stop accepting → drain → deadline → workers → finalizers, with the
//! [`Handover`] (a service manager, an in-place upgrade) told on the way.

use std::future::Future;
use std::io;
use std::os::fd::OwnedFd;
use std::pin::Pin;

use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use crate::admin::{serve_admin, ADMIN_CLOSE_GRACE};
use crate::task::HttpService;
use crate::{
    serve, DrainOutcome, DrainReport, Force, Handover, Listener, Phase, ServeConfig, Shutdown,
    StopReport, Trigger, Watch, Workers,
};

/// The process lifecycle: owns the shutdown timeline, the workers and
/// finalizers, and (once asked) the signals and a [`Handover`].
///
/// Build it first, hand its [`Watch`] to readiness and its
/// [`Workers`] your background work, then [`serve`](Lifecycle::serve).
#[must_use = "a lifecycle does nothing until it serves"]
pub struct Lifecycle {
    shutdown: Shutdown,
    workers: Workers,
    handover: Option<Box<dyn Handover>>,
}

impl std::fmt::Debug for Lifecycle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lifecycle")
            .field("shutdown", &self.shutdown)
            .field("workers", &self.workers)
            .field("handover", &self.handover.is_some())
            .finish()
    }
}

/// How a run ended, for the application to turn into an exit code.
#[derive(Debug)]
pub struct Report {
    /// What the request drain did.
    pub drain: DrainReport,
    /// What stopping workers and running finalizers did.
    pub stop: StopReport,
    /// The pid of the successor this process handed its sockets to, if it
    /// retired after an in-place upgrade: the sockets live on in it.
    pub upgraded_to: Option<u32>,
}

impl Report {
    /// Every request finished, every worker and finalizer did its work,
    /// nothing was forced and every stateful component's updates reached
    /// its store: exit 0.
    pub fn is_clean(&self) -> bool {
        self.drain.outcome == DrainOutcome::Clean
            && !self.stop.forced
            && !self.stop.worker_failed()
            && !self.stop.finalizer_failed()
            && !self.stop.state_spilled()
            && !self.stop.state_lost()
    }
}

impl Default for Lifecycle {
    fn default() -> Self {
        Lifecycle::new()
    }
}

impl Lifecycle {
    /// A lifecycle in the `Running` phase, with no signal handlers yet.
    pub fn new() -> Lifecycle {
        let shutdown = Shutdown::new();
        let workers = Workers::new(&shutdown);
        Lifecycle {
            shutdown,
            workers,
            handover: None,
        }
    }

    /// Installs the SIGTERM and SIGINT handlers now (do it before a slow
    /// startup: a signal is then queued, not fatal). The first signal
    /// triggers the shutdown; the next one — a repeated SIGTERM (what
    /// `docker stop` and the kubelet send) or a SIGINT — forces it. Needs a
    /// runtime.
    ///
    /// # Errors
    /// If the OS refuses a handler.
    pub fn with_signals(self) -> io::Result<Lifecycle> {
        let mut terminate = signal(SignalKind::terminate())?;
        let mut interrupt = signal(SignalKind::interrupt())?;
        let (trigger, force) = (self.trigger_handle(), self.force_handle());
        tokio::spawn(async move {
            let first = next_signal(&mut terminate, &mut interrupt).await;
            trigger.trigger(first);
            let second = next_signal(&mut terminate, &mut interrupt).await;
            force.force(format!("second signal ({second})"));
        });
        Ok(self)
    }

    /// Tells `handover` when serving starts and when the process may exit:
    /// a service manager's notifications and the in-place upgrade
    /// (`lameduck-handoff`'s `Handoff`), or a handover of your own.
    pub fn with_handover(mut self, handover: impl Handover) -> Lifecycle {
        self.handover = Some(Box::new(handover));
        self
    }

    /// A handle that can only watch the timeline: readiness, request code.
    pub fn watch(&self) -> &Watch {
        self.shutdown.watch()
    }

    /// A handle that starts the shutdown (the application's own reasons).
    pub fn trigger_handle(&self) -> Trigger {
        self.shutdown.trigger_handle()
    }

    /// A handle that forces the shutdown, as a second signal does.
    pub fn force_handle(&self) -> Force {
        self.shutdown.force_handle()
    }

    /// Where background workers, finalizers and force hooks are registered.
    pub fn workers(&mut self) -> &mut Workers {
        &mut self.workers
    }

    /// The timeline's owner and the workers, for driving [`serve`] from a
    /// loop of your own.
    pub fn into_parts(self) -> (Shutdown, Workers) {
        (self.shutdown, self.workers)
    }

    /// Serves `service` on `listener`; [`Serve::run`] runs the timeline.
    pub fn serve<L: Listener, S: HttpService>(self, listener: L, service: S) -> Serve<L, S> {
        Serve {
            lifecycle: self,
            listener,
            service,
            config: ServeConfig::default(),
            admin: None,
            closing: CancellationToken::new(),
        }
    }
}

/// The next SIGTERM or SIGINT, by name. Cancel safe: a signal that arrives
/// while nobody waits is kept.
async fn next_signal(terminate: &mut Signal, interrupt: &mut Signal) -> &'static str {
    tokio::select! {
        Some(()) = terminate.recv() => "SIGTERM",
        Some(()) = interrupt.recv() => "SIGINT",
    }
}

type AdminTask = Pin<Box<dyn Future<Output = ()> + Send>>;

/// A lifecycle with its listener and service, ready to [`run`](Serve::run).
#[must_use = "nothing is served until `run` is awaited"]
pub struct Serve<L, S> {
    lifecycle: Lifecycle,
    listener: L,
    service: S,
    config: ServeConfig,
    admin: Option<(AdminTask, io::Result<OwnedFd>)>,
    /// Closes the admin listener, after the finalizers.
    closing: CancellationToken,
}

impl<L: Listener, S: HttpService> Serve<L, S> {
    /// The drain delay, deadline, limits and timeouts.
    pub fn config(mut self, config: ServeConfig) -> Self {
        self.config = config;
        self
    }

    /// Also serves `service` on `listener`, an admin socket for probes and
    /// metrics: open through the drain and the finalizers, closed last
    /// (with [`ADMIN_CLOSE_GRACE`]); passed on by the upgrade as fd 4.
    pub fn admin<A: Listener, T: HttpService>(mut self, listener: A, service: T) -> Self {
        let fd = listener.as_fd().try_clone_to_owned();
        let task = serve_admin(listener, service, self.closing.clone());
        self.admin = Some((Box::pin(task), fd));
        self
    }

    /// Runs the whole timeline: serves until the shutdown is triggered (a
    /// signal, an upgrade, a failed critical worker, the application), then
    /// the lame duck, the drain and its deadline, the workers and the
    /// finalizers (force hooks if forced), and closes the admin socket.
    pub async fn run(self) -> Report {
        let shutdown = self.lifecycle.shutdown;
        let mut handover = self.lifecycle.handover;
        let (admin, admin_fd) = self.admin.unzip();
        let upgrading = handover.as_mut().map(|handover| {
            let mut fds = vec![self.listener.as_fd().try_clone_to_owned()];
            fds.extend(admin_fd);
            let sockets = fds.into_iter().collect();
            let trigger = shutdown.trigger_handle();
            let beside = handover.serving(sockets, shutdown.watch(), trigger);
            AbortOnDropHandle::new(tokio::spawn(beside))
        });
        let admin = admin.map(|task| AbortOnDropHandle::new(tokio::spawn(task)));

        let drain = serve(self.listener, self.service, &shutdown, self.config).await;
        // Done by now unless a signal came in the middle of an upgrade.
        let upgraded_to = match upgrading {
            Some(upgrading) if upgrading.is_finished() => upgrading.await.ok().flatten(),
            _ => None,
        };
        let stop = self.lifecycle.workers.stop().await;
        shutdown.set_phase(Phase::Stopped);
        self.closing.cancel();
        // Dropping the handle aborts the admin server: at once if forced,
        // or once its grace has run out.
        if let Some(admin) = admin.filter(|_| !stop.forced) {
            let _ = tokio::time::timeout(ADMIN_CLOSE_GRACE, admin).await;
        }
        if let Some(handover) = handover.as_mut().filter(|_| !stop.forced) {
            handover.exiting().await;
        }
        Report {
            drain,
            stop,
            upgraded_to,
        }
    }
}
