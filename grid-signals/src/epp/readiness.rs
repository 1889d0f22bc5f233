//! Whether a provider can serve: the `grid_provider_ready` verdict and its Ready-condition
//! reason.
//!
//! The EPP's ready-endpoint count means "endpoints with fresh metrics", not Kubernetes
//! readiness: a saturated engine can read zero while it serves. So a zero flips the
//! verdict only after [`HYSTERESIS_SCRAPES`] scrapes running *and* no engine answer within
//! [`ENGINE_ANSWER_WINDOW_MS`]; coming back takes the same number of positive scrapes (or
//! one engine answer). A provider is also not ready when no scrape has been answered
//! within the stale window ([`ScrapeTiming::window`]) or when it is Unavailable.
//!
//! All times are `u64` milliseconds since the Unix epoch, handed in as `now`.

use super::failure::ScrapeFailure;

/// Consecutive scrapes reading zero ready endpoints before the count may fail the
/// verdict, and consecutive positive scrapes before it recovers.
pub const HYSTERESIS_SCRAPES: u32 = 2;
/// How recent an engine answer (request, TTFT or TPOT counter growth) must be to keep a
/// provider whose EPP reads zero ready endpoints ready.
pub const ENGINE_ANSWER_WINDOW_MS: u64 = 30_000;

/// The scrape cadence settings the stale window derives from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScrapeTiming {
    /// Time between scrape passes.
    pub interval_ms: u64,
    /// The configured `staleMetricsSeconds`, in milliseconds; `None` when unset.
    pub stale_metrics_ms: Option<u64>,
    /// The signal TTL; half of it is the default `staleMetricsSeconds`.
    pub signal_ttl_ms: u64,
}

/// How long a provider's last answered scrape keeps it from being declared stale.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct StaleWindow(pub u64);

impl ScrapeTiming {
    /// `staleMetricsSeconds` as configured, or half the signal TTL when unset.
    pub fn stale_metrics_ms(&self) -> u64 {
        self.stale_metrics_ms.unwrap_or(self.signal_ttl_ms / 2)
    }

    /// The network's readiness floor: one interval plus the longer of one interval or the
    /// latest measured pass. It keeps a successful sample valid until the next
    /// non-overlapping pass can refresh it.
    pub fn readiness_floor_ms(&self, latest_pass_ms: u64) -> u64 {
        self.interval_ms
            .saturating_add(self.interval_ms.max(latest_pass_ms))
    }

    /// The stale window: the readiness floor when it is longer than
    /// `staleMetricsSeconds`, else `staleMetricsSeconds`. `latest_pass_ms` is the
    /// duration of the latest complete scrape pass over the network (0 before the first).
    pub fn window(&self, latest_pass_ms: u64) -> StaleWindow {
        StaleWindow(
            self.stale_metrics_ms()
                .max(self.readiness_floor_ms(latest_pass_ms)),
        )
    }
}

/// The three-valued verdict. `Unknown` never excludes a provider; it publishes nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadyStatus {
    /// Can serve: `grid_provider_ready 1`.
    Ready,
    /// Cannot serve: `grid_provider_ready 0`.
    NotReady,
    /// Not known: `grid_provider_ready` absent.
    Unknown,
}

impl ReadyStatus {
    /// The Kubernetes condition status string.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ready => "True",
            Self::NotReady => "False",
            Self::Unknown => "Unknown",
        }
    }
}

