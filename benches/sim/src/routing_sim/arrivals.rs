//! The offered load: Poisson arrivals at a share of the sites' total capacity, with
//! periodic bursts and a slow swing (a day's load compressed), each request carrying its own service time so every policy serves
//! the very same requests.

use crate::sim_rng::SimRng;
use crate::site_model::{FALLBACK_PRIORITY, Priority, ServiceTime};

/// One request of the offered load.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Arrival {
    /// When it arrives at the gateway (virtual ms from the run's start).
    pub at_ms: u64,
    /// Its undegraded service time, in ms.
    pub service_ms: u64,
    /// Whether the client streams.
    pub streaming: bool,
    /// The gateway it arrives at (index into the scenario's gateways).
    pub gateway: usize,
    /// The flow-control band it asks for (its objective's priority).
    pub priority: Priority,
}

/// Bursts on top of the base rate: every `every_ms`, for `length_ms`, the rate is
/// multiplied by `factor`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Bursts {
    /// First burst start (virtual ms).
    pub first_ms: u64,
    /// Period between burst starts (ms).
    pub every_ms: u64,
    /// Burst length (ms).
    pub length_ms: u64,
    /// Rate multiplier during a burst.
    pub factor: f64,
}

impl Bursts {
    /// Whether `t_ms` falls inside a burst.
    pub fn active(&self, t_ms: u64) -> bool {
        self.every_ms > 0
            && t_ms >= self.first_ms
            && (t_ms - self.first_ms) % self.every_ms < self.length_ms
    }
}

/// A slow swing of the rate around its mean, as a day's load rises and falls: the rate
/// is multiplied by `1 + swing x sin(2 pi t / period)`, so over whole periods the mean is
/// unchanged.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Ramp {
    /// One whole swing, in ms.
    pub period_ms: u64,
    /// How far the rate moves above and below its mean, as a share of it (`0..1`).
    pub swing: f64,
}

impl Ramp {
    /// The rate multiplier at `t_ms`.
    pub fn factor(&self, t_ms: u64) -> f64 {
        if self.period_ms == 0 {
            return 1.0;
        }
        let phase = (t_ms % self.period_ms) as f64 / self.period_ms as f64;
        1.0 + self.swing * (std::f64::consts::TAU * phase).sin()
    }

    /// The largest multiplier.
    pub fn peak(&self) -> f64 {
        1.0 + self.swing.max(0.0)
    }
}

/// The shape of the offered load.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LoadShape {
    /// Base arrival rate, requests per second.
    pub rate_per_s: f64,
    /// Bursts, if any.
    pub bursts: Option<Bursts>,
    /// A slow swing, if any.
    pub ramp: Option<Ramp>,
    /// Service-time distribution of the requests.
    pub service: ServiceTime,
    /// Share of streaming requests.
    pub streaming_share: f64,
    /// Arrivals stop at this time (ms).
    pub duration_ms: u64,
}

/// Every arrival of a run, in time order, fixed by `seed`.
///
/// A non-homogeneous Poisson process by thinning: candidates at the peak rate, each kept
/// with probability rate(t) / peak, so the base, burst and swing rates are exact.
pub fn generate(shape: &LoadShape, seed: u64) -> Vec<Arrival> {
    let mut gaps = SimRng::fork(seed, 1);
    let mut keep = SimRng::fork(seed, 2);
    let mut sizes = SimRng::fork(seed, 3);
    let burst_factor = shape.bursts.map_or(1.0, |b| b.factor.max(1.0));
    let ramp_peak = shape.ramp.map_or(1.0, |r| r.peak());
    let peak = shape.rate_per_s * burst_factor * ramp_peak;
    let mut out = Vec::with_capacity((peak * shape.duration_ms as f64 / 1_000.0) as usize + 16);
    if peak <= 0.0 {
        return out;
    }
    let mean_gap_ms = 1_000.0 / peak;
    let mut t = 0.0;
    loop {
        t += gaps.exponential(mean_gap_ms);
        if t >= shape.duration_ms as f64 {
            break;
        }
        let at_ms = t as u64;
        let burst = if shape.bursts.is_some_and(|b| b.active(at_ms)) {
            burst_factor
        } else {
            1.0
        };
        let rate = shape.rate_per_s * burst * shape.ramp.map_or(1.0, |r| r.factor(at_ms));
        if keep.unit() * peak >= rate {
            continue;
        }
        out.push(Arrival {
            at_ms,
            service_ms: shape.service.draw(&mut sizes),
            streaming: sizes.unit() < shape.streaming_share,
            gateway: 0,
            priority: FALLBACK_PRIORITY,
        });
    }
    out
}

/// The random stream that spreads arrivals over gateways: its own, so one gateway's
/// arrivals are exactly the single-gateway simulator's.
const GATEWAY_STREAM: u64 = 4;

/// Spreads `arrivals` over gateways with the given shares of the load (each arrival
/// independently, so each gateway sees a Poisson stream with bursts at its share). With
/// one gateway nothing is drawn.
pub fn assign_gateways(arrivals: &mut [Arrival], shares: &[f64], seed: u64) {
    if shares.len() < 2 {
        return;
    }
    let total: f64 = shares.iter().sum();
    let mut draw = SimRng::fork(seed, GATEWAY_STREAM);
    for a in arrivals {
        let mut x = draw.unit() * total;
        a.gateway = shares.len() - 1;
        for (g, share) in shares.iter().enumerate() {
            if x < *share {
                a.gateway = g;
                break;
            }
            x -= share;
        }
    }
}

