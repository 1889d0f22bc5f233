//! Embedding grid in a proxy you already run: your hyper server, grid's poller, snapshot,
//! pick and refusals. Run: `cargo run -p grid-gateway --example embedded_proxy -- gateway.toml`.
//!
//! grid polls the operator in the background and publishes a routing view; each request
//! loads that view once, picks a site and is forwarded there, or is refused with the
//! answer every grid front end gives. No grid HTTP server is used.

use std::time::Duration;

use bytes::Bytes;
use grid_gateway::pick::decide;
use grid_gateway::refusal::{Refusal, model_of};
use grid_gateway::routes::{Target, admit, unknown_route};
use grid_gateway::upstream::{Published, uri_for};
use grid_gateway::{Config, Signals};
use grid_score::ScoreMetrics;
use http::{Request, Response, header};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt as _, Full, Limited};
use hyper::body::{Body as _, Incoming};
use hyper::service::service_fn;
use hyper_util::client::legacy::{Client, connect::HttpConnector};
use hyper_util::rt::{TokioExecutor, TokioIo};

type Body = BoxBody<Bytes, hyper::Error>;
type Upstreams = Client<HttpConnector, Full<Bytes>>;

/// What each request is handled with.
#[derive(Clone)]
pub struct Proxy {
    /// The slot grid publishes each refresh's view into.
    pub routes: Published,
    /// grid's decision series, counted by [`decide`].
    pub score: ScoreMetrics,
    /// Your client toward the sites.
    pub client: Upstreams,
    /// `bodyLimitBytes`: the body is held to find its model, so it is bounded.
    pub body_limit: usize,
    /// `clientBodyTimeoutSeconds`: the whole body, from the head.
    pub body_timeout: Duration,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let path = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "gateway.toml".into());
    let config = Config::load(path.as_ref())?;
    let listener = tokio::net::TcpListener::bind(config.listen).await?;
    serve(&config, listener).await
}

/// Serves `listener` with grid routing every request, until the listener fails.
///
/// # Errors
///
/// When grid's signals cannot be built from `config`, or accepting fails.
pub async fn serve(config: &Config, listener: tokio::net::TcpListener) -> anyhow::Result<()> {
    let mut registry = prometheus_client::registry::Registry::default();
    // Operator mTLS client, store, scorer and feedback reporter; the slot they publish to.
    let signals = Signals::new(config, &mut registry)?;
    let proxy = Proxy {
        routes: signals.published().clone(),
        score: signals.score_metrics().clone(),
        client: Client::builder(TokioExecutor::new()).build(HttpConnector::new()),
        body_limit: config.body_limit_bytes,
        body_timeout: Duration::from_millis(config.client_body_timeout_ms),
    };
    let _poller = signals.spawn(); // poll only once we serve
    loop {
        let (stream, _) = listener.accept().await?;
        let proxy = proxy.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req| handle(proxy.clone(), req));
            let conn = hyper::server::conn::http1::Builder::new();
            let _ = conn.serve_connection(TokioIo::new(stream), svc).await;
        });
    }
}

/// Your proxy's handler with grid's decision in the middle.
async fn handle(proxy: Proxy, req: Request<Incoming>) -> Result<Response<Body>, hyper::Error> {
    let declared = req.body().size_hint().lower();
    match admit(req.method(), req.uri().path(), declared, proxy.body_limit) {
        Ok(Target::Proxied) => {}
        // This proxy serves only the routes grid proxies.
        Ok(_) => return Ok(refused(&unknown_route(req.uri().path()))),
        Err(refusal) => return Ok(refused(&refusal)),
    }
    let (mut parts, body) = req.into_parts();
    let read = tokio::time::timeout(
        proxy.body_timeout,
        Limited::new(body, proxy.body_limit).collect(),
    );
    let body = match read.await {
        Ok(Ok(body)) => body.to_bytes(),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => {
            return Ok(refused(&Refusal::too_large(proxy.body_limit)));
        }
        Ok(Err(e)) => return Ok(refused(&Refusal::unreadable_body(&e))),
        Err(_) => return Ok(refused(&Refusal::body_timeout(proxy.body_timeout))),
    };
    let model = match model_of(&body) {
        Ok(model) => model.into_owned(),
        Err(refusal) => return Ok(refused(&refusal)),
    };
    let view = proxy.routes.load(); // one atomic load; no lock, no store read
    let upstream = match decide(&view, &proxy.score, &model) {
        Ok(routed) => routed.upstream,
        Err(refusal) => return Ok(refused(&refusal)),
    };
    let pq = parts
        .uri
        .path_and_query()
        .cloned()
        .unwrap_or_else(|| http::uri::PathAndQuery::from_static("/"));
    let Ok(uri) = uri_for(upstream, &pq) else {
        return Ok(refused(&Refusal::upstream_failed(&model)));
    };
    parts.uri = uri;
    parts.headers.remove(header::HOST);
    grid_gateway::headers::sanitize_request(&mut parts.headers);
    let site = grid_gateway::headers::site_value(&upstream.site);
    // Counted at its site from here until the answer's body is dropped (its end, or the
    // client gone): every pick reads how many requests each site it draws holds.
    let in_flight = upstream.in_flight();
    match proxy
        .client
        .request(Request::from_parts(parts, Full::new(body)))
        .await
    {
        Ok(resp) => {
            let mut resp = resp.map(|body| {
                body.map_frame(move |frame| {
                    let _counted = &in_flight;
                    frame
                })
                .boxed()
            });
            if let Some(site) = site {
                resp.headers_mut()
                    .insert(grid_gateway::headers::SITE_HEADER, site);
            }
            Ok(resp)
        }
        Err(_) => Ok(refused(&Refusal::upstream_failed(&model))),
    }
}

/// grid's refusal, as every grid front end answers it.
fn refused(refusal: &Refusal) -> Response<Body> {
    refusal
        .to_response::<Full<Bytes>>()
        .map(|b| b.map_err(|never| match never {}).boxed())
}
