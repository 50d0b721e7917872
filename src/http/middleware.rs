//! The steps of the production middleware ([`super::stack`] and
//! [`super::admission`] run them): the Host check, the announced body size,
//! the answers to shed, panicking and failed requests, the answer's log line.

use std::any::Any;
use std::time::Duration;

use axum::body::Body;
use axum::body::HttpBody as _;
use axum::extract::Request;
use axum::http::header::{CONTENT_LENGTH, CONTENT_TYPE, HOST};
use axum::http::{HeaderValue, Response, StatusCode, Version};
use axum::response::IntoResponse;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;

use super::ApiError;
use crate::telemetry::request_span;

/// Counters of requests the middleware answered itself.
#[derive(Clone, Debug, Default)]
pub struct GuardMetrics {
    shed: Counter,
    timeouts: Counter,
    panics: Counter,
}

impl GuardMetrics {
    /// Counts a request that timed out.
    pub fn timed_out(&self) {
        self.timeouts.inc();
    }

    /// Registers the series.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "requests_shed",
            "Requests refused at once with 503 because the concurrency limit was reached",
            self.shed.clone(),
        );
        registry.register(
            "requests_timed_out",
            "Requests that did not produce a response within the request timeout",
            self.timeouts.clone(),
        );
        registry.register(
            "handler_panics",
            "Handlers that panicked (answered 500)",
            self.panics.clone(),
        );
    }
}

/// What is wrong with `request`'s host, if anything: the stack refuses
/// with 400 a request that does not say, once and validly, which
/// host it is for, as RFC 9112 §3.2 requires of a server: an HTTP/1.1
/// request without a `Host` header, any request with more than one, or one
/// whose value is not `host[:port]`. HTTP/1.0 may omit it. HTTP/2 names the
/// host in `:authority` (hyper puts it in the URI), so a request there is
/// refused only if it has neither.
///
/// hyper checks none of this, and a request without a host is how a
/// confused proxy or a smuggled request looks; answering it would hide the
/// fault.
pub fn host_problem<B>(request: &axum::http::Request<B>) -> Option<&'static str> {
    let mut hosts = request.headers().get_all(HOST).iter();
    let host = hosts.next();
    if hosts.next().is_some() {
        return Some("the request must have one Host header, not several");
    }
    let version = request.version();
    match host {
        Some(host) if !is_host_and_port(host.as_bytes()) => {
            Some("the Host header must be a host name or address with an optional port")
        }
        Some(_) => None,
        None if version == Version::HTTP_11 => Some("an HTTP/1.1 request must have a Host header"),
        None if matches!(version, Version::HTTP_2 | Version::HTTP_3)
            && request.uri().authority().is_none() =>
        {
            Some("an HTTP/2 request must have an :authority or a Host header")
        }
        None => None,
    }
}

/// The bytes of a host name or an IP literal: unreserved, sub-delims and
/// `%` of percent-encoding (RFC 3986 §3.2.2), as a table.
static HOST_NAME_BYTES: [bool; 256] = {
    let mut table = [false; 256];
    let mut byte = 0;
    while byte < 256 {
        table[byte] = (byte as u8).is_ascii_alphanumeric();
        byte += 1;
    }
    let others = b"-._~!$&'()*+,;=%";
    let mut i = 0;
    while i < others.len() {
        table[others[i] as usize] = true;
        i += 1;
    }
    table
};

/// Whether `value` is `uri-host [":" port]` (RFC 9110 §7.2). Empty is valid:
/// it is what a client sends for a target without an authority.
fn is_host_and_port(value: &[u8]) -> bool {
    let is_name_byte = |b: &u8| HOST_NAME_BYTES[usize::from(*b)];
    let (host, port) = if value.first() == Some(&b'[') {
        // An IP literal: the brackets hold no host name, and a ':' inside
        // them is not the port's.
        let Some(close) = value.iter().position(|&b| b == b']') else {
            return false;
        };
        let literal = &value[1..close];
        if !literal.iter().all(|b| is_name_byte(b) || *b == b':') {
            return false;
        }
        match &value[close + 1..] {
            [] => return true,
            [b':', port @ ..] => (&[][..], port),
            _ => return false,
        }
    } else {
        match value.iter().rposition(|&b| b == b':') {
            Some(colon) => (&value[..colon], &value[colon + 1..]),
            None => (value, &[][..]),
        }
    };
    host.iter().all(is_name_byte) && port.iter().all(u8::is_ascii_digit)
}

