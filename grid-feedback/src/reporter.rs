//! The gateway's end: folds each cycle's skew drops into a cumulative count and keeps the
//! report that must reach the operator until that exact report is acknowledged.
//!
//! # Driving it
//!
//! ```text
//! committed ingest + routing refresh --handle(Cycle::Committed { skew_drops })--+
//! failed fetch -----------------------handle(Cycle::FetchFailed)----------------+
//!                                                                              v
//!            poll_transmit --> Transmit { report, deadline } --> POST (daemon)
//!            handle(Response { outcome }) <-- 204 echo / status / transport error
//!            poll_timeout --> handle(Timeout)
//! poller or certificate reload committed: into_handover() --> Reporter::resume()
//! ```
//!
//! Each cycle grants one delivery attempt, so a dead operator costs one request per
//! cycle, not a retry storm; evidence waits in `pending` meanwhile.

use std::time::Duration;

use crate::metrics::{FailureReason, ReporterMetrics};
use crate::receiver::{HeaderList, INGEST_BUDGET};
use crate::{Ack, Epoch, Replica, Report};

/// The gateway's budget for one exchange: the operator's [`INGEST_BUDGET`] plus a second,
/// so an answer the operator gives at its own deadline is still heard.
pub const REPORT_BUDGET: Duration = INGEST_BUDGET.saturating_add(Duration::from_secs(1));

/// One delivery attempt, named so a late answer to an abandoned attempt is recognized.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ExchangeId(u64);

/// What one committed cycle observed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Cycle {
    /// An ingest committed and routing refreshed; `skew_drops` readings were discarded for
    /// implausible ages in it (0: a clean cycle).
    Committed {
        /// New `grid_signals_ingest_dropped_total{reason="skew"}` in this cycle.
        skew_drops: u64,
    },
    /// The fetch failed: no observation at all, clean or bad, but pending evidence may be
    /// retried.
    FetchFailed,
}

/// How one exchange ended.
#[derive(Clone, Copy, Debug)]
pub enum Outcome<'a> {
    /// The operator answered.
    Http {
        /// The status code.
        status: u16,
        /// The response headers.
        headers: HeaderList<'a>,
    },
    /// Connection, TLS authentication or HTTP protocol error.
    Transport,
    /// The daemon's own timer for [`Transmit::deadline_ms`] fired first.
    TimedOut,
}

/// Inputs of [`Reporter::handle`].
#[derive(Clone, Copy, Debug)]
pub enum ReporterInput<'a> {
    /// A cycle finished; fold its observation before anything else (before a refresh can
    /// be cancelled or the poller replaced).
    Cycle(Cycle),
    /// An exchange ended.
    Response {
        /// [`Transmit::exchange`].
        exchange: ExchangeId,
        /// How it ended.
        outcome: Outcome<'a>,
    },
    /// [`Reporter::poll_timeout`] was reached.
    Timeout,
}

/// "POST this report": encode [`Report::headers`] on an empty-body request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transmit {
    /// Feed back with the outcome.
    pub exchange: ExchangeId,
    /// The report.
    pub report: Report,
    /// When the exchange's [`REPORT_BUDGET`] runs out, on the caller's clock.
    pub deadline_ms: u64,
}

/// The state that must outlive a poller or certificate reload: epoch, sequence, count and
/// pending evidence. Deliberately not `Clone`: one reporter carries the evidence at a time.
/// An exchange in flight is abandoned (not counted as a failure); its report stays pending.
#[derive(Debug, PartialEq, Eq)]
pub struct ReporterHandover {
    epoch: Epoch,
    replica: Replica,
    last_sequence: u64,
    cumulative: u64,
    pending: Option<Report>,
    acknowledged: Option<Report>,
    next_exchange: u64,
    may_send: bool,
}

/// The exchange in flight.
#[derive(Debug)]
struct Exchange {
    id: ExchangeId,
    report: Report,
    deadline_ms: u64,
}

/// The gateway-side state machine.
#[derive(Debug)]
pub struct Reporter {
    epoch: Epoch,
    replica: Replica,
    /// The last sequence handed to a report (0: none yet).
    last_sequence: u64,
    /// Skew drops since the epoch began, saturating at `u64::MAX`.
    cumulative: u64,
    /// The report that must be acknowledged before the operator's view is current.
    pending: Option<Report>,
    /// The last pending report the operator acknowledged.
    acknowledged: Option<Report>,
    exchange: Option<Exchange>,
    next_exchange: u64,
    /// One delivery attempt granted by the latest cycle and not yet used.
    may_send: bool,
    metrics: ReporterMetrics,
}

