//! A replica's `/metrics`, read over the raw client and parsed by the
//! `openmetrics-parser` crate: every sample under the name the page gives
//! it (`…_total`, `…_bucket`, `…_sum`), with its labels, so that a scenario
//! can sum a metric over its label sets or pick one series.
//!
//! The service answers in the OpenMetrics text format (it ends with
//! `# EOF`); a page without `# EOF` is read as the Prometheus text format
//! 0.0.4. Both are checked as the formats require: a page that breaks them
//! is an error, not a page of zeros.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use anyhow::{bail, Context};
use openmetrics_parser::{
    openmetrics, prometheus, MetricsExposition, OpenMetricsValue, PrometheusValue,
    RenderableMetricValue,
};

use crate::raw::{self, RawConn};

/// One sample of a page: a series and its value.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// The sample's name as the page writes it: a counter's `…_total`, a
    /// histogram's `…_bucket`, `…_sum` and `…_count`.
    pub name: String,
    /// Its labels, values unescaped (the crate reads `\\`, `\"` and `\n`
    /// as the character they stand for); a bucket's `le` and a quantile's
    /// `quantile` among them.
    pub labels: BTreeMap<String, String>,
    /// Its value.
    pub value: f64,
}

impl Sample {
    /// The value of label `name`, if the sample has it.
    #[must_use]
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels.get(name).map(String::as_str)
    }
}

/// Every sample of one `/metrics` page, ordered by name and labels.
#[derive(Clone, Debug, Default)]
pub struct Metrics {
    samples: Vec<Sample>,
}

impl Metrics {
    /// Parses a page in the OpenMetrics text format (when it has its
    /// `# EOF` line) or the Prometheus text format 0.0.4.
    ///
    /// # Errors
    /// If the page breaks its format.
    pub fn parse(text: &str) -> anyhow::Result<Metrics> {
        let mut samples = if text.lines().any(|line| line == "# EOF") {
            let page = openmetrics::parse_openmetrics(&without_empty_families(text))
                .map_err(|error| anyhow::anyhow!("{error}"))
                .context("not an OpenMetrics text page")?;
            flatten(&page, openmetrics_points)?
        } else {
            let page = prometheus::parse_prometheus(text)
                .map_err(|error| anyhow::anyhow!("{error}"))
                .context("not a Prometheus text page")?;
            flatten(&page, prometheus_points)?
        };
        samples.sort_by(|a, b| (&a.name, &a.labels).cmp(&(&b.name, &b.labels)));
        Ok(Metrics { samples })
    }

    /// Every sample named `name` (exactly: `connections_open` is not
    /// `connections_open_other`), one per label set.
    pub fn samples<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Sample> + 'a {
        self.samples
            .iter()
            .filter(move |sample| sample.name == name)
    }

    /// The sum of `name` over its label sets (0 if the page has none).
    #[must_use]
    pub fn sum(&self, name: &str) -> f64 {
        self.samples(name).map(|sample| sample.value).sum()
    }

    /// The value of the series `name` with exactly `labels`, if the page
    /// has it.
    #[must_use]
    pub fn value(&self, name: &str, labels: &BTreeMap<String, String>) -> Option<f64> {
        self.samples(name)
            .find(|sample| &sample.labels == labels)
            .map(|sample| sample.value)
    }
}

/// `text` without the `HELP`, `TYPE` and `UNIT` lines of the families
/// that have no sample. The format allows such a family (the service
/// writes one for every labelled metric not used yet), but the crate reads
/// it and the next family's lines as one family and refuses the page; it
/// adds no sample, so leaving its lines out loses nothing.
fn without_empty_families(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let mut kept = String::with_capacity(text.len());
    for (index, line) in lines.iter().enumerate() {
        if let Some(name) = described(line) {
            let after = lines[index + 1..]
                .iter()
                .find(|next| described(next) != Some(name));
            if !after.is_some_and(|next| !next.starts_with('#')) {
                continue;
            }
        }
        kept.push_str(line);
        kept.push('\n');
    }
    kept
}

