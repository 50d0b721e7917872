//! Where a service listens: a TCP address or a Unix socket path
//! (`--listen unix:/run/lameduck/http.sock`), bound here or inherited
//! through socket activation or an in-place upgrade.

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use lameduck_handoff::{Inherited, Listeners};
use lameduck_lifecycle::{Listener, Report};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio_util::either::Either;

use crate::cli::ServeArgs;

/// A listening address: `HOST:PORT`, or `unix:PATH` for a Unix socket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ListenAddr {
    /// A TCP socket address; port 0 picks a free port.
    Tcp(SocketAddr),
    /// A Unix stream socket at this path.
    Unix(PathBuf),
}

impl FromStr for ListenAddr {
    type Err = String;

    fn from_str(value: &str) -> Result<ListenAddr, String> {
        match value.strip_prefix("unix:") {
            Some("") => Err("a unix: address needs a path".to_owned()),
            Some(path) => Ok(ListenAddr::Unix(PathBuf::from(path))),
            None => value
                .parse()
                .map(ListenAddr::Tcp)
                .map_err(|_| format!("expected HOST:PORT or unix:PATH, found {value:?}")),
        }
    }
}

impl fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ListenAddr::Tcp(addr) => write!(f, "{addr}"),
            ListenAddr::Unix(path) => write!(f, "unix:{}", path.display()),
        }
    }
}

/// A bound (or inherited) listening socket, TCP or Unix.
#[derive(Debug)]
pub enum Socket {
    /// A TCP listener.
    Tcp(TcpListener),
    /// A Unix stream listener.
    Unix(UnixListener),
}

/// A connection accepted on a [`Socket`].
pub type Stream = Either<TcpStream, UnixStream>;

/// Binds `addr`, or serves `inherited` (a socket passed down) instead. A
/// Unix socket gets `mode`; a file left at its path by a process that is
/// gone is replaced, one that a live server answers on is not.
///
/// # Errors
/// If the socket cannot be bound, or its file cannot be given `mode`.
pub async fn bind(
    addr: &ListenAddr,
    inherited: Option<Inherited>,
    mode: u32,
) -> io::Result<Socket> {
    if let Some(inherited) = inherited {
        tracing::info!(%addr, "serving an inherited listening socket instead of binding");
        return match inherited {
            Inherited::Tcp(listener) => {
                listener.set_nonblocking(true)?;
                TcpListener::from_std(listener).map(Socket::Tcp)
            }
            Inherited::Unix(listener) => {
                listener.set_nonblocking(true)?;
                UnixListener::from_std(listener).map(Socket::Unix)
            }
        };
    }
    match addr {
        ListenAddr::Tcp(addr) => TcpListener::bind(addr).await.map(Socket::Tcp),
        ListenAddr::Unix(path) => {
            remove_stale_socket(path).await?;
            let listener = UnixListener::bind(path)?;
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
            Ok(Socket::Unix(listener))
        }
    }
}

/// Removes a socket file that nothing listens on any more (a process that
/// was killed could not remove its own). Anything else is left for `bind`
/// to fail on.
async fn remove_stale_socket(path: &Path) -> io::Result<()> {
    let is_socket = std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket());
    if is_socket && UnixStream::connect(path).await.is_err() {
        tracing::info!(path = %path.display(), "removing a stale socket file");
        std::fs::remove_file(path)?;
    }
    Ok(())
}

impl Socket {
    /// The TCP address, if this is a TCP socket.
    ///
    /// # Errors
    /// For a Unix socket, or if the OS cannot tell.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        match self {
            Socket::Tcp(listener) => listener.local_addr(),
            Socket::Unix(_) => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "a Unix socket has no TCP address",
            )),
        }
    }

    /// The file of a Unix socket, if this is one.
    pub fn unix_path(&self) -> Option<PathBuf> {
        match self {
            Socket::Unix(listener) => listener
                .local_addr()
                .ok()?
                .as_pathname()
                .map(Path::to_owned),
            Socket::Tcp(_) => None,
        }
    }
}

impl AsFd for Socket {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            Socket::Tcp(listener) => listener.as_fd(),
            Socket::Unix(listener) => listener.as_fd(),
        }
    }
}

/// A peer's address: TCP, or a Unix socket's (usually unnamed).
pub type Peer = Either<SocketAddr, tokio::net::unix::SocketAddr>;

impl Listener for Socket {
    type Io = Stream;
    type Addr = Peer;

