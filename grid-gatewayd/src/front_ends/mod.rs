//! The daemon's front ends over grid-gateway: its own OpenAI-style HTTP API (HTTP/1.1
//! and HTTP/2, served by the engine's client side, proxied through its site side), the
//! routing evidence it serves beside it, and Envoy's external processor (Envoy keeps the
//! connections; grid decides and reads the answers).

pub mod ext_proc;
pub(crate) mod http_api;
pub(crate) mod routing_evidence;
