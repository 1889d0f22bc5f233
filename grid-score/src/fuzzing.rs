//! Arbitrary bytes to scorer input sequences, and the invariants every sequence must keep.
//!
//! Public so the cargo-fuzz target (`score_sequence`), the property tests and users who
//! fuzz their own drivers share one decoder. Sequences run over a fixed world of
//! [`FUZZ_SITES`] sites and three models (two overlapping, one with no candidates); a
//! fourth model name is never configured.
//!
//! Invariants checked by [`run`]:
//! - no panic;
//! - every snapshot value is finite and in range, or the [`crate::UNMEASURED`] sentinel;
//!   capacity is never NaN, negative or below [`crate::CAPACITY_FLOOR`];
//! - a routed site is never one that a reading vetoed (ready 0 or zero ready endpoints)
//!   unless a later reading said ready or the veto is older than the freshness window,
//!   and a model with any healthy candidate is never Unavailable;
//! - when a candidate has headroom, the pick goes to a candidate with headroom, and never
//!   to an unmeasured one while a measured one has room (an unmeasured site is tried only
//!   once every measured site is full, by capacity);
//! - an unconfigured model is always `UnknownModel`.

use std::collections::HashSet;
use std::fmt;

use crate::Path;
use crate::SplitMix64;
use crate::config::ScoreConfig;
use crate::reading::{CandidateKey, Reading, UnitQueues};
use crate::scorer::{Routes, Scorer};
use crate::select::Decision;
use crate::snapshot::{CandidateState, RouteTable, UNMEASURED};

/// Sites in the fuzz world; site `i` serves provider `p{i}`.
pub const FUZZ_SITES: u8 = 6;

/// Steps decoded from one input at most, so one input cannot run unboundedly long.
pub const MAX_FUZZ_STEPS: usize = 4_096;

/// Milliseconds one clock-step byte unit advances time (so one byte spans 0 to 25.5 s,
/// enough to cross every freshness, window and shedding threshold).
const CLOCK_UNIT_MS: u64 = 100;

/// One decoded action.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// Feed a reading for a site (index below [`FUZZ_SITES`]).
    Reading {
        /// Site index.
        site: u8,
        /// The reading; its stamp is relative to the clock at decode time.
        reading: Reading,
    },
    /// A revision event for a site.
    Reset {
        /// Site index.
        site: u8,
    },
    /// The site leaves the config and is forgotten.
    Forget {
        /// Site index.
        site: u8,
    },
    /// Move the clock forward.
    Advance {
        /// Milliseconds.
        ms: u64,
    },
    /// Rebuild the route table.
    Refresh,
    /// Pick `draws` times for a model index (3 is never configured).
    Pick {
        /// Model index, 0 to 3.
        model: u8,
        /// How many picks.
        draws: u8,
    },
}

/// A broken invariant: the step index and what went wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// Index of the step that exposed it.
    pub step: usize,
    /// Description.
    pub what: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "step {}: {}", self.step, self.what)
    }
}

/// What one run did, for coverage-minded callers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RunStats {
    /// Steps executed.
    pub steps: usize,
    /// Readings the scorer refused.
    pub refused: usize,
    /// Picks made.
    pub picks: usize,
    /// Picks that routed.
    pub routed: usize,
}

struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn byte(&mut self) -> Option<u8> {
        let (&b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(b)
    }

    /// A value from a palette of interesting floats, or eight raw bytes.
    fn float(&mut self) -> Option<f64> {
        const PALETTE: [f64; 15] = [
            0.0,
            0.5,
            1.0,
            2.0,
            3.0,
            4.0,
            8.0,
            16.0,
            64.0,
            0.25,
            0.99,
            1.0e7,
            -1.0,
            f64::NAN,
            f64::INFINITY,
        ];
        let b = self.byte()?;
        if b == u8::MAX {
            let mut raw = [0u8; 8];
            for r in &mut raw {
                *r = self.byte()?;
            }
            return Some(f64::from_le_bytes(raw));
        }
        let i = usize::from(b);
        if i < PALETTE.len() {
            Some(PALETTE[i])
        } else {
            // Otherwise a spread of ordinary counts and fractions.
            Some(f64::from(b) / 8.0)
        }
    }
}

