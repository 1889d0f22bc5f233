//! The samples of one provider batch: the operator's conclusions (contract series) and
//! the raw EPP series it relays for the gateway's own load computation.
//!
//! Owned data only; the batch metadata line and the text encoding belong to
//! [`crate::batch`] and the exposition writer. A series the operator does not hold is
//! left out, never written as 0.

use super::in_flight::operator_in_flight;
use super::latency::Latency;
use super::names::{ENDPOINT_LABEL, EppMetric};
use super::readiness::{Readiness, ReadyStatus};
use super::reading::ScrapeReading;

/// `grid_provider_ready`: 1 ready, 0 not ready; absent when unknown.
pub const READY: &str = "grid_provider_ready";
/// `grid_provider_ready_reason{reason}`: 1, beside a `grid_provider_ready 0`, with the
/// verdict's reason ([`super::readiness::ReadyReasonLabel`]) and stamp, so a reader can
/// tell a provider the EPP showed down from one the operator could not read
/// ([`super::readiness::ReadyReasonLabel::is_unread`]).
pub const READY_REASON: &str = "grid_provider_ready_reason";
/// The label of [`READY_REASON`].
pub const READY_REASON_LABEL: &str = "reason";
/// `grid_provider_ready_endpoints`: the EPP's ready-endpoint count for the pool.
pub const READY_ENDPOINTS: &str = "grid_provider_ready_endpoints";
/// `grid_provider_in_flight_requests`: see [`super::in_flight::operator_in_flight`].
pub const IN_FLIGHT_REQUESTS: &str = "grid_provider_in_flight_requests";
/// `grid_provider_ttft_p50_seconds`.
pub const TTFT_P50_SECONDS: &str = "grid_provider_ttft_p50_seconds";
/// `grid_provider_ttft_p90_seconds`.
pub const TTFT_P90_SECONDS: &str = "grid_provider_ttft_p90_seconds";
/// `grid_provider_tpot_seconds`.
pub const TPOT_SECONDS: &str = "grid_provider_tpot_seconds";
/// `grid_provider_error_ratio`.
pub const ERROR_RATIO: &str = "grid_provider_error_ratio";

/// The site label every published sample carries.
pub const SITE_LABEL: &str = "grid_site";
/// The provider label every published sample carries.
pub const PROVIDER_LABEL: &str = "grid_provider";

/// The one-per-provider series of a ready provider's batch whose scrape read every
/// figure, in the order [`publication`] emits them: the contract's verdicts, then the
/// EPP's pool series relayed under their current names. Besides these a batch holds one
/// per-endpoint queue row per endpoint (between the averages and the flow-control queue)
/// and, while not ready, the reason.
pub const PROVIDER_SERIES: [&str; 13] = [
    READY,
    READY_ENDPOINTS,
    IN_FLIGHT_REQUESTS,
    TTFT_P50_SECONDS,
    TTFT_P90_SECONDS,
    TPOT_SECONDS,
    ERROR_RATIO,
    super::names::EPP_READY_ENDPOINTS,
    super::names::EPP_AVERAGE_RUNNING,
    super::names::EPP_AVERAGE_QUEUE,
    super::names::EPP_AVERAGE_KV_CACHE,
    super::names::EPP_STD_DEV_KV_CACHE,
    super::names::EPP_FLOW_CONTROL_QUEUE,
];

/// One sample of a provider batch.
#[derive(Clone, Debug, PartialEq)]
pub struct PublishedSample {
    /// Metric name.
    pub name: &'static str,
    /// `grid_site`, `grid_provider`, then any extra label (`model_server_endpoint`).
    pub labels: Vec<(&'static str, String)>,
    /// Value.
    pub value: f64,
    /// When the value was observed (ms since the Unix epoch).
    pub stamp_ms: u64,
}

/// What one provider's batch is built from.
#[derive(Clone, Copy, Debug)]
pub struct PublicationInput<'a> {
    /// The site (`grid_site`).
    pub site: &'a str,
    /// The provider (`grid_provider`).
    pub provider: &'a str,
    /// The verdict now.
    pub readiness: Readiness,
    /// The newest parsed scrape still held, with when it was taken.
    pub held: Option<(u64, &'a ScrapeReading)>,
    /// The latency figures now.
    pub latency: Latency,
}

struct Batch<'a> {
    site: &'a str,
    provider: &'a str,
    out: Vec<PublishedSample>,
}

