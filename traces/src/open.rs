//! The server spans of requests not finished yet, so that none is left
//! without an end.
//!
//! A span is exported when it ends, and a request's ends when its future is
//! dropped. Work the shutdown gives up on is not always dropped before the
//! process exits: an HTTP/2 stream runs on a task of its own, work handed
//! to `RequestScope::run` holds the span too, and the runtime is shut down
//! without waiting for them. Their spans would never be exported — exactly
//! the requests an operator looks for after a deploy. So every request's
//! span is listed here while it is open, and the last finalizer ends those
//! left, with an error status saying why ([`end_all`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};

use lameduck_lifecycle::Watch;
use opentelemetry::trace::{Status, TraceContextExt};
use opentelemetry::{Context, KeyValue};

/// Why a span still open at the last flush ends in error.
pub const STILL_RUNNING: &str = "abandoned: still running when the process exited";

/// Why a span still open after a second signal, or dropped unanswered
/// then, ends in error.
pub const FORCED: &str = "abandoned: the shutdown was forced";

/// Why a request dropped unanswered after the lifecycle gave up on its
/// connection ends in error.
pub const ABANDONED: &str = "abandoned: the shutdown deadline passed";

/// Why a request dropped unanswered before that ends in error.
pub const CLIENT_WENT_AWAY: &str = "cancelled: the client went away before the answer";

/// The open spans, by registration number.
static OPEN: Mutex<Option<Listed>> = Mutex::new(None);

/// The open spans: slots taken and freed as spans start and end, each
/// holding its registration number (a slot is reused; a number never is).
#[derive(Debug, Default)]
struct Listed {
    slots: Vec<Option<(u64, Context)>>,
    free: Vec<usize>,
}

impl Listed {
    /// Lists `context` as `number`; says in which slot.
    fn insert(&mut self, number: u64, context: Context) -> usize {
        match self.free.pop() {
            Some(slot) => {
                self.slots[slot] = Some((number, context));
                slot
            }
            None => {
                self.slots.push(Some((number, context)));
                self.slots.len() - 1
            }
        }
    }

    /// Takes `number` out of `slot`, if it is still there.
    fn remove(&mut self, slot: usize, number: u64) -> Option<Context> {
        let entry = self.slots.get_mut(slot)?;
        if entry.as_ref().is_some_and(|(listed, _)| *listed == number) {
            self.free.push(slot);
            entry.take().map(|(_, context)| context)
        } else {
            None
        }
    }
}

static NEXT: AtomicU64 = AtomicU64::new(0);

/// The lifecycle's timeline: has it abandoned the remaining requests?
static LIFECYCLE: OnceLock<Watch> = OnceLock::new();

fn open() -> MutexGuard<'static, Option<Listed>> {
    // A panic while the map was held left it whole: each operation is one
    // insert or remove.
    OPEN.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Lets the span of a request dropped unanswered tell why: once `watch`
/// says the lifecycle abandoned the connections left (`Watch::abandoned`:
/// the deadline's grace passed, or a second signal forced the exit), the
/// server gave up on it; before, its client did. Asked as the span
/// ends — the connection is dropped after the abandon, never before — so
/// the answer cannot race a task that would have to run first.
pub fn judge_by(watch: &Watch) {
    let _ = LIFECYCLE.set(watch.clone());
}

/// A request's span, listed while open.
#[derive(Debug)]
pub struct Registration {
    number: u64,
    slot: usize,
    context: Context,
}

impl Registration {
    /// Lists the span of `context`.
    pub fn new(context: Context) -> Registration {
        let number = NEXT.fetch_add(1, Ordering::Relaxed);
        let slot = open()
            .get_or_insert_with(Listed::default)
            .insert(number, context.clone());
        Registration {
            number,
            slot,
            context,
        }
    }

    /// The span's context: its trace and span ids.
    pub fn context(&self) -> &Context {
        &self.context
    }

