//! What the demo shows each second: a redrawn table on a terminal, one plain line
//! otherwise. Pure formatting of a [`Frame`].

use std::fmt::Write as _;
use std::time::Duration;

use grid_kit::local_grid::SiteRouting;

/// Seconds of routing decisions the share of traffic is computed over.
pub const SHARE_WINDOW_S: usize = 3;
/// Seconds of answers the TTFT percentiles are computed over.
pub const TTFT_WINDOW_S: usize = 10;

/// ANSI: cursor home and clear screen, before each redraw on a terminal.
pub const REDRAW: &str = "\x1b[H\x1b[2J";
/// Events kept on screen.
pub const EVENTS_SHOWN: usize = 10;

/// The live table's column headers, in order: one list, so the header and the test that
/// the legend explains every column cannot drift apart.
pub const COLUMNS: [&str; 9] = [
    "site",
    "role",
    "readiness",
    "rho",
    "capacity",
    "in-flight",
    "share",
    "TTFT p50",
    "TTFT p99",
];

/// What every column and figure of the demo means, printed once at start and repeated in
/// `grid-demo --help`: a newcomer reads `no_room`, `cap=` or `failed` without the source.
/// The plain line's key follows each live column in brackets.
pub fn legend() -> String {
    let share_s = SHARE_WINDOW_S;
    let ttft_s = TTFT_WINDOW_S;
    format!(
        "\
What the columns mean (the plain line's key in brackets):
  site        a is the gateway's own site; b and c are reached through peer operators
  role        local: the gateway's own site; remote: seen through a peer, read every poll
  readiness   where the gateway has the site:
                room        takes new work (recent worst rho below 1)
                no_room     no room to spare, but not saturated with work waiting
                full        saturated: work waiting at every endpoint or in flow control
                unmeasured  no fresh reading yet: picked last
                EXCLUDED r  out of selection, r says why: no_ready_endpoints (the EPP
                            reads zero ready endpoints), not_ready (its provider reads
                            not ready), unit_series_stopped (its per-endpoint series
                            stopped), ejected (its answers kept failing; probed until
                            it answers)
                absent      not in the gateway's view
  rho         the load the gateway reads, smoothed: in-flight over learned capacity
              (or KV pressure); above 1 means work waits [rho=]
  capacity    requests at once the gateway has learned the site takes [cap=]
  in-flight   requests running or waiting at the site, by its own count [inflight=]
  share       the site's share of the gateway's routing decisions, last {share_s} s [share=]
  TTFT p50    median time to first token of streamed answers, last {ttft_s} s [ttft50=]
  TTFT p99    its 99th percentile over the same answers
last second, by answer:
  ok                 200, served by a site [ok=]
  shed (429)         the gateway sheds: every healthy site is full [429=]
  unavailable (503)  no site was selectable [503=]
  failed             anything else: a site's error, 502, no answer within the timeout,
                     or an arrival not sent because too many were open [failed=]
offered: requests per second sent now, against the grid's nominal capacity [offered=];
SHEDDING: the gateway answers 429 + Retry-After now; t: seconds since the load started [t=]"
    )
}

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
    let [
        site,
        role,
        readiness,
        rho,
        capacity,
        in_flight,
        share_c,
        p50,
        p99,
    ] = COLUMNS;
    let _ = writeln!(
        out,
        "{site:<5} {role:<7} {readiness:<32} {rho:>6} {capacity:>9} {in_flight:>10} {share_c:>6} {p50:>10} {p99:>10}",
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
    // The legend printed at start is cleared by the first redraw: say where it lives.
    let _ = writeln!(out, "\n(every column is explained by grid-demo --help)");
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

    #[test]
    fn the_legend_explains_every_column_the_table_prints() {
        let text = render(&frame(&[]));
        let header = text.lines().find(|l| l.starts_with("site ")).unwrap();
        let legend = legend();
        for column in COLUMNS {
            assert!(header.contains(column), "{header}");
            // Each column opens a line of the legend, so it is explained, not only named.
            assert!(
                legend.lines().any(|l| l.trim_start().starts_with(column)),
                "{column} is not explained:\n{legend}"
            );
        }
        for answer in ["ok", "shed (429)", "unavailable (503)", "failed"] {
            assert!(text.contains(answer), "{text}");
            assert!(
                legend.lines().any(|l| l.trim_start().starts_with(answer)),
                "{answer} is not explained:\n{legend}"
            );
        }
    }

    #[test]
    fn the_legend_explains_every_key_of_the_plain_line() {
        let mut shedding = frame(&[]);
        shedding.shedding = true;
        let l = line(&shedding);
        let legend = legend();
        let keys: Vec<&str> = l
            .split([' ', '|'])
            .filter_map(|token| token.split_once('=').map(|(key, _)| key))
            .collect();
        for key in [
            "t", "offered", "rho", "cap", "inflight", "share", "ttft50", "ok", "429", "503",
            "failed",
        ] {
            assert!(keys.contains(&key), "{key} missing from {l}");
        }
        for key in keys {
            assert!(
                legend.contains(&format!("[{key}=]")),
                "{key}= is not explained"
            );
        }
        assert!(l.contains("SHEDDING") && legend.contains("SHEDDING:"));
    }

    #[test]
    fn the_legend_explains_every_readiness_state_and_exclusion_reason() {
        let legend = legend();
        let opens = |word: &str| {
            legend
                .lines()
                .any(|l| l.split_whitespace().next() == Some(word))
        };
        for state in CandidateState::ALL {
            assert!(opens(state.as_str()), "{}:\n{legend}", state.as_str());
        }
        assert!(opens("EXCLUDED") && opens("absent"), "{legend}");
        for reason in grid_score::ExcludeReason::ALL {
            assert!(legend.contains(reason.as_str()), "{}", reason.as_str());
        }
    }

    #[test]
    fn the_live_screen_points_to_the_legend_it_clears() {
        assert!(render(&frame(&[])).contains("explained by grid-demo --help"));
    }
}
