//! Keep-alive clients until the server lets them go (counting what they
//! were answered and what a kill cut), and the bounds a test holds them to.

use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use super::{get, wait_for_eof};

/// Redirect clients on keep-alive connections until the server goes away:
/// each counts the redirects answered 307, and the requests cut (sent,
/// never answered: recorded or not, the client cannot tell). Any other
/// answer (a request shed with 503) counts as neither, and the client goes on.
pub struct KeptAliveClients {
    answered: Arc<AtomicU64>,
    cut: Arc<AtomicU64>,
    threads: Vec<thread::JoinHandle<()>>,
}

impl KeptAliveClients {
    /// `clients` connections to `addr`, each asking for `codes` in turn.
    pub fn start(addr: SocketAddr, codes: &[String], clients: usize) -> KeptAliveClients {
        let (answered, cut) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let threads = (0..clients)
            .map(|client| {
                let (answered, cut) = (Arc::clone(&answered), Arc::clone(&cut));
                let codes = codes.to_vec();
                thread::spawn(move || {
                    let Ok(mut stream) = TcpStream::connect(addr) else {
                        return;
                    };
                    stream
                        .set_read_timeout(Some(Duration::from_secs(10)))
                        .and_then(|()| stream.set_nodelay(true))
                        .expect("socket options");
                    for i in client.. {
                        let path = format!("/{}", codes[i % codes.len()]);
                        match get(&mut stream, &path) {
                            Ok(response) if response.status == 307 => {
                                answered.fetch_add(1, Ordering::Relaxed);
                            }
                            Ok(_) => {}
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

    /// The redirects answered so far.
    pub fn answered(&self) -> u64 {
        self.answered.load(Ordering::Relaxed)
    }

    /// Waits for every client to meet the closed server; `(answered, cut)`.
    pub fn join(self) -> (u64, u64) {
        for thread in self.threads {
            thread.join().expect("client");
        }
        (
            self.answered.load(Ordering::Relaxed),
            self.cut.load(Ordering::Relaxed),
        )
    }
}

/// The bound a kill leaves on a count: every redirect answered is stored
/// (`stored ≥ answered`), and the only excess is requests the kill cut —
/// recorded, then killed before their response went out.
pub fn assert_kill_bound(stored: u64, answered: u64, cut: u64) {
    assert!(
        stored >= answered,
        "{stored} hits stored, {answered} redirects answered: {} lost",
        answered - stored
    );
    assert!(
        stored - answered <= cut,
        "{stored} hits stored, {answered} answered, {cut} cut by the kills"
    );
}

/// How often a polling keep-alive client asks (`until_told`).
const TOLD_POLL: Duration = Duration::from_millis(50);

/// Plays one keep-alive client on `stream` until the server wants it gone,
/// and returns when that was, counted from `since`. An `idle` client sends
/// nothing and waits for the server to close the connection; a busy one
/// asks for `/healthz` every 50 ms until an answer says `Connection:
/// close`, then sees the connection closed. A request that fails is a
/// failure of the server: a client honouring `Connection: close` must
/// never see one.
pub fn until_told(mut stream: TcpStream, idle: bool, since: Instant) -> Duration {
    const LONGEST: Duration = Duration::from_secs(60);
    if idle {
        let closed = wait_for_eof(&mut stream, LONGEST).expect("EOF, not a reset");
        assert!(closed, "still open after {LONGEST:?}");
        return since.elapsed();
    }
    let deadline = Instant::now() + LONGEST;
    loop {
        let response = get(&mut stream, "/healthz").expect("a request on an open connection");
        assert_eq!(response.status, 200, "{response:?}");
        if response.closes_connection() {
            let told = since.elapsed();
            assert!(
                wait_for_eof(&mut stream, LONGEST).expect("EOF"),
                "open after close"
            );
            return told;
        }
        assert!(Instant::now() < deadline, "never told to close");
        thread::sleep(TOLD_POLL);
    }
}

/// Connections told to close at their drawn moments, as `(due, told)` from
/// the same instant: none before its moment, and in the order of their
/// moments wherever two are `apart` or more apart.
pub fn assert_told_in_order(moments: &[(Duration, Duration)], apart: Duration) {
    for (n, &(due, told)) in moments.iter().enumerate() {
        assert!(
            told >= due,
            "connection {n} told at {told:?}, before its moment {due:?}"
        );
    }
    for (a, &(due_a, told_a)) in moments.iter().enumerate() {
        for (b, &(due_b, told_b)) in moments.iter().enumerate() {
            if due_a + apart <= due_b {
                assert!(
                    told_a < told_b,
                    "connection {a} (due {due_a:?}) told at {told_a:?}, after connection {b} (due {due_b:?}) at {told_b:?}"
                );
            }
        }
    }
}
