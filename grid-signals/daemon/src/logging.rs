//! The daemons' log output: human-readable lines on stderr at `info` unless `RUST_LOG`
//! says otherwise, with ANSI colour only when stderr is a terminal (a log collector or a
//! file gets plain text, not escape codes).

use std::io::IsTerminal as _;

/// Installs the global subscriber; call once, first thing in `main`.
pub fn init() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(filter)
        .init();
}
