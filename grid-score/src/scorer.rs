//! The control step: learners for every candidate, fed readings and revision events, and
//! a refresh that turns them into a [`RouteTable`].

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::config::ScoreConfig;
use crate::error::Error;
use crate::hash::FastMap;
use crate::learner::{ExcludeReason, Learner, LearnerView, Observed};
use crate::live::{LiveBoard, LiveEvidence, OutlierChange};
use crate::reading::{CandidateKey, Reading};
use crate::shed::{ShedState, SiteSaturation};
use crate::snapshot::{
    Candidate, CandidateEvidence, Excluded, Refusals, RouteSnapshot, RouteTable, Signal,
};

/// The most site/provider pairs one scorer tracks. A gateway routes a few hundred at
/// most; the cap bounds memory when a misconfigured or hostile source invents keys, and
/// leaves headroom above the 10,000-candidate refresh the benchmarks measure.
pub const MAX_CANDIDATES: usize = 16_384;

/// Which candidates serve which model, from the gateway's serving config.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Routes {
    models: BTreeMap<Arc<str>, Vec<CandidateKey>>,
}

impl Routes {
    /// No models.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the candidates of `model`, replacing any earlier set.
    pub fn insert(&mut self, model: impl Into<Arc<str>>, candidates: Vec<CandidateKey>) {
        self.models.insert(model.into(), candidates);
    }

    /// Builder form of [`Routes::insert`].
    #[must_use]
    pub fn with(mut self, model: impl Into<Arc<str>>, candidates: Vec<CandidateKey>) -> Self {
        self.insert(model, candidates);
        self
    }

    /// Every model and its candidates, by model name.
    pub fn iter(&self) -> impl Iterator<Item = (&Arc<str>, &[CandidateKey])> {
        self.models.iter().map(|(m, c)| (m, c.as_slice()))
    }
}

