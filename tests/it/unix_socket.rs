//! Unix-socket listeners against the real binary: `--listen unix:PATH`,
//! the file's mode, the shutdown timeline over it, `lameduck healthcheck`
//! through it, stale files, and who removes the file — the process that
//! bound it or was handed it by an upgrade, never one that was given it by
//! a service manager.

use std::io::Write;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use nix::sys::signal::Signal;

use lameduck_testkit::binary::{
    begin_slow_post, binary, finish_slow_post, pass_listeners, read_response, server_command,
    tempdir, Lineage, Process, RawResponse, IO_TIMEOUT, LINK,
};

/// Bound on anything that should take well under a second. Reaching it is
/// a failure.
const PATIENCE: Duration = Duration::from_secs(15);

/// `lameduck server --listen unix:PUBLIC --admin-listen ADMIN --data-dir
/// DIR/data ARGS`, in a process group of its own, once it listens.
fn start(dir: &Path, public: &Path, admin: &str, args: &[&str]) -> Process {
    let mut command = server_command(Path::new(binary()), admin);
    command
        .arg("--listen")
        .arg(format!("unix:{}", public.display()))
        .arg("--data-dir")
        .arg(dir.join("data"))
        .args(args);
    let server = Process::spawn_group(&mut command);
    server.expect_log(&format!("listening on unix:{}", public.display()), PATIENCE);
    server
}

fn connect(path: &Path) -> UnixStream {
    let stream = UnixStream::connect(path)
        .unwrap_or_else(|e| panic!("cannot connect to {}: {e}", path.display()));
    stream.set_read_timeout(Some(IO_TIMEOUT)).expect("timeout");
    stream.set_write_timeout(Some(IO_TIMEOUT)).expect("timeout");
    stream
}

fn get(path: &Path, target: &str) -> RawResponse {
    let mut stream = connect(path);
    write!(
        stream,
        "GET {target} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .expect("send");
    read_response(&mut stream).expect("a response")
}

fn healthcheck(admin: &Path) -> i32 {
    let status = Command::new(binary())
        .args(["healthcheck", "--admin-listen"])
        .arg(format!("unix:{}", admin.display()))
        .env_remove("LAMEDUCK_ADMIN_LISTEN")
        .status()
        .expect("run lameduck healthcheck");
    status.code().expect("an exit code")
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path)
        .expect("metadata")
        .permissions()
        .mode()
        & 0o777
}

// Both listeners on Unix sockets: the files get the configured mode, the
// healthcheck probes through the admin socket (503 once the lame duck
// begins), a request in flight at SIGTERM is answered, and a clean exit
// removes both files.
#[test]
fn a_unix_socket_serves_the_whole_timeline_and_is_removed_at_exit() {
    let dir = tempdir("lameduck-unix-");
    let (public, admin) = (dir.path().join("http.sock"), dir.path().join("admin.sock"));
    let admin_arg = format!("unix:{}", admin.display());
    let mut server = start(
        dir.path(),
        &public,
        &admin_arg,
        // Immediate: the answer in flight through the lame duck says close.
        &[
            "--unix-socket-mode",
            "600",
            "--drain-delay",
            "1s",
            "--drain-spread",
            "immediate",
        ],
    );
    server.expect_log(
        &format!("admin endpoints on unix:{}", admin.display()),
        PATIENCE,
    );
    for path in [&public, &admin] {
        let metadata = std::fs::metadata(path).expect("the socket file");
        assert!(metadata.file_type().is_socket());
        assert_eq!(mode(path), 0o600, "{}", path.display());
    }
    assert_eq!(get(&public, "/healthz").status, 200);
    assert_eq!(healthcheck(&admin), 0);

    let mut busy = connect(&public);
    begin_slow_post(&mut busy, LINK);
    server.signal(Signal::SIGTERM);
    server.expect_log("shutdown started", PATIENCE);
    assert_eq!(healthcheck(&admin), 1, "not ready during the lame duck");
    finish_slow_post(&mut busy);
    let response = read_response(&mut busy).expect("the answer");
    assert_eq!(response.status, 201, "{response:?}");
    assert!(response.closes_connection(), "{response:?}");

    assert_eq!(server.exit_code(PATIENCE), 0, "{}", server.log_text());
    assert!(!public.exists(), "the public socket file was left behind");
    assert!(!admin.exists(), "the admin socket file was left behind");
}

