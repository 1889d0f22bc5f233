//! The routing simulator's invariants on a short run (a few virtual seconds): every
//! request is served exactly once under every policy, signals flowed through the real
//! path without refusals, and the run is a pure function of its seed.

use grid_sim::routing_sim::policy::Policy;
use grid_sim::routing_sim::scenario::Scenario;
use grid_sim::routing_sim::signals::{LOCAL_CADENCE_MS, PEER_CADENCE_MS};
use grid_sim::routing_sim::stats::Summary;
use grid_sim::routing_sim::{SimConfig, run};

const DURATION_MS: u64 = 20_000;

/// Policies that never fill a site's flow-control band at 85% load: ours, and those that
/// see every site's state fresh. Blind ones (round-robin, capacity-weighted) overflow the
/// small sites by design; least-queue and peak-EWMA herd onto one site between readings.
const KEEP_BANDS: [Policy; 3] = [Policy::Ours, Policy::Prequal, Policy::Oracle];

fn short(load: f64, seed: u64) -> SimConfig {
    SimConfig::standard(load, DURATION_MS, seed)
}

#[test]
fn every_policy_answers_every_request_once_and_ours_overflows_no_band() {
    let config = short(0.85, 3);
    let results = run(&config, &Policy::ALL, 2);
    assert_eq!(results.len(), Policy::ALL.len());
    let arrived = results[0].arrived;
    assert!(arrived > 500, "{arrived} arrivals in 20 s at 85%");
    for r in &results {
        let name = r.policy.as_str();
        assert_eq!(r.arrived, arrived, "{name}: same arrivals for every policy");
        assert_eq!(
            r.completed + r.failed,
            arrived,
            "{name}: every request completed or was refused, once"
        );
        if KEEP_BANDS.contains(&r.policy) {
            assert_eq!(r.failed, 0, "{name}: no band overflowed");
        }
        let routed: u64 = r
            .record
            .per_second
            .iter()
            .flatten()
            .map(|&c| u64::from(c))
            .sum();
        assert_eq!(routed, arrived, "{name}: every request routed once");
        assert_eq!(
            r.summary.requests + r.summary.failed,
            r.record.routed,
            "{name}: one delay per measured request that was not refused"
        );
        let shares: f64 = r.summary.site_shares.iter().sum();
        assert!((shares - 1.0).abs() < 1e-9, "{name}: shares sum to 1");
        assert!(r.summary.p50_ms <= r.summary.p99_ms && r.summary.p99_ms <= r.summary.max_ms);
        assert!((0.0..=1.0).contains(&r.summary.full_share));
    }
}

#[test]
fn signals_reach_the_gateway_at_the_real_cadences_without_refusals() {
    let config = short(0.6, 4);
    let results = run(&config, &[Policy::Ours], 1);
    let ours = &results[0];
    let seconds = DURATION_MS / LOCAL_CADENCE_MS;
    let sites = config.sites.len() as u64;
    let remote = (0..config.sites.len())
        .filter(|&i| !config.has_gateway(i))
        .count() as u64;
    let c = ours.signals;
    // The last arrival falls in the final second, so the path ran for about `seconds`.
    assert!(
        (sites * (seconds - 1)..=sites * (seconds + 1)).contains(&c.scrapes),
        "{c:?}"
    );
    assert_eq!(c.batches, c.scrapes);
    assert!(
        (seconds - 1..=seconds + 1).contains(&c.gateway_polls),
        "{c:?}"
    );
    let peer_polls = remote * seconds / (PEER_CADENCE_MS / LOCAL_CADENCE_MS);
    assert!(
        (peer_polls - remote..=peer_polls + remote).contains(&c.peer_polls),
        "{c:?}"
    );
    assert_eq!(c.dropped, 0, "no store refused a line: {c:?}");
    assert_eq!(
        c.refused_readings, 0,
        "the scorer took every reading: {c:?}"
    );
    assert_eq!(
        ours.summary.unplaced, 0,
        "grid-score placed every measured request"
    );
}

