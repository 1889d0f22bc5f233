//! What both grid daemons share, so each rule has one home: the trust model ([`tls`]),
//! the client of `GET /v1/site/signals` and of EPP `/metrics` ([`client`]), and the
//! configuration vocabulary both files are read with ([`config`]).
//!
//! # I/O boundary
//!
//! [`tls`] reads PEM files; [`client`] opens one TCP (and TLS) connection per attempt on
//! the caller's tokio runtime. [`config`] does no I/O. [`clock`] is the one place either
//! daemon reads a clock (its wall clock can be stepped in tests); the client's deadlines
//! are tokio timeouts the caller's runtime keeps.
//!
//! # Data flow
//!
//! ```text
//! PEM files --tls::TlsMaterial--> tls::Trust (pin | SPIFFE) --> server_config / client_config
//! FetchTarget (URL, per-attempt timeout, TLS) --client::fetch--> Fetched { body <= 1 MiB, Date }
//! TOML (camelCase, ...Seconds) --a daemon's raw structs--config::{name, seconds, range}--> Config
//! ```
//!
//! ```
//! use std::time::Duration;
//! use grid_daemon::config::{self, Bounds};
//!
//! let poll = Bounds { min_ms: 100, max_ms: 60_000 };
//! assert_eq!(config::seconds("operator.pollIntervalSeconds", Some(0.25), Duration::from_secs(1), poll)?, Duration::from_millis(250));
//! let err = config::name("site", "Site_A").unwrap_err();
//! assert!(matches!(&err, grid_daemon::Error::ConfigField { field, .. } if field == "site"));
//! # Ok::<(), grid_daemon::Error>(())
//! ```

pub mod accept;
pub mod cause;
pub mod client;
pub mod clock;
pub mod config;
mod error;
pub mod evidence;
pub mod exposition;
pub mod logging;
pub mod probe;
pub mod shutdown;
pub mod tls;

pub use error::Error;
