//! Spans to OTLP's protobuf bytes, written straight from the SDK's span
//! data: an `ExportTraceServiceRequest`, as the OpenTelemetry protocol
//! defines it (`opentelemetry/proto/collector/trace/v1`), with no message
//! structs in between.
//!
//! The exporter of `opentelemetry-otlp` first copies every span into the
//! generated message types (an allocation for each id, name, key and
//! value), then encodes those: about 11,000 instructions a span, more than
//! the whole budget of a span here. This writes the same message in one
//! pass; the receiver the tests run decodes it with the generated types.

use std::time::{SystemTime, UNIX_EPOCH};

use opentelemetry::trace::{SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceState};
use opentelemetry::{Array, InstrumentationScope, KeyValue, Value};
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanLinks};
use opentelemetry_sdk::Resource;
use prost::encoding::{encoded_len_varint, WireType};

/// The wire type of each kind of field, by what it holds.
const LEN: WireType = WireType::LengthDelimited;

/// `span.flags`: the context's `is_remote` is known (`0x100`), and set
/// (`0x200`), as the SDK's own exporter writes them.
const HAS_IS_REMOTE: u32 = 0x100;
const IS_REMOTE: u32 = 0x200;

/// The encoded `Resource` and `schema_url` of a process: the same for
/// every export, so written once.
#[derive(Debug, Default)]
pub(super) struct Encoder {
    resource: Vec<u8>,
    schema_url: Option<String>,
}

impl Encoder {
    /// Spans from now on are `resource`'s.
    pub(super) fn set_resource(&mut self, resource: &Resource) {
        self.resource.clear();
        for (key, value) in resource.iter() {
            let attribute = KeyValue::new(key.clone(), value.clone());
            attribute_field(&mut self.resource, 1, &attribute);
        }
        self.schema_url = resource.schema_url().map(str::to_owned);
    }

    /// An export request to be written: its resource, and `scope` opened
    /// for the spans that follow ([`Body::push`]), in a buffer of
    /// `capacity` bytes.
    pub(super) fn open(&self, scope: Scope<'_>, capacity: usize) -> Body {
        let (pipelines, scope) = match scope {
            Scope::Pipeline(scope) => (true, scope),
            Scope::Other(scope) => (false, scope),
        };
        let mut bytes = Vec::with_capacity(capacity);
        // `ExportTraceServiceRequest.resource_spans`: lengths reserved at
        // the size a batch's take, three bytes, up to 2 MiB.
        let resource_spans = open(&mut bytes, 1, 3);
        message(&mut bytes, 1, |buf| buf.extend_from_slice(&self.resource));
        let scope_spans = open(&mut bytes, 2, 3);
        message(&mut bytes, 1, |buf| instrumentation_scope(buf, scope));
        Body {
            bytes,
            resource_spans,
            first: (scope.clone(), scope_spans),
            first_is_pipelines: pipelines,
            others: Vec::new(),
        }
    }

    /// The request's bytes: the first scope closed, the others after it,
    /// then the resource's schema.
    pub(super) fn close(&self, body: Body) -> Vec<u8> {
        let Body {
            mut bytes,
            resource_spans,
            first: (scope, scope_spans),
            others,
            ..
        } = body;
        string(&mut bytes, 3, scope.schema_url().unwrap_or(""));
        close(&mut bytes, scope_spans, 3);
        for (scope, spans) in others {
            message_sized(&mut bytes, 2, 3, |buf| {
                message(buf, 1, |buf| instrumentation_scope(buf, &scope));
                buf.extend_from_slice(&spans);
                string(buf, 3, scope.schema_url().unwrap_or(""));
            });
        }
        if let Some(url) = &self.schema_url {
            string(&mut bytes, 3, url);
        }
        close(&mut bytes, resource_spans, 3);
        bytes
    }

    /// `spans` as one export request's body, grouped by scope in the order
    /// each scope first appears.
    #[cfg(test)]
    pub(super) fn request(&self, spans: &[SpanData]) -> Vec<u8> {
        let mut body = self.open(Scope::Other(&spans[0].instrumentation_scope), 0);
        let mut encoded = Vec::new();
        for data in spans {
            encoded.clear();
            span(&mut encoded, &Fields::of(data));
            body.push(Scope::Other(&data.instrumentation_scope), &encoded);
        }
        self.close(body)
    }
}