/// The family a `# HELP`, `# TYPE` or `# UNIT` line describes.
fn described(line: &str) -> Option<&str> {
    let rest = ["# HELP ", "# TYPE ", "# UNIT "]
        .iter()
        .find_map(|prefix| line.strip_prefix(prefix))?;
    rest.split(' ').next()
}

// === reading a page ===

/// A reader of one replica's `/metrics` that keeps its connection open
/// between reads (a reader every 100 ms would otherwise cost the replica a
/// connection each time, and show in its own counts).
#[derive(Debug)]
pub struct MetricsConn {
    addr: SocketAddr,
    conn: Option<RawConn>,
}

impl MetricsConn {
    /// A reader of the admin listener at `addr`; it connects on its first
    /// read.
    #[must_use]
    pub fn new(addr: SocketAddr) -> MetricsConn {
        MetricsConn { addr, conn: None }
    }

    /// `GET /metrics`, on the open connection or a new one, parsed.
    ///
    /// # Errors
    /// If the exchange fails, the answer is not 200 or the page does not
    /// parse; the next read opens a new connection.
    ///
    /// # Cancel safety
    /// Cancelling it (a caller's timeout) drops the connection, so that
    /// the next read does not find half an answer on it.
    pub async fn read(&mut self) -> anyhow::Result<Metrics> {
        Metrics::parse(&self.read_text().await?)
    }

    /// `GET /metrics` as [`MetricsConn::read`] does, the page left as text.
    ///
    /// # Errors
    /// If the exchange fails or the answer is not 200.
    ///
    /// # Cancel safety
    /// As [`MetricsConn::read`].
    pub async fn read_text(&mut self) -> anyhow::Result<String> {
        let mut conn = match self.conn.take() {
            Some(conn) => conn,
            None => RawConn::connect(self.addr)
                .await
                .with_context(|| format!("cannot connect to {}", self.addr))?,
        };
        let (head, body) = conn
            .exchange_body(&raw::get("/metrics"))
            .await
            .context("GET /metrics failed")?;
        if head.status != 200 {
            bail!("GET /metrics answered {}", head.status);
        }
        if !head.close {
            self.conn = Some(conn);
        }
        Ok(String::from_utf8_lossy(&body).into_owned())
    }
}

/// `GET /metrics` on a new connection to `addr`, parsed.
///
/// # Errors
/// See [`MetricsConn::read`].
pub async fn scrape(addr: SocketAddr) -> anyhow::Result<Metrics> {
    MetricsConn::new(addr).read().await
}

// === from the crate's families to samples ===

/// One sample of a metric point: the suffix its name takes, a label it
/// adds (a bucket's `le`, a quantile's `quantile`) and its value.
type Point = (&'static str, Option<(&'static str, String)>, f64);

/// The samples of every family of `page`, `points` naming each point's.
fn flatten<T, V>(
    page: &MetricsExposition<T, V>,
    points: fn(&V) -> Vec<Point>,
) -> anyhow::Result<Vec<Sample>>
where
    T: Clone,
    V: RenderableMetricValue + Clone,
{
    let mut samples = Vec::new();
    for family in page.families.values() {
        for sample in family.iter_samples() {
            let labels: BTreeMap<String, String> = sample
                .get_labelset()
                .map_err(|error| anyhow::anyhow!("{error}"))
                .with_context(|| format!("the labels of {}", family.family_name))?
                .iter()
                .map(|(name, value)| (name.clone(), value.clone()))
                .collect();
            for (suffix, extra, value) in points(&sample.value) {
                let mut labels = labels.clone();
                labels.extend(extra.map(|(name, value)| (name.to_owned(), value)));
                samples.push(Sample {
                    name: format!("{}{suffix}", family.family_name),
                    labels,
                    value,
                });
            }
        }
    }
    Ok(samples)
}

