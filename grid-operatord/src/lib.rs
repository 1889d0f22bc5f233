//! The site operator: composes the pure crates with I/O.
//!
//! # I/O boundary
//!
//! This crate owns every clock, socket, file and TLS session on the operator side: it
//! scrapes EPP `/metrics` (hyper), serves `GET /v1/site/signals` and
//! `POST /v1/site/signals/ingest` over mutual TLS (rustls), polls peer operators, persists
//! its high-water marks and feedback state, and exports Prometheus `/metrics`. All
//! decisions are made by `grid-signals` (the site machine `grid_signals::site::Site`:
//! framing, the two stores, what a peer may see) and `grid-feedback`, fed by the driver
//! with `now`.
//! The clocks are read in [`clock`] only.
//!
//! # Data flow
//!
//! ```text
//! EPP /metrics --scrape--> Site::handle(Scraped) --batch--> own + all stores
//! peer operators --poll--> Site::handle(PeerBody) --> all store
//! GET /v1/site/signals --Site::relay(Local | Peer)--> local gateway / peers
//! local gateway --POST ingest--> grid-feedback::Receiver --persist--> 204 echo
//! ```

//!
//! # Public API
//!
//! [`driver::start`] with a [`config::Config`] (from a [`config::ConfigSource`]) and a
//! [`state::StateStore`] gives a [`driver::Running`] (`wait`, `shutdown`, its addresses,
//! stores and metric handles). In Kubernetes, [`controller`] builds that `Config` from
//! the namespace's custom resources ([`controller::source::KubeConfigSource`]), keeps the
//! state in the API server ([`controller::state_store::KubeStateStore`]) and supervises
//! the same driver ([`controller::run::run`]); see `docs/crds.md`.
//! `listener`, `slots`, `peers` and `signals` stay public for
//! the whole-operator tests that drive them on loopback; the scrape loop, the feedback
//! writer and the trust wiring are private.

mod bind;
pub mod config;
pub mod controller;
pub mod driver;
mod error;
pub mod evidence;
mod feedback;
pub mod gossip;
pub mod listener;
mod live;
pub mod membership;
pub mod metrics;
pub mod peer_ledger;
pub mod peers;
mod providers;
mod scrape;
pub mod served;
pub mod signals;
pub mod site_machine;
pub mod slots;
pub mod state;
mod trust;

pub use error::Error;
pub use providers::{Verdict, Verdicts};

pub use grid_daemon::clock;
