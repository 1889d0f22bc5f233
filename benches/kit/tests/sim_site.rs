//! The simulated site on loopback: OpenAI-compatible answers that really queue and take
//! their service time, `/metrics` that the real parser and tracker read as the model's
//! live state, the control handle, and a clean stop. Every wait is bounded.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use grid_kit::load::{LoadClient, Protocol, chat_body, keep_sending};
use grid_kit::sim_site::{
    CapacityReaderMode, MAX_REQUEST_BODY_BYTES, Rejection, SimSite, SimSiteConfig, SimSiteControl,
};
use grid_kit::sim_site::{
    FLOW_BAND_HEADROOM_HEADER, FLOW_QUEUE_DURATION_HEADER, PRIORITY_HEADER,
    REQUEST_DROPPED_REASON_HEADER,
};
use grid_signals::epp::{
    PoolSelector, ProviderConfig, ProviderTracker, ReadyStatus, ScrapeInput, ScrapeTiming,
};
use grid_signals::exposition::parse_strict;
use grid_sim::fake_epp::EppIdentity;
use grid_sim::site_model::{BandConfig, Priority, ServiceTime, SiteConfig};
use http::{HeaderMap, Method, Request, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::time::{Instant, sleep, timeout};

const BOUND: Duration = Duration::from_secs(10);
const SERVICE_MS: u64 = 300;

fn config(endpoints: usize, slots: usize) -> SimSiteConfig {
    let mut site = SiteConfig::new("site-a", endpoints, slots);
    site.service = ServiceTime {
        median_ms: SERVICE_MS as f64,
        sigma: 0.0,
        prefill_share: 0.2,
        output_tokens: 8,
    };
    SimSiteConfig {
        site,
        identity: EppIdentity::new("pool-a", "llama"),
        seed: 7,
        spoof_flow_headers: false,
        capacity_reader: CapacityReaderMode::Live,
    }
}

struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    /// Each data frame as it arrived.
    frames: Vec<Bytes>,
}

impl Answer {
    fn text(&self) -> String {
        self.frames
            .iter()
            .map(|f| String::from_utf8_lossy(f).into_owned())
            .collect()
    }

    fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.text()).expect("JSON body")
    }
}

async fn send(addr: SocketAddr, method: Method, path: &str, body: Vec<u8>) -> Answer {
    send_with(addr, method, path, body, &[]).await
}

async fn send_with(
    addr: SocketAddr,
    method: Method,
    path: &str,
    body: Vec<u8>,
    headers: &[(&str, &str)],
) -> Answer {
    let stream = TcpStream::connect(addr).await.expect("connect");
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(conn);
    let mut request = Request::builder()
        .method(method)
        .uri(path)
        .header(header::HOST, "127.0.0.1")
        .header(header::CONTENT_TYPE, "application/json");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request.body(Full::new(Bytes::from(body))).expect("request");
    let response = sender.send_request(request).await.expect("response");
    let status = response.status();
    let headers = response.headers().clone();
    let mut body = response.into_body();
    let mut frames = Vec::new();
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.expect("frame").into_data() {
            frames.push(data);
        }
    }
    Answer {
        status,
        headers,
        frames,
    }
}

async fn post(addr: SocketAddr, path: &str, body: &str) -> Answer {
    send(addr, Method::POST, path, body.as_bytes().to_vec()).await
}

