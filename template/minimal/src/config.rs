//! Command line and environment: every option is a flag and an environment
//! variable, parsed once at startup. An invalid value ends the process before
//! anything starts (exit code 2). The lifecycle's flags, logs and traces,
//! and the `healthcheck` and `reload` subcommands, are the service crate's
//! (`service/`); the rest are this service's own.

use std::path::PathBuf;

use clap::Args;
use lameduck_service::{ServeArgs, StateDurability};

/// How the server runs and how it shuts down.
#[derive(Clone, Debug, Args)]
pub(crate) struct ServerConfig {
    /// Where it listens and how it serves, drains and shuts down.
    #[command(flatten)]
    pub(crate) serve: ServeArgs,

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
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Server {
        #[command(flatten)]
        config: ServerConfig,
    }

    #[test]
    fn the_services_own_flags_parse_beside_the_lifecycles() {
        let argv = ["lameduck", "--drain-delay", "250ms", "--state-durability", "memory"];
        let config = Server::try_parse_from(argv).expect("parse").config;
        assert_eq!(config.serve.drain_delay.as_millis(), 250);
        assert_eq!(config.state_durability, StateDurability::Memory);
        assert_eq!(config.state_dir, PathBuf::from("state"));
    }
}
