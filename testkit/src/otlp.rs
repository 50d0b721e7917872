//! An OTLP collector inside the test process, for the trace tests: a real
//! OTLP/gRPC or OTLP/HTTP (protobuf) server built from the OpenTelemetry
//! protocol's own definitions, which records the spans a real exporter sends.
//!
//! [`Receiver::start`] binds `127.0.0.1:0` before it returns (an exporter may
//! connect at once: the kernel queues the connection until the server
//! accepts it) and serves on a thread of its own with its own tokio runtime,
//! so it works the same under a synchronous `#[test]` driving a child process
//! and under an async one. Dropping it stops the runtime, and with it every
//! connection.
//!
//! What arrives is decoded into plain values ([`ReceivedSpan`]), so a test
//! asserts on names, ids, kinds, statuses and attributes, never on prost
//! types. [`Behaviour::Slow`] makes a collector that holds every export;
//! [`unused_endpoint`] is one that is down; [`Receiver::start_tls`] one at
//! an `https://` endpoint, its certificate signed by a test CA.
//!
//! Every receiver also counts what it took ([`Received`]: exports, spans by
//! kind, bytes). [`Receiver::counting`] starts one that does nothing else:
//! no message decoded, its spans counted from the bytes as they arrived
//! ([`scan`]), no header kept, so that the load harness can run it beside a
//! server under measurement without it setting the pace.
//!
//! Both transports are one axum router (the gRPC service is a tower service
//! inside it) served connection by connection by hyper-util's auto builder:
//! HTTP/1.1 or HTTP/2 by ALPN over TLS, by the client's preface in
//! cleartext (gRPC's HTTP/2 with prior knowledge).
//!
//! Every wait here is bounded.

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, HeaderMap, StatusCode as HttpStatus};
use axum::response::{IntoResponse, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue};
use prost::Message;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde::Serialize;
use serde_json::Value;
use tokio::sync::oneshot;
use tokio_rustls::TlsAcceptor;

use super::tls::TestCa;
use scan::{Kinds, RawCodec};

mod scan;

/// The only body OTLP/HTTP requests here may carry (OTLP/JSON is refused).
const PROTOBUF: &str = "application/x-protobuf";

/// How long dropping a [`Receiver`] waits for its thread to end.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// The largest export the receiver decodes. The SDK's batches of 512
/// spans are a few hundred KiB; tonic's own default (4 MiB) and axum's
/// body limit (2 MiB) are lifted so that a big batch is counted, not
/// refused and retried.
const MAX_EXPORT: usize = 64 * 1024 * 1024;

/// The OTLP transports, as `OTEL_EXPORTER_OTLP_PROTOCOL` names them (also
/// in a report's JSON).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Protocol {
    /// OTLP/gRPC (HTTP/2).
    #[serde(rename = "grpc")]
    Grpc,
    /// OTLP/HTTP with protobuf bodies, `POST /v1/traces`.
    #[serde(rename = "http/protobuf")]
    HttpProtobuf,
}

impl Protocol {
    /// The value of `OTEL_EXPORTER_OTLP_PROTOCOL` that selects it.
    pub fn env_value(&self) -> &'static str {
        match self {
            Protocol::Grpc => "grpc",
            Protocol::HttpProtobuf => "http/protobuf",
        }
    }
}

/// How the receiver answers an export.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Behaviour {
    /// At once, with success.
    Answer,
    /// With success after holding the export this long. Its spans are
    /// recorded only when it is answered: an exporter that gave up first
    /// closes its stream or connection, the server drops the held handler,
    /// and the export shows in [`Receiver::requests`] but never in
    /// [`Receiver::spans`] or [`Receiver::exports`].
    Slow(Duration),
}

/// What a receiver keeps of an export.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Keep {
    /// Its spans decoded into [`ReceivedSpan`]s and its headers, for a
    /// test's assertions; and the counts.
    Spans,
    /// The counts alone ([`Received`]).
    Counts,
}

/// A span's kind and its status code: the protocol's own enums, plain ones.
pub use opentelemetry_proto::tonic::trace::v1::{span::SpanKind, status::StatusCode};

/// What a receiver has taken so far, counted as each export is answered
/// (in the load harness's report, per transport).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Received {
    /// Export requests answered with success.
    pub exports: u64,
    /// Spans of kind server: one per request a server answered.
    pub server_spans: u64,
    /// Spans of kind client: a server's database calls.
    pub client_spans: u64,
    /// Every other span (internal, unspecified): background work such as
    /// the hit flush.
    pub other_spans: u64,
    /// The exports' encoded size (protobuf, uncompressed), bytes.
    pub bytes: u64,
    /// OTLP/HTTP exports that could not be decoded (answered 400): 0 unless
    /// the exporter and the receiver disagree on the protocol.
    pub undecodable: u64,
}