/// The Ready condition's reason: the cause of the verdict, and for a failed scrape its
/// class. The full set, with the status each goes with, is in `docs/metrics.md`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadyReason {
    /// True: the EPP reports ready endpoints.
    EndpointsReady,
    /// True: zero ready endpoints confirmed, but the engine answered within
    /// [`ENGINE_ANSWER_WINDOW_MS`] (saturated, not down).
    EngineAnswering,
    /// True: zero ready endpoints on one scrape, awaiting a second.
    ZeroEndpointsUnconfirmed,
    /// False: zero ready endpoints for [`HYSTERESIS_SCRAPES`] scrapes and no engine answer.
    NoReadyEndpoints,
    /// False: ready endpoints are back, awaiting [`HYSTERESIS_SCRAPES`] positive scrapes.
    RecoveryUnconfirmed,
    /// False: the provider is Unavailable.
    Unavailable,
    /// False when no scrape was answered within the stale window; Unknown while no scrape
    /// has been answered yet but the window has not passed; always Unknown for
    /// [`ScrapeFailure::BodyCap`].
    ScrapeFailed(ScrapeFailure),
    /// False: no scrape answered within the stale window and none failed since the last
    /// answered one (the scrape loop stalled).
    NoRecentScrape,
    /// Unknown: the operator has not scraped this provider yet.
    NoScrapeYet,
    /// Unknown: the scrape answered without the pool's ready-endpoint series (for example
    /// a provider pointed at vLLM's own `/metrics`).
    NoReadySeries,
}

impl ReadyReason {
    /// Every reason: each cause, then a failed scrape once per class. Complete: its
    /// count is tested against [`ReadyReasonLabel::ALL`], which [`Self::label`]'s
    /// exhaustive match keeps in step with the variants.
    pub fn all() -> impl Iterator<Item = Self> {
        [
            Self::EndpointsReady,
            Self::EngineAnswering,
            Self::ZeroEndpointsUnconfirmed,
            Self::NoReadyEndpoints,
            Self::RecoveryUnconfirmed,
            Self::Unavailable,
            Self::NoRecentScrape,
            Self::NoScrapeYet,
            Self::NoReadySeries,
        ]
        .into_iter()
        .chain(ScrapeFailure::ALL.into_iter().map(Self::ScrapeFailed))
    }

    /// The condition reason string (CamelCase).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::EndpointsReady => "EndpointsReady",
            Self::EngineAnswering => "EngineAnswering",
            Self::ZeroEndpointsUnconfirmed => "ZeroEndpointsUnconfirmed",
            Self::NoReadyEndpoints => "NoReadyEndpoints",
            Self::RecoveryUnconfirmed => "RecoveryUnconfirmed",
            Self::Unavailable => "Unavailable",
            Self::ScrapeFailed(class) => class.condition_reason(),
            Self::NoRecentScrape => "NoRecentScrape",
            Self::NoScrapeYet => "NoScrapeYet",
            Self::NoReadySeries => "NoReadySeries",
        }
    }
}

crate::label_values! {
    /// [`ReadyReason`] as a metric label: the closed set an operator exports the current
    /// reason of each provider under (`grid_operator_provider_ready_reason{reason}`), one
    /// value per condition reason, a failed scrape's class included.
    pub enum ReadyReasonLabel {
        /// [`ReadyReason::EndpointsReady`].
        EndpointsReady,
        /// [`ReadyReason::EngineAnswering`].
        EngineAnswering,
        /// [`ReadyReason::ZeroEndpointsUnconfirmed`].
        ZeroEndpointsUnconfirmed,
        /// [`ReadyReason::NoReadyEndpoints`].
        NoReadyEndpoints,
        /// [`ReadyReason::RecoveryUnconfirmed`].
        RecoveryUnconfirmed,
        /// [`ReadyReason::Unavailable`].
        Unavailable,
        /// [`ReadyReason::ScrapeFailed`] with [`ScrapeFailure::Timeout`].
        ScrapeTimeout,
        /// ... with [`ScrapeFailure::Unauthorized`].
        ScrapeUnauthorized,
        /// ... with [`ScrapeFailure::Tls`].
        ScrapeTls,
        /// ... with [`ScrapeFailure::Dns`].
        ScrapeDns,
        /// ... with [`ScrapeFailure::Connect`].
        ScrapeConnect,
        /// ... with [`ScrapeFailure::Http`].
        ScrapeHttp,
        /// ... with [`ScrapeFailure::BodyCap`].
        ScrapeBodyCap,
        /// ... with [`ScrapeFailure::Parse`].
        ScrapeParse,
        /// [`ReadyReason::NoRecentScrape`].
        NoRecentScrape,
        /// [`ReadyReason::NoScrapeYet`].
        NoScrapeYet,
        /// [`ReadyReason::NoReadySeries`].
        NoReadySeries,
    }
}