/// The random stream that draws each arrival's priority: its own, so a scenario without
/// priorities keeps exactly the arrivals it had.
const PRIORITY_STREAM: u64 = 5;

/// Gives each of `arrivals` the band `priority` with probability `share` (independently,
/// so each band sees a Poisson stream with bursts at its share); the rest keep the
/// fallback band.
pub fn assign_priorities(arrivals: &mut [Arrival], priority: Priority, share: f64, seed: u64) {
    let mut draw = SimRng::fork(seed, PRIORITY_STREAM);
    for a in arrivals {
        if draw.unit() < share {
            a.priority = priority;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::f64::consts::PI;

    use super::*;

    fn shape(bursts: Option<Bursts>) -> LoadShape {
        LoadShape {
            rate_per_s: 40.0,
            bursts,
            ramp: None,
            service: ServiceTime::default(),
            streaming_share: 0.8,
            duration_ms: 200_000,
        }
    }

    #[test]
    fn arrivals_are_ordered_and_match_the_rate() {
        let a = generate(&shape(None), 1);
        assert!(a.windows(2).all(|w| w[0].at_ms <= w[1].at_ms));
        let rate = a.len() as f64 / 200.0;
        assert!((rate - 40.0).abs() < 1.5, "rate {rate}");
        let streaming = a.iter().filter(|x| x.streaming).count() as f64 / a.len() as f64;
        assert!((streaming - 0.8).abs() < 0.02, "{streaming}");
    }

    #[test]
    fn bursts_raise_the_rate_only_inside_their_windows() {
        let b = Bursts {
            first_ms: 10_000,
            every_ms: 40_000,
            length_ms: 10_000,
            factor: 2.0,
        };
        let a = generate(&shape(Some(b)), 2);
        let inside = a.iter().filter(|x| b.active(x.at_ms)).count() as f64;
        let outside = a.len() as f64 - inside;
        // 5 bursts of 10 s inside 200 s.
        let inside_rate = inside / 50.0;
        let outside_rate = outside / 150.0;
        assert!((inside_rate - 80.0).abs() < 5.0, "{inside_rate}");
        assert!((outside_rate - 40.0).abs() < 2.5, "{outside_rate}");
    }

    #[test]
    fn a_swing_raises_the_rate_in_its_first_half_lowers_it_in_its_second_and_keeps_the_mean() {
        let ramp = Ramp {
            period_ms: 100_000,
            swing: 0.5,
        };
        let a = generate(
            &LoadShape {
                ramp: Some(ramp),
                ..shape(None)
            },
            3,
        );
        let rate = a.len() as f64 / 200.0;
        assert!((rate - 40.0).abs() < 1.5, "mean rate {rate}");
        let high = a.iter().filter(|x| x.at_ms % 100_000 < 50_000).count() as f64 / 100.0;
        let low = a.len() as f64 / 100.0 - high;
        // The mean of 1 + 0.5 sin over a half period is 1 +/- 1/pi.
        let (want_high, want_low) = (40.0 * (1.0 + 0.5 / PI * 2.0), 40.0 * (1.0 - 0.5 / PI * 2.0));
        assert!((high - want_high).abs() < 2.5, "{high} against {want_high}");
        assert!((low - want_low).abs() < 2.5, "{low} against {want_low}");
        assert!((ramp.factor(25_000) - 1.5).abs() < 1e-9);
        assert!((ramp.factor(75_000) - 0.5).abs() < 1e-9);
    }

    #[test]
    fn without_a_swing_the_arrivals_are_the_same_draws() {
        let none = generate(&shape(None), 4);
        let flat = generate(
            &LoadShape {
                ramp: Some(Ramp {
                    period_ms: 100_000,
                    swing: 0.0,
                }),
                ..shape(None)
            },
            4,
        );
        assert_eq!(none, flat);
    }

    #[test]
    fn arrivals_spread_over_gateways_by_their_shares() {
        let mut a = generate(&shape(None), 5);
        assign_gateways(&mut a, &[0.7, 0.2, 0.1], 5);
        for (g, want) in [0.7, 0.2, 0.1].into_iter().enumerate() {
            let got = a.iter().filter(|x| x.gateway == g).count() as f64 / a.len() as f64;
            assert!((got - want).abs() < 0.02, "gateway {g}: {got}");
        }
    }

    #[test]
    fn a_share_of_arrivals_asks_for_the_higher_band_and_the_rest_for_band_0() {
        let mut a = generate(&shape(None), 6);
        let before = a.clone();
        assign_priorities(&mut a, 1, 0.3, 6);
        let high = a.iter().filter(|x| x.priority == 1).count() as f64 / a.len() as f64;
        assert!((high - 0.3).abs() < 0.02, "{high}");
        assert!(
            a.iter()
                .all(|x| x.priority == 1 || x.priority == FALLBACK_PRIORITY)
        );
        let same = |x: &Arrival, y: &Arrival| (x.at_ms, x.service_ms) == (y.at_ms, y.service_ms);
        assert!(
            a.iter().zip(&before).all(|(x, y)| same(x, y)),
            "only the band"
        );
    }

    #[test]
    fn the_same_seed_gives_the_same_arrivals() {
        assert_eq!(generate(&shape(None), 3), generate(&shape(None), 3));
        assert_ne!(generate(&shape(None), 3), generate(&shape(None), 4));
    }
}
