//! One provider's state, kept by the operator between scrapes: feed it each scrape's
//! outcome, read back the verdict and the batch samples.

use super::failure::ScrapeFailure;
use super::in_flight::{InFlightEstimate, operator_in_flight};
use super::latency::{CounterChange, Latency, LatencyWindow};
use super::publication::{PublicationInput, PublishedSample, publication};
use super::readiness::{Readiness, ReadinessState, ReadyObservation, StaleWindow};
use super::reading::{PoolSelector, RejectionCounts, SampleView, ScrapeReading, read_scrape};

/// Who the provider is and which pool of its EPP it reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProviderConfig {
    /// The site (`grid_site`).
    pub site: String,
    /// The provider (`grid_provider`).
    pub provider: String,
    /// Which of the EPP's pools is this provider.
    pub pool: PoolSelector,
}

/// One scrape's outcome, as the operator's driver hands it over.
#[derive(Debug)]
pub enum ScrapeInput<I> {
    /// The body parsed; its samples.
    Parsed(I),
    /// No parsed body, for this reason.
    Failed(ScrapeFailure),
}

/// What feeding a scrape changed, for the operator's counters and logs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScrapeSummary {
    /// Samples refused while reading, per reason.
    pub rejected: RejectionCounts,
    /// Whether the engine answered or the EPP restarted since the last scrape.
    pub counters: CounterChange,
}

/// Per-provider state: readiness, the latency window and the newest parsed scrape.
#[derive(Clone, Debug)]
pub struct ProviderTracker {
    config: ProviderConfig,
    readiness: ReadinessState,
    latency: LatencyWindow,
    held: Option<(u64, ScrapeReading)>,
}

impl ProviderTracker {
    /// A provider first known at `now` (ms since the Unix epoch).
    pub fn new(config: ProviderConfig, now: u64) -> Self {
        Self {
            config,
            readiness: ReadinessState::new(now),
            latency: LatencyWindow::new(),
            held: None,
        }
    }

    /// The provider's identity and pool.
    pub fn config(&self) -> &ProviderConfig {
        &self.config
    }

    /// Feeds one scrape outcome observed at `now`.
    pub fn handle<I>(&mut self, now: u64, input: ScrapeInput<I>) -> ScrapeSummary
    where
        I: IntoIterator,
        I::Item: SampleView,
    {
        match input {
            ScrapeInput::Parsed(samples) => self.on_scrape(now, samples),
            ScrapeInput::Failed(failure) => {
                self.on_failure(now, failure);
                ScrapeSummary::default()
            }
        }
    }

    /// Feeds one parsed scrape taken at `now`.
    pub fn on_scrape<I>(&mut self, now: u64, samples: I) -> ScrapeSummary
    where
        I: IntoIterator,
        I::Item: SampleView,
    {
        let reading = read_scrape(samples, &self.config.pool);
        let observation = reading
            .ready_endpoints
            .map_or(ReadyObservation::NoReadySeries, ReadyObservation::Endpoints);
        self.readiness.on_answer(now, observation);
        let counters = self.latency.push(now, reading.counters.clone());
        if counters.engine_answered {
            self.readiness.on_engine_answer(now);
        }
        let summary = ScrapeSummary {
            rejected: reading.rejected,
            counters,
        };
        self.held = Some((now, reading));
        summary
    }

    /// Feeds one failed scrape at `now`. What was read before stays held (with its own,
    /// older stamp) until the stale window passes.
    pub fn on_failure(&mut self, now: u64, failure: ScrapeFailure) {
        self.readiness.on_failure(now, failure);
    }

    /// Marks the provider Unavailable, or clears it.
    pub fn set_unavailable(&mut self, unavailable: bool) {
        self.readiness.set_unavailable(unavailable);
    }

    /// The verdict at `now`.
    pub fn readiness(&self, now: u64, window: StaleWindow) -> Readiness {
        self.readiness.verdict(now, window)
    }

    /// The newest parsed scrape and when it was taken, while inside the stale window.
    pub fn held(&self, now: u64, window: StaleWindow) -> Option<(u64, &ScrapeReading)> {
        self.held
            .as_ref()
            .filter(|(at, _)| now.saturating_sub(*at) <= window.0)
            .map(|(at, r)| (*at, r))
    }

    /// The in-flight conclusion from the held scrape.
    pub fn in_flight(&self, now: u64, window: StaleWindow) -> Option<InFlightEstimate> {
        self.held(now, window)
            .and_then(|(_, r)| operator_in_flight(r))
    }

    /// The latency figures at `now`.
    pub fn latency(&self, now: u64) -> Latency {
        self.latency.latency(now)
    }

    /// The samples of this provider's batch at `now`.
    pub fn publication(&self, now: u64, window: StaleWindow) -> Vec<PublishedSample> {
        publication(&PublicationInput {
            site: &self.config.site,
            provider: &self.config.provider,
            readiness: self.readiness(now, window),
            held: self.held(now, window),
            latency: self.latency(now),
        })
    }
}