#[test]
fn round_robin_spreads_evenly_and_the_capacity_draw_follows_slots() {
    let config = short(0.75, 5);
    let results = run(&config, &[Policy::RoundRobin, Policy::CapacityWeighted], 2);
    let n = config.sites.len() as f64;
    for share in &results[0].summary.site_shares {
        assert!((share - 1.0 / n).abs() < 0.01, "round-robin share {share}");
    }
    let slots = config.slots() as f64;
    for (share, site) in results[1].summary.site_shares.iter().zip(&config.sites) {
        let want = site.slots() as f64 / slots;
        assert!(
            (share - want).abs() < 0.05,
            "{}: {share} vs {want}",
            site.name
        );
    }
}

#[test]
fn the_same_seed_gives_the_same_figures_on_any_number_of_threads() {
    let config = short(0.85, 6);
    let one = run(&config, &Policy::ALL, 1);
    let two = run(&config, &Policy::ALL, 2);
    for (a, b) in one.iter().zip(&two) {
        assert_eq!(a.policy, b.policy);
        assert_eq!(a.summary, b.summary, "{}", a.policy.as_str());
        assert_eq!(a.record.delays_ms, b.record.delays_ms);
    }
    let other = run(&short(0.85, 7), &[Policy::Ours], 1);
    assert_ne!(
        one[0].record.delays_ms, other[0].record.delays_ms,
        "another seed, other arrivals"
    );
}

/// Ours alone on scenario file `name` cut to `duration_s`, at `load`, on the file's first
/// seed: its summary.
fn ours_on(name: &str, duration_s: u64, load: f64) -> Summary {
    let file = scenario(name);
    let seed = *file.seeds.first().expect("a scenario file names its seeds");
    let config = file.with_duration_s(duration_s).config(load, seed);
    run(&config, &[Policy::Ours], 1).remove(0).summary
}

/// Ours' p99 time to first token of the requests served over the oracle's in one run of
/// `config`, and the two p99s (ms).
fn ours_over_oracle(config: &SimConfig) -> (f64, u64, u64) {
    let results = run(config, &[Policy::Ours, Policy::Oracle], 2);
    let (ours, oracle) = (
        results[0].summary.p99_ttft_served_ms,
        results[1].summary.p99_ttft_served_ms,
    );
    (ours as f64 / oracle as f64, ours, oracle)
}

fn scenario(name: &str) -> Scenario {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../scenarios")
        .join(name);
    let text = std::fs::read_to_string(&path).expect("the built-in scenario is there");
    Scenario::parse(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn every_scenario_file_under_benches_scenarios_parses() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .expect("benches/scenarios exists")
        .map(|e| {
            e.expect("a readable entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|n| {
            std::path::Path::new(n)
                .extension()
                .is_some_and(|e| e.eq_ignore_ascii_case("toml"))
        })
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "blip.toml",
            "epp-silent.toml",
            "fail-fast.toml",
            "five-sites-long.toml",
            "flapping-remote.toml",
            "frozen-remote-multi.toml",
            "frozen-remote.toml",
            "heavy-tail.toml",
            "mixed-priority.toml",
            "multi-gateway.toml",
            "overloaded-slow.toml",
            "plain-answers.toml",
            "regions-diurnal.toml",
            "short-requests.toml",
            "slow-large.toml",
            "slowed-light.toml",
            "standard.toml"
        ]
    );
    for name in &names {
        let s = scenario(name);
        assert!(!s.loads.is_empty() && !s.seeds.is_empty(), "{name}");
    }
}

#[test]
fn the_regions_file_swings_its_load_and_gives_each_pair_of_regions_its_own_round_trip() {
    let c = scenario("regions-diurnal.toml").config(0.85, 42);
    let ramp = c.ramp.expect("a swing");
    assert_eq!((ramp.period_ms, ramp.swing), (300_000, 0.25));
    let site = |name: &str| c.sites.iter().position(|s| s.name == name).unwrap();
    let gateway_at = |name: &str| {
        c.gateways
            .iter()
            .position(|g| g.site == site(name))
            .unwrap()
    };
    assert_eq!(c.rtt_ms(gateway_at("us-a"), site("us-b")), 12);
    assert_eq!(c.rtt_ms(gateway_at("eu-a"), site("us-a")), 80);
    assert_eq!(c.rtt_ms(gateway_at("ap-a"), site("eu-b")), 210);
    assert_eq!(c.rtt_ms(gateway_at("ap-a"), site("ap-a")), 1);
}

