//! The batch processor: a span is encoded when it ends, on the thread that
//! ends it, and the export thread sends what has gathered.
//!
//! The SDK's `BatchSpanProcessor` sends each span's data through a channel
//! to its thread, which collects them, hands the batch to the exporter to
//! encode and frees them there: the span data moved twice, every string of
//! it freed on another thread than the one that made it, and the encoder
//! reading it cold. Here a span's `Span` message is written while its data
//! is warm ([`super::wire::span`]) into a small buffer of the thread's,
//! then appended under a lock to the batch it falls in — into the export
//! request itself, opened with the resource and scope when the batch's
//! first span came; its data is freed where it was made. The export thread
//! only closes each batch's request and sends it: no span's bytes are
//! copied again, nor moved as the request grows (it starts as large as the
//! largest sent).
//!
//! The batching is the SDK's, with its variables read as the SDK reads
//! them: `OTEL_BSP_SCHEDULE_DELAY` (a batch is sent at most this long after
//! the last, 5 s), `OTEL_BSP_MAX_QUEUE_SIZE` (spans waiting beyond it are
//! dropped, 2048), `OTEL_BSP_MAX_EXPORT_BATCH_SIZE` (a batch's spans, 512,
//! no more than the queue; a full batch is sent at once). Like the SDK's
//! thread-based processor, it leaves `OTEL_BSP_EXPORT_TIMEOUT` to the
//! exporter's own timeout.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use opentelemetry::Context;
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{Span, SpanData, SpanProcessor};
use opentelemetry_sdk::Resource;

use super::count::Counts;
use super::wire::{self, Body, Encoder, Scope};

/// The batching the `OTEL_BSP_*` variables set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Config {
    pub(super) schedule_delay: Duration,
    pub(super) max_queue_size: usize,
    pub(super) max_export_batch_size: usize,
}

impl Default for Config {
    /// The specification's defaults.
    fn default() -> Config {
        Config {
            schedule_delay: Duration::from_millis(5_000),
            max_queue_size: 2_048,
            max_export_batch_size: 512,
        }
    }
}

impl Config {
    /// The defaults, each replaced by its variable where that is a number;
    /// a batch no larger than the queue.
    pub(super) fn from_env() -> Config {
        Config::from_vars(|name| std::env::var(name).ok())
    }

    fn from_vars(var: impl Fn(&str) -> Option<String>) -> Config {
        let number = |name: &str| var(name)?.trim().parse::<u64>().ok();
        let mut config = Config::default();
        if let Some(millis) = number("OTEL_BSP_SCHEDULE_DELAY") {
            config.schedule_delay = Duration::from_millis(millis);
        }
        let size = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
        if let Some(n) = number("OTEL_BSP_MAX_QUEUE_SIZE") {
            config.max_queue_size = size(n);
        }
        if let Some(n) = number("OTEL_BSP_MAX_EXPORT_BATCH_SIZE") {
            config.max_export_batch_size = size(n);
        }
        // No larger than the queue, and at least one span.
        config.max_export_batch_size = config
            .max_export_batch_size
            .min(config.max_queue_size)
            .max(1);
        config
    }
}

/// Where the export thread sends each request: the exporter
/// (`super::export::Exporter`), or a test's recorder.
pub(super) trait Sender: Send + 'static {
    /// Sends one export request's `body`; says why not if it could not.
    fn send(&self, body: Vec<u8>) -> Result<(), String>;
}

/// Spans encoded for one export: at most a batch's worth, written into
/// the request that sends them.
#[derive(Debug)]
struct Batch {
    spans: usize,
    body: Body,
}

/// The room a request's body starts with, until one has been sent: a
/// batch of the default 512 spans of about 240 bytes takes twice that.
const FIRST_CAPACITY: usize = 64 * 1024;

/// The most room a request's body starts with, whatever the largest sent.
const MAX_CAPACITY: usize = 4 * 1024 * 1024;

/// The room for a request's body after one of `sent` bytes: an eighth
/// more. Batches of the same number of spans differ by a few bytes each;
/// with room for the largest alone, each batch a little larger than any
/// before moved its bytes to a buffer twice as large — one batch in six
/// still, ten thousand requests into a run.
fn room_for(sent: usize) -> usize {
    sent.saturating_add(sent / 8).min(MAX_CAPACITY)
}

