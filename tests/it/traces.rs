//! The service's traces, proven against a real OTLP receiver
//! (`lameduck_testkit::otlp`): what a process exports over OTLP/gRPC or OTLP/HTTP is
//! decoded with the protocol's own definitions, then asserted on.
//!
//! First the receiver itself, against the OpenTelemetry SDK's own OTLP
//! exporter: a span arrives with every field intact, a slow collector holds
//! exports, a down one refuses them, and what the receiver does not speak is
//! refused. Then the real binary on each way out — SIGTERM idle and with
//! requests in flight (both transports), the deadline passed, a second
//! signal, a collector down (both transports) or slow at shutdown: every
//! request answered before the signal has exactly one server span, in the
//! caller's trace when it sent a `traceparent`, and the exit keeps to its
//! budget and its code whatever the collector does. A database call given
//! up on (its client hung up) ends its span in error. And the standard
//! `OTEL_*` variables a user sets (the traces' protocol, service name,
//! resource, headers, sampler) reach the collector, over both transports.
//! Last, an `https://` collector: trusted through
//! `OTEL_EXPORTER_OTLP_CERTIFICATE` it gets every span, untrusted it costs
//! the budget and one line saying why, an unusable file is exit 2, and the
//! default roots are each transport's own.

use std::io::Write;
use std::net::TcpStream;
use std::thread;
use std::time::{Duration, Instant};

use opentelemetry::trace::{Span as _, SpanContext, Status, Tracer as _, TracerProvider as _};
use opentelemetry::KeyValue;
use opentelemetry_otlp::{ExporterBuildError, SpanExporter, WithExportConfig};
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;

use axum::body::Bytes;
use http_body_util::Full;
use hyper::client::conn::http2;
use hyper::Request;
use hyper_util::rt::{TokioExecutor, TokioIo};
use lameduck_testkit::binary::{self, LameduckProcess};
use lameduck_testkit::otlp::{self, Behaviour, Protocol, ReceivedSpan, Receiver};
use lameduck_testkit::postgres::{PgCluster, Sql};
use lameduck_testkit::tls::TestCa;
use nix::sys::signal::Signal::SIGTERM;

/// The SDK's default export timeout.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// The longest a test waits for spans that should arrive.
const ARRIVAL: Duration = Duration::from_secs(10);

/// The resource's `service.name` and the tracer's name the tests export as.
const SERVICE: &str = "otlp-receiver-test";
const SCOPE: &str = "lameduck-tests";

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

// === The service's traces, on every way out ===
//
// Each row runs the real binary with traces on, its batch delay longer than
// the test (`HELD`): nothing leaves before the exit, so what the receiver
// has afterwards is what the exit flushed. Every request answered before
// the signal must then have exactly one server span, carrying the caller's
// trace when it sent a `traceparent`.

/// A batch delay no row outlasts: spans leave only when flushed.
const HELD: &str = "600000";

/// How long a row waits for the process to exit after its signal.
const PATIENCE: Duration = Duration::from_secs(30);

/// The trace flush's budget, as the service defines it.
const FLUSH_BUDGET: Duration = lameduck::telemetry::traces::TRACE_FLUSH_BUDGET;

/// One request a row sent, and what it should find among the spans.
#[derive(Debug)]
struct Sent {
    /// Its `x-request-id`, which the server keeps.
    request_id: String,
    /// The caller's trace and span, when it sent a `traceparent`.
    parent: Option<(String, String)>,
    /// The answer's status.
    status: u16,
}

/// Random W3C trace and span ids, as a caller would send them.
fn caller_ids() -> (String, String) {
    let trace = format!("{:032x}", rand::random::<u128>() | 1);
    let span = format!("{:016x}", rand::random::<u64>() | 1);
    (trace, span)
}

/// Headers of a request with id `id`, and a `traceparent` when `parent`.
fn headers(id: &str, parent: Option<&(String, String)>) -> String {
    let mut headers = format!("x-request-id: {id}\r\n");
    if let Some((trace, span)) = parent {
        headers.push_str(&format!("traceparent: 00-{trace}-{span}-01\r\n"));
    }
    headers
}

/// The server's environment: traces to `endpoint` over `protocol`, spans
/// held until the exit, the request lines logged (they carry the trace id).
fn traced_envs(protocol: Protocol, endpoint: &str) -> Vec<(&'static str, String)> {
    let mut envs = otlp::envs(protocol, endpoint);
    for (key, value) in &mut envs {
        if *key == "OTEL_BSP_SCHEDULE_DELAY" {
            *value = HELD.to_owned();
        }
    }
    envs.push(("RUST_LOG", "info,lameduck::http=debug".to_owned()));
    envs
}

/// `lameduck server ARGS`, traced as [`traced_envs`] says.
fn start_traced(protocol: Protocol, endpoint: &str, args: &[&str]) -> LameduckProcess {
    start_traced_with(protocol, endpoint, args, &[])
}

