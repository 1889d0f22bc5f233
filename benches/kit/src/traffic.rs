//! Open-loop load (the demo's and the freshness bench's): open-loop Poisson arrivals of OpenAI-style chat requests through the
//! gateway (what clients do: they do not wait for each other), and the per-second tally
//! of what came back.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use http::{StatusCode, Uri};
use parking_lot::Mutex;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::clock::Stopwatch;
use crate::latency::Latencies;
use crate::load::{Answer, LoadClient, chat_body};
use grid_sim::sim_rng::SimRng;

/// The most requests the generator keeps open; arrivals past it are counted as not sent,
/// so a grid that stops answering cannot make the demo's memory grow without bound.
pub const MAX_OUTSTANDING: usize = 2_000;
/// One request's whole budget, answer included.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// One request in this many is not streamed (its first frame is its whole answer, so
/// it does not count toward time to first token).
pub const NON_STREAMING_EVERY: u64 = 4;

/// What one site answered in one second.
#[derive(Clone, Debug, Default)]
pub struct SiteSecond {
    /// Answers with status 200.
    pub ok: u64,
    /// Answers that named this site with another status (the site itself failed them).
    pub failed: u64,
    /// Time to first token of its streamed 200 answers.
    pub ttft: Latencies,
}

/// What came back in one second (by the second the answer completed).
#[derive(Clone, Debug, Default)]
pub struct Second {
    /// Per site, in the grid's order.
    pub sites: Vec<SiteSecond>,
    /// 429 from the gateway (shedding).
    pub shed: u64,
    /// 503 from the gateway (every site excluded).
    pub unavailable: u64,
    /// Any other failure: 502, transport errors, timeouts.
    pub failed: u64,
    /// Arrivals not sent because [`MAX_OUTSTANDING`] were open.
    pub not_sent: u64,
}

/// The per-second record of a run, shared between request tasks and the screen.
#[derive(Debug)]
pub struct Tally {
    sites: Vec<String>,
    seconds: Vec<Second>,
}

impl Tally {
    /// An empty tally over `sites`.
    pub fn new(sites: Vec<String>) -> Self {
        Self {
            sites,
            seconds: Vec::new(),
        }
    }

    fn second(&mut self, index: usize) -> &mut Second {
        while self.seconds.len() <= index {
            self.seconds.push(Second {
                sites: vec![SiteSecond::default(); self.sites.len()],
                ..Second::default()
            });
        }
        &mut self.seconds[index]
    }

    /// Counts one answer completed in second `index`.
    pub fn record(&mut self, index: usize, answer: &Answer, streamed: bool) {
        let site = answer
            .site
            .as_deref()
            .and_then(|s| self.sites.iter().position(|n| n == s));
        let second = self.second(index);
        match (site, answer.status) {
            (Some(i), StatusCode::OK) => {
                let s = &mut second.sites[i];
                s.ok += 1;
                if let (true, Some(ttft)) = (streamed, answer.first_frame) {
                    s.ttft.record(ttft);
                }
            }
            (Some(i), _) => second.sites[i].failed += 1,
            (None, StatusCode::TOO_MANY_REQUESTS) => second.shed += 1,
            (None, StatusCode::SERVICE_UNAVAILABLE) => second.unavailable += 1,
            (None, _) => second.failed += 1,
        }
    }

    /// Counts a request that got no answer (transport error or timeout).
    pub fn record_failure(&mut self, index: usize) {
        self.second(index).failed += 1;
    }

    /// Counts an arrival not sent.
    pub fn record_not_sent(&mut self, index: usize) {
        self.second(index).not_sent += 1;
    }

    /// Seconds `from..to` merged into one.
    pub fn window(&self, from: usize, to: usize) -> Second {
        let mut merged = Second {
            sites: vec![SiteSecond::default(); self.sites.len()],
            ..Second::default()
        };
        for s in self.seconds.iter().take(to).skip(from) {
            for (m, site) in merged.sites.iter_mut().zip(&s.sites) {
                m.ok += site.ok;
                m.failed += site.failed;
                m.ttft.merge(&site.ttft);
            }
            merged.shed += s.shed;
            merged.unavailable += s.unavailable;
            merged.failed += s.failed;
            merged.not_sent += s.not_sent;
        }
        merged
    }
}

/// The offered rate, changed by the scenario while the generator runs.
#[derive(Debug)]
pub struct Rate(AtomicU64);

impl Rate {
    /// `rps` requests per second.
    pub fn new(rps: f64) -> Self {
        Self(AtomicU64::new(rps.to_bits()))
    }

    /// Requests per second now.
    pub fn get(&self) -> f64 {
        f64::from_bits(self.0.load(Ordering::Relaxed))
    }

    /// Sets the rate.
    pub fn set(&self, rps: f64) {
        self.0.store(rps.to_bits(), Ordering::Relaxed);
    }
}

