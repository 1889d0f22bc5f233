//! `GET /v1/grid/routing` and `grid-gatewayd status`: why requests go where they go, as
//! the gateway's own view says it, for a person and for a program.

use std::time::Duration;

use grid_daemon::evidence::{CandidateRouting, Document, GatewayRouting};
use grid_kit::gateway_harness::fake_model::FakeModel;
use grid_kit::gateway_harness::{
    Cand, Harness, closed_port_url, get, http1_client, one, post, send, start_gateway,
};
use http::StatusCode;

async fn evidence(gw: &Harness, query: &str) -> GatewayRouting {
    let a = send(
        &http1_client(),
        get(&gw.url(&format!("/v1/grid/routing{query}"))),
    )
    .await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.headers["content-type"], "application/json");
    match Document::parse(&a.body).expect("a routing document") {
        Document::Gateway(g) => g,
        Document::Operator(_) => panic!("an operator's document from a gateway"),
    }
}

fn chat() -> String {
    r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#.to_owned()
}

fn at<'g>(g: &'g GatewayRouting, site: &str) -> &'g CandidateRouting {
    g.models[0]
        .candidates
        .iter()
        .find(|c| c.site == site)
        .unwrap_or_else(|| panic!("{site} in {g:?}"))
}

/// Polls the evidence until `done` holds (at most 10 s).
async fn until(gw: &Harness, what: &str, done: impl Fn(&GatewayRouting) -> bool) -> GatewayRouting {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let g = evidence(gw, "").await;
        if done(&g) {
            return g;
        }
        assert!(tokio::time::Instant::now() < deadline, "{what}: {g:#?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn the_evidence_names_each_candidate_its_standing_its_next_share_and_its_recent_picks() {
    let (site_a, site_b) = (FakeModel::start("a").await, FakeModel::start("b").await);
    let gw = start_gateway(
        |_| {},
        &[(
            "m",
            vec![
                Cand::at("a", site_a.base_url()),
                Cand::at("b", site_b.base_url()),
            ],
        )],
    )
    .await;
    let c = http1_client();
    for _ in 0..20 {
        assert_eq!(
            send(&c, post(&gw.url("/v1/chat/completions"), chat()))
                .await
                .status,
            StatusCode::OK
        );
    }
    // The operator never answers (a closed port): both sites are unmeasured, routed by
    // capacity, and the twenty picks show once a refresh has counted them.
    let g = until(&gw, "the picks are counted", |g| {
        g.models[0]
            .candidates
            .iter()
            .map(|c| c.recent.picks)
            .sum::<u64>()
            == 20
    })
    .await;
    assert_eq!((g.daemon.as_str(), g.site.as_str()), ("gateway", "a"));
    assert!(g.operator.last_failure.is_some(), "{g:?}");
    let m = &g.models[0];
    assert_eq!(
        (m.name.as_str(), m.state.as_str()),
        ("m", "without_signals")
    );
    assert_eq!(m.path.as_deref(), Some("fallback"));
    let next: f64 = m.candidates.iter().map(|c| c.next_share).sum();
    assert!((next - 1.0).abs() < 1e-9, "{m:?}");
    let shares: f64 = m.candidates.iter().filter_map(|c| c.recent.share).sum();
    assert!((shares - 1.0).abs() < 1e-9, "{m:?}");
    for c in &m.candidates {
        assert_eq!(c.standing, "unmeasured");
        assert!(c.excluded.is_none() && c.rho.is_none() && c.capacity >= 1.0);
    }
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_site_that_keeps_failing_is_shown_excluded_as_ejected_until_when_with_its_retries() {
    let a = FakeModel::start("a").await;
    let gw = start_gateway(
        |_| {},
        &[(
            "m",
            vec![
                Cand::at("a", a.base_url()),
                Cand::at("b", closed_port_url()),
            ],
        )],
    )
    .await;
    let c = http1_client();
    // b refuses every connection: each request that picks it goes to a instead, until
    // five in a row eject it.
    let g = {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            // Answered by a, directly or retried there (or 502 past the retry budget).
            let _ = send(&c, post(&gw.url("/v1/chat/completions"), chat())).await;
            let g = evidence(&gw, "").await;
            if at(&g, "b").excluded.is_some() {
                break g;
            }
            assert!(tokio::time::Instant::now() < deadline, "{g:#?}");
        }
    };
    let b = at(&g, "b");
    let out = b.excluded.as_ref().unwrap();
    assert_eq!(
        (b.standing.as_str(), out.reason.as_str()),
        ("excluded", "ejected")
    );
    assert!(
        out.until_ms > out.since_ms && out.until_ms.is_some(),
        "{out:?}"
    );
    assert!(b.next_share.abs() < f64::EPSILON);
    let g = until(&gw, "the failures are counted", |g| {
        at(g, "b").recent.failed >= 5 && at(g, "a").recent.retried_here >= 5
    })
    .await;
    assert_eq!(
        at(&g, "b").recent.retried_away,
        at(&g, "a").recent.retried_here
    );
    assert!((at(&g, "a").next_share - 1.0).abs() < 1e-9);

    // The command a person runs says the same, as a table without colour off a terminal,
    // and passes the document through with --json.
    let exe = env!("CARGO_BIN_EXE_grid-gatewayd");
    let base = gw.url("");
    let table = std::process::Command::new(exe)
        .args(["status", "--url", base.trim_end_matches('/')])
        .output()
        .unwrap();
    assert!(table.status.success(), "{table:?}");
    let text = String::from_utf8(table.stdout).unwrap();
    assert!(text.contains("excluded: ejected"), "{text}");
    assert!(
        text.contains("model m: routed_by_load") || text.contains("model m: without_signals"),
        "{text}"
    );
    assert!(!text.contains('\x1b'), "{text}");
    let json = std::process::Command::new(exe)
        .args(["status", "--json", "--url", base.trim_end_matches('/')])
        .output()
        .unwrap();
    assert!(json.status.success(), "{json:?}");
    assert!(matches!(
        Document::parse(&json.stdout),
        Ok(Document::Gateway(_))
    ));
    gw.shutdown().await;
}

#[tokio::test]
async fn one_model_is_asked_for_by_name_and_the_document_lists_at_most_its_cap() {
    use grid_daemon::evidence::MAX_MODELS;
    let a = FakeModel::start("a").await;
    let names: Vec<String> = (0..=MAX_MODELS).map(|i| format!("m{i}")).collect();
    let models: Vec<(&str, Vec<Cand<'_>>)> = names
        .iter()
        .map(|n| (n.as_str(), one("a", a.base_url())))
        .collect();
    let gw = start_gateway(|_| {}, &models).await;
    let all = evidence(&gw, "").await;
    assert_eq!((all.models.len(), all.models_left_out), (MAX_MODELS, 1));
    let last = format!("?model=m{MAX_MODELS}");
    let one_model = evidence(&gw, &last).await;
    assert_eq!(one_model.models.len(), 1);
    assert_eq!(one_model.models[0].name, format!("m{MAX_MODELS}"));
    assert!(evidence(&gw, "?model=nope").await.models.is_empty());
    gw.shutdown().await;
}

#[tokio::test]
async fn status_of_a_closed_port_fails_saying_what_it_read() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_grid-gatewayd"))
        .args(["status", "--url", &closed_port_url()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/v1/grid/routing"), "{err}");
}
