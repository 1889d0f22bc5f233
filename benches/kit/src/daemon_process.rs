//! A daemon binary run as a child process, for the tests that need the real process:
//! signals, exit codes, what it logs. Its stderr is read line by line on a thread so a
//! test can wait for a line; the child is killed when dropped, so a failing test leaves
//! no process behind.

use std::io::{BufRead as _, BufReader};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use crate::clock::Stopwatch;

/// A running daemon.
pub struct Daemon {
    child: Child,
    lines: mpsc::Receiver<String>,
    /// Every stderr line read so far, for failure messages.
    pub seen: Vec<String>,
}

impl Daemon {
    /// Starts `binary` with `args`; stderr is captured, stdout discarded.
    ///
    /// # Panics
    ///
    /// When the binary cannot be started.
    pub fn spawn(binary: &Path, args: &[&str]) -> Self {
        Self::spawn_with(binary, args, None, &[])
    }

    /// [`Daemon::spawn`] in the working directory `cwd` (the test's own when `None`).
    ///
    /// # Panics
    ///
    /// When the binary cannot be started.
    pub fn spawn_in(binary: &Path, args: &[&str], cwd: Option<&Path>) -> Self {
        Self::spawn_with(binary, args, cwd, &[])
    }

    /// [`Daemon::spawn`] with `env` added to its environment.
    ///
    /// # Panics
    ///
    /// When the binary cannot be started.
    pub fn spawn_with_env(binary: &Path, args: &[&str], env: &[(&str, &Path)]) -> Self {
        Self::spawn_with(binary, args, None, env)
    }

    fn spawn_with(binary: &Path, args: &[&str], cwd: Option<&Path>, env: &[(&str, &Path)]) -> Self {
        let mut command = Command::new(binary);
        if let Some(dir) = cwd {
            command.current_dir(dir);
        }
        let mut child = command
            .args(args)
            .envs(env.iter().copied())
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", binary.display()));
        let stderr = child.stderr.take().expect("stderr is piped");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Self {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The first stderr line (from now on) containing `needle`, within `limit`.
    ///
    /// # Panics
    ///
    /// When no such line arrives in time or the process closed stderr.
    pub fn wait_for_line(&mut self, needle: &str, limit: Duration) -> String {
        let watch = Stopwatch::start();
        loop {
            let left = limit.saturating_sub(watch.elapsed());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if line.contains(needle) {
                        return line;
                    }
                }
                Err(e) => panic!(
                    "no line with {needle:?} within {limit:?} ({e}); stderr so far:\n{}",
                    self.seen.join("\n")
                ),
            }
        }
    }

    /// Every stderr line that arrived since the last call (or the last wait), without
    /// waiting and without keeping them in [`Daemon::seen`]: what a long run reads so that
    /// a chatty daemon's lines do not pile up.
    pub fn take_lines(&mut self) -> Vec<String> {
        std::iter::from_fn(|| self.lines.try_recv().ok()).collect()
    }

    /// The stderr lines read so far at WARN or ERROR: a healthy run has none.
    pub fn loud_lines(&self) -> Vec<&str> {
        self.seen
            .iter()
            .map(String::as_str)
            .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
            .collect()
    }

    /// Sends `signal` (a `kill -s` name such as `TERM`, `STOP`, `CONT`).
    ///
    /// # Panics
    ///
    /// When `kill` cannot be run.
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args(["-s", signal, &self.pid().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill -s {signal} failed");
    }

    /// Waits for the process to exit, at most `limit`; `None` if it is still running.
    ///
    /// # Panics
    ///
    /// When the process status cannot be read.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let watch = Stopwatch::start();
        loop {
            if let Some(status) = self.child.try_wait().expect("process status") {
                while let Ok(line) = self.lines.recv_timeout(Duration::from_millis(100)) {
                    self.seen.push(line);
                }
                return Some(status);
            }
            if watch.elapsed() >= limit {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The value of `key=` in a log line (`local_addr=127.0.0.1:8080` gives `127.0.0.1:8080`).
pub fn log_field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let start = line.find(&format!("{key}="))? + key.len() + 1;
    line[start..].split_whitespace().next()
}
