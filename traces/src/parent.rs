//! The caller's trace, from the W3C `traceparent` (and `tracestate`) a
//! request carries.

use http::HeaderMap;
use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::Context;
use opentelemetry_sdk::propagation::TraceContextPropagator;

/// The context a request's headers name as its parent: empty (a new trace
/// starts) when they name none, or a malformed one.
pub fn parent_context(headers: &HeaderMap) -> Context {
    TraceContextPropagator::new().extract(&Headers(headers))
}

/// A header map, as the propagator reads it.
struct Headers<'a>(&'a HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|value| value.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|name| name.as_str()).collect()
    }
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;
    use opentelemetry::trace::TraceContextExt;

    use super::*;

    #[test]
    fn a_traceparent_names_the_parent_and_anything_else_starts_a_trace() {
        let mut headers = HeaderMap::new();
        headers.insert(
            "traceparent",
            HeaderValue::from_static("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
        );
        let parent = parent_context(&headers);
        let span = parent.span();
        let context = span.span_context();
        assert!(context.is_remote());
        assert_eq!(
            context.trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(context.span_id().to_string(), "00f067aa0ba902b7");

        headers.insert("traceparent", HeaderValue::from_static("00-zz-00-01"));
        assert!(!parent_context(&headers).span().span_context().is_valid());
        assert!(!parent_context(&HeaderMap::new()).has_active_span());
    }
}
