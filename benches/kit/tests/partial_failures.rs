//! Partial failures never become total, with the real daemons on loopback: REAL
//! `grid-operatord` drivers scraping simulated sites (model server and EPP), the REAL
//! `grid-gatewayd` routing a steady stream of OpenAI-style requests, and faults put on
//! the model servers, the EPPs and an operator.
//!
//! - Every EPP silent while the model servers serve: the gateway routes by capacity
//!   without signals, never 503, and routes by load again once the signals return.
//! - A site answering every request with 500, 503 or 429: its refusals go to the other
//!   site, it is ejected and probed, and it is back in its share once it serves again.
//! - A remote operator gone while the local site is full: the remote site, without a
//!   signal, takes the overflow.
//! - A remote operator gone while its site keeps serving the gateway's requests, no flow
//!   control: the site stays measured by its answers and keeps serving.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use grid_kit::load::{LoadClient, Protocol, chat_body};
use grid_kit::local_grid::{Cadence, GridSpec, LocalGrid, SiteSpec, TransportMode};
use grid_kit::sim_site::{AnswerFault, EppFault};
use grid_sim::site_model::SiteConfig;
use http::StatusCode;
use tokio::sync::Mutex;
use tokio::time::Instant;

const MODEL: &str = "llama";
const SERVICE_MS: f64 = 200.0;
/// Start-up and first readings, generous for a loaded 2-core machine.
const MEASURED_WITHIN: Duration = Duration::from_secs(15);
/// Requests per second the tests keep flowing through the gateway.
const RATE: u64 = 20;
/// "The first seconds" of a site failing: what it may cost before the gateway has seen
/// enough of its answers to take it out. As the simulator's test reads it: on a loaded
/// machine (five grids at once) the five failures in a row that eject it came 2 s and
/// more after the fault, with the site's share already weighted down by the first ones.
const FIRST_SECONDS: Duration = Duration::from_secs(5);
/// How long the site fails: the first seconds and long enough after them to count at
/// least a hundred answers at a loaded machine's rate.
const FAULT_LASTS: Duration = Duration::from_secs(13);

fn site(name: &str, endpoints: usize, slots: usize) -> SiteSpec {
    SiteSpec::simulated(
        SiteConfig::new(name, endpoints, slots),
        MODEL,
        SERVICE_MS,
        11,
    )
}

async fn grid(sites: Vec<SiteSpec>) -> LocalGrid {
    let spec = GridSpec {
        model: MODEL.to_owned(),
        sites,
        cadence: Cadence::FAST,
        transport: TransportMode::Poll,
        shedding: None,
    };
    LocalGrid::start_measured(&spec, MEASURED_WITHIN)
        .await
        .expect("grid starts, every site measured")
}

/// One answer the traffic got: when (since the traffic began), its status, its site.
type Seen = (Duration, StatusCode, Option<String>);

/// A steady stream of chat requests through the gateway, [`RATE`] a second, until
/// stopped; every answer recorded.
struct Traffic {
    seen: Arc<Mutex<Vec<Seen>>>,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
    started: Instant,
}

impl Traffic {
    fn start(grid: &LocalGrid) -> Self {
        let uri: http::Uri = grid.chat_url().parse().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let started = Instant::now();
        let (s, st) = (Arc::clone(&seen), Arc::clone(&stop));
        let task = tokio::spawn(async move {
            let client = LoadClient::new(Protocol::Http1, Duration::from_secs(30));
            let mut tick = tokio::time::interval(Duration::from_millis(1_000 / RATE));
            let mut set = tokio::task::JoinSet::new();
            let mut i = 0u64;
            // Bounded by the tests' stop, and by an hour whatever happens.
            while !st.load(Ordering::SeqCst) && i < 3_600 * RATE {
                tick.tick().await;
                i += 1;
                let (c, uri, s) = (client.clone(), uri.clone(), Arc::clone(&s));
                set.spawn(async move {
                    let answer = c
                        .post_json(&uri, chat_body(MODEL, i.is_multiple_of(2)))
                        .await;
                    let at = started.elapsed();
                    let entry = match answer {
                        Ok(a) => (at, a.status, a.site),
                        Err(_) => (at, StatusCode::from_u16(599).unwrap(), None),
                    };
                    s.lock().await.push(entry);
                });
            }
            while set.join_next().await.is_some() {}
        });
        Self {
            seen,
            stop,
            task,
            started,
        }
    }

    /// Every answer so far.
    async fn seen(&self) -> Vec<Seen> {
        self.seen.lock().await.clone()
    }

    /// Answers received after `from` (since the traffic began).
    async fn since(&self, from: Duration) -> Vec<Seen> {
        self.seen()
            .await
            .into_iter()
            .filter(|(at, ..)| *at >= from)
            .collect()
    }

