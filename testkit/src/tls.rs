//! Certificates made on the spot (a test CA and leaves it signs), files laid
//! out the way the kubelet lays out a Secret volume, and a blocking rustls
//! client that tells which certificate the server presented.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, SanType,
    SerialNumber,
};
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore, StreamOwned};

use super::binary::{read_response, uninterrupted, RawResponse, IO_TIMEOUT};

/// A certificate authority of the test's own.
pub struct TestCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

/// A leaf certificate and its key, in PEM.
#[derive(Clone, Debug)]
pub struct Leaf {
    /// The certificate.
    pub cert_pem: String,
    /// The private key.
    pub key_pem: String,
    /// Its serial number, as the server logs it (hex, colon-separated).
    pub serial: String,
    /// The end of its validity, in seconds since the Unix epoch.
    pub not_after: i64,
}

impl Default for TestCa {
    /// A new CA, as [`TestCa::new`].
    fn default() -> TestCa {
        TestCa::new()
    }
}

impl TestCa {
    /// A new CA.
    pub fn new() -> TestCa {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "lameduck test CA");
        let key = KeyPair::generate().expect("CA key");
        TestCa {
            issuer: CertifiedIssuer::self_signed(params, key).expect("CA certificate"),
        }
    }

    /// The CA certificate, in PEM (for `curl --cacert`, `openssl -CAfile`).
    pub fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// A leaf for `localhost` and 127.0.0.1 with this `serial`.
    pub fn leaf(&self, serial: u64) -> Leaf {
        let mut params = CertificateParams::new(vec!["localhost".to_owned()]).expect("params");
        params
            .subject_alt_names
            .push(SanType::IpAddress([127, 0, 0, 1].into()));
        params
            .distinguished_name
            .push(DnType::CommonName, format!("lameduck test {serial}"));
        params.serial_number = Some(SerialNumber::from(serial));
        let not_after = params.not_after.unix_timestamp();
        let key = KeyPair::generate().expect("leaf key");
        let cert = params
            .signed_by(&key, &self.issuer)
            .expect("leaf certificate");
        Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            serial: serial_hex(cert.der()),
            not_after,
        }
    }

    /// A client configuration trusting this CA, offering `alpn`.
    pub fn client_config(&self, alpn: &[&[u8]]) -> Arc<ClientConfig> {
        let mut roots = RootCertStore::empty();
        roots.add(self.issuer.der().clone()).expect("trust the CA");
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("protocol versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Arc::new(config)
    }

    /// Connects to `addr` over TLS (HTTP/1.1 by ALPN) and completes the
    /// handshake.
    ///
    /// # Errors
    /// If the connection or the handshake fails.
    pub fn connect(&self, addr: SocketAddr) -> io::Result<TlsClient> {
        let config = self.client_config(&[b"http/1.1"]);
        let tcp = TcpStream::connect_timeout(&addr, IO_TIMEOUT)?;
        tcp.set_read_timeout(Some(IO_TIMEOUT))?;
        tcp.set_write_timeout(Some(IO_TIMEOUT))?;
        let name = ServerName::try_from("localhost").expect("server name");
        let connection = ClientConnection::new(config, name).map_err(io::Error::other)?;
        let mut stream = StreamOwned::new(connection, tcp);
        while stream.conn.is_handshaking() {
            stream.conn.complete_io(&mut stream.sock)?;
        }
        Ok(TlsClient { stream })
    }
}

/// The serial of a DER certificate, as the server logs it.
pub fn serial_hex(der: &CertificateDer<'_>) -> String {
    let (_, cert) = x509_parser::parse_x509_certificate(der).expect("an X.509 certificate");
    cert.raw_serial_as_string()
}

/// A blocking TLS client connection.
pub struct TlsClient {
    /// The stream: read and write through it.
    pub stream: StreamOwned<ClientConnection, TcpStream>,
}

