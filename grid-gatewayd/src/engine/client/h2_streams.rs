//! An HTTP/2 connection's streams polled by the connection's own task, not spawned.
//!
//! hyper's HTTP/2 server hands each new stream (the request's handling and the sending of
//! its answer) to an executor. With tokio's, every request would be a task of its own:
//! its allocation and scheduling, and a hand-over between two tasks each time the stream
//! queues a frame for the connection or the connection delivers one to the stream
//! (`docs/benchmarks.md` has the cost). Here the executor ([`StreamQueue`]) only queues
//! the stream, and [`Served`] polls the connection and its streams together, as nginx and
//! Envoy do (a connection and all of its streams live on one worker thread). The
//! trade-off is the same as theirs: the streams of one connection share one thread, while
//! connections still spread over every worker.
//!
//! A stream lives until hyper's future for it ends (answer sent, or the stream reset);
//! when the connection itself ends, whatever is left of its streams is dropped with it,
//! which cancels their work on the sites as a client leaving an HTTP/1.1 connection does.
//! A stream its client stops taking its answer from ends earlier, at the write bound
//! (`write_bound::Watched`, which wraps each stream's future here).

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;

use futures::StreamExt as _;
use futures::stream::FuturesUnordered;

use crate::engine::client::write_bound::{StreamProgress, Watched};
use crate::engine::timers::when_woken::WhenWoken;

/// One stream's future, as hyper hands it over.
type StreamFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The executor given to hyper's HTTP/2 server for one connection: it queues each new
/// stream for [`Served`] to poll, wrapped in the write bound when it has one.
#[derive(Clone, Default)]
pub(crate) struct StreamQueue {
    queued: Arc<Mutex<Queued>>,
    /// The write bound (`clientWriteTimeoutSeconds`) and where a stream cut at it is
    /// counted.
    bound: Option<(Duration, Counter)>,
}

/// Streams handed over and not yet polled, and the progress of the stream to come.
#[derive(Default)]
struct Queued {
    streams: Vec<StreamFuture>,
    next: Option<Arc<StreamProgress>>,
}

impl std::fmt::Debug for StreamQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamQueue").finish_non_exhaustive()
    }
}

impl<F> hyper::rt::Executor<F> for StreamQueue
where
    F: Future<Output = ()> + Send + 'static,
{
    fn execute(&self, stream: F) {
        let mut queued = self.lock();
        let watched = queued.next.take().zip(self.bound.as_ref());
        let stream: StreamFuture = match watched {
            Some((progress, (bound, reset))) => {
                Box::pin(Watched::new(stream, progress, *bound, reset.clone()))
            }
            None => Box::pin(stream),
        };
        queued.streams.push(stream);
    }
}

impl StreamQueue {
    /// A queue whose streams are each ended once their client has taken nothing of their
    /// answer for `bound`, counted on `reset`.
    pub(crate) fn bounded(bound: Duration, reset: Counter) -> Self {
        Self {
            queued: Arc::default(),
            bound: Some((bound, reset)),
        }
    }

