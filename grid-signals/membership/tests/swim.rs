//! Membership behaviour over a simulated network: joining through one seed, detecting a
//! dead member, healing a partition, refusing what no session authenticates.

mod support;

use grid_membership::{Direction, Input, MEMBER_RECOUNT_MS, Refusal, Role, StateLabel, Timing};
use support::{Net, member};

const ROUND_MS: u64 = 1_000;

fn joined(sites: &[&str]) -> Net {
    let mut net = Net::new(sites, &Timing::default());
    for s in &sites[1..] {
        net.connect(s, sites[0]);
    }
    assert!(
        net.run_until_converged(10 * ROUND_MS).is_some(),
        "the grid did not converge"
    );
    net
}

#[test]
fn members_that_know_only_one_seed_learn_the_whole_roster() {
    let net = joined(&["a", "b", "c", "d", "e"]);
    assert_eq!(net.view("e").len(), 4);
    assert!(
        net.nodes["a"].sessions() >= 4,
        "a session per pair that spoke"
    );
    let (sent, bytes) = net.nodes["a"].metrics().traffic_count(Direction::Sent);
    assert!(sent > 0 && bytes > sent, "{sent} datagrams, {bytes} bytes");
}

#[test]
fn a_member_that_stops_answering_is_suspected_then_declared_down_everywhere() {
    let mut net = joined(&["a", "b", "c", "d"]);
    net.dead.insert("d".into());
    let down = net
        .run_until_converged(20 * ROUND_MS)
        .expect("d was not declared down");
    // Suspected within a few rounds, down `suspect_to_down` later.
    assert!(down <= 10 * ROUND_MS, "{down} ms");
    for s in ["a", "b", "c"] {
        assert!(
            net.downs[s].iter().any(|m| m.site == "d"),
            "{s} saw no Down for d"
        );
        assert!(!net.view(s).contains("d"));
    }
    let suspicions: u64 = ["a", "b", "c"]
        .iter()
        .map(|s| net.nodes[*s].metrics().suspicions())
        .sum();
    assert!(suspicions >= 1);
}

#[test]
fn a_healed_partition_converges_within_three_announce_periods() {
    let timing = Timing::default();
    let mut net = joined(&["a", "b", "c", "d"]);
    net.partition(&["a", "b"], &["c", "d"]);
    net.run(15 * ROUND_MS);
    assert_eq!(net.view("a"), ["b".to_owned()].into());
    net.heal();
    let healed = net
        .run_until_converged(3 * timing.announce.as_millis() as u64)
        .expect("no convergence within three announce periods");
    assert!(healed <= 3 * timing.announce.as_millis() as u64);
}

/// A joined grid of `a`, `b` and twelve others, with `a` and `b` cut off from the twelve;
/// the twelve's names. `a` keeps `b`, so it stays in the cluster (foca stops announcing
/// when it knows nobody).
fn two_cut_off_from_twelve() -> (Net, Vec<String>) {
    let others: Vec<String> = (0..12).map(|i| format!("s{i}")).collect();
    let mut sites: Vec<&str> = others.iter().map(String::as_str).collect();
    sites.extend(["a", "b"]);
    let mut net = joined(&sites);
    net.partition(&["a", "b"], &sites[..12]);
    (net, others)
}

#[test]
fn every_member_believed_down_is_reached_for_each_round() {
    let (mut net, _) = two_cut_off_from_twelve();
    // a probes one member a round, so it takes a round-robin of them to suspect them all.
    let b_only: std::collections::BTreeSet<String> = ["b".to_owned()].into();
    for _ in 0..40 {
        net.run(ROUND_MS);
        if net.view("a") == b_only {
            break;
        }
    }
    assert_eq!(net.view("a"), b_only);
    let from = net.now;
    net.run(ROUND_MS);
    let reached: std::collections::BTreeSet<&str> = net
        .sent
        .iter()
        .filter(|(at, by, to)| *at > from && by == "a" && to != "b")
        .map(|(_, _, to)| to.as_str())
        .collect();
    assert_eq!(reached.len(), 12, "{reached:?}");
}

