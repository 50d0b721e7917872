//! The same timeline on a Unix socket: served through the `Listener` trait,
//! drained on the trigger, and clients queued in the socket's backlog when
//! accepting stops are answered, not refused.

use std::path::PathBuf;
use std::time::Duration;

use axum::routing::get;
use axum::Router;
use lameduck_lifecycle::{DrainOutcome, Lifecycle, ServeConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};

/// A socket path of this test's own, removed when dropped.
struct SocketPath(PathBuf);

impl SocketPath {
    fn new(name: &str) -> SocketPath {
        let path =
            std::env::temp_dir().join(format!("lifecycle-{name}-{}.sock", std::process::id()));
        let _ = std::fs::remove_file(&path);
        SocketPath(path)
    }
}

impl Drop for SocketPath {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

async fn get_ok(stream: &mut UnixStream) -> String {
    stream
        .write_all(b"GET /ok HTTP/1.1\r\nhost: unix\r\n\r\n")
        .await
        .expect("send");
    let mut answer = vec![0u8; 1024];
    let n = stream.read(&mut answer).await.expect("read");
    String::from_utf8_lossy(&answer[..n]).into_owned()
}

#[tokio::test]
async fn a_unix_socket_is_served_and_its_backlog_answered_at_the_drain() {
    const WAITING: usize = 50;
    let path = SocketPath::new("backlog");
    let listener = UnixListener::bind(&path.0).expect("bind");
    let lifecycle = Lifecycle::new();
    let trigger = lifecycle.trigger_handle();
    let router = Router::new().route("/ok", get(|| async { "ok" }));
    let config = ServeConfig {
        drain_delay: Duration::ZERO,
        // One connection at a time: the others wait in the backlog.
        max_connections: 1,
        ..ServeConfig::default()
    };
    let serving = tokio::spawn(lifecycle.serve(listener, router).config(config).run());

    let mut holder = UnixStream::connect(&path.0).await.expect("connect");
    let answer = get_ok(&mut holder).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let mut waiting = Vec::new();
    for _ in 0..WAITING {
        let mut stream = UnixStream::connect(&path.0).await.expect("queue");
        stream
            .write_all(b"GET /ok HTTP/1.1\r\nhost: unix\r\n\r\n")
            .await
            .expect("send");
        waiting.push(stream);
    }
    trigger.trigger("test");
    for (i, mut stream) in waiting.into_iter().enumerate() {
        let mut answer = String::new();
        stream
            .read_to_string(&mut answer)
            .await
            .unwrap_or_else(|error| panic!("client {i}: {error}"));
        assert!(answer.starts_with("HTTP/1.1 200"), "client {i}: {answer:?}");
    }
    let report = serving.await.expect("run");
    assert_eq!(report.drain.outcome, DrainOutcome::Clean);
    assert_eq!(report.drain.backlog_accepted, WAITING);
    assert!(report.is_clean());
}