impl Reporter {
    /// A fresh process: `epoch` is the daemon's random nonzero draw.
    pub fn new(epoch: Epoch, replica: Replica, metrics: ReporterMetrics) -> Self {
        Self::resume(
            ReporterHandover {
                epoch,
                replica,
                last_sequence: 0,
                cumulative: 0,
                pending: None,
                acknowledged: None,
                next_exchange: 0,
                may_send: false,
            },
            metrics,
        )
    }

    /// Takes over from a committed reload. A staged or rejected reload never calls this:
    /// the old reporter keeps running and nothing is published twice.
    pub fn resume(handover: ReporterHandover, metrics: ReporterMetrics) -> Self {
        Self {
            epoch: handover.epoch,
            replica: handover.replica,
            last_sequence: handover.last_sequence,
            cumulative: handover.cumulative,
            pending: handover.pending,
            acknowledged: handover.acknowledged,
            exchange: None,
            next_exchange: handover.next_exchange,
            may_send: handover.may_send,
            metrics,
        }
    }

    /// Hands the evidence to the reporter of a committed reload. An exchange in flight is
    /// abandoned uncounted, and its attempt is given back so the new poller may retry.
    pub fn into_handover(self) -> ReporterHandover {
        let may_send = self.may_send || self.exchange.is_some();
        ReporterHandover {
            epoch: self.epoch,
            replica: self.replica,
            last_sequence: self.last_sequence,
            cumulative: self.cumulative,
            pending: self.pending,
            acknowledged: self.acknowledged,
            next_exchange: self.next_exchange,
            may_send,
        }
    }

    /// This process's identity.
    pub fn epoch(&self) -> Epoch {
        self.epoch
    }

    /// Skew drops since the epoch began (saturated at `u64::MAX`).
    pub fn cumulative(&self) -> u64 {
        self.cumulative
    }

    /// The report awaiting acknowledgment, if any.
    pub fn pending(&self) -> Option<&Report> {
        self.pending.as_ref()
    }

    /// The last report the operator acknowledged while it was pending.
    pub fn acknowledged(&self) -> Option<&Report> {
        self.acknowledged.as_ref()
    }

    /// Whether the sequence is spent: the last report took `u64::MAX` and nothing can
    /// follow it, so the operator keeps this process's evidence unresolved for good.
    pub fn is_latched(&self) -> bool {
        self.last_sequence == u64::MAX
    }

    /// Feeds one input. `now_ms` is milliseconds on any clock that does not go backwards;
    /// only deadlines are computed from it.
    pub fn handle(&mut self, now_ms: u64, input: ReporterInput<'_>) {
        match input {
            ReporterInput::Cycle(cycle) => self.on_cycle(cycle),
            ReporterInput::Response { exchange, outcome } => self.on_response(exchange, outcome),
            ReporterInput::Timeout => {
                if self
                    .exchange
                    .as_ref()
                    .is_some_and(|e| e.deadline_ms <= now_ms)
                {
                    self.exchange = None;
                    self.metrics.failure(FailureReason::Timeout);
                }
            }
        }
    }

    /// The request to send now: the pending report, once per granted attempt, never two
    /// at a time.
    pub fn poll_transmit(&mut self, now_ms: u64) -> Option<Transmit> {
        if self.exchange.is_some() || !self.may_send {
            return None;
        }
        let report = self.pending.clone()?;
        self.may_send = false;
        let id = ExchangeId(self.next_exchange);
        self.next_exchange += 1;
        let deadline_ms = now_ms.saturating_add(REPORT_BUDGET.as_millis() as u64);
        self.exchange = Some(Exchange {
            id,
            report: report.clone(),
            deadline_ms,
        });
        Some(Transmit {
            exchange: id,
            report,
            deadline_ms,
        })
    }

    /// When the exchange in flight runs out of budget.
    pub fn poll_timeout(&self) -> Option<u64> {
        self.exchange.as_ref().map(|e| e.deadline_ms)
    }

