//! The gateway: composes the pure crates with I/O and proxies requests.
//!
//! # I/O boundary
//!
//! This crate owns the gateway's clocks, sockets and TLS: it polls its local operator's
//! `GET /v1/site/signals` over mutual TLS, feeds each body to the `grid-signals` store,
//! publishes the `grid-score` snapshot atomically, serves OpenAI-style requests with hyper
//! and reports rejected readings back through `grid-feedback`.
//!
//! # Data flow
//!
//! ```text
//! operator relay --poll--> store --refresh--> RouteSnapshot (arc-swap)
//! request --load snapshot once--> pick --> proxy to the chosen site (x-grid-site)
//! skew drops --Reporter--> POST /v1/site/signals/ingest
//! ```

mod answer_timing;
pub mod api_error;
pub mod catalog;
pub mod clock;
pub mod config;
pub mod driver;
mod error;
pub mod gateway_tls;
pub mod headers;
pub mod http_api;
pub mod model_field;
pub mod poller;
pub mod refresh;
pub mod request_metrics;
pub mod request_rng;
pub mod routing;
pub mod server;
pub mod upstream;

pub use config::Config;
pub use error::Error;
