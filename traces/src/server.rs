//! A request's trace, decided once at the edge.
//!
//! [`Edge::of`] takes the sampling decision before anything is built: from
//! the caller's `traceparent` and the configured sampler (the standard
//! `OTEL_TRACES_SAMPLER` and its argument, read as the SDK reads them). A
//! request not sampled builds no OpenTelemetry span, no attribute and
//! nothing for the exporter; it keeps only its trace id (the caller's, or
//! the one drawn for the sampler), for its log lines. A request sampled
//! gets its server span, as the HTTP semantic conventions describe it —
//! named `METHOD route`, kind server, a child of the caller's span —
//! recorded in place, its attributes encoded as they are read
//! (`super::span`), and handed to the batch processor when it ends: no
//! `tracing` span, no per-poll bookkeeping, no log field copied into an
//! attribute.
//!
//! While a request is polled inside [`Edge::enter`], the spans made for it
//! know its decision: a [`ChildSpan`] (a database call) is made only if
//! the request is sampled, as a child of its server span; so is a
//! `traced_span!`, with the server span made the current OpenTelemetry
//! context just while it is made ([`in_request_context`]). Work a request
//! hands to another task takes the decision along with [`carry`].
//!
//! The span ends when the request's [`Sampled`] is dropped — in error if no
//! answer was recorded — and is listed meanwhile, so that the last flush
//! can end the spans of requests the shutdown abandoned ([`super::open`]).
//!
//! [`ServerSpan`] puts the two together for a service without lazy request
//! spans: the edge's decision, and the `request` span of the logs with the
//! trace id among its fields.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::sync::OnceLock;
use std::task::{Context as TaskContext, Poll};

use http::header::{HeaderName, HOST, USER_AGENT};
use http::{Request, Version};
use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId, TraceState,
};
use opentelemetry::{Context, InstrumentationScope, KeyValue};
use opentelemetry_sdk::trace::{IdGenerator, RandomIdGenerator, SpanLimits};
use tracing::{Level, Metadata, Value};
use tracing_core::callsite::DefaultCallsite;
use tracing_core::field::FieldSet;
use tracing_core::metadata::Kind;

use super::batch::Batcher;
use super::open::Registration;
use super::sampler::Sampling;
use super::span::{Open, Recorded};
use super::wire::Attributes;

/// What a server span needs: the sampler, the limits, where ended spans
/// go, and the scope they are reported under.
#[derive(Debug)]
pub(super) struct Pipeline {
    pub(super) sampler: Sampling,
    pub(super) limits: SpanLimits,
    pub(super) processor: Batcher,
    pub(super) scope: InstrumentationScope,
    pub(super) ids: RandomIdGenerator,
}

/// The process's pipeline, once traces are exported.
static PIPELINE: OnceLock<Pipeline> = OnceLock::new();

/// Makes `pipeline` the one every request's edge uses.
pub(super) fn install(pipeline: Pipeline) {
    let _ = PIPELINE.set(pipeline);
}

/// What the request being polled on this thread decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Polled {
    /// No request (background work, or a request with traces off).
    Outside,
    /// A request not sampled: it makes no span.
    NotSampled,
    /// A sampled request: its server span is the current context.
    Sampled,
}

thread_local! {
    static POLLED: Cell<Polled> = const { Cell::new(Polled::Outside) };
    /// The server span's context while a sampled request is polled: made
    /// current only for a span made then ([`in_request_context`]), not at
    /// every poll.
    static CONTEXT: Cell<Option<Context>> = const { Cell::new(None) };
}

/// `true` unless the request being polled on this thread was not sampled:
/// whether a span made now for traces only would be wasted.
#[inline]
pub(super) fn polled_is_sampled() -> bool {
    POLLED.try_with(Cell::get) != Ok(Polled::NotSampled)
}

