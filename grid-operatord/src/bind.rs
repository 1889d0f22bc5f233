//! The operator's listening sockets: `/metrics`, and the signals listener with the
//! membership socket beside it on the same address and port number (TCP and UDP ports
//! are separate spaces), so a member's signals endpoint is its gossip endpoint.

use std::net::SocketAddr;

use tokio::net::{TcpListener, UdpSocket};

use crate::Error;

/// Attempts at finding a port free for both TCP and UDP when the configuration asks the
/// OS to choose one.
pub const PORT_PAIR_ATTEMPTS: usize = 16;

/// A listener bound once for the whole process and handed, as a copy of its descriptor,
/// to each server that serves it in turn: a standby's probes, then each driver start.
/// Closing a listening socket and binding its port again fails (`EADDRINUSE`) while any
/// other copy of the descriptor is open, and any process forked in between holds one
/// until it execs; held, the port never closes, and a connection that arrives between two
/// servers waits in the backlog for the next.
#[derive(Debug)]
pub struct HeldListener {
    listener: std::net::TcpListener,
    addr: SocketAddr,
}

impl HeldListener {
    /// Binds `addr` (port 0: the OS chooses).
    ///
    /// # Errors
    ///
    /// [`Error::Bind`] when the address cannot be bound.
    pub async fn bind(addr: SocketAddr) -> Result<Self, Error> {
        let (tcp, bound) = bind(addr).await?;
        let listener = tcp
            .into_std()
            .map_err(|source| Error::Bind { addr, source })?;
        Ok(Self {
            listener,
            addr: bound,
        })
    }

    /// The address it is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// A copy for one server, registered with the current runtime; dropping it leaves
    /// the socket listening.
    pub(crate) fn share(&self) -> Result<(TcpListener, SocketAddr), Error> {
        let bind_err = |source| Error::Bind {
            addr: self.addr,
            source,
        };
        let copy = self.listener.try_clone().map_err(bind_err)?;
        Ok((TcpListener::from_std(copy).map_err(bind_err)?, self.addr))
    }
}

/// Binds `addr`, returning the listener and the address it really has (port 0 chosen).
pub(crate) async fn bind(addr: SocketAddr) -> Result<(TcpListener, SocketAddr), Error> {
    let bind_err = |source| Error::Bind { addr, source };
    let tcp = TcpListener::bind(addr).await.map_err(bind_err)?;
    let bound = tcp.local_addr().map_err(bind_err)?;
    Ok((tcp, bound))
}

/// Binds the signals listener and the membership socket on one address and port
/// number. Port 0 retries, at most [`PORT_PAIR_ATTEMPTS`] times, until a port is free
/// for both; a fixed port whose UDP side is taken is refused at once.
pub(crate) async fn bind_signals(
    addr: SocketAddr,
) -> Result<(TcpListener, UdpSocket, SocketAddr), Error> {
    pair(addr, || async {
        let (tcp, bound) = match bind(addr).await {
            Ok(bound) => bound,
            Err(e) => return Attempt::Failed(e),
        };
        match UdpSocket::bind(bound).await {
            Ok(udp) => Attempt::Bound((tcp, udp, bound)),
            Err(e) if addr.port() == 0 => Attempt::Taken(e),
            Err(source) => Attempt::Failed(Error::Bind { addr, source }),
        }
    })
    .await
}

/// How one attempt at a port pair ended.
enum Attempt<T> {
    Bound(T),
    /// The OS chose a TCP port whose UDP twin is taken: another choice may do.
    Taken(std::io::Error),
    Failed(Error),
}

/// Runs `once` until it binds, fails for good, or [`PORT_PAIR_ATTEMPTS`] choices were
/// taken.
async fn pair<T, F, Fut>(addr: SocketAddr, mut once: F) -> Result<T, Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Attempt<T>>,
{
    let mut last = None;
    for _ in 0..PORT_PAIR_ATTEMPTS {
        match once().await {
            Attempt::Bound(bound) => return Ok(bound),
            Attempt::Taken(e) => last = Some(e),
            Attempt::Failed(e) => return Err(e),
        }
    }
    Err(Error::Bind {
        addr,
        source: last.unwrap_or_else(|| std::io::Error::other("no port pair")),
    })
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    fn any() -> SocketAddr {
        "127.0.0.1:0".parse().unwrap()
    }

    fn taken() -> std::io::Error {
        std::io::Error::from(std::io::ErrorKind::AddrInUse)
    }

    #[tokio::test]
    async fn a_pair_found_on_the_last_attempt_is_bound() {
        let calls = Cell::new(0);
        let bound = pair(any(), || async {
            calls.set(calls.get() + 1);
            if calls.get() == PORT_PAIR_ATTEMPTS {
                Attempt::Bound(calls.get())
            } else {
                Attempt::Taken(taken())
            }
        })
        .await;
        assert_eq!(bound.unwrap(), PORT_PAIR_ATTEMPTS);
    }

    #[tokio::test]
    async fn no_more_than_port_pair_attempts_choices_are_tried() {
        let calls = Cell::new(0);
        let bound: Result<(), Error> = pair(any(), || async {
            calls.set(calls.get() + 1);
            Attempt::Taken(taken())
        })
        .await;
        assert!(matches!(bound, Err(Error::Bind { .. })), "{bound:?}");
        assert_eq!(calls.get(), PORT_PAIR_ATTEMPTS);
    }

    #[tokio::test]
    async fn a_fixed_port_whose_udp_twin_is_taken_is_refused_at_once() {
        let udp = std::net::UdpSocket::bind(any()).unwrap();
        let addr = udp.local_addr().unwrap();
        // Nothing listens on that TCP port, so only the UDP side is taken.
        let bound = bind_signals(addr).await;
        assert!(
            matches!(bound, Err(Error::Bind { .. })),
            "{:?}",
            bound.err()
        );
    }

    #[tokio::test]
    async fn port_zero_binds_tcp_and_udp_on_one_port_number() {
        let (tcp, udp, bound) = bind_signals(any()).await.unwrap();
        assert_eq!(tcp.local_addr().unwrap(), bound);
        assert_eq!(udp.local_addr().unwrap(), bound);
    }
}
