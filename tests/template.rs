//! `cargo generate` makes a working service of its own from this
//! repository (cargo-generate.toml, template/): both variants, the full
//! example and the minimal service, are generated under the name `my-svc`,
//! checked for the new name, built with `cargo build --locked`, started on
//! loopback and stopped with SIGTERM (exit 0); the minimal service also
//! passes its own tests.
//!
//! Needs `cargo generate` (`scripts/install-test-deps.sh generate`). The
//! generated projects build in one shared target directory,
//! `<target>/template-gen`, so their dependencies compile once: the first
//! run takes minutes, later ones much less. Every wait is bounded.

mod support;

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use tempfile::TempDir;

use support::binary::{request, Process, START_TIMEOUT};

/// The checkout: the template.
const REPO: &str = env!("CARGO_MANIFEST_DIR");

/// How long `cargo generate` may take (it copies the template, renames,
/// re-locks and formats).
const GENERATE_TIMEOUT: Duration = Duration::from_secs(180);

/// How long building a generated project, or running its tests, may take:
/// cold, it compiles every dependency.
const BUILD_TIMEOUT: Duration = Duration::from_secs(40 * 60);

/// How long a generated server may take to exit after SIGTERM.
const EXIT_TIMEOUT: Duration = Duration::from_secs(20);

/// The name both projects are generated under, in its three spellings.
const NAME: &str = "my-svc";
const SNAKE: &str = "my_svc";
const SHOUTY: &str = "MY_SVC";

/// The template's name as no generated file may spell it. `LameDuck`, the
/// lame-duck period (`Phase::LameDuck`), is a concept, not the name: it
/// stays, and these case-sensitive spellings do not match it.
const OLD_NAMES: [&str; 3] = ["lameduck", "LAMEDUCK", "Lameduck"];

/// What a server logs once its admin listener serves, then its address.
const ADMIN: &str = "admin endpoints on http://";

/// One cargo build at a time in the shared target directory, and one
/// `my-svc` binary in it: both tests build a binary of that name.
static CARGO: Mutex<()> = Mutex::new(());

#[test]
fn the_full_example_generates_builds_and_drains() {
    let generated = Generated::new(true);
    let root = generated.root();

    // The example domain and its harness come along; the template does not.
    for kept in ["src/links", "migrations", "load", "tests/support/binary.rs"] {
        assert!(root.join(kept).exists(), "{kept} is missing");
    }
    for gone in ["cargo-generate.toml", "template", "tests/template.rs"] {
        assert!(!root.join(gone).exists(), "{gone} was generated");
    }
    generated.check_names();
    let manifest = generated.read("Cargo.toml");
    assert!(manifest.contains("default-run = \"my-svc\""), "{manifest}");
    assert!(generated
        .read("src/app.rs")
        .contains("with_prefix(\"my_svc\")"));
    let spill = generated.read("deploy/kubernetes/spill-pvc.yaml");
    assert!(spill.contains("name: my-svc-spill"), "{spill}");

    let _cargo = lock(&CARGO);
    let exe = generated.build();
    // The example keeps its SQLite database in `--data-dir`.
    let data = generated.dir.path().join("data");
    serve_then_drain(&exe, &[OsStr::new("--data-dir"), data.as_os_str()]);
}

#[test]
fn the_minimal_service_generates_builds_passes_its_tests_and_drains() {
    let generated = Generated::new(false);
    let root = generated.root();

    for kept in ["src/app.rs", "tests", "lifecycle/src/lib.rs", "Dockerfile"] {
        assert!(root.join(kept).exists(), "{kept} is missing");
    }
    for gone in [
        "cargo-generate.toml",
        "template",
        "load",
        "migrations",
        "src/links",
        "scripts",
        "deploy/kubernetes/spill-pvc.yaml",
    ] {
        assert!(!root.join(gone).exists(), "{gone} was generated");
    }
    generated.check_names();
    // No trace of the example's domain, not even in the lock file.
    for file in ["Cargo.toml", "Cargo.lock"] {
        let text = generated.read(file);
        assert!(!text.contains("sqlx"), "{file} still has sqlx");
    }
    let workspace = generated.read("Cargo.toml");
    assert!(workspace.contains("my-svc-lifecycle = { path = \"lifecycle\" }"));

    let _cargo = lock(&CARGO);
    let exe = generated.build();
    serve_then_drain(&exe, &[]);
    generated.cargo(&["test", "--locked"], "test");
}

/// A generated project in a temporary directory.
struct Generated {
    /// Holds the staged template and the project.
    dir: TempDir,
    example: bool,
}

