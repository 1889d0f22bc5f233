//! The real gateway process under SIGTERM: a stream in flight is finished, not cut, and
//! the process exits 0. A supervisor (Kubernetes, systemd) stops a daemon with SIGTERM;
//! without a handler the default action kills it mid-answer.

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use grid_kit::daemon_process::{Daemon, log_field};
use grid_kit::gateway_harness::fake_model::{FakeModel, SSE_EVENTS};
use grid_kit::gateway_harness::{http1_client, post};
use grid_kit::operator_harness::{Grid, Site};
use http_body_util::BodyExt as _;

/// A gateway config file of site `a` routing model `m` to `model_url`; its operator is a
/// closed port. The site (its certificates and directory) lives as long as the test.
fn write_config(site: &Site, model_url: &str) -> std::path::PathBuf {
    write_config_with(site, model_url, "")
}

/// [`write_config`] with `extra` TOML appended (more models).
fn write_config_with(site: &Site, model_url: &str, extra: &str) -> std::path::PathBuf {
    let text = site.gateway_text(("127.0.0.1:0", 9, 1.0), ("m", "p", model_url)) + extra;
    let path = site.dir.path().join("gateway.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// The real gateway started on `config`, once it serves, and the address it serves at.
fn spawn_gateway(config: &Path) -> (Daemon, String) {
    let mut gw = Daemon::spawn(
        Path::new(env!("CARGO_BIN_EXE_grid-gatewayd")),
        &["--config", config.to_str().unwrap()],
    );
    let line = gw.wait_for_line("gateway serving", Duration::from_secs(20));
    assert!(
        !line.contains('\u{1b}'),
        "no ANSI codes on a pipe: {line:?}"
    );
    let addr = log_field(&line, "local_addr").expect("the address is logged");
    let addr = addr.to_owned();
    (gw, addr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_a_stream_in_flight_finish_and_exits_zero() {
    let site = Grid::new().site("a");
    let model = FakeModel::start("a").await;
    let config = write_config(&site, &model.base_url());
    let (mut gw, addr) = spawn_gateway(&config);
    let body = r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    let resp = tokio::time::timeout(
        Duration::from_secs(10),
        http1_client().request(post(&format!("http://{addr}/v1/chat/completions"), body)),
    )
    .await
    .expect("answer head in time")
    .expect("answer head");
    let mut body = resp.into_body();
    let mut text = Vec::new();
    let first = tokio::time::timeout(Duration::from_secs(10), body.frame())
        .await
        .expect("first event in time")
        .expect("a first frame")
        .expect("a good frame");
    text.extend_from_slice(first.data_ref().map_or(&[][..], Bytes::as_ref));
    gw.signal("TERM");
    let rest = tokio::time::timeout(Duration::from_secs(20), body.collect())
        .await
        .expect("the stream ends in time")
        .expect("the stream is not cut");
    text.extend_from_slice(&rest.to_bytes());
    let text = String::from_utf8(text).unwrap();
    assert_eq!(
        text.matches("chat.completion.chunk").count(),
        SSE_EVENTS,
        "{text}"
    );
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    let status = gw.wait_exit(Duration::from_secs(40)).expect("it exits");
    assert!(status.success(), "{status:?}\n{}", gw.seen.join("\n"));
}

#[test]
fn without_config_the_gateway_refuses_to_start_and_says_why() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_grid-gatewayd"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--config"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_the_models_and_a_bad_file_keeps_the_running_ones() {
    let site = Grid::new().site("a");
    let model = FakeModel::start("a").await;
    let config = write_config(&site, &model.base_url());
    let (mut gw, addr) = spawn_gateway(&config);
    let url = format!("http://{addr}/v1/chat/completions");
    let n = r#"{"model":"n","messages":[{"role":"user","content":"hi"}]}"#;
    let c = http1_client();
    let ask = || async {
        grid_kit::gateway_harness::send(&c, post(&url, n))
            .await
            .status
    };
    assert_eq!(ask().await, 404);
    // A file that does not parse is refused and changes nothing.
    std::fs::write(&config, "not toml [").unwrap();
    gw.signal("HUP");
    gw.wait_for_line("reload refused", Duration::from_secs(10));
    assert_eq!(ask().await, 404);
    let more = format!(
        "[[models]]\nname = \"n\"\n[[models.candidates]]\nsite = \"a\"\nprovider = \"p\"\nbaseUrl = \"{}\"\n",
        model.base_url()
    );
    write_config_with(&site, &model.base_url(), &more);
    gw.signal("HUP");
    gw.wait_for_line("models reloaded", Duration::from_secs(10));
    let start = tokio::time::Instant::now();
    while ask().await != 200 {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "model n routes after SIGHUP"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    gw.signal("TERM");
    assert!(
        gw.wait_exit(Duration::from_secs(40))
            .expect("it exits")
            .success()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigterm_or_sighup_the_moment_the_gateway_serves_finds_its_handler() {
    let site = Grid::new().site("a");
    let model = FakeModel::start("a").await;
    let config = write_config(&site, &model.base_url());
    // A few rounds: each signal is sent right as the serving line is read, inside the
    // window a handler installed after start would leave to the default action.
    for _ in 0..3 {
        let (mut gw, _) = spawn_gateway(&config);
        gw.signal("HUP");
        gw.signal("TERM");
        let status = gw.wait_exit(Duration::from_secs(20)).expect("it exits");
        assert!(
            status.success(),
            "{status:?} (killed by the signal's default action?)\n{}",
            gw.seen.join("\n")
        );
    }
}