/// An input to the scorer, for drivers that prefer one entry point.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ScoreInput<'a> {
    /// A reading for a candidate.
    Reading(&'a CandidateKey, &'a Reading),
    /// The candidate's provider revision (UID, generation or publisher epoch) changed.
    RevisionReset(&'a CandidateKey),
    /// The candidate left the serving config; forget it.
    Forget(&'a CandidateKey),
}

/// Learned state of every candidate plus per-model shedding state.
#[derive(Clone, Debug, Default)]
pub struct Scorer {
    config: ScoreConfig,
    learners: FastMap<CandidateKey, Learner>,
    shed: FastMap<Arc<str>, ShedState>,
}

impl Scorer {
    /// An empty scorer.
    pub fn new(config: ScoreConfig) -> Self {
        Self {
            config,
            ..Self::default()
        }
    }

    /// The configuration in force.
    pub fn config(&self) -> &ScoreConfig {
        &self.config
    }

    /// Candidates tracked.
    pub fn len(&self) -> usize {
        self.learners.len()
    }

    /// No candidate tracked.
    pub fn is_empty(&self) -> bool {
        self.learners.is_empty()
    }

    /// Feeds one input; see [`Scorer::observe`], [`Scorer::reset`], [`Scorer::forget`].
    /// A reading answers whether it was a new sample; events answer `None`.
    pub fn handle(&mut self, input: ScoreInput<'_>) -> Result<Option<Observed>, Error> {
        match input {
            ScoreInput::Reading(key, reading) => self.observe(key, reading).map(Some),
            ScoreInput::RevisionReset(key) => {
                self.reset(key);
                Ok(None)
            }
            ScoreInput::Forget(key) => {
                self.forget(key);
                Ok(None)
            }
        }
    }

    /// Learns from one reading. A refused reading changes nothing; count it by
    /// [`Error::reason`]. A reading not newer than the last is [`Observed::NotNewer`].
    pub fn observe(&mut self, key: &CandidateKey, reading: &Reading) -> Result<Observed, Error> {
        reading.validate(key)?;
        if let Some(learner) = self.learners.get_mut(key) {
            return Ok(learner.observe(reading, self.config.fresh_for_ms));
        }
        if self.learners.len() >= MAX_CANDIDATES {
            return Err(Error::CandidateCap {
                limit: MAX_CANDIDATES,
                site: key.site.clone(),
                provider: key.provider.clone(),
            });
        }
        Ok(self
            .learners
            .entry(key.clone())
            .or_default()
            .observe(reading, self.config.fresh_for_ms))
    }

    /// Folds in what a candidate's responses said since the last drain of its slot
    /// (see [`crate::live`]), at `now_ms`: whether that ejected it for failing or brought
    /// it back. Refused only at the candidate cap.
    pub fn observe_live(
        &mut self,
        key: &CandidateKey,
        evidence: &LiveEvidence,
        now_ms: u64,
    ) -> Result<Option<OutlierChange>, Error> {
        if !self.learners.contains_key(key) && self.learners.len() >= MAX_CANDIDATES {
            return Err(Error::CandidateCap {
                limit: MAX_CANDIDATES,
                site: key.site.clone(),
                provider: key.provider.clone(),
            });
        }
        Ok(self
            .learners
            .entry(key.clone())
            .or_default()
            .observe_live(evidence, now_ms))
    }

    /// Drains every slot of `board` into the scorer at `now_ms` (the refresh's live
    /// half; call it before [`Scorer::refresh`]): the candidates ejected for failing or
    /// brought back, and the refusals (candidate cap).
    pub fn feed_live(
        &mut self,
        board: &LiveBoard,
        now_ms: u64,
    ) -> (Vec<(CandidateKey, OutlierChange)>, Vec<Error>) {
        let mut changes = Vec::new();
        let mut refused = Vec::new();
        for (key, slot) in board.iter() {
            match self.observe_live(key, &slot.drain(), now_ms) {
                Ok(Some(change)) => changes.push((key.clone(), change)),
                Ok(None) => {}
                Err(e) => refused.push(e),
            }
        }
        (changes, refused)
    }

    /// The candidates ejected for failing whose probe is due at `now_ms` (each is then
    /// due again a [`crate::live::PROBE_INTERVAL_MS`] later): the daemon probes each and
    /// records the outcome in its live slot ([`crate::live::LiveSlot::record_probe`]).
    pub fn probes_due(&mut self, now_ms: u64) -> Vec<CandidateKey> {
        self.learners
            .iter_mut()
            .filter_map(|(key, learner)| learner.probe_due(now_ms).then(|| key.clone()))
            .collect()
    }

    /// A revision event: forgets the candidate's bounds, load and congestion history.
    pub fn reset(&mut self, key: &CandidateKey) {
        if let Some(learner) = self.learners.get_mut(key) {
            learner.reset();
        }
    }

    /// Forgets everything learned about every candidate (the store's event queue
    /// overflowed, so some revision change may have been missed).
    pub fn reset_all(&mut self) {
        for learner in self.learners.values_mut() {
            learner.reset();
        }
    }

    /// Drops a candidate entirely (it left the serving config).
    pub fn forget(&mut self, key: &CandidateKey) {
        self.learners.remove(key);
    }

    /// Builds every model's snapshot as of `now_ms` and advances shedding. Off the request
    /// path: call it after each committed ingest and publish the result atomically.
    pub fn refresh(&mut self, now_ms: u64, routes: &Routes) -> RouteTable {
        self.shed
            .retain(|model, _| routes.models.contains_key(model));
        let snapshots: Vec<RouteSnapshot> = routes
            .iter()
            .map(|(model, keys)| self.snapshot(now_ms, model, keys))
            .collect();
        RouteTable::from_snapshots(snapshots)
    }

    /// The candidates of one model that are out for failing: those ejected, the
    /// longest-ejected first, up to [`crate::live::max_ejected`] of the model's; the
    /// others stay in (weighted down by their failures), so a problem every site shares
    /// cannot take the model out.
    fn ejected_of<'k>(&self, keys: &'k [CandidateKey]) -> Vec<&'k CandidateKey> {
        let mut out: Vec<(u64, &CandidateKey)> = keys
            .iter()
            .filter_map(|k| Some((self.learners.get(k)?.ejected_since()?, k)))
            .collect();
        out.sort_by_key(|&(since, _)| since);
        out.truncate(crate::live::max_ejected(keys.len()));
        out.into_iter().map(|(_, k)| k).collect()
    }

    fn view(&self, now_ms: u64, key: &CandidateKey) -> LearnerView {
        self.learners.get(key).map_or_else(
            || Learner::default().view(now_ms, self.config.fresh_for_ms),
            |l| l.view(now_ms, self.config.fresh_for_ms),
        )
    }

    fn snapshot(&mut self, now_ms: u64, model: &Arc<str>, keys: &[CandidateKey]) -> RouteSnapshot {
        let mut candidates = Vec::with_capacity(keys.len());
        let mut excluded = Vec::new();
        let shedding_on = self.config.shedding.enabled;
        let mut saturation = Vec::with_capacity(if shedding_on { keys.len() } else { 0 });
        let ejected = self.ejected_of(keys);
        let views: Vec<LearnerView> = keys.iter().map(|k| self.view(now_ms, k)).collect();
        // Whether any candidate of the model is measured by a fresh polled reading: only
        // then do answers without band room measure the others (see `answered_load`).
        let polled = views
            .iter()
            .any(|v| v.load.is_some() && v.excluded.is_none());
        for (key, v) in keys.iter().zip(views) {
            let evidence = CandidateEvidence {
                shown_capacity: Some(v.shown_capacity),
                load_stamp_ms: v.load_stamp,
                soft_bound: v.soft_bound,
                hard_bound: v.hard_bound,
                live_room: v.live.room,
                failures: v.live.failures,
                full_until_ms: v.live.full_until_ms,
            };
            let out = match v.excluded {
                Some(reason) => Some((reason, v.excluded_at, None)),
                None if ejected.contains(&key) => Some((
                    ExcludeReason::Ejected,
                    self.learners.get(key).and_then(Learner::ejected_since),
                    v.live.ejected_until_ms,
                )),
                None => None,
            };
            if let Some((reason, since_ms, until_ms)) = out {
                excluded.push(Excluded {
                    key: key.clone(),
                    reason,
                    since_ms,
                    until_ms,
                    capacity: v.capacity,
                    evidence,
                });
                continue;
            }
            if shedding_on {
                saturation.push(SiteSaturation {
                    unknown: v.load.is_none(),
                    full_since: v.full_since,
                    last_full: v.last_full,
                });
            }
            let signal = |rho_now, life_ms| Signal {
                rho_now,
                life_ms,
                pace: v.pace,
                turnover_ms: v.live.turnover_ms.unwrap_or(0.0),
            };
            candidates.push(
                match v.load {
                    Some((rho, worst)) => {
                        let (rho_now, life_ms, waiting) = live_load(now_ms, &v);
                        Candidate::measured(key.clone(), v.capacity, rho, worst, waiting, v.full)
                            .with_reach(v.reach)
                            .with_signal(signal(rho_now, life_ms))
                    }
                    None => match answered_load(now_ms, &v, polled) {
                        Some((rho, waiting)) => {
                            Candidate::measured(key.clone(), v.capacity, rho, rho, waiting, false)
                                .with_reach(v.reach)
                                .with_signal(signal(rho, 0.0))
                        }
                        None => Candidate::unmeasured(key.clone(), v.capacity).with_reach(v.reach),
                    },
                }
                .with_live(v.live.factor, v.live.headroom)
                .with_failures(v.live.failures)
                .with_shown(v.shown_capacity)
                .with_own(v.own_now)
                .with_quiet(
                    v.live
                        .answered_ms
                        .map_or(f64::INFINITY, |at| now_ms.saturating_sub(at) as f64),
                )
                .with_evidence(evidence),
            );
        }
        let shedding = self.shed.entry(model.clone()).or_default().step(
            now_ms,
            &self.config.shedding,
            &saturation,
        );
        let refusals = Refusals {
            shed_retry_after_ms: shedding.then_some(self.config.shedding.retry_after_ms),
            unavailable_retry_after_ms: self.config.unavailable_retry_after_ms,
        };
        let mut snapshot = RouteSnapshot::build(
            model.clone(),
            candidates,
            excluded,
            refusals,
            self.config.turnover_ms,
        );
        snapshot.refreshed_at_ms = now_ms;
        snapshot
    }
}