/// The scope a span is reported under.
#[derive(Clone, Copy, Debug)]
pub(super) enum Scope<'a> {
    /// The pipeline's own (`super::server`'s): that of every span made
    /// without the SDK. There is one pipeline.
    Pipeline(&'a InstrumentationScope),
    /// Another, or the same reached another way (the SDK's spans).
    Other(&'a InstrumentationScope),
}

/// An export request being written ([`Encoder::open`]). The spans of the
/// scope it was opened with — nearly always all of them: a process has one
/// or two scopes — are appended in place, where they are sent from; another
/// scope's wait apart, and are copied in when it is closed.
#[derive(Debug)]
pub(super) struct Body {
    bytes: Vec<u8>,
    /// Where the lengths of the `ResourceSpans` and of the first scope's
    /// `ScopeSpans` go.
    resource_spans: usize,
    first: (InstrumentationScope, usize),
    /// The first scope is the pipeline's.
    first_is_pipelines: bool,
    /// The `spans` fields of each other scope's `ScopeSpans`, in the order
    /// the scopes first appeared.
    others: Vec<(InstrumentationScope, Vec<u8>)>,
}

impl Body {
    /// Appends a span of `scope`, `encoded` by [`span`].
    pub(super) fn push(&mut self, scope: Scope<'_>, encoded: &[u8]) {
        let scope = match scope {
            // Known without comparing (which collects each side's
            // attributes into a vector first).
            Scope::Pipeline(_) if self.first_is_pipelines => {
                self.bytes.extend_from_slice(encoded);
                return;
            }
            Scope::Pipeline(scope) | Scope::Other(scope) => scope,
        };
        if *scope == self.first.0 {
            self.bytes.extend_from_slice(encoded);
            return;
        }
        let spans = match self.others.iter().position(|(known, _)| known == scope) {
            Some(index) => &mut self.others[index].1,
            None => {
                self.others.push((scope.clone(), Vec::new()));
                &mut self.others.last_mut().expect("just pushed").1
            }
        };
        spans.extend_from_slice(encoded);
    }

    /// The room the request's bytes have before they must move.
    #[cfg(test)]
    pub(super) fn capacity(&self) -> usize {
        self.bytes.capacity()
    }
}

/// A span, as [`span`] writes it: the SDK's data ([`Fields::of`]), or a
/// span recorded here (`super::span`), whose attributes are encoded
/// already.
#[derive(Debug)]
pub(super) struct Fields<'a> {
    pub(super) context: &'a SpanContext,
    pub(super) parent_span_id: SpanId,
    pub(super) parent_span_is_remote: bool,
    pub(super) kind: &'a SpanKind,
    pub(super) name: &'a str,
    pub(super) start_time: SystemTime,
    pub(super) end_time: SystemTime,
    /// Attributes already encoded ([`Attributes`]), written first.
    pub(super) encoded: &'a [u8],
    /// The others.
    pub(super) attributes: &'a [KeyValue],
    pub(super) dropped_attributes_count: u32,
    pub(super) events: &'a SpanEvents,
    pub(super) links: &'a SpanLinks,
    pub(super) status: &'a Status,
}

impl<'a> Fields<'a> {
    /// The SDK's span data, as [`span`] writes it.
    pub(super) fn of(span: &'a SpanData) -> Fields<'a> {
        Fields {
            context: &span.span_context,
            parent_span_id: span.parent_span_id,
            parent_span_is_remote: span.parent_span_is_remote,
            kind: &span.span_kind,
            name: &span.name,
            start_time: span.start_time,
            end_time: span.end_time,
            encoded: &[],
            attributes: &span.attributes,
            dropped_attributes_count: span.dropped_attributes_count,
            events: &span.events,
            links: &span.links,
            status: &span.status,
        }
    }
}

/// `span` as a `ScopeSpans`' `spans` field: its key, its length and its
/// message, ready to be appended to its scope's others.
pub(super) fn span(buf: &mut Vec<u8>, span: &Fields<'_>) {
    // A span's length takes two bytes up to 16 KiB.
    message_sized(buf, 2, 2, |buf| span_fields(buf, span));
}

/// A span's attributes, encoded as they are given, as [`span`] writes a
/// `KeyValue`, within the limit of a span's attributes
/// (`OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT`, as the SDK applies it: the first
/// ones kept, the others counted).
#[derive(Debug)]
pub(super) struct Attributes {
    bytes: Vec<u8>,
    count: u32,
    dropped: u32,
    limit: u32,
}

impl Attributes {
    /// None yet, in `capacity` bytes; at most `limit` kept.
    pub(super) fn new(limit: u32, capacity: usize) -> Attributes {
        Attributes {
            bytes: Vec::with_capacity(capacity),
            count: 0,
            dropped: 0,
            limit,
        }
    }

