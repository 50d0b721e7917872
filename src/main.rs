//! `lameduck`: parse the command line, start logging, build the app, run it
//! until a signal, and turn the outcome into an exit code.

use std::process::ExitCode;

use clap::error::ErrorKind;
use clap::Parser;
use lameduck::app::RunReport;
use lameduck::config::{Cli, Command, ServerConfig};
use lameduck::exit::Exit;
use lameduck::lifecycle::{signal, LifecycleMetrics, Shutdown, LOG_TARGET};
use lameduck::{healthcheck, telemetry, App};

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => return usage_error(&error),
    };
    match cli.command {
        Command::Server(config) => {
            telemetry::init(config.log_format);
            let runtime = match tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime,
                Err(error) => {
                    eprintln!("lameduck: cannot start the async runtime: {error}");
                    return Exit::Startup.into();
                }
            };
            let exit = runtime.block_on(server(config));
            // Anything still running was abandoned on purpose; do not wait.
            runtime.shutdown_background();
            exit.into()
        }
        Command::Healthcheck(config) => match healthcheck::probe(&config) {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("lameduck healthcheck: {}", error_chain(&error));
                ExitCode::FAILURE
            }
        },
    }
}

async fn server(config: ServerConfig) -> Exit {
    // Handlers first: from here on a signal is queued, not fatal.
    let signals = match signal::Signals::install() {
        Ok(signals) => signals,
        Err(error) => {
            tracing::error!(%error, "cannot install signal handlers");
            return Exit::Startup;
        }
    };
    let shutdown = Shutdown::new(LifecycleMetrics::default());
    tokio::spawn(signal::forward(signals, shutdown.clone()));

    let app = match App::build(config, shutdown.clone()).await {
        Ok(app) => app,
        Err(error) => {
            tracing::error!("startup failed: {}", error_chain(&error));
            return Exit::Startup;
        }
    };
    let report = app.run().await;
    let exit = Exit::from_run(&report);
    summarize(&report, exit);
    exit
}

/// The one summary line of the whole shutdown.
fn summarize(run: &RunReport, exit: Exit) {
    let report = &run.drain;
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
        spilled_hits = run.spilled_hits,
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
            let line = rendered
                .lines()
                .find(|line| !line.trim().is_empty())
                .unwrap_or("invalid command line");
            let line = line.strip_prefix("error: ").unwrap_or(line);
            eprintln!("lameduck: {line} (see --help)");
            Exit::Usage.into()
        }
    }
}

fn error_chain(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        // Some errors already print their source; say it once.
        let cause_text = cause.to_string();
        if !message.ends_with(&cause_text) {
            message.push_str(": ");
            message.push_str(&cause_text);
        }
        source = cause.source();
    }
    message
}
