#![doc = include_str!("../README.md")]

mod batch;
mod count;
mod export;
pub mod fields;
mod filter;
pub mod open;
mod parent;
mod sampler;
pub mod server;
mod span;
#[cfg(test)]
mod testing;
mod tls;
mod wire;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, ValueEnum};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_sdk::trace::{RandomIdGenerator, SdkTracerProvider};
use opentelemetry_sdk::Resource;
use tracing::Subscriber;
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

// The minimal service, which has this directory as its own, exports no
// metric of it: unused there.
#[allow(unused_imports)]
pub use count::spans_refused;
use count::Counts;
pub use export::ExporterError;
pub use filter::{admitted, Admitted, Exports};
use lameduck_lifecycle::{BoxError, LOG_TARGET};
pub use parent::parent_context;
pub use server::{carry, in_request_context, ChildSpan, Edge, ServerSpan, SpanAttributes};
pub use tls::CertificateError;
use tls::ExtraRoots;

/// What the logs leave out with traces on, since the exporter says once
/// when exports start failing, and why, and once when they succeed again:
/// the HTTP client's verifier's error for each certificate it refused
/// (`tls::VerifierErrors`).
pub fn logged<S>() -> impl tracing_subscriber::layer::Filter<S> {
    tls::VerifierErrors
}

/// How long the last finalizer may take to export the spans still in the
/// batch, the final flush's among them. Counted in
/// the shutdown budget when traces are on.
pub const TRACE_FLUSH_BUDGET: Duration = Duration::from_secs(2);

/// How long the export may take after a second signal: the operator asked
/// for an exit now, and a collector on the node or in the cluster answers
/// in milliseconds.
pub const TRACE_FORCE_FLUSH_BUDGET: Duration = Duration::from_millis(500);

/// What is kept back from a budget for logging the outcome.
const MARGIN: Duration = Duration::from_millis(100);

/// `true` once traces are exported: what makes the spans that exist only
/// for traces (database calls, background work) and the request span's
/// trace fields.
static ENABLED: AtomicBool = AtomicBool::new(false);

/// `true` if this process exports traces. Asked on every request and
/// every `traced_span!`: inlined into the service's crate.
#[inline]
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// `true` if a span made now for traces only would be exported: traces
/// are on, and no request not sampled is being polled here
/// ([`server::Edge::enter`]).
#[inline]
pub fn wanted() -> bool {
    enabled() && server::polled_is_sampled()
}

/// An `INFO` span, as `tracing::info_span!` makes it, when it would be
/// exported ([`wanted`]); [`tracing::Span::none`] otherwise. For the spans
/// that exist for traces only (a database call, a flush): with traces off,
/// or inside a request not sampled, they cost one branch, change no log
/// line, and do not make a request's lazy span.
#[macro_export]
macro_rules! traced_span {
    ($($span:tt)*) => {
        if $crate::wanted() {
            $crate::in_request_context(|| ::tracing::info_span!($($span)*))
        } else {
            ::tracing::Span::none()
        }
    };
}

/// A count as a span field that OpenTelemetry records as a number: its
/// attributes are signed, and `tracing-opentelemetry` writes an unsigned
/// field as text.
pub fn count(n: impl TryInto<i64>) -> i64 {
    n.try_into().unwrap_or(i64::MAX)
}

/// Marks `span` failed, saying why: `kind` as its `error.type`, and
/// `error` as the description of its status, an error. Recorded as fields,
/// which the span must declare (`tracing::field::Empty`):
/// `error.type` and `otel.status_description`; the logs leave the second
/// out. No-op on [`tracing::Span::none`].
///
/// ```
/// let span = lameduck_traces::traced_span!(
///     "nightly cleanup",
///     error.type = tracing::field::Empty,
///     otel.status_description = tracing::field::Empty,
/// );
/// lameduck_traces::fail(&span, "timeout", &"the database did not answer");
/// ```
pub fn fail(span: &tracing::Span, kind: &str, error: &dyn std::fmt::Display) {
    if span.is_none() {
        return;
    }
    span.record("error.type", kind);
    span.record("otel.status_description", error.to_string().as_str());
}

/// The OTLP transport, as `OTEL_EXPORTER_OTLP_PROTOCOL` names it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum OtlpProtocol {
    /// OTLP/gRPC (a collector's port 4317).
    #[value(name = "grpc")]
    Grpc,
    /// OTLP/HTTP with protobuf bodies (port 4318): the specification's
    /// default.
    #[default]
    #[value(name = "http/protobuf")]
    HttpProtobuf,
}