    /// `true` if one more is kept; counts it either way.
    fn room(&mut self) -> bool {
        if self.count < self.limit {
            self.count += 1;
            true
        } else {
            self.dropped = self.dropped.saturating_add(1);
            false
        }
    }

    /// The attribute `key` of text `value` ([`text_attribute`]).
    pub(super) fn text(&mut self, key: &str, value: &str) {
        if self.room() {
            text_attribute(&mut self.bytes, key, value);
        }
    }

    /// `attribute`.
    pub(super) fn push(&mut self, attribute: &KeyValue) {
        if self.room() {
            attribute_field(&mut self.bytes, 9, attribute);
        }
    }

    /// The attributes kept, encoded.
    pub(super) fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// How many were past the limit.
    pub(super) fn dropped(&self) -> u32 {
        self.dropped
    }
}

/// A span's attribute of text `value`, written as [`span`] writes a
/// `KeyValue` of a string: for the attributes a server span takes from its
/// request, encoded from the request's own bytes with no string copied
/// out of it. Room is made once, for the longest the keys and lengths can
/// take.
pub(super) fn text_attribute(buf: &mut Vec<u8>, key: &str, value: &str) {
    text_field(buf, 9, key, value);
}

/// A `KeyValue` message of text `value`, as field `tag`.
fn text_field(buf: &mut Vec<u8>, tag: u32, key: &str, value: &str) {
    let value_len = field_len(value.len());
    let key_len = if key.is_empty() {
        0
    } else {
        field_len(key.len())
    };
    let len = key_len + field_len(value_len);
    if len < 0x80 && tag < 0x10 && !key.is_empty() {
        // Nearly every attribute: each key and length one byte, written
        // four at a time (a store each, where a byte at a time would check
        // the room eight times).
        buf.reserve(2 + len);
        buf.extend_from_slice(&[key_byte(tag), len as u8, KEY_1, key.len() as u8]);
        buf.extend_from_slice(key.as_bytes());
        buf.extend_from_slice(&[KEY_2, value_len as u8, KEY_1, value.len() as u8]);
        buf.extend_from_slice(value.as_bytes());
        return;
    }
    // Four keys of at most five bytes, four lengths of at most ten.
    buf.reserve(60 + key.len() + value.len());
    encode_key(tag, LEN, buf);
    encode_varint(len as u64, buf);
    if !key.is_empty() {
        encode_key(1, LEN, buf);
        encode_varint(key.len() as u64, buf);
        buf.extend_from_slice(key.as_bytes());
    }
    encode_key(2, LEN, buf);
    encode_varint(value_len as u64, buf);
    encode_key(1, LEN, buf);
    encode_varint(value.len() as u64, buf);
    buf.extend_from_slice(value.as_bytes());
}

/// The one-byte key of a length-delimited field whose number is under 16.
const fn key_byte(tag: u32) -> u8 {
    (tag << 3 | LEN as u32) as u8
}

/// Fields 1 and 2 of a message, length-delimited: a `KeyValue`'s key and
/// value, an `AnyValue`'s string.
const KEY_1: u8 = key_byte(1);
const KEY_2: u8 = key_byte(2);

/// `value` as a varint, the one byte of most values here first.
#[inline]
fn encode_varint(mut value: u64, buf: &mut Vec<u8>) {
    while value > 0x7f {
        // The low seven bits, more to follow.
        buf.push((value & 0x7f) as u8 | 0x80);
        value >>= 7;
    }
    buf.push(value as u8);
}

/// A field's key: its number and wire type.
#[inline]
fn encode_key(tag: u32, wire_type: WireType, buf: &mut Vec<u8>) {
    encode_varint(u64::from(tag << 3 | wire_type as u32), buf);
}

/// A length-delimited field `tag` holding `content`: room made once, the
/// key and length pushed byte by byte (a copy of two bytes would cost a
/// call of `memcpy`), the content copied.
#[inline]
fn bytes(buf: &mut Vec<u8>, tag: u32, content: &[u8]) {
    // A key and a length: at most 5 and 10 bytes.
    buf.reserve(15 + content.len());
    encode_key(tag, LEN, buf);
    encode_varint(content.len() as u64, buf);
    buf.extend_from_slice(content);
}

/// A string field, left out when empty (proto3's default).
fn string(buf: &mut Vec<u8>, tag: u32, value: &str) {
    if !value.is_empty() {
        bytes(buf, tag, value.as_bytes());
    }
}

/// A varint field (`uint32`, `int64`, an enum), left out when zero.
fn varint(buf: &mut Vec<u8>, tag: u32, value: u64) {
    if value != 0 {
        encode_key(tag, WireType::Varint, buf);
        encode_varint(value, buf);
    }
}

/// A `fixed64` field, left out when zero.
fn fixed64(buf: &mut Vec<u8>, tag: u32, value: u64) {
    if value != 0 {
        encode_key(tag, WireType::SixtyFourBit, buf);
        buf.extend_from_slice(&value.to_le_bytes());
    }
}

/// A `fixed32` field, left out when zero.
fn fixed32(buf: &mut Vec<u8>, tag: u32, value: u32) {
    if value != 0 {
        encode_key(tag, WireType::ThirtyTwoBit, buf);
        buf.extend_from_slice(&value.to_le_bytes());
    }
}

/// A message field whose content `write` appends: written in place after
/// a one-byte length, which most messages here (an attribute, a status)
/// fit.
fn message(buf: &mut Vec<u8>, tag: u32, write: impl FnOnce(&mut Vec<u8>)) {
    message_sized(buf, tag, 1, write);
}

/// [`message`], with `reserved` bytes left for the length: the content is
/// moved only if its length's varint takes another number of bytes.
fn message_sized(buf: &mut Vec<u8>, tag: u32, reserved: usize, write: impl FnOnce(&mut Vec<u8>)) {
    let start = open(buf, tag, reserved);
    write(buf);
    close(buf, start, reserved);
}

/// Starts a message field whose content follows, leaving `reserved` bytes
/// for its length; says where they are, for [`close`].
fn open(buf: &mut Vec<u8>, tag: u32, reserved: usize) -> usize {
    encode_key(tag, LEN, buf);
    let start = buf.len();
    buf.resize(start + reserved, 0);
    start
}

/// Ends the message [`open`] started at `start`: everything after its
/// reserved bytes is its content.
fn close(buf: &mut Vec<u8>, start: usize, reserved: usize) {
    let end = buf.len();
    let len = end - start - reserved;
    let needed = encoded_len_varint(len as u64);
    if needed > reserved {
        buf.resize(end + needed - reserved, 0);
        buf.copy_within(start + reserved..end, start + needed);
    } else if needed < reserved {
        buf.copy_within(start + reserved..end, start + needed);
        buf.truncate(end - (reserved - needed));
    }
    // The length's varint, in the bytes left for it.
    let mut value = len as u64;
    for slot in &mut buf[start..start + needed] {
        let more = if value > 0x7f { 0x80 } else { 0 };
        *slot = (value & 0x7f) as u8 | more;
        value >>= 7;
    }
}

fn nanos(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH).map_or(0, |since| {
        u64::try_from(since.as_nanos()).unwrap_or(u64::MAX)
    })
}

