//! Embedding grid in a proxy you already run: your hyper server, grid's poller, snapshot
//! and pick. Run: `cargo run -p grid-gatewayd --example embedded_proxy -- gateway.toml`.
//!
//! grid polls the operator in the background and publishes a routing view; each request
//! loads that view once, picks a site and is forwarded there. No grid HTTP server is used.

use bytes::Bytes;
use grid_gatewayd::Config;
use grid_gatewayd::driver::Signals;
use grid_gatewayd::request_rng::ThreadRng;
use grid_gatewayd::upstream::{Published, uri_for};
use grid_score::model_field::find_model;
use grid_score::routing::Route;
use http::{Request, Response, StatusCode, header};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::client::legacy::{Client, connect::HttpConnector};
use hyper_util::rt::{TokioExecutor, TokioIo};

type Body = BoxBody<Bytes, hyper::Error>;
type Upstreams = Client<HttpConnector, Full<Bytes>>;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let path = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "gateway.toml".into());
    let config = Config::load(path.as_ref())?;
    let mut registry = prometheus_client::registry::Registry::default();
    // Operator mTLS client, store, scorer and feedback reporter; the slot they publish to.
    let signals = Signals::new(&config, &mut registry)?;
    let routes = signals.published().clone();
    let client: Upstreams = Client::builder(TokioExecutor::new()).build(HttpConnector::new());

    let listener = tokio::net::TcpListener::bind(config.listen).await?;
    let _poller = signals.spawn(); // poll only once we serve
    loop {
        let (stream, _) = listener.accept().await?;
        let (routes, client) = (routes.clone(), client.clone());
        tokio::spawn(async move {
            let svc = service_fn(move |req| proxy(routes.clone(), client.clone(), req));
            let conn = hyper::server::conn::http1::Builder::new();
            let _ = conn.serve_connection(TokioIo::new(stream), svc).await;
        });
    }
}

/// Your proxy's handler with grid's decision in the middle.
async fn proxy(
    routes: Published,
    client: Upstreams,
    req: Request<Incoming>,
) -> Result<Response<Body>, hyper::Error> {
    let (mut parts, body) = req.into_parts();
    let body = body.collect().await?.to_bytes(); // a real proxy bounds this (Limited)
    let Ok(model) = find_model(&body) else {
        return Ok(answer(StatusCode::BAD_REQUEST));
    };
    let view = routes.load(); // one atomic load; no lock, no store read
    let decision = view.pick(&model, &mut ThreadRng);
    let upstream = match view.route(&model, &decision) {
        Route::To { upstream, .. } => upstream,
        Route::Shed { .. } => return Ok(answer(StatusCode::TOO_MANY_REQUESTS)),
        Route::Unavailable { .. } => return Ok(answer(StatusCode::SERVICE_UNAVAILABLE)),
        Route::UnknownModel => return Ok(answer(StatusCode::NOT_FOUND)),
    };
    let pq = parts
        .uri
        .path_and_query()
        .cloned()
        .unwrap_or_else(|| "/".parse().unwrap());
    let Ok(uri) = uri_for(upstream, &pq) else {
        return Ok(answer(StatusCode::BAD_REQUEST));
    };
    parts.uri = uri;
    parts.headers.remove(header::HOST);
    let site = upstream.site.to_string();
    match client
        .request(Request::from_parts(parts, Full::new(body)))
        .await
    {
        Ok(resp) => {
            let mut resp = resp.map(http_body_util::BodyExt::boxed);
            if let Ok(v) = site.parse() {
                resp.headers_mut().insert("x-grid-site", v);
            }
            Ok(resp)
        }
        Err(_) => Ok(answer(StatusCode::BAD_GATEWAY)),
    }
}

fn answer(status: StatusCode) -> Response<Body> {
    let mut r = Response::new(
        Full::new(Bytes::new())
            .map_err(|never| match never {})
            .boxed(),
    );
    *r.status_mut() = status;
    r
}
