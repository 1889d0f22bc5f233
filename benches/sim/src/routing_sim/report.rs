//! The simulator's outputs: the printed table, the CSV files and the SVG plot.

use std::fmt::Write as _;
use std::path::Path as FsPath;

use plotters::prelude::*;

use super::policy::Policy;
use super::stats::{Summary, UNSERVED};
use super::{PolicyResult, SimConfig};

/// One load level's results.
#[derive(Debug)]
pub struct LoadResults {
    /// The scenario run.
    pub config: SimConfig,
    /// Every policy's outcome, in [`Policy::ALL`] order.
    pub results: Vec<PolicyResult>,
}

impl LoadResults {
    /// The result of `policy`, if it ran.
    pub fn get(&self, policy: Policy) -> Option<&PolicyResult> {
        self.results.iter().find(|r| r.policy == policy)
    }
}

/// A delay in ms, or `refused` where the percentile falls among requests never served.
fn ms(v: u64) -> String {
    if v == UNSERVED {
        "refused".to_owned()
    } else {
        v.to_string()
    }
}

/// A delay in seconds with one decimal, or `refused`.
fn seconds(v: u64) -> String {
    if v == UNSERVED {
        "refused".to_owned()
    } else {
        format!("{:.1} s", v as f64 / 1_000.0)
    }
}

/// The printed table: one row per load and policy.
pub fn table(all: &[LoadResults]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:>5} {:<18} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>7} {:>6} {:>8} {:>7} {:>6}  shares per site",
        "load",
        "policy",
        "requests",
        "mean_ms",
        "p50_ms",
        "p99_ms",
        "p99_ttft",
        "p99_e2e",
        "to_full",
        "deg_pre",
        "deg_in",
        "deg_post",
        "leave_s",
        "halve_s",
        "failed",
        "ref_room",
        "retries",
        "retry%"
    );
    for level in all {
        for r in &level.results {
            let s = &r.summary;
            let shares: Vec<String> = s.site_shares.iter().map(|x| format!("{x:.2}")).collect();
            let _ = writeln!(
                out,
                "{:>4.0}% {:<18} {:>8} {:>8.0} {:>8} {:>8} {:>8} {:>8} {:>7.1}% {:>7.1}% {:>7.1}% {:>7.1}% {:>8} {:>7} {:>6} {:>8} {:>7} {:>5.1}%  {}",
                level.config.load * 100.0,
                r.policy.as_str(),
                s.requests,
                s.mean_ms,
                ms(s.p50_ms),
                ms(s.p99_ms),
                ms(s.p99_ttft_ms),
                ms(s.p99_e2e_ms),
                s.full_share * 100.0,
                s.degrade.share_before * 100.0,
                s.degrade.share_during * 100.0,
                s.degrade.share_after * 100.0,
                s.degrade
                    .leave_s
                    .map_or_else(|| "never".to_owned(), |v| v.to_string()),
                s.degrade
                    .halve_s
                    .map_or_else(|| "never".to_owned(), |v| v.to_string()),
                s.failed,
                s.refused_room,
                s.retries,
                s.retry_share * 100.0,
                shares.join(" ")
            );
        }
    }
    out
}

/// What grid's gateway did about failing sites and lost signals, per load (the refresh's
/// routing events and its probes), and the retries every policy's gateway made.
pub fn failure_lines(all: &[LoadResults]) -> String {
    let mut out = String::new();
    for level in all {
        let Some(ours) = level.get(Policy::Ours) else {
            continue;
        };
        let c = ours.signals;
        let _ = writeln!(
            out,
            "{:.0}% ours: ejected {} (back by probe {}, by time {}, by reading {}), probes {} (answered {}), \
             without signals {}x, unroutable {}x, scrapes failed {}, gateway polls failed {}, \
             peer polls {}, gossip pulls {}",
            level.config.load * 100.0,
            c.ejections,
            c.rejoined_by_probe,
            c.rejoined_by_time,
            c.rejoined_by_reading,
            c.probes,
            c.probes_answered,
            c.without_signals,
            c.unroutable,
            c.failed_scrapes,
            c.failed_gateway_polls,
            c.peer_polls,
            c.gossip_pulls,
        );
        let skipped: Vec<String> = level
            .results
            .iter()
            .map(|r| {
                format!(
                    "{} {}/{}",
                    r.policy.as_str(),
                    r.record.retries_skipped_budget,
                    r.record.retries_skipped_no_site
                )
            })
            .collect();
        let _ = writeln!(
            out,
            "{:.0}% refusals not retried (budget/no other site): {}",
            level.config.load * 100.0,
            skipped.join(", ")
        );
        let room: Vec<String> = level
            .results
            .iter()
            .map(|r| {
                format!(
                    "{} {}/{}",
                    r.policy.as_str(),
                    r.record.refused_room - r.record.refused_room_full,
                    r.record.refused_room_full
                )
            })
            .collect();
        let _ = writeln!(
            out,
            "{:.0}% refused while another site had room (503/429): {}",
            level.config.load * 100.0,
            room.join(", ")
        );
    }
    out
}

