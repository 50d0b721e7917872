//! TLS for the public listener (rustls, ALPN `h2` and `http/1.1`), with
//! the certificate and key reloaded from their files while the server runs.
//!
//! Every handshake asks [`CertStore`] for the current pair, so a reload
//! takes effect on the next new connection and connections already open
//! keep the pair they were made with. The files are polled
//! ([`reload::run_reloader`]) rather than watched: a Kubernetes Secret
//! volume replaces them by swapping a `..data` symlink, which file watchers
//! on the files themselves miss.

mod handshake;
pub mod reload;

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

pub use handshake::Handshake;
pub use reload::TlsMetrics;

/// The PEM files of the certificate chain and its private key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// The certificate chain, leaf first.
    pub cert: PathBuf,
    /// The private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

/// Why a certificate and key cannot be used; names the file at fault.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file cannot be read.
    #[error("{}: cannot read it: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// A file holds no usable PEM block of the expected kind, or a bad one.
    #[error("{}: {problem}", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        problem: String,
    },
    /// The key is not the certificate's.
    #[error("{}: the key does not match the certificate {}", key.display(), cert.display())]
    Mismatch {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
    },
}

/// What was loaded, for logs and metrics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertInfo {
    /// The leaf certificate's subject, e.g. `CN=lameduck.example`.
    pub subject: String,
    /// Its serial number, in hex.
    pub serial: String,
    /// The end of its validity, in seconds since the Unix epoch.
    pub not_after: i64,
    /// The start of its validity, in seconds since the Unix epoch.
    pub not_before: i64,
}

/// A certificate chain and key that parse and match.
#[derive(Clone, Debug)]
pub struct Pair {
    key: Arc<CertifiedKey>,
    /// The leaf certificate's details.
    pub info: CertInfo,
}

/// The file contents a [`Pair`] is parsed from.
pub(crate) type Contents = (Vec<u8>, Vec<u8>);

impl TlsFiles {
    /// Reads both files.
    pub(crate) fn read(&self) -> Result<Contents, TlsError> {
        let read = |path: &Path| {
            std::fs::read(path).map_err(|source| TlsError::Read {
                path: path.to_owned(),
                source,
            })
        };
        Ok((read(&self.cert)?, read(&self.key)?))
    }

    /// Reads and checks the pair.
    ///
    /// # Errors
    /// If a file cannot be read or parsed, or the key is not the
    /// certificate's.
    pub fn load(&self) -> Result<Pair, TlsError> {
        self.parse(&self.read()?)
    }

    /// Parses and checks file contents read from these paths.
    pub(crate) fn parse(&self, (cert, key): &Contents) -> Result<Pair, TlsError> {
        let invalid = |path: &Path, problem: String| TlsError::Invalid {
            path: path.to_owned(),
            problem,
        };
        let chain = CertificateDer::pem_slice_iter(cert)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|error| {
                invalid(&self.cert, format!("not a PEM certificate chain: {error}"))
            })?;
        let Some(leaf) = chain.first() else {
            return Err(invalid(&self.cert, "no certificate in it".to_owned()));
        };
        let info = cert_info(leaf).map_err(|problem| invalid(&self.cert, problem))?;
        let key_der = PrivateKeyDer::from_pem_slice(key)
            .map_err(|error| invalid(&self.key, format!("not a PEM private key: {error}")))?;
        let signing_key = rustls::crypto::ring::sign::any_supported_type(&key_der)
            .map_err(|error| invalid(&self.key, format!("unusable private key: {error}")))?;
        let certified = CertifiedKey::new(chain, signing_key);
        match certified.keys_match() {
            Ok(()) | Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => {}
            Err(_) => {
                return Err(TlsError::Mismatch {
                    cert: self.cert.clone(),
                    key: self.key.clone(),
                })
            }
        }
        Ok(Pair {
            key: Arc::new(certified),
            info,
        })
    }
}

fn cert_info(der: &CertificateDer<'_>) -> Result<CertInfo, String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der)
        .map_err(|error| format!("not an X.509 certificate: {error}"))?;
    let validity = cert.validity();
    Ok(CertInfo {
        subject: cert.subject().to_string(),
        serial: cert.raw_serial_as_string(),
        not_after: validity.not_after.timestamp(),
        not_before: validity.not_before.timestamp(),
    })
}

/// The pair every new handshake uses; replaced by a reload.
pub struct CertStore {
    current: RwLock<Pair>,
}

impl fmt::Debug for CertStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertStore")
            .field("current", &self.current().info)
            .finish()
    }
}

impl CertStore {
    /// Starts with `pair`.
    pub fn new(pair: Pair) -> CertStore {
        CertStore {
            current: RwLock::new(pair),
        }
    }

    /// The pair in use.
    pub fn current(&self) -> Pair {
        self.current
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// New handshakes use `pair` from now on.
    pub fn replace(&self, pair: Pair) {
        *self
            .current
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = pair;
    }
}

impl ResolvesServerCert for CertStore {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let current = self
            .current
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        Some(Arc::clone(&current.key))
    }
}

/// Starts server-side TLS on accepted connections.
#[derive(Clone)]
pub struct TlsAcceptor {
    acceptor: tokio_rustls::TlsAcceptor,
}

impl fmt::Debug for TlsAcceptor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TlsAcceptor")
    }
}

impl TlsAcceptor {
    /// Serves the pairs of `store`, offering `h2` and `http/1.1` by ALPN.
    ///
    /// # Panics
    /// Never in practice: the built-in provider supports the default
    /// protocol versions.
    pub fn new(store: Arc<CertStore>) -> TlsAcceptor {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("the ring provider supports TLS 1.2 and 1.3")
            .with_no_client_auth()
            .with_cert_resolver(store);
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        TlsAcceptor {
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
        }
    }

    /// Begins the handshake on `io`; it runs as the stream is first used.
    pub fn accept<Io>(&self, io: Io) -> Handshake<Io>
    where
        Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    {
        Handshake::new(io, self.acceptor.clone())
    }
}

/// Logs what was loaded: subject, serial and expiry, on every load.
pub(crate) fn log_loaded(info: &CertInfo, files: &TlsFiles, what: &str) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    let expires = humantime::format_rfc3339_seconds(
        std::time::UNIX_EPOCH
            + std::time::Duration::from_secs(info.not_after.max(0).unsigned_abs()),
    );
    if info.not_after <= now || info.not_before > now {
        tracing::warn!(
            subject = %info.subject, serial = %info.serial, %expires,
            cert = %files.cert.display(),
            "{what}: the certificate is outside its validity period"
        );
    } else {
        tracing::info!(
            subject = %info.subject, serial = %info.serial, %expires,
            cert = %files.cert.display(),
            "{what}"
        );
    }
}
