//! A site cut off by a real partition (its network namespace's link down: packets dropped,
//! no reset): a request the gateway writes on a connection it pooled to that site before
//! the cut is acknowledged by nobody, and must fail over within the connect bound instead
//! of waiting for the header bound while its client gives up.

use std::time::Duration;

use grid_kit::gateway_harness::fake_model::FakeModel;
use grid_kit::gateway_harness::{Cand, http1_client, post, send, series, start_gateway};
use grid_kit::netns::Netns;
use http::StatusCode;
use tokio::time::Instant;

const CHAT: &str = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;

/// The connect bound the test configures; the header bound stays at its 60 s default.
const CONNECT_MS: u64 = 500;

/// What "within the connect bound" allows: the bound, the retry, and scheduling slack,
/// still far below the header bound the request would otherwise wait for.
const WITHIN: Duration = Duration::from_secs(5);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_on_a_pooled_connection_into_a_partition_fails_over_within_the_connect_bound() {
    let ns = Netns::create().expect("root with iproute2, as here and in CI");
    let ip = ns.ns_addr();
    let cut = ns
        .handle()
        .spawn(async move { FakeModel::start_on("c", ip).await })
        .await
        .unwrap();
    let near = FakeModel::start("b").await;
    let cands = vec![
        Cand::at("c", cut.base_url()),
        Cand::at("b", near.base_url()),
    ];
    let gw = start_gateway(|c| c.connect_timeout_ms = CONNECT_MS, &[("m", cands)]).await;
    let client = http1_client();

    // Until c served one: the gateway then holds an idle pooled connection to it.
    for attempt in 0.. {
        assert!(attempt < 40, "site c was never drawn");
        let a = send(&client, post(&gw.url("/v1/chat/completions"), CHAT)).await;
        assert_eq!(a.status, StatusCode::OK, "{:?}", a.body);
        if a.site() == Some("c") {
            break;
        }
    }

    ns.set_link(false).unwrap();
    let unacknowledged =
        r#"grid_gateway_upstream_failures_total{site="c",reason="unacknowledged"}"#;
    for attempt in 0.. {
        assert!(attempt < 40, "site c was never drawn after the cut");
        let started = Instant::now();
        let a = send(&client, post(&gw.url("/v1/chat/completions"), CHAT)).await;
        assert!(started.elapsed() < WITHIN, "{:?}", started.elapsed());
        assert_eq!(a.status, StatusCode::OK, "{:?}", a.body);
        assert_eq!(a.site(), Some("b"), "c is cut off: only b can answer");
        if series(&gw.metrics().await, unacknowledged) > 0 {
            break;
        }
    }
    let text = gw.metrics().await;
    assert!(
        series(
            &text,
            r#"grid_gateway_retries_total{site="b",cause="connect"}"#
        ) >= 1,
        "{text}"
    );
    gw.shutdown().await;
    drop(cut);
}
