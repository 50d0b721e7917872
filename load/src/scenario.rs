//! What `load SCENARIO` does for every scenario behind the balancer: install
//! the tools, find the binaries, pick the output folder, run, write the
//! files, print the summary, and turn the verdict of `--check` into the
//! exit code. A scenario says only how it runs and sums up ([`Scenario`]).

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use serde::Serialize;

use crate::binaries::{self, Binaries};
use crate::machine::{self, Machine};

/// The options every scenario behind the balancer takes, flattened into
/// each one's own (`#[command(flatten)]`) and written into its JSON with
/// them: what to check, where to write, what to run.
#[derive(Clone, Debug, clap::Args, Serialize)]
pub struct Common {
    /// Exit 1 unless the run meets the scenario's targets (its check, in
    /// load/README.md); `--smoke` implies it.
    #[arg(long)]
    pub check: bool,
    /// Output folder (default: load/out/<timestamp>-<scenario>).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Use the binaries in this folder instead of building them.
    #[arg(long)]
    #[serde(skip)]
    pub bin_dir: Option<PathBuf>,
    /// Do not run scripts/install-test-deps.sh postgres haproxy first.
    #[arg(long)]
    #[serde(skip)]
    pub no_install: bool,
}

/// A scenario's options (after `--smoke`), and what it does with them.
pub trait Scenario: Sized {
    /// Its subcommand: the output folder's suffix and the files'
    /// names (`NAME.json`, `NAME.svg`).
    const NAME: &'static str;
    /// What a passed `--check` proved, said after `load: check passed: `.
    const PASSED: &'static str;
    /// The tools it needs, as `scripts/install-test-deps.sh` names them,
    /// installed first unless `--no-install`.
    const TOOLS: &'static [&'static str] = &["postgres", "haproxy"];
    /// Whether it draws `NAME.svg`.
    const PICTURE: bool = true;
    /// Everything a run measured.
    type Report;

    /// The options every scenario shares.
    fn common(&self) -> &Common;

    /// Runs the scenario, its logs under `out`.
    ///
    /// # Errors
    /// If a step of the harness fails; failed requests are results.
    fn run(
        self,
        binaries: &Binaries,
        machine: Machine,
        out: &Path,
    ) -> impl Future<Output = anyhow::Result<Self::Report>>;

    /// Writes `NAME.json`, `NAME.svg` (if [`Scenario::PICTURE`]) and
    /// `summary.md` into `out`.
    ///
    /// # Errors
    /// If a file cannot be written.
    fn write(report: &Self::Report, out: &Path) -> anyhow::Result<()>;

    /// The Markdown summary printed at the end.
    fn summary(report: &Self::Report) -> String;

    /// The verdict of `--check`: the problems, if any.
    ///
    /// # Errors
    /// The problems found, in one sentence.
    fn verdict(report: &Self::Report) -> Result<(), String>;
}

/// Runs `scenario` as `load NAME` does and returns its exit code: 0, 1 if
/// `--check` failed, 2 if the harness did.
pub fn main<S: Scenario>(scenario: S, machine: Machine) -> ExitCode {
    run::<S>(scenario, machine).unwrap_or_else(|error| {
        eprintln!("load: error: {error:#}");
        ExitCode::from(2)
    })
}

fn run<S: Scenario>(scenario: S, mut machine: Machine) -> anyhow::Result<ExitCode> {
    let common = scenario.common().clone();
    if !common.no_install && !S::TOOLS.is_empty() {
        binaries::install_test_deps(S::TOOLS)?;
    }
    let binaries = Binaries::for_run(common.bin_dir.as_deref(), &mut machine)?;
    let out = output_dir(common.out, S::NAME);
    let runtime = tokio::runtime::Runtime::new().context("cannot start the runtime")?;
    let report = runtime.block_on(scenario.run(&binaries, machine, &out))?;
    S::write(&report, &out)?;
    println!("{}", S::summary(&report));
    let picture = if S::PICTURE {
        format!("{}.svg,", S::NAME)
    } else {
        String::new()
    };
    println!(
        "Written: {}/{{{name}.json,{picture}summary.md}} and logs/",
        out.display(),
        name = S::NAME
    );
    if common.check {
        if let Err(problems) = S::verdict(&report) {
            eprintln!("load: check FAILED: {problems}");
            return Ok(ExitCode::FAILURE);
        }
        eprintln!("load: check passed: {}", S::PASSED);
    }
    Ok(ExitCode::SUCCESS)
}

/// `out`, or `load/out/<timestamp>-<what>` in the workspace.
fn output_dir(out: Option<PathBuf>, what: &str) -> PathBuf {
    out.unwrap_or_else(|| {
        let stamp = chrono::Utc::now().format("%Y%m%dT%H%M%SZ");
        machine::workspace_root()
            .join("load/out")
            .join(format!("{stamp}-{what}"))
    })
}
