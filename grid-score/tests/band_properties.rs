//! The live band signal by band: whatever order a site's bands answer in, the queue the
//! gateway reads for the site is the sum of each band's own (its size as shown less its
//! own newest headroom), never one band's size less another's headroom; a band whose
//! capacity dropped stops reading its old size once the forget window passed; a slot
//! keeps at most the bound of bands, the most recently seen.

use grid_score::live::{
    BAND_MAX_FORGET_MS, BandKey, FlowObservation, LiveBoard, LiveSlot, MAX_BANDS_TRACKED,
};
use grid_score::{CandidateKey, Reading, Routes, ScoreConfig, Scorer};
use proptest::prelude::*;

const BANDS: usize = 3;
const _: () = assert!(BANDS <= MAX_BANDS_TRACKED);

fn band(i: usize) -> BandKey {
    if i == 0 {
        BandKey::DEFAULT
    } else {
        BandKey::named(Some(format!("objective-{i}").as_bytes()))
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn a_sites_read_queue_is_the_sum_of_its_bands_own_queues_whatever_order_they_answer_in(
        capacities in proptest::collection::vec(1u64..200, BANDS),
        answers in proptest::collection::vec((0usize..BANDS, 0.0..1.0f64), 1..120),
    ) {
        let key = CandidateKey::new("a", "p");
        let routes = Routes::new().with("m", vec![key.clone()]);
        let mut s = Scorer::new(ScoreConfig::default());
        let reading = Reading {
            in_flight: Some(8.0),
            queue_depth: Some(0.0),
            ready_endpoints: Some(1),
            ..Reading::new(1_000)
        };
        s.observe(&key, &reading).unwrap();
        let board = LiveBoard::new([&key]);
        let slot = board.slot(&key).unwrap();
        let room = |h| FlowObservation { headroom: Some(h), ..FlowObservation::default() };
        // Each band first shows itself empty, so its size is known and a true queue is
        // its capacity less its headroom.
        let mut truth = [0u64; BANDS];
        let mut t = 1_100;
        for (i, &cap) in capacities.iter().enumerate() {
            slot.record_room(t, band(i), &room(cap));
            t += 10;
        }
        s.feed_live(&board, t);
        for &(i, fill) in &answers {
            let h = ((capacities[i] as f64) * fill) as u64;
            truth[i] = capacities[i] - h;
            slot.record_room(t, band(i), &room(h));
            s.feed_live(&board, t);
            let table = s.refresh(t, &routes);
            let c = &table.get("m").unwrap().candidates()[0];
            // A band answering 0 says "full": it holds its whole size, the longest queue
            // it can. Every band's queue is its own.
            let queued: u64 = truth.iter().sum();
            prop_assert!(
                (c.waiting() - queued as f64).abs() < 1e-9,
                "read {} waiting, the bands hold {truth:?} of {capacities:?}", c.waiting()
            );
            t += 10;
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn a_band_whose_capacity_dropped_reads_no_more_queue_than_its_new_capacity_once_the_window_passed(
        high in 2u64..500,
        lowered in 0.0..0.5f64,
        answers in proptest::collection::vec((100u64..5_000, 0.0..=1.0f64), 20..200),
    ) {
        // A drop to under half the old size: what the lowered band holds (at most its new
        // capacity) never covers the queue the old size implies (at least the drop), so
        // no poll can be read as the old band still busy.
        let low = ((high as f64) * lowered) as u64;
        let key = CandidateKey::new("a", "p");
        let routes = Routes::new().with("m", vec![key.clone()]);
        let mut s = Scorer::new(ScoreConfig::default());
        let board = LiveBoard::new([&key]);
        let slot = board.slot(&key).unwrap();
        let room = |h| FlowObservation { headroom: Some(h), ..FlowObservation::default() };
        let poll = |stamp, held| Reading {
            in_flight: Some(8.0),
            queue_depth: Some(0.0),
            flow_held: Some(held),
            ready_endpoints: Some(1),
            ..Reading::new(stamp)
        };
        s.observe(&key, &poll(1_000, 0.0)).unwrap();
        slot.record_room(1_100, BandKey::DEFAULT, &room(high));
        s.feed_live(&board, 1_100);
        // From here the band holds at most `low`: every answer says so, every poll shows
        // what it truly holds.
        let mut t = 1_100;
        for &(gap, fill) in &answers {
            t += gap;
            let h = ((low as f64) * fill) as u64;
            s.observe(&key, &poll(t - gap / 2, (low - h) as f64)).unwrap();
            slot.record_room(t, BandKey::DEFAULT, &room(h));
            s.feed_live(&board, t);
            let waiting = s.refresh(t, &routes).get("m").unwrap().candidates()[0].waiting();
            prop_assert!(waiting >= 0.0);
            if t > 1_100 + BAND_MAX_FORGET_MS && h > 0 {
                prop_assert!(
                    waiting <= (low - h) as f64,
                    "at {t}: read {waiting} waiting in a band of {low} showing {h} free"
                );
            }
        }
    }

    #[test]
    fn a_slot_keeps_the_most_recently_seen_bands_up_to_the_bound_and_each_ones_newest_room(
        order in proptest::collection::vec(0usize..MAX_BANDS_TRACKED + 3, 1..200),
    ) {
        let slot = LiveSlot::new();
        let mut newest: Vec<(usize, u64)> = Vec::new();
        for (n, &i) in order.iter().enumerate() {
            let h = n as u64 + 1;
            slot.record_room(1_000 + n as u64, band(i), &FlowObservation {
                headroom: Some(h),
                ..FlowObservation::default()
            });
            newest.retain(|&(b, _)| b != i);
            newest.push((i, h));
        }
        let drained = slot.drain();
        let kept = drained.bands.iter().flatten().count();
        prop_assert_eq!(kept, newest.len().min(MAX_BANDS_TRACKED));
        // The least recently seen beyond the bound are the ones forgotten.
        let cut = newest.len().saturating_sub(MAX_BANDS_TRACKED);
        for (k, &(i, h)) in newest.iter().enumerate() {
            let room = drained.room_of(band(i));
            if k < cut {
                prop_assert!(room.is_none(), "band {} outlived the bound", i);
            } else {
                prop_assert_eq!(room.and_then(|r| r.headroom), Some(h));
            }
        }
    }
}