impl TlsClient {
    /// The serial of the certificate the server presented.
    pub fn serial(&self) -> String {
        let chain = self
            .stream
            .conn
            .peer_certificates()
            .expect("a server certificate");
        serial_hex(&chain[0])
    }

    /// The protocol ALPN settled on.
    pub fn alpn(&self) -> Option<Vec<u8>> {
        self.stream.conn.alpn_protocol().map(<[u8]>::to_vec)
    }

    /// Sends `GET path` (keep-alive) and reads the response.
    ///
    /// # Errors
    /// Any I/O or TLS error.
    pub fn get(&mut self, path: &str) -> io::Result<RawResponse> {
        write!(
            self.stream,
            "GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n"
        )?;
        self.stream.flush()?;
        read_response(&mut self.stream)
    }

    /// Waits up to `timeout` for the server to end the connection: `Ok(true)`
    /// if it sent `close_notify` first (a clean TLS close), `Ok(false)` if the
    /// TCP connection just ended.
    ///
    /// # Errors
    /// If the connection stays open for `timeout`, or on another error.
    pub fn closed_cleanly(&mut self, timeout: Duration) -> io::Result<bool> {
        self.stream.sock.set_read_timeout(Some(timeout))?;
        let mut byte = [0; 1];
        match uninterrupted(|| self.stream.read(&mut byte)) {
            Ok(0) => Ok(true),
            Ok(_) => Err(io::Error::other("the server sent data instead of closing")),
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(false),
            Err(e) => Err(e),
        }
    }
}

/// A directory laid out as the kubelet lays out a Secret volume:
/// `tls.crt` and `tls.key` are symlinks through `..data`, itself a symlink
/// to a timestamped directory; an update writes a new timestamped directory
/// and swaps `..data` atomically (rename of a new symlink over it).
pub struct SecretVolume {
    dir: PathBuf,
    version: u32,
}

impl SecretVolume {
    /// Creates the volume in `dir` (which must exist) holding `leaf`.
    pub fn new(dir: &Path, leaf: &Leaf) -> SecretVolume {
        let mut volume = SecretVolume {
            dir: dir.to_owned(),
            version: 0,
        };
        volume.update(leaf);
        for name in ["tls.crt", "tls.key"] {
            std::os::unix::fs::symlink(Path::new("..data").join(name), dir.join(name))
                .expect("symlink the key into ..data");
        }
        volume
    }

    /// The certificate's path, as the server is given it.
    pub fn cert(&self) -> PathBuf {
        self.dir.join("tls.crt")
    }

    /// The key's path, as the server is given it.
    pub fn key(&self) -> PathBuf {
        self.dir.join("tls.key")
    }

    /// Writes `leaf` as the kubelet's atomic writer does: a new directory,
    /// then `..data` swapped to it in one rename, then the old one removed.
    pub fn update(&mut self, leaf: &Leaf) {
        self.version += 1;
        let name = format!("..2026_11_23_00_00_00.{}", self.version);
        let payload = self.dir.join(&name);
        std::fs::create_dir(&payload).expect("payload directory");
        std::fs::write(payload.join("tls.crt"), &leaf.cert_pem).expect("write tls.crt");
        std::fs::write(payload.join("tls.key"), &leaf.key_pem).expect("write tls.key");
        let old = std::fs::read_link(self.dir.join("..data")).ok();
        let staged = self.dir.join("..data_tmp");
        std::os::unix::fs::symlink(&name, &staged).expect("stage ..data");
        std::fs::rename(&staged, self.dir.join("..data")).expect("swap ..data");
        if let Some(old) = old {
            std::fs::remove_dir_all(self.dir.join(old)).expect("remove the old payload");
        }
    }
}

/// Writes `leaf` to plain files `cert` and `key`.
pub fn write_pair(leaf: &Leaf, cert: &Path, key: &Path) {
    std::fs::write(cert, &leaf.cert_pem).expect("write the certificate");
    std::fs::write(key, &leaf.key_pem).expect("write the key");
}
