//! The store against a reference model, over arbitrary interleavings of batches: delays,
//! exact duplicates, changed duplicates, reorderings, epoch changes, future epochs and
//! rejected payloads.
//!
//! The model is the store's admission rules written as plainly as possible (whole
//! batches compared by equality, windows as vectors); the store must agree with it after
//! every step on fences, windows, learning state, drop counts and events.

use std::collections::BTreeMap;

use grid_signals::batch::{Batch, BatchMeta, Fence, MAX_EPOCH_LEAD_MS, Revision, Row};
use grid_signals::store::{
    DropCounts, DropReason, IngestReport, Learning, MAX_SAMPLES_PER_SERIES, PauseReason, Sender,
    Store, StoreConfig, StoreEvent, decode_batches,
};
use proptest::prelude::*;

const T0: u64 = 1_700_000_000_000;
const SITE: &str = "b";
const PROVIDERS: [&str; 2] = ["m0", "m1"];
const METRICS: [&str; 2] = ["q", "r"];
/// An epoch far past the lead bound at every `now` the scenarios reach.
const FUTURE_EPOCH: u64 = T0 + 10 * MAX_EPOCH_LEAD_MS;

/// A provider's name, fence and readings, to compare two stores.
type View = (String, Option<Fence>, Vec<(f64, u64)>);

/// One step of a scenario.
#[derive(Clone, Debug)]
enum Op {
    /// A fresh publication.
    Publish {
        provider: usize,
        /// 0..3 pick a real epoch; 3 picks one too far in the future.
        epoch: usize,
        sequence: u64,
        uid: usize,
        generation: u64,
        metrics: Vec<usize>,
        /// 0: whole; 1: a row short; 2: a line refused on the way.
        damage: u8,
    },
    /// The exact bytes of an earlier step again (a duplicate or a delayed delivery).
    Replay { step: usize },
    /// An earlier step's fence and metadata with a changed value.
    Changed { step: usize },
    /// Time passes.
    Wait { ms: u64 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (
            0..PROVIDERS.len(),
            prop_oneof![9 => 0..3usize, 1 => Just(3usize)],
            0..6u64,
            0..2usize,
            1..3u64,
            prop::collection::vec(0..METRICS.len(), 0..4),
            prop_oneof![8 => Just(0u8), 1 => Just(1u8), 1 => Just(2u8)],
        )
            .prop_map(|(provider, epoch, sequence, uid, generation, metrics, damage)| {
                Op::Publish { provider, epoch, sequence, uid, generation, metrics, damage }
            }),
        2 => any::<prop::sample::Index>().prop_map(|i| Op::Replay { step: i.index(usize::MAX) }),
        1 => any::<prop::sample::Index>().prop_map(|i| Op::Changed { step: i.index(usize::MAX) }),
        1 => (0..5_000u64).prop_map(|ms| Op::Wait { ms }),
    ]
}

/// What the model holds for one provider.
#[derive(Clone, Debug, Default)]
struct Provider {
    fence: Option<Fence>,
    /// The complete publication held at `fence`, compared by equality.
    held: Option<Batch>,
    revision: Option<Revision>,
    lifetime: Lifetime,
    windows: BTreeMap<String, Vec<(f64, u64)>>,
}

#[derive(Clone, Debug, Default, PartialEq)]
enum Lifetime {
    #[default]
    None,
    Invalidated,
    Live(Revision, u64),
}

#[derive(Debug, Default)]
struct Model {
    providers: BTreeMap<String, Provider>,
    /// The fence each stored row value came from (values are unique per publication).
    origin: BTreeMap<u64, Fence>,
}

#[derive(Debug, Default, PartialEq)]
struct Expect {
    stored: u64,
    repeated: u64,
    rows: u64,
    skew: u64,
    delayed: u64,
    incomplete: u64,
    reset: Option<Revision>,
}

/// Whether `a` and `b` are one publication: equal in everything but a single shift of
/// every stamp (a relay's re-dating), which does not make a changed duplicate.
fn same_publication(a: &Batch, b: &Batch) -> bool {
    let relative = |batch: &Batch| -> (Vec<u64>, Batch) {
        let base = batch.meta.stamp_ms();
        let offsets = batch
            .rows
            .iter()
            .map(|r| r.stamp_ms().wrapping_sub(base))
            .collect();
        let m = &batch.meta;
        let meta = BatchMeta::new(
            m.site(),
            m.provider(),
            m.uid(),
            m.fence(),
            m.samples(),
            m.generation(),
            0,
        )
        .expect("the batch's own metadata");
        let rows = batch
            .rows
            .iter()
            .map(|r| Row::new(r.name(), r.labels().to_vec(), r.value(), 0).expect("its own row"))
            .collect();
        let mut normal = Batch::new(meta, rows);
        normal.lines_refused = batch.lines_refused;
        (offsets, normal)
    };
    relative(a) == relative(b)
}

