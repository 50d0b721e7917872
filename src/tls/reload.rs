//! Reloads the certificate and key when their files change.

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use super::{log_loaded, CertStore, Contents, TlsFiles};
use crate::lifecycle::BoxError;

/// How often the files are read to see whether they changed. A change is
/// applied once the files have read the same twice in a row, so a pair
/// rewritten in place one file at a time is not caught half-way.
pub const RELOAD_POLL_INTERVAL: Duration = Duration::from_secs(1);

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReloadLabels {
    result: &'static str,
}

/// The certificate's expiry and the reloads, for alerting.
#[derive(Clone, Debug, Default)]
pub struct TlsMetrics {
    expiry: Gauge,
    reloads: Family<ReloadLabels, Counter>,
}

impl TlsMetrics {
    /// Adds the series to `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "tls_certificate_expiry_timestamp_seconds",
            "When the certificate new TLS handshakes are served with expires (Unix time)",
            self.expiry.clone(),
        );
        registry.register(
            "tls_certificate_reloads",
            "Changed certificate files seen: loaded (ok) or refused, the old pair serving on (error)",
            self.reloads.clone(),
        );
    }

    /// The certificate in use expires at `not_after`.
    pub fn set_expiry(&self, not_after: i64) {
        self.expiry.set(not_after);
    }

    fn reloaded(&self, result: &'static str) {
        self.reloads.get_or_create(&ReloadLabels { result }).inc();
    }
}

/// Re-reads `files` every `interval` until `token` fires; a changed pair
/// that parses and matches replaces the one in `store`, one that does not
/// is refused with an error log (once per content) and a metric.
///
/// # Errors
/// Never: a bad pair is not fatal, the old one keeps serving.
pub async fn run_reloader(
    store: Arc<CertStore>,
    files: TlsFiles,
    loaded: Contents,
    metrics: TlsMetrics,
    interval: Duration,
    token: CancellationToken,
) -> Result<(), BoxError> {
    let mut watcher = Watcher::new(loaded);
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await;
    while token.run_until_cancelled(ticker.tick()).await.is_some() {
        let read = files.read();
        let Some(contents) = watcher.changed(read.map_err(|error| error.to_string())) else {
            continue;
        };
        match files.parse(&contents) {
            // Counted before the line is logged: whoever reads the line
            // (an operator, a test) finds the count already there.
            Ok(pair) => {
                metrics.set_expiry(pair.info.not_after);
                metrics.reloaded("ok");
                log_loaded(&pair.info, &files, "TLS certificate reloaded");
                store.replace(pair);
                watcher.loaded(contents);
            }
            Err(error) => {
                metrics.reloaded("error");
                tracing::error!(%error, "TLS certificate reload refused; the previous certificate keeps serving");
                watcher.refused(contents);
            }
        }
    }
    Ok(())
}

/// Decides when the files' contents are a new pair to try.
#[derive(Debug)]
struct Watcher {
    loaded: Contents,
    /// Changed contents seen once, waiting to read the same again.
    pending: Option<Contents>,
    /// The last contents refused: not tried (nor logged) again.
    refused: Option<Contents>,
    /// The last read error, logged once.
    unreadable: Option<String>,
}

impl Watcher {
    fn new(loaded: Contents) -> Watcher {
        Watcher {
            loaded,
            pending: None,
            refused: None,
            unreadable: None,
        }
    }

    /// The contents to try now, if any.
    fn changed(&mut self, read: Result<Contents, String>) -> Option<Contents> {
        let contents = match read {
            Ok(contents) => {
                self.unreadable = None;
                contents
            }
            Err(error) => {
                // Missing for a moment while being replaced is normal;
                // missing twice in a row is worth a warning, once.
                if self.unreadable.as_ref() == Some(&error) {
                    return None;
                }
                if self.pending.take().is_some() || self.unreadable.is_some() {
                    tracing::warn!(%error, "cannot read the TLS certificate files; the loaded certificate keeps serving");
                }
                self.unreadable = Some(error);
                return None;
            }
        };
        if contents == self.loaded || Some(&contents) == self.refused.as_ref() {
            self.pending = None;
            return None;
        }
        if self.pending.as_ref() == Some(&contents) {
            return self.pending.take();
        }
        self.pending = Some(contents);
        None
    }

    fn loaded(&mut self, contents: Contents) {
        self.loaded = contents;
        self.refused = None;
    }

    fn refused(&mut self, contents: Contents) {
        self.refused = Some(contents);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(cert: &str, key: &str) -> Contents {
        (cert.as_bytes().to_vec(), key.as_bytes().to_vec())
    }

    #[test]
    fn a_change_is_tried_once_it_reads_the_same_twice() {
        let mut watcher = Watcher::new(pair("a", "a"));
        assert_eq!(watcher.changed(Ok(pair("a", "a"))), None);
        // The certificate is rewritten first, the key a moment later.
        assert_eq!(watcher.changed(Ok(pair("b", "a"))), None);
        assert_eq!(watcher.changed(Ok(pair("b", "b"))), None);
        assert_eq!(watcher.changed(Ok(pair("b", "b"))), Some(pair("b", "b")));
        watcher.loaded(pair("b", "b"));
        assert_eq!(watcher.changed(Ok(pair("b", "b"))), None);
    }

    #[test]
    fn refused_contents_are_not_tried_again_until_they_change() {
        let mut watcher = Watcher::new(pair("a", "a"));
        assert_eq!(watcher.changed(Ok(pair("bad", "a"))), None);
        let bad = watcher.changed(Ok(pair("bad", "a"))).expect("tried");
        watcher.refused(bad);
        for _ in 0..3 {
            assert_eq!(watcher.changed(Ok(pair("bad", "a"))), None);
        }
        assert_eq!(watcher.changed(Ok(pair("c", "c"))), None);
        assert_eq!(watcher.changed(Ok(pair("c", "c"))), Some(pair("c", "c")));
    }

    #[test]
    fn a_file_missing_for_a_moment_is_not_a_change() {
        let mut watcher = Watcher::new(pair("a", "a"));
        assert_eq!(watcher.changed(Err("gone".to_owned())), None);
        assert_eq!(watcher.changed(Ok(pair("a", "a"))), None);
        assert_eq!(watcher.changed(Err("gone".to_owned())), None);
        assert_eq!(watcher.changed(Err("gone".to_owned())), None);
    }
}
