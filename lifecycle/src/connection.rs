//! Per-connection state shared by a connection's task, its requests and
//! its socket: protocol, activity, and the deadlines derived from them.

use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use hyper::Version;
use tokio::io::AsyncRead;
use tokio::time::Instant;
use tokio_util::io::InspectReader;
use tokio_util::sync::CancellationToken;

use crate::metrics::{CloseReason, LifecycleMetrics, Protocol};
use crate::stage::Facts;
use crate::{Phase, Watch};

/// The client preface that opens every HTTP/2 connection.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The fewest HTTP/2 answers worth a write of their own before the rest of
/// their batch: below it, a second write costs more than it overlaps.
pub(crate) const MIN_HALF_BATCH: usize = 16;

/// What one connection's task, its requests and its socket share.
#[derive(Debug)]
pub(crate) struct ConnState {
    protocol: AtomicU8,
    /// Cancelled when the server wants this HTTP/2 connection to go away
    /// (GOAWAY) before the drain, i.e. during the lame-duck period.
    pub(crate) goaway: CancellationToken,
    /// Cancelled by the connection's first request. Before it, hyper may
    /// still be detecting the protocol (and would drop the connection if
    /// told to shut down), and a client that has just opened it — a load
    /// balancer's fresh HTTP/2 connection — is about to send on it: asking
    /// it to go away now would fail that request.
    pub(crate) first_request: CancellationToken,
    /// Parent of this connection's request tokens (a child of the
    /// server-wide one), so that creating a request's token contends on
    /// this connection's lock, not on one shared by every request. Made
    /// when a request first asks for its token: most connections never do,
    /// and a child token locks its parent when made and when dropped.
    requests: OnceLock<CancellationToken>,
    /// Set once a response went out with `Connection: close`: the server,
    /// not the client, ended this connection.
    pub(crate) close_sent: AtomicBool,
    /// Why the server wants this connection closed ([`CloseReason`] as a
    /// number; 0 while it does not): its next response says so.
    told: AtomicU8,
    /// Every response after the signal says `Connection: close` (an
    /// immediate drain), rather than those after the connection was told.
    close_at_signal: bool,
    /// Requests of this connection not finished yet: from the head until
    /// the response body has been sent (or dropped).
    busy: AtomicUsize,
    /// HTTP/2 answers made since the connection's task last polled the
    /// connection, i.e. not yet handed to a write.
    unwritten: AtomicUsize,
    /// HTTP/2 answer bodies waiting to be taken: just made, or having given
    /// a frame, and since then neither polled nor dropped. hyper sends a
    /// frame only when the client's flow-control window has room for it,
    /// and asks for the next (or drops the body after the last) only then.
    untaken: AtomicUsize,
    /// How many times a body waiting to be taken was taken (or dropped).
    taken: AtomicU64,
    /// When the client started sending a request head while the connection
    /// was not busy, in milliseconds since `born` plus one; 0 when no head
    /// is pending. Starts at accept: a new connection owes its first head.
    head_since: AtomicU64,
    /// When `busy` last fell to zero, in milliseconds since `born`.
    idle_since: AtomicU64,
    born: Instant,
    metrics: LifecycleMetrics,
}

impl ConnState {
    /// A connection just accepted; `close_at_signal`: its responses say
    /// `Connection: close` from the signal on, not from its own moment.
    pub(crate) fn new(metrics: &LifecycleMetrics, close_at_signal: bool) -> ConnState {
        metrics.connection_moved(None, Some(Protocol::Pending));
        ConnState {
            protocol: AtomicU8::new(Protocol::Pending as u8),
            goaway: CancellationToken::new(),
            first_request: CancellationToken::new(),
            requests: OnceLock::new(),
            close_sent: AtomicBool::new(false),
            told: AtomicU8::new(CloseReason::Client as u8),
            close_at_signal,
            busy: AtomicUsize::new(0),
            unwritten: AtomicUsize::new(0),
            untaken: AtomicUsize::new(0),
            taken: AtomicU64::new(0),
            head_since: AtomicU64::new(1),
            idle_since: AtomicU64::new(0),
            born: Instant::now(),
            metrics: metrics.clone(),
        }
    }