impl Generated {
    /// Runs `cargo generate` on a copy of the checkout (`--path` copies the
    /// whole directory, `target/` included: the copy holds only what git
    /// would).
    fn new(example: bool) -> Generated {
        let version = Command::new(cargo())
            .args(["generate", "--version"])
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("cannot run cargo: {e}"));
        assert!(
            version.status.success(),
            "`cargo generate` is missing: run scripts/install-test-deps.sh \
             (its group `generate` installs cargo-generate 0.23): {}",
            String::from_utf8_lossy(&version.stderr).trim()
        );

        let dir = tempfile::Builder::new()
            .prefix("lameduck-template-")
            .tempdir()
            .unwrap_or_else(|e| panic!("cannot create a temporary directory: {e}"));
        let template = dir.path().join("template");
        stage_template(&template);
        let destination = dir.path().join("generated");
        std::fs::create_dir(&destination).expect("create the destination");
        let mut generate = Command::new(cargo());
        generate
            .arg("generate")
            .arg("--path")
            .arg(&template)
            .args(["--name", NAME, "--destination"])
            .arg(&destination)
            .args(["--silent", "--vcs", "none", "--allow-commands"])
            .args(["--define", &format!("example={example}")]);
        let log = dir.path().join("generate.log");
        run(generate, &log, GENERATE_TIMEOUT);
        Generated { dir, example }
    }

    /// The generated project.
    fn root(&self) -> PathBuf {
        self.dir.path().join("generated").join(NAME)
    }

    fn read(&self, file: &str) -> String {
        let path = self.root().join(file);
        std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
    }

    /// The new name is in the packages, the Dockerfile, the manifests and
    /// the unit files (the binary, environment prefix, metric prefix and
    /// log target are checked on the running server); the old one is
    /// nowhere.
    fn check_names(&self) {
        let root = self.root();
        let manifest = self.read("Cargo.toml");
        assert!(manifest.contains("name = \"my-svc\""), "{manifest}");
        let lifecycle = self.read("lifecycle/Cargo.toml");
        assert!(
            lifecycle.contains("name = \"my-svc-lifecycle\""),
            "{lifecycle}"
        );

        let dockerfile = self.read("Dockerfile");
        for expected in [
            "ENTRYPOINT [\"/usr/local/bin/my-svc\"]",
            "MY_SVC_LISTEN=0.0.0.0:8080",
            "-p my-svc --bin my-svc",
        ] {
            assert!(dockerfile.contains(expected), "Dockerfile: no {expected}");
        }
        let deployment = self.read("deploy/kubernetes/deployment.yaml");
        for expected in [
            "name: my-svc\n",
            "image: my-svc:",
            "- name: MY_SVC_DRAIN_DELAY",
        ] {
            assert!(
                deployment.contains(expected),
                "deployment.yaml: no {expected}"
            );
        }
        for unit in ["lameduck.service", "lameduck.socket"] {
            let old = root.join("deploy/systemd").join(unit);
            assert!(!old.exists(), "{} is still there", old.display());
        }
        let service = self.read("deploy/systemd/my-svc.service");
        assert!(service.contains("Requires=my-svc.socket"), "{service}");
        assert!(service.contains("ExecStart=/usr/local/bin/my-svc server"));
        assert!(service.contains("Environment=MY_SVC_DRAIN_DELAY="));
        assert!(self
            .read("deploy/systemd/my-svc.socket")
            .contains("my-svc.service"));

        let mut left = Vec::new();
        find_old_names(&root, &root, &mut left);
        assert!(
            left.is_empty(),
            "the template's name is left in the {} project:\n{}",
            if self.example { "full" } else { "minimal" },
            left.join("\n")
        );
    }

    /// `cargo build --locked`, in the shared target directory; returns the
    /// binary.
    fn build(&self) -> PathBuf {
        self.cargo(&["build", "--locked"], "build");
        target_dir().join("debug").join(NAME)
    }

    /// Runs cargo `args` in the project; its output goes to `<name>.log`.
    fn cargo(&self, args: &[&str], name: &str) {
        let mut command = Command::new(cargo());
        command
            .args(args)
            .current_dir(self.root())
            .env("CARGO_TARGET_DIR", target_dir())
            // A build to check, not to debug: no debug info, and no
            // incremental caches, which every run (a new directory) would
            // only add to. Disk is what CI machines run out of.
            .env("CARGO_PROFILE_DEV_DEBUG", "0")
            .env("CARGO_INCREMENTAL", "0");
        let log = self.dir.path().join(format!("{name}.log"));
        run(command, &log, BUILD_TIMEOUT);
    }
}

