//! The signals path end to end on loopback with real rustls: a fake operator relays load
//! for two sites served by fake model servers, and the gateway's routing follows it.

use std::time::Duration;

use grid_gateway::Config;
use grid_gateway::config::Shedding;
use grid_gateway::poller::PollResult;
use grid_gatewayd::driver::{self, Running};
use grid_kit::gateway_harness::fake_model::FakeModel;
use grid_kit::gateway_harness::fake_operator::{FakeOperator, SiteLoad};
use grid_kit::gateway_harness::{Cand, http1_client, post, send};
use grid_kit::pki::{Ca, server_config};
use http::StatusCode;

const CHAT: &str = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;

/// The test gateway's poll cadence: fast so the suite is quick, slow enough to be real.
const POLL_MS: u64 = 200;

/// "Within one poll" on a loaded 2-core CI machine: the poll itself, the refresh, and a
/// generous margin for scheduling delays.
const ONE_POLL_WITH_MARGIN: Duration = Duration::from_millis(POLL_MS * 5);

struct Grid {
    gateway: Option<Running>,
    operator: FakeOperator,
    sites: Vec<FakeModel>,
    _dir: tempfile::TempDir,
}

impl Grid {
    /// Sites `a` and `b` serving model `m`; the operator's certificate is issued by
    /// `operator_ca` (the grid CA unless a test wants it untrusted).
    async fn start(tune: impl FnOnce(&mut Config), trusted_operator: bool) -> Self {
        Self::start_polling_every(tune, trusted_operator, POLL_MS).await
    }

