//! A throwaway PostgreSQL cluster for integration tests.
//!
//! [`PgCluster::start`] runs `initdb` into a fresh temporary directory, starts
//! `postgres` on a free port on 127.0.0.1, and creates a role with a random
//! password and a database owned by it. Dropping the cluster kills the server
//! and deletes the directory.
//!
//! Everything lives in that directory: the data directory (`data/`), the Unix
//! socket the harness itself uses, and the server log (`postgres.log`), whose
//! tail is part of every panic message. Over TCP the server only accepts
//! password (SCRAM) authentication, so a test can connect with [`PgCluster::url`]
//! and check that [`PgCluster::password`] never shows up where it should not.
//!
//! The server programs are found through `PG_BIN`, then `PATH`, then the
//! newest `/usr/lib/postgresql/*/bin`; `scripts/install-test-deps.sh` installs
//! them. `initdb` refuses to run as root, so when the tests run as root (as
//! they do in CI) every PostgreSQL program is run as the `postgres` system
//! user through `runuser`.
//!
//! All calls block (they run `pg_ctl` and friends), and every wait is bounded.

use std::env;
use std::ffi::OsStr;
use std::fmt;
use std::fs;
use std::hash::{BuildHasher, RandomState};
use std::io::Write;
use std::net::TcpListener;
use std::os::unix::fs::chown;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use sqlx::postgres::PgConnection;
use sqlx::{Connection, Executor};
use tempfile::TempDir;
use tokio::runtime::Runtime;

/// The role that [`PgCluster::url`] logs in as.
const ROLE: &str = "service";
/// The database that [`PgCluster::url`] names, owned by [`ROLE`].
const DATABASE: &str = "service_test";
/// The superuser `initdb` creates; it may log in over the Unix socket only.
const SUPERUSER: &str = "postgres";
/// The system user PostgreSQL runs as when the tests run as root.
const SYSTEM_USER: &str = "postgres";

/// How long `pg_ctl` may wait for the server to start or stop (seconds).
const PG_CTL_WAIT_SECS: &str = "30";
/// How long `Drop` lets `pg_ctl stop -m immediate` take before killing.
const DROP_WAIT_SECS: &str = "10";
/// How long to wait for a started server to accept TCP connections.
const READY_TIMEOUT: Duration = Duration::from_secs(15);
/// How many free ports to try when another process takes ours first.
const START_ATTEMPTS: usize = 5;
/// How much of the server log a panic message shows.
const LOG_TAIL_LINES: usize = 40;

const INSTALL_HINT: &str = "run scripts/install-test-deps.sh, or set PG_BIN to the directory \
                            that holds initdb, pg_ctl and postgres";

/// A PostgreSQL server in a temporary directory, for one test.
///
/// The `Debug` output leaves the password out.
pub struct PgCluster {
    /// Directory holding `initdb`, `pg_ctl`, `postgres`, and usually `psql`
    /// and `pg_isready`.
    bin: PathBuf,
    /// The user to run PostgreSQL programs as, if not ourselves.
    run_as: Option<&'static str>,
    /// Holds `data/`, the Unix socket and `postgres.log`.
    dir: TempDir,
    port: u16,
    password: String,
}

impl PgCluster {
    /// Runs `initdb` into a fresh temporary directory, starts `postgres` on
    /// 127.0.0.1 on a free port, creates the role and database, and returns
    /// once the server accepts connections.
    ///
    /// Panics, with the tail of the server log, if any step fails.
    pub fn start() -> PgCluster {
        let bin = find_bin_dir();
        let run_as = (effective_uid() == 0).then_some(SYSTEM_USER);
        let dir = tempfile::Builder::new()
            .prefix("lameduck-pg-")
            .tempdir()
            .unwrap_or_else(|e| panic!("cannot create a temporary directory for PostgreSQL: {e}"));
        if let Some(user) = run_as {
            hand_over(dir.path(), user);
        }

        // From here on, a panic drops `cluster`, which stops whatever was
        // started and removes the directory.
        let mut cluster = PgCluster {
            bin,
            run_as,
            dir,
            port: 0,
            password: random_password(),
        };
        cluster.init_db();
        cluster.start_on_a_free_port();
        cluster.create_role_and_database();
        cluster
    }

