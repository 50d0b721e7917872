//! The TLS part (`--parts tls`): lameduck with `--tls-cert`/`--tls-key` (a
//! chain the bench makes at start) against lameduck on plain HTTP, taking
//! turns: keep-alive throughput of `GET /healthz` over HTTPS ÷ over HTTP, and
//! new connections per second, full handshakes (and resumed sessions) ÷ plain
//! TCP connections, with the server's CPU time per request.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use serde::Serialize;

use super::stats::{fmt_ratios, median, paired_ratio};
use super::{stop, Bench, CpuMark, Harness, Options, Run, Series};
use crate::raw::{self, RawConn};
use crate::replica::Replica;
use crate::report::{self, fmt_ms};
use crate::tls;
use crate::SERVICE;

/// The rows of the TLS part.
pub const TLS_KEEP_ALIVE: &str = "HTTPS, keep-alive";
/// Plain HTTP, keep-alive.
pub const HTTP_KEEP_ALIVE: &str = "HTTP, keep-alive";
/// HTTPS, one request per connection, every handshake a full one.
pub const TLS_FULL: &str = "HTTPS, new connection per request, full handshake";
/// HTTPS, one request per connection, sessions resumed when the server
/// allows.
pub const TLS_RESUMED: &str = "HTTPS, new connection per request, session resumption";
/// Plain HTTP, one request per connection.
pub const HTTP_NEW: &str = "HTTP, new connection per request";

/// HTTPS against plain HTTP: lameduck with `--tls-cert`/`--tls-key`, and
/// lameduck without, taking turns.
#[derive(Clone, Debug, Serialize)]
pub struct TlsReport {
    /// The certificate chain.
    pub chain: String,
    /// What a handshake of the measured client settled on (version, cipher
    /// suite, key exchange, ALPN).
    pub negotiated: String,
    /// What ALPN settles on when a client offers `h2` and `http/1.1`.
    pub alpn_offering_h2: String,
    /// [`TLS_KEEP_ALIVE`], [`HTTP_KEEP_ALIVE`], [`TLS_FULL`],
    /// [`TLS_RESUMED`], [`HTTP_NEW`], in that order.
    pub series: Vec<TlsSeries>,
}

/// The runs of one TLS target, with CPU time.
#[derive(Clone, Debug, Serialize)]
pub struct TlsSeries {
    /// Throughput and latency.
    #[serde(flatten)]
    pub series: Series,
    /// The server's CPU time per answered request, µs, one per run.
    pub server_cpu_us: Vec<f64>,
    /// The server's CPU time ÷ the run's length (1.0: one core busy), one
    /// per run.
    pub server_busy: Vec<f64>,
    /// The harness's likewise: near its core's whole, the client and not
    /// the server set the pace.
    pub harness_busy: Vec<f64>,
    /// Handshakes that resumed a session ÷ handshakes, one per run (TLS
    /// targets only).
    pub resumed: Vec<f64>,
}

impl TlsSeries {
    fn server_cpu_us(&self) -> f64 {
        median(self.server_cpu_us.iter().copied())
    }
}

/// One target of the TLS part: a server, how to reach it, what to send.
struct TlsTarget<'a> {
    name: &'static str,
    server: &'a Replica,
    /// `None`: plain TCP.
    client: Option<tls::Client>,
    /// One request per connection (`Connection: close`), latency from the
    /// connect; else keep-alive, latency from the send.
    per_connection: bool,
}

impl<'a> TlsTarget<'a> {
    fn new(
        name: &'static str,
        server: &'a Replica,
        client: Option<tls::Client>,
        per_connection: bool,
    ) -> TlsTarget<'a> {
        TlsTarget {
            name,
            server,
            client,
            per_connection,
        }
    }
}

/// One measured run of a TLS target.
#[derive(Clone, Copy)]
struct TlsRun {
    run: Run,
    server_busy: f64,
    resumed: f64,
}

