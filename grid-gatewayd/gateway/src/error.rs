//! The crate's one error type.

use std::path::PathBuf;

/// Why the gateway refused to start or to (re)load something.
///
/// Request-path failures are not errors of this type: they are answered to the client as
/// OpenAI-style JSON (see [`crate::refusal`]) and counted, never propagated.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The configuration file is not valid TOML or does not match the schema; toml's
    /// message names the key and the line.
    #[error("gateway config: {message}")]
    ConfigSyntax {
        /// toml's description, naming the offending key and its position.
        message: String,
    },
    /// A configuration value parsed but is not acceptable.
    #[error("configuration field `{field}`: {reason}")]
    ConfigField {
        /// Dotted path of the offending field, e.g. `models[0].candidates[1].baseUrl`.
        field: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A file named by the configuration could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The operating system's reason.
        source: std::io::Error,
    },
    /// A PEM file holds no usable certificate or key.
    #[error("TLS material in {path}: {reason}")]
    Pem {
        /// The file.
        path: PathBuf,
        /// What was missing or malformed.
        reason: String,
    },
    /// rustls refused the assembled TLS configuration (key does not match the certificate,
    /// unusable CA).
    #[error("TLS configuration ({what}): {reason}")]
    Tls {
        /// Which configuration: the operator client or the site client.
        what: &'static str,
        /// rustls' reason.
        reason: String,
    },
    /// The listener could not be bound.
    #[error("binding {addr}: {source}")]
    Bind {
        /// The configured address.
        addr: std::net::SocketAddr,
        /// The operating system's reason.
        source: std::io::Error,
    },
    /// The operating system's random generator failed, so no feedback epoch could be
    /// drawn (an epoch that is not random could repeat a predecessor's).
    #[error("drawing the feedback epoch from the OS random generator: {reason}")]
    Entropy {
        /// getrandom's reason.
        reason: String,
    },
}

impl From<grid_daemon::Error> for Error {
    fn from(e: grid_daemon::Error) -> Self {
        match e {
            grid_daemon::Error::ConfigField { field, reason } => {
                Self::ConfigField { field, reason }
            }
            grid_daemon::Error::TlsMaterial { path, reason } => Self::Pem { path, reason },
            grid_daemon::Error::Tls { context, source } => Self::Tls {
                what: context,
                reason: source.to_string(),
            },
            other => Self::Tls {
                what: "grid-daemon",
                reason: other.to_string(),
            },
        }
    }
}
