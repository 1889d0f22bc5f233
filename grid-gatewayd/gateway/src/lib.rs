//! The gateway as a library: everything a proxy needs to route with grid, and nothing
//! of any particular HTTP server.
//!
//! The grid-gatewayd daemon (its own HTTP/1.1 server, hyper's HTTP/2, its Envoy
//! external processor), grid-pingora and `examples/embedded_proxy.rs` are front ends
//! of this crate: each one loads the published view once per request, picks, and
//! refuses through [`refusal`], so the same request gets the same answer from each.
//!
//! # I/O boundary
//!
//! [`signals::Signals`] owns this crate's I/O: it reads the TLS files, polls the
//! operator's `GET /v1/site/signals` over mutual TLS on the caller's tokio runtime,
//! posts ingest feedback back, and publishes each refresh's view into an `ArcSwap`.
//! [`upstream`] builds the clients toward sites; [`clock`] (grid-daemon's) is the one place it
//! reads time. Everything else here is pure: [`config`] parses and checks, [`routes`]
//! and [`refusal`] judge a request, [`pick`] reads one snapshot. No routing rule lives
//! here: the routing core is grid-score's.
//!
//! # Data flow
//!
//! ```text
//! gateway.toml --config::Config--> signals::Signals::new --spawn--> poll loop
//! operator relay --poll--> grid-score Refresher --refresh--> Published (arc-swap)
//! request head --routes::admit--> Target | Refusal (404, 405, 413)
//! request body --refusal::model_of--> model --pick::decide(Published.load())--> Upstream | Refusal
//! Upstream --upstream::uri_for--> the site's URI; headers::sanitize_request, x-grid-site
//! ```

pub use grid_daemon::clock;
pub mod config;
mod error;
pub mod headers;
pub mod pick;
pub mod poller;
pub mod refusal;
pub mod request_rng;
pub mod routes;
pub mod signals;
pub mod trust;
pub mod upstream;

pub use config::Config;
pub use error::Error;
pub use signals::Signals;