impl Received {
    /// Every span, whatever its kind.
    pub fn spans(&self) -> u64 {
        self.server_spans + self.client_spans + self.other_spans
    }

    /// What was received since `before`, an earlier count of the same
    /// receiver.
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

    /// Counts one answered export.
    fn count(&mut self, export: &Export) {
        self.server_spans += export.kinds.server;
        self.client_spans += export.kinds.client;
        self.other_spans += export.kinds.other;
        self.bytes += export.bytes as u64;
        self.exports += 1;
    }
}

/// One span as received, with what its resource and scope said about it.
/// Attribute values are JSON: strings, booleans, integers (`as_i64`),
/// doubles (`as_f64`), arrays and maps as such, bytes as lowercase hex.
#[derive(Clone, Debug, PartialEq)]
pub struct ReceivedSpan {
    /// 32 lowercase hex digits.
    pub trace_id: String,
    /// 16 lowercase hex digits.
    pub span_id: String,
    /// `None` for a root span.
    pub parent_span_id: Option<String>,
    /// The span's name.
    pub name: String,
    /// An unknown kind or code reads as `Unspecified` or `Unset`.
    pub kind: SpanKind,
    /// Its status: unset, ok or error.
    pub status_code: StatusCode,
    /// The status's description (an error's).
    pub status_message: String,
    /// The span's attributes, by key.
    pub attributes: BTreeMap<String, Value>,
    /// Its events, in order.
    pub events: Vec<ReceivedEvent>,
    /// When it started, in nanoseconds since the Unix epoch.
    pub start_unix_nanos: u64,
    /// When it ended, likewise.
    pub end_unix_nanos: u64,
    /// The resource's `service.name`.
    pub service_name: Option<String>,
    /// Every attribute of the resource.
    pub resource: BTreeMap<String, Value>,
    /// The instrumentation scope (the tracer's name).
    pub scope_name: String,
}

/// An event of a span (what the `tracing` bridge makes of a log line).
#[derive(Clone, Debug, PartialEq)]
pub struct ReceivedEvent {
    /// The event's name.
    pub name: String,
    /// Its attributes, by key.
    pub attributes: BTreeMap<String, Value>,
}

impl ReceivedSpan {
    /// A string attribute.
    pub fn attr_str(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).and_then(Value::as_str)
    }

    /// An integer attribute.
    pub fn attr_i64(&self, key: &str) -> Option<i64> {
        self.attributes.get(key).and_then(Value::as_i64)
    }

    /// A boolean attribute.
    pub fn attr_bool(&self, key: &str) -> Option<bool> {
        self.attributes.get(key).and_then(Value::as_bool)
    }
}

/// The env vars that point a child's OTLP exporter at `endpoint` over
/// `protocol`, with a batch delay short enough that spans arrive while the
/// child runs (the SDK's default is 5 s).
pub fn envs(protocol: Protocol, endpoint: &str) -> Vec<(&'static str, String)> {
    vec![
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.to_owned()),
        (
            "OTEL_EXPORTER_OTLP_PROTOCOL",
            protocol.env_value().to_owned(),
        ),
        ("OTEL_BSP_SCHEDULE_DELAY", "100".to_owned()),
    ]
}

/// An endpoint where nothing listens: a collector that is down. The port was
/// free a moment ago; another process could take it, but not while a test
/// on loopback runs for a few seconds, in practice.
pub fn unused_endpoint() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a port to find a free one");
    let addr = listener
        .local_addr()
        .expect("a bound listener has an address");
    format!("http://{addr}")
}

/// An OTLP trace collector serving on loopback until dropped.
pub struct Receiver {
    protocol: Protocol,
    addr: SocketAddr,
    /// Whether it serves TLS: its endpoint is `https://`.
    tls: bool,
    /// Its thread's id, whose CPU time `/proc/self/task/TID/stat` holds.
    tid: i32,
    shared: Arc<Shared>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

/// How a receiver is started: its transport, how it answers, what it
/// keeps, and whether it serves TLS.
struct Setup {
    protocol: Protocol,
    behaviour: Behaviour,
    keep: Keep,
    tls: Option<TlsAcceptor>,
}

impl Receiver {
    /// Starts a receiver speaking `protocol` on `127.0.0.1:0`.
    pub fn start(protocol: Protocol, behaviour: Behaviour) -> Receiver {
        Receiver::start_on(protocol, behaviour, "127.0.0.1:0")
    }

