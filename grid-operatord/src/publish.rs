//! Turns one provider's scrape outcomes into its batches: the EPP tracker decides what to
//! say, this module numbers and frames it.
//!
//! No I/O here: the scrape loop passes in the body (or the failure) and `now`, and gets
//! back the batch to put in the store.

use grid_signals::Error as SignalsError;
use grid_signals::batch::{Batch, BatchMeta, Fence, Row};
use grid_signals::epp::{
    PoolSelector, ProviderConfig as TrackerConfig, ProviderTracker, PublishedSample, ScrapeFailure,
    ScrapeInput, ScrapeTiming, StaleWindow,
};
use grid_signals::exposition;

use crate::config::ProviderConfig;

/// One provider's publishing state: its tracker and its place in the publication order.
#[derive(Debug)]
pub struct Publisher {
    tracker: ProviderTracker,
    uid: String,
    generation: u64,
    epoch: u64,
    next_sequence: u64,
    timing: ScrapeTiming,
}

impl Publisher {
    /// A provider of `site` first known at `now` (ms since the Unix epoch), publishing in
    /// `epoch` (this process's publisher epoch).
    pub fn new(
        site: &str,
        provider: &ProviderConfig,
        epoch: u64,
        scrape_interval_ms: u64,
        signal_ttl_ms: u64,
        now: u64,
    ) -> Self {
        Self {
            tracker: ProviderTracker::new(
                TrackerConfig {
                    site: site.to_owned(),
                    provider: provider.name.clone(),
                    pool: provider
                        .pool
                        .clone()
                        .map_or(PoolSelector::All, PoolSelector::Named),
                },
                now,
            ),
            uid: provider.uid.clone(),
            generation: provider.generation,
            epoch,
            next_sequence: 1,
            timing: ScrapeTiming {
                interval_ms: scrape_interval_ms,
                stale_metrics_ms: provider.stale_metrics.map(|d| d.as_millis() as u64),
                signal_ttl_ms,
            },
        }
    }

    /// Feeds one scrape outcome observed at `now`. A body that does not parse becomes a
    /// `parse` failure; the returned class is what the scrape counts as (`None`: ok).
    pub fn observe(
        &mut self,
        now: u64,
        outcome: Result<&[u8], ScrapeFailure>,
    ) -> Option<ScrapeFailure> {
        let failure = match outcome {
            Ok(body) => match exposition::parse_strict(body) {
                Ok(samples) => {
                    self.tracker.handle(now, ScrapeInput::Parsed(samples));
                    return None;
                }
                Err(_) => ScrapeFailure::Parse,
            },
            Err(failure) => failure,
        };
        self.tracker.handle(
            now,
            ScrapeInput::<Vec<exposition::Sample<'_>>>::Failed(failure),
        );
        Some(failure)
    }

    /// The stale window given the latest scrape pass duration.
    pub fn window(&self, latest_pass_ms: u64) -> StaleWindow {
        self.timing.window(latest_pass_ms)
    }

    /// The next batch at `now`: everything the tracker concludes, framed with this
    /// process's epoch and the next sequence.
    pub fn publish(&mut self, now: u64, latest_pass_ms: u64) -> Result<Batch, SignalsError> {
        let window = self.window(latest_pass_ms);
        let samples = self.tracker.publication(now, window);
        let batch = frame(
            &self.tracker.config().site,
            &self.tracker.config().provider,
            &self.uid,
            self.generation,
            Fence::new(self.epoch, self.next_sequence),
            now,
            &samples,
        )?;
        self.next_sequence += 1;
        Ok(batch)
    }
}

/// Frames `samples` as one batch (metadata stamped `now`).
pub fn frame(
    site: &str,
    provider: &str,
    uid: &str,
    generation: u64,
    fence: Fence,
    now: u64,
    samples: &[PublishedSample],
) -> Result<Batch, SignalsError> {
    let meta = BatchMeta::new(
        site,
        provider,
        uid,
        fence,
        samples.len() as u64,
        generation,
        now,
    )?;
    let rows = samples
        .iter()
        .map(Row::from_published)
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Batch::new(meta, rows))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn provider() -> ProviderConfig {
        ProviderConfig {
            name: "m".into(),
            url: "http://127.0.0.1/metrics".parse().unwrap(),
            timeout: Duration::from_secs(1),
            stale_metrics: Some(Duration::from_secs(10)),
            uid: "a/m".into(),
            generation: 3,
            ca_file: None,
            pool: None,
        }
    }

    const BODY: &[u8] = b"llm_d_epp_ready_endpoints{name=\"p\"} 2\nllm_d_epp_average_running_requests{name=\"p\"} 1.5\nllm_d_epp_average_queue_size{name=\"p\"} 0.5\n";

    #[test]
    fn a_parsed_scrape_publishes_ready_with_increasing_sequences() {
        let mut p = Publisher::new("a", &provider(), 7_000, 1_000, 30_000, 10_000);
        assert_eq!(p.observe(10_000, Ok(BODY)), None);
        let first = p.publish(10_000, 0).unwrap();
        assert_eq!(first.meta.fence(), Fence::new(7_000, 1));
        assert_eq!(first.meta.generation(), 3);
        assert_eq!(first.meta.uid(), "a/m");
        assert!(first.is_complete());
        let ready = first
            .rows
            .iter()
            .find(|r| r.name() == "grid_provider_ready")
            .unwrap();
        assert!((ready.value() - 1.0).abs() < f64::EPSILON);
        let endpoints = first
            .rows
            .iter()
            .find(|r| r.name() == "grid_provider_ready_endpoints")
            .unwrap();
        assert!((endpoints.value() - 2.0).abs() < f64::EPSILON);
        let second = p.publish(11_000, 0).unwrap();
        assert_eq!(second.meta.fence(), Fence::new(7_000, 2));
    }

    #[test]
    fn a_named_pool_reads_only_that_pool() {
        let mut named = provider();
        named.pool = Some("other".into());
        let mut p = Publisher::new("a", &named, 1, 1_000, 30_000, 0);
        p.observe(0, Ok(BODY));
        let batch = p.publish(0, 0).unwrap();
        assert!(
            batch
                .rows
                .iter()
                .all(|r| r.name() != "grid_provider_ready_endpoints")
        );
        named.pool = Some("p".into());
        let mut p = Publisher::new("a", &named, 1, 1_000, 30_000, 0);
        p.observe(0, Ok(BODY));
        let batch = p.publish(0, 0).unwrap();
        assert!(
            batch
                .rows
                .iter()
                .any(|r| r.name() == "grid_provider_ready_endpoints")
        );
    }

    #[test]
    fn a_body_that_does_not_parse_is_a_parse_failure() {
        let mut p = Publisher::new("a", &provider(), 1, 1_000, 30_000, 0);
        assert_eq!(
            p.observe(0, Ok(b"not exposition {")),
            Some(ScrapeFailure::Parse)
        );
        assert_eq!(
            p.observe(0, Err(ScrapeFailure::Timeout)),
            Some(ScrapeFailure::Timeout)
        );
    }

    #[test]
    fn a_capped_body_leaves_readiness_unknown_so_ready_is_absent() {
        let mut p = Publisher::new("a", &provider(), 1, 1_000, 30_000, 0);
        p.observe(0, Err(ScrapeFailure::BodyCap));
        let batch = p.publish(0, 0).unwrap();
        assert!(batch.rows.iter().all(|r| r.name() != "grid_provider_ready"));
    }
}
