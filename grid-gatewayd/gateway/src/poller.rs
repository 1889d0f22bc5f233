//! The signals loop: poll the local operator, ingest, refresh, publish, report back.
//!
//! One task owns the store, the scorer and the feedback reporter, so none of them needs a
//! lock. Each cycle (only while the gateway serves; at least every
//! `operator.pollIntervalSeconds`, sooner when a site's readiness changes):
//!
//! 1. `GET /v1/site/signals` over the operator mTLS client, a bounded long poll
//!    (grid-signals' `long_poll`: held by the operator up to the interval, answered as soon
//!    as the readiness of any site it holds changes), bounded by
//!    `operator.pollTimeoutSeconds` plus that wait and by
//!    [`grid_signals::exposition::MAX_EXPOSITION_BYTES`];
//! 2. ingest with the relay trusted for all sites; drops counted per reason;
//! 3. fold the cycle into the reporter (before the refresh, so nothing can cancel it);
//! 4. refresh and publish the new routing view atomically (also after a failed poll:
//!    readings age out by time, and a silent operator must turn into "unmeasured");
//! 5. when the reporter has something to send, one `POST /v1/site/signals/ingest` on its
//!    own task, bounded by `operator.feedbackTimeoutSeconds`; its outcome comes back on a channel and
//!    never fails or delays a poll.

use std::time::Duration;

use bytes::Bytes;
use grid_daemon::client::{Failed, poll_budget, read_response, with_wait, within};
use grid_feedback::{Cycle, ExchangeId, Outcome, Reporter, ReporterInput};
use grid_feedback::{Epoch, Replica};
use grid_signals::epp::ScrapeFailure;
use grid_signals::labels::{register_zeroed, zeroed};
use grid_signals::long_poll::{LongPoll, Wait};
use grid_signals::store::{DropReason, IngestMetrics, IngestReport};
use http::{Request, Uri};
use http_body_util::Full;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::sync::{mpsc, watch};

use crate::Error;
use crate::clock;
use grid_score::refresh::{Refresher, RoutingEvent};
use grid_score::routing::RoutingView;

use crate::upstream::HttpClient;
use crate::upstream::Published;

pub use grid_signals::wire::SIGNALS_PATH;

