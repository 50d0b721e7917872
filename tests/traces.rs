//! The service's traces, proven against a real OTLP receiver
//! (`support::otlp`): what a process exports over OTLP/gRPC or OTLP/HTTP is
//! decoded with the protocol's own definitions, then asserted on.
//!
//! The tests here first prove the receiver itself against the OpenTelemetry
//! SDK's own OTLP exporter, built the way a service builds it (batch
//! processor, both transports): a span arrives with every field intact, an
//! exporter configured by [`otlp::envs`] alone finds the receiver, a slow
//! collector holds exports, a down one refuses them, and what the receiver
//! does not speak is refused.

mod support;

use std::io::Write;
use std::net::TcpStream;
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use opentelemetry::trace::{Span as _, SpanContext, Status, Tracer as _, TracerProvider as _};
use opentelemetry::KeyValue;
use opentelemetry_otlp::{ExporterBuildError, SpanExporter, WithExportConfig};
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;

use support::binary::{self, Process};
use support::otlp::{self, Behaviour, Protocol, ReceivedSpan, Receiver};

/// The SDK's default export timeout.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// The longest a test waits for spans that should arrive.
const ARRIVAL: Duration = Duration::from_secs(10);

/// The resource's `service.name` and the tracer's name the tests export as.
const SERVICE: &str = "otlp-receiver-test";
const SCOPE: &str = "lameduck-tests";

/// Marks the child process of [`exporter_configured_by_envs`].
const CHILD: &str = "LAMEDUCK_TEST_OTLP_CHILD";

/// The SDK's tracer provider with its OTLP exporter and batch processor. The
/// tonic exporter's channel spawns onto the runtime current when it is built,
/// and needs it running, so the runtime is dropped last; the HTTP exporter's
/// blocking client must be built and dropped outside any runtime context.
struct Sdk {
    provider: SdkTracerProvider,
    _runtime: tokio::runtime::Runtime,
}

impl Sdk {
    /// Exports to `endpoint` over `protocol`, each export given up after
    /// `timeout` (retries included).
    fn to(protocol: Protocol, endpoint: String, timeout: Duration) -> Sdk {
        Sdk::with_exporter(protocol, || match protocol {
            Protocol::Grpc => SpanExporter::builder()
                .with_tonic()
                .with_endpoint(endpoint)
                .with_timeout(timeout)
                .build(),
            Protocol::HttpProtobuf => SpanExporter::builder()
                .with_http()
                .with_endpoint(endpoint)
                .with_timeout(timeout)
                .build(),
        })
    }

    /// Exports as the env vars say, transport included, as a service would;
    /// `protocol` tells only whether the exporter needs a runtime.
    fn from_env(protocol: Protocol) -> Sdk {
        Sdk::with_exporter(protocol, || SpanExporter::builder().build())
    }

    fn with_exporter(
        protocol: Protocol,
        build: impl FnOnce() -> Result<SpanExporter, ExporterBuildError>,
    ) -> Sdk {
        // The HTTP exporter's reqwest has rustls without a provider, and its
        // client panics unless one is installed for the process, even for a
        // cleartext endpoint. Installed already: fine.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("build a runtime for the tonic exporter");
        let context = (protocol == Protocol::Grpc).then(|| runtime.enter());
        let exporter = build().expect("build the SDK's OTLP exporter");
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(Resource::builder().with_service_name(SERVICE).build())
            .build();
        drop(context);
        Sdk {
            provider,
            _runtime: runtime,
        }
    }

    /// Ends a server span with an attribute and an error status; returns
    /// its context.
    fn emit(&self, name: &'static str) -> SpanContext {
        let tracer = self.provider.tracer(SCOPE);
        let mut span = tracer
            .span_builder(name)
            .with_kind(opentelemetry::trace::SpanKind::Server)
            .with_attributes([
                KeyValue::new("http.response.status_code", 503_i64),
                KeyValue::new("http.route", "/links/{id}"),
            ])
            .start(&tracer);
        span.set_status(Status::error("the database is away"));
        let context = span.span_context().clone();
        span.end();
        context
    }
}

/// Asserts that `spans` is exactly the one span [`Sdk::emit`] made as
/// `context`, field by field.
fn assert_emitted(spans: &[ReceivedSpan], name: &str, context: &SpanContext) {
    let [span] = spans else {
        panic!("expected exactly the span {name:?}, got {spans:#?}");
    };
    assert_eq!(span.trace_id, context.trace_id().to_string(), "{span:#?}");
    assert_eq!(span.span_id, context.span_id().to_string(), "{span:#?}");
    assert_eq!(span.trace_id.len(), 32, "{span:#?}");
    assert_eq!(span.span_id.len(), 16, "{span:#?}");
    assert_eq!(span.parent_span_id, None, "{span:#?}");
    assert_eq!(span.name, name, "{span:#?}");
    assert_eq!(span.kind, otlp::SpanKind::Server, "{span:#?}");
    assert_eq!(span.status_code, otlp::StatusCode::Error, "{span:#?}");
    assert_eq!(span.status_message, "the database is away", "{span:#?}");
    assert_eq!(
        span.attr_i64("http.response.status_code"),
        Some(503),
        "{span:#?}"
    );
    assert_eq!(
        span.attr_str("http.route"),
        Some("/links/{id}"),
        "{span:#?}"
    );
    assert_eq!(span.service_name.as_deref(), Some(SERVICE), "{span:#?}");
    assert_eq!(span.scope_name, SCOPE, "{span:#?}");
    assert!(span.start_unix_nanos > 0, "{span:#?}");
    assert!(span.start_unix_nanos <= span.end_unix_nanos, "{span:#?}");
}

