//! What happened to one request, in the classes the harness reports.

use std::error::Error as StdError;
use std::io;

use serde::Serialize;

/// The fate of one request. Every class but [`Fate::Success`] is a failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Fate {
    /// The expected status (307 for a redirect, 201 for a creation).
    Success,
    /// The TCP connection was refused.
    Refused,
    /// The connection was reset, the pipe broke, or it closed before the
    /// response was complete (on HTTP/2: the stream or connection was reset).
    Reset,
    /// No complete response within the request timeout.
    Timeout,
    /// A 5xx status (the balancer's 502/503/504 included).
    Http5xx,
    /// Any other status than the expected one.
    UnexpectedStatus,
    /// A client error that fits none of the classes above.
    OtherError,
}

impl Fate {
    /// Every class, in report order.
    pub const ALL: [Fate; 7] = [
        Fate::Success,
        Fate::Refused,
        Fate::Reset,
        Fate::Timeout,
        Fate::Http5xx,
        Fate::UnexpectedStatus,
        Fate::OtherError,
    ];

    /// The failure classes, in report order.
    pub const FAILURES: [Fate; 6] = [
        Fate::Refused,
        Fate::Reset,
        Fate::Timeout,
        Fate::Http5xx,
        Fate::UnexpectedStatus,
        Fate::OtherError,
    ];

    /// The class's name in tables and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Fate::Success => "success",
            Fate::Refused => "refused",
            Fate::Reset => "reset",
            Fate::Timeout => "timeout",
            Fate::Http5xx => "http_5xx",
            Fate::UnexpectedStatus => "unexpected_status",
            Fate::OtherError => "other_error",
        }
    }

    /// Index into [`Fate::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// `true` for every class but success.
    pub fn is_failure(self) -> bool {
        self != Fate::Success
    }

    /// The fate of a response with `status` where `expected` was wanted.
    pub fn of_status(status: u16, expected: u16) -> Fate {
        if status == expected {
            Fate::Success
        } else if (500..600).contains(&status) {
            Fate::Http5xx
        } else {
            Fate::UnexpectedStatus
        }
    }

    /// Classifies a client error by walking its cause chain: the first I/O
    /// error kind or hyper condition that names a class wins.
    pub fn of_error(error: &(dyn StdError + 'static)) -> Fate {
        let mut cause: Option<&(dyn StdError + 'static)> = Some(error);
        while let Some(current) = cause {
            if let Some(io) = current.downcast_ref::<io::Error>() {
                if let Some(fate) = Fate::of_io(io) {
                    return fate;
                }
            }
            if let Some(hyper) = current.downcast_ref::<hyper::Error>() {
                if hyper.is_timeout() {
                    return Fate::Timeout;
                }
                if hyper.is_incomplete_message() || hyper.is_closed() || hyper.is_canceled() {
                    return Fate::Reset;
                }
                // An HTTP/2 RST_STREAM or GOAWAY: the HTTP/2 form of a reset.
                // Its h2 cause carries no I/O kind, so look no further.
                if hyper.to_string().starts_with("http2 error") {
                    return Fate::Reset;
                }
            }
            cause = current.source();
        }
        Fate::OtherError
    }

    /// The class of an I/O error kind, if it names one.
    pub fn of_io(error: &io::Error) -> Option<Fate> {
        match error.kind() {
            io::ErrorKind::ConnectionRefused => Some(Fate::Refused),
            io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::UnexpectedEof => Some(Fate::Reset),
            io::ErrorKind::TimedOut => Some(Fate::Timeout),
            _ => None,
        }
    }
}

/// Counts of requests by fate.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FateCounts(pub [u64; 7]);

impl FateCounts {
    /// Counts one more `fate`.
    pub fn add(&mut self, fate: Fate) {
        self.0[fate.index()] += 1;
    }

    /// The count of `fate`.
    pub fn get(&self, fate: Fate) -> u64 {
        self.0[fate.index()]
    }

    /// Every request counted.
    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }

    /// Every request that did not succeed.
    pub fn failed(&self) -> u64 {
        self.total() - self.get(Fate::Success)
    }
}

impl Serialize for FateCounts {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(Some(Fate::ALL.len() + 2))?;
        map.serialize_entry("total", &self.total())?;
        map.serialize_entry("failed", &self.failed())?;
        for fate in Fate::ALL {
            map.serialize_entry(fate.as_str(), &self.get(fate))?;
        }
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_are_classified_against_the_expected_one() {
        assert_eq!(Fate::of_status(307, 307), Fate::Success);
        assert_eq!(Fate::of_status(503, 307), Fate::Http5xx);
        assert_eq!(Fate::of_status(404, 307), Fate::UnexpectedStatus);
    }

    #[test]
    fn io_errors_are_found_in_the_cause_chain() {
        #[derive(Debug)]
        struct Wrapper(io::Error);
        impl std::fmt::Display for Wrapper {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("wrapped")
            }
        }
        impl StdError for Wrapper {
            fn source(&self) -> Option<&(dyn StdError + 'static)> {
                Some(&self.0)
            }
        }
        let refused = Wrapper(io::Error::from(io::ErrorKind::ConnectionRefused));
        assert_eq!(Fate::of_error(&refused), Fate::Refused);
        let reset = Wrapper(io::Error::from(io::ErrorKind::BrokenPipe));
        assert_eq!(Fate::of_error(&reset), Fate::Reset);
        let other = Wrapper(io::Error::other("strange"));
        assert_eq!(Fate::of_error(&other), Fate::OtherError);
    }
}
