//! The throughput part (`--parts throughput`): throughput, latency and CPU
//! a request of `GET /healthz` under closed-loop load. lameduck (all its
//! middleware) against the minimal axum app (headline, target ≥ 0.90), axum
//! with the usual tower-http stack, bare hyper, lameduck's own app on plain
//! `axum::serve`, and a second copy of the minimal app (the run's own noise).

use std::sync::Arc;

use super::stats::{fmt_ratios, paired_ratio, paired_ratios, verdict};
use super::table::{ratio_table, series_table};
use super::{
    stop, Bench, BenchReport, Series, Target, AXUM_STACK, BARE_HYPER, LAMEDUCK, MINIMAL_AXUM,
    MINIMAL_AXUM_COPY, PLAIN_AXUM, THROUGHPUT_TARGET,
};
use crate::raw;
use crate::SERVICE;

impl Bench<'_> {
    pub(super) async fn throughput(&self) -> anyhow::Result<Vec<Series>> {
        eprintln!("load: throughput of GET /healthz");
        let b = self.binaries;
        let mut service = self
            .start(
                &format!("tp-{SERVICE}"),
                &self.spec(&b.service, &format!("tp-{SERVICE}"), &[]),
                "/readyz",
            )
            .await?;
        let mut minimal = self
            .start(
                "tp-minimal-axum",
                &self.spec(&b.minimal_axum, "tp-minimal", &[]),
                "/readyz",
            )
            .await?;
        let mut stack = self
            .start(
                "tp-axum-stack",
                &self.spec(&b.axum_stack, "tp-stack", &[]),
                "/readyz",
            )
            .await?;
        let mut bare = self
            .start("tp-bare-hyper", &self.bare_spec(), "/healthz")
            .await?;
        let mut plain = self
            .start(
                "tp-plain-axum",
                &self.spec(&b.plain_axum, "tp-plain", &[]),
                "/readyz",
            )
            .await?;
        let mut copy = self
            .start(
                "tp-minimal-axum-copy",
                &self.spec(&b.minimal_axum, "tp-minimal-copy", &[]),
                "/readyz",
            )
            .await?;
        let requests = Arc::new(vec![raw::get("/healthz")]);
        let targets = [
            Target::new(LAMEDUCK, &service, &requests, 200),
            Target::new(MINIMAL_AXUM, &minimal, &requests, 200),
            Target::new(AXUM_STACK, &stack, &requests, 200),
            Target::new(BARE_HYPER, &bare, &requests, 200),
            Target::new(PLAIN_AXUM, &plain, &requests, 200),
            Target::new(MINIMAL_AXUM_COPY, &copy, &requests, 200),
        ];
        let series = self.rounds(&targets).await;
        for replica in [
            &mut service,
            &mut minimal,
            &mut stack,
            &mut bare,
            &mut plain,
            &mut copy,
        ] {
            stop(replica).await;
        }
        Ok(series)
    }
}

/// The throughput part's section: every server's medians, lameduck ÷ the
/// minimal axum app run by run against the target, the run's own noise, and
/// lameduck ÷ each of the other baselines.
pub(super) fn throughput_summary(report: &BenchReport, footer: &str) -> String {
    let o = &report.options;
    let [service, minimal, stack, bare, plain, copy] = report.throughput.as_slice() else {
        return String::new();
    };
    let ratios = paired_ratios(&service.runs, &minimal.runs, |r| r.rps);
    format!(
        "### Trivial route: `GET /healthz`, closed loop, {} connections, {} rounds of {:?} (+{:?} warm-up), servers taking turns\n\n{}\n\
         **{SERVICE} ÷ minimal axum app, run by run, median (min–max): throughput {} \
         (target ≥ {THROUGHPUT_TARGET:.2}: {}), p50 {}, p99 {}; server CPU a request {}.** The run's own noise, \
         two copies of the minimal axum app taking turns like the rest (minimal axum app \
         ÷ its second copy, run by run): throughput {}, p99 {}. The other baselines:\n\n{}\n{footer}\n",
        o.connections,
        o.rounds,
        o.duration,
        o.warmup,
        series_table(&[service, minimal, stack, bare, plain, copy], minimal),
        fmt_ratios(&ratios),
        verdict(&ratios, THROUGHPUT_TARGET, true),
        paired_ratio(service, minimal, |r| r.p50_ms),
        paired_ratio(service, minimal, |r| r.p99_ms),
        paired_ratio(service, minimal, |r| r.cpu_us),
        paired_ratio(minimal, copy, |r| r.rps),
        paired_ratio(minimal, copy, |r| r.p99_ms),
        ratio_table(
            service,
            &[
                (minimal, format!("≥ {THROUGHPUT_TARGET:.2} (headline)")),
                (stack, String::new()),
                (bare, String::new()),
                (plain, String::new()),
            ]
        ),
    )
}
