//! `grid-pingora`: a Pingora proxy that sends each OpenAI-style request to the site grid
//! picks. Run: `grid-pingora gateway.toml` (the gateway's own configuration file: its
//! `listen`, `operator`, `tls` and `models`).
//!
//! grid plugs in as round-robin or Ketama would: a `LoadBalancer<GridSelection>` whose
//! key is the request's model, its backends grid's sites, grid's poller a background
//! service beside it. The routing is `request_filter` and `upstream_peer` below.

use std::time::Duration;

use anyhow::Context as _;
use async_trait::async_trait;
use bytes::Bytes;
use grid_gatewayd::Config;
use grid_gatewayd::driver::Signals;
use grid_gatewayd::upstream::Published;
use grid_pingora::{GridSelection, SignalsService, SiteBackends, SiteOf, peer_of, refusal};
use grid_score::model_field::find_model;
use pingora_core::ErrorType::ConnectNoRoute;
use pingora_core::server::Server;
use pingora_core::services::background::{GenBackgroundService, background_service};
use pingora_core::upstreams::peer::HttpPeer;
use pingora_core::{Error, Result};
use pingora_http::{RequestHeader, ResponseHeader};
use pingora_load_balancing::{Backend, Backends, LoadBalancer};
use pingora_proxy::{ProxyHttp, Session, http_proxy_service};
use std::sync::Arc;

/// How long a client has to send its whole request body: the model is in it, so nothing
/// is routed before it is read.
const BODY_TIMEOUT: Duration = Duration::from_secs(30);

/// The largest body read to find the model: Pingora's retry buffer, which replays it
/// upstream, holds this much (`BODY_BUF_LIMIT`); a longer body is refused 413.
const MAX_BODY_BYTES: usize = 64 * 1024;

/// How often the sites are listed again (a model reload may add one).
const REDISCOVER_EVERY: Duration = Duration::from_secs(10);

/// Backends at most tried per request: grid's pick, then its retry site.
const MAX_TRIES: usize = 2;

/// The proxy: grid's balancer and the routing slot it reads.
struct GridProxy {
    balancer: Arc<LoadBalancer<GridSelection>>,
    routes: Published,
    /// The gateway's `clientWriteTimeoutSeconds`: a client that takes nothing of its answer
    /// for this long has its request ended (Pingora's own downstream write timeout, reset
    /// by every write), which drops the site's answer.
    write_timeout: Duration,
}

#[async_trait]
impl ProxyHttp for GridProxy {
    /// The backend grid chose for this request.
    type CTX = Option<Backend>;

    fn new_ctx(&self) -> Self::CTX {
        None
    }

    async fn request_filter(&self, session: &mut Session, ctx: &mut Self::CTX) -> Result<bool> {
        session.set_read_timeout(Some(BODY_TIMEOUT));
        session.set_write_timeout(Some(self.write_timeout));
        session.enable_retry_buffering();
        while session.read_request_body().await?.is_some() {}
        if session.retry_buffer_truncated() {
            return answer(session, refusal::too_large(MAX_BODY_BYTES)).await;
        }
        let body = session.get_retry_buffer().unwrap_or_default();
        let model = match find_model(&body) {
            Ok(model) => model,
            Err(e) => return answer(session, refusal::no_model(&e.to_string())).await,
        };
        *ctx = self.balancer.select(model.as_bytes(), MAX_TRIES);
        // Only a request grid gave no site asks why (the pick again, tens of nanoseconds).
        let refused = ctx.is_none().then(|| refusal(&self.routes.load(), &model));
        match refused.flatten() {
            Some(refused) => answer(session, refused).await,
            None => Ok(false),
        }
    }

    async fn upstream_peer(&self, _: &mut Session, ctx: &mut Self::CTX) -> Result<Box<HttpPeer>> {
        let backend = ctx
            .as_ref()
            .ok_or_else(|| Error::explain(ConnectNoRoute, "no site"))?;
        Ok(Box::new(peer_of(backend)))
    }

    async fn upstream_request_filter(
        &self,
        _: &mut Session,
        request: &mut RequestHeader,
        _: &mut Self::CTX,
    ) -> Result<()> {
        // Clients must not forge routing headers downstream.
        request.remove_header(grid_gatewayd::headers::SITE_HEADER.as_str());
        Ok(())
    }

    async fn response_filter(
        &self,
        _: &mut Session,
        response: &mut ResponseHeader,
        ctx: &mut Self::CTX,
    ) -> Result<()> {
        if let Some(site) = ctx.as_ref().and_then(|b| b.ext.get::<SiteOf>()) {
            response.insert_header(grid_gatewayd::headers::SITE_HEADER, &*site.site)?;
        }
        Ok(())
    }
}

/// Writes grid's refusal as the whole answer; `Ok(true)`: the request is done.
async fn answer(session: &mut Session, refused: http::Response<Bytes>) -> Result<bool> {
    let (parts, body) = refused.into_parts();
    let mut head = ResponseHeader::build(parts.status, Some(parts.headers.len() + 1))?;
    for (name, value) in &parts.headers {
        head.insert_header(name.clone(), value.clone())?;
    }
    head.insert_header(http::header::CONTENT_LENGTH, body.len())?;
    session.write_response_header(Box::new(head), false).await?;
    session.write_response_body(Some(body), true).await?;
    Ok(true)
}

fn main() -> anyhow::Result<()> {
    let path = std::env::args()
        .nth(1)
        .context("usage: grid-pingora GATEWAY_CONFIG")?;
    let config = Config::load(path.as_ref())?;
    let mut registry = prometheus_client::registry::Registry::default();
    let signals = Signals::new(&config, &mut registry)?;
    let routes = signals.published().clone();

    let sites = Backends::new(Box::new(SiteBackends::new(routes.clone())));
    let mut balancer =
        LoadBalancer::<GridSelection>::from_backends_with_config(sites, Some(routes.clone()));
    balancer.update_frequency = Some(REDISCOVER_EVERY);
    let balancer: GenBackgroundService<LoadBalancer<GridSelection>> =
        background_service("grid sites", balancer);

    let mut server = Server::new(None)?;
    server.bootstrap();
    let mut proxy = http_proxy_service(
        &server.configuration,
        GridProxy {
            balancer: balancer.task(),
            routes,
            write_timeout: Duration::from_millis(config.client_write_timeout_ms),
        },
    );
    proxy.add_tcp(&config.listen.to_string());
    server.add_service(proxy);
    server.add_service(balancer);
    server.add_service(background_service(
        "grid signals",
        SignalsService::new(signals),
    ));
    println!("grid-pingora serving on {}", config.listen);
    server.run_forever()
}
