//! [`Handover`]: the parties outside the process that take part in its
//! timeline — a service manager told when it is ready and when it stops, a
//! process it replaced and waits for, a successor it hands its sockets to.
//!
//! The lifecycle knows none of them: it calls a `Handover` at the two
//! moments they care about. The `lameduck-handoff` crate beside this one is
//! the `Handover` of systemd's notifications and the in-place upgrade; a
//! lifecycle without one serves and stops on its own.

use std::io;
use std::os::fd::OwnedFd;

use futures_util::future::BoxFuture;

use crate::{Trigger, Watch};

/// Someone outside the process that takes part in its timeline; given to
/// [`Lifecycle::with_handover`](crate::Lifecycle::with_handover).
pub trait Handover: Send + 'static {
    /// Serving starts on `sockets` — the service's listener, then the admin
    /// socket's if there is one — or could not be given them (a failed
    /// `dup`). Say so to whoever waits for it, and return what runs beside
    /// the serving: a future that ends with the pid of a successor this
    /// process handed its sockets to (after triggering the shutdown with
    /// `trigger`), or with `None` once the shutdown was triggered for any
    /// other reason. Dropped, unfinished, when the timeline ends.
    fn serving(
        &mut self,
        sockets: io::Result<Vec<OwnedFd>>,
        watch: &Watch,
        trigger: Trigger,
    ) -> BoxFuture<'static, Option<u32>>;

    /// Everything has stopped and the shutdown was not forced: resolves
    /// when the process may exit (a successor waits for the predecessor it
    /// replaced to finish draining, so that a service manager does not stop
    /// it mid-drain).
    fn exiting(&mut self) -> BoxFuture<'static, ()>;
}
