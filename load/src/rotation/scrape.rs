//! Each replica's own count of what it served, read from its `/metrics`
//! on the admin listener every [`TICK`]: the connections its main listener
//! accepted, the redirects it answered, and the connections it closed, by
//! who and why. The server's counters are the honest source: through an L4
//! balancer the client cannot tell which replica it reached, and a
//! client-side count of handshakes would miss none of them but could not
//! say where they landed.
//!
//! Readings are taken on a grid of ticks from the traffic's origin, so
//! that the replicas' series line up; tick `k` reads the counts at about
//! `origin + k·TICK`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior};

use crate::metric;
use crate::metrics::{Metrics, MetricsConn};

/// How often a replica's counters are read: the resolution of the
/// reconnect rate.
pub(super) const TICK: Duration = Duration::from_millis(100);

/// How long one reading may take before it is skipped.
const READ_TIMEOUT: Duration = Duration::from_millis(500);

/// One replica's counters at one tick.
#[derive(Clone, Debug, Default)]
pub(super) struct Reading {
    /// Tick number: the reading was taken at about `origin + tick·TICK`.
    pub(super) tick: u64,
    /// `connections_accepted_total`: every connection its main listener
    /// accepted.
    pub(super) accepted: u64,
    /// `http_requests_total{status="3xx"}`: redirects answered.
    pub(super) redirects: u64,
    /// `connections_closed_total{by,reason}`, keyed `by/reason`.
    pub(super) closed: BTreeMap<String, u64>,
    /// `connections_open`, every protocol.
    pub(super) open: u64,
}

/// A running reader of one replica's counters.
#[derive(Debug)]
pub(super) struct Scraper {
    stop: watch::Sender<bool>,
    task: JoinHandle<Vec<Reading>>,
}

impl Scraper {
    /// Reads `admin`'s `/metrics` at every tick from `origin` on (the next
    /// one from now) until [`Scraper::finish`].
    pub(super) fn spawn(admin: SocketAddr, origin: Instant) -> Scraper {
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(read_until(admin, origin, stopped));
        Scraper { stop, task }
    }

    /// Takes one last reading (if the replica still answers) and stops;
    /// returns every reading taken, in tick order.
    pub(super) async fn finish(self) -> Vec<Reading> {
        let _ = self.stop.send(true);
        self.task.await.unwrap_or_default()
    }
}

async fn read_until(
    admin: SocketAddr,
    origin: Instant,
    mut stop: watch::Receiver<bool>,
) -> Vec<Reading> {
    let now = Instant::now();
    let first = if now <= origin {
        0
    } else {
        let elapsed = now.duration_since(origin).as_nanos();
        u64::try_from(elapsed.div_ceil(TICK.as_nanos())).unwrap_or(u64::MAX)
    };
    let start = origin + TICK * u32::try_from(first).unwrap_or(u32::MAX);
    let mut ticker = tokio::time::interval_at(start, TICK);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Skip);
    let mut conn = MetricsConn::new(admin);
    let mut readings = Vec::new();
    loop {
        let (at, last) = tokio::select! {
            at = ticker.tick() => (at, false),
            _ = stop.changed() => (Instant::now(), true),
        };
        // The last reading is of the moment it was asked for: what the
        // replica counted since the last tick is not lost (a replica that
        // has exited does not answer, and its last tick stands).
        let tick = (at.duration_since(origin).as_nanos() + TICK.as_nanos() / 2) / TICK.as_nanos();
        let tick = u64::try_from(tick).unwrap_or(u64::MAX);
        if let Some(mut reading) = read(&mut conn).await {
            reading.tick = tick.max(readings.last().map_or(0, |r: &Reading| r.tick));
            readings.push(reading);
        }
        if last {
            break;
        }
    }
    readings
}

/// Waits until the replica at `admin` has no connection open (its clients
/// are gone and it has seen them go), at most `bound`, so that a last
/// reading counts every close.
pub(super) async fn wait_closed(admin: SocketAddr, bound: Duration) {
    let deadline = Instant::now() + bound;
    let mut conn = MetricsConn::new(admin);
    while Instant::now() < deadline {
        if read(&mut conn).await.is_some_and(|r| r.open == 0) {
            return;
        }
        tokio::time::sleep(TICK / 4).await;
    }
}

/// One `/metrics` on `conn` (opened if needed), parsed; `None` if it did
/// not answer within [`READ_TIMEOUT`] (the next tick tries again, on a new
/// connection).
async fn read(conn: &mut MetricsConn) -> Option<Reading> {
    match tokio::time::timeout(READ_TIMEOUT, conn.read_text()).await {
        Ok(Ok(text)) => Some(parse(&text)),
        _ => None,
    }
}

/// The counters of a `/metrics` page; a page that does not parse reads as
/// no counts, as one the server never writes.
pub(super) fn parse(text: &str) -> Reading {
    Metrics::parse(text)
        .map(|metrics| Reading::of(&metrics))
        .unwrap_or_default()
}

impl Reading {
    /// The counters of a parsed page (at tick 0).
    fn of(metrics: &Metrics) -> Reading {
        let to_count = |value: f64| {
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let count = value as u64;
            count
        };
        let mut reading = Reading {
            accepted: to_count(metrics.sum(&metric("connections_accepted_total"))),
            open: to_count(metrics.sum(&metric("connections_open"))),
            ..Reading::default()
        };
        let requests = metric("http_requests_total");
        for sample in metrics.samples(&requests) {
            if sample.label("status") == Some("3xx") {
                reading.redirects += to_count(sample.value);
            }
        }
        let closed = metric("connections_closed_total");
        for sample in metrics.samples(&closed) {
            let by = sample.label("by").unwrap_or("?");
            let reason = sample.label("reason").unwrap_or("?");
            *reading.closed.entry(format!("{by}/{reason}")).or_default() += to_count(sample.value);
        }
        reading
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // A page as the service writes it: each family under its TYPE line.
    #[test]
    fn the_counters_are_read_from_a_metrics_page() {
        let page = format!(
            "# HELP {p}_connections_accepted Connections accepted.\n\
             # TYPE {p}_connections_accepted counter\n\
             {p}_connections_accepted_total 1234\n\
             # TYPE {p}_http_requests counter\n\
             {p}_http_requests_total{{route=\"/{{code}}\",status=\"3xx\"}} 500\n\
             {p}_http_requests_total{{route=\"/api/links\",status=\"2xx\"}} 7\n\
             # TYPE {p}_connections_closed counter\n\
             {p}_connections_closed_total{{by=\"server\",reason=\"drain\"}} 30\n\
             {p}_connections_closed_total{{by=\"client\",reason=\"client\"}} 2\n\
             # TYPE {p}_connections_open gauge\n\
             {p}_connections_open{{protocol=\"http1\"}} 3\n\
             {p}_connections_open{{protocol=\"http2\"}} 1\n\
             # EOF\n",
            p = lameduck::CRATE_NAME
        );
        let reading = parse(&page);
        assert_eq!(reading.accepted, 1234);
        assert_eq!(reading.redirects, 500);
        assert_eq!(reading.closed.get("server/drain"), Some(&30));
        assert_eq!(reading.closed.get("client/client"), Some(&2));
        assert_eq!(reading.open, 4);
    }
}