impl Model {
    fn apply(&mut self, batch: &Batch, now: u64) -> Expect {
        let mut e = Expect::default();
        let lines = 1 + batch.rows.len() as u64;
        let fence = batch.meta.fence();
        if fence.epoch > now + MAX_EPOCH_LEAD_MS {
            e.skew = lines;
            return e;
        }
        let p = self
            .providers
            .entry(batch.meta.provider().to_owned())
            .or_default();
        if let Some(held_fence) = p.fence {
            let same = p.held.as_ref().is_some_and(|h| same_publication(h, batch));
            if fence < held_fence || (fence == held_fence && !same) {
                e.delayed = lines;
                return e;
            }
            if fence == held_fence {
                e.repeated = 1;
                return e;
            }
        }
        p.fence = Some(fence);
        p.held = None;
        let revision = batch.meta.revision();
        let whole = batch.lines_refused == 0 && batch.rows.len() as u64 == batch.meta.samples();
        if !whole {
            e.incomplete = lines;
            if p.revision.as_ref() != Some(&revision) {
                p.lifetime = Lifetime::None;
            }
            p.revision = Some(revision);
            return e;
        }
        p.held = Some(batch.clone());
        e.stored = 1;
        if batch.rows.is_empty() {
            p.lifetime = Lifetime::Invalidated;
        } else if !matches!(&p.lifetime, Lifetime::Live(r, _) if *r == revision) {
            p.lifetime = Lifetime::Live(revision.clone(), now);
            e.reset = Some(revision.clone());
        }
        p.revision = Some(revision);
        for row in &batch.rows {
            let w = p.windows.entry(row.name().to_owned()).or_default();
            if w.len() == MAX_SAMPLES_PER_SERIES {
                w.remove(0);
            }
            w.push((row.value(), row.stamp_ms()));
            self.origin.insert(row.value() as u64, fence);
            e.rows += 1;
        }
        e
    }
}

fn build(op: &Op, step: usize, now: u64) -> Batch {
    let Op::Publish {
        provider,
        epoch,
        sequence,
        uid,
        generation,
        metrics,
        damage,
    } = op
    else {
        unreachable!("only publications are built")
    };
    let epoch = if *epoch == 3 {
        FUTURE_EPOCH
    } else {
        T0 + *epoch as u64 * 1_000
    };
    // Unique values per step let the test trace every held reading to its batch.
    let rows: Vec<Row> = metrics
        .iter()
        .enumerate()
        .map(|(i, &m)| {
            Row::new(METRICS[m], vec![], (step * 10 + i) as f64, now - i as u64).unwrap()
        })
        .collect();
    let meta = BatchMeta::new(
        SITE,
        PROVIDERS[*provider],
        format!("u{uid}"),
        Fence::new(epoch, *sequence),
        rows.len() as u64,
        *generation,
        now,
    )
    .unwrap();
    let mut batch = Batch::new(meta, rows);
    match damage {
        1 if !batch.rows.is_empty() => {
            batch.rows.pop();
        }
        1 | 2 => batch.lines_refused = 1,
        _ => {}
    }
    batch
}

fn changed(mut batch: Batch, step: usize) -> Batch {
    if let Some(first) = batch.rows.first_mut() {
        *first = Row::new(
            first.name(),
            vec![],
            (step * 10 + 9) as f64,
            first.stamp_ms(),
        )
        .unwrap();
    } else {
        batch.lines_refused += 1;
    }
    batch
}

