//! The public listener: a TCP or Unix [`Socket`] (bound or inherited, from
//! the service crate), with TLS on top when it is configured.

pub use lameduck_service::listen::{bind, ListenAddr, Peer, Socket, Stream};

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, BorrowedFd};
use std::time::Duration;

use tokio_util::either::Either;

use crate::lifecycle::Listener;
use crate::tls::{Handshake, TlsAcceptor};

/// The public listener: a [`Socket`], with TLS on top when configured.
/// The TLS handshake happens on the connection's own task, under its
/// request-head deadline, never in the accept loop.
#[derive(Debug)]
pub struct PublicListener {
    socket: Socket,
    tls: Option<TlsAcceptor>,
}

impl PublicListener {
    /// Serves `socket`, through `tls` if given.
    pub fn new(socket: Socket, tls: Option<TlsAcceptor>) -> PublicListener {
        PublicListener { socket, tls }
    }

    /// The socket underneath.
    pub fn socket(&self) -> &Socket {
        &self.socket
    }

    /// The TCP address, if this is a TCP socket.
    ///
    /// # Errors
    /// For a Unix socket, or if the OS cannot tell.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.socket.local_addr()
    }

    fn wrap(&self, io: Stream) -> Either<Stream, Handshake<Stream>> {
        match &self.tls {
            Some(tls) => Either::Right(tls.accept(io)),
            None => Either::Left(io),
        }
    }
}

impl AsFd for PublicListener {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.socket.as_fd()
    }
}

impl Listener for PublicListener {
    type Io = Either<Stream, Handshake<Stream>>;
    type Addr = Peer;

    async fn accept(&mut self) -> io::Result<(Self::Io, Peer)> {
        let (io, peer) = self.socket.accept().await?;
        Ok((self.wrap(io), peer))
    }

    fn accept_queued(&mut self, max: usize) -> Vec<(Self::Io, Peer)> {
        let queued = self.socket.accept_queued(max);
        queued
            .into_iter()
            .map(|(io, peer)| (self.wrap(io), peer))
            .collect()
    }

    fn describe(&self) -> String {
        let plain = self.socket.describe();
        match (&self.tls, plain.strip_prefix("http://")) {
            (Some(_), Some(addr)) => format!("https://{addr}"),
            (Some(_), None) => format!("{plain} (TLS)"),
            (None, _) => plain,
        }
    }

    fn set_send_timeout(&self, timeout: Duration) -> io::Result<()> {
        self.socket.set_send_timeout(timeout)
    }
}

/// So that the app's parts can be served by `axum::serve` too (the load
/// harness's baseline does): accept errors are retried after a pause, as
/// axum's own listeners do.
impl axum::serve::Listener for PublicListener {
    type Io = Either<Stream, Handshake<Stream>>;
    type Addr = Peer;

    async fn accept(&mut self) -> (Self::Io, Peer) {
        loop {
            match Listener::accept(self).await {
                Ok(accepted) => return accepted,
                Err(error) => {
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(crate::lifecycle::ACCEPT_ERROR_BACKOFF).await;
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<Peer> {
        self.socket.local_addr().map(Either::Left)
    }
}