fn decode_reading(b: &mut Bytes<'_>, clock_ms: u64) -> Option<Reading> {
    let flags = b.byte()?;
    let more = b.byte()?;
    let delta = i64::from(b.byte()? as i8) * 50;
    let bit = |f: u8, i: u8| f & (1 << i) != 0;
    let ready = match more & 0b11 {
        0 => None,
        1 => Some(true),
        _ => Some(false),
    };
    let ready_endpoints = if bit(more, 2) {
        Some(u32::from(b.byte()? % 5))
    } else {
        None
    };
    let units = if bit(more, 3) {
        let units = u32::from(b.byte()? % 5);
        let waiting = u32::from(b.byte()? % 6); // may exceed units: refused
        Some(UnitQueues { units, waiting })
    } else {
        None
    };
    let mut values = [None; 5];
    for (i, value) in (0u8..).zip(values.iter_mut()) {
        if bit(flags, i) {
            *value = Some(b.float()?);
        }
    }
    let [in_flight, queue_depth, kv_mean, kv_spread, flow_held] = values;
    Some(Reading {
        stamp_ms: clock_ms.saturating_add_signed(delta),
        in_flight,
        queue_depth,
        kv_mean,
        kv_spread,
        flow_held,
        ready,
        // `ready = 0` reached without reading the EPP (a verdict that excludes nothing).
        verdict_unread: more & 0b11 == 3,
        ready_endpoints,
        units,
        learning_allowed: !bit(flags, 5),
    })
}

/// Decodes up to [`MAX_FUZZ_STEPS`] steps; a truncated last step is dropped. Reading
/// stamps are placed relative to a clock that starts at [`START_MS`] and follows the
/// decoded `Advance` steps, so most readings are plausible and some are late or early.
pub fn decode(bytes: &[u8]) -> Vec<Step> {
    let mut b = Bytes(bytes);
    let mut clock = START_MS;
    let mut steps = Vec::new();
    while steps.len() < MAX_FUZZ_STEPS {
        let Some(op) = b.byte() else { break };
        let site = (op >> 3) % FUZZ_SITES;
        let step = match op % 8 {
            0..=2 => match decode_reading(&mut b, clock) {
                Some(reading) => Step::Reading { site, reading },
                None => break,
            },
            3 => Step::Reset { site },
            4 => Step::Forget { site },
            5 => match b.byte() {
                Some(units) => {
                    let ms = u64::from(units) * CLOCK_UNIT_MS;
                    clock += ms;
                    Step::Advance { ms }
                }
                None => break,
            },
            6 => Step::Refresh,
            _ => Step::Pick {
                model: op >> 6,
                draws: (op >> 3) & 0b111,
            },
        };
        steps.push(step);
    }
    steps
}

/// Where the fuzz clock starts, ms since the epoch (any value far from 0 works; this one
/// keeps early negative stamp offsets from saturating).
pub const START_MS: u64 = 1_000_000;

fn key(site: u8) -> CandidateKey {
    CandidateKey::new(format!("s{site}"), format!("p{site}"))
}

/// The fuzz world's routes: `m0` on sites 0–3, `m1` on sites 2–5, `m2` on none.
pub fn fuzz_routes() -> Routes {
    Routes::new()
        .with("m0", (0..4).map(key).collect())
        .with("m1", (2..FUZZ_SITES).map(key).collect())
        .with("m2", Vec::new())
}

const MODELS: [&str; 4] = ["m0", "m1", "m2", "not-configured"];

fn check_table(step: usize, table: &RouteTable) -> Result<(), Violation> {
    let fail = |what: String| Err(Violation { step, what });
    for snap in table.iter() {
        for c in snap.candidates() {
            let cap = c.capacity();
            if !(cap.is_finite() && cap >= crate::CAPACITY_FLOOR) {
                return fail(format!("capacity {cap} of {:?}", c.key()));
            }
            for (name, v) in [("rho", c.rho()), ("score", c.score())] {
                let sentinel = v == UNMEASURED;
                let in_range = v.is_finite() && (0.0..=crate::RHO_CAP).contains(&v);
                if !(sentinel || in_range) {
                    return fail(format!("{name} {v} of {:?}", c.key()));
                }
                if sentinel != (c.state() == CandidateState::Unmeasured) {
                    return fail(format!(
                        "{name} sentinel disagrees with state {:?}",
                        c.state()
                    ));
                }
            }
        }
    }
    Ok(())
}

