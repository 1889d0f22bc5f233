//! The client side: connections from clients, from accept to the last byte written.

pub mod connection_metrics;
pub(crate) mod connection_watch;
pub(crate) mod h1;
pub(crate) mod h2_streams;
pub mod limits;
pub(crate) mod listener;
pub(crate) mod request_body;
pub(crate) mod write_bound;