#[test]
fn the_mixed_priority_file_runs_a_higher_band_beside_band_0() {
    let s = scenario("mixed-priority.toml");
    let fc = s.config(0.85, 42).flow_control.expect("flow control on");
    let high = fc.high.expect("a second band");
    assert_eq!(high.priority, 1);
    assert!((high.share - 0.3).abs() < 1e-12 && (high.capacity_per_slot - 1.0).abs() < 1e-12);
    assert!((fc.band_capacity_per_slot - 4.0).abs() < 1e-12);
    assert_eq!(s.without_flow_control().config(0.85, 42).flow_control, None);
}

/// Each band's tail is read apart: at a site whose flow control serves the higher band
/// first, a request of that band waits less than one of band 0 behind it.
#[test]
fn with_two_bands_each_has_its_own_tail_and_the_higher_one_waits_less() {
    let (band0, high) = ours_on("mixed-priority.toml", 180, 0.85)
        .p99_ttft_by_band
        .expect("two bands, two tails");
    assert!(high < band0, "band 0 {band0} ms, the higher band {high} ms");
    assert_eq!(ours_on("standard.toml", 60, 0.85).p99_ttft_by_band, None);
}

#[test]
fn the_standard_file_is_the_standard_scenario() {
    let s = scenario("standard.toml");
    assert_eq!(s.config(0.85, 42), SimConfig::standard(0.85, 600_000, 42));
    assert_eq!(s.seeds, [42, 7, 1234]);
    let off = s.without_flow_control().config(0.85, 42);
    assert_eq!(off.flow_control, None);
    assert_eq!(
        off,
        SimConfig {
            flow_control: None,
            ..SimConfig::standard(0.85, 600_000, 42)
        }
    );
}

#[test]
fn a_scenario_with_an_unknown_field_is_refused_with_the_field_name() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/standard.toml");
    let text = std::fs::read_to_string(path).unwrap();
    let bad = text.replace("rtt_ms = 0\n", "rtt_ms = 0\nround_trip_ms = 5\n");
    let err = Scenario::parse(&bad).unwrap_err().to_string();
    assert!(err.contains("round_trip_ms"), "{err}");
    let bad = text.replace("site = \"s16\"", "site = \"s99\"");
    let err = Scenario::parse(&bad).unwrap_err().to_string();
    assert!(err.contains("degrade.site") && err.contains("s99"), "{err}");
}

/// A large site at half speed near saturation: a band that fills like a fast site's holds
/// its queue twice as long, which the time to first token shows against the oracle's.
#[test]
fn a_large_site_at_half_speed_near_saturation_keeps_ours_within_a_quarter_of_the_oracle() {
    let config = scenario("slow-large.toml")
        .with_duration_s(180)
        .config(0.85, 42);
    let results = run(&config, &[Policy::Ours, Policy::Oracle], 2);
    let (ours, oracle) = (&results[0], &results[1]);
    assert_eq!((ours.failed, oracle.failed), (0, 0));
    let ratio = ours.summary.p99_ttft_served_ms as f64 / oracle.summary.p99_ttft_served_ms as f64;
    assert!(
        ratio <= 1.25,
        "ours {} ms, oracle {} ms",
        ours.summary.p99_ttft_served_ms,
        oracle.summary.p99_ttft_served_ms
    );
}

/// Past saturation (the same file at 95%, 108% of what is served) every site is out of
/// headroom and drawn by the by-capacity weights, which count each one's queue against
/// how fast it drains. The fast sites, drawn most, refuse most: floored for it by their
/// answers' "full" and their refusals retried by slots, they handed their picks to the
/// half-speed site and kept its queue full, 1.5x the oracle's tail.
#[test]
fn past_saturation_a_large_site_at_half_speed_keeps_ours_within_a_fifth_of_the_oracle() {
    let config = scenario("slow-large.toml")
        .with_duration_s(180)
        .config(0.95, 42);
    let (ratio, ours, oracle) = ours_over_oracle(&config);
    assert!(ratio <= 1.2, "ours {ours} ms, oracle {oracle} ms");
}

