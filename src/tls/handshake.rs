//! A TLS stream whose handshake runs inside its first reads and writes, so
//! that it happens on the connection's own task — under the request-head
//! deadline, like any slow client — and never in the accept loop.
//!
//! The client's first byte decides: a TLS record goes to rustls; an ASCII
//! capital (the first letter of an HTTP method) is plain HTTP sent to the
//! TLS port, which gets a `400` with a JSON body instead of a TLS alert it
//! cannot read.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_rustls::server::TlsStream;
use tokio_rustls::Accept;

/// The answer to plain HTTP on the TLS port.
const PLAIN_HTTP_REFUSED: &[u8] = b"HTTP/1.1 400 Bad Request\r\n\
content-type: application/json\r\n\
content-length: 61\r\n\
connection: close\r\n\r\n\
{\"error\":\"this port speaks HTTPS; plain HTTP was sent to it\"}";

/// How much of a refused plain-HTTP request is read and discarded before
/// the socket closes, so that the close is a FIN after the `400`, not a
/// reset that could destroy it (unread data at close means RST).
const REFUSED_DISCARD_LIMIT: usize = 64 * 1024;

/// A server-side TLS connection: handshaking, then encrypted.
pub enum Handshake<Io> {
    /// Waiting for the client's first byte.
    Sniffing(Option<Io>, tokio_rustls::TlsAcceptor),
    /// The handshake is under way.
    Handshaking(Box<Accept<Replay<Io>>>),
    /// The handshake is done.
    Ready(Box<TlsStream<Replay<Io>>>),
    /// Plain HTTP was sent: the `400` is being written (`sent` bytes so
    /// far), then the rest of the request read and dropped until the client
    /// closes. The head deadline bounds the wait.
    Refusing {
        /// The connection.
        io: Io,
        /// How much of the answer is written.
        sent: usize,
        /// How much of the request was discarded.
        discarded: usize,
    },
    /// The handshake failed, or plain HTTP was refused; nothing more is
    /// read or written.
    Failed,
}

impl<Io> std::fmt::Debug for Handshake<Io> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Handshake::Sniffing(..) => "Handshake::Sniffing",
            Handshake::Handshaking(_) => "Handshake::Handshaking",
            Handshake::Ready(_) => "Handshake::Ready",
            Handshake::Refusing { .. } => "Handshake::Refusing",
            Handshake::Failed => "Handshake::Failed",
        })
    }
}

/// What the connection's first bytes turned out to be.
enum Outcome<'a, Io> {
    /// The TLS stream, handshake done.
    Tls(&'a mut TlsStream<Replay<Io>>),
    /// Not TLS: the connection is over (plain HTTP answered `400`, or
    /// closed before its first byte).
    Closed,
}

impl<Io: AsyncRead + AsyncWrite + Unpin> Handshake<Io> {
    /// Begins on a freshly accepted connection.
    pub(super) fn new(io: Io, acceptor: tokio_rustls::TlsAcceptor) -> Self {
        Handshake::Sniffing(Some(io), acceptor)
    }

    /// Drives the connection through its states until it is a TLS stream
    /// or over.
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<Outcome<'_, Io>>> {
        loop {
            match self {
                Handshake::Sniffing(io, acceptor) => {
                    let stream = io.as_mut().expect("the connection, until it moves on");
                    let mut first = [0u8; 1];
                    let mut buf = ReadBuf::new(&mut first);
                    if let Err(error) = ready!(Pin::new(stream).poll_read(cx, &mut buf)) {
                        *self = Handshake::Failed;
                        return Poll::Ready(Err(error));
                    }
                    let io = io.take().expect("the connection, until it moves on");
                    *self = match buf.filled().first() {
                        None => Handshake::Failed,
                        Some(byte) if byte.is_ascii_uppercase() => Handshake::Refusing {
                            io,
                            sent: 0,
                            discarded: 0,
                        },
                        Some(&byte) => {
                            Handshake::Handshaking(Box::new(acceptor.accept(Replay::new(byte, io))))
                        }
                    };
                }
                Handshake::Handshaking(accept) => {
                    *self = match ready!(Pin::new(&mut **accept).poll(cx)) {
                        Ok(stream) => Handshake::Ready(Box::new(stream)),
                        Err(error) => {
                            *self = Handshake::Failed;
                            return Poll::Ready(Err(error));
                        }
                    };
                }
                Handshake::Ready(_) => break,
                Handshake::Refusing {
                    io,
                    sent,
                    discarded,
                } => {
                    let done = ready!(refuse(io, sent, discarded, cx));
                    *self = Handshake::Failed;
                    done?;
                }
                Handshake::Failed => return Poll::Ready(Ok(Outcome::Closed)),
            }
        }
        match self {
            Handshake::Ready(stream) => Poll::Ready(Ok(Outcome::Tls(stream))),
            _ => unreachable!("the loop breaks on Ready only"),
        }
    }
}

