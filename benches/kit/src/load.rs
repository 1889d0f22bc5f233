//! The load generators' HTTP client: OpenAI-style chat requests over HTTP/1.1 or HTTP/2
//! (prior knowledge, cleartext, loopback), answers read frame by frame so the time to the
//! first frame (the client's time to first token when streaming) is measured.

use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode, Uri, header};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use crate::Error;
use crate::clock::Stopwatch;

/// The header the gateway names the serving site in.
pub const SITE_HEADER: &str = "x-grid-site";

/// The most pooled idle connections per host: a load generator's whole concurrency.
pub const MAX_IDLE_PER_HOST: usize = 1_024;

/// Which HTTP version the client speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// HTTP/1.1, one request per pooled connection at a time.
    Http1,
    /// HTTP/2 with prior knowledge, requests multiplexed on one connection.
    Http2,
}

impl Protocol {
    /// `h1` or `h2`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Http1 => "h1",
            Self::Http2 => "h2",
        }
    }
}

/// What one request got.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    /// The status.
    pub status: StatusCode,
    /// `x-grid-site`, when present.
    pub site: Option<String>,
    /// `Retry-After`, when present.
    pub retry_after: Option<String>,
    /// Time from sending to the first body frame; `None` for an empty body.
    pub first_frame: Option<Duration>,
    /// Time from sending to the end of the body.
    pub total: Duration,
    /// Body bytes read.
    pub bytes: usize,
}

/// A pooled client for one protocol.
#[derive(Clone, Debug)]
pub struct LoadClient {
    inner: Client<HttpConnector, Full<Bytes>>,
    timeout: Duration,
}

/// A chat completion request body for `model`.
pub fn chat_body(model: &str, stream: bool) -> Bytes {
    Bytes::from(
        serde_json::json!({
            "model": model,
            "messages": [{"role": "user", "content": "How loaded is the grid?"}],
            "stream": stream,
        })
        .to_string(),
    )
}

/// Keeps `n` requests with `body` open at `uri`, each sent again as soon as it ends, until
/// `kept_for` has passed, the set is dropped, or one fails (unreachable, timed out, or an
/// error status: a server that refuses at once would otherwise be asked as fast as it
/// answers). A closed loop of `n` clients: the load stays while it lasts, where requests
/// sent once drain.
pub fn keep_sending(
    client: &LoadClient,
    uri: &Uri,
    body: &Bytes,
    n: usize,
    kept_for: Duration,
) -> tokio::task::JoinSet<()> {
    let until = tokio::time::Instant::now() + kept_for;
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..n {
        let (c, uri, body) = (client.clone(), uri.clone(), body.clone());
        set.spawn(async move {
            while tokio::time::Instant::now() < until {
                match c.post_json(&uri, body.clone()).await {
                    Ok(answer) if answer.status.is_success() => {}
                    _ => break,
                }
            }
        });
    }
    set
}

impl LoadClient {
    /// A client speaking `protocol`; every request (answer included) is bounded by
    /// `timeout`.
    pub fn new(protocol: Protocol, timeout: Duration) -> Self {
        let mut http = HttpConnector::new();
        http.set_nodelay(true);
        let mut builder = Client::builder(TokioExecutor::new());
        builder.pool_max_idle_per_host(MAX_IDLE_PER_HOST);
        if protocol == Protocol::Http2 {
            builder.http2_only(true);
        }
        Self {
            inner: builder.build(http),
            timeout,
        }
    }

    /// POSTs `body` as JSON to `uri` and reads the whole answer.
    pub async fn post_json(&self, uri: &Uri, body: Bytes) -> Result<Answer, Error> {
        match tokio::time::timeout(self.timeout, self.exchange(uri, body)).await {
            Ok(answer) => answer,
            Err(_) => Err(Error::Timeout {
                what: format!("POST {uri}"),
                limit_ms: self.timeout.as_millis() as u64,
            }),
        }
    }