/// `lameduck server ARGS`, traced to `endpoint` as [`traced_envs`] says,
/// with `more` variables.
fn start_traced_with(
    protocol: Protocol,
    endpoint: &str,
    args: &[&str],
    more: &[(&'static str, &str)],
) -> LameduckProcess {
    let mut envs = traced_envs(protocol, endpoint);
    envs.extend(more.iter().map(|(key, value)| (*key, (*value).to_owned())));
    let envs: Vec<(&str, &str)> = envs.iter().map(|(k, v)| (*k, v.as_str())).collect();
    LameduckProcess::start(args, &envs)
}

/// The requests a row makes before its signal: a link created, redirects
/// with and without a caller's trace, a link shown, an unknown route.
fn answered_requests(server: &LameduckProcess, row: &str) -> Vec<Sent> {
    let mut sent = Vec::new();
    let mut send = |method: &str, path: &str, body: Option<&str>, traced: bool| {
        let request_id = format!("{row}-{}", sent.len());
        let parent = traced.then(caller_ids);
        let headers = headers(&request_id, parent.as_ref());
        let response = binary::request_with(server.addr(), method, path, &headers, body)
            .unwrap_or_else(|error| panic!("{method} {path}: {error}"));
        sent.push(Sent {
            request_id,
            parent,
            status: response.status,
        });
        response
    };
    let created = send("POST", "/api/links", Some(binary::LINK), true);
    assert_eq!(created.status, 201, "{created:?}");
    let code = created.json()["code"]
        .as_str()
        .expect("the new link's code")
        .to_owned();
    for traced in [true, false, true] {
        let redirect = send("GET", &format!("/{code}"), None, traced);
        assert_eq!(redirect.status, 307, "{redirect:?}");
    }
    assert_eq!(
        send("GET", &format!("/api/links/{code}"), None, false).status,
        200
    );
    assert_eq!(send("GET", "/no/such/route", None, true).status, 404);
    sent
}

/// The server spans of the service's requests among `spans`.
fn server_spans(spans: &[ReceivedSpan]) -> Vec<&ReceivedSpan> {
    spans
        .iter()
        .filter(|span| span.kind == otlp::SpanKind::Server)
        .collect()
}

/// Each of `sent` has exactly one server span, with its answer's status
/// and, for a request that carried one, the caller's trace as its parent.
fn assert_each_answered_once(spans: &[ReceivedSpan], sent: &[Sent]) {
    let servers = server_spans(spans);
    for request in sent {
        let mine: Vec<_> = servers
            .iter()
            .filter(|span| span.attr_str("request_id") == Some(request.request_id.as_str()))
            .collect();
        let [span] = mine.as_slice() else {
            panic!(
                "{request:?} has {} server spans, not one; received:\n{spans:#?}",
                mine.len()
            );
        };
        assert_eq!(
            span.attr_i64("http.response.status_code"),
            Some(i64::from(request.status)),
            "{span:#?}"
        );
        if let Some((trace, parent)) = &request.parent {
            assert_eq!(&span.trace_id, trace, "{span:#?}");
            assert_eq!(span.parent_span_id.as_ref(), Some(parent), "{span:#?}");
        } else {
            assert_eq!(span.parent_span_id, None, "{span:#?}");
        }
        let error = span.status_code == otlp::StatusCode::Error;
        assert_eq!(error, request.status >= 500, "{span:#?}");
        assert_eq!(
            span.service_name.as_deref(),
            Some(env!("CARGO_PKG_NAME")),
            "{span:#?}"
        );
    }
}

/// Spans named `name`.
fn named<'a>(spans: &'a [ReceivedSpan], name: &str) -> Vec<&'a ReceivedSpan> {
    spans.iter().filter(|span| span.name == name).collect()
}

/// A clean stop, idle: every answered request's span, the database call
/// under the link's creation, the final flush as a root span of its own; the
/// request lines carry the trace id beside the request id.
fn sigterm_idle(protocol: Protocol) {
    let receiver = Receiver::start(protocol, Behaviour::Answer);
    // The hits wait for the final flush.
    let args = ["--flush-interval", "600s"];
    let mut server = start_traced(protocol, &receiver.endpoint(), &args);
    let sent = answered_requests(&server, "idle");
    assert_eq!(receiver.requests(), 0, "spans left before the exit flush");
    server.signal(SIGTERM);
    assert_eq!(server.exit_code(PATIENCE), 0, "{}", server.log_text());
    let spans = receiver.spans();
    assert_each_answered_once(&spans, &sent);

    let created = server_spans(&spans)
        .into_iter()
        .find(|span| span.name == "POST /api/links")
        .unwrap_or_else(|| panic!("no span of the creation:\n{spans:#?}"));
    let insert = named(&spans, "INSERT links");
    let [insert] = insert.as_slice() else {
        panic!("one INSERT links span expected:\n{spans:#?}");
    };
    assert_eq!(insert.kind, otlp::SpanKind::Client, "{insert:#?}");
    assert_eq!(insert.trace_id, created.trace_id, "{insert:#?}");
    assert_eq!(insert.parent_span_id.as_ref(), Some(&created.span_id));
    assert_eq!(insert.attr_str("db.system.name"), Some("sqlite"));
    let redirect = named(&spans, "GET /{code}");
    assert_eq!(redirect.len(), 3, "{spans:#?}");
    assert_eq!(redirect[0].attr_str("http.route"), Some("/{code}"));
    assert_eq!(
        named(&spans, "GET").len(),
        1,
        "the 404 is named by its method only"
    );

    let flushes = named(&spans, "write-behind final flush");
    let [flush] = flushes.as_slice() else {
        panic!("one final flush span expected:\n{spans:#?}");
    };
    assert_eq!(flush.parent_span_id, None, "{flush:#?}");
    let applied = named(&spans, "UPDATE links");
    assert!(
        applied
            .iter()
            .any(|update| update.trace_id == flush.trace_id),
        "the flush's database call is in its trace:\n{spans:#?}"
    );

    let log = server.log_text();
    let (trace, _) = sent[1].parent.as_ref().expect("a traced redirect");
    let line = log
        .lines()
        .find(|line| line.contains("request_id=\"idle-1\""))
        .unwrap_or_else(|| panic!("no line of request idle-1:\n{log}"));
    assert!(line.contains(&format!("trace_id={trace}")), "{line}");
    assert!(!line.contains("otel."), "{line}");
    assert!(log.contains("traces flushed"), "{log}");
}