/// The load a candidate's headroom reads and how long that reading stands: its band's
/// queue as its newest answer showed it, where that answer is newer than the polled
/// reading and at most [`crate::live::LIVE_ROOM_FRESH_MS`] old, else the polled reading.
///
/// A queue in the band means every slot is taken and that many wait (rho above 1 by the
/// queue per unit of capacity); an empty band says nothing of free slots, so it only caps
/// an older reading's queue at full. Either is moved by what this gateway sent there and
/// saw end since the answer, as a polled reading is since its stamp. A live reading is
/// corrected at every refresh, so it is spread over [`crate::MIN_SPREAD_MS`]. The third
/// value is the work waiting the by-capacity weights read, from the same source.
fn live_load(now_ms: u64, v: &LearnerView) -> (f64, f64, f64) {
    let fresh = v.live.queue.filter(|&(_, at)| {
        v.load_stamp.is_none_or(|polled| at > polled)
            && now_ms.saturating_sub(at) <= crate::live::LIVE_ROOM_FRESH_MS
    });
    let polled = moved_load(v);
    // Corrected at every refresh, the reading stands only until the next one.
    let life = if v.own_change.is_some() {
        0.0
    } else {
        v.interval_ms
    };
    let Some((queue, _)) = fresh else {
        return (polled, life, polled_waiting(v, polled));
    };
    let reach = v.reach.max(crate::CAPACITY_FLOOR);
    // What this gateway sent there and saw end since the answer: the band showed none
    // of it. A slow site's answers, or a band's that few requests name, come seconds
    // apart, and reading the newest as it stood hid a queue of this gateway's own
    // making (a site three times slower read 0 waiting for 3 s while 17 more of ours
    // went there).
    let since = v.own_change_live.unwrap_or(0.0) / reach;
    let (at_answer, stands) = if queue > 0.0 {
        (1.0 + queue / reach, 0.0)
    } else {
        // The polled reading moved to the answer, capped at full.
        ((polled - since).min(1.0), life)
    };
    let rho = (at_answer + since).max(0.0);
    (rho, stands, waiting_past_reach(v, rho))
}

/// The polled reading's load, moved by what this gateway sent and saw end there since
/// its stamp (as it stood where that is not known), never below 0.
fn moved_load(v: &LearnerView) -> f64 {
    (v.instant + v.own_change.unwrap_or(0.0) / v.reach.max(crate::CAPACITY_FLOOR)).max(0.0)
}

/// The work waiting at a candidate read at `rho`: what it holds past its reach.
fn waiting_past_reach(v: &LearnerView, rho: f64) -> f64 {
    ((rho - 1.0) * v.reach.max(crate::CAPACITY_FLOOR)).max(0.0)
}

/// The work waiting at a candidate read by its polled reading, moved like its load
/// (`polled`, the reading's rho moved by this gateway's own requests since): a site that
/// was queueing keeps the reading's queue plus what this gateway sent there since, net
/// of what it saw end; one that was not queues what the moved load holds past its
/// reach. Read as the reading stood, a site the gateway had been filling since its last
/// reading (a remote one, seconds old) still read that reading's empty queue, and the
/// by-capacity weights, which even out the queues, sent it more. A queueing site's
/// queue is never read shorter than the reading showed: the slots the gateway's ended
/// requests freed went to that queue, and whether others filled it again only the next
/// reading says (read shorter, a site kept backed up by others drew the gateway's
/// requests back between its readings).
fn polled_waiting(v: &LearnerView, polled: f64) -> f64 {
    if v.waiting > 0.0 {
        v.waiting + v.own_change.unwrap_or(0.0).max(0.0)
    } else {
        waiting_past_reach(v, polled)
    }
}

/// The load of a candidate with no fresh polled reading, read off its answers alone:
/// `Some((rho, waiting))` while some band's room is at most
/// [`crate::live::LIVE_ROOM_FRESH_MS`] old. A queue in its bands reads as every slot
/// taken and that many waiting; bands with room and no queue as every slot taken and none
/// waiting (its free slots are not known), so the site is offered what its slots turn
/// over, no more; either moved by what this gateway sent there and saw end since the
/// answer; a band that said "full" counts its whole size waiting and weighs it down
/// through its live factor.
///
/// An answer without band room (no flow control) shows the site serving but not what it
/// holds. While another candidate of the model is measured by a fresh polled reading
/// (`polled`), an answer within the same window measures the site by its last polled
/// reading however old, moved by what this gateway sent there and saw end since (other
/// gateways' requests stay as that reading showed them), or, with no reading ever, as a
/// band with room and no queue; its answers' timing weighs it down through the live
/// factor. So a site whose own signals stopped keeps its share beside the measured ones
/// instead of only their overflow. With no polled reading at all the model is routed
/// without signals, by capacity over every candidate: answers alone would herd it onto
/// whichever sites answered first, since without band room nothing says when they fill.
fn answered_load(now_ms: u64, v: &LearnerView, polled: bool) -> Option<(f64, f64)> {
    if v.live.headroom.is_none() {
        let answering = v.live.answered_ms.is_some_and(|at| {
            polled && now_ms.saturating_sub(at) <= crate::live::LIVE_ROOM_FRESH_MS
        });
        if !answering {
            return None;
        }
        return Some(match (v.load_stamp, v.own_change) {
            (Some(_), Some(_)) => {
                let rho = moved_load(v);
                (rho, waiting_past_reach(v, rho))
            }
            _ => (1.0, 0.0),
        });
    }
    let queue = v.live.queue.map_or(0.0, |(q, _)| q.max(0.0));
    let reach = v.reach.max(crate::CAPACITY_FLOOR);
    let rho = (1.0 + (queue + v.own_change_live.unwrap_or(0.0)) / reach).max(0.0);
    Some((rho, waiting_past_reach(v, rho)))
}

#[cfg(test)]
#[allow(
    clippy::float_cmp,
    reason = "sentinels and floors are exact values, compared exactly on purpose"
)]
mod tests {
    use super::*;
    use crate::Path;
    use crate::SplitMix64;
    use crate::reading::UnitQueues;
    use crate::select::Decision;
    use crate::snapshot::{CandidateState, UNMEASURED};

    fn key(site: &str) -> CandidateKey {
        CandidateKey::new(site, "p")
    }

