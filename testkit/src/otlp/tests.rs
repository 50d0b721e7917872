//! The receiver's counting, in both modes, over both transports.

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
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

/// An export with something of everything: two resources, scopes with
/// and without spans, spans of every kind, one of a kind the protocol does
/// not know and one with none, attributes, events and statuses.
fn everything() -> ExportTraceServiceRequest {
    use opentelemetry_proto::tonic::resource::v1::Resource;
    use opentelemetry_proto::tonic::trace::v1::span::Event;
    use opentelemetry_proto::tonic::trace::v1::Status;

    let attribute = |key: &str, value: &str| KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue {
            value: Some(Any::StringValue(value.to_owned())),
        }),
        ..KeyValue::default()
    };
    let span = |kind: i32, name: &str| Span {
        trace_id: vec![7; 16],
        span_id: vec![9; 8],
        name: name.to_owned(),
        kind,
        start_time_unix_nano: 1_764_000_000_000_000_000,
        end_time_unix_nano: 1_764_000_000_000_500_000,
        attributes: vec![attribute("url.path", "/a-code"), attribute("k", "")],
        events: vec![Event {
            name: "retry".to_owned(),
            ..Event::default()
        }],
        status: Some(Status {
            code: 2,
            message: "x".repeat(200),
        }),
        flags: 0x301,
        ..Span::default()
    };
    let scope = |spans| ScopeSpans {
        spans,
        schema_url: "https://opentelemetry.io/schemas/1.30.0".to_owned(),
        ..ScopeSpans::default()
    };
    let resource = |scope_spans| ResourceSpans {
        resource: Some(Resource {
            attributes: vec![attribute("service.name", "lameduck")],
            ..Resource::default()
        }),
        scope_spans,
        ..ResourceSpans::default()
    };
    ExportTraceServiceRequest {
        resource_spans: vec![
            resource(vec![
                scope(vec![span(2, "GET /{code}"), span(3, "SELECT links")]),
                scope(Vec::new()),
                scope(vec![span(1, "flush"), span(0, ""), span(99, "new kind")]),
            ]),
            resource(Vec::new()),
            resource(vec![scope(vec![span(2, "GET /"), span(5, "consume")])]),
        ],
    }
}

// The counting receiver counts an export from its bytes as decoding it
// would count it: the same spans of each kind where the bytes are whole,
// and refused wherever they are cut short and decoding fails.
#[test]
fn counting_from_the_bytes_counts_as_decoding_does() {
    let bytes = everything().encode_to_vec();
    let whole = Export::counted(&bytes).expect("the whole export counts");
    assert_eq!(
        (whole.kinds.server, whole.kinds.client, whole.kinds.other),
        (2, 1, 4)
    );
    assert_eq!(whole.bytes, bytes.len());
    let mut refused = 0;
    for len in 0..=bytes.len() {
        let cut = &bytes[..len];
        let decoded = ExportTraceServiceRequest::decode(cut)
            .ok()
            .map(|request| Export::decoded(request, len).kinds);
        let counted = Export::counted(cut).map(|export| export.kinds);
        assert_eq!(counted, decoded, "the first {len} bytes");
        refused += usize::from(counted.is_none());
    }
    assert!(refused > bytes.len() / 2, "{refused} of {}", bytes.len());
    // A key of field 0, a group, a varint longer than 64 bits, a known
    // field of the wrong type: refused both ways. A field the protocol
    // does not know: skipped both ways.
    let long = b"\x28\xff\xff\xff\xff\xff\xff\xff\xff\xff\x7f";
    for bad in [&b"\x00\x00"[..], b"\x0b\x0c", long, b"\x08\x01"] {
        assert!(ExportTraceServiceRequest::decode(bad).is_err(), "{bad:?}");
        assert!(Export::counted(bad).is_none(), "{bad:?}");
    }
    let unknown = b"\x28\x01\x32\x00";
    assert!(ExportTraceServiceRequest::decode(&unknown[..]).is_ok());
    assert_eq!(
        Export::counted(unknown).map(|e| e.kinds),
        Some(Kinds::default())
    );
}
