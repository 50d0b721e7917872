//! `lameduck`: an HTTP service that stops, restarts and rolls out under load
//! without dropping a request. `main` parses the command line, starts
//! logging, builds the app, runs it until a signal, and turns the outcome
//! into an exit code.
//!
//! - [`app`]: the service (one route, one worker, one finalizer): replace it.
//! - [`counts`]: state of its own, requests per route, written behind.
//! - [`config`]: command line and environment.
//! - [`http`]: health, readiness, metrics.
//!
//! The lifecycle itself (signals, lame duck, drain, deadline, workers and
//! finalizers) is the crate in `lifecycle/`; socket activation and the
//! in-place upgrade the one in `handoff/`; the lifecycle's flags, exit codes,
//! the health probe, listeners, logging and the lifecycle's metrics the one
//! in `service/`; traces over OTLP the one in `traces/`; the write-behind
//! component (flush, journal, spill, replay) the one in `writebehind/`.

mod app;
mod config;
mod counts;
mod http;

use std::process::ExitCode;

use clap::error::ErrorKind;
use clap::Parser;

use lameduck_handoff::{self as handoff, Handoff, Successor};
use lameduck_lifecycle::{error_chain, Lifecycle, Report, LOG_TARGET};
use lameduck_service::{healthcheck, logs, Exit, PidFile};
use lameduck_traces::{self as traces, Traces};

use crate::app::App;
use crate::config::{Cli, Command, ServerConfig};

/// The service's name as its package spells it, for its messages: read from
/// `Cargo.toml` at compile time, so renaming the package renames them.
const NAME: &str = env!("CARGO_PKG_NAME");

fn main() -> ExitCode {
    // Started by an in-place upgrade under systemd only to start the new
    // server detached: before anything else.
    if let Some(detached) = handoff::detach() {
        return match detached {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("{NAME}: cannot start the new process detached: {error}");
                ExitCode::FAILURE
            }
        };
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => return usage_error(&error),
    };
    match cli.command {
        Command::Server(config) => {
            // Before any thread starts: this clears LISTEN_FDS from the
            // environment.
            let inherited = handoff::inherited_listeners();
            let runtime = match tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime,
                Err(error) => {
                    eprintln!("{NAME}: cannot start the async runtime: {error}");
                    return Exit::Startup.into();
                }
            };
            // Inside the runtime: the gRPC exporter's channel lives on it.
            let traces = match runtime.block_on(async { Traces::start(&config.otlp, traces::service!()) }) {
                Ok(traces) => traces,
                Err(error) => {
                    logs::init(config.log_format, None);
                    tracing::error!("traces: {}", error_chain(&error));
                    return Exit::Usage.into();
                }
            };
            logs::init(config.log_format, traces.as_ref());
            if let Some(traces) = &traces {
                traces.log_started();
            }
            let inherited = match inherited {
                Ok(inherited) => inherited,
                Err(error) => {
                    tracing::error!(%error, "an inherited socket is neither a TCP nor a Unix stream listener");
                    return Exit::Startup.into();
                }
            };
            let exit = runtime.block_on(async {
                let exit = server(config, inherited, traces.clone()).await;
                // A run flushes its traces as its last finalizer; a start
                // that failed never runs its finalizers: flush here.
                if let (Exit::Startup | Exit::Usage, Some(traces)) = (exit, traces) {
                    let _ = traces.flush().await;
                }
                exit
            });
            // Anything still running was abandoned on purpose; do not wait.
            runtime.shutdown_background();
            exit.into()
        }
        Command::Healthcheck(config) => match healthcheck::probe(&config, NAME) {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("{NAME} healthcheck: {}", error_chain(&error));
                ExitCode::FAILURE
            }
        },
        Command::Reload(config) => {
            match handoff::reload::reload(config.pid, config.timeout) {
                Ok(pid) => {
                    println!("{NAME} reload: upgraded in place, pid {} → pid {pid}", config.pid);
                    ExitCode::SUCCESS
                }
                Err(error) => {
                    eprintln!("{NAME} reload: {}", error_chain(&error));
                    ExitCode::FAILURE
                }
            }
        }
    }
}

