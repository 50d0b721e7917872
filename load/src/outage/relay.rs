//! A TCP relay in front of PostgreSQL, one per replica, so that the
//! harness can cut one replica off from the database while the others keep
//! reaching it: [`Relay::cut`] closes every relayed connection and the
//! listener (new connections are refused), [`Relay::restore`] listens on the
//! same port again.

use std::net::SocketAddr;

use anyhow::Context;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Mutex;
use tokio::task::{JoinHandle, JoinSet};

/// A relay from a loopback port of its own to `upstream`.
#[derive(Debug)]
pub struct Relay {
    /// Where the replica connects.
    pub addr: SocketAddr,
    upstream: SocketAddr,
    /// The accept loop while the relay is up; it owns every relayed
    /// connection, so aborting it closes them all.
    running: Mutex<Option<JoinHandle<()>>>,
}

impl Relay {
    /// Listens on a free loopback port and relays to `upstream`.
    ///
    /// # Errors
    /// If no port can be bound.
    pub async fn start(upstream: SocketAddr) -> anyhow::Result<Relay> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .context("cannot bind the relay")?;
        let addr = listener.local_addr()?;
        Ok(Relay {
            addr,
            upstream,
            running: Mutex::new(Some(tokio::spawn(relay(listener, upstream)))),
        })
    }

    /// Cuts the replica off: closes every relayed connection and stops
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
    pub async fn restore(&self) -> anyhow::Result<()> {
        let mut running = self.running.lock().await;
        if running.is_none() {
            let listener = TcpListener::bind(self.addr)
                .await
                .with_context(|| format!("cannot listen on {} again", self.addr))?;
            *running = Some(tokio::spawn(relay(listener, self.upstream)));
        }
        Ok(())
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        if let Some(running) = self.running.get_mut().take() {
            running.abort();
        }
    }
}

/// Accepts until aborted; each connection is copied both ways to
/// `upstream` on a task of the set this loop owns.
async fn relay(listener: TcpListener, upstream: SocketAddr) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((mut inbound, _)) = accepted else { continue };
                connections.spawn(async move {
                    let Ok(mut outbound) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let _ = inbound.set_nodelay(true);
                    let _ = outbound.set_nodelay(true);
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                });
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
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
}
