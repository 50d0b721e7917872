//! The receiver's counting, in both modes, over both transports.

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;

fn export(kinds: &[SpanKind]) -> ExportTraceServiceRequest {
    let spans = kinds
        .iter()
        .map(|kind| Span {
            kind: *kind as i32,
            ..Span::default()
        })
        .collect();
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            scope_spans: vec![ScopeSpans {
                spans,
                ..ScopeSpans::default()
            }],
            ..ResourceSpans::default()
        }],
    }
}

/// One OTLP/HTTP export of `body` on a connection of its own; the
/// answer's status line.
async fn post(receiver: &Receiver, body: &[u8]) -> String {
    let mut tcp = tokio::net::TcpStream::connect(receiver.addr())
        .await
        .expect("connects");
    let head = format!(
        "POST /v1/traces HTTP/1.1\r\nHost: otlp\r\nConnection: close\r\nContent-Type: {PROTOBUF}\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    tcp.write_all(head.as_bytes()).await.expect("sends");
    tcp.write_all(body).await.expect("sends");
    let mut answer = Vec::new();
    tcp.read_to_end(&mut answer).await.expect("reads");
    let answer = String::from_utf8_lossy(&answer).into_owned();
    answer.lines().next().unwrap_or_default().to_owned()
}

// The load harness's receiver, over HTTP: counted by span kind and
// size, answered 200, a body that does not decode counted apart, and
// nothing kept but the counts.
#[tokio::test]
async fn a_counting_receiver_counts_an_http_export_by_span_kind_and_keeps_no_span() {
    let receiver = Receiver::counting(Protocol::HttpProtobuf).expect("starts");
    let body = export(&[SpanKind::Server, SpanKind::Client, SpanKind::Internal]).encode_to_vec();
    assert_eq!(post(&receiver, &body).await, "HTTP/1.1 200 OK");
    assert_eq!(
        receiver.received(),
        Received {
            exports: 1,
            server_spans: 1,
            client_spans: 1,
            other_spans: 1,
            bytes: body.len() as u64,
            undecodable: 0,
        }
    );
    assert_eq!((receiver.requests(), receiver.exports()), (1, 1));
    assert!(receiver.spans().is_empty() && receiver.request_headers().is_empty());
    assert_eq!(
        post(&receiver, b"\xff\xff\xff").await,
        "HTTP/1.1 400 Bad Request"
    );
    assert_eq!(receiver.received().undecodable, 1);
    assert!(receiver.thread_id() > 0);
}

// Over gRPC the size is the message's encoded length; a receiver that
// keeps spans counts them just the same.
#[tokio::test]
async fn a_grpc_export_is_counted_whether_the_spans_are_kept_or_not() {
    for receiver in [
        Receiver::counting(Protocol::Grpc).expect("starts"),
        Receiver::start(Protocol::Grpc, Behaviour::Answer),
    ] {
        let mut client = TraceServiceClient::connect(receiver.endpoint())
            .await
            .expect("connects");
        let request = export(&[SpanKind::Server, SpanKind::Server]);
        let bytes = request.encoded_len() as u64;
        client.export(request).await.expect("exports");
        let received = receiver.received();
        assert_eq!((received.exports, received.server_spans), (1, 2));
        assert_eq!(received.bytes, bytes);
    }
}
