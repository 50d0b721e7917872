//! The four disturbances of `load outage`, one phase each, and what one
//! phase's traffic and readings add up to.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::ValueEnum;
use hdrhistogram::Histogram;
use lameduck_testkit::relay::Relay;
use serde::Serialize;
use sqlx::PgPool;
use tokio::time::Instant;

use super::monitor::Timeline;
use super::Options;
use crate::fate::{Fate, FateCounts};
use crate::fleet::Ran;
use crate::postgres::PgCluster;
use crate::report::{self, Latency};
use crate::traffic::{Kind, Record};

/// One disturbance of the database.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Phase {
    /// (a) PostgreSQL stopped (`pg_ctl stop -m fast`), then started again.
    Stopped,
    /// (b) PostgreSQL up, `links` locked by another session while creations
    /// keep coming: every replica's pool fills with waiting calls.
    Locked,
    /// (c) `pg_ctl restart -m fast`: every pooled connection dies at once.
    Restarted,
    /// (d) One replica cut off from PostgreSQL (its relay stopped, then
    /// started again); the others reach it as before.
    CutOff,
}

impl Phase {
    /// Every phase, in the order they run.
    pub const ALL: [Phase; 4] = [
        Phase::Stopped,
        Phase::Locked,
        Phase::Restarted,
        Phase::CutOff,
    ];

    /// `(a) PostgreSQL stopped for 15s`, …
    pub fn label(self, options: &Options) -> String {
        let human = |d: Duration| humantime::format_duration(d).to_string();
        match self {
            Phase::Stopped => format!("(a) PostgreSQL stopped for {}", human(options.stopped)),
            Phase::Locked => format!(
                "(b) `links` locked for {} (pools saturated)",
                human(options.locked)
            ),
            Phase::Restarted => "(c) PostgreSQL restarted (`pg_ctl restart -m fast`)".to_owned(),
            Phase::CutOff => format!(
                "(d) one replica cut off from PostgreSQL for {}",
                human(options.cut_off)
            ),
        }
    }

    /// A few words for the picture.
    pub fn short(self) -> &'static str {
        match self {
            Phase::Stopped => "(a) stopped",
            Phase::Locked => "(b) locked",
            Phase::Restarted => "(c) restart",
            Phase::CutOff => "(d) one cut off",
        }
    }
}

/// What the harness disturbs.
pub struct Database<'a> {
    /// The one PostgreSQL every replica uses.
    pub cluster: &'a Arc<PgCluster>,
    /// The harness's own connections to it (not through a relay).
    pub pool: &'a PgPool,
    /// One relay per replica, in replica order.
    pub relays: &'a [Relay],
}

/// When a phase's disturbance began, and when the database answered again,
/// since the phase's traffic started.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Disturbance {
    /// It began.
    #[serde(with = "crate::report::millis")]
    pub from: Duration,
    /// The database answered again: started and accepting connections,
    /// the lock released, the relay listening.
    #[serde(with = "crate::report::millis")]
    pub answering: Duration,
}

/// Disturbs the database as `phase` says and undoes it; `origin` is when
/// the phase's traffic started.
///
/// # Errors
/// If PostgreSQL cannot be stopped, started or locked, or a relay cannot
/// listen again.
pub async fn disturb(
    phase: Phase,
    database: &Database<'_>,
    options: &Options,
    origin: Instant,
) -> anyhow::Result<Disturbance> {
    let from = origin.elapsed();
    let blocking = |what: fn(&PgCluster)| {
        let cluster = Arc::clone(database.cluster);
        tokio::task::spawn_blocking(move || what(&cluster))
    };
    match phase {
        Phase::Stopped => {
            blocking(PgCluster::stop).await.context("pg_ctl stop")?;
            tokio::time::sleep(options.stopped).await;
            blocking(PgCluster::start_again)
                .await
                .context("pg_ctl start")?;
        }
        Phase::Locked => {
            let mut session = database.pool.acquire().await?;
            sqlx::query("BEGIN").execute(&mut *session).await?;
            sqlx::query("LOCK TABLE links IN ACCESS EXCLUSIVE MODE")
                .execute(&mut *session)
                .await?;
            tokio::time::sleep(options.locked).await;
            sqlx::query("COMMIT").execute(&mut *session).await?;
        }
        Phase::Restarted => {
            blocking(PgCluster::restart_fast)
                .await
                .context("pg_ctl restart")?;
        }
        Phase::CutOff => {
            let relay = database.relays.last().context("no relay to cut")?;
            relay.cut().await;
            tokio::time::sleep(options.cut_off).await;
            relay
                .restore()
                .await
                .with_context(|| format!("cannot listen on {} again", relay.addr))?;
        }
    }
    Ok(Disturbance {
        from,
        answering: origin.elapsed(),
    })
}