/// Two sites slowed for the whole run leave the grid at 124% of what it serves, and every
/// band stays full for minutes. A band is full in requests, so the half-speed site's
/// full band holds its requests twice as long as a fast one's, and two things kept it
/// full: a site kept queued shows no calm moment, so its reach faded (a 32-slot site read
/// at 8 after ten minutes) and the by-capacity weights drew the fast sites as if they
/// drained a fraction of their slots; and the fast sites' refusals were retried by those
/// weights onto the slow site's longer queue. Ours' p99 was 1.8x the oracle's here.
#[test]
fn overloaded_by_slow_sites_ours_stays_within_one_and_a_half_times_the_oracle() {
    let config = scenario("overloaded-slow.toml")
        .with_duration_s(200)
        .config(0.85, 7);
    let (ratio, ours, oracle) = ours_over_oracle(&config);
    assert!(ratio <= 1.5, "ours {ours} ms, oracle {oracle} ms");
}

/// Every EPP silent for 90 s and no flow control: nothing is measured, so the gateway
/// routes without signals, by capacity. Drawn by capacity alone, the smallest site (its
/// learned size a little over its share of the load) kept that share while its queue
/// grew to 7 s behind the other sites' free slots, and ours' p99 was 1.18x the oracle's;
/// drawn less by the queue the gateway's own requests there show, 1.04x.
#[test]
fn with_every_epp_silent_and_no_flow_control_ours_stays_within_a_tenth_of_the_oracle() {
    let config = scenario("epp-silent.toml")
        .without_flow_control()
        .config(0.85, 5);
    let (ratio, ours, oracle) = ours_over_oracle(&config);
    assert!(ratio <= 1.1, "ours {ours} ms, oracle {oracle} ms");
}

/// Past saturation with two bands (the mixed-priority file at 95% load): a band whose
/// answers said "full" holds its whole size. Left out of its site's queue, a full default
/// band beside a priority band with a few waiting read as those few, the site refusing
/// every default-band request read as draining soonest, and a second's retries went to
/// the smallest site and were refused again while larger sites had room: ours failed
/// 243 requests where the oracle failed 5, with the full band counted 1.
#[test]
fn past_saturation_with_two_bands_ours_fails_at_most_a_tenth_of_a_percent_more_than_the_oracle() {
    let config = scenario("mixed-priority.toml").config(0.95, 42);
    let results = run(&config, &[Policy::Ours, Policy::Oracle], 2);
    let (ours, oracle) = (&results[0], &results[1]);
    let bound = oracle.summary.failed + ours.arrived / 1_000;
    assert!(
        ours.summary.failed <= bound,
        "ours failed {}, the oracle {} of {} arrived",
        ours.summary.failed,
        oracle.summary.failed,
        ours.arrived
    );
}

/// Past saturation (the standard sites at 95% load, one slowed threefold for a third of
/// the run) every site is read full and drawn by the by-capacity weights. With each
/// site's pace read there too, the fast sites, their bands four per slot, were paced down
/// to an eighth for keeping more than two waiting per slot, while the slowed site kept its
/// whole pace with fewer per slot waiting three times longer: its share grew its waits to
/// twice the others', and ours' p99 was 1.13x the oracle's; 1.03x with the queue counted
/// once, in time.
#[test]
fn past_saturation_ours_stays_within_eight_percent_of_the_oracle() {
    let config = scenario("standard.toml").config(0.95, 4);
    let (ratio, ours, oracle) = ours_over_oracle(&config);
    assert!(ratio <= 1.08, "ours {ours} ms, oracle {oracle} ms");
}

/// The standard sites at 85% with one slowed twentyfold for a third of the run: between
/// two refreshes the weights stand while the slowed site's requests last twenty times
/// longer. Drawn once by weight, a second's picks kept landing there until a refresh
/// read the queue they made (ours 1.05x the oracle's p99); drawn twice and sent to the
/// one holding fewer of the gateway's requests for its weight, the site whose requests
/// run long is drawn less at once (0.98x).
#[test]
fn a_site_whose_requests_run_long_is_drawn_less_before_a_refresh_says_so() {
    let config = scenario("slowed-light.toml").config(0.85, 7);
    let (ratio, ours, oracle) = ours_over_oracle(&config);
    assert!(ratio <= 1.02, "ours {ours} ms, oracle {oracle} ms");
}

