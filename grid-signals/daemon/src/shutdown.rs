//! The signals that stop a daemon gracefully. Kubernetes (and systemd, and `docker stop`)
//! send SIGTERM, a terminal sends SIGINT: both mean "stop accepting, drain, persist,
//! exit 0", so both daemons wait on [`Handlers`] rather than on Ctrl-C alone (a SIGTERM
//! with no handler kills the process mid-stream).

/// Which signal asked the daemon to stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Stop {
    /// SIGINT (Ctrl-C).
    Interrupt,
    /// SIGTERM (a supervisor).
    Terminate,
}

impl Stop {
    /// The signal's name, for the log line.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Interrupt => "SIGINT",
            Self::Terminate => "SIGTERM",
        }
    }
}

/// The SIGINT and SIGTERM handlers, in force from [`Handlers::install`] on. A daemon
/// installs them before it opens a listener: a signal that arrives once it serves must
/// find them, not the default action, which ends the process mid-stream. (An `async fn`
/// that installed them would do so only when first polled.)
#[derive(Debug)]
pub struct Handlers {
    #[cfg(unix)]
    term: tokio::signal::unix::Signal,
    #[cfg(unix)]
    int: tokio::signal::unix::Signal,
}

impl Handlers {
    /// Installs both handlers now. Fails only when the runtime has no signal driver,
    /// which both daemons' runtimes have.
    ///
    /// # Errors
    ///
    /// When a handler cannot be installed.
    pub fn install() -> std::io::Result<Self> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            Ok(Self {
                term: signal(SignalKind::terminate())?,
                int: signal(SignalKind::interrupt())?,
            })
        }
        #[cfg(not(unix))]
        Ok(Self {})
    }

    /// Resolves when SIGINT or SIGTERM arrives (any time after [`Handlers::install`]).
    ///
    /// # Errors
    ///
    /// Off unix, when Ctrl-C cannot be listened for.
    pub async fn requested(mut self) -> std::io::Result<Stop> {
        #[cfg(unix)]
        {
            tokio::select! {
                _ = self.term.recv() => Ok(Stop::Terminate),
                _ = self.int.recv() => Ok(Stop::Interrupt),
            }
        }
        #[cfg(not(unix))]
        {
            tokio::signal::ctrl_c().await?;
            Ok(Stop::Interrupt)
        }
    }
}