#[test]
fn a_member_told_it_was_declared_down_announces_its_new_identity_to_every_member_believed_down_at_once()
 {
    let (mut net, others) = two_cut_off_from_twelve();
    let b_only: std::collections::BTreeSet<String> = ["b".to_owned()].into();
    let apart =
        |net: &Net| net.view("a") == b_only && others.iter().all(|s| !net.view(s).contains("a"));
    for _ in 0..60 {
        if apart(&net) {
            break;
        }
        net.run(ROUND_MS);
    }
    assert!(apart(&net), "the sides never declared each other down");
    net.heal();
    let before = net.nodes["a"].identity().incarnation;
    for _ in 0..3 * ROUND_MS {
        if net.nodes["a"].identity().incarnation != before {
            break;
        }
        net.run(1);
    }
    assert_ne!(
        net.nodes["a"].identity().incarnation,
        before,
        "a was never told it was down"
    );
    // Well inside one round: without the announce at renewal, foca waits a round after
    // hearing from a member again before it announces to the members believed down.
    let renewed = net.now;
    net.run(ROUND_MS / 4);
    let reached: std::collections::BTreeSet<&str> = net
        .sent
        .iter()
        .filter(|(at, by, to)| *at >= renewed && by == "a" && to != "b")
        .map(|(_, _, to)| to.as_str())
        .collect();
    assert_eq!(reached.len(), 12, "{reached:?}");
}

#[test]
fn a_restarted_member_is_seen_up_again_under_its_new_incarnation() {
    let timing = Timing::default();
    let mut net = joined(&["a", "b", "c"]);
    net.dead.insert("c".into());
    net.run(2 * ROUND_MS);
    net.add("c", 2, &timing, 77);
    net.connect("c", "a");
    let renewed = |net: &Net| {
        net.nodes["b"]
            .live()
            .any(|m| m.site == "c" && m.incarnation == 2)
    };
    for _ in 0..100 {
        if renewed(&net) {
            break;
        }
        net.run(100);
    }
    assert!(renewed(&net), "b never learned c's new incarnation");
    assert!(net.converged());
    assert!(
        net.ups["b"]
            .iter()
            .any(|m| m.site == "c" && m.incarnation == 2)
    );
}

#[test]
fn membership_converges_with_one_percent_loss() {
    let mut net = Net::new(&["a", "b", "c", "d", "e", "f"], &Timing::default());
    net.loss = 10;
    for s in ["b", "c", "d", "e", "f"] {
        net.connect(s, "a");
    }
    assert!(net.run_until_converged(15 * ROUND_MS).is_some());
    net.run(30 * ROUND_MS);
    assert!(net.converged(), "a false Down under 1% loss");
}

#[test]
fn a_member_suspected_while_briefly_cut_off_refutes_and_stays_up() {
    let mut net = joined(&["a", "b", "c"]);
    // Long enough for a probe of c to fail, shorter than suspect-to-down.
    net.partition(&["c"], &["a", "b"]);
    let mut refuted = false;
    for _ in 0..20 {
        net.run(400);
        if net.nodes["a"].metrics().suspicions() + net.nodes["b"].metrics().suspicions() > 0 {
            break;
        }
    }
    net.heal();
    net.run(3 * ROUND_MS);
    refuted |= net.nodes["c"].metrics().refutations() > 0;
    assert!(refuted, "c never refuted");
    assert!(net.converged());
}

#[test]
fn a_refuted_suspicion_leaves_the_suspect_gauge_within_the_recount_period() {
    let mut net = joined(&["a", "b", "c"]);
    net.partition(&["c"], &["a", "b"]);
    let suspects = |net: &Net| {
        ["a", "b"]
            .iter()
            .map(|s| net.nodes[*s].metrics().members(StateLabel::Suspect))
            .sum::<i64>()
    };
    for _ in 0..40 {
        net.run(100);
        if suspects(&net) > 0 {
            break;
        }
    }
    assert!(suspects(&net) > 0, "c was never suspected");
    net.heal();
    // c refutes within a round; the gauges follow within one recount period more.
    net.run(ROUND_MS + MEMBER_RECOUNT_MS);
    assert_eq!(suspects(&net), 0);
    assert!(net.converged());
}

#[test]
fn a_datagram_without_a_session_is_refused_as_unknown_and_changes_nothing() {
    let mut net = joined(&["a", "b"]);
    let before = net.view("a");
    let mut garbage = vec![1u8; 64];
    garbage[0] = grid_membership::seal::SEAL_VERSION;
    net.inject("a", garbage);
    net.inject("a", vec![0u8; 3]);
    net.inject("a", vec![1u8; grid_membership::MAX_DATAGRAM_BYTES + 1]);
    let m = net.nodes["a"].metrics();
    assert_eq!(m.refused(Refusal::UnknownSession), 1);
    assert_eq!(m.refused(Refusal::Malformed), 1);
    assert_eq!(m.refused(Refusal::Oversized), 1);
    assert_eq!(net.view("a"), before);
}