/// The largest body size `request` announces: every `Content-Length` value
/// (hyper has already refused HTTP/1.1 requests whose values disagree or
/// are not numbers), and the body's own lower bound, which hyper sets from
/// the header on HTTP/1.1 and HTTP/2 alike.
pub fn announced_body_size(request: &Request) -> u64 {
    let declared = request
        .headers()
        .get_all(CONTENT_LENGTH)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .filter_map(|length| length.trim().parse::<u64>().ok())
        .max()
        .unwrap_or(0);
    declared.max(request.body().size_hint().lower())
}

/// The answer to a request shed by the concurrency limit: 503 at once, with
/// a hint to retry.
pub fn shed(metrics: &GuardMetrics) -> Response<Body> {
    metrics.shed.inc();
    ApiError::RetryLater {
        message: "server is at capacity; retry shortly".to_owned(),
        retry_after_secs: 1,
    }
    .into_response()
}

/// The answer to a panicking handler: 500 with a JSON body that says
/// nothing of the panic (it is logged).
pub fn panic_response(
    metrics: &GuardMetrics,
    panic: Box<dyn Any + Send + 'static>,
) -> Response<Body> {
    metrics.panics.inc();
    let message = crate::lifecycle::panic_message(&*panic);
    tracing::error!(panic = %message, "handler panicked");
    ApiError::Internal("handler panicked".into()).into_response()
}

/// Whether `response` is an error answer without a JSON body: rejections
/// from axum's extractors come as plain text, and get one from
/// [`json_error_body`].
pub fn lacks_json_body(response: &Response<Body>) -> bool {
    let status = response.status();
    // The status first: a success's headers are not looked at.
    (status.is_client_error() || status.is_server_error())
        && !response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .is_some_and(|value| value.starts_with("application/json"))
}

/// Gives an error answer a JSON body if it has none: clients get
/// `{"error": ...}` everywhere.
pub async fn json_error_body(response: Response<Body>) -> Response<Body> {
    if !lacks_json_body(&response) {
        return response;
    }
    let status = response.status();
    let (mut parts, body) = response.into_parts();
    let detail = match axum::body::to_bytes(body, 1024).await {
        Ok(bytes) if !bytes.is_empty() => String::from_utf8_lossy(&bytes).trim().to_owned(),
        _ => status.canonical_reason().unwrap_or("error").to_lowercase(),
    };
    let body = serde_json::json!({ "error": detail }).to_string();
    parts
        .headers
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    parts.headers.remove(axum::http::header::CONTENT_LENGTH);
    Response::from_parts(parts, Body::from(body))
}

/// Records the status and latency on the request's span (see
/// [`RequestSpan`](crate::telemetry::RequestSpan)), and logs the answer: at
/// debug level, so that per-request lines cost nothing unless asked for
/// (`RUST_LOG=lameduck::http=debug`); a 500 at warn. Called inside the
/// request's span.
pub fn on_response(response: &Response<Body>, latency: Duration) {
    let status = response.status().as_u16();
    request_span::record_answer(status, latency.as_secs_f64() * 1000.0);
    if response.status() == StatusCode::INTERNAL_SERVER_ERROR {
        tracing::warn!(status, ?latency, "request failed");
    } else {
        tracing::debug!(status, ?latency, "request finished");
    }
}

#[cfg(test)]
mod tests {
    use axum::http::Method;

    use super::*;

    fn request(version: Version, uri: &str, hosts: &[&str]) -> Request {
        let mut builder = axum::http::Request::builder().version(version).uri(uri);
        for host in hosts {
            builder = builder.header(HOST, *host);
        }
        builder.body(Body::empty()).expect("request")
    }