/// Runs `f` (which makes a span) with the polled request's server span as
/// the current OpenTelemetry context, so that the span made is its child.
pub fn in_request_context<R>(f: impl FnOnce() -> R) -> R {
    let Ok(context) = CONTEXT.try_with(Cell::take) else {
        return f();
    };
    let attached = context.clone().map(Context::attach);
    let made = f();
    drop(attached);
    let _ = CONTEXT.try_with(|cell| cell.set(context));
    made
}

/// A request's trace, as decided at its edge: two words, in every
/// request's future whether traces are on or not.
#[derive(Debug, Default)]
pub enum Edge {
    /// Traces are off.
    #[default]
    Off,
    /// Not sampled: the request makes no span.
    NotSampled,
    /// Sampled: its server span.
    Sampled(Box<Sampled>),
}

impl Edge {
    /// The decision for `request`, on `route` (`None`: no route matched),
    /// named `request_id`, and the trace id its log lines carry (the
    /// caller's, or the one drawn for the sampler); nothing with traces
    /// off.
    pub fn of<B>(
        request: &Request<B>,
        route: Option<&str>,
        request_id: Option<&str>,
    ) -> (Edge, Option<TraceId>) {
        match PIPELINE.get() {
            Some(pipeline) => Pipeline::edge(pipeline, request, route, request_id),
            None => (Edge::Off, None),
        }
    }

    /// `true` if the request is sampled: it has a server span.
    #[inline]
    pub fn is_sampled(&self) -> bool {
        matches!(self, Edge::Sampled(_))
    }

    /// Records the answer's status, as the conventions say: the code, and a
    /// 5xx in error.
    #[inline]
    pub fn answer(&mut self, status: u16) {
        if let Edge::Sampled(sampled) = self {
            sampled.answer(status);
        }
    }

    /// Enters the decision for one poll of the request: until the guard is
    /// dropped, `traced_span!` makes spans only if the request is sampled,
    /// and then as children of its server span.
    #[inline]
    pub fn enter(&mut self) -> Entered<'_> {
        match self {
            Edge::Off => Entered::none(),
            Edge::NotSampled => Entered::new(Polled::NotSampled, None),
            Edge::Sampled(sampled) => Entered::new(Polled::Sampled, Some(&mut sampled.context)),
        }
    }
}

/// One poll inside a request's decision ([`Edge::enter`]).
#[derive(Debug)]
#[must_use = "the decision holds while the guard lives"]
pub struct Entered<'a> {
    previous: Option<Polled>,
    /// Where the request keeps its context between polls, and the context
    /// of the request polled around this one.
    context: Option<(&'a mut Option<Context>, Option<Context>)>,
}

impl<'a> Entered<'a> {
    #[inline]
    fn none() -> Entered<'a> {
        Entered {
            previous: None,
            context: None,
        }
    }

    fn new(polled: Polled, context: Option<&'a mut Option<Context>>) -> Entered<'a> {
        let Ok(previous) = POLLED.try_with(|cell| cell.replace(polled)) else {
            // The thread is ending and its locals are gone.
            return Entered::none();
        };
        // Moved into the thread's slot, and back when the poll ends: no
        // reference count touched.
        let context = context.map(|slot| {
            let mine = slot.take();
            let outer = CONTEXT.with(|cell| cell.replace(mine));
            (slot, outer)
        });
        Entered {
            previous: Some(previous),
            context,
        }
    }
}

impl Drop for Entered<'_> {
    #[inline]
    fn drop(&mut self) {
        if let Some(previous) = self.previous {
            let _ = POLLED.try_with(|cell| cell.set(previous));
        }
        if let Some((slot, outer)) = self.context.take() {
            if let Ok(mine) = CONTEXT.try_with(|cell| cell.replace(outer)) {
                *slot = mine;
            }
        }
    }
}

