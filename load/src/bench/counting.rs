//! The counting part (`--parts counting`, alias `redirect`): the redirect
//! `GET /{code}` under closed-loop load, lameduck counting hits against the
//! minimal axum app's in-memory redirect (headline, target ≥ 0.90) and
//! against lameduck's same path without counting (`redirect-uncounted`):
//! the cost of hit counting.

use super::stats::{fmt_ratios, paired_ratio, paired_ratios, verdict};
use super::table::{ratio_table, series_table};
use super::{
    stop, Bench, BenchReport, Series, Target, COUNTING, MINIMAL_REDIRECT, NOT_COUNTING,
    THROUGHPUT_TARGET,
};
use crate::SERVICE;

impl Bench<'_> {
    pub(super) async fn counting(&self) -> anyhow::Result<Vec<Series>> {
        eprintln!("load: the redirect path: {SERVICE}, the minimal axum app, no hit counting");
        let b = self.binaries;
        let mut counted = self
            .start(
                &format!("ct-{SERVICE}"),
                &self.spec(&b.service, "ct-counted", &[]),
                "/readyz",
            )
            .await?;
        let mut minimal = self
            .start(
                "ct-minimal-axum",
                &self.spec(&b.minimal_axum, "ct-minimal", &[]),
                "/readyz",
            )
            .await?;
        let mut uncounted = self
            .start(
                "ct-uncounted",
                &self.spec(&b.redirect_uncounted, "ct-uncounted", &[]),
                "/readyz",
            )
            .await?;
        for replica in [&counted, &minimal, &uncounted] {
            self.create_links(replica).await?;
        }
        let requests = self.redirect_requests();
        let targets = [
            Target::new(&COUNTING, &counted, &requests, 307),
            Target::new(MINIMAL_REDIRECT, &minimal, &requests, 307),
            Target::new(&NOT_COUNTING, &uncounted, &requests, 307),
        ];
        let series = self.rounds(&targets).await;
        for replica in [&mut counted, &mut minimal, &mut uncounted] {
            stop(replica).await;
        }
        Ok(series)
    }
}

/// The counting part's section: every server's medians, lameduck ÷ the
/// minimal axum app run by run against the target, and the cost of
/// counting.
pub(super) fn counting_summary(report: &BenchReport, footer: &str) -> String {
    let o = &report.options;
    let [counted, minimal, uncounted] = report.counting.as_slice() else {
        return String::new();
    };
    let ratios = paired_ratios(&counted.runs, &minimal.runs, |r| r.rps);
    format!(
        "### Redirect hot path: `GET /{{code}}` over {} links ({SERVICE} on SQLite, the default store; the minimal axum app on an in-memory map), closed loop, {} connections, {} rounds of {:?} (+{:?} warm-up)\n\n{}\n\
         **{SERVICE} ÷ minimal axum app, run by run, median (min–max): throughput {} \
         (target ≥ {THROUGHPUT_TARGET:.2}: {}), p50 {}, p99 {}; server CPU a request {}.** The cost of counting the hit:\n\n{}\n{footer}\n",
        o.links,
        o.connections,
        o.rounds,
        o.duration,
        o.warmup,
        series_table(&[counted, minimal, uncounted], minimal),
        fmt_ratios(&ratios),
        verdict(&ratios, THROUGHPUT_TARGET, true),
        paired_ratio(counted, minimal, |r| r.p50_ms),
        paired_ratio(counted, minimal, |r| r.p99_ms),
        paired_ratio(counted, minimal, |r| r.cpu_us),
        ratio_table(
            counted,
            &[
                (minimal, format!("≥ {THROUGHPUT_TARGET:.2} (headline)")),
                (uncounted, "≥ 0.95 (the cost of counting)".to_owned()),
            ]
        ),
    )
}