fn learning_of(p: &Provider, now: u64, ttl: u64, meta_stamp: Option<u64>) -> Learning<'_> {
    match &p.lifetime {
        Lifetime::None => Learning::Paused(PauseReason::MetadataMissing),
        Lifetime::Invalidated => Learning::Paused(PauseReason::ZeroSamples),
        Lifetime::Live(revision, since_ms) => {
            if meta_stamp.is_some_and(|s| s + ttl >= now) {
                Learning::Allowed {
                    revision,
                    since_ms: *since_ms,
                }
            } else {
                Learning::Paused(PauseReason::MetadataStale)
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn store_agrees_with_the_reference_model(ops in prop::collection::vec(op(), 1..60)) {
        let config = StoreConfig::default();
        let mut store = Store::new(config);
        let mut model = Model::default();
        let mut sent: Vec<Option<Batch>> = Vec::new();
        let mut now = T0 + 5_000;
        // The revision of each provider's last stored batch with rows.
        let mut learned: BTreeMap<String, Revision> = BTreeMap::new();
        for (step, op) in ops.iter().enumerate() {
            let earlier = |i: usize| sent[..step].iter().flatten().nth(i % sent[..step].iter().flatten().count().max(1)).cloned();
            let batch = match op {
                Op::Publish { .. } => Some(build(op, step, now)),
                Op::Replay { step: i } => earlier(*i),
                Op::Changed { step: i } => earlier(*i).map(|b| changed(b, step)),
                Op::Wait { ms } => {
                    now += ms;
                    None
                }
            };
            sent.push(batch.clone());
            let Some(batch) = batch else { continue };

            let expect = model.apply(&batch, now);
            let mut report = IngestReport::default();
            store.ingest_batch(batch.clone(), Sender::Local, now, now, &mut report);
            let events: Vec<StoreEvent> = std::iter::from_fn(|| store.poll_event()).collect();

            let got = Expect {
                stored: report.batches_stored,
                repeated: report.batches_repeated,
                rows: report.rows_stored,
                skew: report.dropped.get(DropReason::Skew),
                delayed: report.dropped.get(DropReason::Delayed),
                incomplete: report.dropped.get(DropReason::Incomplete),
                reset: match events.as_slice() {
                    [] => None,
                    [StoreEvent::Reset { revision, provider, .. }] => {
                        prop_assert_eq!(provider, batch.meta.provider());
                        Some(revision.clone())
                    }
                    other => {
                        prop_assert!(false, "more than one event for one batch: {:?}", other);
                        None
                    }
                },
            };
            prop_assert_eq!(&got, &expect, "step {} {:?}", step, op);
            // Stated on its own: a stored batch whose revision differs from the one
            // learned before raises exactly one reset, for that revision.
            if got.stored == 1 && !batch.rows.is_empty() {
                let revision = batch.meta.revision();
                let previous = learned.insert(batch.meta.provider().to_owned(), revision.clone());
                if previous.as_ref() != Some(&revision) {
                    prop_assert_eq!(got.reset.as_ref(), Some(&revision));
                }
            }
            prop_assert_eq!(report.dropped.total(), expect.skew + expect.delayed + expect.incomplete);

            for (name, p) in &model.providers {
                let entry = store.entry(SITE, name);
                prop_assert_eq!(entry.and_then(grid_signals::store::Entry::fence), p.fence);
                let Some(entry) = entry else { continue };
                prop_assert_eq!(entry.revision(), p.revision.as_ref());
                let ttl = config.ttl_ms;
                prop_assert_eq!(
                    entry.learning(now),
                    learning_of(p, now, ttl, entry.metadata_stamp_ms())
                );
                for metric in METRICS {
                    let held: Vec<(f64, u64)> = entry
                        .series(metric)
                        .flat_map(|s| s.readings().map(|r| (r.value, r.stamp_ms)))
                        .collect();
                    let want = p.windows.get(metric).cloned().unwrap_or_default();
                    prop_assert_eq!(&held, &want, "window of {} {}", name, metric);
                    // Never older than the fence: every held reading came from an
                    // admitted batch at or below the current fence.
                    for (value, _) in held {
                        let origin = model.origin.get(&(value as u64)).copied();
                        prop_assert!(origin.is_some_and(|f| Some(f) <= p.fence));
                    }
                }
            }
        }
    }

    #[test]
    fn exact_duplicates_are_idempotent(
        ops in prop::collection::vec(op(), 1..30),
        copies in 2..4usize,
    ) {
        // Every delivery sent `copies` times in a row: the store ends exactly as with
        // single deliveries, and the copies are neither drops nor events.
        let mut once = Store::new(StoreConfig::default());
        let mut many = Store::new(StoreConfig::default());
        let now = T0 + 5_000;
        for (step, op) in ops.iter().enumerate() {
            let Op::Publish { damage: 0, .. } = op else { continue };
            let batch = build(op, step, now);
            let mut r1 = IngestReport::default();
            once.ingest_batch(batch.clone(), Sender::Local, now, now, &mut r1);
            let mut rn = IngestReport::default();
            for _ in 0..copies {
                many.ingest_batch(batch.clone(), Sender::Local, now, now, &mut rn);
            }
            if r1.batches_stored == 1 {
                prop_assert_eq!(rn.batches_repeated, copies as u64 - 1);
            }
            prop_assert_eq!(rn.dropped, {
                let mut d = r1.dropped;
                // A refused first copy refuses every copy the same way.
                for (reason, n) in r1.dropped.iter() {
                    d.add(reason, n * (copies as u64 - 1));
                }
                d
            });
            let e1: Vec<_> = std::iter::from_fn(|| once.poll_event()).collect();
            let en: Vec<_> = std::iter::from_fn(|| many.poll_event()).collect();
            prop_assert_eq!(e1, en);
        }
        let view = |s: &Store| -> Vec<View> {
            s.entries()
                .map(|e| {
                    let readings = METRICS
                        .iter()
                        .flat_map(|m| e.series(m).flat_map(|s| s.readings().map(|r| (r.value, r.stamp_ms))).collect::<Vec<_>>())
                        .collect();
                    (e.provider().to_owned(), e.fence(), readings)
                })
                .collect()
        };
        prop_assert_eq!(view(&once), view(&many));
    }

    #[test]
    fn written_batches_decode_to_themselves(
        ops in prop::collection::vec(op(), 1..10),
    ) {
        let now = T0 + 5_000;
        let batches: Vec<Batch> = ops
            .iter()
            .enumerate()
            .filter(|(_, op)| matches!(op, Op::Publish { damage: 0, .. }))
            .map(|(step, op)| build(op, step, now))
            .collect();
        let mut body = Vec::new();
        for b in &batches {
            b.write(&mut body);
        }
        let mut drops = DropCounts::default();
        let mut decoded = Vec::new();
        decode_batches(&body, &mut drops, |b| decoded.push(b));
        prop_assert_eq!(drops.total(), 0);
        prop_assert_eq!(decoded, batches);
    }
}
