//! A TCP relay in front of PostgreSQL, so that a test or the `load` harness
//! can cut a service off from its database while others keep reaching it,
//! or lose the one answer a service cannot do without:
//!
//! - [`Relay::cut`] closes every relayed connection and the listener (new
//!   connections are refused); [`Relay::restore`] listens on the same port
//!   again;
//! - [`Relay::lose_next_commit_answer`] lets the next `COMMIT` a client
//!   sends reach the database, waits for the database's answer (so the
//!   transaction did commit), drops it and closes that client's
//!   connection: the client sent a commit and never learns its outcome, as
//!   when the network fails at that moment.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Mutex;
use tokio::task::{JoinHandle, JoinSet};

/// PostgreSQL's simple-query `COMMIT`, as a client sends it (sqlx commits
/// a transaction so): the statement and its terminating NUL.
const COMMIT: &[u8] = b"COMMIT\0";

/// A relay from a loopback port of its own to `upstream`.
#[derive(Debug)]
pub struct Relay {
    /// Where the client connects.
    pub addr: SocketAddr,
    upstream: SocketAddr,
    /// What every relayed connection shares: the armed commit and the
    /// count of answers lost.
    faults: Arc<Faults>,
    /// The accept loop while the relay is up; it owns every relayed
    /// connection, so aborting it closes them all.
    running: Mutex<Option<JoinHandle<()>>>,
}

/// The faults a relay injects, shared by its connections.
#[derive(Debug, Default)]
struct Faults {
    /// The next `COMMIT` sent loses its answer.
    lose_commit_answer: AtomicBool,
    /// Commit answers lost so far.
    commit_answers_lost: AtomicUsize,
}

impl Relay {
    /// Listens on a free loopback port and relays to `upstream`.
    ///
    /// # Errors
    /// If no port can be bound.
    pub async fn start(upstream: SocketAddr) -> std::io::Result<Relay> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let faults = Arc::new(Faults::default());
        Ok(Relay {
            addr,
            upstream,
            running: Mutex::new(Some(tokio::spawn(relay(
                listener,
                upstream,
                Arc::clone(&faults),
            )))),
            faults,
        })
    }

    /// Cuts the client off: closes every relayed connection and stops
    /// listening, so new connections are refused.
    pub async fn cut(&self) {
        if let Some(running) = self.running.lock().await.take() {
            running.abort();
            let _ = running.await;
        }
    }

    /// Listens on the same port again.
    ///
    /// # Errors
    /// If the port cannot be bound again.
    pub async fn restore(&self) -> std::io::Result<()> {
        let mut running = self.running.lock().await;
        if running.is_none() {
            let listener = TcpListener::bind(self.addr).await?;
            *running = Some(tokio::spawn(relay(
                listener,
                self.upstream,
                Arc::clone(&self.faults),
            )));
        }
        Ok(())
    }

    /// Arms the relay: the next `COMMIT` any relayed client sends reaches
    /// the database, and once the database has answered, the answer is
    /// dropped and that client's connection closed. Once.
    pub fn lose_next_commit_answer(&self) {
        self.faults.lose_commit_answer.store(true, Ordering::SeqCst);
    }

    /// How many commit answers were lost so far.
    pub fn commit_answers_lost(&self) -> usize {
        self.faults.commit_answers_lost.load(Ordering::SeqCst)
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        if let Some(running) = self.running.get_mut().take() {
            running.abort();
        }
    }
}