    fn on_cycle(&mut self, cycle: Cycle) {
        self.may_send = true;
        let Cycle::Committed { skew_drops } = cycle else {
            // A failed fetch observed nothing: no clean report, but the attempt it
            // granted may retry pending evidence.
            return;
        };
        if skew_drops > 0 {
            self.cumulative = self.cumulative.saturating_add(skew_drops);
            let pending_bad = self.pending.as_ref().is_some_and(|p| !p.clean());
            // A pending bad report is kept exactly (the drops follow once it is
            // acknowledged); a pending clean one is superseded.
            if !pending_bad && self.cumulative > self.expected_counter() {
                self.create(false);
            }
        } else if self.pending.is_none() && self.acknowledged.as_ref().is_some_and(|a| !a.clean()) {
            self.create(true);
        }
    }

    /// The counter the operator will hold once what is pending settles.
    fn expected_counter(&self) -> u64 {
        self.pending
            .as_ref()
            .or(self.acknowledged.as_ref())
            .map_or(0, Report::rejected)
    }

    /// Makes the next report pending; `false` when the sequence or counter is latched and
    /// this kind of report can no longer be made.
    fn create(&mut self, clean: bool) -> bool {
        let Some(sequence) = self.last_sequence.checked_add(1) else {
            return false;
        };
        let Ok(report) = Report::new(
            self.epoch,
            sequence,
            self.cumulative,
            clean,
            self.replica.clone(),
        ) else {
            return false;
        };
        self.last_sequence = sequence;
        self.pending = Some(report);
        true
    }

    fn on_response(&mut self, exchange: ExchangeId, outcome: Outcome<'_>) {
        let current = self.exchange.as_ref().is_some_and(|e| e.id == exchange);
        if !current {
            // An abandoned or superseded exchange: its failure was counted (or it never
            // failed). A valid echo naming the pending report still proves it persisted,
            // since no two reports of this epoch share a sequence.
            if let Outcome::Http {
                status: 204,
                headers,
            } = outcome
                && let Ok(ack) = Ack::from_headers(headers.iter().copied())
            {
                self.on_ack(ack);
            }
            return;
        }
        let Some(sent) = self.exchange.take() else {
            return;
        };
        let failure = match outcome {
            Outcome::Http {
                status: 204,
                headers,
            } => match Ack::from_headers(headers.iter().copied()) {
                Ok(ack) if ack == sent.report.ack() => {
                    self.on_ack(ack);
                    return;
                }
                _ => FailureReason::Acknowledgment,
            },
            Outcome::Http { .. } => FailureReason::Status,
            Outcome::Transport => FailureReason::Transport,
            Outcome::TimedOut => FailureReason::Timeout,
        };
        self.metrics.failure(failure);
    }

