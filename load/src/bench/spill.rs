//! The spill part (`--parts spill`): a forced exit's synchronous spill of the
//! pending hits of `--spill-links` links, timed around the force hook's own
//! call (`HitCounter::spill_now`), once per round, on the out folder's disk;
//! target: well under 100 ms.

use std::path::Path;

use serde::Serialize;

use super::Options;
use crate::report::fmt_ms;

/// A forced exit's spill, timed: the force hook's own call
/// (`HitCounter::spill_now`), which takes the pending hits out of memory
/// and writes, fsyncs and renames the file, then fsyncs the directory.
#[derive(Clone, Debug, Serialize)]
pub struct SpillSeries {
    /// Links with pending hits.
    pub links: u32,
    /// Pending hits in all.
    pub hits: u64,
    /// Size of one spill file.
    pub bytes: u64,
    /// Where the files were written (the out folder's file system).
    pub dir: String,
    /// One time per round, ms.
    pub runs_ms: Vec<f64>,
    /// Median of `runs_ms`.
    pub median_ms: f64,
    /// Largest of `runs_ms`.
    pub max_ms: f64,
}

/// Times the forced exit's spill of `--spill-links` links with pending
/// hits (1 to 3 each, codes of the generated length), once per round, into
/// `dir` on the out folder's disk.
pub(super) fn spill(options: &Options, dir: &Path) -> anyhow::Result<SpillSeries> {
    use lameduck::links::hits::{HitCounter, NAME};
    use lameduck_writebehind::{Config, Durability, FinalFlush};
    eprintln!(
        "load: a forced exit's spill of {} links' pending hits",
        options.spill_links
    );
    let codes: Vec<String> = (0..options.spill_links)
        .map(|i| {
            format!(
                "{i:0width$x}",
                width = lameduck::links::validate::GENERATED_CODE_LENGTH
            )
        })
        .collect();
    let (mut runs_ms, mut hits, mut bytes) = (Vec::new(), 0, 0);
    for _ in 0..options.rounds {
        let mut config = Config::new(NAME, dir);
        config.durability = Durability::Memory;
        let counter = HitCounter::open(config)?;
        for (i, code) in codes.iter().enumerate() {
            for _ in 0..=i % 3 {
                counter.record(code.as_str(), 1);
            }
        }
        let started = std::time::Instant::now();
        let spilled = counter.spill_now()?;
        runs_ms.push(started.elapsed().as_secs_f64() * 1e3);
        let Some(FinalFlush::Spilled { updates: n, path }) = spilled else {
            anyhow::bail!("nothing was spilled");
        };
        hits = n;
        bytes = std::fs::metadata(&path)?.len();
        std::fs::remove_file(&path)?;
    }
    let mut sorted = runs_ms.clone();
    sorted.sort_by(f64::total_cmp);
    Ok(SpillSeries {
        links: options.spill_links,
        hits,
        bytes,
        dir: dir.display().to_string(),
        median_ms: sorted[sorted.len() / 2],
        max_ms: sorted.last().copied().unwrap_or_default(),
        runs_ms,
    })
}

/// The spill part's section: every run, the median and the largest.
pub(super) fn spill_summary(spill: &SpillSeries, footer: &str) -> String {
    let runs: Vec<String> = spill.runs_ms.iter().map(|ms| fmt_ms(*ms)).collect();
    format!(
        "### A forced exit's spill: pending hits of {} links, written synchronously\n\n\
         {} hits, a {} KiB file, written, fsynced and renamed, directory fsynced, in {}; \
         one run per round: {} ms.\n\n\
         **Median {} ms, max {} ms (target: well under 100 ms).** Timed around \
         `HitCounter::spill_now`, the call the force hook makes at a second signal.\n\n{footer}\n",
        spill.links,
        spill.hits,
        spill.bytes / 1024,
        spill.dir,
        runs.join(", "),
        fmt_ms(spill.median_ms),
        fmt_ms(spill.max_ms),
    )
}
