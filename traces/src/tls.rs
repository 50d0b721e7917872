//! The collector's TLS: what an `https://` endpoint's certificate is checked
//! against. Each transport has default roots of its own library's choosing —
//! the gRPC exporter (tonic) the Mozilla roots compiled in by `webpki-roots`,
//! the HTTP exporter (reqwest) the system's store, read once at startup by
//! `rustls-platform-verifier` — and both add the CA certificates of
//! `OTEL_EXPORTER_OTLP_CERTIFICATE`, which the SDK (0.33) does not read:
//! a private collector's CA, trusted beside the defaults, never instead.
//!
//! The SDK exporter's own gRPC default for an `https://` endpoint trusts no
//! root at all (an empty `ClientTlsConfig`), and its HTTP default is a
//! client built with the export timeout only; here both are built with the
//! roots above, and the HTTP client has the export's timeout.
//!
//! A certificate refused says why once, in the exporter's warning that
//! exports are failing, over either transport; the HTTP client's verifier,
//! which says so at every attempt, is left out of the logs
//! ([`VerifierErrors`]).

use std::path::{Path, PathBuf};
use std::time::Duration;

use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, TrustAnchor};
use rustls::RootCertStore;
use tonic::transport::ClientTlsConfig;
use tracing::subscriber::Interest;
use tracing_subscriber::filter::LevelFilter;

use super::export::ExporterError;

/// The standard variable: a PEM file of CA certificates for every signal.
pub(super) const CERTIFICATE: &str = "OTEL_EXPORTER_OTLP_CERTIFICATE";

/// The traces' own; wins over [`CERTIFICATE`].
pub(super) const TRACES_CERTIFICATE: &str = "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE";

/// CA certificates a user trusts beside the default roots, read and checked
/// once at startup: a file that changes later is not read again.
#[derive(Clone, Debug)]
pub(super) struct ExtraRoots {
    /// As the file holds them, for the HTTP client.
    certificates: Vec<CertificateDer<'static>>,
    /// The same, parsed, for the gRPC channel.
    anchors: Vec<TrustAnchor<'static>>,
}

/// The CA certificates named cannot be used: a configuration error, exit
/// code 2, naming the variable and the file.
#[derive(Debug, thiserror::Error)]
#[error("{variable}={}: {problem}", path.display())]
pub struct CertificateError {
    variable: &'static str,
    path: PathBuf,
    #[source]
    problem: Problem,
}