#[test]
fn grpc_sigterm_idle_exports_every_span() {
    sigterm_idle(Protocol::Grpc);
}

#[test]
fn http_sigterm_idle_exports_every_span() {
    sigterm_idle(Protocol::HttpProtobuf);
}

/// What a user sets for a vendor's collector is what the collector gets:
/// the traces' own transport over the general one, the service's name and
/// resource attributes, headers on every export (an API key), and a
/// sampler that keeps a caller's decision and samples none of its own
/// traces — so only the caller's sampled trace arrives, and the log still
/// joins every request to its trace.
fn standard_variables_apply(protocol: Protocol) {
    let receiver = Receiver::start(protocol, Behaviour::Answer);
    let mut envs = traced_envs(protocol, &receiver.endpoint());
    // The general protocol names the other transport; the traces' own wins.
    let other = match protocol {
        Protocol::Grpc => Protocol::HttpProtobuf,
        Protocol::HttpProtobuf => Protocol::Grpc,
    };
    for (key, value) in &mut envs {
        if *key == "OTEL_EXPORTER_OTLP_PROTOCOL" {
            *value = other.env_value().to_owned();
        }
    }
    envs.extend([
        (
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            protocol.env_value().to_owned(),
        ),
        ("OTEL_SERVICE_NAME", "shortener-eu".to_owned()),
        (
            "OTEL_RESOURCE_ATTRIBUTES",
            "deployment.environment.name=tests,service.namespace=links".to_owned(),
        ),
        (
            "OTEL_EXPORTER_OTLP_HEADERS",
            "authorization=Bearer%20t0ken,x-tenant=tests".to_owned(),
        ),
        ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio".to_owned()),
        ("OTEL_TRACES_SAMPLER_ARG", "0".to_owned()),
    ]);
    let envs: Vec<(&str, &str)> = envs.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let mut server = LameduckProcess::start(&[], &envs);
    let addr = server.addr();
    let created = binary::request(addr, "POST", "/api/links", Some(binary::LINK));
    let created = created.expect("POST /api/links");
    assert_eq!(created.status, 201, "{created:?}");
    let code = created.json()["code"].as_str().expect("a code").to_owned();

    let sampled = caller_ids();
    let (unsampled_trace, unsampled_parent) = caller_ids();
    let flags_off = format!("traceparent: 00-{unsampled_trace}-{unsampled_parent}-00\r\n");
    let requests = [
        headers("sampled", Some(&sampled)),
        headers("unsampled", None) + &flags_off,
        headers("untraced", None),
    ];
    for headers in &requests {
        let path = format!("/api/links/{code}");
        let shown = binary::request_with(addr, "GET", &path, headers, None);
        assert_eq!(shown.expect("GET /api/links/{code}").status, 200);
    }
    server.signal(SIGTERM);
    assert_eq!(server.exit_code(PATIENCE), 0, "{}", server.log_text());

    let spans = receiver.spans();
    let (trace, parent) = &sampled;
    assert!(
        spans.iter().all(|span| &span.trace_id == trace),
        "only the caller's sampled trace is exported:\n{spans:#?}"
    );
    let servers = server_spans(&spans);
    let [shown] = servers.as_slice() else {
        panic!("one server span expected:\n{spans:#?}");
    };
    assert_eq!(shown.attr_str("request_id"), Some("sampled"), "{shown:#?}");
    assert_eq!(shown.parent_span_id.as_ref(), Some(parent), "{shown:#?}");
    assert!(
        spans.iter().any(|span| span.kind == otlp::SpanKind::Client
            && span.parent_span_id.as_ref() == Some(&shown.span_id)),
        "the read's database call is exported with it:\n{spans:#?}"
    );
    for span in &spans {
        assert_eq!(span.service_name.as_deref(), Some("shortener-eu"));
        let resource = |key| span.resource.get(key).and_then(|v| v.as_str());
        assert_eq!(resource("deployment.environment.name"), Some("tests"));
        assert_eq!(resource("service.namespace"), Some("links"));
        assert_eq!(resource("service.version"), Some(env!("CARGO_PKG_VERSION")));
    }

    let exports = receiver.request_headers();
    assert!(!exports.is_empty(), "nothing was exported");
    for headers in &exports {
        let header = |name| headers.get(name).map(String::as_str);
        assert_eq!(header("authorization"), Some("Bearer t0ken"), "{headers:?}");
        assert_eq!(header("x-tenant"), Some("tests"), "{headers:?}");
    }

    // Sampled out is not untraced: each request's log line has its trace.
    let log = server.log_text();
    for (id, trace) in [
        ("sampled", Some(trace)),
        ("unsampled", Some(&unsampled_trace)),
        ("untraced", None),
    ] {
        let line = log
            .lines()
            .find(|line| line.contains(&format!("request_id=\"{id}\"")))
            .unwrap_or_else(|| panic!("no line of request {id}:\n{log}"));
        match trace {
            Some(trace) => assert!(line.contains(&format!("trace_id={trace}")), "{line}"),
            None => assert!(line.contains("trace_id="), "{line}"),
        }
    }
}

