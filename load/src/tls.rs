//! TLS for `load bench`: a certificate chain made at start and written where
//! the server reads it, and the client side of the handshake for the raw
//! client of [`crate::raw`].
//!
//! The chain is what a public certificate looks like: a root CA, an
//! intermediate CA, and a leaf for `localhost` and `127.0.0.1`, each key
//! ECDSA P-256 (what `rcgen` makes on ring). The server is given the leaf
//! and the intermediate (a `fullchain.pem`) and the leaf's key; the client
//! trusts the root alone and verifies the chain at every full handshake, as
//! a real client does. The client is rustls on ring, TLS 1.3 preferred,
//! offering X25519 first.

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use anyhow::Context;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use rustls::client::Resumption;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, HandshakeKind, RootCertStore};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

use crate::raw::RawConn;

/// The name the leaf certificate is for, and the client asks for (SNI).
pub const SERVER_NAME: &str = "localhost";

/// What the chain is, for reports.
pub const CHAIN: &str =
    "ECDSA P-256 leaf + intermediate (fullchain), verified by the client against its root";

/// The files of a certificate chain made for one run, and the root that
/// verifies it.
#[derive(Clone, Debug)]
pub struct Certificates {
    /// The leaf and the intermediate, PEM: `--tls-cert`.
    pub cert: PathBuf,
    /// The leaf's private key, PEM (PKCS#8): `--tls-key`.
    pub key: PathBuf,
    root: CertificateDer<'static>,
}

impl Certificates {
    /// Makes a root, an intermediate and a leaf, and writes the chain and
    /// the leaf's key into `dir`.
    ///
    /// # Errors
    /// If a certificate cannot be made or a file cannot be written.
    pub fn make(dir: &Path) -> anyhow::Result<Certificates> {
        let ca = |name: &str, depth: Option<u8>| -> anyhow::Result<CertificateParams> {
            let mut params = CertificateParams::new(Vec::<String>::new())?;
            params.distinguished_name.push(DnType::CommonName, name);
            params.is_ca = IsCa::Ca(match depth {
                Some(depth) => BasicConstraints::Constrained(depth),
                None => BasicConstraints::Unconstrained,
            });
            params.key_usages = vec![
                KeyUsagePurpose::KeyCertSign,
                KeyUsagePurpose::CrlSign,
                KeyUsagePurpose::DigitalSignature,
            ];
            Ok(params)
        };
        let root = CertifiedIssuer::self_signed(ca("load bench root", None)?, KeyPair::generate()?)
            .context("cannot make the root certificate")?;
        let intermediate = CertifiedIssuer::signed_by(
            ca("load bench intermediate", Some(0))?,
            KeyPair::generate()?,
            &root,
        )
        .context("cannot make the intermediate certificate")?;
        let mut leaf =
            CertificateParams::new(vec![SERVER_NAME.to_owned(), "127.0.0.1".to_owned()])?;
        leaf.distinguished_name
            .push(DnType::CommonName, SERVER_NAME);
        leaf.is_ca = IsCa::ExplicitNoCa;
        leaf.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let leaf_key = KeyPair::generate()?;
        let leaf = leaf
            .signed_by(&leaf_key, &intermediate)
            .context("cannot make the leaf certificate")?;

        std::fs::create_dir_all(dir)?;
        let cert = dir.join("fullchain.pem");
        let key = dir.join("privkey.pem");
        std::fs::write(&cert, format!("{}{}", leaf.pem(), intermediate.pem()))
            .with_context(|| format!("cannot write {}", cert.display()))?;
        std::fs::write(&key, leaf_key.serialize_pem())
            .with_context(|| format!("cannot write {}", key.display()))?;
        Ok(Certificates {
            cert,
            key,
            root: root.der().clone(),
        })
    }

    /// A client that trusts the root, offers `alpn`, and resumes sessions
    /// (TLS 1.3 tickets) only if `resume`.
    ///
    /// # Errors
    /// If rustls refuses the configuration.
    pub fn client(&self, alpn: &[&[u8]], resume: bool) -> anyhow::Result<Client> {
        let mut roots = RootCertStore::empty();
        roots.add(self.root.clone())?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        if !resume {
            config.resumption = Resumption::disabled();
        }
        Ok(Client {
            connector: TlsConnector::from(Arc::new(config)),
            name: ServerName::try_from(SERVER_NAME)?,
            handshakes: Arc::new(AtomicU64::new(0)),
            resumed: Arc::new(AtomicU64::new(0)),
        })
    }
}

