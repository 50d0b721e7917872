//! What machine a run happened on, printed with every table.

use std::process::Command;

use serde::Serialize;

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
            profile: crate::binaries::PROFILE,
            revision: Command::new("git")
                .current_dir(crate::binaries::workspace_root())
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
    pub fn prebuilt(&mut self, dir: &std::path::Path) {
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
