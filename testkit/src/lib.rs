//! What the lameduck integration tests share, as a library of its own: the
//! tests of `tests/` and the suites with binaries of their own use one copy.
//!
//! - [`fate`]: what happened to one request, in the classes the tests and
//!   `load` report;
//! - [`binary`]: the real binary as a child process, its logs and exit
//!   code, real signals, and raw HTTP/1 on blocking sockets with timeouts;
//! - [`postgres`]: a throwaway PostgreSQL cluster per test;
//! - [`haproxy`]: HAProxy's runtime API, over a Unix socket or TCP, and
//!   `show stat` in typed rows;
//! - [`otlp`]: an OTLP receiver, over gRPC and HTTP, plain or TLS, keeping
//!   the spans it decodes or only counting them;
//! - [`relay`]: a TCP relay in front of PostgreSQL that cuts its clients
//!   off, or loses the answer to one commit;
//! - [`tls`]: a test CA and the certificates it signs;
//! - [`traffic`]: clients that keep asking while the test changes the
//!   server, and what each request met.
//!
//! Every wait is bounded, and every child process is killed when its
//! handle is dropped.

pub mod binary;
pub mod fate;
pub mod haproxy;
pub mod otlp;
pub mod postgres;
pub mod relay;
pub mod tls;
pub mod traffic;
