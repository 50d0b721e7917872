//! `<service> healthcheck`: a container health check that needs no curl.
//! It asks the local server for `/readyz` over plain HTTP/1.1 and exits 0
//! only on 200.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use crate::cli::HealthcheckConfig;
use crate::listen::ListenAddr;

/// Errors of one health probe.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// The server could not be reached or did not answer in time.
    #[error("cannot reach {addr}")]
    Io {
        /// Where.
        addr: ListenAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The answer was not an HTTP status line.
    #[error("unexpected answer: {0:?}")]
    Malformed(String),
    /// The server answered, but not with 200.
    #[error("{path} answered {status}")]
    NotReady {
        /// The path probed.
        path: String,
        /// The status code.
        status: u16,
    },
}

/// Probes the server once, as `service` (its `User-Agent` is
/// `<service>-healthcheck`).
///
/// # Errors
/// A [`ProbeError`] saying why the server is not ready.
pub fn probe(config: &HealthcheckConfig, service: &str) -> Result<(), ProbeError> {
    let addr = match &config.admin_listen {
        ListenAddr::Tcp(listen) => ListenAddr::Tcp(loopback_for(*listen)),
        unix @ ListenAddr::Unix(_) => unix.clone(),
    };
    let io = |source| ProbeError::Io {
        addr: addr.clone(),
        source,
    };
    let host = match &addr {
        ListenAddr::Tcp(addr) => addr.to_string(),
        ListenAddr::Unix(_) => "localhost".to_owned(),
    };
    let mut stream = connect(&addr, config.timeout).map_err(io)?;
    write!(
        stream,
        "GET {} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: {}-healthcheck\r\nConnection: close\r\n\r\n",
        config.path,
        service
    )
    .map_err(io)?;
    let mut status_line = String::new();
    BufReader::new(stream)
        .read_line(&mut status_line)
        .map_err(io)?;
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse::<u16>().ok())
        .ok_or_else(|| ProbeError::Malformed(status_line.trim_end().to_owned()))?;
    if status == 200 {
        Ok(())
    } else {
        Err(ProbeError::NotReady {
            path: config.path.clone(),
            status,
        })
    }
}

/// A wildcard listen address is probed on the loopback address of its family.
/// A connected stream, TCP or Unix, with `timeout` on every read and write.
fn connect(addr: &ListenAddr, timeout: Duration) -> std::io::Result<Box<dyn ReadWrite>> {
    Ok(match addr {
        ListenAddr::Tcp(addr) => {
            let stream = TcpStream::connect_timeout(addr, timeout)?;
            stream.set_read_timeout(Some(timeout))?;
            stream.set_write_timeout(Some(timeout))?;
            Box::new(stream)
        }
        ListenAddr::Unix(path) => {
            let stream = UnixStream::connect(path)?;
            stream.set_read_timeout(Some(timeout))?;
            stream.set_write_timeout(Some(timeout))?;
            Box::new(stream)
        }
    })
}

trait ReadWrite: Read + Write {}
impl<T: Read + Write> ReadWrite for T {}

fn loopback_for(listen: SocketAddr) -> SocketAddr {
    let ip = match listen.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    SocketAddr::new(ip, listen.port())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcard_addresses_are_probed_on_loopback() {
        let probed = loopback_for("0.0.0.0:8080".parse().expect("addr"));
        assert_eq!(probed, "127.0.0.1:8080".parse().expect("addr"));
        let probed = loopback_for("[::]:9000".parse().expect("addr"));
        assert_eq!(probed, "[::1]:9000".parse().expect("addr"));
    }
}
