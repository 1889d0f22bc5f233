//! What the demo shows each second: a redrawn table on a terminal, one plain line
//! otherwise. Pure formatting of a [`Frame`].

use std::fmt::Write as _;
use std::time::Duration;

use crate::local_grid::SiteRouting;

/// ANSI: cursor home and clear screen, before each redraw on a terminal.
pub const REDRAW: &str = "\x1b[H\x1b[2J";
/// Events kept on screen.
pub const EVENTS_SHOWN: usize = 10;

/// One site's line.
#[derive(Clone, Debug, PartialEq)]
pub struct SiteRow {
    /// Site name.
    pub name: String,
    /// `local` or `remote`.
    pub role: &'static str,
    /// Where the gateway has it.
    pub routing: SiteRouting,
    /// Requests running or waiting at the site (its model server's truth).
    pub in_flight: usize,
    /// Its share of the gateway's routing decisions of the last seconds (`None` before
    /// any).
    pub share: Option<f64>,
    /// Time to first token, median and 99th percentile, over the last seconds.
    pub ttft: Option<(Duration, Duration)>,
}

/// One timed event of the run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// Milliseconds since the load started.
    pub at_ms: u64,
    /// What happened.
    pub text: String,
}

/// Everything one refresh shows.
#[derive(Clone, Debug, PartialEq)]
pub struct Frame<'a> {
    /// Seconds since the load started.
    pub elapsed_s: u64,
    /// The run's length.
    pub duration_s: u64,
    /// The scenario's name.
    pub scenario: &'static str,
    /// Requests per second offered now.
    pub offered_rps: f64,
    /// The grid's nominal capacity in requests per second.
    pub capacity_rps: f64,
    /// Per site.
    pub sites: Vec<SiteRow>,
    /// Whether the gateway answers 429 now.
    pub shedding: bool,
    /// Answers of the last second: 200, 429, 503, failed.
    pub last_second: (u64, u64, u64, u64),
    /// The run's events so far.
    pub events: &'a [Event],
}

fn ms(d: Duration) -> String {
    format!("{:.0}ms", d.as_secs_f64() * 1e3)
}

fn figure(v: f64) -> String {
    if v.is_finite() {
        format!("{v:.2}")
    } else {
        "-".to_owned()
    }
}

/// Readiness, rho and capacity as shown.
fn routing_cells(r: &SiteRouting) -> (String, String, String) {
    match r {
        SiteRouting::Candidate {
            state,
            rho,
            capacity,
            ..
        } => (
            state.as_str().to_owned(),
            figure(*rho),
            format!("{capacity:.1}"),
        ),
        SiteRouting::Excluded(reason) => (format!("EXCLUDED {reason}"), "-".into(), "-".into()),
        SiteRouting::Absent => ("absent".into(), "-".into(), "-".into()),
    }
}

fn share(s: Option<f64>) -> String {
    s.map_or_else(|| "-".to_owned(), |v| format!("{:.0}%", v * 100.0))
}

/// The full-screen view.
pub fn render(frame: &Frame<'_>) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "grid-demo   t = {:>3} s of {} s   scenario: {}   offered: {:.1} req/s ({:.0}% of capacity {:.1} req/s)",
        frame.elapsed_s,
        frame.duration_s,
        frame.scenario,
        frame.offered_rps,
        100.0 * frame.offered_rps / frame.capacity_rps.max(f64::MIN_POSITIVE),
        frame.capacity_rps,
    );
    let _ = writeln!(
        out,
        "gateway: {}\n",
        if frame.shedding {
            "SHEDDING (429 + Retry-After)"
        } else {
            "routing"
        }
    );
    let _ = writeln!(
        out,
        "{:<5} {:<7} {:<32} {:>6} {:>9} {:>10} {:>6} {:>10} {:>10}",
        "site",
        "role",
        "readiness",
        "rho",
        "capacity",
        "in-flight",
        "share",
        "TTFT p50",
        "TTFT p99"
    );
    for s in &frame.sites {
        let (ready, rho, capacity) = routing_cells(&s.routing);
        let (p50, p99) = s
            .ttft
            .map_or(("-".to_owned(), "-".to_owned()), |(a, b)| (ms(a), ms(b)));
        let _ = writeln!(
            out,
            "{:<5} {:<7} {:<32} {:>6} {:>9} {:>10} {:>6} {:>10} {:>10}",
            s.name,
            s.role,
            ready,
            rho,
            capacity,
            s.in_flight,
            share(s.share),
            p50,
            p99
        );
    }
    let (ok, shed, unavailable, failed) = frame.last_second;
    let _ = writeln!(
        out,
        "\nlast second: {ok} ok, {shed} shed (429), {unavailable} unavailable (503), {failed} failed\n\nevents:"
    );
    let first = frame.events.len().saturating_sub(EVENTS_SHOWN);
    for e in &frame.events[first..] {
        let _ = writeln!(out, "  {:>6.1} s  {}", e.at_ms as f64 / 1e3, e.text);
    }
    out
}

