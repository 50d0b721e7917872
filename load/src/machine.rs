//! What a run happened on, printed with every table: the machine, and
//! which build ([`PROFILE`]) of which workspace ([`workspace_root`]).

use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Serialize;

/// The profile this binary was built with, and builds the servers with:
/// measure with `--release`; debug builds are for correctness runs only.
pub const PROFILE: &str = if cfg!(debug_assertions) {
    "debug"
} else {
    "release"
};

/// The workspace this crate was built from.
pub fn workspace_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_path_buf()
}

/// The machine and the moment.
#[derive(Clone, Debug, Serialize)]
pub struct Machine {
    /// UTC date and time of the run.
    pub date: String,
    /// Logical CPUs.
    pub cores: usize,
    /// `model name` from `/proc/cpuinfo`.
    pub cpu: String,
    /// Total memory in GiB.
    pub memory_gib: f64,
    /// `uname -sr`.
    pub kernel: String,
    /// The command line, exactly as run.
    pub command: String,
    /// The cargo profile of the harness and the servers it built.
    pub profile: &'static str,
    /// `git describe --always --dirty` of the workspace.
    pub revision: String,
}

impl Machine {
    /// Describes this machine now.
    pub fn describe() -> Machine {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu = cpuinfo
            .lines()
            .find_map(|line| line.strip_prefix("model name"))
            .map(|rest| rest.trim_start_matches([' ', '\t', ':']).trim().to_owned())
            .unwrap_or_else(|| "unknown".to_owned());
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        #[allow(clippy::cast_precision_loss)]
        let memory_gib = meminfo
            .lines()
            .find_map(|line| line.strip_prefix("MemTotal:"))
            .and_then(|rest| rest.split_whitespace().next()?.parse::<u64>().ok())
            .map_or(0.0, |kib| kib as f64 / 1024.0 / 1024.0);
        let kernel = Command::new("uname")
            .arg("-sr")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .unwrap_or_default();
        let command = std::env::args()
            .map(|arg| {
                if arg.contains(' ') {
                    format!("'{arg}'")
                } else {
                    arg
                }
            })
            .collect::<Vec<_>>()
            .join(" ");
        Machine {
            date: chrono::Utc::now().format("%Y-%m-%d %H:%M UTC").to_string(),
            cores: std::thread::available_parallelism().map_or(1, usize::from),
            cpu,
            memory_gib: (memory_gib * 10.0).round() / 10.0,
            kernel,
            command,
            profile: PROFILE,
            revision: Command::new("git")
                .current_dir(workspace_root())
                .args(["describe", "--always", "--dirty"])
                .output()
                .ok()
                .filter(|o| o.status.success())
                .map_or_else(
                    || "unknown".to_owned(),
                    |o| String::from_utf8_lossy(&o.stdout).trim().to_owned(),
                ),
        }
    }

    /// Notes that the servers were not built by this run but taken from
    /// `dir`, so the revision may not be theirs.
    pub fn prebuilt(&mut self, dir: &Path) {
        self.revision = format!(
            "workspace {}, servers prebuilt in {}",
            self.revision,
            dir.display()
        );
    }

    /// One line for under a table.
    pub fn line(&self) -> String {
        format!(
            "{} · {} cores ({}) · {} GiB · {} · {} build of {}",
            self.date,
            self.cores,
            self.cpu,
            self.memory_gib,
            self.kernel,
            self.profile,
            self.revision
        )
    }
}

/// How long [`conntrack_room`] waits at most: a closed connection stays in
/// the table for its `TIME_WAIT`, two minutes by default.
const CONNTRACK_WAIT: std::time::Duration = std::time::Duration::from_secs(130);

/// Waits until the kernel's connection-tracking table, where the machine
/// keeps one (Docker's firewall rules load it), has room for `connections`
/// more; at most [`CONNTRACK_WAIT`]. A full table drops the packets of new
/// connections, loopback ones too, and a benchmark that opens tens of
/// thousands of them a round fills it with its own closed ones.
pub async fn conntrack_room(connections: usize) {
    let read = |name: &str| -> Option<usize> {
        let path = format!("/proc/sys/net/netfilter/nf_conntrack_{name}");
        std::fs::read_to_string(path).ok()?.trim().parse().ok()
    };
    let deadline = tokio::time::Instant::now() + CONNTRACK_WAIT;
    let mut told = false;
    while let (Some(count), Some(max)) = (read("count"), read("max")) {
        if has_room(count, max, connections) || tokio::time::Instant::now() >= deadline {
            return;
        }
        if !told {
            eprintln!("load:   waiting for room in the connection-tracking table ({count} of {max} entries)");
            told = true;
        }
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
}

/// Room for `connections` more entries, and half as many again for the
/// rest of the machine.
fn has_room(count: usize, max: usize, connections: usize) -> bool {
    count + connections + connections / 2 <= max
}

#[cfg(test)]
mod tests {
    use super::has_room;

    #[test]
    fn the_table_has_room_for_the_connections_and_a_margin() {
        assert!(has_room(0, 262_144, 10_000));
        assert!(has_room(247_144, 262_144, 10_000));
        assert!(!has_room(247_145, 262_144, 10_000));
        assert!(!has_room(262_144, 262_144, 1));
    }
}