/// What the threads ending spans and the export thread share.
#[derive(Debug, Default)]
struct State {
    /// The batches waiting, the last one filling.
    batches: VecDeque<Batch>,
    /// Spans waiting, in all of them.
    queued: usize,
    /// Flushes asked for, and flushes done: a flush waits until the second
    /// reaches the first as it was when it asked.
    flushes_asked: u64,
    flushes_done: u64,
    /// Why the last flush's exports failed, if one did.
    flush_failure: Option<String>,
    /// The processor is shut down: spans ending now are dropped.
    stopping: bool,
    /// The export thread has returned.
    stopped: bool,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    /// Wakes the export thread: a batch is full, or a flush or the
    /// shutdown is asked for.
    work: Condvar,
    /// Wakes who waits for a flush.
    flushed: Condvar,
    config: Config,
    counts: Arc<Counts>,
    /// The resource's bytes, written at the head of each request.
    encoder: Encoder,
    /// The room each request's body starts with: the largest sent so far,
    /// and an eighth more ([`room_for`]), so that a batch's bytes are not
    /// moved as it grows.
    capacity: AtomicUsize,
    /// A span was dropped for a full queue: warned once.
    dropping: AtomicBool,
    /// The export thread, joined at the shutdown.
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Every change under the lock is whole before anything can panic.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

thread_local! {
    /// Where a span is encoded before it joins its batch: the lock is held
    /// for a copy, not for the encoding.
    static SCRATCH: RefCell<Vec<u8>> = RefCell::new(Vec::with_capacity(1024));
}

/// The processor every span ends into: the provider's for the spans of
/// `tracing`, and [`super::server`]'s directly. Its clones are one
/// processor.
#[derive(Clone, Debug)]
pub(super) struct Batcher {
    shared: Arc<Shared>,
}

impl Batcher {
    /// Starts the export thread, sending through `exporter` the spans of
    /// `resource`, counted in `counts`.
    ///
    /// # Errors
    /// The thread could not be started.
    pub(super) fn start(
        exporter: impl Sender,
        resource: &Resource,
        config: Config,
        counts: Arc<Counts>,
    ) -> std::io::Result<Batcher> {
        let mut encoder = Encoder::default();
        encoder.set_resource(resource);
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            work: Condvar::new(),
            flushed: Condvar::new(),
            config,
            counts,
            encoder,
            capacity: AtomicUsize::new(FIRST_CAPACITY),
            dropping: AtomicBool::new(false),
            thread: Mutex::new(None),
        });
        let thread = std::thread::Builder::new()
            .name("trace export".into())
            .spawn({
                let shared = Arc::clone(&shared);
                move || export_loop(&shared, &exporter)
            })?;
        *shared.thread.lock().unwrap_or_else(PoisonError::into_inner) = Some(thread);
        Ok(Batcher { shared })
    }

    /// Asks the export thread to send everything queued now, and waits
    /// until it has (or has stopped); says why not if the collector did
    /// not take it all.
    fn flush(&self) -> Result<(), String> {
        let shared = &*self.shared;
        let mut state = shared.lock();
        state.flushes_asked += 1;
        let asked = state.flushes_asked;
        shared.work.notify_one();
        while state.flushes_done < asked && !state.stopped {
            state = shared
                .flushed
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
        match &state.flush_failure {
            Some(failure) if state.flushes_done >= asked => Err(failure.clone()),
            _ => Ok(()),
        }
    }

    /// Ends `span`, of `scope`: encoded here, queued for the export
    /// thread.
    pub(super) fn end(&self, scope: Scope<'_>, span: &wire::Fields<'_>) {
        let shared = &*self.shared;
        shared.counts.ended();
        SCRATCH.with_borrow_mut(|scratch| {
            scratch.clear();
            wire::span(scratch, span);
            let mut state = shared.lock();
            if state.stopping {
                // After the shutdown: counted ended, never exported.
                return;
            }
            if state.queued >= shared.config.max_queue_size {
                drop(state);
                if !shared.dropping.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        max_queue_size = shared.config.max_queue_size,
                        "trace spans dropped: the queue is full (OTEL_BSP_MAX_QUEUE_SIZE); \
                         the count at exit says how many"
                    );
                }
                return;
            }
            let max = shared.config.max_export_batch_size;
            if state.batches.back().is_none_or(|batch| batch.spans >= max) {
                let capacity = shared.capacity.load(Ordering::Relaxed);
                let body = shared.encoder.open(scope, capacity);
                state.batches.push_back(Batch { spans: 0, body });
            }
            let batch = state.batches.back_mut().expect("a batch was pushed");
            batch.body.push(scope, scratch);
            batch.spans += 1;
            let full = batch.spans >= max;
            state.queued += 1;
            drop(state);
            if full {
                shared.work.notify_one();
            }
        });
    }
}

