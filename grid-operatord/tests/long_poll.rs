//! A whole operator answering long polls of `GET /v1/site/signals` (grid-signals'
//! `long_poll`): every answer states the readiness generation; a long poll that saw the
//! current one is held until the readiness moves or its wait runs out, one that saw
//! another is answered at once; load alone never answers it early; a peer and the
//! gateway each wait on the generation of what they are served.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use grid_daemon::client::{FetchTarget, Fetched, fetch, poll_budget, with_wait};
use grid_kit::epp_server::{Behaviour, FakeEpp};
use grid_kit::operator_harness::{Grid, ProviderSpec, epp_body, eventually, signals_url};
use grid_signals::long_poll::Wait;

/// The harness scrapes every 200 ms: a readiness change is answered within a few of
/// those, far below the waits asked here.
const CHANGE_WITHIN: Duration = Duration::from_millis(1_500);

async fn long_poll(
    addr: std::net::SocketAddr,
    tls: Arc<rustls::ClientConfig>,
    wait: Option<Wait>,
) -> (Fetched, Duration) {
    let url = signals_url(addr).parse().unwrap();
    let started = Instant::now();
    let fetched = fetch(&FetchTarget::new(
        with_wait(&url, wait),
        poll_budget(Duration::from_secs(5), wait),
        Some(tls),
    ))
    .await
    .expect("answered");
    (fetched, started.elapsed())
}

fn ready_endpoints(body: &[u8]) -> Option<f64> {
    String::from_utf8_lossy(body)
        .lines()
        .find(|l| l.starts_with("grid_provider_ready_endpoints{"))
        .and_then(|l| l.rsplit_once('}'))
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_poll_is_held_until_readiness_moves_or_its_wait_runs_out() {
    let grid = Grid::new();
    let a = grid.site("a");
    let epp = FakeEpp::start(Behaviour::Body(epp_body(2, 1.0))).await;
    let op = a.start(&[], &[ProviderSpec::of("llama", &epp)]).await;
    let gateway = grid.client(&a.cert, "a", "a");
    let peer = grid.client(&grid.site("b").cert, "b", "a");
    eventually("a serves its provider", 10, || {
        let tls = gateway.clone();
        async move {
            let (f, _) = long_poll(op.signals_addr, tls, None).await;
            ready_endpoints(&f.body) == Some(2.0)
        }
    })
    .await;

    // A plain poll states the generation, and is answered at once.
    let (plain, _) = long_poll(op.signals_addr, gateway.clone(), None).await;
    let seen = plain.readiness_generation.expect("a generation stated");

    // Nothing changes but the load: held to its wait, same generation.
    epp.set(Behaviour::Body(epp_body(2, 7.0)));
    let wait = Wait {
        seen,
        wait_ms: 1_200,
    };
    let (held, took) = long_poll(op.signals_addr, gateway.clone(), Some(wait)).await;
    assert!(
        took >= Duration::from_millis(1_200),
        "answered after {took:?}"
    );
    assert_eq!(held.readiness_generation, Some(seen));

    // A generation the server has moved past: answered at once.
    let stale = Wait {
        seen: seen.wrapping_sub(1),
        wait_ms: 30_000,
    };
    let (_, took) = long_poll(op.signals_addr, gateway.clone(), Some(stale)).await;
    assert!(took < CHANGE_WITHIN, "answered after {took:?}");

    // The EPP reads zero ready endpoints: both the gateway's and a peer's held polls are
    // answered by the next scrape, each with the relay showing it.
    let (peer_plain, _) = long_poll(op.signals_addr, peer.clone(), None).await;
    let peer_seen = peer_plain
        .readiness_generation
        .expect("stated to a peer too");
    let long = Wait {
        seen,
        wait_ms: 30_000,
    };
    let peer_long = Wait {
        seen: peer_seen,
        wait_ms: 30_000,
    };
    let gateway_poll = tokio::spawn(long_poll(op.signals_addr, gateway.clone(), Some(long)));
    let peer_poll = tokio::spawn(long_poll(op.signals_addr, peer.clone(), Some(peer_long)));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let dropped = Instant::now();
    epp.set(Behaviour::Body(epp_body(0, 0.0)));
    for (who, poll, seen) in [
        ("gateway", gateway_poll, seen),
        ("peer", peer_poll, peer_seen),
    ] {
        let (answer, _) = poll.await.unwrap();
        let after = dropped.elapsed();
        assert!(after < CHANGE_WITHIN, "{who}: answered {after:?} after");
        assert_ne!(answer.readiness_generation, Some(seen), "{who}");
        assert_eq!(ready_endpoints(&answer.body), Some(0.0), "{who}");
    }
    assert_eq!(op.metrics.long_polls.held(), 0, "every hold given back");
}
