//! Random draws for the request path, without a lock or a syscall per request.
//!
//! Each thread keeps its own grid-score generator, seeded once from the operating
//! system's generator (`getrandom`).

use std::cell::RefCell;
use std::hash::{BuildHasher as _, Hasher as _};

use grid_score::{Rng, SplitMix64};

/// A fresh random word from the OS generator, for a thread's seed. Should the generator
/// fail (it does not on Linux once booted), the standard library's OS-seeded hash keys
/// stand in: a seed only spreads picks, it identifies nothing (the feedback epoch, which
/// does, has no fallback: `poller::random_epoch`).
pub fn os_random_u64() -> u64 {
    getrandom::u64().unwrap_or_else(|_| {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(0x6772_6964); // "grid"
        h.finish()
    })
}

thread_local! {
    static RNG: RefCell<SplitMix64> = RefCell::new(SplitMix64::new(os_random_u64()));
}

/// This thread's generator, as grid-score's [`Rng`].
#[derive(Clone, Copy, Debug, Default)]
pub struct ThreadRng;

impl Rng for ThreadRng {
    fn next_u64(&mut self) -> u64 {
        RNG.with(|r| r.borrow_mut().next_u64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn successive_draws_differ() {
        assert_ne!(ThreadRng.next_u64(), ThreadRng.next_u64());
    }

    #[test]
    fn os_seeds_differ() {
        assert_ne!(os_random_u64(), os_random_u64());
    }
}
