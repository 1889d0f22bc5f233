//! A site's answer body with its silences bounded (`upstreamIdleTimeoutSeconds`).
//!
//! The bound runs only while the gateway waits for the site: the timer is armed when the
//! client side asks for the next frame and none is ready, and disarmed when one arrives,
//! so a slow client (which makes the gateway stop asking) never makes a site look
//! silent. Past the bound
//! the body ends in an error: hyper then aborts the answer (an HTTP/1.1 chunked body
//! without its last chunk, a connection closed before its `Content-Length`, an HTTP/2
//! stream reset), the site's connection is dropped, and the timeout is counted and fed
//! to routing once, as a serving failure.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use grid_score::live::LiveSlot;
use http_body::{Body, Frame, SizeHint};
use tokio::time::Instant;

use crate::engine::BoxError;
use crate::engine::request_metrics::{RequestMetrics, TimeoutPhase};
use crate::engine::timers::deadline_timer::DeadlineTimer;

/// The site went silent mid-answer for longer than the bound.
#[derive(Debug, thiserror::Error)]
#[error("the site sent nothing for {0:?} in the middle of its answer")]
pub(crate) struct UpstreamIdle(pub(crate) Duration);

/// Who hears of a timeout: the metric and the site's live slot.
pub(crate) struct IdleReport {
    pub(crate) metrics: RequestMetrics,
    pub(crate) site: Arc<str>,
    pub(crate) slot: Arc<LiveSlot>,
    pub(crate) live_refresh: Arc<tokio::sync::Notify>,
    /// The site slot the answer holds until it ends (or is cut): `maxConnectionsPerSite`.
    pub(crate) _site_slot: crate::engine::site::slots::Held,
}

impl IdleReport {
    fn send(self) {
        self.metrics.timed_out(&self.site, TimeoutPhase::Body);
        self.slot.record_failure();
        self.live_refresh.notify_one();
        tracing::warn!(site = %self.site, "upstream went silent mid-answer; answer cut");
    }
}

/// `inner` with each wait for its next frame bounded by `idle`.
pub(crate) struct IdleBody<B> {
    inner: B,
    idle: Duration,
    /// Made the first time the site has nothing ready: most answers (every plain one
    /// whose body came with its head) never wait, and a timer made for each of them read
    /// the clock, cloned the runtime's handle and allocated.
    timer: DeadlineTimer,
    /// When the current wait ends in a timeout (none while the site is not awaited).
    deadline: Option<Instant>,
    /// Taken when the timeout is reported (at most once).
    report: Option<IdleReport>,
}

impl<B> IdleBody<B> {
    pub(crate) fn new(inner: B, idle: Duration, report: IdleReport) -> Self {
        Self {
            inner,
            idle,
            timer: DeadlineTimer::default(),
            deadline: None,
            report: Some(report),
        }
    }
}

