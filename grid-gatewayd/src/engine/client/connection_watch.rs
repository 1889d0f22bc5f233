//! What a connection's watchdog knows: whether a request is in flight on it, since when
//! it has had none, and since when a request head has been arriving.
//!
//! A request counts from its head until its answer body is dropped, sent or not. The
//! count is two atomics the requests touch and the watchdog reads; nothing wakes the
//! watchdog when they change. Its timer is set for the earliest the connection could be
//! due, and when it fires it looks again: a connection that served a request in the
//! meantime is not due, and the timer is set again. A request's answer that ends at `t`
//! makes the connection due at `t + idle`, never earlier, and a head that begins to
//! arrive at `h` (after the connection's first request) makes it due at `h + header`,
//! never earlier; so the next look is at the connection's bound as it stands or the
//! shorter of the two bounds from now, whichever comes first (a busy connection, or one
//! still waiting for its first head under a longer header bound, is looked at once per
//! that bound), and no close comes late. That keeps the request path at an atomic add
//! and a subtraction, where a channel to the watchdog would cost two notifications and a
//! timer-wheel update per request; a later head read whole in one read (nearly every
//! one) costs nothing more, and one that arrives in pieces one atomic store.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Response;

use crate::engine::client::connection_metrics::Closed;
use crate::engine::client::limits::Limits;
use crate::engine::client::write_bound::StreamProgress;
use crate::front_ends::http_api::ResponseBody;

/// The requests of one connection, shared by its requests and its watchdog.
#[derive(Debug)]
pub(crate) struct Activity {
    /// When the connection opened: the origin of `idle_since_ns`.
    opened: Instant,
    /// Requests whose answer is not done.
    in_flight: AtomicUsize,
    /// At least one request was seen (the header bound no longer applies).
    served: AtomicBool,
    /// When a request last ended, in nanoseconds after `opened` (0: none has).
    idle_since_ns: AtomicU64,
    /// When the last head that did not arrive whole in one read began to arrive, in
    /// nanoseconds after `opened` (0: none has). It bounds the connection only while it
    /// is later than `idle_since_ns`: the head of no request that has since ended.
    head_since_ns: AtomicU64,
}

/// What the watchdog does after a look.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Look {
    /// Close the connection now, for this reason.
    Close(Closed),
    /// Look again at this instant.
    Again(Instant),
}

impl Activity {
    /// A connection opened at `now`, with no request yet.
    pub(crate) fn new(now: Instant) -> Arc<Self> {
        Arc::new(Self {
            opened: now,
            in_flight: AtomicUsize::new(0),
            served: AtomicBool::new(false),
            idle_since_ns: AtomicU64::new(0),
            head_since_ns: AtomicU64::new(0),
        })
    }

    /// Nanoseconds from `opened` to `now` (0 for a `now` before it).
    fn since_opened(&self, now: Instant) -> u64 {
        u64::try_from(now.saturating_duration_since(self.opened).as_nanos()).unwrap_or(u64::MAX)
    }

    /// A request head began to arrive at `now` and is not whole yet: from here it is held
    /// to the header bound, not to the idle bound (HTTP/1.1, after the first request).
    pub(crate) fn head_started(&self, now: Instant) {
        self.head_since_ns
            .store(self.since_opened(now), Ordering::Relaxed);
    }

    /// A request's head arrived.
    fn start(&self) {
        self.served.store(true, Ordering::Relaxed);
        self.in_flight.fetch_add(1, Ordering::AcqRel);
    }

    /// A request's answer ended at `now`.
    fn end(&self, now: Instant) {
        let ns = self.since_opened(now);
        self.idle_since_ns.fetch_max(ns, Ordering::Relaxed);
        self.in_flight.fetch_sub(1, Ordering::Release);
    }

    /// When the connection is to be closed, and why; `None` while a request is in flight.
    fn deadline(&self, limits: Limits) -> Option<(Instant, Closed)> {
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return None;
        }
        if !self.served.load(Ordering::Relaxed) {
            return Some((self.opened + limits.header_timeout, Closed::HeaderTimeout));
        }
        let idle_ns = self.idle_since_ns.load(Ordering::Relaxed);
        let idle_due = self.opened + Duration::from_nanos(idle_ns) + limits.idle_timeout;
        let head_ns = self.head_since_ns.load(Ordering::Relaxed);
        if head_ns > idle_ns {
            // A head has been arriving since the last answer ended: a client slow to send
            // it is held to the header bound, as on a new connection.
            let head_due = self.opened + Duration::from_nanos(head_ns) + limits.header_timeout;
            if head_due < idle_due {
                return Some((head_due, Closed::HeaderTimeout));
            }
        }
        Some((idle_due, Closed::IdleTimeout))
    }

    /// The watchdog's look at `now`: close, or when to look next (see the module docs).
    pub(crate) fn look(&self, now: Instant, limits: Limits) -> Look {
        // A request ending or a head beginning after this look can make the connection
        // due no sooner than one of the two bounds from now.
        let soonest = now + limits.idle_timeout.min(limits.header_timeout);
        match self.deadline(limits) {
            Some((due, reason)) if due <= now => Look::Close(reason),
            Some((due, _)) => Look::Again(due.min(soonest)),
            None => Look::Again(soonest),
        }
    }
}

