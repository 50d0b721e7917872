//! A minimal OTLP receiver for the traces benchmark: it takes every export,
//! decodes it and counts its spans, and answers success — nothing else, so
//! that it never sets the pace of the server that exports to it.
//!
//! One listener on `127.0.0.1:0` speaks both transports the service can
//! export over: OTLP/HTTP (`POST /v1/traces`, a protobuf body, answered 200
//! with an empty `ExportTraceServiceResponse`) and OTLP/gRPC (the generated
//! `TraceService`, over HTTP/2 with prior knowledge). Counts are kept per
//! transport, so two servers exporting over different transports are
//! counted apart. It runs on a thread and a runtime of its own, whose CPU
//! time the bench reads apart from the load generator's.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Context};
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::post;
use axum::serve::ListenerExt as _;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use prost::Message;
use serde::Serialize;
use tokio::sync::oneshot;
use tokio::time::Instant;

/// The largest export the receiver decodes. The SDK's batches of 512
/// spans are a few hundred KiB; tonic's own default (4 MiB) and axum's
/// body limit (2 MiB) are lifted so that a big batch is counted, not
/// refused and retried.
const MAX_EXPORT: usize = 64 * 1024 * 1024;

/// How often [`OtlpSink::settle`] looks at the counts.
const SETTLE_POLL: Duration = Duration::from_millis(25);

/// An OTLP transport, as the receiver counts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Transport {
    /// OTLP/HTTP with protobuf bodies.
    #[serde(rename = "http/protobuf")]
    HttpProtobuf,
    /// OTLP/gRPC.
    #[serde(rename = "grpc")]
    Grpc,
}

impl Transport {
    /// Its name in `OTEL_EXPORTER_OTLP_PROTOCOL`.
    pub fn protocol(self) -> &'static str {
        match self {
            Transport::HttpProtobuf => "http/protobuf",
            Transport::Grpc => "grpc",
        }
    }
}

/// What the receiver has taken over one transport so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Received {
    /// Export requests answered with success.
    pub exports: u64,
    /// Spans of kind server: one per request the server answered.
    pub server_spans: u64,
    /// Spans of kind client: the server's database calls.
    pub client_spans: u64,
    /// Every other span (internal, unspecified): background work such as
    /// the hit flush.
    pub other_spans: u64,
    /// The exports' encoded size (protobuf, uncompressed), bytes.
    pub bytes: u64,
    /// Exports that could not be decoded (answered 400): 0 unless the
    /// exporter and the receiver disagree on the protocol.
    pub undecodable: u64,
}

impl Received {
    /// Every span, whatever its kind.
    pub fn spans(&self) -> u64 {
        self.server_spans + self.client_spans + self.other_spans
    }

    /// What was received since `before`.
    pub fn since(&self, before: &Received) -> Received {
        Received {
            exports: self.exports - before.exports,
            server_spans: self.server_spans - before.server_spans,
            client_spans: self.client_spans - before.client_spans,
            other_spans: self.other_spans - before.other_spans,
            bytes: self.bytes - before.bytes,
            undecodable: self.undecodable - before.undecodable,
        }
    }
}

/// The counters of one transport.
#[derive(Debug, Default)]
struct Counters {
    exports: AtomicU64,
    server_spans: AtomicU64,
    client_spans: AtomicU64,
    other_spans: AtomicU64,
    bytes: AtomicU64,
    undecodable: AtomicU64,
}

impl Counters {
    /// Counts one decoded export of `bytes`, span by span kind.
    fn count(&self, request: &ExportTraceServiceRequest, bytes: usize) {
        let (mut server, mut client, mut other) = (0, 0, 0);
        let spans = request
            .resource_spans
            .iter()
            .flat_map(|resource| &resource.scope_spans)
            .flat_map(|scope| &scope.spans);
        for span in spans {
            match SpanKind::try_from(span.kind) {
                Ok(SpanKind::Server) => server += 1,
                Ok(SpanKind::Client) => client += 1,
                _ => other += 1,
            }
        }
        self.server_spans.fetch_add(server, Ordering::Relaxed);
        self.client_spans.fetch_add(client, Ordering::Relaxed);
        self.other_spans.fetch_add(other, Ordering::Relaxed);
        self.bytes.fetch_add(bytes as u64, Ordering::Relaxed);
        self.exports.fetch_add(1, Ordering::Relaxed);
    }

