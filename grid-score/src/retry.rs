//! Which requests a site refused go to another site, and how many may.
//!
//! A request goes elsewhere, once, when the site it was sent to refused it before doing
//! any work for it ([`goes_elsewhere`]): nothing reached the site (a refused or timed-out
//! connect, a TLS refusal, every slot of the site taken), the site answered 503 (it
//! cannot serve now: no ready endpoint) or 429 (it is full), or the connection was reset
//! before any byte of an answer. The body is still held, so nothing is lost by sending it
//! again, and the client saw nothing of the first attempt.
//!
//! Not retried: a site that sent no answer head within the header bound (it may still be
//! generating; a second site would do the work twice while the first goes on), any other
//! 5xx (the site took the request and failed it: a completion is not idempotent), and
//! anything after an answer started (the client has seen it).
//!
//! Retries are bounded by a budget ([`RetryBudget`], as linkerd's and Envoy's): at most
//! [`RETRY_BUDGET_RATIO`] of the requests of the last [`RETRY_BUDGET_WINDOW_MS`], plus
//! [`MIN_RETRIES_PER_SECOND`], so a grid-wide failure cannot double the load on what is
//! left. The budget is read only when a retry is wanted: the request path of a request
//! that is not retried never touches it.

use std::collections::VecDeque;
use std::sync::{Mutex, PoisonError};

/// The share of recent requests that may be retries.
pub const RETRY_BUDGET_RATIO: f64 = 0.2;

/// The window the budget counts requests and retries over.
pub const RETRY_BUDGET_WINDOW_MS: u64 = 10_000;

/// Retries allowed per second whatever the request rate: a quiet gateway can still retry
/// the odd refused request.
pub const MIN_RETRIES_PER_SECOND: f64 = 10.0;

/// How often the budget takes a sample of the counts (the window moves in these steps).
pub const SAMPLE_EVERY_MS: u64 = 1_000;

grid_signals::label_values! {
    /// Why a request went to a second site (the `cause` of `grid_gateway_retries_total`).
    pub enum RetryCause {
        /// Nothing reached the first site: a refused, unreachable or timed-out connect, a
        /// TLS refusal, or every slot of the site taken.
        Connect,
        /// The first site answered 503: it cannot serve now.
        Unavailable,
        /// The first site answered 429: it is full.
        Full,
        /// The first site's connection was reset before any byte of an answer.
        Reset,
    }
}

/// How one attempt at a site ended, as far as retrying goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttemptEnd {
    /// Nothing of the request reached the site.
    NotSent,
    /// The site answered with this status.
    Answered(u16),
    /// The connection failed after sending, before any byte of an answer.
    ResetBeforeAnswer,
    /// No answer head within the header bound.
    NoAnswerInTime,
}

/// Whether a request whose attempt ended so may go to another site, and why.
pub fn goes_elsewhere(end: AttemptEnd) -> Option<RetryCause> {
    match end {
        AttemptEnd::NotSent => Some(RetryCause::Connect),
        AttemptEnd::Answered(503) => Some(RetryCause::Unavailable),
        AttemptEnd::Answered(429) => Some(RetryCause::Full),
        AttemptEnd::ResetBeforeAnswer => Some(RetryCause::Reset),
        AttemptEnd::Answered(_) | AttemptEnd::NoAnswerInTime => None,
    }
}

/// The retries a gateway may still make: see the module docs. Shared by every request
/// (it locks, but only when a retry is wanted).
#[derive(Debug, Default)]
pub struct RetryBudget {
    window: Mutex<Window>,
}

#[derive(Debug, Default)]
struct Window {
    /// (when, requests then, retries then), oldest first, one per [`SAMPLE_EVERY_MS`].
    samples: VecDeque<(u64, u64, u64)>,
    /// Retries granted so far.
    retries: u64,
}

impl Window {
    /// Takes a sample (at most one per [`SAMPLE_EVERY_MS`]) and drops those the window no
    /// longer needs: it starts at the newest sample at least its length old.
    fn sample(&mut self, now_ms: u64, requests_total: u64) {
        if self
            .samples
            .back()
            .is_none_or(|&(at, ..)| now_ms >= at.saturating_add(SAMPLE_EVERY_MS))
        {
            self.samples
                .push_back((now_ms, requests_total, self.retries));
        }
        while self.samples.len() > 1
            && self.samples[1].0.saturating_add(RETRY_BUDGET_WINDOW_MS) <= now_ms
        {
            self.samples.pop_front();
        }
    }
}

impl RetryBudget {
    /// A budget with nothing spent.
    pub fn new() -> Self {
        Self::default()
    }

    /// Notes `requests_total` requests served so far (a count the caller keeps anyway,
    /// never reset) at `now_ms`. Call it about once a [`SAMPLE_EVERY_MS`] off the request
    /// path (the gateway does from a timer, the simulator as it routes): the window then
    /// knows how many requests its span saw, so a gateway that has been busy may retry its
    /// share at once, and one that was quiet does not count old requests as recent.
    pub fn sample(&self, now_ms: u64, requests_total: u64) {
        let mut w = self.window.lock().unwrap_or_else(PoisonError::into_inner);
        w.sample(now_ms, requests_total);
    }