    /// A new token for one of this connection's requests: it fires with
    /// the server's request tokens (`shutdown`'s deadline or a forced
    /// shutdown), or when cancelled.
    pub(crate) fn request_token(&self, shutdown: &Watch) -> CancellationToken {
        let requests = self.requests.get_or_init(|| shutdown.request_token());
        requests.child_token()
    }

    /// Records the protocol once a request or the preface reveals it.
    pub(crate) fn observe(&self, version: Version) {
        let protocol = match version {
            Version::HTTP_2 => Protocol::Http2,
            _ => Protocol::Http1,
        };
        let pending = Protocol::Pending as u8;
        let decided = self
            .protocol
            .compare_exchange(pending, protocol as u8, AcqRel, Acquire);
        if decided.is_ok() {
            self.metrics
                .connection_moved(Some(Protocol::Pending), Some(protocol));
        }
    }

    pub(crate) fn protocol(&self) -> Protocol {
        Protocol::ALL[usize::from(self.protocol.load(Acquire))]
    }

    /// What the connection's next stage depends on.
    pub(crate) fn facts(&self) -> Facts {
        Facts {
            http2: self.protocol() == Protocol::Http2,
            served: self.first_request.is_cancelled(),
        }
    }

    /// The server wants this connection closed, for `why`; the first reason
    /// given is the one kept.
    pub(crate) fn tell(&self, why: CloseReason) {
        let untold = CloseReason::Client as u8;
        let _ = self
            .told
            .compare_exchange(untold, why as u8, AcqRel, Acquire);
    }

    /// Why the server wants this connection closed, if it does.
    pub(crate) fn told(&self) -> Option<CloseReason> {
        CloseReason::from_u8(self.told.load(Acquire)).filter(|&why| why != CloseReason::Client)
    }

    /// Whether a response made in `phase` should close the connection
    /// (HTTP/1: `Connection: close`; HTTP/2: GOAWAY); records the drain as
    /// the reason when it is one. From the drain on, every response does,
    /// whether or not the connection's task has seen the drain yet.
    pub(crate) fn should_close(&self, phase: Phase) -> bool {
        if self.told().is_some() {
            return true;
        }
        let close = phase >= Phase::Draining || (phase > Phase::Running && self.close_at_signal);
        if close {
            self.tell(CloseReason::Drain);
        }
        close
    }

    /// The instant this connection reaches `age`, if it has one.
    pub(crate) fn at_age(&self, age: Option<Duration>) -> Option<Instant> {
        age.map(|age| self.born + age)
    }

    /// Requests of this connection not finished yet.
    pub(crate) fn busy(&self) -> usize {
        self.busy.load(Acquire)
    }

    /// An HTTP/2 answer is ready for the connection to write.
    pub(crate) fn answer_ready(&self) {
        self.unwritten.fetch_add(1, Relaxed);
    }

    /// The connection's task polls the connection, which writes every
    /// answer made so far.
    pub(crate) fn writing(&self) {
        self.unwritten.store(0, Relaxed);
    }

    /// Half of a large batch of HTTP/2 streams has been answered and not
    /// written: a stream about to start should let the connection write
    /// them first, so that the client works on them meanwhile.
    pub(crate) fn half_answered(&self) -> bool {
        let unwritten = self.unwritten.load(Relaxed);
        unwritten >= MIN_HALF_BATCH && unwritten >= self.busy()
    }

    /// An HTTP/2 answer's body waits to be taken.
    pub(crate) fn answer_untaken(&self) {
        self.untaken.fetch_add(1, Relaxed);
    }

    /// hyper took from a body that waited for it, or dropped it.
    pub(crate) fn answer_taken(&self) {
        self.untaken.fetch_sub(1, Relaxed);
        self.taken.fetch_add(1, Relaxed);
    }