/// One phase of one flavor's run, every request's fate counted.
#[derive(Clone, Debug, Serialize)]
pub struct PhaseResult {
    /// Which.
    pub phase: Phase,
    /// Its label in tables.
    pub label: String,
    /// Seconds of traffic.
    pub traffic_s: f64,
    /// When the database was disturbed.
    pub disturbance: Disturbance,
    /// `GET /{code}` of links every replica has served.
    pub redirects: FateCounts,
    /// `POST /api/links`.
    pub creations: FateCounts,
    /// `GET /api/links/{code}`.
    pub reads: FateCounts,
    /// Creations and reads answered 503 by a replica whose breaker was
    /// open (every reading around the request said `down`): their latency.
    pub failed_fast: Latency,
    /// Of those, answered without `Retry-After`.
    pub failed_fast_without_retry_after: u64,
    /// Their latencies, in microseconds, to pool over the phases.
    #[serde(skip)]
    pub failed_fast_us: Vec<u64>,
    /// Creations and reads answered 503, and how many of those carried
    /// `Retry-After`.
    pub unavailable: (u64, u64),
    /// Latency of every creation and read, whatever its answer.
    pub database_latency: Latency,
    /// From the database answering again to the last creation or read that
    /// failed after it (zero if none did).
    #[serde(with = "crate::report::millis")]
    pub recovered_after: Duration,
    /// Per replica: `/readyz` readings that were not 200, of how many.
    pub not_ready: Vec<(usize, usize)>,
    /// Per replica: seconds it reported the database down.
    pub down_s: Vec<f64>,
    /// The fewest servers the balancer had UP.
    pub lb_min_up: Option<usize>,
    /// Redirects answered 307: hits the service owes the database.
    pub redirects_answered: u64,
    /// What `SUM(links.hits)` grew by, read once every replica's pending
    /// hits were flushed after the phase.
    pub hits_stored: i64,
    /// Creations answered 201.
    pub links_answered: u64,
    /// Creations answered 503 naming the link the database did not
    /// confirm: each may have been stored.
    pub links_unconfirmed: u64,
    /// What the number of links grew by.
    pub links_stored: i64,
    /// Per second: requests answered as expected.
    pub ok_per_second: Vec<u64>,
    /// Per second: failed requests.
    pub failed_per_second: Vec<u64>,
    /// Every `/readyz` reading and the balancer's view.
    #[serde(skip)]
    pub timeline: Timeline,
}

/// What a phase's run left to sum up, beside what the database gained.
pub struct Observed<'a> {
    /// Which phase.
    pub phase: Phase,
    /// The run's options.
    pub options: &'a Options,
    /// The phase's traffic.
    pub ran: &'a Ran,
    /// Every `/readyz` reading and the balancer's view.
    pub timeline: Timeline,
    /// When the database was disturbed.
    pub disturbance: Disturbance,
}

/// A phase's requests counted: by kind, per second, the latency of those
/// that needed the database, and the 503s behind an open breaker.
struct Tally {
    redirects: FateCounts,
    creations: FateCounts,
    reads: FateCounts,
    failed_fast: Histogram<u64>,
    failed_fast_us: Vec<u64>,
    failed_fast_without_retry_after: u64,
    unavailable: u64,
    with_retry_after: u64,
    database_latency: Histogram<u64>,
    recovered_after: Duration,
    ok_per_second: Vec<u64>,
    failed_per_second: Vec<u64>,
    redirects_answered: u64,
    links_answered: u64,
    links_unconfirmed: u64,
}

impl Tally {
    fn new(seconds: usize) -> Tally {
        Tally {
            redirects: FateCounts::default(),
            creations: FateCounts::default(),
            reads: FateCounts::default(),
            failed_fast: report::histogram(),
            failed_fast_us: Vec::new(),
            failed_fast_without_retry_after: 0,
            unavailable: 0,
            with_retry_after: 0,
            database_latency: report::histogram(),
            recovered_after: Duration::ZERO,
            ok_per_second: vec![0; seconds],
            failed_per_second: vec![0; seconds],
            redirects_answered: 0,
            links_answered: 0,
            links_unconfirmed: 0,
        }
    }

    /// Counts `record` by kind, answer and second.
    fn add(&mut self, record: &Record) {
        match record.kind {
            Kind::Redirect => self.redirects.add(record.fate),
            Kind::Create => self.creations.add(record.fate),
            Kind::Read => self.reads.add(record.fate),
        }
        match (record.kind, record.status) {
            (Kind::Redirect, 307) => self.redirects_answered += 1,
            (Kind::Create, 201) => self.links_answered += 1,
            (Kind::Create, 503) if record.unconfirmed => self.links_unconfirmed += 1,
            _ => {}
        }
        #[allow(clippy::cast_possible_truncation)]
        let second = record.due.as_secs() as usize;
        let bucket = if record.fate == Fate::Success {
            self.ok_per_second.get_mut(second)
        } else {
            self.failed_per_second.get_mut(second)
        };
        if let Some(bucket) = bucket {
            *bucket += 1;
        }
    }

