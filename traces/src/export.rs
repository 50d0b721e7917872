//! The OTLP exporter: each export request the batch processor
//! ([`super::batch`]) has encoded ([`super::wire`]), sent over OTLP/HTTP
//! (protobuf) or OTLP/gRPC, with the standard variables' settings:
//! `OTEL_EXPORTER_OTLP_HEADERS`, `…_TIMEOUT` and `…_COMPRESSION` (`gzip` or
//! `none`), each in its traces' form first (`OTEL_EXPORTER_OTLP_TRACES_…`),
//! as the specification says.
//!
//! It replaces the exporter of `opentelemetry-otlp` for one reason: that one
//! copies each span into generated message structs before encoding them,
//! which cost more than the whole budget of a span ([`super::wire`]).

use std::time::{Duration, Instant};

use bytes::{Buf, BufMut, Bytes};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder as TonicEncoder};
use tonic::transport::{Channel, Endpoint};

use super::batch::Sender;
use super::tls::{self, ExtraRoots};
use super::OtlpProtocol;

/// How long an export may take when no variable says: the specification's
/// default.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// The gRPC method of an export.
const EXPORT_METHOD: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";

/// The exporter could not be made from its settings.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ExporterError(String);

impl ExporterError {
    pub(super) fn new(message: String) -> ExporterError {
        ExporterError(message)
    }
}

/// The settings the standard variables give an export.
#[derive(Clone, Debug)]
struct Settings {
    headers: Vec<(String, String)>,
    timeout: Duration,
    gzip: bool,
}

impl Settings {
    /// As the variables say, each traces' variable winning over the general
    /// one.
    fn from_env() -> Settings {
        let read = |name: &str| {
            let traces = name.replace("OTEL_EXPORTER_OTLP_", "OTEL_EXPORTER_OTLP_TRACES_");
            std::env::var(traces).or_else(|_| std::env::var(name)).ok()
        };
        let timeout = [
            "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
            "OTEL_EXPORTER_OTLP_TIMEOUT",
        ]
        .into_iter()
        .find_map(|name| std::env::var(name).ok()?.trim().parse().ok())
        .map_or(DEFAULT_TIMEOUT, Duration::from_millis);
        let gzip = match read("OTEL_EXPORTER_OTLP_COMPRESSION") {
            Some(value) if value.trim().eq_ignore_ascii_case("gzip") => true,
            Some(value) if value.trim().eq_ignore_ascii_case("none") || value.is_empty() => false,
            Some(value) => {
                tracing::warn!(compression = %value, "unknown OTLP compression ignored: gzip or none");
                false
            }
            None => false,
        };
        let headers = read("OTEL_EXPORTER_OTLP_HEADERS")
            .map(|value| parse_headers(&value))
            .unwrap_or_default();
        Settings {
            headers,
            timeout,
            gzip,
        }
    }
}

/// `key=value` pairs separated by commas, values percent-decoded, as the
/// specification writes `OTEL_EXPORTER_OTLP_HEADERS`; pairs without a key
/// or a value are left out.
fn parse_headers(value: &str) -> Vec<(String, String)> {
    value
        .split(',')
        .filter_map(|pair| {
            let (key, value) = pair.split_once('=')?;
            let (key, value) = (key.trim(), value.trim());
            let decoded = percent_encoding::percent_decode_str(value).decode_utf8();
            let value = decoded.map_or_else(|_| value.to_owned(), |value| value.into_owned());
            (!key.is_empty() && !value.is_empty()).then(|| (key.to_owned(), value))
        })
        .collect()
}

/// Where the exports go, and how.
#[derive(Debug)]
enum Transport {
    Http {
        client: otlp_http_client::blocking::Client,
        url: String,
        headers: otlp_http_client::header::HeaderMap,
    },
    Grpc {
        client: tonic::client::Grpc<Channel>,
        metadata: tonic::metadata::MetadataMap,
        /// The runtime the channel's connection lives on: the export
        /// thread waits for each call on it.
        runtime: tokio::runtime::Handle,
    },
}

/// The exporter the batch processor sends each batch through.
#[derive(Debug)]
pub(super) struct Exporter {
    transport: Transport,
    settings: Settings,
}

