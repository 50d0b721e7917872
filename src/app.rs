//! The one place that wires the example domain to the lifecycle:
//! [`App::build`] opens the database and binds the listener,
//! [`App::run`] serves until shutdown, drains, and finalizes.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use prometheus_client::registry::Registry;

use crate::config::ServerConfig;
use crate::handoff::Listeners;
use crate::http::{
    self, AppState, GuardMetrics, HttpMetrics, ReadinessPolicy, Startup, StateParts,
};
use crate::lifecycle::{self, Lifecycle, Report, ADMIN_CLOSE_GRACE, DEADLINE_CLEANUP_GRACE};
use crate::links::cache::LinkCache;
use crate::links::hits::{self, HitCounter, HitSink};
use crate::links::live::LiveHits;
use crate::listen::{PublicListener, Socket};
use crate::storage::{self, Storage, StorageError, StorageMetrics};
use crate::telemetry::traces::TRACE_FLUSH_BUDGET;
use crate::tls::reload::{run_reloader, RELOAD_POLL_INTERVAL};
use crate::tls::{self as tls, CertStore, TlsAcceptor, TlsError, TlsMetrics};
use lameduck_service::listen::{BindError, Listening, SocketFiles};
use lameduck_service::metrics::LifecycleCollector;
use lameduck_service::{Exit, LogFormat, ServeArgs, Start};
use lameduck_traces::Traces;
use lameduck_writebehind::{OpenError, ReplayError};

/// How long the hit flusher may take to stop after its token fires.
pub const FLUSHER_STOP_BUDGET: Duration = lameduck_writebehind::FLUSHER_STOP_BUDGET;

/// How long the final hit flush may retry the database before it spills the
/// hits to disk (it keeps [`SPILL_RESERVE`](lameduck_writebehind::SPILL_RESERVE)
/// of this for the spill).
pub const FINAL_FLUSH_BUDGET: Duration = Duration::from_secs(5);

/// How long closing the database pool may take at exit; a connection still
/// held by abandoned work must not hold the process.
pub const POOL_CLOSE_BUDGET: Duration = Duration::from_secs(2);

/// The whole finalize phase at its worst: stopping workers, every
/// finalizer's budget, and closing the admin listener. Part of
/// [`shutdown_budget`].
pub const FINALIZE_BUDGET: Duration = FLUSHER_STOP_BUDGET
    .saturating_add(FINAL_FLUSH_BUDGET)
    .saturating_add(POOL_CLOSE_BUDGET)
    .saturating_add(ADMIN_CLOSE_GRACE);

/// The longest a clean-up can take from the first signal to exit: lame
/// duck + drain timeout + the deadline's cleanup grace + stopping workers
/// and running finalizers (with traces on, their flush too). A supervisor's
/// grace period (Kubernetes' `terminationGracePeriodSeconds`) must be
/// longer, or it kills the process mid-drain.
pub fn shutdown_budget(config: &ServerConfig) -> Duration {
    let traces = if config.serve.otlp.enabled() {
        TRACE_FLUSH_BUDGET
    } else {
        Duration::ZERO
    };
    let serve = &config.serve;
    serve.drain_delay + serve.shutdown_timeout + DEADLINE_CLEANUP_GRACE + FINALIZE_BUDGET + traces
}