/// At light load every site has free slots, and one at the slowed site answers twenty
/// times slower than one elsewhere: drawn by its headroom alone the slowed site kept its
/// slots full and took about 2% of the requests while slowed (the oracle none), which
/// is the top of the time-to-first-token tail; drawn by headroom times its speed, under
/// 1%.
#[test]
fn at_light_load_a_site_twenty_times_slower_takes_under_one_percent_of_the_requests() {
    let during = ours_on("slowed-light.toml", 400, 0.3).degrade.share_during;
    assert!(
        during < 0.01,
        "the slowed site's share while slowed: {during}"
    );
}

/// Four gateways, the largest site's operator frozen, no flow control: each gateway reads
/// the frozen site as its last polled load moved by its own requests there, so together
/// they neither starve it (it took half its share while unmeasured: 1.5-1.6x the
/// oracle) nor each offer it its whole turnover (1.3-1.5x).
#[test]
fn with_a_large_sites_operator_frozen_and_no_flow_control_every_gateway_keeps_ours_near_the_oracle()
{
    for gossip in [false, true] {
        let mut frozen = scenario("frozen-remote-multi.toml")
            .with_duration_s(400)
            .without_flow_control();
        if gossip {
            frozen = frozen.with_gossip();
        }
        let (ratio, ours, oracle) = ours_over_oracle(&frozen.config(0.85, 42));
        assert!(
            ratio <= 1.3,
            "gossip {gossip}: ours {ours} ms, oracle {oracle} ms"
        );
    }
}

#[test]
fn in_the_multi_gateway_scenario_every_request_is_answered_once_and_ours_overflows_no_band() {
    let config = scenario("multi-gateway.toml")
        .with_duration_s(DURATION_MS / 1_000)
        .config(0.85, 8);
    assert_eq!(config.gateways.len(), config.sites.len());
    let results = run(&config, &Policy::ALL, 2);
    let arrived = results[0].arrived;
    for r in &results {
        let name = r.policy.as_str();
        assert_eq!(
            r.completed + r.failed,
            arrived,
            "{name}: every request answered"
        );
        if KEEP_BANDS.contains(&r.policy) {
            assert_eq!(r.failed, 0, "{name}: no band overflowed");
        }
        assert_eq!(
            r.summary.requests + r.summary.failed,
            r.record.routed,
            "{name}: one delay each that was not refused"
        );
        if r.summary.p99_ms != grid_sim::routing_sim::stats::UNSERVED {
            assert!(
                r.summary.p99_ttft_ms > r.summary.p99_ms,
                "{name}: the round trip and the prefill add to the wait"
            );
            assert!(
                r.summary.p99_e2e_ms > r.summary.p99_ttft_ms,
                "{name}: the decode adds to the first token"
            );
        }
    }
    let ours = &results[0];
    assert_eq!(ours.signals.dropped, 0, "{:?}", ours.signals);
    assert_eq!(ours.signals.refused_readings, 0, "{:?}", ours.signals);
    let gateways = config.gateways.len() as u64;
    let seconds = DURATION_MS / LOCAL_CADENCE_MS;
    assert!(
        ours.signals.gateway_polls >= gateways * (seconds - 1),
        "every gateway polled its own operator: {:?}",
        ours.signals
    );
}

#[test]
fn requests_at_a_site_that_loses_every_endpoint_fail_and_the_rest_complete() {
    let mut config = scenario("blip.toml").config(0.75, 9);
    config.duration_ms = 40_000;
    config.warmup_ms = 5_000;
    let blip = &mut config.blips[0];
    blip.from_ms = 20_000;
    blip.until_ms = 26_000;
    let results = run(&config, &Policy::ALL, 2);
    for r in &results {
        let name = r.policy.as_str();
        assert_eq!(r.completed + r.failed, r.arrived, "{name}");
        let after: u32 = r.record.per_second[30..]
            .iter()
            .map(|s| s[config.blips[0].site])
            .sum();
        assert!(
            after > 0,
            "{name}: the site has traffic again after the blip"
        );
    }
    let round_robin = &results[1];
    assert!(round_robin.failed > 0, "round-robin keeps sending to it");
}