    fn snapshot(&self) -> Received {
        Received {
            exports: self.exports.load(Ordering::Relaxed),
            server_spans: self.server_spans.load(Ordering::Relaxed),
            client_spans: self.client_spans.load(Ordering::Relaxed),
            other_spans: self.other_spans.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            undecodable: self.undecodable.load(Ordering::Relaxed),
        }
    }
}

/// The counters of both transports, shared by the handlers and the bench.
#[derive(Debug, Default)]
struct Counts {
    http: Counters,
    grpc: Counters,
}

impl Counts {
    fn of(&self, transport: Transport) -> &Counters {
        match transport {
            Transport::HttpProtobuf => &self.http,
            Transport::Grpc => &self.grpc,
        }
    }
}

/// A running receiver. Dropping it stops it: its runtime, and with it every
/// connection, is dropped and its thread joined.
#[derive(Debug)]
pub struct OtlpSink {
    /// Where it listens: the base URL an exporter is given is
    /// `http://{addr}` for either transport.
    pub addr: SocketAddr,
    counts: Arc<Counts>,
    /// Its thread's id, whose CPU time `/proc/self/task/TID/stat` holds.
    tid: i32,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl OtlpSink {
    /// Starts a receiver on `127.0.0.1:0`, on a thread of its own (which
    /// inherits the caller's CPU affinity).
    ///
    /// # Errors
    /// If it cannot bind or start its thread or runtime.
    pub fn start() -> anyhow::Result<OtlpSink> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")
            .context("the OTLP receiver cannot bind 127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let counts = Arc::new(Counts::default());
        let (stop, stopped) = oneshot::channel();
        let (started, tid) = std::sync::mpsc::sync_channel(1);
        let app = router(Arc::clone(&counts));
        let thread = std::thread::Builder::new()
            .name("otlp sink".into())
            .spawn(move || {
                let _ = started.send(nix::unistd::gettid().as_raw());
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime,
                    Err(error) => {
                        eprintln!("load: the OTLP receiver cannot start its runtime: {error}");
                        return;
                    }
                };
                runtime.block_on(async move {
                    let listener = match tokio::net::TcpListener::from_std(listener) {
                        Ok(listener) => listener,
                        Err(error) => {
                            eprintln!("load: the OTLP receiver cannot listen: {error}");
                            return;
                        }
                    };
                    // A gRPC answer is written in pieces (headers, message,
                    // trailers): without TCP_NODELAY the last waits for the
                    // exporter's delayed ACK, some 40 ms an export, and the
                    // receiver, not the server, sets the pace. Collectors
                    // set it (Go's net package does by default).
                    let listener = listener.tap_io(|tcp| {
                        let _ = tcp.set_nodelay(true);
                    });
                    // Not graceful: the bench stops it after every exporter
                    // has exited.
                    tokio::select! {
                        served = axum::serve(listener, app) => {
                            if let Err(error) = served {
                                eprintln!("load: the OTLP receiver stopped: {error}");
                            }
                        }
                        _ = stopped => {}
                    }
                });
            })
            .context("cannot start the OTLP receiver's thread")?;
        let tid = tid
            .recv()
            .map_err(|_| anyhow!("the OTLP receiver's thread ended at start"))?;
        Ok(OtlpSink {
            addr,
            counts,
            tid,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// The URL to give an exporter as `OTEL_EXPORTER_OTLP_ENDPOINT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// What it has taken over `transport` so far.
    pub fn received(&self, transport: Transport) -> Received {
        self.counts.of(transport).snapshot()
    }

    /// Waits until nothing more has arrived over `transport` for `quiet`
    /// (the exporter's batch has been emptied), for at most `bound`; returns
    /// what it has taken by then.
    pub async fn settle(&self, transport: Transport, quiet: Duration, bound: Duration) -> Received {
        let deadline = Instant::now() + bound;
        let mut last = self.received(transport);
        let mut since = Instant::now();
        while Instant::now() < deadline && since.elapsed() < quiet {
            tokio::time::sleep(SETTLE_POLL).await;
            let now = self.received(transport);
            if now != last {
                last = now;
                since = Instant::now();
            }
        }
        last
    }

    /// The CPU time (user + system) its thread has used.
    pub fn cpu_time(&self) -> Option<Duration> {
        crate::replica::cpu_time(&format!("self/task/{}", self.tid))
    }
}

impl Drop for OtlpSink {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// OTLP/HTTP at `POST /v1/traces`, and OTLP/gRPC's `TraceService` at its
/// path, on one router.
fn router(counts: Arc<Counts>) -> axum::Router {
    let grpc = TraceServiceServer::new(GrpcSink {
        counts: Arc::clone(&counts),
    })
    .max_decoding_message_size(MAX_EXPORT);
    tonic::service::Routes::new(grpc).into_axum_router().route(
        "/v1/traces",
        post(http_export)
            .with_state(counts)
            .layer(DefaultBodyLimit::max(MAX_EXPORT)),
    )
}

/// One OTLP/HTTP export: decoded and counted, answered 200 with an empty
/// `ExportTraceServiceResponse` (no partial success), or 400 if it does not
/// decode.
async fn http_export(State(counts): State<Arc<Counts>>, body: Bytes) -> impl IntoResponse {
    let counters = counts.of(Transport::HttpProtobuf);
    let bytes = body.len();
    match ExportTraceServiceRequest::decode(body) {
        Ok(request) => {
            counters.count(&request, bytes);
            let answer = ExportTraceServiceResponse::default().encode_to_vec();
            (
                StatusCode::OK,
                [(header::CONTENT_TYPE, "application/x-protobuf")],
                answer,
            )
        }
        Err(_) => {
            counters.undecodable.fetch_add(1, Ordering::Relaxed);
            (
                StatusCode::BAD_REQUEST,
                [(header::CONTENT_TYPE, "text/plain")],
                b"undecodable ExportTraceServiceRequest".to_vec(),
            )
        }
    }
}

/// The gRPC `TraceService`: tonic has decoded the request; it is counted
/// and answered with an empty response.
struct GrpcSink {
    counts: Arc<Counts>,
}

#[tonic::codegen::async_trait]
impl TraceService for GrpcSink {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        // tonic keeps no count of the bytes it decoded: the message's own
        // encoded length, a walk over it, far cheaper than the decoding.
        let request = request.get_ref();
        self.counts
            .of(Transport::Grpc)
            .count(request, request.encoded_len());
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

#[cfg(test)]
mod tests {
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};

    use super::*;
    use crate::raw::RawConn;

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

    // The HTTP transport end to end, over a socket, as the exporter posts
    // it; the gRPC one shares the counting.
    #[tokio::test]
    async fn an_http_export_is_counted_by_span_kind_and_answered_200() {
        let sink = OtlpSink::start().expect("starts");
        let body =
            export(&[SpanKind::Server, SpanKind::Client, SpanKind::Internal]).encode_to_vec();
        let head = format!(
            "POST /v1/traces HTTP/1.1\r\nHost: sink\r\nContent-Type: application/x-protobuf\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        let mut request = head.into_bytes();
        request.extend_from_slice(&body);
        let mut conn = RawConn::connect(sink.addr).await.expect("connects");
        let answer = conn.exchange(&request).await.expect("answers");
        assert_eq!(answer.status, 200);
        let received = sink.received(Transport::HttpProtobuf);
        assert_eq!(
            received,
            Received {
                exports: 1,
                server_spans: 1,
                client_spans: 1,
                other_spans: 1,
                bytes: body.len() as u64,
                undecodable: 0,
            }
        );
        assert_eq!(sink.received(Transport::Grpc), Received::default());
        let garbage =
            b"POST /v1/traces HTTP/1.1\r\nHost: sink\r\nContent-Length: 3\r\n\r\n\xff\xff\xff";
        let answer = conn.exchange(garbage).await.expect("answers");
        assert_eq!(answer.status, 400);
        assert_eq!(sink.received(Transport::HttpProtobuf).undecodable, 1);
        assert!(sink.cpu_time().is_some());
    }

    // The gRPC transport: HTTP/2 with prior knowledge on the same port,
    // counted apart from OTLP/HTTP.
    #[tokio::test]
    async fn a_grpc_export_is_counted_apart() {
        use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;
        let sink = OtlpSink::start().expect("starts");
        let mut client = TraceServiceClient::connect(sink.endpoint())
            .await
            .expect("connects");
        let request = export(&[SpanKind::Server, SpanKind::Server]);
        let bytes = request.encoded_len() as u64;
        client.export(request).await.expect("exports");
        let received = sink.received(Transport::Grpc);
        assert_eq!((received.exports, received.server_spans), (1, 2));
        assert_eq!(received.bytes, bytes);
        assert_eq!(sink.received(Transport::HttpProtobuf), Received::default());
    }
}
