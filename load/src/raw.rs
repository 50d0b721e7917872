//! A minimal HTTP/1.1 keep-alive client over a bare `TcpStream` (or a TLS
//! stream): fixed request bytes out, one response in (status line,
//! `Content-Length` body). From one core it drives more requests a second
//! than `h2load --h1` does (bare hyper: 213k against 175k on one machine),
//! so a closed loop on one core keeps a server on another busy; the bench
//! says, run by run, how much of its core the harness took.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hdrhistogram::Histogram;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::report;

/// Largest response head the client accepts.
const MAX_HEAD: usize = 16 * 1024;

/// `GET PATH HTTP/1.1` with a Host header, as bytes.
pub fn get(path: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nHost: bench\r\n\r\n").into_bytes()
}

/// `GET PATH HTTP/1.1` with a Host header and `Connection: close`: the
/// connection's one request.
pub fn get_close(path: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n").into_bytes()
}

/// `POST PATH HTTP/1.1` with a JSON `body`, as bytes.
pub fn post_json(path: &str, body: &str) -> Vec<u8> {
    format!(
        "POST {path} HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// The head of one response.
#[derive(Clone, Copy, Debug)]
pub struct Head {
    /// Status code.
    pub status: u16,
    /// The server asked to close the connection.
    pub close: bool,
}

/// One keep-alive connection, over TCP or over anything else that reads and
/// writes bytes (a TLS stream).
#[derive(Debug)]
pub struct RawConn<S = TcpStream> {
    stream: S,
    buf: Vec<u8>,
}

impl RawConn {
    /// Connects with `TCP_NODELAY`.
    ///
    /// # Errors
    /// The connect error.
    pub async fn connect(addr: SocketAddr) -> io::Result<RawConn> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(RawConn::new(stream))
    }

    /// The stream, for keeping the connection open without using it.
    pub fn into_stream(self) -> TcpStream {
        self.stream
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> RawConn<S> {
    /// A connection over `stream`, already connected.
    pub fn new(stream: S) -> RawConn<S> {
        RawConn {
            stream,
            buf: Vec::with_capacity(1024),
        }
    }

    /// The stream.
    pub fn stream(&self) -> &S {
        &self.stream
    }

    /// Sends `request` and reads the whole response.
    ///
    /// # Errors
    /// I/O errors, an early close (`UnexpectedEof`) or a malformed response
    /// (`InvalidData`).
    pub async fn exchange(&mut self, request: &[u8]) -> io::Result<Head> {
        self.stream.write_all(request).await?;
        // A TLS stream may hold the last record back until flushed; a
        // TcpStream's flush does nothing.
        self.stream.flush().await?;
        self.read_response().await
    }

    /// Sends `request` and reads the whole response, keeping its body (for
    /// `/metrics`; the benchmarks' hot path uses [`RawConn::exchange`],
    /// which copies nothing).
    ///
    /// # Errors
    /// As [`RawConn::exchange`].
    pub async fn exchange_body(&mut self, request: &[u8]) -> io::Result<(Head, Vec<u8>)> {
        self.stream.write_all(request).await?;
        self.stream.flush().await?;
        let (head, head_end, length) = self.read_whole().await?;
        let body = self.buf[head_end..head_end + length].to_vec();
        self.buf.drain(..head_end + length);
        Ok((head, body))
    }

    /// Whether nothing of a response has arrived since the last whole one:
    /// after a failed [`RawConn::exchange`], the server answered none of the
    /// request, so a client may send it again on a new connection (RFC
    /// 9112 §9.3.1, for an idempotent request on a connection it reused).
    pub fn received_nothing(&self) -> bool {
        self.buf.is_empty()
    }

    /// Waits, while no request is out, until the server closes the
    /// connection; returns at its end of stream (a TLS stream's
    /// `close_notify` included). Bytes that come unasked end the wait as
    /// `InvalidData`, and a failed read as its error: either way the
    /// connection is done with. A keep-alive client awaits this beside its
    /// next request's due time, so a connection the server closed while
    /// idle is not reused, as hyper's pool drops one.
    ///
    /// # Cancel safety
    /// Cancel safe: a read that has not completed took nothing.
    pub async fn closed(&mut self) -> io::Result<()> {
        let mut chunk = [0u8; 512];
        let n = self.stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        self.buf.extend_from_slice(&chunk[..n]);
        Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "bytes while no request was out",
        ))
    }

    async fn read_response(&mut self) -> io::Result<Head> {
        let (head, head_end, length) = self.read_whole().await?;
        self.buf.drain(..head_end + length);
        Ok(head)
    }

    /// Reads until one whole response is in the buffer; returns its head,
    /// where its body starts and the body's length.
    async fn read_whole(&mut self) -> io::Result<(Head, usize, usize)> {
        let head_end = loop {
            if let Some(end) = find(&self.buf, b"\r\n\r\n") {
                break end + 4;
            }
            if self.buf.len() > MAX_HEAD {
                return Err(io::Error::new(io::ErrorKind::InvalidData, "head too long"));
            }
            self.fill().await?;
        };
        let (status, length, close) = parse_head(&self.buf[..head_end])?;
        while self.buf.len() < head_end + length {
            self.fill().await?;
        }
        Ok((Head { status, close }, head_end, length))
    }

    async fn fill(&mut self) -> io::Result<()> {
        let mut chunk = [0u8; 4096];
        let n = self.stream.read(&mut chunk).await?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(())
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}

/// Status, `Content-Length` (0 if absent) and `Connection: close`.
fn parse_head(head: &[u8]) -> io::Result<(u16, usize, bool)> {
    let invalid = |what: &str| io::Error::new(io::ErrorKind::InvalidData, what.to_owned());
    let text = std::str::from_utf8(head).map_err(|_| invalid("head is not UTF-8"))?;
    let mut lines = text.split("\r\n");
    let status = lines
        .next()
        .and_then(|line| line.split(' ').nth(1))
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| invalid("no status line"))?;
    let mut length = 0;
    let mut close = false;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            length = value.parse().map_err(|_| invalid("bad content-length"))?;
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            return Err(invalid("chunked responses are not supported"));
        } else if name.eq_ignore_ascii_case("connection") && value.eq_ignore_ascii_case("close") {
            close = true;
        }
    }
    Ok((status, length, close))
}