/// The failure table across seeds (Markdown), at the load closest to [`RATIO_LOAD`]:
/// per seed and policy the p99 queueing delay, time to first token and end to end,
/// client-visible failures,
/// refusals answered while another site had room, and the retries' share of requests.
pub fn failures_by_seed(runs: &[Vec<LoadResults>]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| seed | load | policy | p99 | p99 TTFT | p99 e2e | failed | refused while another site had room | retries | retry share |"
    );
    let _ = writeln!(out, "|{}", " --- |".repeat(10));
    for levels in runs {
        let Some(level) = ratio_level(levels) else {
            continue;
        };
        for r in &level.results {
            let s = &r.summary;
            let _ = writeln!(
                out,
                "| {} | {:.0}% | {} | {} | {} | {} | {} | {} | {} | {:.1}% |",
                level.config.seed,
                level.config.load * 100.0,
                r.policy.as_str(),
                seconds(s.p99_ms),
                seconds(s.p99_ttft_ms),
                seconds(s.p99_e2e_ms),
                s.failed,
                s.refused_room,
                s.retries,
                s.retry_share * 100.0
            );
        }
    }
    out
}

/// The bound on ours' p99 time to first token over the oracle's (the oracle is a
/// heuristic that sees every site's true state, not a lower bound).
pub const ORACLE_BOUND: f64 = 1.25;

/// What users would run instead: ours is to be no worse than each.
pub const PEERS: [Policy; 5] = [
    Policy::Prequal,
    Policy::P2cPeakEwma,
    Policy::LlmDHub,
    Policy::LiteLlmLeastBusy,
    Policy::SkyWalker,
];

/// The policies ours is compared with, in the tables' column order: the oracle, then
/// [`PEERS`].
fn compared() -> impl Iterator<Item = Policy> {
    std::iter::once(Policy::Oracle).chain(PEERS)
}

/// Ours' p99 time to first token of the requests served over `other`'s.
fn served_ttft_ratio(ours: &Summary, other: &Summary) -> f64 {
    ours.p99_ttft_served_ms as f64 / (other.p99_ttft_served_ms as f64).max(1.0)
}

/// The verdict against the routing targets at the load closest to 85%, read on the p99
/// time to first token of the requests served, with each policy's failures beside it
/// rather than folded into the percentile: ours at most [`ORACLE_BOUND`] times the
/// oracle's, and no worse than any of [`PEERS`] (no slower and failing no more).
pub fn target_lines(all: &[LoadResults]) -> String {
    let Some(level) = ratio_level(all) else {
        return String::new();
    };
    let Some(ours) = level.get(Policy::Ours).map(|r| &r.summary) else {
        return String::new();
    };
    let verdict = |ok: bool| if ok { "met" } else { "MISSED" };
    let against = |p: Policy, bound: f64, fail_no_more: bool| -> Option<String> {
        let other = &level.get(p)?.summary;
        let r = served_ttft_ratio(ours, other);
        let ok = r <= bound && (!fail_no_more || ours.failed <= other.failed);
        Some(format!(
            "{r:.2}x {} ({} ms, {} failed; target <= {bound}x{}: {})",
            p.as_str(),
            other.p99_ttft_served_ms,
            other.failed,
            if fail_no_more {
                ", failing no more"
            } else {
                ""
            },
            verdict(ok)
        ))
    };
    let parts: Vec<String> = compared()
        .filter_map(|p| {
            let peer = p != Policy::Oracle;
            against(p, if peer { 1.0 } else { ORACLE_BOUND }, peer)
        })
        .collect();
    let mut out = String::new();
    if !parts.is_empty() {
        let _ = writeln!(
            out,
            "at {:.0}% load: ours p99 TTFT {} ms served, {} failed = {}",
            level.config.load * 100.0,
            ours.p99_ttft_served_ms,
            ours.failed,
            parts.join(", ")
        );
    }
    out
}

