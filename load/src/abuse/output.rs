//! Reading what slowhttptest leaves behind: its printed output (status
//! reports every 5 s, its exit verdict, a lowered connection target), its
//! colours stripped, and its per-second CSV.

use super::Status;

/// `text` without its ANSI escape sequences (slowhttptest colours its
/// output and clears the screen before each report).
pub(super) fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c != '\u{1b}' {
            out.push(c);
            continue;
        }
        if chars.next() == Some('[') {
            // Parameters and intermediates, then one final byte.
            for next in chars.by_ref() {
                if ('@'..='~').contains(&next) {
                    break;
                }
            }
        }
    }
    out
}

/// What slowhttptest printed.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Printed {
    /// Its status reports, in order.
    pub(super) statuses: Vec<Status>,
    /// Its own final verdict (`Exit status:` line), if it printed one.
    pub(super) exit_status: Option<String>,
    /// The connection count it lowered its target to, if it did.
    pub(super) lowered_to: Option<u32>,
}

/// Parses slowhttptest's output, colours stripped: its status reports
/// (`slow HTTP test status on 10th second:` then `connected: N` …), its
/// `Exit status:` and a lowered connection target.
pub(super) fn parse_output(text: &str) -> Printed {
    let mut printed = Printed::default();
    let mut current: Option<Status> = None;
    let number = |rest: &str| rest.trim().parse::<u64>().ok();
    for line in text.lines() {
        let line = line.trim();
        if let Some(rest) = line.strip_prefix("slow HTTP test status on ") {
            printed.statuses.extend(current.take());
            let second = rest
                .trim_end_matches(|c: char| !c.is_ascii_digit())
                .parse()
                .ok();
            current = second.map(|second| Status {
                second,
                ..Status::default()
            });
        } else if let Some(status) = current.as_mut() {
            if let Some(rest) = line.strip_prefix("pending:") {
                status.pending = number(rest).unwrap_or(0);
            } else if let Some(rest) = line.strip_prefix("connected:") {
                status.connected = number(rest).unwrap_or(0);
            } else if let Some(rest) = line.strip_prefix("error:") {
                status.error = number(rest).unwrap_or(0);
            } else if let Some(rest) = line.strip_prefix("closed:") {
                status.closed = number(rest).unwrap_or(0);
            } else if let Some(rest) = line.strip_prefix("service available:") {
                status.available = rest.trim() == "YES";
                printed.statuses.extend(current.take());
            }
        }
        if let Some(rest) = line.split("Exit status:").nth(1) {
            printed.exit_status = Some(rest.trim().to_owned());
        }
        if let Some(rest) = line.split("Decreasing target connection number to").nth(1) {
            printed.lowered_to = rest.trim().parse().ok();
        }
    }
    printed.statuses.extend(current);
    printed
}

/// slowhttptest's CSV (`Seconds,Closed,Pending,Connected,Service
/// Available`): second → connected.
pub(super) fn parse_csv(text: &str) -> Vec<(u32, u64)> {
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(',').collect();
            Some((
                fields.first()?.trim().parse().ok()?,
                fields.get(3)?.trim().parse().ok()?,
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const PRINTED: &str = "Mon Nov 23 06:14:46 2026:\u{1b}[H\u{1b}[2JMon Nov 23 06:14:46 2026:\n\
        \t\u{1b}[1;36mslowhttptest version 1.8.2\n\
        \u{1b}[0;34mnumber of connections:\u{1b}[1;34m            300\n\
        \u{1b}[0mMon Nov 23 06:14:46 2026:\u{1b}[1;32m\n\
        slow HTTP test status on \u{1b}[0;32m5\u{1b}[1;32mth second:\n\n\
        \u{1b}[1;32minitializing:\u{1b}[1;32m        0\n\
        \u{1b}[1;32mpending:     \u{1b}[1;32m        2\n\
        \u{1b}[1;32mconnected:   \u{1b}[1;32m        298\n\
        \u{1b}[1;32merror:       \u{1b}[1;32m        0\n\
        \u{1b}[1;32mclosed:      \u{1b}[1;32m        7\n\
        \u{1b}[1;32mservice available:\u{1b}[1;32m   \u{1b}[1;32mYES\u{1b}[0m\n\
        \u{1b}[0mMon Nov 23 06:14:54 2026:\u{1b}[0;36m\n\
        Test ended on 13th second\n\
        Exit status:\u{1b}[1;36m No open connections left\n";

    #[test]
    fn slowhttptest_output_is_read_without_its_colours() {
        let printed = parse_output(&strip_ansi(PRINTED));
        assert_eq!(
            printed.statuses,
            vec![Status {
                second: 5,
                pending: 2,
                connected: 298,
                closed: 7,
                error: 0,
                available: true,
            }]
        );
        assert_eq!(
            printed.exit_status.as_deref(),
            Some("No open connections left")
        );
        assert_eq!(printed.lowered_to, None);
    }

    #[test]
    fn a_lowered_target_is_noticed() {
        let text =
            " hit system limit for open fds: 1024. \nDecreasing target connection number to 1018\n";
        assert_eq!(parse_output(text).lowered_to, Some(1018));
    }

    #[test]
    fn slowhttptest_csv_gives_connected_per_second() {
        let csv = "Seconds,Closed,Pending,Connected,Service Available\n0,0,1,0,300\n1,0,1,96,300\n11,95,0,205,300\n";
        assert_eq!(parse_csv(csv), vec![(0, 0), (1, 96), (11, 205)]);
    }
}
