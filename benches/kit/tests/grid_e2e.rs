//! The whole grid end to end on loopback with real rustls: REAL `grid-operatord` drivers
//! (one per site, scraping a simulated site whose EPP reflects its model server's real
//! queue), the gateway's operator polling the other sites' operators as peers, and the
//! REAL `grid-gatewayd` driver routing OpenAI-style requests. Certificates are minted by
//! rcgen per test. Every wait is bounded; cadences are the short test ones
//! ([`Cadence::FAST`]).

use std::collections::HashMap;
use std::time::Duration;

use grid_kit::load::{LoadClient, Protocol, chat_body};
use grid_kit::local_grid::{
    Cadence, GridSpec, LocalGrid, Shedding, SiteRouting, SiteSpec, TransportMode,
};
use grid_score::CandidateState;
use grid_signals::epp::HYSTERESIS_SCRAPES;
use grid_sim::site_model::SiteConfig;
use http::StatusCode;
use tokio::task::JoinSet;

const MODEL: &str = "llama";
const SERVICE_MS: f64 = 200.0;
/// Start-up and first readings, generous for a loaded 2-core machine.
const MEASURED_WITHIN: Duration = Duration::from_secs(15);

/// One cycle of the local path: a scrape, then a gateway poll. A site whose EPP reads zero
/// ready endpoints is excluded by the first such reading to reach the gateway.
const LOCAL_CYCLE: Duration =
    Duration::from_millis(Cadence::FAST.scrape_ms + Cadence::FAST.gateway_poll_ms);
/// Rejoining takes the readiness hysteresis: once the zero has lasted
/// `HYSTERESIS_SCRAPES` scrapes with no engine answer, `grid_provider_ready` reads 0
/// (`not_ready`) and comes back only after as many positive scrapes, then one poll.
const LOCAL_REJOIN_CYCLE: Duration = Duration::from_millis(
    Cadence::FAST.scrape_ms * HYSTERESIS_SCRAPES as u64 + Cadence::FAST.gateway_poll_ms,
);
/// One cycle of the remote path: the peer's scrape, operator[0]'s peer poll, the gateway
/// poll (rejoining adds the hysteresis scrapes, which the peer poll interval covers).
const REMOTE_CYCLE: Duration = Duration::from_millis(
    Cadence::FAST.scrape_ms * HYSTERESIS_SCRAPES as u64
        + Cadence::FAST.peer_poll_ms
        + Cadence::FAST.gateway_poll_ms,
);
/// The assertions allow three cycles for scheduling delays on a loaded 2-core machine;
/// the measured times are printed (`--nocapture`).
const MARGIN: u32 = 3;

fn site(name: &str, endpoints: usize, slots: usize) -> SiteSpec {
    SiteSpec::simulated(
        SiteConfig::new(name, endpoints, slots),
        MODEL,
        SERVICE_MS,
        11,
    )
}

async fn grid(shedding: Option<Shedding>) -> LocalGrid {
    let spec = GridSpec {
        model: MODEL.to_owned(),
        sites: vec![site("a", 2, 2), site("b", 2, 2)],
        cadence: Cadence::FAST,
        transport: TransportMode::Poll,
        shedding,
    };
    LocalGrid::start_measured(&spec, MEASURED_WITHIN)
        .await
        .expect("grid starts, both sites measured")
}

fn client() -> LoadClient {
    LoadClient::new(Protocol::Http1, Duration::from_secs(30))
}

/// Sends `n` chat requests through the gateway, `concurrency` at a time; counts the
/// answers by serving site (`status:<code>` for answers without one).
async fn through_gateway(grid: &LocalGrid, n: usize, concurrency: usize) -> HashMap<String, usize> {
    let uri: http::Uri = grid.chat_url().parse().unwrap();
    let c = client();
    let mut counts = HashMap::new();
    let mut set = JoinSet::new();
    for i in 0..n {
        if set.len() >= concurrency {
            let answer: grid_kit::load::Answer = set.join_next().await.unwrap().unwrap();
            count(&mut counts, &answer);
        }
        let (c, uri) = (c.clone(), uri.clone());
        set.spawn(async move {
            c.post_json(&uri, chat_body(MODEL, i % 2 == 0))
                .await
                .expect("answered")
        });
    }
    while let Some(answer) = set.join_next().await {
        count(&mut counts, &answer.unwrap());
    }
    counts
}

