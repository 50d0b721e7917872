//! `cargo generate` makes a working service of its own from this
//! repository (cargo-generate.toml, template/). Both variants, the full
//! example and the minimal service, are generated under a name of the
//! test's own, from a copy of the checkout that also holds build output
//! (which must not come along); each is checked for the new name and for
//! no trace of the old one, and then does what its README says a new user
//! does: `cargo run server` (its admin listener, metric prefix, drain to
//! exit 0 and lifecycle log target under the new name) and the README's
//! test command — for the full example `scripts/test`, its whole suite; for
//! the minimal service `cargo test`.
//!
//! Needs `cargo generate` (`scripts/install-test-deps.sh generate`). The
//! generated projects build in one shared target directory,
//! `<target>/template-gen`, so their dependencies compile once: the first
//! run takes minutes, later ones much less. Every wait is bounded.

use std::ffi::OsString;
use std::fs::File;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use tempfile::TempDir;

use lameduck_testkit::binary::{request, Process, START_TIMEOUT};

/// The checkout: the template.
const REPO: &str = env!("CARGO_MANIFEST_DIR");

/// How long `cargo generate` may take (it copies the template, renames,
/// re-locks and formats).
const GENERATE_TIMEOUT: Duration = Duration::from_secs(180);

/// How long building a generated project may take: cold, it compiles every
/// dependency.
const BUILD_TIMEOUT: Duration = Duration::from_secs(40 * 60);

/// How long a generated project's own test command may take: the full
/// example's is this repository's whole suite.
const TEST_TIMEOUT: Duration = Duration::from_secs(50 * 60);

/// How long `cargo run server` may take to serve (nothing to build: the
/// binary was built just before).
const RUN_TIMEOUT: Duration = Duration::from_secs(120);

/// How long a generated server may take to exit after SIGTERM.
const EXIT_TIMEOUT: Duration = Duration::from_secs(20);

/// The name both projects are generated under, in its four spellings: not
/// the README's example name (`my-svc`), so that a text that spells the
/// example's name instead of the project's shows.
const NAME: &str = "acme-links";
const SNAKE: &str = "acme_links";
const SHOUTY: &str = "ACME_LINKS";
const PASCAL: &str = "AcmeLinks";

/// The template's name as no generated file may spell it. `LameDuck`, the
/// lame-duck period (`Phase::LameDuck`), is a concept, not the name: it
/// stays, and these case-sensitive spellings do not match it.
const OLD_NAMES: [&str; 3] = ["lameduck", "LAMEDUCK", "Lameduck"];

/// Build output and local state a checkout may hold; `cargo generate
/// --path` copies them, and the generated project must not have them.
const BUILD_OUTPUT: [&str; 3] = [
    "target/debug/marker",
    "data/old.db",
    "load/out/run/summary.md",
];

/// What a server logs once it listens, then its address.
const LISTENING: &str = "listening on http://";

/// What a server logs once its admin listener serves, then its address.
const ADMIN: &str = "admin endpoints on http://";

/// One cargo build at a time in the shared target directory, and one
/// binary of the new name in it: both tests build one.
static CARGO: Mutex<()> = Mutex::new(());

#[test]
fn the_full_example_generates_and_passes_its_own_test_command() {
    let generated = Generated::new(true);
    let root = generated.root();

    // The example domain and its harness come along; the template does not.
    for kept in [
        "src/links",
        "migrations",
        "load",
        "testkit/src/binary/mod.rs",
    ] {
        assert!(root.join(kept).exists(), "{kept} is missing");
    }
    for gone in [
        "cargo-generate.toml",
        "template",
        "tests/template.rs",
        "target",
        "data",
        "load/out",
    ] {
        assert!(!root.join(gone).exists(), "{gone} was generated");
    }
    generated.check_names();
    let manifest = generated.read("Cargo.toml");
    assert!(
        manifest.contains(&format!("default-run = \"{NAME}\"")),
        "{manifest}"
    );
    let spill = generated.read("deploy/kubernetes/spill-pvc.yaml");
    assert!(spill.contains(&format!("name: {NAME}-spill")), "{spill}");
    generated.check_readme(&["cargo run server", "scripts/test"]);

    let _cargo = lock(&CARGO);
    generated.cargo(&["build", "--locked"], "build", BUILD_TIMEOUT);
    // The example keeps its SQLite database in `--data-dir`.
    let data = generated.dir.path().join("data");
    generated.run_server(&["run", "server"], &[("DATA_DIR", data.as_os_str())]);
    generated.run_script(&["scripts/test"], "test", TEST_TIMEOUT);
}

