//! A client nobody here wrote: the official `openai` Python package drives a streaming and
//! a non-streaming chat completion through the gateway. `.ci/install` creates `.venv` with
//! it; a missing venv fails this test rather than skipping it.

use std::path::PathBuf;
use std::time::Duration;

use grid_kit::gateway_harness::fake_model::{FakeModel, SSE_EVENTS};
use grid_kit::gateway_harness::{Cand, start_gateway};
use grid_kit::openai_client::run_client;

/// The Python client gets this long, imports included.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_python_client_streams_and_completes_through_the_gateway() {
    let up = FakeModel::start("a").await;
    let gw = start_gateway(
        |_| {},
        &[(
            "m",
            vec![Cand {
                site: "a",
                provider: "p",
                base_url: up.base_url(),
            }],
        )],
    )
    .await;
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/clients/openai_chat.py");
    let base_url = gw.url("/v1");

    let out = run_client(
        script,
        Vec::new(),
        vec![("GATEWAY_BASE_URL".to_owned(), base_url)],
        CLIENT_TIMEOUT,
    )
    .await;
    assert!(
        out.status.success(),
        "client failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON line");
    assert_eq!(got["content"], "hello from a");
    assert_eq!(got["site"], "a");
    let stream: Vec<String> = serde_json::from_value(got["stream"].clone()).unwrap();
    let want: Vec<String> = (0..SSE_EVENTS).map(|i| format!("a-{i} ")).collect();
    assert_eq!(stream, want);
    assert_eq!(up.seen().len(), 2);
    gw.shutdown().await;
}
