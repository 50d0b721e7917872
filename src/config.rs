//! Command line and environment: every option is a flag and an environment
//! variable, parsed once at startup. An invalid value ends the process before
//! anything starts (exit code 2).

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use lameduck_service::cli::parse_positive_duration;
pub use lameduck_service::cli::{
    HealthcheckConfig, ReloadConfig, ServeArgs, Spread, StateDurability,
};

use crate::http::HttpLimits;
pub use crate::telemetry::traces::OtlpConfig;
pub use crate::telemetry::LogFormat;
use crate::tls::TlsFiles;

/// The command line, as `lameduck_service::main` parses it: for the tests
/// and the load harness, which build a [`ServerConfig`] from arguments.
pub type Cli = lameduck_service::Cli<ServerConfig>;

/// The subcommands: `server` with this service's options, and the
/// `healthcheck` and `reload` every service has.
pub type Command = lameduck_service::Command<ServerConfig>;

/// How the server runs and how it shuts down.
#[derive(Clone, Debug, Args)]
pub struct ServerConfig {
    /// Where it listens and how it serves, drains and shuts down: the
    /// lifecycle's flags, every service's.
    #[command(flatten)]
    pub serve: ServeArgs,

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

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    fn server(args: &[&str]) -> Result<ServerConfig, clap::Error> {
        let argv = [crate::NAME, "server"].iter().chain(args);
        match Cli::try_parse_from(argv)?.command {
            Command::Server(config) => Ok(config),
            _ => unreachable!("parsed the server subcommand"),
        }
    }

    #[test]
    fn the_lifecycles_flags_parse_beside_the_services_own() {
        let config = server(&["--drain-delay", "250ms", "--flush-interval", "2s"]).expect("parse");
        assert_eq!(config.serve.drain_delay, Duration::from_millis(250));
        assert_eq!(config.flush_interval, Duration::from_secs(2));
        assert_eq!(config.spill_dir(), PathBuf::from("data/spill"));
    }

    #[test]
    fn invalid_values_name_the_option() {
        let error = server(&["--flush-interval", "0s"]).expect_err("invalid");
        assert!(error.to_string().contains("--flush-interval"), "{error}");
        let error = server(&["--tls-cert", "cert.pem"]).expect_err("needs its key");
        assert!(error.to_string().contains("--tls-key"), "{error}");
    }
}