impl SpanProcessor for Batcher {
    fn on_start(&self, _span: &mut Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        let scope = Scope::Other(&span.instrumentation_scope);
        self.end(scope, &wire::Fields::of(&span));
        // `span` is freed here, on the thread that made its strings.
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.flush().map_err(OTelSdkError::InternalFailure)
    }

    /// Sends what is queued, then stops the export thread, waiting for it
    /// at most `timeout`.
    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        let shared = &*self.shared;
        let deadline = Instant::now() + timeout;
        let mut state = shared.lock();
        if state.stopping {
            return Err(OTelSdkError::AlreadyShutdown);
        }
        state.stopping = true;
        shared.work.notify_one();
        while !state.stopped {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(OTelSdkError::Timeout(timeout));
            }
            state = shared
                .flushed
                .wait_timeout(state, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        drop(state);
        let mut thread = shared.thread.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(thread) = thread.take() {
            let _ = thread.join();
        }
        Ok(())
    }

    /// Given when the processor was started.
    fn set_resource(&mut self, _resource: &Resource) {}
}

/// The export thread: waits for a full batch, the schedule, a flush or the
/// shutdown, then sends what that calls for.
fn export_loop(shared: &Shared, exporter: &impl Sender) {
    let config = shared.config;
    let full = |batch: &Batch| batch.spans >= config.max_export_batch_size;
    let mut last_export = Instant::now();
    loop {
        let mut state = shared.lock();
        // On the schedule, a flush or the shutdown: everything; otherwise
        // the batches that are full.
        let (everything, flush, stop) = loop {
            let flush = (state.flushes_asked > state.flushes_done).then_some(state.flushes_asked);
            let due = last_export.elapsed() >= config.schedule_delay;
            if flush.is_some() || state.stopping || due {
                break (true, flush, state.stopping);
            }
            if state.batches.front().is_some_and(full) {
                break (false, None, false);
            }
            let wait = config.schedule_delay.saturating_sub(last_export.elapsed());
            state = shared
                .work
                .wait_timeout(state, wait)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        };
        let mut taken = Vec::new();
        while state
            .batches
            .front()
            .is_some_and(|batch| everything || full(batch))
        {
            let batch = state.batches.pop_front().expect("a batch");
            state.queued -= batch.spans;
            taken.push(batch);
        }
        drop(state);
        if everything {
            last_export = Instant::now();
        }
        let mut failure = None;
        for batch in taken {
            let body = shared.encoder.close(batch.body);
            shared
                .capacity
                .fetch_max(room_for(body.len()), Ordering::Relaxed);
            let result = exporter.send(body);
            if let Err(error) = &result {
                failure = Some(error.clone());
            }
            shared.counts.exported(batch.spans as u64, result);
        }
        let mut state = shared.lock();
        if let Some(asked) = flush {
            state.flushes_done = state.flushes_done.max(asked);
            state.flush_failure = failure;
        }
        state.stopped = stop;
        shared.flushed.notify_all();
        if stop {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;
    use std::sync::mpsc::{self, Receiver, SyncSender};

    use opentelemetry::trace::TraceState;
    use opentelemetry::trace::{SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId};
    use opentelemetry::InstrumentationScope;
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_sdk::trace::{SpanEvents, SpanLinks};
    use prost::Message as _;

    use super::*;

    fn config(max_queue_size: usize, max_export_batch_size: usize) -> Config {
        Config {
            // Never on the schedule: a test says when.
            schedule_delay: Duration::from_secs(3600),
            max_queue_size,
            max_export_batch_size,
        }
    }

    /// Span `n` of scope `scope`.
    fn span(n: u64, scope: &'static str) -> SpanData {
        let context = SpanContext::new(
            TraceId::from(u128::from(n) + 1),
            SpanId::from(n + 1),
            TraceFlags::SAMPLED,
            false,
            TraceState::NONE,
        );
        let now = std::time::SystemTime::now();
        SpanData {
            span_context: context,
            parent_span_id: SpanId::INVALID,
            parent_span_is_remote: false,
            span_kind: SpanKind::Server,
            name: Cow::Owned(format!("span {n}")),
            start_time: now,
            end_time: now,
            attributes: Vec::new(),
            dropped_attributes_count: 0,
            events: SpanEvents::default(),
            links: SpanLinks::default(),
            status: Status::Unset,
            instrumentation_scope: InstrumentationScope::builder(scope).build(),
        }
    }

    /// Each export's span names, by scope; an export is taken from
    /// `sent` as it is made, and answered when the test says
    /// (`answer`).
    struct Recorder {
        sent: SyncSender<Vec<(String, Vec<String>)>>,
        answer: Mutex<Receiver<Result<(), String>>>,
    }

    impl Sender for Recorder {
        fn send(&self, body: Vec<u8>) -> Result<(), String> {
            let request = ExportTraceServiceRequest::decode(&body[..]).expect("decodes");
            let scopes = request.resource_spans[0]
                .scope_spans
                .iter()
                .map(|scope| {
                    let name = scope
                        .scope
                        .as_ref()
                        .map(|s| s.name.clone())
                        .unwrap_or_default();
                    (name, scope.spans.iter().map(|s| s.name.clone()).collect())
                })
                .collect();
            self.sent.send(scopes).expect("the test listens");
            self.answer
                .lock()
                .expect("lock")
                .recv()
                .unwrap_or(Err("the test ended".to_owned()))
        }
    }

    struct Harness {
        batcher: Batcher,
        counts: Arc<Counts>,
        sent: Receiver<Vec<(String, Vec<String>)>>,
        answer: SyncSender<Result<(), String>>,
    }

    fn start(config: Config) -> Harness {
        let (sent_tx, sent) = mpsc::sync_channel(16);
        let (answer, answer_rx) = mpsc::sync_channel(16);
        let recorder = Recorder {
            sent: sent_tx,
            answer: Mutex::new(answer_rx),
        };
        let counts = Arc::new(Counts::default());
        let resource = Resource::builder_empty().with_service_name("tests").build();
        let batcher = Batcher::start(recorder, &resource, config, Arc::clone(&counts))
            .expect("the thread starts");
        Harness {
            batcher,
            counts,
            sent,
            answer,
        }
    }

    fn names(scope: &str, spans: std::ops::Range<u64>) -> (String, Vec<String>) {
        (
            scope.to_owned(),
            spans.map(|n| format!("span {n}")).collect(),
        )
    }

    // A full batch goes at once, without its schedule; each export holds
    // at most a batch, its spans grouped by scope in the order they came.
    #[test]
    fn a_full_batch_is_sent_at_once_and_a_flush_sends_the_rest() {
        let harness = start(config(100, 3));
        harness.batcher.on_end(span(0, "a"));
        harness.batcher.on_end(span(1, "b"));
        harness.batcher.on_end(span(2, "a"));
        let first = harness.sent.recv().expect("sent without a flush");
        assert_eq!(
            first,
            [
                (
                    "a".to_owned(),
                    vec!["span 0".to_owned(), "span 2".to_owned()]
                ),
                names("b", 1..2)
            ]
        );
        harness.answer.send(Ok(())).expect("answered");
        harness.batcher.on_end(span(3, "a"));
        harness.answer.send(Ok(())).expect("answered ahead");
        harness.batcher.force_flush().expect("flushed");
        let rest = harness.sent.try_recv().expect("the flush sent the rest");
        assert_eq!(rest, [names("a", 3..4)]);
        assert_eq!(harness.counts.snapshot(), (4, 4));
    }

    // A batch is written into a request as large as the largest sent, and
    // some: its bytes are not moved as it grows.
    #[test]
    fn a_request_starts_as_large_as_the_largest_sent() {
        let harness = start(config(100, 4));
        let large = |n| {
            let mut span = span(n, "a");
            span.attributes = vec![opentelemetry::KeyValue::new("x", "y".repeat(30_000))];
            span
        };
        for n in 0..4 {
            harness.batcher.on_end(large(n));
        }
        assert_eq!(harness.sent.recv().expect("sent"), [names("a", 0..4)]);
        harness.answer.send(Ok(())).expect("answered");
        harness.batcher.on_end(span(4, "a"));
        let shared = &*harness.batcher.shared;
        let room = shared.capacity.load(Ordering::Relaxed);
        assert!(room > 4 * 30_000 * 9 / 8, "{room}");
        let state = shared.lock();
        let next = state.batches.back().expect("the next batch");
        assert!(next.body.capacity() >= room, "{room}");
    }

    // Past `OTEL_BSP_MAX_QUEUE_SIZE` a span is dropped, and counted: ended,
    // never exported.
    #[test]
    fn spans_past_the_queue_are_dropped_and_counted() {
        let harness = start(config(2, 2));
        harness.batcher.on_end(span(0, "a"));
        harness.batcher.on_end(span(1, "a"));
        // The export thread holds the first batch, waiting for its answer:
        // the queue is empty again, and takes two more.
        assert_eq!(harness.sent.recv().expect("sent"), [names("a", 0..2)]);
        for n in 2..5 {
            harness.batcher.on_end(span(n, "a"));
        }
        harness.answer.send(Ok(())).expect("answered");
        assert_eq!(harness.sent.recv().expect("sent"), [names("a", 2..4)]);
        harness.answer.send(Ok(())).expect("answered");
        harness.batcher.force_flush().expect("flushed");
        assert!(harness.sent.try_recv().is_err(), "span 4 was dropped");
        assert_eq!(harness.counts.snapshot(), (5, 4));
    }

    // A refused export counts its spans ended, not exported; the shutdown
    // sends what is queued, and a span ending after it is dropped.
    #[test]
    fn refused_spans_and_spans_after_the_shutdown_are_not_exported() {
        let harness = start(config(100, 100));
        harness.batcher.on_end(span(0, "a"));
        harness
            .answer
            .send(Err("refused".to_owned()))
            .expect("answered");
        let refused = harness
            .batcher
            .force_flush()
            .expect_err("the flush says so");
        assert!(refused.to_string().contains("refused"), "{refused}");
        assert_eq!(harness.sent.try_recv().expect("sent"), [names("a", 0..1)]);
        harness.batcher.on_end(span(1, "a"));
        harness.answer.send(Ok(())).expect("answered ahead");
        harness
            .batcher
            .shutdown_with_timeout(Duration::from_secs(60))
            .expect("shut down");
        assert_eq!(harness.sent.try_recv().expect("sent"), [names("a", 1..2)]);
        harness.batcher.on_end(span(2, "a"));
        assert_eq!(harness.counts.snapshot(), (3, 1));
    }

    #[test]
    fn the_variables_are_read_as_the_sdk_reads_them() {
        let vars = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(key, _)| *key == name)
                    .map(|(_, value)| (*value).to_owned())
            }
        };
        assert_eq!(Config::from_vars(vars(&[])), Config::default());
        let set = Config::from_vars(vars(&[
            ("OTEL_BSP_SCHEDULE_DELAY", "200"),
            ("OTEL_BSP_MAX_QUEUE_SIZE", "100"),
            ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "512"),
        ]));
        assert_eq!(
            set,
            Config {
                schedule_delay: Duration::from_millis(200),
                max_queue_size: 100,
                // No larger than the queue.
                max_export_batch_size: 100,
            }
        );
        let unreadable = Config::from_vars(vars(&[("OTEL_BSP_SCHEDULE_DELAY", "soon")]));
        assert_eq!(unreadable, Config::default());
        let empty = Config::from_vars(vars(&[("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "0")]));
        assert_eq!(
            empty.max_export_batch_size, 1,
            "a batch holds a span at least"
        );
    }
}
