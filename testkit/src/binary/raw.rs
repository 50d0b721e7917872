//! Raw HTTP/1 on blocking sockets with read and write timeouts: a test
//! sees exactly what the server put on the wire (`Connection: close`, EOF)
//! and never waits forever.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use super::IO_TIMEOUT;

/// A response as it came off the wire.
#[derive(Debug)]
pub struct RawResponse {
    /// The status code.
    pub status: u16,
    /// Header names (lower-cased) and values, in order.
    pub headers: Vec<(String, String)>,
    /// The body, de-chunked.
    pub body: Vec<u8>,
}

impl RawResponse {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(key, _)| *key == name)
            .map(|(_, value)| value.as_str())
    }

    /// Whether the response carries `Connection: close`.
    pub fn closes_connection(&self) -> bool {
        self.header("connection")
            .is_some_and(|value| value.eq_ignore_ascii_case("close"))
    }

    /// The body parsed as JSON.
    ///
    /// # Panics
    /// If the body is not JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "body is not JSON ({e}): {}",
                String::from_utf8_lossy(&self.body)
            )
        })
    }
}

/// A fresh temporary directory whose name starts with `prefix`, removed
/// when dropped.
pub fn tempdir(prefix: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .expect("a temporary directory")
}

/// A complete, valid body for `POST /api/links`.
pub const LINK: &str = r#"{"url":"https://example.com/x"}"#;

/// Where [`start_slow_post`] splits [`LINK`]: the first part goes with the
/// request head, the rest when the test lets the request finish.
pub const LINK_SPLIT: usize = 10;

/// Sends the head of `POST /api/links` and the first [`LINK_SPLIT`] bytes
/// of [`LINK`]: the handler waits for the rest, which holds a request in
/// flight without any debug route.
pub fn start_slow_post(addr: SocketAddr) -> TcpStream {
    start_slow_post_of(addr, LINK)
}

/// Like [`start_slow_post`], for the JSON `body` (longer than
/// [`LINK_SPLIT`] bytes).
pub fn start_slow_post_of(addr: SocketAddr, body: &str) -> TcpStream {
    let mut stream = connect(addr);
    begin_slow_post(&mut stream, body);
    stream
}

/// Writes the head of `POST /api/links` and the first [`LINK_SPLIT`] bytes
/// of `body` to any stream (TCP, TLS, a Unix socket): the handler then
/// waits for the rest, which [`finish_slow_post_of`] sends.
pub fn begin_slow_post(stream: &mut impl Write, body: &str) {
    begin_slow_post_with(stream, body, "");
}

/// [`begin_slow_post`] with more `headers` (`Name: value\r\n` each).
pub fn begin_slow_post_with(stream: &mut impl Write, body: &str, headers: &str) {
    write!(
        stream,
        "POST /api/links HTTP/1.1\r\nHost: lameduck\r\nContent-Type: application/json\r\n\
         {headers}Content-Length: {}\r\n\r\n{}",
        body.len(),
        &body[..LINK_SPLIT]
    )
    .expect("send the request head");
    stream.flush().expect("flush the request head");
}

/// Sends the rest of the body [`start_slow_post`] began.
pub fn finish_slow_post(stream: &mut impl Write) {
    finish_slow_post_of(stream, LINK);
}

/// Sends the rest of the `body` [`begin_slow_post`] began.
pub fn finish_slow_post_of(stream: &mut impl Write, body: &str) {
    stream
        .write_all(&body.as_bytes()[LINK_SPLIT..])
        .expect("send the rest of the body");
    stream.flush().expect("flush the body");
}

/// Sends `method path` with a JSON `body` (or none) on a new connection
/// that the request closes, and reads the response.
///
/// # Errors
/// Any I/O error, including a refused connection.
pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> io::Result<RawResponse> {
    request_with(addr, method, path, "", body)
}

/// [`request`] with more `headers` (`Name: value\r\n` each).
///
/// # Errors
/// Any I/O error, including a refused connection.
pub fn request_with(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &str,
    body: Option<&str>,
) -> io::Result<RawResponse> {
    let mut stream = TcpStream::connect_timeout(&addr, IO_TIMEOUT)?;
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    let body = body.unwrap_or_default();
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: lameduck\r\nConnection: close\r\n\
         Content-Type: application/json\r\n{headers}Content-Length: {}\r\n\r\n{body}",
        body.len()
    )?;
    read_response(&mut stream)
}