/// Writes the `400` for plain HTTP, closes the write side, then reads and
/// drops what the client sent until it closes (or past the limit).
fn refuse<Io: AsyncRead + AsyncWrite + Unpin>(
    io: &mut Io,
    sent: &mut usize,
    discarded: &mut usize,
    cx: &mut Context<'_>,
) -> Poll<io::Result<()>> {
    while *sent < PLAIN_HTTP_REFUSED.len() {
        *sent += ready!(Pin::new(&mut *io).poll_write(cx, &PLAIN_HTTP_REFUSED[*sent..]))?;
    }
    ready!(Pin::new(&mut *io).poll_shutdown(cx))?;
    let mut scratch = [0u8; 4096];
    while *discarded < REFUSED_DISCARD_LIMIT {
        let mut buf = ReadBuf::new(&mut scratch);
        ready!(Pin::new(&mut *io).poll_read(cx, &mut buf))?;
        if buf.filled().is_empty() {
            break;
        }
        *discarded += buf.filled().len();
    }
    Poll::Ready(Ok(()))
}

/// A connection whose first byte, already read to tell TLS from plain
/// HTTP, is given back to the first read.
#[derive(Debug)]
pub struct Replay<Io> {
    first: Option<u8>,
    io: Io,
}

impl<Io> Replay<Io> {
    fn new(first: u8, io: Io) -> Self {
        Replay {
            first: Some(first),
            io,
        }
    }
}

impl<Io: AsyncRead + Unpin> AsyncRead for Replay<Io> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if buf.remaining() > 0 {
            if let Some(byte) = this.first.take() {
                buf.put_slice(&[byte]);
                return Poll::Ready(Ok(()));
            }
        }
        Pin::new(&mut this.io).poll_read(cx, buf)
    }
}

impl<Io: AsyncWrite + Unpin> AsyncWrite for Replay<Io> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

impl<Io: AsyncRead + AsyncWrite + Unpin> AsyncRead for Handshake<Io> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match ready!(self.get_mut().poll_ready(cx))? {
            Outcome::Tls(stream) => Pin::new(stream).poll_read(cx, buf),
            Outcome::Closed => Poll::Ready(Ok(())),
        }
    }
}

impl<Io: AsyncRead + AsyncWrite + Unpin> AsyncWrite for Handshake<Io> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match ready!(self.get_mut().poll_ready(cx))? {
            Outcome::Tls(stream) => Pin::new(stream).poll_write(cx, buf),
            Outcome::Closed => Poll::Ready(Err(not_tls())),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match ready!(self.get_mut().poll_ready(cx))? {
            Outcome::Tls(stream) => Pin::new(stream).poll_write_vectored(cx, bufs),
            Outcome::Closed => Poll::Ready(Err(not_tls())),
        }
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
            Handshake::Sniffing(Some(io), _) | Handshake::Refusing { io, .. } => {
                Pin::new(io).poll_shutdown(cx)
            }
            Handshake::Sniffing(None, _) | Handshake::Failed => Poll::Ready(Ok(())),
        }
    }
}

/// A write on a connection that never became TLS.
fn not_tls() -> io::Error {
    io::Error::new(io::ErrorKind::NotConnected, "not a TLS connection")
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    fn acceptor() -> tokio_rustls::TlsAcceptor {
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_no_client_auth()
            .with_cert_resolver(std::sync::Arc::new(
                rustls::server::ResolvesServerCertUsingSni::new(),
            ));
        tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config))
    }

    #[test]
    fn the_refusal_announces_its_body_length() {
        let text = std::str::from_utf8(PLAIN_HTTP_REFUSED).expect("ASCII");
        let (head, body) = text.split_once("\r\n\r\n").expect("a head and a body");
        let length: usize = head
            .lines()
            .find_map(|line| line.strip_prefix("content-length: "))
            .expect("a content-length")
            .parse()
            .expect("a number");
        assert_eq!(length, body.len());
        let json: serde_json::Value = serde_json::from_str(body).expect("a JSON body");
        assert!(json["error"].is_string());
    }

    #[tokio::test]
    async fn plain_http_is_answered_400_and_the_stream_ends() {
        let (server, mut client) = tokio::io::duplex(4096);
        let mut connection = Handshake::new(server, acceptor());
        client
            .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .expect("send");
        client.shutdown().await.expect("the client is done");
        let mut read = Vec::new();
        assert_eq!(connection.read_to_end(&mut read).await.expect("EOF"), 0);
        assert!(matches!(connection, Handshake::Failed));
        let mut answer = Vec::new();
        client.read_to_end(&mut answer).await.expect("the answer");
        assert_eq!(answer, PLAIN_HTTP_REFUSED);
    }

    #[tokio::test]
    async fn a_tls_record_reaches_rustls_from_its_first_byte() {
        let (server, mut client) = tokio::io::duplex(4096);
        let mut connection = Handshake::new(server, acceptor());
        // A fatal alert record: rustls, given it from its first byte, fails
        // the handshake on the alert; without that byte it would read
        // 0x03 as the record type and fail on that instead.
        client
            .write_all(&[0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x28])
            .await
            .expect("send");
        let mut byte = [0u8; 1];
        let error = connection.read(&mut byte).await.expect_err("no handshake");
        assert!(error.to_string().contains("alert"), "{error}");
        assert!(matches!(connection, Handshake::Failed));
    }

    #[tokio::test]
    async fn a_client_that_closes_before_its_first_byte_is_an_end_of_stream() {
        let (server, client) = tokio::io::duplex(64);
        drop(client);
        let mut connection = Handshake::new(server, acceptor());
        let mut byte = [0u8; 1];
        assert_eq!(connection.read(&mut byte).await.expect("EOF"), 0);
    }
}