/// The points of an OpenMetrics value, named as the format writes them.
fn openmetrics_points(value: &OpenMetricsValue) -> Vec<Point> {
    match value {
        OpenMetricsValue::Unknown(number)
        | OpenMetricsValue::Gauge(number)
        | OpenMetricsValue::StateSet(number) => vec![("", None, number.as_f64())],
        OpenMetricsValue::Counter(counter) => {
            let mut points = vec![("_total", None, counter.value.as_f64())];
            points.extend(counter.created.map(|at| ("_created", None, at)));
            points
        }
        OpenMetricsValue::Histogram(histogram) => histogram_points(histogram, "_sum", "_count"),
        OpenMetricsValue::GaugeHistogram(histogram) => {
            histogram_points(histogram, "_gsum", "_gcount")
        }
        OpenMetricsValue::Summary(summary) => summary_points(summary),
        OpenMetricsValue::Info => vec![("_info", None, 1.0)],
    }
}

/// The points of a Prometheus 0.0.4 value: a counter's name is its
/// family's, `_total` included.
fn prometheus_points(value: &PrometheusValue) -> Vec<Point> {
    match value {
        PrometheusValue::Unknown(number) | PrometheusValue::Gauge(number) => {
            vec![("", None, number.as_f64())]
        }
        PrometheusValue::Counter(counter) => vec![("", None, counter.value.as_f64())],
        PrometheusValue::Histogram(histogram) => histogram_points(histogram, "_sum", "_count"),
        PrometheusValue::Summary(summary) => summary_points(summary),
    }
}

/// A histogram's buckets (`le` written as the formats write it, `+Inf`
/// for the last), then its sum and count under the names given.
fn histogram_points(
    histogram: &openmetrics_parser::HistogramValue,
    sum: &'static str,
    count: &'static str,
) -> Vec<Point> {
    let mut points: Vec<Point> = histogram
        .buckets
        .iter()
        .map(|bucket| {
            let le = if bucket.upper_bound == f64::INFINITY {
                "+Inf".to_owned()
            } else {
                bucket.upper_bound.to_string()
            };
            ("_bucket", Some(("le", le)), bucket.count.as_f64())
        })
        .collect();
    points.extend(histogram.sum.map(|value| (sum, None, value.as_f64())));
    points.extend(histogram.count.map(|value| (count, None, value as f64)));
    points
}

