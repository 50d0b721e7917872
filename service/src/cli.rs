//! The command line every service made from the template shares: its
//! subcommands (`server`, `healthcheck`, `reload`) and the server's
//! lifecycle flags, each a flag and an environment variable. A service
//! flattens [`ServeArgs`] into its own server options and names its
//! command line with [`Command`]:
//!
//! ```
//! use clap::{Args, Parser};
//! use lameduck_service::cli::{Command, ServeArgs};
//!
//! /// my-svc: says hello.
//! #[derive(Debug, Parser)]
//! #[command(version, about)]
//! struct Cli {
//!     #[command(subcommand)]
//!     command: Command<ServerConfig>,
//! }
//!
//! #[derive(Clone, Debug, Args)]
//! struct ServerConfig {
//!     #[command(flatten)]
//!     serve: ServeArgs,
//!     /// Whom to greet.
//!     #[arg(long, default_value = "world")]
//!     greet: String,
//! }
//!
//! let cli = Cli::parse_from(["my-svc", "server", "--drain-delay", "5s"]);
//! let Command::Server(config) = cli.command else { unreachable!() };
//! assert_eq!(config.serve.config().drain_delay.as_secs(), 5);
//! assert_eq!(config.greet, "world");
//! ```

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};
use lameduck_lifecycle::{
    DrainSpread, ServeConfig, Workers, ADMIN_CLOSE_GRACE, DEADLINE_CLEANUP_GRACE,
};

use lameduck_traces::OtlpConfig;

use crate::listen::ListenAddr;

/// The subcommands, around the service's own server options `S` (which
/// flatten [`ServeArgs`]).
// Parsed once at startup; boxing the server's options would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command<S: Args> {
    /// Run the HTTP server until SIGTERM or SIGINT, then drain and exit.
    Server(S),
    /// Exit 0 if the local server answers `/readyz` with 200 (for container
    /// health checks; needs no curl in the image).
    Healthcheck(HealthcheckConfig),
    /// Upgrade the server of a systemd unit in place and wait for the
    /// outcome: its `ExecReload=`, so that `systemctl reload` returns once
    /// the new process serves and fails when it does not come up.
    Reload(ReloadConfig),
}

