//! The operator's `GET /v1/grid/routing` on its metrics listener: what it concluded per
//! provider, the fences it holds and how its peers answer, read by a program and by
//! `grid-gatewayd status`'s table.

use std::sync::Arc;
use std::time::Duration;

use grid_daemon::client::{FetchTarget, fetch};
use grid_daemon::evidence::{Document, OperatorRouting};
use grid_kit::epp_server::{Behaviour, FakeEpp};
use grid_kit::operator_harness::{Grid, ProviderSpec, epp_body};
use grid_operatord::driver::{self, Options};
use grid_operatord::state::{FileStateStore, StateStore};

async fn evidence(addr: std::net::SocketAddr) -> OperatorRouting {
    let uri = format!("http://{addr}/v1/grid/routing").parse().unwrap();
    let fetched = fetch(&FetchTarget::new(uri, Duration::from_secs(5), None))
        .await
        .unwrap();
    match Document::parse(&fetched.body).unwrap() {
        Document::Operator(o) => o,
        Document::Gateway(_) => panic!("a gateway's document from an operator"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_evidence_names_each_providers_verdict_its_last_scrape_the_fences_and_each_peers_last_poll()
 {
    let grid = Grid::new();
    let a = grid.site("a");
    let epp = FakeEpp::start(Behaviour::Body(epp_body(0, 0.0))).await;
    let mut config = a.config(
        &[("b", "https://127.0.0.1:9/v1/site/signals".into())],
        &[ProviderSpec::of("llama", &epp)],
    );
    config.transport = grid_operatord::config::TransportMode::Poll;
    let state: Arc<dyn StateStore> = Arc::new(FileStateStore::open(a.state_dir()).unwrap());
    let op = driver::start(config, None, state, Options::default())
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    let doc = loop {
        let doc = evidence(op.metrics_addr).await;
        let scraped = doc.providers[0].last_scrape.is_some();
        let polled = doc.peers.first().is_some_and(|p| p.last_exchange.is_some());
        // Zero ready endpoints read not ready once confirmed (the first reads stay
        // ready as unconfirmed).
        let concluded = doc.providers[0].reason.as_deref() == Some("no_ready_endpoints");
        if scraped && polled && concluded && !doc.held.is_empty() {
            break doc;
        }
        assert!(tokio::time::Instant::now() < deadline, "{doc:#?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        (doc.daemon.as_str(), doc.site.as_str(), doc.mode.as_str()),
        ("operator", "a", "poll")
    );
    assert_eq!(doc.epoch, op.epoch);
    let llama = &doc.providers[0];
    // Zero ready endpoints: not ready, and the reason says why.
    assert_eq!(llama.name, "llama");
    assert_eq!(llama.ready, Some(false), "{llama:?}");
    assert_eq!(llama.reason.as_deref(), Some("no_ready_endpoints"));
    assert_eq!(llama.last_scrape.as_ref().unwrap().result, "ok");
    assert!(
        doc.held
            .iter()
            .any(|h| h.site == "a" && h.provider == "llama" && h.epoch == op.epoch)
    );
    let b = &doc.peers[0];
    assert_eq!((b.name.as_str(), b.configured), ("b", true));
    let last = b.last_exchange.as_ref().unwrap();
    assert_eq!(last.kind, "poll");
    assert_ne!(last.result, "ok");
    assert_eq!(b.last_ok_ms, None);
    let table = Document::Operator(doc).table(false);
    assert!(
        table.contains("no_ready_endpoints") && table.contains("poll connect"),
        "{table}"
    );
}
