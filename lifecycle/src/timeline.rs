//! [`Lifecycle`]: the one owner of the whole timeline. Signals → lame duck
//! → stop accepting → drain → deadline → workers → finalizers, with the
//! in-place upgrade handing the sockets over on the way.

use std::future::Future;
use std::io;
use std::os::fd::OwnedFd;
use std::pin::Pin;

use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::admin::{serve_admin, ADMIN_CLOSE_GRACE};
use crate::handoff::{self, Successor};
use crate::signal::{forward, Signals};
use crate::task::HttpService;
use crate::{
    serve, DrainOutcome, DrainReport, Force, Listener, Phase, ServeConfig, Shutdown, StopReport,
    Trigger, Watch, Workers,
};

/// The process lifecycle: owns the shutdown timeline, the workers and
/// finalizers, and (once asked) the signals and the in-place upgrade.
///
/// Build it first, hand its [`Watch`] to readiness and its
/// [`Workers`] your background work, then [`serve`](Lifecycle::serve).
#[derive(Debug)]
#[must_use = "a lifecycle does nothing until it serves"]
pub struct Lifecycle {
    shutdown: Shutdown,
    workers: Workers,
    upgrade: Option<(Signal, Successor)>,
}

/// How a run ended, for the application to turn into an exit code.
#[derive(Debug)]
pub struct Report {
    /// What the request drain did.
    pub drain: DrainReport,
    /// What stopping workers and running finalizers did.
    pub stop: StopReport,
}

impl Report {
    /// Every request finished, every worker and finalizer did its work and
    /// nothing was forced: exit 0.
    pub fn is_clean(&self) -> bool {
        self.drain.outcome == DrainOutcome::Clean
            && !self.stop.forced
            && !self.stop.worker_failed()
            && !self.stop.finalizer_failed()
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
            upgrade: None,
        }
    }

    /// Installs the SIGTERM and SIGINT handlers now (do it before a slow
    /// startup: a signal is then queued, not fatal). The first signal
    /// triggers the shutdown, the second forces it. Needs a runtime.
    ///
    /// # Errors
    /// If the OS refuses a handler.
    pub fn with_signals(self) -> io::Result<Lifecycle> {
        let signals = Signals::install()?;
        let force = self.shutdown.force_handle();
        tokio::spawn(forward(signals, self.trigger_handle(), force));
        Ok(self)
    }

    /// Upgrades in place on SIGHUP: starts `successor` with the listening
    /// sockets (see [`handoff`]) and, once it is ready, drains and exits.
    /// Installs the SIGHUP handler now.
    ///
    /// # Errors
    /// If the OS refuses the handler.
    pub fn with_upgrade(mut self, successor: Successor) -> io::Result<Lifecycle> {
        self.upgrade = Some((signal(SignalKind::hangup())?, successor));
        Ok(self)
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
        }
    }
}

type AdminTask =
    Box<dyn FnOnce(CancellationToken) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send>;

/// A lifecycle with its listener and service, ready to [`run`](Serve::run).
#[must_use = "nothing is served until `run` is awaited"]
pub struct Serve<L, S> {
    lifecycle: Lifecycle,
    listener: L,
    service: S,
    config: ServeConfig,
    admin: Option<(AdminTask, io::Result<OwnedFd>)>,
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
        let task: AdminTask =
            Box::new(move |closing| Box::pin(serve_admin(listener, service, closing)));
        self.admin = Some((task, fd));
        self
    }

    /// Runs the whole timeline: serves until the shutdown is triggered (a
    /// signal, an upgrade, a failed critical worker, the application), then
    /// the lame duck, the drain and its deadline, the workers and the
    /// finalizers (force hooks if forced), and closes the admin socket.
    pub async fn run(self) -> Report {
        let Serve {
            lifecycle,
            listener,
            service,
            config,
            admin,
        } = self;
        let Lifecycle {
            shutdown,
            workers,
            upgrade,
        } = lifecycle;
        let watch = shutdown.watch().clone();
        let (admin, admin_fd) = admin.unzip();
        if let Some((hangups, successor)) = upgrade {
            let mut fds = vec![listener.as_fd().try_clone_to_owned()];
            fds.extend(admin_fd);
            match fds.into_iter().collect::<io::Result<Vec<OwnedFd>>>() {
                Ok(fds) => {
                    let upgrading = handoff::upgrade_on_hangup(
                        hangups,
                        fds,
                        successor,
                        watch.clone(),
                        shutdown.trigger_handle(),
                    );
                    tokio::spawn(upgrading);
                }
                Err(error) => warn!(%error, "in-place upgrade unavailable"),
            }
        }
        tokio::spawn(async move {
            watch.triggered().await;
            handoff::notify_stopping();
        });
        let closing = CancellationToken::new();
        let mut admin = admin.map(|start| tokio::spawn(start(closing.clone())));
        handoff::notify_ready();

        let drain = serve(listener, service, &shutdown, config).await;
        let stop = workers.stop().await;
        shutdown.set_phase(Phase::Stopped);
        closing.cancel();
        if let Some(admin) = &mut admin {
            if stop.forced
                || tokio::time::timeout(ADMIN_CLOSE_GRACE, &mut *admin)
                    .await
                    .is_err()
            {
                admin.abort();
            }
        }
        Report { drain, stop }
    }
}