impl Bench<'_> {
    /// HTTPS against plain HTTP on lameduck, taking turns like
    /// [`Bench::rounds`], the server's and the harness's CPU time read
    /// around every measured run.
    pub(super) async fn tls(&self) -> anyhow::Result<TlsReport> {
        eprintln!(
            "load: TLS: HTTPS against plain HTTP, keep-alive and a new connection per request"
        );
        let certificates = tls::Certificates::make(&self.scratch.join("tls"))?;
        let (mut https, mut http) = self.tls_servers(&certificates).await?;
        let full = certificates.client(&[b"http/1.1"], false)?;
        let resuming = certificates.client(&[b"http/1.1"], true)?;
        let (negotiated, alpn_offering_h2) = probe(&certificates, &full, &https).await?;
        eprintln!("load:   negotiated {negotiated}; offering h2 too: ALPN {alpn_offering_h2}");
        let targets = [
            TlsTarget::new(TLS_KEEP_ALIVE, &https, Some(full.clone()), false),
            TlsTarget::new(HTTP_KEEP_ALIVE, &http, None, false),
            TlsTarget::new(TLS_FULL, &https, Some(full), true),
            TlsTarget::new(TLS_RESUMED, &https, Some(resuming), true),
            TlsTarget::new(HTTP_NEW, &http, None, true),
        ];
        let series = self.tls_rounds(&targets).await;
        stop(&mut https).await;
        stop(&mut http).await;
        Ok(TlsReport {
            chain: tls::CHAIN.to_owned(),
            negotiated,
            alpn_offering_h2,
            series,
        })
    }

    /// lameduck over HTTPS with `certificates`' chain, ready on its admin
    /// listener, and lameduck on plain HTTP.
    async fn tls_servers(
        &self,
        certificates: &tls::Certificates,
    ) -> anyhow::Result<(Replica, Replica)> {
        let (cert, key) = (
            certificates.cert.display().to_string(),
            certificates.key.display().to_string(),
        );
        let b = self.binaries;
        let name = format!("tls-{SERVICE}");
        let spec = self.spec(&b.service, &name, &["--tls-cert", &cert, "--tls-key", &key]);
        let https = Replica::spawn(&name, &spec, &self.logs.join(format!("{name}.log")))
            .await
            .with_context(|| {
                format!("{SERVICE} with --tls-cert/--tls-key (does this build have them?)")
            })?;
        // The public listener speaks TLS only: readiness on the admin one.
        let admin = https.admin_addr().await?;
        https
            .wait_ready_at(admin, "/readyz", Duration::from_secs(30))
            .await?;
        let http = self
            .start(
                &format!("tls-{SERVICE}-plain"),
                &self.spec(&b.service, &format!("tls-{SERVICE}-plain"), &[]),
                "/readyz",
            )
            .await?;
        Ok((https, http))
    }

    /// Every target's rounds, taking turns like [`Bench::rounds`].
    async fn tls_rounds(&self, targets: &[TlsTarget<'_>]) -> Vec<TlsSeries> {
        let mut runs: Vec<Vec<TlsRun>> = vec![Vec::new(); targets.len()];
        for round in 0..self.options.rounds as usize {
            for turn in 0..targets.len() {
                let index = (turn + round) % targets.len();
                runs[index].push(self.tls_turn(&targets[index], round).await);
            }
        }
        targets
            .iter()
            .zip(runs)
            .map(|(target, runs)| TlsSeries {
                series: Series::new(target.name, runs.iter().map(|r| r.run).collect()),
                server_cpu_us: runs.iter().map(|r| r.run.cpu_us).collect(),
                server_busy: runs.iter().map(|r| r.server_busy).collect(),
                harness_busy: runs.iter().map(|r| r.run.client_busy).collect(),
                resumed: if target.client.is_some() {
                    runs.iter().map(|r| r.resumed).collect()
                } else {
                    Vec::new()
                },
            })
            .collect()
    }

    /// One turn of `target`: the warm-up, then the measured run, with the
    /// server's and the harness's CPU time read around it and the share of
    /// handshakes that resumed a session.
    async fn tls_turn(&self, target: &TlsTarget<'_>, round: usize) -> TlsRun {
        self.tls_load(target, self.options.warmup).await;
        let handshakes = target.client.as_ref().map(tls::Client::handshakes);
        let mark = CpuMark::take(target.server.pid(), Harness::Own);
        let result = self.tls_load(target, self.options.duration).await;
        let seconds = result.elapsed.as_secs_f64();
        let spent = mark.spent();
        let resumed = match (
            handshakes,
            target.client.as_ref().map(tls::Client::handshakes),
        ) {
            (Some((made0, resumed0)), Some((made1, resumed1))) if made1 > made0 => {
                #[allow(clippy::cast_precision_loss)]
                let share = (resumed1 - resumed0) as f64 / (made1 - made0) as f64;
                share
            }
            _ => 0.0,
        };
        let run = Run::measured(&result, spent);
        eprintln!(
            "load:   round {}/{} {}: {:.0} req/s, p50 {} ms, p99 {} ms, server CPU {:.1} µs per request ({:.0} % of a core), harness {:.0} %{}{}",
            round + 1,
            self.options.rounds,
            target.name,
            run.rps,
            fmt_ms(run.p50_ms),
            fmt_ms(run.p99_ms),
            run.cpu_us,
            spent.server / seconds * 100.0,
            run.client_busy * 100.0,
            if target.name == TLS_RESUMED {
                format!(", {:.0} % resumed", resumed * 100.0)
            } else {
                String::new()
            },
            if run.unexpected + run.errors > 0 {
                format!(", {} unexpected, {} errors", run.unexpected, run.errors)
            } else {
                String::new()
            }
        );
        TlsRun {
            run,
            server_busy: spent.server / seconds,
            resumed,
        }
    }

    /// `--connections` closed-loop connections on `target` for `duration`:
    /// over TLS with its client or over plain TCP, keep-alive or one
    /// request a connection.
    async fn tls_load(&self, target: &TlsTarget<'_>, duration: Duration) -> raw::LoopResult {
        let connections = usize::try_from(self.options.connections).unwrap_or(64);
        let (requests, latency) = if target.per_connection {
            (raw::get_close("/healthz"), raw::Latency::FromConnect)
        } else {
            (raw::get("/healthz"), raw::Latency::FromSend)
        };
        let requests = Arc::new(vec![requests]);
        let addr = target.server.addr;
        match target.client.clone() {
            Some(client) => {
                let connect = move || {
                    let client = client.clone();
                    async move { client.connect(addr).await }
                };
                raw::closed_loop_with(connect, requests, 200, connections, duration, latency).await
            }
            None => {
                let connect = move || RawConn::connect(addr);
                raw::closed_loop_with(connect, requests, 200, connections, duration, latency).await
            }
        }
    }
}

