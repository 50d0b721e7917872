//! Command line and environment: every option is a flag and an environment
//! variable, parsed once at startup. An invalid value ends the process before
//! anything starts (exit code 2).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use lameduck_lifecycle::ServeConfig;

use crate::telemetry::traces::OtlpConfig;

/// lameduck: an HTTP service that stops, restarts and rolls out under load
/// without dropping a request.
#[derive(Debug, Parser)]
#[command(version, about, long_about = None)]
pub(crate) struct Cli {
    /// What to run.
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// The subcommands.
// Parsed once at startup; boxing the server's options would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
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
pub(crate) struct ServerConfig {
    /// Socket address to listen on; port 0 picks a free port. Ignored when
    /// a listening socket is inherited (`LISTEN_FDS`: systemd socket
    /// activation, or an in-place upgrade).
    #[arg(long, env = "LAMEDUCK_LISTEN", default_value = "127.0.0.1:8080")]
    pub(crate) listen: SocketAddr,

    /// Where liveness (`/healthz`), readiness (`/readyz`) and `/metrics` are
    /// served, outside `--max-connections`. It follows the same timeline
    /// (readiness turns 503 at the signal) and closes last. Port 0 picks a
    /// free one (logged as `admin endpoints on http://ADDR`).
    #[arg(long, env = "LAMEDUCK_ADMIN_LISTEN", default_value = "127.0.0.1:9090")]
    pub(crate) admin_listen: SocketAddr,

    /// Lame-duck period after the signal: readiness is already 503 but the
    /// server keeps accepting, so load balancers that have not noticed yet
    /// still reach it (e.g. `5s`, `250ms`).
    #[arg(long, env = "LAMEDUCK_DRAIN_DELAY", default_value = "0s", value_parser = humantime::parse_duration, value_name = "DURATION")]
    pub(crate) drain_delay: Duration,

    /// How long in-flight requests may take after the listener closes; then
    /// their cancellation tokens fire and the process exits with code 3.
    #[arg(long, env = "LAMEDUCK_SHUTDOWN_TIMEOUT", default_value = "20s", value_parser = humantime::parse_duration, value_name = "DURATION")]
    pub(crate) shutdown_timeout: Duration,

    /// Log format (filter with `RUST_LOG`, default `info`).
    #[arg(long, env = "LAMEDUCK_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub(crate) log_format: LogFormat,

    /// Most connections open at once; at the limit the server stops
    /// accepting until one closes (back-pressure into the kernel backlog).
    #[arg(long, env = "LAMEDUCK_MAX_CONNECTIONS", default_value_t = 10_000, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) max_connections: u32,

    /// How long a client may take to send a request's headers (HTTP/1;
    /// cuts off slowloris clients).
    #[arg(long, env = "LAMEDUCK_HEADER_READ_TIMEOUT", default_value = "10s", value_parser = parse_positive_duration, value_name = "DURATION")]
    pub(crate) header_read_timeout: Duration,

    /// A connection with no request in flight for this long is closed
    /// (HTTP/1 keep-alive and HTTP/2).
    #[arg(long, env = "LAMEDUCK_IDLE_TIMEOUT", default_value = "60s", value_parser = parse_positive_duration, value_name = "DURATION")]
    pub(crate) idle_timeout: Duration,

    /// How long what the server sent may go unacknowledged (a client that
    /// stopped reading, a peer that vanished; the kernel's
    /// `TCP_USER_TIMEOUT`), or an HTTP/2 answer wait for the client's
    /// flow-control window, before the connection is closed.
    #[arg(long, env = "LAMEDUCK_SEND_TIMEOUT", default_value = "30s", value_parser = parse_positive_duration, value_name = "DURATION")]
    pub(crate) send_timeout: Duration,

    /// Most concurrent streams on one HTTP/2 connection.
    #[arg(long, env = "LAMEDUCK_H2_MAX_CONCURRENT_STREAMS", default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) h2_max_concurrent_streams: u32,

