//! `bare-hyper [ADDR]`: a hyper-util server answering `GET /healthz` with
//! 200 `ok`, the floor of the trivial-route benchmark. Listens on ADDR
//! (default `127.0.0.1:0`) and logs `listening on http://ADDR`.

use std::net::SocketAddr;
use std::process::ExitCode;

fn main() -> ExitCode {
    let listen = match std::env::args().nth(1).map(|arg| arg.parse::<SocketAddr>()) {
        None => SocketAddr::from(([127, 0, 0, 1], 0)),
        Some(Ok(addr)) => addr,
        Some(Err(error)) => {
            eprintln!("bare-hyper: bad address: {error}");
            return ExitCode::from(2);
        }
    };
    load::baseline::run(load::baseline::bare_hyper(listen))
}