    /// Whether one more retry fits at `now_ms`, with `requests_total` requests served so
    /// far; counts it when it does.
    pub fn try_retry(&self, now_ms: u64, requests_total: u64) -> bool {
        let mut w = self.window.lock().unwrap_or_else(PoisonError::into_inner);
        w.sample(now_ms, requests_total);
        let retries = w.retries;
        let Some(&(start, requests_then, retries_then)) = w.samples.front() else {
            return false;
        };
        // The current second counts whole: a budget of ten a second gives ten at once.
        let span_s = (now_ms.saturating_sub(start) + SAMPLE_EVERY_MS) as f64 / 1_000.0;
        let allowed = RETRY_BUDGET_RATIO * requests_total.saturating_sub(requests_then) as f64
            + MIN_RETRIES_PER_SECOND * span_s;
        if (retries - retries_then) as f64 + 1.0 <= allowed {
            w.retries += 1;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_refusal_before_any_work_goes_elsewhere() {
        assert_eq!(
            goes_elsewhere(AttemptEnd::NotSent),
            Some(RetryCause::Connect)
        );
        assert_eq!(
            goes_elsewhere(AttemptEnd::Answered(503)),
            Some(RetryCause::Unavailable)
        );
        assert_eq!(
            goes_elsewhere(AttemptEnd::Answered(429)),
            Some(RetryCause::Full)
        );
        assert_eq!(
            goes_elsewhere(AttemptEnd::ResetBeforeAnswer),
            Some(RetryCause::Reset)
        );
        for status in [200, 400, 404, 500, 502, 504] {
            assert_eq!(
                goes_elsewhere(AttemptEnd::Answered(status)),
                None,
                "{status}"
            );
        }
        assert_eq!(goes_elsewhere(AttemptEnd::NoAnswerInTime), None);
    }

    #[test]
    fn a_quiet_gateway_may_retry_ten_a_second_and_no_more() {
        let b = RetryBudget::new();
        let t = 1_000_000;
        let granted = (0..50).filter(|_| b.try_retry(t, 0)).count();
        assert_eq!(granted, MIN_RETRIES_PER_SECOND as usize);
        // A second later, ten more.
        let granted = (0..50).filter(|_| b.try_retry(t + 1_000, 0)).count();
        assert_eq!(granted, MIN_RETRIES_PER_SECOND as usize);
    }

    #[test]
    fn a_busy_gateway_may_retry_a_fifth_of_its_requests_over_the_window() {
        let b = RetryBudget::new();
        let t = 1_000_000;
        let rate = 1_000; // requests per second
        let mut granted = 0;
        let mut wanted = 0;
        for s in 0..60u64 {
            let now = t + s * 1_000;
            let requests = s * rate;
            // Every other request is refused and wants a retry.
            for _ in 0..rate / 2 {
                wanted += 1;
                granted += usize::from(b.try_retry(now, requests));
            }
        }
        let share = granted as f64 / (f64::from(wanted) * 2.0);
        let most = RETRY_BUDGET_RATIO + MIN_RETRIES_PER_SECOND / rate as f64;
        assert!(share <= most + 0.01, "{share}");
        assert!(share >= RETRY_BUDGET_RATIO * 0.9, "{share}");
    }

    #[test]
    fn the_budget_refills_once_the_window_has_passed() {
        let b = RetryBudget::new();
        let t = 1_000_000;
        let spent = (0..100).filter(|_| b.try_retry(t, 100)).count();
        assert_eq!(spent, MIN_RETRIES_PER_SECOND as usize);
        // Half a second later, half a second's more, and no requests came meanwhile.
        let more = (0..100).filter(|_| b.try_retry(t + 500, 100)).count();
        assert_eq!(more, MIN_RETRIES_PER_SECOND as usize / 2);
        // The requests of the next window bring retries back.
        assert!(b.try_retry(t + RETRY_BUDGET_WINDOW_MS + 1_000, 1_000));
    }

    #[test]
    fn a_gateway_busy_before_its_first_refusal_may_retry_its_share_of_what_it_served() {
        let b = RetryBudget::new();
        let t = 1_000_000;
        // A minute at 40 requests a second, noted every second, nothing refused.
        for s in 0..60u64 {
            b.sample(t + s * 1_000, s * 40);
        }
        let now = t + 60_000;
        let granted = (0..200).filter(|_| b.try_retry(now, 60 * 40)).count();
        // The last 10 s saw 400 requests: a fifth of them, and ten a second.
        let want = RETRY_BUDGET_RATIO * 400.0 + MIN_RETRIES_PER_SECOND * 11.0;
        assert_eq!(granted, want as usize);
    }

    #[test]
    fn requests_long_before_a_quiet_spell_do_not_count_as_recent() {
        let b = RetryBudget::new();
        let t = 1_000_000;
        for s in 0..10u64 {
            b.sample(t + s * 1_000, s * 100);
        }
        // A minute with no request, noted every second.
        for s in 10..70u64 {
            b.sample(t + s * 1_000, 900);
        }
        let granted = (0..500).filter(|_| b.try_retry(t + 70_000, 900)).count();
        assert_eq!(
            granted,
            (MIN_RETRIES_PER_SECOND * 11.0) as usize,
            "only the floor"
        );
    }
}