/// Why the service could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    /// The database could not be opened or migrated.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// Hits spilled or journaled by an earlier run could not be applied.
    #[error(transparent)]
    Replay(#[from] ReplayError),
    /// The spill directory cannot take a file: a spill at exit would fail.
    #[error(transparent)]
    SpillDir(#[from] OpenError),
    /// The listen address could not be bound.
    #[error(transparent)]
    Bind(#[from] BindError),
    /// The TLS certificate or key is unusable (a configuration error: exit 2).
    #[error(transparent)]
    Tls(#[from] TlsError),
}

/// The pieces of a built [`App`], for serving its router with another loop.
#[derive(Debug)]
pub struct AppParts {
    /// The bound listener.
    pub listener: PublicListener,
    /// The full router.
    pub router: Router,
    /// The open database.
    pub storage: Storage,
    /// The lifecycle, with the hit flusher and the finalizers registered.
    pub lifecycle: Lifecycle,
}

/// A built service: database open, spilled state recovered, listener bound,
/// workers running, router ready.
#[derive(Debug)]
pub struct App {
    listener: PublicListener,
    router: Router,
    admin_listener: Socket,
    /// Unix socket files this process owns: removed at exit, unless handed
    /// to a successor.
    socket_files: SocketFiles,
    admin_router: Router,
    lifecycle: Lifecycle,
    storage: Storage,
    hits: HitCounter,
    config: ServerConfig,
}

impl App {
    /// Opens the database, runs migrations, applies hits spilled by an
    /// earlier run, binds the listener and starts the workers.
    ///
    /// # Errors
    /// A [`StartupError`] naming what failed.
    pub async fn build(config: ServerConfig, lifecycle: Lifecycle) -> Result<App, StartupError> {
        App::build_on(config, lifecycle, Listeners::default()).await
    }

    /// Like [`App::build`], but serves the `inherited` listening sockets
    /// (passed down by systemd or a predecessor) instead of binding
    /// `--listen` and `--admin-listen`. `lifecycle` owns the timeline:
    /// take the handles the caller needs from it first.
    ///
    /// # Errors
    /// A [`StartupError`] naming what failed.
    pub async fn build_on(
        config: ServerConfig,
        mut lifecycle: Lifecycle,
        inherited: Listeners,
    ) -> Result<App, StartupError> {
        let mut registry = Registry::with_prefix(crate::CRATE_NAME);
        LifecycleCollector::register(lifecycle.watch().metrics(), &mut registry);
        crate::telemetry::TracesCollector::register(&mut registry);
        let http_metrics = HttpMetrics::default();
        http_metrics.register(&mut registry);
        let storage_metrics = StorageMetrics::default();
        storage_metrics.register(&mut registry);
        let hits = hits::open(&config)?;
        hits.register(&mut registry);
        let guard_metrics = GuardMetrics::default();
        guard_metrics.register(&mut registry);

        let storage = Storage::open(
            config.database_url.as_deref(),
            &config.data_dir,
            config.database_max_connections,
            storage_metrics,
        )
        .await?;
        storage
            .health()
            .register(registry.sub_registry_with_prefix("db"));
        let tls = match config.tls_files() {
            Some(files) => {
                let contents = files.read()?;
                let pair = files.parse(&contents)?;
                tls::log_loaded(&pair.info, &files, "TLS certificate loaded");
                let metrics = TlsMetrics::default();
                metrics.register(&mut registry);
                metrics.set_expiry(pair.info.not_after);
                let store = Arc::new(CertStore::new(pair));
                lifecycle
                    .workers()
                    .spawn_background("TLS certificate reloader", {
                        let store = Arc::clone(&store);
                        move |token| {
                            run_reloader(
                                store,
                                files,
                                contents,
                                metrics,
                                RELOAD_POLL_INTERVAL,
                                token,
                            )
                        }
                    });
                Some(TlsAcceptor::new(store))
            }
            None => None,
        };
        let Listening {
            public: socket,
            admin: admin_listener,
            files: socket_files,
        } = Listening::bind(&config.serve, inherited).await?;
        let listener = PublicListener::new(socket, tls);

        let workers = lifecycle.workers();
        // Finalizers run last-registered first: the pool closes after the
        // final flush has used it.
        workers.on_shutdown("close database pool", POOL_CLOSE_BUDGET, {
            let storage = storage.clone();
            move || async move {
                // Fault injection for the ways-out tests: a finalizer that
                // overruns its budget.
                #[cfg(feature = "failpoints")]
                if fail::eval("close-database-pool-hangs", |_| ()).is_some() {
                    std::future::pending::<()>().await;
                }
                storage.close().await;
                Ok(())
            }
        });
        workers.spawn_background("database health probe", {
            let storage = storage.clone();
            move |token| storage::run_health_probe(storage, token)
        });
        // Before readiness: the database must hold every hit from before
        // (spilled, or journaled by a process that was killed). Then the
        // flusher, the replayer of what other replicas leave, the final
        // flush after the last redirect, and the spill of a forced exit.
        hits.attach(workers, HitSink(storage.clone())).await?;

        let startup = Startup::default();
        let state = AppState::new(StateParts {
            shutdown: lifecycle.watch().clone(),
            startup: startup.clone(),
            readiness: ReadinessPolicy {
                follows_database: config.readiness_follows_database,
            },
            registry: Arc::new(registry),
            http_metrics,
            guard_metrics,
            storage: storage.clone(),
            hits: hits.clone(),
            links: LinkCache::default(),
            live: LiveHits::default(),
        });
        let admin_router = http::admin_router(state.clone(), config.http_limits());
        let router = http::router(state, config.http_limits());
        startup.complete();
        Ok(App {
            listener,
            router,
            admin_listener,
            socket_files,
            admin_router,
            lifecycle,
            storage,
            hits,
            config,
        })
    }

    /// The bound address (useful with port 0).
    ///
    /// # Panics
    /// If the listener is a Unix socket, or the OS cannot report the address
    /// of a bound socket.
    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("a bound listener has a local address")
    }

    /// The admin listener's address: `/healthz`, `/readyz`, `/metrics`.
    ///
    /// # Panics
    /// If the listener is a Unix socket, or the OS cannot report the address
    /// of a bound socket.
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin_listener
            .local_addr()
            .expect("a bound listener has a local address")
    }

    /// The open database.
    pub fn storage(&self) -> &Storage {
        &self.storage
    }

    /// The write-behind hit counters.
    pub fn hits(&self) -> &HitCounter {
        &self.hits
    }

    /// Registers more workers and finalizers before the app runs (finalizers
    /// added here run before the app's own).
    pub fn workers_mut(&mut self) -> &mut lifecycle::Workers {
        self.lifecycle.workers()
    }

    /// Takes the app apart, for serving its router with another server loop
    /// (the load harness's plain-axum baseline does this).
    pub fn into_parts(self) -> AppParts {
        AppParts {
            listener: self.listener,
            router: self.router,
            storage: self.storage,
            lifecycle: self.lifecycle,
        }
    }

    /// Serves until the shutdown handle is triggered, drains, stops the
    /// workers and runs the finalizers (the final flush, then closing the
    /// pool).
    pub async fn run(self) -> Report {
        let report = self
            .lifecycle
            .serve(self.listener, self.router)
            .config(self.config.serve.config())
            .admin(self.admin_listener, self.admin_router)
            .run()
            .await;
        self.socket_files.remove_after(&report);
        report
    }
}

/// The template's `main` runs the link shortener: its options, the build
/// on the lifecycle, the run.
impl lameduck_service::Service for App {
    type Config = ServerConfig;
    type Error = StartupError;

    async fn build(start: Start<ServerConfig>) -> Result<App, StartupError> {
        App::build_on(start.config, start.lifecycle, start.inherited).await
    }

    fn serve_args(config: &ServerConfig) -> &ServeArgs {
        &config.serve
    }

    /// An unusable certificate or key is a configuration error (exit 2):
    /// one line naming the file and the problem.
    fn startup_exit(error: &StartupError) -> Exit {
        match error {
            StartupError::Tls(_) => Exit::Usage,
            _ => Exit::Startup,
        }
    }

    /// Logs with the requests' lazy spans ([`crate::telemetry`]).
    fn init_logs(format: LogFormat, traces: Option<&Traces>) {
        crate::telemetry::init(format, traces);
    }

    fn shutdown_budget(&mut self) -> Duration {
        self.config.serve.shutdown_budget(self.lifecycle.workers())
    }

    async fn run(self) -> Report {
        App::run(self).await
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::config::{Cli, Command};

    #[test]
    fn the_default_shutdown_budget_fits_the_default_kubernetes_grace_period() {
        let cli = Cli::try_parse_from([crate::NAME, "server"]).expect("defaults parse");
        let Command::Server(config) = cli.command else {
            unreachable!("parsed the server subcommand")
        };
        assert!(shutdown_budget(&config) < Duration::from_secs(30));
    }
}
