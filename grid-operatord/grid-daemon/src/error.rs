//! The crate's one error type.

use std::path::PathBuf;

/// Why TLS material or a TLS configuration could not be built; each daemon turns it into
/// its own error, naming the same file or context.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A PEM file is unreadable or holds no usable certificate or key.
    #[error("TLS material {path}: {reason}")]
    TlsMaterial {
        /// The PEM file involved.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// rustls refused a configuration (key does not match the certificate, unusable CA).
    #[error("TLS configuration ({context}): {source}")]
    Tls {
        /// Which configuration.
        context: &'static str,
        /// rustls' reason.
        #[source]
        source: rustls::Error,
    },
}