/// Where the server listens and how it serves, drains and shuts down: the
/// lifecycle's flags.
#[derive(Clone, Debug, Args)]
pub struct ServeArgs {
    /// Where to listen: `HOST:PORT` (port 0 picks a free port) or
    /// `unix:PATH` for a Unix socket. Ignored when a listening socket is
    /// inherited (`LISTEN_FDS`: systemd socket activation, or an in-place
    /// upgrade).
    #[arg(
        long,
        env = "LAMEDUCK_LISTEN",
        default_value = "127.0.0.1:8080",
        value_name = "ADDR"
    )]
    pub listen: ListenAddr,

    /// Where liveness (`/healthz`), readiness (`/readyz`) and `/metrics` are
    /// served for probes and scrapers, outside `--max-connections` and load
    /// shedding, so public traffic never starves them. It follows the same
    /// timeline (readiness turns 503 at the signal) and closes last, after
    /// the drain. Port 0 picks a free one (logged as `admin endpoints on
    /// http://ADDR`). `unix:PATH` for a Unix socket. Always plain HTTP.
    #[arg(
        long,
        env = "LAMEDUCK_ADMIN_LISTEN",
        default_value = "127.0.0.1:9090",
        value_name = "ADDR"
    )]
    pub admin_listen: ListenAddr,

    /// Permissions of the Unix socket files this server creates (`--listen
    /// unix:…`, `--admin-listen unix:…`), in octal: who may connect. The
    /// files are removed at exit, unless handed to a successor.
    #[arg(long, env = "LAMEDUCK_UNIX_SOCKET_MODE", default_value = "660", value_parser = parse_mode, value_name = "OCTAL")]
    pub unix_socket_mode: u32,

    /// Lame-duck period after the signal: readiness is already 503 but the
    /// server keeps accepting, so load balancers that have not noticed yet
    /// still reach it (e.g. `5s`, `250ms`).
    #[arg(long, env = "LAMEDUCK_DRAIN_DELAY", default_value = "0s", value_parser = humantime::parse_duration, value_name = "DURATION")]
    pub drain_delay: Duration,

    /// How long in-flight work may take after the listener closes; then its
    /// cancellation tokens fire and the process exits with code 3.
    #[arg(long, env = "LAMEDUCK_SHUTDOWN_TIMEOUT", default_value = "20s", value_parser = humantime::parse_duration, value_name = "DURATION")]
    pub shutdown_timeout: Duration,

    /// Most connections open at once; at the limit the server stops
    /// accepting until one closes (back-pressure into the kernel backlog).
    #[arg(long, env = "LAMEDUCK_MAX_CONNECTIONS", default_value_t = 10_000, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections: u32,

    /// How long a client may take to send a request's headers (HTTP/1;
    /// cuts off slowloris clients).
    #[arg(long, env = "LAMEDUCK_HEADER_READ_TIMEOUT", default_value = "10s", value_parser = parse_positive_duration, value_name = "DURATION")]
    pub header_read_timeout: Duration,

    /// A connection with no request in flight for this long is closed
    /// (HTTP/1 keep-alive and HTTP/2). Behind an L4 balancer or a NAT, keep
    /// it below their idle timeout (they drop a flow silently); behind an
    /// L7 proxy that pools connections, above the proxy's own keep-alive
    /// timeout, so that the proxy closes first.
    #[arg(long = "max-connection-idle", visible_alias = "idle-timeout", env = "LAMEDUCK_MAX_CONNECTION_IDLE", default_value = "60s", value_parser = parse_positive_duration, value_name = "DURATION")]
    pub idle_timeout: Duration,

    /// How the lame duck tells connections to close: `gradual` tells each
    /// at its own moment, spread evenly over the drain delay but its last
    /// second (left for the last told to carry one more request), so their
    /// clients reconnect elsewhere at an even rate (Envoy's gradual drain);
    /// `immediate` tells every one at the signal.
    #[arg(long, env = "LAMEDUCK_DRAIN_SPREAD", value_enum, default_value_t = Spread::Gradual)]
    pub drain_spread: Spread,

    /// Ask a connection open this long to close (as at a drain), so that the
    /// clients' pools spread over replicas added since: behind an L4
    /// balancer (a Kubernetes Service) nothing else moves a keep-alive
    /// client. Off by default (e.g. `5m`).
    #[arg(long, env = "LAMEDUCK_MAX_CONNECTION_AGE", value_parser = parse_positive_duration, value_name = "DURATION")]
    pub max_connection_age: Option<Duration>,

    /// Each connection's age limit is drawn this many percent either side
    /// of `--max-connection-age`, so that connections opened together do
    /// not close together.
    #[arg(long, env = "LAMEDUCK_MAX_CONNECTION_AGE_JITTER", default_value_t = 10, value_parser = clap::value_parser!(u8).range(0..=100), value_name = "PERCENT")]
    pub max_connection_age_jitter: u8,

    /// How long a connection past its age may take to finish what it has in
    /// flight (a long download, a server-sent event stream) before it is
    /// dropped with it.
    #[arg(long, env = "LAMEDUCK_MAX_CONNECTION_AGE_GRACE", default_value = "30s", value_parser = humantime::parse_duration, value_name = "DURATION")]
    pub max_connection_age_grace: Duration,

    /// Seed of each connection's draws (its moment in the drain spread, its
    /// age within the jitter), to reproduce a run; random by default.
    #[arg(long, env = "LAMEDUCK_CONNECTION_SEED", value_name = "N")]
    pub connection_seed: Option<u64>,

    /// How long what the server sent may go unacknowledged (a client that
    /// stopped reading, a peer that vanished; the kernel's
    /// `TCP_USER_TIMEOUT`), or an HTTP/2 answer wait for the client's
    /// flow-control window, before the connection is closed.
    #[arg(long, env = "LAMEDUCK_SEND_TIMEOUT", default_value = "30s", value_parser = parse_positive_duration, value_name = "DURATION")]
    pub send_timeout: Duration,

    /// Most concurrent streams on one HTTP/2 connection.
    #[arg(long, env = "LAMEDUCK_H2_MAX_CONCURRENT_STREAMS", default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..))]
    pub h2_max_concurrent_streams: u32,

    /// Write the server's pid here once it is ready (and remove it at exit,
    /// unless a successor has replaced it): how scripts find the process to
    /// send SIGHUP for an in-place upgrade.
    #[arg(long, env = "LAMEDUCK_PID_FILE", value_name = "PATH")]
    pub pid_file: Option<PathBuf>,

    /// Log format (filter with `RUST_LOG`, default `info`).
    #[arg(long, env = "LAMEDUCK_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Traces, exported over OTLP when an endpoint is set (the standard
    /// `OTEL_*` variables).
    #[command(flatten)]
    pub otlp: OtlpConfig,
}