/// The client side of TLS: a configuration, and counts of the handshakes it
/// made and of those that resumed a session.
#[derive(Clone)]
pub struct Client {
    connector: TlsConnector,
    name: ServerName<'static>,
    handshakes: Arc<AtomicU64>,
    resumed: Arc<AtomicU64>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// A TLS connection of the raw client.
pub type TlsConn = RawConn<TlsStream<TcpStream>>;

impl Client {
    /// Connects to `addr` (`TCP_NODELAY`) and completes the handshake.
    ///
    /// # Errors
    /// The connect or handshake error.
    pub async fn connect(&self, addr: SocketAddr) -> io::Result<TlsConn> {
        let tcp = TcpStream::connect(addr).await?;
        tcp.set_nodelay(true)?;
        let stream = self.connector.connect(self.name.clone(), tcp).await?;
        self.handshakes.fetch_add(1, Ordering::Relaxed);
        if stream.get_ref().1.handshake_kind() == Some(HandshakeKind::Resumed) {
            self.resumed.fetch_add(1, Ordering::Relaxed);
        }
        Ok(RawConn::new(stream))
    }

    /// Handshakes made so far, and how many of them resumed a session.
    pub fn handshakes(&self) -> (u64, u64) {
        (
            self.handshakes.load(Ordering::Relaxed),
            self.resumed.load(Ordering::Relaxed),
        )
    }
}

/// What a handshake settled on, for reports: `TLS 1.3,
/// TLS13_AES_256_GCM_SHA384, X25519, ALPN http/1.1`.
pub fn describe(conn: &TlsConn) -> String {
    let state = conn.stream().get_ref().1;
    let version = match state.protocol_version() {
        Some(rustls::ProtocolVersion::TLSv1_3) => "TLS 1.3".to_owned(),
        Some(rustls::ProtocolVersion::TLSv1_2) => "TLS 1.2".to_owned(),
        other => format!("{other:?}"),
    };
    let suite = state
        .negotiated_cipher_suite()
        .map_or_else(|| "?".to_owned(), |s| format!("{:?}", s.suite()));
    let group = state
        .negotiated_key_exchange_group()
        .map_or_else(|| "?".to_owned(), |g| format!("{:?}", g.name()));
    format!("{version}, {suite}, {group}, ALPN {}", alpn(conn))
}

/// The protocol ALPN settled on, or `none`.
pub fn alpn(conn: &TlsConn) -> String {
    conn.stream().get_ref().1.alpn_protocol().map_or_else(
        || "none".to_owned(),
        |p| String::from_utf8_lossy(p).into_owned(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::PrivateKeyDer;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A rustls server on the files, answering one HTTP/1.1 request per
    /// connection, `connections` times.
    async fn server(made: &Certificates, connections: usize) -> SocketAddr {
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&made.cert)
            .expect("chain")
            .collect::<Result<_, _>>()
            .expect("PEM");
        assert_eq!(chain.len(), 2, "leaf and intermediate");
        let key = PrivateKeyDer::from_pem_file(&made.key).expect("key");
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .expect("the pair matches");
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("address");
        tokio::spawn(async move {
            for _ in 0..connections {
                let (tcp, _) = listener.accept().await.expect("accept");
                let mut tls = acceptor.accept(tcp).await.expect("handshake");
                let mut buf = [0u8; 1024];
                let _ = tls.read(&mut buf).await;
                let _ = tls
                    .write_all(
                        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok",
                    )
                    .await;
                let _ = tls.shutdown().await;
            }
        });
        addr
    }

    #[tokio::test]
    async fn the_chain_verifies_and_sessions_resume_only_when_asked() {
        let dir = tempfile::tempdir().expect("temp dir");
        let made = Certificates::make(dir.path()).expect("certificates");
        let key = std::fs::read_to_string(&made.key).expect("key");
        assert!(key.starts_with("-----BEGIN PRIVATE KEY-----"), "{key}");
        let addr = server(&made, 5).await;

        let full = made.client(&[b"http/1.1"], false).expect("a client");
        for _ in 0..2 {
            let mut conn = full.connect(addr).await.expect("a verified handshake");
            assert_eq!(alpn(&conn), "http/1.1");
            assert!(
                describe(&conn).starts_with("TLS 1.3, "),
                "{}",
                describe(&conn)
            );
            let head = conn
                .exchange(&crate::raw::get_close("/healthz"))
                .await
                .expect("answer");
            assert_eq!((head.status, head.close), (200, true));
        }
        assert_eq!(full.handshakes(), (2, 0), "no resumption when not asked");

        let h2 = made.client(&[b"h2", b"http/1.1"], false).expect("a client");
        assert_eq!(alpn(&h2.connect(addr).await.expect("handshake")), "h2");

        let resuming = made.client(&[b"http/1.1"], true).expect("a client");
        for _ in 0..2 {
            let mut conn = resuming.connect(addr).await.expect("handshake");
            conn.exchange(&crate::raw::get_close("/"))
                .await
                .expect("answer");
        }
        assert_eq!(resuming.handshakes(), (2, 1), "the second resumed");
    }
}
