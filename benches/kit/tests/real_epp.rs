//! grid against llm-d's real endpoint picker (EPP) and inference simulator
//! (`grid_kit::llmd`): the EPP runs against the real API server, watching an
//! `InferencePool` whose `Pod`s point at simulator processes in network namespaces, with
//! Envoy as its data path; grid's operator scrapes the EPP's `/metrics`, in file mode
//! and in controller mode (an `InferenceProvider` on the same API server naming the EPP).
//! Needs root (network namespaces) and the peers `.ci/install` builds.

use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use grid_kit::clock::Stopwatch;
use grid_kit::llmd::{LlmdSite, LlmdSpec, MODEL, SimSpec, epp_release};
use grid_kit::load::{LoadClient, Protocol};
use grid_kit::operator_harness::{Grid, ProviderSpec, read_metrics};
use grid_signals::epp::{EppMetric, Generation, PoolSelector, ScrapeBody, read_scrape, recognize};
use grid_signals::exposition::MAX_EXPOSITION_BYTES;

const POOL: &str = "llama";
/// Requests held on the loaded simulators.
const HELD: usize = 12;

/// Where the recorded expositions are kept (`GRID_RECORD_EPP=1` rewrites them).
fn recorded_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/epp-real")
}

fn chat(stream: bool, max_tokens: u32, fairness: Option<&str>) -> (Bytes, Option<String>) {
    let body = serde_json::json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": "How loaded is the grid?"}],
        "stream": stream,
        "max_tokens": max_tokens,
        // Exactly `max_tokens` tokens (vLLM's extension, which the simulator honours).
        "ignore_eos": true,
    });
    (Bytes::from(body.to_string()), fairness.map(str::to_owned))
}

/// Sends one request through the site's Envoy (and so through the EPP): its status.
async fn send(site: &LlmdSite, stream: bool, max_tokens: u32, fairness: Option<&str>) -> u16 {
    exchange(site, stream, max_tokens, fairness).await.0
}

/// [`send`], with the answer's headers.
async fn exchange(
    site: &LlmdSite,
    stream: bool,
    max_tokens: u32,
    fairness: Option<&str>,
) -> (u16, http::HeaderMap) {
    let (body, fairness) = chat(stream, max_tokens, fairness);
    let uri: http::Uri = format!("{}/v1/chat/completions", site.api_url())
        .parse()
        .unwrap();
    let authority = uri.authority().unwrap().to_string();
    let exchange = async {
        let tcp = tokio::net::TcpStream::connect(&authority).await.ok()?;
        let (mut tx, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp))
                .await
                .ok()?;
        tokio::spawn(conn);
        let mut req = http::Request::post(uri)
            .header(http::header::HOST, &authority)
            .header(http::header::CONTENT_TYPE, "application/json");
        if let Some(f) = &fairness {
            req = req.header("x-gateway-inference-fairness-id", f);
        }
        let answer = tx
            .send_request(req.body(http_body_util::Full::new(body)).unwrap())
            .await
            .ok()?;
        let (status, headers) = (answer.status().as_u16(), answer.headers().clone());
        http_body_util::BodyExt::collect(answer.into_body())
            .await
            .ok()?;
        Some((status, headers))
    };
    tokio::time::timeout(Duration::from_secs(60), exchange)
        .await
        .ok()
        .flatten()
        .unwrap_or_default()
}

/// The value of the operator's series `name` for provider `llama` of site `a`, if it
/// publishes one.
fn operator_value(metrics: &str, name: &str) -> Option<f64> {
    let prefix = format!("{name}{{");
    metrics.lines().find_map(|l| {
        (l.starts_with(&prefix) && l.contains("grid_provider=\"llama\""))
            .then(|| l.rsplit(' ').next()?.parse().ok())
            .flatten()
    })
}

