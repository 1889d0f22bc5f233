//! The ingest counters a daemon exports.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use super::{DropReason, IngestReport};

/// Handles to the store's metrics, registered in the daemon's registry (libraries never
/// own one).
#[derive(Clone, Debug, Default)]
pub struct IngestMetrics {
    dropped: Family<DropReason, Counter>,
    relay_dropped_providers: Counter,
}

impl IngestMetrics {
    /// Registers `grid_signals_ingest_dropped_total{reason}` (the design texts' name, the
    /// same in both daemons) in `registry` and returns the handles.
    ///
    /// Every reason starts at 0 so a dashboard sees the full set before the first drop.
    pub fn register(registry: &mut Registry) -> Self {
        Self {
            dropped: crate::labels::register_zeroed(
                registry,
                "grid_signals_ingest_dropped",
                "Lines of ingested signal bodies refused, by reason",
            ),
            relay_dropped_providers: Counter::default(),
        }
    }

    /// Adds the drops of one ingest.
    pub fn record(&self, report: &IngestReport) {
        for (reason, lines) in report.dropped.iter() {
            self.dropped.get_or_create(&reason).inc_by(lines);
        }
    }

    /// Registers `grid_operator_relay_dropped_providers_total`: only an operator relays,
    /// so the series carries its process's prefix.
    pub fn register_relay(&self, registry: &mut Registry) {
        registry.register(
            "grid_operator_relay_dropped_providers",
            "Whole providers left out of a relay body to keep it within its budget",
            self.relay_dropped_providers.clone(),
        );
    }

    /// Adds providers a relay left out.
    pub fn record_relay_dropped(&self, providers: u64) {
        self.relay_dropped_providers.inc_by(providers);
    }

    /// The current count for `reason` (for the feedback reporter's skew evidence).
    pub fn dropped(&self, reason: DropReason) -> u64 {
        self.dropped.get_or_create(&reason).get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drops_are_exported_by_reason_with_every_reason_present() {
        let mut registry = Registry::default();
        let metrics = IngestMetrics::register(&mut registry);
        metrics.register_relay(&mut registry);
        let mut report = IngestReport::default();
        report.dropped.add(DropReason::Skew, 3);
        metrics.record(&report);
        metrics.record(&report);
        metrics.record_relay_dropped(2);
        assert_eq!(metrics.dropped(DropReason::Skew), 6);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(text.contains("grid_signals_ingest_dropped_total{reason=\"skew\"} 6"));
        for reason in DropReason::ALL {
            let line = format!(
                "grid_signals_ingest_dropped_total{{reason=\"{}\"}}",
                reason.as_str()
            );
            assert!(text.contains(&line), "{line} missing from\n{text}");
        }
        assert!(text.contains("grid_operator_relay_dropped_providers_total 2"));
    }
}