impl ReadyReasonLabel {
    /// Whether a verdict of this reason says the EPP was not read (a failed scrape, or no
    /// scrape within the stale window) rather than anything the EPP said. Such a "not
    /// ready" is the operator's monitoring failing, not evidence about the model servers:
    /// a reader takes it as no signal (unmeasured), never as a site known to be down, so a
    /// monitoring outage cannot become a serving outage. Every other "not ready" reason
    /// (zero ready endpoints confirmed, a recovery not yet confirmed, Unavailable) is
    /// evidence.
    pub fn is_unread(self) -> bool {
        matches!(
            self,
            Self::ScrapeTimeout
                | Self::ScrapeUnauthorized
                | Self::ScrapeTls
                | Self::ScrapeDns
                | Self::ScrapeConnect
                | Self::ScrapeHttp
                | Self::ScrapeBodyCap
                | Self::ScrapeParse
                | Self::NoRecentScrape
                | Self::NoScrapeYet
        )
    }

    /// The label whose text is `text`, if any.
    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|l| l.as_str() == text)
    }
}

impl ReadyReason {
    /// The reason's metric label (snake case of [`Self::as_str`]).
    pub fn label(self) -> ReadyReasonLabel {
        match self {
            Self::EndpointsReady => ReadyReasonLabel::EndpointsReady,
            Self::EngineAnswering => ReadyReasonLabel::EngineAnswering,
            Self::ZeroEndpointsUnconfirmed => ReadyReasonLabel::ZeroEndpointsUnconfirmed,
            Self::NoReadyEndpoints => ReadyReasonLabel::NoReadyEndpoints,
            Self::RecoveryUnconfirmed => ReadyReasonLabel::RecoveryUnconfirmed,
            Self::Unavailable => ReadyReasonLabel::Unavailable,
            Self::ScrapeFailed(class) => match class {
                ScrapeFailure::Timeout => ReadyReasonLabel::ScrapeTimeout,
                ScrapeFailure::Unauthorized => ReadyReasonLabel::ScrapeUnauthorized,
                ScrapeFailure::Tls => ReadyReasonLabel::ScrapeTls,
                ScrapeFailure::Dns => ReadyReasonLabel::ScrapeDns,
                ScrapeFailure::Connect => ReadyReasonLabel::ScrapeConnect,
                ScrapeFailure::Http => ReadyReasonLabel::ScrapeHttp,
                ScrapeFailure::BodyCap => ReadyReasonLabel::ScrapeBodyCap,
                ScrapeFailure::Parse => ReadyReasonLabel::ScrapeParse,
            },
            Self::NoRecentScrape => ReadyReasonLabel::NoRecentScrape,
            Self::NoScrapeYet => ReadyReasonLabel::NoScrapeYet,
            Self::NoReadySeries => ReadyReasonLabel::NoReadySeries,
        }
    }

    /// Whether the verdict says the EPP was not read (a failed scrape, or none within the
    /// stale window) rather than what the EPP said: see [`ReadyReasonLabel::is_unread`].
    pub fn is_unread(self) -> bool {
        self.label().is_unread()
    }

    /// The failed scrape's class, for a reason that names one.
    pub fn failure(self) -> Option<ScrapeFailure> {
        match self {
            Self::ScrapeFailed(class) => Some(class),
            _ => None,
        }
    }
}

/// The verdict at one instant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Readiness {
    /// Ready, not ready or unknown.
    pub status: ReadyStatus,
    /// Why.
    pub reason: ReadyReason,
    /// When the reading that decided it was observed: the deciding scrape, or `now` for
    /// verdicts decided by elapsed time or by Unavailable.
    pub stamp_ms: u64,
}

/// What an answered scrape said about readiness.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ReadyObservation {
    /// The pool's ready-endpoint count.
    Endpoints(f64),
    /// No ready-endpoint series in the scrape.
    NoReadySeries,
    /// The body reached the cap; nothing was read.
    BodyCap,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Latch {
    Serving,
    Down,
}