fn ready_reason(metrics: &str) -> Option<String> {
    metrics.lines().find_map(|l| {
        let rest = l.strip_prefix("grid_operator_provider_ready_reason{")?;
        if !l.ends_with(" 1") || !rest.contains("provider=\"llama\"") {
            return None;
        }
        let reason = rest.split("reason=\"").nth(1)?;
        Some(reason.split('"').next()?.to_owned())
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_epp_writes_every_series_grid_reads_with_the_labels_grid_reads() {
    let began = Stopwatch::start();
    let site = LlmdSite::start(LlmdSpec::new(POOL, 2)).await.unwrap();
    // A plain and a streamed answer through the EPP's data path, so its request series
    // exist.
    for stream in [false, true, false, true] {
        let (status, headers) = exchange(&site, stream, 20, None).await;
        assert_eq!(status, 200, "{}", site.logs());
        // This release writes no flow-control headers on its answers
        // (`x-llm-d-flow-queue-duration-ms`, `x-llm-d-flow-band-headroom-requests`).
        assert!(
            headers
                .keys()
                .all(|k| !k.as_str().starts_with("x-llm-d-flow")),
            "{headers:?}"
        );
    }
    // The pool gauges are refreshed every 5 s (--refresh-prometheus-metrics-interval).
    tokio::time::sleep(Duration::from_secs(6)).await;
    let text = site.exposition().await.unwrap();
    if std::env::var_os("GRID_RECORD_EPP").is_some() {
        std::fs::create_dir_all(recorded_dir()).unwrap();
        std::fs::write(
            recorded_dir().join("two-pods-after-four-requests.prom"),
            &text,
        )
        .unwrap();
        std::fs::write(
            recorded_dir().join("RELEASE"),
            format!("{}\n", epp_release()),
        )
        .unwrap();
    }

    let body = ScrapeBody::parse(text.as_bytes());
    assert_eq!(
        body.refused().total(),
        0,
        "no line of the real body is refused"
    );
    // Which generation of names the release writes, for every metric grid reads.
    let mut seen = std::collections::BTreeMap::new();
    for s in body.samples() {
        if let Some(r) = recognize(s.name) {
            seen.insert(r.metric, r.generation);
        }
    }
    for (metric, generation) in [
        (EppMetric::ReadyEndpoints, Generation::Old),
        (EppMetric::AverageRunning, Generation::Old),
        (EppMetric::AverageQueue, Generation::Old),
        (EppMetric::AverageKvCache, Generation::Old),
        (EppMetric::PerEndpointQueue, Generation::Old),
        (EppMetric::FlowControlQueue, Generation::Old),
        (EppMetric::RequestTotal, Generation::Old),
    ] {
        assert_eq!(seen.get(&metric), Some(&generation), "{metric:?}: {seen:?}");
    }
    // Not written by this release: the KV spread, the in-flight load producer's
    // per-endpoint counts, and (without the predicted-latency plugins) TTFT and TPOT;
    // the error counter until the first error.
    for metric in [
        EppMetric::StdDevKvCache,
        EppMetric::InflightRequests,
        EppMetric::Ttft,
        EppMetric::Tpot,
        EppMetric::RequestErrorTotal,
    ] {
        assert!(!seen.contains_key(&metric), "{metric:?} appeared: {seen:?}");
    }
    let reading = read_scrape(body.samples(), &PoolSelector::Named(POOL.into()));
    assert_eq!(reading.pools_seen, 1);
    assert_eq!(reading.ready_endpoints, Some(2.0));
    assert_eq!(reading.average_running, Some(0.0));
    assert_eq!(reading.average_queue, Some(0.0));
    assert!(
        reading
            .average_kv_cache
            .is_some_and(|v| (0.0..=1.0).contains(&v))
    );
    // One unit per pod and rank, named after the pod.
    let units: Vec<&String> = reading.per_endpoint_queue.keys().collect();
    assert_eq!(units, ["llama-0-rank-0", "llama-1-rank-0"]);
    assert_eq!(reading.flow_control_queue, Some(0.0));
    assert_eq!(reading.counters.requests, Some(4.0));
    assert_eq!(reading.counters.errors, None);
    assert_eq!(reading.counters.ttft, None);
    assert_eq!(reading.rejected.total(), 0);
    eprintln!(
        "{} exposition: {} bytes, {} samples, in {:?}",
        epp_release(),
        text.len(),
        body.sample_lines(),
        began.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_removed_make_the_provider_not_ready_and_pods_back_make_it_ready_again() {
    let mut site = LlmdSite::start(LlmdSpec::new(POOL, 2)).await.unwrap();
    let grid = Grid::new();
    let a = grid.site("a");
    let operator = a
        .start(
            &[],
            &[ProviderSpec {
                name: POOL.into(),
                url: format!("http://{}", site.epp_metrics),
                timeout_s: 1.0,
            }],
        )
        .await;
    let metrics = operator.metrics_addr;
    let ready = || async move {
        let m = read_metrics(metrics).await.unwrap_or_default();
        operator_value(&m, "grid_provider_ready")
    };
    let took = grid_kit::llmd::wait_until("ready", Duration::from_secs(20), || async {
        ready().await == Some(1.0)
    })
    .await
    .unwrap();
    eprintln!("provider ready {took:?} after the operator started");

    // One pod not ready (its readiness probe failing): the EPP drops it; still ready.
    site.set_pod_ready(1, false).unwrap();
    site.wait_ready_pods(1).await.unwrap();
    assert_eq!(ready().await, Some(1.0));

    // Scaled to zero: no engine answered in the last 30 s, so two scrapes of zero make
    // the provider not ready. The bound: the EPP's pod watch, its gauge refresh
    // (5 s), then two scrapes (0.2 s apart).
    let gone = Stopwatch::start();
    site.remove_sim(0).unwrap();
    site.remove_sim(1).unwrap();
    let took = grid_kit::llmd::wait_until("not ready", Duration::from_secs(10), || async {
        ready().await == Some(0.0)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}; {}", site.logs()));
    let m = read_metrics(metrics).await.unwrap();
    assert_eq!(
        ready_reason(&m).as_deref(),
        Some("no_ready_endpoints"),
        "{m}"
    );
    assert_eq!(
        operator_value(&m, "grid_provider_in_flight_requests"),
        None,
        "no in-flight figure without a ready endpoint"
    );
    eprintln!(
        "not ready {took:?} after the pods went ({:?} in all)",
        gone.elapsed()
    );

    // Back: two positive scrapes.
    let back = Stopwatch::start();
    site.start_sim(0).await.unwrap();
    let took = grid_kit::llmd::wait_until("ready again", Duration::from_secs(10), || async {
        ready().await == Some(1.0)
    })
    .await
    .unwrap();
    eprintln!(
        "ready again {took:?} ({:?} since the pod came back)",
        back.elapsed()
    );
    operator.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_epp_that_stops_answering_never_reads_as_zero_load() {
    let mut site = LlmdSite::start(LlmdSpec::new(POOL, 1)).await.unwrap();
    let grid = Grid::new();
    let a = grid.site("a");
    let operator = a
        .start(
            &[],
            &[ProviderSpec {
                name: POOL.into(),
                url: format!("http://{}", site.epp_metrics),
                timeout_s: 1.0,
            }],
        )
        .await;
    let metrics = operator.metrics_addr;
    let series = || async move { read_metrics(metrics).await.unwrap_or_default() };
    grid_kit::llmd::wait_until("in-flight published", Duration::from_secs(20), || async {
        operator_value(&series().await, "grid_provider_in_flight_requests").is_some()
    })
    .await
    .unwrap();

    site.stop_epp();
    // Within the stale window (5 s here) the last answered scrape's verdict stands,
    // stamped with its time; past it the provider is not ready for a failed scrape,
    // and its load is absent: never a zero a gateway would read as idle.
    let stale = Stopwatch::start();
    let mut reads = 0;
    let mut gone_after = None;
    while stale.elapsed() < Duration::from_secs(8) {
        let m = series().await;
        assert_ne!(
            operator_value(&m, "grid_provider_ready_endpoints"),
            Some(0.0),
            "a silent EPP never reads as zero endpoints: {m}"
        );
        let in_flight = operator_value(&m, "grid_provider_in_flight_requests");
        match (in_flight, gone_after) {
            (None, None) => gone_after = Some(stale.elapsed()),
            (Some(v), Some(_)) => panic!("the load came back as {v} with the EPP gone: {m}"),
            _ => {}
        }
        reads += 1;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let gone_after = gone_after.expect("the load is withdrawn within 8 s");
    assert!(gone_after < Duration::from_secs(7), "{gone_after:?}");
    let m = series().await;
    assert_eq!(
        operator_value(&m, "grid_provider_in_flight_requests"),
        None,
        "{m}"
    );
    assert_eq!(
        operator_value(&m, "grid_provider_ready_endpoints"),
        None,
        "{m}"
    );
    assert_eq!(ready_reason(&m).as_deref(), Some("scrape_connect"), "{m}");
    eprintln!("{reads} reads while the EPP was gone; its load withdrawn after {gone_after:?}");

    // Back: ready again from the first scrapes.
    site.restart_epp(1).await.unwrap();
    grid_kit::llmd::wait_until("ready again", Duration::from_secs(10), || async {
        operator_value(&series().await, "grid_provider_ready") == Some(1.0)
    })
    .await
    .unwrap();
    operator.shutdown().await.unwrap();
}

/// Starts an operator (file mode, the same scrape and readiness code as the controller)
/// scraping `site`'s EPP as provider `llama`.
async fn operator_for(grid: &Grid, site: &LlmdSite) -> grid_operatord::driver::Running {
    grid.site("a")
        .start(
            &[],
            &[ProviderSpec {
                name: POOL.into(),
                url: format!("http://{}", site.epp_metrics),
                timeout_s: 1.0,
            }],
        )
        .await
}

/// A simulator that runs two requests at once and writes a token every 20 ms.
fn slow_sim() -> SimSpec {
    SimSpec {
        max_num_seqs: 2,
        ttft: Duration::from_millis(100),
        inter_token: Duration::from_millis(20),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_put_on_the_simulators_shows_in_the_operators_in_flight_estimate() {
    let mut spec = LlmdSpec::new(POOL, 2);
    spec.sims = vec![slow_sim(); 2];
    let site = std::sync::Arc::new(LlmdSite::start(spec).await.unwrap());
    let grid = Grid::new();
    let operator = operator_for(&grid, &site).await;
    let metrics = operator.metrics_addr;
    let value = |name: &'static str| async move {
        operator_value(&read_metrics(metrics).await.unwrap_or_default(), name)
    };
    grid_kit::llmd::wait_until("idle in-flight", Duration::from_secs(20), || async {
        value("grid_provider_in_flight_requests").await == Some(0.0)
    })
    .await
    .unwrap();

    // Twelve requests of 300 tokens (6 s each) on four slots: four run, eight wait.
    let loaded = Stopwatch::start();
    let mut held = tokio::task::JoinSet::new();
    for i in 0..HELD {
        let site = site.clone();
        held.spawn(async move { send(&site, i % 2 == 0, 300, None).await });
    }
    // The EPP refreshes its pool gauges every 5 s: that is the lag, then one scrape.
    let took =
        grid_kit::llmd::wait_until("in-flight under load", Duration::from_secs(8), || async {
            value("grid_provider_in_flight_requests")
                .await
                .is_some_and(|v| v >= 8.0)
        })
        .await
        .unwrap_or_else(|e| {
            let m = futures::executor::block_on(read_metrics(metrics)).unwrap_or_default();
            let pool: Vec<&str> = m
                .lines()
                .filter(|l| l.contains("llama") && !l.starts_with('#'))
                .collect();
            panic!("{e}; operator: {pool:#?}")
        });
    let in_flight = value("grid_provider_in_flight_requests").await.unwrap();
    let text = site.exposition().await.unwrap();
    if std::env::var_os("GRID_RECORD_EPP").is_some() {
        std::fs::write(
            recorded_dir().join("two-pods-twelve-requests-held.prom"),
            &text,
        )
        .unwrap();
    }
    let reading = read_scrape(
        ScrapeBody::parse(text.as_bytes()).samples(),
        &PoolSelector::Named(POOL.into()),
    );
    eprintln!(
        "in-flight {in_flight} of {HELD} held, {took:?} after the load began \
         (running {:?}, queued {:?} per endpoint, flow control holding {:?}, KV {:?})",
        reading.average_running,
        reading.average_queue,
        reading.flow_control_queue,
        reading.average_kv_cache
    );
    assert!(in_flight <= HELD as f64 + 0.5, "{in_flight}");
    assert!(loaded.elapsed() < Duration::from_secs(10));
    let mut statuses = Vec::new();
    while let Some(s) = held.join_next().await {
        statuses.push(s.unwrap());
    }
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    // Forty short ones: past twenty requests in the 30 s window, the error ratio is
    // measured; this release records no TTFT or TPOT without its latency predictor, so
    // those stay absent (never 0).
    for _ in 0..8 {
        let batch = (0..5).map(|_| send(&site, true, 5, None));
        assert!(
            futures::future::join_all(batch)
                .await
                .iter()
                .all(|s| *s == 200)
        );
    }
    grid_kit::llmd::wait_until("error ratio measured", Duration::from_secs(15), || async {
        value("grid_provider_error_ratio").await == Some(0.0)
    })
    .await
    .unwrap_or_else(|e| {
        let m = futures::executor::block_on(read_metrics(metrics)).unwrap_or_default();
        let ours: Vec<&str> = m
            .lines()
            .filter(|l| l.starts_with("grid_provider"))
            .collect();
        let epp = futures::executor::block_on(site.exposition()).unwrap_or_default();
        let requests: Vec<&str> = epp
            .lines()
            .filter(|l| l.contains("request_total"))
            .collect();
        panic!("{e}: {ours:#?} {requests:#?}")
    });
    assert_eq!(value("grid_provider_ttft_p50_seconds").await, None);
    assert_eq!(value("grid_provider_tpot_seconds").await, None);
    operator.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_streams_answers_and_sends_traffic_away_from_the_site_whose_simulators_are_loaded()
 {
    use grid_kit::local_grid::{Backend, Cadence, GridSpec, LocalGrid, SiteSpec, TransportMode};
    let mut sites = Vec::new();
    for pool in ["a", "b"] {
        let mut spec = LlmdSpec::new(pool, 2);
        spec.sims = vec![slow_sim(); 2];
        sites.push(std::sync::Arc::new(LlmdSite::start(spec).await.unwrap()));
    }
    let fronts = [
        sites[0].front().await.unwrap(),
        sites[1].front().await.unwrap(),
    ];
    let spec = GridSpec {
        model: MODEL.into(),
        sites: ["a", "b"]
            .iter()
            .zip(&fronts)
            .map(|(name, f)| SiteSpec {
                name: (*name).into(),
                backend: Backend::External(f.url()),
            })
            .collect(),
        cadence: Cadence::FAST,
        transport: TransportMode::Poll,
        shedding: None,
    };
    let grid = LocalGrid::start(&spec).await.unwrap();
    let client = LoadClient::new(Protocol::Http1, Duration::from_secs(60));
    let uri: http::Uri = grid.chat_url().parse().unwrap();
    let route = |n: usize| {
        let (client, uri) = (client.clone(), uri.clone());
        async move {
            let mut by_site = std::collections::BTreeMap::<String, u32>::new();
            for _ in 0..n {
                let (body, _) = chat(false, 10, None);
                let a = client.post_json(&uri, body).await.unwrap();
                assert!(a.status.is_success(), "{a:?}");
                *by_site.entry(a.site.unwrap_or_default()).or_default() += 1;
            }
            by_site
        }
    };
    grid_kit::llmd::wait_until("both sites measured", Duration::from_secs(30), || async {
        let b = route(4).await;
        b.len() == 2 || b.contains_key("b")
    })
    .await
    .unwrap();
    let idle = route(20).await;

    // Streamed answers pass through the gateway, the site's Envoy and the EPP as they are
    // made: twenty tokens 20 ms apart end some 380 ms after the first event, which a
    // proxy holding the body would have sent at the end.
    for _ in 0..4 {
        let (body, _) = chat(true, 20, None);
        let a = client.post_json(&uri, body).await.unwrap();
        assert!(a.status.is_success() && a.site.is_some(), "{a:?}");
        let first = a.first_frame.expect("a streamed body");
        assert!(
            a.total.saturating_sub(first) >= Duration::from_millis(200),
            "streamed as made: {a:?}"
        );
    }

    // Site a's simulators loaded from outside the grid: twelve long requests on its four
    // slots, which the grid learns of only through a's EPP.
    let mut held = tokio::task::JoinSet::new();
    for _ in 0..12 {
        let site = sites[0].clone();
        held.spawn(async move { send(&site, false, 400, None).await });
    }
    tokio::time::sleep(Duration::from_secs(7)).await;
    let loaded = route(20).await;
    eprintln!("idle: {idle:?}; site a loaded: {loaded:?}");
    let to = |m: &std::collections::BTreeMap<String, u32>, s: &str| m.get(s).copied().unwrap_or(0);
    assert!(
        to(&loaded, "b") >= 16,
        "loaded: {loaded:?} (idle: {idle:?})"
    );
    held.abort_all();
    drop(grid);
}

/// Sends one short request for each fairness ID in `ids`, eight at a time.
async fn one_per_fairness_id(site: &LlmdSite, ids: std::ops::Range<usize>) {
    let ids: Vec<usize> = ids.collect();
    for chunk in ids.chunks(8) {
        let sends = chunk.iter().map(|i| {
            let id = format!("tenant-{i:04}");
            async move { send(site, false, 1, Some(&id)).await }
        });
        let statuses = futures::future::join_all(sends).await;
        assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_chosen_fairness_ids_grow_the_exposition_past_the_cap_unless_flow_control_is_off() {
    let site = LlmdSite::start(LlmdSpec::new(POOL, 1)).await.unwrap();
    let grid = Grid::new();
    let operator = operator_for(&grid, &site).await;
    let metrics = operator.metrics_addr;
    one_per_fairness_id(&site, 0..1).await;
    let base = site.exposition().await.unwrap().len();
    one_per_fairness_id(&site, 1..21).await;
    let per_id = (site.exposition().await.unwrap().len() - base) / 20;
    // Every new fairness ID adds its flow-control series (queue size and bytes, the
    // queue-duration and enqueue-duration histograms); nothing removes them.
    assert!(per_id > 1_000, "{per_id} bytes per fairness ID");
    let needed = (MAX_EXPOSITION_BYTES - base) / per_id + 1;
    assert!(needed < 400, "{needed}");
    one_per_fairness_id(&site, 21..needed + 10).await;
    let size = site.exposition().await.unwrap().len();
    assert!(size > MAX_EXPOSITION_BYTES, "{size}");
    // Past the cap the operator reads no count: readiness unknown, never a false zero.
    grid_kit::llmd::wait_until(
        "readiness unknown at the cap",
        Duration::from_secs(10),
        || async {
            let m = read_metrics(metrics).await.unwrap_or_default();
            ready_reason(&m).as_deref() == Some("scrape_body_cap")
                && operator_value(&m, "grid_provider_ready").is_none()
        },
    )
    .await
    .unwrap();
    eprintln!(
        "{base} bytes with one fairness ID, {per_id} more per ID: the 1 MiB cap at about \
         {needed} IDs ({size} bytes after {})",
        needed + 10
    );
    operator.shutdown().await.unwrap();
    drop(site);

    // Flow control off: the fairness ID is no label of any series.
    let mut spec = LlmdSpec::new(POOL, 1);
    spec.flow_control = false;
    let site = LlmdSite::start(spec).await.unwrap();
    one_per_fairness_id(&site, 0..1).await;
    let base = site.exposition().await.unwrap();
    one_per_fairness_id(&site, 1..41).await;
    let after = site.exposition().await.unwrap();
    assert!(
        !after.contains("tenant-0040"),
        "no series names a fairness ID"
    );
    assert!(
        after.len() < base.len() + 2_000,
        "{} -> {}",
        base.len(),
        after.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_epp_with_the_charts_metrics_authentication_reads_as_unauthorized() {
    let mut spec = LlmdSpec::new(POOL, 1);
    spec.metrics_auth = true;
    let site = LlmdSite::start(spec).await.unwrap();
    let grid = Grid::new();
    let operator = operator_for(&grid, &site).await;
    let metrics = operator.metrics_addr;
    // The operator sends no token: 401, classed `unauthorized`, the Ready reason
    // `ScrapeUnauthorized` (unknown until the stale window passes, then not ready).
    grid_kit::llmd::wait_until("unauthorized", Duration::from_secs(12), || async {
        let m = read_metrics(metrics).await.unwrap_or_default();
        ready_reason(&m).as_deref() == Some("scrape_unauthorized")
    })
    .await
    .unwrap();
    let m = read_metrics(metrics).await.unwrap();
    assert!(
        m.lines()
            .any(|l| l.starts_with("grid_operator_scrapes_total{")
                && l.contains("result=\"unauthorized\"")
                && !l.ends_with(" 0")),
        "{m}"
    );
    operator.shutdown().await.unwrap();
}

/// The Ready condition the operator wrote on `InferenceProvider` `llama`: (status,
/// reason), if any.
async fn ready_condition(k8s: &grid_kit::kube_cluster::KubeTest) -> Option<(String, String)> {
    let object = k8s.get("inferenceproviders", POOL).await?;
    let conditions = object["status"]["conditions"].as_array()?;
    let ready = conditions.iter().find(|c| c["type"] == "Ready")?;
    Some((
        ready["status"].as_str()?.to_owned(),
        ready["reason"].as_str()?.to_owned(),
    ))
}

/// An operator in controller mode (`grid_operatord::controller::run`, the daemon's own
/// loop) on the process's API server, in a namespace of its own with the example RBAC.
struct Controller {
    started: tokio::sync::watch::Receiver<Option<grid_operatord::controller::run::StartedDriver>>,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), grid_operatord::Error>>,
}

impl Controller {
    /// Creates the `GridNetwork` and an `InferenceProvider` `llama` whose `metricsConfig`
    /// names `site`'s EPP and whose `pool` is its `InferencePool`, then starts the
    /// operator as site `a`; returns once its driver runs.
    async fn start(
        k8s: &grid_kit::kube_cluster::KubeTest,
        a: &grid_kit::operator_harness::Site,
        site: &LlmdSite,
    ) -> (Self, grid_operatord::controller::run::StartedDriver) {
        use grid_operatord::controller::api::{self, ControllerMetrics};
        use grid_operatord::controller::run;
        use grid_operatord::controller::source::KubeConfigSource;
        use grid_operatord::controller::translate::Deployment;
        use serde_json::json;

        k8s.create(
            "gridnetworks",
            json!({"metadata": {"name": "prod"}, "spec": {
                "peerTrust": {"mode": "spiffe", "trustDomain": grid_kit::operator_harness::DOMAIN},
                "intervals": {"scrapeSeconds": 0.2},
            }}),
        )
        .await;
        k8s.create(
            "inferenceproviders",
            json!({"metadata": {"name": POOL}, "spec": {
                "metricsConfig": {
                    "endpoint": format!("http://{}", site.epp_metrics),
                    "path": "/metrics",
                    "timeoutSeconds": 1,
                    "staleMetricsSeconds": 10,
                },
                "pool": site.spec.pool,
                "serving": {"baseUrl": site.api_url(), "models": [MODEL]},
            }}),
        )
        .await;
        let d = a.dir.path();
        let on_loopback =
            || std::net::SocketAddr::from(([127, 0, 0, 1], grid_kit::ports::loopback_port()));
        let deployment = Deployment {
            site: a.name.clone(),
            listen: grid_operatord::config::Listen {
                signals: on_loopback(),
                metrics: on_loopback(),
            },
            tls: grid_operatord::config::TlsFiles {
                cert: d.join("site.crt"),
                key: d.join("site.key"),
                ca: Some(d.join("ca.crt")),
            },
            state_label: "ConfigMap/grid-site-a".into(),
        };
        let client = api::client_from(k8s.operator_config().await, &k8s.ns).unwrap();
        let metrics = ControllerMetrics::new();
        let source = std::sync::Arc::new(
            KubeConfigSource::start(client.clone(), &k8s.ns, deployment, metrics.clone())
                .await
                .unwrap(),
        );
        let (tx, mut started) = tokio::sync::watch::channel(None);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let setup = run::Setup {
            client,
            namespace: k8s.ns.clone(),
            source,
            options: grid_operatord::driver::Options::default(),
            metrics,
            election: None,
        };
        let task = tokio::spawn(run::run(setup, tx, async {
            let _ = stopped.await;
        }));
        let op = tokio::time::timeout(Duration::from_secs(15), started.wait_for(Option::is_some))
            .await
            .expect("the operator started within 15 s")
            .unwrap()
            .clone()
            .unwrap();
        (
            Self {
                started,
                stop,
                task,
            },
            op,
        )
    }

    /// Stops it gracefully, within 10 s.
    async fn stop(self) {
        let _ = self.stop.send(());
        tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .expect("the operator stops within 10 s")
            .unwrap()
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_in_controller_mode_follows_the_real_epp_an_inference_provider_names_through_ready_loaded_and_pods_gone()
 {
    let began = Stopwatch::start();
    // The EPP and the operator on one API server: the EPP watches its pool's Pods in its
    // namespace, the operator its resources in another, as the example RBAC allows.
    let mut spec = LlmdSpec::new(POOL, 2);
    spec.sims = vec![slow_sim(); 2];
    let mut site = LlmdSite::start(spec).await.unwrap();
    let k8s = grid_kit::kube_cluster::KubeTest::start().await;
    let grid = Grid::new();
    let a = grid.site("a");
    let (operator, op) = Controller::start(&k8s, &a, &site).await;
    let metrics = op.metrics_addr;
    let value = |name: &'static str| async move {
        operator_value(&read_metrics(metrics).await.unwrap_or_default(), name)
    };
    let condition = || ready_condition(&k8s);

    // Ready, with the EPP's two ready pods, on the series and on the resource.
    let took = grid_kit::llmd::wait_until("ready", Duration::from_secs(20), || async {
        value("grid_provider_ready").await == Some(1.0)
            && value("grid_provider_ready_endpoints").await == Some(2.0)
            && condition().await == Some(("True".into(), "EndpointsReady".into()))
    })
    .await
    .unwrap_or_else(|e| panic!("{e}; {}", site.logs()));
    eprintln!("ready with 2 endpoints {took:?} after the operator started");

    // Every Pod of the pool deleted (its simulators gone): not ready, on both. The bound:
    // the EPP's pod watch, its gauge refresh (5 s), two scrapes, one status write.
    let gone = Stopwatch::start();
    site.remove_sim(0).unwrap();
    site.remove_sim(1).unwrap();
    let took = grid_kit::llmd::wait_until("not ready", Duration::from_secs(12), || async {
        value("grid_provider_ready").await == Some(0.0)
            && condition().await == Some(("False".into(), "NoReadyEndpoints".into()))
    })
    .await
    .unwrap_or_else(|e| panic!("{e}; {}", site.logs()));
    assert_eq!(value("grid_provider_in_flight_requests").await, None);
    eprintln!(
        "not ready {took:?} after the pods went ({:?} in all)",
        gone.elapsed()
    );

    // The Pods back: ready again with both endpoints.
    site.start_sim(0).await.unwrap();
    site.start_sim(1).await.unwrap();
    let took = grid_kit::llmd::wait_until("ready again", Duration::from_secs(12), || async {
        value("grid_provider_ready_endpoints").await == Some(2.0)
            && condition().await == Some(("True".into(), "EndpointsReady".into()))
    })
    .await
    .unwrap_or_else(|e| panic!("{e}; {}", site.logs()));
    eprintln!("ready again {took:?} after the pods came back");

    // Load on the simulators, through the site's Envoy and the EPP: twelve requests of
    // 300 tokens (6 s each) on four slots show in the in-flight series within the EPP's
    // refresh and a scrape.
    let idle = value("grid_provider_in_flight_requests").await;
    assert_eq!(idle, Some(0.0), "idle before the load");
    let site = std::sync::Arc::new(site);
    let mut held = tokio::task::JoinSet::new();
    for i in 0..HELD {
        let site = site.clone();
        held.spawn(async move { send(&site, i % 2 == 0, 300, None).await });
    }
    let took =
        grid_kit::llmd::wait_until("in-flight under load", Duration::from_secs(8), || async {
            value("grid_provider_in_flight_requests")
                .await
                .is_some_and(|v| v >= 8.0)
        })
        .await
        .unwrap();
    let in_flight = value("grid_provider_in_flight_requests").await.unwrap();
    assert!(in_flight <= HELD as f64 + 0.5, "{in_flight}");
    eprintln!("in-flight {in_flight} of {HELD} held, {took:?} after the load began");
    let mut statuses = Vec::new();
    while let Some(s) = held.join_next().await {
        statuses.push(s.unwrap());
    }
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");

    // One driver start throughout: nothing of this needed the operator restarted.
    assert_eq!(
        operator.started.borrow().as_ref().map(|s| s.restarts),
        Some(0)
    );
    operator.stop().await;
    eprintln!("{:?} in all", began.elapsed());
}
