//! A client nobody here wrote: the official `openai` Python package drives a streaming and
//! a non-streaming chat completion through the gateway. `.ci/install` creates `.venv` with
//! it; a missing venv fails this test rather than skipping it.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use grid_kit::gateway_harness::fake_model::{FakeModel, SSE_EVENTS};
use grid_kit::gateway_harness::{Cand, start_gateway};

/// The Python client gets this long, imports included.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_python_client_streams_and_completes_through_the_gateway() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let python = root.join(".venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run `bash .ci/install` to create the venv with the openai package",
        python.display()
    );
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

    let out = tokio::task::spawn_blocking(move || {
        let mut child = Command::new(python)
            .arg(script)
            .env("GATEWAY_BASE_URL", base_url)
            .env_remove("OPENAI_API_KEY")
            .env_remove("OPENAI_BASE_URL")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("python starts");
        let deadline = grid_gatewayd::clock::monotonic() + CLIENT_TIMEOUT;
        while child.try_wait().expect("wait").is_none() {
            if grid_gatewayd::clock::monotonic() > deadline {
                let _ = child.kill();
                panic!("the openai client did not finish within {CLIENT_TIMEOUT:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        child.wait_with_output().expect("output")
    })
    .await
    .unwrap();
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