#[test]
fn a_site_back_from_a_six_second_blip_regains_its_capacity_share_within_ten_seconds() {
    // Readings taken while a site has no ready endpoint never move its capacity bounds:
    // otherwise a 6 s blip drops the largest site's learned capacity to the floor and
    // it gets no traffic for many minutes. In the simulator, through the real signal
    // path, its share in the ten seconds after the blip must be within 20% of its
    // capacity share.
    let mut config = SimConfig::standard(0.6, 60_000, 11);
    config.degrade.clear();
    config.bursts = None;
    let s64 = 3;
    config.blips = vec![grid_sim::routing_sim::Blip {
        site: s64,
        from_ms: 30_000,
        until_ms: 36_000,
    }];
    let results = run(&config, &[Policy::Ours], 1);
    let per_second = &results[0].record.per_second;
    let share_over = |window: std::ops::Range<usize>| {
        let (mine, all) = per_second[window].iter().fold((0u32, 0u32), |(m, a), s| {
            (m + s[s64], a + s.iter().sum::<u32>())
        });
        f64::from(mine) / f64::from(all)
    };
    let capacity_share = config.sites[s64].slots() as f64 / config.slots() as f64;
    // The refresh after the endpoints are back, then ten seconds: at least its capacity
    // share less 20% (a collapsed capacity gets none at all), and at least 80% of what it
    // took before the blip. It may take more, being empty while the others still hold the
    // blip's backlog (the oracle sends it 75% of the requests in the first three seconds,
    // Prequal 85% over the ten), but not everything: the others together keep a tenth.
    let first = share_over(37..47);
    assert!(
        first >= 0.8 * capacity_share && first <= 0.9,
        "share {first:.3} against capacity share {capacity_share:.3}"
    );
    // Before the blip it took about 60% at this load, more than its slots' 53%: spreading
    // free slots favours the site with the most of them while load is light.
    let before = share_over(20..30);
    assert!(
        first >= 0.8 * before,
        "share {first:.3} after the blip against {before:.3} before it"
    );
}

/// Without flow control a remote site back from losing its endpoints takes the new
/// requests while the sites that covered for it drain their backlog: the reading that
/// says it serves again clears what failed around the outage, which had weighed it down
/// to a seventeenth of its share for seconds (a third of the requests in the two seconds
/// after, where the oracle sends it all).
#[test]
fn a_remote_site_back_from_a_flap_without_flow_control_takes_most_requests_at_once() {
    let config = scenario("flapping-remote.toml")
        .with_duration_s(200)
        .without_flow_control()
        .config(0.85, 42);
    let results = run(&config, &[Policy::Ours], 1);
    let per_second = &results[0].record.per_second;
    let s64 = config
        .sites
        .iter()
        .position(|s| s.name == "s64")
        .expect("the flapping site");
    for blip in config.blips.iter().filter(|b| b.until_ms < 200_000) {
        // The second after the one it came back in: the long poll has told the gateway.
        let first = (blip.until_ms / 1_000 + 1) as usize;
        let (mine, all) = per_second[first..first + 2]
            .iter()
            .fold((0u32, 0u32), |(m, a), s| {
                (m + s[s64], a + s.iter().sum::<u32>())
            });
        let share = f64::from(mine) / f64::from(all);
        assert!(
            share >= 0.7,
            "back at {} ms: {mine} of {all} requests in the next two seconds",
            blip.until_ms
        );
    }
}

