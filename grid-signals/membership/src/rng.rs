//! Randomness as an input: the project's one `Rng` trait (grid-signals'), adapted to the
//! trait foca draws from.

use core::convert::Infallible;

pub use grid_signals::rng::{Rng, SplitMix64};

/// Hands an [`Rng`] to foca, which wants rand 0.10's core trait.
#[derive(Debug)]
pub(crate) struct FocaRng<R>(pub(crate) R);

impl<R: Rng> rand_core::TryRng for FocaRng<R> {
    type Error = Infallible;

    fn try_next_u32(&mut self) -> Result<u32, Infallible> {
        Ok((self.0.next_u64() >> 32) as u32)
    }

    fn try_next_u64(&mut self) -> Result<u64, Infallible> {
        Ok(self.0.next_u64())
    }

    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Infallible> {
        for chunk in dst.chunks_mut(8) {
            let word = self.0.next_u64().to_le_bytes();
            chunk.copy_from_slice(&word[..chunk.len()]);
        }
        Ok(())
    }
}
