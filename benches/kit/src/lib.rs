//! The whole-system kit: shared pieces of the criterion benches, the routing simulator,
//! the simulated sites and the local-grid demo.
//!
//! # I/O boundary
//!
//! Unlike the pure crates, this crate may read clocks and open loopback sockets: it plays
//! the world around grid (EPPs, model servers, load generators). It never sends traffic
//! anywhere but loopback. The clock is read in one place, [`clock`].
//!
//! # Data flow
//!
//! ```text
//! site_model (slots, queues, flow-control bands, service times; time as a parameter)
//!     |-- fake_epp: the EPP /metrics text its state would produce
//!     |-- sim_site: a loopback OpenAI-compatible server living by the model in real time,
//!     |             with /metrics from fake_epp and a control handle
//!     `-- routing_sim: sites in virtual time, signals through the real grid-signals and
//!                      grid-score paths, policies compared (the `grid-sim` binary)
//! ```
//!
//! Randomness comes from [`sim_rng::SimRng`], seeded, so every run replays.

pub mod clock;
pub mod demo;
pub mod epp_exposition;
mod error;
pub mod fake_epp;
pub mod instant_upstream;
pub mod latency;
pub mod load;
pub mod local_grid;
pub mod pki;
pub mod routing_sim;
pub mod sim_rng;
pub mod sim_site;
pub mod site_model;

pub use error::Error;