    /// `postgres://USER:PASSWORD@127.0.0.1:PORT/DATABASE`, for the role and
    /// database that [`PgCluster::start`] created.
    pub fn url(&self) -> String {
        format!(
            "postgres://{ROLE}:{}@127.0.0.1:{}/{DATABASE}",
            self.password, self.port
        )
    }

    /// The role's password, which is also in [`PgCluster::url`].
    pub fn password(&self) -> &str {
        &self.password
    }

    /// The TCP port the server listens on (on 127.0.0.1), the same across
    /// [`PgCluster::stop`] and [`PgCluster::start_again`].
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Stops the server the way an operator would (`pg_ctl stop -m fast`:
    /// open connections are closed, data is kept), and waits until it is down.
    pub fn stop(&self) {
        let output = self
            .pg_ctl("stop")
            .args(["-m", "fast", "-w", "-t", PG_CTL_WAIT_SECS])
            .output();
        self.expect_success(output, "pg_ctl stop");
    }

    /// Restarts the server the way an operator applying a setting would
    /// (`pg_ctl restart -m fast`): every open connection is closed at once,
    /// then the server comes back on the same port with the same data.
    /// Returns once it accepts connections again.
    pub fn restart_fast(&self) {
        let output = self
            .pg_ctl("restart")
            .args(["-m", "fast", "-w", "-t", PG_CTL_WAIT_SECS])
            .arg("--log")
            .arg(self.log_file())
            .arg("-o")
            .arg(format!("-p {}", self.port))
            .output();
        self.expect_success(output, "pg_ctl restart");
        self.wait_until_ready();
    }

    /// Starts the server again after [`PgCluster::stop`], on the same port
    /// with the same data, and waits until it accepts connections.
    pub fn start_again(&self) {
        if let Err(failure) = self.pg_ctl_start() {
            self.fail("pg_ctl start (again)", &failure);
        }
        self.wait_until_ready();
    }

    /// Whether the server is running (`pg_ctl status`).
    pub fn is_running(&self) -> bool {
        self.pg_ctl("status")
            .output()
            .is_ok_and(|output| output.status.success())
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn log_file(&self) -> PathBuf {
        self.dir.path().join("postgres.log")
    }

    fn init_db(&self) {
        let output = self
            .command("initdb")
            .arg("--pgdata")
            .arg(self.data_dir())
            .args([
                &format!("--username={SUPERUSER}"),
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                "--encoding=UTF8",
                "--locale=C",
                "--no-sync",
            ])
            .output();
        self.expect_success(output, "initdb");

        // Settings go into postgresql.conf rather than onto the command line,
        // so `pg_ctl start` stays simple and `start_again` gets them for free.
        // Only the port is passed per start, since a start may need a new one.
        let socket_dir = self.dir.path().to_string_lossy().replace('\'', "''");
        let settings = format!(
            "\n# Added by testkit/src/postgres.rs\n\
             listen_addresses = '127.0.0.1'\n\
             unix_socket_directories = '{socket_dir}'\n\
             max_connections = 100\n\
             fsync = off\n\
             synchronous_commit = off\n\
             full_page_writes = off\n"
        );
        let conf = self.data_dir().join("postgresql.conf");
        fs::OpenOptions::new()
            .append(true)
            .open(&conf)
            .and_then(|mut file| file.write_all(settings.as_bytes()))
            .unwrap_or_else(|e| panic!("cannot append to {}: {e}", conf.display()));
    }

    /// Starts the server on a port that was free a moment ago, and tries
    /// another one if something else took it in between.
    fn start_on_a_free_port(&mut self) {
        for attempt in 1..=START_ATTEMPTS {
            self.port = free_port();
            let log_len = fs::metadata(self.log_file()).map_or(0, |m| m.len());
            match self.pg_ctl_start() {
                Ok(()) => {
                    self.wait_until_ready();
                    return;
                }
                // Someone took the port: try another one.
                Err(_) if attempt < START_ATTEMPTS && self.port_was_taken(log_len) => {}
                Err(failure) => self.fail("pg_ctl start", &failure),
            }
        }
    }

    /// Whether the server log, from byte `since` on, says the port was busy.
    fn port_was_taken(&self, since: u64) -> bool {
        let log = fs::read(self.log_file()).unwrap_or_default();
        let new = log
            .get(usize::try_from(since).unwrap_or(usize::MAX)..)
            .unwrap_or_default();
        String::from_utf8_lossy(new).contains("Address already in use")
    }

    fn pg_ctl_start(&self) -> Result<(), Failure> {
        let output = self
            .pg_ctl("start")
            .arg("--log")
            .arg(self.log_file())
            .args(["-w", "-t", PG_CTL_WAIT_SECS])
            .arg("-o")
            .arg(format!("-p {}", self.port))
            .output();
        check(output)
    }

    /// Polls `pg_isready` over TCP until the server accepts connections.
    fn wait_until_ready(&self) {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let output = self
                .command("pg_isready")
                .args(["--host=127.0.0.1", "--timeout=1", "--quiet"])
                .arg(format!("--port={}", self.port))
                .output();
            match check(output) {
                Ok(()) => return,
                // Exit code 3 means pg_isready could not even try: no point
                // in asking again.
                Err(Failure::Exited(output)) if output.status.code() != Some(3) => {
                    if Instant::now() >= deadline {
                        self.fail(
                            &format!(
                                "waiting {READY_TIMEOUT:?} for the server to accept connections"
                            ),
                            &Failure::Exited(output),
                        );
                    }
                    thread::sleep(Duration::from_millis(50));
                }
                Err(failure) => self.fail("pg_isready", &failure),
            }
        }
    }

    fn create_role_and_database(&self) {
        // The SQL goes in on stdin, so the password is never on a command line.
        let sql = format!(
            "CREATE ROLE {ROLE} LOGIN PASSWORD '{}';\n\
             CREATE DATABASE {DATABASE} OWNER {ROLE};\n",
            self.password
        );
        let conninfo = format!(
            "host={} port={} user={SUPERUSER} dbname=postgres connect_timeout=10",
            self.dir.path().display(),
            self.port
        );
        let output = self
            .command("psql")
            .args(["--no-psqlrc", "--quiet", "--set=ON_ERROR_STOP=1"])
            .arg(conninfo)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .and_then(|mut child| {
                if let Some(mut stdin) = child.stdin.take() {
                    stdin.write_all(sql.as_bytes())?;
                }
                child.wait_with_output()
            });
        self.expect_success(output, "psql (creating the role and database)");
    }

    /// `pg_ctl ACTION --pgdata DATA`.
    fn pg_ctl(&self, action: &str) -> Command {
        let mut command = self.command("pg_ctl");
        command.arg(action).arg("--pgdata").arg(self.data_dir());
        command
    }

    /// A command running the PostgreSQL program `name`, as the right user,
    /// from inside the temporary directory, with no stdin and without the
    /// caller's `PG*` variables (`PGHOST`, `PGPORT`, ...), which would
    /// otherwise override what the harness asks for.
    fn command(&self, name: &str) -> Command {
        let mut program = self.bin.join(name);
        if !program.is_file() {
            // psql and pg_isready may live apart from the server (client
            // package); look for them on PATH then.
            program = PathBuf::from(name);
        }
        let mut command = match self.run_as {
            Some(user) => {
                let mut command = Command::new("runuser");
                command.args(["-u", user, "--"]).arg(program);
                command
            }
            None => Command::new(program),
        };
        for (key, _) in env::vars_os() {
            if key.to_string_lossy().starts_with("PG") {
                command.env_remove(key);
            }
        }
        command.current_dir(self.dir.path()).stdin(Stdio::null());
        command
    }

    /// Panics with `what`'s output and the server log unless it succeeded.
    fn expect_success(&self, output: std::io::Result<Output>, what: &str) {
        if let Err(failure) = check(output) {
            self.fail(what, &failure);
        }
    }

    fn fail(&self, what: &str, failure: &Failure) -> ! {
        let as_user = match self.run_as {
            Some(user) => format!(
                " (run as user {user} via runuser, since the tests run as root; \
                 {user} needs access to that directory)"
            ),
            None => String::new(),
        };
        panic!(
            "throwaway PostgreSQL in {dir}: {what} failed{as_user}: {failure}\n\
             --- last {LOG_TAIL_LINES} lines of {log} ---\n{tail}",
            dir = self.dir.path().display(),
            log = self.log_file().display(),
            tail = self.log_tail(),
        );
    }

    fn log_tail(&self) -> String {
        match fs::read(self.log_file()) {
            Ok(bytes) => {
                let log = String::from_utf8_lossy(&bytes);
                let lines: Vec<&str> = log.lines().collect();
                lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n")
            }
            Err(e) => format!("(no log: {e})"),
        }
    }

    /// Last resort for `Drop`: SIGKILL the postmaster named in postmaster.pid.
    /// Its backends notice and exit by themselves.
    fn kill_postmaster(&self) {
        let pid = fs::read_to_string(self.data_dir().join("postmaster.pid"))
            .ok()
            .and_then(|contents| contents.lines().next()?.trim().parse::<i32>().ok());
        if let Some(pid) = pid.filter(|&pid| pid > 0) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
}

impl Drop for PgCluster {
    /// Stops the server at once (`pg_ctl stop -m immediate`, or SIGKILL if
    /// that does not work within a few seconds), then the `TempDir` field
    /// deletes the directory. Never panics, never waits unboundedly.
    fn drop(&mut self) {
        if !self.data_dir().join("postmaster.pid").exists() {
            return; // never started, or already stopped
        }
        let stopped = self
            .pg_ctl("stop")
            .args(["-m", "immediate", "-w", "-t", DROP_WAIT_SECS])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|status| status.success());
        if !stopped {
            self.kill_postmaster();
        }
    }
}

impl fmt::Debug for PgCluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgCluster")
            .field("dir", &self.dir.path())
            .field("port", &self.port)
            .field("bin", &self.bin)
            .field("run_as", &self.run_as)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// Why a command did not succeed.
enum Failure {
    /// It could not be run at all.
    Spawn(std::io::Error),
    /// It ran and exited unsuccessfully.
    Exited(Output),
}

fn check(output: std::io::Result<Output>) -> Result<(), Failure> {
    match output {
        Ok(output) if output.status.success() => Ok(()),
        Ok(output) => Err(Failure::Exited(output)),
        Err(e) => Err(Failure::Spawn(e)),
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Spawn(e) => write!(f, "could not run it: {e}"),
            Failure::Exited(output) => {
                write!(f, "{}", output.status)?;
                for (name, bytes) in [("stdout", &output.stdout), ("stderr", &output.stderr)] {
                    let text = String::from_utf8_lossy(bytes);
                    if !text.trim().is_empty() {
                        write!(f, "\n--- {name} ---\n{}", text.trim_end())?;
                    }
                }
                Ok(())
            }
        }
    }
}

