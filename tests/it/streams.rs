//! Long-lived connections end on time (axum #3003, hyper #2787): at the
//! drain, every SSE stream gets `event: shutdown` and every websocket a
//! close frame 1001, and the process exits without waiting for streams that
//! would otherwise never end. Real binary, real SIGTERM.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use lameduck_testkit::binary::LameduckProcess;
use nix::sys::signal::Signal;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, Barrier};
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::Message;

const SSE_CLIENTS: usize = 500;
const WS_CLIENTS: usize = 500;
const DRAIN_DELAY: Duration = Duration::from_secs(2);
/// Correctness bound on "on time": the goodbye must come at the drain, not
/// at some deadline. Generous for a loaded 2-core machine.
const MARGIN: Duration = Duration::from_secs(3);

#[derive(Debug)]
enum Goodbye {
    Sse { retry: bool },
    WebSocket { code: Option<CloseCode> },
    Missing(String),
}

async fn sse_client(addr: SocketAddr, ready: &Barrier) -> Goodbye {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    stream
        .write_all(
            b"GET /api/links/live/events HTTP/1.1\r\nhost: t\r\naccept: text/event-stream\r\n\r\n",
        )
        .await
        .expect("request");
    let mut lines = BufReader::new(stream).lines();
    let mut event = String::new();
    let mut saw_first = false;
    let mut retry = false;
    loop {
        let line = match lines.next_line().await {
            Ok(Some(line)) => line,
            Ok(None) => return Goodbye::Missing(format!("EOF after event {event:?}")),
            Err(error) => return Goodbye::Missing(error.to_string()),
        };
        if let Some(name) = line.strip_prefix("event: ") {
            event = name.to_owned();
        } else if line.starts_with("retry: ") {
            retry = true;
        } else if line.starts_with("data: ") && event == "hits" && !saw_first {
            saw_first = true;
            ready.wait().await;
        } else if line.is_empty() && event == "shutdown" {
            return Goodbye::Sse { retry };
        }
    }
}

async fn ws_client(addr: SocketAddr, ready: &Barrier) -> Goodbye {
    let (mut socket, _) =
        tokio_tungstenite::connect_async(format!("ws://{addr}/api/links/live/ws"))
            .await
            .expect("websocket handshake");
    match socket.next().await {
        Some(Ok(Message::Text(count))) => assert!(count.parse::<i64>().is_ok(), "{count}"),
        other => return Goodbye::Missing(format!("first message: {other:?}")),
    }
    ready.wait().await;
    while let Some(message) = socket.next().await {
        match message {
            Ok(Message::Close(frame)) => {
                let _ = socket.close(None).await;
                return Goodbye::WebSocket {
                    code: frame.map(|f| f.code),
                };
            }
            Ok(_) => {}
            Err(error) => return Goodbye::Missing(error.to_string()),
        }
    }
    let _ = socket.send(Message::Close(None)).await;
    Goodbye::Missing("stream ended without a close frame".to_owned())
}

// A thousand streams that would never end on their own: SIGTERM makes each
// one say goodbye at the drain, and the process exits right after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_stream_and_websocket_gets_its_goodbye_at_the_drain_and_the_process_exits() {
    let delay = format!("{}s", DRAIN_DELAY.as_secs());
    let mut server =
        LameduckProcess::start(&["--drain-delay", &delay, "--max-connections", "5000"], &[]);
    let addr = server.addr();
    let created = reqwest::Client::new()
        .post(format!("http://{addr}/api/links"))
        .json(&serde_json::json!({ "url": "https://example.com/", "code": "live" }))
        .send()
        .await
        .expect("create");
    assert_eq!(created.status(), 201);

    let ready = std::sync::Arc::new(Barrier::new(SSE_CLIENTS + WS_CLIENTS + 1));
    let (done, mut goodbyes) = mpsc::unbounded_channel();
    for i in 0..SSE_CLIENTS + WS_CLIENTS {
        let (ready, done) = (ready.clone(), done.clone());
        tokio::spawn(async move {
            let goodbye = if i < SSE_CLIENTS {
                sse_client(addr, &ready).await
            } else {
                ws_client(addr, &ready).await
            };
            let _ = done.send((goodbye, Instant::now()));
        });
    }
    drop(done);
    tokio::time::timeout(Duration::from_secs(60), ready.wait())
        .await
        .expect("every stream open");

    let signalled = Instant::now();
    server.signal(Signal::SIGTERM);
    let mut sse = 0;
    let mut websockets = 0;
    while let Some((goodbye, at)) = tokio::time::timeout(Duration::from_secs(30), goodbyes.recv())
        .await
        .expect("every client answered")
    {
        let after = at - signalled;
        assert!(
            after >= DRAIN_DELAY - Duration::from_millis(100),
            "goodbye before the drain: {after:?}"
        );
        assert!(after <= DRAIN_DELAY + MARGIN, "goodbye late: {after:?}");
        match goodbye {
            Goodbye::Sse { retry } => {
                assert!(retry, "the shutdown event carries a retry hint");
                sse += 1;
            }
            Goodbye::WebSocket { code } => {
                assert_eq!(code, Some(CloseCode::Away), "close code 1001");
                websockets += 1;
            }
            Goodbye::Missing(why) => panic!("a client got no goodbye: {why}"),
        }
    }
    assert_eq!((sse, websockets), (SSE_CLIENTS, WS_CLIENTS));

    let status = server
        .wait_exit(MARGIN + DRAIN_DELAY)
        .expect("exited on its own");
    assert_eq!(status.code(), Some(0), "{}", server.log_text());
    assert!(signalled.elapsed() < DRAIN_DELAY + 2 * MARGIN);
}
