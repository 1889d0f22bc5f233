//! The loopback kit: what the daemons' tests and grid-programs run on. Simulated sites
//! behind real sockets, test doubles, the local grid of real daemons, harnesses of the
//! real peers (Envoy, Pingora, a real API server, llm-d's EPP and simulator), load
//! generators and the pieces of the whole-system benches.
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
//! grid_sim::site_model --sim_site--> a loopback OpenAI-compatible server living by the
//!                                    model in real time, /metrics from grid_sim::fake_epp
//! pki + sim_site + the daemons' drivers --local_grid--> a whole grid on 127.0.0.1
//! load / traffic --> requests through it, measured
//! ```

pub mod clock;
pub mod daemon_process;
pub mod envoy;
pub mod epp_server;
mod error;
pub mod fault_relay;
pub mod front_end_checks;
pub mod gateway_harness;
pub mod instant_upstream;
pub mod kube_cluster;
pub mod kube_grid;
pub mod latency;
pub mod llmd;
pub mod load;
pub mod local_grid;
pub mod netns;
pub mod openai_client;
pub mod operator_harness;
pub mod pingora_proxy;
pub mod pki;
pub mod ports;
pub mod promtool;
pub mod sim_site;
pub mod ticking_upstream;
pub mod traffic;

pub use error::Error;
