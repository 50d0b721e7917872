//! A future polled only when its own waker fired.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use futures_util::task::AtomicWaker;

/// Polls a future only when it woke, not every time the task it runs in is
/// polled: a connection's task is woken for every request, its timeline
/// events and deadlines seldom. What `FuturesUnordered` does for many
/// futures, for one, without allocating for each new future it is given.
pub(crate) struct WhenWoken {
    flag: Arc<Flag>,
    /// Wakes `flag`: the waker the future is polled with.
    waker: Waker,
}

struct Flag {
    woken: AtomicBool,
    /// The task to wake on the future's behalf.
    task: AtomicWaker,
}

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        self.task.wake();
    }
}

impl WhenWoken {
    pub(crate) fn new() -> WhenWoken {
        let flag = Arc::new(Flag {
            woken: AtomicBool::new(true),
            task: AtomicWaker::new(),
        });
        WhenWoken {
            waker: Waker::from(Arc::clone(&flag)),
            flag,
        }
    }

    /// The next future polled is a new one: polled at once.
    pub(crate) fn renew(&self) {
        self.flag.woken.store(true, Ordering::Release);
    }

    /// Polls `future` if it woke since it was last polled, or is new;
    /// `Pending` otherwise, and the task is woken when it wakes.
    pub(crate) fn poll<F: Future>(
        &self,
        future: Pin<&mut F>,
        cx: &mut Context<'_>,
    ) -> Poll<F::Output> {
        // Registered first: a wake between the two is seen by the swap.
        self.flag.task.register(cx.waker());
        if !self.flag.woken.swap(false, Ordering::AcqRel) {
            return Poll::Pending;
        }
        future.poll(&mut Context::from_waker(&self.waker))
    }
}

#[cfg(test)]
mod tests {
    use std::pin::pin;
    use std::sync::atomic::AtomicUsize;

    use super::*;
    use crate::task::tests::Wakes;

    // Polled at first and after its waker fired, never in between; its
    // wake wakes the task.
    #[test]
    fn a_future_is_polled_only_when_it_woke() {
        let polls = AtomicUsize::new(0);
        let kept = std::sync::Mutex::new(None);
        let mut future = pin!(std::future::poll_fn(|cx| {
            polls.fetch_add(1, Ordering::Relaxed);
            *kept.lock().expect("lock") = Some(cx.waker().clone());
            Poll::<()>::Pending
        }));
        let wakes = Arc::new(Wakes::default());
        let task = Waker::from(Arc::clone(&wakes));
        let mut cx = Context::from_waker(&task);
        let when_woken = WhenWoken::new();
        for _ in 0..3 {
            assert!(when_woken.poll(future.as_mut(), &mut cx).is_pending());
        }
        assert_eq!(polls.load(Ordering::Relaxed), 1, "not woken: polled once");

        let woke = kept.lock().expect("lock").take();
        woke.expect("its waker").wake();
        assert_eq!(wakes.0.load(Ordering::Relaxed), 1, "the task is woken");
        assert!(when_woken.poll(future.as_mut(), &mut cx).is_pending());
        assert_eq!(polls.load(Ordering::Relaxed), 2);

        when_woken.renew();
        assert!(when_woken.poll(future.as_mut(), &mut cx).is_pending());
        assert_eq!(polls.load(Ordering::Relaxed), 3, "a new future is polled");
    }
}
