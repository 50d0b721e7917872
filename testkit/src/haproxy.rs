//! HAProxy's runtime API, as a client: one command a connection over its
//! `stats socket`, a Unix path (the load harness's own HAProxy) or a TCP
//! address (a container's published admin port), the answers of `set`
//! commands checked for a refusal, and `show stat` read into typed rows.
//!
//! The API answers a command and closes the connection (no `prompt` mode),
//! so a command is: connect, write the line, read to the end. Every
//! exchange is bounded by [`ANSWER_TIMEOUT`].

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpStream, UnixStream};

/// How long one command may take, from connecting to the end of its
/// answer: HAProxy answers at once, so a wait this long means it is stuck
/// or gone, and the caller (a test's wait, a scenario's phase) should hear
/// so rather than hang.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

/// Words in the answer to a `set` command that mean HAProxy refused it: it
/// answers one it took with nothing, or with a line saying what changed
/// (`IP changed from …`).
const REFUSALS: [&str; 5] = ["no such", "unknown", "require", "invalid", "error"];

/// Where a runtime API listens: HAProxy's `stats socket`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Socket {
    /// A Unix socket's path (`stats socket /path/haproxy.sock`).
    Unix(PathBuf),
    /// A TCP address (`stats socket ipv4@0.0.0.0:9999`, published).
    Tcp(SocketAddr),
}

impl fmt::Display for Socket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Socket::Unix(path) => write!(f, "{}", path.display()),
            Socket::Tcp(addr) => write!(f, "{addr}"),
        }
    }
}

/// Why a runtime API command failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Nothing answers at the socket: HAProxy is not (yet) running.
    #[error("cannot reach the HAProxy runtime API at {socket}: {source}")]
    Connect {
        /// Where it was asked.
        socket: Socket,
        /// The connection's error.
        source: io::Error,
    },
    /// The connection failed while the command was sent or answered.
    #[error("the HAProxy runtime API failed during `{command}`: {source}")]
    Io {
        /// The command.
        command: String,
        /// The socket's error.
        source: io::Error,
    },
    /// No whole answer within [`ANSWER_TIMEOUT`].
    #[error("HAProxy did not answer `{command}` within {ANSWER_TIMEOUT:?}")]
    Timeout {
        /// The command.
        command: String,
    },
    /// A `set` command answered with a refusal ([`refused`]).
    #[error("HAProxy rejected `{command}`: {answer}")]
    Rejected {
        /// The command.
        command: String,
        /// HAProxy's answer, trimmed.
        answer: String,
    },
    /// `show stat` did not read as its CSV.
    #[error("`show stat` did not read as CSV: {0}")]
    Stat(#[from] csv::Error),
}

/// One line of `show stat`: a frontend, a backend or a server of one, with
/// the columns the tests and the load harness read. Every other column is
/// ignored.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct StatRow {
    /// The proxy (`pxname`): the frontend's or backend's name.
    #[serde(rename = "pxname")]
    pub proxy: String,
    /// The server (`svname`): a server's name, or `FRONTEND` / `BACKEND`
    /// for the proxy's own line.
    #[serde(rename = "svname")]
    pub server: String,
    /// `UP`, `DOWN`, `MAINT`, `no check`, and in between `UP 1/2` (one
    /// check failed, going down) or `DOWN 1/2` (coming up).
    pub status: String,
    /// The last health check's result (`check_status`): `L7OK`, `L7STS`
    /// (a wrong status), `L4CON` (refused), …; empty without checks. HAProxy
    /// marks one in progress with a leading `* `, left off here.
    #[serde(default, deserialize_with = "check_status")]
    pub check_status: String,
    /// Sessions (requests, in HTTP mode) sent to it so far (`stot`);
    /// `None` where HAProxy leaves the column empty.
    #[serde(rename = "stot", default, deserialize_with = "count")]
    pub sessions: Option<u64>,
}

/// `check_status` without the `* ` of a check in progress.
fn check_status<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<String, D::Error> {
    let status = String::deserialize(deserializer)?;
    Ok(status.trim_start_matches("* ").to_owned())
}

