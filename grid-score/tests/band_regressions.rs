//! The live band signal kept by band: the cases where one room value and one band
//! maximum per site read a queue that was not there.
#![allow(
    clippy::float_cmp,
    reason = "queues are whole requests, compared exactly on purpose"
)]

use grid_score::live::{BAND_MAX_FORGET_MS, BandKey, FlowObservation, LiveBoard};
use grid_score::{Candidate, CandidateKey, Reading, RouteTable, Routes, ScoreConfig, Scorer};

fn key() -> CandidateKey {
    CandidateKey::new("a", "p")
}

fn routes() -> Routes {
    Routes::new().with("m", vec![key()])
}

/// A polled reading at `stamp`: 8 in flight of 16 slots seen, nothing queued, flow
/// control holding `held`.
fn polled(stamp: u64, held: f64) -> Reading {
    Reading {
        in_flight: Some(8.0),
        queue_depth: Some(0.0),
        flow_held: Some(held),
        ready_endpoints: Some(1),
        ..Reading::new(stamp)
    }
}

fn room(h: u64) -> FlowObservation {
    FlowObservation {
        headroom: Some(h),
        ..FlowObservation::default()
    }
}

fn only(t: &RouteTable) -> &Candidate {
    &t.get("m").unwrap().candidates()[0]
}

/// A scorer that has polled the site once (nothing held) and drained one answer of its
/// default band showing 64 of room, with the board its answers are recorded on.
fn default_band_of_64() -> (Scorer, LiveBoard) {
    let mut s = Scorer::new(ScoreConfig::default());
    s.observe(&key(), &polled(1_000, 0.0)).unwrap();
    let board = LiveBoard::new([&key()]);
    board
        .slot(&key())
        .unwrap()
        .record_room(1_100, BandKey::DEFAULT, &room(64));
    s.feed_live(&board, 1_100);
    (s, board)
}

#[test]
fn a_second_bands_smaller_headroom_is_not_read_as_a_queue_of_the_first() {
    // Both bands empty: the default band holds 64, the critical one 16.
    // Each answer is drained as the gateway's refresh drains them (at most 50 ms apart).
    let (mut s, board) = default_band_of_64();
    let slot = board.slot(&key()).unwrap();
    slot.record_room(1_200, BandKey::named(Some(b"critical")), &room(16));
    s.feed_live(&board, 1_200);
    let t = s.refresh(1_200, &routes());
    assert_eq!(
        only(&t).waiting(),
        0.0,
        "64 less the other band's 16 is no queue"
    );
    assert!(only(&t).rho() <= 1.0, "rho {}", only(&t).rho());
    // Each band's own queue counts: 4 wait in the critical band, 10 in the default.
    slot.record_room(1_300, BandKey::named(Some(b"critical")), &room(12));
    s.feed_live(&board, 1_300);
    slot.record_room(1_400, BandKey::DEFAULT, &room(54));
    s.feed_live(&board, 1_400);
    let t = s.refresh(1_400, &routes());
    assert_eq!(only(&t).waiting(), 14.0);
}

#[test]
fn a_lowered_band_capacity_stops_reading_as_a_queue_after_the_forget_window() {
    let (mut s, board) = default_band_of_64();
    let slot = board.slot(&key()).unwrap();
    // The band is reconfigured to 16 and stays empty: every answer says 16, every poll
    // shows nothing held.
    let mut waiting = Vec::new();
    let mut t = 1_100;
    while t <= 1_100 + BAND_MAX_FORGET_MS + 2_000 {
        t += 1_000;
        s.observe(&key(), &polled(t - 500, 0.0)).unwrap();
        slot.record_room(t, BandKey::DEFAULT, &room(16));
        s.feed_live(&board, t);
        waiting.push((t, only(&s.refresh(t, &routes())).waiting()));
    }
    let (first_t, first) = waiting[0];
    assert_eq!(
        first, 48.0,
        "at {first_t}: within the window the size stands"
    );
    let (last_t, last) = *waiting.last().unwrap();
    assert_eq!(last, 0.0, "at {last_t}: the old size is forgotten");
    let forgot = waiting.iter().find(|&&(_, w)| w == 0.0).unwrap().0;
    assert!(
        forgot > 1_100 + BAND_MAX_FORGET_MS && forgot <= 1_100 + BAND_MAX_FORGET_MS + 1_000,
        "forgotten at {forgot}"
    );
}

#[test]
fn a_saturated_band_keeps_its_size_while_the_polls_show_what_it_holds() {
    let (mut s, board) = default_band_of_64();
    let slot = board.slot(&key()).unwrap();
    let mut t = 1_100;
    while t <= 1_100 + 3 * BAND_MAX_FORGET_MS {
        t += 1_000;
        // Flow control holds 60 and says so at every poll.
        s.observe(&key(), &polled(t - 500, 60.0)).unwrap();
        slot.record_room(t, BandKey::DEFAULT, &room(4));
        s.feed_live(&board, t);
    }
    assert_eq!(only(&s.refresh(t, &routes())).waiting(), 60.0);
}
