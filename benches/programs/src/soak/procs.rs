//! What the soak reads of a running daemon: from `/proc/<pid>` its resident memory,
//! open descriptors and threads, and from its `/metrics` how many series it exposes.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::Path;

/// One reading of one process.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcReading {
    /// `VmRSS`: resident memory, KiB.
    pub rss_kib: u64,
    /// `RssAnon`: the anonymous part of it (the heap and stacks, not the mapped binary),
    /// KiB.
    pub rss_anon_kib: u64,
    /// Entries of `/proc/<pid>/fd`.
    pub fds: u64,
    /// `Threads`.
    pub threads: u64,
    /// Sample lines of its `/metrics` (every line that is neither empty nor a comment);
    /// `None` when the page could not be read at this sample.
    pub series: Option<u64>,
}

/// The `KiB` (or plain count) of a `/proc/<pid>/status` field, such as `VmRSS:  1234 kB`.
pub fn status_field(status: &str, key: &str) -> Option<u64> {
    status.lines().find_map(|l| {
        l.strip_prefix(key)?
            .strip_prefix(':')?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    })
}

/// Reads `pid`'s memory, descriptors and threads (`series` left unread).
///
/// # Errors
///
/// When the process is gone or `/proc` cannot be read.
pub fn read_proc(pid: u32) -> std::io::Result<ProcReading> {
    let dir = Path::new("/proc").join(pid.to_string());
    let status = std::fs::read_to_string(dir.join("status"))?;
    let field = |key| {
        status_field(&status, key).ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("no {key} in /proc/{pid}/status"),
            )
        })
    };
    let fds = std::fs::read_dir(dir.join("fd"))?.count() as u64;
    Ok(ProcReading {
        rss_kib: field("VmRSS")?,
        rss_anon_kib: field("RssAnon")?,
        fds,
        threads: field("Threads")?,
        series: None,
    })
}

/// The machine's one-minute load average (`/proc/loadavg`), the run's context.
pub fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// How many series an exposition carries: its lines that are neither empty nor comments.
pub fn series_count(exposition: &str) -> u64 {
    exposition
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .count() as u64
}

/// Every series of an exposition, each as its name and labels without the value: what
/// tells which series a page gained.
pub fn series_keys(exposition: &str) -> BTreeSet<String> {
    exposition
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .map(|l| l.rsplit_once(' ').map_or(l, |(key, _)| key).to_owned())
        .collect()
}

/// The `/metrics` page served at `addr` (plain HTTP, 5 s bound).
///
/// # Errors
///
/// When the page cannot be read.
pub async fn read_page(addr: SocketAddr) -> Result<String, String> {
    grid_kit::operator_harness::read_metrics(addr).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_fields_are_read_by_exact_key_in_kib() {
        let status = "Name:\tgrid\nVmRSS:\t   20480 kB\nRssAnon:\t   12000 kB\nThreads:\t7\n";
        assert_eq!(status_field(status, "VmRSS"), Some(20_480));
        assert_eq!(status_field(status, "RssAnon"), Some(12_000));
        assert_eq!(status_field(status, "Threads"), Some(7));
        assert_eq!(status_field(status, "Rss"), None, "a prefix is not a key");
    }

    #[test]
    fn this_process_reads_as_alive_with_memory_threads_and_descriptors() {
        let r = read_proc(std::process::id()).unwrap();
        assert!(r.rss_kib > 0 && r.rss_anon_kib <= r.rss_kib, "{r:?}");
        assert!(r.threads >= 1 && r.fds >= 3, "{r:?}");
    }

    #[test]
    fn series_are_the_lines_that_are_neither_comments_nor_blank() {
        let page = "# HELP a x\n# TYPE a counter\na_total 1\nb{x=\"1\"} 2\n\n# EOF\n";
        assert_eq!(series_count(page), 2);
    }

    #[test]
    fn a_series_key_is_its_name_and_labels_without_the_value() {
        let page = "# TYPE a counter\na_total 1\nb{x=\"1 2\"} 2.5\n";
        let keys: Vec<String> = series_keys(page).into_iter().collect();
        assert_eq!(keys, ["a_total", "b{x=\"1 2\"}"]);
    }
}