/// Sends a whole `POST /api/links` with the JSON `body` on a new
/// connection and returns it unread: the answer is the test's to wait for.
///
/// # Panics
/// If the request cannot be sent.
pub fn send_create(addr: SocketAddr, body: &str) -> TcpStream {
    let mut stream = connect(addr);
    write!(
        stream,
        "POST /api/links HTTP/1.1\r\nHost: lameduck\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .expect("send POST /api/links");
    stream
}

/// Creates a link to `url` and returns its code.
///
/// # Panics
/// Unless the server answers 201 with a code.
pub fn create_link(addr: SocketAddr, url: &str) -> String {
    let body = serde_json::json!({ "url": url }).to_string();
    let response = request(addr, "POST", "/api/links", Some(&body)).expect("POST /api/links");
    assert_eq!(response.status, 201, "{response:?}");
    response.json()["code"]
        .as_str()
        .expect("the new link's code")
        .to_owned()
}

/// Opens a connection to `addr` with [`IO_TIMEOUT`] on reads and writes.
///
/// # Panics
/// If the connection cannot be made.
pub fn connect(addr: SocketAddr) -> TcpStream {
    let stream = TcpStream::connect_timeout(&addr, IO_TIMEOUT)
        .unwrap_or_else(|e| panic!("cannot connect to {addr}: {e}"));
    stream
        .set_read_timeout(Some(IO_TIMEOUT))
        .and_then(|()| stream.set_write_timeout(Some(IO_TIMEOUT)))
        .and_then(|()| stream.set_nodelay(true))
        .expect("socket options");
    stream
}

/// Sends `GET path` (keep-alive) on `stream` and reads the response.
///
/// # Errors
/// Any I/O error, including EOF before a complete response.
pub fn get(stream: &mut TcpStream, path: &str) -> io::Result<RawResponse> {
    // One write: `write!` would send each piece as a segment of its own,
    // and Nagle's algorithm hold the last for the server's delayed ACK.
    stream.write_all(format!("GET {path} HTTP/1.1\r\nHost: lameduck\r\n\r\n").as_bytes())?;
    read_response(stream)
}

/// Reads one complete response (head, then a `Content-Length` or chunked
/// body, or a body up to EOF) from `stream`, reading no further.
///
/// # Errors
/// Any I/O error, or `UnexpectedEof` if the server closed mid-response.
pub fn read_response(stream: &mut impl Read) -> io::Result<RawResponse> {
    let head = read_head(stream)?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| invalid(format!("bad status line {status_line:?}")))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(key, value)| (key.trim().to_ascii_lowercase(), value.trim().to_owned()))
        .collect();
    let mut response = RawResponse {
        status,
        headers,
        body: Vec::new(),
    };
    if let Some(length) = response.header("content-length") {
        let length = length
            .parse()
            .map_err(|_| invalid(format!("bad content-length {length:?}")))?;
        response.body = vec![0; length];
        stream.read_exact(&mut response.body)?;
    } else if response
        .header("transfer-encoding")
        .is_some_and(|value| value.eq_ignore_ascii_case("chunked"))
    {
        response.body = read_chunked(stream)?;
    } else if !(status == 204 || status == 304 || (100..200).contains(&status)) {
        stream.read_to_end(&mut response.body)?;
    }
    Ok(response)
}

/// Waits up to `timeout` for the server to close `stream`: `Ok(true)` on EOF,
/// `Ok(false)` if it stays open (or sends data instead).
///
/// # Errors
/// Any other I/O error, such as a reset.
pub fn wait_for_eof(stream: &mut TcpStream, timeout: Duration) -> io::Result<bool> {
    stream.set_read_timeout(Some(timeout.max(Duration::from_millis(1))))?;
    let mut byte = [0; 1];
    let result = match uninterrupted(|| stream.read(&mut byte)) {
        Ok(0) => Ok(true),
        Ok(_) => Ok(false),
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) =>
        {
            Ok(false)
        }
        Err(e) => Err(e),
    };
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    result
}

/// Runs the socket call `op` again while it fails with EINTR. A socket
/// call with a timeout (`SO_RCVTIMEO`, as every client here sets) is never
/// restarted by the kernel: it fails with EINTR when a signal handler runs
/// or the process is stopped and continued (signal(7)), neither of which is
/// the server's doing.
///
/// # Errors
/// Any other error of `op`.
pub fn uninterrupted<T>(mut op: impl FnMut() -> io::Result<T>) -> io::Result<T> {
    loop {
        match op() {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            result => return result,
        }
    }
}

/// Reads up to and including the blank line that ends a response head.
fn read_head(stream: &mut impl Read) -> io::Result<String> {
    const MAX_HEAD: usize = 64 * 1024;
    let mut head = Vec::new();
    let mut byte = [0; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() > MAX_HEAD {
            return Err(invalid("response head too long".to_owned()));
        }
        if uninterrupted(|| stream.read(&mut byte))? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "connection closed after {} bytes of response head",
                    head.len()
                ),
            ));
        }
        head.push(byte[0]);
    }
    String::from_utf8(head).map_err(|_| invalid("response head is not UTF-8".to_owned()))
}

fn read_chunked(stream: &mut impl Read) -> io::Result<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let size_line = read_line(stream)?;
        let size = size_line.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size, 16)
            .map_err(|_| invalid(format!("bad chunk size {size_line:?}")))?;
        if size == 0 {
            // Trailers, if any, end with an empty line.
            while !read_line(stream)?.is_empty() {}
            return Ok(body);
        }
        let start = body.len();
        body.resize(start + size, 0);
        stream.read_exact(&mut body[start..])?;
        read_line(stream)?;
    }
}

fn read_line(stream: &mut impl Read) -> io::Result<String> {
    let mut line = Vec::new();
    let mut byte = [0; 1];
    while !line.ends_with(b"\r\n") {
        stream.read_exact(&mut byte)?;
        line.push(byte[0]);
    }
    line.truncate(line.len() - 2);
    String::from_utf8(line).map_err(|_| invalid("chunk line is not UTF-8".to_owned()))
}

fn invalid(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}
