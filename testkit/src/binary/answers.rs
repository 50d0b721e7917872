//! Answers, metrics and readiness, shared by the suites: a link created,
//! an error's JSON without internals, a metric read or waited for, the
//! database's state as `/readyz` reports it.

use std::io::Write;
use std::net::SocketAddr;
use std::thread;
use std::time::{Duration, Instant};

use super::{connect, get, read_response, RawResponse, POLL_INTERVAL, START_TIMEOUT};

/// Words that would betray internals in an error body.
pub const INTERNALS: [&str; 6] = [
    "sqlx",
    "panicked",
    "src/",
    ".rs:",
    "backtrace",
    "postgres://",
];

/// `GET path` on a new connection.
pub fn fresh_get(addr: SocketAddr, path: &str) -> RawResponse {
    let mut stream = connect(addr);
    get(&mut stream, path).unwrap_or_else(|e| panic!("GET {path}: {e}"))
}

/// `POST /api/links` with `body` and, if given, a `Content-Type`, on a new
/// connection.
pub fn post_links(addr: SocketAddr, body: &[u8], content_type: Option<&str>) -> RawResponse {
    let mut stream = connect(addr);
    let mut head = format!(
        "POST /api/links HTTP/1.1\r\nHost: lameduck\r\nContent-Length: {}\r\n",
        body.len()
    );
    if let Some(content_type) = content_type {
        head.push_str(&format!("Content-Type: {content_type}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).expect("send the head");
    stream.write_all(body).expect("send the body");
    read_response(&mut stream).unwrap_or_else(|e| panic!("POST /api/links: {e}"))
}

/// `POST /api/links` of a JSON `body` on a new connection.
pub fn post_json(addr: SocketAddr, body: &str) -> RawResponse {
    post_links(addr, body.as_bytes(), Some("application/json"))
}

/// The body of a link with a custom `code`.
pub fn link_body(code: &str) -> String {
    format!(r#"{{"url":"https://example.com/{code}","code":"{code}"}}"#)
}

/// Asserts an error answer: `status`, a JSON body `{"error": "..."}` with a
/// message, and nothing of the internals. Returns the message.
pub fn assert_json_error(response: &RawResponse, status: u16, case: &str) -> String {
    let body = String::from_utf8_lossy(&response.body);
    assert_eq!(response.status, status, "{case}: {response:?} {body}");
    let content_type = response.header("content-type").unwrap_or_default();
    assert!(
        content_type.starts_with("application/json"),
        "{case}: content-type {content_type:?}, body {body}"
    );
    let json = response.json();
    let message = json["error"]
        .as_str()
        .unwrap_or_else(|| panic!("{case}: no \"error\" string in {json}"));
    assert!(!message.trim().is_empty(), "{case}: empty error message");
    let lower = body.to_lowercase();
    for word in INTERNALS {
        assert!(!lower.contains(word), "{case}: {word:?} in the body {body}");
    }
    message.to_owned()
}

/// `GET /metrics` on a new connection.
pub fn metrics(addr: SocketAddr) -> String {
    let response = fresh_get(addr, "/metrics");
    assert_eq!(response.status, 200, "{response:?}");
    String::from_utf8_lossy(&response.body).into_owned()
}

/// The value of the unlabelled series `name` in a `/metrics` text.
pub fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|value| value.trim().parse().ok())
}

/// Waits until the series `name` satisfies `wanted`; returns its value.
pub fn wait_metric(addr: SocketAddr, name: &str, wanted: impl Fn(f64) -> bool) -> f64 {
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        let text = metrics(addr);
        if let Some(value) = metric(&text, name).filter(|value| wanted(*value)) {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "{name} never reached the expected value; last /metrics:\n{text}"
        );
        thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until `/readyz` at `admin` reports the database `state` (`up`,
/// `busy`, `down`); returns the answer. Readiness itself does not follow
/// the database: the caller asserts what it should be.
pub fn wait_database(admin: SocketAddr, state: &str) -> RawResponse {
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        let response = fresh_get(admin, "/readyz");
        if response.json()["database"] == state {
            return response;
        }
        assert!(
            Instant::now() < deadline,
            "the database never turned {state}; last /readyz: {response:?} {}",
            String::from_utf8_lossy(&response.body)
        );
        thread::sleep(POLL_INTERVAL);
    }
}