#[test]
fn grpc_standard_variables_apply() {
    standard_variables_apply(Protocol::Grpc);
}

#[test]
fn http_standard_variables_apply() {
    standard_variables_apply(Protocol::HttpProtobuf);
}

/// A request in flight at the signal, answered during the drain, is
/// exported with the rest; the JSON log lines carry the trace id beside
/// the request id.
fn sigterm_in_flight(protocol: Protocol) {
    let receiver = Receiver::start(protocol, Behaviour::Answer);
    let args = ["--log-format", "json"];
    let mut server = start_traced(protocol, &receiver.endpoint(), &args);
    let mut sent = answered_requests(&server, "flight");
    let parent = caller_ids();
    let id = "flight-held";
    let mut held = binary::connect(server.addr());
    binary::begin_slow_post_with(&mut held, binary::LINK, &headers(id, Some(&parent)));
    server.wait_in_flight(1);
    server.signal(SIGTERM);
    server.expect_log("draining", PATIENCE);
    binary::finish_slow_post(&mut held);
    let answer = binary::read_response(&mut held).expect("the held request's answer");
    assert_eq!(answer.status, 201, "{answer:?}");
    sent.push(Sent {
        request_id: id.to_owned(),
        parent: Some(parent),
        status: answer.status,
    });
    assert_eq!(server.exit_code(PATIENCE), 0, "{}", server.log_text());
    assert_each_answered_once(&receiver.spans(), &sent);

    let (trace, _) = sent[0].parent.as_ref().expect("a traced creation");
    let line = server
        .json_log("flight-0")
        .unwrap_or_else(|| panic!("no JSON line of flight-0:\n{}", server.log_text()));
    assert_eq!(line["span"]["request_id"], "flight-0", "{line}");
    assert_eq!(line["span"]["trace_id"], trace.as_str(), "{line}");
    assert!(line["span"].get("otel.kind").is_none(), "{line}");
}

#[test]
fn grpc_sigterm_with_requests_in_flight_exports_every_span() {
    sigterm_in_flight(Protocol::Grpc);
}

#[test]
fn http_sigterm_with_requests_in_flight_exports_every_span() {
    sigterm_in_flight(Protocol::HttpProtobuf);
}

/// The deadline passes with a request stalled in flight: the answered ones
/// are exported, and the abandoned one too, ended in error, not left open.
#[test]
fn deadline_passed_ends_the_abandoned_request_in_error() {
    let protocol = Protocol::Grpc;
    let receiver = Receiver::start(protocol, Behaviour::Answer);
    let args = ["--shutdown-timeout", "1s"];
    let mut server = start_traced(protocol, &receiver.endpoint(), &args);
    let sent = answered_requests(&server, "deadline");
    let parent = caller_ids();
    let mut held = binary::connect(server.addr());
    binary::begin_slow_post_with(
        &mut held,
        binary::LINK,
        &headers("deadline-held", Some(&parent)),
    );
    server.wait_in_flight(1);
    server.signal(SIGTERM);
    assert_eq!(server.exit_code(PATIENCE), 3, "{}", server.log_text());
    let spans = receiver.spans();
    assert_each_answered_once(&spans, &sent);
    let held: Vec<_> = server_spans(&spans)
        .into_iter()
        .filter(|span| span.attr_str("request_id") == Some("deadline-held"))
        .collect();
    let [held] = held.as_slice() else {
        panic!("the abandoned request has no single span:\n{spans:#?}");
    };
    assert_eq!(held.trace_id, parent.0, "{held:#?}");
    assert_eq!(held.status_code, otlp::StatusCode::Error, "{held:#?}");
    let why = lameduck::telemetry::traces::open::ABANDONED;
    assert_eq!(held.status_message, why, "{held:#?}");
    assert_eq!(held.attr_str("error.type"), Some("abandoned"), "{held:#?}");
}

/// A read whose client hangs up while its `SELECT` waits on a lock: the
/// request's database span ends in error, `cancelled`, rather than as if
/// the database had answered.
#[test]
fn a_read_given_up_on_ends_its_database_span_in_error() {
    let protocol = Protocol::HttpProtobuf;
    let receiver = Receiver::start(protocol, Behaviour::Answer);
    let cluster = PgCluster::start();
    let url = cluster.url();
    let mut server = start_traced(protocol, &receiver.endpoint(), &["--database-url", &url]);
    let created = binary::post_json(server.addr(), &binary::link_body("held-read"));
    assert_eq!(created.status, 201, "{created:?}");

    let mut lock = Sql::connect(&url);
    lock.execute("BEGIN");
    lock.execute("LOCK TABLE links IN ACCESS EXCLUSIVE MODE");
    let mut reader = binary::connect(server.addr());
    reader
        .write_all(
            format!(
                "GET /api/links/held-read HTTP/1.1\r\nHost: lameduck\r\n{}\r\n",
                headers("held-read", None)
            )
            .as_bytes(),
        )
        .expect("send the read");
    Sql::connect(&url).wait_lock_waiters(1, PATIENCE, "the read");
    drop(reader);
    binary::wait_metric(server.admin_addr(), "lameduck_requests_in_flight", |n| {
        n == 0.0
    });
    lock.execute("COMMIT");
    server.signal(SIGTERM);
    assert_eq!(server.exit_code(PATIENCE), 0, "{}", server.log_text());

    let spans = receiver.spans();
    let request = server_spans(&spans)
        .into_iter()
        .find(|span| span.attr_str("request_id") == Some("held-read"))
        .unwrap_or_else(|| panic!("no span of the read:\n{spans:#?}"));
    let selects: Vec<_> = named(&spans, "SELECT links")
        .into_iter()
        .filter(|span| span.parent_span_id.as_ref() == Some(&request.span_id))
        .collect();
    let [select] = selects.as_slice() else {
        panic!("the read has no single SELECT span:\n{spans:#?}");
    };
    assert_eq!(select.status_code, otlp::StatusCode::Error, "{select:#?}");
    assert_eq!(
        select.attr_str("error.type"),
        Some("cancelled"),
        "{select:#?}"
    );
    assert!(select.status_message.contains("given up on"), "{select:#?}");
}