    /// Ends the span now, unless [`end_all`] did; one that got no answer
    /// ends in error.
    pub fn end(self, answered: bool) {
        let listed = open()
            .as_mut()
            .and_then(|open| open.remove(self.slot, self.number));
        let Some(context) = listed else {
            return;
        };
        if !answered {
            let why = match LIFECYCLE.get() {
                Some(watch) if watch.is_forced() => FORCED,
                Some(watch) if watch.is_abandoned() => ABANDONED,
                _ => CLIENT_WENT_AWAY,
            };
            fail(&context, why);
        }
        context.span().end();
    }
}

/// Ends every span still open with an error status saying `why`, and says
/// how many there were.
pub fn end_all(why: &'static str) -> usize {
    let left = open().take().unwrap_or_default();
    let mut ended = 0;
    for (_, context) in left.slots.into_iter().flatten() {
        fail(&context, why);
        context.span().end();
        ended += 1;
    }
    ended
}

fn fail(context: &Context, why: &'static str) {
    let span = context.span();
    let kind = why.split(':').next().unwrap_or(why);
    span.set_attribute(KeyValue::new("error.type", kind));
    span.set_status(Status::error(why));
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use opentelemetry::trace::{Status, Tracer as _, TracerProvider as _};
    use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData};

    use super::*;
    use crate::testing::Ended;

    /// Spans listed here, and what became of them. The list is the
    /// process's: one test at a time has a recorder.
    struct Recorder {
        ended: Ended,
        provider: SdkTracerProvider,
        _turn: MutexGuard<'static, ()>,
    }

    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

    impl Recorder {
        fn new() -> Recorder {
            let turn = ONE_AT_A_TIME.lock().unwrap_or_else(PoisonError::into_inner);
            let ended = Ended::default();
            let provider = SdkTracerProvider::builder()
                .with_span_processor(ended.clone())
                .build();
            Recorder {
                ended,
                provider,
                _turn: turn,
            }
        }

        /// Starts a span named `name` and lists it.
        fn open(&self, name: &'static str) -> Registration {
            let span = self.provider.tracer("test").start(name);
            Registration::new(Context::current_with_span(span))
        }

        /// The spans ended so far: name and status, in order.
        fn outcomes(&self) -> Vec<(String, Status)> {
            let outcome = |span: &SpanData| (span.name.to_string(), span.status.clone());
            self.ended.spans().iter().map(outcome).collect()
        }
    }

    // A span ended on its own leaves the list; one still listed at the last
    // flush is ended there, in error, once — its own end later is a no-op.
    #[test]
    fn spans_left_open_are_ended_in_error_once() {
        let spans = Recorder::new();
        let answered = spans.open("answered");
        let left = spans.open("left open");
        answered.end(true);
        assert_eq!(end_all(STILL_RUNNING), 1);
        left.end(true);
        assert_eq!(end_all(STILL_RUNNING), 0);
        assert_eq!(
            spans.outcomes(),
            [
                ("answered".to_owned(), Status::Unset),
                ("left open".to_owned(), Status::error(STILL_RUNNING)),
            ]
        );
    }

    // Unanswered, a span says whose doing that was: the client's, until the
    // lifecycle gives up on the connections left; the server's from then on.
    #[test]
    fn an_unanswered_span_says_who_gave_up() {
        let spans = Recorder::new();
        let shutdown = lameduck_lifecycle::Shutdown::new();
        judge_by(shutdown.watch());
        spans.open("hung up").end(false);
        shutdown.trigger_handle().trigger("SIGTERM");
        spans.open("hung up while the server drains").end(false);
        shutdown.force_handle().force("second SIGTERM");
        spans.open("dropped by the forced exit").end(false);
        let client = Status::error(CLIENT_WENT_AWAY);
        assert_eq!(
            spans.outcomes(),
            [
                ("hung up".to_owned(), client.clone()),
                ("hung up while the server drains".to_owned(), client),
                (
                    "dropped by the forced exit".to_owned(),
                    Status::error(FORCED)
                ),
            ]
        );
    }
}