/// What is wrong with the file.
#[derive(Debug, thiserror::Error)]
enum Problem {
    #[error("cannot read the file")]
    Read(#[source] std::io::Error),
    #[error("not a PEM file")]
    Pem(#[source] pem::Error),
    #[error("no CERTIFICATE in the file")]
    Empty,
    #[error("certificate {number} of the file is not a valid X.509 certificate")]
    Invalid {
        number: usize,
        #[source]
        source: rustls::Error,
    },
}

impl ExtraRoots {
    /// The file the traces' variable names, or else the general one's;
    /// `None` if neither is set. Empty is unset, as the SDK reads its own.
    ///
    /// # Errors
    /// [`CertificateError`] if the file named cannot be used.
    pub(super) fn from_env() -> Result<Option<ExtraRoots>, CertificateError> {
        for variable in [TRACES_CERTIFICATE, CERTIFICATE] {
            match std::env::var_os(variable) {
                Some(path) if !path.is_empty() => {
                    return ExtraRoots::read(variable, Path::new(&path)).map(Some);
                }
                _ => {}
            }
        }
        Ok(None)
    }

    /// Reads every certificate of the PEM file at `path`, which `variable`
    /// named. Other sections (a key) are skipped; a file with no
    /// certificate, or one that is not X.509, is refused now rather than
    /// failing every export later.
    ///
    /// # Errors
    /// [`CertificateError`] if the file cannot be read or holds no usable
    /// certificate.
    pub(super) fn read(
        variable: &'static str,
        path: &Path,
    ) -> Result<ExtraRoots, CertificateError> {
        let refuse = |problem| CertificateError {
            variable,
            path: path.to_owned(),
            problem,
        };
        let pem = std::fs::read(path).map_err(|error| refuse(Problem::Read(error)))?;
        let certificates = CertificateDer::pem_slice_iter(&pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|error| refuse(Problem::Pem(error)))?;
        if certificates.is_empty() {
            return Err(refuse(Problem::Empty));
        }
        let mut store = RootCertStore::empty();
        for (index, certificate) in certificates.iter().enumerate() {
            store.add(certificate.clone()).map_err(|source| {
                refuse(Problem::Invalid {
                    number: index + 1,
                    source,
                })
            })?;
        }
        Ok(ExtraRoots {
            certificates,
            anchors: store.roots,
        })
    }
}

/// The gRPC channel's TLS: tonic's enabled roots (the `tls-webpki-roots`
/// feature: Mozilla's, compiled in), and `extra`. Used for an `https://`
/// endpoint only; tonic speaks cleartext to an `http://` one whatever this
/// says.
pub(super) fn grpc(extra: Option<&ExtraRoots>) -> ClientTlsConfig {
    let config = ClientTlsConfig::new().with_enabled_roots();
    match extra {
        Some(extra) => config.trust_anchors(extra.anchors.iter().cloned()),
        None => config,
    }
}

/// The OTLP/HTTP exporter's client: reqwest's blocking one, with the
/// export's `timeout` on each request, trusting the system's roots and
/// `extra`. Built on a thread of its own: the blocking client starts a
/// runtime and waits for it, which panics on one.
///
/// # Errors
/// If the client cannot be built: among other reasons, no root at all (no
/// system store, and no `extra`).
pub(super) fn http_client(
    extra: Option<&ExtraRoots>,
    timeout: Duration,
) -> Result<otlp_http_client::blocking::Client, ExporterError> {
    let certificates = extra.map_or(&[][..], |extra| &extra.certificates[..]);
    let certificates = certificates
        .iter()
        .map(|der| otlp_http_client::Certificate::from_der(der))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| failed("read the extra roots", &error))?;
    let builder = otlp_http_client::blocking::Client::builder()
        .timeout(timeout)
        .tls_certs_merge(certificates);
    std::thread::Builder::new()
        .name("otlp http client".into())
        .spawn(move || builder.build())
        .map_err(|error| failed("spawn the thread that builds it", &error))?
        .join()
        .map_err(|_| failed("build it", &std::io::Error::other("its thread panicked")))?
        .map_err(|error| failed("build it", &error))
}

/// A client that could not be built, with every cause: reqwest's own
/// message is only "builder error".
fn failed(step: &str, error: &dyn std::error::Error) -> ExporterError {
    let error = lameduck_lifecycle::error_chain(error);
    ExporterError::new(format!("the HTTP client: cannot {step}: {error}"))
}

// === A refusal, told by the exporter ===

/// The logs' filter that leaves out the HTTP client's verifier
/// (`rustls-platform-verifier`, whose only error it is) saying it refused
/// the collector's certificate. It says so at every attempt, a batch every
/// few seconds; the exporter's warning that exports are failing carries the
/// same cause, once until an export succeeds ([`super::count`]).
///
/// It decides on the event, not on its metadata: `log`'s records reach
/// `tracing` under a target of `log`, the crate's being a field.
#[derive(Debug)]
pub(super) struct VerifierErrors;

impl<S> tracing_subscriber::layer::Filter<S> for VerifierErrors {
    // Said, so that the filter it is `and`ed with keeps its hint and its
    // cached interest: every level, and every callsite but an error's
    // always (an error's is decided at each event).
    fn callsite_enabled(&self, metadata: &'static tracing::Metadata<'static>) -> Interest {
        if *metadata.level() == tracing::Level::ERROR {
            Interest::sometimes()
        } else {
            Interest::always()
        }
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        Some(LevelFilter::TRACE)
    }

    fn enabled(
        &self,
        _: &tracing::Metadata<'_>,
        _: &tracing_subscriber::layer::Context<'_, S>,
    ) -> bool {
        true
    }

