//! State of the service's own (`src/counts.rs`: requests per route) at
//! every way out: with the journal (the default), every request answered
//! before a SIGKILL is counted once the service is back; a clean stop
//! counts exactly; counts the store refuses at exit are spilled (exit 6)
//! and counts nothing can keep are reported lost (exit 8). Every wait is
//! bounded.

mod support;

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::ExitStatusExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use nix::sys::signal::Signal;

use support::{request, wait, Server, TIMEOUT};

const GREETING: &str = r#"{"name":"Ada"}"#;

// SIGKILL under keep-alive load, five times: every greeting answered before
// a kill is counted after the restarts, and the only excess is requests a
// kill cut (counted, then killed before the response went out). Each start
// applies the journal its killed predecessor left, before it serves; then a
// clean stop's final flush counts exactly what was answered.
#[test]
fn sigkill_under_load_loses_no_answered_request() {
    const ROUNDS: u64 = 5;
    let state = tempfile::tempdir().expect("a state directory");
    let args = ["--state-dir", state.path().to_str().expect("a UTF-8 path")];
    let (mut answered, mut cut) = (0, 0);
    for round in 0..ROUNDS {
        let mut server = Server::start(&args);
        if round > 0 {
            server.wait_for_log("applied spilled counts");
        }
        let clients = KeptAliveClients::start(server.addr, 4);
        // A different moment of the flush interval (1 s) each round: before
        // the first flush, and after some have landed.
        thread::sleep(Duration::from_millis(300 + round * 450));
        assert!(clients.answered() > 0, "round {round}: nothing answered");
        server.signal(Signal::SIGKILL);
        let status = wait(&mut server.child, TIMEOUT).expect("killed");
        assert_eq!(status.signal(), Some(Signal::SIGKILL as i32), "{status}");
        let (round_answered, round_cut) = clients.join();
        answered += round_answered;
        cut += round_cut;
    }

    let mut last = Server::start(&args);
    last.wait_for_log("applied spilled counts");
    let stored = greetings_counted(&last);
    assert!(
        stored >= answered,
        "{stored} greetings counted, {answered} answered: {} lost",
        answered - stored
    );
    assert!(
        stored - answered <= cut,
        "{stored} greetings counted, {answered} answered, {cut} cut by the kills"
    );
    greet_times(&last, 10);
    last.signal(Signal::SIGTERM);
    assert_eq!(last.exit_code(), 0, "{}", last.log_lines().join("\n"));
    let next = Server::start(&args);
    assert_eq!(greetings_counted(&next), stored + 10);
}

// The store refuses the final flush (here `counts.json` is a directory,
// which the sink cannot replace): the counts go to a spill file, the exit
// code says so, and the next start, with the store back, applies them.
#[test]
fn counts_the_store_refuses_at_exit_are_spilled_and_applied_by_the_next_start() {
    let state = tempfile::tempdir().expect("a state directory");
    let args = ["--state-dir", state.path().to_str().expect("a UTF-8 path")];
    let store = state.path().join("counts.json");
    std::fs::create_dir(&store).expect("a store that refuses");
    let mut server = Server::start(&args);
    greet_times(&server, 3);
    server.signal(Signal::SIGTERM);
    assert_eq!(server.exit_code(), 6, "{}", server.log_lines().join("\n"));

    std::fs::remove_dir(&store).expect("the store back");
    let next = Server::start(&args);
    assert_eq!(greetings_counted(&next), 3);
}

// Neither the store nor a spill file can take the counts at exit, and the
// journal's files are gone too: the state directory was replaced by a
// file. The counts are lost, and the exit code says so.
#[test]
fn counts_nothing_can_keep_are_lost_and_the_exit_code_says_so() {
    let temporary = tempfile::tempdir().expect("a temporary directory");
    let state = temporary.path().join("state");
    let args = ["--state-dir", state.to_str().expect("a UTF-8 path")];
    let mut server = Server::start(&args);
    greet_times(&server, 3);
    std::fs::remove_dir_all(&state).expect("remove the state directory");
    std::fs::write(&state, "").expect("a file in its place");
    server.signal(Signal::SIGTERM);
    assert_eq!(server.exit_code(), 8, "{}", server.log_lines().join("\n"));
}

/// Sends `n` greetings, each answered 200.
fn greet_times(server: &Server, n: usize) {
    for _ in 0..n {
        let (status, body) =
            request(server.addr, "POST", "/api/greetings", GREETING).expect("POST");
        assert_eq!(status, 200, "{body}");
    }
}

/// `/api/greetings` in `GET /api/counts`.
fn greetings_counted(server: &Server) -> u64 {
    let (status, body) = request(server.addr, "GET", "/api/counts", "").expect("GET /api/counts");
    assert_eq!(status, 200, "{body}");
    let counts: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    counts["/api/greetings"].as_u64().unwrap_or_default()
}

/// Clients that greet over one keep-alive connection each, back to back,
/// until the server is gone.
struct KeptAliveClients {
    /// Responses received.
    answered: Arc<AtomicU64>,
    /// Requests sent and never answered: at most one a client.
    cut: Arc<AtomicU64>,
    threads: Vec<thread::JoinHandle<()>>,
}

impl KeptAliveClients {
    fn start(addr: SocketAddr, clients: usize) -> KeptAliveClients {
        let (answered, cut) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let threads = (0..clients)
            .map(|_| {
                let (answered, cut) = (Arc::clone(&answered), Arc::clone(&cut));
                thread::spawn(move || {
                    let Ok(stream) = TcpStream::connect(addr) else {
                        return;
                    };
                    stream.set_read_timeout(Some(TIMEOUT)).expect("timeout");
                    let mut reader = BufReader::new(stream.try_clone().expect("clone"));
                    loop {
                        match greet(&stream, &mut reader) {
                            Ok(status) => {
                                assert_eq!(status, 200);
                                answered.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(_) => {
                                cut.fetch_add(1, Ordering::Relaxed);
                                return;
                            }
                        }
                    }
                })
            })
            .collect();
        KeptAliveClients {
            answered,
            cut,
            threads,
        }
    }

    fn answered(&self) -> u64 {
        self.answered.load(Ordering::Relaxed)
    }

    /// Waits for every client to meet the killed server; `(answered, cut)`.
    fn join(self) -> (u64, u64) {
        for thread in self.threads {
            thread.join().expect("a client");
        }
        (
            self.answered.load(Ordering::Relaxed),
            self.cut.load(Ordering::Relaxed),
        )
    }
}

/// Sends `POST /api/greetings` on a kept-alive connection and reads the
/// whole response; its status.
fn greet(mut stream: &TcpStream, reader: &mut BufReader<TcpStream>) -> io::Result<u16> {
    // One write: a request in pieces would wait for the server's delayed
    // acknowledgement of the first (Nagle's algorithm).
    let request = format!(
        "POST /api/greetings HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{GREETING}",
        GREETING.len()
    );
    stream.write_all(request.as_bytes())?;
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    let status = line.split(' ').nth(1).and_then(|code| code.parse().ok());
    let status = status.ok_or_else(|| io::Error::other(format!("a status line: {line:?}")))?;
    let mut length = 0;
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        if line == "\r\n" {
            break;
        }
        let header = line.to_ascii_lowercase();
        if let Some(value) = header.strip_prefix("content-length:") {
            length = value.trim().parse().unwrap_or_default();
        }
    }
    reader.read_exact(&mut vec![0; length])?;
    Ok(status)
}