/// The outcome of a closed-loop run.
#[derive(Debug)]
pub struct LoopResult {
    /// Responses with the expected status.
    pub ok: u64,
    /// Responses with another status.
    pub unexpected: u64,
    /// Connection errors (each followed by a reconnect).
    pub errors: u64,
    /// How long the run took.
    pub elapsed: Duration,
    /// Latency of every response, in microseconds.
    pub latency_us: Histogram<u64>,
}

impl LoopResult {
    /// Nothing counted yet.
    fn empty() -> Self {
        LoopResult {
            ok: 0,
            unexpected: 0,
            errors: 0,
            elapsed: Duration::ZERO,
            latency_us: report::histogram(),
        }
    }

    /// Expected responses per second.
    pub fn throughput(&self) -> f64 {
        #[allow(clippy::cast_precision_loss)]
        let ok = self.ok as f64;
        ok / self.elapsed.as_secs_f64()
    }

    /// The `q` quantile of latency, in milliseconds.
    pub fn latency_ms(&self, q: f64) -> f64 {
        #[allow(clippy::cast_precision_loss)]
        let us = self.latency_us.value_at_quantile(q) as f64;
        us / 1000.0
    }
}

/// Closed loop: `connections` connections each send the next request of
/// `requests` (cycling, each connection from its own offset) as soon as the
/// previous answer is in, for `duration`.
pub async fn closed_loop(
    addr: SocketAddr,
    requests: Arc<Vec<Vec<u8>>>,
    expected: u16,
    connections: usize,
    duration: Duration,
) -> LoopResult {
    let connect = move || RawConn::connect(addr);
    closed_loop_with(
        connect,
        requests,
        expected,
        connections,
        duration,
        Latency::FromSend,
    )
    .await
}

/// What [`closed_loop_with`] measures a request's latency from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Latency {
    /// The request's first byte sent, as [`closed_loop`] does.
    FromSend,
    /// The connect (and any handshake) when the request needs a new
    /// connection: what a client that opens one per request waits.
    FromConnect,
}

