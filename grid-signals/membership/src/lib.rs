//! SWIM membership for grid's sites, sans-I/O.
//!
//! # I/O boundary
//!
//! Pure: no sockets, clocks or random sources. The operator's driver owns the UDP socket,
//! the timers and the mutual-TLS exchange that agrees session keys; it hands in datagrams,
//! agreed sessions and the current time (`now_ms`, any monotonic millisecond count), and
//! takes out datagrams to send, sessions to agree and members that came up or went down.
//! Randomness comes in through [`Rng`].
//!
//! # Data flow
//!
//! ```text
//! signals listener (mTLS) --exported key--> Input::Session --> Sessions
//! UDP datagram --> Input::Datagram --open (Sessions)--> identity check --> foca (SWIM)
//! foca --plaintext--> seal (Sessions) --> Output::Transmit --> UDP
//!                          \--no session--> queued, Output::Connect --> driver agrees one
//! foca notifications --> Output::Up / Output::Down --> the peer poller follows them
//! Membership::announce(version) --rides SWIM messages--> Output::Heard at every other
//!                                                     member --> Pulls::heard, Pulls::poll_pull --> the driver pulls the batches
//! ```
//!
//! Every datagram is sealed per pair of sites under a key only the two ends of an
//! authenticated TLS handshake know ([`seal`]); one that does not open, or whose SWIM
//! sender names another site than the session's, is refused and counted
//! ([`Refusal`]) before the protocol sees it. Why this and not a shared key or QUIC is in
//! `docs/wire.md`.
#![deny(clippy::disallowed_methods)]

mod error;
mod machine;
mod member;
mod metrics;
pub mod overlay;
pub mod pull_wire;
pub mod pulls;
mod rng;
pub mod seal;

pub use error::Error;
pub use machine::{
    Input, MAX_DATAGRAM_BYTES, MAX_DOWN_ANNOUNCES, MAX_PENDING_MEMBERS, MAX_PLAINTEXT_BYTES,
    MAX_SESSIONS_CONNECTING, MEMBER_RECOUNT_MS, MIN_TRANSMISSIONS, Membership, Output,
    PENDING_PER_MEMBER, SESSION_RETRY_MS, TRANSMISSIONS_PER_DECADE, Timing, transmissions,
};
pub use member::{MAX_HOST_BYTES, MAX_SITE_NAME_BYTES, Member};
pub use metrics::{Direction, MembershipMetrics, Refusal, StateLabel, Unsent};
pub use overlay::Version;
pub use rng::{Rng, SplitMix64};
pub use seal::{Role, SealRefusal, Sessions};
