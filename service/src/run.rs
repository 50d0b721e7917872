//! [`main`]: everything a service made from the template does around its
//! own code, from the command line to the exit code.
//!
//! 1. Under systemd, an in-place upgrade runs the binary once only to start
//!    the new server detached ([`lameduck_handoff::detach`]).
//! 2. The command line: `server` with the service's options,
//!    `healthcheck`, `reload`; a bad one is one line and exit 2.
//! 3. `server`: the inherited sockets (before any thread starts), the
//!    runtime, traces (if an endpoint is set) and logs; the lifecycle with
//!    its signals, the in-place upgrade and the traces' flush as its last
//!    finalizer; then the service is built ([`Service::build`]), the pid
//!    file written, the service run, and the one summary line logged.
//! 4. The run's [`Report`] becomes the exit code ([`Exit`]).

use std::future::Future;
use std::process::ExitCode;
use std::time::Duration;

use clap::error::ErrorKind;
use clap::{Args, CommandFactory, FromArgMatches, Parser};
use lameduck_handoff::{Handoff, Listeners, Successor};
use lameduck_lifecycle::{error_chain, Lifecycle, Report, LOG_TARGET};
use lameduck_traces::{OtlpConfig, Traces};

use crate::cli::{Command, LogFormat, ServeArgs};
use crate::{healthcheck, logs, Exit, PidFile};

/// A service the template's [`main`] runs: its options, how it is built on
/// the lifecycle, and how it runs.
pub trait Service: Sized + Send + 'static {
    /// The `server` subcommand's options: [`ServeArgs`] flattened, and the
    /// service's own.
    type Config: Args + Send + 'static;

    /// Why it could not start.
    type Error: std::error::Error + Send + Sync + 'static;

    /// Opens what the service needs, binds its listeners (or serves the
    /// inherited ones), registers its workers and finalizers on the
    /// lifecycle, and builds its router. The traces' flush is already
    /// registered, first, so that it runs last.
    fn build(start: Start<Self::Config>) -> impl Future<Output = Result<Self, Self::Error>> + Send;

    /// The lifecycle's flags among `config`'s.
    fn serve_args(config: &Self::Config) -> &ServeArgs;

    /// The exit a failed start calls for: [`Exit::Startup`], or
    /// [`Exit::Usage`] for a configuration error the service finds only
    /// when it starts (an unusable certificate).
    fn startup_exit(_error: &Self::Error) -> Exit {
        Exit::Startup
    }

    /// Installs the global subscriber: [`logs::init`] unless the service
    /// has a subscriber of its own.
    fn init_logs(format: LogFormat, traces: Option<&Traces>) {
        logs::init(format, traces);
    }

    /// The longest a shutdown can take from the first signal to exit
    /// (usually [`ServeArgs::shutdown_budget`]): logged at start, for the
    /// supervisor's grace period.
    fn shutdown_budget(&mut self) -> Duration;

    /// Serves until the timeline ends: drain, workers, finalizers.
    fn run(self) -> impl Future<Output = Report> + Send;
}

/// What [`Service::build`] is given.
#[derive(Debug)]
pub struct Start<C> {
    /// The `server` subcommand's options.
    pub config: C,
    /// The lifecycle, with its signals, the in-place upgrade and the
    /// traces' flush (if on) registered.
    pub lifecycle: Lifecycle,
    /// The listening sockets passed down by a service manager or a
    /// predecessor, to serve instead of binding.
    pub inherited: Listeners,
}

/// The command line: the three subcommands around `C`. [`main`] names it
/// after the service's package; tests and tools that build a service's
/// options from arguments parse it as it is.
#[derive(Debug, Parser)]
pub struct Cli<C: Args> {
    /// What to run.
    #[command(subcommand)]
    pub command: Command<C>,
}

/// Runs the service `S` of `package` (its name, version and description
/// make the command line's; `lameduck_traces::package!()`): the whole
/// `main` of a service made from the template.
pub fn main<S: Service>(package: lameduck_traces::Package) -> ExitCode {
    let name = package.name;
    if let Some(detached) = lameduck_handoff::detach() {
        return match detached {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("{name}: cannot start the new process detached: {error}");
                ExitCode::FAILURE
            }
        };
    }
    let command = Cli::<S::Config>::command()
        .name(name)
        .bin_name(name)
        .version(package.version)
        .about(package.description);
    let parsed = command
        .try_get_matches()
        .and_then(|matches| Cli::<S::Config>::from_arg_matches(&matches));
    let cli = match parsed {
        Ok(cli) => cli,
        Err(error) => return usage_error(name, &error),
    };
    match cli.command {
        Command::Server(config) => server::<S>(package, config),
        Command::Healthcheck(config) => match healthcheck::probe(&config, name) {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("{name} healthcheck: {}", error_chain(&error));
                ExitCode::FAILURE
            }
        },
        Command::Reload(config) => {
            match lameduck_handoff::reload::reload(config.pid, config.timeout) {
                Ok(pid) => {
                    println!(
                        "{name} reload: upgraded in place, pid {} → pid {pid}",
                        config.pid
                    );
                    ExitCode::SUCCESS
                }
                Err(error) => {
                    eprintln!("{name} reload: {}", error_chain(&error));
                    ExitCode::FAILURE
                }
            }
        }
    }
}

