//! The servers the scenarios run, built from this workspace in the
//! profile of the harness ([`crate::machine::PROFILE`]), and the non-Rust
//! tools they need.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::LazyLock;

use anyhow::{anyhow, bail, Context};

use crate::machine::Machine;
use crate::SERVICE;

/// The build's profile and the workspace's root, which [`crate::machine`]
/// owns (they describe a run), named here too for the scenarios that build
/// and find their tools through this module.
use crate::machine::{workspace_root, PROFILE};

/// Paths of the server binaries.
#[derive(Clone, Debug)]
pub struct Binaries {
    /// `lameduck`, the service itself.
    pub service: PathBuf,
    /// `minimal-axum`: the minimal axum app (README-style, no
    /// middleware), the baseline of the headline ratios.
    pub minimal_axum: PathBuf,
    /// `axum-stack`: the minimal app with the usual tower-http stack.
    pub axum_stack: PathBuf,
    /// `plain-axum`: the same app served by `axum::serve`.
    pub plain_axum: PathBuf,
    /// `bare-hyper`: a hyper server answering `GET /healthz`.
    pub bare_hyper: PathBuf,
    /// `redirect-uncounted`: lameduck's redirect path without hit counting.
    pub redirect_uncounted: PathBuf,
    /// `lameduck-without`: lameduck with one step of its middleware
    /// switched off (`LOAD_WITHOUT=STEP`), to price each step.
    pub lameduck_without: PathBuf,
    /// `close-floor`: no server; closes its connections from every CPU at
    /// SIGTERM, the floor of the shutdown benchmark.
    pub close_floor: PathBuf,
}

/// The binaries' names, in the order [`Binaries::pick`] takes them: the
/// service's own and its `-without` build's follow the package's name.
static NAMES: LazyLock<[String; 8]> = LazyLock::new(|| {
    [
        SERVICE,
        "plain-axum",
        "bare-hyper",
        "redirect-uncounted",
        "close-floor",
        "minimal-axum",
        "axum-stack",
        &format!("{SERVICE}-without"),
    ]
    .map(str::to_owned)
});

impl Binaries {
    /// Runs `cargo build [--release] -p lameduck -p load --bins` in the
    /// workspace, in the profile this binary was built with (a no-op when
    /// nothing changed), and takes the binaries' paths from cargo's own
    /// report, wherever the target directory is. A debug build is the test
    /// suite's: it has the suite's features (`lameduck/failpoints`, as
    /// `scripts/test` builds it), so that it neither rebuilds the binary the
    /// other tests run nor replaces it with one that lacks fault injection.
    ///
    /// # Errors
    /// If the build fails or a binary is missing from its report.
    pub fn build() -> anyhow::Result<Binaries> {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let failpoints = format!("{SERVICE}/failpoints");
        let mut args = vec!["build"];
        if PROFILE == "release" {
            args.push("--release");
        } else {
            args.extend(["--features", &failpoints]);
        }
        args.extend(["-p", SERVICE, "-p", "load", "--bins"]);
        eprintln!("load: cargo {}", args.join(" "));
        let output = Command::new(cargo)
            .current_dir(workspace_root())
            .args(&args)
            .arg("--message-format=json-render-diagnostics")
            .stdin(Stdio::null())
            .stderr(Stdio::inherit())
            .output()
            .context("cannot run cargo")?;
        if !output.status.success() {
            bail!("cargo {} failed ({})", args.join(" "), output.status);
        }
        let mut found = HashMap::new();
        for line in String::from_utf8_lossy(&output.stdout).lines() {
            let Ok(message) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            if message["reason"] != "compiler-artifact" {
                continue;
            }
            if let (Some(name), Some(exe)) = (
                message["target"]["name"].as_str(),
                message["executable"].as_str(),
            ) {
                found.insert(name.to_owned(), PathBuf::from(exe));
            }
        }
        Binaries::pick(|name| found.get(name).cloned())
    }

    /// The servers a run measures: those in `dir` when it is given (and
    /// `machine` says so: the workspace's revision may not be theirs), or
    /// those [`Binaries::build`] builds now.
    ///
    /// # Errors
    /// As [`Binaries::in_dir`] or [`Binaries::build`].
    pub fn for_run(dir: Option<&Path>, machine: &mut Machine) -> anyhow::Result<Binaries> {
        match dir {
            Some(dir) => {
                machine.prebuilt(dir);
                Binaries::in_dir(dir)
            }
            None => Binaries::build(),
        }
    }

    /// The binaries in `dir` (`target/release`), built beforehand.
    ///
    /// # Errors
    /// If one is missing.
    pub fn in_dir(dir: &Path) -> anyhow::Result<Binaries> {
        Binaries::pick(|name| Some(dir.join(name)).filter(|path| path.is_file()))
    }

    fn pick(find: impl Fn(&str) -> Option<PathBuf>) -> anyhow::Result<Binaries> {
        let get = |name: &str| {
            find(name).ok_or_else(|| {
                anyhow!("binary {name} not found; build with `cargo build --release -p {SERVICE} -p load --bins`")
            })
        };
        Ok(Binaries {
            service: get(&NAMES[0])?,
            plain_axum: get(&NAMES[1])?,
            bare_hyper: get(&NAMES[2])?,
            redirect_uncounted: get(&NAMES[3])?,
            close_floor: get(&NAMES[4])?,
            minimal_axum: get(&NAMES[5])?,
            axum_stack: get(&NAMES[6])?,
            lameduck_without: get(&NAMES[7])?,
        })
    }
}

/// Runs `scripts/install-test-deps.sh GROUPS…`, which installs what is
/// missing and does nothing (quietly) when everything is there.
///
/// # Errors
/// If the script fails.
pub fn install_test_deps(groups: &[&str]) -> anyhow::Result<()> {
    let script = workspace_root().join("scripts/install-test-deps.sh");
    let status = Command::new("bash")
        .arg(&script)
        .args(groups)
        .stdin(Stdio::null())
        .status()
        .with_context(|| format!("cannot run {}", script.display()))?;
    if !status.success() {
        bail!(
            "{} {} failed ({status})",
            script.display(),
            groups.join(" ")
        );
    }
    Ok(())
}