    fn reading(stamp: u64, in_flight: f64) -> Reading {
        Reading {
            in_flight: Some(in_flight),
            queue_depth: Some(0.0),
            ready_endpoints: Some(1),
            ..Reading::new(stamp)
        }
    }

    /// Model m's candidate at `site` in `t`.
    fn at<'t>(t: &'t RouteTable, site: &str) -> &'t Candidate {
        t.get("m")
            .unwrap()
            .candidates()
            .iter()
            .find(|c| &**c.site() == site)
            .unwrap()
    }

    fn routes(sites: &[&str]) -> Routes {
        Routes::new().with("m", sites.iter().map(|s| key(s)).collect())
    }

    /// A scorer that read both `sites` once, at 1,000 ms; model m's routes over them; a
    /// live board for them.
    fn both_read_once(sites: [&str; 2]) -> (Scorer, Routes, LiveBoard) {
        let mut s = Scorer::new(ScoreConfig::default());
        for site in sites {
            s.observe(&key(site), &reading(1_000, 4.0)).unwrap();
        }
        let board = LiveBoard::new(&[key(sites[0]), key(sites[1])]);
        (s, routes(&sites), board)
    }

    /// A scorer for model m over the one site "a", with its live board, and the
    /// gateway's own requests there counted (none) at 900 ms, before any reading.
    fn one_site_counted_from_900() -> (Scorer, Routes, LiveBoard) {
        let mut s = Scorer::new(ScoreConfig::default());
        let board = LiveBoard::new(&[key("a")]);
        s.feed_live(&board, 900);
        (s, routes(&["a"]), board)
    }

    #[test]
    fn a_candidate_never_read_scores_unmeasured_and_sorts_last() {
        let mut s = Scorer::new(ScoreConfig::default());
        s.observe(&key("a"), &reading(1_000, 5.0)).unwrap();
        let t = s.refresh(1_000, &routes(&["never", "a"]));
        let snap = t.get("m").unwrap();
        assert_eq!(&**snap.candidates()[0].site(), "a");
        assert_eq!(snap.candidates()[1].score(), UNMEASURED);
        assert_eq!(snap.candidates()[1].state(), CandidateState::Unmeasured);
    }

    #[test]
    fn every_candidate_not_ready_makes_the_model_unavailable_not_unknown() {
        let mut s = Scorer::new(ScoreConfig::default());
        for site in ["a", "b"] {
            let r = Reading {
                ready: Some(false),
                ..reading(1, 1.0)
            };
            s.observe(&key(site), &r).unwrap();
        }
        let t = s.refresh(1, &routes(&["a", "b"]));
        let mut rng = SplitMix64::new(1);
        assert!(matches!(
            t.pick("m", &mut rng),
            Decision::Unavailable { .. }
        ));
        assert_eq!(t.pick("nope", &mut rng), Decision::UnknownModel);
        assert_eq!(t.get("m").unwrap().excluded().len(), 2);
    }

    #[test]
    fn a_refused_reading_changes_nothing() {
        let mut s = Scorer::new(ScoreConfig::default());
        let bad = Reading {
            kv_mean: Some(f64::INFINITY),
            ..reading(1, 1.0)
        };
        assert!(s.observe(&key("a"), &bad).is_err());
        assert!(s.is_empty());
    }

    #[test]
    fn candidates_up_to_the_cap_are_tracked_and_one_more_is_refused() {
        let mut s = Scorer::new(ScoreConfig::default());
        for i in 0..MAX_CANDIDATES {
            s.observe(&CandidateKey::new(i.to_string(), "p"), &reading(1, 1.0))
                .unwrap();
        }
        assert_eq!(s.len(), MAX_CANDIDATES);
        // A known key still learns at the cap.
        assert!(
            s.observe(&CandidateKey::new("0", "p"), &reading(2, 1.0))
                .is_ok()
        );
        let e = s.observe(&key("extra"), &reading(1, 1.0)).unwrap_err();
        assert!(matches!(
            e,
            Error::CandidateCap {
                limit: MAX_CANDIDATES,
                ..
            }
        ));
    }

    #[test]
    fn revision_reset_forgets_learned_capacity() {
        let mut s = Scorer::new(ScoreConfig::default());
        let r = reading(1, 40.0);
        assert_eq!(
            s.handle(ScoreInput::Reading(&key("a"), &r)),
            Ok(Some(Observed::NewSample))
        );
        let cap = |s: &mut Scorer| {
            s.refresh(1, &routes(&["a"])).get("m").unwrap().candidates()[0].capacity()
        };
        assert!((cap(&mut s) - 40.0).abs() < 1e-9);
        assert_eq!(s.handle(ScoreInput::RevisionReset(&key("a"))), Ok(None));
        assert!((cap(&mut s) - crate::CAPACITY_FLOOR).abs() < 1e-9);
    }

    #[test]
    fn a_model_whose_only_site_stays_full_sheds_and_routes_again_after_room() {
        let mut config = ScoreConfig::default();
        config.shedding.enabled = true;
        let (full_after, room_after) =
            (config.shedding.full_after_ms, config.shedding.room_after_ms);
        let mut s = Scorer::new(config);
        let full = |stamp| Reading {
            units: Some(UnitQueues {
                units: 1,
                waiting: 1,
            }),
            queue_depth: Some(3.0),
            ..reading(stamp, 16.0)
        };
        s.observe(&key("a"), &reading(0, 4.0)).unwrap(); // soft bound 4: capacity 8
        let r = routes(&["a"]);
        let mut rng = SplitMix64::new(1);
        s.observe(&key("a"), &full(1_000)).unwrap();
        assert!(matches!(
            s.refresh(1_000, &r).pick("m", &mut rng),
            Decision::Route { .. }
        ));
        s.observe(&key("a"), &full(1_000 + full_after)).unwrap();
        let t = s.refresh(1_000 + full_after, &r);
        assert!(matches!(t.pick("m", &mut rng), Decision::Shed { .. }));
        // A roomy sample does not end shedding at once...
        let roomy = Reading {
            units: Some(UnitQueues {
                units: 1,
                waiting: 0,
            }),
            ..reading(1_001 + full_after, 0.0)
        };
        s.observe(&key("a"), &roomy).unwrap();
        let t = s.refresh(1_001 + full_after, &r);
        assert!(matches!(t.pick("m", &mut rng), Decision::Shed { .. }));
        // ...only room_after_ms past the last full sample.
        let later = 1_000 + full_after + room_after + 1;
        let t = s.refresh(later, &r);
        let d = t.pick("m", &mut rng);
        assert!(
            matches!(
                d,
                Decision::Route {
                    path: Path::Lone,
                    ..
                }
            ),
            "{d:?}"
        );
    }

    #[test]
    fn a_band_queue_newer_than_the_polled_reading_stands_in_for_its_load() {
        use crate::live::{FlowObservation, LiveBoard};
        let mut s = Scorer::new(ScoreConfig::default());
        let r = routes(&["a", "b"]);
        // Both polled at 1 s holding 8 of their 16 slots (soft bound 8, reach 16).
        for site in ["a", "b"] {
            s.observe(&key(site), &reading(1_000, 8.0)).unwrap();
        }
        let board = LiveBoard::new(&[key("a"), key("b")]);
        let room = |h| FlowObservation {
            headroom: Some(h),
            ..FlowObservation::default()
        };
        let (slot_a, slot_b) = (
            board.slot(&key("a")).unwrap(),
            board.slot(&key("b")).unwrap(),
        );
        // Answers at 1.1 s: both bands empty (64 each).
        slot_a.record_room(1_100, crate::live::BandKey::DEFAULT, &room(64));
        slot_b.record_room(1_100, crate::live::BandKey::DEFAULT, &room(64));
        s.feed_live(&board, 1_100);
        let calm = s.refresh(1_100, &r);
        let rho = |t: &RouteTable, site: &str| at(t, site).signal().rho_now;
        assert!(
            (rho(&calm, "a") - 0.5).abs() < 1e-3,
            "an empty band says nothing of free slots"
        );
        // At 1.2 s an answer from a shows 16 waiting in its band: every slot taken and a
        // slot's worth of queue, an instant the 1 s poll cannot show.
        slot_a.record_room(1_200, crate::live::BandKey::DEFAULT, &room(48));
        s.feed_live(&board, 1_200);
        let queued = s.refresh(1_200, &r);
        // (Bounds fade with a 5-minute half-life: a few parts in ten thousand here.)
        assert!(
            (rho(&queued, "a") - 2.0).abs() < 1e-3,
            "{}",
            rho(&queued, "a")
        );
        let c = at(&queued, "a");
        assert!(
            (c.waiting() - 16.0).abs() < 1e-9,
            "the by-capacity weights read it too"
        );
        // A newer poll takes over again.
        s.observe(&key("a"), &reading(2_000, 8.0)).unwrap();
        assert!((rho(&s.refresh(2_000, &r), "a") - 0.5).abs() < 1e-3);
    }

    #[test]
    fn an_answers_band_room_is_moved_by_what_this_gateway_sent_and_saw_end_there_since() {
        use crate::live::{BandKey, FlowObservation};
        let (mut s, r, board) = one_site_counted_from_900();
        let slot = board.slot(&key("a")).unwrap();
        let room = |h| FlowObservation {
            headroom: Some(h),
            ..FlowObservation::default()
        };
        let read = |s: &mut Scorer, now| {
            let c = at(&s.refresh(now, &r), "a").clone();
            (c.signal().rho_now, c.waiting())
        };
        // (Bounds fade with a 5-minute half-life: a few parts in ten thousand here.)
        // Polled at 1 s holding 8 of its 16 slots (soft bound 8, reach 16); an answer at
        // 1.1 s shows its band empty (64).
        s.observe(&key("a"), &reading(1_000, 8.0)).unwrap();
        slot.record_room(1_100, BandKey::DEFAULT, &room(64));
        s.feed_live(&board, 1_100);
        let (rho, waiting) = read(&mut s, 1_100);
        assert!(
            (rho - 0.5).abs() < 1e-3 && waiting == 0.0,
            "{rho} {waiting}"
        );
        // Twelve of ours sent since, no answer yet: eight fill the slots, four wait.
        let mut sent: Vec<_> = (0..12).map(|_| slot.in_flight()).collect();
        s.feed_live(&board, 1_300);
        let (rho, waiting) = read(&mut s, 1_300);
        assert!(
            (rho - 1.25).abs() < 1e-3 && (waiting - 4.0).abs() < 1e-2,
            "the band's emptiness at 1.1 s hides none of them: {rho} {waiting}"
        );
        // An answer at 1.4 s shows the four waiting: counted once, not again as sent.
        slot.record_room(1_400, BandKey::DEFAULT, &room(60));
        s.feed_live(&board, 1_400);
        let (rho, waiting) = read(&mut s, 1_400);
        assert!((rho - 1.25).abs() < 1e-3, "{rho} {waiting}");
        // Two of ours ended since: two of the waiting took their slots.
        sent.truncate(10);
        s.feed_live(&board, 1_500);
        let (rho, waiting) = read(&mut s, 1_500);
        assert!(
            (rho - 1.125).abs() < 1e-3 && (waiting - 2.0).abs() < 1e-2,
            "{rho} {waiting}"
        );
    }

    #[test]
    fn a_polled_readings_load_moves_by_what_this_gateway_sent_and_saw_end_there_since_its_stamp() {
        // A drain before the reading: nothing of ours outstanding then.
        let (mut s, r, board) = one_site_counted_from_900();
        let slot = board.slot(&key("a")).unwrap();
        let rho = |s: &mut Scorer, now| at(&s.refresh(now, &r), "a").signal().rho_now;
        // Polled at 1 s holding 8 of its 16 slots (soft bound 8, reach 16).
        s.observe(&key("a"), &reading(1_000, 8.0)).unwrap();
        assert!((rho(&mut s, 1_000) - 0.5).abs() < 1e-3);
        // Eight sent since: the site holds them too, before any reading says so.
        let mut sent: Vec<_> = (0..8).map(|_| slot.in_flight()).collect();
        s.feed_live(&board, 1_300);
        assert!(
            (rho(&mut s, 1_300) - 1.0).abs() < 1e-3,
            "{}",
            rho(&mut s, 1_300)
        );
        // Four more: past its reach they wait, though the reading showed no queue.
        let more: Vec<_> = (0..4).map(|_| slot.in_flight()).collect();
        s.feed_live(&board, 1_400);
        let c = at(&s.refresh(1_400, &r), "a").clone();
        assert!((c.waiting() - 4.0).abs() < 1e-2, "{c:?}");
        drop(more);
        // Four of them ended.
        let _kept = sent.split_off(4);
        drop(sent);
        s.feed_live(&board, 1_600);
        assert!((rho(&mut s, 1_600) - 0.75).abs() < 1e-3);
        // A newer reading counts what it saw (the four still there among its eight);
        // only what changes after it moves it.
        s.observe(&key("a"), &reading(2_000, 8.0)).unwrap();
        s.feed_live(&board, 2_000);
        assert!((rho(&mut s, 2_000) - 0.5).abs() < 1e-3);
        // A reading older than every kept sample is read as it stands.
        let mut fresh = Scorer::new(ScoreConfig::default());
        fresh.observe(&key("a"), &reading(5_000, 8.0)).unwrap();
        let _more = slot.in_flight();
        fresh.feed_live(&board, 5_100);
        assert!((rho(&mut fresh, 5_100) - 0.5).abs() < 1e-3);
    }

    #[test]
    fn a_queueing_sites_polled_queue_grows_by_what_this_gateway_sent_there_since() {
        let (mut s, r, board) = one_site_counted_from_900();
        let slot = board.slot(&key("a")).unwrap();
        let queueing = Reading {
            queue_depth: Some(3.0),
            ..reading(1_000, 8.0)
        };
        s.observe(&key("a"), &queueing).unwrap();
        let waiting = |s: &mut Scorer, now| at(&s.refresh(now, &r), "a").waiting();
        assert!((waiting(&mut s, 1_000) - 3.0).abs() < 1e-9);
        let mut sent: Vec<_> = (0..2).map(|_| slot.in_flight()).collect();
        s.feed_live(&board, 1_300);
        assert!(
            (waiting(&mut s, 1_300) - 5.0).abs() < 1e-9,
            "behind the three"
        );
        sent.clear();
        s.feed_live(&board, 1_600);
        assert!((waiting(&mut s, 1_600) - 3.0).abs() < 1e-9);
        // Two of ours there at the next reading, both ended since: their slots went to
        // its queue, which reads no shorter than that reading showed.
        let mut sent: Vec<_> = (0..2).map(|_| slot.in_flight()).collect();
        s.feed_live(&board, 2_000);
        s.observe(
            &key("a"),
            &Reading {
                queue_depth: Some(3.0),
                ..reading(2_000, 8.0)
            },
        )
        .unwrap();
        sent.clear();
        s.feed_live(&board, 2_300);
        assert!((waiting(&mut s, 2_300) - 3.0).abs() < 1e-9);
    }

    #[test]
    fn a_site_whose_polled_reading_aged_out_and_whose_answers_carry_no_band_room_is_measured_while_it_answers()
     {
        use crate::live::LIVE_ROOM_FRESH_MS;
        let (mut s, r, board) = both_read_once(["polled", "answering"]);
        let fresh = ScoreConfig::default().fresh_for_ms;
        let slot = board.slot(&key("answering")).unwrap();
        // Past the freshness window only "polled" is read again; "answering" answers,
        // without flow control's headers, and no count of the gateway's own requests was
        // kept at its reading: every slot taken, none waiting.
        let now = 1_000 + fresh + 100;
        s.observe(&key("polled"), &reading(now, 4.0)).unwrap();
        slot.record_answer();
        s.feed_live(&board, now);
        let c = at(&s.refresh(now, &r), "answering").clone();
        assert_ne!(c.state(), CandidateState::Unmeasured, "{c:?}");
        assert!(
            (c.signal().rho_now - 1.0).abs() < 1e-9 && c.waiting() == 0.0,
            "every slot taken, none waiting: {c:?}"
        );
        // A failure is no sign of serving.
        let later = now + LIVE_ROOM_FRESH_MS + 1;
        s.observe(&key("polled"), &reading(later, 4.0)).unwrap();
        slot.record_failure();
        s.feed_live(&board, later);
        assert_eq!(
            at(&s.refresh(later, &r), "answering").state(),
            CandidateState::Unmeasured
        );
        // At the window's edge an answer still measures it; one past it, nothing does.
        let answered = later + 10;
        slot.record_answer();
        s.feed_live(&board, answered);
        let edge = answered + LIVE_ROOM_FRESH_MS;
        s.observe(&key("polled"), &reading(edge, 4.0)).unwrap();
        assert_ne!(
            at(&s.refresh(edge, &r), "answering").state(),
            CandidateState::Unmeasured
        );
        s.observe(&key("polled"), &reading(edge + 1, 4.0)).unwrap();
        assert_eq!(
            at(&s.refresh(edge + 1, &r), "answering").state(),
            CandidateState::Unmeasured
        );
    }

    #[test]
    fn a_site_measured_by_its_answers_reads_its_last_polled_load_moved_by_the_gateways_own_requests_since()
     {
        let mut s = Scorer::new(ScoreConfig::default());
        let fresh = ScoreConfig::default().fresh_for_ms;
        let r = routes(&["polled", "answering"]);
        let board = LiveBoard::new(&[key("polled"), key("answering")]);
        // A count kept before the readings: none of the gateway's requests out.
        s.feed_live(&board, 900);
        for site in ["polled", "answering"] {
            s.observe(&key(site), &reading(1_000, 4.0)).unwrap();
        }
        let slot = board.slot(&key("answering")).unwrap();
        // Long past the freshness window, and past the counts the gateway keeps.
        let now = 1_000 + 4 * fresh;
        for i in 1..=crate::live::OUTSTANDING_SAMPLES as u64 {
            s.feed_live(&board, 1_000 + i * crate::live::OUTSTANDING_SPACING_MS);
        }
        s.observe(&key("polled"), &reading(now, 4.0)).unwrap();
        slot.record_answer();
        s.feed_live(&board, now);
        let before = at(&s.refresh(now, &r), "answering").clone();
        assert_ne!(before.state(), CandidateState::Unmeasured, "{before:?}");
        let _sent: Vec<_> = (0..3).map(|_| slot.in_flight()).collect();
        slot.record_answer();
        s.feed_live(&board, now + 100);
        let after = at(&s.refresh(now + 100, &r), "answering").clone();
        let moved = after.signal().rho_now - before.signal().rho_now;
        assert!(
            (moved - 3.0 / after.reach()).abs() < 1e-9,
            "three more of its own requests there: {before:?} -> {after:?}"
        );
    }

    #[test]
    fn with_no_polled_reading_in_the_model_answers_without_band_room_measure_no_site() {
        let (mut s, r, board) = both_read_once(["answering", "silent"]);
        let fresh = ScoreConfig::default().fresh_for_ms;
        board.slot(&key("answering")).unwrap().record_answer();
        let now = 1_000 + fresh + 100;
        s.feed_live(&board, now);
        let table = s.refresh(now, &r);
        // Nothing says when the answering site fills: it would take everything.
        assert_eq!(at(&table, "answering").state(), CandidateState::Unmeasured);
        assert_eq!(table.get("m").unwrap().path(), Some(Path::Fallback));
    }

    #[test]
    fn a_pick_without_signals_reads_how_many_of_the_gateways_own_requests_each_site_holds() {
        let (mut s, r, board) = both_read_once(["held", "idle"]);
        let now = 1_000 + ScoreConfig::default().fresh_for_ms + 100;
        let slot = board.slot(&key("held")).unwrap();
        let mut sent: Vec<_> = (0..20).map(|_| slot.in_flight()).collect();
        s.feed_live(&board, now);
        let table = s.refresh(now, &r);
        assert_eq!(table.get("m").unwrap().path(), Some(Path::Fallback));
        assert_eq!(
            (at(&table, "held").own(), at(&table, "idle").own()),
            (20.0, 0.0)
        );
        sent.truncate(5);
        s.feed_live(&board, now + 100);
        let table = s.refresh(now + 100, &r);
        assert_eq!(at(&table, "held").own(), 5.0, "fifteen of them ended");
    }

    #[test]
    fn a_site_whose_polled_reading_aged_out_is_measured_by_its_answers_band_room_while_fresh() {
        use crate::live::{FlowObservation, LIVE_ROOM_FRESH_MS};
        let (mut s, r, board) = both_read_once(["polled", "answering"]);
        let fresh = ScoreConfig::default().fresh_for_ms;
        let slot = board.slot(&key("answering")).unwrap();
        let room = |h| FlowObservation {
            headroom: Some(h),
            ..FlowObservation::default()
        };
        // Past the freshness window only "polled" is read again; "answering" speaks only
        // through its answers, whose band is empty (64 of 64).
        let now = 1_000 + fresh + 100;
        s.observe(&key("polled"), &reading(now, 4.0)).unwrap();
        slot.record_room(now, crate::live::BandKey::DEFAULT, &room(64));
        s.feed_live(&board, now);
        let table = s.refresh(now, &r);
        let c = at(&table, "answering");
        assert_ne!(c.state(), CandidateState::Unmeasured);
        assert!(
            (c.signal().rho_now - 1.0).abs() < 1e-9,
            "room in its band, its free slots unknown: every slot taken, none waiting"
        );
        let snap = table.get("m").unwrap();
        let shares = snap.plan_shares();
        let i = snap
            .candidates()
            .iter()
            .position(|c| &**c.site() == "answering")
            .unwrap();
        assert!(
            shares[i] > 0.1,
            "it takes its turnover's share beside a site with headroom: {shares:?}"
        );
        // A queue in its band reads as a slot's worth waiting per slot it holds.
        slot.record_room(now + 100, crate::live::BandKey::DEFAULT, &room(48));
        s.feed_live(&board, now + 100);
        let c = at(&s.refresh(now + 100, &r), "answering").clone();
        assert!(c.signal().rho_now > 1.0 && c.waiting() > 0.0, "{c:?}");
        // Ours sent there after that answer wait behind its queue too.
        let queued = c.waiting();
        let _sent: Vec<_> = (0..4).map(|_| slot.in_flight()).collect();
        s.feed_live(&board, now + 200);
        let c = at(&s.refresh(now + 200, &r), "answering").clone();
        assert!((c.waiting() - queued - 4.0).abs() < 1e-6, "{c:?}");
        // Once its newest room is past the live window, nothing measures it.
        let later = now + 100 + LIVE_ROOM_FRESH_MS + 1;
        s.observe(&key("polled"), &reading(later, 4.0)).unwrap();
        let table = s.refresh(later, &r);
        assert_eq!(at(&table, "answering").state(), CandidateState::Unmeasured);
    }

    #[test]
    fn a_site_whose_answers_hold_slots_three_times_longer_is_offered_a_third_of_the_turnover() {
        use crate::live::LiveBoard;
        let mut s = Scorer::new(ScoreConfig::default());
        let r = routes(&["fast", "slow"]);
        for site in ["fast", "slow"] {
            s.observe(&key(site), &reading(1_000, 16.0)).unwrap();
        }
        let board = LiveBoard::new(&[key("fast"), key("slow")]);
        for _ in 0..50 {
            board.slot(&key("fast")).unwrap().record_served(2_000);
            board.slot(&key("slow")).unwrap().record_served(6_000);
        }
        s.feed_live(&board, 1_000);
        let t = s.refresh(1_000, &r);
        let turnover = |site: &str| at(&t, site).signal().turnover_ms;
        assert!((turnover("fast") - 2_000.0).abs() < 1.0);
        assert!((turnover("slow") - 6_000.0).abs() < 1.0);
        let headroom = |site: &str| at(&t, site).headroom();
        // Both at rho 0.5 of reach 32: turnover 32/2 s = 16/s and 32/6 s; free slots
        // 16 over the 2 s minimum spread = 8/s each.
        assert!(
            (headroom("fast") - 24.0).abs() < 1e-3,
            "{}",
            headroom("fast")
        );
        assert!(
            (headroom("slow") - (32.0 / 6.0 + 8.0)).abs() < 1e-3,
            "{}",
            headroom("slow")
        );
    }

    /// A reading at 1 s of a site holding 12 on its 4 slots (two units, two waiting at
    /// each, 8 in its queue).
    fn three_times_its_four_slots() -> Reading {
        Reading {
            units: Some(UnitQueues {
                units: 2,
                waiting: 2,
            }),
            queue_depth: Some(8.0),
            ..reading(1_000, 12.0)
        }
    }

    #[test]
    fn a_queued_site_is_never_read_as_turning_over_faster_than_the_prior() {
        use crate::live::LiveBoard;
        // a learned a 160 ms turnover from answers before it slowed; now it holds three
        // times its 4 slots (read at a limit) while b idles. Read at 160 ms, a's 8 waiting
        // drain in a third of a second and it out-draws b; at the 2 s prior it has none.
        let mut s = Scorer::new(ScoreConfig::default());
        let r = routes(&["a", "b"]);
        s.observe(&key("a"), &three_times_its_four_slots()).unwrap();
        s.observe(&key("b"), &reading(1_000, 0.5)).unwrap();
        let board = LiveBoard::new(&[key("a"), key("b")]);
        for _ in 0..50 {
            board.slot(&key("a")).unwrap().record_served(160);
            board.slot(&key("b")).unwrap().record_served(160);
        }
        s.feed_live(&board, 1_000);
        let t = s.refresh(1_000, &r);
        let snap = t.get("m").unwrap();
        let a = at(&t, "a");
        assert!(
            (a.signal().turnover_ms - 160.0).abs() < 1.0,
            "learned, and shown as learned"
        );
        assert!(a.headroom() == 0.0, "{}", a.headroom());
        assert_eq!(snap.path(), Some(Path::Lone));
    }

    #[test]
    fn a_queued_site_read_draining_at_its_own_turnover_is_read_at_the_prior_once_its_answers_stop()
    {
        use crate::live::LiveBoard;
        // a learned a 160 ms turnover and holds three times its 4 slots. Answering, its
        // queue drains at 160 ms a request per slot; with no answer for 3 s, at the 2 s
        // prior (the turnover is older than its silence).
        let mut s = Scorer::new(ScoreConfig::default());
        let r = routes(&["a"]);
        s.observe(&key("a"), &three_times_its_four_slots()).unwrap();
        let board = LiveBoard::new(&[key("a")]);
        for _ in 0..50 {
            let slot = board.slot(&key("a")).unwrap();
            slot.record_answer();
            slot.record_served(160);
        }
        s.feed_live(&board, 1_000);
        let answering = at(&s.refresh(1_000, &r), "a").clone();
        s.feed_live(&board, 4_000);
        let silent = at(&s.refresh(4_000, &r), "a").clone();
        assert!(answering.waiting() > 0.0, "{answering:?}");
        assert!(
            (silent.waiting() - answering.waiting()).abs() < 1e-9,
            "the same queue: {silent:?}"
        );
        let ratio = silent.drain_ms() / answering.drain_ms();
        assert!((ratio - 2_000.0 / 160.0).abs() < 0.1, "{ratio}");
    }

    #[test]
    fn a_full_band_in_one_response_moves_traffic_at_the_next_refresh_without_a_reading() {
        use crate::live::{FlowObservation, LiveBoard};
        let mut s = Scorer::new(ScoreConfig::default());
        let r = routes(&["a", "b"]);
        for site in ["a", "b"] {
            s.observe(&key(site), &reading(1_000, 4.0)).unwrap();
        }
        let board = LiveBoard::new(&[key("a"), key("b")]);
        let share_of_a = |t: &RouteTable| {
            let mut rng = SplitMix64::new(9);
            let picks = 4_000;
            let hits = (0..picks)
                .filter(|_| {
                    matches!(t.pick("m", &mut rng), Decision::Route { candidate, .. } if &**candidate.site() == "a")
                })
                .count();
            hits as f64 / f64::from(picks)
        };
        let calm = FlowObservation {
            headroom: Some(20),
            ..FlowObservation::default()
        };
        board
            .slot(&key("a"))
            .unwrap()
            .record_room(1_100, crate::live::BandKey::DEFAULT, &calm);
        board
            .slot(&key("b"))
            .unwrap()
            .record_room(1_100, crate::live::BandKey::DEFAULT, &calm);
        assert!(s.feed_live(&board, 1_200).1.is_empty());
        let before = s.refresh(1_200, &r);
        assert!((share_of_a(&before) - 0.5).abs() < 0.05);
        assert_eq!(before.get("m").unwrap().grid_headroom(), Some(40));
        // One response from a says its band is full; no poll, no new reading.
        let full = FlowObservation {
            headroom: Some(0),
            ..FlowObservation::default()
        };
        board
            .slot(&key("a"))
            .unwrap()
            .record_room(1_300, crate::live::BandKey::DEFAULT, &full);
        s.feed_live(&board, 1_300);
        let after = s.refresh(1_300, &r);
        assert!(share_of_a(&after) < 0.01, "{}", share_of_a(&after));
        assert_eq!(after.get("m").unwrap().grid_headroom(), Some(20));
        // Its weight comes back as the signal ages.
        let later = s.refresh(1_300 + 3 * crate::live::LIVE_ROOM_HALF_LIFE_MS, &r);
        assert!(share_of_a(&later) > 0.4, "{}", share_of_a(&later));
    }

    #[test]
    fn serving_failures_weigh_a_site_down_and_answers_bring_it_back() {
        use crate::live::LiveBoard;
        let mut s = Scorer::new(ScoreConfig::default());
        let r = routes(&["a", "b"]);
        for site in ["a", "b"] {
            s.observe(&key(site), &reading(1_000, 4.0)).unwrap();
        }
        let board = LiveBoard::new(&[key("a"), key("b")]);
        let a = board.slot(&key("a")).unwrap();
        // One short of an ejection: weighted down, not out.
        for _ in 0..crate::live::CONSECUTIVE_FAILURES - 1 {
            a.record_failure();
        }
        s.feed_live(&board, 1_000);
        let t = s.refresh(1_000, &r);
        let weight = |t: &RouteTable, site: &str| at(t, site).live_factor();
        assert!((weight(&t, "a") - 1.0 / 5.0).abs() < 1e-9);
        assert!((weight(&t, "b") - 1.0).abs() < 1e-12);
        a.record_answer();
        s.feed_live(&board, 1_000);
        let t = s.refresh(1_000, &r);
        assert!(
            (weight(&t, "a") - 1.0 / 3.0).abs() < 1e-9,
            "halved by an answer"
        );
    }
}