    /// GETs `uri` and returns the status and the whole body (a `/metrics` page).
    pub async fn get(&self, uri: &Uri) -> Result<(StatusCode, Bytes), Error> {
        let exchange = async {
            let request = Request::get(uri.clone())
                .body(Full::new(Bytes::new()))
                .map_err(|e| Error::Request(e.to_string()))?;
            let response = self
                .inner
                .request(request)
                .await
                .map_err(|e| Error::Request(e.to_string()))?;
            let status = response.status();
            let body = response
                .into_body()
                .collect()
                .await
                .map_err(|e| Error::Request(e.to_string()))?
                .to_bytes();
            Ok((status, body))
        };
        match tokio::time::timeout(self.timeout, exchange).await {
            Ok(result) => result,
            Err(_) => Err(Error::Timeout {
                what: format!("GET {uri}"),
                limit_ms: self.timeout.as_millis() as u64,
            }),
        }
    }

    async fn exchange(&self, uri: &Uri, body: Bytes) -> Result<Answer, Error> {
        let request = Request::post(uri.clone())
            .header(header::CONTENT_TYPE, "application/json")
            .body(Full::new(body))
            .map_err(|e| Error::Request(e.to_string()))?;
        let watch = Stopwatch::start();
        let response = self
            .inner
            .request(request)
            .await
            .map_err(|e| Error::Request(e.to_string()))?;
        let header_text = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let status = response.status();
        let site = header_text(SITE_HEADER);
        let retry_after = header_text(header::RETRY_AFTER.as_str());
        let mut body = response.into_body();
        let mut first_frame = None;
        let mut bytes = 0;
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| Error::Request(e.to_string()))?;
            if let Some(data) = frame.data_ref() {
                if first_frame.is_none() && !data.is_empty() {
                    first_frame = Some(watch.elapsed());
                }
                bytes += data.len();
            }
        }
        Ok(Answer {
            status,
            site,
            retry_after,
            first_frame,
            total: watch.elapsed(),
            bytes,
        })
    }
}

/// What a closed loop measured.
#[derive(Clone, Debug)]
pub struct LoopResult {
    /// Answers with status 200.
    pub ok: u64,
    /// Anything else (error status, transport error, timeout).
    pub failed: u64,
    /// Time from the first send to the last answer.
    pub elapsed: Duration,
    /// Latency of every 200 answer, to the end of its body.
    pub latencies: crate::latency::Latencies,
}

impl LoopResult {
    /// Answers with status 200 per second.
    pub fn throughput(&self) -> f64 {
        self.ok as f64 / self.elapsed.as_secs_f64().max(f64::MIN_POSITIVE)
    }
}

/// Sends `body` to `uri` from `concurrency` workers, each sending its next request as soon
/// as its previous answer has been read whole, until `duration` has passed.
pub async fn closed_loop(
    client: &LoadClient,
    uri: &Uri,
    body: &Bytes,
    concurrency: usize,
    duration: Duration,
) -> LoopResult {
    let watch = Stopwatch::start();
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..concurrency.max(1) {
        let (client, uri, body) = (client.clone(), uri.clone(), body.clone());
        workers.spawn(async move {
            let mut mine = LoopResult {
                ok: 0,
                failed: 0,
                elapsed: Duration::ZERO,
                latencies: crate::latency::Latencies::new(),
            };
            while watch.elapsed() < duration {
                match client.post_json(&uri, body.clone()).await {
                    Ok(a) if a.status == StatusCode::OK => {
                        mine.ok += 1;
                        mine.latencies.record(a.total);
                    }
                    _ => mine.failed += 1,
                }
            }
            mine
        });
    }
    let mut all = LoopResult {
        ok: 0,
        failed: 0,
        elapsed: Duration::ZERO,
        latencies: crate::latency::Latencies::new(),
    };
    while let Some(done) = workers.join_next().await {
        if let Ok(mine) = done {
            all.ok += mine.ok;
            all.failed += mine.failed;
            all.latencies.merge(&mine.latencies);
        }
    }
    all.elapsed = watch.elapsed();
    all
}