/// [`closed_loop`] over connections that `connect` opens (plain TCP, or TLS
/// with its handshake), a new one whenever the server closed the last, with
/// latency taken as `latency` says. `result.errors` counts failed connects
/// and exchanges alike.
pub async fn closed_loop_with<S, C, F>(
    connect: C,
    requests: Arc<Vec<Vec<u8>>>,
    expected: u16,
    connections: usize,
    duration: Duration,
    latency: Latency,
) -> LoopResult
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    C: Fn() -> F + Clone + Send + 'static,
    F: Future<Output = io::Result<RawConn<S>>> + Send,
{
    let started = Instant::now();
    let deadline = started + duration;
    let mut tasks = JoinSet::new();
    for c in 0..connections {
        let requests = Arc::clone(&requests);
        let connect = connect.clone();
        tasks.spawn(async move {
            let mut result = LoopResult::empty();
            let mut next = c * 7919;
            let mut conn: Option<RawConn<S>> = None;
            while Instant::now() < deadline && result.errors < 1000 {
                let mut sent = Instant::now();
                let connected = match conn.take() {
                    Some(current) => Ok(current),
                    None => tokio::time::timeout_at(deadline + Duration::from_secs(5), connect())
                        .await
                        .unwrap_or_else(|_| Err(io::ErrorKind::TimedOut.into())),
                };
                let mut current = match connected {
                    Ok(current) => current,
                    Err(_) => {
                        result.errors += 1;
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                };
                let request = &requests[next % requests.len()];
                next += 1;
                if latency == Latency::FromSend {
                    sent = Instant::now();
                }
                match tokio::time::timeout_at(
                    deadline + Duration::from_secs(5),
                    current.exchange(request),
                )
                .await
                {
                    Ok(Ok(head)) => {
                        report::record(&mut result.latency_us, sent.elapsed());
                        if head.status == expected {
                            result.ok += 1;
                        } else {
                            result.unexpected += 1;
                        }
                        if !head.close {
                            conn = Some(current);
                        }
                    }
                    Ok(Err(_)) | Err(_) => result.errors += 1,
                }
            }
            result
        });
    }
    let mut total = LoopResult::empty();
    while let Some(done) = tasks.join_next().await {
        if let Ok(part) = done {
            total.ok += part.ok;
            total.unexpected += part.unexpected;
            total.errors += part.errors;
            let _ = total.latency_us.add(&part.latency_us);
        }
    }
    total.elapsed = started.elapsed();
    total
}

/// Sends exactly `count` requests over `connections` keep-alive
/// connections (the last few take one more), each waiting for its answer;
/// returns how many were answered `expected`.
///
/// # Errors
/// The first connection error.
pub async fn exactly(
    addr: SocketAddr,
    request: &[u8],
    expected: u16,
    connections: usize,
    count: usize,
) -> io::Result<usize> {
    let request = Arc::new(request.to_vec());
    let connections = connections.clamp(1, count.max(1));
    let mut tasks = JoinSet::new();
    for c in 0..connections {
        let share = count / connections + usize::from(c < count % connections);
        let request = Arc::clone(&request);
        tasks.spawn(async move {
            let mut conn = RawConn::connect(addr).await?;
            let mut answered = 0;
            for _ in 0..share {
                let head = conn.exchange(&request).await?;
                if head.close {
                    conn = RawConn::connect(addr).await?;
                }
                answered += usize::from(head.status == expected);
            }
            Ok::<_, io::Error>(answered)
        });
    }
    let mut answered = 0;
    while let Some(done) = tasks.join_next().await {
        answered += done.map_err(io::Error::other)??;
    }
    Ok(answered)
}

/// Opens `count` connections, each answered one `request` (so the server
/// knows its protocol), and returns them open and idle. At most
/// `concurrency` connects run at once. They are returned outside the
/// runtime's reactor, so the server closing them wakes nothing here: a
/// shutdown is timed on the server's work alone.
///
/// # Errors
/// The first connection that fails.
pub async fn open_idle(
    addr: SocketAddr,
    count: usize,
    request: &[u8],
    concurrency: usize,
) -> io::Result<Vec<std::net::TcpStream>> {
    let request = Arc::new(request.to_vec());
    let mut open = Vec::with_capacity(count);
    let mut tasks = JoinSet::new();
    let mut started = 0;
    while open.len() < count {
        while started < count && tasks.len() < concurrency {
            let request = Arc::clone(&request);
            tasks.spawn(async move {
                let mut conn = RawConn::connect(addr).await?;
                let head = conn.exchange(&request).await?;
                if head.close {
                    return Err(io::Error::other("the server closed an idle connection"));
                }
                conn.into_stream().into_std()
            });
            started += 1;
        }
        match tasks.join_next().await {
            Some(Ok(Ok(stream))) => open.push(stream),
            Some(Ok(Err(error))) => return Err(error),
            Some(Err(error)) => return Err(io::Error::other(error)),
            None => break,
        }
    }
    Ok(open)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads_are_parsed() {
        let head = b"HTTP/1.1 307 Temporary Redirect\r\nlocation: x\r\ncontent-length: 12\r\nConnection: close\r\n\r\n";
        let (status, length, close) = parse_head(head).expect("parse");
        assert_eq!((status, length, close), (307, 12, true));
    }
}
