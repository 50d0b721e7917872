//! What the accept loop accepts from: a TCP or a Unix socket (or a TLS
//! listener wrapping one), behind one trait, in the spirit of
//! `axum::serve::Listener`.

use std::fmt;
use std::future::Future;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};

/// A listening socket the lifecycle serves.
///
/// `AsFd` is what the in-place upgrade passes to its successor.
pub trait Listener: AsFd + Send + 'static {
    /// One accepted connection.
    type Io: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    /// The peer's address, for logs.
    type Addr: fmt::Debug + Send + Sync + 'static;

    /// Waits for the next connection. Errors are the socket's: the accept
    /// loop absorbs them (backing off on EMFILE and the like).
    fn accept(&mut self) -> impl Future<Output = io::Result<(Self::Io, Self::Addr)>> + Send;

    /// Takes, without waiting, up to `max` connections already queued in the
    /// kernel: called once, when accepting stops, so that clients whose
    /// handshake completed are served rather than reset.
    fn accept_queued(&mut self, max: usize) -> Vec<(Self::Io, Self::Addr)>;

    /// Where it listens, as a URL for the log (`http://127.0.0.1:8080`).
    fn describe(&self) -> String;

    /// Has the kernel close an accepted connection once what the server sent
    /// on it has gone unacknowledged for `timeout`: a client that stopped
    /// reading (its window closed) or a peer that vanished. Such a
    /// connection is busy with its answer, so no idle timeout applies.
    /// [`serve`](crate::serve) calls it before it accepts. The default does
    /// nothing, for sockets without such a timeout.
    fn set_send_timeout(&self, timeout: Duration) -> io::Result<()> {
        let _ = timeout;
        Ok(())
    }
}

/// A second descriptor on `socket`'s open file: it accepts from the same
/// queue, directly rather than through the reactor, so it sees connections
/// the reactor has not been told about yet.
fn queue_handle(socket: &impl AsFd) -> io::Result<OwnedFd> {
    socket.as_fd().try_clone_to_owned()
}

/// Accepts from `listener` until it would block, at most `max` times.
fn drain_queue<S, A>(max: usize, mut accept: impl FnMut() -> io::Result<(S, A)>) -> Vec<(S, A)> {
    let mut taken = Vec::new();
    while taken.len() < max {
        match accept() {
            Ok(accepted) => taken.push(accepted),
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => break,
            Err(error) if is_connection_error(&error) => {}
            Err(error) => {
                tracing::warn!(%error, "accept failed while emptying the backlog");
                break;
            }
        }
    }
    taken
}

/// Errors that concern one connection, not the listener.
pub(crate) fn is_connection_error(error: &io::Error) -> bool {
    use io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    matches!(
        error.kind(),
        ConnectionRefused | ConnectionAborted | ConnectionReset
    )
}

impl Listener for TcpListener {
    type Io = TcpStream;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> io::Result<(TcpStream, Self::Addr)> {
        let (stream, peer) = TcpListener::accept(self).await?;
        if let Err(error) = stream.set_nodelay(true) {
            tracing::debug!(%error, %peer, "could not set TCP_NODELAY");
        }
        Ok((stream, peer))
    }

    fn accept_queued(&mut self, max: usize) -> Vec<(TcpStream, Self::Addr)> {
        let Ok(queue) = queue_handle(self).map(std::net::TcpListener::from) else {
            return Vec::new();
        };
        drain_queue(max, || queue.accept())
            .into_iter()
            .filter_map(|(stream, peer)| {
                stream.set_nonblocking(true).ok()?;
                let _ = stream.set_nodelay(true);
                Some((TcpStream::from_std(stream).ok()?, peer))
            })
            .collect()
    }

    fn describe(&self) -> String {
        match self.local_addr() {
            Ok(addr) => format!("http://{addr}"),
            Err(error) => format!("an unknown address ({error})"),
        }
    }

    /// `TCP_USER_TIMEOUT` on the listening socket, which each connection
    /// inherits when the kernel completes its handshake (so not one already
    /// queued when this is called: a backlog handed over by socket
    /// activation). It bounds zero-window probing too.
    fn set_send_timeout(&self, timeout: Duration) -> io::Result<()> {
        socket2::SockRef::from(self).set_tcp_user_timeout(Some(timeout))
    }
}

impl Listener for UnixListener {
    type Io = UnixStream;
    type Addr = tokio::net::unix::SocketAddr;

    async fn accept(&mut self) -> io::Result<(UnixStream, Self::Addr)> {
        UnixListener::accept(self).await
    }

    fn accept_queued(&mut self, max: usize) -> Vec<(UnixStream, Self::Addr)> {
        let Ok(queue) = queue_handle(self).map(std::os::unix::net::UnixListener::from) else {
            return Vec::new();
        };
        drain_queue(max, || queue.accept())
            .into_iter()
            .filter_map(|(stream, _)| {
                stream.set_nonblocking(true).ok()?;
                let stream = UnixStream::from_std(stream).ok()?;
                let peer = stream.peer_addr().ok()?;
                Some((stream, peer))
            })
            .collect()
    }

    fn describe(&self) -> String {
        match self.local_addr() {
            Ok(addr) => match addr.as_pathname() {
                Some(path) => format!("unix:{}", path.display()),
                None => "an unnamed unix socket".to_owned(),
            },
            Err(error) => format!("an unknown address ({error})"),
        }
    }
}
