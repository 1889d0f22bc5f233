//! SWIM membership between real operators on loopback: peers are polled where
//! membership says they are, a dead member stops being polled, and what no session
//! authenticates is refused and counted.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use grid_kit::epp_server::{Behaviour, FakeEpp};
use grid_kit::operator_harness::{
    Grid, ProviderSpec, Site, epp_body, eventually, get_signals, post, signals_url,
};
use grid_membership::{Member, Refusal as DatagramRefusal, StateLabel};
use grid_operatord::driver::Options;
use grid_operatord::driver::Running;
use grid_operatord::membership::SESSION_PATH;
use grid_operatord::peer_ledger::SkipReason;
use grid_operatord::peers::{PollOutcome, PollTarget};
use grid_operatord::signals::Refusal;
use grid_signals::epp::ScrapeFailure;

/// A peer URL nothing answers at (port 1 on loopback).
const NOWHERE: &str = "https://127.0.0.1:1/v1/site/signals";

async fn start(site: &Site, peers: &[(&str, String)], providers: &[ProviderSpec]) -> Running {
    site.start(peers, providers).await
}

fn polls_of(op: &Running, peer: &str) -> u64 {
    [
        PollOutcome::Ok,
        PollOutcome::Failed(ScrapeFailure::Connect),
        PollOutcome::Failed(ScrapeFailure::Timeout),
        PollOutcome::Failed(ScrapeFailure::Tls),
        PollOutcome::Failed(ScrapeFailure::Http),
    ]
    .into_iter()
    .map(|o| op.metrics.polls.count(peer, o))
    .sum()
}

/// Waits up to `seconds` for `site`'s rows in the relay `op` (site `own`'s operator)
/// serves its gateway.
async fn relays_within(grid: &Grid, (own, op): (&Site, &Running), site: &str, seconds: u64) {
    let gateway = grid.client(&own.cert, &own.name, &own.name);
    let needle = format!("grid_site=\"{site}\"");
    eventually(&format!("{} relays {site}", own.name), seconds, || {
        let (tls, needle) = (gateway.clone(), needle.clone());
        async move {
            let body = get_signals(op.signals_addr, tls).await.unwrap().body;
            String::from_utf8_lossy(&body).contains(&needle)
        }
    })
    .await;
}

