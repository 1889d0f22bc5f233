//! The programs a person runs against a whole local grid, each a module with its binary
//! in `src/bin/`: the demo ([`demo`], `grid-demo`), the fault suite ([`fault_suite`],
//! `grid-faults`), the proxy comparison against nginx and Envoy ([`proxy_compare`],
//! `grid-proxy-compare`), gossip at scale with real operators ([`gossip_scale`],
//! `grid-gossip-scale`) and the soak ([`soak`], `grid-soak`).
//!
//! # I/O boundary
//!
//! Everything here runs on grid-kit's harnesses: real daemons on loopback or in network
//! namespaces the programs create and remove, simulated sites, and the real peers
//! (nginx, Envoy, wrk, h2load) `.ci/install` provides. Nothing is sent anywhere but
//! loopback and those namespaces.
//!
//! # Data flow
//!
//! ```text
//! grid_kit::local_grid (a whole grid) --demo / fault_suite--> a screen, a plot, a table
//! grid_kit::operator_harness + instant upstream --proxy_compare--> grid vs nginx vs Envoy
//! grid_kit::operator_harness (N operators) --gossip_scale--> gossip against poll
//! daemon processes + simulated sites --soak--> a verdict table, memory and descriptor plots
//! ```

pub mod demo;
pub mod fault_ledger;
pub mod fault_suite;
pub mod gossip_scale;
pub mod proxy_compare;
pub mod soak;