impl Exporter {
    /// An exporter to `url` over `protocol`, trusting `extra` beside the
    /// transport's default roots. Call with the runtime entered: the gRPC
    /// channel's connection lives on it.
    pub(super) fn new(
        url: &str,
        protocol: OtlpProtocol,
        extra: Option<&ExtraRoots>,
    ) -> Result<Exporter, ExporterError> {
        let settings = Settings::from_env();
        let invalid =
            |what: &str, error: &dyn std::fmt::Display| ExporterError(format!("{what}: {error}"));
        let transport = match protocol {
            OtlpProtocol::HttpProtobuf => {
                let client = tls::http_client(extra, settings.timeout)?;
                let mut headers = otlp_http_client::header::HeaderMap::new();
                for (key, value) in &settings.headers {
                    let name = otlp_http_client::header::HeaderName::try_from(key.as_str())
                        .map_err(|error| invalid("a header's name", &error))?;
                    let value = otlp_http_client::header::HeaderValue::try_from(value.as_str())
                        .map_err(|error| invalid("a header's value", &error))?;
                    headers.append(name, value);
                }
                let content_type =
                    otlp_http_client::header::HeaderValue::from_static("application/x-protobuf");
                headers.insert(otlp_http_client::header::CONTENT_TYPE, content_type);
                if settings.gzip {
                    let gzip = otlp_http_client::header::HeaderValue::from_static("gzip");
                    headers.insert(otlp_http_client::header::CONTENT_ENCODING, gzip);
                }
                Transport::Http {
                    client,
                    url: url.to_owned(),
                    headers,
                }
            }
            OtlpProtocol::Grpc => {
                let mut endpoint = Endpoint::from_shared(url.to_owned())
                    .map_err(|error| invalid("the endpoint", &error))?
                    .timeout(settings.timeout);
                if url.starts_with("https:") {
                    endpoint = endpoint
                        .tls_config(tls::grpc(extra))
                        .map_err(|error| invalid("the TLS settings", &error))?;
                }
                let mut client = tonic::client::Grpc::new(endpoint.connect_lazy());
                if settings.gzip {
                    client = client.send_compressed(tonic::codec::CompressionEncoding::Gzip);
                }
                let mut metadata = tonic::metadata::MetadataMap::new();
                for (key, value) in &settings.headers {
                    let key = tonic::metadata::MetadataKey::from_bytes(
                        key.to_ascii_lowercase().as_bytes(),
                    )
                    .map_err(|error| invalid("a header's name", &error))?;
                    let value = value
                        .parse()
                        .map_err(|error| invalid("a header's value", &error))?;
                    metadata.append(key, value);
                }
                let runtime = tokio::runtime::Handle::try_current()
                    .map_err(|error| invalid("the gRPC channel's runtime", &error))?;
                Transport::Grpc {
                    client,
                    metadata,
                    runtime,
                }
            }
        };
        Ok(Exporter {
            transport,
            settings,
        })
    }

    /// Sends one request's `body` over HTTP, on this thread (the batch
    /// processor's own).
    fn post(
        &self,
        client: &otlp_http_client::blocking::Client,
        url: &str,
        headers: &otlp_http_client::header::HeaderMap,
        body: Bytes,
    ) -> Result<(), Failure> {
        let response = client
            .post(url)
            .headers(headers.clone())
            .body(body)
            .send()
            .map_err(|error| {
                let message = lameduck_lifecycle::error_chain(&error);
                if error.is_connect() {
                    Failure::Retryable(message)
                } else {
                    Failure::Final(message)
                }
            })?;
        let status = response.status();
        match status.as_u16() {
            200..=299 => Ok(()),
            // Busy, or a proxy without the collector behind it: worth
            // another try, as the specification says.
            429 | 502 | 503 | 504 => Err(Failure::Retryable(format!(
                "the collector answered {status}"
            ))),
            _ => Err(Failure::Final(format!("the collector answered {status}"))),
        }
    }

