//! A future polled only once it asked to be.
//!
//! A connection's task waits on its traffic and, beside it, on rare events: its
//! watchdog's timer, the listener draining. `select!` polls every branch each time the
//! task wakes, and the task wakes for every read and write of every request, so the rare
//! branches would be polled twice or more per answer for nothing: a timer's poll, a watch
//! channel's lock and notification list (`docs/benchmarks.md` has the cost). [`WhenWoken`]
//! gives its future a waker of its own, and polls it only after that waker fired (and the
//! first time, so it can register).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Waker};

use futures::task::AtomicWaker;

/// Whether a future was woken since it was last polled: the waker given to that future
/// (not the task's), and what tells its owner to poll it. A wake also wakes the owning
/// task, unless the owner said it is polling now ([`WakeFlag::polling`]) and will look
/// at the flag again before it returns (`h2_streams` does, to poll a connection again
/// in the same turn instead of a turn later).
#[derive(Debug)]
pub(crate) struct WakeFlag {
    woken: AtomicBool,
    polling: AtomicBool,
    task: AtomicWaker,
}

impl WakeFlag {
    /// A flag set at first (the future must be polled once to register), and its waker.
    pub(crate) fn new() -> (Arc<Self>, Waker) {
        let flag = Arc::new(Self {
            woken: AtomicBool::new(true),
            polling: AtomicBool::new(false),
            task: AtomicWaker::new(),
        });
        let waker = Waker::from(Arc::clone(&flag));
        (flag, waker)
    }

    /// Remembers the task to wake; registered before the flag is read, so a wake after
    /// the read wakes it.
    pub(crate) fn register(&self, task: &Waker) {
        self.task.register(task);
    }

    /// Whether a wake came since the last call (and clears it).
    pub(crate) fn take(&self) -> bool {
        self.woken.swap(false, Ordering::SeqCst)
    }

    /// Sets the flag, as a wake would, without waking the task.
    pub(crate) fn set(&self) {
        self.woken.store(true, Ordering::SeqCst);
    }

    /// Whether a wake came that [`WakeFlag::take`] has not cleared.
    pub(crate) fn is_set(&self) -> bool {
        self.woken.load(Ordering::SeqCst)
    }

    /// While `on`, a wake only sets the flag: the owner is polling and looks again.
    /// `SeqCst` here and in the wake: one side always sees the other's store, so a wake
    /// is never lost between the owner's last look and its `Pending`.
    pub(crate) fn polling(&self, on: bool) {
        self.polling.store(on, Ordering::SeqCst);
    }
}

impl std::task::Wake for WakeFlag {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::SeqCst);
        if !self.polling.load(Ordering::SeqCst) {
            self.task.wake();
        }
    }
}

/// `F`, polled only when its own waker fired since it was last polled.
pub(crate) struct WhenWoken<F> {
    inner: Pin<Box<F>>,
    flag: Arc<WakeFlag>,
    /// `flag` as a waker, made once.
    waker: Waker,
}

impl<F: Future> WhenWoken<F> {
    /// `inner`, polled at the first poll and then only when woken.
    pub(crate) fn new(inner: F) -> Self {
        let (flag, waker) = WakeFlag::new();
        Self {
            inner: Box::pin(inner),
            flag,
            waker,
        }
    }
}

impl<F> WhenWoken<F> {
    /// The flag its waker sets: for an owner that polls it in a loop of its own.
    pub(crate) fn flag(&self) -> &WakeFlag {
        &self.flag
    }

    /// The future itself, to call its methods (polled at the next poll: the flag is set).
    pub(crate) fn inner(&mut self) -> Pin<&mut F> {
        self.flag.set();
        self.inner.as_mut()
    }
}

impl<F: Future> Future for WhenWoken<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        // Every field is Unpin (the future is boxed).
        let this = self.get_mut();
        this.flag.register(cx.waker());
        if !this.flag.take() {
            return Poll::Pending;
        }
        this.inner
            .as_mut()
            .poll(&mut Context::from_waker(&this.waker))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use std::sync::atomic::AtomicUsize;

    /// A future that counts its polls, keeps its last waker, and ends when told.
    #[derive(Default)]
    struct Probe {
        polls: AtomicUsize,
        waker: Mutex<Option<Waker>>,
        done: AtomicBool,
    }

    fn probed() -> (Arc<Probe>, impl Future<Output = ()>) {
        let probe = Arc::new(Probe::default());
        let p = Arc::clone(&probe);
        let fut = std::future::poll_fn(move |cx| {
            p.polls.fetch_add(1, Ordering::SeqCst);
            *p.waker.lock().unwrap() = Some(cx.waker().clone());
            if p.done.load(Ordering::SeqCst) {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        });
        (probe, fut)
    }

    #[tokio::test]
    async fn the_inner_future_is_polled_first_and_then_only_after_its_waker_fired() {
        let (probe, fut) = probed();
        let mut w = WhenWoken::new(fut);
        assert!(futures::poll!(&mut w).is_pending());
        assert_eq!(probe.polls.load(Ordering::SeqCst), 1, "the first poll");
        for _ in 0..3 {
            assert!(futures::poll!(&mut w).is_pending());
        }
        assert_eq!(
            probe.polls.load(Ordering::SeqCst),
            1,
            "not woken: not polled"
        );
        probe.done.store(true, Ordering::SeqCst);
        let waker = probe.waker.lock().unwrap().take().unwrap();
        waker.wake();
        assert_eq!(futures::poll!(&mut w), Poll::Ready(()));
        assert_eq!(
            probe.polls.load(Ordering::SeqCst),
            2,
            "woken once, polled once"
        );
    }

    #[tokio::test]
    async fn a_wake_of_the_inner_future_wakes_the_task_that_polls_it() {
        let (probe, fut) = probed();
        let w = WhenWoken::new(fut);
        let task = tokio::spawn(w);
        // The spawned task polls once and parks; the inner wake must bring it back.
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
        while probe.waker.lock().unwrap().is_none() {
            assert!(tokio::time::Instant::now() < deadline, "never polled");
            tokio::task::yield_now().await;
        }
        probe.done.store(true, Ordering::SeqCst);
        let waker = probe.waker.lock().unwrap().take().unwrap();
        waker.wake();
        tokio::time::timeout(std::time::Duration::from_secs(5), task)
            .await
            .expect("the task was woken and ended")
            .unwrap();
    }
}