/// The directory with the PostgreSQL server programs: `$PG_BIN`, else where
/// `pg_ctl` on `PATH` really lives, else the newest `/usr/lib/postgresql/*/bin`
/// (Debian keeps them off `PATH`).
fn find_bin_dir() -> PathBuf {
    if let Some(dir) = env::var_os("PG_BIN") {
        let dir = PathBuf::from(dir);
        assert!(
            has_server_programs(&dir),
            "PG_BIN={} does not hold initdb, pg_ctl and postgres",
            dir.display()
        );
        return dir;
    }

    let on_path = env::var_os("PATH")
        .into_iter()
        .flat_map(|path| env::split_paths(&path).collect::<Vec<_>>())
        .map(|dir| dir.join("pg_ctl"))
        .find(|pg_ctl| pg_ctl.is_file())
        // Follow symlinks (/usr/local/bin/pg_ctl -> /usr/lib/postgresql/15/bin/pg_ctl)
        // to the directory that has the rest of the programs.
        .and_then(|pg_ctl| fs::canonicalize(pg_ctl).ok())
        .and_then(|pg_ctl| pg_ctl.parent().map(Path::to_path_buf))
        .filter(|dir| has_server_programs(dir));
    if let Some(dir) = on_path {
        return dir;
    }

    fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version = parse_version(&entry.file_name())?;
            Some((version, entry.path().join("bin")))
        })
        .filter(|(_, dir)| has_server_programs(dir))
        .max_by(|(a, _), (b, _)| a.cmp(b))
        .map(|(_, dir)| dir)
        .unwrap_or_else(|| {
            panic!(
                "PostgreSQL server programs (initdb, pg_ctl, postgres) not found in $PG_BIN, \
                 on PATH or under /usr/lib/postgresql/*/bin: {INSTALL_HINT}"
            )
        })
}

