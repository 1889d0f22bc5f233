//! The immutable, pre-ordered view of one model's candidates that the request path reads.
//!
//! Everything a pick needs is decided here, off the request path: which candidates are
//! healthy, their order, which selection path applies and the cumulative weights it draws
//! from. [`crate::select`] only draws random numbers and compares.

use std::sync::Arc;

use crate::learner::ExcludeReason;
use crate::reading::CandidateKey;

/// The rho and score of a candidate with no fresh reading: infinitely loaded, so it sorts
/// after every measured candidate (whose values are capped at [`crate::RHO_CAP`]) and
/// never reads as having room. Loss of signal degrades to least preferred, never to idle.
pub const UNMEASURED: f64 = f64::INFINITY;

/// Where a healthy candidate stands, derived from its score and latest sample.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CandidateState {
    /// Measured, recent worst rho below 1.
    Room,
    /// Measured, no room, but not saturated with work waiting.
    NoRoom,
    /// Measured, saturated with work waiting at every unit or in flow control.
    Full,
    /// No fresh reading: scores [`UNMEASURED`].
    Unmeasured,
}

impl CandidateState {
    /// The metric label for this state.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Room => "room",
            Self::NoRoom => "no_room",
            Self::Full => "full",
            Self::Unmeasured => "unmeasured",
        }
    }
}

/// One healthy candidate as of the refresh that built the snapshot.
#[derive(Clone, Debug, PartialEq)]
pub struct Candidate {
    key: CandidateKey,
    capacity: f64,
    rho: f64,
    score: f64,
    waiting: f64,
    state: CandidateState,
}

impl Candidate {
    /// A candidate with a fresh reading. `rho` is the latest smoothed rho, `score` the
    /// recent worst (what ordering and selection read); `full` says the latest sample was
    /// saturated with work waiting. Non-finite or negative inputs are clamped into range
    /// so a snapshot can never carry NaN.
    pub fn measured(
        key: CandidateKey,
        capacity: f64,
        rho: f64,
        score: f64,
        waiting: f64,
        full: bool,
    ) -> Self {
        let clean = |v: f64, cap: f64| if v.is_nan() { cap } else { v.clamp(0.0, cap) };
        let score = clean(score, crate::RHO_CAP);
        let state = if full {
            CandidateState::Full
        } else if score < 1.0 {
            CandidateState::Room
        } else {
            CandidateState::NoRoom
        };
        Self {
            key,
            capacity: clean(capacity, f64::MAX).max(crate::CAPACITY_FLOOR),
            rho: clean(rho, crate::RHO_CAP),
            score,
            waiting: clean(waiting, f64::MAX),
            state,
        }
    }

    /// A candidate with no fresh reading: rho and score are [`UNMEASURED`].
    pub fn unmeasured(key: CandidateKey, capacity: f64) -> Self {
        let capacity = if capacity.is_nan() {
            crate::CAPACITY_FLOOR
        } else {
            capacity.clamp(crate::CAPACITY_FLOOR, f64::MAX)
        };
        Self {
            key,
            capacity,
            rho: UNMEASURED,
            score: UNMEASURED,
            waiting: 0.0,
            state: CandidateState::Unmeasured,
        }
    }

    /// Site and provider.
    pub fn key(&self) -> &CandidateKey {
        &self.key
    }

    /// The site's name.
    pub fn site(&self) -> &Arc<str> {
        &self.key.site
    }

    /// Learned capacity in requests; finite and at least [`crate::CAPACITY_FLOOR`].
    pub fn capacity(&self) -> f64 {
        self.capacity
    }

    /// Latest smoothed rho, or [`UNMEASURED`].
    pub fn rho(&self) -> f64 {
        self.rho
    }

    /// Recent worst rho — the ordering key and what selection compares — or [`UNMEASURED`].
    pub fn score(&self) -> f64 {
        self.score
    }

    /// Work waiting at the site (endpoint queues plus flow control); the by-capacity rule
    /// compares it per unit of capacity.
    pub fn waiting(&self) -> f64 {
        self.waiting
    }

    /// Where the candidate stands.
    pub fn state(&self) -> CandidateState {
        self.state
    }
}

/// A candidate kept out of selection, with the reason (for status pages and metrics).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Excluded {
    /// Site and provider.
    pub key: CandidateKey,
    /// Why it is out.
    pub reason: ExcludeReason,
}

/// Capacity-weighted draw over a subset of candidates: member indices and inclusive
/// prefix sums of their weights, built once at refresh.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Pool {
    pub(crate) members: Vec<u32>,
    pub(crate) cumulative: Vec<f64>,
}