/// Per-provider readiness state, fed scrape outcomes and asked for the verdict at `now`.
#[derive(Clone, Debug)]
pub struct ReadinessState {
    created_ms: u64,
    attempted: bool,
    last_answered: Option<(u64, ReadyObservation)>,
    failed_since_answer: Option<ScrapeFailure>,
    zero_streak: u32,
    positive_streak: u32,
    latch: Latch,
    last_engine_answer_ms: Option<u64>,
    unavailable: bool,
}

impl ReadinessState {
    /// A provider first known at `now`: its stale clock starts here, so one that never
    /// answers is declared down one stale window after it was added.
    pub fn new(now: u64) -> Self {
        Self {
            created_ms: now,
            attempted: false,
            last_answered: None,
            failed_since_answer: None,
            zero_streak: 0,
            positive_streak: 0,
            latch: Latch::Serving,
            last_engine_answer_ms: None,
            unavailable: false,
        }
    }

    /// A scrape that answered (parsed, or capped) at `now`.
    pub fn on_answer(&mut self, now: u64, observation: ReadyObservation) {
        self.attempted = true;
        self.failed_since_answer = None;
        self.last_answered = Some((now, observation));
        match observation {
            ReadyObservation::Endpoints(count) if count > 0.0 => {
                self.zero_streak = 0;
                self.positive_streak = self.positive_streak.saturating_add(1);
                if self.positive_streak >= HYSTERESIS_SCRAPES {
                    self.latch = Latch::Serving;
                }
            }
            ReadyObservation::Endpoints(_) => {
                self.positive_streak = 0;
                self.zero_streak = self.zero_streak.saturating_add(1);
                if self.zero_streak >= HYSTERESIS_SCRAPES {
                    self.latch = Latch::Down;
                }
            }
            // Not a reading of the count: the next reading starts a fresh run.
            ReadyObservation::NoReadySeries | ReadyObservation::BodyCap => {
                self.zero_streak = 0;
                self.positive_streak = 0;
            }
        }
    }

    /// A scrape that failed at `now`. A failure reads no count, so it neither extends
    /// nor breaks a run of readings.
    pub fn on_failure(&mut self, now: u64, failure: ScrapeFailure) {
        if failure.endpoint_answered() {
            self.on_answer(now, ReadyObservation::BodyCap);
            return;
        }
        self.attempted = true;
        self.failed_since_answer = Some(failure);
    }

    /// The engine answered (its request, TTFT or TPOT counters grew) as seen at `now`.
    pub fn on_engine_answer(&mut self, now: u64) {
        self.last_engine_answer_ms = Some(now);
    }

    /// Marks the provider Unavailable (or clears it).
    pub fn set_unavailable(&mut self, unavailable: bool) {
        self.unavailable = unavailable;
    }

    /// When the last answered scrape was, if any.
    pub fn last_answered_ms(&self) -> Option<u64> {
        self.last_answered.map(|(at, _)| at)
    }

    /// The verdict at `now` given the network's stale window.
    pub fn verdict(&self, now: u64, window: StaleWindow) -> Readiness {
        let at_now = |status, reason| Readiness {
            status,
            reason,
            stamp_ms: now,
        };
        if self.unavailable {
            return at_now(ReadyStatus::NotReady, ReadyReason::Unavailable);
        }
        if !self.attempted {
            return at_now(ReadyStatus::Unknown, ReadyReason::NoScrapeYet);
        }
        let since = self.last_answered.map_or(self.created_ms, |(at, _)| at);
        if now.saturating_sub(since) > window.0 {
            let reason = self
                .failed_since_answer
                .map_or(ReadyReason::NoRecentScrape, ReadyReason::ScrapeFailed);
            return at_now(ReadyStatus::NotReady, reason);
        }
        let Some((at, observation)) = self.last_answered else {
            let reason = self
                .failed_since_answer
                .map_or(ReadyReason::NoScrapeYet, ReadyReason::ScrapeFailed);
            return at_now(ReadyStatus::Unknown, reason);
        };
        let (status, reason) = match observation {
            ReadyObservation::BodyCap => (
                ReadyStatus::Unknown,
                ReadyReason::ScrapeFailed(ScrapeFailure::BodyCap),
            ),
            ReadyObservation::NoReadySeries => (ReadyStatus::Unknown, ReadyReason::NoReadySeries),
            ReadyObservation::Endpoints(_) => self.endpoint_verdict(now),
        };
        Readiness {
            status,
            reason,
            stamp_ms: at,
        }
    }