/// Polls the control until `check` holds (bounded).
async fn until(control: &SimSiteControl, check: impl Fn(&SimSiteControl) -> bool) {
    let deadline = Instant::now() + BOUND;
    while !check(control) {
        assert!(Instant::now() < deadline, "condition not reached");
        sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn models_lists_the_one_model_served() {
    let site = SimSite::start(config(1, 1)).await.unwrap();
    let answer = timeout(BOUND, send(site.addr(), Method::GET, "/v1/models", vec![]))
        .await
        .unwrap();
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.json()["data"][0]["id"], "llama");
    site.stop().await;
}

#[tokio::test]
async fn a_second_request_on_a_one_slot_site_waits_for_the_first() {
    let site = SimSite::start(config(1, 1)).await.unwrap();
    let control = site.control();
    let addr = site.addr();
    let begun = Instant::now();
    let body = r#"{"model":"llama","messages":[{"role":"user","content":"hi"}]}"#;
    let first = tokio::spawn(async move { post(addr, "/v1/chat/completions", body).await });
    let second = tokio::spawn(async move { post(addr, "/v1/chat/completions", body).await });
    until(&control, |c| {
        let s = c.stats();
        s.running == 1 && s.waiting == 1
    })
    .await;
    let (a, b) = timeout(BOUND, async {
        (first.await.unwrap(), second.await.unwrap())
    })
    .await
    .unwrap();
    let elapsed = begun.elapsed();
    for answer in [&a, &b] {
        assert_eq!(answer.status, StatusCode::OK);
        let json = answer.json();
        assert_eq!(json["object"], "chat.completion");
        assert_eq!(json["choices"][0]["finish_reason"], "stop");
        assert_eq!(answer.headers["x-sim-endpoint"], "site-a-ep-0");
    }
    assert!(
        elapsed >= Duration::from_millis(2 * SERVICE_MS),
        "two {SERVICE_MS} ms requests through one slot took {elapsed:?}"
    );
    let stats = control.stats();
    assert_eq!((stats.requests, stats.running, stats.waiting), (2, 0, 0));
    site.stop().await;
}

#[tokio::test]
async fn a_streamed_answer_is_server_sent_events_ending_in_done() {
    let site = SimSite::start(config(1, 1)).await.unwrap();
    for (path, object) in [
        ("/v1/chat/completions", "chat.completion.chunk"),
        ("/v1/completions", "text_completion"),
    ] {
        let answer = timeout(
            BOUND,
            post(site.addr(), path, r#"{"model":"llama","stream":true}"#),
        )
        .await
        .unwrap();
        assert_eq!(answer.status, StatusCode::OK);
        assert_eq!(answer.headers[header::CONTENT_TYPE], "text/event-stream");
        assert!(answer.frames.len() > 1, "chunks arrive separately");
        let text = answer.text();
        let events: Vec<&str> = text.split("\n\n").filter(|e| !e.is_empty()).collect();
        assert_eq!(events.last(), Some(&"data: [DONE]"));
        let chunks = &events[..events.len() - 1];
        assert_eq!(chunks.len(), 9, "8 words and the finishing chunk");
        for chunk in chunks {
            let json: serde_json::Value =
                serde_json::from_str(chunk.strip_prefix("data: ").unwrap()).unwrap();
            assert_eq!(json["object"], object);
        }
        assert!(chunks.last().unwrap().contains(r#""finish_reason":"stop""#));
    }
    site.stop().await;
}

#[tokio::test]
async fn embeddings_answer_without_streaming() {
    let site = SimSite::start(config(1, 1)).await.unwrap();
    let answer = timeout(
        BOUND,
        post(
            site.addr(),
            "/v1/embeddings",
            r#"{"model":"llama","input":"x","stream":true}"#,
        ),
    )
    .await
    .unwrap();
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.json()["data"][0]["object"], "embedding");
    site.stop().await;
}

#[tokio::test]
async fn metrics_report_the_live_state_through_the_real_parser_and_tracker() {
    let site = SimSite::start(config(2, 1)).await.unwrap();
    let control = site.control();
    let addr = site.addr();
    let mut waiting = Vec::new();
    for _ in 0..3 {
        waiting.push(tokio::spawn(async move {
            post(addr, "/v1/completions", r#"{"prompt":"x"}"#).await
        }));
    }
    until(&control, |c| {
        let s = c.stats();
        s.running + s.waiting == 3
    })
    .await;
    let scrape = timeout(BOUND, send(addr, Method::GET, "/metrics", vec![]))
        .await
        .unwrap();
    assert_eq!(scrape.status, StatusCode::OK);
    assert!(
        scrape.headers[header::CONTENT_TYPE]
            .to_str()
            .unwrap()
            .starts_with("text/plain")
    );
    let body = scrape.frames.concat();
    let samples = parse_strict(&body).expect("strict parse");
    let mut tracker = ProviderTracker::new(
        ProviderConfig {
            site: "site-a".into(),
            provider: "llama".into(),
            pool: PoolSelector::Named("pool-a".into()),
        },
        0,
    );
    let summary = tracker.handle(1_000, ScrapeInput::Parsed(&samples));
    assert_eq!(summary.rejected.total(), 0);
    let window = ScrapeTiming {
        interval_ms: 1_000,
        stale_metrics_ms: None,
        signal_ttl_ms: 20_000,
    }
    .window(0);
    assert_eq!(tracker.readiness(1_000, window).status, ReadyStatus::Ready);
    let in_flight = tracker.in_flight(1_000, window).expect("in-flight");
    assert!(
        (in_flight.value - 3.0).abs() < f64::EPSILON,
        "{in_flight:?}"
    );
    let held = tracker.held(1_000, window).unwrap().1;
    assert_eq!(held.ready_endpoints, Some(2.0));
    assert!((held.per_endpoint_queue.values().sum::<f64>() - 1.0).abs() < f64::EPSILON);
    for answer in waiting {
        assert_eq!(
            timeout(BOUND, answer).await.unwrap().unwrap().status,
            StatusCode::OK
        );
    }
    site.stop().await;
}

#[tokio::test]
async fn dropping_every_endpoint_fails_work_and_restoring_serves_again() {
    let site = SimSite::start(config(1, 1)).await.unwrap();
    let control = site.control();
    let addr = site.addr();
    let running =
        tokio::spawn(async move { post(addr, "/v1/chat/completions", r#"{"stream":true}"#).await });
    until(&control, |c| c.stats().running == 1).await;
    control.drop_all_endpoints();
    let cut = timeout(BOUND, running).await.unwrap().unwrap();
    assert_eq!(cut.status, StatusCode::OK, "headers were already sent");
    assert!(cut.text().contains("endpoint_removed"), "{}", cut.text());
    assert!(!cut.text().contains("[DONE]"));

    let refused = timeout(BOUND, post(addr, "/v1/chat/completions", "{}"))
        .await
        .unwrap();
    assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(control.rejections(Rejection::NoReadyEndpoint), 1);
    assert_eq!(control.rejections(Rejection::EndpointRemoved), 1);
    let text = control.metrics();
    assert!(
        String::from_utf8_lossy(&text).contains("llm_d_epp_ready_endpoints{name=\"pool-a\"} 0")
    );

    control.restore();
    let served = timeout(BOUND, post(addr, "/v1/chat/completions", "{}"))
        .await
        .unwrap();
    assert_eq!(served.status, StatusCode::OK);
    site.stop().await;
}

#[tokio::test]
async fn a_degraded_site_takes_longer_per_request() {
    let site = SimSite::start(config(1, 1)).await.unwrap();
    let control = site.control();
    control.degrade(3.0).unwrap();
    assert!(control.degrade(0.0).is_err());
    let begun = Instant::now();
    let answer = timeout(BOUND, post(site.addr(), "/v1/completions", "{}"))
        .await
        .unwrap();
    assert_eq!(answer.status, StatusCode::OK);
    assert!(begun.elapsed() >= Duration::from_millis(3 * SERVICE_MS));
    assert!((control.stats().degrade - 3.0).abs() < f64::EPSILON);
    control.restore();
    assert!((control.stats().degrade - 1.0).abs() < f64::EPSILON);
    site.stop().await;
}

#[tokio::test]
async fn a_client_that_goes_away_frees_its_slot() {
    let site = SimSite::start(config(1, 1)).await.unwrap();
    let control = site.control();
    let addr = site.addr();
    let abandoned =
        tokio::spawn(async move { post(addr, "/v1/chat/completions", r#"{"stream":true}"#).await });
    until(&control, |c| c.stats().running == 1).await;
    abandoned.abort();
    until(&control, |c| c.stats().running == 0).await;
    assert_eq!(control.stats().requests, 0, "never completed");
    site.stop().await;
}

#[tokio::test]
async fn bad_requests_are_refused_with_their_reason() {
    let site = SimSite::start(config(1, 1)).await.unwrap();
    let control = site.control();
    let addr = site.addr();
    let cases: [(Method, &str, &str, StatusCode, Rejection); 4] = [
        (
            Method::GET,
            "/nope",
            "",
            StatusCode::NOT_FOUND,
            Rejection::NotFound,
        ),
        (
            Method::GET,
            "/v1/chat/completions",
            "",
            StatusCode::METHOD_NOT_ALLOWED,
            Rejection::MethodNotAllowed,
        ),
        (
            Method::POST,
            "/v1/chat/completions",
            "{not json",
            StatusCode::BAD_REQUEST,
            Rejection::InvalidJson,
        ),
        (
            Method::POST,
            "/v1/chat/completions",
            r#"{"model":"other"}"#,
            StatusCode::NOT_FOUND,
            Rejection::UnknownModel,
        ),
    ];
    for (method, path, body, status, reason) in cases {
        let answer = timeout(BOUND, send(addr, method, path, body.as_bytes().to_vec()))
            .await
            .unwrap();
        assert_eq!(answer.status, status, "{path} {body}");
        assert_eq!(control.rejections(reason), 1, "{}", reason.as_str());
    }
    site.stop().await;
}

#[tokio::test]
async fn a_body_exactly_at_the_cap_is_read_and_one_byte_more_is_refused() {
    let site = SimSite::start(config(1, 1)).await.unwrap();
    let control = site.control();
    let padded = |len: usize| {
        let mut body = b"{}".to_vec();
        body.resize(len, b' ');
        body
    };
    let at = timeout(
        BOUND,
        send(
            site.addr(),
            Method::POST,
            "/v1/completions",
            padded(MAX_REQUEST_BODY_BYTES),
        ),
    )
    .await
    .unwrap();
    assert_eq!(at.status, StatusCode::OK);
    let past = timeout(
        BOUND,
        send(
            site.addr(),
            Method::POST,
            "/v1/completions",
            padded(MAX_REQUEST_BODY_BYTES + 1),
        ),
    )
    .await
    .unwrap();
    assert_eq!(past.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(control.rejections(Rejection::BodyTooLarge), 1);
    site.stop().await;
}

#[tokio::test]
async fn a_stopped_site_refuses_connections() {
    let site = SimSite::start(config(1, 1)).await.unwrap();
    let addr = site.addr();
    timeout(BOUND, site.stop())
        .await
        .expect("stops within bound");
    let connect = timeout(BOUND, TcpStream::connect(addr)).await.unwrap();
    assert!(connect.is_err(), "nothing listens after stop");
}

// Flow-control bands and the headers the EPP layer owns: a band's headroom is read when
// the answer's head is built, for the band that actually admitted the request, and a copy
// the model server put on its answer never passes.

const PLAIN: &str = r#"{"model":"llama","prompt":"x"}"#;
const STREAMED: &str = r#"{"model":"llama","prompt":"x","stream":true}"#;

/// One endpoint with one slot and no endpoint queue under flow control, so every request
/// beyond the running one waits in its band.
fn gated(bands: &[(Priority, Option<usize>)]) -> SimSiteConfig {
    let mut c = config(1, 1);
    c.site.queue_per_endpoint = Some(0);
    c.site.bands = bands
        .iter()
        .map(|&(priority, capacity)| BandConfig { priority, capacity })
        .collect();
    c
}

/// Posts a completion asking for band `priority` in the background.
fn post_at(
    addr: SocketAddr,
    body: &'static str,
    priority: Priority,
) -> tokio::task::JoinHandle<Answer> {
    tokio::spawn(async move {
        let priority = priority.to_string();
        let headers = [(PRIORITY_HEADER, priority.as_str())];
        send_with(
            addr,
            Method::POST,
            "/v1/completions",
            body.as_bytes().to_vec(),
            &headers,
        )
        .await
    })
}

async fn answer(task: tokio::task::JoinHandle<Answer>) -> Answer {
    timeout(BOUND, task)
        .await
        .expect("answered in time")
        .expect("task")
}

fn header_value<'a>(answer: &'a Answer, name: &str) -> Option<&'a str> {
    let mut values = answer.headers.get_all(name).iter();
    let value = values.next().map(|v| v.to_str().expect("ASCII"));
    assert!(values.next().is_none(), "{name} sent once at most");
    value
}

fn headroom(answer: &Answer) -> Option<&str> {
    header_value(answer, FLOW_BAND_HEADROOM_HEADER)
}

fn queued_ms(answer: &Answer) -> Option<u64> {
    header_value(answer, FLOW_QUEUE_DURATION_HEADER).map(|v| v.parse().expect("ms"))
}

fn dropped(answer: &Answer) -> Option<&str> {
    header_value(answer, REQUEST_DROPPED_REASON_HEADER)
}

/// How many times its service time the first request of a band test runs: long enough
/// that the requests a test queues behind it surely arrive while it runs.
const LONG_FACTOR: f64 = 4.0;

/// Starts a plain request asking for band `priority` that runs [`LONG_FACTOR`] times the
/// service time, and returns once it runs; requests after it run at the normal speed.
async fn start_long(
    control: &SimSiteControl,
    addr: SocketAddr,
    priority: Priority,
) -> tokio::task::JoinHandle<Answer> {
    control.degrade(LONG_FACTOR).unwrap();
    let task = post_at(addr, PLAIN, priority);
    until(control, |c| c.stats().running == 1).await;
    control.degrade(1.0).unwrap();
    task
}

/// Waits until `held` requests wait in band `priority`.
async fn until_held(control: &SimSiteControl, priority: Priority, held: usize) {
    until(control, |c| {
        c.band_snapshot(priority).is_some_and(|b| b.len == held)
    })
    .await;
}

#[tokio::test]
async fn a_request_dispatched_at_once_reports_its_band_headroom_and_no_queueing() {
    let site = SimSite::start(gated(&[(0, Some(10))])).await.unwrap();
    for body in [PLAIN, STREAMED] {
        let a = answer(post_at(site.addr(), body, 0)).await;
        assert_eq!(a.status, StatusCode::OK);
        assert_eq!(headroom(&a), Some("10"), "{body}");
        assert_eq!(queued_ms(&a), Some(0), "{body}");
        assert_eq!(dropped(&a), None);
    }
    site.stop().await;
}

#[tokio::test]
async fn a_held_request_reports_how_long_it_waited_in_flow_control() {
    let site = SimSite::start(gated(&[])).await.unwrap();
    let control = site.control();
    let first = start_long(&control, site.addr(), 0).await;
    let second = post_at(site.addr(), PLAIN, 0);
    until_held(&control, 0, 1).await;
    let (first, second) = (answer(first).await, answer(second).await);
    assert_eq!(queued_ms(&first), Some(0));
    let waited = queued_ms(&second).expect("queue duration");
    let longest = (SERVICE_MS as f64 * LONG_FACTOR) as u64;
    assert!(
        (1..=longest).contains(&waited),
        "held behind one {longest} ms request: {waited} ms"
    );
    site.stop().await;
}

#[tokio::test]
async fn a_request_for_an_unprovisioned_band_reports_band_0_even_after_that_band_is_provisioned() {
    let site = SimSite::start(gated(&[(0, Some(4))])).await.unwrap();
    let control = site.control();
    let fell_back = start_long(&control, site.addr(), 5).await;
    // The control plane provisions band 5 while the request runs.
    control.set_band(5, Some(50)).unwrap();
    let behind: Vec<_> = (0..2).map(|_| post_at(site.addr(), PLAIN, 0)).collect();
    until_held(&control, 0, 2).await;
    let a = answer(fell_back).await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(
        headroom(&a),
        Some("3"),
        "band 0: capacity 4, one still held when the answer is built; band 5 would say 50"
    );
    for task in behind {
        assert_eq!(answer(task).await.status, StatusCode::OK);
    }
    site.stop().await;
}

#[tokio::test]
async fn a_full_band_refuses_with_429_rejected_saturated_and_an_over_capacity_band_reports_0() {
    let site = SimSite::start(gated(&[(0, Some(3))])).await.unwrap();
    let control = site.control();
    let running = start_long(&control, site.addr(), 0).await;
    let held: Vec<_> = (0..3).map(|_| post_at(site.addr(), PLAIN, 0)).collect();
    until_held(&control, 0, 3).await;

    let refused = answer(post_at(site.addr(), PLAIN, 0)).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(dropped(&refused), Some("rejected-saturated"));
    assert_eq!((headroom(&refused), queued_ms(&refused)), (None, None));
    assert_eq!(control.rejections(Rejection::Saturated), 1);

    // Lowered below what it holds: 2 held against 1 when the running answer is built.
    control.set_band(0, Some(1)).unwrap();
    let a = answer(running).await;
    assert_eq!(headroom(&a), Some("0"), "clamped, not negative");
    for task in held {
        assert_eq!(answer(task).await.status, StatusCode::OK);
    }
    site.stop().await;
}

#[tokio::test]
async fn an_unbounded_band_sends_no_headroom_but_still_the_queue_duration() {
    let site = SimSite::start(gated(&[])).await.unwrap();
    let a = answer(post_at(site.addr(), PLAIN, 0)).await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(headroom(&a), None);
    assert_eq!(queued_ms(&a), Some(0));
    site.stop().await;
}

#[tokio::test]
async fn a_request_whose_band_was_removed_before_its_answer_sends_no_headroom() {
    let site = SimSite::start(gated(&[(5, Some(4))])).await.unwrap();
    let control = site.control();
    let task = start_long(&control, site.addr(), 5).await;
    control.remove_band(5).unwrap();
    let a = answer(task).await;
    assert_eq!(
        a.status,
        StatusCode::OK,
        "a missing band never fails the request"
    );
    assert_eq!(headroom(&a), None);
    assert_eq!(queued_ms(&a), Some(0));
    site.stop().await;
}

#[tokio::test]
async fn a_failing_or_absent_capacity_reader_leaves_the_headroom_out_and_the_answer_served() {
    let mut c = gated(&[(0, Some(4))]);
    c.capacity_reader = CapacityReaderMode::Failing;
    let site = SimSite::start(c).await.unwrap();
    let control = site.control();
    for mode in [CapacityReaderMode::Failing, CapacityReaderMode::Absent] {
        control.set_capacity_reader(mode);
        let a = answer(post_at(site.addr(), PLAIN, 0)).await;
        assert_eq!(a.status, StatusCode::OK, "{mode:?}");
        assert_eq!(headroom(&a), None, "{mode:?}");
        assert_eq!(queued_ms(&a), Some(0), "{mode:?}");
    }
    control.set_capacity_reader(CapacityReaderMode::Live);
    let a = answer(post_at(site.addr(), PLAIN, 0)).await;
    assert_eq!(headroom(&a), Some("4"));
    site.stop().await;
}

#[tokio::test]
async fn requests_flow_control_did_not_admit_carry_no_headroom_and_dropped_ones_say_why() {
    // Flow control off: nothing passes a band, whatever the band registry holds.
    let mut off = config(1, 1);
    off.site.bands = vec![BandConfig {
        priority: 0,
        capacity: Some(4),
    }];
    let site = SimSite::start(off).await.unwrap();
    let a = answer(post_at(site.addr(), PLAIN, 0)).await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(
        (headroom(&a), queued_ms(&a), dropped(&a)),
        (None, None, None)
    );
    site.stop().await;

    // Expired while held, and refused with no endpoint up.
    let mut c = gated(&[(0, Some(4))]);
    c.site.flow_ttl_ms = Some(SERVICE_MS / 3);
    let site = SimSite::start(c).await.unwrap();
    let control = site.control();
    let running = start_long(&control, site.addr(), 0).await;
    let expired = answer(post_at(site.addr(), PLAIN, 0)).await;
    assert_eq!(expired.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(dropped(&expired), Some("rejected-ttl-expired"));
    assert_eq!((headroom(&expired), queued_ms(&expired)), (None, None));
    assert_eq!(answer(running).await.status, StatusCode::OK);
    control.drop_all_endpoints();
    let refused = answer(post_at(site.addr(), PLAIN, 0)).await;
    assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(dropped(&refused), Some("rejected-no-endpoints"));
    assert_eq!(headroom(&refused), None);

    let not_a_number = timeout(
        BOUND,
        send_with(
            site.addr(),
            Method::POST,
            "/v1/completions",
            PLAIN.as_bytes().to_vec(),
            &[(PRIORITY_HEADER, "high")],
        ),
    )
    .await
    .unwrap();
    assert_eq!(not_a_number.status, StatusCode::BAD_REQUEST);
    assert_eq!(control.rejections(Rejection::InvalidPriority), 1);
    site.stop().await;
}

#[tokio::test]
async fn flow_headers_the_model_server_spoofs_are_removed_or_replaced_by_the_epp() {
    let mut bounded = gated(&[(0, Some(6))]);
    bounded.spoof_flow_headers = true;
    let mut off = config(1, 1);
    off.spoof_flow_headers = true;
    for (c, expected) in [(bounded, Some("6")), (off, None)] {
        let site = SimSite::start(c).await.unwrap();
        for body in [PLAIN, STREAMED] {
            let a = answer(post_at(site.addr(), body, 0)).await;
            assert_eq!(a.status, StatusCode::OK);
            assert_eq!(headroom(&a), expected, "{body}");
            assert_eq!(dropped(&a), None, "{body}");
            assert!(
                !a.headers.contains_key("x-llm-d-flow-band-headroom"),
                "provisional spelling from the backend removed"
            );
            if expected.is_none() {
                assert_eq!(queued_ms(&a), None, "{body}");
            }
        }
        site.stop().await;
    }
}

#[tokio::test]
async fn a_band_provisioned_at_runtime_is_seen_by_both_the_exposition_and_the_headers() {
    let site = SimSite::start(gated(&[])).await.unwrap();
    let control = site.control();
    control.set_band(7, Some(5)).unwrap();
    let first = start_long(&control, site.addr(), 7).await;
    let held: Vec<_> = (0..2).map(|_| post_at(site.addr(), PLAIN, 7)).collect();
    until_held(&control, 7, 2).await;
    let text = String::from_utf8(control.metrics()).unwrap();
    let band_7 = text
        .lines()
        .find(|l| {
            l.starts_with("llm_d_epp_flow_control_queue_size{") && l.contains(r#"priority="7""#)
        })
        .expect("band 7 exposed");
    assert!(band_7.ends_with(" 2"), "{band_7}");
    let a = answer(first).await;
    assert_eq!(
        headroom(&a),
        Some("4"),
        "band 7: capacity 5, one still held"
    );
    for task in held {
        assert_eq!(answer(task).await.status, StatusCode::OK);
    }
    site.stop().await;
}

#[tokio::test]
async fn the_headroom_is_read_when_the_answer_is_built_not_at_admission() {
    let site = SimSite::start(gated(&[(0, Some(10))])).await.unwrap();
    let control = site.control();
    let first = start_long(&control, site.addr(), 0).await;
    assert_eq!(
        control.band_snapshot(0).map(|b| b.len),
        Some(0),
        "at admission the band was empty: headroom 10"
    );
    let held: Vec<_> = (0..3).map(|_| post_at(site.addr(), PLAIN, 0)).collect();
    until_held(&control, 0, 3).await;
    let a = answer(first).await;
    assert_eq!(
        headroom(&a),
        Some("8"),
        "two still held when the answer is built (the third took the freed slot)"
    );
    for task in held {
        assert_eq!(answer(task).await.status, StatusCode::OK);
    }
    site.stop().await;
}

#[tokio::test]
async fn requests_kept_at_a_site_are_sent_again_as_they_end_until_their_time_is_up() {
    let site = SimSite::start(config(1, 2)).await.unwrap();
    let control = site.control();
    let uri: http::Uri = format!("http://{}/v1/chat/completions", site.addr())
        .parse()
        .unwrap();
    let client = LoadClient::new(Protocol::Http1, BOUND);
    let body = chat_body("llama", false);
    // Two requests kept for a second on two 300 ms slots: four turns each when every
    // resend is prompt (the last sent at 900 ms), none sent past the second; sent once they
    // would be two.
    let mut kept = keep_sending(&client, &uri, &body, 2, Duration::from_secs(1));
    timeout(BOUND, async { while kept.join_next().await.is_some() {} })
        .await
        .expect("the kept requests end once their time is up");
    let end = control.stats();
    assert!(
        (4..=8).contains(&end.requests),
        "each sent again as it ended, at most four turns: {end:?}"
    );
    assert_eq!((end.running, end.waiting), (0, 0));
    sleep(Duration::from_millis(SERVICE_MS)).await;
    assert_eq!(
        control.stats().requests,
        end.requests,
        "nothing is sent once they end"
    );

    // A site that refuses ends them at once rather than being asked as fast as it answers.
    control.drop_all_endpoints();
    let mut refused = keep_sending(&client, &uri, &body, 2, Duration::from_secs(60));
    timeout(BOUND, async {
        while refused.join_next().await.is_some() {}
    })
    .await
    .expect("a refusal ends a kept request");
    site.stop().await;
}