impl ServeArgs {
    /// How the lifecycle serves connections and drains them.
    pub fn config(&self) -> ServeConfig {
        ServeConfig {
            drain_delay: self.drain_delay,
            shutdown_timeout: self.shutdown_timeout,
            max_connections: self.max_connections as usize,
            header_read_timeout: self.header_read_timeout,
            idle_timeout: self.idle_timeout,
            h2_max_concurrent_streams: self.h2_max_concurrent_streams,
            send_timeout: self.send_timeout,
            drain_spread: match self.drain_spread {
                Spread::Gradual => DrainSpread::Gradual,
                Spread::Immediate => DrainSpread::Immediate,
            },
            max_connection_age: self.max_connection_age,
            max_connection_age_jitter: f64::from(self.max_connection_age_jitter) / 100.0,
            max_connection_age_grace: self.max_connection_age_grace,
            connection_seed: self
                .connection_seed
                .unwrap_or_else(|| ServeConfig::default().connection_seed),
        }
    }

    /// The worst case from the first signal to exit: the lame duck, the
    /// drain's deadline and its cleanup grace, the budgets of `workers`'
    /// finalizers and the admin socket's grace. Keep it under the
    /// orchestrator's grace period (Kubernetes: 30 s by default).
    pub fn shutdown_budget(&self, workers: &Workers) -> Duration {
        self.drain_delay
            + self.shutdown_timeout
            + DEADLINE_CLEANUP_GRACE
            + workers.budget()
            + ADMIN_CLOSE_GRACE
    }
}

/// `--log-format`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// What a write-behind component's state survives (`--state-durability`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum StateDurability {
    /// Pending updates in memory only: a process kill loses them.
    Memory,
    /// Every update journaled before it is acknowledged: a process kill
    /// loses none.
    Journal,
}

impl From<StateDurability> for lameduck_writebehind::Durability {
    fn from(durability: StateDurability) -> Self {
        match durability {
            StateDurability::Memory => lameduck_writebehind::Durability::Memory,
            StateDurability::Journal => lameduck_writebehind::Durability::Journal,
        }
    }
}

/// `--drain-spread`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Spread {
    /// Each connection told at its own moment over the drain delay.
    Gradual,
    /// Every connection told at the signal.
    Immediate,
}

/// Options of `<service> reload`: `ExecReload=/usr/local/bin/<service>
/// reload` in a `Type=notify` unit with a `RuntimeDirectory=` (systemd sets
/// `$MAINPID` and `$RUNTIME_DIRECTORY` for the command; a
/// `Type=notify-reload` unit, systemd 253 and later, needs no
/// `ExecReload=`).
#[derive(Clone, Debug, Args)]
pub struct ReloadConfig {
    /// The unit's main process, which gets the SIGHUP (systemd sets
    /// `MAINPID` for `ExecReload=`).
    #[arg(long, env = "MAINPID", value_name = "PID")]
    pub pid: u32,

