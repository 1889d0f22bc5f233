//! Where the signals wire lives: every path one grid process serves to another, and the
//! media type of a signals body. One home, so the operator that serves a path and the
//! gateway or peer that calls it can never spell it differently.

/// The relay: `GET` answers a signals body ([`SIGNALS_CONTENT_TYPE`]) holding what the
/// caller may see (the site's own gateway everything, a peer this site's rows).
pub const SIGNALS_PATH: &str = "/v1/site/signals";
/// Ingest feedback: the local gateway `POST`s what it refused of the relay.
pub const INGEST_PATH: &str = "/v1/site/signals/ingest";
/// The local gateway's catalog: its models and their candidates (JSON).
pub const CATALOG_PATH: &str = "/v1/site/catalog";
/// Gossip mode: batches, `?site=..&provider=..` per register asked for.
pub const BATCH_PATH: &str = "/v1/site/membership/batch";
/// Gossip mode: the digest of the versions a member holds.
pub const DIGEST_PATH: &str = "/v1/site/membership/digest";
/// Membership: the session exchange that keys a pair of sites' datagrams.
pub const SESSION_PATH: &str = "/v1/site/membership/session";
/// The routing evidence both daemons serve beside their metrics.
pub const ROUTING_PATH: &str = "/v1/grid/routing";
/// The media type of a signals body: Prometheus text exposition 0.0.4.
pub const SIGNALS_CONTENT_TYPE: &str = "text/plain; version=0.0.4";