/// Runs `exe server` on loopback ports with `args`, and checks it end to
/// end under the new name: the command's name, the environment prefix
/// (the admin address comes from `MY_SVC_ADMIN_LISTEN`), readiness on the
/// admin listener, the metric prefix, a clean exit at SIGTERM and the log
/// target of the shutdown.
fn serve_then_drain(exe: &Path, args: &[&OsStr]) {
    let version = Command::new(exe)
        .arg("--version")
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", exe.display()));
    let version = String::from_utf8_lossy(&version.stdout);
    assert!(version.starts_with(&format!("{NAME} ")), "{version}");

    let mut server = Process::spawn(
        Command::new(exe)
            .args(["server", "--listen", "127.0.0.1:0"])
            .args(args)
            .env(format!("{SHOUTY}_ADMIN_LISTEN"), "127.0.0.1:0")
            .env("RUST_LOG", "info"),
    );
    let line = server.expect_log(ADMIN, START_TIMEOUT);
    let admin: SocketAddr = line[line.find(ADMIN).expect("found") + ADMIN.len()..]
        .split(|c: char| !(c.is_ascii_digit() || c == '.' || c == ':'))
        .next()
        .and_then(|addr| addr.parse().ok())
        .unwrap_or_else(|| panic!("no address in {line:?}"));
    let readyz = request(admin, "GET", "/readyz", None).expect("GET /readyz");
    assert_eq!(readyz.status, 200, "{readyz:?}");
    let metrics = request(admin, "GET", "/metrics", None).expect("GET /metrics");
    let metrics = String::from_utf8_lossy(&metrics.body);
    let gauge = format!("{SNAKE}_requests_in_flight ");
    assert!(metrics.contains(&gauge), "no {gauge} in:\n{metrics}");

    server.signal(Signal::SIGTERM);
    assert_eq!(server.exit_code(EXIT_TIMEOUT), 0, "{}", server.log_text());
    let target = format!("{SNAKE}::shutdown");
    assert!(
        server.has_logged(&target),
        "no {target} log line:\n{}",
        server.log_text()
    );
}

/// Copies the files git would check out (tracked, and new ones not
/// ignored), as they are in the working tree, into `to`.
fn stage_template(to: &Path) {
    let listed = Command::new("git")
        .args([
            "ls-files",
            "-z",
            "--cached",
            "--others",
            "--exclude-standard",
        ])
        .current_dir(REPO)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("git lists the template's files: {e}"));
    assert!(listed.status.success(), "git ls-files: {listed:?}");
    let files = String::from_utf8(listed.stdout).expect("UTF-8 file names");
    for file in files.split('\0').filter(|file| !file.is_empty()) {
        let from = Path::new(REPO).join(file);
        // Tracked but deleted in the working tree.
        if !from.is_file() {
            continue;
        }
        let dest = to.join(file);
        if let Some(parent) = dest.parent() {
            std::fs::create_dir_all(parent).expect("create a directory");
        }
        std::fs::copy(&from, &dest).unwrap_or_else(|e| panic!("copy {file}: {e}"));
    }
}

/// Every `path:line` under `dir` that spells the template's name.
fn find_old_names(root: &Path, dir: &Path, found: &mut Vec<String>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("a directory entry").path();
        let relative = path.strip_prefix(root).expect("under root").display();
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        if OLD_NAMES.iter().any(|old| name.contains(old)) {
            found.push(format!("{relative} (file name)"));
        }
        if path.is_dir() {
            find_old_names(root, &path, found);
            continue;
        }
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{relative}: {e}"));
        let text = String::from_utf8_lossy(&bytes);
        for (number, line) in text.lines().enumerate() {
            if OLD_NAMES.iter().any(|old| line.contains(old)) {
                found.push(format!("{relative}:{}: {}", number + 1, line.trim()));
            }
        }
    }
}

/// Runs `command` with its output in `log`, for at most `timeout`.
///
/// # Panics
/// With the end of the log, if it fails or overruns.
fn run(mut command: Command, log: &Path, timeout: Duration) -> ExitStatus {
    let output = File::create(log).expect("create a log file");
    let errors = output.try_clone().expect("clone the log file");
    let what = format!("{command:?}");
    let mut child = command
        .stdin(Stdio::null())
        .stdout(output)
        .stderr(errors)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the child") {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        thread::sleep(Duration::from_millis(50));
    };
    match status {
        Some(status) if status.success() => status,
        _ => {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let tail = lines[lines.len().saturating_sub(60)..].join("\n");
            let how = status.map_or_else(|| format!("ran over {timeout:?}"), |s| s.to_string());
            panic!("{what} failed ({how}); the end of its output:\n{tail}");
        }
    }
}

/// The cargo running these tests (the same toolchain).
fn cargo() -> OsString {
    std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into())
}

/// `<target>/template-gen`: apart from the workspace's own target
/// directory, which `cargo test` holds.
fn target_dir() -> PathBuf {
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    tmp.parent().unwrap_or(tmp).join("template-gen")
}

fn lock(mutex: &Mutex<()>) -> MutexGuard<'_, ()> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