    /// How long to wait for the new process to serve, or the old one to
    /// report that it did not.
    #[arg(long, default_value = "45s", value_parser = parse_positive_duration, value_name = "DURATION")]
    pub timeout: Duration,
}

/// Options of `<service> healthcheck`.
#[derive(Clone, Debug, Args)]
pub struct HealthcheckConfig {
    /// The server's admin address (`--admin-listen`), where `/readyz` is
    /// never shed; a wildcard address is probed on loopback, `unix:PATH`
    /// through the socket file.
    #[arg(
        long,
        env = "LAMEDUCK_ADMIN_LISTEN",
        default_value = "127.0.0.1:9090",
        value_name = "ADDR"
    )]
    pub admin_listen: ListenAddr,

    /// Path to probe.
    #[arg(long, default_value = "/readyz")]
    pub path: String,

    /// How long to wait for the answer.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration, value_name = "DURATION")]
    pub timeout: Duration,
}

/// A duration that is not zero (`humantime`: `250ms`, `5s`, `1m`), for
/// `value_parser`.
///
/// # Errors
/// If `value` is not a duration, or is zero.
pub fn parse_positive_duration(value: &str) -> Result<Duration, String> {
    match humantime::parse_duration(value) {
        Ok(duration) if duration.is_zero() => Err("must be greater than zero".to_owned()),
        Ok(duration) => Ok(duration),
        Err(error) => Err(error.to_string()),
    }
}

fn parse_mode(value: &str) -> Result<u32, String> {
    match u32::from_str_radix(value.trim_start_matches("0o"), 8) {
        Ok(mode) if mode <= 0o777 => Ok(mode),
        _ => Err("expected an octal file mode such as 660".to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(subcommand)]
        command: Command<Server>,
    }

    #[derive(Clone, Debug, Args)]
    struct Server {
        #[command(flatten)]
        serve: ServeArgs,
    }

    fn server(args: &[&str]) -> Result<ServeArgs, clap::Error> {
        let argv = ["service", "server"].iter().chain(args);
        match Cli::try_parse_from(argv)?.command {
            Command::Server(config) => Ok(config.serve),
            _ => unreachable!("parsed the server subcommand"),
        }
    }

    #[test]
    fn default_drain_delay_and_shutdown_timeout() {
        let config = server(&[]).expect("defaults parse");
        assert_eq!(config.drain_delay, Duration::ZERO);
        assert_eq!(config.shutdown_timeout, Duration::from_secs(20));
    }

    #[test]
    fn human_durations_are_accepted() {
        let config =
            server(&["--drain-delay", "250ms", "--shutdown-timeout", "1m"]).expect("parse");
        assert_eq!(config.drain_delay, Duration::from_millis(250));
        assert_eq!(config.shutdown_timeout, Duration::from_secs(60));
    }

    #[test]
    fn invalid_values_name_the_option() {
        let error = server(&["--drain-delay", "soon"]).expect_err("invalid");
        assert!(error.to_string().contains("--drain-delay"), "{error}");
        let error = server(&["--listen", "nowhere"]).expect_err("invalid");
        assert!(error.to_string().contains("--listen"), "{error}");
        let error = server(&["--unix-socket-mode", "999"]).expect_err("invalid");
        assert!(error.to_string().contains("--unix-socket-mode"), "{error}");
    }

    #[test]
    fn the_healthcheck_and_reload_parse_beside_the_server() {
        let cli = Cli::try_parse_from([
            "service",
            "healthcheck",
            "--admin-listen",
            "unix:/run/a.sock",
        ])
        .expect("parse");
        let Command::Healthcheck(config) = cli.command else {
            unreachable!("parsed the healthcheck subcommand")
        };
        assert_eq!(config.admin_listen, ListenAddr::Unix("/run/a.sock".into()));
        let cli = Cli::try_parse_from(["service", "reload", "--pid", "7"]).expect("parse");
        assert!(matches!(
            cli.command,
            Command::Reload(ReloadConfig { pid: 7, .. })
        ));
    }
}
