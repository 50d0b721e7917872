//! A request's server span: the `request` span of the logs (method, route,
//! request id, then status and latency), made up front, and the
//! OpenTelemetry span of the request as the HTTP semantic conventions
//! describe it — named `METHOD route`, kind server, a child of the caller's
//! trace when a `traceparent` came with the request, with `trace_id` among
//! its fields so that every line the request logs carries it.
//!
//! It ends when the [`ServerSpan`] is dropped — in error if no answer was
//! recorded — and is listed meanwhile, so that the last flush can end the
//! spans of requests the shutdown abandoned ([`super::open`]).

use axum::http::header::{HOST, USER_AGENT};
use axum::http::{Request, Version};
use opentelemetry::trace::{Status, TraceContextExt};
use opentelemetry::KeyValue;
use tracing::{Level, Metadata, Value};
use tracing_core::callsite::DefaultCallsite;
use tracing_core::field::FieldSet;
use tracing_core::metadata::Kind;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use super::open::Registration;

/// The span's callsite, made by hand: its name is the logs' `request`, its
/// fields those of the logs, the trace id, and the OpenTelemetry span's
/// name and kind (which the logs leave out, [`super::fields`]).
static CALLSITE: DefaultCallsite = DefaultCallsite::new(&META);

/// At `ERROR` level, like the lazy request span: no log filter leaves it
/// out of a request's lines.
static META: Metadata<'static> = Metadata::new(
    "request",
    concat!(env!("CARGO_CRATE_NAME"), "::http"),
    Level::ERROR,
    Some(file!()),
    Some(line!()),
    Some(module_path!()),
    FieldSet::new(
        &[
            "method",
            "route",
            "request_id",
            "trace_id",
            "status",
            "latency_ms",
            "otel.name",
            "otel.kind",
        ],
        tracing_core::identify_callsite!(&CALLSITE),
    ),
    Kind::SPAN,
);

/// A request's server span, and its place among the open ones.
#[derive(Debug)]
pub struct ServerSpan {
    span: tracing::Span,
    registration: Option<Registration>,
    answered: bool,
}

impl ServerSpan {
    /// The span of `request`, on `route` (`None`: no route matched),
    /// carrying `request_id`; `None` if the subscriber does not want it.
    pub fn new<B>(
        request: &Request<B>,
        route: Option<&str>,
        request_id: Option<&str>,
    ) -> Option<ServerSpan> {
        if CALLSITE.interest().is_never()
            || !tracing::dispatcher::get_default(|dispatch| dispatch.enabled(&META))
        {
            return None;
        }
        let method = request.method().as_str();
        // The conventions' name: the method and the route's template; the
        // method alone for no route, so that names stay few.
        let name = match route {
            Some(route) => format!("{method} {route}"),
            None => method.to_owned(),
        };
        let fields = META.fields();
        let field = |name| fields.field(name).expect("a field of META");
        let (method_field, route_field, id_field) =
            (field("method"), field("route"), field("request_id"));
        let (name_field, kind_field) = (field("otel.name"), field("otel.kind"));
        let route_value = route.unwrap_or("unmatched");
        let id = request_id.unwrap_or("");
        let values = [
            (&method_field, Some(&method as &dyn Value)),
            (&route_field, Some(&route_value as &dyn Value)),
            (&id_field, Some(&id as &dyn Value)),
            (&name_field, Some(&name.as_str() as &dyn Value)),
            (&kind_field, Some(&"server" as &dyn Value)),
        ];
        let span = tracing::Span::new(&META, &fields.value_set(&values));
        // Before the span starts in OpenTelemetry, which `context` does.
        let _ = span.set_parent(super::parent_context(request.headers()));
        let context = span.context();
        let registration = context.span().span_context().is_valid().then(|| {
            let otel = context.span();
            let trace_id = otel.span_context().trace_id();
            span.record("trace_id", tracing::field::display(trace_id));
            otel.set_attributes(attributes(request, method, route));
            Registration::new(context.clone())
        });
        Some(ServerSpan {
            span,
            registration,
            answered: false,
        })
    }

    /// The `tracing` span, to enter while the request is polled.
    pub fn span(&self) -> &tracing::Span {
        &self.span
    }

    /// Records the answer: status and latency on the span (and so on the
    /// log lines); the status code as the conventions say, a 5xx in error.
    pub fn answer(&mut self, status: u16, latency_ms: f64) {
        self.answered = true;
        self.span.record("status", status);
        self.span.record("latency_ms", latency_ms);
        let Some(registration) = &self.registration else {
            return;
        };
        let span = registration.context().span();
        span.set_attribute(KeyValue::new(
            "http.response.status_code",
            i64::from(status),
        ));
        if status >= 500 {
            span.set_attribute(KeyValue::new("error.type", status.to_string()));
            span.set_status(Status::error(""));
        }
    }
}

impl Drop for ServerSpan {
    fn drop(&mut self) {
        if let Some(registration) = self.registration.take() {
            registration.end(self.answered);
        }
    }
}

/// The HTTP server span's attributes, as OpenTelemetry's semantic
/// conventions name them.
fn attributes<B>(request: &Request<B>, method: &str, route: Option<&str>) -> Vec<KeyValue> {
    let mut attributes = vec![
        KeyValue::new("http.request.method", method.to_owned()),
        KeyValue::new("url.path", request.uri().path().to_owned()),
    ];
    if let Some(route) = route {
        attributes.push(KeyValue::new("http.route", route.to_owned()));
    }
    let version = match request.version() {
        Version::HTTP_10 => Some("1.0"),
        Version::HTTP_11 => Some("1.1"),
        Version::HTTP_2 => Some("2"),
        _ => None,
    };
    if let Some(version) = version {
        attributes.push(KeyValue::new("network.protocol.version", version));
    }
    let host = request
        .uri()
        .host()
        .or_else(|| request.headers().get(HOST)?.to_str().ok());
    if let Some(host) = host {
        // `Host` may carry a port; an IPv6 literal keeps its brackets.
        let address = match host.rsplit_once(':') {
            Some((address, port)) if !port.contains(']') => address,
            _ => host,
        };
        attributes.push(KeyValue::new("server.address", address.to_owned()));
    }
    let agent = request.headers().get(USER_AGENT);
    if let Some(agent) = agent.and_then(|agent| agent.to_str().ok()) {
        attributes.push(KeyValue::new("user_agent.original", agent.to_owned()));
    }
    attributes
}