/// Runs one decoded sequence against a fresh scorer, checking the invariants.
pub fn run_steps(steps: &[Step], shedding: bool) -> Result<RunStats, Violation> {
    let mut config = ScoreConfig::default();
    config.shedding.enabled = shedding;
    let fresh_for_ms = config.fresh_for_ms;
    let mut scorer = Scorer::new(config);
    let routes = fuzz_routes();
    let mut clock = START_MS;
    let mut stats = RunStats::default();
    // The latest accepted reading per site, read independently of the learner: whether
    // it vetoed the site outright.
    let mut last_stamp: [Option<u64>; FUZZ_SITES as usize] = [None; FUZZ_SITES as usize];
    // Per site, the stamp of the veto that stands (the model of the exclusion rule, kept
    // apart from the learner's).
    let mut veto_at: [Option<u64>; FUZZ_SITES as usize] = [None; FUZZ_SITES as usize];
    let mut vetoed_at_refresh = HashSet::new();
    let mut table = RouteTable::default();
    let mut rng = SplitMix64::new(0x5EED);
    for (i, step) in steps.iter().enumerate() {
        stats.steps += 1;
        match step {
            Step::Reading { site, reading } => {
                let newer = last_stamp[usize::from(*site)].is_none_or(|s| reading.stamp_ms > s);
                match scorer.observe(&key(*site), reading) {
                    Ok(_) if newer => {
                        let s = usize::from(*site);
                        last_stamp[s] = Some(reading.stamp_ms);
                        // A verdict reached without reading the EPP is none at all.
                        let ready = reading.ready.filter(|_| !reading.verdict_unread);
                        if ready == Some(false) || reading.ready_endpoints == Some(0) {
                            veto_at[s] = Some(reading.stamp_ms);
                        } else if reading.ready_endpoints.is_some()
                            || ready == Some(true)
                            || veto_at[s].is_some_and(|at| {
                                reading.stamp_ms.saturating_sub(at) > fresh_for_ms
                            })
                        {
                            // A reading that says ready clears the veto; one that says
                            // nothing clears it only once the veto has aged out.
                            veto_at[s] = None;
                        }
                    }
                    Ok(_) => {}
                    Err(_) => stats.refused += 1,
                }
            }
            Step::Reset { site } => scorer.reset(&key(*site)),
            Step::Forget { site } => {
                scorer.forget(&key(*site));
                last_stamp[usize::from(*site)] = None;
                veto_at[usize::from(*site)] = None;
            }
            Step::Advance { ms } => clock += ms,
            Step::Refresh => {
                table = scorer.refresh(clock, &routes);
                vetoed_at_refresh = (0..FUZZ_SITES)
                    .filter(|&s| {
                        veto_at[usize::from(s)]
                            .is_some_and(|at| clock.saturating_sub(at) <= fresh_for_ms)
                    })
                    .collect();
                check_table(i, &table)?;
            }
            Step::Pick { model, draws } => {
                let name = MODELS[usize::from(*model)];
                for _ in 0..*draws {
                    stats.picks += 1;
                    let decision = table.pick(name, &mut rng);
                    check_pick(i, &table, name, &decision, &vetoed_at_refresh)?;
                    stats.routed += usize::from(matches!(decision, Decision::Route { .. }));
                }
            }
        }
    }
    Ok(stats)
}

