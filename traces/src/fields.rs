//! How the log lines write a span's fields when traces are on: as
//! `tracing-subscriber` does, less the `otel.*` ones, which name the
//! OpenTelemetry span (`otel.name`, `otel.kind`) and mean nothing in a log
//! line. With traces off no span has them, and the stock formatters run.

use std::fmt;

use tracing::field::{Field, Visit};
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::field::{MakeVisitor, VisitFmt, VisitOutput};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FormatFields, FormattedFields};

/// Left out of the log lines.
fn hidden(field: &Field) -> bool {
    field.name().starts_with("otel.")
}

/// Text: `name=value` separated by spaces, the message bare; strings quoted
/// as `Debug` quotes them.
#[derive(Clone, Copy, Debug, Default)]
pub struct TextFields;

impl<'w> MakeVisitor<Writer<'w>> for TextFields {
    type Visitor = TextVisitor<'w>;

    fn make_visitor(&self, writer: Writer<'w>) -> TextVisitor<'w> {
        TextVisitor {
            writer,
            first: true,
            result: Ok(()),
        }
    }
}

/// One span's or line's fields, written as text.
#[derive(Debug)]
pub struct TextVisitor<'w> {
    writer: Writer<'w>,
    first: bool,
    result: fmt::Result,
}

impl Visit for TextVisitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.record_debug(field, &format_args!("{value}"));
        } else {
            self.record_debug(field, &value);
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if self.result.is_err() || hidden(field) {
            return;
        }
        // Piece by piece: the formatter's machinery only for the value.
        let writer = &mut self.writer;
        let first = std::mem::replace(&mut self.first, false);
        self.result = (|| {
            if !first {
                writer.write_char(' ')?;
            }
            if field.name() != "message" {
                writer.write_str(field.name())?;
                writer.write_char('=')?;
            }
            write!(writer, "{value:?}")
        })();
    }
}

impl VisitOutput<fmt::Result> for TextVisitor<'_> {
    fn finish(self) -> fmt::Result {
        self.result
    }
}

impl VisitFmt for TextVisitor<'_> {
    fn writer(&mut self) -> &mut dyn fmt::Write {
        &mut self.writer
    }
}

/// JSON: one object per span, as `tracing-subscriber`'s JSON format nests
/// it under `span` and `spans`.
#[derive(Clone, Copy, Debug, Default)]
pub struct JsonFields;

impl<'w> FormatFields<'w> for JsonFields {
    fn format_fields<R: RecordFields>(&self, mut writer: Writer<'w>, fields: R) -> fmt::Result {
        let mut object = serde_json::Map::new();
        fields.record(&mut JsonVisitor(&mut object));
        writer.write_str(&serde_json::Value::Object(object).to_string())
    }

    fn add_fields(
        &self,
        current: &'w mut FormattedFields<Self>,
        fields: &tracing::span::Record<'_>,
    ) -> fmt::Result {
        let mut object = match serde_json::from_str(&current.fields) {
            Ok(serde_json::Value::Object(object)) => object,
            _ => serde_json::Map::new(),
        };
        fields.record(&mut JsonVisitor(&mut object));
        current.fields = serde_json::Value::Object(object).to_string();
        Ok(())
    }
}

/// Fields into a JSON object: numbers and booleans as such, the rest as
/// strings.
struct JsonVisitor<'a>(&'a mut serde_json::Map<String, serde_json::Value>);

impl JsonVisitor<'_> {
    fn put(&mut self, field: &Field, value: impl Into<serde_json::Value>) {
        if !hidden(field) {
            self.0.insert(field.name().to_owned(), value.into());
        }
    }
}

impl Visit for JsonVisitor<'_> {
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.put(field, value);
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, value);
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, value);
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, value);
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, value);
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.put(field, format!("{value:?}"));
    }
}

#[cfg(test)]
mod tests {
    use std::io;
    use std::sync::{Arc, Mutex};

    use tracing_subscriber::fmt::MakeWriter;
    use tracing_subscriber::layer::SubscriberExt;

    use super::*;

    /// What a subscriber wrote.
    #[derive(Clone, Default)]
    struct Written(Arc<Mutex<Vec<u8>>>);

    impl io::Write for Written {
        fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
            self.0.lock().expect("lock").extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Written {
        type Writer = Written;

        fn make_writer(&'a self) -> Written {
            self.clone()
        }
    }

    impl Written {
        fn text(&self) -> String {
            String::from_utf8(self.0.lock().expect("lock").clone()).expect("UTF-8")
        }
    }

    fn log_in_a_span() {
        let span = tracing::info_span!(
            "request",
            method = "GET",
            otel.name = "GET /{code}",
            otel.kind = "server",
            status = tracing::field::Empty
        );
        span.record("status", 200);
        span.in_scope(|| tracing::info!(hits = 3, "answered"));
    }

    #[test]
    fn text_lines_leave_the_otel_fields_out() {
        let written = Written::default();
        let layer = tracing_subscriber::fmt::layer()
            .with_writer(written.clone())
            .with_ansi(false)
            .without_time()
            .fmt_fields(TextFields);
        tracing::subscriber::with_default(
            tracing_subscriber::registry().with(layer),
            log_in_a_span,
        );
        let line = written.text();
        assert!(
            line.contains(r#"request{method="GET" status=200}: "#),
            "{line}"
        );
        assert!(line.trim_end().ends_with("answered hits=3"), "{line}");
    }

    #[test]
    fn json_lines_leave_the_otel_fields_out() {
        let written = Written::default();
        let layer = tracing_subscriber::fmt::layer()
            .json()
            .flatten_event(true)
            .with_writer(written.clone())
            .fmt_fields(JsonFields);
        tracing::subscriber::with_default(
            tracing_subscriber::registry().with(layer),
            log_in_a_span,
        );
        let line: serde_json::Value = serde_json::from_str(&written.text()).expect("JSON");
        assert_eq!(
            line["span"],
            serde_json::json!({"method": "GET", "status": 200, "name": "request"})
        );
        assert_eq!(line["hits"], 3);
    }
}
