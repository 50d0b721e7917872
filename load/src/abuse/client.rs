//! The normal client that keeps using the server during an attack: open
//! loop, redirects and link creations at a steady pace, each on a new
//! connection.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinSet;
use tokio::time::Instant;

use super::{Kind, Options, Record, LINK_CODE};
use crate::fate::Fate;
use crate::raw::{self, RawConn};

/// Open loop: request *i* of each kind is due at *start + i ÷ rate* whether
/// or not earlier ones have answered (creations half a period after
/// redirects), each on a new connection, for `--window`; latency counts
/// from when it was due, so a stall shows as latency, not as fewer
/// requests.
pub(super) async fn normal_client(addr: SocketAddr, options: &Options) -> Vec<Record> {
    let redirect = Arc::new(raw::get(&format!("/{LINK_CODE}")));
    let start = Instant::now();
    let mut tasks = JoinSet::new();
    for (at, kind, i) in schedule(options) {
        tokio::time::sleep_until(start + at).await;
        let request = match kind {
            Kind::Redirect => Arc::clone(&redirect),
            Kind::Creation => Arc::new(raw::post_json(
                "/api/links",
                &format!(r#"{{"url":"https://example.com/normal/{i}"}}"#),
            )),
        };
        let due = Due {
            start,
            at,
            kind,
            timeout: options.timeout,
        };
        tasks.spawn(send(addr, request, due));
    }
    collect(tasks).await
}

/// When each request is due, from the start: (offset, kind, index within
/// its kind), in order.
fn schedule(options: &Options) -> Vec<(Duration, Kind, u64)> {
    let window_ms = u64::try_from(options.window.as_millis()).unwrap_or(u64::MAX);
    let per_kind = u64::from(options.rate).saturating_mul(window_ms) / 1000;
    let period = Duration::from_secs(1) / options.rate;
    let mut due: Vec<(Duration, Kind, u64)> = (0..per_kind)
        .flat_map(|i| {
            let at = period * u32::try_from(i).unwrap_or(u32::MAX);
            [
                (at, Kind::Redirect, i),
                (at + period / 2, Kind::Creation, i),
            ]
        })
        .collect();
    due.sort_by_key(|(at, _, _)| *at);
    due
}

/// When one request was due and how long it may take.
#[derive(Clone, Copy)]
struct Due {
    /// The start of the measurement.
    start: Instant,
    /// Its offset from `start`.
    at: Duration,
    /// Its kind.
    kind: Kind,
    /// How long it may take from when it was due, connect included.
    timeout: Duration,
}

/// Sends `request` on a new connection and records its fate.
async fn send(addr: SocketAddr, request: Arc<Vec<u8>>, due: Due) -> Record {
    let due_at = due.start + due.at;
    let answer = tokio::time::timeout_at(due_at + due.timeout, async {
        let mut conn = RawConn::connect(addr).await?;
        conn.exchange(&request).await
    })
    .await;
    let fate = match answer {
        Ok(Ok(head)) => Fate::of_status(head.status, due.kind.expected()),
        Ok(Err(error)) => Fate::of_io(&error).unwrap_or(Fate::OtherError),
        Err(_) => Fate::Timeout,
    };
    Record {
        kind: due.kind,
        due_ms: due.at.as_secs_f64() * 1e3,
        latency_ms: due_at.elapsed().as_secs_f64() * 1e3,
        fate,
    }
}

/// Every request's record, in due order; a task that failed counts as a
/// failed redirect.
async fn collect(mut tasks: JoinSet<Record>) -> Vec<Record> {
    let mut records = Vec::new();
    while let Some(done) = tasks.join_next().await {
        match done {
            Ok(record) => records.push(record),
            Err(error) => {
                eprintln!("load abuse: a request task failed: {error}");
                records.push(Record {
                    kind: Kind::Redirect,
                    due_ms: 0.0,
                    latency_ms: 0.0,
                    fate: Fate::OtherError,
                });
            }
        }
    }
    records.sort_by(|a, b| a.due_ms.total_cmp(&b.due_ms));
    records
}