fn instrumentation_scope(buf: &mut Vec<u8>, scope: &InstrumentationScope) {
    string(buf, 1, scope.name());
    string(buf, 2, scope.version().unwrap_or(""));
    for attribute in scope.attributes() {
        attribute_field(buf, 3, attribute);
    }
}

fn span_fields(buf: &mut Vec<u8>, span: &Fields<'_>) {
    let context = span.context;
    bytes(buf, 1, &context.trace_id().to_bytes());
    bytes(buf, 2, &context.span_id().to_bytes());
    // Most spans have none: no string made for it then.
    if *context.trace_state() != TraceState::NONE {
        string(buf, 3, &context.trace_state().header());
    }
    if span.parent_span_id != SpanId::INVALID {
        bytes(buf, 4, &span.parent_span_id.to_bytes());
    }
    string(buf, 5, span.name);
    let kind = match span.kind {
        SpanKind::Internal => 1,
        SpanKind::Server => 2,
        SpanKind::Client => 3,
        SpanKind::Producer => 4,
        SpanKind::Consumer => 5,
    };
    varint(buf, 6, kind);
    fixed64(buf, 7, nanos(span.start_time));
    fixed64(buf, 8, nanos(span.end_time));
    buf.extend_from_slice(span.encoded);
    for attribute in span.attributes {
        attribute_field(buf, 9, attribute);
    }
    varint(buf, 10, u64::from(span.dropped_attributes_count));
    for event in &span.events.events {
        message(buf, 11, |buf| {
            fixed64(buf, 1, nanos(event.timestamp));
            string(buf, 2, &event.name);
            for attribute in &event.attributes {
                attribute_field(buf, 3, attribute);
            }
            varint(buf, 4, u64::from(event.dropped_attributes_count));
        });
    }
    varint(buf, 12, u64::from(span.events.dropped_count));
    for link in &span.links.links {
        message(buf, 13, |buf| {
            let context = &link.span_context;
            bytes(buf, 1, &context.trace_id().to_bytes());
            bytes(buf, 2, &context.span_id().to_bytes());
            string(buf, 3, &context.trace_state().header());
            for attribute in &link.attributes {
                attribute_field(buf, 4, attribute);
            }
            varint(buf, 5, u64::from(link.dropped_attributes_count));
            let remote = if context.is_remote() { IS_REMOTE } else { 0 };
            fixed32(
                buf,
                6,
                flags(context.trace_flags()) | HAS_IS_REMOTE | remote,
            );
        });
    }
    varint(buf, 14, u64::from(span.links.dropped_count));
    // The status is always written, as the SDK's exporter writes it.
    message(buf, 15, |buf| match span.status {
        Status::Unset => {}
        Status::Ok => varint(buf, 3, 1),
        Status::Error { description } => {
            string(buf, 2, description);
            varint(buf, 3, 2);
        }
    });
    let remote = if span.parent_span_is_remote {
        IS_REMOTE
    } else {
        0
    };
    fixed32(
        buf,
        16,
        flags(context.trace_flags()) | HAS_IS_REMOTE | remote,
    );
}