fn check_pick(
    step: usize,
    table: &RouteTable,
    model: &str,
    decision: &Decision<'_>,
    vetoed: &HashSet<u8>,
) -> Result<(), Violation> {
    let fail = |what: String| Err(Violation { step, what });
    let Some(snap) = table.get(model) else {
        return if *decision == Decision::UnknownModel {
            Ok(())
        } else {
            fail(format!("{model} is not in the table but got {decision:?}"))
        };
    };
    match decision {
        Decision::Route { candidate, .. } => {
            let site: u8 = candidate.site()[1..].parse().unwrap_or(u8::MAX);
            if vetoed.contains(&site) {
                return fail(format!("picked vetoed site {site}"));
            }
            if snap.excluded().iter().any(|e| e.key == *candidate.key()) {
                return fail(format!("picked excluded {:?}", candidate.key()));
            }
            let any_headroom = snap.candidates().iter().any(|c| c.headroom() > 0.0);
            // Only overflow draws beyond headroom: there the sites with headroom have
            // less of it than the grid serves, and the rest go by capacity.
            if any_headroom && candidate.headroom() <= 0.0 && snap.path() != Some(Path::Overflow) {
                return fail(format!(
                    "picked {:?} without headroom while one had headroom, on {:?}",
                    candidate.key(),
                    snap.path()
                ));
            }
            let any_measured = snap
                .candidates()
                .iter()
                .any(|c| c.state() != CandidateState::Unmeasured);
            if any_measured
                && candidate.state() == CandidateState::Unmeasured
                && snap.path() != Some(Path::ByCapacity)
            {
                return fail(format!(
                    "picked unmeasured {:?} while one was measured",
                    candidate.key()
                ));
            }
            if !candidate.headroom().is_finite() || candidate.headroom() < 0.0 {
                return fail(format!(
                    "headroom {} escaped its range",
                    candidate.headroom()
                ));
            }
        }
        Decision::Unavailable { .. } if !snap.candidates().is_empty() => {
            return fail("unavailable while a healthy candidate exists".into());
        }
        Decision::UnknownModel => return fail(format!("{model} is configured but unknown")),
        _ => {}
    }
    Ok(())
}

/// Decodes `bytes` and runs them; the first byte's low bit turns shedding on.
pub fn run(bytes: &[u8]) -> Result<RunStats, Violation> {
    let shedding = bytes.first().is_some_and(|b| b & 1 == 1);
    run_steps(&decode(bytes.get(1..).unwrap_or_default()), shedding)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_input_runs_nothing() {
        assert_eq!(run(&[]), Ok(RunStats::default()));
    }

    #[test]
    fn steps_are_capped_exactly_at_the_limit() {
        let refreshes = vec![6u8; MAX_FUZZ_STEPS];
        assert_eq!(decode(&refreshes).len(), MAX_FUZZ_STEPS);
        let one_more = vec![6u8; MAX_FUZZ_STEPS + 1];
        assert_eq!(decode(&one_more).len(), MAX_FUZZ_STEPS);
    }

    #[test]
    fn a_hand_written_sequence_decodes_as_intended() {
        // Reading for site 1: in_flight present (palette 4.0), stamp +0, ready=1.
        let bytes = [1 << 3, 0b1, 0b01, 0, 5, 5, 10, 6, 7 | (1 << 3)];
        let steps = decode(&bytes);
        assert_eq!(steps.len(), 4);
        let Step::Reading { site: 1, reading } = &steps[0] else {
            panic!("{steps:?}")
        };
        assert_eq!(reading.in_flight, Some(4.0));
        assert_eq!(reading.ready, Some(true));
        assert_eq!(reading.stamp_ms, START_MS);
        assert_eq!(steps[1], Step::Advance { ms: 1_000 });
        assert_eq!(steps[2], Step::Refresh);
        assert_eq!(steps[3], Step::Pick { model: 0, draws: 1 });
    }

    #[test]
    fn a_vetoed_site_is_never_picked_in_a_hand_written_run() {
        let ok = |stamp| Reading {
            in_flight: Some(1.0),
            ready: Some(true),
            ..Reading::new(stamp)
        };
        let veto = Reading {
            ready: Some(false),
            ..ok(START_MS + 1)
        };
        let steps = vec![
            Step::Reading {
                site: 0,
                reading: ok(START_MS),
            },
            Step::Reading {
                site: 1,
                reading: ok(START_MS),
            },
            Step::Reading {
                site: 0,
                reading: veto,
            },
            Step::Refresh,
            Step::Pick { model: 0, draws: 7 },
            Step::Pick { model: 2, draws: 1 },
            Step::Pick { model: 3, draws: 1 },
        ];
        let stats = run_steps(&steps, false).unwrap();
        assert_eq!(stats.picks, 9);
        assert_eq!(stats.routed, 7);
    }
}