fn sdk_export_is_decoded(protocol: Protocol) {
    let receiver = Receiver::start(protocol, Behaviour::Answer);
    let sdk = Sdk::to(protocol, receiver.exporter_endpoint(), EXPORT_TIMEOUT);
    let context = sdk.emit("GET /links/{id}");
    sdk.provider.force_flush().expect("export to the receiver");
    let spans = receiver.wait_for(ARRIVAL, |spans| !spans.is_empty());
    assert_emitted(&spans, "GET /links/{id}", &context);
    assert_eq!(receiver.exports(), 1);
    sdk.provider.shutdown().expect("shut the SDK down");
}

#[test]
fn grpc_receiver_decodes_the_sdk_export() {
    sdk_export_is_decoded(Protocol::Grpc);
}

#[test]
fn http_receiver_decodes_the_sdk_export() {
    sdk_export_is_decoded(Protocol::HttpProtobuf);
}

/// A child configured by nothing but [`Receiver::envs`] exports to the
/// receiver while it runs, with no flush: the endpoint (the HTTP exporter
/// appends `/v1/traces` to it), the protocol and the short batch delay are
/// what the SDK reads. The child is this test binary, running
/// [`child_exports_as_the_env_says`].
fn exporter_configured_by_envs(protocol: Protocol) {
    let receiver = Receiver::start(protocol, Behaviour::Answer);
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut command = Command::new(exe);
    command.args([
        "--exact",
        "child_exports_as_the_env_says",
        "--ignored",
        "--nocapture",
    ]);
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("OTEL_") {
            command.env_remove(key);
        }
    }
    command.env(CHILD, "1").envs(receiver.envs());
    let child = Process::spawn(&mut command);
    // Timed from the span's end, however slowly the child started: well
    // under the SDK's default batch delay of 5 s.
    let context = parse_context(&child);
    let spans = receiver.wait_for(Duration::from_secs(3), |spans| !spans.is_empty());
    assert!(
        !spans.is_empty(),
        "nothing arrived from the child; it wrote:\n{}",
        child.log_text()
    );
    assert_emitted(&spans, "child span", &context);
    drop(child);
}

/// The context the child printed, as `trace_id span_id`.
fn parse_context(child: &Process) -> SpanContext {
    // The harness may print its own words on the same line first.
    let line = child.expect_log("emitted ", ARRIVAL);
    let mut ids = line.split("emitted ").nth(1).unwrap_or_default().split(' ');
    let mut next = |what| {
        ids.next()
            .unwrap_or_else(|| panic!("no {what} in {line:?}"))
            .to_owned()
    };
    let (trace_id, span_id) = (next("trace id"), next("span id"));
    SpanContext::new(
        opentelemetry::trace::TraceId::from_hex(&trace_id).expect("a trace id in hex"),
        opentelemetry::trace::SpanId::from_hex(&span_id).expect("a span id in hex"),
        opentelemetry::trace::TraceFlags::SAMPLED,
        false,
        opentelemetry::trace::TraceState::NONE,
    )
}

#[test]
fn grpc_exporter_configured_by_envs() {
    exporter_configured_by_envs(Protocol::Grpc);
}

#[test]
fn http_exporter_configured_by_envs() {
    exporter_configured_by_envs(Protocol::HttpProtobuf);
}

/// The child of [`exporter_configured_by_envs`]: exports as the env says
/// (the SDK's builder picks the transport from `OTEL_EXPORTER_OTLP_PROTOCOL`
/// too), then waits to be killed.
#[test]
#[ignore = "a child process of the *_exporter_configured_by_envs tests"]
fn child_exports_as_the_env_says() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let protocol = match std::env::var("OTEL_EXPORTER_OTLP_PROTOCOL").as_deref() {
        Ok("grpc") => Protocol::Grpc,
        Ok("http/protobuf") => Protocol::HttpProtobuf,
        other => panic!("unexpected OTEL_EXPORTER_OTLP_PROTOCOL: {other:?}"),
    };
    let sdk = Sdk::from_env(protocol);
    let context = sdk.emit("child span");
    println!("emitted {} {}", context.trace_id(), context.span_id());
    // Killed by the parent once the span arrived, with nothing flushed; a
    // bound all the same.
    thread::sleep(ARRIVAL);
    drop(sdk);
}