    /// Milliseconds since `born`.
    fn now_ms(&self) -> u64 {
        u64::try_from(self.born.elapsed().as_millis()).unwrap_or(u64::MAX / 2)
    }

    fn at_ms(&self, ms: u64) -> Instant {
        self.born + Duration::from_millis(ms)
    }

    /// Bytes arrived from the client. On an idle HTTP/1 (or undecided)
    /// connection they begin a request head, which starts its deadline.
    fn bytes_arrived(&self) {
        if self.busy.load(Acquire) == 0
            && self.head_since.load(Acquire) == 0
            && self.protocol() != Protocol::Http2
        {
            self.head_since.store(self.now_ms() + 1, Release);
        }
    }

    pub(crate) fn request_started(&self) {
        if !self.first_request.is_cancelled() {
            self.first_request.cancel();
        }
        self.busy.fetch_add(1, AcqRel);
        self.head_since.store(0, Release);
    }

    pub(crate) fn request_finished(&self) {
        if self.busy.fetch_sub(1, AcqRel) == 1 {
            self.idle_since.store(self.now_ms(), Release);
        }
    }

    // The deadlines below are kept lazily: nothing wakes the connection's
    // task when a request starts or ends. Each timer sleeps until the
    // earliest instant its deadline could fall on, then looks at what
    // happened meanwhile and either fires or sleeps again, so a request
    // costs a few atomic stores and no wakeup. Since a period that has not
    // begun by `now` cannot end before `now + timeout`, every deadline is
    // still met to the millisecond.

    /// Resolves once this connection has had nothing in flight for
    /// `timeout`, counting from the first poll or the end of the last
    /// request, whichever is later.
    pub(crate) async fn idle_for(&self, timeout: Duration) {
        self.idle_from(self.now_ms(), timeout).await;
    }

    /// Resolves once this connection has had nothing in flight for
    /// `timeout` since its last request (or its accept): at once if it
    /// already has.
    pub(crate) async fn idle_since_last(&self, timeout: Duration) {
        self.idle_from(0, timeout).await;
    }

    async fn idle_from(&self, start: u64, timeout: Duration) {
        let mut at = self.at_ms(start) + timeout;
        loop {
            tokio::time::sleep_until(at).await;
            if self.busy.load(Acquire) > 0 {
                at = Instant::now() + timeout;
                continue;
            }
            let since = self.idle_since.load(Acquire).max(start);
            let deadline = self.at_ms(since) + timeout;
            // Reloaded: a request that came and went meanwhile moved it.
            if deadline <= Instant::now()
                && self.busy.load(Acquire) == 0
                && self.idle_since.load(Acquire).max(start) == since
            {
                return;
            }
            at = deadline.max(Instant::now() + Duration::from_millis(1));
        }
    }

    /// Resolves when the client is overdue: on HTTP/1 (or undecided) a
    /// request head, or the first one counted from accept, taking longer
    /// than `head` to arrive (a slow or silent client); on HTTP/2, whose idle
    /// connections carry frames, answers left untaken for `send`.
    pub(crate) async fn overdue(&self, head: Duration, send: Duration) -> Overdue {
        let mut at = self.born + head;
        loop {
            tokio::time::sleep_until(at).await;
            if self.protocol() == Protocol::Http2 {
                self.answers_untaken(send).await;
                return Overdue::Answers;
            }
            let since = self.head_since.load(Acquire);
            if since == 0 {
                at = Instant::now() + head;
                continue;
            }
            let deadline = self.at_ms(since - 1) + head;
            if deadline <= Instant::now() && self.head_since.load(Acquire) == since {
                return Overdue::Head;
            }
            at = deadline.max(Instant::now() + Duration::from_millis(1));
        }
    }