    /// Sends one request's `body` over gRPC.
    async fn call(
        &self,
        client: &tonic::client::Grpc<Channel>,
        metadata: &tonic::metadata::MetadataMap,
        body: Bytes,
    ) -> Result<(), Failure> {
        let mut client = client.clone();
        client
            .ready()
            .await
            .map_err(|error| Failure::Retryable(error.to_string()))?;
        let mut request = tonic::Request::new(body);
        *request.metadata_mut() = metadata.clone();
        request.set_timeout(self.settings.timeout);
        let path = http::uri::PathAndQuery::from_static(EXPORT_METHOD);
        match client.unary(request, path, Raw).await {
            Ok(_) => Ok(()),
            Err(status) => {
                use tonic::Code;
                let retry = matches!(
                    status.code(),
                    Code::Unavailable | Code::ResourceExhausted | Code::Aborted | Code::Cancelled
                );
                let message = status.to_string();
                Err(if retry {
                    Failure::Retryable(message)
                } else {
                    Failure::Final(message)
                })
            }
        }
    }
}

/// An export that failed, and whether another try could succeed.
#[derive(Debug)]
enum Failure {
    Retryable(String),
    Final(String),
}

/// Tries an export at most this many times, while another try could
/// succeed (the collector unreachable, or busy).
const ATTEMPTS: u32 = 3;

/// The wait before the second try; doubled before each next one.
const FIRST_BACKOFF: Duration = Duration::from_millis(100);

fn gzip(body: &[u8]) -> Result<Vec<u8>, String> {
    use std::io::Write as _;
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    encoder
        .write_all(body)
        .and_then(|()| encoder.finish())
        .map_err(|error| format!("export failed: {error}"))
}

impl Sender for Exporter {
    /// Sends one export request's `body`, on this thread (the batch
    /// processor's own); a failure another try could cure is tried again
    /// ([`ATTEMPTS`], waiting [`FIRST_BACKOFF`], then twice as long),
    /// within the export's timeout.
    fn send(&self, body: Vec<u8>) -> Result<(), String> {
        let started = Instant::now();
        let body = match &self.transport {
            Transport::Http { .. } if self.settings.gzip => gzip(&body)?,
            _ => body,
        };
        let body = Bytes::from(body);
        let mut backoff = FIRST_BACKOFF;
        for attempt in 1..=ATTEMPTS {
            let sent = match &self.transport {
                Transport::Http {
                    client,
                    url,
                    headers,
                } => self.post(client, url, headers, body.clone()),
                Transport::Grpc {
                    client,
                    metadata,
                    runtime,
                } => runtime.block_on(self.call(client, metadata, body.clone())),
            };
            let message = match sent {
                Ok(()) => return Ok(()),
                Err(Failure::Final(message)) => return Err(format!("export failed: {message}")),
                Err(Failure::Retryable(message)) => message,
            };
            let time_left = self.settings.timeout.saturating_sub(started.elapsed());
            if attempt == ATTEMPTS || time_left <= backoff {
                return Err(format!("export failed: {message} ({attempt} tries)"));
            }
            // The batch processor's own thread: a wait here holds no one
            // else up.
            std::thread::sleep(backoff);
            backoff *= 2;
        }
        Err("export failed: no try made".to_owned())
    }
}

/// The gRPC codec of a request already encoded: its bytes go out as they
/// are, and the answer (an `ExportTraceServiceResponse`, whose partial
/// success the SDK's exporter only logs at debug level) is read and set
/// aside.
#[derive(Clone, Copy, Debug, Default)]
struct Raw;

impl Codec for Raw {
    type Encode = Bytes;
    type Decode = ();
    type Encoder = Raw;
    type Decoder = Raw;

    fn encoder(&mut self) -> Raw {
        Raw
    }

    fn decoder(&mut self) -> Raw {
        Raw
    }
}

impl TonicEncoder for Raw {
    type Item = Bytes;
    type Error = tonic::Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        // Room for all of it first: `put` would grow the buffer 64 bytes at
        // a time past its first 8 KiB, moving what it holds each time it
        // must reallocate.
        dst.reserve(item.len());
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for Raw {
    type Item = ();
    type Error = tonic::Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<()>, tonic::Status> {
        src.advance(src.remaining());
        Ok(Some(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_are_read_as_the_specification_writes_them() {
        let parsed = parse_headers("authorization=Bearer%20t0ken, x-tenant = tests ,=x,empty=,bad");
        assert_eq!(
            parsed,
            [
                ("authorization".to_owned(), "Bearer t0ken".to_owned()),
                ("x-tenant".to_owned(), "tests".to_owned()),
            ]
        );
    }
}
