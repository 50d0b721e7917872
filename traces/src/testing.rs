//! What the crate's tests share.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry::Context;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{Span, SpanData, SpanProcessor};

/// A processor that keeps the spans that ended, in order.
#[derive(Clone, Debug, Default)]
pub(crate) struct Ended(Arc<Mutex<Vec<SpanData>>>);

impl Ended {
    /// The spans that ended so far.
    pub(crate) fn spans(&self) -> Vec<SpanData> {
        self.0.lock().expect("lock").clone()
    }
}

impl SpanProcessor for Ended {
    fn on_start(&self, _: &mut Span, _: &Context) {}

    fn on_end(&self, span: SpanData) {
        self.0.lock().expect("lock").push(span);
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, _: Duration) -> OTelSdkResult {
        Ok(())
    }
}
