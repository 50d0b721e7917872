//! The attacks, driven through the real `slowhttptest`: the command lines
//! that split a target into processes ([`plan`]) and each running process,
//! from its start to its report.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use anyhow::Context;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::process::{Child, Command};

use super::output::{parse_csv, parse_output, strip_ansi};
use super::{
    Attack, SlowReport, ATTACK_SLACK, CONTENT_LENGTH, FOLLOWUP_INTERVAL_SECS, PER_PROCESS,
    RAMP_LIMIT, RATE_OVERSHOOT, SERVER_READ_TIMEOUT_SECS, STOP_GRACE,
};

/// The slowhttptest command lines (arguments) of `attack` against `addr`,
/// one per process: the target split into shares of at most
/// [`PER_PROCESS`]; each process opens `share × RATE_OVERSHOOT ÷ 10 s`
/// connections a second (`-r`), so that about its share is open at once
/// while lameduck closes each after [`SERVER_READ_TIMEOUT_SECS`], for `-l`
/// seconds, and `-c` is what it opens in that time.
pub fn plan(attack: Attack, addr: SocketAddr, window: Duration) -> Vec<Vec<String>> {
    let target = attack.target();
    let processes = target.div_ceil(PER_PROCESS);
    let length = (RAMP_LIMIT + window + ATTACK_SLACK).as_secs_f64().ceil();
    (0..processes)
        .map(|index| {
            let share = target / processes + u32::from(index < target % processes);
            let rate = (f64::from(share) * RATE_OVERSHOOT / SERVER_READ_TIMEOUT_SECS).ceil();
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let (rate, length) = (rate as u32, length as u32);
            let mut args: Vec<String> = Vec::new();
            if attack.slow_body() {
                args.extend(["-B", "-t", "POST", "-f", "application/json"].map(String::from));
            } else {
                args.push("-H".to_owned());
            }
            args.extend([
                "-u".to_owned(),
                format!("http://{addr}/api/links"),
                "-c".to_owned(),
                (rate * length).to_string(),
                "-r".to_owned(),
                rate.to_string(),
                "-i".to_owned(),
                FOLLOWUP_INTERVAL_SECS.to_string(),
            ]);
            if attack.slow_body() {
                args.extend(["-s".to_owned(), CONTENT_LENGTH.to_string()]);
            }
            args.extend([
                "-l".to_owned(),
                length.to_string(),
                "-g".to_owned(),
                "-o".to_owned(),
                format!("logs/{}-slowhttptest-{}", attack.name(), index + 1),
            ]);
            args
        })
        .collect()
}

// === impl Slow ===

/// One running slowhttptest process.
pub(super) struct Slow {
    child: Child,
    pid: Option<i32>,
    command: String,
    log: PathBuf,
    csv: PathBuf,
    exited: Option<ExitStatus>,
}

impl Slow {
    /// Starts `slowhttptest ARGS` in `out` (its `-o` paths are relative to
    /// it), its output into `logs/NAME-slowhttptest-INDEX.log`. Killed if
    /// dropped.
    pub(super) fn spawn(
        attack: Attack,
        index: usize,
        args: &[String],
        out: &Path,
    ) -> anyhow::Result<Slow> {
        let stem = format!("logs/{}-slowhttptest-{index}", attack.name());
        let log = out.join(format!("{stem}.log"));
        let file = std::fs::File::create(&log)
            .with_context(|| format!("cannot create {}", log.display()))?;
        let child = Command::new("slowhttptest")
            .args(args)
            .current_dir(out)
            .stdin(Stdio::null())
            .stdout(Stdio::from(file.try_clone()?))
            .stderr(Stdio::from(file))
            .kill_on_drop(true)
            .spawn()
            .context(
                "cannot start slowhttptest (scripts/install-test-deps.sh abuse installs it)",
            )?;
        Ok(Slow {
            pid: child.id().and_then(|pid| i32::try_from(pid).ok()),
            child,
            command: format!("slowhttptest {}", args.join(" ")),
            log,
            csv: out.join(format!("{stem}.csv")),
            exited: None,
        })
    }

    /// Connected sockets in the last second its CSV has (0 before it has
    /// one).
    pub(super) fn connected_now(&self) -> u64 {
        let text = std::fs::read_to_string(&self.csv).unwrap_or_default();
        parse_csv(&text)
            .last()
            .map_or(0, |(_, connected)| *connected)
    }

    /// Whether it has exited (remembered once seen).
    pub(super) fn has_exited(&mut self) -> bool {
        if self.exited.is_none() {
            self.exited = self.child.try_wait().ok().flatten();
        }
        self.exited.is_some()
    }

    /// SIGINT (it closes its sockets and prints its final report), SIGKILL
    /// after [`STOP_GRACE`]; then reads what it printed.
    pub(super) async fn stop(mut self) -> SlowReport {
        if !self.has_exited() {
            if let Some(pid) = self.pid {
                let _ = kill(Pid::from_raw(pid), Signal::SIGINT);
            }
        }
        let status = match self.exited {
            Some(status) => Some(status),
            None => match tokio::time::timeout(STOP_GRACE, self.child.wait()).await {
                Ok(status) => status.ok(),
                Err(_) => {
                    let _ = self.child.start_kill();
                    self.child.wait().await.ok()
                }
            },
        };
        let exit = status.map_or_else(|| "?".to_owned(), |status| describe_exit(&status));
        let printed = std::fs::read_to_string(&self.log).unwrap_or_default();
        let parsed = parse_output(&strip_ansi(&printed));
        SlowReport {
            command: self.command,
            exit,
            exit_status: parsed.exit_status,
            lowered_to: parsed.lowered_to,
            printed: parsed.statuses,
            per_second: parse_csv(&std::fs::read_to_string(&self.csv).unwrap_or_default()),
        }
    }
}

fn describe_exit(status: &ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => code.to_string(),
        (None, Some(signal)) => Signal::try_from(signal)
            .map_or_else(|_| format!("signal {signal}"), |s| s.as_str().to_owned()),
        (None, None) => "?".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plan_splits_5000_into_shares_that_hold_it() {
        let addr = SocketAddr::from(([127, 0, 0, 1], 8080));
        let plans = plan(Attack::SlowBody5000, addr, Duration::from_secs(15));
        assert_eq!(plans.len(), 5);
        let joined = plans[0].join(" ");
        assert!(
            joined.starts_with("-B -t POST -f application/json -u http://127.0.0.1:8080/api/links -c 5000 -r 125 -i 2 -s 8192 -l 40"),
            "{joined}"
        );
        let loris = plan(Attack::Slowloris5000, addr, Duration::from_secs(15));
        assert!(loris[0].join(" ").starts_with("-H -u "));
        assert_eq!(
            plan(Attack::SlowBody1100, addr, Duration::from_secs(15)).len(),
            1
        );
    }
}