#[test]
fn the_minimal_service_generates_and_passes_its_own_test_command() {
    let generated = Generated::new(false);
    let root = generated.root();

    for kept in [
        "src/app.rs",
        "src/counts.rs",
        "tests/state.rs",
        "lifecycle/src/lib.rs",
        "handoff/src/lib.rs",
        "service/src/lib.rs",
        "traces/src/lib.rs",
        "writebehind/src/lib.rs",
        "Dockerfile",
    ] {
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
        "target",
        "data",
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
    for crate_dir in ["lifecycle", "handoff", "service", "traces", "writebehind"] {
        let dependency = format!("{NAME}-{crate_dir} = {{ path = \"{crate_dir}\" }}");
        assert!(
            workspace.contains(&dependency),
            "Cargo.toml: no {dependency}"
        );
    }
    generated.check_readme(&["cargo run -- server", "cargo test"]);

    let _cargo = lock(&CARGO);
    generated.cargo(&["build", "--locked"], "build", BUILD_TIMEOUT);
    generated.run_server(&["run", "--", "server"], &[]);
    generated.cargo(&["test", "--locked"], "test", TEST_TIMEOUT);
}

/// A generated project in a temporary directory.
struct Generated {
    /// Holds the staged template and the project.
    dir: TempDir,
    example: bool,
}

impl Generated {
    /// Runs `cargo generate --path` on a copy of the checkout: what git
    /// would check out, plus build output that must not come along.
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
        assert!(
            manifest.contains(&format!("name = \"{NAME}\"")),
            "{manifest}"
        );
        for crate_dir in ["lifecycle", "handoff", "service", "traces", "writebehind"] {
            let manifest = self.read(&format!("{crate_dir}/Cargo.toml"));
            assert!(
                manifest.contains(&format!("name = \"{NAME}-{crate_dir}\"")),
                "{manifest}"
            );
        }

        let dockerfile = self.read("Dockerfile");
        for expected in [
            format!("ENTRYPOINT [\"/usr/local/bin/{NAME}\"]"),
            format!("{SHOUTY}_LISTEN=0.0.0.0:8080"),
            format!("-p {NAME} --bin {NAME}"),
            format!(
                "cargo clean --release --locked -p {NAME} -p {NAME}-lifecycle -p {NAME}-handoff -p {NAME}-service -p {NAME}-traces -p {NAME}-writebehind"
            ),
        ] {
            assert!(dockerfile.contains(&expected), "Dockerfile: no {expected}");
        }
        let deployment = self.read("deploy/kubernetes/deployment.yaml");
        for expected in [
            format!("name: {NAME}\n"),
            format!("image: {NAME}:"),
            format!("- name: {SHOUTY}_DRAIN_DELAY"),
        ] {
            assert!(
                deployment.contains(&expected),
                "deployment.yaml: no {expected}"
            );
        }
        for unit in ["lameduck.service", "lameduck.socket"] {
            let old = root.join("deploy/systemd").join(unit);
            assert!(!old.exists(), "{} is still there", old.display());
        }
        let service = self.read(&format!("deploy/systemd/{NAME}.service"));
        assert!(
            service.contains(&format!("Requires={NAME}.socket")),
            "{service}"
        );
        assert!(service.contains(&format!("ExecStart=/usr/local/bin/{NAME} server")));
        assert!(service.contains(&format!("Environment={SHOUTY}_DRAIN_DELAY=")));
        assert!(self
            .read(&format!("deploy/systemd/{NAME}.socket"))
            .contains(&format!("{NAME}.service")));
        if self.example {
            // A type named after the service.
            assert!(self
                .read("testkit/src/binary/mod.rs")
                .contains(&format!("pub struct {PASCAL}Process")));
        }

        let mut left = Vec::new();
        find_old_names(&root, &root, &mut left);
        assert!(
            left.is_empty(),
            "the template's name is left in the {} project:\n{}",
            if self.example { "full" } else { "minimal" },
            left.join("\n")
        );
    }

    /// The README's commands are the project's own: `commands` appear in
    /// it, and every path that its "Make your own service" (or, in the
    /// minimal service, "Layout") section names in backticks exists.
    fn check_readme(&self, commands: &[&str]) {
        let readme = self.read("README.md");
        for command in commands {
            assert!(readme.contains(command), "README.md: no `{command}`");
        }
        let heading = if self.example {
            "## Make your own service"
        } else {
            "## Layout"
        };
        let section = readme
            .split(heading)
            .nth(1)
            .and_then(|rest| rest.split("\n## ").next())
            .unwrap_or_else(|| panic!("README.md has no {heading:?}"));
        assert!(
            section.contains(&format!("`{NAME} healthcheck`"))
                || section.contains(&format!("`{NAME} server`"))
                || !self.example,
            "{heading} does not name the new binary:\n{section}"
        );
        let paths: Vec<&str> = section
            .split('`')
            .skip(1)
            .step_by(2)
            // Relative paths: not routes (`/healthz`), commands or Rust paths.
            .filter(|quoted| {
                quoted.contains('/')
                    && !quoted.starts_with('/')
                    && !quoted.contains(' ')
                    && !quoted.contains("::")
            })
            .collect();
        assert!(paths.len() >= 3, "{heading} names no paths:\n{section}");
        for path in paths {
            assert!(
                self.root().join(path).exists(),
                "README.md's {heading} names {path}, which the project does not have"
            );
        }
    }

    /// Runs cargo `args` in the project, in the shared target directory;
    /// its output goes to `<name>.log`.
    fn cargo(&self, args: &[&str], name: &str, timeout: Duration) {
        let mut command = Command::new(cargo());
        command.args(args);
        self.run_in_project(command, name, timeout);
    }

    /// Runs the project's own `program` (a script of its own) with `args`,
    /// as [`Generated::cargo`] does.
    fn run_script(&self, program_and_args: &[&str], name: &str, timeout: Duration) {
        let (program, args) = program_and_args.split_first().expect("a program");
        let mut command = Command::new(self.root().join(program));
        command.args(args);
        self.run_in_project(command, name, timeout);
    }

    fn run_in_project(&self, mut command: Command, name: &str, timeout: Duration) {
        self.environment(&mut command);
        let log = self.dir.path().join(format!("{name}.log"));
        run(command, &log, timeout);
    }

    /// What every command in the project runs with: the shared target
    /// directory, and a build to check, not to debug — no debug info and no
    /// incremental caches, which every run (a new directory) would only add
    /// to. Disk is what CI machines run out of.
    fn environment(&self, command: &mut Command) {
        command
            .current_dir(self.root())
            .env("CARGO_TARGET_DIR", target_dir())
            .env("CARGO_PROFILE_DEV_DEBUG", "0")
            .env("CARGO_INCREMENTAL", "0");
    }

    /// Runs `cargo ARGS` as the README writes it (`cargo run server`), on
    /// loopback ports picked by the system through the new environment
    /// prefix (`…_LISTEN`, `…_ADMIN_LISTEN`, and `env` with the prefix
    /// added), and checks the server end to end under the new name:
    /// readiness on the admin listener, the metric prefix, a clean exit at
    /// SIGTERM and the lifecycle's log target.
    fn run_server(&self, args: &[&str], env: &[(&str, &std::ffi::OsStr)]) {
        let mut command = Command::new(cargo());
        command
            .args(args)
            .env(format!("{SHOUTY}_LISTEN"), "127.0.0.1:0")
            .env(format!("{SHOUTY}_ADMIN_LISTEN"), "127.0.0.1:0")
            .env("RUST_LOG", "info");
        for (name, value) in env {
            command.env(format!("{SHOUTY}_{name}"), value);
        }
        self.environment(&mut command);
        // `cargo run` replaces itself with the program: the signal reaches
        // the server; the group is killed if the test fails first.
        let mut server = Process::spawn_group(&mut command);
        let admin = address_after(&server.expect_log(ADMIN, RUN_TIMEOUT), ADMIN);
        let public = address_after(&server.expect_log(LISTENING, START_TIMEOUT), LISTENING);
        for addr in [public, admin] {
            let readyz = request(addr, "GET", "/readyz", None).expect("GET /readyz");
            assert_eq!(readyz.status, 200, "{readyz:?}");
        }
        let metrics = request(admin, "GET", "/metrics", None).expect("GET /metrics");
        let metrics = String::from_utf8_lossy(&metrics.body);
        let gauge = format!("{SNAKE}_requests_in_flight ");
        assert!(metrics.contains(&gauge), "no {gauge} in:\n{metrics}");

        server.signal(Signal::SIGTERM);
        assert_eq!(server.exit_code(EXIT_TIMEOUT), 0, "{}", server.log_text());
        let target = format!("{SNAKE}_lifecycle::shutdown");
        assert!(
            server.has_logged(&target),
            "no {target} log line:\n{}",
            server.log_text()
        );
    }
}

/// The address that follows `marker` in a log `line`.
fn address_after(line: &str, marker: &str) -> SocketAddr {
    line[line.find(marker).expect("found") + marker.len()..]
        .split(|c: char| !(c.is_ascii_digit() || c == '.' || c == ':'))
        .next()
        .and_then(|addr| addr.parse().ok())
        .unwrap_or_else(|| panic!("no address in {line:?}"))
}

/// Copies the files git would check out (tracked, and new ones not
/// ignored), as they are in the working tree, into `to`, and adds
/// [`BUILD_OUTPUT`].
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
    // What a developer's checkout holds besides: `--path` copies it too.
    for file in BUILD_OUTPUT {
        let dest = to.join(file);
        std::fs::create_dir_all(dest.parent().expect("a parent")).expect("create a directory");
        std::fs::write(&dest, b"build output").expect("write build output");
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
