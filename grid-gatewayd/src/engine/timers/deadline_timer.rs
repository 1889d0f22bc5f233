//! A deadline kept by a timer made when a wait first needs it and moved only when it
//! fires: the bound on a site's answer head (`upstreamHeadersTimeoutSeconds`, one timer
//! per connection to the site, across its requests) and on a site's silences mid-answer
//! (`upstreamIdleTimeoutSeconds`, one per answer, across its waits).
//!
//! `tokio::time::timeout` makes a timer for every request: a clock read, a registration
//! in the runtime's timer wheel when the exchange first waits, and its removal when the
//! answer comes, each under the wheel's lock. Here the timer is kept
//! (`docs/benchmarks.md` has what that saves): deadlines only move later from one wait to
//! the next, so a timer still set for an earlier deadline fires first, is found early and
//! is set again for the wait in progress. On a busy connection that is once per bound,
//! not once per request; work that does not wait at all never makes one.

use std::future::Future;
use std::pin::{Pin, pin};
use std::task::{Context, Poll};

use tokio::time::{Instant, Sleep};

/// The deadline passed first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the deadline passed")]
pub(crate) struct DeadlinePassed;

/// A timer for a run of deadlines, each no earlier than the one before (an earlier one is
/// kept too, at the cost of a move): none until a wait first needs it.
#[derive(Debug, Default)]
pub(crate) struct DeadlineTimer {
    sleep: Option<Pin<Box<Sleep>>>,
}

impl DeadlineTimer {
    /// `Ready` once `deadline` has passed; otherwise the task is woken by then.
    pub(crate) fn poll_passed(&mut self, cx: &mut Context<'_>, deadline: Instant) -> Poll<()> {
        let sleep = match &mut self.sleep {
            // Set for a later deadline than this one (a reload shortened the bound):
            // moved in, or it would wake too late.
            Some(sleep) if sleep.deadline() > deadline => {
                sleep.as_mut().reset(deadline);
                sleep
            }
            Some(sleep) => sleep,
            None => self
                .sleep
                .insert(Box::pin(tokio::time::sleep_until(deadline))),
        };
        loop {
            if sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            if sleep.deadline() >= deadline {
                return Poll::Ready(());
            }
            // It fired for an earlier wait's deadline: set it for this one's.
            sleep.as_mut().reset(deadline);
        }
    }

    /// Whether a wait has made the timer.
    #[cfg(test)]
    pub(crate) fn is_made(&self) -> bool {
        self.sleep.is_some()
    }

    /// `work`'s output, or [`DeadlinePassed`] once `deadline` has passed without it.
    /// `work` is polled first: what is ready by the deadline's check is taken.
    pub(crate) async fn within<F: Future>(
        &mut self,
        deadline: Instant,
        work: F,
    ) -> Result<F::Output, DeadlinePassed> {
        let mut work = pin!(work);
        std::future::poll_fn(|cx| {
            if let Poll::Ready(out) = work.as_mut().poll(cx) {
                return Poll::Ready(Ok(out));
            }
            self.poll_passed(cx, deadline).map(|()| Err(DeadlinePassed))
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const BOUND: Duration = Duration::from_millis(300);

    #[tokio::test(start_paused = true)]
    async fn work_that_never_waits_makes_no_timer() {
        let mut timer = DeadlineTimer::default();
        let out = timer.within(Instant::now() + BOUND, async { 7 }).await;
        assert_eq!(out, Ok(7));
        assert!(!timer.is_made());
    }

    #[tokio::test(start_paused = true)]
    async fn work_that_never_ends_times_out_at_its_deadline() {
        unanswered_times_out_a_bound_after_its_start(&mut DeadlineTimer::default()).await;
    }

    #[tokio::test(start_paused = true)]
    async fn work_done_before_the_deadline_is_its_output() {
        let mut timer = DeadlineTimer::default();
        let late = BOUND.saturating_sub(Duration::from_millis(1));
        let out = timer
            .within(Instant::now() + BOUND, async {
                tokio::time::sleep(late).await;
                "head"
            })
            .await;
        assert_eq!(out, Ok("head"));
    }

    /// A request given `bound` that waits a little (so the timer is made and set for
    /// its deadline) and is answered.
    async fn answered_after_a_wait(timer: &mut DeadlineTimer, bound: Duration) {
        let waits = tokio::time::sleep(Duration::from_millis(10));
        assert_eq!(timer.within(Instant::now() + bound, waits).await, Ok(()));
    }

    /// A request never answered times out a whole [`BOUND`] after its own start.
    async fn unanswered_times_out_a_bound_after_its_start(timer: &mut DeadlineTimer) {
        let start = Instant::now();
        let out = timer
            .within(start + BOUND, std::future::pending::<()>())
            .await;
        assert_eq!(out, Err(DeadlinePassed));
        assert_eq!(start.elapsed(), BOUND);
    }

    #[tokio::test(start_paused = true)]
    async fn a_timer_set_for_an_earlier_request_bounds_the_next_from_its_own_start() {
        let mut timer = DeadlineTimer::default();
        answered_after_a_wait(&mut timer, BOUND).await;
        // Sent before the first one's deadline: not cut at it.
        tokio::time::sleep(Duration::from_millis(200)).await;
        unanswered_times_out_a_bound_after_its_start(&mut timer).await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_timer_that_fired_while_the_connection_was_idle_does_not_cut_the_next_request() {
        let mut timer = DeadlineTimer::default();
        answered_after_a_wait(&mut timer, BOUND).await;
        // Idle past the first deadline: the timer has fired with nobody waiting.
        tokio::time::sleep(BOUND * 3).await;
        unanswered_times_out_a_bound_after_its_start(&mut timer).await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_shorter_bound_than_the_timer_is_set_for_is_kept() {
        let mut timer = DeadlineTimer::default();
        answered_after_a_wait(&mut timer, BOUND * 10).await;
        unanswered_times_out_a_bound_after_its_start(&mut timer).await;
    }
}