/// Where traces go; the standard variables, and flags of the same meaning.
#[derive(Clone, Debug, Default, Args)]
pub struct OtlpConfig {
    /// Export traces over OTLP to this collector (`http://collector:4318`;
    /// `/v1/traces` is added for HTTP). Off when unset. The other standard
    /// `OTEL_*` variables apply: service name, headers, sampler, batching.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT", value_name = "URL")]
    pub otlp_endpoint: Option<url::Url>,

    /// The traces endpoint itself, used as given (no path added); wins over
    /// `--otlp-endpoint`.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", value_name = "URL")]
    pub otlp_traces_endpoint: Option<url::Url>,

    /// The OTLP transport.
    #[arg(
        long,
        env = "OTEL_EXPORTER_OTLP_PROTOCOL",
        value_enum,
        default_value_t,
        value_name = "PROTOCOL"
    )]
    pub otlp_protocol: OtlpProtocol,

    /// The traces' transport; wins over `--otlp-protocol`.
    #[arg(
        long,
        env = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        value_enum,
        value_name = "PROTOCOL"
    )]
    pub otlp_traces_protocol: Option<OtlpProtocol>,
}

impl OtlpConfig {
    /// `true` if an endpoint is set: traces are exported.
    pub fn enabled(&self) -> bool {
        self.otlp_endpoint.is_some() || self.otlp_traces_endpoint.is_some()
    }

    /// The transport: the traces' own, or the general one.
    fn protocol(&self) -> OtlpProtocol {
        self.otlp_traces_protocol.unwrap_or(self.otlp_protocol)
    }

    /// The URL the exporter sends to.
    fn traces_url(&self) -> Option<String> {
        if let Some(url) = &self.otlp_traces_endpoint {
            return Some(url.to_string());
        }
        let base = self.otlp_endpoint.as_ref()?.as_str().trim_end_matches('/');
        Some(match self.protocol() {
            OtlpProtocol::Grpc => base.to_owned(),
            OtlpProtocol::HttpProtobuf => format!("{base}/v1/traces"),
        })
    }
}

/// The trace exporter could not be made: a configuration error, exit code 2.
#[derive(Debug, thiserror::Error)]
pub enum TracesError {
    /// The exporter refused its settings (an endpoint it cannot use, an
    /// invalid header), or its HTTP client could not be built.
    #[error("cannot export traces to {url}: {source}")]
    Exporter {
        /// Where the traces were to go.
        url: String,
        /// What the exporter said.
        #[source]
        source: export::ExporterError,
    },
    /// `OTEL_EXPORTER_OTLP_CERTIFICATE` (or the traces' own) names a file
    /// that is no CA certificate.
    #[error(transparent)]
    Certificate(#[from] CertificateError),
}

/// The package whose traces these are, as its `Cargo.toml` names it; made
/// by [`package!`] in the service's own crate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Package {
    /// The package's name (`my-svc`): `service.name`, unless
    /// `OTEL_SERVICE_NAME` or `OTEL_RESOURCE_ATTRIBUTES` names another.
    pub name: &'static str,
    /// Its crate's name (`my_svc`): the instrumentation scope of its spans.
    pub crate_name: &'static str,
    /// Its version: `service.version`.
    pub version: &'static str,
    /// Its description, for its command line's help.
    pub description: &'static str,
}

/// The [`Package`] this is written in: its name, crate name, version and
/// description, read from its `Cargo.toml` at compile time.
#[macro_export]
macro_rules! package {
    () => {
        $crate::Package {
            name: env!("CARGO_PKG_NAME"),
            crate_name: env!("CARGO_CRATE_NAME"),
            version: env!("CARGO_PKG_VERSION"),
            description: env!("CARGO_PKG_DESCRIPTION"),
        }
    };
}

/// The running trace pipeline: the SDK's provider, and the count of spans
/// ended and exported. Cloning is cheap.
#[derive(Clone, Debug)]
pub struct Traces {
    package: Package,
    provider: SdkTracerProvider,
    counts: Arc<Counts>,
    url: String,
    protocol: OtlpProtocol,
}

