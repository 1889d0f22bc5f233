//! Turns one provider's scrape outcomes into its batches: the EPP tracker decides what to
//! say, this module numbers and frames it.
//!
//! No I/O here: the caller passes in the body (or the failure) and `now`, and gets back
//! the batch to put in the store.

use crate::Error;
use crate::batch::{Batch, BatchMeta, Fence, Row};
use crate::epp::{
    LineRefusals, PoolSelector, ProviderConfig as TrackerConfig, ProviderTracker, PublishedSample,
    Readiness, ScrapeBody, ScrapeFailure, ScrapeInput, ScrapeTiming, StaleWindow,
};
use crate::exposition;

/// What one scrape outcome counted as.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Observed {
    /// The failure class the scrape counts as; `None`: ok.
    pub failure: Option<ScrapeFailure>,
    /// Lines of the body the parser refused, per reason (all zero for a failed fetch).
    pub refused: LineRefusals,
}

/// One provider as its site publishes it: what names its batches and how its readiness
/// ages. The operator builds it from its configuration; the simulator from a scenario.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProviderSpec {
    /// `grid_provider`.
    pub name: String,
    /// The `InferenceProvider`'s UID (`provider_uid`): a recreated object is another one.
    pub uid: String,
    /// Its generation (`grid_provider_config_generation`).
    pub generation: u64,
    /// Which of the EPP's pools is this provider.
    pub pool: PoolSelector,
    /// `staleMetricsSeconds` in milliseconds; `None`: half the signal TTL.
    pub stale_metrics_ms: Option<u64>,
}

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
        provider: &ProviderSpec,
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
                    pool: provider.pool.clone(),
                },
                now,
            ),
            uid: provider.uid.clone(),
            generation: provider.generation,
            epoch,
            next_sequence: 1,
            timing: ScrapeTiming {
                interval_ms: scrape_interval_ms,
                stale_metrics_ms: provider.stale_metrics_ms,
                signal_ttl_ms,
            },
        }
    }

    /// This publisher, numbering its batches from `sequence` on: a provider whose
    /// configuration changed keeps its fence moving up in the same epoch instead of
    /// starting again at 1, which every receiver would refuse as `delayed`.
    #[must_use]
    pub fn starting_at(mut self, sequence: u64) -> Self {
        self.next_sequence = sequence.max(1);
        self
    }

    /// The sequence its next batch carries.
    pub fn next_sequence(&self) -> u64 {
        self.next_sequence
    }

    /// The provider's name (`grid_provider`).
    pub fn name(&self) -> &str {
        &self.tracker.config().provider
    }

    /// Feeds one scrape outcome observed at `now`.
    ///
    /// The body is read leniently ([`ScrapeBody`]): an EPP's exposition carries dozens
    /// of plugin families grid never reads, and one odd line among them must not fail
    /// the scrape and, after the stale window, a serving provider. Its good lines are
    /// read and its refused lines counted; it is a `parse` failure only when no sample
    /// line was usable at all.
    pub fn observe(&mut self, now: u64, outcome: Result<&[u8], ScrapeFailure>) -> Observed {
        let (failure, refused) = match outcome {
            Ok(body) => {
                let body = ScrapeBody::parse(body);
                let refused = *body.refused();
                if !body.is_unusable() {
                    self.tracker
                        .handle(now, ScrapeInput::Parsed(body.into_samples()));
                    return Observed {
                        failure: None,
                        refused,
                    };
                }
                (ScrapeFailure::Parse, refused)
            }
            Err(failure) => (failure, LineRefusals::default()),
        };
        self.tracker.handle(
            now,
            ScrapeInput::<Vec<exposition::Sample<'_>>>::Failed(failure),
        );
        Observed {
            failure: Some(failure),
            refused,
        }
    }

    /// Marks the provider Unavailable (its configuration says it cannot serve), or
    /// clears it: the verdict is then not ready with [`crate::epp::ReadyReason::Unavailable`].
    pub fn set_unavailable(&mut self, unavailable: bool) {
        self.tracker.set_unavailable(unavailable);
    }

    /// The readiness verdict at `now` given the latest scrape pass duration (the one the
    /// next batch publishes).
    pub fn readiness(&self, now: u64, latest_pass_ms: u64) -> Readiness {
        self.tracker.readiness(now, self.window(latest_pass_ms))
    }

    /// The stale window given the latest scrape pass duration.
    pub fn window(&self, latest_pass_ms: u64) -> StaleWindow {
        self.timing.window(latest_pass_ms)
    }

    /// The next batch at `now`: everything the tracker concludes, framed with this
    /// process's epoch and the next sequence.
    pub fn publish(&mut self, now: u64, latest_pass_ms: u64) -> Result<Batch, Error> {
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
fn frame(
    site: &str,
    provider: &str,
    uid: &str,
    generation: u64,
    fence: Fence,
    now: u64,
    samples: &[PublishedSample],
) -> Result<Batch, Error> {
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
    use crate::exposition::SyntaxError;

    use super::*;

    fn provider() -> ProviderSpec {
        ProviderSpec {
            name: "m".into(),
            uid: "a/m".into(),
            generation: 3,
            pool: PoolSelector::All,
            stale_metrics_ms: Some(10_000),
        }
    }

    const BODY: &[u8] = b"llm_d_epp_ready_endpoints{name=\"p\"} 2\nllm_d_epp_average_running_requests{name=\"p\"} 1.5\nllm_d_epp_average_queue_size{name=\"p\"} 0.5\n";

    #[test]
    fn a_parsed_scrape_publishes_ready_with_increasing_sequences() {
        let mut p = Publisher::new("a", &provider(), 7_000, 1_000, 30_000, 10_000);
        assert_eq!(p.observe(10_000, Ok(BODY)), Observed::default());
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
        named.pool = PoolSelector::Named("other".into());
        let mut p = Publisher::new("a", &named, 1, 1_000, 30_000, 0);
        p.observe(0, Ok(BODY));
        let batch = p.publish(0, 0).unwrap();
        assert!(
            batch
                .rows
                .iter()
                .all(|r| r.name() != "grid_provider_ready_endpoints")
        );
        named.pool = PoolSelector::Named("p".into());
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
    fn a_body_with_no_usable_line_is_a_parse_failure() {
        let mut p = Publisher::new("a", &provider(), 1, 1_000, 30_000, 0);
        let seen = p.observe(0, Ok(b"not exposition {\n<html>\n"));
        assert_eq!(seen.failure, Some(ScrapeFailure::Parse));
        assert_eq!(seen.refused.total(), 2);
        assert_eq!(
            p.observe(0, Err(ScrapeFailure::Timeout)).failure,
            Some(ScrapeFailure::Timeout)
        );
    }

    fn ready_of(batch: &Batch) -> Option<f64> {
        batch
            .rows
            .iter()
            .find(|r| r.name() == "grid_provider_ready")
            .map(Row::value)
    }

    #[test]
    fn one_malformed_unrelated_family_still_yields_a_ready_provider_with_the_bad_lines_counted() {
        let mut body = b"# HELP plugin_odd A plugin's family.\n# TYPE plugin_odd gauge\n\
            plugin_odd{kind=\"a\",kind=\"b\"} 1\nplugin_odd{kind=\"c} 2\n"
            .to_vec();
        body.extend_from_slice(BODY);
        let mut p = Publisher::new("a", &provider(), 1, 1_000, 30_000, 0);
        for now in [0, 1_000, 20_000] {
            let seen = p.observe(now, Ok(&body));
            assert_eq!(seen.failure, None, "at {now}");
            assert_eq!(seen.refused.get(SyntaxError::DuplicateLabel), 1);
            assert_eq!(seen.refused.get(SyntaxError::LabelValue), 1);
            assert_eq!(seen.refused.total(), 2);
        }
        // Past the 10 s staleMetricsSeconds, still answered and ready.
        let batch = p.publish(20_000, 0).unwrap();
        assert_eq!(ready_of(&batch), Some(1.0));
        let endpoints = batch
            .rows
            .iter()
            .find(|r| r.name() == "grid_provider_ready_endpoints")
            .map(Row::value);
        assert_eq!(endpoints, Some(2.0));
    }

    #[test]
    fn a_refused_line_of_the_ready_family_leaves_readiness_unknown_not_false() {
        let mut body = BODY.to_vec();
        body.extend_from_slice(b"llm_d_epp_ready_endpoints{name=\"q\"} 0x\n");
        let mut p = Publisher::new("a", &provider(), 1, 1_000, 30_000, 0);
        for now in [0, 1_000, 2_000] {
            let seen = p.observe(now, Ok(&body));
            assert_eq!(seen.failure, None);
            assert_eq!(seen.refused.get(SyntaxError::Value), 1);
        }
        let batch = p.publish(2_000, 0).unwrap();
        assert_eq!(ready_of(&batch), None, "unknown, neither ready nor not");
        assert!(
            batch
                .rows
                .iter()
                .all(|r| r.name() != "grid_provider_ready_endpoints")
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
