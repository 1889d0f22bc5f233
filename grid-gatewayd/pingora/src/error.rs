//! The crate's one error type.

/// What can go wrong turning grid's configuration and catalog into a Pingora proxy.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A site's base URL authority does not resolve to an address.
    #[error("site {site}: {authority} does not resolve: {source}")]
    Resolve {
        /// The site.
        site: String,
        /// Its base URL's `host:port`.
        authority: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A site's base URL authority resolved to no address at all.
    #[error("site {site}: {authority} resolves to no address")]
    NoAddress {
        /// The site.
        site: String,
        /// Its base URL's `host:port`.
        authority: String,
    },
    /// `bodyLimitBytes` is above what Pingora can hold to send a body upstream after
    /// reading its model.
    #[error(
        "bodyLimitBytes is {configured}; grid-pingora routes bodies of at most {most} bytes (Pingora's retry buffer): set bodyLimitBytes to {most} or less"
    )]
    BodyLimit {
        /// The configured limit.
        configured: usize,
        /// The most grid-pingora can hold.
        most: usize,
    },
    /// grid's signals could not be built from the configuration.
    #[error(transparent)]
    Gateway(#[from] grid_gateway::Error),
    /// Pingora could not make its server.
    #[error("pingora: {0}")]
    Pingora(Box<pingora_core::Error>),
}
