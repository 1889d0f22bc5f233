//! Which site gets the next request.
//!
//! # I/O boundary
//!
//! Pure: time arrives as a `now` parameter and randomness through the crate's `Rng`
//! trait, so tests and the routing simulator replay exactly. No sockets, clocks or locks.
//!
//! # Data flow
//!
//! ```text
//! store readings + revision events --learner--> capacity, rho per site/provider
//!                                   --refresh--> immutable RouteSnapshot per model (off the request path)
//! request --pick(snapshot, rng)--> route to site / shed (429) / unavailable (503) / unknown model
//! ```
#![deny(clippy::disallowed_methods)]