    /// Resolves once an answer has waited to be taken through a whole
    /// `timeout` in which no answer of this connection was taken: the
    /// client reads its socket but never opens its flow-control window,
    /// which `TCP_USER_TIMEOUT` cannot see. Looked at every `timeout`, so
    /// found within two.
    async fn answers_untaken(&self, timeout: Duration) {
        let mut last_look = None;
        loop {
            tokio::time::sleep(timeout).await;
            let look = (self.untaken.load(Acquire) > 0).then(|| self.taken.load(Acquire));
            if look.is_some() && look == last_look {
                return;
            }
            last_look = look;
        }
    }
}

/// What the client was late with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Overdue {
    /// A request head (HTTP/1).
    Head,
    /// Taking its answers (HTTP/2).
    Answers,
}

impl Drop for ConnState {
    fn drop(&mut self) {
        self.metrics.connection_moved(Some(self.protocol()), None);
    }
}

/// Marks a connection busy from a request's start until its response body
/// is done; dropping it ends that.
#[derive(Debug)]
#[must_use = "dropping the guard marks the request finished"]
pub(crate) struct BusyGuard(pub(crate) Arc<ConnState>);

impl BusyGuard {
    pub(crate) fn new(conn: Arc<ConnState>) -> BusyGuard {
        conn.request_started();
        BusyGuard(conn)
    }
}

impl Drop for BusyGuard {
    fn drop(&mut self) {
        self.0.request_finished();
    }
}

