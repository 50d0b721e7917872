//! The one place that wires the example domain to the lifecycle:
//! [`App::build`] opens the database and binds the listener,
//! [`App::run`] serves until shutdown, drains, and finalizes.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;

use crate::config::ServerConfig;
use crate::http::{self, AppState, HttpMetrics, Startup};
use crate::lifecycle::{self, DrainReport, Phase, Shutdown, LOG_TARGET};
use crate::storage::{Storage, StorageError, StorageMetrics};

/// How long closing the database pool may take at exit; a connection still
/// held by abandoned work must not hold the process.
pub const POOL_CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// Why the service could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    /// The database could not be opened or migrated.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// The listen address could not be bound.
    #[error("cannot listen on {addr}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// The pieces of a built [`App`].
#[derive(Debug)]
pub struct AppParts {
    /// The bound listener.
    pub listener: TcpListener,
    /// The full router.
    pub router: Router,
    /// The open database; close it after serving.
    pub storage: Storage,
}

/// A built service: database open, listener bound, router ready.
#[derive(Debug)]
pub struct App {
    listener: TcpListener,
    router: Router,
    shutdown: Shutdown,
    storage: Storage,
    config: ServerConfig,
}

impl App {
    /// Opens the database, runs migrations and binds the listener.
    ///
    /// # Errors
    /// A [`StartupError`] naming what failed.
    pub async fn build(config: ServerConfig, shutdown: Shutdown) -> Result<App, StartupError> {
        let mut registry = Registry::with_prefix("lameduck");
        shutdown.metrics().register(&mut registry);
        let http_metrics = HttpMetrics::default();
        http_metrics.register(&mut registry);
        let storage_metrics = StorageMetrics::default();
        storage_metrics.register(&mut registry);

        let storage = Storage::open(
            config.database_url.as_deref(),
            &config.data_dir,
            config.database_max_connections,
            storage_metrics,
        )
        .await?;
        let listener =
            TcpListener::bind(config.listen)
                .await
                .map_err(|source| StartupError::Bind {
                    addr: config.listen,
                    source,
                })?;

        let startup = Startup::default();
        let router = http::router(AppState {
            shutdown: shutdown.clone(),
            startup: startup.clone(),
            registry: Arc::new(registry),
            http_metrics,
            storage: storage.clone(),
        });
        startup.complete();
        Ok(App {
            listener,
            router,
            shutdown,
            storage,
            config,
        })
    }

    /// The bound address (useful with port 0).
    ///
    /// # Panics
    /// If the OS cannot report the address of a bound socket.
    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("a bound listener has a local address")
    }

    /// Takes the app apart, for serving its router with another server loop
    /// (the load harness's plain-axum baseline does this).
    pub fn into_parts(self) -> AppParts {
        AppParts {
            listener: self.listener,
            router: self.router,
            storage: self.storage,
        }
    }

    /// Serves until the shutdown handle is triggered, drains, then closes
    /// the database pool.
    pub async fn run(self) -> DrainReport {
        let App {
            listener,
            router,
            shutdown,
            storage,
            config,
        } = self;
        let report = lifecycle::serve(listener, router, shutdown.clone(), config.drain()).await;

        if !shutdown.is_forced() {
            tokio::select! {
                result = tokio::time::timeout(POOL_CLOSE_TIMEOUT, storage.close()) => {
                    if result.is_err() {
                        tracing::warn!(target: LOG_TARGET, timeout = ?POOL_CLOSE_TIMEOUT, "database pool did not close in time");
                    }
                }
                () = shutdown.forced() => {}
            }
        }
        shutdown.set_phase(Phase::Stopped);
        report
    }
}