/// A handshake of the measured client `full` with `https`, and one that
/// offers `h2` too: what each settled on (version, cipher suite, key
/// exchange, ALPN; ALPN). `GET /healthz` over the first must answer 200.
async fn probe(
    certificates: &tls::Certificates,
    full: &tls::Client,
    https: &Replica,
) -> anyhow::Result<(String, String)> {
    let mut probe = full
        .connect(https.addr)
        .await
        .with_context(|| format!("TLS handshake with {}", https.addr))?;
    let negotiated = tls::describe(&probe);
    let head = probe.exchange(&raw::get("/healthz")).await?;
    if head.status != 200 {
        bail!("GET /healthz over HTTPS answered {}", head.status);
    }
    drop(probe);
    let h2 = certificates
        .client(&[b"h2", b"http/1.1"], false)?
        .connect(https.addr)
        .await?;
    Ok((negotiated, tls::alpn(&h2)))
}

/// A median share as a percentage.
fn percent(values: &[f64]) -> String {
    format!("{:.0} %", median(values.iter().copied()) * 100.0)
}

/// One target's row of the TLS part's first table.
fn tls_row(s: &TlsSeries) -> Vec<String> {
    let mut name = s.series.server.clone();
    if s.series.server == TLS_RESUMED {
        name.push_str(&format!(" ({} resumed)", percent(&s.resumed)));
    }
    vec![
        name,
        format!("{:.0}", s.series.rps),
        fmt_ms(s.series.p50_ms),
        fmt_ms(s.series.p99_ms),
        format!("{:.1}", s.server_cpu_us()),
        percent(&s.server_busy),
        percent(&s.harness_busy),
        s.series.failures().to_string(),
    ]
}

/// `a` ÷ `b`, run by run, labelled `label`: throughput, latency and the
/// server's CPU a request.
fn ratio_row(a: &TlsSeries, b: &TlsSeries, label: &str) -> Vec<String> {
    let cpu: Vec<f64> = (a.server_cpu_us.iter().zip(&b.server_cpu_us))
        .filter(|(_, y)| **y > 0.0)
        .map(|(x, y)| x / y)
        .collect();
    vec![
        label.to_owned(),
        paired_ratio(&a.series, &b.series, |r| r.rps),
        paired_ratio(&a.series, &b.series, |r| r.p50_ms),
        paired_ratio(&a.series, &b.series, |r| r.p99_ms),
        fmt_ratios(&cpu),
    ]
}

