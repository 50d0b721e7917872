//! SIGTERM and SIGINT, turned into the shutdown timeline: the first starts
//! it, the second forces it.

use std::fmt;
use std::io;

use tokio::signal::unix::{signal, SignalKind};

use super::{Force, Trigger};

/// A signal that asks the process to stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signal {
    /// SIGTERM: what Docker, Kubernetes and systemd send.
    Terminate,
    /// SIGINT: Ctrl-C in a terminal.
    Interrupt,
}

impl fmt::Display for Signal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Signal::Terminate => "SIGTERM",
            Signal::Interrupt => "SIGINT",
        })
    }
}

/// Installed handlers for SIGTERM and SIGINT.
///
/// Install them before anything slow happens at startup: once installed, a
/// signal is queued for [`Signals::recv`] instead of killing the process.
#[derive(Debug)]
pub struct Signals {
    terminate: tokio::signal::unix::Signal,
    interrupt: tokio::signal::unix::Signal,
}

impl Signals {
    /// Installs the handlers.
    ///
    /// # Errors
    /// If the OS refuses to install a handler.
    pub fn install() -> io::Result<Signals> {
        Ok(Signals {
            terminate: signal(SignalKind::terminate())?,
            interrupt: signal(SignalKind::interrupt())?,
        })
    }

    /// Waits for the next signal.
    ///
    /// # Cancel safety
    /// Cancel safe: a signal that arrives while nobody waits is kept.
    pub async fn recv(&mut self) -> Signal {
        tokio::select! {
            Some(()) = self.terminate.recv() => Signal::Terminate,
            Some(()) = self.interrupt.recv() => Signal::Interrupt,
        }
    }
}

/// Forwards signals to the timeline: the first one triggers the shutdown,
/// the next one — a repeated SIGTERM (what `docker stop` and the kubelet
/// send) or a SIGINT — forces it. Returns after forcing.
pub async fn forward(mut signals: Signals, trigger: Trigger, force: Force) {
    let first = signals.recv().await;
    trigger.trigger(first.to_string());
    let second = signals.recv().await;
    force.force(format!("second signal ({second})"));
}