#[test]
fn time_to_first_token_is_the_wait_the_round_trip_and_the_prefill_and_end_to_end_the_whole_service()
{
    const RTT_MS: u64 = 40;
    let mut config = short(0.1, 11);
    config.service.sigma = 0.0;
    config.degrade.clear();
    config.local_rtt_ms = RTT_MS;
    for site in &mut config.sites {
        site.rtt_ms = RTT_MS;
    }
    let median = config.service.median_ms as u64;
    let prefill = (config.service.median_ms * config.service.prefill_share).round() as u64;
    let r = &run(&config, &[Policy::Oracle], 1)[0];
    let record = &r.record;
    assert_eq!(record.delays_ms.len(), record.ttft_ms.len());
    assert!(
        record.delays_ms.len() > 50,
        "{} measured",
        record.delays_ms.len()
    );
    let (mut streamed, mut plain) = (0, 0);
    for (delay, ttft) in record.delays_ms.iter().zip(&record.ttft_ms) {
        match ttft - delay {
            x if x == RTT_MS + prefill => streamed += 1,
            x if x == RTT_MS + median => plain += 1,
            x => panic!("time to first token {ttft} ms after a {delay} ms wait adds {x} ms"),
        }
    }
    let share = f64::from(streamed) / f64::from(streamed + plain);
    assert!(
        (share - config.streaming_share).abs() < 0.1,
        "{streamed} streamed and {plain} plain"
    );
    assert_eq!(
        record.e2e_ms.len(),
        record.delays_ms.len(),
        "every answer completed"
    );
    let fastest = record.e2e_ms.iter().min().copied();
    assert_eq!(
        fastest,
        Some(RTT_MS + median),
        "an answer that never waited"
    );
    assert!(r.summary.p99_e2e_ms >= RTT_MS + median);
    assert!(r.summary.p99_ttft_served_ms <= r.summary.p99_ttft_ms);
}

#[test]
fn skywalker_holds_at_its_gateway_what_no_site_has_slots_for_and_never_sends_to_a_full_site() {
    let config = SimConfig::standard(0.95, 120_000, 5);
    let r = &run(&config, &[Policy::SkyWalker], 1)[0];
    assert_eq!(r.completed + r.failed, r.arrived, "every request answered");
    assert_eq!(
        r.failed, 0,
        "nothing refused: the gateway's queue holds the excess"
    );
    assert!(
        r.summary.full_share.abs() < f64::EPSILON,
        "one gateway sends only to a site with a free slot: {}",
        r.summary.full_share
    );
    assert!(
        r.summary.max_ms > 0,
        "at 95% with bursts some requests waited, at the gateway: {:?}",
        r.summary
    );
}

/// Requests five times shorter than the configured turnover, and the largest site at half
/// speed for a third of the run, past what the grid serves: every site queues. Read no
/// faster than the prior while queued, every site drained its queue alike, the half-speed
/// site took a fast one's share, and its full band, twice as long in time, was the tail
/// (ours 1.57x the oracle's p99); drained at each site's own turnover, 0.98x.
#[test]
fn with_requests_shorter_than_the_prior_a_queue_drains_at_its_sites_own_pace() {
    let config = scenario("short-requests.toml").config(0.85, 1);
    let (ratio, ours, oracle) = ours_over_oracle(&config);
    assert!(ratio <= 1.15, "ours {ours} ms, oracle {oracle} ms");
}

/// Every answer plain and no flow control: no answer states its wait, so the only time
/// the gateway can learn a site's turnover from is a plain answer's sending to its head,
/// the slot and the wait for one together. Unlearned, every site read at the prior, the
/// site slowed threefold kept its share and its queue (ours 1.12x the oracle's p99); read
/// from those times until a cleaner one is known, 1.06x.
#[test]
fn without_flow_control_plain_answers_alone_teach_a_sites_turnover() {
    let config = scenario("plain-answers.toml")
        .without_flow_control()
        .config(0.85, 42);
    let (ratio, ours, oracle) = ours_over_oracle(&config);
    assert!(ratio <= 1.09, "ours {ours} ms, oracle {oracle} ms");
}

/// Requests with a heavy tail (sigma 1.3: the mean 2.3 times the median) past saturation,
/// the largest site three times slower for a third of the run. A turnover averaged over
/// about ten answers wandered over a sevenfold range from one refresh to the next, the
/// by-capacity shares swung with it, and the slowed site took in bursts of picks its
/// queue then needed twice the others' time to drain (ours 1.22x the oracle's p99);
/// averaged over as many answers as their spread needs, 1.10x.
#[test]
fn with_heavy_tailed_requests_past_saturation_ours_stays_within_fifteen_percent_of_the_oracle() {
    let config = scenario("heavy-tail.toml").config(0.85, 2);
    let (ratio, ours, oracle) = ours_over_oracle(&config);
    assert!(ratio <= 1.15, "ours {ours} ms, oracle {oracle} ms");
}
