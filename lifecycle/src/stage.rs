//! One connection's way through the shutdown timeline, as a state machine:
//! [`Stage`] is where it stands, [`Event`] what it saw, [`Stage::next`] the
//! whole transition table. The connection task in `serve` only selects the
//! events its stage listens for and applies the table.

use crate::metrics::CloseReason;

/// Where one connection stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stage {
    /// Serving. An HTTP/1 connection stays here through the lame duck: its
    /// next response says `Connection: close`, nothing to do at the signal.
    Serving,
    /// Signalled, or told to close before it carried a request: waiting for
    /// its first request to answer with `Connection: close` or GOAWAY.
    LameDuck,
    /// An HTTP/1 connection told to close (drain spread or age): its next
    /// response says `Connection: close`, and hyper closes it after that;
    /// if none comes, it is closed once it has been idle for `SETTLE`
    /// (at once if it already has). Closing a keep-alive connection just
    /// used would race the request its client may be sending on it.
    Telling,
    /// The drain began before the connection carried a request: it may still
    /// deliver its first one (hyper would drop it while detecting the
    /// protocol, failing a request already on its way).
    AwaitingFirst,
    /// Told to close (`graceful_shutdown`): in-flight requests finish, then
    /// it closes; it may linger only briefly with nothing in flight.
    Closing,
}

/// What the connection task saw.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Event {
    /// Shutdown started (an immediate drain).
    Triggered,
    /// The connection's own moment came: its place in the drain spread, or
    /// its age. Its reason is recorded on the connection.
    Due,
    /// A request arrived on an HTTP/2 connection during the lame duck.
    GoAway,
    /// The listener closed: the drain started.
    Draining,
    /// The first request arrived, or its grace ran out.
    FirstRequestDue,
    /// Nothing in flight for the idle timeout.
    Idle,
}

/// What the connection has shown so far.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Facts {
    /// It speaks HTTP/2.
    pub(crate) http2: bool,
    /// It has carried a request.
    pub(crate) served: bool,
}

impl Stage {
    /// The transition table.
    pub(crate) fn next(self, event: Event, facts: Facts) -> Stage {
        use {Event::*, Stage::*};
        match (self, event) {
            (Serving, Triggered) if facts.http2 && facts.served => Closing,
            (Serving, Triggered) => LameDuck,
            (Serving, Due) if !facts.served => LameDuck,
            (Serving, Due) if facts.http2 => Closing,
            (Serving, Due) => Telling,
            (LameDuck, GoAway) => Closing,
            (Serving | LameDuck | Telling, Draining) if facts.served => Closing,
            (Serving | LameDuck, Draining) => AwaitingFirst,
            (AwaitingFirst, FirstRequestDue) => Closing,
            (Serving | LameDuck | AwaitingFirst | Telling, Idle) => Closing,
            (stage, _) => stage,
        }
    }

    /// Whether the task listens for `event` in this stage (`http1`: the
    /// connection is known to speak HTTP/1, which has nothing to do at the
    /// signal). Every poll polls each listened-for event, so a serving
    /// connection listens for few.
    pub(crate) fn listens(self, event: Event, http1: bool) -> bool {
        use {Event::*, Stage::*};
        match event {
            Triggered => self == Serving && !http1,
            Due => self == Serving,
            GoAway => self == LameDuck,
            Draining => matches!(self, Serving | LameDuck | Telling),
            FirstRequestDue => self == AwaitingFirst,
            Idle => self != Closing,
        }
    }

    /// Why the server closes a connection when `event` takes it to
    /// `Closing`, unless it had a reason already.
    pub(crate) fn reason(event: Event) -> CloseReason {
        match event {
            Event::Idle => CloseReason::Idle,
            _ => CloseReason::Drain,
        }
    }

    /// Whether the task watches for the connections to be abandoned: only
    /// once the timeline has reached this connection.
    pub(crate) fn watches_abandon(self) -> bool {
        self != Stage::Serving
    }
}

#[cfg(test)]
mod tests {
    use super::{Event::*, Facts, Stage::*};

    const FRESH: Facts = Facts {
        http2: false,
        served: false,
    };
    const H1: Facts = Facts {
        http2: false,
        served: true,
    };
    const H2: Facts = Facts {
        http2: true,
        served: true,
    };

    #[test]
    fn a_served_http2_connection_is_told_to_go_away_at_the_signal() {
        assert_eq!(Serving.next(Triggered, H2), Closing);
        // A fresh one waits for its first request's GOAWAY.
        assert_eq!(Serving.next(Triggered, FRESH), LameDuck);
        assert_eq!(LameDuck.next(GoAway, FRESH), Closing);
    }

    #[test]
    fn an_http1_connection_sleeps_through_the_lame_duck_and_closes_at_the_drain() {
        assert!(!Serving.listens(Triggered, true));
        assert!(Serving.listens(Draining, true));
        assert_eq!(Serving.next(Draining, H1), Closing);
    }

    #[test]
    fn a_connection_without_a_request_gets_its_first_at_the_drain() {
        assert_eq!(Serving.next(Draining, FRESH), AwaitingFirst);
        assert_eq!(LameDuck.next(Draining, FRESH), AwaitingFirst);
        assert!(AwaitingFirst.listens(FirstRequestDue, false));
        assert_eq!(AwaitingFirst.next(FirstRequestDue, H1), Closing);
    }

    #[test]
    fn closing_is_final_and_only_it_stops_listening_for_idleness() {
        for event in [Triggered, Due, GoAway, Draining, FirstRequestDue, Idle] {
            assert_eq!(Closing.next(event, H2), Closing);
            assert!(!Closing.listens(event, false));
        }
        for stage in [Serving, LameDuck, AwaitingFirst, Telling] {
            assert_eq!(stage.next(Idle, H1), Closing);
        }
    }

    #[test]
    fn a_connection_whose_moment_came_is_told_by_goaway_or_its_next_answer() {
        // HTTP/2: GOAWAY now, its streams finish.
        assert_eq!(Serving.next(Due, H2), Closing);
        // HTTP/1: its next response says `Connection: close`; or it is
        // closed once idle a moment, or at the drain.
        assert_eq!(Serving.next(Due, H1), Telling);
        assert!(Telling.listens(Idle, true) && Telling.listens(Draining, true));
        assert_eq!(Telling.next(Idle, H1), Closing);
        assert_eq!(Telling.next(Draining, H1), Closing);
        // One that never carried a request answers its first with it.
        assert_eq!(Serving.next(Due, FRESH), LameDuck);
        assert!(!LameDuck.listens(Due, false) && !Telling.listens(Due, true));
    }

    #[test]
    fn abandonment_is_watched_only_once_the_timeline_reached_the_connection() {
        assert!(!Serving.watches_abandon());
        assert!([LameDuck, AwaitingFirst, Telling, Closing]
            .iter()
            .all(|s| s.watches_abandon()));
    }
}