    async fn stop(self) -> Vec<Seen> {
        self.stop.store(true, Ordering::SeqCst);
        let _ = self.task.await;
        self.seen.lock().await.clone()
    }
}

/// Answers by status, and the 200s by site.
fn tally(seen: &[Seen]) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for (_, status, site) in seen {
        let key = match (status, site) {
            (&StatusCode::OK, Some(site)) => site.clone(),
            (status, _) => format!("status:{}", status.as_u16()),
        };
        *counts.entry(key).or_default() += 1;
    }
    counts
}

fn failures(seen: &[Seen]) -> usize {
    seen.iter().filter(|(_, s, _)| *s != StatusCode::OK).count()
}

/// The gateway's `/metrics`.
async fn gateway_metrics(grid: &LocalGrid) -> String {
    let uri: http::Uri = format!("http://{}/metrics", grid.gateway_addr())
        .parse()
        .unwrap();
    let (_, body) = LoadClient::new(Protocol::Http1, Duration::from_secs(10))
        .get(&uri)
        .await
        .expect("the gateway's /metrics answers");
    String::from_utf8_lossy(&body).into_owned()
}

/// The value of the series starting with `prefix` (0 when absent).
fn series(text: &str, prefix: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

/// Waits until `done` holds for the gateway's `/metrics`, at most `within`; how long it took.
async fn until_metrics(
    grid: &LocalGrid,
    within: Duration,
    what: &str,
    done: impl Fn(&str) -> bool,
) -> Duration {
    let started = Instant::now();
    loop {
        let text = gateway_metrics(grid).await;
        if done(&text) {
            return started.elapsed();
        }
        assert!(started.elapsed() < within, "never: {what}\n{text}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

const WITHOUT_SIGNALS: &str = r#"grid_gateway_model_without_signals{model="llama"}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_epp_silent_while_the_sites_serve_routes_by_capacity_and_never_answers_503() {
    let grid = grid(vec![site("a", 2, 2), site("b", 2, 2)]).await;
    let traffic = Traffic::start(&grid);
    // Every EPP stops answering its scrapes: the operators' verdicts turn 0 for a scrape
    // timeout once their stale window passes, while both model servers serve.
    for s in ["a", "b"] {
        grid.control(s)
            .unwrap()
            .set_epp_fault(Some(EppFault::Slow(Duration::from_secs(600))));
    }
    let blind_after = until_metrics(
        &grid,
        Duration::from_secs(60),
        "the model routed without signals",
        |t| series(t, WITHOUT_SIGNALS) > 0.5,
    )
    .await;
    println!("routing without signals {blind_after:?} after every EPP fell silent");
    // A few seconds without any signal.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let text = gateway_metrics(&grid).await;
    let fallback: f64 = text
        .lines()
        .filter(|l| {
            l.starts_with("grid_gateway_score_decisions_total{")
                && l.contains(r#"path="fallback""#)
                && l.contains(r#"outcome="routed""#)
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(fallback > 0.0, "routed by capacity and counted: {text}");
    // The signals return: routing by load within a few poll cycles.
    for s in ["a", "b"] {
        grid.control(s).unwrap().set_epp_fault(None);
    }
    let back_after = until_metrics(&grid, Duration::from_secs(10), "signals back", |t| {
        series(t, WITHOUT_SIGNALS) < 0.5
    })
    .await;
    println!("routing by load again {back_after:?} after the EPPs answered");
    let seen = traffic.stop().await;
    let counts = tally(&seen);
    assert_eq!(failures(&seen), 0, "every request answered 200: {counts:?}");
    assert!(
        counts.get("a").is_some_and(|&n| n > 0) && counts.get("b").is_some_and(|&n| n > 0),
        "{counts:?}"
    );
    grid.shutdown().await;
}

/// Site `b` answers everything with `fault` while `a` serves: how the traffic fared.
async fn a_failing_site(fault: AnswerFault) {
    let grid = grid(vec![site("a", 2, 2), site("b", 2, 2)]).await;
    let b = grid.control("b").unwrap();
    let traffic = Traffic::start(&grid);
    tokio::time::sleep(Duration::from_secs(1)).await;
    b.set_answer_fault(Some(fault));
    let faulted_at = traffic.started.elapsed();
    tokio::time::sleep(FAULT_LASTS).await;
    // After the first seconds, under 1% of the requests fail.
    let settled = traffic.since(faulted_at + FIRST_SECONDS).await;
    assert!(settled.len() >= 100, "{} answers", settled.len());
    let failed = failures(&settled);
    assert!(
        failed * 100 < settled.len(),
        "{}: {failed} of {} failed after the first seconds: {:?}",
        fault.status,
        settled.len(),
        tally(&settled)
    );
    assert!(b.faulted_answers() > 0, "the site was tried and failed");
    let text = gateway_metrics(&grid).await;
    if fault.status != 500 {
        // Refused before any work: sent to the other site instead.
        let cause = if fault.status == 429 {
            "full"
        } else {
            "unavailable"
        };
        let retried = series(
            &text,
            &format!(r#"grid_gateway_retries_total{{site="a",cause="{cause}"}}"#),
        );
        assert!(retried > 0.0, "{text}");
    }
    if fault.status == 500 {
        // Failing: out of selection, and probed (and failing the probes).
        assert!(
            series(&text, r#"grid_gateway_score_ejected{site="b",provider="#) > 0.5,
            "{text}"
        );
        // The first probe is due a probe interval after the ejection, which a loaded
        // machine may have reached late in the fault: waited for, bounded.
        until_metrics(&grid, Duration::from_secs(10), "a failed probe of b", |t| {
            series(t, r#"grid_gateway_site_probes_total{result="failed"}"#) > 0.5
        })
        .await;
    }
    // The site serves again: back in its share within ten seconds.
    b.set_answer_fault(None);
    let recovered_at = traffic.started.elapsed();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let back = traffic
            .since(recovered_at)
            .await
            .iter()
            .filter(|(_, s, site)| *s == StatusCode::OK && site.as_deref() == Some("b"))
            .count();
        if back >= 3 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{}: b not back within 10 s: {:?}",
            fault.status,
            tally(&traffic.since(recovered_at).await)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let seen = traffic.stop().await;
    println!("{}: {:?}", fault.status, tally(&seen));
    if fault.status != 500 {
        assert_eq!(
            failures(&seen),
            0,
            "{}: every refusal went elsewhere: {:?}",
            fault.status,
            tally(&seen)
        );
    }
    grid.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_site_failing_every_request_with_500_is_ejected_and_back_once_it_serves() {
    a_failing_site(AnswerFault {
        status: 500,
        retry_after_s: None,
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_site_refusing_every_request_with_503_has_them_served_elsewhere() {
    a_failing_site(AnswerFault {
        status: 503,
        retry_after_s: None,
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_site_answering_429_with_retry_after_is_full_for_it_and_its_refusals_go_elsewhere() {
    a_failing_site(AnswerFault {
        status: 429,
        retry_after_s: Some(5),
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_site_without_signals_takes_the_overflow_of_a_full_local_site() {
    // The local site has two slots; the remote one eight.
    let mut grid = grid(vec![site("a", 1, 2), site("b", 2, 4)]).await;
    // The remote operator goes: its site's readings age out at the gateway.
    assert!(grid.stop_operator("b"));
    let deadline = Instant::now() + Duration::from_secs(60);
    while grid.routing("b").measured() {
        assert!(Instant::now() < deadline, "b still measured");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The local site is full: forty requests held at it directly.
    let _held = grid.hold_requests("a", 40, Duration::from_secs(60));
    let deadline = Instant::now() + Duration::from_secs(20);
    while grid.routing("a").selectable() && !grid.view().is_shedding(MODEL) {
        let full = matches!(
            grid.routing("a"),
            grid_kit::local_grid::SiteRouting::Candidate { state, .. }
                if state != grid_score::CandidateState::Room
        );
        if full {
            break;
        }
        assert!(Instant::now() < deadline, "a never read full");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let traffic = Traffic::start(&grid);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let seen = traffic.stop().await;
    let counts = tally(&seen);
    let to_b = counts.get("b").copied().unwrap_or(0);
    assert!(
        to_b * 2 > seen.len(),
        "the remote site took the overflow: {counts:?}"
    );
    assert_eq!(failures(&seen), 0, "{counts:?}");
    grid.shutdown().await;
}

/// Past the gateway's freshness window (15 s) with no signal of `b`, its answers (no
/// flow-control headers here) keep it measured: its last polled reading moved by the
/// gateway's own requests there. Unmeasured, it would take only what the local site,
/// with room, leaves over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_site_whose_operator_is_gone_stays_measured_by_its_answers_and_keeps_serving() {
    let mut grid = grid(vec![site("a", 2, 4), site("b", 2, 4)]).await;
    let traffic = Traffic::start(&grid);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let gone = traffic.started.elapsed();
    assert!(grid.stop_operator("b"));
    // Its last reading ages out 15 s after it was taken; ten seconds more to watch.
    tokio::time::sleep(Duration::from_secs(26)).await;
    let routing = grid.routing("b");
    let seen = traffic.since(gone + Duration::from_secs(16)).await;
    let _ = traffic.stop().await;
    let counts = tally(&seen);
    println!("after b's operator went: {counts:?}, b {routing:?}");
    assert!(routing.measured(), "b measured by its answers: {routing:?}");
    assert!(counts.get("b").is_some_and(|n| *n > 0), "{counts:?}");
    assert_eq!(failures(&seen), 0, "{counts:?}");
    grid.shutdown().await;
}
