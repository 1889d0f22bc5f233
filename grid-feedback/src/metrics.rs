//! Metric handles for both ends. The daemons own the registry; each end registers its
//! families once and the state machines count through clones of the handles.
//!
//! Labels come only from the closed enums here: never a reporter identity, a header value
//! or an error string.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use grid_signals::labels::register_zeroed;

use crate::RefusalReason;

grid_signals::label_values! {
    label "event";
    /// What happened while the operator tried to store feedback: the `event` label of
    /// `grid_gateway_feedback_events_total`, exactly this closed set.
    pub enum Event {
        /// One Kubernetes 409 resource-version race.
        Conflict,
        /// All [`crate::MAX_WRITE_ATTEMPTS`] attempts lost a race.
        ConflictExhausted,
        /// Persisted reporter capacity refused a new identity.
        Overflow,
        /// A caller other than the site's own certificate submitted feedback.
        Unauthorized,
        /// Any other write error, or a storage response that could not be verified.
        WriteFailure,
    }
}

grid_signals::label_values! {
    label "reason";
    /// Why one delivery attempt failed: the `reason` label of
    /// `grid_signals_feedback_failures_total`.
    pub enum FailureReason {
        /// The exchange budget ([`crate::REPORT_BUDGET`]) expired.
        Timeout,
        /// Connection, authentication or HTTP-level error.
        Transport,
        /// A response other than 204 (an older operator refusing the route lands here).
        Status,
        /// A 204 whose echo is missing, repeated or names another report.
        Acknowledgment,
    }
}

/// The operator side's handles.
#[derive(Clone, Debug, Default)]
pub struct ReceiverMetrics {
    events: Family<Event, Counter>,
    refusals: Family<RefusalReason, Counter>,
    expired: Counter,
}

impl ReceiverMetrics {
    /// Registers `grid_gateway_feedback_events_total{event}` and
    /// `grid_operator_feedback_refusals_total{reason}`, every label pre-created at 0 so a
    /// dashboard sees the series before the first incident.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            events: register_zeroed(
                registry,
                "grid_gateway_feedback_events",
                "Feedback storage events on the operator: write races, exhausted retries, capacity overflow, unauthorized callers, write failures",
            ),
            refusals: register_zeroed(
                registry,
                "grid_operator_feedback_refusals",
                "Ingest feedback requests the operator refused, by reason",
            ),
            expired: Counter::default(),
        };
        registry.register(
            "grid_operator_feedback_evidence_expired",
            "Gateway processes whose unresolved rejection evidence expired after UNRESOLVED_RETENTION_MS of silence",
            metrics.expired.clone(),
        );
        metrics
    }

    pub(crate) fn event(&self, event: Event) {
        self.events.get_or_create(&event).inc();
    }

    pub(crate) fn expired(&self, records: u64) {
        self.expired.inc_by(records);
    }

    /// How many processes' unresolved evidence expired for silence.
    pub fn expired_count(&self) -> u64 {
        self.expired.get()
    }

    pub(crate) fn refusal(&self, reason: RefusalReason) {
        self.record_refusal(reason);
    }

    /// Counts a request the daemon refused for `reason` before the receiver saw it (its
    /// own queue in front of the receiver was full, or the budget ran out waiting), so
    /// every refusal lands in the one series.
    pub fn record_refusal(&self, reason: RefusalReason) {
        self.refusals.get_or_create(&reason).inc();
    }

    /// How many times `event` was counted; for tests and the daemon's self-checks.
    pub fn event_count(&self, event: Event) -> u64 {
        self.events.get_or_create(&event).get()
    }

    /// How many requests were refused for `reason`.
    pub fn refusal_count(&self, reason: RefusalReason) -> u64 {
        self.refusals.get_or_create(&reason).get()
    }
}

/// The gateway side's handles.
#[derive(Clone, Debug, Default)]
pub struct ReporterMetrics {
    failures: Family<FailureReason, Counter>,
}

impl ReporterMetrics {
    /// Registers `grid_signals_feedback_failures_total{reason}`, every reason pre-created.
    pub fn register(registry: &mut Registry) -> Self {
        Self {
            failures: register_zeroed(
                registry,
                "grid_signals_feedback_failures",
                "Failed ingest-feedback delivery attempts from the gateway, by reason",
            ),
        }
    }

    pub(crate) fn failure(&self, reason: FailureReason) {
        self.failures.get_or_create(&reason).inc();
    }

    /// How many deliveries failed for `reason`.
    pub fn failure_count(&self, reason: FailureReason) -> u64 {
        self.failures.get_or_create(&reason).get()
    }

    /// Failed deliveries over every reason.
    pub fn total_failures(&self) -> u64 {
        FailureReason::ALL
            .iter()
            .map(|r| self.failure_count(*r))
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::encoding::text::encode;

    #[test]
    fn the_receiver_exposes_exactly_the_closed_event_set() {
        let mut registry = Registry::default();
        let metrics = ReceiverMetrics::register(&mut registry);
        metrics.event(Event::Conflict);
        let mut text = String::new();
        encode(&mut text, &registry).unwrap();
        for event in Event::ALL {
            assert!(
                text.contains(&format!(
                    "grid_gateway_feedback_events_total{{event=\"{}\"}}",
                    event.as_str()
                )),
                "{text}"
            );
        }
        assert!(text.contains("grid_gateway_feedback_events_total{event=\"conflict\"} 1"));
        let event_lines = text
            .lines()
            .filter(|l| l.starts_with("grid_gateway_feedback_events_total"))
            .count();
        assert_eq!(event_lines, Event::ALL.len());
        assert!(text.contains("grid_operator_feedback_refusals_total{reason=\"replay\"} 0"));
    }

    #[test]
    fn the_reporter_exposes_its_four_failure_reasons() {
        let mut registry = Registry::default();
        let metrics = ReporterMetrics::register(&mut registry);
        metrics.failure(FailureReason::Acknowledgment);
        let mut text = String::new();
        encode(&mut text, &registry).unwrap();
        for reason in ["timeout", "transport", "status"] {
            assert!(text.contains(&format!(
                "grid_signals_feedback_failures_total{{reason=\"{reason}\"}} 0"
            )));
        }
        assert!(text.contains("grid_signals_feedback_failures_total{reason=\"acknowledgment\"} 1"));
        assert_eq!(metrics.total_failures(), 1);
    }
}
