//! How the log lines write the fields of events and spans: byte for byte
//! as `tracing-subscriber`'s default formatter writes them, less a span's
//! `otel.*` fields, which name the OpenTelemetry span (`otel.name`,
//! `otel.kind`) and mean nothing in a log line. The same formatter serves
//! traces on and off, so that what a line costs does not depend on them.

use std::fmt;

use tracing::field::{Field, Visit};
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::field::{MakeVisitor, VisitFmt, VisitOutput};
use tracing_subscriber::fmt::format::{DefaultVisitor, Writer};
use tracing_subscriber::fmt::{FormatFields, FormattedFields};

/// Left out of the log lines.
fn hidden(field: &Field) -> bool {
    field.name().starts_with("otel.")
}

/// Text, as `tracing-subscriber`'s `DefaultFields`: `name=value` separated
/// by spaces, strings quoted as `Debug` quotes them, the message bare with
/// its control characters escaped, an error followed by its sources.
///
/// A plain field (not the message, an error, a raw `r#` name or the `log`
/// crate's metadata) on a line without colours is written here piece by
/// piece: the formatter's machinery only for the value. Every other field
/// is written by the default visitor itself.
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

impl TextVisitor<'_> {
    /// Whether `field` is written at all, and if so by whom.
    fn route(&self, field: &Field) -> Route {
        let name = field.name();
        // The default formatter leaves out the `log` crate's metadata,
        // already in the line's head.
        if self.result.is_err() || hidden(field) || name.starts_with("log.") {
            Route::Skip
        } else if self.writer.has_ansi_escapes() || name == "message" || name.starts_with("r#") {
            Route::Default
        } else {
            Route::Plain
        }
    }

    /// `name=value`, after a space unless it is the first field.
    fn plain(&mut self, field: &Field, value: &dyn fmt::Debug) {
        let writer = &mut self.writer;
        let first = std::mem::replace(&mut self.first, false);
        self.result = (|| {
            if !first {
                writer.write_char(' ')?;
            }
            writer.write_str(field.name())?;
            writer.write_char('=')?;
            write!(writer, "{value:?}")
        })();
    }

    /// The field, written by the default formatter's own visitor.
    fn default(&mut self, record: impl FnOnce(&mut DefaultVisitor<'_>)) {
        let first = std::mem::replace(&mut self.first, false);
        let mut visitor = DefaultVisitor::new(self.writer.by_ref(), first);
        record(&mut visitor);
        self.result = visitor.finish();
    }
}

/// Who writes a field.
enum Route {
    Skip,
    Plain,
    Default,
}

impl Visit for TextVisitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        match self.route(field) {
            Route::Skip => {}
            Route::Plain => self.plain(field, &value),
            Route::Default => self.default(|visitor| visitor.record_str(field, value)),
        }
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        match self.route(field) {
            Route::Skip => {}
            // With its sources, as the default formatter writes an error.
            Route::Plain | Route::Default => {
                self.default(|visitor| visitor.record_error(field, value));
            }
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        match self.route(field) {
            Route::Skip => {}
            Route::Plain => self.plain(field, value),
            Route::Default => self.default(|visitor| visitor.record_debug(field, value)),
        }
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
        let line = written(TextFields, false, log_in_a_span);
        assert!(
            line.contains(r#"request{method="GET" status=200}: "#),
            "{line}"
        );
        assert!(line.trim_end().ends_with("answered hits=3"), "{line}");
    }

    /// An error with a source, as the default formatter lists them.
    #[derive(Debug)]
    struct Failed(std::num::ParseIntError);

    impl fmt::Display for Failed {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("the count is not a number")
        }
    }

    impl std::error::Error for Failed {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    /// A line of every kind of field the default formatter writes apart,
    /// in a span whose fields are recorded at its start and later.
    fn log_every_kind() {
        let failed = Failed("x".parse::<u32>().expect_err("not a number"));
        let span = tracing::info_span!(
            "request",
            method = "GET",
            r#type = "link",
            id = 7_u64,
            delta = -2_i64,
            ratio = 0.5,
            ok = true,
            status = tracing::field::Empty
        );
        span.record("status", 200);
        span.in_scope(|| {
            tracing::info!(
                path = "/a\x1b[31m\"b",
                who = ?Some("me"),
                log.target = "from the log crate",
                "answered \x1b[31mred\u{9b}"
            );
            tracing::warn!(error = &failed as &dyn std::error::Error, "failed");
            tracing::info!(empty = "");
        });
    }

    /// What `log` writes with `fields`, colours on or off.
    fn written<F>(fields: F, ansi: bool, log: fn()) -> String
    where
        F: for<'w> FormatFields<'w> + Send + Sync + 'static,
    {
        let written = Written::default();
        let layer = tracing_subscriber::fmt::layer()
            .with_writer(written.clone())
            .with_ansi(ansi)
            .without_time()
            .fmt_fields(fields);
        tracing::subscriber::with_default(tracing_subscriber::registry().with(layer), log);
        written.text()
    }

    // Byte for byte what the stock formatter writes, with and without
    // colours: the message's control characters escaped, an error with
    // its sources, a raw name bare, the `log` crate's metadata left out.
    #[test]
    fn text_lines_are_the_default_formatters() {
        use tracing_subscriber::fmt::format::DefaultFields;
        for ansi in [false, true] {
            let ours = written(TextFields, ansi, log_every_kind);
            let stock = written(DefaultFields::new(), ansi, log_every_kind);
            assert_eq!(ours, stock, "ansi: {ansi}");
            assert_eq!(ours.lines().count(), 3, "{ours}");
        }
        let plain = written(TextFields, false, log_every_kind);
        assert!(plain.contains("answered \\x1b[31mred"), "{plain}");
        assert!(plain.contains("error.sources=["), "{plain}");
        assert!(plain.contains(" type=\"link\""), "{plain}");
        assert!(!plain.contains("from the log crate"), "{plain}");
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
