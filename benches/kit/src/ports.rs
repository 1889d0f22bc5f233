//! Loopback ports for programs that must be told their port before they start (the real
//! EPP, etcd, kube-apiserver, Envoy, a gateway named in its peers' configurations).
//!
//! Asking the kernel for a free port (bind to port 0, read it, close) and handing it to a
//! program races with everything else that binds or connects meanwhile: the kernel hands
//! the same ephemeral port to the next `bind(0)` or outgoing connection, and tests run in
//! parallel. The ports handed out here come from below the kernel's ephemeral range
//! (`/proc/sys/net/ipv4/ip_local_port_range`, 32768 and up by default), which the kernel
//! never picks on its own, and each is handed out at most once per process; a port some
//! other program already holds (TCP or UDP) is skipped. Test binaries run one after
//! another, and each process starts at its own offset, so two processes rarely walk the
//! same ports.

use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::sync::atomic::{AtomicU32, Ordering};

/// The first port of the range handed out.
pub const FIRST_PORT: u16 = 20_000;
/// One past the last port of the range: the bottom of Linux's default ephemeral range.
pub const END_PORT: u16 = 32_768;

static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);

/// A loopback port nothing held when it was handed out, never handed out before by this
/// process, and outside the range the kernel assigns on its own.
///
/// # Panics
/// When every port of the range has been handed out or is held (a test leaking ports).
pub fn loopback_port() -> u16 {
    let span = u32::from(END_PORT - FIRST_PORT);
    // The offset spreads processes over the range (pid-derived: no clock or random
    // source is needed for that).
    let _ = NEXT.compare_exchange(
        u32::MAX,
        (std::process::id().wrapping_mul(2_654_435_761)) % span,
        Ordering::Relaxed,
        Ordering::Relaxed,
    );
    for _ in 0..span {
        let n = NEXT.fetch_add(1, Ordering::Relaxed) % span;
        let port = FIRST_PORT + u16::try_from(n).expect("within the span");
        if bindable(port) {
            return port;
        }
    }
    panic!("no loopback port free in {FIRST_PORT}..{END_PORT}");
}

/// [`loopback_port`] on 127.0.0.1.
pub fn loopback_addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], loopback_port()))
}

/// Whether both TCP and UDP can bind `port` on loopback now (gossip listens on the UDP
/// twin of the signals port).
fn bindable(port: u16) -> bool {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    TcpListener::bind(addr).is_ok() && UdpSocket::bind(addr).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn ports_handed_out_are_distinct_and_below_the_ephemeral_range() {
        let ports: Vec<u16> = (0..500).map(|_| loopback_port()).collect();
        let distinct: HashSet<u16> = ports.iter().copied().collect();
        assert_eq!(distinct.len(), ports.len());
        assert!(ports.iter().all(|p| (FIRST_PORT..END_PORT).contains(p)));
    }

    #[test]
    fn a_port_another_socket_holds_is_skipped() {
        let held = loopback_port();
        // Hold the next candidate, then ask: the held one must not come back.
        let next = FIRST_PORT
            + u16::try_from(NEXT.load(Ordering::Relaxed) % u32::from(END_PORT - FIRST_PORT))
                .unwrap();
        let _hold = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], next)));
        let got = loopback_port();
        assert_ne!(got, next);
        assert_ne!(got, held);
    }
}