/// The load the ratios are taken at.
pub const RATIO_LOAD: f64 = 0.85;

/// The level of `levels` closest to [`RATIO_LOAD`].
fn ratio_level(levels: &[LoadResults]) -> Option<&LoadResults> {
    levels.iter().min_by(|a, b| {
        (a.config.load - RATIO_LOAD)
            .abs()
            .total_cmp(&(b.config.load - RATIO_LOAD).abs())
    })
}

/// The p99 table across seeds (Markdown): per seed and policy, the p99 queueing delay
/// in seconds at every load; then per seed, at the load closest to [`RATIO_LOAD`], ours
/// over the oracle and each of [`PEERS`]. `runs` holds one seed's loads each.
pub fn p99_by_seed(runs: &[Vec<LoadResults>]) -> String {
    let mut out = String::new();
    let Some(first) = runs.first() else {
        return out;
    };
    let _ = write!(out, "| seed | policy |");
    for level in first {
        let _ = write!(out, " p99 at {:.0}% |", level.config.load * 100.0);
    }
    out.push('\n');
    let _ = writeln!(out, "|{}", " --- |".repeat(first.len() + 2));
    for levels in runs {
        for policy in Policy::ALL {
            let Some(seed) = levels.first().map(|l| l.config.seed) else {
                continue;
            };
            let _ = write!(out, "| {seed} | {} |", policy.as_str());
            for level in levels {
                match level.get(policy) {
                    Some(r) => {
                        let _ = write!(out, " {} |", seconds(r.summary.p99_ms));
                    }
                    None => out.push_str(" - |"),
                }
            }
            out.push('\n');
        }
    }
    out.push('\n');
    let _ = write!(out, "| seed | load | ours p99 |");
    for p in compared() {
        let _ = write!(out, " ours / {} |", p.as_str());
    }
    out.push('\n');
    let _ = writeln!(out, "|{}", " --- |".repeat(compared().count() + 3));
    for levels in runs {
        let Some(level) = ratio_level(levels) else {
            continue;
        };
        let raw = |p| level.get(p).map(|r| r.summary.p99_ms);
        let p99 = |p| raw(p).filter(|&v| v != UNSERVED).map(|v| v as f64);
        let ratio = |p| match (raw(Policy::Ours), raw(p)) {
            (Some(UNSERVED), _) => "ours refused".to_owned(),
            (Some(_), Some(UNSERVED)) => "0 (it refused)".to_owned(),
            (Some(a), Some(b)) => format!("{:.2}x", a as f64 / (b as f64).max(1.0)),
            _ => "-".to_owned(),
        };
        let _ = write!(
            out,
            "| {} | {:.0}% | {} |",
            level.config.seed,
            level.config.load * 100.0,
            p99(Policy::Ours).map_or_else(|| "-".to_owned(), |v| format!("{:.1} s", v / 1_000.0)),
        );
        for p in compared() {
            let _ = write!(out, " {} |", ratio(p));
        }
        out.push('\n');
    }
    out
}

/// The time-to-first-token table across seeds (Markdown), at the load closest to
/// [`RATIO_LOAD`]: per seed ours' p99 of the requests served and its failures, then ours
/// over the oracle and each of [`PEERS`], each with that policy's failures.
pub fn ttft_by_seed(runs: &[Vec<LoadResults>]) -> String {
    let mut out = String::new();
    let others: Vec<Policy> = compared().collect();
    let _ = write!(out, "| seed | load | ours p99 TTFT (failed) |");
    for p in &others {
        let _ = write!(out, " ours / {} (its failed) |", p.as_str());
    }
    out.push('\n');
    let _ = writeln!(out, "|{}", " --- |".repeat(others.len() + 3));
    for levels in runs {
        let Some(level) = ratio_level(levels) else {
            continue;
        };
        let Some(ours) = level.get(Policy::Ours).map(|r| &r.summary) else {
            continue;
        };
        let _ = write!(
            out,
            "| {} | {:.0}% | {} ({}) |",
            level.config.seed,
            level.config.load * 100.0,
            seconds(ours.p99_ttft_served_ms),
            ours.failed
        );
        for p in &others {
            match level.get(*p).map(|r| &r.summary) {
                Some(o) => {
                    let r = served_ttft_ratio(ours, o);
                    let _ = write!(out, " {r:.2}x ({}) |", o.failed);
                }
                None => out.push_str(" - |"),
            }
        }
        out.push('\n');
    }
    out
}