/// Resolves when the connection has waited past its bound, with why.
pub(crate) async fn watchdog(activity: Arc<Activity>, limits: Limits) -> Closed {
    let mut look = activity.look(activity.opened, limits);
    let timer = tokio::time::sleep_until(activity.opened.into());
    tokio::pin!(timer);
    loop {
        match look {
            Look::Close(reason) => return reason,
            Look::Again(at) => timer.as_mut().reset(at.into()),
        }
        timer.as_mut().await;
        look = activity.look(grid_gateway::clock::monotonic(), limits);
    }
}

/// One request in flight on a connection, from its head until its answer body is
/// dropped.
pub(crate) struct InFlight(Arc<Activity>);

impl InFlight {
    /// Counts a request on `activity`'s connection until the guard is dropped.
    pub(crate) fn start(activity: &Arc<Activity>) -> Self {
        activity.start();
        Self(Arc::clone(activity))
    }

    /// The answer, its body holding the guard (not boxed again: hyper takes it as is) and
    /// reporting each of its polls to `progress` (an HTTP/2 stream's, `write_bound`).
    pub(crate) fn hold(
        self,
        resp: Response<ResponseBody>,
        progress: Option<Arc<StreamProgress>>,
    ) -> Response<Guarded> {
        if let Some(p) = &progress {
            p.answering();
        }
        resp.map(|body| Guarded {
            body,
            progress,
            _guard: self,
        })
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.end(grid_gateway::clock::monotonic());
    }
}

/// An answer body that ends its request's [`InFlight`] when dropped.
pub(crate) struct Guarded {
    body: ResponseBody,
    /// Told whether each poll gave a frame: whether the stream waits on its client.
    progress: Option<Arc<StreamProgress>>,
    _guard: InFlight,
}

impl http_body::Body for Guarded {
    type Data = Bytes;
    type Error = crate::engine::BoxError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        let polled = std::pin::Pin::new(&mut self.body).poll_frame(cx);
        if let Some(p) = &self.progress {
            p.polled(polled.is_ready());
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        max_connections: 1,
        header_timeout: Duration::from_secs(10),
        idle_timeout: Duration::from_secs(60),
        write_timeout: Duration::from_secs(30),
    };

    #[test]
    fn a_connection_is_due_by_its_header_bound_then_its_idle_bound_never_while_busy() {
        let t0 = grid_gateway::clock::monotonic();
        let a = Activity::new(t0);
        assert_eq!(
            a.deadline(LIMITS),
            Some((t0 + LIMITS.header_timeout, Closed::HeaderTimeout))
        );
        a.start();
        assert_eq!(
            a.deadline(LIMITS),
            None,
            "a request in flight is never idle"
        );
        let ended = t0 + Duration::from_secs(5);
        a.end(ended);
        assert_eq!(
            a.deadline(LIMITS),
            Some((ended + LIMITS.idle_timeout, Closed::IdleTimeout))
        );
    }

    #[test]
    fn a_look_at_the_header_bound_closes_a_connection_that_sent_nothing() {
        let t0 = grid_gateway::clock::monotonic();
        let a = Activity::new(t0);
        let due = t0 + LIMITS.header_timeout;
        assert_eq!(
            a.look(due.checked_sub(Duration::from_nanos(1)).unwrap(), LIMITS),
            Look::Again(due)
        );
        assert_eq!(a.look(due, LIMITS), Look::Close(Closed::HeaderTimeout));
    }

    #[test]
    fn a_first_request_under_a_header_bound_longer_than_the_idle_bound_is_looked_at_in_time() {
        let limits = Limits {
            header_timeout: Duration::from_secs(60),
            idle_timeout: Duration::from_secs(1),
            ..LIMITS
        };
        let t0 = grid_gateway::clock::monotonic();
        let a = Activity::new(t0);
        // Looked at no later than one idle bound after opening, not at the header bound.
        assert_eq!(a.look(t0, limits), Look::Again(t0 + limits.idle_timeout));
        a.start();
        a.end(t0 + Duration::from_millis(10));
        let due = t0 + Duration::from_millis(10) + limits.idle_timeout;
        assert_eq!(a.look(t0 + limits.idle_timeout, limits), Look::Again(due));
        assert_eq!(a.look(due, limits), Look::Close(Closed::IdleTimeout));
    }