    #[test]
    fn an_http11_request_needs_exactly_one_valid_host() {
        let v11 = Version::HTTP_11;
        assert_eq!(host_problem(&request(v11, "/", &["lameduck"])), None);
        let missing = host_problem(&request(v11, "/", &[])).expect("refused");
        assert!(missing.contains("must have a Host"), "{missing}");
        let two = host_problem(&request(v11, "/", &["a", "a"])).expect("refused");
        assert!(two.contains("not several"), "{two}");
        // An absolute-form target does not excuse a missing Host.
        assert!(host_problem(&request(v11, "http://lameduck/", &[])).is_some());
        assert!(host_problem(&request(v11, "/", &["a b"])).is_some());
    }

    #[test]
    fn http10_may_omit_the_host_and_http2_may_carry_it_in_the_authority() {
        assert_eq!(host_problem(&request(Version::HTTP_10, "/", &[])), None);
        assert!(host_problem(&request(Version::HTTP_10, "/", &["a", "b"])).is_some());
        let h2 = Version::HTTP_2;
        assert_eq!(host_problem(&request(h2, "http://lameduck/", &[])), None);
        assert_eq!(host_problem(&request(h2, "/", &["lameduck"])), None);
        let neither = host_problem(&request(h2, "/", &[])).expect("refused");
        assert!(neither.contains(":authority"), "{neither}");
        assert!(host_problem(&request(h2, "http://lameduck/", &["a", "b"])).is_some());
    }

    #[test]
    fn host_values_are_a_host_and_an_optional_port() {
        for valid in [
            "lameduck",
            "lameduck.test:8080",
            "127.0.0.1:0",
            "[::1]",
            "[::1]:8080",
            "xn--bcher-kva.example",
            "under_score",
            "",
        ] {
            assert!(is_host_and_port(valid.as_bytes()), "{valid:?}");
        }
        for invalid in [
            "a b",
            "user@lameduck",
            "lameduck:http",
            "a:1:2",
            "[::1",
            "[::1]x",
            "[::1]:x",
            "a/b",
            "ünï",
        ] {
            assert!(!is_host_and_port(invalid.as_bytes()), "{invalid:?}");
        }
    }

    #[test]
    fn the_announced_body_size_is_the_largest_of_the_header_and_the_body() {
        let with_length = |length: &str, body: Body| {
            axum::http::Request::builder()
                .header(CONTENT_LENGTH, length)
                .body(body)
                .expect("request")
        };
        let huge = with_length("10000000000", Body::empty());
        assert_eq!(announced_body_size(&huge), 10_000_000_000);
        let folded = with_length("7, 7", Body::empty());
        assert_eq!(announced_body_size(&folded), 7);
        let unannounced = axum::http::Request::new(Body::from(vec![0; 100]));
        assert_eq!(announced_body_size(&unannounced), 100);
        assert_eq!(
            announced_body_size(&axum::http::Request::new(Body::empty())),
            0
        );
    }

    // The answer's status and latency go on the request's span (in one
    // `record`): every line the request logged, or logs later, carries them.
    #[test]
    fn the_answer_s_status_and_latency_are_recorded_on_the_request_span() {
        use std::sync::{Arc, Mutex};
        use tracing::field::{Field, Visit};
        use tracing_subscriber::layer::{Context, SubscriberExt};

        /// Every value recorded on a span after its creation, as
        /// `name=value`.
        #[derive(Clone, Default)]
        struct Recorded(Arc<Mutex<Vec<String>>>);

        impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Recorded {
            fn on_record(
                &self,
                _: &tracing::Id,
                values: &tracing::span::Record<'_>,
                _: Context<'_, S>,
            ) {
                struct Values<'a>(&'a mut Vec<String>);
                impl Visit for Values<'_> {
                    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
                        self.0.push(format!("{}={value:?}", field.name()));
                    }
                }
                values.record(&mut Values(&mut self.0.lock().expect("lock")));
            }
        }

        let recorded = Recorded::default();
        let subscriber = tracing_subscriber::registry().with(recorded.clone());
        tracing::subscriber::with_default(subscriber, || {
            let mut span = crate::telemetry::RequestSpan::new(&Method::GET, None, None);
            let response = StatusCode::NOT_FOUND.into_response();
            span.in_scope(|| on_response(&response, Duration::from_micros(2500)));
        });
        assert_eq!(
            *recorded.0.lock().expect("lock"),
            ["status=404", "latency_ms=2.5"]
        );
    }
}