/// `summary.csv`: one row per seed, load and policy.
pub fn summary_csv(all: &[LoadResults]) -> String {
    let sites = all
        .first()
        .map(|l| l.config.sites.clone())
        .unwrap_or_default();
    let mut out = String::from(
        "seed,load,policy,requests,mean_ms,p50_ms,p99_ms,p99_ttft_ms,p99_ttft_served_ms,p99_e2e_ms,max_ms,to_full_share,unplaced,failed,refused_room,refused_by_gateway,retries,retries_skipped_budget,retries_skipped_no_site,retry_share,degraded_share_before,degraded_share_during,degraded_share_after,leave_s,halve_s,p99_ttft_served_band0_ms,p99_ttft_served_high_ms",
    );
    for s in &sites {
        let _ = write!(out, ",share_{}", s.name);
    }
    out.push('\n');
    for level in all {
        for r in &level.results {
            let s = &r.summary;
            let _ = write!(
                out,
                "{},{},{},{},{:.1},{},{},{},{},{},{},{:.4},{},{},{},{},{},{},{},{:.4},{:.4},{:.4},{:.4},{},{}",
                level.config.seed,
                level.config.load,
                r.policy.as_str(),
                s.requests,
                s.mean_ms,
                s.p50_ms,
                s.p99_ms,
                s.p99_ttft_ms,
                s.p99_ttft_served_ms,
                s.p99_e2e_ms,
                s.max_ms,
                s.full_share,
                s.unplaced,
                s.failed,
                s.refused_room,
                r.record.refused_by_gateway,
                s.retries,
                r.record.retries_skipped_budget,
                r.record.retries_skipped_no_site,
                s.retry_share,
                s.degrade.share_before,
                s.degrade.share_during,
                s.degrade.share_after,
                s.degrade
                    .leave_s
                    .map_or_else(String::new, |v| v.to_string()),
                s.degrade
                    .halve_s
                    .map_or_else(String::new, |v| v.to_string()),
            );
            let (band0, high) = s
                .p99_ttft_by_band
                .map_or_else(Default::default, |(b, h)| (b.to_string(), h.to_string()));
            let _ = write!(out, ",{band0},{high}");
            for share in &s.site_shares {
                let _ = write!(out, ",{share:.4}");
            }
            out.push('\n');
        }
    }
    out
}

/// `shares.csv`: per second and policy, each site's share of the requests routed that
/// second, at one load level.
pub fn shares_csv(level: &LoadResults) -> String {
    let mut out = String::from("second,policy");
    for s in &level.config.sites {
        let _ = write!(out, ",{}", s.name);
    }
    out.push('\n');
    for r in &level.results {
        for (second, counts) in r.record.per_second.iter().enumerate() {
            let total: u32 = counts.iter().sum();
            let _ = write!(out, "{second},{}", r.policy.as_str());
            for c in counts {
                let share = if total == 0 {
                    0.0
                } else {
                    f64::from(*c) / f64::from(total)
                };
                let _ = write!(out, ",{share:.3}");
            }
            out.push('\n');
        }
    }
    out
}

fn color(policy: Policy) -> RGBColor {
    match policy {
        Policy::Ours => RGBColor(214, 39, 40),
        Policy::RoundRobin => RGBColor(127, 127, 127),
        Policy::CapacityWeighted => RGBColor(44, 160, 44),
        Policy::LeastQueue => RGBColor(255, 127, 14),
        Policy::Prequal => RGBColor(148, 103, 189),
        Policy::P2cPeakEwma => RGBColor(140, 86, 75),
        Policy::LlmDHub => RGBColor(188, 189, 34),
        Policy::LiteLlmLeastBusy => RGBColor(23, 190, 207),
        Policy::SkyWalker => RGBColor(227, 119, 194),
        Policy::Oracle => RGBColor(31, 119, 180),
    }
}