fn flags(flags: TraceFlags) -> u32 {
    u32::from(flags.to_u8())
}

/// An attribute, as the `KeyValue` message of field `tag`.
fn attribute_field(buf: &mut Vec<u8>, tag: u32, attribute: &KeyValue) {
    let key = attribute.key.as_str();
    if let Value::String(text) = &attribute.value {
        text_field(buf, tag, key, text.as_str());
        return;
    }
    // A scalar's length is known before it is written (most attributes
    // are strings): its message is written straight, with no length to
    // fix up afterwards.
    let value_len = match &attribute.value {
        Value::Bool(_) => Some(2),
        Value::I64(number) => {
            Some(1 + encoded_len_varint(u64::from_ne_bytes(number.to_ne_bytes())))
        }
        Value::F64(_) => Some(9),
        _ => None,
    };
    let Some(value_len) = value_len else {
        message(buf, tag, |buf| {
            string(buf, 1, key);
            message(buf, 2, |buf| any_value(buf, &attribute.value));
        });
        return;
    };
    let key_len = if key.is_empty() {
        0
    } else {
        field_len(key.len())
    };
    encode_key(tag, LEN, buf);
    encode_varint((key_len + field_len(value_len)) as u64, buf);
    string(buf, 1, key);
    encode_key(2, LEN, buf);
    encode_varint(value_len as u64, buf);
    any_value(buf, &attribute.value);
}

/// The bytes of a length-delimited field of `len` bytes, with a one-byte
/// key.
fn field_len(len: usize) -> usize {
    1 + encoded_len_varint(len as u64) + len
}

