//! Arbitrary sequences of readings, revision resets, forgets, clock steps, refreshes and
//! picks through grid-score's learner, refresh and selection (decoded by the public
//! `grid_score::fuzzing` module). Asserts: no panic; no NaN, negative or sub-floor
//! capacity and no out-of-range rho/score escaping the UNMEASURED sentinel; no pick of a
//! vetoed or excluded site, nor Unavailable, while a healthy candidate exists; a pick goes
//! to a site with room whenever one has room; unconfigured models answer UnknownModel.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(violation) = grid_score::fuzzing::run(data) {
        panic!("{violation}");
    }
});