/// Smoothed share of `site` over a trailing window of `window` seconds, per second.
fn smoothed_share(per_second: &[Vec<u32>], site: usize, window: usize) -> Vec<(f64, f64)> {
    (0..per_second.len())
        .map(|end| {
            let start = (end + 1).saturating_sub(window);
            let (mine, all) = per_second[start..=end]
                .iter()
                .fold((0u32, 0u32), |(m, a), s| {
                    (m + s[site], a + s.iter().sum::<u32>())
                });
            let share = if all == 0 {
                0.0
            } else {
                f64::from(mine) / f64::from(all)
            };
            (end as f64, share * 100.0)
        })
        .collect()
}

/// Writes the SVG: p99 queueing delay against load per policy, and the degraded site's
/// share of traffic over time at `focus`.
pub fn plot(all: &[LoadResults], focus: &LoadResults, path: &FsPath) -> Result<(), String> {
    let root = SVGBackend::new(path, (1200, 500)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let (left, right) = root.split_horizontally(560);
    plot_p99(all, &left)?;
    plot_degraded_share(focus, &right)?;
    root.present().map_err(|e| e.to_string())
}

type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;

fn plot_p99(all: &[LoadResults], left: &Area<'_>) -> Result<(), String> {
    // Seconds on a log axis: round-robin is orders of magnitude above the rest.
    let floor = 0.01;
    // A p99 that falls among refused requests has no delay to plot: it is drawn at the
    // top of the axis.
    let p99_s = |r: &PolicyResult| {
        if r.summary.p99_ms == UNSERVED {
            f64::NAN
        } else {
            (r.summary.p99_ms as f64 / 1_000.0).max(floor)
        }
    };
    let max_p99 = all
        .iter()
        .flat_map(|l| l.results.iter().map(p99_s))
        .filter(|v| v.is_finite())
        .fold(1.0, f64::max);
    let loads: Vec<f64> = all.iter().map(|l| l.config.load * 100.0).collect();
    let lo = loads.iter().copied().fold(f64::INFINITY, f64::min) - 2.0;
    let hi = loads.iter().copied().fold(f64::NEG_INFINITY, f64::max) + 2.0;
    let mut chart = ChartBuilder::on(left)
        .caption("p99 queueing delay by offered load", ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(60)
        .build_cartesian_2d(lo..hi, (floor..max_p99 * 2.0).log_scale())
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc("offered load (% of capacity)")
        .y_desc("p99 queueing delay (s, log)")
        .draw()
        .map_err(|e| e.to_string())?;
    for policy in Policy::ALL {
        let points: Vec<(f64, f64)> = all
            .iter()
            .filter_map(|l| l.get(policy).map(|r| (l.config.load * 100.0, p99_s(r))))
            .filter(|(_, v)| v.is_finite())
            .collect();
        let c = color(policy);
        chart
            .draw_series(LineSeries::new(points, c.stroke_width(2)))
            .map_err(|e| e.to_string())?
            .label(policy.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::LowerRight)
        .draw()
        .map_err(|e| e.to_string())
}

fn plot_degraded_share(focus: &LoadResults, right: &Area<'_>) -> Result<(), String> {
    let window = focus.config.degrade_window();
    let seconds = focus
        .results
        .first()
        .map_or(1, |r| r.record.per_second.len()) as f64;
    let mut chart = ChartBuilder::on(right)
        .caption(
            format!(
                "share of traffic to the degraded site ({}), {:.0}% load",
                focus.config.sites[window.site].name,
                focus.config.load * 100.0
            ),
            ("sans-serif", 18),
        )
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(50)
        .build_cartesian_2d(0.0..seconds, 0.0..50.0)
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc("virtual time (s); degraded between the dashed lines")
        .y_desc("share (%), 15 s trailing")
        .draw()
        .map_err(|e| e.to_string())?;
    for edge in [window.from_ms, window.until_ms] {
        let x = edge as f64 / 1_000.0;
        chart
            .draw_series(DashedLineSeries::new(
                vec![(x, 0.0), (x, 50.0)],
                4,
                4,
                BLACK.stroke_width(1),
            ))
            .map_err(|e| e.to_string())?;
    }
    for r in &focus.results {
        let c = color(r.policy);
        chart
            .draw_series(LineSeries::new(
                smoothed_share(&r.record.per_second, window.site, 15),
                c.stroke_width(1),
            ))
            .map_err(|e| e.to_string())?
            .label(r.policy.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(|e| e.to_string())
}