fn has_server_programs(dir: &Path) -> bool {
    ["initdb", "pg_ctl", "postgres"]
        .iter()
        .all(|name| dir.join(name).is_file())
}

/// `15` -> `[15]`, `9.6` -> `[9, 6]`; `None` for anything else.
fn parse_version(name: &OsStr) -> Option<Vec<u32>> {
    name.to_str()?
        .split('.')
        .map(|part| part.parse().ok())
        .collect()
}

/// The effective user id, without `unsafe` (the crate forbids it).
fn effective_uid() -> u32 {
    // "Uid:\t<real>\t<effective>\t<saved>\t<filesystem>" on Linux.
    let from_proc = fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let uids = status.lines().find_map(|line| line.strip_prefix("Uid:"))?;
            uids.split_whitespace().nth(1)?.parse().ok()
        });
    from_proc.unwrap_or_else(|| {
        id(&["-u"]).unwrap_or_else(|| panic!("cannot tell which user the tests run as"))
    })
}

/// Runs `id ARGS` and parses the number it prints.
fn id(args: &[&str]) -> Option<u32> {
    let output = Command::new("id").args(args).output().ok()?;
    if !output.status.success() {
        return None;
    }
    String::from_utf8_lossy(&output.stdout).trim().parse().ok()
}

/// Gives `dir` to the system user `user`, so PostgreSQL running as that user
/// can create its data directory, socket and log there.
fn hand_over(dir: &Path, user: &str) {
    let (Some(uid), Some(gid)) = (id(&["-u", user]), id(&["-g", user])) else {
        panic!(
            "the tests run as root, and initdb refuses to, but there is no `{user}` user \
             to run PostgreSQL as: {INSTALL_HINT} (Debian's postgresql package creates it), \
             or run the tests as an ordinary user"
        );
    };
    chown(dir, Some(uid), Some(gid))
        .unwrap_or_else(|e| panic!("cannot give {} to user {user}: {e}", dir.display()));
}

