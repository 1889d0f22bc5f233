//! The signals that stop a daemon gracefully. Kubernetes (and systemd, and `docker stop`)
//! send SIGTERM, a terminal sends SIGINT: both mean "stop accepting, drain, persist,
//! exit 0", so both daemons wait on [`requested`] rather than on Ctrl-C alone (a SIGTERM
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

/// Resolves when SIGINT or SIGTERM arrives; installing the handlers can only fail when
/// the runtime has no signal driver, which both daemons' runtimes have.
///
/// # Errors
///
/// When a handler cannot be installed.
pub async fn requested() -> std::io::Result<Stop> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        tokio::select! {
            _ = term.recv() => Ok(Stop::Terminate),
            _ = int.recv() => Ok(Stop::Interrupt),
        }
    }
    #[cfg(not(unix))]
    {
        tokio::signal::ctrl_c().await?;
        Ok(Stop::Interrupt)
    }
}
