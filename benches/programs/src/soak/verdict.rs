//! The soak's rules: which samples are warm-up, which two windows are compared, and
//! what growth between them fails the run.
//!
//! ```text
//! 0 ........ warm-up ........ | baseline window | .......... | late window | end
//!   (max(one cycle, settle,      (W long)                        (W long, ends
//!    min(20% of the run, 3 min)))                                 with the run)
//! W = max(one cycle, 10% of the run), rounded up to whole cycles
//! settle = how long a connection the load opened may be kept idle (the gateway's
//!          pool idle timeout), rounded up to whole cycles
//! ```
//!
//! Both windows hold whole cycles of the traffic script, so they see the same mix of
//! steady load, faults and bursts. Per process:
//!
//! - **memory**: the late window's median `VmRSS` at most [`MEMORY_GROWTH_LIMIT`] over
//!   the baseline window's median;
//! - **descriptors**: the late median at most [`FD_GROWTH_LIMIT`] plus [`FD_SLACK`] over
//!   the baseline median (open connections come and go with the load);
//! - **series**: the late window's most series no more than the baseline window's most
//!   plus [`SERIES_SLACK`] (a few closed label sets are created at their first use, not
//!   at start; the report names every series the end shows that the warm-up's end did
//!   not); a window whose `/metrics` was never read fails;
//! - **threads**: the late window's median thread count no more than the baseline
//!   window's plus [`THREAD_SLACK`] (a runtime's blocking pool starts and retires
//!   threads; a median ignores the few samples that catch it busy). Neither daemon
//!   exposes its runtime's task count, so threads are what is counted of its work;
//! - **alive**: in `/proc` at every sample of the late window.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use super::procs::ProcReading;

/// The share of the run that is warm-up, at most [`WARMUP_LIMIT_S`] and at least one
/// cycle: caches, pools and the allocator's arenas fill during it.
pub const WARMUP_SHARE: f64 = 0.2;
/// The longest warm-up, in seconds.
pub const WARMUP_LIMIT_S: f64 = 180.0;
/// Each compared window's share of the run, at least one cycle, in whole cycles.
pub const WINDOW_SHARE: f64 = 0.1;
/// How much the late window's median resident memory may exceed the baseline window's:
/// 5%.
pub const MEMORY_GROWTH_LIMIT: f64 = 0.05;
/// How much the late window's median descriptor count may exceed the baseline's, as a
/// share of it, on top of [`FD_SLACK`]: connections come and go with the load (clean
/// three-minute runs moved by up to 11%), while a descriptor kept per request adds
/// about a thousand in the minute between the windows.
pub const FD_GROWTH_LIMIT: f64 = 0.25;
/// Descriptors the late median may exceed the baseline's by whatever its size: a few
/// more pooled connections after a burst.
pub const FD_SLACK: u64 = 8;
/// Series the late window may show beyond the baseline window's most: label sets of
/// closed families that a daemon creates at their first use rather than at start (the
/// gateway's request outcomes, ejection reasons and routing paths), when that first use
/// falls after the warm-up (a rare timeout, an ejection). Each is one series, once; a
/// label that is not from a closed set (a request id, a peer's port) adds one per
/// request or connection, hundreds in a minute.
pub const SERIES_SLACK: u64 = 8;
/// Threads the late window's median may show beyond the baseline window's median.
pub const THREAD_SLACK: u64 = 2;

/// Where the warm-up ends and the two compared windows lie, in seconds since the load
/// started.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Windows {
    /// The end of the warm-up (the baseline window's start).
    pub warmup_end_s: f64,
    /// The baseline window, `[start, end)`.
    pub baseline: (f64, f64),
    /// The late window, `[start, end]`.
    pub late: (f64, f64),
}

impl Windows {
    /// The windows of a run of `duration_s` whose script repeats every `cycle_s`, whose
    /// daemons keep what the load opened for up to `settle_s` once idle (until then the
    /// idle connections a burst left still add up, and with them the memory their
    /// buffers hold: that is filling, not growth); `None` when the run is too short to
    /// hold a warm-up and two windows apart.
    pub fn of(duration_s: f64, cycle_s: f64, settle_s: f64) -> Option<Self> {
        if !(cycle_s > 0.0 && duration_s > 0.0) {
            return None;
        }
        let settle = (settle_s.max(0.0) / cycle_s).ceil() * cycle_s;
        let warmup = (duration_s * WARMUP_SHARE)
            .min(WARMUP_LIMIT_S)
            .max(cycle_s)
            .max(settle);
        let window = ((duration_s * WINDOW_SHARE).max(cycle_s) / cycle_s).ceil() * cycle_s;
        let w = Self {
            warmup_end_s: warmup,
            baseline: (warmup, warmup + window),
            late: (duration_s - window, duration_s),
        };
        (w.baseline.1 <= w.late.0 + 1e-9).then_some(w)
    }
}

