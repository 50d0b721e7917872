//! The traces part's OTLP receivers: the test kit's receiver in its
//! counting mode ([`Receiver::counting`]), one per transport, each on a
//! loopback port and a thread of its own, whose CPU time the part reads
//! apart from the load generator's. It takes every export, counts its
//! spans by kind and answers success, and nothing else, so that it never
//! sets the pace of the server that exports to it.

use std::fmt;
use std::time::Duration;

use anyhow::Context;
use lameduck_testkit::otlp::{Protocol, Received, Receiver};
use tokio::time::Instant;

use crate::replica;

/// How often [`Receivers::settle`] looks at the counts.
const SETTLE_POLL: Duration = Duration::from_millis(25);

/// A counting receiver per transport, so that two servers exporting over
/// different transports are counted apart. Dropping them stops them.
pub(super) struct Receivers {
    http: Receiver,
    grpc: Receiver,
}

impl Receivers {
    /// Starts both, on `127.0.0.1:0`, on threads that inherit the caller's
    /// CPU affinity.
    ///
    /// # Errors
    /// If one cannot bind or start its thread or runtime.
    pub(super) fn start() -> anyhow::Result<Receivers> {
        let start = |protocol: Protocol| {
            Receiver::counting(protocol).with_context(|| {
                format!("cannot start the OTLP receiver of {}", protocol.env_value())
            })
        };
        Ok(Receivers {
            http: start(Protocol::HttpProtobuf)?,
            grpc: start(Protocol::Grpc)?,
        })
    }

    fn of(&self, transport: Protocol) -> &Receiver {
        match transport {
            Protocol::HttpProtobuf => &self.http,
            Protocol::Grpc => &self.grpc,
        }
    }

    /// The URL to give an exporter over `transport` as
    /// `OTEL_EXPORTER_OTLP_ENDPOINT`.
    pub(super) fn endpoint(&self, transport: Protocol) -> String {
        self.of(transport).endpoint()
    }

    /// What has been taken over `transport` so far.
    pub(super) fn received(&self, transport: Protocol) -> Received {
        self.of(transport).received()
    }

    /// Waits until nothing more has arrived over `transport` for `quiet`
    /// (the exporter's batch has been emptied), for at most `bound`;
    /// returns what has been taken by then.
    pub(super) async fn settle(
        &self,
        transport: Protocol,
        quiet: Duration,
        bound: Duration,
    ) -> Received {
        let deadline = Instant::now() + bound;
        let mut last = self.received(transport);
        let mut since = Instant::now();
        while Instant::now() < deadline && since.elapsed() < quiet {
            tokio::time::sleep(SETTLE_POLL).await;
            let now = self.received(transport);
            if now != last {
                last = now;
                since = Instant::now();
            }
        }
        last
    }

    /// The CPU time (user + system) both receivers' threads have used;
    /// `None` if `/proc` cannot be read.
    pub(super) fn cpu_time(&self) -> Option<Duration> {
        let thread =
            |receiver: &Receiver| replica::cpu_time(&format!("self/task/{}", receiver.thread_id()));
        Some(thread(&self.http)? + thread(&self.grpc)?)
    }
}

impl fmt::Display for Receivers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "OTLP receivers on {} (HTTP) and {} (gRPC)",
            self.http.endpoint(),
            self.grpc.endpoint()
        )
    }
}