/// A count column: a number, or nothing where the row has none.
fn count<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<u64>, D::Error> {
    let count = String::deserialize(deserializer)?;
    if count.is_empty() {
        return Ok(None);
    }
    count.parse().map(Some).map_err(serde::de::Error::custom)
}

/// A client of one HAProxy's runtime API. It holds no connection: each
/// command opens its own, as the API closes it after answering.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuntimeApi {
    socket: Socket,
}

impl RuntimeApi {
    /// The API on the Unix socket at `path`.
    pub fn unix(path: impl Into<PathBuf>) -> RuntimeApi {
        RuntimeApi {
            socket: Socket::Unix(path.into()),
        }
    }

    /// The API at the TCP address `addr`.
    pub fn tcp(addr: SocketAddr) -> RuntimeApi {
        RuntimeApi {
            socket: Socket::Tcp(addr),
        }
    }

    /// Where it is asked.
    pub fn socket(&self) -> &Socket {
        &self.socket
    }

    /// Runs one command and returns its answer. A `set` command whose
    /// answer is a refusal ([`refused`]) is an error.
    ///
    /// # Errors
    /// If the socket cannot be reached or fails, no answer comes within
    /// [`ANSWER_TIMEOUT`], or HAProxy refuses a `set` command.
    pub async fn command(&self, command: &str) -> Result<String, Error> {
        let answer = tokio::time::timeout(ANSWER_TIMEOUT, self.exchange(command))
            .await
            .map_err(|_| Error::Timeout {
                command: command.to_owned(),
            })??;
        if refused(command, &answer) {
            return Err(Error::Rejected {
                command: command.to_owned(),
                answer: answer.trim().to_owned(),
            });
        }
        Ok(answer)
    }

    /// `show stat`, every line of it.
    ///
    /// # Errors
    /// As [`RuntimeApi::command`], or if the answer is not its CSV.
    pub async fn show_stat(&self) -> Result<Vec<StatRow>, Error> {
        parse_stat(&self.command("show stat").await?)
    }

    /// Connects, sends `command` and reads the answer to its end.
    async fn exchange(&self, command: &str) -> Result<String, Error> {
        let unreachable = |source| Error::Connect {
            socket: self.socket.clone(),
            source,
        };
        let failed = |source| Error::Io {
            command: command.to_owned(),
            source,
        };
        match &self.socket {
            Socket::Unix(path) => {
                let stream = UnixStream::connect(path).await.map_err(unreachable)?;
                ask(stream, command).await.map_err(failed)
            }
            Socket::Tcp(addr) => {
                let stream = TcpStream::connect(addr).await.map_err(unreachable)?;
                ask(stream, command).await.map_err(failed)
            }
        }
    }
}

/// One command on a connected stream: the line, then everything HAProxy
/// writes until it closes the connection.
async fn ask(mut stream: impl AsyncRead + AsyncWrite + Unpin, command: &str) -> io::Result<String> {
    stream.write_all(format!("{command}\n").as_bytes()).await?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await?;
    Ok(answer)
}

/// Whether `answer` is HAProxy refusing `command`: only `set` commands are
/// judged, by the words of a refusal (`No such server.`, `Require
/// 'operator' level.`, `Invalid …`, `Unknown …`, an error).
pub fn refused(command: &str, answer: &str) -> bool {
    let lowered = answer.to_ascii_lowercase();
    command.starts_with("set ") && REFUSALS.iter().any(|word| lowered.contains(word))
}