// A socket file left by a process that was killed is replaced; one a live
// server answers on is not: the second server fails to start (exit 1) and
// the first keeps serving through its file.
#[test]
fn a_stale_socket_file_is_replaced_and_a_live_one_is_not() {
    let dir = tempdir("lameduck-unix-");
    let public = dir.path().join("http.sock");
    drop(UnixListener::bind(&public).expect("bind"));
    assert!(
        public.exists(),
        "the stale file stays after its listener closed"
    );
    let mut server = start(dir.path(), &public, "127.0.0.1:0", &[]);
    assert!(
        server.has_logged("removing a stale socket file"),
        "{}",
        server.log_text()
    );
    assert_eq!(get(&public, "/healthz").status, 200);

    let other = dir.path().join("other");
    std::fs::create_dir(&other).expect("mkdir");
    let mut command = server_command(Path::new(binary()), "127.0.0.1:0");
    command
        .arg("--listen")
        .arg(format!("unix:{}", public.display()))
        .arg("--data-dir")
        .arg(other.join("data"));
    let mut second = Process::spawn_group(&mut command);
    assert_eq!(second.exit_code(PATIENCE), 1, "{}", second.log_text());
    assert!(
        second.has_logged(&format!("cannot listen on unix:{}", public.display())),
        "{}",
        second.log_text()
    );
    assert_eq!(
        get(&public, "/healthz").status,
        200,
        "the first server lost its socket"
    );

    server.signal(Signal::SIGTERM);
    assert_eq!(server.exit_code(PATIENCE), 0, "{}", server.log_text());
    assert!(!public.exists());
}

/// Starts `lameduck` with `--pid-file` on the Unix socket `public`, bound by
/// itself or (`given`) passed as fd 3 the way a service manager does.
fn start_lineage(dir: &Path, public: &Path, given: Option<&UnixListener>) -> Lineage {
    let pid_file = dir.join("lameduck.pid");
    let mut command = server_command(Path::new(binary()), "127.0.0.1:0");
    command
        .arg("--listen")
        .arg(format!("unix:{}", public.display()))
        .arg("--data-dir")
        .arg(dir.join("data"))
        .arg("--pid-file")
        .arg(&pid_file);
    if let Some(listener) = given {
        pass_listeners(&mut command, &[listener]);
    }
    Lineage::start(Process::spawn_group(&mut command), pid_file)
}

// The in-place upgrade hands a Unix socket over like a TCP one: the
// successor serves the same file, the retiring process exits 0 without
// removing it, and the successor — which owns it now — removes it at its
// clean exit.
#[test]
fn an_upgrade_hands_the_socket_file_to_the_successor_which_removes_it_at_exit() {
    nix::sys::prctl::set_child_subreaper(true).expect("become a child subreaper");
    let dir = tempdir("lameduck-unix-");
    let public = dir.path().join("http.sock");
    let mut lineage = start_lineage(dir.path(), &public, None);
    assert_eq!(get(&public, "/healthz").status, 200);

    lineage.upgrade();
    assert!(
        public.exists(),
        "the retiring process removed the handed-over socket"
    );
    assert_eq!(get(&public, "/healthz").status, 200);
    assert!(
        lineage
            .first
            .has_logged("serving an inherited listening socket"),
        "{}",
        lineage.first.log_text()
    );

    assert_eq!(lineage.stop(), 0, "{}", lineage.first.log_text());
    assert!(
        !public.exists(),
        "the successor left its socket file behind"
    );
}

// Socket activation of a Unix socket: the server serves the socket it is
// given, through an upgrade too, and leaves the file to whoever made it
// (systemd's `.socket` unit removes it, or keeps it for the next start).
#[test]
fn a_socket_given_by_a_service_manager_is_served_and_left_in_place() {
    nix::sys::prctl::set_child_subreaper(true).expect("become a child subreaper");
    let dir = tempdir("lameduck-unix-");
    let public: PathBuf = dir.path().join("activated.sock");
    let listener = UnixListener::bind(&public).expect("bind the socket unit's socket");
    // Connected before any server runs: waits in the backlog.
    let mut early = connect(&public);
    write!(
        early,
        "GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .expect("send");

    let mut lineage = start_lineage(dir.path(), &public, Some(&listener));
    assert_eq!(read_response(&mut early).expect("answered").status, 200);
    lineage.upgrade();
    assert_eq!(get(&public, "/healthz").status, 200);
    assert_eq!(lineage.stop(), 0, "{}", lineage.first.log_text());
    assert!(public.exists(), "the activated socket's file was removed");
    drop(listener);
}