/// Accepts until aborted; each connection is relayed to `upstream` on a
/// task of the set this loop owns.
async fn relay(listener: TcpListener, upstream: SocketAddr, faults: Arc<Faults>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((inbound, _)) = accepted else { continue };
                connections.spawn(connection(inbound, upstream, Arc::clone(&faults)));
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// Copies `inbound` to `upstream` and back, each way until its end of
/// file (passed on as a half close), unless an armed `COMMIT` goes by:
/// then the database's answer to it ends the copy back, unsent, and the
/// client's side is closed.
async fn connection(inbound: TcpStream, upstream: SocketAddr, faults: Arc<Faults>) {
    let Ok(outbound) = TcpStream::connect(upstream).await else {
        return;
    };
    let _ = inbound.set_nodelay(true);
    let _ = outbound.set_nodelay(true);
    let (mut from_client, mut to_client) = inbound.into_split();
    let (mut from_server, mut to_server) = outbound.into_split();
    // Set before the armed COMMIT is passed on, and once it has been: what
    // comes back after that is its answer.
    let (losing, sent) = (AtomicBool::new(false), AtomicBool::new(false));
    let (losing, sent, faults) = (&losing, &sent, &*faults);

    let up = async move {
        let mut buffer = vec![0u8; 16 * 1024];
        loop {
            let n = match from_client.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let commit = buffer[..n].windows(COMMIT.len()).any(|w| w == COMMIT)
                && faults.lose_commit_answer.swap(false, Ordering::SeqCst);
            if commit {
                losing.store(true, Ordering::SeqCst);
            }
            if to_server.write_all(&buffer[..n]).await.is_err() {
                break;
            }
            if commit {
                sent.store(true, Ordering::SeqCst);
            }
        }
        let _ = to_server.shutdown().await;
    };
    let down = async move {
        let mut buffer = vec![0u8; 16 * 1024];
        loop {
            let n = match from_server.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if sent.load(Ordering::SeqCst) {
                // The database has committed and answered: the client
                // never hears it.
                faults.commit_answers_lost.fetch_add(1, Ordering::SeqCst);
                drop(to_client);
                return;
            }
            if losing.load(Ordering::SeqCst) {
                continue;
            }
            if to_client.write_all(&buffer[..n]).await.is_err() {
                break;
            }
        }
        let _ = to_client.shutdown().await;
    };
    tokio::join!(up, down);
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// An echo server: what the relay sends upstream comes back.
    async fn echo() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut read, mut write) = stream.split();
                    let _ = tokio::io::copy(&mut read, &mut write).await;
                });
            }
        });
        addr
    }

    async fn round_trip(stream: &mut TcpStream) -> std::io::Result<[u8; 4]> {
        stream.write_all(b"ping").await?;
        let mut answer = [0u8; 4];
        stream.read_exact(&mut answer).await?;
        Ok(answer)
    }

    #[tokio::test]
    async fn relays_until_cut_and_again_once_restored() {
        let relay = Relay::start(echo().await).await.expect("relay");
        let mut before = TcpStream::connect(relay.addr).await.expect("connect");
        assert_eq!(&round_trip(&mut before).await.expect("relayed"), b"ping");

        relay.cut().await;
        assert!(
            round_trip(&mut before).await.is_err(),
            "a relayed connection ends with the cut"
        );
        assert!(
            TcpStream::connect(relay.addr).await.is_err(),
            "new connections are refused while cut"
        );

        relay.restore().await.expect("restore");
        let mut after = TcpStream::connect(relay.addr).await.expect("connect");
        assert_eq!(&round_trip(&mut after).await.expect("relayed"), b"ping");
    }

    #[tokio::test]
    async fn an_armed_commit_arrives_and_its_answer_is_lost_once() {
        let relay = Relay::start(echo().await).await.expect("relay");
        let mut client = TcpStream::connect(relay.addr).await.expect("connect");
        assert_eq!(&round_trip(&mut client).await.expect("relayed"), b"ping");

        relay.lose_next_commit_answer();
        client.write_all(COMMIT).await.expect("send the commit");
        let mut answer = Vec::new();
        client
            .read_to_end(&mut answer)
            .await
            .expect("the connection ends");
        assert!(answer.is_empty(), "the answer was relayed: {answer:?}");
        // The echo server answered, so it had the commit.
        assert_eq!(relay.commit_answers_lost(), 1);

        let mut other = TcpStream::connect(relay.addr).await.expect("connect");
        other.write_all(COMMIT).await.expect("send a commit");
        let mut answer = [0u8; COMMIT.len()];
        other.read_exact(&mut answer).await.expect("answered");
        assert_eq!(&answer, COMMIT, "armed once: the next commit is answered");
        assert_eq!(relay.commit_answers_lost(), 1);
    }
}
