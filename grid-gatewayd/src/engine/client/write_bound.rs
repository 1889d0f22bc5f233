//! The bound on writes to a client that stops reading (`clientWriteTimeoutSeconds`).
//!
//! Every other wait of a request is on the site, or on the client sending its request.
//! This one is on the client taking its answer: a client that stops reading (its TCP
//! receive window shut, or an HTTP/2 stream held at a zero flow-control window) would
//! otherwise keep its answer, the site's generation behind it and one of the site's
//! slots (`maxConnectionsPerSite`) for as long as it stays connected. The site's own
//! silence bound cannot notice: while the gateway waits on the client it does not ask the
//! site for more, and an HTTP/2 client answers pings however little it reads.
//!
//! The bound counts from the moment a write can make no progress and starts over with
//! every byte the client takes: a slow client that keeps reading is never cut, one that
//! takes nothing for the bound is. While writes go through it costs nothing: no clock is
//! read and no timer made until a write is refused.
//!
//! - **HTTP/1.1** ([`write_all_within`]): the gateway's own server writes every batch of
//!   an answer through it. Past the bound the write fails with [`ClientStalled`]; the
//!   answer's body is dropped (which cancels the site's work and frees its slot) and the
//!   connection is closed, counted as
//!   `grid_gateway_connections_closed_total{reason="write_timeout"}`.
//! - **HTTP/2** ([`StreamProgress`], [`Watched`]): hyper sends each stream's answer,
//!   polling its body only while the stream and the connection have window left. The
//!   body records whether its last poll gave a frame (so hyper holds it, waiting for the
//!   client) or found the site with nothing ready; the stream's future is wrapped so
//!   that, when it is left waiting on the client, a timer runs. Past the bound the
//!   stream's future is dropped: h2 resets the stream (`RST_STREAM`, `CANCEL`), its body
//!   goes with it (cancelling the site's work, freeing its slot), and it is counted as
//!   `grid_gateway_streams_reset_total{reason="write_timeout"}`. The connection and its
//!   other streams go on.

use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use tokio::io::AsyncWrite;
use tokio::time::Instant;

use crate::engine::timers::deadline_timer::DeadlineTimer;

/// A client took none of its answer for the bound.
#[derive(Debug, thiserror::Error)]
#[error("the client took nothing of its answer for {0:?}")]
pub(crate) struct ClientStalled(pub(crate) Duration);

/// Whether `error` is a write that ran out of [`write_all_within`]'s bound.
pub(crate) fn is_client_stalled(error: &std::io::Error) -> bool {
    error
        .get_ref()
        .is_some_and(<dyn std::error::Error + Send + Sync>::is::<ClientStalled>)
}

