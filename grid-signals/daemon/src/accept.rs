//! The one accept loop step every listener of both daemons takes: a failed `accept`
//! (`EMFILE` when the process is out of descriptors, a connection reset before it was
//! accepted) never ends the loop; it backs off exponentially from [`ACCEPT_BACKOFF_MIN`]
//! to [`ACCEPT_BACKOFF_MAX`], and is logged at most once per
//! [`ACCEPT_ERROR_LOG_INTERVAL`] with the count of those not logged, so a listener out of
//! descriptors neither spins nor floods the log.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::net::{TcpListener, TcpStream};

/// First pause after a failed accept: a transient error (a connection reset before
/// accept) costs 10 ms.
pub const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(10);

/// Longest pause after repeated failed accepts: an out-of-descriptors listener retries
/// once a second instead of spinning, and still notices freed descriptors quickly.
pub const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// Accept errors are logged at most once per this interval (with the count of those not
/// logged), so a listener out of descriptors does not flood the log.
pub const ACCEPT_ERROR_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// One listener's back-off state.
#[derive(Debug)]
pub struct AcceptBackoff {
    next: Duration,
    last_log: Option<Instant>,
    unlogged: u64,
}

impl Default for AcceptBackoff {
    fn default() -> Self {
        Self {
            next: ACCEPT_BACKOFF_MIN,
            last_log: None,
            unlogged: 0,
        }
    }
}

impl AcceptBackoff {
    /// Accepts the next connection on `listener`. Each failed accept is counted through
    /// `failed`, logged (as `listener_name`) within the log bound, and followed by its
    /// pause; the loop goes on. Cancel-safe: dropped while pausing, nothing is lost.
    pub async fn accept(
        &mut self,
        listener: &TcpListener,
        listener_name: &'static str,
        mut failed: impl FnMut(),
    ) -> (TcpStream, SocketAddr) {
        loop {
            match listener.accept().await {
                Ok(accepted) => {
                    self.on_success();
                    return accepted;
                }
                Err(e) => {
                    failed();
                    let (pause, log) = self.on_error(crate::clock::monotonic());
                    if let Some(unlogged) = log {
                        tracing::warn!(
                            listener = listener_name,
                            error = %e,
                            unlogged,
                            retry_in = ?pause,
                            "accept failed; backing off"
                        );
                    }
                    tokio::time::sleep(pause).await;
                }
            }
        }
    }

    /// The pause after a failed accept at `now`, and `Some(errors not logged since the
    /// last log line)` when this one is to be logged.
    pub fn on_error(&mut self, now: Instant) -> (Duration, Option<u64>) {
        let pause = self.next;
        self.next = (self.next * 2).min(ACCEPT_BACKOFF_MAX);
        let due = self
            .last_log
            .is_none_or(|at| now.duration_since(at) >= ACCEPT_ERROR_LOG_INTERVAL);
        if due {
            self.last_log = Some(now);
            let unlogged = std::mem::take(&mut self.unlogged);
            (pause, Some(unlogged))
        } else {
            self.unlogged += 1;
            (pause, None)
        }
    }

    /// An accept succeeded: the next failure pauses [`ACCEPT_BACKOFF_MIN`] again.
    pub fn on_success(&mut self) {
        self.next = ACCEPT_BACKOFF_MIN;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_accept_errors_back_off_to_the_cap_and_log_once_per_interval() {
        let start = crate::clock::monotonic();
        let mut b = AcceptBackoff::default();
        let (mut now, mut logged, mut pauses) = (start, 0, Vec::new());
        // A minute of a listener out of descriptors.
        while now.duration_since(start) < Duration::from_secs(60) {
            let (pause, log) = b.on_error(now);
            logged += usize::from(log.is_some());
            pauses.push(pause);
            now += pause;
        }
        assert_eq!(pauses[0], ACCEPT_BACKOFF_MIN);
        assert_eq!(pauses[1], ACCEPT_BACKOFF_MIN * 2);
        assert_eq!(*pauses.last().unwrap(), ACCEPT_BACKOFF_MAX, "capped");
        assert!(
            pauses.len() < 80,
            "{} accepts in a minute, not one per 10 ms",
            pauses.len()
        );
        assert!(
            (6..=7).contains(&logged),
            "{logged} log lines in a minute, one per interval"
        );
        b.on_success();
        assert_eq!(b.on_error(now).0, ACCEPT_BACKOFF_MIN, "reset by an accept");
    }
}
