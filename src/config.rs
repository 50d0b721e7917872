//! Command line and environment: every option is a flag and an environment
//! variable, parsed once at startup. An invalid value ends the process before
//! anything starts (exit code 2).

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::http::HttpLimits;
use crate::lifecycle::{DrainSpread, ServeConfig};
use crate::listen::ListenAddr;
pub use crate::telemetry::traces::OtlpConfig;
pub use crate::telemetry::LogFormat;
use crate::tls::TlsFiles;

/// What the write-behind state survives (`--state-durability`).
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

/// lameduck: an HTTP service that stops, restarts and rolls out under load
/// without dropping a request or losing a byte.
#[derive(Debug, Parser)]
#[command(version, about, long_about = None)]
pub struct Cli {
    /// What to run.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
// Parsed once at startup; boxing the server's options would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the HTTP server until SIGTERM or SIGINT, then drain and exit.
    Server(ServerConfig),
    /// Exit 0 if the local server answers `/readyz` with 200 (for container
    /// health checks; needs no curl in the image).
    Healthcheck(HealthcheckConfig),
    /// Upgrade the server of a systemd unit in place and wait for the
    /// outcome: its `ExecReload=`, so that `systemctl reload` returns once
    /// the new process serves and fails when it does not come up.
    Reload(ReloadConfig),
}

/// How the server runs and how it shuts down.
#[derive(Clone, Debug, Args)]
pub struct ServerConfig {
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

    /// PEM certificate chain (leaf first): the public listener then speaks
    /// TLS only (ALPN `h2`, `http/1.1`). Reloaded without a restart when it
    /// changes, as a Kubernetes Secret volume does. Needs `--tls-key`.
    #[arg(
        long,
        env = "LAMEDUCK_TLS_CERT",
        value_name = "PATH",
        requires = "tls_key"
    )]
    pub tls_cert: Option<PathBuf>,

    /// PEM private key of `--tls-cert` (PKCS#8, PKCS#1 or SEC1).
    #[arg(
        long,
        env = "LAMEDUCK_TLS_KEY",
        value_name = "PATH",
        requires = "tls_cert"
    )]
    pub tls_key: Option<PathBuf>,

    /// Lame-duck period after the signal: readiness is already 503 but the
    /// server keeps accepting, so load balancers that have not noticed yet
    /// still reach it (e.g. `5s`, `250ms`).
    #[arg(long, env = "LAMEDUCK_DRAIN_DELAY", default_value = "0s", value_parser = humantime::parse_duration, value_name = "DURATION")]
    pub drain_delay: Duration,

    /// How long in-flight work may take after the listener closes; then its
    /// cancellation tokens fire and the process exits with code 3.
    #[arg(long, env = "LAMEDUCK_SHUTDOWN_TIMEOUT", default_value = "20s", value_parser = humantime::parse_duration, value_name = "DURATION")]
    pub shutdown_timeout: Duration,

    /// Log format (filter with `RUST_LOG`, default `info`).
    #[arg(long, env = "LAMEDUCK_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Directory for the embedded SQLite database and spill files; created
    /// if missing.
    #[arg(long, env = "LAMEDUCK_DATA_DIR", default_value = "data")]
    pub data_dir: PathBuf,

    /// Where hits go when the database cannot take them at exit, and where
    /// this process looks for such files (and for the journals of killed
    /// processes) to apply, at startup and every 5 s while it runs (the
    /// write-behind component's `scan_interval`). Replicas of one service may
    /// (and in containers should) share it on a durable volume: any live
    /// replica applies any replica's spill, exactly once.
    /// Default: `<data-dir>/spill`.
    #[arg(long, env = "LAMEDUCK_SPILL_DIR", value_name = "PATH")]
    pub spill_dir: Option<PathBuf>,

    /// Database URL: `postgres://…` for PostgreSQL, `sqlite://…` for SQLite.
    /// Default: SQLite at `<data-dir>/lameduck.db`.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,

    /// How often the write-behind hit counters are flushed to the database
    /// (sooner when many hits are pending). With `--state-durability
    /// memory`, at most this much is lost on SIGKILL or an OOM kill.
    #[arg(long, env = "LAMEDUCK_FLUSH_INTERVAL", default_value = "1s", value_parser = parse_positive_duration, value_name = "DURATION")]
    pub flush_interval: Duration,

    /// What the hit counters survive: `journal` also stores every hit into
    /// a journal in the spill directory before the redirect is answered,
    /// so SIGKILL and the OOM killer lose none; `memory` keeps pending hits
    /// in memory only (every shutdown still keeps them).
    #[arg(long, env = "LAMEDUCK_STATE_DURABILITY", value_enum, default_value_t = StateDurability::Journal)]
    pub state_durability: StateDurability,

    /// Most connections open at once; at the limit the server stops
    /// accepting until one closes (back-pressure into the kernel backlog).
    #[arg(long, env = "LAMEDUCK_MAX_CONNECTIONS", default_value_t = 10_000, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections: u32,

    /// Most requests handled at once by the API routes; past it requests are
    /// shed at once with 503 and `Retry-After` (health, readiness and
    /// metrics are never shed).
    #[arg(long, env = "LAMEDUCK_MAX_CONCURRENT_REQUESTS", default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_concurrent_requests: u32,

    /// How long a request may take to produce its response head; then its
    /// cancellation token fires and the client gets 503.
    #[arg(long, env = "LAMEDUCK_REQUEST_TIMEOUT", default_value = "30s", value_parser = parse_positive_duration, value_name = "DURATION")]
    pub request_timeout: Duration,

    /// Largest request body accepted, in bytes; larger ones get 413.
    #[arg(long, env = "LAMEDUCK_MAX_BODY_BYTES", default_value_t = 64 * 1024)]
    pub max_body_bytes: usize,

    /// How long a client may take to send a request's whole body, counted
    /// from the end of its head; then 408. Bodies are read before a request
    /// takes a slot under `--max-concurrent-requests`, so a slow upload holds
    /// a connection for at most this long and never a slot.
    #[arg(long, env = "LAMEDUCK_BODY_READ_TIMEOUT", default_value = "10s", value_parser = parse_positive_duration, value_name = "DURATION")]
    pub body_read_timeout: Duration,

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

    /// Largest number of pooled database connections.
    #[arg(long, env = "LAMEDUCK_DATABASE_MAX_CONNECTIONS", default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub database_max_connections: u32,

    /// Make `/readyz` answer 503 while the database is down (its circuit
    /// breaker open), as many services do and this one advises against:
    /// every replica shares the database, so when it is down for one it is
    /// down for all, and a balancer that follows readiness is left with no
    /// replica at all, not even for what they serve without it (cached
    /// redirects, counted and kept). Off by default; docs/database.md
    /// measures both.
    #[arg(long, env = "LAMEDUCK_READINESS_FOLLOWS_DATABASE")]
    pub readiness_follows_database: bool,

    /// Traces, exported over OTLP when an endpoint is set.
    #[command(flatten)]
    pub otlp: OtlpConfig,
}