    /// The progress the answer of the stream hyper is handing over reports to, called by
    /// the service as it takes the stream's request. hyper hands each new stream to the
    /// service and then, at once, its future to the executor (`execute`), which takes
    /// this: one stream at a time, on the connection's task.
    pub(crate) fn progress_of_next(&self) -> Option<Arc<StreamProgress>> {
        self.bound.as_ref()?;
        let progress = Arc::new(StreamProgress::default());
        self.lock().next = Some(Arc::clone(&progress));
        Some(progress)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Queued> {
        // A panic while pushing leaves a valid Vec: the queue is still usable.
        self.queued.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The most times one poll of [`Served`] goes round (connection, then streams) while the
/// connection keeps being woken: past it the task yields, so a connection that wakes
/// itself to yield (its cooperative budget spent) does not spin.
pub(crate) const MAX_TURNS: usize = 8;

/// A connection's future and its streams, polled together by one task.
pub(crate) struct Served<C> {
    /// Polled only when it was woken: its wakers are its own, not the task's, so a
    /// stream queueing a frame has the connection alone polled again, in the same turn
    /// when that happens during [`Served::poll`].
    conn: WhenWoken<C>,
    queue: StreamQueue,
    running: FuturesUnordered<StreamFuture>,
}

impl<C: Future> Served<C> {
    /// `conn`, whose server was built with `queue` as its executor.
    pub(crate) fn new(conn: C, queue: StreamQueue) -> Self {
        Self {
            conn: WhenWoken::new(conn),
            queue,
            running: FuturesUnordered::new(),
        }
    }

    /// The connection, to ask it to shut down gracefully. It is polled next time.
    pub(crate) fn conn(&mut self) -> Pin<&mut C> {
        self.conn.inner()
    }

    /// Streams in flight: queued by the connection or being polled.
    #[cfg(test)]
    fn streams(&self) -> usize {
        self.running.len() + self.queue.lock().streams.len()
    }

    /// Polls every stream that is ready, those queued since the last call first.
    fn poll_streams(&mut self, cx: &mut Context<'_>) {
        loop {
            {
                let mut queued = self.queue.lock();
                for stream in queued.streams.drain(..) {
                    self.running.push(stream);
                }
            }
            // Ready(None): no stream left; Pending: none ready (or the set yielded after
            // a long run, having woken this task to come back).
            match self.running.poll_next_unpin(cx) {
                Poll::Ready(Some(())) => {}
                Poll::Ready(None) | Poll::Pending => return,
            }
        }
    }
}

impl<C: Future> Future for Served<C> {
    type Output = C::Output;

    /// The connection when it was woken (it may have opened streams), then the streams
    /// that are ready (they may have queued frames, waking the connection), round again
    /// while the connection was woken, at most [`MAX_TURNS`] times. Ends with the
    /// connection, dropping whatever streams are left.
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<C::Output> {
        // Every field is Unpin (the connection is boxed).
        let this = self.get_mut();
        this.conn.flag().polling(true);
        for _ in 0..MAX_TURNS {
            // Not woken: not even asked (its poll would register this task again, which
            // it still is: only a wake of the connection, which sets the flag, takes it).
            if this.conn.flag().is_set()
                && let Poll::Ready(ended) = Pin::new(&mut this.conn).poll(cx)
            {
                this.conn.flag().polling(false);
                return Poll::Ready(ended);
            }
            this.poll_streams(cx);
            let flag = this.conn.flag();
            if !flag.is_set() {
                flag.polling(false);
                if !flag.is_set() {
                    return Poll::Pending;
                }
                flag.polling(true);
            }
        }
        // Still woken: yield to the other tasks, and come back.
        this.conn.flag().polling(false);
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::rt::Executor as _;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::task::Waker;

    /// What a test holds of its fake connection.
    #[derive(Default)]
    struct Remote {
        /// Streams to open at the next poll.
        opens: AtomicUsize,
        /// Streams that ran to their end.
        done: AtomicUsize,
        /// The connection ends at its next poll.
        end: AtomicBool,
        /// Polls of the connection.
        polls: AtomicUsize,
        /// The waker the connection was last polled with.
        waker: Mutex<Option<Waker>>,
        /// The connection wakes itself at each poll (as one whose budget ran out).
        wake_self: AtomicBool,
    }

    impl Remote {
        /// As the socket would: wakes the connection.
        fn wake(&self) {
            if let Some(w) = self.waker.lock().unwrap().take() {
                w.wake();
            }
        }
    }

    /// A connection that opens the streams asked of it, each needing three polls (woken
    /// at once after each of the first two), and ends when told.
    struct FakeConn {
        queue: StreamQueue,
        remote: Arc<Remote>,
    }

    impl Future for FakeConn {
        type Output = &'static str;

        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<&'static str> {
            let remote = &self.remote;
            remote.polls.fetch_add(1, Ordering::SeqCst);
            *remote.waker.lock().unwrap() = Some(cx.waker().clone());
            for _ in 0..remote.opens.swap(0, Ordering::SeqCst) {
                let remote = Arc::clone(remote);
                let mut polls = 0;
                self.queue.execute(std::future::poll_fn(move |cx| {
                    polls += 1;
                    if polls < 3 {
                        cx.waker().wake_by_ref();
                        return Poll::Pending;
                    }
                    remote.done.fetch_add(1, Ordering::SeqCst);
                    Poll::Ready(())
                }));
            }
            if remote.end.load(Ordering::SeqCst) {
                return Poll::Ready("ended");
            }
            if remote.wake_self.load(Ordering::SeqCst) {
                cx.waker().wake_by_ref();
            }
            Poll::Pending
        }
    }

    fn served() -> (Served<FakeConn>, Arc<Remote>) {
        let queue = StreamQueue::default();
        let remote = Arc::new(Remote::default());
        let conn = FakeConn {
            queue: queue.clone(),
            remote: Arc::clone(&remote),
        };
        (Served::new(conn, queue), remote)
    }

    #[tokio::test]
    async fn streams_a_connection_opens_run_to_their_end_on_its_task() {
        let (mut s, remote) = served();
        remote.opens.store(3, Ordering::SeqCst);
        // Bounded: each stream needs three polls, and every turn polls at least one.
        for _ in 0..20 {
            assert!(futures::poll!(&mut s).is_pending(), "not ended yet");
            if remote.done.load(Ordering::SeqCst) == 3 {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(remote.done.load(Ordering::SeqCst), 3, "every stream ended");
        assert_eq!(s.streams(), 0);
        remote.end.store(true, Ordering::SeqCst);
        remote.wake();
        assert_eq!(futures::poll!(&mut s), Poll::Ready("ended"));
    }

    #[tokio::test]
    async fn the_connection_is_polled_only_when_it_was_woken() {
        let (mut s, remote) = served();
        assert!(futures::poll!(&mut s).is_pending());
        assert_eq!(remote.polls.load(Ordering::SeqCst), 1, "the first poll");
        // Streams woken, the connection not: only the streams are polled.
        remote.opens.store(1, Ordering::SeqCst);
        assert!(futures::poll!(&mut s).is_pending());
        assert_eq!(remote.polls.load(Ordering::SeqCst), 1, "not woken");
        remote.wake();
        assert!(futures::poll!(&mut s).is_pending());
        assert_eq!(
            remote.polls.load(Ordering::SeqCst),
            2,
            "woken once, polled once"
        );
        assert_eq!(s.streams(), 1, "opened");
    }

    #[tokio::test]
    async fn a_connection_woken_while_its_streams_run_is_polled_again_in_the_same_turn() {
        let (mut s, remote) = served();
        assert!(futures::poll!(&mut s).is_pending());
        // A stream that wakes the connection, as queueing a frame does.
        let r = Arc::clone(&remote);
        s.queue.execute(async move { r.wake() });
        assert!(futures::poll!(&mut s).is_pending());
        assert_eq!(
            remote.polls.load(Ordering::SeqCst),
            2,
            "polled after the stream"
        );
    }

    #[tokio::test]
    async fn a_connection_that_keeps_waking_itself_yields_after_max_turns() {
        let (mut s, remote) = served();
        remote.wake_self.store(true, Ordering::SeqCst);
        let woken = Arc::new(AtomicUsize::new(0));
        let task = Waker::from(Arc::new(CountWakes(Arc::clone(&woken))));
        let polled = Pin::new(&mut s).poll(&mut Context::from_waker(&task));
        assert!(polled.is_pending(), "yields, not spins");
        assert_eq!(remote.polls.load(Ordering::SeqCst), MAX_TURNS);
        assert_eq!(woken.load(Ordering::SeqCst), 1, "and asks to come back");
    }

    /// A task waker that counts its wakes.
    struct CountWakes(Arc<AtomicUsize>);

    impl std::task::Wake for CountWakes {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[tokio::test]
    async fn streams_left_when_the_connection_ends_are_dropped_with_it() {
        let (mut s, remote) = served();
        remote.opens.store(2, Ordering::SeqCst);
        assert!(futures::poll!(&mut s).is_pending());
        assert_eq!(s.streams(), 2, "opened and polled once");
        remote.end.store(true, Ordering::SeqCst);
        remote.wake();
        assert_eq!(futures::poll!(&mut s), Poll::Ready("ended"));
        assert_eq!(remote.done.load(Ordering::SeqCst), 0, "never finished");
    }
}
