//! Who a member is: the identity SWIM gossips about, and the checks a claimed one passes.

use serde::{Deserialize, Serialize};

use crate::Error;

/// Longest site name a member may carry: a DNS label, as in the site's certificate.
pub const MAX_SITE_NAME_BYTES: usize = 63;
/// Longest advertised host: a DNS name.
pub const MAX_HOST_BYTES: usize = 253;

/// One site's membership identity.
///
/// The site name is what the signals listener's trust authenticates; the host and the
/// signals port are where peers poll it (`https://{host}:{signals_port}/v1/site/signals`)
/// and open membership sessions; the gossip port is its UDP socket on the same host. The
/// incarnation is the operator's publisher epoch, so it moves on every restart and the
/// new process's identity wins over the old one's.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Member {
    /// The site's name.
    pub site: String,
    /// The host peers reach it at.
    pub host: String,
    /// Its mutual-TLS signals listener's port.
    pub signals_port: u16,
    /// Its membership datagram port.
    pub gossip_port: u16,
    /// Moves on every restart.
    pub incarnation: u64,
}

/// Whether `s` is a name the grid accepts for a site or a provider: 1 to `max` bytes of
/// ASCII letters, digits, `-` and `_`. Identities, batch versions, pull queries and
/// digests all judge names by this one rule.
pub(crate) fn is_label(s: &str, max: usize) -> bool {
    !s.is_empty()
        && s.len() <= max
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

impl Member {
    /// Refuses an identity no honest operator would send: a site name that is not a DNS
    /// label, a host that is empty, too long or holds characters a URL authority cannot,
    /// a zero port.
    pub fn check(&self) -> Result<(), Error> {
        if !is_label(&self.site, MAX_SITE_NAME_BYTES) {
            return Err(Error::Identity {
                field: "site",
                value: truncated(&self.site),
            });
        }
        let host_ok = !self.host.is_empty()
            && self.host.len() <= MAX_HOST_BYTES
            && self.host.bytes().all(|b| {
                b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b':' | b'[' | b']')
            });
        if !host_ok {
            return Err(Error::Identity {
                field: "host",
                value: truncated(&self.host),
            });
        }
        if self.signals_port == 0 || self.gossip_port == 0 {
            return Err(Error::Identity {
                field: "port",
                value: format!("{}/{}", self.signals_port, self.gossip_port),
            });
        }
        Ok(())
    }

    /// Where the member's signals are polled.
    pub fn signals_url(&self) -> String {
        format!(
            "https://{}:{}/v1/site/signals",
            self.authority_host(),
            self.signals_port
        )
    }

    /// The host as a URL authority writes it (an IPv6 literal in brackets).
    pub fn authority_host(&self) -> String {
        if self.host.contains(':') && !self.host.starts_with('[') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        }
    }
}

fn truncated(s: &str) -> String {
    s.chars().take(64).collect()
}

impl foca::Identity for Member {
    /// One member per site: a restarted operator replaces its earlier incarnation.
    type Addr = String;

    fn renew(&self) -> Option<Self> {
        Some(Self {
            incarnation: self.incarnation.checked_add(1)?,
            ..self.clone()
        })
    }

    fn addr(&self) -> String {
        self.site.clone()
    }

    fn win_addr_conflict(&self, adversary: &Self) -> bool {
        self.incarnation > adversary.incarnation
    }
}

impl Member {
    /// `site` at 127.0.0.1, signals and gossip on 9443, first incarnation: the member the
    /// unit tests, fuzzers and examples start from.
    pub fn loopback(site: &str) -> Self {
        Self {
            site: site.into(),
            host: "127.0.0.1".into(),
            signals_port: 9443,
            gossip_port: 9443,
            incarnation: 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn member(site: &str) -> Member {
        Member {
            site: site.into(),
            host: "127.0.0.1".into(),
            signals_port: 9443,
            gossip_port: 7946,
            incarnation: 1,
        }
    }

    #[test]
    fn a_site_name_of_the_longest_label_passes_and_one_byte_more_does_not() {
        let mut m = member(&"a".repeat(MAX_SITE_NAME_BYTES));
        assert!(m.check().is_ok());
        m.site.push('a');
        assert!(matches!(
            m.check(),
            Err(Error::Identity { field: "site", .. })
        ));
    }

    #[test]
    fn a_host_of_the_longest_name_passes_and_one_byte_more_does_not() {
        let mut m = member("a");
        m.host = "h".repeat(MAX_HOST_BYTES);
        assert!(m.check().is_ok());
        m.host.push('h');
        assert!(matches!(
            m.check(),
            Err(Error::Identity { field: "host", .. })
        ));
    }

    #[test]
    fn a_host_that_could_rewrite_the_poll_url_is_refused() {
        for host in ["evil/path", "a@b", "a b", "", "x?y"] {
            let mut m = member("a");
            m.host = host.into();
            assert!(m.check().is_err(), "{host:?}");
        }
    }

    #[test]
    fn a_zero_port_is_refused() {
        let mut m = member("a");
        m.gossip_port = 0;
        assert!(m.check().is_err());
    }

    #[test]
    fn an_ipv6_host_is_bracketed_in_the_poll_url() {
        let mut m = member("a");
        m.host = "::1".into();
        assert_eq!(m.signals_url(), "https://[::1]:9443/v1/site/signals");
    }

    #[test]
    fn a_renewed_identity_wins_over_the_one_it_replaces() {
        use foca::Identity;
        let old = member("a");
        let new = old.renew().unwrap();
        assert!(new.win_addr_conflict(&old));
        assert!(!old.win_addr_conflict(&new));
        assert_eq!(new.addr(), old.addr());
    }
}