async fn server(
    config: ServerConfig,
    inherited: handoff::Listeners,
    traces: Option<Traces>,
) -> Exit {
    // Handlers first: from here on a signal is queued, not fatal.
    let lifecycle = match Lifecycle::new().with_signals() {
        Ok(lifecycle) => lifecycle,
        Err(error) => {
            tracing::error!(%error, "cannot install signal handlers");
            return Exit::Startup;
        }
    };
    let mut lifecycle = match Successor::current().and_then(|s| Handoff::new().with_upgrade(s)) {
        Ok(handoff) => lifecycle.with_handover(handoff),
        Err(error) => {
            tracing::error!(%error, "in-place upgrade unavailable (SIGHUP handler or own binary)");
            return Exit::Startup;
        }
    };
    if let Some(traces) = traces {
        flush_traces_last(&mut lifecycle, traces);
    }
    let pid_path = config.serve.pid_file.clone();
    let mut app = match App::build(config, lifecycle, inherited).await {
        Ok(app) => app,
        Err(error) => {
            tracing::error!("startup failed: {}", error_chain(&error));
            return Exit::Startup;
        }
    };
    let Ok(pid_file) = PidFile::write_if_asked(pid_path.as_deref()) else {
        return Exit::Startup;
    };
    tracing::info!(
        shutdown_budget = ?app.shutdown_budget(),
        "started; a supervisor must wait longer than the shutdown budget before SIGKILL"
    );

    let report = app.run().await;
    if let Some(pid_file) = pid_file {
        pid_file.remove();
    }
    let exit = Exit::from_report(&report);
    summarize(&report, exit);
    exit
}

/// Registers the flush of the traces before anything else, so that it runs
/// after every other finalizer (and force hook), and the spans of their work
/// go with it.
fn flush_traces_last(lifecycle: &mut Lifecycle, traces: Traces) {
    traces::open::judge_by(lifecycle.watch());
    let workers = lifecycle.workers();
    workers.on_shutdown("flush traces", traces::TRACE_FLUSH_BUDGET, {
        let traces = traces.clone();
        move || traces.flush()
    });
    workers.on_force("flush traces", move || traces.flush_now());
}

/// The one summary line of the whole shutdown.
fn summarize(report: &Report, exit: Exit) {
    let drain = &report.drain;
    tracing::info!(
        target: LOG_TARGET,
        reason = drain.reason.as_deref().unwrap_or("none"),
        lame_duck_ms = drain.lame_duck.as_millis(),
        drain_ms = drain.drain.as_millis(),
        backlog_accepted = drain.backlog_accepted,
        requests_drained = drain.requests_drained,
        requests_aborted = drain.requests_aborted,
        requests_abandoned = drain.requests_abandoned,
        connections_closed_by_client = drain.closed_by_client,
        connections_closed_by_server = drain.closed_by_server,
        connections_abandoned = drain.connections_abandoned,
        stopped = %report.stop.summary(),
        exit_code = exit.code(),
        "shutdown complete"
    );
}

/// Help and version go to stdout with exit 0; anything else is a one-line
/// message naming the option, and exit code 2.
fn usage_error(error: &clap::Error) -> ExitCode {
    match error.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
            let _ = error.print();
            ExitCode::SUCCESS
        }
        _ => {
            let rendered = error.render().to_string();
            let line = rendered
                .lines()
                .find(|line| !line.trim().is_empty())
                .unwrap_or("invalid command line");
            let line = line.strip_prefix("error: ").unwrap_or(line);
            eprintln!("{NAME}: {line} (see --help)");
            Exit::Usage.into()
        }
    }
}