impl<B> Body for IdleBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        if this.report.is_none() {
            // Timed out already: the body stays ended.
            return Poll::Ready(None);
        }
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            this.deadline = None;
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        // A wait starts only once the site has nothing ready: a frame already there costs
        // no clock read and no timer, and most of a fast stream's frames are.
        let deadline = *this
            .deadline
            .get_or_insert_with(|| Instant::now() + this.idle);
        if this.timer.poll_passed(cx, deadline).is_ready() {
            if let Some(report) = this.report.take() {
                report.send();
            }
            return Poll::Ready(Some(Err(Box::new(UpstreamIdle(this.idle)))));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.report.is_none() || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt as _;

    fn report(metrics: &RequestMetrics, slot: &Arc<LiveSlot>) -> IdleReport {
        IdleReport {
            metrics: metrics.clone(),
            site: "a".into(),
            slot: Arc::clone(slot),
            _site_slot: crate::engine::site::slots::Slot::held(None, None, None),
            live_refresh: Arc::new(tokio::sync::Notify::new()),
        }
    }

    #[tokio::test]
    async fn a_body_silent_past_the_bound_ends_in_an_error_reported_once() {
        let (metrics, slot) = (RequestMetrics::default(), Arc::new(LiveSlot::new()));
        let (mut tx, inner) =
            http_body_util::channel::Channel::<Bytes, std::convert::Infallible>::new(1);
        let mut body = IdleBody::new(inner, Duration::from_millis(100), report(&metrics, &slot));
        tx.send_data(Bytes::from_static(b"half")).await.unwrap();
        let first = body.frame().await.unwrap().unwrap();
        assert_eq!(first.into_data().unwrap(), "half");
        let err = body.frame().await.unwrap().unwrap_err();
        assert!(err.is::<UpstreamIdle>(), "{err}");
        assert!(body.frame().await.is_none(), "ended after the timeout");
        assert_eq!(slot.drain().failures, 1, "fed to routing as a failure");
        let labels = crate::engine::request_metrics::TimeoutLabels {
            site: "a".into(),
            phase: TimeoutPhase::Body,
        };
        assert_eq!(metrics.upstream_timeouts.get_or_create(&labels).get(), 1);
        drop(tx);
    }

    #[tokio::test]
    async fn an_answer_whose_frames_are_all_ready_never_makes_a_timer() {
        let (metrics, slot) = (RequestMetrics::default(), Arc::new(LiveSlot::new()));
        let inner = http_body_util::Full::new(Bytes::from_static(b"whole"));
        let mut body = IdleBody::new(inner, Duration::from_millis(100), report(&metrics, &slot));
        let first = body.frame().await.unwrap().unwrap();
        assert_eq!(first.into_data().unwrap(), "whole");
        assert!(body.frame().await.is_none());
        assert!(!body.timer.is_made(), "no wait, so no timer");
    }

    #[tokio::test(start_paused = true)]
    async fn a_timer_made_for_one_wait_is_reset_for_the_next_and_bounds_it_whole() {
        let (metrics, slot) = (RequestMetrics::default(), Arc::new(LiveSlot::new()));
        let idle = Duration::from_millis(100);
        let (mut tx, inner) =
            http_body_util::channel::Channel::<Bytes, std::convert::Infallible>::new(1);
        let mut body = IdleBody::new(inner, idle, report(&metrics, &slot));
        let sender = tokio::spawn(async move {
            // The first wait is within the bound: it makes the timer.
            tokio::time::sleep(idle.saturating_sub(Duration::from_millis(1))).await;
            tx.send_data(Bytes::from_static(b"a")).await.unwrap();
            // Then silence: the second wait reuses that timer, from its own start.
            tokio::time::sleep(idle * 10).await;
            drop(tx);
        });
        assert_eq!(
            body.frame().await.unwrap().unwrap().into_data().unwrap(),
            "a"
        );
        assert!(body.timer.is_made());
        let second_wait = Instant::now();
        let err = body.frame().await.unwrap().unwrap_err();
        assert!(err.is::<UpstreamIdle>(), "{err}");
        assert_eq!(
            second_wait.elapsed(),
            idle,
            "a whole bound from the second wait"
        );
        sender.abort();
    }

    #[tokio::test]
    async fn the_bound_restarts_with_every_frame() {
        let (metrics, slot) = (RequestMetrics::default(), Arc::new(LiveSlot::new()));
        let (mut tx, inner) =
            http_body_util::channel::Channel::<Bytes, std::convert::Infallible>::new(1);
        let body = IdleBody::new(inner, Duration::from_millis(300), report(&metrics, &slot));
        let sender = tokio::spawn(async move {
            for _ in 0..5 {
                tokio::time::sleep(Duration::from_millis(100)).await;
                tx.send_data(Bytes::from_static(b"x")).await.unwrap();
            }
        });
        let all = body.collect().await.unwrap().to_bytes();
        assert_eq!(
            &all[..],
            b"xxxxx",
            "longer than the bound in all, never that long silent"
        );
        sender.await.unwrap();
        assert_eq!(slot.drain().failures, 0);
    }
}