/// One process's readings over the run.
#[derive(Clone, Debug, Default)]
pub struct Track {
    /// Its name in the table (`gateway`, `operator a`...).
    pub name: String,
    /// `(seconds since the load started, reading)`; a sample the process did not answer
    /// is missing.
    pub samples: Vec<(f64, ProcReading)>,
    /// Sample times at which it could not be read.
    pub missed: Vec<f64>,
    /// The series of its first `/metrics` page read after the warm-up.
    pub series_after_warmup: BTreeSet<String>,
    /// The series of its last `/metrics` page read.
    pub series_at_end: BTreeSet<String>,
}

impl Track {
    /// The series its last page shows that its first page after the warm-up did not:
    /// what a failed series check names.
    pub fn new_series(&self) -> Vec<&str> {
        if self.series_after_warmup.is_empty() {
            return Vec::new();
        }
        self.series_at_end
            .difference(&self.series_after_warmup)
            .map(String::as_str)
            .collect()
    }
}

/// What one check found.
#[derive(Clone, Debug, PartialEq)]
pub struct Check {
    /// The process.
    pub process: String,
    /// `memory`, `descriptors`, `series`, `threads` or `alive`.
    pub what: &'static str,
    /// The baseline window's figure.
    pub baseline: f64,
    /// The late window's figure.
    pub late: f64,
    /// The most the late figure may be.
    pub limit: f64,
    /// The unit the figures are in.
    pub unit: &'static str,
    /// Whether it held.
    pub passed: bool,
}

/// Every check of a run.
#[derive(Clone, Debug, Default)]
pub struct Verdict {
    /// In table order.
    pub checks: Vec<Check>,
}

fn median(mut v: Vec<u64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_unstable();
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2] as f64
    } else {
        (v[n / 2 - 1] + v[n / 2]) as f64 / 2.0
    })
}

fn within(samples: &[(f64, ProcReading)], (from, to): (f64, f64)) -> Vec<ProcReading> {
    samples
        .iter()
        .filter(|(t, _)| *t >= from && *t <= to)
        .map(|(_, r)| *r)
        .collect()
}

impl Verdict {
    /// Judges every track by the module's rules over `windows`.
    pub fn judge(tracks: &[Track], windows: Windows) -> Self {
        let mut checks = Vec::new();
        for track in tracks {
            let base = within(&track.samples, windows.baseline);
            let late = within(&track.samples, windows.late);
            let missed_late = track
                .missed
                .iter()
                .filter(|t| **t >= windows.late.0)
                .count();
            let process = track.name.clone();
            let alive = !late.is_empty() && missed_late == 0;
            checks.push(Check {
                process: process.clone(),
                what: "alive",
                baseline: base.len() as f64,
                late: late.len() as f64,
                limit: 0.0,
                unit: "samples",
                passed: alive,
            });
            if base.is_empty() || late.is_empty() {
                continue;
            }
            let med = |v: &[ProcReading], f: fn(&ProcReading) -> u64| {
                median(v.iter().map(f).collect()).unwrap_or(0.0)
            };
            let (b, l) = (med(&base, |r| r.rss_kib), med(&late, |r| r.rss_kib));
            let limit = b * (1.0 + MEMORY_GROWTH_LIMIT);
            checks.push(Check {
                process: process.clone(),
                what: "memory",
                baseline: b / 1024.0,
                late: l / 1024.0,
                limit: limit / 1024.0,
                unit: "MiB, median VmRSS",
                passed: l <= limit,
            });
            let (b, l) = (med(&base, |r| r.fds), med(&late, |r| r.fds));
            let limit = b * (1.0 + FD_GROWTH_LIMIT) + FD_SLACK as f64;
            checks.push(Check {
                process: process.clone(),
                what: "descriptors",
                baseline: b,
                late: l,
                limit,
                unit: "median open",
                passed: l <= limit,
            });
            let most_series =
                |v: &[ProcReading]| v.iter().filter_map(|r| r.series).max().map(|n| n as f64);
            let (b, l) = (most_series(&base), most_series(&late));
            let limit = b.unwrap_or(0.0) + SERIES_SLACK as f64;
            checks.push(Check {
                process: process.clone(),
                what: "series",
                baseline: b.unwrap_or(f64::NAN),
                late: l.unwrap_or(f64::NAN),
                limit,
                unit: "most on /metrics",
                // A window whose pages were never read proves nothing: it fails.
                passed: b.is_some() && l.is_some_and(|l| l <= limit),
            });
            let (b, l) = (med(&base, |r| r.threads), med(&late, |r| r.threads));
            let limit = b + THREAD_SLACK as f64;
            checks.push(Check {
                process,
                what: "threads",
                baseline: b,
                late: l,
                limit,
                unit: "median",
                passed: l <= limit,
            });
        }
        Self { checks }
    }