impl ServerConfig {
    /// The TLS certificate and key, if TLS is on.
    pub fn tls_files(&self) -> Option<TlsFiles> {
        Some(TlsFiles {
            cert: self.tls_cert.clone()?,
            key: self.tls_key.clone()?,
        })
    }

    /// The spill directory: `--spill-dir`, or `<data-dir>/spill`.
    pub fn spill_dir(&self) -> PathBuf {
        self.spill_dir
            .clone()
            .unwrap_or_else(|| self.data_dir.join("spill"))
    }

    /// How the lifecycle serves connections and drains them.
    pub fn serve(&self) -> ServeConfig {
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

    /// The limits the HTTP router enforces.
    pub fn http_limits(&self) -> HttpLimits {
        HttpLimits {
            max_body_bytes: self.max_body_bytes,
            request_timeout: self.request_timeout,
            max_concurrent_requests: self.max_concurrent_requests as usize,
            body_read_timeout: self.body_read_timeout,
        }
    }
}

fn parse_mode(value: &str) -> Result<u32, String> {
    match u32::from_str_radix(value.trim_start_matches("0o"), 8) {
        Ok(mode) if mode <= 0o777 => Ok(mode),
        _ => Err("expected an octal file mode such as 660".to_owned()),
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

fn parse_positive_duration(value: &str) -> Result<Duration, String> {
    match humantime::parse_duration(value) {
        Ok(duration) if duration.is_zero() => Err("must be greater than zero".to_owned()),
        Ok(duration) => Ok(duration),
        Err(error) => Err(error.to_string()),
    }
}

/// Options of `lameduck reload`: `ExecReload=/usr/local/bin/lameduck
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

/// Options of `lameduck healthcheck`.
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

#[cfg(test)]
mod tests {
    use super::*;

    fn server(args: &[&str]) -> Result<ServerConfig, clap::Error> {
        let argv = [crate::NAME, "server"].iter().chain(args);
        match Cli::try_parse_from(argv)?.command {
            Command::Server(config) => Ok(config),
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
    }
}
