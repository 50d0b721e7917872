//! A span recorded without the SDK's tracer: its data is the SDK's own
//! [`SpanData`], filled in place and handed to the span processor when it
//! ends, as the SDK's span does.
//!
//! The server span of a sampled request is one ([`super::server`]): the
//! sampling decision was taken at the edge, so nothing here samples again,
//! draws ids or looks at a parent. It lives in an OpenTelemetry
//! [`Context`](opentelemetry::Context), which the request's database calls
//! find as their parent and the last flush can end ([`super::open`]).

use std::borrow::Cow;
use std::time::SystemTime;

use opentelemetry::trace::{Event, Link, SpanContext, Status};
use opentelemetry::KeyValue;
use opentelemetry_sdk::trace::{SpanData, SpanLimits};

use super::batch::Batcher;

/// A recording span: [`SpanData`] until it ends, then nothing.
#[derive(Debug)]
pub(super) struct Recorded {
    context: SpanContext,
    data: Option<SpanData>,
    /// Attributes already encoded, ahead of the data's own, and how many.
    encoded: Vec<u8>,
    encoded_count: usize,
    limits: SpanLimits,
    processor: Batcher,
}

impl Recorded {
    /// A span of `data` (its `span_context` is the span's), which ends into
    /// `processor`.
    pub(super) fn new(data: SpanData, limits: SpanLimits, processor: Batcher) -> Recorded {
        Recorded::with_encoded(data, (Vec::new(), 0), limits, processor)
    }

    /// [`Recorded::new`], with `encoded`: attributes already encoded
    /// (`super::wire::text_attribute`), and how many, counted within
    /// the limit of a span's attributes.
    pub(super) fn with_encoded(
        data: SpanData,
        encoded: (Vec<u8>, usize),
        limits: SpanLimits,
        processor: Batcher,
    ) -> Recorded {
        Recorded {
            context: data.span_context.clone(),
            data: Some(data),
            encoded: encoded.0,
            encoded_count: encoded.1,
            limits,
            processor,
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
        let Some(data) = &mut self.data else {
            return;
        };
        if data.events.events.len() >= self.limits.max_events_per_span as usize {
            data.events.dropped_count += 1;
            return;
        }
        let limit = self.limits.max_attributes_per_event as usize;
        let dropped = u32::try_from(attributes.len().saturating_sub(limit)).unwrap_or(u32::MAX);
        let mut attributes = attributes;
        attributes.truncate(limit);
        let event = Event::new(name, timestamp, attributes, dropped);
        data.events.events.push(event);
    }

    fn span_context(&self) -> &SpanContext {
        &self.context
    }

    fn is_recording(&self) -> bool {
        self.data.is_some()
    }

    fn set_attribute(&mut self, attribute: KeyValue) {
        let Some(data) = &mut self.data else {
            return;
        };
        let count = self.encoded_count + data.attributes.len();
        if count < self.limits.max_attributes_per_span as usize {
            data.attributes.push(attribute);
        } else {
            data.dropped_attributes_count += 1;
        }
    }

    /// As the SDK's: the statuses form a total order, `Ok` > `Error` >
    /// `Unset`, and only a higher one replaces the one set.
    fn set_status(&mut self, status: Status) {
        if let Some(data) = &mut self.data {
            if status > data.status {
                data.status = status;
            }
        }
    }

    fn update_name<T>(&mut self, new_name: T)
    where
        T: Into<Cow<'static, str>>,
    {
        if let Some(data) = &mut self.data {
            data.name = new_name.into();
        }
    }

    fn add_link(&mut self, span_context: SpanContext, attributes: Vec<KeyValue>) {
        let Some(data) = &mut self.data else {
            return;
        };
        if data.links.links.len() >= self.limits.max_links_per_span as usize {
            data.links.dropped_count += 1;
            return;
        }
        data.links
            .links
            .push(Link::new(span_context, attributes, 0));
    }

    fn end_with_timestamp(&mut self, timestamp: SystemTime) {
        if let Some(mut data) = self.data.take() {
            data.end_time = timestamp;
            self.processor.end(data, &self.encoded);
        }
    }
}

/// Like the SDK's, a span dropped without an end ends then.
impl Drop for Recorded {
    fn drop(&mut self) {
        opentelemetry::trace::Span::end(self);
    }
}
