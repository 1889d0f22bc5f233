//! `promtool check metrics` (Debian's `prometheus` package, installed by `.ci/install`)
//! over an exposition: what both daemons' `/metrics` tests assert. A missing binary fails
//! the test: CI must not pass without the check.

use std::io::Write as _;
use std::process::{Command, Stdio};

/// Runs `promtool check metrics` on `text`; `Err` carries promtool's report (a lint
/// finding or a parse error) with the exposition for context.
///
/// # Panics
///
/// When promtool is not installed.
pub fn check_metrics(text: &str) -> Result<(), String> {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool is installed (bash .ci/install adds Debian's prometheus package)");
    let written = child
        .stdin
        .take()
        .map(|mut stdin| stdin.write_all(text.as_bytes()));
    let out = child
        .wait_with_output()
        .map_err(|e| format!("waiting for promtool: {e}"))?;
    if let Some(Err(e)) = written {
        return Err(format!("writing to promtool: {e}"));
    }
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() && report.trim().is_empty() {
        Ok(())
    } else {
        Err(format!(
            "promtool ({}): {report}\n--- metrics:\n{text}",
            out.status
        ))
    }
}

/// Runs `promtool` with `args` in `dir`; `Err` carries its report when it fails.
///
/// # Panics
///
/// When promtool is not installed.
pub fn run(dir: &std::path::Path, args: &[&str]) -> Result<String, String> {
    let out = Command::new("promtool")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("promtool is installed (bash .ci/install adds Debian's prometheus package)");
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() {
        Ok(report)
    } else {
        Err(format!(
            "promtool {} ({}): {report}",
            args.join(" "),
            out.status
        ))
    }
}

/// `promtool check rules` on the rules file `path`.
pub fn check_rules(path: &std::path::Path) -> Result<String, String> {
    let dir = path.parent().unwrap_or_else(|| std::path::Path::new("."));
    let file = path.file_name().map(|f| f.to_string_lossy().into_owned());
    run(
        dir,
        &["check", "rules", file.as_deref().unwrap_or_default()],
    )
}

/// `promtool test rules` on the test file `path` (its `rule_files` relative to it).
pub fn test_rules(path: &std::path::Path) -> Result<String, String> {
    let dir = path.parent().unwrap_or_else(|| std::path::Path::new("."));
    let file = path.file_name().map(|f| f.to_string_lossy().into_owned());
    run(dir, &["test", "rules", file.as_deref().unwrap_or_default()])
}
