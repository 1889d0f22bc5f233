//! The flow-control response headers a site's router sends (`grid_score::live`), from
//! arbitrary header lists.
//!
//! Input: `name:value` lines; names and values are raw bytes (names lossily as UTF-8, as
//! an HTTP stack hands them over), so repeated, oversized, signed, fractional, non-ASCII
//! and case-mixed headers all occur.
//!
//! Asserts: no panic; a value taken is within its documented bound; a header that
//! appeared twice (either spelling) is never taken; every refusal is one of the closed
//! reasons; a slot holding the observation gives back the headroom it was given (capped
//! at the bound) and a saturated observation stays saturated.
#![no_main]

use grid_score::live::{
    BandKey, FlowHeader, FlowHeaders, LiveSlot, MAX_HEADROOM_REQUESTS, MAX_QUEUE_DURATION_MS,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut reader = FlowHeaders::new();
    let mut seen = [0usize; 3];
    for line in data.split(|b| *b == b'\n') {
        let (name, value) = match line.iter().position(|b| *b == b':') {
            Some(at) => (&line[..at], &line[at + 1..]),
            None => (line, &[][..]),
        };
        let name = String::from_utf8_lossy(name);
        if let Some(h) = reader.observe(&name, value) {
            seen[h as usize] += 1;
        }
    }
    let (o, refusals) = reader.finish();
    if let Some(h) = o.headroom {
        assert!(h <= MAX_HEADROOM_REQUESTS);
        assert_eq!(seen[FlowHeader::Headroom as usize], 1);
    }
    if let Some(q) = o.queue_ms {
        assert!(q <= MAX_QUEUE_DURATION_MS);
        assert_eq!(seen[FlowHeader::QueueDuration as usize], 1);
    }
    if o.dropped.is_some() {
        assert_eq!(seen[FlowHeader::DroppedReason as usize], 1);
    }
    for (header, _reason) in refusals.iter() {
        assert!(seen[header as usize] >= 1);
    }
    let slot = LiveSlot::new();
    slot.record_room(1_700_000_000_000, BandKey::DEFAULT, &o);
    let drained = slot.drain();
    match drained.room() {
        Some(room) => {
            assert!(o.has_room_signal());
            assert_eq!(room.headroom, o.headroom);
            assert_eq!(room.saturated, o.saturated());
        }
        None => assert!(!o.has_room_signal()),
    }
});