/// `future`, polled inside the decision of the request polled now: for
/// work a request hands to a task of its own.
pub fn carry<F: Future>(future: F) -> Carried<F> {
    let polled = POLLED.try_with(Cell::get).unwrap_or(Polled::Outside);
    let context = if polled == Polled::Sampled {
        CONTEXT
            .try_with(|cell| {
                let context = cell.take();
                let copy = context.clone();
                cell.set(context);
                copy
            })
            .ok()
            .flatten()
    } else {
        None
    };
    Carried {
        future,
        polled,
        context,
    }
}

pin_project_lite::pin_project! {
    /// A future polled inside a request's decision ([`carry`]).
    #[derive(Debug)]
    pub struct Carried<F> {
        #[pin]
        future: F,
        polled: Polled,
        context: Option<Context>,
    }
}

impl<F: Future> Future for Carried<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<F::Output> {
        let this = self.project();
        let _entered = match *this.polled {
            Polled::Outside => Entered::none(),
            Polled::NotSampled => Entered::new(Polled::NotSampled, None),
            Polled::Sampled => Entered::new(Polled::Sampled, Some(this.context)),
        };
        this.future.poll(cx)
    }
}

impl Pipeline {
    /// The decision for `request`, taken before anything is built.
    fn edge<B>(
        &'static self,
        request: &Request<B>,
        route: Option<&str>,
        request_id: Option<&str>,
    ) -> (Edge, Option<TraceId>) {
        let headers = request.headers();
        // Most requests carry no trace: no context to parse then. Looked
        // for name by name, a comparison a header (most of them standard
        // names, told apart at once), where `contains_key` would hash the
        // name first: about 180 instructions, at every request.
        let parent = if headers.keys().any(|name| *name == TRACEPARENT) {
            super::parent_context(headers)
        } else {
            Context::new()
        };
        let parent_span = parent.span();
        let caller = parent_span.span_context();
        let from_caller = caller.is_valid();
        let trace_id = if from_caller {
            caller.trace_id()
        } else {
            self.ids.new_trace_id()
        };
        if !self.sampler.samples(&parent, trace_id) {
            // The id drawn for the sampler stays the request's in its log
            // lines, as an SDK span's would.
            return (Edge::NotSampled, Some(trace_id));
        }
        let context = SpanContext::new(
            trace_id,
            self.ids.new_span_id(),
            TraceFlags::SAMPLED,
            false,
            // As the SDK's samplers leave it: the caller's.
            caller.trace_state().clone(),
        );
        let method = request.method().as_str();
        // Room for the conventions' attributes of a request with a browser's
        // `User-Agent` and the status added when answered: a request's
        // take about 300 bytes, and growing past 256 cost a reallocation
        // (about 250 instructions) at every request sampled.
        let mut attributes = Attributes::new(self.limits.max_attributes_per_span, 512);
        request_attributes(&mut attributes, request, method, route);
        if let Some(id) = request_id {
            // What the logs and the answer's `x-request-id` name it by.
            attributes.text("request_id", id);
        }
        let parent_span_id = if from_caller {
            caller.span_id()
        } else {
            SpanId::INVALID
        };
        let open = Open::now(
            (parent_span_id, from_caller && caller.is_remote()),
            SpanKind::Server,
            name(method, route).into(),
            attributes,
        );
        let span = Recorded::new(context, open, self);
        let context = parent.with_span(span);
        let sampled = Sampled {
            context: Some(context.clone()),
            registration: Some(Registration::new(context)),
            answered: false,
        };
        (Edge::Sampled(Box::new(sampled)), Some(trace_id))
    }
}

/// A span of work done for the request polled now (a database call),
/// built straight for the exporter as the server span is: a child of the
/// server span if the request is sampled, nothing if it is not (or traces
/// are off), and outside any request a root of its own, sampled as the
/// configured sampler samples a root. It ends when dropped. One word in the
/// future of the call it times, whether traces are on or off.
#[derive(Debug)]
pub struct ChildSpan(Option<Box<Recorded>>);

