//! The official `openai` Python client as a test driver: a client nobody here wrote sends
//! chat completions through whatever proxy a test put in front of the grid (the gateway,
//! Envoy with grid's external processor, Pingora with grid's selection).
//!
//! It runs `grid-gatewayd/tests/clients/openai_requests.py` with the `.venv` that
//! `.ci/install` creates; a missing venv fails the test that asked rather than skipping it.
#![allow(clippy::missing_panics_doc)] // a test harness: every failure is the test's

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

/// One run of the client, imports included, on a loaded 2-core machine.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(90);

/// How long [`openai_requests`]' client waits for one answer (the `openai` client's
/// `timeout`): past it the request fails and so does the run.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Runs the client script `script` of `.venv`'s Python with `args` and `envs` (no
/// `OPENAI_API_KEY` or `OPENAI_BASE_URL` of the caller's), within `limit` (killed and the
/// test failed past it): its whole output.
pub async fn run_client(
    script: PathBuf,
    args: Vec<String>,
    envs: Vec<(String, String)>,
    limit: Duration,
) -> std::process::Output {
    let python = root().join(".venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run `bash .ci/install` to create the venv with the openai package",
        python.display()
    );
    tokio::task::spawn_blocking(move || {
        let mut child = Command::new(python)
            .arg(script)
            .args(args)
            .envs(envs)
            .env_remove("OPENAI_API_KEY")
            .env_remove("OPENAI_BASE_URL")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("python starts");
        let clock = crate::clock::Stopwatch::start();
        while child.try_wait().expect("wait").is_none() {
            if clock.elapsed() > limit {
                let _ = child.kill();
                panic!("the openai client did not finish within {limit:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        child.wait_with_output().expect("output")
    })
    .await
    .expect("the client's thread")
}

/// `count` chat completions for model `llama` to `base_url` (ending in `/v1`), one after
/// another, plain or streamed: one JSON object per request (`status`, `site` from
/// `x-grid-site`, `headroom`, `content`; for a refusal `retry_after`, `code`, `type`).
/// `Err` carries what the client printed on stderr when it failed, a request unanswered
/// within [`REQUEST_TIMEOUT`] among it.
pub async fn openai_requests(
    base_url: String,
    count: usize,
    stream: bool,
) -> Result<Vec<serde_json::Value>, String> {
    let script = root().join("grid-gatewayd/tests/clients/openai_requests.py");
    let mode = if stream { "stream" } else { "plain" };
    let out = run_client(
        script,
        vec![
            base_url,
            count.to_string(),
            mode.to_owned(),
            REQUEST_TIMEOUT.as_secs_f64().to_string(),
        ],
        Vec::new(),
        CLIENT_TIMEOUT,
    )
    .await;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON line per request"))
        .collect())
}

/// How many of `lines` (from [`openai_requests`]) each site answered (`x-grid-site`).
/// Every line must be a 200 with content: a refusal or an empty answer fails the test.
pub fn answered_by(lines: &[serde_json::Value]) -> std::collections::HashMap<String, u64> {
    let mut by = std::collections::HashMap::new();
    for line in lines {
        assert_eq!(line["status"], 200, "{line}");
        assert!(
            line["content"].as_str().is_some_and(|c| !c.is_empty()),
            "an answer with content: {line}"
        );
        let site = line["site"].as_str().expect("x-grid-site on every answer");
        *by.entry(site.to_owned()).or_default() += 1;
    }
    by
}