/// `server`: the runtime, traces and logs, then [`serve`] on them.
fn server<S: Service>(package: lameduck_traces::Package, config: S::Config) -> ExitCode {
    // Before any thread starts: this clears LISTEN_FDS from the environment.
    let inherited = lameduck_handoff::inherited_listeners();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("{}: cannot start the async runtime: {error}", package.name);
            return Exit::Startup.into();
        }
    };
    let serve = S::serve_args(&config);
    let (format, otlp): (LogFormat, &OtlpConfig) = (serve.log_format, &serve.otlp);
    // Inside the runtime: the gRPC exporter's channel lives on it.
    let traces = match runtime.block_on(async { Traces::start(otlp, package) }) {
        Ok(traces) => traces,
        Err(error) => {
            S::init_logs(format, None);
            tracing::error!("traces: {}", error_chain(&error));
            return Exit::Usage.into();
        }
    };
    S::init_logs(format, traces.as_ref());
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
        let exit = serve_service::<S>(config, inherited, traces.clone()).await;
        // A run flushes its traces as its last finalizer; a start that
        // failed has none, and its spans (a spill replay's) are flushed
        // here.
        if let (Exit::Startup | Exit::Usage, Some(traces)) = (exit, traces) {
            let _ = traces.flush().await;
        }
        exit
    });
    // Anything still running was abandoned on purpose; do not wait.
    runtime.shutdown_background();
    exit.into()
}

/// The lifecycle, the service built on it, its run, and the exit.
async fn serve_service<S: Service>(
    config: S::Config,
    inherited: Listeners,
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
    let pid_path = S::serve_args(&config).pid_file.clone();
    let start = Start {
        config,
        lifecycle,
        inherited,
    };
    let mut service = match S::build(start).await {
        Ok(service) => service,
        Err(error) => {
            let exit = S::startup_exit(&error);
            match exit {
                Exit::Usage => tracing::error!("{}", error_chain(&error)),
                _ => tracing::error!("startup failed: {}", error_chain(&error)),
            }
            return exit;
        }
    };
    let Ok(pid_file) = PidFile::write_if_asked(pid_path.as_deref()) else {
        return Exit::Startup;
    };
    tracing::info!(
        shutdown_budget = ?service.shutdown_budget(),
        "started; a supervisor must wait longer than the shutdown budget before SIGKILL"
    );

    let report = service.run().await;
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
    lameduck_traces::open::judge_by(lifecycle.watch());
    let workers = lifecycle.workers();
    workers.on_shutdown("flush traces", lameduck_traces::TRACE_FLUSH_BUDGET, {
        let traces = traces.clone();
        move || traces.flush()
    });
    workers.on_force("flush traces", move || traces.flush_now());
}

/// The one summary line of the whole shutdown: the drain, what each
/// stateful component kept (`kept="hits:flushed=…,spilled=…,lost=…"`, and
/// the totals), what stopped, and the exit code.
fn summarize(report: &Report, exit: Exit) {
    let drain = &report.drain;
    let kept = report.stop.kept.iter();
    let (flushed, spilled, lost) = kept.fold((0, 0, 0), |(f, s, l), kept| {
        (f + kept.flushed, s + kept.spilled, l + kept.lost)
    });
    let each: Vec<String> = report
        .stop
        .kept
        .iter()
        .map(|k| {
            format!(
                "{}:flushed={},spilled={},lost={}",
                k.name, k.flushed, k.spilled, k.lost
            )
        })
        .collect();
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
        state_flushed = flushed,
        state_spilled = spilled,
        state_lost = lost,
        kept = %each.join(" "),
        stopped = %report.stop.summary(),
        exit_code = exit.code(),
        "shutdown complete"
    );
}

/// Help and version go to stdout with exit 0; anything else is a one-line
/// message naming the option, and exit code 2.
fn usage_error(name: &str, error: &clap::Error) -> ExitCode {
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
                Some(next) => eprintln!("{name}: {first} {next} (see --help)"),
                None => eprintln!("{name}: {first} (see --help)"),
            }
            Exit::Usage.into()
        }
    }
}