impl Batch<'_> {
    fn push(
        &mut self,
        name: &'static str,
        value: Option<f64>,
        stamp_ms: u64,
        extra: Option<(&'static str, &str)>,
    ) {
        let Some(value) = value else { return };
        let mut labels = vec![
            (SITE_LABEL, self.site.to_owned()),
            (PROVIDER_LABEL, self.provider.to_owned()),
        ];
        if let Some((k, v)) = extra {
            labels.push((k, v.to_owned()));
        }
        self.out.push(PublishedSample {
            name,
            labels,
            value,
            stamp_ms,
        });
    }
}

/// The samples of one provider batch, contract series first, then the relayed raw EPP
/// series under their current names.
///
/// The raw averages (running, queue, KV cache and its spread) are relayed only while the
/// pool has a fresh endpoint: at zero the EPP stops updating them and they are frozen.
pub fn publication(input: &PublicationInput<'_>) -> Vec<PublishedSample> {
    let mut batch = Batch {
        site: input.site,
        provider: input.provider,
        out: Vec::new(),
    };
    let ready = match input.readiness.status {
        ReadyStatus::Ready => Some(1.0),
        ReadyStatus::NotReady => Some(0.0),
        ReadyStatus::Unknown => None,
    };
    batch.push(READY, ready, input.readiness.stamp_ms, None);
    if input.readiness.status == ReadyStatus::NotReady {
        batch.push(
            READY_REASON,
            Some(1.0),
            input.readiness.stamp_ms,
            Some((READY_REASON_LABEL, input.readiness.reason.label().as_str())),
        );
    }
    if let Some((at, reading)) = input.held {
        batch.push(READY_ENDPOINTS, reading.ready_endpoints, at, None);
        batch.push(
            IN_FLIGHT_REQUESTS,
            operator_in_flight(reading).map(|e| e.value),
            at,
            None,
        );
    }
    let l = input.latency;
    batch.push(TTFT_P50_SECONDS, l.ttft_p50, l.stamp_ms, None);
    batch.push(TTFT_P90_SECONDS, l.ttft_p90, l.stamp_ms, None);
    batch.push(TPOT_SECONDS, l.tpot, l.stamp_ms, None);
    batch.push(ERROR_RATIO, l.error_ratio, l.stamp_ms, None);
    if let Some((at, reading)) = input.held {
        let fresh = reading.ready_endpoints.is_some_and(|r| r > 0.0);
        let live = |v: Option<f64>| v.filter(|_| fresh);
        batch.push(
            EppMetric::ReadyEndpoints.current_name(),
            reading.ready_endpoints,
            at,
            None,
        );
        batch.push(
            EppMetric::AverageRunning.current_name(),
            live(reading.average_running),
            at,
            None,
        );
        batch.push(
            EppMetric::AverageQueue.current_name(),
            live(reading.average_queue),
            at,
            None,
        );
        batch.push(
            EppMetric::AverageKvCache.current_name(),
            live(reading.average_kv_cache),
            at,
            None,
        );
        batch.push(
            EppMetric::StdDevKvCache.current_name(),
            live(reading.std_dev_kv_cache),
            at,
            None,
        );
        for (endpoint, &queued) in &reading.per_endpoint_queue {
            batch.push(
                EppMetric::PerEndpointQueue.current_name(),
                Some(queued),
                at,
                Some((ENDPOINT_LABEL, endpoint)),
            );
        }
        batch.push(
            EppMetric::FlowControlQueue.current_name(),
            reading.flow_control_queue,
            at,
            None,
        );
    }
    batch.out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::epp::ReadyReason;

    #[test]
    fn a_ready_provider_with_every_figure_publishes_the_provider_series_in_their_order() {
        let reading = ScrapeReading {
            pools_seen: 1,
            ready_endpoints: Some(2.0),
            average_running: Some(1.0),
            average_queue: Some(0.5),
            average_kv_cache: Some(0.3),
            std_dev_kv_cache: Some(0.1),
            per_endpoint_queue: [("10.0.0.1:8000".to_owned(), 1.0)].into(),
            inflight_requests: Some(3.0),
            flow_control_queue: Some(0.0),
            ..ScrapeReading::default()
        };
        let samples = publication(&PublicationInput {
            site: "s",
            provider: "p",
            readiness: Readiness {
                status: ReadyStatus::Ready,
                reason: ReadyReason::EndpointsReady,
                stamp_ms: 1,
            },
            held: Some((1, &reading)),
            latency: Latency {
                ttft_p50: Some(0.1),
                ttft_p90: Some(0.2),
                tpot: Some(0.01),
                error_ratio: Some(0.0),
                stamp_ms: 1,
            },
        });
        let per_provider: Vec<&str> = samples
            .iter()
            .filter(|s| s.name != EppMetric::PerEndpointQueue.current_name())
            .map(|s| s.name)
            .collect();
        assert_eq!(per_provider, PROVIDER_SERIES);
    }
}