/// `show stat`'s CSV read into rows. Its header line starts with `# `;
/// each line ends with a comma, an empty last column, which is ignored.
///
/// # Errors
/// If a line does not read as a row (a column missing or of the wrong type).
pub fn parse_stat(csv: &str) -> Result<Vec<StatRow>, Error> {
    let csv = csv.trim_start_matches("# ");
    let mut reader = csv::ReaderBuilder::new()
        .flexible(true)
        .from_reader(csv.as_bytes());
    let rows = reader.deserialize().collect::<Result<Vec<StatRow>, _>>()?;
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use tokio::net::{TcpListener, UnixListener};

    use super::*;

    /// Two servers of a backend and its own line, as HAProxy 2.6 writes
    /// them, cut to the first columns and `check_status`.
    const STAT: &str = "\
# pxname,svname,qcur,qmax,scur,smax,slim,stot,status,check_status,
apps,slot1,0,0,0,1,,1234,UP,L7OK,
apps,slot2,0,0,0,0,,0,DOWN 1/2,* L7STS,
apps,BACKEND,0,0,0,1,103,1234,UP,,
";

    #[test]
    fn show_stat_reads_into_rows_with_the_check_in_progress_unmarked() {
        let rows = parse_stat(STAT).expect("reads");
        assert_eq!(rows.len(), 3);
        assert_eq!(
            rows[1],
            StatRow {
                proxy: "apps".to_owned(),
                server: "slot2".to_owned(),
                status: "DOWN 1/2".to_owned(),
                check_status: "L7STS".to_owned(),
                sessions: Some(0),
            }
        );
        assert_eq!(rows[0].sessions, Some(1234));
        assert_eq!(
            (rows[2].server.as_str(), rows[2].check_status.as_str()),
            ("BACKEND", "")
        );
    }

    #[test]
    fn only_a_set_command_answered_with_a_refusal_is_refused() {
        assert!(refused("set server be/s9 state ready", "No such server.\n"));
        assert!(refused(
            "set server be/s1 addr x",
            "Require 'operator' level.\n"
        ));
        assert!(!refused("set server be/s1 state ready", "\n"));
        let changed = "IP changed from '127.0.0.1' to '10.0.0.3', no need to change the port.";
        assert!(!refused("set server be/s1 addr 10.0.0.3", changed));
        assert!(!refused("show errors", "Total events captured: 0\n"));
    }

    /// An API stand-in that reads one command line and answers `answer`
    /// to it, then closes, as HAProxy does; returns the command it read.
    async fn answer_once(mut stream: impl AsyncRead + AsyncWrite + Unpin, answer: &str) -> String {
        let mut line = Vec::new();
        let mut byte = [0; 1];
        while stream.read_exact(&mut byte).await.is_ok() && byte[0] != b'\n' {
            line.push(byte[0]);
        }
        stream.write_all(answer.as_bytes()).await.expect("answers");
        String::from_utf8(line).expect("a text command")
    }

    // Both ways of reaching the API run the same exchange: the Unix
    // socket of the load harness, the TCP port of the container test.
    #[tokio::test]
    async fn a_command_goes_over_a_unix_socket_or_tcp_and_a_refusal_is_an_error() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let path = dir.path().join("haproxy.sock");
        let unix = UnixListener::bind(&path).expect("binds");
        let server = tokio::spawn(async move {
            let (stream, _) = unix.accept().await.expect("accepts");
            answer_once(stream, STAT).await
        });
        let rows = RuntimeApi::unix(&path).show_stat().await.expect("answers");
        assert_eq!(rows.len(), 3);
        assert_eq!(server.await.expect("served"), "show stat");

        let tcp = TcpListener::bind("127.0.0.1:0").await.expect("binds");
        let addr = tcp.local_addr().expect("an address");
        let server = tokio::spawn(async move {
            let (stream, _) = tcp.accept().await.expect("accepts");
            answer_once(stream, "No such server.\n").await
        });
        let error = RuntimeApi::tcp(addr)
            .command("set server apps/slot9 state ready")
            .await
            .expect_err("refused");
        assert!(matches!(error, Error::Rejected { .. }), "{error}");
        assert_eq!(
            server.await.expect("served"),
            "set server apps/slot9 state ready"
        );

        drop(dir);
        let gone = RuntimeApi::unix(&path).command("show info").await;
        assert!(matches!(gone, Err(Error::Connect { .. })), "{gone:?}");
    }
}