/// Sends requests to `uri` at Poisson arrivals of `rate` until `stop` turns true; every
/// answer is counted in `tally` by the second (on `clock`) it completed. Open requests
/// are cancelled on return.
pub async fn generate(
    uri: Uri,
    model: String,
    rate: Arc<Rate>,
    tally: Arc<Mutex<Tally>>,
    clock: Stopwatch,
    seed: u64,
    mut stop: watch::Receiver<bool>,
) {
    let client = LoadClient::new(crate::load::Protocol::Http1, REQUEST_TIMEOUT);
    let mut rng = SimRng::new(seed);
    let mut open = JoinSet::new();
    let mut next = clock.elapsed();
    let mut sent: u64 = 0;
    loop {
        let rps = rate.get().max(0.1);
        next += Duration::from_secs_f64(rng.exponential(1.0 / rps));
        tokio::select! {
            () = tokio::time::sleep_until(clock.origin() + next) => {}
            _ = stop.wait_for(|s| *s) => break,
        }
        while open.try_join_next().is_some() {}
        let second = clock.elapsed().as_secs() as usize;
        if open.len() >= MAX_OUTSTANDING {
            tally.lock().record_not_sent(second);
            continue;
        }
        sent += 1;
        let streamed = !sent.is_multiple_of(NON_STREAMING_EVERY);
        let (client, uri, tally) = (client.clone(), uri.clone(), Arc::clone(&tally));
        let body = chat_body(&model, streamed);
        open.spawn(async move {
            let answer = client.post_json(&uri, body).await;
            let second = clock.elapsed().as_secs() as usize;
            let mut tally = tally.lock();
            match answer {
                Ok(a) => tally.record(second, &a, streamed),
                Err(_) => tally.record_failure(second),
            }
        });
    }
    open.shutdown().await;
}

/// The gateway's routing decisions so far, per site: the `routed` outcomes of
/// `grid_gateway_score_decisions_total` in a `/metrics` page (Prometheus text or its `OpenMetrics` variant).
/// Lines the parser refuses are skipped.
pub fn routed_by_site(metrics: &[u8]) -> std::collections::HashMap<String, f64> {
    use grid_signals::exposition::{Line, lines};
    let mut routed = std::collections::HashMap::new();
    for line in lines(metrics).flatten() {
        let Line::Sample(s) = line else { continue };
        if s.name != "grid_gateway_score_decisions_total"
            || !s.labels.get("outcome").is_some_and(|o| o.eq_str("routed"))
        {
            continue;
        }
        if let Some(site) = s.labels.get("site") {
            *routed.entry(site.unescaped().into_owned()).or_insert(0.0) += s.value;
        }
    }
    routed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(site: Option<&str>, status: StatusCode, ttft_ms: u64) -> Answer {
        Answer {
            status,
            site: site.map(str::to_owned),
            retry_after: None,
            first_frame: Some(Duration::from_millis(ttft_ms)),
            total: Duration::from_millis(ttft_ms * 2),
            bytes: 10,
        }
    }

    #[test]
    fn answers_are_counted_by_site_and_gateway_refusals_apart() {
        let mut t = Tally::new(vec!["a".into(), "b".into()]);
        t.record(0, &answer(Some("a"), StatusCode::OK, 100), true);
        t.record(0, &answer(Some("b"), StatusCode::OK, 50), false);
        t.record(
            1,
            &answer(Some("b"), StatusCode::SERVICE_UNAVAILABLE, 5),
            true,
        );
        t.record(1, &answer(None, StatusCode::TOO_MANY_REQUESTS, 1), true);
        t.record(1, &answer(None, StatusCode::SERVICE_UNAVAILABLE, 1), true);
        t.record(2, &answer(None, StatusCode::BAD_GATEWAY, 1), true);
        t.record_failure(2);
        let mut w = t.window(0, 3);
        assert_eq!((w.sites[0].ok, w.sites[1].ok, w.sites[1].failed), (1, 1, 1));
        assert_eq!((w.shed, w.unavailable, w.failed), (1, 1, 2));
        // Only the streamed 200 counts toward time to first token.
        assert_eq!(w.sites[0].ttft.p50(), Some(Duration::from_millis(100)));
        assert!(w.sites[1].ttft.is_empty());
        assert_eq!(t.window(1, 2).sites[0].ok, 0);
    }

    #[test]
    fn routed_decisions_are_summed_per_site_over_paths_and_other_outcomes_ignored() {
        let page = b"# TYPE grid_gateway_score_decisions counter\n\
grid_gateway_score_decisions_total{site=\"a\",path=\"two_choices\",outcome=\"routed\"} 5\n\
grid_gateway_score_decisions_total{site=\"a\",path=\"lone\",outcome=\"routed\"} 2\n\
grid_gateway_score_decisions_total{site=\"b\",path=\"lone\",outcome=\"routed\"} 1\n\
grid_gateway_score_decisions_total{site=\"\",path=\"\",outcome=\"shed\"} 9\n\
grid_gateway_polls_total{result=\"ok\"} 3\n\
# EOF\n";
        let routed = routed_by_site(page);
        assert_eq!(routed.get("a"), Some(&7.0));
        assert_eq!(routed.get("b"), Some(&1.0));
        assert_eq!(routed.len(), 2);
    }

    #[test]
    fn an_unknown_site_header_counts_as_a_failure() {
        let mut t = Tally::new(vec!["a".into()]);
        t.record(0, &answer(Some("zz"), StatusCode::OK, 1), true);
        assert_eq!(t.window(0, 1).failed, 1);
    }
}