/// The TLS part's tables.
pub(super) fn tls_summary(o: &Options, report: &TlsReport, footer: &str) -> String {
    let [keep_tls, keep_http, full, resumed, new_http] = report.series.as_slice() else {
        return String::new();
    };
    let header: Vec<String> = [
        "client",
        "req/s (median)",
        "p50 ms",
        "p99 ms",
        "server CPU per request, µs",
        "server busy",
        "harness busy",
        "failed",
    ]
    .map(str::to_owned)
    .into();
    let rows: Vec<Vec<String>> = report.series.iter().map(tls_row).collect();
    let ratio_header: Vec<String> = [
        "ratio, run by run, median (min–max)",
        "throughput",
        "p50",
        "p99",
        "server CPU per request",
    ]
    .map(str::to_owned)
    .into();
    let ratio_rows: Vec<Vec<String>> = [
        (keep_tls, keep_http, "keep-alive: HTTPS ÷ HTTP"),
        (
            full,
            new_http,
            "new connection per request: full TLS handshake ÷ plain TCP",
        ),
        (
            resumed,
            new_http,
            "new connection per request: session resumption ÷ plain TCP",
        ),
    ]
    .into_iter()
    .map(|(a, b, label)| ratio_row(a, b, label))
    .collect();
    let handshake_us = full.server_cpu_us() - new_http.server_cpu_us();
    format!(
        "### TLS: `GET /healthz` on {SERVICE} over HTTPS and over plain HTTP, closed loop, {} connections, {} rounds of {:?} (+{:?} warm-up), taking turns\n\n{}\n\
         **HTTPS ÷ HTTP, run by run, median (min–max): keep-alive throughput {}; new connections per second, \
         full handshake: {} ({:.0} against {:.0} a second), with session resumption: {}.** \
         Each full handshake costs the server about {:.0} µs of CPU more than a plain connection \
         ({:.1} against {:.1} µs per connection and request).\n\n{}\n\
         Server: `{SERVICE} server --tls-cert --tls-key`, a chain made at start: {}. The client offers \
         ALPN `http/1.1` alone (the raw client speaks HTTP/1.1) and negotiated {}; offering `h2` too, \
         the server picks {}. A new connection per request sends `Connection: close`, its latency counts \
         from the connect; keep-alive latency from the send. CPU is user + system time from \
         `/proc/PID/stat` around each measured run (10 ms ticks); *busy* is that time ÷ the run's \
         length, of one core: a harness near 100 % means the client, not the server, set the pace; \
         neither near it, a wait (neither process's CPU) did.\n\n{footer}\n",
        o.connections,
        o.rounds,
        o.duration,
        o.warmup,
        report::table(&header, &rows),
        paired_ratio(&keep_tls.series, &keep_http.series, |r| r.rps),
        paired_ratio(&full.series, &new_http.series, |r| r.rps),
        full.series.rps,
        new_http.series.rps,
        paired_ratio(&resumed.series, &new_http.series, |r| r.rps),
        handshake_us,
        full.server_cpu_us(),
        new_http.server_cpu_us(),
        report::table(&ratio_header, &ratio_rows),
        report.chain,
        report.negotiated,
        report.alpn_offering_h2,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::tests::{series, Args};
    use crate::bench::Part;

    #[test]
    fn the_tls_part_prints_https_over_http_run_by_run() {
        let tls_series = |name: &str, rps: &[f64], cpu_us: f64| TlsSeries {
            series: series(name, rps),
            server_cpu_us: vec![cpu_us; rps.len()],
            server_busy: vec![1.0; rps.len()],
            harness_busy: vec![0.5; rps.len()],
            resumed: vec![0.9; rps.len()],
        };
        let report = TlsReport {
            chain: tls::CHAIN.to_owned(),
            negotiated: "TLS 1.3, X25519, ALPN http/1.1".to_owned(),
            alpn_offering_h2: "h2".to_owned(),
            series: vec![
                tls_series(TLS_KEEP_ALIVE, &[90.0, 95.0], 20.0),
                tls_series(HTTP_KEEP_ALIVE, &[100.0, 100.0], 18.0),
                tls_series(TLS_FULL, &[10.0, 12.0], 250.0),
                tls_series(TLS_RESUMED, &[20.0, 20.0], 120.0),
                tls_series(HTTP_NEW, &[100.0, 100.0], 25.0),
            ],
        };
        use clap::Parser;
        let options = Args::parse_from(["load"]).options;
        assert!(options.parts.contains(&Part::Tls), "a default part");
        let text = tls_summary(&options, &report, "footer");
        for expected in [
            "keep-alive throughput 0.925 (0.90–0.95)",
            "full handshake: 0.110 (0.10–0.12) (11 against 100 a second)",
            "with session resumption: 0.200 (0.20–0.20)",
            "about 225 µs of CPU more",
            "session resumption (90 % resumed)",
            "the server picks h2",
        ] {
            assert!(text.contains(expected), "{expected}: {text}");
        }
    }
}