/// A summary's quantiles, then its sum and count.
fn summary_points(summary: &openmetrics_parser::SummaryValue) -> Vec<Point> {
    let mut points: Vec<Point> = summary
        .quantiles
        .iter()
        .map(|quantile| {
            let at = quantile.quantile.to_string();
            ("", Some(("quantile", at)), quantile.value.as_f64())
        })
        .collect();
    points.extend(summary.sum.map(|value| ("_sum", None, value.as_f64())));
    points.extend(summary.count.map(|value| ("_count", None, value as f64)));
    points
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
            .collect()
    }

    /// The service's own format: families with no series yet (first, one
    /// after the other, and last, as the service writes them), labels with
    /// braces, commas and escapes in their values, a labelled histogram up
    /// to `+Inf`.
    #[test]
    fn an_openmetrics_page_with_labels_escapes_and_a_histogram_is_read() {
        let page = "# HELP early Nothing yet.\n\
            # TYPE early counter\n\
            # HELP before Nothing yet either.\n\
            # TYPE before gauge\n\
            # HELP req Requests.\n\
            # TYPE req counter\n\
            req_total{route=\"/{code}\",status=\"3xx\"} 500\n\
            req_total{route=\"/a,b=\\\"c\\\"\",status=\"4xx\"} 2\n\
            req_total{route=\"C:\\\\DIR\\nNEXT\",status=\"5xx\"} 1\n\
            # TYPE took histogram\n\
            took_bucket{route=\"/{code}\",le=\"0.5\"} 3\n\
            took_bucket{route=\"/{code}\",le=\"+Inf\"} 4\n\
            took_sum{route=\"/{code}\"} 1.25\n\
            took_count{route=\"/{code}\"} 4\n\
            # HELP later Nothing yet.\n\
            # TYPE later counter\n\
            # EOF\n";
        let metrics = Metrics::parse(page).expect("a valid page");
        assert!((metrics.sum("req_total") - 503.0).abs() < 1e-9);
        let quoted = labels(&[("route", "/a,b=\"c\""), ("status", "4xx")]);
        assert_eq!(metrics.value("req_total", &quoted), Some(2.0));
        let escaped = labels(&[("route", "C:\\DIR\nNEXT"), ("status", "5xx")]);
        assert_eq!(metrics.value("req_total", &escaped), Some(1.0));
        let inf = labels(&[("route", "/{code}"), ("le", "+Inf")]);
        assert_eq!(metrics.value("took_bucket", &inf), Some(4.0));
        assert_eq!(metrics.sum("took_count"), 4.0);
        assert!((metrics.sum("took_sum") - 1.25).abs() < 1e-9);
        assert_eq!(metrics.samples("later_total").count(), 0);
    }

    /// The Prometheus text format 0.0.4, as its documentation's example
    /// writes it: timestamps, comments, escapes, `+Inf` as a value.
    #[test]
    fn a_prometheus_page_is_read_too() {
        let page = "# HELP http_requests_total The total number of HTTP requests.\n\
            # TYPE http_requests_total counter\n\
            http_requests_total{method=\"post\",code=\"200\"} 1027 1395066363000\n\
            http_requests_total{method=\"post\",code=\"400\"}    3 1395066363000\n\
            \n\
            # Escaping in label values:\n\
            msdos_file_access_time_seconds{path=\"C:\\\\DIR\\\\FILE.TXT\",error=\"Cannot find file:\\n\\\"FILE.TXT\\\"\"} 1.458255915e9\n\
            \n\
            # A weird metric from before the epoch:\n\
            something_weird{problem=\"division by zero\"} +Inf -3982045\n";
        let metrics = Metrics::parse(page).expect("a valid page");
        assert!((metrics.sum("http_requests_total") - 1030.0).abs() < 1e-9);
        let file = metrics
            .samples("msdos_file_access_time_seconds")
            .next()
            .expect("the escaped series");
        assert_eq!(file.label("path"), Some("C:\\DIR\\FILE.TXT"));
        assert_eq!(file.label("error"), Some("Cannot find file:\n\"FILE.TXT\""));
        assert_eq!(metrics.sum("something_weird"), f64::INFINITY);
    }

    /// A page as the service's encoder writes it: labelled families not
    /// used yet, one after the other, and a labelled histogram.
    #[test]
    fn a_page_of_the_services_encoder_is_read() {
        use prometheus_client::encoding::text::encode;
        use prometheus_client::metrics::counter::Counter;
        use prometheus_client::metrics::family::Family;
        use prometheus_client::metrics::gauge::Gauge;
        use prometheus_client::metrics::histogram::Histogram;
        use prometheus_client::registry::Registry;

        type Labels = Vec<(String, String)>;
        let mut registry = Registry::with_prefix("svc");
        let unused = Family::<Labels, Counter>::default();
        registry.register("unused", "Not used yet", unused);
        let idle = Family::<Labels, Gauge>::default();
        registry.register("idle", "Not used either", idle);
        let open = Family::<Labels, Gauge>::default();
        registry.register("open", "Open connections", open.clone());
        let took = Family::<Labels, Histogram>::new_with_constructor(|| Histogram::new([0.5, 1.0]));
        registry.register("took", "Time taken", took.clone());
        let route = vec![("route".to_owned(), "/{code}".to_owned())];
        open.get_or_create(&route).set(3);
        took.get_or_create(&route).observe(0.7);
        let mut page = String::new();
        encode(&mut page, &registry).expect("encoded");

        let metrics = Metrics::parse(&page).expect("the encoder's page");
        assert_eq!(metrics.sum("svc_open"), 3.0);
        let inf = labels(&[("route", "/{code}"), ("le", "+Inf")]);
        assert_eq!(metrics.value("svc_took_bucket", &inf), Some(1.0));
        assert_eq!(metrics.sum("svc_took_count"), 1.0);
    }

    #[test]
    fn a_broken_page_is_an_error_not_zeros() {
        assert!(Metrics::parse("req_total{route=\"/\" 1\n# EOF\n").is_err());
    }
}