impl Pool {
    fn new(members: Vec<u32>, candidates: &[Candidate]) -> Self {
        let mut total = 0.0;
        let cumulative = members
            .iter()
            .map(|&i| {
                total += candidates[i as usize].capacity;
                total
            })
            .collect();
        Self {
            members,
            cumulative,
        }
    }
}

/// The selection path decided at refresh.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Plan {
    Unavailable {
        retry_after_ms: u64,
    },
    Shed {
        retry_after_ms: u64,
    },
    Lone(u32),
    WeightedPair {
        first: u32,
        second: u32,
        first_share: f64,
    },
    TwoChoices(Pool),
    ByCapacity(Pool),
    Fallback(Pool),
}

/// What a snapshot answers when it cannot route.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refusals {
    /// `Some(retry_after_ms)` when the model is shedding.
    pub shed_retry_after_ms: Option<u64>,
    /// Retry-After when every candidate is excluded.
    pub unavailable_retry_after_ms: u64,
}

/// One model's candidates, least-loaded first, with the selection path already decided.
///
/// Immutable once built: the daemon publishes a [`RouteTable`] of these atomically and
/// every request reads the same one until the next refresh.
#[derive(Clone, Debug, PartialEq)]
pub struct RouteSnapshot {
    model: Arc<str>,
    candidates: Vec<Candidate>,
    excluded: Vec<Excluded>,
    pub(crate) plan: Plan,
}

impl RouteSnapshot {
    /// Orders `candidates` least-loaded first (score, then larger capacity; full ties keep
    /// the given order) and decides the selection path. Public so simulators and tests can
    /// build snapshots without a learner.
    pub fn new(
        model: impl Into<Arc<str>>,
        mut candidates: Vec<Candidate>,
        excluded: Vec<Excluded>,
        refusals: Refusals,
    ) -> Self {
        candidates.sort_by(|a, b| {
            a.score
                .total_cmp(&b.score)
                .then(b.capacity.total_cmp(&a.capacity))
        });
        let plan = plan(&candidates, refusals);
        Self {
            model: model.into(),
            candidates,
            excluded,
            plan,
        }
    }

    /// The model this snapshot routes.
    pub fn model(&self) -> &Arc<str> {
        &self.model
    }

    /// Healthy candidates, least-loaded first; unmeasured ones last.
    pub fn candidates(&self) -> &[Candidate] {
        &self.candidates
    }

    /// Candidates out of selection and why.
    pub fn excluded(&self) -> &[Excluded] {
        &self.excluded
    }

    /// The path a pick will take.
    pub fn path(&self) -> Option<crate::Path> {
        use crate::Path;
        match self.plan {
            Plan::Unavailable { .. } | Plan::Shed { .. } => None,
            Plan::Lone(_) => Some(Path::Lone),
            Plan::WeightedPair { .. } => Some(Path::WeightedPair),
            Plan::TwoChoices(_) => Some(Path::TwoChoices),
            Plan::ByCapacity(_) => Some(Path::ByCapacity),
            Plan::Fallback(_) => Some(Path::Fallback),
        }
    }
}

fn indices_in(candidates: &[Candidate], state: CandidateState) -> Vec<u32> {
    (0..candidates.len() as u32)
        .filter(|&i| candidates[i as usize].state == state)
        .collect()
}

fn plan(candidates: &[Candidate], refusals: Refusals) -> Plan {
    if candidates.is_empty() {
        return Plan::Unavailable {
            retry_after_ms: refusals.unavailable_retry_after_ms,
        };
    }
    if let Some(retry_after_ms) = refusals.shed_retry_after_ms {
        return Plan::Shed { retry_after_ms };
    }
    let room = indices_in(candidates, CandidateState::Room);
    match room.as_slice() {
        [] => {
            let not_full = indices_in(candidates, CandidateState::NoRoom);
            if not_full.is_empty() {
                // Measured-full sites before unmeasured ones (loss of signal is least
                // preferred), spread by capacity rather than herded onto one.
                let full = indices_in(candidates, CandidateState::Full);
                let pool = if full.is_empty() {
                    indices_in(candidates, CandidateState::Unmeasured)
                } else {
                    full
                };
                Plan::Fallback(Pool::new(pool, candidates))
            } else {
                Plan::ByCapacity(Pool::new(not_full, candidates))
            }
        }
        [only] => Plan::Lone(*only),
        [first, second] => {
            let weight = |i: u32| {
                let c = &candidates[i as usize];
                c.capacity / (1.0 + c.score)
            };
            let (a, b) = (weight(*first), weight(*second));
            Plan::WeightedPair {
                first: *first,
                second: *second,
                first_share: a / (a + b),
            }
        }
        _ => Plan::TwoChoices(Pool::new(room, candidates)),
    }
}