impl Traces {
    /// Starts exporting `package`'s traces as `config` says, or returns
    /// `None` if it names no endpoint. Call with the runtime entered: the
    /// gRPC exporter's channel lives on it.
    ///
    /// # Errors
    /// [`TracesError`] if the exporter cannot be made, or the CA
    /// certificates named cannot be read.
    pub fn start(config: &OtlpConfig, package: Package) -> Result<Option<Traces>, TracesError> {
        let protocol = config.protocol();
        let Some(url) = config.traces_url() else {
            return Ok(None);
        };
        // Read whatever the endpoint's scheme: a file named is meant to be
        // used, and a wrong one is better found before the collector moves
        // to `https://`.
        let extra = ExtraRoots::from_env()?;
        if protocol == OtlpProtocol::HttpProtobuf {
            // The HTTP client's TLS: rustls, with the provider the
            // service's own TLS uses.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        let exporter = export::Exporter::new(&url, protocol, extra.as_ref()).map_err(|source| {
            TracesError::Exporter {
                url: url.clone(),
                source,
            }
        })?;
        let counts = Arc::new(Counts::default());
        let resource = resource(package);
        // The provider would hand the resource to its processors; this one
        // is shared with the server spans ([`server`]), so it gets it here.
        let batch = batch::Batcher::start(
            exporter,
            &resource,
            batch::Config::from_env(),
            Arc::clone(&counts),
        )
        .map_err(|error| TracesError::Exporter {
            url: url.clone(),
            source: ExporterError::new(format!("cannot start the export thread: {error}")),
        })?;
        let provider = SdkTracerProvider::builder()
            .with_span_processor(batch.clone())
            .with_resource(resource)
            .build();
        // The sampler and limits the standard variables name, as the SDK
        // reads them for its own spans (and warns of a sampler it does not
        // know); its standard samplers' decision taken without it.
        let sdk = opentelemetry_sdk::trace::Config::default();
        server::install(server::Pipeline {
            sampler: sampler::Sampling::from_env(),
            limits: sdk.span_limits,
            processor: batch,
            scope: InstrumentationScope::builder(package.crate_name).build(),
            ids: RandomIdGenerator::default(),
        });
        ENABLED.store(true, Ordering::Relaxed);
        Ok(Some(Traces {
            package,
            provider,
            counts,
            url,
            protocol,
        }))
    }

    /// Says where the traces go: logged once logging is set up.
    pub fn log_started(&self) {
        let protocol = self.protocol.to_possible_value();
        let protocol = protocol.as_ref().map_or("", |value| value.get_name());
        tracing::info!(url = %self.url, protocol, "exporting traces");
    }

    /// The layer that turns `tracing` spans into OpenTelemetry spans: the
    /// spans of [`Traces::FILTER`] and above, but a request's log span
    /// ([`Exports`]). It needs no filter of its own, and takes only what
    /// the subscriber makes: under a filter of `RUST_LOG`'s, put
    /// [`admitted`] in the filter's place, so that a span is exported
    /// whatever the logs show.
    pub fn layer<S>(&self) -> Exports<impl Layer<S> + Send + Sync + 'static>
    where
        S: Subscriber + for<'span> LookupSpan<'span> + Send + Sync,
    {
        // No attributes for the code location, the target or the thread:
        // the same for every request, they would only add to each span.
        Exports::new(
            tracing_opentelemetry::layer()
                .with_tracer(self.provider.tracer(self.package.crate_name))
                .with_tracked_inactivity(false)
                .with_location(false)
                .with_target(false)
                .with_threads(false),
        )
    }

    /// The spans and lines exported: `INFO` and above.
    pub const FILTER: LevelFilter = LevelFilter::INFO;

    /// The last finalizer: ends the spans of requests still open, then
    /// exports what the batch holds, for at most [`TRACE_FLUSH_BUDGET`]
    /// (less a margin, so that the lifecycle never has to abandon it).
    /// What the collector did not take is logged, not failed: traces are
    /// not worth an exit code.
    ///
    /// # Errors
    /// None: the signature is a finalizer's.
    pub async fn flush(self) -> Result<(), BoxError> {
        let ended = open::end_all(open::STILL_RUNNING);
        let wait = TRACE_FLUSH_BUDGET.saturating_sub(MARGIN);
        let provider = self.provider.clone();
        // Off the runtime's workers: the wait blocks, and the gRPC
        // exporter needs this runtime meanwhile.
        let outcome = tokio::task::spawn_blocking(move || flush_within(&provider, wait))
            .await
            .unwrap_or_else(|error| Err(error.to_string()));
        self.report(outcome, ended);
        Ok(())
    }

    /// The force hook: the same export, for at most
    /// [`TRACE_FORCE_FLUSH_BUDGET`], blocking the caller meanwhile.
    ///
    /// # Errors
    /// None: the signature is a force hook's.
    pub fn flush_now(self) -> Result<(), BoxError> {
        let ended = open::end_all(open::FORCED);
        let outcome = flush_within(&self.provider, TRACE_FORCE_FLUSH_BUDGET);
        self.report(outcome, ended);
        Ok(())
    }

    /// One line: what was exported, and what was dropped and why.
    fn report(&self, outcome: Result<(), String>, ended_open: usize) {
        let (ended, exported) = self.counts.snapshot();
        let dropped = ended.saturating_sub(exported);
        match outcome {
            Ok(()) if dropped == 0 => tracing::info!(
                target: LOG_TARGET,
                spans_exported = exported,
                requests_ended_open = ended_open,
                "traces flushed"
            ),
            Ok(()) => tracing::warn!(
                target: LOG_TARGET,
                spans_exported = exported,
                spans_dropped = dropped,
                requests_ended_open = ended_open,
                "traces flushed, but the collector did not take every span"
            ),
            Err(error) => tracing::warn!(
                target: LOG_TARGET,
                spans_exported = exported,
                spans_dropped = dropped,
                requests_ended_open = ended_open,
                %error,
                "traces not flushed; spans dropped"
            ),
        }
    }
}

