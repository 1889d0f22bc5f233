//! A membership datagram from the network: raw (refused before any decoding unless it
//! opens) and sealed under a genuine session, so arbitrary plaintext reaches the
//! identity check and the SWIM decoder. Nothing may panic, and the machine keeps going.
#![no_main]

use grid_membership::{
    Input, Member, Membership, MembershipMetrics, Role, Sessions, SplitMix64, Timing,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(mut a) = Membership::new(
        Member::loopback("a"),
        &Timing::default(),
        SplitMix64::new(1),
        MembershipMetrics::default(),
    ) else {
        return;
    };
    let material = [3u8; 40];
    a.handle(
        0,
        Input::Session {
            member: Member::loopback("b"),
            material,
            role: Role::Responder,
        },
    );
    let mut b_end = Sessions::default();
    b_end.install(0, "a", &material, Role::Initiator);
    let mut sealed = Vec::new();
    if b_end.seal(1, "a", data, &mut sealed) {
        a.handle(1, Input::Datagram(&mut sealed));
    }
    let mut raw = data.to_vec();
    a.handle(2, Input::Datagram(&mut raw));
    a.handle_timeout(60_000);
    while a.poll().is_some() {}
});