    /// Clears the pending report only if the acknowledgment names exactly it; an
    /// acknowledgment of an older, superseded report changes nothing.
    fn on_ack(&mut self, ack: Ack) {
        let matches = ack.epoch == self.epoch
            && self
                .pending
                .as_ref()
                .is_some_and(|p| p.sequence() == ack.sequence);
        if !matches {
            return;
        }
        let Some(acknowledged) = self.pending.take() else {
            return;
        };
        let behind = self.cumulative > acknowledged.rejected();
        self.acknowledged = Some(acknowledged);
        if behind {
            // Drops folded while a bad report was pending: report them next.
            self.create(false);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::headers::{HEADER_EPOCH, HEADER_SEQUENCE};

    struct Gateway {
        reporter: Reporter,
        metrics: ReporterMetrics,
        now: u64,
    }

    impl Gateway {
        fn new() -> Self {
            let metrics = ReporterMetrics::default();
            let reporter = Reporter::new(
                Epoch::new(0xabc).unwrap(),
                Replica::new("gw-0").unwrap(),
                metrics.clone(),
            );
            Self {
                reporter,
                metrics,
                now: 0,
            }
        }

        fn cycle(&mut self, skew_drops: u64) {
            self.now += 1_000;
            self.reporter.handle(
                self.now,
                ReporterInput::Cycle(Cycle::Committed { skew_drops }),
            );
        }

        fn fetch_failed(&mut self) {
            self.now += 1_000;
            self.reporter
                .handle(self.now, ReporterInput::Cycle(Cycle::FetchFailed));
        }

        fn send(&mut self) -> Option<Transmit> {
            self.reporter.poll_transmit(self.now)
        }

        fn respond(&mut self, exchange: ExchangeId, outcome: Outcome<'_>) {
            self.reporter
                .handle(self.now, ReporterInput::Response { exchange, outcome });
        }

        fn echo(&mut self, exchange: ExchangeId, ack: Ack) {
            let owned = ack.headers();
            let headers: Vec<(&[u8], &[u8])> = owned
                .iter()
                .map(|(n, v)| (n.as_bytes(), v.as_bytes()))
                .collect();
            self.respond(
                exchange,
                Outcome::Http {
                    status: 204,
                    headers: &headers,
                },
            );
        }

        fn ack(&mut self, transmit: &Transmit) {
            self.echo(transmit.exchange, transmit.report.ack());
        }

        fn pending(&self) -> Option<(u64, u64, bool)> {
            self.reporter
                .pending()
                .map(|p| (p.sequence(), p.rejected(), p.clean()))
        }
    }

    #[test]
    fn a_bad_cycle_makes_a_rejected_report_with_the_cumulative_count() {
        let mut g = Gateway::new();
        g.cycle(3);
        let t = g.send().unwrap();
        assert_eq!(
            (t.report.sequence(), t.report.rejected(), t.report.clean()),
            (1, 3, false)
        );
        assert_eq!(t.deadline_ms, g.now + REPORT_BUDGET.as_millis() as u64);
        assert_eq!(
            t.report.headers()[0],
            ("x-grid-ingest-version", "1".to_owned())
        );
    }

    #[test]
    fn clean_cycles_with_nothing_unresolved_send_nothing_and_count_nothing() {
        let mut g = Gateway::new();
        for _ in 0..3 {
            g.cycle(0);
            assert!(g.send().is_none());
        }
        assert_eq!(g.metrics.total_failures(), 0);
    }

    #[test]
    fn later_clean_cycles_do_not_replace_an_unacknowledged_bad_report() {
        let mut g = Gateway::new();
        g.cycle(2);
        let first = g.send().unwrap();
        g.respond(first.exchange, Outcome::Transport);
        g.cycle(0);
        g.cycle(0);
        let retry = g.send().unwrap();
        assert_eq!(retry.report, first.report, "resent exactly");
        assert_ne!(retry.exchange, first.exchange);
    }

    #[test]
    fn drops_during_a_pending_bad_report_are_reported_once_it_is_acknowledged() {
        let mut g = Gateway::new();
        g.cycle(2);
        let first = g.send().unwrap();
        g.cycle(5);
        assert_eq!(g.pending(), Some((1, 2, false)), "kept exactly");
        g.ack(&first);
        assert_eq!(g.pending(), Some((2, 7, false)));
        let next = g.send().unwrap();
        assert_eq!(next.report.rejected(), 7);
    }

    #[test]
    fn a_clean_report_follows_an_acknowledged_bad_one_and_then_nothing_is_pending() {
        let mut g = Gateway::new();
        g.cycle(2);
        let bad = g.send().unwrap();
        g.ack(&bad);
        assert_eq!(g.pending(), None);
        g.cycle(0);
        let clean = g.send().unwrap();
        assert_eq!(
            (
                clean.report.sequence(),
                clean.report.rejected(),
                clean.report.clean()
            ),
            (2, 2, true)
        );
        g.ack(&clean);
        assert_eq!(g.pending(), None);
        g.cycle(0);
        assert!(g.send().is_none());
        assert_eq!(g.metrics.total_failures(), 0);
    }

    #[test]
    fn a_new_rejection_supersedes_an_unacknowledged_clean_report() {
        let mut g = Gateway::new();
        g.cycle(1);
        let bad = g.send().unwrap();
        g.ack(&bad);
        g.cycle(0);
        assert_eq!(g.pending(), Some((2, 1, true)));
        g.cycle(4);
        assert_eq!(g.pending(), Some((3, 5, false)));
    }

    #[test]
    fn a_delayed_acknowledgment_of_a_superseded_clean_report_clears_nothing() {
        let mut g = Gateway::new();
        g.cycle(1);
        let bad = g.send().unwrap();
        g.ack(&bad);
        g.cycle(0);
        let clean = g.send().unwrap();
        g.cycle(4); // new rejection while the clean report is in flight
        g.ack(&clean); // the operator persisted the clean one; its echo arrives late
        assert_eq!(g.pending(), Some((3, 5, false)), "newer bad evidence kept");
        assert_eq!(g.reporter.acknowledged().unwrap().sequence(), 1);
        let next = g.send().unwrap();
        assert_eq!(next.report.sequence(), 3);
        assert_eq!(g.metrics.total_failures(), 0, "a good echo is no failure");
    }

    #[test]
    fn a_failed_fetch_makes_no_clean_report_but_retries_pending_evidence() {
        let mut g = Gateway::new();
        g.cycle(1);
        let bad = g.send().unwrap();
        g.ack(&bad);
        g.fetch_failed();
        assert!(
            g.send().is_none(),
            "no clean observation from a failed fetch"
        );
        g.cycle(3);
        let t = g.send().unwrap();
        g.respond(t.exchange, Outcome::Transport);
        g.fetch_failed();
        assert_eq!(g.send().unwrap().report, t.report);
    }

    #[test]
    fn each_cycle_grants_one_attempt() {
        let mut g = Gateway::new();
        g.cycle(1);
        let t = g.send().unwrap();
        assert!(g.send().is_none(), "never two at a time");
        g.respond(
            t.exchange,
            Outcome::Http {
                status: 503,
                headers: &[],
            },
        );
        assert!(
            g.send().is_none(),
            "the failed attempt used this cycle's grant"
        );
        g.cycle(0);
        assert!(g.send().is_some());
    }

    #[test]
    fn each_failed_delivery_is_counted_once_by_reason() {
        let mut g = Gateway::new();
        g.cycle(1);
        let t = g.send().unwrap();
        g.respond(t.exchange, Outcome::Transport);
        g.respond(t.exchange, Outcome::Transport); // a repeat of a closed exchange
        g.cycle(0);
        let t = g.send().unwrap();
        g.respond(
            t.exchange,
            Outcome::Http {
                status: 404,
                headers: &[],
            },
        );
        g.cycle(0);
        let t = g.send().unwrap();
        g.respond(t.exchange, Outcome::TimedOut);
        g.cycle(0);
        let t = g.send().unwrap();
        g.respond(
            t.exchange,
            Outcome::Http {
                status: 204,
                headers: &[],
            },
        );
        for reason in FailureReason::ALL {
            assert_eq!(g.metrics.failure_count(reason), 1, "{reason:?}");
        }
        assert_eq!(g.pending(), Some((1, 1, false)), "evidence kept for retry");
    }

    #[test]
    fn a_mismatched_or_repeated_echo_is_an_acknowledgment_failure() {
        let mut g = Gateway::new();
        g.cycle(1);
        let t = g.send().unwrap();
        let wrong = Ack {
            epoch: t.report.epoch(),
            sequence: 2,
        };
        g.echo(t.exchange, wrong);
        g.cycle(0);
        let t = g.send().unwrap();
        let epoch = t.report.epoch().to_string();
        let headers: [(&[u8], &[u8]); 3] = [
            (HEADER_EPOCH.as_bytes(), epoch.as_bytes()),
            (HEADER_SEQUENCE.as_bytes(), b"1"),
            (HEADER_SEQUENCE.as_bytes(), b"1"),
        ];
        g.respond(
            t.exchange,
            Outcome::Http {
                status: 204,
                headers: &headers,
            },
        );
        assert_eq!(g.metrics.failure_count(FailureReason::Acknowledgment), 2);
        assert!(g.pending().is_some());
    }

    #[test]
    fn an_older_operator_refusing_the_route_is_a_status_failure_and_polling_goes_on() {
        let mut g = Gateway::new();
        g.cycle(1);
        for _ in 0..3 {
            let t = g.send().unwrap();
            g.respond(
                t.exchange,
                Outcome::Http {
                    status: 404,
                    headers: &[],
                },
            );
            g.cycle(0);
        }
        assert_eq!(g.metrics.failure_count(FailureReason::Status), 3);
        assert_eq!(g.pending(), Some((1, 1, false)));
    }

    #[test]
    fn a_timeout_is_counted_once_and_a_late_acknowledgment_still_counts_as_delivery() {
        let mut g = Gateway::new();
        g.cycle(1);
        let t = g.send().unwrap();
        assert_eq!(g.reporter.poll_timeout(), Some(t.deadline_ms));
        g.reporter.handle(t.deadline_ms - 1, ReporterInput::Timeout);
        assert_eq!(g.metrics.total_failures(), 0, "not yet");
        g.reporter.handle(t.deadline_ms, ReporterInput::Timeout);
        g.reporter.handle(t.deadline_ms, ReporterInput::Timeout);
        g.respond(t.exchange, Outcome::TimedOut);
        assert_eq!(g.metrics.failure_count(FailureReason::Timeout), 1);
        g.ack(&t);
        assert_eq!(
            g.pending(),
            None,
            "the echo proves the exact report is persisted"
        );
        assert_eq!(g.metrics.total_failures(), 1);
    }

    #[test]
    fn an_echo_from_another_epoch_acknowledges_nothing() {
        let mut g = Gateway::new();
        g.cycle(1);
        let t = g.send().unwrap();
        g.respond(t.exchange, Outcome::Transport);
        g.echo(
            t.exchange,
            Ack {
                epoch: Epoch::new(0xdef).unwrap(),
                sequence: 1,
            },
        );
        assert!(g.pending().is_some());
    }

    #[test]
    fn a_reload_hands_over_epoch_sequence_count_and_pending_evidence() {
        let mut g = Gateway::new();
        g.cycle(1);
        let bad = g.send().unwrap();
        g.ack(&bad);
        g.cycle(2); // folded before the poller is replaced
        let in_flight = g.send().unwrap();
        let handover = g.reporter.into_handover();
        g.reporter = Reporter::resume(handover, g.metrics.clone());
        assert_eq!(g.reporter.epoch(), Epoch::new(0xabc).unwrap());
        assert_eq!(g.reporter.cumulative(), 3);
        assert_eq!(g.pending(), Some((2, 3, false)));
        assert_eq!(
            g.reporter.poll_timeout(),
            None,
            "the exchange was abandoned"
        );
        assert_eq!(g.metrics.total_failures(), 0, "abandoning is not a failure");
        let retry = g.send().unwrap();
        assert_eq!(retry.report, in_flight.report);
        assert_ne!(retry.exchange, in_flight.exchange);
        // The old exchange's late echo still acknowledges the same report.
        g.ack(&in_flight);
        assert_eq!(g.pending(), None);
        g.ack(&retry);
        assert_eq!(g.metrics.total_failures(), 0);
        g.cycle(0);
        assert_eq!(g.send().unwrap().report.sequence(), 3);
    }

    #[test]
    fn the_counter_latches_at_the_maximum_instead_of_wrapping() {
        let mut g = Gateway::new();
        g.cycle(u64::MAX - 1);
        let t = g.send().unwrap();
        g.ack(&t);
        g.cycle(5);
        let t = g.send().unwrap();
        assert_eq!((t.report.rejected(), t.report.clean()), (u64::MAX, false));
        assert!(t.report.is_terminal());
        g.ack(&t);
        g.cycle(7);
        g.cycle(0);
        assert_eq!(g.reporter.cumulative(), u64::MAX);
        assert_eq!(g.pending(), None, "no clean report at the maximum counter");
        assert!(g.send().is_none());
    }

    #[test]
    fn the_sequence_latches_at_the_maximum_instead_of_wrapping() {
        let mut g = Gateway::new();
        g.reporter.last_sequence = u64::MAX - 2;
        g.cycle(1);
        let t = g.send().unwrap();
        assert_eq!(t.report.sequence(), u64::MAX - 1);
        g.ack(&t);
        g.cycle(1);
        let t = g.send().unwrap();
        assert_eq!(
            (t.report.sequence(), t.report.clean()),
            (u64::MAX, false),
            "the last sequence carries rejected evidence"
        );
        g.ack(&t);
        assert!(g.reporter.is_latched());
        g.cycle(0);
        g.cycle(9);
        assert_eq!(g.pending(), None);
        assert!(g.send().is_none());
    }

    #[test]
    fn a_clean_report_is_never_made_at_the_maximum_sequence() {
        let mut g = Gateway::new();
        g.reporter.last_sequence = u64::MAX - 2;
        g.cycle(1);
        let t = g.send().unwrap();
        assert_eq!(t.report.sequence(), u64::MAX - 1);
        g.ack(&t);
        g.cycle(0);
        assert!(g.send().is_none(), "clean cannot take the last sequence");
        g.cycle(2);
        let last = g.send().unwrap();
        assert_eq!(
            (last.report.sequence(), last.report.clean()),
            (u64::MAX, false)
        );
        g.ack(&last);
        g.cycle(0);
        assert!(
            g.send().is_none(),
            "the evidence at the maximum stays unresolved"
        );
    }
}
