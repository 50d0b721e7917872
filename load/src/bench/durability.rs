//! The durability part (`--parts durability`): what the journal costs. The
//! counted redirect `GET /{code}` with the default durability (every hit
//! in a mapped journal before the 307 goes out, so that a SIGKILL or the
//! OOM killer loses none) against the same build counting in memory only
//! (`--state-durability memory`) and against the minimal axum app, taking
//! turns: on one core (CPU 0) when pinning, then on all cores. Headline:
//! journal ÷ memory only, target ≥ 0.95 in each placement. Each server's
//! RSS and the journal's disk use are read after the runs.

use std::path::Path;

use serde::Serialize;

use super::stats::{fmt_ratios, paired_ratios, verdict};
use super::table::{fmt_cpu, pairs_table, series_table};
use super::{stop, Bench, BenchReport, Series, Target, MINIMAL_REDIRECT};
use crate::replica::Spec;
use crate::report;
use crate::SERVICE;

/// The headline: the journal keeps this much of memory-only throughput.
pub const DURABILITY_TARGET: f64 = 0.95;

/// The servers' names in the tables.
const JOURNAL: &str = "counting, journal (default)";
const MEMORY: &str = "counting, memory only";

/// One placement's runs.
#[derive(Clone, Debug, Serialize)]
pub struct DurabilityRun {
    /// Where the servers ran: one core, or all cores.
    pub placement: String,
    /// The journal, memory only, and the minimal axum app.
    pub series: Vec<Series>,
    /// Each server's resident set after its runs, KiB, in `series` order.
    pub rss_kib: Vec<Option<u64>>,
    /// The journal's files after the runs: segments and ledger, bytes.
    pub journal_bytes: u64,
    /// Hits the journaled server answered over its runs and warm-ups,
    /// which its journal took.
    pub journaled_hits: u64,
}

impl Bench<'_> {
    pub(super) async fn durability(&self) -> anyhow::Result<Vec<DurabilityRun>> {
        let mut runs = Vec::new();
        for (tag, (placement, cpus)) in self.placements().into_iter().enumerate() {
            eprintln!("load: the journal's cost on {placement}: {SERVICE} journaled, in memory only, the minimal axum app");
            runs.push(self.durability_on(placement, cpus, tag).await?);
        }
        Ok(runs)
    }

    async fn durability_on(
        &self,
        placement: String,
        cpus: Option<String>,
        tag: usize,
    ) -> anyhow::Result<DurabilityRun> {
        let b = self.binaries;
        let data = |name: &str| format!("du{tag}-{name}");
        let placed = |mut spec: Spec| {
            spec.cpus.clone_from(&cpus);
            spec
        };
        let journal_data = data("journal");
        let mut journal = self
            .start(
                &journal_data,
                &placed(self.spec(&b.service, &journal_data, &[])),
                "/readyz",
            )
            .await?;
        let memory_data = data("memory");
        let mut memory = self
            .start(
                &memory_data,
                &placed(self.spec(&b.service, &memory_data, &["--state-durability", "memory"])),
                "/readyz",
            )
            .await?;
        let minimal_data = data("minimal");
        let mut minimal = self
            .start(
                &minimal_data,
                &placed(self.spec(&b.minimal_axum, &minimal_data, &[])),
                "/readyz",
            )
            .await?;
        for replica in [&journal, &memory, &minimal] {
            self.create_links(replica).await?;
        }
        let requests = self.redirect_requests();
        let targets = [
            Target::new(JOURNAL, &journal, &requests, 307),
            Target::new(MEMORY, &memory, &requests, 307),
            Target::new(MINIMAL_REDIRECT, &minimal, &requests, 307),
        ];
        let (series, answered) = self.rounds_counted(&targets).await;
        let rss_kib = [&journal, &memory, &minimal]
            .iter()
            .map(|replica| replica.rss_kib())
            .collect();
        let journal_bytes = journal_files_bytes(&self.scratch.join(&journal_data).join("spill"));
        for replica in [&mut journal, &mut memory, &mut minimal] {
            stop(replica).await;
        }
        Ok(DurabilityRun {
            placement,
            series,
            rss_kib,
            journal_bytes,
            journaled_hits: answered[0],
        })
    }
}

/// The bytes of the journal's files (segments and ledgers) in `dir`.
fn journal_files_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .filter_map(Result::ok)
        .filter(|entry| {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            name.ends_with(".seg") || name.ends_with(".ledger")
        })
        .filter_map(|entry| entry.metadata().ok())
        .map(|metadata| metadata.len())
        .sum()
}

/// The durability part's section: the three servers per placement, the
/// journal ÷ memory only run by run against the target, RSS and disk.
pub(super) fn durability_summary(report: &BenchReport, footer: &str) -> String {
    let o = &report.options;
    let mut text = String::new();
    for run in &report.durability {
        let [journal, memory, minimal] = run.series.as_slice() else {
            continue;
        };
        let ratios = paired_ratios(&journal.runs, &memory.runs, |r| r.rps);
        let rss: Vec<Vec<String>> = run
            .series
            .iter()
            .zip(&run.rss_kib)
            .map(|(series, rss)| {
                vec![
                    series.server.clone(),
                    rss.map_or_else(
                        || "–".to_owned(),
                        |kib| format!("{:.1}", kib as f64 / 1024.0),
                    ),
                    fmt_cpu(series.cpu_us),
                ]
            })
            .collect();
        text.push_str(&format!(
            "### The journal's cost, {}: `GET /{{code}}` over {} links, {SERVICE} journaling each hit before its 307 against the same build counting in memory only and the minimal axum app, closed loop, {} connections, {} rounds of {:?} (+{:?} warm-up)\n\n{}\n\
             **journal ÷ memory only, run by run, median (min–max): throughput {} (target ≥ {DURABILITY_TARGET:.2}: {}).**\n\n{}\n{}\n\
             The journal's files after {} journaled hits: {:.1} MiB (segments are recycled as batches land, so this is bounded by the segments in use, not by the hits).\n\n{footer}\n",
            run.placement,
            o.links,
            o.connections,
            o.rounds,
            o.duration,
            o.warmup,
            series_table(&[journal, memory, minimal], memory),
            fmt_ratios(&ratios),
            verdict(&ratios, DURABILITY_TARGET, true),
            pairs_table(&[
                (journal, memory, format!("≥ {DURABILITY_TARGET:.2} (headline)")),
                (journal, minimal, String::new()),
            ]),
            report::table(
                &["server".to_owned(), "RSS after the runs, MiB".to_owned(), "server CPU µs a request (median)".to_owned()],
                &rss
            ),
            run.journaled_hits,
            run.journal_bytes as f64 / (1024.0 * 1024.0),
        ));
    }
    text
}