impl ChildSpan {
    /// Starts the span `name` of `kind`, with the attributes `attributes`
    /// sets, called only if it is recorded.
    pub fn start(
        name: &'static str,
        kind: SpanKind,
        attributes: impl FnOnce(&mut SpanAttributes),
    ) -> ChildSpan {
        let Some(pipeline) = PIPELINE.get() else {
            return ChildSpan(None);
        };
        let polled = POLLED.try_with(Cell::get).unwrap_or(Polled::Outside);
        let parent = match polled {
            Polled::NotSampled => return ChildSpan(None),
            Polled::Sampled => CONTEXT
                .try_with(|cell| {
                    let context = cell.take();
                    let parent = context.as_ref().map(|c| c.span().span_context().clone());
                    cell.set(context);
                    parent
                })
                .ok()
                .flatten(),
            Polled::Outside => None,
        };
        let (trace_id, parent_span_id, trace_state) = match parent {
            Some(parent) => (
                parent.trace_id(),
                parent.span_id(),
                parent.trace_state().clone(),
            ),
            None => {
                let trace_id = pipeline.ids.new_trace_id();
                if !pipeline.sampler.samples(&Context::new(), trace_id) {
                    return ChildSpan(None);
                }
                (trace_id, SpanId::INVALID, TraceState::NONE)
            }
        };
        let mut encoded = SpanAttributes(Attributes::new(
            pipeline.limits.max_attributes_per_span,
            128,
        ));
        attributes(&mut encoded);
        let encoded = encoded.0;
        let context = SpanContext::new(
            trace_id,
            pipeline.ids.new_span_id(),
            TraceFlags::SAMPLED,
            false,
            trace_state,
        );
        let open = Open::now((parent_span_id, false), kind, name.into(), encoded);
        ChildSpan(Some(Box::new(Recorded::new(context, open, pipeline))))
    }

    /// `true` if the span is recorded (and will be exported).
    pub fn is_recording(&self) -> bool {
        self.0.is_some()
    }

    /// Marks the span failed: the error's `kind` as `error.type`, and the
    /// error as the status's description.
    pub fn fail(&mut self, kind: &str, error: &dyn std::fmt::Display) {
        use opentelemetry::trace::Span as _;
        if let Some(span) = &mut self.0 {
            span.set_attribute(KeyValue::new("error.type", kind.to_owned()));
            span.set_status(Status::error(error.to_string()));
        }
    }
}

/// A [`ChildSpan`]'s attributes, encoded for the exporter as they are set.
#[derive(Debug)]
pub struct SpanAttributes(Attributes);

impl SpanAttributes {
    /// The attribute `key` of text `value`, written from `value` itself:
    /// no `KeyValue` made, no string copied.
    pub fn text(&mut self, key: &str, value: &str) {
        self.0.text(key, value);
    }

    /// `attribute`, of any type.
    pub fn push(&mut self, attribute: &KeyValue) {
        self.0.push(attribute);
    }
}

/// A sampled request's server span, listed among the open ones until it
/// ends.
#[derive(Debug)]
pub struct Sampled {
    registration: Option<Registration>,
    /// The span's context, for the spans made while the request is polled
    /// ([`Edge::enter`]): in the thread's slot meanwhile.
    context: Option<Context>,
    answered: bool,
}