grid_signals::label_values! {
    label "result";
    /// How one poll ended (the `result` label of `grid_gateway_polls_total`).
    pub enum PollResult {
        /// A body was read and ingested.
        Ok,
        /// The exchange exceeded `operator.pollTimeoutSeconds`.
        Timeout,
        /// Connection, TLS (including an untrusted operator certificate) or HTTP error.
        Transport,
        /// The operator answered with a status other than 200.
        Status,
        /// The body was larger than [`grid_signals::exposition::MAX_EXPOSITION_BYTES`].
        BodyCap,
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModelLabels {
    model: String,
}

grid_signals::label_values! {
    label "result";
    /// How one probe of a site ejected for failing ended (the `result` of
    /// `grid_gateway_site_probes_total`).
    pub enum ProbeResult {
        /// The site answered the list of models (2xx): it is back in selection.
        Answered,
        /// It failed: refused, reset, any other status, or nothing within
        /// [`PROBE_TIMEOUT`]. A 404 (a server that does not list its models) fails too:
        /// such a site comes back when its ejection runs out.
        Failed,
    }
}

/// The path a site ejected for failing is probed at (under its base URL's prefix): the
/// `OpenAI` list of models, which every `OpenAI`-compatible server answers, costs no
/// generation and reaches the same server a request would.
pub const PROBE_PATH: &str = "/v1/models";

/// How long one probe may take, connect to answer head.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// The poll loop's metric handles, and why its last poll failed.
#[derive(Clone, Debug, Default)]
pub struct PollMetrics {
    // The poll loop's own.
    polls: Family<PollResult, Counter>,
    probes: Family<ProbeResult, Counter>,
    /// What the last poll's failure said (`/readyz` and the log say it too); none once a
    /// poll succeeded. Read only by `/readyz`, never on the request path.
    last_failure: std::sync::Arc<std::sync::Mutex<Option<String>>>,
    /// 1 while the feedback reporter holds evidence the operator has not acknowledged.
    feedback_pending: Gauge,
    // Per model, as of the last view published.
    shedding: Family<ModelLabels, Gauge>,
    routable: Family<ModelLabels, Gauge>,
    without_signals: Family<ModelLabels, Gauge>,
}

impl PollMetrics {
    /// Registers `grid_gateway_polls_total{result}`, `grid_gateway_model_shedding{model}`
    /// and `grid_gateway_model_routable{model}`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self {
            polls: register_zeroed(
                registry,
                "grid_gateway_polls",
                "Polls of the local operator, by result",
            ),
            probes: zeroed(),
            ..Self::default()
        };
        registry.register(
            "grid_gateway_model_shedding",
            "1 while the model answers 429 because every healthy site is full",
            m.shedding.clone(),
        );
        registry.register(
            "grid_gateway_model_routable",
            "1 while the model has at least one candidate not excluded",
            m.routable.clone(),
        );
        registry.register(
            "grid_gateway_model_without_signals",
            "1 while no candidate of the model has a fresh signal and it is routed by learned capacity alone",
            m.without_signals.clone(),
        );
        registry.register(
            "grid_gateway_feedback_evidence_pending",
            "1 while the gateway holds rejected-age evidence its operator has not acknowledged yet (its feedback report is pending), else 0",
            m.feedback_pending.clone(),
        );
        registry.register(
            "grid_gateway_site_probes",
            "Probes of sites ejected for failing, by result (answered, failed)",
            m.probes.clone(),
        );
        m
    }

    /// Count of polls that ended with `result`.
    pub fn polls(&self, result: PollResult) -> u64 {
        self.polls.get_or_create(&result).get()
    }

    /// Why the last poll failed, when it did.
    pub fn last_failure(&self) -> Option<String> {
        self.failure_slot().clone()
    }

    fn failure_slot(&self) -> std::sync::MutexGuard<'_, Option<String>> {
        self.last_failure
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The rustls error `e` is, or wraps in I/O errors (whose `source` skips what they wrap).
fn rustls_error<'e>(e: &'e (dyn std::error::Error + 'static)) -> Option<&'e rustls::Error> {
    let mut e = e;
    loop {
        if let Some(tls) = e.downcast_ref::<rustls::Error>() {
            return Some(tls);
        }
        e = e
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::get_ref)?;
    }
}

/// A name as rustls lists it (`DnsName("a.example")`), without its kind.
fn bare_name(listed: &str) -> &str {
    listed
        .split_once("(\"")
        .and_then(|(_, rest)| rest.strip_suffix("\")"))
        .unwrap_or(listed)
}

/// What a failed exchange with the operator says about its cause, for a person: an
/// operator certificate naming another name than `operator.identity` is said in those
/// words (both names), anything else is the error's chain of causes.
fn describe(error: &(dyn std::error::Error + 'static)) -> String {
    let causes = || std::iter::successors(Some(error), |e| e.source());
    for e in causes() {
        if let Some(rustls::Error::InvalidCertificate(
            rustls::CertificateError::NotValidForNameContext {
                expected,
                presented,
            },
        )) = rustls_error(e)
        {
            let presented = if presented.is_empty() {
                "no name".to_owned()
            } else {
                presented
                    .iter()
                    .map(|n| bare_name(n))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            return format!(
                "the operator's certificate names {presented}, but operator.identity expects {:?}",
                expected.to_str()
            );
        }
    }
    let mut text = String::new();
    for e in causes() {
        let part = e.to_string();
        if !text.contains(&part) {
            if !text.is_empty() {
                text.push_str(": ");
            }
            text.push_str(&part);
        }
        if let Some(inner) = e
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::get_ref)
        {
            let inner = inner.to_string();
            if !text.contains(&inner) {
                text.push_str(": ");
                text.push_str(&inner);
            }
        }
    }
    text
}

/// How the loop talks to its operator.
#[derive(Clone, Debug)]
pub struct PollerConfig {
    /// `https://host:port` of the operator.
    pub operator: Uri,
    /// Cadence.
    pub interval: Duration,
    /// Budget of one poll.
    pub poll_timeout: Duration,
    /// Budget of one feedback POST.
    pub feedback_timeout: Duration,
}

/// The answer of one feedback exchange, owned so it can cross the task boundary.
enum Delivery {
    Http {
        status: u16,
        headers: Vec<(Vec<u8>, Vec<u8>)>,
    },
    Transport,
    TimedOut,
}

/// The loop's state.
pub struct Poller {
    config: PollerConfig,
    client: HttpClient,
    refresher: Refresher,
    reporter: Reporter,
    published: Published,
    ingest_metrics: IngestMetrics,
    metrics: PollMetrics,
    started: std::time::Instant,
    live_refresh: std::sync::Arc<tokio::sync::Notify>,
    /// The previous poll's result: a change is logged above debug, so a gateway that
    /// never reaches its operator says so at the default level.
    last_result: Option<PollResult>,
    /// Reloaded model lists (SIGHUP), applied between polls.
    reloads: Option<mpsc::Receiver<Vec<grid_score::catalog::ModelSpec>>>,
    /// The client sites ejected for failing are probed with, when they are.
    prober: Option<HttpClient>,
}

impl std::fmt::Debug for Poller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Poller")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// The next reloaded model list, or never when there is no reload channel (or it closed).
async fn next_reload(
    reloads: &mut Option<mpsc::Receiver<Vec<grid_score::catalog::ModelSpec>>>,
) -> Option<Vec<grid_score::catalog::ModelSpec>> {
    if let Some(rx) = reloads {
        if let Some(models) = rx.recv().await {
            return Some(models);
        }
        // Every sender is gone: no reload can come any more.
        *reloads = None;
    }
    std::future::pending().await
}

/// A fresh random nonzero feedback epoch for this process, drawn from the operating
/// system's generator (`getrandom`): two gateway processes must never share an epoch,
/// and a predecessor's must not be guessable.
///
/// # Errors
///
/// When the OS generator fails.
pub fn random_epoch() -> Result<Epoch, Error> {
    // A zero draw has probability 2^-64 per try; four tries bound the loop.
    for _ in 0..4 {
        let word = getrandom::u64().map_err(|e| Error::Entropy {
            reason: e.to_string(),
        })?;
        if let Some(e) = Epoch::new(word) {
            return Ok(e);
        }
    }
    Err(Error::Entropy {
        reason: "the generator answered zero four times".into(),
    })
}

/// Sets `grid_gateway_model_shedding` and `grid_gateway_model_routable` of every model of
/// `view` to what `view` says.
fn mirror_gauges(metrics: &PollMetrics, view: &RoutingView) {
    for m in view.catalog().models() {
        let labels = ModelLabels {
            model: m.name.to_string(),
        };
        metrics
            .shedding
            .get_or_create(&labels)
            .set(i64::from(view.is_shedding(&m.name)));
        metrics
            .routable
            .get_or_create(&labels)
            .set(i64::from(view.is_routable(&m.name)));
        let blind = view
            .table()
            .get(&m.name)
            .is_some_and(|s| s.path() == Some(grid_score::Path::Fallback));
        metrics
            .without_signals
            .get_or_create(&labels)
            .set(i64::from(blind));
    }
}

/// Logs each change a refresh reports, once: at warn when a model or a site is lost, at
/// info when it is back.
fn log_events(events: &[RoutingEvent]) {
    for event in events {
        match event {
            RoutingEvent::Ejected {
                key,
                reason,
                until_ms,
            } => tracing::warn!(
                site = %key.site,
                provider = %key.provider,
                reason = reason.as_str(),
                for_ms = until_ms.saturating_sub(clock::wall_ms()),
                "site ejected for failing; probing it until it answers"
            ),
            RoutingEvent::Rejoined { key, cause } => tracing::info!(
                site = %key.site,
                provider = %key.provider,
                cause = cause.as_str(),
                "site back in selection"
            ),
            RoutingEvent::Unroutable { model } => tracing::warn!(
                %model,
                "every site of the model is out; it answers 503 until one is back"
            ),
            RoutingEvent::Routable { model } => {
                tracing::info!(%model, "the model routes again");
            }
            RoutingEvent::WithoutSignals { model } => tracing::warn!(
                %model,
                "no site of the model has a fresh signal; routing by learned capacity until one returns"
            ),
            RoutingEvent::SignalsBack { model } => {
                tracing::info!(%model, "signals are back; routing by load again");
            }
        }
    }
}

impl Poller {
    /// A poller publishing into `published`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        config: PollerConfig,
        client: HttpClient,
        refresher: Refresher,
        reporter: Reporter,
        published: Published,
        ingest_metrics: IngestMetrics,
        metrics: PollMetrics,
        live_refresh: std::sync::Arc<tokio::sync::Notify>,
    ) -> Self {
        // The view published before the first poll is already being routed on: its
        // per-model gauges exist from the start, not only once a poll has ended (which
        // an operator that does not answer holds off for a whole poll timeout).
        mirror_gauges(&metrics, &published.load());
        Self {
            config,
            client,
            refresher,
            reporter,
            published,
            ingest_metrics,
            metrics,
            started: clock::monotonic(),
            live_refresh,
            last_result: None,
            reloads: None,
            prober: None,
        }
    }

    /// Probes sites ejected for failing with `client` (a site client: TLS sites need the
    /// gateway's certificate); without one, an ejection ends only when its time runs out.
    #[must_use]
    pub fn with_prober(mut self, client: HttpClient) -> Self {
        self.prober = Some(client);
        self
    }

    /// Takes reloaded model lists from `reloads`: each replaces the catalog between two
    /// polls, learned state of the candidates kept carried over, and is published at once.
    #[must_use]
    pub fn with_reloads(
        mut self,
        reloads: mpsc::Receiver<Vec<grid_score::catalog::ModelSpec>>,
    ) -> Self {
        self.reloads = Some(reloads);
        self
    }

    /// The reporter's clock: milliseconds since this poller started (never goes back).
    fn mono_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Runs until `stop` turns true; returns the reporter so a reload can hand its
    /// evidence over.
    pub async fn run(mut self, mut stop: watch::Receiver<bool>) -> Reporter {
        // Polls are bounded long polls (grid_signals::long_poll): answered early when
        // the readiness of any site the operator holds changes, else at the interval.
        let mut schedule = LongPoll::new(self.config.interval.as_millis() as u64);
        let base = tokio::time::Instant::now();
        let ms = move || base.elapsed().as_millis() as u64;
        let mut next_poll = 0;
        let mut in_flight: Option<InFlight> = None;
        let (done_tx, mut done_rx) = mpsc::channel::<(ExchangeId, Delivery)>(4);
        let live = std::sync::Arc::clone(&self.live_refresh);
        let mut reloads = self.reloads.take();
        let mut probe_tick = tokio::time::interval(Duration::from_millis(
            grid_score::live::PROBE_INTERVAL_MS / 2,
        ));
        probe_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                () = until_stopped(&mut stop) => break,
                Some(models) = next_reload(&mut reloads) => {
                    self.refresher.replace_models(&models);
                    let refreshed = self.refresher.refresh(clock::wall_ms());
                    tracing::info!(models = models.len(), "model configuration reloaded; learned state of kept candidates carried over");
                    self.apply(refreshed);
                }
                Some((exchange, delivery)) = done_rx.recv() => self.delivered(exchange, &delivery),
                () = tokio::time::sleep_until(base + Duration::from_millis(next_poll)), if in_flight.is_none() => {
                    // A poll in flight is given up when the gateway stops (its one wait
                    // is the fetch, before any state changes): shutdown does not wait a
                    // poll for an operator that does not answer, and nothing else waits
                    // for it meanwhile.
                    schedule.started(ms());
                    in_flight = Some(Box::pin(self.fetch(schedule.wait())));
                }
                fetched = answer_of(&mut in_flight), if in_flight.is_some() => {
                    in_flight = None;
                    let now = ms();
                    next_poll = match &fetched {
                        Ok(f) => schedule.answered(now, f.generation),
                        Err(_) => schedule.failed(now),
                    };
                    self.cycle(fetched, &done_tx);
                }
                () = live.notified() => {
                    // An answer carried live evidence: fold it in now, not at the next
                    // poll, as grid-score's refresher allows (at most once per
                    // LIVE_REFRESH_MIN_INTERVAL_MS); answers arriving meanwhile leave one
                    // permit, however many there are.
                    self.refresher.wake_live();
                    if let Some(wait) = self.refresher.live_wait_ms(clock::wall_ms()) {
                        tokio::time::sleep(Duration::from_millis(wait)).await;
                    }
                    if let Some(refreshed) = self.refresher.refresh_live(clock::wall_ms()) {
                        self.apply(refreshed);
                    }
                }
                _ = probe_tick.tick() => self.probe_ejected(),
            }
        }
        self.reporter
    }

    fn cycle(&mut self, fetched: Fetch, done: &mpsc::Sender<(ExchangeId, Delivery)>) {
        let now_ms = clock::wall_ms();
        let (result, cycle) = match fetched {
            Err(result) => (result, Cycle::FetchFailed),
            Ok(Fetched {
                body, reference_ms, ..
            }) => {
                let report = match body {
                    Some(body) => {
                        self.refresher
                            .ingest(&body, reference_ms.unwrap_or(now_ms), now_ms)
                    }
                    None => IngestReport::body_cap(),
                };
                self.ingest_metrics.record(&report);
                let skew_drops = report.dropped.get(DropReason::Skew);
                let result = if body_was_capped(&report) {
                    PollResult::BodyCap
                } else {
                    PollResult::Ok
                };
                (result, Cycle::Committed { skew_drops })
            }
        };
        self.metrics.polls.get_or_create(&result).inc();
        self.log_change(result);
        let mono = self.mono_ms();
        self.reporter.handle(mono, ReporterInput::Cycle(cycle));
        self.publish(now_ms);
        self.reporter.handle(mono, ReporterInput::Timeout);
        self.mirror_pending();

        if let Some(tx) = self.reporter.poll_transmit(mono) {
            let req = self.feedback_request(&tx.report);
            let (client, budget, done) = (
                self.client.clone(),
                self.config.feedback_timeout,
                done.clone(),
            );
            tokio::spawn(async move {
                let delivery = match tokio::time::timeout(budget, client.request(req)).await {
                    Err(_) => Delivery::TimedOut,
                    Ok(Err(_)) => Delivery::Transport,
                    Ok(Ok(resp)) => Delivery::Http {
                        status: resp.status().as_u16(),
                        headers: resp
                            .headers()
                            .iter()
                            .map(|(k, v)| (k.as_str().as_bytes().to_vec(), v.as_bytes().to_vec()))
                            .collect(),
                    },
                };
                let _ = done.send((tx.exchange, delivery)).await;
            });
        }
    }

    /// Logs a poll result at the level [`log_level`] gives it.
    fn log_change(&mut self, result: PollResult) {
        let previous = self.last_result.replace(result);
        let operator = &self.config.operator;
        match log_level(previous, result) {
            Some(tracing::Level::WARN) => tracing::warn!(
                %operator,
                result = result.as_str(),
                cause = self.metrics.last_failure().unwrap_or_default(),
                "operator poll failed; every site ranks as unmeasured until one succeeds"
            ),
            Some(tracing::Level::INFO) => tracing::info!(%operator, "operator polls succeed again"),
            Some(_) => tracing::debug!(result = result.as_str(), "operator poll failed"),
            None => {}
        }
    }

    /// Refreshes and publishes the routing view as of `now_ms`.
    fn publish(&mut self, now_ms: u64) {
        let refreshed = self.refresher.refresh(now_ms);
        for e in &refreshed.refused {
            tracing::debug!(error = %e, "reading refused");
        }
        self.apply(refreshed);
    }

    /// Logs what a refresh changed and publishes its view.
    fn apply(&mut self, refreshed: grid_score::refresh::Refreshed) {
        log_events(&refreshed.events);
        self.publish_view(refreshed.view);
    }

    /// Probes every site ejected for failing whose probe is due, each on its own task
    /// bounded by [`PROBE_TIMEOUT`]: an answer (2xx) is recorded in the
    /// site's live slot, and the refresh it wakes brings the site back.
    fn probe_ejected(&mut self) {
        let Some(client) = &self.prober else {
            return;
        };
        for upstream in self.refresher.probes_due(clock::wall_ms()) {
            let Ok(uri) = crate::upstream::uri_for(
                &upstream,
                &http::uri::PathAndQuery::from_static(PROBE_PATH),
            ) else {
                continue;
            };
            let mut req = Request::new(Full::new(Bytes::new()));
            *req.uri_mut() = uri;
            let (client, metrics, live) = (
                client.clone(),
                self.metrics.clone(),
                std::sync::Arc::clone(&self.live_refresh),
            );
            tokio::spawn(async move {
                let answered = matches!(
                    tokio::time::timeout(PROBE_TIMEOUT, client.request(req)).await,
                    Ok(Ok(resp)) if resp.status().is_success()
                );
                let result = if answered {
                    ProbeResult::Answered
                } else {
                    ProbeResult::Failed
                };
                metrics.probes.get_or_create(&result).inc();
                upstream.live().record_probe(answered);
                if answered {
                    live.notify_one();
                }
            });
        }
    }

    /// Mirrors `view`'s per-model state into gauges and publishes it.
    fn publish_view(&mut self, view: RoutingView) {
        mirror_gauges(&self.metrics, &view);
        self.published.store(std::sync::Arc::new(view));
    }

    fn delivered(&mut self, exchange: ExchangeId, delivery: &Delivery) {
        let pairs: Vec<(&[u8], &[u8])>;
        let outcome = match delivery {
            Delivery::Http { status, headers } => {
                pairs = headers
                    .iter()
                    .map(|(k, v)| (k.as_slice(), v.as_slice()))
                    .collect();
                Outcome::Http {
                    status: *status,
                    headers: &pairs,
                }
            }
            Delivery::Transport => Outcome::Transport,
            Delivery::TimedOut => Outcome::TimedOut,
        };
        let mono = self.mono_ms();
        self.reporter
            .handle(mono, ReporterInput::Response { exchange, outcome });
        self.mirror_pending();
    }

    /// Mirrors whether the reporter holds unacknowledged evidence into its gauge.
    fn mirror_pending(&self) {
        self.metrics
            .feedback_pending
            .set(i64::from(self.reporter.pending().is_some()));
    }

    fn feedback_request(&self, report: &grid_feedback::Report) -> Request<Full<Bytes>> {
        let mut req = Request::new(Full::new(Bytes::new()));
        *req.method_mut() = http::Method::POST;
        *req.uri_mut() = operator_uri(&self.config.operator, grid_feedback::INGEST_PATH);
        for (name, value) in report.headers() {
            if let Ok(v) = http::HeaderValue::from_str(&value) {
                req.headers_mut().insert(name, v);
            }
        }
        req
    }

    /// Reads one relay body over the one kept-alive operator connection, with
    /// grid-daemon's reader (the operator's peer poller reads the same way); with `wait`,
    /// a long poll bounded by the poll timeout plus the wait. Owns what it needs, so the
    /// loop goes on while it waits.
    fn fetch(&self, wait: Option<Wait>) -> impl Future<Output = Fetch> + Send + 'static {
        let (client, metrics) = (self.client.clone(), self.metrics.clone());
        let uri = with_wait(&operator_uri(&self.config.operator, SIGNALS_PATH), wait);
        let timeout = poll_budget(self.config.poll_timeout, wait);
        async move { fetch_relay(client, metrics, uri, timeout).await }
    }
}

