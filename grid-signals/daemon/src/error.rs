//! The crate's one error type.

use std::path::PathBuf;

/// Why a configuration value, TLS material or a TLS configuration was refused; each
/// daemon turns it into its own error, naming the same field, file or context.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A configuration value that parsed but is not acceptable.
    #[error("`{field}` {reason}")]
    ConfigField {
        /// The key as the file spells it, dotted and indexed:
        /// `models[0].candidates[1].baseUrl`.
        field: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A PEM file is unreadable or holds no usable certificate or key.
    #[error("TLS material {path}: {reason}")]
    TlsMaterial {
        /// The PEM file involved.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The private key is not the certificate's: both files named, since either may be
    /// the wrong one.
    #[error("the private key in {key} does not match the certificate in {cert}")]
    KeyMismatch {
        /// The certificate chain's file.
        cert: PathBuf,
        /// The key's file.
        key: PathBuf,
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

impl Error {
    /// A refusal of configuration `field` for `reason`.
    pub fn config_field(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::ConfigField {
            field: field.into(),
            reason: reason.into(),
        }
    }
}
