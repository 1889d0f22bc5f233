//! The gateway: composes the pure crates with I/O and proxies requests.
//!
//! # I/O boundary
//!
//! This crate owns the gateway's clocks, sockets and TLS: it polls its local operator's
//! `GET /v1/site/signals` over mutual TLS, feeds each body to grid-score's routing core
//! (`grid_score::refresh::Refresher`: store, scorer, live slots), publishes its view
//! atomically, serves OpenAI-style requests (HTTP/1.1 with its own server over
//! `grid-h1-wire`, HTTP/2 with hyper's) and reports rejected readings back
//! through `grid-feedback`. No routing rule lives here.
//!
//! # Data flow
//!
//! ```text
//! operator relay --poll--> grid-score Refresher --refresh--> RoutingView (arc-swap)
//! request --load snapshot once--> pick --> proxy to the chosen site (x-grid-site)
//! skew drops --Reporter--> POST /v1/site/signals/ingest
//! ```

//!
//! # Public API
//!
//! [`driver::start`] with a [`Config`] gives a [`driver::Running`] (`shutdown`, its
//! address, routing slot and metric handles). What an embedding proxy needs
//! (`docs/embedding.md`): [`driver::Signals`] (the poller without the HTTP server),
//! [`upstream`] (the published slot, `uri_for`, the site client), [`trust`], [`headers`],
//! [`api_error`], [`request_rng`]; [`server`] shows the listener's limits. The request
//! path and the accept loop are private; the routing core itself is grid-score's.

mod answer_evidence;
mod answer_timing;
pub mod api_error;
mod client_h1;
mod client_write_bound;
pub mod clock;
pub mod coalesce_body;
pub mod config;
mod connection_watch;
mod deadline_timer;
pub mod driver;
mod error;
mod evidence;
pub mod ext_proc;
pub mod headers;
mod http2_streams;
mod http_api;
mod idle_body;
pub mod poller;
mod request_body;
mod request_metrics;
pub mod request_rng;
pub mod server;
mod site_pool;
mod site_slots;
pub mod status;
pub mod trust;
pub mod upstream;
mod when_woken;

pub use config::Config;
pub use error::Error;