impl Sampled {
    fn answer(&mut self, status: u16) {
        self.answered = true;
        let Some(context) = self.registration.as_ref().map(Registration::context) else {
            return;
        };
        let span = context.span();
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

impl Drop for Sampled {
    fn drop(&mut self) {
        if let Some(registration) = self.registration.take() {
            registration.end(self.answered);
        }
    }
}

/// The W3C trace context's header.
const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");

/// The span's name, as the conventions give it: the method and the route's
/// template; the method alone for no route, so that names stay few.
fn name(method: &str, route: Option<&str>) -> String {
    let route = route.unwrap_or("");
    let mut name = String::with_capacity(method.len() + 1 + route.len());
    name.push_str(method);
    if !route.is_empty() {
        name.push(' ');
        name.push_str(route);
    }
    name
}

/// The HTTP server span's attributes, as OpenTelemetry's semantic
/// conventions name them, encoded as they are read from the request: no
/// string copied out of it, no `KeyValue` made.
fn request_attributes<B>(
    attributes: &mut Attributes,
    request: &Request<B>,
    method: &str,
    route: Option<&str>,
) {
    attributes.text("http.request.method", method);
    attributes.text("url.path", request.uri().path());
    if let Some(route) = route {
        attributes.text("http.route", route);
    }
    let version = match request.version() {
        Version::HTTP_10 => Some("1.0"),
        Version::HTTP_11 => Some("1.1"),
        Version::HTTP_2 => Some("2"),
        _ => None,
    };
    if let Some(version) = version {
        attributes.text("network.protocol.version", version);
    }
    // `Host` and `User-Agent` in one pass over the few headers a request
    // has, rather than a hashed look-up each.
    let (mut host, mut agent) = (request.uri().host(), None);
    for (name, value) in request.headers() {
        if *name == HOST && host.is_none() {
            host = value.to_str().ok();
        } else if *name == USER_AGENT && agent.is_none() {
            agent = value.to_str().ok();
        }
    }
    if let Some(host) = host {
        // `Host` may carry a port; an IPv6 literal keeps its brackets.
        let address = match host.rsplit_once(':') {
            Some((address, port)) if !port.contains(']') => address,
            _ => host,
        };
        attributes.text("server.address", address);
    }
    if let Some(agent) = agent {
        attributes.text("user_agent.original", agent);
    }
}

/// A trace id as the W3C and the logs write it, 32 lowercase hex digits,
/// written sixteen at a time ([`hex`]) rather than by the formatter's
/// machinery for a `u128`.
#[derive(Clone, Copy, Debug)]
pub struct Hex(pub TraceId);

impl std::fmt::Display for Hex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let id = u128::from_be_bytes(self.0.to_bytes());
        let mut text = [0u8; 32];
        text[..16].copy_from_slice(&hex((id >> 64) as u64));
        text[16..].copy_from_slice(&hex(id as u64));
        // Hex digits are ASCII.
        f.write_str(std::str::from_utf8(&text).map_err(|_| std::fmt::Error)?)
    }
}

/// `value`'s 16 hex digits, most significant first, with no loop and no
/// table: each nibble moved into a byte of its own, then every byte made
/// a digit at once. About 30 instructions, where a look-up a digit took
/// five times that.
fn hex(value: u64) -> [u8; 16] {
    // The most significant byte first in memory, each byte then spread
    // into a 16-bit lane of its own: its high nibble in the lane's first
    // byte, its low nibble in the second.
    let mut v = u128::from(value.swap_bytes());
    v = (v & 0xffff_ffff) | (v & 0xffff_ffff_0000_0000) << 32;
    v = (v & 0x0000_ffff_0000_0000_0000_ffff) | (v & 0xffff_0000_0000_0000_ffff_0000) << 16;
    v = (v & 0x00ff_0000_00ff_0000_00ff_0000_00ff)
        | (v & 0xff00_0000_ff00_0000_ff00_0000_ff00) << 8;
    v = (v & 0x00f0_00f0_00f0_00f0_00f0_00f0_00f0_00f0) >> 4
        | (v & 0x000f_000f_000f_000f_000f_000f_000f_000f) << 8;
    // A nibble is 10 or more if adding 6 carries into its byte's high
    // half: then 'a' - '0' - 10 more.
    const ONES: u128 = u128::MAX / 0xff;
    let past_nine = ((v + 6 * ONES) >> 4) & ONES;
    (v + u128::from(b'0') * ONES + past_nine * u128::from(b'a' - b'0' - 10)).to_le_bytes()
}

