//! The routing knobs and their defaults (documented for operators in `docs/routing.md`).

use serde::Deserialize;

/// Default [`ShedConfig::full_after_ms`]: two local polls. One saturated sample can be a
/// scheduling blip; two in a row at the 1 s poll are a site that stays full.
pub const DEFAULT_FULL_AFTER_MS: u64 = 2_000;

/// Default [`ShedConfig::room_after_ms`]: one peer poll. Longer than `full_after_ms` so
/// leaving shedding is slower than entering it (hysteresis), and long enough that a remote
/// site's next reading (5 s apart) has arrived before the model routes again.
pub const DEFAULT_ROOM_AFTER_MS: u64 = 5_000;

/// Default [`ShedConfig::retry_after_ms`]: a shed model is re-evaluated at every refresh
/// (about 1 s), so a client retrying sooner only meets another 429.
pub const DEFAULT_SHED_RETRY_AFTER_MS: u64 = 1_000;

/// Default [`ScoreConfig::fresh_for_ms`]: three peer polls. A remote reading arrives every
/// 5 s; missing two in a row is a lost signal, and the candidate then scores as
/// maximally loaded.
pub const DEFAULT_FRESH_FOR_MS: u64 = 15_000;

/// Default [`ScoreConfig::unavailable_retry_after_ms`]: a remote site rejoins within one
/// peer poll of recovering, so asking again after 5 s is the earliest useful retry.
pub const DEFAULT_UNAVAILABLE_RETRY_AFTER_MS: u64 = 5_000;

/// Default [`ScoreConfig::turnover_ms`]: two seconds, a short chat completion. Headroom
/// reads a site's slots as turning over once per this long; set it to the workload's
/// typical request duration, erring short: a prior longer than the requests leaves a
/// reading's free slots and queue barely moving the shares until a site's answers have
/// shown its own turnover (the routing simulator with turnover held at the prior, mean
/// request 2.4 s: p99 at 85% load about the same from 1 s to 2 s, up to three times
/// higher at 4 s and five times at 8 s; `docs/routing.md`).
pub const DEFAULT_TURNOVER_MS: u64 = 2_000;

/// `availability.shedding`: answer 429 instead of queueing onto sites that are all full.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ShedConfig {
    /// Off by default: shedding refuses work the sites might still have served late.
    pub enabled: bool,
    /// A model sheds once every healthy site has been saturated with work waiting for
    /// this long (sample stamps against `now`).
    pub full_after_ms: u64,
    /// A shedding model routes again once no sample from any site has shown saturation
    /// with work waiting for more than this long. Zero leaves shedding as soon as possible
    /// and lets it start only on a sample stamped at `now`.
    pub room_after_ms: u64,
    /// Retry-After for a shed request, in ms (the daemon rounds up to whole seconds).
    pub retry_after_ms: u64,
}

impl Default for ShedConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            full_after_ms: DEFAULT_FULL_AFTER_MS,
            room_after_ms: DEFAULT_ROOM_AFTER_MS,
            retry_after_ms: DEFAULT_SHED_RETRY_AFTER_MS,
        }
    }
}

/// Everything the scorer is configured with.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ScoreConfig {
    /// `availability.shedding`.
    pub shedding: ShedConfig,
    /// A candidate's newest loaded sample counts for this long after its stamp; older, the
    /// candidate scores as maximally loaded ([`crate::UNMEASURED`]).
    pub fresh_for_ms: u64,
    /// Retry-After when every candidate of a model is excluded (503), in ms.
    pub unavailable_retry_after_ms: u64,
    /// The typical time a request holds a slot, in ms: a site of capacity `c` absorbs
    /// about `c / turnover` requests per second when balanced (the first term of
    /// headroom). At least 1.
    pub turnover_ms: u64,
}

impl Default for ScoreConfig {
    fn default() -> Self {
        Self {
            shedding: ShedConfig::default(),
            fresh_for_ms: DEFAULT_FRESH_FOR_MS,
            unavailable_retry_after_ms: DEFAULT_UNAVAILABLE_RETRY_AFTER_MS,
            turnover_ms: DEFAULT_TURNOVER_MS,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shedding_is_off_by_default_and_leaving_is_slower_than_entering() {
        let c = ScoreConfig::default();
        assert!(!c.shedding.enabled);
        assert!(c.shedding.room_after_ms > c.shedding.full_after_ms);
    }
}