/// The SDK's flush, on a thread of its own, waited for at most `wait`. The
/// SDK's call blocks until its batch thread has exported (up to
/// `OTEL_EXPORTER_OTLP_TIMEOUT`, retries included); a thread still waiting
/// for a slow collector is left behind, and the process exits without it.
fn flush_within(provider: &SdkTracerProvider, wait: Duration) -> Result<(), String> {
    let (sender, receiver) = mpsc::sync_channel(1);
    let provider = provider.clone();
    std::thread::Builder::new()
        .name("trace flush".into())
        .spawn(move || {
            let _ = sender.send(provider.force_flush());
        })
        .map_err(|error| format!("cannot start the flush thread: {error}"))?;
    match receiver.recv_timeout(wait) {
        Ok(Ok(())) => Ok(()),
        Ok(Err(error)) => Err(error.to_string()),
        Err(RecvTimeoutError::Timeout) => {
            Err(format!("the collector did not answer within {wait:?}"))
        }
        Err(RecvTimeoutError::Disconnected) => {
            Err("the flush thread ended without an answer".into())
        }
    }
}

/// The service as the collector sees it: `service.name` from the standard
/// variables, or the package's name; its version.
fn resource(package: Package) -> Resource {
    let service_name = opentelemetry::Key::from_static_str("service.name");
    let detected = Resource::builder().build();
    let named = detected
        .get(&service_name)
        .is_some_and(|name| !name.as_str().starts_with("unknown_service"));
    let builder = if named {
        Resource::builder()
    } else {
        Resource::builder().with_service_name(package.name)
    };
    builder
        .with_attribute(KeyValue::new("service.version", package.version))
        .build()
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    /// A command line with nothing but the OTLP flags.
    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        otlp: OtlpConfig,
    }

    fn otlp(args: &[&str]) -> OtlpConfig {
        let argv = ["service"].iter().chain(args);
        Cli::try_parse_from(argv).expect("parses").otlp
    }

    #[test]
    fn off_without_an_endpoint() {
        assert!(!otlp(&[]).enabled());
    }

    // The standard variables' meaning: the general endpoint is a base to
    // which HTTP adds the signal's path; the traces endpoint is used as is.
    #[test]
    fn the_endpoint_is_resolved_as_the_specification_says() {
        let base = otlp(&["--otlp-endpoint", "http://collector:4318/"]);
        let url = base.traces_url();
        assert_eq!(url.as_deref(), Some("http://collector:4318/v1/traces"));
        let grpc = otlp(&[
            "--otlp-endpoint",
            "http://collector:4317/",
            "--otlp-protocol",
            "grpc",
        ]);
        assert_eq!(grpc.traces_url().as_deref(), Some("http://collector:4317"));
        let both = otlp(&[
            "--otlp-endpoint",
            "http://collector:4318",
            "--otlp-traces-endpoint",
            "https://traces.example/ingest",
        ]);
        let url = both.traces_url();
        assert_eq!(url.as_deref(), Some("https://traces.example/ingest"));
    }

    // As for the endpoint, the signal's own setting wins over the general one.
    #[test]
    fn the_traces_protocol_wins_over_the_general_one() {
        assert_eq!(otlp(&[]).protocol(), OtlpProtocol::HttpProtobuf);
        let general = otlp(&["--otlp-protocol", "grpc"]);
        assert_eq!(general.protocol(), OtlpProtocol::Grpc);
        let both = otlp(&[
            "--otlp-protocol",
            "grpc",
            "--otlp-traces-protocol",
            "http/protobuf",
            "--otlp-endpoint",
            "http://collector:4318",
        ]);
        assert_eq!(both.protocol(), OtlpProtocol::HttpProtobuf);
        let url = both.traces_url();
        assert_eq!(url.as_deref(), Some("http://collector:4318/v1/traces"));
    }

    // With traces on, the subscriber's filter says the most the logs and the
    // exports let through: without it the subscriber's hint is none, every
    // `debug!` and `trace!` of every crate (and `log`'s, through its
    // maximum level) is asked about at run time, and the SQL driver formats
    // each query for a line nobody writes.
    #[test]
    fn with_traces_on_the_level_is_still_bounded_by_rust_log_and_the_exports() {
        use tracing_subscriber::filter::{EnvFilter, FilterExt};
        use tracing_subscriber::layer::SubscriberExt;

        let subscriber = |rust_log: &str| {
            let logs = tracing_subscriber::fmt::layer().with_writer(std::io::sink);
            let exports = tracing_subscriber::fmt::layer().with_writer(std::io::sink);
            tracing_subscriber::registry()
                .with(admitted(EnvFilter::new(rust_log).and(logged())))
                .with(logs)
                .with(Exports::new(exports))
        };
        assert_eq!(subscriber("info").max_level_hint(), Some(LevelFilter::INFO));
        assert_eq!(subscriber("warn").max_level_hint(), Some(Traces::FILTER));
        let debug = subscriber("info,my_service=debug").max_level_hint();
        assert_eq!(debug, Some(LevelFilter::DEBUG));
    }

    // The lines are what `RUST_LOG` names, whatever the exporter takes; the
    // exporter takes its spans whatever `RUST_LOG` names, and never a
    // request's log span.
    #[test]
    fn the_lines_are_rust_logs_and_the_exports_the_exporters() {
        use std::sync::{Arc, Mutex};

        use tracing_subscriber::filter::{EnvFilter, FilterExt};
        use tracing_subscriber::layer::SubscriberExt;

        /// The names of the spans made, and the messages of the lines.
        #[derive(Clone, Default)]
        struct Seen(Arc<Mutex<Vec<String>>>);
        impl<S: Subscriber> Layer<S> for Seen {
            fn on_new_span(
                &self,
                attrs: &tracing::span::Attributes<'_>,
                _: &tracing::span::Id,
                _: tracing_subscriber::layer::Context<'_, S>,
            ) {
                let name = attrs.metadata().name();
                self.0.lock().expect("lock").push(format!("span {name}"));
            }
            fn on_event(
                &self,
                event: &tracing::Event<'_>,
                _: tracing_subscriber::layer::Context<'_, S>,
            ) {
                let level = event.metadata().level();
                self.0.lock().expect("lock").push(format!("line {level}"));
            }
        }
        let (lines, exports) = (Seen::default(), Seen::default());
        let subscriber = tracing_subscriber::registry()
            .with(admitted(EnvFilter::new("warn").and(logged())))
            .with(lines.clone())
            .with(Exports::new(exports.clone()));
        tracing::subscriber::with_default(subscriber, || {
            // As a request's span is made: its callsite registered, and
            // the subscriber asked first.
            assert!(!server::LOG_CALLSITE.interest().is_never());
            assert!(tracing::dispatcher::get_default(
                |d| d.enabled(&server::LOG_META)
            ));
            let request =
                tracing::Span::new(&server::LOG_META, &server::LOG_META.fields().value_set(&[]));
            let _request = request.enter();
            tracing::info_span!("flush").in_scope(|| {
                tracing::info!("not a line");
                tracing::warn!("a line");
            });
            let _ = tracing::debug_span!("neither");
        });
        let seen = |seen: &Seen| seen.0.lock().expect("lock").clone();
        assert_eq!(seen(&lines), ["span request", "span flush", "line WARN"]);
        assert_eq!(seen(&exports), ["span flush", "line WARN"]);
    }

    #[test]
    fn a_protocol_the_service_does_not_speak_is_refused() {
        let argv = ["service", "--otlp-protocol", "http/json"];
        let error = Cli::try_parse_from(argv).expect_err("refused");
        assert!(error.to_string().contains("--otlp-protocol"), "{error}");
    }
}
