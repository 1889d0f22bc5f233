//! grid inside a Pingora proxy.
//!
//! A Pingora user picks upstreams with a `LoadBalancer<S>` whose `S` is a
//! `BackendSelection` (round-robin, Ketama) and keeps them healthy with a `HealthCheck`.
//! This crate answers both from grid's routing view, so grid plugs in the same way:
//!
//! - [`GridSelection`]: a `BackendSelection` whose key is the request's model; its first
//!   backend is grid's pick, its second the site a refused connection is retried on.
//! - [`GridHealth`]: a `HealthCheck` that calls a backend healthy while grid routes to its
//!   site (ready endpoints, fresh signals, not excluded).
//! - [`SiteBackends`]: the backends themselves, one per site of the catalog.
//! - [`SignalsService`]: grid's poller as a Pingora background service.
//!
//! - [`proxy`]: the whole proxy, a Pingora server the `grid-pingora` binary runs;
//!   `docs/embedding.md` counts its routing lines.
//!
//! # I/O boundary
//!
//! None here beyond what grid-gateway's `Signals` does (the operator poll, on the
//! background service's runtime): selection and health read the published view with one
//! atomic load each, no lock, no store read. Addresses are a site's base URL authority,
//! resolved by the OS when the backends are listed, off the request path.
//!
//! # Data flow
//!
//! ```text
//! operator relay --Signals (SignalsService)--> Published (arc-swap)
//! request: model --GridSelection::iter--> Published.load().pick --> Backend (ext: SiteOf, ChosenFor)
//! sent: Backend's ChosenFor --in_flight--> the site's live slot, until the request ends
//! health pass: Backend --GridHealth::check--> Published.load().table()
//! ```

mod backends;
mod error;
mod health;
pub mod proxy;
pub mod refusal;
mod selection;
mod signals_service;

pub use backends::{SiteBackends, SiteOf, backend_of, peer_of};
pub use error::Error;
pub use health::GridHealth;
pub use refusal::{MAX_REPLAYED_BODY_BYTES, body_limit, refusal};
pub use selection::{ChosenFor, GridIter, GridSelection};
pub use signals_service::SignalsService;
