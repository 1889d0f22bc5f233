//! The scrape loop: every interval, scrape every provider's EPP concurrently (bounded by
//! the [`Scraper`]), feed each outcome to the site machine (grid-signals' `Site`, which
//! frames and stores the batch) as it arrives, and count what it says.

use std::time::Duration;

use grid_signals::epp::PoolSelector;
use grid_signals::epp::{
    LineRefusals, Readiness, ReadyReason, ReadyReasonLabel, ReadyStatus, ScrapeFailure,
};
use grid_signals::exposition::SyntaxError;
use grid_signals::site::{ProviderSpec, SiteInput, SiteOutput};
use grid_signals::store::IngestMetrics;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::clock::{self, Clock};
use crate::config::ProviderConfig;
use crate::scrape::Scraper;
use crate::site_machine::{SharedSignals, lock};
use grid_daemon::client::FetchTarget;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ScrapeLabels {
    provider: String,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReadyReasonLabels {
    provider: String,
    /// grid-signals' closed set of readiness reasons.
    reason: ReadyReasonLabel,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RefusedLineLabels {
    provider: String,
    /// The parser's closed set of reasons.
    reason: SyntaxError,
}

/// The scrape loop's series.
#[derive(Clone, Debug, Default)]
pub struct ScrapeMetrics {
    scrapes: Family<ScrapeLabels, Counter>,
    refused_lines: Family<RefusedLineLabels, Counter>,
    pass_seconds: Gauge<f64, std::sync::atomic::AtomicU64>,
    passes: Counter,
    publish_failures: Counter,
    ready_reason: Family<ReadyReasonLabels, Gauge>,
    /// Each provider's last scrape: its result (`ok` or the failure class) and when it
    /// ended, for the routing evidence.
    last: std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, (&'static str, u64)>>>,
}

impl ScrapeMetrics {
    /// Registers `grid_operator_scrapes_total{provider,result}`,
    /// `grid_operator_scrape_lines_refused_total{provider,reason}`,
    /// `grid_operator_scrape_pass_seconds`, `grid_operator_scrape_passes_total` and
    /// `grid_operator_publish_failures_total`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "grid_operator_scrapes",
            "EPP scrapes by provider and result (ok or a failure class)",
            m.scrapes.clone(),
        );
        registry.register(
            "grid_operator_scrape_lines_refused",
            "EPP exposition lines the parser refused, by provider and reason; the rest of the body is still read",
            m.refused_lines.clone(),
        );
        registry.register(
            "grid_operator_scrape_pass_seconds",
            "Duration of the latest complete scrape pass over every provider",
            m.pass_seconds.clone(),
        );
        registry.register(
            "grid_operator_scrape_passes",
            "Complete scrape passes over every provider; /readyz answers 200 after the first",
            m.passes.clone(),
        );
        registry.register(
            "grid_operator_provider_ready_reason",
            "1 for the reason of each own provider's current readiness verdict (its Ready condition's reason, a failed scrape's class included), 0 for every other reason",
            m.ready_reason.clone(),
        );
        registry.register(
            "grid_operator_publish_failures",
            "Provider batches that could not be framed (a bound of docs/wire.md was exceeded)",
            m.publish_failures.clone(),
        );
        m
    }

    /// Complete scrape passes so far: the operator is ready once it has scraped every
    /// provider once.
    pub fn passes(&self) -> u64 {
        self.passes.get()
    }

    /// `provider`'s last scrape: its result and when it ended (ms since the Unix epoch).
    pub fn last_scrape(&self, provider: &str) -> Option<(&'static str, u64)> {
        self.last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(provider)
            .copied()
    }

    /// Scrapes of `provider` with `result` (`ok` or a failure class).
    pub fn count(&self, provider: &str, result: &'static str) -> u64 {
        self.scrapes
            .get_or_create(&ScrapeLabels {
                provider: provider.to_owned(),
                result,
            })
            .get()
    }

    /// Lines of `provider`'s scrapes refused for `reason`.
    pub fn refused_lines(&self, provider: &str, reason: SyntaxError) -> u64 {
        self.refused_counter(provider, reason).get()
    }

    /// Creates every reason's series of `provider` at 0, so a dashboard sees them before
    /// the first refused line or readiness verdict.
    pub fn add_provider(&self, provider: &str) {
        for reason in SyntaxError::ALL {
            self.refused_counter(provider, reason);
        }
        for reason in ReadyReasonLabel::ALL {
            self.ready_reason_gauge(provider, reason);
        }
    }

    /// Whether `reason` is `provider`'s current readiness reason (1) or not (0).
    pub fn ready_reason(&self, provider: &str, reason: ReadyReasonLabel) -> i64 {
        self.ready_reason_gauge(provider, reason).get()
    }

    fn ready_reason_gauge(&self, provider: &str, reason: ReadyReasonLabel) -> Gauge {
        self.ready_reason
            .get_or_create(&ReadyReasonLabels {
                provider: provider.to_owned(),
                reason,
            })
            .clone()
    }

    /// Moves `provider`'s current reason from `from` to `to`.
    fn set_ready_reason(&self, provider: &str, from: Option<ReadyReason>, to: ReadyReason) {
        if let Some(from) = from {
            self.ready_reason_gauge(provider, from.label()).set(0);
        }
        self.ready_reason_gauge(provider, to.label()).set(1);
    }

    fn refused_counter(&self, provider: &str, reason: SyntaxError) -> Counter {
        self.refused_lines
            .get_or_create(&RefusedLineLabels {
                provider: provider.to_owned(),
                reason,
            })
            .clone()
    }

    fn count_refused(&self, provider: &str, refused: &LineRefusals) {
        for (reason, lines) in refused.iter().filter(|(_, n)| *n > 0) {
            self.refused_counter(provider, reason).inc_by(lines);
        }
    }
}

/// One scraped provider.
#[derive(Clone, Debug)]
pub(crate) struct ScrapedProvider {
    /// Where and how to scrape.
    pub target: FetchTarget,
    /// Its configuration: the name labels carry, and what its publisher is built from.
    pub config: ProviderConfig,
}

/// What the site machine publishes `provider` as.
pub(crate) fn spec_of(provider: &ProviderConfig) -> ProviderSpec {
    ProviderSpec {
        name: provider.name.clone(),
        uid: provider.uid.clone(),
        generation: provider.generation,
        pool: provider
            .pool
            .clone()
            .map_or(PoolSelector::All, PoolSelector::Named),
        stale_metrics_ms: provider.stale_metrics.map(|d| d.as_millis() as u64),
    }
}

/// One provider's latest readiness verdict, beside the configuration it was reached
/// under: the Ready condition it becomes names that generation and UID, so a verdict
/// is never written onto a provider it was not reached for.
#[derive(Clone, Debug, PartialEq)]
pub struct Verdict {
    /// The provider, as configured when the verdict was reached.
    pub provider: ProviderConfig,
    /// Its latest verdict; `None` before the first.
    pub readiness: Option<Readiness>,
}

/// Each provider's verdict, in the scrape loop's order.
pub type Verdicts = Vec<Verdict>;

/// The scrape loop.
#[derive(Debug)]
pub(crate) struct ScrapeLoop {
    /// Every provider.
    pub providers: Vec<ScrapedProvider>,
    /// The shared concurrency bound.
    pub scraper: Scraper,
    /// Where batches go.
    pub signals: SharedSignals,
    /// Scrape results.
    pub metrics: ScrapeMetrics,
    /// Publication drops (normally none: own batches are well-formed).
    pub ingest: IngestMetrics,
    /// Scrape interval.
    pub interval: Duration,
    /// The wall clock scrapes are stamped with.
    pub clock: Clock,
    /// Each provider's latest verdict, by index, updated on every transition: what the
    /// controller mode writes as the Ready condition.
    pub verdicts: tokio::sync::watch::Sender<Verdicts>,
    /// The provider list to scrape from now on, when the configuration changes under a
    /// running operator (the controller's live reconfiguration).
    pub changes: tokio::sync::watch::Receiver<Vec<ScrapedProvider>>,
}

/// Whether a provider's readiness changed from `last` to `now`: the first verdict and
/// every change of reason count, a repeat of the same reason does not (a change of
/// status always changes the reason).
pub(crate) fn transition(last: Option<ReadyReason>, now: ReadyReason) -> bool {
    last != Some(now)
}

impl ScrapeLoop {
    /// Scrapes at the interval forever. A pass that runs long delays the next one rather
    /// than overlapping it, and its duration widens the readiness floor.
    pub(crate) async fn run(mut self) {
        for p in &self.providers {
            self.metrics.add_provider(&p.config.name);
        }
        let mut ticker = tokio::time::interval(self.interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut latest_pass_ms = 0u64;
        let mut following = true;
        loop {
            // A new provider list is taken between passes only, so every outcome of a
            // pass is fed under the indexes it was started with; and at the first
            // boundary: a pass longer than the interval leaves the tick ready too, and an
            // unbiased pick could run pass after pass on the old list.
            tokio::select! {
                biased;
                changed = self.changes.changed(), if following => {
                    match changed {
                        Ok(()) => {
                            let next = self.changes.borrow_and_update().clone();
                            self.reconfigure(next);
                        }
                        Err(_) => following = false,
                    }
                    continue;
                }
                _ = ticker.tick() => {}
            }
            let started = clock::monotonic();
            self.pass(latest_pass_ms).await;
            latest_pass_ms = started.elapsed().as_millis() as u64;
            self.metrics
                .pass_seconds
                .set(latest_pass_ms as f64 / 1000.0);
            self.metrics.passes.inc();
            let now = self.clock.wall_ms();
            lock(&self.signals).handle(now, SiteInput::Expire);
        }
    }

    /// Scrapes `next` from now on: the site machine keeps each unchanged provider's
    /// publisher (and this loop its last verdict), gives a changed one a fresh lifetime in
    /// the same epoch, and withdraws a removed one.
    fn reconfigure(&mut self, next: Vec<ScrapedProvider>) {
        let specs: Vec<ProviderSpec> = next.iter().map(|p| spec_of(&p.config)).collect();
        let now = self.clock.wall_ms();
        let (kept, outputs) = {
            let mut site = lock(&self.signals);
            let kept = site.reconfigure(now, &specs);
            for (i, p) in next.iter().enumerate() {
                site.set_unavailable(i, p.config.unavailable);
            }
            let outputs: Vec<SiteOutput> = std::iter::from_fn(|| site.poll()).collect();
            (kept, outputs)
        };
        let last = self.verdicts.borrow().clone();
        let verdicts = next
            .iter()
            .zip(&kept)
            .map(|(p, k)| Verdict {
                provider: p.config.clone(),
                readiness: k.and_then(|i| last.get(i)).and_then(|v| v.readiness),
            })
            .collect();
        // A provider not kept (replaced or withdrawn) no longer exports its last reason;
        // a replacement exports its own from its first verdict.
        for (i, v) in last.iter().enumerate() {
            if let Some(r) = v.readiness
                && !kept.contains(&Some(i))
            {
                self.metrics
                    .ready_reason_gauge(&v.provider.name, r.reason.label())
                    .set(0);
            }
        }
        for p in &next {
            self.metrics.add_provider(&p.config.name);
        }
        tracing::info!(
            providers = next.len(),
            kept = kept.iter().flatten().count(),
            "the provider list changed; scraping the new one in the same epoch"
        );
        self.providers = next;
        self.verdicts.send_replace(verdicts);
        for output in outputs {
            self.record(output);
        }
    }

    async fn pass(&mut self, latest_pass_ms: u64) {
        let mut set = tokio::task::JoinSet::new();
        for (i, p) in self.providers.iter().enumerate() {
            let (scraper, target) = (self.scraper.clone(), p.target.clone());
            set.spawn(async move { (i, scraper.scrape(&target).await) });
        }
        while let Some(joined) = set.join_next().await {
            let Ok((i, outcome)) = joined else { continue };
            let now = self.clock.wall_ms();
            // Counted and logged after the lock is released, so a log line never holds
            // up the relay or /metrics.
            let outputs: Vec<SiteOutput> = {
                let mut site = lock(&self.signals);
                site.handle(
                    now,
                    SiteInput::Scraped {
                        provider: i,
                        outcome: outcome.as_deref().map_err(|f| *f),
                        latest_pass_ms,
                    },
                );
                std::iter::from_fn(|| site.poll()).collect()
            };
            for output in outputs {
                self.record(output);
            }
        }
    }

    /// Logs and exports a provider's readiness when its reason changed: once per
    /// transition, at info when it can serve or is unknown, at warn when it cannot.
    fn record_readiness(&mut self, provider: usize, readiness: Readiness) {
        let Some(name) = self.providers.get(provider).map(|p| p.config.name.as_str()) else {
            return;
        };
        // The verdict last published is the reason a transition is judged against.
        let last = self
            .verdicts
            .borrow()
            .get(provider)
            .and_then(|v| v.readiness)
            .map(|r| r.reason);
        if !transition(last, readiness.reason) {
            return;
        }
        self.metrics.set_ready_reason(name, last, readiness.reason);
        self.verdicts.send_modify(|v| {
            if let Some(slot) = v.get_mut(provider) {
                slot.readiness = Some(readiness);
            }
        });
        let previous = last.map_or("none", ReadyReason::as_str);
        let class = readiness.reason.failure().map(ScrapeFailure::as_str);
        let status = readiness.status.as_str();
        let reason = readiness.reason.as_str();
        if readiness.status == ReadyStatus::NotReady {
            tracing::warn!(provider = %name, status, reason, class, previous, "provider readiness changed");
        } else {
            tracing::info!(provider = %name, status, reason, class, previous, "provider readiness changed");
        }
    }

    /// Counts what the site machine said of one scrape.
    fn record(&mut self, output: SiteOutput) {
        match output {
            SiteOutput::Scraped { provider, observed } => {
                let name = &self.providers[provider].config.name;
                let result = observed.failure.map_or("ok", ScrapeFailure::as_str);
                self.metrics
                    .scrapes
                    .get_or_create(&ScrapeLabels {
                        provider: name.clone(),
                        result,
                    })
                    .inc();
                {
                    let mut last = self
                        .metrics
                        .last
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    // One entry per provider configured (at most 256): a name not seen
                    // before replaces nothing; removed providers' entries are dropped
                    // at the next reconfiguration.
                    last.insert(name.clone(), (result, self.clock.wall_ms()));
                }
                if observed.refused.total() > 0 {
                    self.metrics.count_refused(name, &observed.refused);
                    tracing::debug!(
                        provider = %name,
                        lines = observed.refused.total(),
                        "EPP exposition lines refused; the rest of the body was read"
                    );
                }
            }
            SiteOutput::Published {
                provider,
                report,
                readiness,
                ..
            } => {
                self.ingest.record(&report);
                self.record_readiness(provider, readiness);
            }
            SiteOutput::PeerIngested { report } => self.ingest.record(&report),
            SiteOutput::Withdrawn {
                provider,
                fence,
                report,
            } => {
                self.ingest.record(&report);
                tracing::info!(%provider, epoch = fence.epoch, sequence = fence.sequence, "provider withdrawn: its last batch reads not ready");
            }
            SiteOutput::NotPublished { provider, error } => {
                self.metrics.publish_failures.inc();
                let name = &self.providers[provider].config.name;
                tracing::warn!(provider = %name, %error, "provider batch not published");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_verdict_and_each_change_of_reason_are_transitions_and_a_repeat_is_not() {
        let ready = ReadyReason::EndpointsReady;
        let timeout = ReadyReason::ScrapeFailed(ScrapeFailure::Timeout);
        assert!(transition(None, ready));
        assert!(!transition(Some(ready), ready));
        assert!(transition(Some(ready), timeout));
        assert!(!transition(Some(timeout), timeout));
        // Another failure class is another reason.
        assert!(transition(
            Some(timeout),
            ReadyReason::ScrapeFailed(ScrapeFailure::Connect)
        ));
    }

    #[test]
    fn a_provider_exports_exactly_its_current_reason_as_one() {
        let mut registry = Registry::default();
        let m = ScrapeMetrics::register(&mut registry);
        m.add_provider("llama");
        for reason in ReadyReasonLabel::ALL {
            assert_eq!(m.ready_reason("llama", reason), 0);
        }
        m.set_ready_reason("llama", None, ReadyReason::EndpointsReady);
        let timeout = ReadyReason::ScrapeFailed(ScrapeFailure::Timeout);
        m.set_ready_reason("llama", Some(ReadyReason::EndpointsReady), timeout);
        let ones: Vec<_> = ReadyReasonLabel::ALL
            .into_iter()
            .filter(|r| m.ready_reason("llama", *r) == 1)
            .collect();
        assert_eq!(ones, [ReadyReasonLabel::ScrapeTimeout]);
        let text = grid_daemon::exposition::render(&registry);
        assert!(
            text.contains(
                "grid_operator_provider_ready_reason{provider=\"llama\",reason=\"scrape_timeout\"} 1"
            ),
            "{text}"
        );
    }
}