/// The client socket, watched: tells the connection state when bytes
/// arrive (a request head begins) and when they are the HTTP/2 preface.
pub(crate) fn observed<Io: AsyncRead>(
    io: Io,
    conn: Arc<ConnState>,
) -> InspectReader<Io, impl FnMut(&[u8])> {
    // Bytes of the preface seen so far; `None` once decided.
    let mut preface = Some(0);
    InspectReader::new(io, move |bytes: &[u8]| {
        if bytes.is_empty() {
            return; // the end of the stream
        }
        if let Some(seen) = preface {
            let wanted = &H2_PREFACE[seen..];
            let n = wanted.len().min(bytes.len());
            preface = if bytes[..n] != wanted[..n] {
                None
            } else if seen + n == H2_PREFACE.len() {
                conn.observe(Version::HTTP_2);
                None
            } else {
                Some(seen + n)
            };
        }
        conn.bytes_arrived();
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conn() -> ConnState {
        ConnState::new(&LifecycleMetrics::default(), true)
    }

    /// Runs `deadline` alongside the paused clock and returns when it fired,
    /// counted from the test's start.
    async fn fired_after<T>(deadline: impl std::future::Future<Output = T>) -> Duration {
        let start = Instant::now();
        deadline.await;
        start.elapsed()
    }

    // Streams answered one by one, each dropping its guard: the batch of
    // 40 is half answered when the 21st starts, until the connection
    // writes; a batch of `MIN_HALF_BATCH` never is.
    #[test]
    fn a_large_http2_batch_is_half_answered_once_half_its_answers_wait() {
        let conn = Arc::new(conn());
        let batch = |n| {
            (0..n)
                .map(|_| BusyGuard::new(Arc::clone(&conn)))
                .collect::<Vec<_>>()
        };
        let mut first_half_answered = None;
        for (k, stream) in batch(40).into_iter().enumerate() {
            if conn.half_answered() {
                first_half_answered.get_or_insert(k);
            }
            conn.answer_ready();
            drop(stream);
        }
        assert_eq!(first_half_answered, Some(20));
        conn.writing();
        assert!(!conn.half_answered());

        for stream in batch(MIN_HALF_BATCH) {
            assert!(!conn.half_answered());
            conn.answer_ready();
            drop(stream);
        }
    }

    // A response made once the listener closed says so, though the
    // connection's task (queued behind the one that started the drain, or
    // its moment in the spread not come) has not told it yet: its client
    // would otherwise reuse a connection about to close.
    #[test]
    fn from_the_drain_on_every_response_closes_its_connection() {
        let gradual = ConnState::new(&LifecycleMetrics::default(), false);
        assert!(!gradual.should_close(Phase::Running));
        assert!(!gradual.should_close(Phase::LameDuck), "its moment decides");
        assert_eq!(gradual.told(), None);
        assert!(gradual.should_close(Phase::Draining));
        assert_eq!(gradual.told(), Some(CloseReason::Drain));

        let immediate = conn();
        assert!(!immediate.should_close(Phase::Running));
        assert!(immediate.should_close(Phase::LameDuck));
    }

    // The idle deadline counts from the end of the last request, to the
    // millisecond, though nothing wakes the timer when requests come and go.
    #[tokio::test(start_paused = true)]
    async fn the_idle_deadline_counts_from_the_last_request() {
        let conn = conn();
        let timeout = Duration::from_secs(60);
        let requests = async {
            tokio::time::sleep(Duration::from_secs(10)).await;
            conn.request_started();
            tokio::time::sleep(Duration::from_secs(70)).await;
            conn.request_finished();
            std::future::pending::<()>().await;
        };
        let fired = tokio::select! {
            fired = fired_after(conn.idle_for(timeout)) => fired,
            () = requests => unreachable!(),
        };
        assert_eq!(fired, Duration::from_secs(80 + 60));
    }

    // A head owed since accept, then one begun between requests: each is
    // overdue exactly `timeout` after it began; an HTTP/2 connection never.
    #[tokio::test(start_paused = true)]
    async fn the_head_deadline_counts_from_its_first_byte() {
        let timeout = Duration::from_secs(10);
        async fn head_overdue(conn: &ConnState, timeout: Duration) {
            let overdue = conn.overdue(timeout, Duration::from_secs(3600)).await;
            assert_eq!(overdue, Overdue::Head);
        }
        let silent = conn();
        assert_eq!(fired_after(head_overdue(&silent, timeout)).await, timeout);

        let slow = conn();
        let client = async {
            slow.request_started();
            tokio::time::sleep(Duration::from_secs(15)).await;
            slow.request_finished();
            tokio::time::sleep(Duration::from_secs(20)).await;
            slow.bytes_arrived();
            std::future::pending::<()>().await;
        };
        let fired = tokio::select! {
            fired = fired_after(head_overdue(&slow, timeout)) => fired,
            () = client => unreachable!(),
        };
        assert_eq!(fired, Duration::from_secs(15 + 20 + 10));

        let h2 = conn();
        h2.observe(Version::HTTP_2);
        let never = tokio::time::timeout(Duration::from_secs(3600), h2.overdue(timeout, timeout));
        assert!(never.await.is_err());
    }

    // An HTTP/2 answer that waits to be taken through a whole look, and the
    // next, with nothing taken between: overdue, within two sends of the
    // head deadline that tells the protocol. Answers taken now and then,
    // one always waiting, are never overdue.
    #[tokio::test(start_paused = true)]
    async fn an_http2_answer_left_untaken_makes_the_client_overdue() {
        let (head, send) = (Duration::from_secs(10), Duration::from_secs(30));
        let stuck = conn();
        stuck.observe(Version::HTTP_2);
        stuck.answer_untaken();
        let overdue = async { assert_eq!(stuck.overdue(head, send).await, Overdue::Answers) };
        let fired = tokio::time::timeout(Duration::from_secs(3600), fired_after(overdue));
        assert_eq!(fired.await.expect("overdue"), head + send * 2);

        let slow = conn();
        slow.observe(Version::HTTP_2);
        slow.answer_untaken();
        let client = async {
            loop {
                tokio::time::sleep(send / 2).await;
                slow.answer_taken();
                slow.answer_untaken();
            }
        };
        tokio::select! {
            overdue = slow.overdue(head, send) => panic!("{overdue:?} while answers are taken"),
            () = client => unreachable!(),
            () = tokio::time::sleep(Duration::from_secs(3600)) => {}
        }
    }
}
