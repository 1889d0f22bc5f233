//! Whole operators on loopback with real rustls and rcgen certificates: scraping fake
//! EPPs, serving by identity, polling peers, the body cap, restarts and `/metrics`.

use std::sync::Arc;
use std::time::Duration;

use grid_daemon::tls::Fingerprint;
use grid_kit::epp_server::{Behaviour, FakeEpp};
use grid_kit::operator_harness::{
    Grid, ProviderSpec, Site, epp_body, eventually, get_metrics, get_signals, ingest_resets,
    post_ingest, signals_url,
};
use grid_kit::pki::rewrite_keeping_mtime;
use grid_operatord::config::{ConfigSource, FileConfigSource};
use grid_operatord::driver::{self, Options, Running};
use grid_operatord::peers::PollOutcome;
use grid_operatord::signals::SIGNALS_CONTENT_TYPE;
use grid_operatord::state::{FileStateStore, StateStore};
use grid_signals::epp::ScrapeFailure;
use grid_signals::exposition::{MAX_EXPOSITION_BYTES, SyntaxError};

async fn run(site: &Site, peers: &[(&str, String)], providers: &[ProviderSpec]) -> Running {
    site.start(peers, providers).await
}

/// Site `a`'s operator started from the file at `path`, re-reading it every 100 ms.
async fn watching(a: &Site, path: &std::path::Path) -> Running {
    let source: Arc<dyn ConfigSource> = Arc::new(FileConfigSource::new(path));
    let config = source.load().unwrap();
    let state: Arc<dyn StateStore> = Arc::new(FileStateStore::open(a.state_dir()).unwrap());
    let options = Options {
        mode_check: Duration::from_millis(100),
        ..Options::default()
    };
    driver::start(config, Some(source), state, options)
        .await
        .unwrap()
}

fn provider(name: &str, epp: &FakeEpp) -> ProviderSpec {
    ProviderSpec::of(name, epp)
}

/// A peer URL nothing answers at (port 1 on loopback).
const NOWHERE: &str = "https://127.0.0.1:1/v1/site/signals";

fn text(body: &[u8]) -> String {
    String::from_utf8(body.to_vec()).unwrap()
}