fn count(counts: &mut HashMap<String, usize>, answer: &grid_kit::load::Answer) {
    let key = match (&answer.site, answer.status) {
        (Some(site), StatusCode::OK) => site.clone(),
        (_, status) => format!("status:{}", status.as_u16()),
    };
    *counts.entry(key).or_default() += 1;
}

/// Fires `n` requests straight at a site, bypassing the gateway, and keeps them open.
fn load_directly(grid: &LocalGrid, site: &str, n: usize) -> JoinSet<()> {
    let uri: http::Uri = format!("{}/v1/chat/completions", grid.base_url(site).unwrap())
        .parse()
        .unwrap();
    let c = client();
    let mut set = JoinSet::new();
    for _ in 0..n {
        let (c, uri) = (c.clone(), uri.clone());
        set.spawn(async move {
            let _ = c.post_json(&uri, chat_body(MODEL, false)).await;
        });
    }
    set
}

async fn post_once(grid: &LocalGrid) -> grid_kit::load::Answer {
    client()
        .post_json(&grid.chat_url().parse().unwrap(), chat_body(MODEL, false))
        .await
        .expect("answered")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traffic_shifts_away_from_a_site_that_saturates() {
    let grid = grid(None).await;
    // Both sites take traffic while idle.
    let before = through_gateway(&grid, 24, 2).await;
    assert!(before.get("a").copied().unwrap_or(0) > 0, "{before:?}");
    assert!(before.get("b").copied().unwrap_or(0) > 0, "{before:?}");

    // Site a slows twentyfold and is filled three times over, bypassing the gateway: its
    // EPP reports the queue, its operator publishes it, the gateway reads it.
    grid.control("a").unwrap().degrade(20.0).unwrap();
    let _held = load_directly(&grid, "a", 12);
    let took = grid
        .wait_until("a seen without room", Duration::from_secs(10), |g| {
            matches!(
                g.routing("a"),
                SiteRouting::Candidate {
                    state: CandidateState::Full | CandidateState::NoRoom,
                    ..
                }
            )
        })
        .await
        .expect("the gateway sees a's queue");
    println!("a seen saturated after {took:?}");
    let after = through_gateway(&grid, 30, 3).await;
    println!("after a saturated: {after:?}");
    let to_b = after.get("b").copied().unwrap_or(0);
    assert!(to_b >= 27, "traffic did not shift to b: {after:?}");
    grid.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_site_with_zero_ready_endpoints_leaves_and_rejoins_within_one_cycle() {
    let grid = grid(None).await;
    let a = grid.control("a").unwrap();
    a.drop_all_endpoints();
    let left = grid
        .wait_until("a excluded", LOCAL_CYCLE * MARGIN, |g| {
            matches!(g.routing("a"), SiteRouting::Excluded(_))
        })
        .await
        .expect("a leaves selection within one scrape + one poll");
    println!("local exclusion after {left:?} (cycle {LOCAL_CYCLE:?})");
    let counts = through_gateway(&grid, 10, 2).await;
    assert_eq!(counts.get("b"), Some(&10), "{counts:?}");

    a.restore();
    let back = grid
        .wait_until("a selectable again", LOCAL_REJOIN_CYCLE * MARGIN, |g| {
            g.routing("a").selectable()
        })
        .await
        .expect("a rejoins within one scrape + one poll");
    println!("local rejoin after {back:?} (cycle {LOCAL_REJOIN_CYCLE:?})");
    grid.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_site_is_seen_through_its_peer_operator_and_leaves_and_rejoins() {
    let grid = grid(None).await;
    // b's readings exist at the gateway only through operator b, polled by operator a.
    let SiteRouting::Candidate {
        capacity, state, ..
    } = grid.routing("b")
    else {
        panic!("b is not a candidate: {:?}", grid.routing("b"));
    };
    assert_ne!(state, CandidateState::Unmeasured);
    assert!(capacity.is_finite() && capacity >= 1.0, "{capacity}");
    let a_metrics = grid.operator_metrics_addr("a").unwrap();
    let text = get_text(a_metrics).await;
    assert!(
        text.lines().any(|l| l.contains("grid_site=\"b\"")),
        "operator a relays no row of b:\n{text}"
    );

    let b = grid.control("b").unwrap();
    b.drop_all_endpoints();
    let left = grid
        .wait_until("b excluded", REMOTE_CYCLE * MARGIN, |g| {
            matches!(g.routing("b"), SiteRouting::Excluded(_))
        })
        .await
        .expect("remote b leaves within one peer cycle");
    println!("remote exclusion after {left:?} (cycle {REMOTE_CYCLE:?})");
    b.restore();
    let back = grid
        .wait_until("b selectable again", REMOTE_CYCLE * MARGIN, |g| {
            g.routing("b").selectable()
        })
        .await
        .expect("remote b rejoins within one peer cycle");
    println!("remote rejoin after {back:?} (cycle {REMOTE_CYCLE:?})");

    // With the local site down, the remote one serves through the gateway.
    grid.control("a").unwrap().drop_all_endpoints();
    grid.wait_until("a excluded", LOCAL_CYCLE * MARGIN, |g| {
        !g.routing("a").selectable()
    })
    .await
    .unwrap();
    let counts = through_gateway(&grid, 6, 2).await;
    assert_eq!(counts.get("b"), Some(&6), "{counts:?}");
    grid.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_site_excluded_answers_503_with_retry_after() {
    let grid = grid(None).await;
    grid.control("a").unwrap().drop_all_endpoints();
    grid.control("b").unwrap().drop_all_endpoints();
    grid.wait_until("both excluded", REMOTE_CYCLE * MARGIN, |g| {
        !g.routing("a").selectable() && !g.routing("b").selectable()
    })
    .await
    .expect("both sites leave selection");
    let answer = post_once(&grid).await;
    assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE);
    let retry: u64 = answer
        .retry_after
        .as_deref()
        .expect("Retry-After on 503")
        .parse()
        .unwrap();
    assert!(retry >= 1);
    assert_eq!(answer.site, None, "a 503 names no site");
    grid.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shedding_on_and_every_site_full_answers_429_with_retry_after() {
    let grid = grid(Some(Shedding {
        full_after_ms: 300,
        room_after_ms: 3_000,
        retry_after_s: 2,
    }))
    .await;
    assert!(!grid.shedding());
    assert_eq!(post_once(&grid).await.status, StatusCode::OK);
    // Both sites slow fiftyfold and hold three times their slots.
    let mut held = Vec::new();
    for s in ["a", "b"] {
        grid.control(s).unwrap().degrade(50.0).unwrap();
        held.push(load_directly(&grid, s, 12));
    }
    let took = grid
        .wait_until("shedding", Duration::from_secs(10), LocalGrid::shedding)
        .await
        .expect("the model sheds once every site is full");
    println!("shedding after {took:?}");
    let answer = post_once(&grid).await;
    assert_eq!(answer.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(answer.retry_after.as_deref(), Some("2"));

    // The sites drain; shedding stops and requests are served again.
    drop(held);
    for s in ["a", "b"] {
        grid.control(s).unwrap().restore();
    }
    grid.wait_until("shedding over", Duration::from_secs(20), |g| !g.shedding())
        .await
        .expect("shedding ends once the sites have room");
    grid.shutdown().await;
}

async fn get_text(addr: std::net::SocketAddr) -> String {
    use http_body_util::{BodyExt, Empty};
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp))
            .await
            .unwrap();
    tokio::spawn(conn);
    let request = http::Request::get("/metrics")
        .header("host", "localhost")
        .body(Empty::<bytes::Bytes>::new())
        .unwrap();
    let response = tokio::time::timeout(Duration::from_secs(5), sender.send_request(request))
        .await
        .unwrap()
        .unwrap();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(body.to_vec()).unwrap()
}
