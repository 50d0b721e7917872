//! A span recorded without the SDK's tracer: what the exporter needs of it,
//! filled in place and written out for the batch when it ends.
//!
//! The server span of a sampled request is one ([`super::server`]), and so
//! is a database call's: the sampling decision was taken at the edge, so
//! nothing here samples again, draws ids or looks at a parent. Its
//! attributes are encoded as they come: it holds no `KeyValue`, and is no
//! SDK `SpanData`, which was moved whole at each step and carried a copy
//! of the scope. It lives in an OpenTelemetry
//! [`Context`](opentelemetry::Context), which the request's database calls
//! find as their parent and the last flush can end ([`super::open`]).

use std::borrow::Cow;
use std::time::SystemTime;

use opentelemetry::trace::{Event, Link, SpanContext, SpanId, SpanKind, Status};
use opentelemetry::KeyValue;
use opentelemetry_sdk::trace::{SpanEvents, SpanLinks};

use super::server::Pipeline;
use super::wire;

/// A span still open: everything but its context and its end.
#[derive(Debug)]
pub(super) struct Open {
    parent_span_id: SpanId,
    parent_span_is_remote: bool,
    kind: SpanKind,
    name: Cow<'static, str>,
    start_time: SystemTime,
    /// The attributes, encoded as they are set, and how many: those
    /// past `OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT` are counted, not kept.
    attributes: wire::Attributes,
    status: Status,
    events: SpanEvents,
    links: SpanLinks,
}

impl Open {
    /// A span starting now, a child of `parent` (its id, and whether it is
    /// remote; `SpanId::INVALID` for a root), with no status, event or
    /// link yet.
    pub(super) fn now(
        parent: (SpanId, bool),
        kind: SpanKind,
        name: Cow<'static, str>,
        attributes: wire::Attributes,
    ) -> Open {
        Open {
            parent_span_id: parent.0,
            parent_span_is_remote: parent.1,
            kind,
            name,
            start_time: opentelemetry::time::now(),
            attributes,
            status: Status::Unset,
            events: SpanEvents::default(),
            links: SpanLinks::default(),
        }
    }
}

/// A recording span: [`Open`] until it ends, then nothing.
#[derive(Debug)]
pub(super) struct Recorded {
    context: SpanContext,
    open: Option<Open>,
    pipeline: &'static Pipeline,
}

impl Recorded {
    /// A span of `context`, which ends into `pipeline`'s processor.
    pub(super) fn new(context: SpanContext, open: Open, pipeline: &'static Pipeline) -> Recorded {
        Recorded {
            context,
            open: Some(open),
            pipeline,
        }
    }
}

impl opentelemetry::trace::Span for Recorded {
    fn add_event_with_timestamp<T>(
        &mut self,
        name: T,
        timestamp: SystemTime,
        attributes: Vec<KeyValue>,
    ) where
        T: Into<Cow<'static, str>>,
    {
        let Some(open) = &mut self.open else {
            return;
        };
        let limits = &self.pipeline.limits;
        if open.events.events.len() >= limits.max_events_per_span as usize {
            open.events.dropped_count += 1;
            return;
        }
        let limit = limits.max_attributes_per_event as usize;
        let dropped = u32::try_from(attributes.len().saturating_sub(limit)).unwrap_or(u32::MAX);
        let mut attributes = attributes;
        attributes.truncate(limit);
        let event = Event::new(name, timestamp, attributes, dropped);
        open.events.events.push(event);
    }

    fn span_context(&self) -> &SpanContext {
        &self.context
    }

    fn is_recording(&self) -> bool {
        self.open.is_some()
    }

    fn set_attribute(&mut self, attribute: KeyValue) {
        if let Some(open) = &mut self.open {
            open.attributes.push(&attribute);
        }
    }

    /// As the SDK's: the statuses form a total order, `Ok` > `Error` >
    /// `Unset`, and only a higher one replaces the one set.
    fn set_status(&mut self, status: Status) {
        if let Some(open) = &mut self.open {
            if status > open.status {
                open.status = status;
            }
        }
    }

    fn update_name<T>(&mut self, new_name: T)
    where
        T: Into<Cow<'static, str>>,
    {
        if let Some(open) = &mut self.open {
            open.name = new_name.into();
        }
    }

    fn add_link(&mut self, span_context: SpanContext, attributes: Vec<KeyValue>) {
        let Some(open) = &mut self.open else {
            return;
        };
        if open.links.links.len() >= self.pipeline.limits.max_links_per_span as usize {
            open.links.dropped_count += 1;
            return;
        }
        open.links
            .links
            .push(Link::new(span_context, attributes, 0));
    }

    fn end_with_timestamp(&mut self, timestamp: SystemTime) {
        // Read where it is, and dropped once written: moving the open span
        // out first cost a copy of it.
        let Some(open) = &self.open else {
            return;
        };
        let fields = wire::Fields {
            context: &self.context,
            parent_span_id: open.parent_span_id,
            parent_span_is_remote: open.parent_span_is_remote,
            kind: &open.kind,
            name: &open.name,
            start_time: open.start_time,
            end_time: timestamp,
            encoded: open.attributes.bytes(),
            attributes: &[],
            dropped_attributes_count: open.attributes.dropped(),
            events: &open.events,
            links: &open.links,
            status: &open.status,
        };
        let pipeline = self.pipeline;
        let scope = wire::Scope::Pipeline(&pipeline.scope);
        pipeline.processor.end(scope, &fields);
        self.open = None;
    }
}

/// Like the SDK's, a span dropped without an end ends then.
impl Drop for Recorded {
    fn drop(&mut self) {
        opentelemetry::trace::Span::end(self);
    }
}
