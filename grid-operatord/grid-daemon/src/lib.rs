//! What both grid daemons share, so each rule has one home: the configuration
//! vocabulary both files are read with.
//!
//! # I/O boundary
//!
//! None: this crate checks values the daemons already parsed. The daemons own the files.
//!
//! # Data flow
//!
//! ```text
//! TOML (camelCase keys, durations in seconds, fractional allowed)
//!     --serde--> a daemon's raw structs --config::{name, seconds, range}--> validated Config
//!                                                      \--> FieldError naming the key
//! ```
//!
//! ```
//! use std::time::Duration;
//! use grid_daemon::config::{self, Bounds};
//!
//! let poll = Bounds { min_ms: 100, max_ms: 60_000 };
//! assert_eq!(config::seconds("operator.pollIntervalSeconds", Some(0.25), Duration::from_secs(1), poll)?, Duration::from_millis(250));
//! let err = config::name("site", "Site_A").unwrap_err();
//! assert_eq!(err.field, "site");
//! # Ok::<(), grid_daemon::config::FieldError>(())
//! ```

pub mod config;
