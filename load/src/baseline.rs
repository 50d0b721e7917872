//! The servers lameduck is measured against. Each binary in `src/bin/` is a
//! thin `main` around one of these.
//!
//! - [`plain_axum`]: lameduck's own app (same router, same middleware, same
//!   database code) served the way most axum services are:
//!   `axum::serve(listener, router).with_graceful_shutdown(sigterm)`. No
//!   readiness flip, no lame-duck period, no deadline.
//! - [`bare_hyper`]: a hyper-util server answering `GET /healthz` with
//!   200 `ok`: the floor of what serving HTTP costs. At SIGTERM it either
//!   exits at once, leaving its connections to the kernel, or, with
//!   [`OnSigterm::Graceful`], follows hyper-util's own recipe
//!   (`GracefulShutdown`): every connection is told to close, and the
//!   process exits when the last one has.
//! - [`redirect_uncounted`]: lameduck itself with hit counting switched off
//!   (`HitCounter::set_counting(false)`), to price the counting.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::process::ExitCode;

use anyhow::Context;
use axum::Extension;
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Method, Request};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use lameduck::config::{Cli, Command, ServerConfig};
use lameduck::lifecycle::{Lifecycle, RequestScope};
use lameduck::{telemetry, App};
use tokio::net::TcpListener;
use tokio::signal::unix::{signal as unix_signal, SignalKind};

/// Parses lameduck's own command line (`NAME server --listen …`), so the
/// harness starts every flavor with the same arguments.
///
/// # Errors
/// Exit code 2 with clap's message for a bad command line.
pub fn server_config() -> Result<ServerConfig, ExitCode> {
    use clap::Parser;
    match Cli::try_parse() {
        Ok(Cli {
            command: Command::Server(config),
        }) => Ok(config),
        Ok(_) => {
            eprintln!("only the `server` subcommand is supported");
            Err(ExitCode::from(2))
        }
        Err(error) => {
            let _ = error.print();
            Err(ExitCode::from(if error.use_stderr() { 2 } else { 0 }))
        }
    }
}

/// Runs `serve` on a multi-threaded runtime and maps its error to exit 1.
pub fn run<F>(serve: F) -> ExitCode
where
    F: std::future::Future<Output = anyhow::Result<()>>,
{
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("cannot start the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(serve);
    runtime.shutdown_background();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

async fn sigterm() {
    match unix_signal(SignalKind::terminate()) {
        Ok(mut terminate) => {
            terminate.recv().await;
        }
        Err(error) => {
            tracing::error!(%error, "cannot install the SIGTERM handler");
            std::future::pending::<()>().await;
        }
    }
}

/// lameduck's app on `axum::serve(..).with_graceful_shutdown(sigterm)`.
/// After serving, the app's workers stop and its finalizers run (the final
/// hit flush, closing the pool), so hits are not lost for lack of a flush:
/// what the baseline lacks is only the lifecycle.
///
/// # Errors
/// If the app cannot be built.
pub async fn plain_axum(config: ServerConfig) -> anyhow::Result<()> {
    telemetry::init(config.log_format);
    // The shutdown handle is never triggered: readiness stays 200 until the
    // process is gone, as in a service that has no lame-duck logic.
    let parts = App::build(config, Lifecycle::new())
        .await
        .context("startup failed")?
        .into_parts();
    let addr = parts.listener.local_addr()?;
    tracing::info!("listening on http://{addr}");
    let router = parts.router.layer(Extension(RequestScope::detached()));
    axum::serve(parts.listener, router)
        .with_graceful_shutdown(sigterm())
        .await
        .context("axum::serve failed")?;
    let (_shutdown, workers) = parts.lifecycle.into_parts();
    let stop = workers.stop().await;
    tracing::info!(stop = %stop.summary(), "drained; workers stopped");
    Ok(())
}

/// What [`bare_hyper`] does at SIGTERM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnSigterm {
    /// Return at once: the kernel closes every connection at exit.
    Exit,
    /// Stop accepting, `graceful_shutdown()` every connection through
    /// hyper-util's `GracefulShutdown`, and return when all have closed.
    Graceful,
}

/// A hyper-util server on `listen` answering `GET /healthz` with 200 `ok`
/// (404 otherwise), until SIGTERM; then as `on_sigterm` says.
///
/// # Errors
/// If it cannot bind.
pub async fn bare_hyper(listen: SocketAddr, on_sigterm: OnSigterm) -> anyhow::Result<()> {
    let listener = TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    println!("listening on http://{}", listener.local_addr()?);
    let builder = auto::Builder::new(TokioExecutor::new());
    let service = hyper::service::service_fn(|request: Request<Incoming>| async move {
        let ok = request.method() == Method::GET && request.uri().path() == "/healthz";
        let response = if ok {
            hyper::Response::new(Full::new(Bytes::from_static(b"ok")))
        } else {
            let mut response = hyper::Response::new(Full::new(Bytes::new()));
            *response.status_mut() = hyper::StatusCode::NOT_FOUND;
            response
        };
        Ok::<_, Infallible>(response)
    });
    // Only the graceful flavor watches its connections: the one that exits
    // at once stays the bare floor of serving.
    let graceful = (on_sigterm == OnSigterm::Graceful).then(GracefulShutdown::new);
    let terminate = sigterm();
    tokio::pin!(terminate);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let _ = stream.set_nodelay(true);
                let builder = builder.clone();
                let watcher = graceful.as_ref().map(GracefulShutdown::watcher);
                tokio::spawn(async move {
                    let connection = builder.serve_connection(TokioIo::new(stream), service);
                    let _ = match watcher {
                        Some(watcher) => watcher.watch(connection).await,
                        None => connection.await,
                    };
                });
            }
            () = &mut terminate => break,
        }
    }
    if let Some(graceful) = graceful {
        drop(listener);
        graceful.shutdown().await;
    }
    Ok(())
}

/// lameduck itself, with hit counting switched off: the redirect path
/// minus `hits.record`, everything else identical.
///
/// # Errors
/// If the app cannot be built.
pub async fn redirect_uncounted(config: ServerConfig) -> anyhow::Result<()> {
    telemetry::init(config.log_format);
    let lifecycle = Lifecycle::new()
        .with_signals()
        .context("cannot install signal handlers")?;
    let app = App::build(config, lifecycle)
        .await
        .context("startup failed")?;
    app.hits().set_counting(false);
    let report = app.run().await;
    tracing::info!(outcome = ?report.drain.outcome, stop = %report.stop.summary(), "drained; workers stopped");
    Ok(())
}