    fn endpoint_verdict(&self, now: u64) -> (ReadyStatus, ReadyReason) {
        match self.latch {
            Latch::Serving if self.zero_streak > 0 => {
                (ReadyStatus::Ready, ReadyReason::ZeroEndpointsUnconfirmed)
            }
            Latch::Serving => (ReadyStatus::Ready, ReadyReason::EndpointsReady),
            Latch::Down if self.engine_answered_within(now) => {
                (ReadyStatus::Ready, ReadyReason::EngineAnswering)
            }
            Latch::Down if self.positive_streak > 0 => {
                (ReadyStatus::NotReady, ReadyReason::RecoveryUnconfirmed)
            }
            Latch::Down => (ReadyStatus::NotReady, ReadyReason::NoReadyEndpoints),
        }
    }

    fn engine_answered_within(&self, now: u64) -> bool {
        self.last_engine_answer_ms
            .is_some_and(|at| now.saturating_sub(at) <= ENGINE_ANSWER_WINDOW_MS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: u64 = 1_700_000_000_000;
    const WINDOW: StaleWindow = StaleWindow(10_000);

    #[derive(Clone, Copy, Debug)]
    enum Step {
        Count(f64),
        NoSeries,
        Fail(ScrapeFailure),
        Answer,
        Unavailable(bool),
    }

    /// Feeds steps one second apart starting at T0 and returns the verdict after each.
    fn run(steps: &[Step]) -> Vec<(ReadyStatus, &'static str)> {
        let mut state = ReadinessState::new(T0);
        let mut out = Vec::new();
        for (i, step) in steps.iter().enumerate() {
            let now = T0 + 1_000 * i as u64;
            match *step {
                Count(c) => state.on_answer(now, ReadyObservation::Endpoints(c)),
                NoSeries => state.on_answer(now, ReadyObservation::NoReadySeries),
                Fail(f) => state.on_failure(now, f),
                Answer => state.on_engine_answer(now),
                Step::Unavailable(u) => state.set_unavailable(u),
            }
            let v = state.verdict(now, WINDOW);
            out.push((v.status, v.reason.as_str()));
        }
        out
    }

    use ReadyStatus::{NotReady, Ready, Unknown};
    use Step::{Answer, Count, Fail, NoSeries};

    #[test]
    fn readiness_rules_table() {
        let cases: &[(&str, &[Step], (ReadyStatus, &str))] = &[
            (
                "one zero scrape does not fail the verdict",
                &[Count(2.0), Count(0.0)],
                (Ready, "ZeroEndpointsUnconfirmed"),
            ),
            (
                "two zero scrapes without an answer fail it",
                &[Count(2.0), Count(0.0), Count(0.0)],
                (NotReady, "NoReadyEndpoints"),
            ),
            (
                "two zero scrapes from the start fail it",
                &[Count(0.0), Count(0.0)],
                (NotReady, "NoReadyEndpoints"),
            ),
            (
                "an engine answer keeps two zero scrapes ready",
                &[Count(0.0), Answer, Count(0.0)],
                (Ready, "EngineAnswering"),
            ),
            (
                "a zero between positives never fails",
                &[Count(0.0), Count(1.0), Count(0.0)],
                (Ready, "ZeroEndpointsUnconfirmed"),
            ),
            (
                "one positive scrape after down does not recover",
                &[Count(0.0), Count(0.0), Count(3.0)],
                (NotReady, "RecoveryUnconfirmed"),
            ),
            (
                "two positive scrapes after down recover",
                &[Count(0.0), Count(0.0), Count(3.0), Count(3.0)],
                (Ready, "EndpointsReady"),
            ),
            (
                "an engine answer recovers down at once",
                &[Count(0.0), Count(0.0), Answer],
                (Ready, "EngineAnswering"),
            ),
            (
                "a scrape without the ready series is unknown",
                &[Count(0.0), Count(0.0), NoSeries],
                (Unknown, "NoReadySeries"),
            ),
            (
                "a capped body is unknown",
                &[Count(0.0), Count(0.0), Fail(ScrapeFailure::BodyCap)],
                (Unknown, "ScrapeBodyCap"),
            ),
            (
                "no scrape yet is unknown",
                &[Answer],
                (Unknown, "NoScrapeYet"),
            ),
            (
                "a failure before any answer is unknown within the window",
                &[Fail(ScrapeFailure::Tls)],
                (Unknown, "ScrapeTls"),
            ),
            (
                "a failure after an answer keeps the answered verdict",
                &[Count(1.0), Fail(ScrapeFailure::Timeout)],
                (Ready, "EndpointsReady"),
            ),
            (
                "a failure between zeros neither breaks nor extends the run",
                &[Count(0.0), Fail(ScrapeFailure::Http), Count(0.0)],
                (NotReady, "NoReadyEndpoints"),
            ),
            (
                "unavailable fails whatever the scrapes say",
                &[Count(4.0), Step::Unavailable(true)],
                (NotReady, "Unavailable"),
            ),
            (
                "clearing unavailable restores the scrape verdict",
                &[
                    Count(4.0),
                    Step::Unavailable(true),
                    Step::Unavailable(false),
                ],
                (Ready, "EndpointsReady"),
            ),
        ];
        for (name, steps, want) in cases {
            let got = *run(steps).last().unwrap();
            assert_eq!(got, *want, "{name}");
        }
    }

    #[test]
    fn the_engine_answer_counts_for_exactly_thirty_seconds() {
        for (since_answer, want) in [
            (ENGINE_ANSWER_WINDOW_MS, ReadyReason::EngineAnswering),
            (ENGINE_ANSWER_WINDOW_MS + 1, ReadyReason::NoReadyEndpoints),
        ] {
            let mut state = ReadinessState::new(T0);
            state.on_engine_answer(T0);
            let now = T0 + since_answer;
            state.on_answer(now - 1, ReadyObservation::Endpoints(0.0));
            state.on_answer(now, ReadyObservation::Endpoints(0.0));
            assert_eq!(
                state.verdict(now, StaleWindow(60_000)).reason,
                want,
                "{since_answer} ms after the answer"
            );
        }
    }

    #[test]
    fn the_stale_window_holds_exactly_its_length() {
        for (elapsed, want) in [(WINDOW.0, Ready), (WINDOW.0 + 1, NotReady)] {
            let mut state = ReadinessState::new(T0);
            state.on_answer(T0, ReadyObservation::Endpoints(1.0));
            state.on_failure(T0 + 500, ScrapeFailure::Connect);
            let v = state.verdict(T0 + elapsed, WINDOW);
            assert_eq!(v.status, want, "{elapsed} ms");
            if want == NotReady {
                assert_eq!(v.reason, ReadyReason::ScrapeFailed(ScrapeFailure::Connect));
                assert_eq!(v.stamp_ms, T0 + elapsed);
            } else {
                assert_eq!(v.stamp_ms, T0);
            }
        }
    }

    #[test]
    fn every_failure_class_but_body_cap_fails_readiness_once_stale() {
        for failure in ScrapeFailure::ALL {
            let mut state = ReadinessState::new(T0);
            let end = T0 + WINDOW.0 + 1_000;
            for now in (T0..=end).step_by(1_000) {
                state.on_failure(now, failure);
            }
            let v = state.verdict(end, WINDOW);
            let want = if failure == ScrapeFailure::BodyCap {
                Unknown
            } else {
                NotReady
            };
            assert_eq!(v.status, want, "{failure:?}");
            assert_eq!(v.reason, ReadyReason::ScrapeFailed(failure), "{failure:?}");
        }
    }

    #[test]
    fn a_stalled_scrape_loop_is_named_apart_from_failures() {
        let mut state = ReadinessState::new(T0);
        state.on_answer(T0, ReadyObservation::Endpoints(1.0));
        assert_eq!(
            state.verdict(T0 + WINDOW.0 + 1, WINDOW).reason,
            ReadyReason::NoRecentScrape
        );
    }

    #[test]
    fn the_floor_formula_is_one_interval_plus_the_longer_of_interval_and_pass() {
        let timing = |interval_ms, stale_metrics_ms, signal_ttl_ms| ScrapeTiming {
            interval_ms,
            stale_metrics_ms,
            signal_ttl_ms,
        };
        // (timing, latest pass, floor, window)
        let cases = [
            (
                "a fast pass gives two intervals",
                timing(1_000, Some(1_000), 30_000),
                200,
                2_000,
                2_000,
            ),
            (
                "a slow pass widens the floor",
                timing(1_000, Some(1_000), 30_000),
                4_500,
                5_500,
                5_500,
            ),
            (
                "a pass of exactly one interval",
                timing(1_000, Some(1_000), 30_000),
                1_000,
                2_000,
                2_000,
            ),
            (
                "a longer staleMetricsSeconds wins",
                timing(1_000, Some(9_000), 30_000),
                4_500,
                5_500,
                9_000,
            ),
            (
                "unset staleMetricsSeconds is half the TTL",
                timing(1_000, None, 30_000),
                200,
                2_000,
                15_000,
            ),
            (
                "the floor overrides half the TTL when longer",
                timing(5_000, None, 12_000),
                9_000,
                14_000,
                14_000,
            ),
            (
                "before any pass the floor is two intervals",
                timing(3_000, Some(0), 0),
                0,
                6_000,
                6_000,
            ),
        ];
        for (name, t, pass, floor, window) in cases {
            assert_eq!(t.readiness_floor_ms(pass), floor, "{name}");
            assert_eq!(t.window(pass), StaleWindow(window), "{name}");
        }
    }

    fn any_step() -> impl proptest::strategy::Strategy<Value = Step> {
        use proptest::prelude::*;
        prop_oneof![
            (0u8..4).prop_map(|c| Count(f64::from(c))),
            Just(NoSeries),
            proptest::sample::select(ScrapeFailure::ALL.to_vec()).prop_map(Fail),
            Just(Answer),
        ]
    }

    proptest::proptest! {
        #[test]
        fn while_scrapes_answer_only_the_endpoint_count_can_fail_the_verdict(
            // At most 10 steps one second apart: everything happens inside the 10 s window.
            steps in proptest::collection::vec(any_step(), 1..=10),
        ) {
            for (status, reason) in run(&steps) {
                if status == NotReady {
                    proptest::prop_assert!(
                        reason == "NoReadyEndpoints" || reason == "RecoveryUnconfirmed",
                        "{reason} within the stale window"
                    );
                }
            }
        }

        #[test]
        fn two_positive_scrapes_always_end_ready(steps in proptest::collection::vec(any_step(), 0..40)) {
            let mut steps = steps;
            steps.extend([Count(3.0), Count(3.0)]);
            proptest::prop_assert_eq!(*run(&steps).last().unwrap(), (Ready, "EndpointsReady"));
        }
    }

    #[test]
    fn every_reason_string_is_distinct() {
        let mut reasons: Vec<&str> = ReadyReason::all().map(ReadyReason::as_str).collect();
        let n = reasons.len();
        reasons.sort_unstable();
        reasons.dedup();
        assert_eq!(reasons.len(), n);
    }

    #[test]
    fn every_reason_has_one_label_the_snake_case_of_its_condition_reason() {
        let all: Vec<ReadyReason> = ReadyReason::all().collect();
        let mut labels: Vec<ReadyReasonLabel> = all.iter().map(|r| r.label()).collect();
        for reason in &all {
            let snake: String = reason
                .as_str()
                .chars()
                .enumerate()
                .flat_map(|(i, c)| {
                    let sep = (i > 0 && c.is_ascii_uppercase()).then_some('_');
                    sep.into_iter()
                        .chain(std::iter::once(c.to_ascii_lowercase()))
                })
                .collect();
            assert_eq!(reason.label().as_str(), snake);
        }
        labels.sort_by_key(|l| l.as_str());
        labels.dedup();
        assert_eq!(labels.len(), ReadyReasonLabel::ALL.len());
        assert_eq!(all.len(), ReadyReasonLabel::ALL.len());
    }
}