#[test]
fn a_member_whose_session_names_it_cannot_speak_as_another_site() {
    // "mallory" holds a genuine session with a (it is inside the grid's trust) and sends a
    // SWIM message whose sender claims to be b.
    let timing = Timing::default();
    let mut net = joined(&["a", "b"]);
    net.add("mallory", 1, &timing, 5);
    let material = [7u8; 40];
    let now = net.now;
    net.nodes.get_mut("a").unwrap().handle(
        now,
        Input::Session {
            member: member("mallory", 1),
            material,
            role: Role::Responder,
        },
    );
    // An impostor membership named b, holding mallory's key: what it sends is sealed by
    // mallory but claims b.
    let mut impostor = grid_membership::Membership::new(
        member("b", 9),
        &timing,
        grid_membership::SplitMix64::new(3),
        grid_membership::MembershipMetrics::default(),
    )
    .unwrap();
    let mut sessions_as_mallory = grid_membership::Sessions::default();
    sessions_as_mallory.install(now, "a", &material, Role::Initiator);
    // Get the impostor to emit an announce to a, sealed under its own (b-side) session...
    impostor.handle(
        now,
        Input::Session {
            member: member("a", 1),
            material: [8u8; 40],
            role: Role::Initiator,
        },
    );
    let plaintext = loop {
        match impostor.poll() {
            Some(grid_membership::Output::Transmit { datagram, .. }) => {
                // ...open it with the impostor's key to get the SWIM plaintext, then
                // re-seal it under mallory's genuine session.
                let mut other_end = grid_membership::Sessions::default();
                other_end.install(now, "b", &[8u8; 40], Role::Responder);
                let mut d = datagram;
                break other_end.open(now, &mut d).unwrap().1.to_vec();
            }
            Some(_) => {}
            None => panic!("the impostor sent nothing"),
        }
    };
    let mut forged = Vec::new();
    assert!(sessions_as_mallory.seal(now, "a", &plaintext, &mut forged));
    net.inject("a", forged);
    assert_eq!(
        net.nodes["a"].metrics().refused(Refusal::IdentityMismatch),
        1
    );
    assert!(
        !net.nodes["a"]
            .live()
            .any(|m| m.site == "b" && m.incarnation == 9)
    );
}

fn version(site: &str, sequence: u64) -> grid_membership::Version {
    grid_membership::Version {
        site: site.into(),
        provider: "llama".into(),
        epoch: 1_700_000_000_000,
        sequence,
    }
}

#[test]
fn a_version_announced_by_one_member_is_heard_once_by_every_other_within_two_rounds() {
    let sites = ["a", "b", "c", "d", "e", "f", "g", "h"];
    let mut net = joined(&sites);
    assert!(net.announce("a", &version("a", 1)));
    assert!(
        !net.announce("a", &version("a", 1)),
        "the same version is not sent again"
    );
    net.run(2 * ROUND_MS);
    for s in &sites[1..] {
        let heard: Vec<_> = net.heard.get(*s).into_iter().flatten().collect();
        assert_eq!(heard.len(), 1, "{s} heard {heard:?}");
        assert_eq!(heard[0].1, version("a", 1));
        assert_ne!(heard[0].0.site, *s, "heard from another member");
    }
    assert!(
        !net.heard.contains_key("a"),
        "a does not hear its own version"
    );
    // A newer version replaces the old one; an older one is not passed on.
    assert!(net.announce("a", &version("a", 2)));
    net.run(2 * ROUND_MS);
    for s in &sites[1..] {
        assert_eq!(net.heard[*s].last().unwrap().1, version("a", 2), "{s}");
        assert_eq!(net.heard[*s].len(), 2);
    }
}

/// Who heard a version, besides its origin.
fn heard_by(net: &Net) -> Vec<String> {
    let mut who: Vec<String> = net
        .heard
        .iter()
        .filter(|(_, h)| !h.is_empty())
        .map(|(s, _)| s.clone())
        .collect();
    who.sort();
    who
}

/// `n` members that all know each other, with rounds so long that nothing rides one
/// within the hops a test measures; what each heard so far forgotten.
fn fully_joined_slow(n: usize) -> (Net, Vec<String>) {
    let names: Vec<String> = (0..n).map(|i| format!("s{i:02}")).collect();
    let sites: Vec<&str> = names.iter().map(String::as_str).collect();
    let slow = Timing {
        gossip: std::time::Duration::from_secs(30),
        probe_period: std::time::Duration::from_secs(30),
        announce: std::time::Duration::from_secs(30),
        ..Timing::default()
    };
    let mut net = Net::new(&sites, &slow);
    for s in &sites[1..] {
        for t in &sites {
            if s != t {
                net.connect(s, t);
            }
        }
    }
    net.run(1_000);
    net.heard.clear();
    assert_eq!(
        net.nodes[sites[0]].live_count(),
        n - 1,
        "every member known"
    );
    (net, names)
}