    async fn start_polling_every(
        tune: impl FnOnce(&mut Config),
        trusted_operator: bool,
        poll_ms: u64,
    ) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let pki = Ca::new("grid-ca");
        let rogue = Ca::new("rogue-ca");
        let op_issuer = if trusted_operator { &pki } else { &rogue };
        let op_files = op_issuer.issue(dir.path(), "operator", &["operator.a.grid"]);
        let operator = FakeOperator::start(server_config(&op_files, &pki.pem())).await;
        operator.set("a", SiteLoad::idle());
        operator.set("b", SiteLoad::idle());
        let sites = vec![FakeModel::start("a").await, FakeModel::start("b").await];
        let mut config = grid_kit::gateway_harness::config(
            dir.path(),
            &pki,
            &operator.url(),
            &[(
                "m",
                vec![
                    Cand {
                        site: "a",
                        provider: "p",
                        base_url: sites[0].base_url(),
                    },
                    Cand {
                        site: "b",
                        provider: "p",
                        base_url: sites[1].base_url(),
                    },
                ],
            )],
        );
        config.operator.poll_interval_ms = poll_ms;
        tune(&mut config);
        config.validate().unwrap();
        let gateway = driver::start(config).await.unwrap();
        Self {
            gateway: Some(gateway),
            operator,
            sites,
            _dir: dir,
        }
    }

    fn gw(&self) -> &Running {
        self.gateway.as_ref().unwrap()
    }

    fn url(&self) -> String {
        format!("http://{}/v1/chat/completions", self.gw().local_addr())
    }

    fn excluded(&self) -> Vec<String> {
        let view = self.gw().published().load();
        view.table()
            .get("m")
            .unwrap()
            .excluded()
            .iter()
            .map(|e| e.key.site.to_string())
            .collect()
    }

    /// Waits (bounded) until `cond` holds on the published view; returns how long it took.
    async fn until(&self, what: &str, limit: Duration, cond: impl Fn(&Self) -> bool) -> Duration {
        let start = tokio::time::Instant::now();
        while !cond(self) {
            assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        start.elapsed()
    }

    async fn measured(&self) {
        self.until("both sites measured", Duration::from_secs(5), |g| {
            let view = g.gw().published().load();
            let snap = view.table().get("m").unwrap();
            snap.candidates().len() == 2 && snap.candidates().iter().all(|c| c.score().is_finite())
        })
        .await;
    }

    async fn shutdown(mut self) {
        let g = self.gateway.take().unwrap();
        tokio::time::timeout(Duration::from_secs(10), g.shutdown())
            .await
            .expect("gateway stops in time");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn site_with_zero_ready_endpoints_leaves_within_one_poll_and_rejoins_after_recovery() {
    let grid = Grid::start(|_| {}, true).await;
    grid.measured().await;
    let polls_before = grid.operator.polls();
    grid.operator.set(
        "b",
        SiteLoad {
            ready_endpoints: 0,
            ..SiteLoad::idle()
        },
    );
    let left = grid
        .until("b excluded", ONE_POLL_WITH_MARGIN, |g| {
            g.excluded() == ["b"]
        })
        .await;
    assert!(
        grid.operator.polls() - polls_before <= 4,
        "exclusion took {left:?}"
    );
    let c = http1_client();
    for _ in 0..10 {
        assert_eq!(send(&c, post(&grid.url(), CHAT)).await.site(), Some("a"));
    }
    grid.operator.set("b", SiteLoad::idle());
    let back = grid
        .until("b back", ONE_POLL_WITH_MARGIN, |g| g.excluded().is_empty())
        .await;
    eprintln!("left selection after {left:?}, rejoined after {back:?} (poll {POLL_MS} ms)");
    grid.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sites_full_band_header_moves_traffic_within_one_response_without_a_poll() {
    // One poll at start, the next a minute later: only the response path can move traffic.
    let grid = Grid::start_polling_every(|_| {}, true, 60_000).await;
    grid.measured().await;
    let polls = grid.operator.polls();
    grid.sites[0].set_response_headers(&[
        ("x-llm-d-flow-band-headroom-requests", "0"),
        ("x-llm-d-flow-queue-duration-ms", "12"),
        ("x-llm-d-flow-something-else", "1"),
    ]);
    grid.sites[1].set_response_headers(&[("x-llm-d-flow-band-headroom-requests", "30")]);
    let c = http1_client();
    // Until one request lands on a (each lands there about half the time).
    let mut from_a = None;
    for _ in 0..64 {
        let answer = send(&c, post(&grid.url(), CHAT)).await;
        if answer.site() == Some("a") {
            from_a = Some(answer);
            break;
        }
    }
    let from_a = from_a.expect("a request reached a");
    assert!(
        from_a
            .headers
            .keys()
            .all(|k| !k.as_str().starts_with("x-llm-d-flow-")
                || k == "x-llm-d-flow-band-headroom-requests"),
        "a site's flow headers are not passed on: {:?}",
        from_a.headers
    );
    assert_eq!(
        from_a
            .headers
            .get("x-llm-d-flow-band-headroom-requests")
            .map(|v| v.to_str().unwrap()),
        Some("0"),
        "the grid restates the chosen site's own band: a's is full"
    );
    grid.until("a weighted out", ONE_POLL_WITH_MARGIN, |g| {
        let view = g.gw().published().load();
        let snap = view.table().get("m").unwrap();
        snap.candidates()
            .iter()
            .any(|c| &**c.site() == "a" && c.live_factor() < 0.5)
    })
    .await;
    let mut on_b = 0;
    for _ in 0..20 {
        let answer = send(&c, post(&grid.url(), CHAT)).await;
        on_b += usize::from(answer.site() == Some("b"));
    }
    assert!(
        on_b >= 17,
        "{on_b} of 20 on b after a said its band is full"
    );
    assert_eq!(grid.operator.polls(), polls, "no poll happened meanwhile");
    // The model's grid headroom (routing evidence): the sum of fresh band headroom over
    // its sites (a: 0, b: 30), once the refresh that b's answers woke (at most one per
    // 50 ms) has been published.
    grid.until("b's headroom folded in", ONE_POLL_WITH_MARGIN, |g| {
        let view = g.gw().published().load();
        view.table().get("m").unwrap().grid_headroom() == Some(30)
    })
    .await;
    // What a client is told is the headroom of its own band at the site that answered.
    let answer = send(&c, post(&grid.url(), CHAT)).await;
    let own = if answer.site() == Some("a") {
        "0"
    } else {
        "30"
    };
    assert_eq!(
        answer.headers["x-llm-d-flow-band-headroom-requests"]
            .to_str()
            .unwrap(),
        own
    );
    grid.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traffic_shifts_away_from_a_saturated_site() {
    let grid = Grid::start(|_| {}, true).await;
    grid.measured().await;
    grid.operator.set("a", SiteLoad::full());
    grid.until("a reads saturated", ONE_POLL_WITH_MARGIN, |g| {
        let view = g.gw().published().load();
        let snap = view.table().get("m").unwrap();
        snap.candidates()
            .first()
            .is_some_and(|c| &**c.site() == "b")
            && snap.path() == Some(grid_score::Path::Lone)
    })
    .await;
    let c = http1_client();
    for _ in 0..20 {
        assert_eq!(send(&c, post(&grid.url(), CHAT)).await.site(), Some("b"));
    }
    assert!(
        grid.sites[0].seen().is_empty() || grid.sites[0].seen().len() < grid.sites[1].seen().len()
    );
    grid.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_site_excluded_gives_503_with_retry_after() {
    let grid = Grid::start(|c| c.unavailable_retry_after_s = 7, true).await;
    grid.measured().await;
    grid.operator.set(
        "a",
        SiteLoad {
            ready_endpoints: 0,
            ..SiteLoad::idle()
        },
    );
    grid.operator.set(
        "b",
        SiteLoad {
            ready_endpoints: 0,
            ..SiteLoad::idle()
        },
    );
    grid.until("both excluded", ONE_POLL_WITH_MARGIN, |g| {
        g.excluded().len() == 2
    })
    .await;
    let a = send(&http1_client(), post(&grid.url(), CHAT)).await;
    assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(a.headers["retry-after"], "7");
    assert_eq!(a.error_code(), "unavailable");
    assert!(grid.sites.iter().all(|s| s.seen().is_empty()));
    let models = send(
        &http1_client(),
        grid_kit::gateway_harness::get(&grid.url().replace("/chat/completions", "/models")),
    )
    .await;
    assert_eq!(
        models.json()["data"].as_array().unwrap().len(),
        0,
        "no routable model is listed"
    );
    grid.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shedding_on_and_every_site_full_gives_429_with_retry_after() {
    let grid = Grid::start(
        |c| {
            c.availability.shedding = Shedding {
                enabled: true,
                full_after_ms: Some(1),
                room_after_ms: Some(1_000),
                retry_after_s: Some(2),
            };
        },
        true,
    )
    .await;
    grid.measured().await;
    grid.operator.set("a", SiteLoad::full());
    grid.operator.set("b", SiteLoad::full());
    grid.until("model sheds", Duration::from_secs(5), |g| {
        g.gw().published().load().is_shedding("m")
    })
    .await;
    let a = send(&http1_client(), post(&grid.url(), CHAT)).await;
    assert_eq!(a.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(a.headers["retry-after"], "2");
    assert_eq!(a.error_code(), "shedding");
    assert_eq!(a.json()["error"]["type"], "rate_limit_error");
    grid.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn untrusted_operator_certificate_is_refused_and_every_site_ranks_unmeasured() {
    let grid = Grid::start(|_| {}, false).await;
    let polls = &grid.gw().handles().poll;
    grid.until("three refused polls", Duration::from_secs(5), |_| {
        polls.polls(PollResult::Transport) >= 3
    })
    .await;
    assert_eq!(polls.polls(PollResult::Ok), 0);
    let view = grid.gw().published().load();
    let snap = view.table().get("m").unwrap();
    assert_eq!(snap.candidates().len(), 2);
    assert!(
        snap.candidates()
            .iter()
            .all(|c| c.score() == grid_score::UNMEASURED),
        "{snap:?}"
    );
    // Unmeasured is least preferred, not unavailable: requests still route.
    assert_eq!(
        send(&http1_client(), post(&grid.url(), CHAT)).await.status,
        StatusCode::OK
    );
    grid.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skew_drops_reach_the_operator_and_clear_after_a_clean_cycle() {
    let grid = Grid::start(|_| {}, true).await;
    grid.measured().await;
    // Stamps a minute after the body's Date: implausible, dropped as skew.
    grid.operator.set(
        "b",
        SiteLoad {
            stamp_offset_ms: 60_000,
            ..SiteLoad::idle()
        },
    );
    grid.until("a bad report", Duration::from_secs(5), |g| {
        g.operator.feedback().iter().any(|f| !f.clean)
    })
    .await;
    let bad = grid
        .operator
        .feedback()
        .into_iter()
        .find(|f| !f.clean)
        .unwrap();
    assert!(bad.rejected > 0);
    assert_eq!(bad.epoch.len(), 16);
    grid.operator.set("b", SiteLoad::idle());
    grid.until(
        "a clean report after the bad one",
        Duration::from_secs(5),
        |g| {
            g.operator
                .feedback()
                .iter()
                .any(|f| f.clean && f.sequence > bad.sequence)
        },
    )
    .await;
    let ingest = &grid.gw().handles().ingest;
    assert!(ingest.dropped(grid_signals::store::DropReason::Skew) > 0);
    assert_eq!(grid.gw().handles().feedback.total_failures(), 0);
    grid.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_answers_200_once_a_poll_of_the_operator_fed_routing() {
    let grid = Grid::start(|_| {}, true).await;
    grid.measured().await;
    let url = format!("http://{}/readyz", grid.gw().local_addr());
    let a = send(&http1_client(), grid_kit::gateway_harness::get(&url)).await;
    assert_eq!(a.status, StatusCode::OK, "{:?}", a.body);
    grid.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_operator_identity_is_named_beside_the_name_the_certificate_carries() {
    // The operator's certificate is for operator.a.grid; the gateway was told another name.
    let grid = Grid::start(|c| c.operator.identity = "operator.b.grid".into(), true).await;
    let url = format!("http://{}/readyz", grid.gw().local_addr());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let body = loop {
        let a = send(&http1_client(), grid_kit::gateway_harness::get(&url)).await;
        let body = String::from_utf8_lossy(&a.body).into_owned();
        if body.contains("the last poll failed") {
            break body;
        }
        assert!(tokio::time::Instant::now() < deadline, "{body}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        body.contains("operator.a.grid") && body.contains("\"operator.b.grid\""),
        "{body}"
    );
    assert!(body.contains("operator.identity"), "{body}");
    grid.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_feedback_post_overlapping_polls_shares_the_one_operator_connection() {
    let grid = Grid::start(|_| {}, true).await;
    grid.measured().await;
    // Every POST is now held well past several polls.
    grid.operator.set_ingest_delay(Duration::from_millis(1_500));
    grid.operator.set(
        "b",
        SiteLoad {
            stamp_offset_ms: 60_000,
            ..SiteLoad::idle()
        },
    );
    grid.until("a bad report", Duration::from_secs(5), |g| {
        g.operator.feedback().iter().any(|f| !f.clean)
    })
    .await;
    // The POST is held; polls keep coming meanwhile.
    let polls = grid.operator.polls();
    grid.until(
        "three polls while the POST is held",
        Duration::from_secs(5),
        |g| g.operator.polls() >= polls + 3,
    )
    .await;
    assert_eq!(grid.operator.connections(), 1);
    grid.until("the held POST answered", Duration::from_secs(5), |g| {
        g.gw().handles().feedback.total_failures() == 0 && g.operator.polls() >= polls + 8
    })
    .await;
    assert_eq!(grid.operator.connections(), 1);
    grid.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_gives_up_a_poll_the_operator_holds_rather_than_wait_out_its_timeout() {
    // The longest poll timeout the configuration takes (60 s), far past the shutdown
    // bound below (10 s): a stop must give up the poll in flight, not wait for it to time
    // out.
    let grid = Grid::start(|c| c.operator.poll_timeout_ms = 60_000, true).await;
    grid.measured().await;
    grid.operator.set_relay_delay(Duration::from_secs(600));
    let asked = grid.operator.polls();
    let start = tokio::time::Instant::now();
    while grid.operator.polls() == asked {
        assert!(
            start.elapsed() < ONE_POLL_WITH_MARGIN,
            "no poll reached the operator"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // A poll is now held by the operator.
    grid.shutdown().await;
}
