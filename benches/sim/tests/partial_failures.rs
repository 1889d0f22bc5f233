//! Partial failures never become total, in the routing simulator: the four shapes as
//! scenario files (`benches/scenarios/`), shortened, run for grid's policy on every seed
//! of the file, through the production rules (grid-score's retry rule and budget, its
//! probes of ejected sites, an unread "not ready" as no verdict, a 429 as full).
//!
//! "Refused while another site had room" counts the requests answered to their client
//! with a refusal (a site's 503 or 429 that was not retried, or was refused again when
//! retried, or the gateway's own 503 or 429) at an instant when another site serving the
//! model had a free slot or room in its flow-control band, in the simulator's truth.

use grid_score::retry::RETRY_BUDGET_RATIO;
use grid_sim::routing_sim::policy::Policy;
use grid_sim::routing_sim::scenario::Scenario;
use grid_sim::routing_sim::{PolicyResult, SimConfig, run};

/// "The first seconds" of a site failing fast: what it may cost before the gateway has
/// seen enough of its answers to take it out.
const FIRST_SECONDS_MS: u64 = 5_000;
/// The share of the requests arriving after those first seconds that may fail.
const MAX_FAILED_SHARE: f64 = 0.01;
/// A site serving again is back in its share within this long: over this long after it
/// serves again it takes at least [`BACK_SHARE_OF_SLOTS`] of its share of the slots. Read
/// over the whole span, not its last seconds: an empty site back from failing fills its
/// free slots first (of two candidates drawn it wins every comparison it is in, up to
/// 1 - (1 - w)^2 of the picks) and is then drawn less while those requests run; what it
/// must not be is kept out.
const BACK_WITHIN_MS: u64 = 10_000;
/// The window after [`BACK_WITHIN_MS`] over which it keeps that share: long enough that a
/// second of luck does not count.
const BACK_WINDOW_MS: u64 = 5_000;
/// "Back in its share": at least this part of its share of the slots.
const BACK_SHARE_OF_SLOTS: f64 = 0.5;

fn scenario(name: &str, duration_s: u64) -> Scenario {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../scenarios")
        .join(name);
    let text = std::fs::read_to_string(&path).expect("the scenario file is there");
    Scenario::parse(&text)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .with_duration_s(duration_s)
}

/// Grid's run of `scenario` at its first load, once per seed of the file.
fn grid_runs(scenario: &Scenario) -> Vec<(SimConfig, PolicyResult)> {
    scenario
        .seeds
        .iter()
        .map(|&seed| {
            let config = scenario.config(scenario.loads[0], seed);
            let mut results = run(&config, &[Policy::Ours], 1);
            let ours = results.pop().expect("one policy, one result");
            assert_eq!(
                ours.completed + ours.failed,
                ours.arrived,
                "seed {seed}: every request answered once"
            );
            (config, ours)
        })
        .collect()
}

fn slot_share(config: &SimConfig, site: usize) -> f64 {
    config.sites[site].slots() as f64 / config.slots() as f64
}

/// The figures a run missed, each said once: every one is checked, so a run that misses
/// several shows them all.
#[derive(Default)]
struct Misses(Vec<String>);

impl Misses {
    fn check(&mut self, ok: bool, what: impl FnOnce() -> String) {
        if !ok {
            self.0.push(what());
        }
    }

    fn assert_none(self) {
        assert!(self.0.is_empty(), "{}", self.0.join("\n"));
    }
}

#[test]
fn with_every_epp_silent_grid_routes_by_the_answers_band_room_and_refuses_no_request_while_a_site_has_room()
 {
    // The scenario's sites run flow control: their answers carry their bands' room, which
    // measures each site while no polled reading does.
    let mut misses = Misses::default();
    for (config, ours) in grid_runs(&scenario("epp-silent.toml", 180)) {
        let seed = config.seed;
        let c = ours.signals;
        misses.check(c.failed_scrapes > 0, || {
            format!("seed {seed}: the EPPs never went silent: {c:?}")
        });
        misses.check(ours.summary.refused_room == 0, || {
            format!(
                "seed {seed}: {} refused while another site had room",
                ours.summary.refused_room
            )
        });
        misses.check((c.without_signals, c.unroutable) == (0, 0), || {
            format!(
                "seed {seed}: without signals {}x, unroutable {}x (want never: the answers \
                 are signals)",
                c.without_signals, c.unroutable
            )
        });
    }
    misses.assert_none();
}

#[test]
fn with_every_epp_silent_and_no_flow_control_grid_routes_without_signals_and_refuses_no_request_while_a_site_has_room()
 {
    let mut misses = Misses::default();
    let silent = scenario("epp-silent.toml", 180).without_flow_control();
    for (config, ours) in grid_runs(&silent) {
        let seed = config.seed;
        let c = ours.signals;
        misses.check(c.failed_scrapes > 0, || {
            format!("seed {seed}: the EPPs never went silent: {c:?}")
        });
        misses.check(ours.summary.refused_room == 0, || {
            format!(
                "seed {seed}: {} refused while another site had room",
                ours.summary.refused_room
            )
        });
        misses.check((c.without_signals, c.unroutable) == (1, 0), || {
            format!(
                "seed {seed}: without signals {}x, unroutable {}x (want once, never)",
                c.without_signals, c.unroutable
            )
        });
    }
    misses.assert_none();
}