/// Writes all of `buf` to `io`, failing with [`ClientStalled`] (as an I/O `TimedOut`)
/// once a write has made no progress for `bound`. `timer` is the connection's, kept
/// across its writes: it is made only the first time a write has to wait.
pub(crate) async fn write_all_within<W: AsyncWrite + Unpin>(
    io: &mut W,
    buf: &[u8],
    bound: Duration,
    timer: &mut DeadlineTimer,
) -> std::io::Result<()> {
    let mut written = 0;
    // Set when a write is first refused, cleared by every byte taken.
    let mut deadline: Option<Instant> = None;
    poll_fn(|cx| {
        while written < buf.len() {
            match Pin::new(&mut *io).poll_write(cx, &buf[written..]) {
                Poll::Ready(Ok(0)) => {
                    return Poll::Ready(Err(std::io::ErrorKind::WriteZero.into()));
                }
                Poll::Ready(Ok(n)) => {
                    written += n;
                    deadline = None;
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => {
                    let at = *deadline.get_or_insert_with(|| Instant::now() + bound);
                    if timer.poll_passed(cx, at).is_ready() {
                        return Poll::Ready(Err(std::io::Error::new(
                            std::io::ErrorKind::TimedOut,
                            ClientStalled(bound),
                        )));
                    }
                    return Poll::Pending;
                }
            }
        }
        Poll::Ready(Ok(()))
    })
    .await
}

/// No answer yet: the request is being handled (its waits are the site's bounds).
const HANDLING: u8 = 0;
/// The body's last poll found the site with nothing ready: the site's silence bound runs.
const AWAITING_SITE: u8 = 1;
/// The answer's head is out and its body either gave a frame that hyper holds or was not
/// polled yet: whatever the stream waits for, it is not the site.
const AWAITING_CLIENT: u8 = 2;

/// How one HTTP/2 stream's answer is moving: written by its body (the connection's
/// `Guarded`), read by the [`Watched`] wrapper of the stream's future, both on the
/// connection's task.
#[derive(Debug)]
pub(crate) struct StreamProgress {
    /// Frames the body handed to hyper: progress the client made room for.
    frames: AtomicU64,
    state: AtomicU8,
}

impl Default for StreamProgress {
    fn default() -> Self {
        Self {
            frames: AtomicU64::new(0),
            state: AtomicU8::new(HANDLING),
        }
    }
}

impl StreamProgress {
    /// The answer's head is ready and its body is hyper's to send.
    pub(crate) fn answering(&self) {
        self.state.store(AWAITING_CLIENT, Ordering::Relaxed);
    }

    /// What a poll of the answer's body gave: `Some(true)` a frame (or its end),
    /// `Some(false)` nothing yet from the site.
    pub(crate) fn polled(&self, gave_frame: bool) {
        if gave_frame {
            self.frames.fetch_add(1, Ordering::Relaxed);
            self.state.store(AWAITING_CLIENT, Ordering::Relaxed);
        } else {
            self.state.store(AWAITING_SITE, Ordering::Relaxed);
        }
    }

    /// The frames handed on so far, when the stream now waits on its client.
    fn awaiting_client(&self) -> Option<u64> {
        (self.state.load(Ordering::Relaxed) == AWAITING_CLIENT)
            .then(|| self.frames.load(Ordering::Relaxed))
    }
}

pin_project_lite::pin_project! {
    /// A stream's future that ends (dropping what it holds, which resets the stream) once
    /// it has waited on its client for the bound with no frame taken.
    pub(crate) struct Watched<F> {
        #[pin]
        stream: F,
        progress: std::sync::Arc<StreamProgress>,
        bound: Duration,
        // The frame count when the current wait on the client began, and its deadline.
        stall: Option<(u64, Instant)>,
        timer: DeadlineTimer,
        reset: Counter,
    }
}

impl<F> Watched<F> {
    /// `stream`, whose answer reports to `progress`, ended past `bound` and counted on
    /// `reset`.
    pub(crate) fn new(
        stream: F,
        progress: std::sync::Arc<StreamProgress>,
        bound: Duration,
        reset: Counter,
    ) -> Self {
        Self {
            stream,
            progress,
            bound,
            stall: None,
            timer: DeadlineTimer::default(),
            reset,
        }
    }
}

impl<F: Future<Output = ()>> Future for Watched<F> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.project();
        if this.stream.poll(cx).is_ready() {
            return Poll::Ready(());
        }
        let Some(frames) = this.progress.awaiting_client() else {
            *this.stall = None;
            return Poll::Pending;
        };
        // A wait starts when first seen, and again after every frame the client made room
        // for: the clock is read only while the stream is held by its client.
        let at = match *this.stall {
            Some((seen, at)) if seen == frames => at,
            _ => {
                let at = Instant::now() + *this.bound;
                *this.stall = Some((frames, at));
                at
            }
        };
        if this.timer.poll_passed(cx, at).is_ready() {
            this.reset.inc();
            tracing::debug!(bound = ?this.bound, "HTTP/2 client took nothing of its answer; stream reset");
            return Poll::Ready(());
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    const BOUND: Duration = Duration::from_secs(30);
    /// Just under the bound.
    const ALMOST: Duration = Duration::from_millis(29_999);

    /// A client as the writes see it: it takes `take` bytes per write, each after `gap`
    /// (none: at once), or nothing at all (`take` 0).
    struct Client {
        take: usize,
        gap: Option<Duration>,
        next: Option<Pin<Box<tokio::time::Sleep>>>,
        got: Vec<u8>,
    }

    impl Client {
        fn taking(take: usize, gap: Option<Duration>) -> Self {
            Self {
                take,
                gap,
                next: None,
                got: Vec::new(),
            }
        }
    }

    impl AsyncWrite for Client {
        fn poll_write(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<std::io::Result<usize>> {
            if self.take == 0 {
                return Poll::Pending;
            }
            if let Some(gap) = self.gap {
                let sleep = self
                    .next
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(gap)));
                if sleep.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                self.next = None;
            }
            let n = buf.len().min(self.take);
            self.got.extend_from_slice(&buf[..n]);
            Poll::Ready(Ok(n))
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_that_goes_through_makes_no_timer() {
        let mut client = Client::taking(3, None);
        let mut timer = DeadlineTimer::default();
        write_all_within(&mut client, b"hello world", BOUND, &mut timer)
            .await
            .unwrap();
        assert_eq!(client.got, b"hello world");
        assert!(!timer.is_made(), "no wait, no timer");
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_takes_nothing_is_cut_at_the_bound_and_not_before() {
        let mut client = Client::taking(0, None);
        let mut timer = DeadlineTimer::default();
        let start = Instant::now();
        let e = write_all_within(&mut client, b"hello", BOUND, &mut timer)
            .await
            .unwrap_err();
        assert!(is_client_stalled(&e), "{e}");
        assert_eq!(e.kind(), std::io::ErrorKind::TimedOut);
        assert_eq!(start.elapsed(), BOUND, "exactly at the bound");
        // Any other timeout is not this one.
        assert!(!is_client_stalled(&std::io::ErrorKind::TimedOut.into()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_client_that_keeps_taking_bytes_is_never_cut() {
        // Each byte takes just under the bound; the whole write takes many bounds.
        let mut slow = Client::taking(1, Some(ALMOST));
        let mut timer = DeadlineTimer::default();
        let start = Instant::now();
        write_all_within(&mut slow, &[0; 5], BOUND, &mut timer)
            .await
            .unwrap();
        assert_eq!(slow.got.len(), 5);
        assert!(start.elapsed() > BOUND * 4);
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_slower_than_the_bound_is_cut_at_its_first_long_pause() {
        let mut slow = Client::taking(1, Some(BOUND + Duration::from_millis(1)));
        let mut timer = DeadlineTimer::default();
        let e = write_all_within(&mut slow, &[0; 5], BOUND, &mut timer)
            .await
            .unwrap_err();
        assert!(is_client_stalled(&e));
        assert!(slow.got.is_empty());
    }

    /// A stream future that stays pending, standing for hyper's while it waits.
    fn pending_stream() -> impl Future<Output = ()> {
        std::future::pending()
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_held_by_its_client_ends_at_the_bound_and_is_counted() {
        let progress = Arc::new(StreamProgress::default());
        let reset = Counter::default();
        let watched = Watched::new(
            pending_stream(),
            Arc::clone(&progress),
            BOUND,
            reset.clone(),
        );
        progress.answering();
        progress.polled(true);
        let start = Instant::now();
        watched.await;
        assert_eq!(start.elapsed(), BOUND);
        assert_eq!(reset.get(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_waiting_on_its_site_or_its_answer_is_left_to_the_site_bounds() {
        for (answering, site_silent) in [(false, false), (true, true)] {
            let progress = Arc::new(StreamProgress::default());
            let reset = Counter::default();
            let mut watched = Box::pin(Watched::new(
                pending_stream(),
                Arc::clone(&progress),
                BOUND,
                reset.clone(),
            ));
            if answering {
                progress.answering();
            }
            if site_silent {
                progress.polled(true);
                progress.polled(false);
            }
            let ended = tokio::time::timeout(BOUND * 10, watched.as_mut()).await;
            assert!(ended.is_err(), "not cut while the site is awaited");
            assert_eq!(reset.get(), 0);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn each_frame_the_client_makes_room_for_starts_the_bound_again() {
        let progress = Arc::new(StreamProgress::default());
        let reset = Counter::default();
        let mut watched = Box::pin(Watched::new(
            pending_stream(),
            Arc::clone(&progress),
            BOUND,
            reset.clone(),
        ));
        progress.answering();
        let start = Instant::now();
        for _ in 0..4 {
            // Held for just under the bound, then a frame goes (and the next is held).
            let step = ALMOST;
            assert!(
                tokio::time::timeout(step, watched.as_mut()).await.is_err(),
                "cut while the client kept taking frames"
            );
            progress.polled(true);
        }
        watched.as_mut().await;
        assert_eq!(reset.get(), 1);
        assert_eq!(start.elapsed(), ALMOST * 4 + BOUND);
    }
}