    /// Starts a receiver on `addr`: a collector coming up where the
    /// service was told it is ([`unused_endpoint`]'s address).
    pub fn start_on(protocol: Protocol, behaviour: Behaviour, addr: &str) -> Receiver {
        let setup = Setup {
            protocol,
            behaviour,
            keep: Keep::Spans,
            tls: None,
        };
        Receiver::start_with(setup, addr).expect("start the OTLP receiver")
    }

    /// Starts a receiver speaking `protocol` on `127.0.0.1:0` that answers
    /// every export at once and only counts it ([`Receiver::received`]):
    /// [`Receiver::spans`] and [`Receiver::request_headers`] stay empty.
    /// It is the load harness's: cheap enough to run beside a server under
    /// measurement.
    ///
    /// # Errors
    /// If it cannot bind, or start its runtime or thread.
    pub fn counting(protocol: Protocol) -> std::io::Result<Receiver> {
        let setup = Setup {
            protocol,
            behaviour: Behaviour::Answer,
            keep: Keep::Counts,
            tls: None,
        };
        Receiver::start_with(setup, "127.0.0.1:0")
    }

    /// Starts a receiver on `127.0.0.1:0` that serves TLS only, with a
    /// certificate `ca` signed for `localhost` and `127.0.0.1`, offering
    /// HTTP/2 and HTTP/1.1 by ALPN (tonic's client insists on `h2`).
    pub fn start_tls(protocol: Protocol, behaviour: Behaviour, ca: &TestCa) -> Receiver {
        let leaf = ca.leaf(1);
        let chain = CertificateDer::pem_slice_iter(leaf.cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .expect("the leaf's certificate");
        let key = PrivateKeyDer::from_pem_slice(leaf.key_pem.as_bytes()).expect("the leaf's key");
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("protocol versions")
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .expect("the receiver's certificate");
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let setup = Setup {
            protocol,
            behaviour,
            keep: Keep::Spans,
            tls: Some(TlsAcceptor::from(Arc::new(config))),
        };
        Receiver::start_with(setup, "127.0.0.1:0").expect("start the OTLP receiver")
    }

    fn start_with(setup: Setup, addr: &str) -> std::io::Result<Receiver> {
        let Setup {
            protocol,
            behaviour,
            keep,
            tls,
        } = setup;
        let listener = TcpListener::bind(addr)?;
        let addr = listener.local_addr()?;
        // tokio needs a non-blocking listener.
        listener.set_nonblocking(true)?;
        // Built here rather than on its thread, so that a failure shows in the test.
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let shared = Arc::new(Shared::default());
        let sink = Sink {
            shared: Arc::clone(&shared),
            behaviour,
            keep,
        };
        let (stop, stopped) = oneshot::channel();
        let (started, tid) = std::sync::mpsc::sync_channel(1);
        let https = tls.is_some();
        let serve = move || {
            let _ = started.send(nix::unistd::gettid().as_raw());
            runtime.block_on(async move {
                tokio::select! {
                    served = serve(listener, protocol, sink, tls) => if let Err(e) = served {
                        eprintln!("the OTLP receiver on {addr} failed: {e}");
                    },
                    _ = stopped => {}
                }
            });
            // The runtime drops here, and every connection with it, held
            // exports included: a stopped collector answers nothing.
        };
        let thread = thread::Builder::new()
            .name(format!("otlp-receiver-{}", addr.port()))
            .spawn(serve)?;
        let tid = tid
            .recv()
            .map_err(|_| std::io::Error::other("the OTLP receiver's thread ended as it started"))?;
        Ok(Receiver {
            protocol,
            addr,
            tls: https,
            tid,
            shared,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT` (`https://` with TLS), the value of
    /// `OTEL_EXPORTER_OTLP_ENDPOINT`.
    pub fn endpoint(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    /// What to give an exporter's `with_endpoint`. The SDK's HTTP exporter
    /// appends `/v1/traces` to `OTEL_EXPORTER_OTLP_ENDPOINT` only; an
    /// endpoint set in code is the full URL.
    pub fn exporter_endpoint(&self) -> String {
        match self.protocol {
            Protocol::Grpc => self.endpoint(),
            Protocol::HttpProtobuf => format!("{}/v1/traces", self.endpoint()),
        }
    }

    /// The env vars a test passes to a child to export here ([`envs`]).
    pub fn envs(&self) -> Vec<(&'static str, String)> {
        envs(self.protocol, &self.endpoint())
    }

    /// Every span recorded so far, in arrival order.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.shared.lock().spans.clone()
    }

    /// Export requests answered (and recorded).
    pub fn exports(&self) -> usize {
        usize::try_from(self.shared.lock().received.exports).unwrap_or(usize::MAX)
    }

    /// What it has taken so far, counted.
    pub fn received(&self) -> Received {
        self.shared.lock().received
    }

    /// The id of the thread it serves on, whose CPU time
    /// `/proc/self/task/TID/stat` holds: what receiving costs the process
    /// it runs in.
    pub fn thread_id(&self) -> i32 {
        self.tid
    }

    /// Export requests that arrived and decoded, answered or not.
    pub fn requests(&self) -> usize {
        self.shared.lock().requests
    }

    /// Why each TLS handshake that failed did, in order: a client that does
    /// not trust the certificate ends it with an alert.
    pub fn handshake_failures(&self) -> Vec<String> {
        self.shared.lock().handshake_failures.clone()
    }

    /// The headers (gRPC: metadata) of each export request that arrived, in
    /// arrival order, names in lower case.
    pub fn request_headers(&self) -> Vec<BTreeMap<String, String>> {
        self.shared.lock().headers.clone()
    }

    /// Waits up to `timeout` until `pred` holds for the spans recorded so
    /// far, and returns them; on timeout, returns what there is, for the
    /// caller's assertion to show.
    pub fn wait_for(
        &self,
        timeout: Duration,
        pred: impl Fn(&[ReceivedSpan]) -> bool,
    ) -> Vec<ReceivedSpan> {
        let deadline = Instant::now() + timeout;
        let mut collected = self.shared.lock();
        while !pred(&collected.spans) {
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                break;
            };
            collected = self
                .shared
                .grew
                .wait_timeout(collected, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        collected.spans.clone()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        // The server may have ended on its own (it said why on stderr).
        let _ = self.stop.take().map(|stop| stop.send(()));
        let Some(thread) = self.thread.take() else {
            return;
        };
        let deadline = Instant::now() + STOP_TIMEOUT;
        while !thread.is_finished() && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(5));
        }
        if !thread.is_finished() {
            eprintln!(
                "the OTLP receiver on {} still runs after {STOP_TIMEOUT:?}; left behind",
                self.addr
            );
        } else if thread.join().is_err() && !thread::panicking() {
            panic!("the OTLP receiver on {} panicked", self.addr);
        }
    }
}

/// Accepts until the runtime stops, each connection served on a task of
/// its own, behind a TLS handshake when `tls` says so.
async fn serve(
    listener: TcpListener,
    protocol: Protocol,
    sink: Sink,
    tls: Option<TlsAcceptor>,
) -> Result<(), String> {
    let listener = tokio::net::TcpListener::from_std(listener).map_err(|e| e.to_string())?;
    let shared = Arc::clone(&sink.shared);
    let app = match protocol {
        Protocol::Grpc if sink.keep == Keep::Counts => axum::Router::new()
            .route(GRPC_EXPORT, axum::routing::post(grpc_count))
            .with_state(sink),
        Protocol::Grpc => {
            let grpc = TraceServiceServer::new(sink).max_decoding_message_size(MAX_EXPORT);
            tonic::service::Routes::new(grpc).into_axum_router()
        }
        Protocol::HttpProtobuf => axum::Router::new()
            .route("/v1/traces", axum::routing::post(http_export))
            .layer(DefaultBodyLimit::max(MAX_EXPORT))
            .with_state(sink),
    };
    loop {
        let (tcp, _) = listener.accept().await.map_err(|e| e.to_string())?;
        // A gRPC answer is written in pieces (headers, message, trailers):
        // without TCP_NODELAY the last waits for the exporter's delayed
        // ACK, some 40 ms an export, and the receiver, not the exporter,
        // sets the pace. Collectors set it (Go's net package does by
        // default).
        let _ = tcp.set_nodelay(true);
        let service = TowerToHyperService::new(app.clone());
        let tls = tls.clone();
        let shared = Arc::clone(&shared);
        tokio::spawn(async move {
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            // A connection's end, the client's or an error, is no concern
            // of the test: what arrived is recorded.
            let _ = match tls {
                None => builder.serve_connection(TokioIo::new(tcp), service).await,
                Some(tls) => match tls.accept(tcp).await {
                    Ok(tls) => builder.serve_connection(TokioIo::new(tls), service).await,
                    Err(error) => {
                        shared.lock().handshake_failures.push(error.to_string());
                        shared.grew.notify_all();
                        return;
                    }
                },
            };
        });
    }
}

/// What the server's handlers share with the [`Receiver`]; `grew` is
/// notified whenever it changes.
#[derive(Default)]
struct Shared {
    collected: Mutex<Collected>,
    grew: Condvar,
}

#[derive(Default)]
struct Collected {
    spans: Vec<ReceivedSpan>,
    requests: usize,
    headers: Vec<BTreeMap<String, String>>,
    received: Received,
    handshake_failures: Vec<String>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Collected> {
        // No code holding the lock can panic; recover anyway.
        self.collected
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// The handler state of both transports.
#[derive(Clone)]
struct Sink {
    shared: Arc<Shared>,
    behaviour: Behaviour,
    keep: Keep,
}

impl Sink {
    /// Counts `export` and keeps its headers on arrival, holds it as told,
    /// and counts and records its spans as it answers. Dropped while held
    /// (the client left), it records no span. Counting only, it keeps
    /// neither headers nor spans (and was given no decoded request).
    async fn export(&self, headers: Option<&HeaderMap>, export: Export) {
        let headers = headers.map(|headers| {
            let headers = headers.iter().map(|(name, value)| {
                let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
                (name.as_str().to_owned(), value)
            });
            headers.collect()
        });
        {
            let mut collected = self.shared.lock();
            collected.requests += 1;
            collected.headers.extend(headers);
        }
        self.shared.grew.notify_all();
        if let Behaviour::Slow(hold) = self.behaviour {
            tokio::time::sleep(hold).await;
        }
        let mut collected = self.shared.lock();
        collected.received.count(&export);
        if let Some(request) = export.request {
            collected.spans.extend(decode(request));
        }
        drop(collected);
        self.shared.grew.notify_all();
    }

    /// The request's headers, where the receiver keeps them.
    fn keeps<'h>(&self, headers: &'h HeaderMap) -> Option<&'h HeaderMap> {
        (self.keep == Keep::Spans).then_some(headers)
    }
}

#[tonic::async_trait]
impl TraceService for Sink {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        // tonic keeps no count of the bytes it decoded: the message's own
        // encoded length, a walk over it, far cheaper than the decoding.
        let bytes = request.get_ref().encoded_len();
        let headers = (self.keep == Keep::Spans).then(|| request.metadata().clone().into_headers());
        let export = Export::decoded(request.into_inner(), bytes);
        Sink::export(self, headers.as_ref(), export).await;
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

/// `POST /v1/traces`. OTLP/JSON and compressed bodies are refused with 415,
/// as a collector that does not speak them would, rather than misread.
async fn http_export(State(sink): State<Sink>, headers: HeaderMap, body: Bytes) -> Response {
    let header = |name| headers.get(name).and_then(|v| v.to_str().ok());
    let media_type = header(header::CONTENT_TYPE).and_then(|v| v.split(';').next());
    let encoding = header(header::CONTENT_ENCODING).unwrap_or("identity");
    if media_type.map(str::trim) != Some(PROTOBUF) || encoding != "identity" {
        let only = "only uncompressed application/x-protobuf";
        return (HttpStatus::UNSUPPORTED_MEDIA_TYPE, only).into_response();
    }
    let bytes = body.len();
    let export = match sink.keep {
        Keep::Spans => ExportTraceServiceRequest::decode(body)
            .ok()
            .map(|request| Export::decoded(request, bytes)),
        Keep::Counts => Export::counted(&body),
    };
    let Some(export) = export else {
        sink.shared.lock().received.undecodable += 1;
        return (HttpStatus::BAD_REQUEST, "not an ExportTraceServiceRequest").into_response();
    };
    sink.export(sink.keeps(&headers), export).await;
    let answer = ExportTraceServiceResponse::default().encode_to_vec();
    ([(header::CONTENT_TYPE, PROTOBUF)], answer).into_response()
}

/// The path of OTLP/gRPC's one method.
const GRPC_EXPORT: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";

/// OTLP/gRPC's `Export` for the counting receiver: tonic takes the gRPC
/// framing off and hands the message over undecoded ([`RawCodec`]); its
/// spans are counted from its bytes. Bytes that do not frame as an export
/// are counted as undecodable and refused, as tonic's own decoding would
/// refuse them.
async fn grpc_count(State(sink): State<Sink>, request: axum::extract::Request) -> Response {
    let count = tower::service_fn(move |request: tonic::Request<Bytes>| {
        let sink = sink.clone();
        async move {
            let Some(export) = Export::counted(request.get_ref()) else {
                sink.shared.lock().received.undecodable += 1;
                return Err(tonic::Status::internal("not an ExportTraceServiceRequest"));
            };
            sink.export(None, export).await;
            // An `ExportTraceServiceResponse` with nothing partial: no bytes.
            Ok(tonic::Response::new(Bytes::new()))
        }
    });
    let mut grpc = tonic::server::Grpc::new(RawCodec).max_decoding_message_size(MAX_EXPORT);
    grpc.unary(count, request).await.map(axum::body::Body::new)
}

/// An export as it arrived: its spans counted, its size, and the request
/// decoded where the receiver keeps its spans.
struct Export {
    kinds: Kinds,
    /// Encoded, uncompressed.
    bytes: usize,
    request: Option<ExportTraceServiceRequest>,
}

impl Export {
    /// `request`, decoded from `bytes`.
    fn decoded(request: ExportTraceServiceRequest, bytes: usize) -> Export {
        let mut kinds = Kinds::default();
        let spans = (request.resource_spans.iter())
            .flat_map(|resource| &resource.scope_spans)
            .flat_map(|scope| &scope.spans);
        for span in spans {
            kinds.add(span.kind);
        }
        Export {
            kinds,
            bytes,
            request: Some(request),
        }
    }

    /// The export in `bytes`, counted and not decoded; `None` if they do
    /// not frame as one.
    fn counted(bytes: &[u8]) -> Option<Export> {
        Some(Export {
            kinds: scan::count(bytes)?,
            bytes: bytes.len(),
            request: None,
        })
    }
}

fn decode(request: ExportTraceServiceRequest) -> Vec<ReceivedSpan> {
    let mut received = Vec::new();
    for resource_spans in request.resource_spans {
        let resource = attributes(resource_spans.resource.unwrap_or_default().attributes);
        let service_name = resource.get("service.name").and_then(Value::as_str);
        let service_name = service_name.map(str::to_owned);
        for scope_spans in resource_spans.scope_spans {
            let scope_name = scope_spans.scope.unwrap_or_default().name;
            for span in scope_spans.spans {
                let status = span.status.unwrap_or_default();
                let events = span.events.into_iter().map(|event| ReceivedEvent {
                    name: event.name,
                    attributes: attributes(event.attributes),
                });
                received.push(ReceivedSpan {
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent_span_id: (!span.parent_span_id.is_empty())
                        .then(|| hex(&span.parent_span_id)),
                    name: span.name,
                    kind: SpanKind::try_from(span.kind).unwrap_or(SpanKind::Unspecified),
                    status_code: StatusCode::try_from(status.code).unwrap_or(StatusCode::Unset),
                    status_message: status.message,
                    attributes: attributes(span.attributes),
                    events: events.collect(),
                    start_unix_nanos: span.start_time_unix_nano,
                    end_unix_nanos: span.end_time_unix_nano,
                    service_name: service_name.clone(),
                    resource: resource.clone(),
                    scope_name: scope_name.clone(),
                });
            }
        }
    }
    received
}

fn attributes(pairs: Vec<KeyValue>) -> BTreeMap<String, Value> {
    pairs
        .into_iter()
        .map(|kv| (kv.key, value(kv.value)))
        .collect()
}

fn value(value: Option<AnyValue>) -> Value {
    match value.and_then(|v| v.value) {
        Some(Any::StringValue(s)) => Value::String(s),
        Some(Any::BoolValue(b)) => Value::Bool(b),
        Some(Any::IntValue(i)) => Value::from(i),
        // Not finite: null.
        Some(Any::DoubleValue(d)) => Value::from(d),
        Some(Any::ArrayValue(a)) => a.values.into_iter().map(|v| self::value(Some(v))).collect(),
        Some(Any::KvlistValue(l)) => Value::Object(
            (l.values.into_iter())
                .map(|kv| (kv.key, self::value(kv.value)))
                .collect(),
        ),
        Some(Any::BytesValue(b)) => Value::String(hex(&b)),
        // A string table index belongs to the profiles signal, not traces.
        Some(Any::StringValueStrindex(_)) | None => Value::Null,
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests;
