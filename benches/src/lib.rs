//! The whole-system kit: shared pieces of the criterion benches, the routing simulator,
//! the simulated sites and the local-grid demo.
//!
//! # I/O boundary
//!
//! Unlike the pure crates, this crate may read clocks and open loopback sockets: it plays
//! the world around grid (EPPs, model servers, load generators). It never sends traffic
//! anywhere but loopback.

pub mod clock;
pub mod epp_exposition;
