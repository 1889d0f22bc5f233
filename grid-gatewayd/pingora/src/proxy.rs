//! The whole proxy: Pingora's HTTP proxy service with grid's balancer choosing the
//! backend, grid's poller beside it as a background service. The `grid-pingora` binary
//! runs [`server`]'s answer until a signal; a test runs it until its own.
//!
//! The routing is `request_filter` and `upstream_peer` below: the head judged by
//! grid-gateway's routes, the body read (to `bodyLimitBytes`) for its model, the
//! balancer's first backend grid's pick; a request grid sends nowhere is refused with
//! grid-gateway's refusal, as every grid front end refuses it.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use grid_gateway::Config;
use grid_gateway::Signals;
use grid_gateway::refusal::{Refusal, model_of};
use grid_gateway::routes::{Target, admit, unknown_route};
use grid_gateway::upstream::Published;
use pingora_core::ErrorType::ConnectNoRoute;
use pingora_core::server::Server;
use pingora_core::services::background::{GenBackgroundService, background_service};
use pingora_core::upstreams::peer::HttpPeer;
use pingora_core::{Error, Result};
use pingora_http::{RequestHeader, ResponseHeader};
use pingora_load_balancing::{Backend, Backends, LoadBalancer};
use pingora_proxy::{ProxyHttp, Session, http_proxy_service};

use crate::{
    ChosenFor, GridSelection, SignalsService, SiteBackends, SiteOf, body_limit, peer_of, refusal,
};

/// How often the sites are listed again (a model reload may add one).
const REDISCOVER_EVERY: Duration = Duration::from_secs(10);

/// Backends at most tried per request: grid's pick, then its retry site.
const MAX_TRIES: usize = 2;

/// The proxy: grid's balancer and the routing slot it reads.
pub struct GridProxy {
    balancer: Arc<LoadBalancer<GridSelection>>,
    routes: Published,
    /// The gateway's `clientWriteTimeoutSeconds`: a client that takes nothing of its answer
    /// for this long has its request ended (Pingora's own downstream write timeout, reset
    /// by every write), which drops the site's answer.
    write_timeout: Duration,
    /// The gateway's `bodyLimitBytes` (at most what Pingora can replay upstream).
    body_limit: usize,
    /// The gateway's `clientBodyTimeoutSeconds`: the whole body, from the head. The model
    /// is in it, so nothing is routed before it is read.
    body_timeout: Duration,
}

/// One request's routing: the backend grid chose, and while the request is sent there,
/// its count in flight at that site.
#[derive(Default)]
pub struct Chosen {
    backend: Option<Backend>,
    /// Dropped with the context when Pingora is done with the request, however it ended.
    in_flight: Option<grid_score::live::InFlight>,
}

#[async_trait]
impl ProxyHttp for GridProxy {
    type CTX = Chosen;

    fn new_ctx(&self) -> Self::CTX {
        Chosen::default()
    }

    async fn request_filter(&self, session: &mut Session, ctx: &mut Self::CTX) -> Result<bool> {
        session.set_write_timeout(Some(self.write_timeout));
        // The head alone: 404 and 405 as the daemon's routes say (only the proxied routes
        // are served here), 413 for a declared length above the limit.
        let head = session.req_header();
        let declared = head
            .headers
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
            .unwrap_or(0);
        match admit(&head.method, head.uri.path(), declared, self.body_limit) {
            Ok(Target::Proxied) => {}
            Ok(_) => return answer(session, &unknown_route(head.uri.path())).await,
            Err(refused) => return answer(session, &refused).await,
        }
        session.enable_retry_buffering();
        let limit = self.body_limit;
        let read = tokio::time::timeout(self.body_timeout, async {
            let mut length = 0;
            while let Some(chunk) = session.read_request_body().await? {
                length += chunk.len();
                if length > limit {
                    return Ok(false);
                }
            }
            Ok::<_, Box<Error>>(true)
        });
        match read.await {
            Ok(Ok(true)) => {}
            Ok(Ok(false)) => return answer(session, &Refusal::too_large(limit)).await,
            Ok(Err(e)) => return answer(session, &Refusal::unreadable_body(&e)).await,
            Err(_) => return answer(session, &Refusal::body_timeout(self.body_timeout)).await,
        }
        let body = session.get_retry_buffer().unwrap_or_default();
        let model = match model_of(&body) {
            Ok(model) => model,
            Err(refused) => return answer(session, &refused).await,
        };
        ctx.backend = self.balancer.select(model.as_bytes(), MAX_TRIES);
        // Only a request grid gave no site asks why (the pick again, tens of nanoseconds).
        let refused = ctx
            .backend
            .is_none()
            .then(|| refusal(&self.routes.load(), &model));
        match refused.flatten() {
            Some(refused) => answer_with(session, refused).await,
            None => Ok(false),
        }
    }