/// What one poll of the operator read: the body (`None` when it was over the cap), its
/// `Date` and the readiness generation the operator stated.
struct Fetched {
    body: Option<Vec<u8>>,
    reference_ms: Option<u64>,
    generation: Option<u64>,
}

/// One poll's outcome.
type Fetch = Result<Fetched, PollResult>;

/// A poll under way.
type InFlight = std::pin::Pin<Box<dyn Future<Output = Fetch> + Send>>;

/// The answer of the poll under way; never, when none is.
async fn answer_of(in_flight: &mut Option<InFlight>) -> Fetch {
    match in_flight {
        Some(poll) => poll.await,
        None => std::future::pending().await,
    }
}

async fn fetch_relay(
    client: HttpClient,
    metrics: PollMetrics,
    uri: Uri,
    timeout: Duration,
) -> Fetch {
    let req = Request::get(uri)
        .body(Full::new(Bytes::new()))
        .map_err(|_| PollResult::Transport)?;
    let attempt = async {
        let resp = client.request(req).await.map_err(|e| {
            let cause = describe(&e);
            tracing::debug!(%cause, "operator unreachable");
            *metrics.failure_slot() = Some(cause);
            Failed::from(ScrapeFailure::Connect)
        })?;
        read_response(resp).await
    };
    let fetched = within(timeout, attempt).await;
    let mut failure = metrics.failure_slot();
    match &fetched {
        Ok(_) => *failure = None,
        // A refused exchange said why above; the others say it here.
        Err(f) if f.class != ScrapeFailure::Connect => {
            *failure = Some(match f.status {
                Some(status) => format!("the operator answered {status}"),
                None => f.class.as_str().replace('_', " "),
            });
        }
        Err(_) => {}
    }
    drop(failure);
    match fetched {
        Ok(fetched) => Ok(Fetched {
            body: Some(fetched.body),
            reference_ms: fetched.date_ms,
            generation: fetched.readiness_generation,
        }),
        Err(Failed {
            class: ScrapeFailure::BodyCap,
            ..
        }) => Ok(Fetched {
            body: None,
            reference_ms: None,
            generation: None,
        }),
        Err(Failed {
            class: ScrapeFailure::Timeout,
            ..
        }) => Err(PollResult::Timeout),
        Err(Failed {
            status: Some(_), ..
        }) => Err(PollResult::Status),
        Err(_) => Err(PollResult::Transport),
    }
}

