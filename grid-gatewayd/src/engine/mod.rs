//! The gateway's HTTP engine: what moves bytes between clients and sites, with every
//! wait bounded.
//!
//! - [`client`]: the client side. The listener and its accept loop, the gateway's own
//!   HTTP/1.1 server, HTTP/2 streams polled on their connection's task, each
//!   connection's watchdog, the bound on writes to a slow client, the request body read
//!   whole, and every limit on a client connection.
//! - [`site`]: the site side. Pooled HTTP/1.1 connections to sites in the clear, the
//!   per-site cap on requests in flight, and what each answer tells about its site (its
//!   live evidence, how long it held its slot).
//! - `timers`: deadlines kept by one timer moved only when it fires, and futures woken
//!   without a timer per wait.
//! - `buffer_room`: how much room a connection's buffers hold, on either side: reads
//!   grow them only when their room runs low, and a streaming connection gives back
//!   room past what its events need.
//! - [`body`]: wrappers around a site's answer body (silences bounded; frames already
//!   there handed on together).
//!
//! The client side serves the daemon's own API (`front_ends::http_api`), which proxies
//! through the site side; Envoy's external processor (`front_ends::ext_proc`) uses only
//! what the site side reads off an answer.

pub mod body;
pub(crate) mod buffer_room;
pub mod client;
pub(crate) mod request_metrics;
pub mod site;
pub(crate) mod timers;

/// A boxed body error: what every body the engine hands on fails with.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;