/// One plain line per second, for a log or a pipe.
pub fn line(frame: &Frame<'_>) -> String {
    let mut out = format!(
        "t={}s offered={:.1}rps{}",
        frame.elapsed_s,
        frame.offered_rps,
        if frame.shedding { " SHEDDING" } else { "" }
    );
    for s in &frame.sites {
        let (ready, rho, capacity) = routing_cells(&s.routing);
        let p50 = s.ttft.map_or_else(|| "-".to_owned(), |(a, _)| ms(a));
        let _ = write!(
            out,
            " | {} {} rho={} cap={} inflight={} share={} ttft50={}",
            s.name,
            ready.replace(' ', ":"),
            rho,
            capacity,
            s.in_flight,
            share(s.share),
            p50
        );
    }
    let (ok, shed, unavailable, failed) = frame.last_second;
    let _ = write!(
        out,
        " | ok={ok} 429={shed} 503={unavailable} failed={failed}"
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use grid_score::CandidateState;

    fn frame(events: &[Event]) -> Frame<'_> {
        Frame {
            elapsed_s: 37,
            duration_s: 90,
            scenario: "full",
            offered_rps: 12.4,
            capacity_rps: 31.0,
            sites: vec![
                SiteRow {
                    name: "a".into(),
                    role: "local",
                    routing: SiteRouting::Excluded("no_ready_endpoints"),
                    in_flight: 0,
                    share: Some(0.0),
                    ttft: None,
                },
                SiteRow {
                    name: "b".into(),
                    role: "remote",
                    routing: SiteRouting::Candidate {
                        state: CandidateState::Room,
                        rho: 0.625,
                        capacity: 8.0,
                        score: 0.7,
                    },
                    in_flight: 6,
                    share: Some(0.62),
                    ttft: Some((Duration::from_millis(131), Duration::from_millis(402))),
                },
            ],
            shedding: false,
            last_second: (12, 0, 0, 1),
            events,
        }
    }

    #[test]
    fn the_table_shows_each_site_with_its_figures_and_the_events() {
        let events = [Event {
            at_ms: 36_000,
            text: "a loses all its endpoints".into(),
        }];
        let text = render(&frame(&events));
        assert!(text.contains("EXCLUDED no_ready_endpoints"), "{text}");
        assert!(text.contains("0.62") && text.contains("8.0") && text.contains("62%"));
        assert!(text.contains("131ms") && text.contains("402ms"), "{text}");
        assert!(text.contains("36.0 s  a loses all its endpoints"), "{text}");
        assert!(text.contains("12 ok, 0 shed (429), 0 unavailable (503), 1 failed"));
    }

    #[test]
    fn the_plain_line_is_one_line_with_every_site() {
        let l = line(&frame(&[]));
        assert!(!l.contains('\n'));
        assert!(l.contains("a EXCLUDED:no_ready_endpoints"), "{l}");
        assert!(
            l.contains("b room rho=0.62 cap=8.0 inflight=6 share=62% ttft50=131ms"),
            "{l}"
        );
    }

    #[test]
    fn only_the_latest_events_are_shown() {
        let events: Vec<Event> = (0..(EVENTS_SHOWN as u64 + 3))
            .map(|i| Event {
                at_ms: i * 1000,
                text: format!("event {i}"),
            })
            .collect();
        let text = render(&frame(&events));
        assert!(!text.contains("event 2\n"));
        assert!(text.contains(&format!("event {}", EVENTS_SHOWN + 2)));
    }
}