/// Over HTTP/2, with a handler that ignores its cancellation (a fault
/// injected into link creation): the stream's span ends in error all the
/// same, and is exported — whether the abandoned stream is dropped, or its
/// span is still open at the last flush, which ends it.
#[test]
fn deadline_passed_over_http2_ends_the_open_stream_in_error() {
    let protocol = Protocol::Grpc;
    let receiver = Receiver::start(protocol, Behaviour::Answer);
    let mut server = start_traced_with(
        protocol,
        &receiver.endpoint(),
        &["--shutdown-timeout", "1s"],
        &[("FAILPOINTS", "create-link-hangs=return")],
    );
    let parent = caller_ids();
    let request = Request::post(format!("http://{}/api/links", server.addr()))
        .header("content-type", "application/json")
        .header("x-request-id", "h2-held")
        .header("traceparent", format!("00-{}-{}-01", parent.0, parent.1))
        .body(Full::new(Bytes::from_static(binary::LINK.as_bytes())))
        .expect("an HTTP/2 request");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime for the HTTP/2 client");
    runtime.block_on(async {
        let tcp = tokio::net::TcpStream::connect(server.addr())
            .await
            .expect("connect for HTTP/2");
        let (mut sender, connection) = http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .expect("HTTP/2 handshake");
        tokio::spawn(connection);
        tokio::spawn(async move { sender.send_request(request).await });
    });
    // The client's runtime keeps the stream open while the server shuts
    // down around it.
    let client = thread::spawn(move || {
        runtime.block_on(async { tokio::time::sleep(PATIENCE).await });
    });
    server.wait_in_flight(1);
    server.signal(SIGTERM);
    assert_eq!(server.exit_code(PATIENCE), 3, "{}", server.log_text());
    drop(client);
    let spans = receiver.spans();
    let held: Vec<_> = server_spans(&spans)
        .into_iter()
        .filter(|span| span.attr_str("request_id") == Some("h2-held"))
        .collect();
    let [held] = held.as_slice() else {
        panic!("the abandoned stream has no single span:\n{spans:#?}");
    };
    assert_eq!(held.trace_id, parent.0, "{held:#?}");
    assert_eq!(held.attr_str("network.protocol.version"), Some("2"));
    assert_eq!(held.status_code, otlp::StatusCode::Error, "{held:#?}");
    assert!(held.status_message.starts_with("abandoned:"), "{held:#?}");
}

/// A second signal during the lame duck: the force hooks spill the hits,
/// then give the export its short budget; every span of the requests
/// answered before, and the spill's, reach a collector that answers.
#[test]
fn second_signal_exports_within_its_short_budget() {
    second_signal_exports(Protocol::Grpc, &[]);
}

/// The same with a runtime of one worker, as a service limited to one CPU
/// or less gets (tokio sizes it by the CPUs the process may use). The
/// force hooks block the thread they run on while the export waits, and
/// the gRPC exporter's connection is a task of that runtime: were the
/// hooks run on its one worker, the export would wait for it until its
/// budget was spent and the spans would be lost.
#[test]
fn second_signal_exports_on_a_runtime_of_one_worker() {
    for protocol in [Protocol::Grpc, Protocol::HttpProtobuf] {
        second_signal_exports(protocol, &[("TOKIO_WORKER_THREADS", "1")]);
    }
}

