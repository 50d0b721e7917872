//! `close-floor [ADDR]`: the floor of a graceful close, with no HTTP server
//! in the way.
//!
//! It accepts connections on ADDR (default `127.0.0.1:0`, logged as
//! `listening on http://ADDR`), answers the first request on each with
//! `200 ok` so the harness can open them as it does for the servers, and
//! keeps them as plain sockets, out of any reactor. Accepting and answering
//! run concurrently on a tokio runtime, so that the harness's burst of
//! clients is taken as fast as it comes (one thread answering one client at
//! a time behind a 128-deep accept queue once had a client reset, which
//! ended a whole bench run). At SIGTERM it sends every
//! connection the FIN a graceful server sends (`shutdown(2)`, then
//! `close(2)`), from one thread per CPU it may run on, and exits. What that
//! takes is the kernel's share of closing the connections, which no server
//! can go below.

use std::net::{Shutdown, SocketAddr, TcpStream};
use std::process::ExitCode;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use nix::sys::signal::{SigSet, Signal};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket};

const ANSWER: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";

/// The listen backlog, that of `tokio::net::TcpListener::bind`.
const BACKLOG: u32 = 1024;

/// How long a client may take to send its first request head.
const HEAD_TIMEOUT: Duration = Duration::from_secs(10);

/// How long accepting pauses after it failed.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(10);

fn main() -> ExitCode {
    let listen = match std::env::args().nth(1).map(|arg| arg.parse::<SocketAddr>()) {
        None => SocketAddr::from(([127, 0, 0, 1], 0)),
        Some(Ok(addr)) => addr,
        Some(Err(error)) => {
            eprintln!("close-floor: bad address: {error} (usage: close-floor [ADDR])");
            return ExitCode::from(2);
        }
    };
    // Before any thread starts, so that every thread inherits the mask and
    // SIGTERM waits for `wait` below.
    let mut terminate = SigSet::empty();
    terminate.add(Signal::SIGTERM);
    if let Err(error) = terminate.thread_block() {
        eprintln!("close-floor: cannot block SIGTERM: {error}");
        return ExitCode::FAILURE;
    }
    // Made after SIGTERM is blocked: its threads inherit the mask.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("close-floor: cannot start a runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let listener = match runtime.block_on(bind(listen)) {
        Ok(listener) => listener,
        Err(error) => {
            eprintln!("close-floor: cannot listen on {listen}: {error}");
            return ExitCode::FAILURE;
        }
    };
    match listener.local_addr() {
        Ok(addr) => println!("listening on http://{addr}"),
        Err(error) => {
            eprintln!("close-floor: {error}");
            return ExitCode::FAILURE;
        }
    }
    let open = Arc::new(Mutex::new(Vec::new()));
    std::thread::spawn({
        let open = Arc::clone(&open);
        move || runtime.block_on(accept(listener, open))
    });
    if let Err(error) = terminate.wait() {
        eprintln!("close-floor: cannot wait for SIGTERM: {error}");
        return ExitCode::FAILURE;
    }
    let connections = std::mem::take(&mut *open.lock().unwrap_or_else(PoisonError::into_inner));
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    let share = connections.len().div_ceil(threads).max(1);
    let mut rest = connections;
    std::thread::scope(|scope| {
        while !rest.is_empty() {
            let part = rest.split_off(rest.len().saturating_sub(share));
            scope.spawn(move || {
                for connection in part {
                    let _ = connection.shutdown(Shutdown::Write);
                    // Closed here, after its FIN, as a server's task would.
                    drop(connection);
                }
            });
        }
    });
    ExitCode::SUCCESS
}

/// Listens on `addr` with a [`BACKLOG`]-deep accept queue.
async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.bind(addr)?;
    socket.listen(BACKLOG)
}

/// Answers the first request of every connection, each on a task of its
/// own, and keeps the connection in `open`.
async fn accept(listener: TcpListener, open: Arc<Mutex<Vec<TcpStream>>>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            // Out of descriptors, say: not a spin that starves the answers.
            tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
            continue;
        };
        let open = Arc::clone(&open);
        tokio::spawn(async move {
            let answered = tokio::time::timeout(HEAD_TIMEOUT, answer_first_request(stream)).await;
            if let Ok(Ok(stream)) = answered {
                open.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(stream);
            }
        });
    }
}

/// Reads one request head and answers it; returns the connection as a
/// blocking socket, out of the runtime.
async fn answer_first_request(mut stream: tokio::net::TcpStream) -> std::io::Result<TcpStream> {
    stream.set_nodelay(true)?;
    let mut head = Vec::with_capacity(256);
    let mut buffer = [0_u8; 1024];
    while !head.windows(4).any(|window| window == b"\r\n\r\n") {
        let read = stream.read(&mut buffer).await?;
        if read == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        head.extend_from_slice(&buffer[..read]);
    }
    stream.write_all(ANSWER).await?;
    let stream = stream.into_std()?;
    stream.set_nonblocking(false)?;
    Ok(stream)
}