/// POSTs `body` to `addr`'s session path presenting `tls`'s certificate; the status.
async fn post_session(
    addr: std::net::SocketAddr,
    tls: Arc<rustls::ClientConfig>,
    body: Vec<u8>,
) -> u16 {
    post(addr, tls, SESSION_PATH, &[], Bytes::from(body))
        .await
        .0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_configured_at_a_dead_url_is_polled_where_membership_says_it_is_and_at_that_url_once_it_is_down()
 {
    let grid = Grid::new();
    let (a, b, c) = (grid.site("a"), grid.site("b"), grid.site("c"));
    let epp_c = FakeEpp::start(Behaviour::Body(epp_body(5, 1.0))).await;
    let op_b = start(&b, &[("a", NOWHERE.into()), ("c", NOWHERE.into())], &[]).await;
    // c's only seed is b; a's only seed is b. Nobody's configuration says where c is.
    let op_c = start(
        &c,
        &[("a", NOWHERE.into()), ("b", signals_url(op_b.signals_addr))],
        &[ProviderSpec::of("qwen", &epp_c)],
    )
    .await;
    let op_a = start(
        &a,
        &[("b", signals_url(op_b.signals_addr)), ("c", NOWHERE.into())],
        &[],
    )
    .await;
    let view = op_a.membership.clone();
    let c_port = op_c.signals_addr.port();
    eventually("a learns c's address through b", 20, || {
        let v = view.borrow().clone();
        async move { v.live.get("c").is_some_and(|m| m.signals_port == c_port) }
    })
    .await;
    relays_within(&grid, (&a, &op_a), "c", 20).await;
    assert!(op_a.metrics.polls.count("c", PollOutcome::Ok) >= 1);
    assert_eq!(op_a.membership_metrics.members(StateLabel::Alive), 2);

    drop(op_c);
    eventually("a declares c down", 30, || {
        let v = view.borrow().clone();
        async move { v.down.contains("c") && !v.live.contains_key("c") }
    })
    .await;
    assert!(op_a.membership_metrics.suspicions() >= 1);
    // Membership never makes a configured peer unmeasured: once down, c is polled at
    // its configured URL (dead here), so polls go on and none answers.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (after_down, ok) = (
        polls_of(&op_a, "c"),
        op_a.metrics.polls.count("c", PollOutcome::Ok),
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        polls_of(&op_a, "c") > after_down,
        "a down configured peer is still polled"
    );
    assert_eq!(op_a.metrics.polls.count("c", PollOutcome::Ok), ok);
    drop(op_b);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_site_no_configuration_names_joins_through_a_seed_and_is_polled_where_it_advertises() {
    let grid = Grid::new();
    let (a, b, c) = (grid.site("a"), grid.site("b"), grid.site("c"));
    let epp_c = FakeEpp::start(Behaviour::Body(epp_body(5, 1.0))).await;
    // b names nobody; a and c name only b. In SPIFFE mode the trust domain is the
    // grid's trust, so the peers list is where membership starts, not who may join.
    let op_b = start(&b, &[], &[]).await;
    let seed = [("b", signals_url(op_b.signals_addr))];
    let op_c = start(&c, &seed, &[ProviderSpec::of("qwen", &epp_c)]).await;
    let op_a = start(&a, &seed, &[]).await;
    // a polls c, which it was never told of.
    relays_within(&grid, (&a, &op_a), "c", 30).await;
    assert!(op_a.metrics.polls.count("c", PollOutcome::Ok) >= 1);
    assert!(
        op_b.metrics.polls.count("a", PollOutcome::Ok) >= 1,
        "the seed polls who joined through it"
    );
    assert_eq!(op_a.membership_metrics.members(StateLabel::Alive), 2);
    // c, which no configuration names, has no other address once declared down: it is
    // not polled, and that is counted.
    drop(op_c);
    let view = op_a.membership.clone();
    eventually("a declares c down", 30, || {
        let v = view.borrow().clone();
        async move { v.down.contains("c") }
    })
    .await;
    eventually("the skip is counted", 5, || async {
        op_a.metrics.polls.skipped(SkipReason::MemberDown) >= 1
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after_down = polls_of(&op_a, "c");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(polls_of(&op_a, "c"), after_down);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_whose_advertised_host_does_not_answer_is_measured_at_its_configured_url_and_counted()
 {
    use grid_operatord::peers::{PeerPoller, PollMetrics};
    use rand::SeedableRng;
    let grid = Grid::new();
    let (a, b) = (grid.site("a"), grid.site("b"));
    let epp_b = FakeEpp::start(Behaviour::Body(epp_body(5, 1.0))).await;
    let op_b = start(
        &b,
        &[("a", NOWHERE.into())],
        &[ProviderSpec::of("qwen", &epp_b)],
    )
    .await;
    let op_a = start(&a, &[], &[]).await;
    let gateway_b = grid.client(&b.cert, "b", "b");
    eventually("b publishes", 10, || async {
        let body = get_signals(op_b.signals_addr, gateway_b.clone())
            .await
            .unwrap()
            .body;
        !body.is_empty()
    })
    .await;
    // What a member may gossip as b's host: an address where nothing of b listens.
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let mut peer = grid_operatord::config::PeerConfig::new(
        "b",
        format!("https://{dead}/v1/site/signals").parse().unwrap(),
        Vec::new(),
    );
    peer.timeout = Duration::from_secs(1);
    let poller = PeerPoller {
        peer,
        fallback: Some(signals_url(op_b.signals_addr).parse().unwrap()),
        tls: grid.client(&a.cert, "a", "b"),
        signals: op_a.signals.clone(),
        metrics: PollMetrics::default(),
        ingest: grid_signals::store::IngestMetrics::default(),
        interval: Duration::from_secs(5),
        clock: grid_operatord::clock::Clock::system(),
    };
    let (outcome, _) = poller
        .poll_once(&mut rand::rngs::SmallRng::seed_from_u64(1), None)
        .await;
    assert_eq!(outcome, PollOutcome::Ok);
    assert_eq!(
        (
            poller.metrics.answered("b", PollTarget::Advertised),
            poller.metrics.answered("b", PollTarget::Configured)
        ),
        (0, 1)
    );
    assert!(
        grid_operatord::site_machine::lock(&op_a.signals)
            .all()
            .entry("b", "qwen")
            .is_some(),
        "b is measured"
    );
}

/// Adds a policy rule dropping every UDP datagram the namespace `ns` sends (SWIM's
/// transport), leaving TCP alone; the rule goes with the namespace.
fn drop_udp_from(ns: &grid_kit::netns::Netns) {
    let out = std::process::Command::new("ip")
        .args([
            "netns",
            "exec",
            ns.name(),
            "ip",
            "rule",
            "add",
            "pref",
            "10",
            "ipproto",
            "udp",
            "blackhole",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_swim_reads_as_down_while_its_signals_endpoint_answers_is_still_polled() {
    let ns = match grid_kit::netns::Netns::create() {
        Ok(ns) => ns,
        Err(e) => {
            eprintln!("skipped: no network namespace can be made here ({e})");
            return;
        }
    };
    let grid = Grid::new();
    let (a, b) = (grid.site("a"), grid.site("b"));
    // b lives in the namespace, behind a veth pair; a outside, on the pair's outer end.
    let mut b_config = b.config(&[("a", NOWHERE.into())], &[]);
    b_config.listen.signals = std::net::SocketAddr::new(ns.ns_addr().into(), 0);
    b_config.listen.metrics = std::net::SocketAddr::new(ns.ns_addr().into(), 0);
    let state: Arc<dyn grid_operatord::state::StateStore> =
        Arc::new(grid_operatord::state::FileStateStore::open(b.state_dir()).unwrap());
    let op_b = ns
        .handle()
        .spawn(grid_operatord::driver::start(
            b_config,
            None,
            state,
            Options::default(),
        ))
        .await
        .unwrap()
        .unwrap();
    let b_url = format!("https://{}/v1/site/signals", op_b.signals_addr);
    let mut a_config = a.config(&[("b", b_url)], &[]);
    a_config.listen.signals = std::net::SocketAddr::new(ns.host_addr().into(), 0);
    let state: Arc<dyn grid_operatord::state::StateStore> =
        Arc::new(grid_operatord::state::FileStateStore::open(a.state_dir()).unwrap());
    let op_a = grid_operatord::driver::start(a_config, None, state, Options::default())
        .await
        .unwrap();
    let view = op_a.membership.clone();
    eventually("a sees b live", 20, || {
        let v = view.borrow().clone();
        async move { v.live.contains_key("b") }
    })
    .await;
    // SWIM's datagrams from b are lost from now on; its TCP listener still answers.
    drop_udp_from(&ns);
    eventually("a declares b down", 30, || {
        let v = view.borrow().clone();
        async move { v.down.contains("b") && !v.live.contains_key("b") }
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after_down = op_a.metrics.polls.count("b", PollOutcome::Ok);
    eventually("b is still polled, at its configured URL", 10, || async {
        op_a.metrics.polls.count("b", PollOutcome::Ok) > after_down
    })
    .await;
    assert!(op_a.metrics.polls.answered("b", PollTarget::Configured) > 0);
    drop(op_a);
    drop(op_b);
    drop(ns);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_datagram_no_session_opens_is_refused_and_counted_and_membership_goes_on() {
    let grid = Grid::new();
    let a = grid.site("a");
    let op_a = start(&a, &[("b", NOWHERE.into())], &[]).await;
    let udp = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let mut unknown = vec![grid_membership::seal::SEAL_VERSION; 80];
    unknown[1..9].copy_from_slice(b"stranger");
    udp.send_to(&unknown, op_a.signals_addr).await.unwrap();
    udp.send_to(&[0u8; 5], op_a.signals_addr).await.unwrap();
    udp.send_to(
        &vec![1u8; grid_membership::MAX_DATAGRAM_BYTES + 1],
        op_a.signals_addr,
    )
    .await
    .unwrap();
    let m = op_a.membership_metrics.clone();
    eventually("three refusals counted", 10, || {
        let m = m.clone();
        async move {
            m.refused(DatagramRefusal::UnknownSession) == 1
                && m.refused(DatagramRefusal::Malformed) == 1
                && m.refused(DatagramRefusal::Oversized) == 1
        }
    })
    .await;
    // The driver still answers: a fresh stranger datagram is counted too.
    udp.send_to(&unknown, op_a.signals_addr).await.unwrap();
    eventually("the loop kept reading", 10, || {
        let m = m.clone();
        async move { m.refused(DatagramRefusal::UnknownSession) == 2 }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_naming_another_site_than_the_certificate_or_from_the_gateway_is_refused() {
    let grid = Grid::new();
    let (a, b) = (grid.site("a"), grid.site("b"));
    let op_a = start(&a, &[("b", NOWHERE.into())], &[]).await;
    let claim = |site: &str| {
        serde_json::to_vec(&Member {
            site: site.into(),
            host: "127.0.0.1".into(),
            signals_port: 9,
            gossip_port: 9,
            incarnation: 1,
        })
        .unwrap()
    };
    let as_b = grid.client(&b.cert, "b", "a");
    assert_eq!(
        post_session(op_a.signals_addr, as_b.clone(), claim("c")).await,
        403
    );
    assert_eq!(op_a.metrics.refusals.count(Refusal::SessionIdentity), 1);
    let gateway = grid.client(&a.cert, "a", "a");
    assert_eq!(
        post_session(op_a.signals_addr, gateway, claim("a")).await,
        403
    );
    assert_eq!(op_a.metrics.refusals.count(Refusal::SessionIdentity), 2);
    assert_eq!(
        post_session(op_a.signals_addr, as_b.clone(), b"{not json".to_vec()).await,
        400
    );
    assert_eq!(op_a.metrics.refusals.count(Refusal::SessionBody), 1);
    let oversized = vec![b' '; grid_operatord::membership::MAX_SESSION_BODY_BYTES + 1];
    assert_eq!(
        post_session(op_a.signals_addr, as_b.clone(), oversized).await,
        400
    );
    // b's honest claim is answered with a's identity.
    assert_eq!(post_session(op_a.signals_addr, as_b, claim("b")).await, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_whose_body_never_arrives_is_answered_408_at_the_exchange_bound() {
    use grid_operatord::membership::SESSION_EXCHANGE_TIMEOUT;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let grid = Grid::new();
    let (a, b) = (grid.site("a"), grid.site("b"));
    let op_a = start(&a, &[("b", NOWHERE.into())], &[]).await;
    let tcp = tokio::net::TcpStream::connect(op_a.signals_addr)
        .await
        .unwrap();
    let name = rustls_pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let mut tls = tokio_rustls::TlsConnector::from(grid.client(&b.cert, "b", "a"))
        .connect(name, tcp)
        .await
        .unwrap();
    // Headers promise a body that never comes.
    tls.write_all(
        format!("POST {SESSION_PATH} HTTP/1.1\r\nhost: a\r\ncontent-length: 100\r\n\r\n")
            .as_bytes(),
    )
    .await
    .unwrap();
    let sent = grid_kit::clock::Stopwatch::start();
    let mut answer = vec![0u8; 64];
    let n = tokio::time::timeout(SESSION_EXCHANGE_TIMEOUT * 3, tls.read(&mut answer))
        .await
        .expect("answered within the bound")
        .unwrap();
    let took = sent.elapsed();
    assert!(
        String::from_utf8_lossy(&answer[..n]).starts_with("HTTP/1.1 408"),
        "{}",
        String::from_utf8_lossy(&answer[..n])
    );
    assert!(took >= SESSION_EXCHANGE_TIMEOUT, "{took:?}");
}