/// An exporter that gives up before the slow receiver answers fails, and
/// the receiver records nothing of it, even once its hold is over; a patient
/// exporter waits the hold out and gets its span recorded.
fn slow_receiver_holds_exports(protocol: Protocol) {
    let hold = Duration::from_secs(1);
    let receiver = Receiver::start(protocol, Behaviour::Slow(hold));

    let impatient = Sdk::to(
        protocol,
        receiver.exporter_endpoint(),
        Duration::from_millis(200),
    );
    impatient.emit("given up");
    let started = Instant::now();
    let flushed = impatient.provider.force_flush();
    assert!(
        flushed.is_err(),
        "the export outlived its timeout: {flushed:?}"
    );
    assert!(started.elapsed() < hold, "{:?}", started.elapsed());
    assert!(receiver.requests() >= 1, "the export never arrived");
    thread::sleep(hold + Duration::from_millis(300));
    assert_eq!(
        receiver.spans(),
        [],
        "a held export was recorded after its exporter gave up"
    );
    assert_eq!(receiver.exports(), 0);
    drop(impatient);

    let patient = Sdk::to(protocol, receiver.exporter_endpoint(), EXPORT_TIMEOUT);
    let context = patient.emit("waited");
    let started = Instant::now();
    patient.provider.force_flush().expect("a patient export");
    assert!(
        started.elapsed() >= hold,
        "answered within {:?}",
        started.elapsed()
    );
    assert_emitted(&receiver.spans(), "waited", &context);
    assert_eq!(receiver.exports(), 1);
}

#[test]
fn grpc_slow_receiver_holds_exports() {
    slow_receiver_holds_exports(Protocol::Grpc);
}

#[test]
fn http_slow_receiver_holds_exports() {
    slow_receiver_holds_exports(Protocol::HttpProtobuf);
}

/// OTLP/JSON, compressed bodies and garbage are refused, as by a collector
/// that does not speak them, and none of them counts as an export.
#[test]
fn http_receiver_refuses_what_it_does_not_speak() {
    let receiver = Receiver::start(Protocol::HttpProtobuf, Behaviour::Answer);
    let post = |headers: &str, body: &[u8]| {
        let mut stream = binary::connect(receiver.addr());
        write!(
            stream,
            "POST /v1/traces HTTP/1.1\r\nHost: otlp\r\nConnection: close\r\n{headers}\
             Content-Length: {}\r\n\r\n",
            body.len()
        )
        .and_then(|()| stream.write_all(body))
        .expect("send an export");
        let response = binary::read_response(&mut stream).expect("an answer");
        (
            response.status,
            String::from_utf8_lossy(&response.body).into_owned(),
        )
    };
    let json = post("Content-Type: application/json\r\n", b"{}");
    assert_eq!(json.0, 415, "OTLP/JSON: {json:?}");
    let gzip = post(
        "Content-Type: application/x-protobuf\r\nContent-Encoding: gzip\r\n",
        b"\x1f\x8b",
    );
    assert_eq!(gzip.0, 415, "gzip: {gzip:?}");
    let garbage = post("Content-Type: application/x-protobuf\r\n", b"\xff\xff\xff");
    assert_eq!(garbage.0, 400, "not protobuf: {garbage:?}");
    assert_eq!(receiver.requests(), 0);
    // An empty message is a valid, empty export.
    let empty = post("Content-Type: application/x-protobuf\r\n", b"");
    assert_eq!(empty.0, 200, "an empty export: {empty:?}");
    assert_eq!((receiver.requests(), receiver.exports()), (1, 1));
    assert_eq!(receiver.spans(), []);
}

/// Nothing listens on the unused endpoint, and the SDK's export to it fails
/// rather than hangs.
fn unused_endpoint_refuses(protocol: Protocol) {
    let endpoint = otlp::unused_endpoint();
    let addr = endpoint.trim_start_matches("http://");
    let refused = TcpStream::connect(addr).expect_err("something listens on the unused endpoint");
    assert_eq!(
        refused.kind(),
        std::io::ErrorKind::ConnectionRefused,
        "{refused}"
    );

    let endpoint = match protocol {
        Protocol::Grpc => endpoint,
        Protocol::HttpProtobuf => format!("{endpoint}/v1/traces"),
    };
    let sdk = Sdk::to(protocol, endpoint, Duration::from_secs(2));
    sdk.emit("lost");
    let flushed = sdk.provider.force_flush();
    assert!(
        flushed.is_err(),
        "an export to a down collector: {flushed:?}"
    );
}

#[test]
fn grpc_unused_endpoint_refuses() {
    unused_endpoint_refuses(Protocol::Grpc);
}

#[test]
fn http_unused_endpoint_refuses() {
    unused_endpoint_refuses(Protocol::HttpProtobuf);
}