    #[test]
    fn a_connection_that_served_since_the_timer_was_set_is_not_closed_at_the_old_bound() {
        // Looks once per idle bound (the header bound no shorter).
        let limits = Limits {
            header_timeout: LIMITS.idle_timeout,
            ..LIMITS
        };
        let t0 = grid_gateway::clock::monotonic();
        let a = Activity::new(t0);
        a.start();
        a.end(t0 + Duration::from_secs(1));
        let first = t0 + Duration::from_secs(1) + limits.idle_timeout;
        assert_eq!(
            a.look(t0 + Duration::from_secs(2), limits),
            Look::Again(first)
        );
        // Another request comes and goes before the timer fires.
        a.start();
        let later = t0 + Duration::from_secs(30);
        a.end(later);
        assert_eq!(
            a.look(first, limits),
            Look::Again(later + limits.idle_timeout)
        );
        assert_eq!(
            a.look(later + limits.idle_timeout, limits),
            Look::Close(Closed::IdleTimeout)
        );
    }

    #[test]
    fn a_busy_connection_is_looked_at_again_before_its_answer_could_make_it_due() {
        let t0 = grid_gateway::clock::monotonic();
        let a = Activity::new(t0);
        a.start();
        let look = t0 + Duration::from_secs(100);
        let Look::Again(next) = a.look(look, LIMITS) else {
            panic!("a busy connection is closed");
        };
        // The earliest the connection can be due is its answer's end (after `look`) plus
        // the idle bound, or a next head's first byte after that plus the (shorter)
        // header bound: the next look comes no later.
        assert_eq!(next, look + LIMITS.header_timeout);
        a.end(look + Duration::from_millis(1));
        let ended = look + Duration::from_millis(1);
        assert_eq!(
            a.look(next, LIMITS),
            Look::Again((ended + LIMITS.idle_timeout).min(next + LIMITS.header_timeout))
        );
    }

    #[test]
    fn a_head_begun_after_an_answer_is_due_by_the_header_bound_from_its_first_byte() {
        let t0 = grid_gateway::clock::monotonic();
        let a = Activity::new(t0);
        a.start();
        let ended = t0 + Duration::from_secs(1);
        a.end(ended);
        let begun = ended + Duration::from_secs(20);
        a.head_started(begun);
        let due = begun + LIMITS.header_timeout;
        assert_eq!(a.deadline(LIMITS), Some((due, Closed::HeaderTimeout)));
        assert_eq!(
            a.look(due.checked_sub(Duration::from_nanos(1)).unwrap(), LIMITS),
            Look::Again(due)
        );
        assert_eq!(a.look(due, LIMITS), Look::Close(Closed::HeaderTimeout));
        // Once its request has come and gone, that head bounds the connection no more.
        a.start();
        let later = begun + Duration::from_secs(1);
        a.end(later);
        assert_eq!(
            a.deadline(LIMITS),
            Some((later + LIMITS.idle_timeout, Closed::IdleTimeout))
        );
    }

    #[test]
    fn a_head_begun_just_before_the_idle_bound_closes_at_the_idle_bound() {
        let t0 = grid_gateway::clock::monotonic();
        let a = Activity::new(t0);
        a.start();
        a.end(t0);
        let idle_due = t0 + LIMITS.idle_timeout;
        a.head_started(t0 + LIMITS.idle_timeout.saturating_sub(Duration::from_secs(1)));
        assert_eq!(a.deadline(LIMITS), Some((idle_due, Closed::IdleTimeout)));
    }

    #[test]
    fn overlapping_requests_keep_the_connection_busy_until_the_last_ends() {
        let t0 = grid_gateway::clock::monotonic();
        let a = Activity::new(t0);
        a.start();
        a.start();
        a.end(t0 + Duration::from_secs(3));
        assert_eq!(a.deadline(LIMITS), None, "one stream is still open");
        // The later end wins even if it is recorded first.
        a.end(t0 + Duration::from_secs(2));
        assert_eq!(
            a.deadline(LIMITS),
            Some((
                t0 + Duration::from_secs(3) + LIMITS.idle_timeout,
                Closed::IdleTimeout
            ))
        );
    }
}