/// Every model's snapshot from one refresh: what the daemon swaps in atomically.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RouteTable {
    models: crate::hash::FnvMap<Arc<str>, RouteSnapshot>,
}

impl RouteTable {
    /// A table of the given snapshots (a later snapshot for the same model wins).
    pub fn from_snapshots(snapshots: impl IntoIterator<Item = RouteSnapshot>) -> Self {
        Self {
            models: snapshots
                .into_iter()
                .map(|s| (s.model.clone(), s))
                .collect(),
        }
    }

    /// The snapshot of `model`, if the model is configured.
    pub fn get(&self, model: &str) -> Option<&RouteSnapshot> {
        self.models.get(model)
    }

    /// Every snapshot, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = &RouteSnapshot> {
        self.models.values()
    }

    /// Number of models.
    pub fn len(&self) -> usize {
        self.models.len()
    }

    /// No models configured.
    pub fn is_empty(&self) -> bool {
        self.models.is_empty()
    }
}

#[cfg(test)]
#[allow(
    clippy::float_cmp,
    reason = "sentinels and floors are exact values, compared exactly on purpose"
)]
mod tests {
    use super::*;

    pub(crate) fn cand(site: &str, capacity: f64, score: f64) -> Candidate {
        Candidate::measured(
            CandidateKey::new(site, "p"),
            capacity,
            score,
            score,
            0.0,
            false,
        )
    }

    const REFUSE: Refusals = Refusals {
        shed_retry_after_ms: None,
        unavailable_retry_after_ms: 5_000,
    };

    #[test]
    fn candidates_sort_least_loaded_first_and_unmeasured_last() {
        let s = RouteSnapshot::new(
            "m",
            vec![
                Candidate::unmeasured(CandidateKey::new("u", "p"), 100.0),
                cand("busy", 10.0, 3.0),
                cand("idle", 10.0, 0.1),
                cand("mid", 10.0, 0.5),
            ],
            vec![],
            REFUSE,
        );
        let order: Vec<_> = s.candidates().iter().map(|c| &*c.key.site).collect();
        assert_eq!(order, ["idle", "mid", "busy", "u"]);
    }

    #[test]
    fn paths_follow_the_number_of_sites_with_room() {
        use crate::Path;
        let path = |cs: Vec<Candidate>| RouteSnapshot::new("m", cs, vec![], REFUSE).path();
        assert_eq!(path(vec![cand("a", 1.0, 0.1)]), Some(Path::Lone));
        assert_eq!(
            path(vec![cand("a", 1.0, 0.1), cand("b", 1.0, 0.2)]),
            Some(Path::WeightedPair)
        );
        assert_eq!(
            path(vec![
                cand("a", 1.0, 0.1),
                cand("b", 1.0, 0.2),
                cand("c", 1.0, 0.3)
            ]),
            Some(Path::TwoChoices)
        );
        assert_eq!(
            path(vec![cand("a", 1.0, 1.0), cand("b", 1.0, 2.0)]),
            Some(Path::ByCapacity)
        );
        let full = Candidate::measured(CandidateKey::new("f", "p"), 1.0, 2.0, 2.0, 3.0, true);
        assert_eq!(path(vec![full]), Some(Path::Fallback));
        assert_eq!(path(vec![]), None);
    }

    #[test]
    fn rho_exactly_one_has_no_room() {
        assert_eq!(cand("a", 1.0, 1.0).state(), CandidateState::NoRoom);
        assert_eq!(cand("a", 1.0, 0.999_999).state(), CandidateState::Room);
    }

    #[test]
    fn nan_inputs_never_reach_a_snapshot() {
        let c = Candidate::measured(
            CandidateKey::new("a", "p"),
            f64::NAN,
            f64::NAN,
            f64::NAN,
            f64::NAN,
            false,
        );
        assert!(c.capacity().is_finite() && c.rho().is_finite() && c.score().is_finite());
        assert!(c.capacity() >= crate::CAPACITY_FLOOR);
        let u = Candidate::unmeasured(CandidateKey::new("a", "p"), f64::NAN);
        assert_eq!(u.capacity(), crate::CAPACITY_FLOOR);
        assert_eq!(u.score(), UNMEASURED);
    }
}