#[test]
fn a_site_failing_fast_fails_under_one_percent_after_its_first_seconds_and_is_back_within_ten_seconds()
 {
    let mut misses = Misses::default();
    for (config, ours) in grid_runs(&scenario("fail-fast.toml", 400)) {
        let seed = config.seed;
        misses.check(ours.summary.refused_room == 0, || {
            format!(
                "seed {seed}: {} refused while another site had room",
                ours.summary.refused_room
            )
        });
        let r = &ours.record;
        for f in &config.fail_fast {
            let status = f.status;
            let (failed, arrived) = r.failed_share(f.from_ms + FIRST_SECONDS_MS, f.until_ms);
            assert!(arrived > 1_000, "seed {seed}, {status}: {arrived} requests");
            misses.check(failed < MAX_FAILED_SHARE, || {
                format!(
                    "seed {seed}, {status}: {:.2}% of requests failed after the first seconds",
                    failed * 100.0
                )
            });
            let retried = r.retry_share(f.from_ms, f.until_ms);
            misses.check(retried <= RETRY_BUDGET_RATIO, || {
                format!(
                    "seed {seed}, {status}: retries {:.1}% of requests",
                    retried * 100.0
                )
            });
            let back = f.until_ms + BACK_WITHIN_MS;
            let fair = slot_share(&config, f.site);
            let share = r.site_share(f.site, f.until_ms, back);
            misses.check(share >= BACK_SHARE_OF_SLOTS * fair, || {
                format!(
                    "seed {seed}, {status}: {share:.3} of requests in the {} s after it serves \
                     again (its slots: {fair:.3})",
                    BACK_WITHIN_MS / 1_000
                )
            });
            let kept = r.site_share(f.site, back, back + BACK_WINDOW_MS);
            misses.check(kept >= BACK_SHARE_OF_SLOTS * fair, || {
                format!(
                    "seed {seed}, {status}: {kept:.3} of requests {}-{} s after it serves again \
                     (its slots: {fair:.3})",
                    BACK_WITHIN_MS / 1_000,
                    (BACK_WITHIN_MS + BACK_WINDOW_MS) / 1_000
                )
            });
        }
    }
    misses.assert_none();
}

#[test]
fn with_a_remote_operator_frozen_the_remote_site_takes_the_overflow_and_grid_refuses_nothing() {
    let mut misses = Misses::default();
    for (config, ours) in grid_runs(&scenario("frozen-remote.toml", 200)) {
        let seed = config.seed;
        misses.check(ours.summary.refused_room == 0, || {
            format!(
                "seed {seed}: {} refused while another site had room",
                ours.summary.refused_room
            )
        });
        let frozen = config.operator_frozen[0];
        // Its readings age out of freshness first (three peer polls); from then on it has
        // no signal at all.
        let unmeasured_from = frozen.from_ms + grid_score::ScoreConfig::default().fresh_for_ms;
        let share = ours
            .record
            .site_share(frozen.site, unmeasured_from, frozen.until_ms);
        let fair = slot_share(&config, frozen.site);
        misses.check(share >= BACK_SHARE_OF_SLOTS * fair, || {
            format!(
                "seed {seed}: the remote site took {share:.3} of requests without a signal \
                 (its slots: {fair:.3})"
            )
        });
        misses.check(ours.summary.retry_share <= RETRY_BUDGET_RATIO, || {
            format!(
                "seed {seed}: retries {:.1}% of requests",
                ours.summary.retry_share * 100.0
            )
        });
    }
    misses.assert_none();
}

#[test]
fn while_a_remote_site_flaps_grid_refuses_nothing_while_another_site_has_room_and_its_retries_stay_within_the_budget()
 {
    let mut misses = Misses::default();
    for (config, ours) in grid_runs(&scenario("flapping-remote.toml", 250)) {
        let seed = config.seed;
        // Each flap takes the site out: its readings (the remote zero reaches the gateway
        // within a scrape), or its failures.
        let flaps = config
            .blips
            .iter()
            .filter(|b| b.from_ms < config.duration_ms)
            .count() as u64;
        let out = ours.signals.exclusions + ours.signals.ejections;
        misses.check(out >= flaps, || {
            format!(
                "seed {seed}: the flapping site left selection {out} times in {flaps} flaps: {:?}",
                ours.signals
            )
        });
        let s = &ours.summary;
        misses.check(s.refused_room == 0, || {
            format!(
                "seed {seed}: {} refused while another site had room",
                s.refused_room
            )
        });
        misses.check(s.retries > 0 && s.retry_share <= RETRY_BUDGET_RATIO, || {
            format!(
                "seed {seed}: {} retries, {:.1}% of requests",
                s.retries,
                s.retry_share * 100.0
            )
        });
    }
    misses.assert_none();
}