    /// Counts a request that needed the database: its latency, a failure
    /// after the database answered again, a 503 and whether the replica's
    /// breaker was open then.
    fn add_database(&mut self, record: &Record, timeline: &Timeline, answering: Duration) {
        report::record(&mut self.database_latency, record.latency);
        if record.fate.is_failure() && record.due >= answering {
            self.recovered_after = self.recovered_after.max(record.due - answering);
        }
        if record.status != 503 {
            return;
        }
        self.unavailable += 1;
        self.with_retry_after += u64::from(record.retry_after);
        let replica = record
            .server
            .map(|slot| usize::from(slot).saturating_sub(1));
        let open = replica.is_some_and(|replica| {
            timeline.breaker_open(replica, record.due, record.due + record.latency)
        });
        if open {
            report::record(&mut self.failed_fast, record.latency);
            self.failed_fast_us
                .push(u64::try_from(record.latency.as_micros()).unwrap_or(u64::MAX));
            self.failed_fast_without_retry_after += u64::from(!record.retry_after);
        }
    }
}

impl PhaseResult {
    /// Sums up one phase: its requests, its readings, and what the database
    /// gained (`hits_stored`, `links_stored`: the growth over the phase).
    pub fn of(observed: Observed<'_>, (hits_stored, links_stored): (i64, i64)) -> PhaseResult {
        let Observed {
            phase,
            options,
            ran,
            timeline,
            disturbance,
        } = observed;
        let records = &ran.records;
        #[allow(clippy::cast_possible_truncation)]
        let seconds = (records.last().map_or(0, |r| r.due.as_secs()) as usize).max(1);
        let mut tally = Tally::new(seconds);
        for record in records {
            tally.add(record);
            if record.kind.needs_database() {
                tally.add_database(record, &timeline, disturbance.answering);
            }
        }
        PhaseResult {
            phase,
            label: phase.label(options),
            traffic_s: (ran.traffic_s * 10.0).round() / 10.0,
            disturbance,
            redirects: tally.redirects,
            creations: tally.creations,
            reads: tally.reads,
            failed_fast: Latency::of(&tally.failed_fast),
            failed_fast_without_retry_after: tally.failed_fast_without_retry_after,
            failed_fast_us: tally.failed_fast_us,
            unavailable: (tally.unavailable, tally.with_retry_after),
            database_latency: Latency::of(&tally.database_latency),
            recovered_after: tally.recovered_after,
            not_ready: timeline
                .not_ready()
                .into_iter()
                .zip(timeline.readings())
                .collect(),
            down_s: timeline.down_seconds(),
            lb_min_up: timeline.lb_min_up(),
            redirects_answered: tally.redirects_answered,
            hits_stored,
            links_answered: tally.links_answered,
            links_unconfirmed: tally.links_unconfirmed,
            links_stored,
            ok_per_second: tally.ok_per_second,
            failed_per_second: tally.failed_per_second,
            timeline,
        }
    }

    /// Hits answered but not stored (negative: stored but not answered).
    pub fn hits_lost(&self) -> i64 {
        i64::try_from(self.redirects_answered).unwrap_or(i64::MAX) - self.hits_stored
    }

    /// Links answered 201 but not stored.
    pub fn links_lost(&self) -> i64 {
        i64::try_from(self.links_answered).unwrap_or(i64::MAX) - self.links_stored
    }

    /// Links stored that neither a 201 nor an unconfirmed 503 announced.
    pub fn links_unannounced(&self) -> i64 {
        unannounced(
            self.links_stored,
            self.links_answered,
            self.links_unconfirmed,
        )
    }

    /// Every `/readyz` reading on every replica was 200.
    pub fn always_ready(&self) -> bool {
        self.not_ready.iter().all(|(not_ready, _)| *not_ready == 0)
    }
}

/// Links stored beyond those answered 201 and those answered unconfirmed:
/// an unconfirmed creation may be stored or not, any other must not be.
pub fn unannounced(stored: i64, answered: u64, unconfirmed: u64) -> i64 {
    stored - i64::try_from(answered.saturating_add(unconfirmed)).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::unannounced;

    #[test]
    fn a_link_stored_is_announced_by_a_201_or_an_unconfirmed_answer() {
        assert_eq!(unannounced(66, 66, 0), 0);
        assert_eq!(unannounced(67, 66, 1), 0, "the unconfirmed one was made");
        assert_eq!(unannounced(66, 66, 1), -1, "the unconfirmed one was not");
        assert_eq!(unannounced(67, 66, 0), 1, "a link nobody was told of");
    }
}
