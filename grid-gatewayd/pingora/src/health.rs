//! grid's view of a site as a Pingora `HealthCheck`.
//!
//! grid already knows whether a site can serve (its operator's readiness, fresh signals,
//! the gateway's own evidence); probing it again from Pingora would only be a second,
//! weaker opinion. [`GridHealth`] reports grid's: a backend is healthy while at least one
//! model routes to its site. A Pingora user who keeps round-robin or Ketama for the pick
//! still gets grid's exclusions this way.

use async_trait::async_trait;
use grid_gateway::upstream::Published;
use pingora_load_balancing::Backend;
use pingora_load_balancing::health_check::HealthCheck;

use crate::SiteOf;

/// Health as grid sees it.
#[derive(Clone, Debug)]
pub struct GridHealth {
    published: Published,
}

impl GridHealth {
    /// Reads whatever view `published` holds at each check.
    pub fn new(published: Published) -> Self {
        Self { published }
    }

    /// Whether grid routes any model to `site` now.
    pub fn routes_to(&self, site: &str) -> bool {
        let view = self.published.load();
        view.catalog().models().iter().any(|m| {
            view.table()
                .get(&m.name)
                .is_some_and(|s| s.candidates().iter().any(|c| &**c.site() == site))
        })
    }
}

#[async_trait]
impl HealthCheck for GridHealth {
    async fn check(&self, target: &Backend) -> pingora_core::Result<()> {
        let Some(of) = target.ext.get::<SiteOf>() else {
            return Err(pingora_core::Error::explain(
                pingora_core::ErrorType::InternalError,
                "a backend grid did not list",
            ));
        };
        if self.routes_to(&of.site) {
            Ok(())
        } else {
            Err(pingora_core::Error::explain(
                pingora_core::ErrorType::ConnectRefused,
                format!("grid routes nothing to site {}", of.site),
            ))
        }
    }

    /// grid's view already smooths over single readings: one check flips it.
    fn health_threshold(&self, _success: bool) -> usize {
        1
    }
}
