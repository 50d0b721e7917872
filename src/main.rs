//! `lameduck`: parse the command line, start logging, build the app, run it
//! until a signal, and turn the outcome into an exit code.

use std::process::ExitCode;

use clap::error::ErrorKind;
use clap::Parser;
use lameduck::app::StartupError;
use lameduck::config::{Cli, Command, ServerConfig};
use lameduck::exit::Exit;

use lameduck::handoff::{self, Handoff, Successor};
use lameduck::lifecycle::{error_chain, Lifecycle, Report, LOG_TARGET};
use lameduck::links::hits;
use lameduck::telemetry::traces::{self, Traces};
use lameduck::{healthcheck, telemetry, App, NAME};
use lameduck_service::PidFile;

/// mimalloc instead of the system allocator: a request makes a few dozen
/// short-lived allocations, and glibc's malloc and free were a third of the
/// instructions of `GET /healthz` (`load bench --parts instructions`).
/// Its v2 line (feature `v2`): the crate's default, v3, took about 180 more
/// instructions per request, at the same RSS per idle connection.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
            let traces = runtime
                .block_on(async { Traces::start(&config.otlp, lameduck_traces::service!()) });
            let traces = match traces {
                Ok(traces) => traces,
                Err(error) => {
                    telemetry::init(config.log_format, None);
                    tracing::error!("traces: {}", error_chain(&error));
                    return Exit::Usage.into();
                }
            };
            telemetry::init(config.log_format, traces.as_ref());
            if let Some(traces) = &traces {
                traces.log_started();
            }
            // Fault injection for the ways-out tests (`FAILPOINTS=…`); not
            // compiled into a normal build.
            #[cfg(feature = "failpoints")]
            let _failpoints = fail::FailScenario::setup();
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
                // that failed has none, and its spans (a spill replay's)
                // are flushed here.
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
        Command::Reload(config) => match handoff::reload::reload(config.pid, config.timeout) {
            Ok(pid) => {
                println!(
                    "{NAME} reload: upgraded in place, pid {} → pid {pid}",
                    config.pid
                );
                ExitCode::SUCCESS
            }
            Err(error) => {
                eprintln!("{NAME} reload: {}", error_chain(&error));
                ExitCode::FAILURE
            }
        },
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
    let app = match App::build_on(config, lifecycle, inherited).await {
        Ok(app) => app,
        // An unusable certificate or key is a configuration error: one
        // line naming the file and the problem.
        Err(StartupError::Tls(error)) => {
            tracing::error!("TLS: {error}");
            return Exit::Usage;
        }
        Err(error) => {
            tracing::error!("startup failed: {}", error_chain(&error));
            return Exit::Startup;
        }
    };
    let Ok(pid_file) = PidFile::write_if_asked(pid_path.as_deref()) else {
        return Exit::Startup;
    };

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
fn summarize(run: &Report, exit: Exit) {
    let report = &run.drain;
    let hits = run.stop.kept(hits::NAME).cloned().unwrap_or_default();
    tracing::info!(
        target: LOG_TARGET,
        reason = report.reason.as_deref().unwrap_or("none"),
        lame_duck_ms = report.lame_duck.as_millis(),
        drain_ms = report.drain.as_millis(),
        backlog_accepted = report.backlog_accepted,
        requests_drained = report.requests_drained,
        requests_aborted = report.requests_aborted,
        requests_abandoned = report.requests_abandoned,
        connections_closed_by_client = report.closed_by_client,
        connections_closed_by_server = report.closed_by_server,
        connections_abandoned = report.connections_abandoned,
        flushed_hits = hits.flushed,
        spilled_hits = hits.spilled,
        lost_hits = hits.lost,
        stopped = %run.stop.summary(),
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
            let mut lines = rendered.lines().map(str::trim).filter(|l| !l.is_empty());
            let first = lines.next().unwrap_or("invalid command line");
            let first = first.strip_prefix("error: ").unwrap_or(first);
            // "the following required arguments were not provided:" names
            // them on the next line.
            match lines.next().filter(|_| first.ends_with(':')) {
                Some(next) => eprintln!("{NAME}: {first} {next} (see --help)"),
                None => eprintln!("{NAME}: {first} (see --help)"),
            }
            Exit::Usage.into()
        }
    }
}