fn any_value(buf: &mut Vec<u8>, value: &Value) {
    match value {
        Value::String(text) => bytes(buf, 1, text.as_str().as_bytes()),
        Value::Bool(flag) => {
            encode_key(2, WireType::Varint, buf);
            encode_varint(u64::from(*flag), buf);
        }
        Value::I64(number) => {
            encode_key(3, WireType::Varint, buf);
            // `int64`: two's complement, as a varint.
            encode_varint(u64::from_ne_bytes(number.to_ne_bytes()), buf);
        }
        Value::F64(number) => {
            encode_key(4, WireType::SixtyFourBit, buf);
            buf.extend_from_slice(&number.to_le_bytes());
        }
        Value::Array(array) => message(buf, 5, |buf| match array {
            Array::Bool(values) => each(buf, values, |v| Value::Bool(*v)),
            Array::I64(values) => each(buf, values, |v| Value::I64(*v)),
            Array::F64(values) => each(buf, values, |v| Value::F64(*v)),
            Array::String(values) => each(buf, values, |v| Value::String(v.clone())),
            // A kind this crate's version does not know: written empty.
            _ => {}
        }),
        // A kind this crate's version does not know: an empty value.
        _ => {}
    }
}

/// An `ArrayValue`'s `values`.
fn each<T>(buf: &mut Vec<u8>, values: &[T], value: impl Fn(&T) -> Value) {
    for item in values {
        message(buf, 1, |buf| any_value(buf, &value(item)));
    }
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;
    use std::time::Duration;

    use opentelemetry::trace::{Event, Link, SpanContext, TraceFlags, TraceId, TraceState};
    use opentelemetry::{Array, StringValue};
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::transform::common::tonic::ResourceAttributesWithSchema;
    use opentelemetry_proto::transform::trace::tonic::group_spans_by_resource_and_scope;
    use opentelemetry_sdk::trace::{SpanEvents, SpanLinks};
    use prost::Message as _;

    use super::*;

    fn context(trace: u128, span: u64, remote: bool) -> SpanContext {
        let state = TraceState::from_key_value([("vendor", "x1")]).expect("a trace state");
        SpanContext::new(
            TraceId::from(trace),
            SpanId::from(span),
            TraceFlags::SAMPLED,
            remote,
            state,
        )
    }

    /// Spans with every kind of field: two scopes, a remote parent and a
    /// root, each attribute type, an event, a link, each status; one span
    /// of under 128 bytes, one of 128 or more, one of over 16 KiB.
    fn spans() -> Vec<SpanData> {
        let start = UNIX_EPOCH + Duration::from_nanos(1_764_000_000_123_456_789);
        let scope = InstrumentationScope::builder("lameduck").build();
        let other = InstrumentationScope::builder("other")
            .with_version("1.2")
            .with_attributes([KeyValue::new("scope.attr", true)])
            .build();
        let attributes = vec![
            KeyValue::new("http.request.method", "GET"),
            KeyValue::new("url.path", "/a-code".to_owned()),
            KeyValue::new("http.response.status_code", 307_i64),
            KeyValue::new("negative", -5_i64),
            KeyValue::new("ratio", 0.25),
            KeyValue::new("flag", false),
            KeyValue::new(
                "list",
                Value::Array(Array::String(vec![StringValue::from("a"), "b".into()])),
            ),
            KeyValue::new("numbers", Value::Array(Array::I64(vec![1, -2]))),
        ];
        let mut events = SpanEvents::default();
        events.events.push(Event::new(
            "retry",
            start + Duration::from_micros(10),
            vec![KeyValue::new("attempt", 2_i64)],
            1,
        ));
        events.dropped_count = 3;
        let mut links = SpanLinks::default();
        links.links.push(Link::new(
            context(0xdef, 0x22, true),
            vec![KeyValue::new("why", "batch")],
            0,
        ));
        let server = SpanData {
            span_context: context(0xabc, 0x11, false),
            parent_span_id: SpanId::from(0x99),
            parent_span_is_remote: true,
            span_kind: SpanKind::Server,
            name: Cow::Borrowed("GET /{code}"),
            start_time: start,
            end_time: start + Duration::from_micros(1500),
            attributes,
            dropped_attributes_count: 2,
            events,
            links,
            status: Status::error("abandoned: the shutdown deadline passed"),
            instrumentation_scope: scope.clone(),
        };
        let database = SpanData {
            span_context: context(0xabc, 0x12, false),
            parent_span_id: SpanId::from(0x11),
            parent_span_is_remote: false,
            span_kind: SpanKind::Client,
            name: Cow::Owned("SELECT links".to_owned()),
            attributes: vec![KeyValue::new("db.system.name", "sqlite")],
            status: Status::Ok,
            instrumentation_scope: other,
            events: SpanEvents::default(),
            links: SpanLinks::default(),
            dropped_attributes_count: 0,
            ..server.clone()
        };
        let root = SpanData {
            span_context: context(0x123, 0x13, false),
            parent_span_id: SpanId::INVALID,
            parent_span_is_remote: false,
            span_kind: SpanKind::Internal,
            name: Cow::Borrowed("write-behind final flush"),
            // Longer than a span's two bytes of length say: moved up.
            attributes: vec![KeyValue::new("error", "x".repeat(20_000))],
            status: Status::Unset,
            events: SpanEvents::default(),
            links: SpanLinks::default(),
            dropped_attributes_count: 0,
            ..server.clone()
        };
        vec![server, database, root]
    }

    // What the receiver decodes from these bytes is what it decodes from
    // the SDK exporter's: the same message, field for field.
    #[test]
    fn the_bytes_decode_to_what_the_sdk_exporter_sends() {
        let resource = Resource::builder_empty()
            .with_service_name("lameduck")
            .with_attribute(KeyValue::new("service.version", "0.1.0"))
            .with_schema_url([], "https://opentelemetry.io/schemas/1.30.0")
            .build();
        let mut encoder = Encoder::default();
        encoder.set_resource(&resource);
        let ours = ExportTraceServiceRequest::decode(&encoder.request(&spans())[..])
            .expect("our bytes decode");
        let theirs = ExportTraceServiceRequest {
            resource_spans: group_spans_by_resource_and_scope(
                spans(),
                &ResourceAttributesWithSchema::from(&resource),
            ),
        };
        let theirs = ExportTraceServiceRequest::decode(&theirs.encode_to_vec()[..])
            .expect("the SDK's bytes decode");
        assert_eq!(ours, theirs);
        let scopes = &ours.resource_spans[0].scope_spans;
        assert_eq!(scopes.len(), 2, "{ours:#?}");
        assert_eq!(scopes[0].spans.len(), 2, "{ours:#?}");
    }

    // The pipeline's spans are grouped by their scope's value, as any
    // other: with the spans of an equal scope, whichever scope came first.
    #[test]
    fn the_pipelines_spans_are_grouped_as_any_others() {
        fn scope<'a>(data: &'a SpanData, pipelines: &'a InstrumentationScope) -> Scope<'a> {
            if data.instrumentation_scope == *pipelines {
                Scope::Pipeline(pipelines)
            } else {
                Scope::Other(&data.instrumentation_scope)
            }
        }

        let encoder = Encoder::default();
        let pipelines = InstrumentationScope::builder("lameduck").build();
        for order in [[0, 1, 2], [1, 0, 2]] {
            let spans: Vec<SpanData> = order.iter().map(|&n| spans().swap_remove(n)).collect();
            let mut body = encoder.open(scope(&spans[0], &pipelines), 0);
            for data in &spans {
                let mut encoded = Vec::new();
                span(&mut encoded, &Fields::of(data));
                body.push(scope(data, &pipelines), &encoded);
            }
            assert_eq!(encoder.close(body), encoder.request(&spans), "{order:?}");
        }
    }

    // The attributes a server span encodes from its request are the
    // `KeyValue`s they stand for, ahead of the span data's own.
    #[test]
    fn text_attributes_encode_as_key_values_do() {
        let texts = [
            ("url.path", "/a-code"),
            ("empty", ""),
            ("long", &"y".repeat(300)[..]),
        ];
        let mut with_keys = spans().swap_remove(1);
        let mut encoded = Vec::new();
        for (key, value) in texts {
            text_attribute(&mut encoded, key, value);
        }
        let mut ours = Vec::new();
        let fields = Fields {
            encoded: &encoded,
            ..Fields::of(&with_keys)
        };
        span(&mut ours, &fields);
        let mut attributes: Vec<KeyValue> = texts
            .iter()
            .map(|(key, value)| KeyValue::new(*key, (*value).to_owned()))
            .collect();
        attributes.append(&mut with_keys.attributes);
        with_keys.attributes = attributes;
        let mut theirs = Vec::new();
        span(&mut theirs, &Fields::of(&with_keys));
        assert_eq!(ours, theirs);
    }
}
