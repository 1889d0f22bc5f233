//! The fake EPP's text, read the way an operator reads a real one (strict parser, then
//! `epp::ProviderTracker`), concludes what the model's true state is: ready endpoints,
//! in-flight, and readiness through an outage.

use grid_signals::epp::{
    PoolSelector, ProviderConfig, ProviderTracker, ReadyStatus, ScrapeInput, ScrapeTiming,
    StaleWindow,
};
use grid_signals::exposition::parse_strict;
use grid_sim::fake_epp::{EppIdentity, FakeEpp};
use grid_sim::sim_rng::SimRng;
use grid_sim::site_model::{RequestSpec, SiteConfig, SiteModel};

const T0: u64 = 1_700_000_000_000;

struct World {
    model: SiteModel,
    epp: FakeEpp,
    tracker: ProviderTracker,
    window: StaleWindow,
    arrivals: SimRng,
    /// Virtual ms since the model's zero.
    now: u64,
}

impl World {
    fn new(flow_control: bool) -> Self {
        let mut config = SiteConfig::new("site-a", 4, 8);
        if flow_control {
            config.queue_per_endpoint = Some(2);
        }
        Self {
            model: SiteModel::new(config, 11).unwrap(),
            epp: FakeEpp::new(EppIdentity::new("pool-a", "llama")),
            tracker: ProviderTracker::new(
                ProviderConfig {
                    site: "site-a".into(),
                    provider: "llama".into(),
                    pool: PoolSelector::Named("pool-a".into()),
                },
                T0,
            ),
            window: ScrapeTiming {
                interval_ms: 1_000,
                stale_metrics_ms: None,
                signal_ttl_ms: 20_000,
            }
            .window(0),
            arrivals: SimRng::new(5),
            now: 0,
        }
    }

    /// Runs Poisson arrivals at `rate_per_s` for one second, then scrapes.
    fn second(&mut self, rate_per_s: f64) {
        let end = self.now + 1_000;
        let mut t = self.now as f64;
        loop {
            t += self.arrivals.exponential(1_000.0 / rate_per_s);
            if t >= end as f64 {
                break;
            }
            let streaming = self.arrivals.unit() < 0.8;
            let _ = self.model.arrive(
                t as u64,
                RequestSpec {
                    streaming,
                    service_ms: None,
                },
            );
        }
        self.model.advance(end);
        while self.model.poll_event().is_some() {}
        self.now = end;
        let text = self.epp.render(&self.model);
        let samples = parse_strict(&text).expect("the fake EPP writes strict text");
        let summary = self
            .tracker
            .handle(T0 + self.now, ScrapeInput::Parsed(&samples));
        assert_eq!(summary.rejected.total(), 0, "nothing refused");
    }

    fn status(&self) -> ReadyStatus {
        self.tracker.readiness(T0 + self.now, self.window).status
    }

    fn in_flight(&self) -> Option<f64> {
        self.tracker
            .in_flight(T0 + self.now, self.window)
            .map(|e| e.value)
    }

    fn true_in_flight(&self) -> f64 {
        (self.model.running() + self.model.waiting()) as f64
    }
}

#[test]
fn in_flight_and_readiness_match_the_model_under_load() {
    for flow_control in [false, true] {
        let mut w = World::new(flow_control);
        // 32 slots, 2 s median service (mean about 2.4 s): about 13 req/s fills them;
        // 20 req/s overloads and builds queues.
        for (second, rate) in (0..40).map(|s| (s, if s < 20 { 8.0 } else { 20.0 })) {
            w.second(rate);
            assert_eq!(w.status(), ReadyStatus::Ready, "second {second}");
            assert_eq!(
                w.in_flight(),
                Some(w.true_in_flight()),
                "second {second}, flow control {flow_control}"
            );
        }
        assert!(w.model.waiting() > 0, "the overload built a queue");
        let held = w.tracker.held(T0 + w.now, w.window).unwrap().1;
        assert_eq!(held.ready_endpoints, Some(4.0));
        assert_eq!(
            held.flow_control_queue.is_some(),
            flow_control,
            "the flow-control gauge exists only with flow control on"
        );
    }
}

#[test]
fn an_outage_reads_not_ready_and_recovery_reads_ready_again() {
    let mut w = World::new(false);
    for _ in 0..5 {
        w.second(8.0);
    }
    w.model.take_all_endpoints(w.now);
    // Completions before the outage count as engine answers for 30 s: the operator keeps
    // a saturated-looking site ready that long, then decides it is down.
    let mut not_ready_after = None;
    for s in 1..=40 {
        w.second(8.0);
        let held = w.tracker.held(T0 + w.now, w.window).unwrap().1;
        assert_eq!(held.ready_endpoints, Some(0.0));
        assert_eq!(w.in_flight(), None, "nothing published at zero endpoints");
        if w.status() == ReadyStatus::NotReady && not_ready_after.is_none() {
            not_ready_after = Some(s);
        }
    }
    let after = not_ready_after.expect("the outage is concluded");
    assert!((2..=32).contains(&after), "not ready after {after} s");
    w.model.restore_all_endpoints(w.now);
    w.second(8.0);
    assert_eq!(w.status(), ReadyStatus::NotReady, "one positive scrape");
    w.second(8.0);
    assert_eq!(w.status(), ReadyStatus::Ready, "two positive scrapes");
}