/// The `request` span's callsite: the log span of every request, made by
/// hand rather than by `info_span!`, which cannot be used while the
/// subscriber is handling a line (it would find no subscriber). Its fields
/// are the logs' and the trace id. A span for the logs only, never
/// exported ([`is_log_span`]): a request's trace is its [`Edge`]'s.
pub static LOG_CALLSITE: DefaultCallsite = DefaultCallsite::new(&LOG_META);

/// At `ERROR` level, so that no filter that lets a request's line through
/// leaves its span out: under `RUST_LOG=warn` a warning still carries the
/// request id.
pub static LOG_META: Metadata<'static> = Metadata::new(
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
        ],
        tracing_core::identify_callsite!(&LOG_CALLSITE),
    ),
    Kind::SPAN,
);

/// `true` for a request's log span: the trace layer leaves it out.
pub fn is_log_span(metadata: &Metadata<'_>) -> bool {
    metadata.callsite() == LOG_META.callsite()
}

/// A request's edge and its log span, made up front: for a service whose
/// subscriber makes every span it is given.
#[derive(Debug)]
pub struct ServerSpan {
    edge: Edge,
    span: tracing::Span,
}

impl ServerSpan {
    /// The trace of `request`, on `route` (`None`: no route matched), and
    /// its log span carrying `request_id` and the trace id.
    pub fn new<B>(
        request: &Request<B>,
        route: Option<&str>,
        request_id: Option<&str>,
    ) -> ServerSpan {
        let (edge, trace_id) = Edge::of(request, route, request_id);
        let span = if LOG_CALLSITE.interest().is_never()
            || !tracing::dispatcher::get_default(|dispatch| dispatch.enabled(&LOG_META))
        {
            tracing::Span::none()
        } else {
            let fields = LOG_META.fields();
            let field = |name| fields.field(name).expect("a field of LOG_META");
            let method = request.method().as_str();
            let route = route.unwrap_or("unmatched");
            let id = request_id.unwrap_or("");
            let trace_id = trace_id.map(|id| tracing::field::display(Hex(id)));
            let values = [
                (&field("method"), Some(&method as &dyn Value)),
                (&field("route"), Some(&route as &dyn Value)),
                (&field("request_id"), Some(&id as &dyn Value)),
                (
                    &field("trace_id"),
                    trace_id.as_ref().map(|id| id as &dyn Value),
                ),
            ];
            tracing::Span::new(&LOG_META, &fields.value_set(&values))
        };
        ServerSpan { edge, span }
    }

    /// `future` (the request), polled in its log span and its decision.
    pub async fn run<F: Future>(&mut self, future: F) -> F::Output {
        let mut future = std::pin::pin!(future);
        std::future::poll_fn(|cx| {
            let _entered = self.span.enter();
            let _decided = self.edge.enter();
            future.as_mut().poll(cx)
        })
        .await
    }

    /// Records the answer: status and latency on the log span, the status
    /// on the server span.
    pub fn answer(&mut self, status: u16, latency_ms: f64) {
        self.span.record("status", status);
        self.span.record("latency_ms", latency_ms);
        self.edge.answer(status);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trace_id_is_written_as_the_sdk_writes_it() {
        let every_digit = 0x0123_4567_89ab_cdef_fedc_ba98_7654_3210;
        for id in [
            0,
            1,
            0x4bf9_2f35_77b3_4da6_a3ce_929d_0e0e_4736,
            every_digit,
            u128::MAX,
        ] {
            let id = TraceId::from(id);
            assert_eq!(Hex(id).to_string(), id.to_string());
        }
        // And ids of every shape: a xorshift's.
        let mut state = 0x9e37_79b9_7f4a_7c15_u128;
        for _ in 0..10_000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let id = TraceId::from(state);
            assert_eq!(Hex(id).to_string(), id.to_string());
        }
    }
}
