//! The routing simulator: grid's production cores in virtual time.
//!
//! # I/O boundary
//!
//! No sockets and no clocks in the simulation: sites are models advanced by a virtual
//! `now`, and every signal crosses the same pure machines the daemons run
//! (`grid_signals::site::Site` for each operator, `grid_score::refresh::Refresher` for
//! each gateway). The `grid-sim` binary reads scenario files and writes its report;
//! [`clock`] times the component benches and is the one clock read.
//!
//! # Data flow
//!
//! ```text
//! site_model (slots, queues, flow-control bands, service times; time as a parameter)
//!     |-- fake_epp: the EPP /metrics text its state would produce
//!     `-- routing_sim: sites in virtual time, signals through the production cores,
//!                      policies compared (the `grid-sim` binary)
//! epp_exposition: a synthetic EPP body for the exposition bench
//! provider_batches: operators' publications for the store and signal-plane benches
//! ```
//!
//! Randomness comes from [`sim_rng::SimRng`], seeded, so every run replays. The loopback
//! kit (`grid-kit`) runs the same site model in real time behind real sockets.

pub mod clock;
pub mod epp_exposition;
mod error;
pub mod fake_epp;
pub mod provider_batches;
pub mod routing_sim;
pub mod sim_rng;
pub mod site_model;
pub mod swim_scale;

pub use error::Error;
