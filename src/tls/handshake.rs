//! A TLS stream whose handshake runs inside its first reads and writes, so
//! that it happens on the connection's own task — under the request-head
//! deadline, like any slow client — and never in the accept loop.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_rustls::server::TlsStream;
use tokio_rustls::Accept;

/// A server-side TLS connection: handshaking, then encrypted.
pub enum Handshake<Io> {
    /// The handshake is under way.
    Handshaking(Box<Accept<Io>>),
    /// The handshake is done.
    Ready(Box<TlsStream<Io>>),
    /// The handshake failed; the error was returned once.
    Failed,
}

impl<Io> std::fmt::Debug for Handshake<Io> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Handshake::Handshaking(_) => "Handshake::Handshaking",
            Handshake::Ready(_) => "Handshake::Ready",
            Handshake::Failed => "Handshake::Failed",
        })
    }
}

impl<Io: AsyncRead + AsyncWrite + Unpin> Handshake<Io> {
    /// Drives the handshake; ready with the stream once it is done.
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<&mut TlsStream<Io>>> {
        if let Handshake::Handshaking(accept) = self {
            *self = match ready!(Pin::new(&mut **accept).poll(cx)) {
                Ok(stream) => Handshake::Ready(Box::new(stream)),
                Err(error) => {
                    *self = Handshake::Failed;
                    return Poll::Ready(Err(error));
                }
            };
        }
        match self {
            Handshake::Ready(stream) => Poll::Ready(Ok(stream)),
            _ => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::NotConnected,
                "the TLS handshake failed",
            ))),
        }
    }
}

impl<Io: AsyncRead + AsyncWrite + Unpin> AsyncRead for Handshake<Io> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let stream = ready!(self.get_mut().poll_ready(cx))?;
        Pin::new(stream).poll_read(cx, buf)
    }
}

impl<Io: AsyncRead + AsyncWrite + Unpin> AsyncWrite for Handshake<Io> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let stream = ready!(self.get_mut().poll_ready(cx))?;
        Pin::new(stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let stream = ready!(self.get_mut().poll_ready(cx))?;
        Pin::new(stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Handshake::Ready(stream) => Pin::new(stream).poll_flush(cx),
            _ => Poll::Ready(Ok(())),
        }
    }

    /// Sends `close_notify`, then closes the write side. A connection still
    /// handshaking has nothing to say goodbye with: its socket just closes.
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Handshake::Ready(stream) => Pin::new(stream).poll_shutdown(cx),
            Handshake::Handshaking(accept) => match accept.get_mut() {
                Some(io) => Pin::new(io).poll_shutdown(cx),
                None => Poll::Ready(Ok(())),
            },
            Handshake::Failed => Poll::Ready(Ok(())),
        }
    }
}
