//! `bare-hyper [--graceful] [ADDR]`: a hyper-util server answering
//! `GET /healthz` with 200 `ok`, the floor of the trivial-route benchmark.
//! Listens on ADDR (default `127.0.0.1:0`) and logs `listening on
//! http://ADDR`. At SIGTERM it exits at once or, with `--graceful`, closes
//! every connection through hyper-util's `GracefulShutdown` first.

use std::net::SocketAddr;
use std::process::ExitCode;

use load::baseline::OnSigterm;

fn main() -> ExitCode {
    let mut on_sigterm = OnSigterm::Exit;
    let mut listen = SocketAddr::from(([127, 0, 0, 1], 0));
    for arg in std::env::args().skip(1) {
        if arg == "--graceful" {
            on_sigterm = OnSigterm::Graceful;
            continue;
        }
        match arg.parse::<SocketAddr>() {
            Ok(addr) => listen = addr,
            Err(error) => {
                eprintln!("bare-hyper: bad address {arg:?}: {error} (usage: bare-hyper [--graceful] [ADDR])");
                return ExitCode::from(2);
            }
        }
    }
    load::baseline::run(load::baseline::bare_hyper(listen, on_sigterm))
}
