//! In the routing simulator's signal path (the real site machines, the gateway's real
//! refresher, both polls on grid-signals' long-poll rule): a remote site whose EPP reads
//! zero ready endpoints leaves the gateway's selection within the scrape that reads it,
//! and rejoins within the scrapes its readiness needs, never waiting for a 5 s peer poll.
//! Prints each transition's time (`-- --nocapture`), from the moment the site lost its
//! endpoints (the next scrape is the first to read it).

use grid_sim::routing_sim::signals::{
    GOSSIP_SPREAD_MS, LOCAL_CADENCE_MS, MODEL, PEER_CADENCE_MS, SignalPath,
};
use grid_sim::site_model::{RequestSpec, SiteConfig, SiteModel};

/// Transitions measured, each at another phase of the scrapes and polls.
const CYCLES: u64 = 25;
/// Exclusion: the wait for the next scrape (a scrape interval at most), and nothing on
/// the polls.
const EXCLUDE_WITHIN_MS: u64 = LOCAL_CADENCE_MS;
/// Rejoining: the scrapes the operator's readiness needs to come back (a positive count
/// is read at once, its verdict after the engine's answer), and nothing on the polls.
const REJOIN_WITHIN_MS: u64 = LOCAL_CADENCE_MS;

fn excluded(path: &SignalPath, site: &str) -> bool {
    path.table()
        .get(MODEL)
        .is_some_and(|m| m.excluded().iter().any(|e| &*e.key.site == site))
}

/// Runs the path and the sites up to `until_ms`; returns the first instant `done` held.
fn run_until(
    path: &mut SignalPath,
    sites: &mut [SiteModel],
    t_ms: &mut u64,
    until_ms: u64,
    mut done: impl FnMut(&SignalPath) -> bool,
) -> Option<u64> {
    while *t_ms <= until_ms {
        for site in sites.iter_mut() {
            site.advance(*t_ms);
            while site.poll_event().is_some() {}
        }
        path.at(*t_ms, sites);
        if done(path) {
            return Some(*t_ms);
        }
        *t_ms = path.next_instant_after(*t_ms);
    }
    None
}

fn quantile(mut v: Vec<u64>, q: f64) -> u64 {
    v.sort_unstable();
    v[((v.len() - 1) as f64 * q).round() as usize]
}

const NAMES: [&str; 4] = ["home", "r1", "r2", "r3"];

/// Each cycle's time from a remote site losing its endpoints to its exclusion, and from
/// their return to its rejoining, over `path` (built for [`NAMES`], home first).
fn transitions(mut path: SignalPath) -> (Vec<u64>, Vec<u64>) {
    let names: Vec<String> = NAMES.map(String::from).to_vec();
    let mut sites: Vec<SiteModel> = names
        .iter()
        .enumerate()
        .map(|(i, n)| SiteModel::new(SiteConfig::new(n.as_str(), 2, 4), i as u64).unwrap())
        .collect();
    let mut t = 0;
    run_until(&mut path, &mut sites, &mut t, 15_000, |_| false);
    let (mut out, mut back) = (Vec::new(), Vec::new());
    for i in 0..CYCLES {
        let remote = 1 + (i % 3) as usize;
        let name = NAMES[remote];
        // An engine answer at the site, so its verdict follows the ready-endpoint count
        // (a site that answered within 30 s is not declared down by it).
        sites[remote]
            .arrive(
                t,
                RequestSpec {
                    streaming: false,
                    service_ms: Some(300),
                },
            )
            .unwrap();
        let drop_at = t + 1_000 + (i * 373) % PEER_CADENCE_MS;
        run_until(&mut path, &mut sites, &mut t, drop_at - 1, |_| false);
        sites[remote].take_all_endpoints(drop_at);
        let left = run_until(&mut path, &mut sites, &mut t, drop_at + 20_000, |p| {
            excluded(p, name)
        })
        .expect("the site leaves selection");
        let restore_at = left + 500 + (i * 211) % 3_000;
        run_until(&mut path, &mut sites, &mut t, restore_at - 1, |_| false);
        sites[remote].restore_all_endpoints(restore_at);
        let rejoined = run_until(&mut path, &mut sites, &mut t, restore_at + 20_000, |p| {
            !excluded(p, name)
        })
        .expect("the site rejoins");
        println!(
            "cycle {}: {name} excluded after {} ms, selectable again after {} ms",
            i + 1,
            left - drop_at,
            rejoined - restore_at
        );
        out.push(left - drop_at);
        back.push(rejoined - restore_at);
    }
    let row = |what: &str, v: &[u64]| {
        println!(
            "{what}: median {} ms, worst {} ms",
            quantile(v.to_vec(), 0.5),
            quantile(v.to_vec(), 1.0)
        );
    };
    row("exclude", &out);
    row("rejoin", &back);
    (out, back)
}

#[test]
fn a_remote_site_leaves_and_rejoins_selection_within_a_scrape_not_a_peer_poll() {
    let names: Vec<String> = NAMES.map(String::from).to_vec();
    let (out, back) = transitions(SignalPath::new(&names, 0));
    assert!(
        out.iter().all(|&ms| ms <= EXCLUDE_WITHIN_MS),
        "exclusions {out:?}"
    );
    assert!(
        back.iter().all(|&ms| ms <= REJOIN_WITHIN_MS),
        "rejoins {back:?}"
    );
}

#[test]
fn under_gossip_a_remote_sites_readiness_change_is_pushed_and_it_leaves_and_rejoins_within_a_scrape_and_a_hop()
 {
    const RTT_MS: u64 = 40;
    let names: Vec<String> = NAMES.map(String::from).to_vec();
    let path = SignalPath::new(&names, 0).gossiping(&[RTT_MS; NAMES.len()]);
    let (out, back) = transitions(path);
    // The scrape that reads the change, the push's one-way hop and the pull's round trip,
    // then the gateway's poll that the home operator's readiness answers at once: never
    // the spread a load change waits for.
    let within = LOCAL_CADENCE_MS + RTT_MS / 2 + RTT_MS;
    assert!(within < LOCAL_CADENCE_MS + GOSSIP_SPREAD_MS);
    assert!(out.iter().all(|&ms| ms <= within), "exclusions {out:?}");
    assert!(back.iter().all(|&ms| ms <= within), "rejoins {back:?}");
}