/// A port on 127.0.0.1 that was free when we asked. Someone else may take it
/// before the server binds it; `start_on_a_free_port` retries then.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .unwrap_or_else(|e| panic!("cannot find a free port on 127.0.0.1: {e}"))
}

/// 32 hex digits from the standard library's randomly keyed hasher: unique
/// per cluster and easy to search for in logs and responses.
fn random_password() -> String {
    let hasher = RandomState::new();
    format!("{:016x}{:016x}", hasher.hash_one(1u8), hasher.hash_one(2u8))
}

/// A blocking PostgreSQL session of the test's own (not the service's: its
/// `application_name` is not `lameduck`).
pub struct Sql {
    runtime: Runtime,
    conn: PgConnection,
}

impl Sql {
    /// Connects to `url`; panics if it cannot.
    pub fn connect(url: &str) -> Sql {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("tokio runtime");
        let conn = runtime
            .block_on(PgConnection::connect(url))
            .expect("connect to PostgreSQL");
        Sql { runtime, conn }
    }

    /// Runs `sql`; panics if it fails.
    pub fn execute(&mut self, sql: &str) {
        self.runtime
            .block_on(self.conn.execute(sql))
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    /// The one number `sql` selects; panics if it fails.
    pub fn count(&mut self, sql: &str) -> i64 {
        self.runtime
            .block_on(sqlx::query_scalar(sql).fetch_one(&mut self.conn))
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    /// Waits until at least `n` of the service's sessions (`application_name`
    /// `lameduck`) wait on a lock; panics, naming `what`, after `within`.
    pub fn wait_lock_waiters(&mut self, n: i64, within: Duration, what: &str) {
        let deadline = Instant::now() + within;
        while self.count(
            "SELECT count(*) FROM pg_stat_activity \
             WHERE application_name = 'lameduck' AND wait_event_type = 'Lock'",
        ) < n
        {
            assert!(
                Instant::now() < deadline,
                "{what} never waited on the lock within {within:?}"
            );
            thread::sleep(Duration::from_millis(20));
        }
    }
}