fn second_signal_exports(protocol: Protocol, more: &[(&'static str, &str)]) {
    let receiver = Receiver::start(protocol, Behaviour::Answer);
    let args = ["--drain-delay", "30s", "--flush-interval", "600s"];
    let mut server = start_traced_with(protocol, &receiver.endpoint(), &args, more);
    let sent = answered_requests(&server, "forced");
    server.signal(SIGTERM);
    server.expect_log("lame duck", PATIENCE);
    server.signal(SIGTERM);
    assert_eq!(server.exit_code(PATIENCE), 4, "{}", server.log_text());
    let spans = receiver.spans();
    assert_each_answered_once(&spans, &sent);
    let spill = named(&spans, "write-behind spill");
    assert_eq!(spill.len(), 1, "the force hook's spill:\n{spans:#?}");
    assert_eq!(spill[0].attr_i64("updates"), Some(3), "{:#?}", spill[0]);
    assert!(
        server.log_text().contains("traces flushed"),
        "{}",
        server.log_text()
    );
}

/// The service stopping on its own terms — a critical worker that panics
/// (exit 5), a finalizer over its budget (exit 7): the flush still runs
/// last, and every answered request's span leaves with it.
fn exits_with_every_span(failpoint: &str, signalled: bool, expected: i32) {
    let protocol = Protocol::Grpc;
    let receiver = Receiver::start(protocol, Behaviour::Answer);
    // The flusher's first tick, which the panic waits for, after the
    // requests.
    let mut server = start_traced_with(
        protocol,
        &receiver.endpoint(),
        &["--flush-interval", "2s"],
        &[("FAILPOINTS", failpoint)],
    );
    let sent = answered_requests(&server, failpoint);
    if signalled {
        server.signal(SIGTERM);
    }
    assert_eq!(
        server.exit_code(PATIENCE),
        expected,
        "{}",
        server.log_text()
    );
    assert_each_answered_once(&receiver.spans(), &sent);
    assert!(
        server.log_text().contains("traces flushed"),
        "{}",
        server.log_text()
    );
}

#[test]
fn a_failed_worker_exports_every_span() {
    exits_with_every_span("write-behind-flusher=panic", false, 5);
}

#[test]
fn a_finalizer_over_its_budget_exports_every_span() {
    exits_with_every_span("close-database-pool-hangs=return", true, 7);
}

/// What a row with a collector that does not take the spans sees: the exit
/// within the flush's budget of the signal (nothing else to wait for), the
/// exit code of a clean stop, and a warning that counts what was dropped.
fn assert_dropped_within_budget(server: &mut LameduckProcess) {
    let signalled = Instant::now();
    server.signal(SIGTERM);
    assert_eq!(server.exit_code(PATIENCE), 0, "{}", server.log_text());
    let took = signalled.elapsed();
    // The drain and the other finalizers take milliseconds here; the rest
    // is the flush, which must keep to its budget.
    assert!(
        took < FLUSH_BUDGET + Duration::from_secs(1),
        "exit {took:?} after the signal; logs:\n{}",
        server.log_text()
    );
    let warning = server.expect_log("traces not flushed; spans dropped", Duration::ZERO);
    let dropped = warning
        .split("spans_dropped=")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|count| count.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("no spans_dropped count in {warning:?}"));
    assert!(dropped >= 7, "{warning}");
}

/// A collector down while the service runs, then up: one warning when the
/// exports start failing, one line when they succeed again with the count
/// of spans dropped meanwhile — the same count as the metric — and never
/// the SDK's error for each batch refused.
fn collector_down_then_up(protocol: Protocol) {
    let endpoint = otlp::unused_endpoint();
    // Batches every 100 ms (`otlp::envs`), so that a few fail meanwhile.
    let envs = otlp::envs(protocol, &endpoint);
    let envs: Vec<(&str, &str)> = envs.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let mut server = LameduckProcess::start(&[], &envs);
    let (addr, admin) = (server.addr(), server.admin_addr());
    let refused_total = "lameduck_traces_spans_refused_total";
    for round in 0..5 {
        binary::create_link(addr, &format!("https://example.com/down/{round}"));
        thread::sleep(Duration::from_millis(150));
    }
    assert!(
        server.wait_for_log("trace export failing", PATIENCE),
        "{}",
        server.log_text()
    );
    binary::wait_metric(admin, refused_total, |n| n >= 5.0);

    let at = endpoint.trim_start_matches("http://");
    let collector = Receiver::start_on(protocol, Behaviour::Answer, at);
    binary::create_link(addr, "https://example.com/up");
    let recovered = server.expect_log("trace export recovered", PATIENCE);
    // One outage since the start: what it dropped is all the metric counts.
    let refused = binary::metric(&binary::metrics(admin), refused_total);
    let refused = refused.expect("the metric") as u64;
    assert!(
        recovered.contains(&format!("spans_dropped={refused}")),
        "{refused} refused: {recovered}"
    );
    let received = collector.wait_for(PATIENCE, |spans| !spans.is_empty());
    assert!(!received.is_empty(), "nothing exported after the recovery");

    server.signal(SIGTERM);
    assert_eq!(server.exit_code(PATIENCE), 0, "{}", server.log_text());
    let logs = server.log_text();
    let failing = logs.matches("trace export failing").count();
    assert_eq!(failing, 1, "{logs}");
    // Nor the SDK's warning, for each batch, that its retries are exhausted.
    assert!(
        !logs.contains("ExportError")
            && !logs.contains(" ERROR ")
            && !logs.contains("exhausted retries"),
        "{logs}"
    );
}

#[test]
fn grpc_collector_down_then_up_logs_once_each_way_and_counts_the_dropped() {
    collector_down_then_up(Protocol::Grpc);
}

#[test]
fn http_collector_down_then_up_logs_once_each_way_and_counts_the_dropped() {
    collector_down_then_up(Protocol::HttpProtobuf);
}

/// A collector that is down at shutdown costs at most the flush's budget.
fn collector_down(protocol: Protocol) {
    let mut server = start_traced(protocol, &otlp::unused_endpoint(), &[]);
    answered_requests(&server, "down");
    assert_dropped_within_budget(&mut server);
}

#[test]
fn grpc_collector_down_at_shutdown_costs_at_most_the_budget() {
    collector_down(Protocol::Grpc);
}

#[test]
fn http_collector_down_at_shutdown_costs_at_most_the_budget() {
    collector_down(Protocol::HttpProtobuf);
}

/// A collector that answers only after the budget: the same, and it never
/// records the export it held.
#[test]
fn collector_slow_at_shutdown_costs_at_most_the_budget() {
    let protocol = Protocol::Grpc;
    let receiver = Receiver::start(protocol, Behaviour::Slow(FLUSH_BUDGET * 3));
    let mut server = start_traced(protocol, &receiver.endpoint(), &[]);
    answered_requests(&server, "slow");
    assert_dropped_within_budget(&mut server);
    assert!(receiver.requests() >= 1, "the export never arrived");
    assert_eq!(receiver.spans(), []);
}

// === An `https://` collector ===
//
// The receiver serves TLS only, with a certificate of a test CA that no
// default root store holds: it is trusted through
// `OTEL_EXPORTER_OTLP_CERTIFICATE` or not at all. gRPC insists on HTTP/2 by
// ALPN; OTLP/HTTP's client speaks HTTP/1.1.

/// The standard variable, and its traces' own form.
const CERTIFICATE: &str = "OTEL_EXPORTER_OTLP_CERTIFICATE";
const TRACES_CERTIFICATE: &str = "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE";

/// A test CA, and its certificate written to `dir/ca.pem`.
fn ca_file(dir: &tempfile::TempDir) -> (TestCa, String) {
    let ca = TestCa::new();
    let path = dir.path().join("ca.pem");
    std::fs::write(&path, ca.pem()).expect("write the CA's certificate");
    (ca, path.to_str().expect("a UTF-8 path").to_owned())
}

/// Trusted through the standard variable, the collector gets every answered
/// request's span at the exit flush, as in cleartext, and no handshake
/// failed on the way.
fn https_collector_trusted(protocol: Protocol) {
    let dir = binary::tempdir("otlp-ca-");
    let (ca, pem) = ca_file(&dir);
    let receiver = Receiver::start_tls(protocol, Behaviour::Answer, &ca);
    assert!(receiver.endpoint().starts_with("https://"));
    let mut server = start_traced_with(protocol, &receiver.endpoint(), &[], &[(CERTIFICATE, &pem)]);
    let sent = answered_requests(&server, "https");
    assert_eq!(receiver.requests(), 0, "spans left before the exit flush");
    server.signal(SIGTERM);
    assert_eq!(server.exit_code(PATIENCE), 0, "{}", server.log_text());
    assert_each_answered_once(&receiver.spans(), &sent);
    assert_eq!(receiver.handshake_failures(), Vec::<String>::new());
    let logs = server.log_text();
    assert!(logs.contains("traces flushed"), "{logs}");
    assert!(!logs.contains("trace export failing"), "{logs}");
}

#[test]
fn grpc_https_collector_trusted_by_the_certificate_variable_gets_every_span() {
    https_collector_trusted(Protocol::Grpc);
}

#[test]
fn http_https_collector_trusted_by_the_certificate_variable_gets_every_span() {
    https_collector_trusted(Protocol::HttpProtobuf);
}

/// Without the variable, the collector's certificate is not trusted: the
/// exporter refuses it in the handshake (the receiver sees that, and no
/// export), says so once, and the exit keeps its code and its budget, the
/// spans counted as dropped.
fn https_collector_untrusted(protocol: Protocol) {
    let receiver = Receiver::start_tls(protocol, Behaviour::Answer, &TestCa::new());
    let mut server = start_traced(protocol, &receiver.endpoint(), &[]);
    answered_requests(&server, "untrusted");
    assert_dropped_within_budget(&mut server);
    assert_eq!(receiver.requests(), 0);
    let failures = receiver.handshake_failures();
    assert!(
        !failures.is_empty() && failures.iter().all(|f| f.contains("UnknownCA")),
        "the exporter did not refuse the certificate: {failures:?}"
    );
    // Said once while it runs (gRPC: in the exporter's warning; HTTP: in
    // the verifier's error, the warning saying "network error"), not at
    // each of the export's attempts; the exit's line counts the dropped.
    let logs = server.log_text();
    let running: Vec<_> = logs
        .lines()
        .filter(|line| !line.contains("traces not flushed"))
        .collect();
    let failing = running
        .iter()
        .filter(|l| l.contains("trace export failing"));
    assert_eq!(failing.count(), 1, "{logs}");
    let why = running.iter().filter(|l| l.contains("UnknownIssuer"));
    assert_eq!(why.count(), 1, "{logs}");
    assert!(!logs.contains("exhausted retries"), "{logs}");
}

#[test]
fn grpc_https_collector_untrusted_is_refused_and_costs_at_most_the_budget() {
    https_collector_untrusted(Protocol::Grpc);
}

#[test]
fn http_https_collector_untrusted_is_refused_and_costs_at_most_the_budget() {
    https_collector_untrusted(Protocol::HttpProtobuf);
}

/// Runs the service with `certificates` set, exporting to a collector that
/// is down; expects exit 2 and one line, an error, naming `refused`: the
/// variable and the file it names.
fn assert_refused_at_start(
    protocol: Protocol,
    certificates: &[(&str, &str)],
    refused: (&str, &str),
) {
    let mut envs = otlp::envs(protocol, &otlp::unused_endpoint());
    envs.extend(certificates.iter().map(|(k, v)| (*k, (*v).to_owned())));
    let envs: Vec<(&str, &str)> = envs.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let run = binary::run(&[], &envs, PATIENCE);
    let output = run.output();
    assert_eq!(run.status.code(), Some(2), "{certificates:?}:\n{output}");
    let (variable, path) = refused;
    let named: Vec<_> = output.lines().filter(|l| l.contains(variable)).collect();
    let [line] = named.as_slice() else {
        panic!("one line naming {variable} expected:\n{output}");
    };
    // The target is the crate's name, which a generated service renames.
    let message = format!(": traces: {variable}={path}: ");
    assert!(
        line.contains(" ERROR ") && line.contains(&message),
        "{line}"
    );
}

/// A certificate file that cannot be used stops the start with exit 2 and
/// one line naming the variable and the file — whatever the endpoint's
/// scheme, so that the mistake shows before the collector moves to TLS —
/// and the traces' own variable wins over the general one.
#[test]
fn an_unusable_certificate_file_is_a_usage_error_naming_the_variable() {
    let dir = binary::tempdir("otlp-ca-");
    let (_, good) = ca_file(&dir);
    let missing = dir.path().join("missing.pem");
    let missing = missing.to_str().expect("a UTF-8 path");
    let garbage = dir.path().join("garbage.pem");
    std::fs::write(&garbage, "not a certificate\n").expect("write the file");
    let garbage = garbage.to_str().expect("a UTF-8 path");

    let unreadable = [(CERTIFICATE, missing)];
    assert_refused_at_start(Protocol::Grpc, &unreadable, unreadable[0]);
    let no_certificate = [(CERTIFICATE, garbage)];
    assert_refused_at_start(Protocol::HttpProtobuf, &no_certificate, no_certificate[0]);
    let traces_own = [(CERTIFICATE, good.as_str()), (TRACES_CERTIFICATE, missing)];
    assert_refused_at_start(Protocol::HttpProtobuf, &traces_own, traces_own[1]);

    // The traces' own variable names a usable file: the general one is
    // not read.
    let endpoint = otlp::unused_endpoint();
    let envs = otlp::envs(Protocol::Grpc, &endpoint);
    let mut envs: Vec<(&str, &str)> = envs.iter().map(|(k, v)| (*k, v.as_str())).collect();
    envs.extend([(CERTIFICATE, missing), (TRACES_CERTIFICATE, good.as_str())]);
    let mut server = LameduckProcess::start(&[], &envs);
    server.signal(SIGTERM);
    assert_eq!(server.exit_code(PATIENCE), 0, "{}", server.log_text());
}

/// The default roots, per transport, as docs/traces.md states them: OTLP/HTTP
/// trusts the system's store, which `SSL_CERT_FILE` and `SSL_CERT_DIR`
/// replace (here: the test CA alone, so it is trusted); gRPC trusts the
/// Mozilla roots compiled in, which no file changes (so the same CA is not).
#[test]
fn the_default_roots_are_the_systems_for_http_and_compiled_in_for_grpc() {
    let dir = binary::tempdir("otlp-ca-");
    let (ca, pem) = ca_file(&dir);
    // Empty is unset: the directory a shell may set is not read.
    let system = [("SSL_CERT_FILE", pem.as_str()), ("SSL_CERT_DIR", "")];

    let protocol = Protocol::HttpProtobuf;
    let receiver = Receiver::start_tls(protocol, Behaviour::Answer, &ca);
    let mut server = start_traced_with(protocol, &receiver.endpoint(), &[], &system);
    let sent = answered_requests(&server, "system");
    server.signal(SIGTERM);
    assert_eq!(server.exit_code(PATIENCE), 0, "{}", server.log_text());
    assert_each_answered_once(&receiver.spans(), &sent);

    let protocol = Protocol::Grpc;
    let receiver = Receiver::start_tls(protocol, Behaviour::Answer, &ca);
    let mut server = start_traced_with(protocol, &receiver.endpoint(), &[], &system);
    answered_requests(&server, "compiled-in");
    assert_dropped_within_budget(&mut server);
    assert_eq!(receiver.requests(), 0);
    assert!(!receiver.handshake_failures().is_empty());
}

/// The service builds the OTLP/HTTP exporter's client itself (to add the
/// roots), and gives it the export timeout the SDK would have given its
/// own: an export held longer than `OTEL_EXPORTER_OTLP_TIMEOUT` fails then,
/// not when the collector answers at last.
#[test]
fn http_export_timeout_applies_to_the_client_the_service_builds() {
    let protocol = Protocol::HttpProtobuf;
    let hold = Duration::from_secs(4);
    let receiver = Receiver::start(protocol, Behaviour::Slow(hold));
    // Batches every 100 ms (`otlp::envs`).
    let mut envs = otlp::envs(protocol, &receiver.endpoint());
    envs.push(("OTEL_EXPORTER_OTLP_TIMEOUT", "300".to_owned()));
    let envs: Vec<(&str, &str)> = envs.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let mut server = LameduckProcess::start(&[], &envs);
    binary::create_link(server.addr(), "https://example.com/timeout");
    let sent = Instant::now();
    let failing = server.wait_for_log("trace export failing", hold);
    let took = sent.elapsed();
    assert!(failing, "{}", server.log_text());
    assert!(took < hold / 2, "failed {took:?} after the request");
    assert!(receiver.requests() >= 1, "the export never arrived");
    server.signal(SIGTERM);
    assert_eq!(server.exit_code(PATIENCE), 0, "{}", server.log_text());
}