    fn event_enabled(
        &self,
        event: &tracing::Event<'_>,
        _: &tracing_subscriber::layer::Context<'_, S>,
    ) -> bool {
        if *event.metadata().level() != tracing::Level::ERROR {
            return true;
        }
        let mut target = LogTarget(false);
        event.record(&mut target);
        !target.0
    }
}

/// Whether a `log` record came from the verifier.
struct LogTarget(bool);

impl tracing::field::Visit for LogTarget {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        if field.name() == "log.target" {
            self.0 = value.starts_with("rustls_platform_verifier");
        }
    }

    fn record_debug(&mut self, _: &tracing::field::Field, _: &dyn std::fmt::Debug) {}
}

#[cfg(test)]
mod tests {
    use lameduck_lifecycle::error_chain;

    use super::*;

    /// What reading `contents` from a file says, less the variable and path.
    fn read(contents: &[u8]) -> Result<ExtraRoots, String> {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("ca.pem");
        std::fs::write(&path, contents).expect("write the file");
        ExtraRoots::read(CERTIFICATE, &path).map_err(|error| {
            let message = error_chain(&error);
            let prefix = format!("{CERTIFICATE}={}: ", path.display());
            let problem = message.strip_prefix(&prefix);
            problem.unwrap_or_else(|| panic!("{message}")).to_owned()
        })
    }

    // What a user gets wrong is refused at startup, and the message says
    // which variable, which file, and what is wrong with it.
    #[test]
    fn a_missing_file_is_refused_naming_the_variable_and_the_path() {
        let path = Path::new("/nonexistent/ca.pem");
        let error = ExtraRoots::read(TRACES_CERTIFICATE, path).expect_err("no such file");
        let message = error_chain(&error);
        let expected = "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE=/nonexistent/ca.pem: \
                        cannot read the file: No such file or directory";
        assert!(message.starts_with(expected), "{message}");
    }

    #[test]
    fn a_file_without_a_certificate_is_refused() {
        let empty = "no CERTIFICATE in the file";
        assert_eq!(read(b"").unwrap_err(), empty);
        assert_eq!(read(b"not a certificate\n").unwrap_err(), empty);
        let key = b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n";
        assert_eq!(read(key).unwrap_err(), empty);
    }

    #[test]
    fn a_broken_certificate_is_refused() {
        let unended = b"-----BEGIN CERTIFICATE-----\nAAAA\n";
        let error = read(unended).unwrap_err();
        assert!(error.starts_with("not a PEM file: "), "{error}");
        let not_x509 = b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        let error = read(not_x509).unwrap_err();
        let expected = "certificate 1 of the file is not a valid X.509 certificate: ";
        assert!(error.starts_with(expected), "{error}");
    }

    /// Counts the events its filter lets through.
    struct Counting(std::sync::Arc<std::sync::atomic::AtomicUsize>);

    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Counting {
        fn on_event(&self, _: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    // The verifier's error, as `log` hands it to `tracing`, is left out
    // however many attempts fail (the exporter's warning carries it); other
    // errors, and other crates' records, are not held back.
    #[test]
    fn a_refused_certificate_is_left_to_the_exporter_to_tell() {
        use tracing_subscriber::layer::SubscriberExt as _;
        use tracing_subscriber::Layer as _;

        let logged = std::sync::Arc::default();
        let layer = Counting(std::sync::Arc::clone(&logged)).with_filter(VerifierErrors);
        let subscriber = tracing_subscriber::registry().with(layer);
        let count = || logged.load(std::sync::atomic::Ordering::Relaxed);
        let refused = || {
            let target = "rustls_platform_verifier::verification::others";
            tracing::error!(log.target = target, "failed to verify TLS certificate");
        };
        tracing::subscriber::with_default(subscriber, || {
            refused();
            refused();
            assert_eq!(count(), 0);
            tracing::error!(log.target = "hyper_util::client", "another crate's error");
            tracing::error!("the service's own error");
            tracing::warn!(log.target = "rustls_platform_verifier", "a warning");
            assert_eq!(count(), 3);
        });
    }
}