    /// Where the service keeps state of its own (`src/counts.rs`): its
    /// files, and the write-behind journal and spill files that keep what
    /// is not in them yet. Created if missing; keep it across restarts (a
    /// volume, a systemd `StateDirectory=`): the next start applies what a
    /// killed process left there.
    #[arg(
        long,
        env = "LAMEDUCK_STATE_DIR",
        default_value = "state",
        value_name = "PATH"
    )]
    pub(crate) state_dir: PathBuf,

    /// What that state survives: `journal` also stores every update into a
    /// journal in the state directory before the response is sent, so
    /// SIGKILL and the OOM killer lose none; `memory` keeps pending updates
    /// in memory only (every shutdown still keeps them).
    #[arg(long, env = "LAMEDUCK_STATE_DURABILITY", value_enum, default_value_t = StateDurability::Journal)]
    pub(crate) state_durability: StateDurability,

    /// Write the server's pid here once it is ready (and remove it at exit,
    /// unless a successor has replaced it): how scripts find the process to
    /// send SIGHUP for an in-place upgrade.
    #[arg(long, env = "LAMEDUCK_PID_FILE", value_name = "PATH")]
    pub(crate) pid_file: Option<PathBuf>,

    /// Traces, exported over OTLP when an endpoint is set (the standard
    /// `OTEL_*` variables).
    #[command(flatten)]
    pub(crate) otlp: OtlpConfig,
}

impl ServerConfig {
    /// How the lifecycle serves connections and drains them.
    pub(crate) fn serve(&self) -> ServeConfig {
        ServeConfig {
            drain_delay: self.drain_delay,
            shutdown_timeout: self.shutdown_timeout,
            max_connections: self.max_connections as usize,
            header_read_timeout: self.header_read_timeout,
            idle_timeout: self.idle_timeout,
            h2_max_concurrent_streams: self.h2_max_concurrent_streams,
            send_timeout: self.send_timeout,
            // The gradual drain spread; no connection age limit.
            ..ServeConfig::default()
        }
    }
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
/// `$MAINPID` and `$RUNTIME_DIRECTORY` for the command).
#[derive(Clone, Debug, Args)]
pub(crate) struct ReloadConfig {
    /// The unit's main process, which gets the SIGHUP (systemd sets
    /// `MAINPID` for `ExecReload=`).
    #[arg(long, env = "MAINPID", value_name = "PID")]
    pub(crate) pid: u32,

    /// How long to wait for the new process to serve, or the old one to
    /// report that it did not.
    #[arg(long, default_value = "45s", value_parser = parse_positive_duration, value_name = "DURATION")]
    pub(crate) timeout: Duration,
}

/// Options of `lameduck healthcheck`.
#[derive(Clone, Debug, Args)]
pub(crate) struct HealthcheckConfig {
    /// The server's admin address (`--admin-listen`); a wildcard address is
    /// probed on loopback.
    #[arg(long, env = "LAMEDUCK_ADMIN_LISTEN", default_value = "127.0.0.1:9090")]
    pub(crate) admin_listen: SocketAddr,

    /// Path to probe.
    #[arg(long, default_value = "/readyz")]
    pub(crate) path: String,

    /// How long to wait for the answer.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration, value_name = "DURATION")]
    pub(crate) timeout: Duration,
}

/// What the write-behind state survives (`--state-durability`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum StateDurability {
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

/// Log line format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
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
    fn defaults_and_human_durations() {
        let config = server(&[]).expect("defaults parse");
        assert_eq!(config.drain_delay, Duration::ZERO);
        assert_eq!(config.shutdown_timeout, Duration::from_secs(20));
        assert_eq!(config.state_durability, StateDurability::Journal);
        let config =
            server(&["--drain-delay", "250ms", "--shutdown-timeout", "1m"]).expect("parse");
        assert_eq!(config.drain_delay, Duration::from_millis(250));
        assert_eq!(config.shutdown_timeout, Duration::from_secs(60));
    }

    #[test]
    fn invalid_values_name_the_option() {
        let error = server(&["--drain-delay", "soon"]).expect_err("invalid");
        assert!(error.to_string().contains("--drain-delay"), "{error}");
        let error = server(&["--idle-timeout", "0s"]).expect_err("invalid");
        assert!(error.to_string().contains("--idle-timeout"), "{error}");
    }
}
