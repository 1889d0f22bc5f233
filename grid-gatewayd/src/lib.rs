//! The gateway daemon: grid-gateway's front ends with their own I/O.
//!
//! # I/O boundary
//!
//! This crate owns the gateway's listeners and the connections on them: it serves
//! OpenAI-style requests (HTTP/1.1 with its own server over `grid-h1-wire`, HTTP/2 with
//! hyper's), Envoy's external processor (gRPC), and proxies to sites in the clear over
//! its own pools. What it routes with, and how it refuses, is grid-gateway's
//! ([`grid_gateway::Signals`], [`grid_gateway::pick`], [`grid_gateway::refusal`]); no
//! routing rule lives here.
//!
//! # Data flow
//!
//! ```text
//! operator relay --grid_gateway::Signals (poll)--> Published (arc-swap)
//! request --load snapshot once--> pick --> proxy to the chosen site (x-grid-site)
//! skew drops --Reporter--> POST /v1/site/signals/ingest
//! ```
//!
//! # Public API
//!
//! [`driver::start`] with a [`grid_gateway::Config`] gives a [`driver::Running`]
//! (`shutdown`, its address, routing slot and metric handles);
//! [`engine::client::limits`] shows the listener's limits. The request path and the
//! accept loop are private. A proxy that keeps its own HTTP server embeds grid-gateway
//! instead (`docs/embedding.md`).

pub mod driver;
pub mod engine;
pub mod front_ends;
pub mod status;