    /// Whether every check held.
    pub fn passed(&self) -> bool {
        !self.checks.is_empty() && self.checks.iter().all(|c| c.passed)
    }

    /// The checks that failed.
    pub fn failures(&self) -> Vec<&Check> {
        self.checks.iter().filter(|c| !c.passed).collect()
    }

    /// The verdict as a markdown table: process, check, both windows, growth, limit.
    pub fn table(&self) -> String {
        let mut out = String::from(
            "| process | check | baseline | late | growth | limit | verdict |\n\
             | --- | --- | ---: | ---: | ---: | ---: | --- |\n",
        );
        for c in &self.checks {
            let growth = if c.what == "alive" {
                String::new()
            } else if c.what == "memory" && c.baseline > 0.0 {
                format!("{:+.1}%", (c.late / c.baseline - 1.0) * 100.0)
            } else {
                format!("{:+}", c.late - c.baseline)
            };
            let figure = |v: f64| {
                if c.what == "memory" || v.fract() != 0.0 {
                    format!("{v:.1}")
                } else {
                    format!("{v}")
                }
            };
            let limit = if c.what == "alive" {
                "every late sample".to_owned()
            } else {
                format!("{} ({})", figure(c.limit), c.unit)
            };
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {growth} | {limit} | {} |",
                c.process,
                c.what,
                figure(c.baseline),
                figure(c.late),
                if c.passed { "flat" } else { "GROWTH" }
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(rss_kib: u64, fds: u64, series: u64, threads: u64) -> ProcReading {
        ProcReading {
            rss_kib,
            rss_anon_kib: rss_kib / 2,
            fds,
            threads,
            series: Some(series),
        }
    }

    fn track(f: impl Fn(f64) -> ProcReading) -> Track {
        Track {
            name: "gateway".into(),
            samples: (0..=60)
                .map(|i| (f64::from(i) * 2.0, f(f64::from(i) * 2.0)))
                .collect(),
            ..Track::default()
        }
    }

    #[test]
    fn a_two_minute_run_of_thirty_second_cycles_warms_one_cycle_and_compares_the_second_with_the_last()
     {
        let w = Windows::of(120.0, 30.0, 0.0).unwrap();
        assert_eq!(
            (w.warmup_end_s, w.baseline, w.late),
            (30.0, (30.0, 60.0), (90.0, 120.0))
        );
    }

    #[test]
    fn a_thirty_minute_run_warms_three_minutes_and_compares_three_minute_windows() {
        let w = Windows::of(1_800.0, 30.0, 90.0).unwrap();
        assert_eq!(
            (w.warmup_end_s, w.baseline, w.late),
            (180.0, (180.0, 360.0), (1_620.0, 1_800.0))
        );
    }

    #[test]
    fn the_warm_up_lasts_until_idle_connections_are_let_go_in_whole_cycles() {
        let w = Windows::of(180.0, 30.0, 90.0).unwrap();
        assert_eq!(
            (w.warmup_end_s, w.baseline, w.late),
            (90.0, (90.0, 120.0), (150.0, 180.0))
        );
        let w = Windows::of(180.0, 30.0, 61.0).unwrap();
        assert!(
            (w.warmup_end_s - 90.0).abs() < 1e-9,
            "a settle past two cycles takes three: {w:?}"
        );
        assert!(
            Windows::of(150.0, 30.0, 90.0).is_some(),
            "windows side by side"
        );
        assert_eq!(Windows::of(149.0, 30.0, 90.0), None);
    }

    #[test]
    fn a_run_too_short_for_two_windows_after_its_warm_up_has_none() {
        assert_eq!(Windows::of(80.0, 30.0, 0.0), None);
        assert_eq!(Windows::of(120.0, 0.0, 0.0), None);
    }

    #[test]
    fn flat_readings_with_noise_pass_every_check() {
        let t = track(|t| reading(20_000 + (t as u64 % 7) * 100, 40 + t as u64 % 3, 300, 5));
        let v = Verdict::judge(&[t], Windows::of(120.0, 30.0, 0.0).unwrap());
        assert!(v.passed(), "{}", v.table());
        assert_eq!(v.checks.len(), 5);
    }

    #[test]
    fn memory_growing_past_five_percent_between_the_windows_fails_and_only_memory() {
        // 20 MiB growing 20 KiB a second: +1.2 MiB between the windows' middles, 6%.
        let t = track(|t| reading(20_480 + (t * 20.0) as u64, 40, 300, 5));
        let v = Verdict::judge(&[t], Windows::of(120.0, 30.0, 0.0).unwrap());
        let failed: Vec<&str> = v.failures().iter().map(|c| c.what).collect();
        assert_eq!(failed, ["memory"], "{}", v.table());
        assert!(v.table().contains("GROWTH"));
    }

    #[test]
    fn leaked_descriptors_new_series_and_new_threads_each_fail_their_check() {
        let t = track(|t| {
            let new_series = if t > 100.0 { SERIES_SLACK + 1 } else { 0 };
            reading(20_000, 40 + t as u64, 300 + new_series, 5 + t as u64 / 20)
        });
        let v = Verdict::judge(&[t], Windows::of(120.0, 30.0, 0.0).unwrap());
        let failed: Vec<&str> = v.failures().iter().map(|c| c.what).collect();
        assert_eq!(
            failed,
            ["descriptors", "series", "threads"],
            "{}",
            v.table()
        );
    }

    /// Readings of `base` up to the middle of the run and `late` after it.
    fn step(base: ProcReading, late: ProcReading) -> Track {
        track(|t| if t < 75.0 { base } else { late })
    }

    fn failed(t: Track) -> Vec<&'static str> {
        let v = Verdict::judge(&[t], Windows::of(120.0, 30.0, 0.0).unwrap());
        v.failures().iter().map(|c| c.what).collect()
    }

    #[test]
    fn growth_exactly_at_each_limit_passes_and_one_unit_past_it_fails() {
        let base = reading(20_000, 40, 300, 5);
        // Memory: 5% of 20,000 KiB is 1,000 KiB.
        assert!(failed(step(base, reading(21_000, 40, 300, 5))).is_empty());
        assert_eq!(failed(step(base, reading(21_001, 40, 300, 5))), ["memory"]);
        // Descriptors: 25% of 40 plus 8 is 18.
        assert!(failed(step(base, reading(20_000, 58, 300, 5))).is_empty());
        assert_eq!(
            failed(step(base, reading(20_000, 59, 300, 5))),
            ["descriptors"]
        );
        // Series: eight more.
        assert!(failed(step(base, reading(20_000, 40, 308, 5))).is_empty());
        assert_eq!(failed(step(base, reading(20_000, 40, 309, 5))), ["series"]);
        // Threads: two more.
        assert!(failed(step(base, reading(20_000, 40, 300, 7))).is_empty());
        assert_eq!(failed(step(base, reading(20_000, 40, 300, 8))), ["threads"]);
    }

    #[test]
    fn growth_during_the_warm_up_and_a_spike_every_cycle_are_not_growth() {
        // Memory doubles over the first cycle, then a burst adds 30% for a fifth of
        // every cycle; descriptors and threads jump with it.
        let t = track(|t| {
            let warm = (t / 30.0).min(1.0);
            let burst = (t % 30.0) >= 20.0 && (t % 30.0) < 26.0;
            let rss = (10_000.0 + 10_000.0 * warm) as u64 + if burst { 6_000 } else { 0 };
            reading(
                rss,
                40 + 30 * u64::from(burst),
                300,
                5 + 6 * u64::from(burst),
            )
        });
        assert!(failed(t).is_empty());
    }

    #[test]
    fn a_window_whose_metrics_page_was_never_read_fails_series() {
        let mut t = track(|_| reading(20_000, 40, 300, 5));
        for (s, r) in &mut t.samples {
            if *s >= 90.0 {
                r.series = None;
            }
        }
        assert_eq!(failed(t), ["series"]);
    }

    #[test]
    fn a_metrics_page_missed_now_and_then_is_not_a_failure() {
        let mut t = track(|_| reading(20_000, 40, 300, 5));
        for (i, (_, r)) in t.samples.iter_mut().enumerate() {
            if i % 5 == 0 {
                r.series = None;
            }
        }
        assert!(failed(t).is_empty());
    }

    #[test]
    fn a_process_that_stops_answering_late_fails_alive() {
        let mut t = track(|_| reading(20_000, 40, 300, 5));
        t.samples.retain(|(s, _)| *s < 100.0);
        t.missed = vec![100.0, 102.0];
        let v = Verdict::judge(&[t], Windows::of(120.0, 30.0, 0.0).unwrap());
        assert!(!v.passed());
        assert_eq!(v.failures()[0].what, "alive");
    }
}