    /// Called for every attempt: a new attempt ends the last one's count before its own.
    async fn upstream_peer(&self, _: &mut Session, ctx: &mut Self::CTX) -> Result<Box<HttpPeer>> {
        let backend = ctx
            .backend
            .as_ref()
            .ok_or_else(|| Error::explain(ConnectNoRoute, "no site"))?;
        ctx.in_flight = None;
        ctx.in_flight = backend.ext.get::<ChosenFor>().map(|c| c.0.in_flight());
        Ok(Box::new(peer_of(backend)))
    }

    async fn upstream_request_filter(
        &self,
        _: &mut Session,
        request: &mut RequestHeader,
        _: &mut Self::CTX,
    ) -> Result<()> {
        // Clients must not forge routing headers downstream.
        request.remove_header(grid_gateway::headers::SITE_HEADER.as_str());
        Ok(())
    }

    async fn response_filter(
        &self,
        _: &mut Session,
        response: &mut ResponseHeader,
        ctx: &mut Self::CTX,
    ) -> Result<()> {
        if let Some(site) = ctx.backend.as_ref().and_then(|b| b.ext.get::<SiteOf>()) {
            response.insert_header(grid_gateway::headers::SITE_HEADER, &*site.site)?;
        }
        Ok(())
    }
}

/// Writes `refused` as the whole answer; `Ok(true)`: the request is done.
async fn answer(session: &mut Session, refused: &Refusal) -> Result<bool> {
    answer_with(session, refused.to_response()).await
}

/// Writes grid's refusal as the whole answer; `Ok(true)`: the request is done.
async fn answer_with(session: &mut Session, refused: http::Response<Bytes>) -> Result<bool> {
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

/// The proxy for `config` (the gateway's own configuration: its `listen`, `operator`,
/// `tls`, `models` and client bounds) as a Pingora server, bootstrapped and ready to run.
///
/// # Errors
///
/// When `config`'s body limit is above what Pingora can replay, grid's signals cannot
/// be built from it (TLS files, operator URL), or Pingora cannot make its server.
pub fn server(config: &Config) -> std::result::Result<Server, crate::Error> {
    let body_limit = body_limit(config)?;
    let mut registry = prometheus_client::registry::Registry::default();
    let signals = Signals::new(config, &mut registry)?;
    let routes = signals.published().clone();

    let sites = Backends::new(Box::new(SiteBackends::new(routes.clone())));
    let mut balancer =
        LoadBalancer::<GridSelection>::from_backends_with_config(sites, Some(routes.clone()));
    balancer.update_frequency = Some(REDISCOVER_EVERY);
    let balancer: GenBackgroundService<LoadBalancer<GridSelection>> =
        background_service("grid sites", balancer);

    let mut server = Server::new(None).map_err(crate::Error::Pingora)?;
    server.bootstrap();
    let mut proxy = http_proxy_service(
        &server.configuration,
        GridProxy {
            balancer: balancer.task(),
            routes,
            write_timeout: Duration::from_millis(config.client_write_timeout_ms),
            body_limit,
            body_timeout: Duration::from_millis(config.client_body_timeout_ms),
        },
    );
    proxy.add_tcp(&config.listen.to_string());
    server.add_service(proxy);
    server.add_service(balancer);
    server.add_service(background_service(
        "grid signals",
        SignalsService::new(signals),
    ));
    Ok(server)
}
