//! The examples as a user runs them: `examples/hello.rs` serves, logs
//! `listening on http://ADDR`, answers, and on SIGTERM drains, runs its
//! finalizer and exits 0; a second SIGTERM during the lame duck forces it.
//!
//! The examples are built by `cargo test` (and `scripts/test`); with a
//! target filter such as `--test examples` Cargo does not rebuild them, so
//! run `cargo build -p lameduck-lifecycle --examples` first.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Generous bound on anything that should take milliseconds.
const PATIENCE: Duration = Duration::from_secs(20);

/// The example binary Cargo built beside this test (`target/*/examples`).
fn example(name: &str) -> PathBuf {
    let test = std::env::current_exe().expect("the test binary's path");
    let profile = test
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps");
    profile.join("examples").join(name)
}

struct Hello {
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Hello {
    fn start() -> Hello {
        let mut child = Command::new(example("hello"))
            .env("HELLO_LISTEN", "127.0.0.1:0")
            .env("NO_COLOR", "1")
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("run examples/hello (built by cargo test)");
        let (send, lines) = mpsc::channel();
        let stdout = child.stdout.take().expect("piped");
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = send.send(line);
            }
        });
        Hello {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// Waits for a line containing `needle`; returns it.
    fn expect(&mut self, needle: &str) -> String {
        let deadline = Instant::now() + PATIENCE;
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match self.lines.recv_timeout(left) {
                Ok(line) if line.contains(needle) => return line,
                Ok(line) => self.seen.push(line),
                Err(_) => break,
            }
        }
        panic!("no line with {needle:?}; seen:\n{}", self.seen.join("\n"));
    }

    fn addr(&mut self) -> SocketAddr {
        let line = self.expect("listening on http://");
        let addr = line.rsplit("http://").next().expect("an address");
        addr.trim().parse().expect("a socket address")
    }

    fn sigterm(&self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success());
    }

    fn exit_code(&mut self) -> Option<i32> {
        let deadline = Instant::now() + PATIENCE;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return status.code();
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        panic!("hello still runs after {PATIENCE:?}");
    }
}

fn get(addr: SocketAddr) -> String {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream.set_read_timeout(Some(PATIENCE)).expect("timeout");
    stream
        .write_all(b"GET / HTTP/1.1\r\nhost: hello\r\nconnection: close\r\n\r\n")
        .expect("send");
    let mut answer = String::new();
    stream.read_to_string(&mut answer).expect("read");
    answer
}

#[test]
fn hello_serves_drains_runs_its_finalizer_and_exits_0_on_sigterm() {
    let mut hello = Hello::start();
    let addr = hello.addr();
    let answer = get(addr);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.ends_with("hello\n"), "{answer}");

    hello.sigterm();
    hello.expect("lame duck");
    // Still served in the lame duck, and told to close.
    let late = get(addr);
    assert!(late.starts_with("HTTP/1.1 200"), "{late}");
    assert!(late.to_lowercase().contains("connection: close"), "{late}");
    let goodbye = hello.expect("goodbye");
    assert!(goodbye.contains("greeted=2"), "{goodbye}");
    assert_eq!(hello.exit_code(), Some(0));
}

#[test]
fn a_second_sigterm_forces_hello_out_of_its_lame_duck() {
    let mut hello = Hello::start();
    hello.addr();
    hello.sigterm();
    hello.expect("lame duck");
    hello.sigterm();
    hello.expect("shutdown forced");
    assert_eq!(hello.exit_code(), Some(1), "a forced exit is not clean");
}