/// The value of the first line starting with `prefix` (a metric name and its labels up
/// to where they differ), or `None`.
fn value_of(body: &str, name: &str, site: &str, provider: &str) -> Option<f64> {
    body.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .find(|l| {
            l.contains(&format!("grid_site=\"{site}\""))
                && l.contains(&format!("grid_provider=\"{provider}\""))
        })
        .and_then(|l| l.rsplit_once('}'))
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changing_fake_epp_is_scraped_and_served_to_the_local_gateway() {
    let grid = Grid::new();
    let a = grid.site("a");
    let epp = FakeEpp::start(Behaviour::Body(epp_body(2, 1.5))).await;
    let op = run(&a, &[], &[provider("llama", &epp)]).await;
    let gateway = grid.client(&a.cert, "a", "a");
    eventually("ready endpoints 2 served", 10, || {
        let tls = gateway.clone();
        async move {
            let f = get_signals(op.signals_addr, tls).await.unwrap();
            value_of(
                &text(&f.body),
                "grid_provider_ready_endpoints",
                "a",
                "llama",
            ) == Some(2.0)
        }
    })
    .await;
    let f = get_signals(op.signals_addr, gateway.clone()).await.unwrap();
    assert_eq!(f.content_type.as_deref(), Some(SIGNALS_CONTENT_TYPE));
    let date = f.date_ms.expect("Date header");
    let now = grid_operatord::clock::wall_ms();
    assert!(date <= now && now - date < 5_000);
    let body = text(&f.body);
    assert!(body.contains("grid_provider_config_generation{"), "{body}");
    assert!(
        body.contains(&format!("publisher_epoch=\"{}\"", op.epoch)),
        "{body}"
    );
    assert_eq!(
        value_of(&body, "grid_provider_ready", "a", "llama"),
        Some(1.0)
    );
    // The EPP changes; the next scrapes publish the new count.
    epp.set(Behaviour::Body(epp_body(3, 0.5)));
    eventually("ready endpoints 3 served", 10, || {
        let tls = gateway.clone();
        async move {
            let f = get_signals(op.signals_addr, tls).await.unwrap();
            value_of(
                &text(&f.body),
                "grid_provider_ready_endpoints",
                "a",
                "llama",
            ) == Some(3.0)
        }
    })
    .await;
    assert!(op.metrics.scrapes.count("llama", "ok") >= 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_operator_is_polled_and_peers_see_only_the_serving_site() {
    let grid = Grid::new();
    let (a, b) = (grid.site("a"), grid.site("b"));
    let epp_a = FakeEpp::start(Behaviour::Body(epp_body(4, 1.0))).await;
    let epp_b = FakeEpp::start(Behaviour::Body(epp_body(7, 1.0))).await;
    // b knows a as a peer (else a's polls get 403) but cannot reach it: only a polls.
    let op_b = run(&b, &[("a", NOWHERE.into())], &[provider("mistral", &epp_b)]).await;
    let op_a = run(
        &a,
        &[("b", signals_url(op_b.signals_addr))],
        &[provider("llama", &epp_a)],
    )
    .await;
    let gateway_a = grid.client(&a.cert, "a", "a");
    eventually("a relays b's provider to its gateway", 15, || {
        let tls = gateway_a.clone();
        async move {
            let f = get_signals(op_a.signals_addr, tls).await.unwrap();
            let body = text(&f.body);
            value_of(&body, "grid_provider_ready_endpoints", "b", "mistral") == Some(7.0)
                && value_of(&body, "grid_provider_ready_endpoints", "a", "llama") == Some(4.0)
        }
    })
    .await;
    assert!(op_a.metrics.polls.count("b", PollOutcome::Ok) >= 1);
    // Peer b asking a sees a's providers only, never what a relayed from b (or others).
    let peer_b = grid.client(&b.cert, "b", "a");
    let body = text(&get_signals(op_a.signals_addr, peer_b).await.unwrap().body);
    assert_eq!(
        value_of(&body, "grid_provider_ready_endpoints", "a", "llama"),
        Some(4.0)
    );
    assert!(!body.contains("grid_site=\"b\""), "{body}");
    // /metrics exports both sites' provider series.
    let m = get_metrics(op_a.metrics_addr).await;
    assert_eq!(
        value_of(&m, "grid_provider_ready_endpoints", "b", "mistral"),
        Some(7.0)
    );
    assert_eq!(value_of(&m, "grid_provider_ready", "a", "llama"), Some(1.0));
}

/// With TLS 1.3 the server refuses a client certificate after the client finished its
/// side of the handshake: the client sees the alert (`tls`) or, if the server closed
/// first, a dropped connection (`http`). What the server counted is asserted separately.
fn refused(result: &Result<grid_daemon::client::Fetched, ScrapeFailure>) {
    assert!(
        matches!(result, Err(ScrapeFailure::Tls | ScrapeFailure::Http)),
        "{result:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strangers_get_403_and_untrusted_or_expired_certificates_are_refused() {
    let grid = Grid::new();
    let a = grid.site("a");
    let op = run(&a, &[], &[]).await;
    // A certificate from the grid's CA that names no site of its trust domain.
    let zz = grid.ca.site("other.test", "zz");
    let stranger = grid.client(&zz, "zz", "a");
    assert_eq!(
        get_signals(op.signals_addr, stranger).await,
        Err(ScrapeFailure::Unauthorized)
    );
    assert_eq!(
        op.metrics
            .refusals
            .count(grid_operatord::signals::Refusal::Forbidden),
        1
    );
    // A certificate from another CA naming site a itself.
    let rogue_grid = Grid::new();
    let rogue = rogue_grid.site("a");
    let tls = grid.client(&rogue.cert, "a", "a");
    refused(&get_signals(op.signals_addr, tls).await);
    // An expired certificate from the right CA.
    let expired = grid.ca.mint(&grid_kit::pki::Mint {
        spiffe: Some("spiffe://grid.test/site/a".into()),
        expired: true,
        cn: "a",
    });
    let tls = grid.client(&expired, "a", "a");
    refused(&get_signals(op.signals_addr, tls).await);
    let m = op.metrics.listener.clone();
    eventually("two refused handshakes counted", 5, || {
        let m = m.clone();
        async move { m.handshake_failures() == 2 }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_with_the_wrong_identity_is_refused_and_contributes_nothing() {
    let grid = Grid::new();
    let (a, c) = (grid.site("a"), grid.site("c"));
    let epp_c = FakeEpp::start(Behaviour::Body(epp_body(5, 1.0))).await;
    let op_c = run(&c, &[("a", NOWHERE.into())], &[provider("qwen", &epp_c)]).await;
    // a believes peer "b" lives where c answers.
    let op_a = run(&a, &[("b", signals_url(op_c.signals_addr))], &[]).await;
    let polls = op_a.metrics.polls.clone();
    eventually("a poll of the impostor failed as tls", 10, || {
        let polls = polls.clone();
        async move { polls.count("b", PollOutcome::Failed(ScrapeFailure::Tls)) >= 1 }
    })
    .await;
    assert_eq!(op_a.metrics.polls.count("b", PollOutcome::Ok), 0);
    let body = text(
        &get_signals(op_a.signals_addr, grid.client(&a.cert, "a", "a"))
            .await
            .unwrap()
            .body,
    );
    assert!(
        !body.contains("grid_site=\"c\"") && !body.contains("grid_site=\"b\""),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_peer_does_not_delay_the_others() {
    let grid = Grid::new();
    let (a, b) = (grid.site("a"), grid.site("b"));
    // "h" accepts TCP connections and never says a word.
    let hang = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hang_addr = hang.local_addr().unwrap();
    let _hang_task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = hang.accept().await {
            held.push(s);
        }
    });
    let epp_b = FakeEpp::start(Behaviour::Body(epp_body(6, 1.0))).await;
    let op_b = run(&b, &[("a", NOWHERE.into())], &[provider("mistral", &epp_b)]).await;
    let op_a = run(
        &a,
        &[
            (
                "h",
                format!("https://127.0.0.1:{}/v1/site/signals", hang_addr.port()),
            ),
            ("b", signals_url(op_b.signals_addr)),
        ],
        &[],
    )
    .await;
    // b is polled every 0.5 s even though every poll of h takes its full 1 s timeout.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let ok_b = op_a.metrics.polls.count("b", PollOutcome::Ok);
    let timeouts_h = op_a
        .metrics
        .polls
        .count("h", PollOutcome::Failed(ScrapeFailure::Timeout));
    assert!(ok_b >= 5, "b polled only {ok_b} times in 4 s");
    assert!(
        (1..=4).contains(&timeouts_h),
        "h timed out {timeouts_h} times"
    );
    let body = text(
        &get_signals(op_a.signals_addr, grid.client(&a.cert, "a", "a"))
            .await
            .unwrap()
            .body,
    );
    assert_eq!(
        value_of(&body, "grid_provider_ready_endpoints", "b", "mistral"),
        Some(6.0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_epp_with_one_malformed_unrelated_family_stays_ready_and_its_bad_lines_are_counted() {
    let grid = Grid::new();
    let a = grid.site("a");
    let mut body =
        b"# TYPE plugin_odd gauge\nplugin_odd{kind=\"a\",kind=\"b\"} 1\nplugin_odd {k=\"v\"} 2\n\
        # UNIT plugin_odd - x\n# EOF\n"
            .to_vec();
    body.extend_from_slice(&epp_body(2, 1.0));
    let epp = FakeEpp::start(Behaviour::Body(body)).await;
    let op = run(&a, &[], &[provider("llama", &epp)]).await;
    let scrapes = op.metrics.scrapes.clone();
    eventually("three scrapes with a refused line each", 10, || {
        let s = scrapes.clone();
        async move { s.refused_lines("llama", SyntaxError::DuplicateLabel) >= 3 }
    })
    .await;
    assert_eq!(scrapes.count("llama", "parse"), 0);
    assert!(scrapes.count("llama", "ok") >= 3);
    // Only the one line: the blank before `{`, the `# UNIT` comment and what follows
    // `# EOF` are all valid text 0.0.4.
    let total: u64 = SyntaxError::ALL
        .iter()
        .map(|&r| scrapes.refused_lines("llama", r))
        .sum();
    assert_eq!(
        total,
        scrapes.refused_lines("llama", SyntaxError::DuplicateLabel)
    );
    let gateway = grid.client(&a.cert, "a", "a");
    let signals = text(&get_signals(op.signals_addr, gateway).await.unwrap().body);
    assert_eq!(
        value_of(&signals, "grid_provider_ready", "a", "llama"),
        Some(1.0),
        "{signals}"
    );
    let metrics = get_metrics(op.metrics_addr).await;
    assert!(
        metrics.contains(
            "grid_operator_scrape_lines_refused_total{provider=\"llama\",reason=\"duplicate_label\"}"
        ),
        "{metrics}"
    );
    assert!(
        metrics.contains(
            "grid_operator_scrape_lines_refused_total{provider=\"llama\",reason=\"label_value\"} 0"
        ),
        "every reason exists from the start: {metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_over_one_mib_is_body_cap_and_leaves_readiness_unknown() {
    let grid = Grid::new();
    let a = grid.site("a");
    let mut big = epp_body(2, 1.0);
    big.resize(MAX_EXPOSITION_BYTES + 1, b'\n');
    let epp = FakeEpp::start(Behaviour::Body(big)).await;
    let op = run(&a, &[], &[provider("llama", &epp)]).await;
    let scrapes = op.metrics.scrapes.clone();
    eventually("body_cap counted", 10, || {
        let s = scrapes.clone();
        async move { s.count("llama", "body_cap") >= 2 }
    })
    .await;
    let gateway = grid.client(&a.cert, "a", "a");
    let body = text(
        &get_signals(op.signals_addr, gateway.clone())
            .await
            .unwrap()
            .body,
    );
    assert!(body.contains("grid_provider_config_generation{"), "{body}");
    assert_eq!(
        value_of(&body, "grid_provider_ready", "a", "llama"),
        None,
        "{body}"
    );
    // Exactly at the cap is read and parsed.
    let mut at = epp_body(2, 1.0);
    at.resize(MAX_EXPOSITION_BYTES, b'\n');
    epp.set(Behaviour::Body(at));
    eventually("a capped-size body parsed", 10, || {
        let tls = gateway.clone();
        async move {
            let f = get_signals(op.signals_addr, tls).await.unwrap();
            value_of(&text(&f.body), "grid_provider_ready", "a", "llama") == Some(1.0)
        }
    })
    .await;
}

fn report(epoch: &str, sequence: u64, rejected: u64, clean: bool) -> Vec<(&'static str, String)> {
    vec![
        ("x-grid-ingest-version", "1".into()),
        ("x-grid-ingest-epoch", epoch.into()),
        ("x-grid-ingest-sequence", sequence.to_string()),
        ("x-grid-ingest-rejected", rejected.to_string()),
        ("x-grid-ingest-clean", clean.to_string()),
        ("x-grid-ingest-replica", "gw-0".into()),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_keeps_the_epoch_rising_and_the_feedback_evidence() {
    let grid = Grid::new();
    let a = grid.site("a");
    let gateway = grid.client(&a.cert, "a", "a");
    let epoch = "00000000000000ab";
    let first = run(&a, &[], &[]).await;
    let (status, headers) = post_ingest(
        first.signals_addr,
        gateway.clone(),
        &report(epoch, 1, 3, false),
    )
    .await;
    assert_eq!(status, 204);
    assert_eq!(headers["x-grid-ingest-epoch"], epoch);
    assert_eq!(headers["x-grid-ingest-sequence"], "1");
    // Persisted before the 204: the file already holds the report.
    let on_disk = FileStateStore::open(a.state_dir())
        .unwrap()
        .load_feedback()
        .unwrap()
        .unwrap();
    assert_eq!(on_disk.reporters.len(), 1);
    assert_eq!(
        get_metrics(first.metrics_addr)
            .await
            .lines()
            .find(|l| l.starts_with("grid_operator_gateway_ages_rejected ")),
        Some("grid_operator_gateway_ages_rejected 1")
    );
    // A peer may not report.
    let b = grid.site("b");
    let config_with_b = a.config(&[("b", NOWHERE.into())], &[]);
    drop(first);
    let first_epoch = FileStateStore::open(a.state_dir())
        .unwrap()
        .load_epoch_hwm()
        .unwrap()
        .unwrap();

    let state: Arc<dyn StateStore> = Arc::new(FileStateStore::open(a.state_dir()).unwrap());
    let second = driver::start(config_with_b, None, state, Options::default())
        .await
        .unwrap();
    assert!(second.epoch > first_epoch);
    // The evidence survived the restart: the condition is still True.
    let m = get_metrics(second.metrics_addr).await;
    assert!(
        m.lines()
            .any(|l| l == "grid_operator_gateway_ages_rejected 1"),
        "{m}"
    );
    // The exact duplicate is idempotent; a decreasing counter is refused.
    let (status, _) = post_ingest(
        second.signals_addr,
        gateway.clone(),
        &report(epoch, 1, 3, false),
    )
    .await;
    assert_eq!(status, 204);
    let (status, _) = post_ingest(
        second.signals_addr,
        gateway.clone(),
        &report(epoch, 2, 2, false),
    )
    .await;
    assert_eq!(status, 409);
    let peer = grid.client(&b.cert, "b", "a");
    let (status, _) = post_ingest(second.signals_addr, peer, &report(epoch, 3, 3, false)).await;
    assert_eq!(status, 403);
    // A newer clean report with the same counter resolves the evidence.
    let (status, _) = post_ingest(second.signals_addr, gateway, &report(epoch, 4, 3, true)).await;
    assert_eq!(status, 204);
    let m = get_metrics(second.metrics_addr).await;
    assert!(
        m.lines()
            .any(|l| l == "grid_operator_gateway_ages_rejected 0"),
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declared_mode_change_stops_the_operator() {
    let grid = Grid::new();
    let a = grid.site("a");
    let path = a.dir.path().join("operator.toml");
    std::fs::write(&path, a.config_text(&[], &[])).unwrap();
    let mut running = watching(&a, &path).await;
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace("mode = \"poll\"", "mode = \"gossip\"");
    std::fs::write(&path, text).unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(5), running.wait())
        .await
        .unwrap();
    let err = ended.unwrap_err().to_string();
    assert!(err.contains("poll") && err.contains("gossip"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_ends_every_task_persists_the_fences_and_frees_the_ports() {
    let grid = Grid::new();
    let a = grid.site("a");
    let path = a.dir.path().join("operator.toml");
    std::fs::write(&path, a.config_text(&[], &[])).unwrap();
    let config = FileConfigSource::new(&path).load().unwrap();
    let state: Arc<dyn StateStore> = Arc::new(FileStateStore::open(a.state_dir()).unwrap());
    let running = driver::start(config, None, state, Options::default())
        .await
        .unwrap();
    let (signals, metrics) = (running.signals_addr, running.metrics_addr);
    tokio::time::timeout(Duration::from_secs(5), running.shutdown())
        .await
        .expect("shutdown is prompt")
        .unwrap();
    assert!(
        a.state_dir()
            .join(grid_operatord::state::FENCES_FILE)
            .exists()
    );
    // Both listeners are closed: their ports can be bound again.
    for addr in [signals, metrics] {
        std::net::TcpListener::bind(addr).unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_a_peer_sends_for_another_site_are_dropped() {
    use grid_signals::store::DropReason;
    let grid = Grid::new();
    let (a, b) = (grid.site("a"), grid.site("b"));
    let now = grid_operatord::clock::wall_ms();
    let batch = |site: &str| {
        format!(
            "grid_provider_config_generation{{grid_site=\"{site}\",grid_provider=\"m\",provider_uid=\"u\",publisher_epoch=\"{now}\",batch_sequence=\"1\",batch_samples=\"1\"}} 1 {now}\n\
             grid_provider_ready{{grid_site=\"{site}\",grid_provider=\"m\"}} 1 {now}\n"
        )
    };
    let body = format!("{}{}", batch("c"), batch("b")).into_bytes();
    // A fake peer presenting b's certificate, serving a row for site c beside its own.
    let fake_b = FakeEpp::start_with_tls(Behaviour::Body(body), Some(fake_peer_tls(&b))).await;
    let url = format!("https://127.0.0.1:{}/v1/site/signals", fake_b.addr.port());
    let op_a = run(&a, &[("b", url)], &[]).await;
    let ingest = op_a.metrics.ingest.clone();
    eventually("site_mismatch counted", 10, || {
        let ingest = ingest.clone();
        async move { ingest.dropped(DropReason::SiteMismatch) >= 2 }
    })
    .await;
    let body = text(
        &get_signals(op_a.signals_addr, grid.client(&a.cert, "a", "a"))
            .await
            .unwrap()
            .body,
    );
    assert_eq!(
        value_of(&body, "grid_provider_ready", "b", "m"),
        Some(1.0),
        "{body}"
    );
    assert!(!body.contains("grid_site=\"c\""), "{body}");
}

/// `text` switched to pin mode, pinning each named peer to its certificate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pin_mode_operators_poll_each_other_and_refuse_an_unpinned_peer() {
    let grid = Grid::new();
    let (a, b) = (grid.site("a"), grid.site("b"));
    let epp_b = FakeEpp::start(Behaviour::Body(epp_body(9, 1.0))).await;
    let start = |config: grid_operatord::config::Config, dir: std::path::PathBuf| async move {
        assert_eq!(config.trust, grid_operatord::config::TrustMode::Pin);
        let state: Arc<dyn StateStore> = Arc::new(FileStateStore::open(dir).unwrap());
        driver::start(config, None, state, Options::default())
            .await
            .unwrap()
    };
    let op_b = start(
        b.pinned_config(
            &[("a", NOWHERE.into())],
            &[provider("mistral", &epp_b)],
            &[("a", &a.cert)],
        ),
        b.state_dir(),
    )
    .await;
    let op_a = start(
        a.pinned_config(
            &[("b", signals_url(op_b.signals_addr))],
            &[],
            &[("b", &b.cert)],
        ),
        a.state_dir(),
    )
    .await;
    let gateway_a = grid.client(&a.cert, "a", "a");
    eventually("a relays b's provider in pin mode", 15, || {
        let tls = gateway_a.clone();
        async move {
            let f = get_signals(op_a.signals_addr, tls).await.unwrap();
            value_of(
                &text(&f.body),
                "grid_provider_ready_endpoints",
                "b",
                "mistral",
            ) == Some(9.0)
        }
    })
    .await;
    // Another certificate for site b from the same CA is not the pinned one.
    let other_b = grid.ca.site(grid_kit::operator_harness::DOMAIN, "b");
    refused(&get_signals(op_a.signals_addr, grid.client(&other_b, "b", "a")).await);
}

/// Server TLS of a fake peer that presents `site`'s certificate.
fn fake_peer_tls(site: &Site) -> Arc<rustls::ServerConfig> {
    let server = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(vec![site.cert.cert.clone()], site.cert.key())
    .unwrap();
    Arc::new(server)
}

/// One batch of site `site`, provider `m`, at (`epoch`, `sequence`), readiness `ready`.
fn peer_batch(site: &str, epoch: u64, sequence: u64, ready: u8, now: u64) -> Vec<u8> {
    format!(
        "grid_provider_config_generation{{grid_site=\"{site}\",grid_provider=\"m\",provider_uid=\"u\",publisher_epoch=\"{epoch}\",batch_sequence=\"{sequence}\",batch_samples=\"1\"}} 1 {now}\n\
         grid_provider_ready{{grid_site=\"{site}\",grid_provider=\"m\"}} {ready} {now}\n"
    )
    .into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_survive_a_restart_so_an_older_batch_stays_refused() {
    use grid_signals::store::DropReason;
    let grid = Grid::new();
    let (a, b) = (grid.site("a"), grid.site("b"));
    let now = grid_operatord::clock::wall_ms();
    let epoch = now - 60_000;
    let fake_b = FakeEpp::start_with_tls(
        Behaviour::Body(peer_batch("b", epoch, 5, 1, now)),
        Some(fake_peer_tls(&b)),
    )
    .await;
    let url = format!("https://127.0.0.1:{}/v1/site/signals", fake_b.addr.port());
    let options = Options {
        fence_persist: Duration::from_millis(100),
        ..Options::default()
    };
    let start = |options: Options| {
        let config = a.config(&[("b", url.clone())], &[]);
        let state: Arc<dyn StateStore> = Arc::new(FileStateStore::open(a.state_dir()).unwrap());
        async move { driver::start(config, None, state, options).await.unwrap() }
    };
    let first = start(options.clone()).await;
    let dir = a.state_dir();
    eventually("fence (epoch, 5) persisted", 10, || {
        let dir = dir.clone();
        async move {
            let fences = FileStateStore::open(dir).unwrap().load_fences().unwrap();
            fences.is_some_and(|f| {
                f.records
                    .iter()
                    .any(|r| r.site == "b" && r.fence == grid_signals::batch::Fence::new(epoch, 5))
            })
        }
    })
    .await;
    drop(first);
    // After the restart the peer (say, behind a stale cache) serves an older batch.
    let now = grid_operatord::clock::wall_ms();
    fake_b.set(Behaviour::Body(peer_batch("b", epoch, 4, 0, now)));
    let second = start(options).await;
    let ingest = second.metrics.ingest.clone();
    eventually("the older batch refused as delayed", 10, || {
        let ingest = ingest.clone();
        async move { ingest.dropped(DropReason::Delayed) >= 2 }
    })
    .await;
    let body = text(
        &get_signals(second.signals_addr, grid.client(&a.cert, "a", "a"))
            .await
            .unwrap()
            .body,
    );
    assert!(!body.contains("grid_site=\"b\""), "{body}");
    // A newer batch is admitted as usual.
    fake_b.set(Behaviour::Body(peer_batch(
        "b",
        epoch,
        6,
        1,
        grid_operatord::clock::wall_ms(),
    )));
    eventually("the newer batch relayed", 10, || {
        let tls = grid.client(&a.cert, "a", "a");
        async move {
            let f = get_signals(second.signals_addr, tls).await.unwrap();
            value_of(&text(&f.body), "grid_provider_ready", "b", "m") == Some(1.0)
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metrics_listener_answers_probes_ready_only_after_a_complete_scrape_pass() {
    use grid_kit::gateway_harness::{get, http1_client, send};
    let grid = Grid::new();
    let a = grid.site("a");
    // The first pass lasts as long as this EPP's answer.
    let epp = FakeEpp::start(Behaviour::Delay(
        Duration::from_millis(1_500),
        epp_body(2, 1.0),
    ))
    .await;
    let spec = ProviderSpec {
        timeout_s: 3.0,
        ..provider("llama", &epp)
    };
    let op = run(&a, &[], &[spec]).await;
    let url = |path: &str| format!("http://{}{path}", op.metrics_addr);
    let c = http1_client();
    assert_eq!(send(&c, get(&url("/healthz"))).await.status, 200);
    assert_eq!(
        send(&c, get(&url("/readyz"))).await.status,
        503,
        "no pass has completed yet"
    );
    eventually("ready after the first pass", 10, || {
        let (c, u) = (c.clone(), url("/readyz"));
        async move { send(&c, get(&u)).await.status == 200 }
    })
    .await;
    assert_eq!(send(&c, get(&url("/nothing"))).await.status, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_persisted_epoch_mark_an_hour_ahead_of_the_clock_keeps_the_site_serving_and_says_so() {
    use grid_signals::batch::{Fence, FenceRecord, FenceSet, MAX_EPOCH_LEAD_MS};
    let grid = Grid::new();
    let a = grid.site("a");
    let now = grid_operatord::clock::wall_ms();
    // The previous process ran with a clock an hour ahead: its mark and its own
    // provider's fence are both there; then the clock stepped back across the restart.
    let ahead = now + 3_600_000;
    let store = FileStateStore::open(a.state_dir()).unwrap();
    store.store_epoch_hwm(ahead).unwrap();
    store
        .store_fences(&FenceSet {
            records: vec![FenceRecord {
                site: "a".into(),
                provider: "llama".into(),
                fence: Fence::new(ahead, 40),
            }],
        })
        .unwrap();
    let epp = FakeEpp::start(Behaviour::Body(epp_body(2, 1.0))).await;
    let op = run(&a, &[], &[provider("llama", &epp)]).await;
    // The epoch every receiver with a right clock still admits, above every fence one
    // could have retained from the previous process.
    let after = grid_operatord::clock::wall_ms();
    assert!(
        op.epoch >= now + MAX_EPOCH_LEAD_MS && op.epoch <= after + MAX_EPOCH_LEAD_MS,
        "epoch {} not clamped to the clock's lead bound",
        op.epoch
    );
    let gateway = grid.client(&a.cert, "a", "a");
    eventually("the site's provider served to its gateway", 10, || {
        let tls = gateway.clone();
        async move {
            let f = get_signals(op.signals_addr, tls).await.unwrap();
            value_of(&text(&f.body), "grid_provider_ready", "a", "llama") == Some(1.0)
        }
    })
    .await;
    let m = get_metrics(op.metrics_addr).await;
    assert!(
        m.lines()
            .any(|l| l == "grid_operator_publisher_epoch_clamped 1"),
        "{m}"
    );
    assert_eq!(
        op.metrics
            .ingest
            .dropped(grid_signals::store::DropReason::Skew),
        0
    );
    assert_eq!(
        op.metrics
            .ingest
            .dropped(grid_signals::store::DropReason::Delayed),
        0
    );
    drop(op);
    // The next restart starts above the clamped epoch.
    let hwm = FileStateStore::open(a.state_dir())
        .unwrap()
        .load_epoch_hwm()
        .unwrap()
        .unwrap();
    assert!(hwm <= after + MAX_EPOCH_LEAD_MS, "mark {hwm} left ahead");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_show_a_provider_series_while_it_is_held_and_drop_it_as_soon_as_it_is_not() {
    let grid = Grid::new();
    let a = grid.site("a");
    let epp = FakeEpp::start(Behaviour::Body(epp_body(2, 1.0))).await;
    let op = run(&a, &[], &[provider("llama", &epp)]).await;
    let addr = op.metrics_addr;
    eventually(
        "grid_provider_ready 1 on /metrics while held",
        10,
        || async move {
            value_of(
                &get_metrics(addr).await,
                "grid_provider_ready",
                "a",
                "llama",
            ) == Some(1.0)
        },
    )
    .await;
    // The EPP stops exporting the pool's series: readiness becomes unknown and the next
    // publication carries no grid_provider_ready. The relay drops it at once; /metrics
    // must too, long before the 30 s TTL would expire the old reading.
    epp.set(Behaviour::Body(b"some_other_family 1\n".to_vec()));
    let gateway = grid.client(&a.cert, "a", "a");
    let signals = op.signals_addr;
    eventually("the relay no longer carries grid_provider_ready", 5, || {
        let tls = gateway.clone();
        async move {
            let f = get_signals(signals, tls).await.unwrap();
            let body = text(&f.body);
            body.contains("grid_provider_config_generation{")
                && value_of(&body, "grid_provider_ready", "a", "llama").is_none()
        }
    })
    .await;
    let m = get_metrics(addr).await;
    assert_eq!(
        value_of(&m, "grid_provider_ready", "a", "llama"),
        None,
        "a series the relay no longer holds is still on /metrics:\n{m}"
    );
    assert_eq!(
        value_of(&m, "grid_provider_ready_endpoints", "a", "llama"),
        None,
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_unavailable_from_configuration_reads_not_ready_with_that_reason() {
    let grid = Grid::new();
    let a = grid.site("a");
    let epp = FakeEpp::start(Behaviour::Body(epp_body(2, 1.0))).await;
    let mut config = a.config(&[], &[provider("llama", &epp)]);
    config.providers[0].unavailable = true;
    config.validate().unwrap();
    let state: Arc<dyn StateStore> = Arc::new(FileStateStore::open(a.state_dir()).unwrap());
    let op = driver::start(config, None, state, Options::default())
        .await
        .unwrap();
    let gateway = grid.client(&a.cert, "a", "a");
    eventually("grid_provider_ready 0 relayed", 10, || {
        let tls = gateway.clone();
        async move {
            let f = get_signals(op.signals_addr, tls).await.unwrap();
            value_of(&text(&f.body), "grid_provider_ready", "a", "llama") == Some(0.0)
        }
    })
    .await;
    // Still scraped: its load stays visible.
    let m = get_metrics(op.metrics_addr).await;
    assert_eq!(
        value_of(&m, "grid_provider_ready_endpoints", "a", "llama"),
        Some(2.0)
    );
    assert!(
        m.contains(
            "grid_operator_provider_ready_reason{provider=\"llama\",reason=\"unavailable\"} 1"
        ),
        "{m}"
    );
    assert!(
        m.contains(
            "grid_operator_provider_ready_reason{provider=\"llama\",reason=\"endpoints_ready\"} 0"
        ),
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_readiness_transition_is_exported_with_its_reason_and_the_failed_scrapes_class() {
    use grid_signals::epp::ReadyReasonLabel;
    let grid = Grid::new();
    let a = grid.site("a");
    let epp = FakeEpp::start(Behaviour::Body(epp_body(2, 1.0))).await;
    let mut config = a.config(&[], &[provider("llama", &epp)]);
    // The readiness floor (two 1 s intervals) decides the stale window.
    config.providers[0].stale_metrics = Some(Duration::from_secs(1));
    let state: Arc<dyn StateStore> = Arc::new(FileStateStore::open(a.state_dir()).unwrap());
    let op = driver::start(config, None, state, Options::default())
        .await
        .unwrap();
    let scrapes = op.metrics.scrapes.clone();
    eventually("endpoints_ready is the current reason", 10, || {
        let s = scrapes.clone();
        async move { s.ready_reason("llama", ReadyReasonLabel::EndpointsReady) == 1 }
    })
    .await;
    epp.set(Behaviour::Status(500));
    eventually("scrape_http is the current reason", 10, || {
        let s = scrapes.clone();
        async move { s.ready_reason("llama", ReadyReasonLabel::ScrapeHttp) == 1 }
    })
    .await;
    let current: Vec<_> = ReadyReasonLabel::ALL
        .into_iter()
        .filter(|r| scrapes.ready_reason("llama", *r) == 1)
        .collect();
    assert_eq!(current, [ReadyReasonLabel::ScrapeHttp]);
    let m = get_metrics(op.metrics_addr).await;
    assert_eq!(value_of(&m, "grid_provider_ready", "a", "llama"), Some(0.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewed_certificate_is_presented_to_new_connections_without_a_restart() {
    use grid_daemon::tls::{Identity, ReloadResult, TlsMaterial, Trust, client_config};
    let grid = Grid::new();
    let a = grid.site("a");
    let config = a.config(&[], &[]);
    let state: Arc<dyn StateStore> = Arc::new(FileStateStore::open(a.state_dir()).unwrap());
    let options = Options {
        cert_check: Duration::from_millis(100),
        ..Options::default()
    };
    let op = driver::start(config, None, state, options).await.unwrap();
    // A local client that accepts the operator only if it presents the renewed leaf.
    let renewed = grid.ca.site(grid_kit::operator_harness::DOMAIN, "a");
    let material = TlsMaterial {
        chain: vec![renewed.cert.clone()],
        key: renewed.key(),
        roots: rustls::RootCertStore::empty(),
    };
    let only_renewed = Arc::new(Trust::pin("a", &renewed.cert, []).unwrap());
    let tls = client_config(&material, only_renewed, Identity::Local).unwrap();
    assert!(
        get_signals(op.signals_addr, tls.clone()).await.is_err(),
        "the old leaf is presented before the renewal"
    );
    // A renewal whose key is not its certificate's is refused, the old pair kept.
    let (cert_path, key_path) = (a.dir.path().join("site.crt"), a.dir.path().join("site.key"));
    std::fs::write(&cert_path, &renewed.cert_pem).unwrap();
    eventually("the mismatched pair refused", 10, || async {
        op.certificates.count(ReloadResult::Refused) > 0
    })
    .await;
    assert!(get_signals(op.signals_addr, tls.clone()).await.is_err());
    std::fs::write(&key_path, &renewed.key_pem).unwrap();
    eventually("the renewed pair presented", 10, || {
        let tls = tls.clone();
        async move { get_signals(op.signals_addr, tls).await.is_ok() }
    })
    .await;
    assert_eq!(op.certificates.count(ReloadResult::Rotated), 1);
    let m = get_metrics(op.metrics_addr).await;
    assert!(
        m.contains("grid_operator_certificate_reloads_total{result=\"rotated\"} 1"),
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declared_trust_change_stops_the_operator_so_its_supervisor_restarts_it() {
    let grid = Grid::new();
    let a = grid.site("a");
    let path = a.dir.path().join("operator.toml");
    std::fs::write(&path, a.config_text(&[], &[])).unwrap();
    let mut running = watching(&a, &path).await;
    // Unchanged trust: the operator keeps running through several checks.
    assert!(
        tokio::time::timeout(Duration::from_millis(500), running.wait())
            .await
            .is_err()
    );
    std::fs::write(&path, a.config_text(&[("b", NOWHERE.into())], &[])).unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(5), running.wait())
        .await
        .expect("the operator stops");
    let err = ended.unwrap_err().to_string();
    assert!(err.contains("`peers`") && err.contains("restarts"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_gossip_a_switch_to_pin_is_in_force_at_the_next_handshake_without_a_restart() {
    let grid = Grid::new();
    let (a, b, c) = (grid.site("a"), grid.site("b"), grid.site("c"));
    let path = a.dir.path().join("operator.toml");
    let gossip = |text: String| text.replace("mode = \"poll\"", "mode = \"gossip\"");
    std::fs::write(&path, gossip(a.config_text(&[], &[]))).unwrap();
    let mut running = watching(&a, &path).await;
    let as_c = || grid.client(&c.cert, "c", "a");
    assert!(
        get_signals(running.signals_addr, as_c()).await.is_ok(),
        "under SPIFFE every site of the domain is a peer"
    );
    // The same file in pin mode, pinning b only.
    let pin = Fingerprint::of_der(&b.cert.cert);
    let pinned = gossip(a.config_text(&[("b", NOWHERE.into())], &[]))
        .replace(
            &format!(
                "mode = \"spiffe\"\ntrustDomain = \"{}\"",
                grid_kit::operator_harness::DOMAIN
            ),
            "mode = \"pin\"",
        )
        .replace(
            "timeoutSeconds = 1",
            &format!("timeoutSeconds = 1\nfingerprints = [\"{pin}\"]"),
        );
    assert!(pinned.contains("mode = \"pin\"") && pinned.contains("fingerprints"));
    std::fs::write(&path, pinned).unwrap();
    eventually("c refused at the handshake", 10, || async {
        get_signals(running.signals_addr, as_c()).await.is_err()
    })
    .await;
    assert!(
        get_signals(running.signals_addr, grid.client(&b.cert, "b", "a"))
            .await
            .is_ok()
    );
    assert!(
        get_signals(running.signals_addr, grid.client(&a.cert, "a", "a"))
            .await
            .is_ok(),
        "the local gateway is this site's own certificate"
    );
    // Ten checks and more: the same change stops a polling operator within two.
    assert!(
        tokio::time::timeout(Duration::from_secs(1), running.wait())
            .await
            .is_err(),
        "a gossiping operator exited on a trust change"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_added_to_the_file_is_scraped_live_and_the_kept_one_goes_on_learning() {
    use grid_signals::store::{Store, StoreConfig};
    let grid = Grid::new();
    let a = grid.site("a");
    let (m, n) = (
        FakeEpp::start(Behaviour::Body(epp_body(2, 1.0))).await,
        FakeEpp::start(Behaviour::Body(epp_body(3, 1.0))).await,
    );
    let path = a.dir.path().join("operator.toml");
    std::fs::write(&path, a.config_text(&[], &[provider("m", &m)])).unwrap();
    let running = watching(&a, &path).await;
    let gateway = grid.client(&a.cert, "a", "a");
    let mut store = Store::new(StoreConfig::default());
    // Every learning reset one poll raises: (provider, epoch).
    let mut poll = async || {
        let fetched = get_signals(running.signals_addr, gateway.clone())
            .await
            .unwrap();
        let (report, resets) = ingest_resets(&mut store, &fetched);
        assert_eq!(report.dropped.total(), 0, "{report:?}");
        resets
            .into_iter()
            .map(|(provider, revision)| (provider, revision.epoch))
            .collect::<Vec<_>>()
    };
    let mut resets = Vec::new();
    for _ in 0..100 {
        resets.extend(poll().await);
        if !resets.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(resets, [("m".to_owned(), running.epoch)]);
    std::fs::write(
        &path,
        a.config_text(&[], &[provider("m", &m), provider("n", &n)]),
    )
    .unwrap();
    let mut after = Vec::new();
    for _ in 0..100 {
        after.extend(poll().await);
        if !after.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        after.extend(poll().await);
    }
    assert_eq!(
        after,
        [("n".to_owned(), running.epoch)],
        "n is published in the running epoch, and m's learning goes on"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_relay_body_served_is_counted_by_who_asked() {
    use grid_operatord::served::Served;
    let grid = Grid::new();
    let (a, b) = (grid.site("a"), grid.site("b"));
    let epp = FakeEpp::start(Behaviour::Body(epp_body(2, 1.0))).await;
    let op = run(&a, &[], &[provider("m", &epp)]).await;
    let local = get_signals(op.signals_addr, grid.client(&a.cert, "a", "a"))
        .await
        .unwrap();
    let peer = get_signals(op.signals_addr, grid.client(&b.cert, "b", "a"))
        .await
        .unwrap();
    let served = &op.metrics.served;
    assert_eq!(served.count(Served::RelayLocal), local.body.len() as u64);
    assert_eq!(served.count(Served::RelayPeer), peer.body.len() as u64);
    assert_eq!(served.count(Served::Batch), 0);
    let m = get_metrics(op.metrics_addr).await;
    assert!(
        m.contains(&format!(
            "grid_operator_served_bytes_total{{kind=\"relay_local\"}} {}",
            local.body.len()
        )),
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_gossip_a_ca_bundle_rewritten_in_place_is_in_force_at_the_next_handshake() {
    let grid = Grid::new();
    let a = grid.site("a");
    let path = a.dir.path().join("operator.toml");
    let gossip = |text: String| text.replace("mode = \"poll\"", "mode = \"gossip\"");
    std::fs::write(&path, gossip(a.config_text(&[], &[]))).unwrap();
    let mut running = watching(&a, &path).await;
    // c's certificate comes from a CA a does not trust yet.
    let next_ca = grid_kit::pki::Ca::new("next-ca");
    let c = next_ca.site(grid_kit::operator_harness::DOMAIN, "c");
    let as_c = || grid.client(&c, "c", "a");
    assert!(get_signals(running.signals_addr, as_c()).await.is_err());
    // The Secret's update: the bundle now holds both CAs, same path, same mtime.
    rewrite_keeping_mtime(
        &a.dir.path().join("ca.crt"),
        &format!("{}{}", grid.ca.pem(), next_ca.pem()),
    );
    eventually("c, under the new CA, is accepted", 10, || async {
        get_signals(running.signals_addr, as_c()).await.is_ok()
    })
    .await;
    assert!(
        get_signals(running.signals_addr, grid.client(&a.cert, "a", "a"))
            .await
            .is_ok(),
        "the old CA's certificates still pass"
    );
    assert!(
        tokio::time::timeout(Duration::from_millis(500), running.wait())
            .await
            .is_err(),
        "a gossiping operator takes a CA change over live"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_poll_a_ca_bundle_rewritten_in_place_stops_the_operator_like_a_declared_ca_change() {
    let grid = Grid::new();
    let a = grid.site("a");
    let path = a.dir.path().join("operator.toml");
    std::fs::write(&path, a.config_text(&[], &[])).unwrap();
    let mut running = watching(&a, &path).await;
    assert!(
        tokio::time::timeout(Duration::from_millis(500), running.wait())
            .await
            .is_err()
    );
    let next_ca = grid_kit::pki::Ca::new("next-ca");
    rewrite_keeping_mtime(
        &a.dir.path().join("ca.crt"),
        &format!("{}{}", grid.ca.pem(), next_ca.pem()),
    );
    let ended = tokio::time::timeout(Duration::from_secs(5), running.wait())
        .await
        .expect("the operator stops for its supervisor to restart it");
    let err = ended.unwrap_err().to_string();
    assert!(err.contains("`tls.ca`"), "{err}");
}