/// How loudly a poll result is logged after `previous`: a new failure at warn (a gateway
/// that never reaches its operator says so at the default level), a recovery at info, a
/// repeated failure at debug only (a down operator does not flood the log), a repeated
/// success not at all.
fn log_level(previous: Option<PollResult>, result: PollResult) -> Option<tracing::Level> {
    match (previous, result) {
        (Some(PollResult::Ok) | None, PollResult::Ok) => None,
        (Some(_), PollResult::Ok) => Some(tracing::Level::INFO),
        (Some(p), r) if p == r => Some(tracing::Level::DEBUG),
        _ => Some(tracing::Level::WARN),
    }
}

async fn until_stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

fn body_was_capped(report: &IngestReport) -> bool {
    report.dropped.get(DropReason::BodyCap) > 0
}

/// `base` with its path replaced by `path`.
fn operator_uri(base: &Uri, path: &'static str) -> Uri {
    let mut parts = base.clone().into_parts();
    parts.path_and_query = Some(http::uri::PathAndQuery::from_static(path));
    Uri::from_parts(parts).unwrap_or_else(|_| base.clone())
}

/// The feedback replica name from `operator.replica`, refused naming the field when the
/// wire contract does not accept it.
pub fn replica(name: &str) -> Result<Replica, Error> {
    Replica::new(name).map_err(|e| Error::ConfigField {
        field: "operator.replica".into(),
        reason: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn feedback_epochs_are_drawn_fresh_from_the_os_generator() {
        let draws: std::collections::HashSet<u64> =
            (0..64).map(|_| random_epoch().unwrap().get()).collect();
        assert_eq!(draws.len(), 64, "64 draws, 64 distinct nonzero epochs");
    }

    #[test]
    fn operator_uri_replaces_the_path() {
        let base: Uri = "https://127.0.0.1:9443".parse().unwrap();
        assert_eq!(
            operator_uri(&base, SIGNALS_PATH),
            "https://127.0.0.1:9443/v1/site/signals"
        );
    }

    #[test]
    fn a_new_failure_warns_a_repeated_one_whispers_and_a_recovery_is_told() {
        use tracing::Level;
        assert_eq!(log_level(None, PollResult::Ok), None);
        assert_eq!(log_level(None, PollResult::Transport), Some(Level::WARN));
        assert_eq!(
            log_level(Some(PollResult::Transport), PollResult::Transport),
            Some(Level::DEBUG)
        );
        assert_eq!(
            log_level(Some(PollResult::Transport), PollResult::Timeout),
            Some(Level::WARN)
        );
        assert_eq!(
            log_level(Some(PollResult::Timeout), PollResult::Ok),
            Some(Level::INFO)
        );
        assert_eq!(log_level(Some(PollResult::Ok), PollResult::Ok), None);
    }

    #[test]
    fn poll_result_labels_are_distinct() {
        let labels: std::collections::HashSet<_> =
            PollResult::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(labels.len(), PollResult::ALL.len());
    }
}
