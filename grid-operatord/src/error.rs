//! The crate's one error type.

use std::path::PathBuf;

/// Why the operator refused to start, or why one of its I/O steps failed.
///
/// Every variant names the file, field or address involved, so the message alone is enough
/// to fix the deployment.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A file the operator needs could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file involved.
        path: PathBuf,
        /// What the operating system said.
        source: std::io::Error,
    },
    /// The configuration is not valid TOML for the operator's schema; the message from the
    /// TOML reader names the field (unknown, missing or of the wrong type) and its line.
    #[error("configuration {path}: {message}")]
    ConfigSyntax {
        /// The configuration file.
        path: PathBuf,
        /// The reader's message, naming the field and where it is.
        message: String,
    },
    /// A configuration field parsed but its value is refused.
    #[error("configuration field `{field}`: {reason}")]
    ConfigField {
        /// Dotted path of the field, e.g. `providers[1].url`.
        field: String,
        /// Why the value is refused.
        reason: String,
    },
    /// TLS material or a TLS configuration was refused, as the shared daemon crate
    /// says it (the file, the mismatched pair or the configuration it was building).
    #[error(transparent)]
    Tls(grid_daemon::Error),
    /// A persisted state file exists but cannot be understood; the operator refuses to
    /// guess rather than reuse an epoch or forget feedback evidence.
    #[error("state file {path}: {reason}")]
    StateCorrupt {
        /// The state file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A listener could not bind its address.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address from the configuration.
        addr: std::net::SocketAddr,
        /// What the operating system said.
        source: std::io::Error,
    },
    /// The declared signal transport differs from the one this process runs; a supervisor
    /// restarts the operator into the declared mode.
    #[error(
        "signalTransport.mode changed from `{running}` to `{declared}`: exiting so the supervisor restarts into the declared mode"
    )]
    ModeChanged {
        /// The mode this process started in.
        running: &'static str,
        /// The mode the configuration now declares.
        declared: String,
    },
    /// Controller mode: the namespace does not hold exactly one `GridNetwork`. One
    /// operator serves one network (the mode and trust are process-global), so it refuses
    /// to pick one.
    #[error(
        "the namespace holds {count} GridNetworks ({names:?}); one operator serves exactly one"
    )]
    NetworkCount {
        /// How many there are.
        count: usize,
        /// Their names.
        names: Vec<String>,
    },
    /// Controller mode: a Kubernetes API call failed (a status, a transport error, no
    /// answer in time, or an answer that did not read back as written).
    #[error("Kubernetes API, {operation}: {message}")]
    Kube {
        /// What was being done.
        operation: &'static str,
        /// What went wrong.
        message: String,
    },
    /// Controller mode: a write lost a resourceVersion race (409): another writer moved
    /// the object since it was read. The caller re-reads and decides whether to retry.
    #[error("Kubernetes API, {operation}: 409 Conflict (the object changed since it was read)")]
    KubeConflict {
        /// What was being written.
        operation: &'static str,
    },
    /// Controller mode: this replica no longer holds the site's Lease (another holds it,
    /// or no renewal succeeded for a whole lease duration), so it stops publishing.
    #[error("lost the Lease `{lease}`: another replica may publish now; exiting")]
    LeaseLost {
        /// The Lease's name.
        lease: String,
    },
    /// The declared trust changed under a running operator.
    #[error(
        "the declared `{field}` changed: exiting so the supervisor restarts with the new trust (a peer's certificates are only ever judged under the trust a process started with)"
    )]
    TrustChanged {
        /// The first changed field: `trust`, `tls.ca` or `peers`.
        field: &'static str,
    },
}

impl From<grid_daemon::Error> for Error {
    fn from(e: grid_daemon::Error) -> Self {
        match e {
            grid_daemon::Error::ConfigField { field, reason } => {
                Self::ConfigField { field, reason }
            }
            other => Self::Tls(other),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::Error;

    #[test]
    fn a_key_that_is_not_its_certificates_names_both_files_through_the_operators_error() {
        let e = Error::from(grid_daemon::Error::KeyMismatch {
            cert: PathBuf::from("/tls/site.crt"),
            key: PathBuf::from("/tls/site.key"),
        });
        assert!(matches!(
            e,
            Error::Tls(grid_daemon::Error::KeyMismatch { .. })
        ));
        assert_eq!(
            e.to_string(),
            "the private key in /tls/site.key does not match the certificate in /tls/site.crt"
        );
    }

    #[test]
    fn a_refused_field_from_the_shared_crate_reads_as_the_operators_own_field_error() {
        let e = Error::from(grid_daemon::Error::config_field("tls.ca", "is empty"));
        assert_eq!(e.to_string(), "configuration field `tls.ca`: is empty");
    }
}