#[test]
fn a_version_announced_now_is_held_by_most_members_one_hop_later_not_at_the_next_round() {
    let (mut net, sites) = fully_joined_slow(10);
    let a = sites[0].as_str();
    let hop = 2 * net.delay_ms;
    // Given to the rounds, a version waits for one.
    assert!(net.announce(a, &version(a, 1)));
    net.run(hop);
    assert_eq!(
        heard_by(&net),
        Vec::<String>::new(),
        "nothing before a round"
    );
    // Given now, it is pushed at once to three members per push, one push per three live
    // members: most of the nine hold it a hop later.
    assert!(net.announce_now(a, &version(a, 2)));
    net.run(hop);
    let first_hop = heard_by(&net);
    assert!(first_hop.len() >= 5, "{first_hop:?}");
    assert!(
        !net.announce_now(a, &version(a, 2)),
        "the same version is not pushed again"
    );
}

#[test]
fn a_version_announced_now_is_pushed_in_as_many_datagrams_as_its_transmissions_and_no_more() {
    let (mut net, sites) = fully_joined_slow(30);
    let a = sites[0].as_str();
    let sent_by =
        |net: &Net, site: &str| net.sent.iter().filter(|(_, from, _)| from == site).count();
    let before = sent_by(&net, a);
    // One push per three live members would be ten pushes of three: the version's
    // transmissions stop them first.
    assert!(net.announce_now(a, &version(a, 1)));
    assert_eq!(
        sent_by(&net, a) - before,
        usize::from(grid_membership::transmissions(29))
    );
    // With fewer members than transmissions, one datagram per push and member drawn.
    let (mut net, sites) = fully_joined_slow(7);
    let a = sites[0].as_str();
    let before = sent_by(&net, a);
    assert!(net.announce_now(a, &version(a, 1)));
    assert_eq!(sent_by(&net, a) - before, 6);
}

#[test]
fn a_malformed_version_inside_an_authentic_message_is_refused_and_counted() {
    use grid_membership::{Membership, MembershipMetrics, Output, Sessions, SplitMix64};
    let timing = Timing::default();
    let new = |site: &str, seed| {
        Membership::new(
            member(site, 1),
            &timing,
            SplitMix64::new(seed),
            MembershipMetrics::default(),
        )
        .unwrap()
    };
    let (mut a, mut b) = (new("a", 1), new("b", 2));
    let (genuine, tamper) = ([5u8; 40], [6u8; 40]);
    // Installed first, so a seals with the genuine (newest) session.
    a.handle(
        0,
        Input::Session {
            member: member("b", 1),
            material: tamper,
            role: Role::Responder,
        },
    );
    a.handle(
        0,
        Input::Session {
            member: member("b", 1),
            material: genuine,
            role: Role::Responder,
        },
    );
    b.handle(
        0,
        Input::Session {
            member: member("a", 1),
            material: genuine,
            role: Role::Initiator,
        },
    );
    // What the wire would let an attacker inside b's trust do: read b's plaintext (a copy
    // of the genuine session) and reseal a changed one (the second session a holds for b).
    let mut reader = Sessions::default();
    reader.install(0, "b", &genuine, Role::Responder);
    let mut resealer = Sessions::default();
    resealer.install(0, "a", &tamper, Role::Initiator);
    let mut marker = Vec::new();
    version("b", 1).encode(&mut marker);
    let mut corrupted = 0;
    let mut announced = false;
    for now in 0..3_000u64 {
        if !announced && a.live_member("b").is_some() {
            announced = b.announce(now, &version("b", 1));
        }
        for node in [&mut a, &mut b] {
            if node.poll_timeout().is_some_and(|t| t <= now) {
                node.handle_timeout(now);
            }
        }
        while let Some(o) = a.poll() {
            if let Output::Transmit { mut datagram, .. } = o {
                b.handle(now, Input::Datagram(&mut datagram));
            }
        }
        while let Some(o) = b.poll() {
            let Output::Transmit { mut datagram, .. } = o else {
                continue;
            };
            let plain = reader.open(now, &mut datagram.clone()).unwrap().1.to_vec();
            match plain.windows(marker.len()).position(|w| w == marker) {
                Some(at) => {
                    let mut bad = plain.clone();
                    bad[at + 2] = b'/'; // a site name may not hold '/'
                    let mut resealed = Vec::new();
                    assert!(resealer.seal(now, "a", &bad, &mut resealed));
                    a.handle(now, Input::Datagram(&mut resealed));
                    corrupted += 1;
                }
                None => a.handle(now, Input::Datagram(&mut datagram)),
            }
        }
    }
    assert!(
        announced && corrupted >= 1,
        "announced {announced}, corrupted {corrupted}, b knows {:?}, a refused {:?}",
        b.live().collect::<Vec<_>>(),
        Refusal::ALL.map(|r| a.metrics().refused(r))
    );
    assert_eq!(a.metrics().refused(Refusal::Broadcast), corrupted);
}