    async fn accept(&mut self) -> io::Result<(Stream, Peer)> {
        Ok(match self {
            Socket::Tcp(listener) => {
                let (io, peer) = Listener::accept(listener).await?;
                (Either::Left(io), Either::Left(peer))
            }
            Socket::Unix(listener) => {
                let (io, peer) = Listener::accept(listener).await?;
                (Either::Right(io), Either::Right(peer))
            }
        })
    }

    fn accept_queued(&mut self, max: usize) -> Vec<(Stream, Peer)> {
        match self {
            Socket::Tcp(listener) => listener
                .accept_queued(max)
                .into_iter()
                .map(|(io, peer)| (Either::Left(io), Either::Left(peer)))
                .collect(),
            Socket::Unix(listener) => listener
                .accept_queued(max)
                .into_iter()
                .map(|(io, peer)| (Either::Right(io), Either::Right(peer)))
                .collect(),
        }
    }

    fn describe(&self) -> String {
        match self {
            Socket::Tcp(listener) => listener.describe(),
            Socket::Unix(listener) => listener.describe(),
        }
    }

    fn set_send_timeout(&self, timeout: Duration) -> io::Result<()> {
        match self {
            Socket::Tcp(listener) => listener.set_send_timeout(timeout),
            Socket::Unix(listener) => listener.set_send_timeout(timeout),
        }
    }
}

/// A service's two listening sockets, bound or inherited, and the Unix
/// socket files among them this process owns.
#[derive(Debug)]
pub struct Listening {
    /// The public socket (`--listen`).
    pub public: Socket,
    /// The admin socket (`--admin-listen`): probes and metrics.
    pub admin: Socket,
    /// The socket files to remove at exit.
    pub files: SocketFiles,
}

/// A listening address that could not be bound.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen on {addr}")]
pub struct BindError {
    /// The address.
    pub addr: ListenAddr,
    /// Why.
    #[source]
    pub source: io::Error,
}

impl Listening {
    /// Binds `--listen` and `--admin-listen`, or serves the sockets
    /// `inherited` from a service manager or a predecessor instead. Unix
    /// socket files get `--unix-socket-mode`.
    ///
    /// # Errors
    /// A [`BindError`] naming the address that could not be bound.
    pub async fn bind(serve: &ServeArgs, inherited: Listeners) -> Result<Listening, BindError> {
        let mode = serve.unix_socket_mode;
        let one = |addr: &ListenAddr, inherited: Option<Inherited>| {
            let addr = addr.clone();
            async move {
                bind(&addr, inherited, mode)
                    .await
                    .map_err(|source| BindError { addr, source })
            }
        };
        let given = (inherited.public.is_some(), inherited.admin.is_some());
        let public = one(&serve.listen, inherited.public).await?;
        let admin = one(&serve.admin_listen, inherited.admin).await?;
        // A socket file is this process's to remove if it bound it, or if a
        // predecessor that bound it handed it down; never a service
        // manager's.
        let mut files = Vec::new();
        if !given.0 || inherited.owned {
            files.extend(public.unix_path());
        }
        if !given.1 || inherited.owned {
            files.extend(admin.unix_path());
        }
        Ok(Listening {
            public,
            admin,
            files: SocketFiles(files),
        })
    }
}

/// The Unix socket files a process owns: removed at exit, unless it handed
/// them to a successor.
#[derive(Debug, Default)]
pub struct SocketFiles(Vec<PathBuf>);

impl SocketFiles {
    /// Removes the files, unless `report` says a successor serves on them
    /// now (an in-place upgrade).
    pub fn remove_after(&self, report: &Report) {
        if report.upgraded_to.is_some() {
            return;
        }
        for path in &self.0 {
            if let Err(error) = std::fs::remove_file(path) {
                tracing::warn!(%error, path = %path.display(), "cannot remove the socket file");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_tcp_or_unix_paths() {
        assert_eq!(
            "127.0.0.1:0".parse::<ListenAddr>(),
            Ok(ListenAddr::Tcp("127.0.0.1:0".parse().expect("addr")))
        );
        assert_eq!(
            "unix:/run/x.sock".parse::<ListenAddr>(),
            Ok(ListenAddr::Unix("/run/x.sock".into()))
        );
        assert!("unix:".parse::<ListenAddr>().is_err());
        assert!("localhost".parse::<ListenAddr>().is_err());
        assert_eq!(
            ListenAddr::Unix("/run/x.sock".into()).to_string(),
            "unix:/run/x.sock"
        );
    }
}
