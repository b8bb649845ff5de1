//! Failure detectors: when an observer suspects a subject, from the
//! heartbeats it got (docs/CLUSTER.md, "Failure detection").
//!
//! * [`DetectorKind::Fixed`] suspects after a fixed silence. With two
//!   periods and a grace it is the rule of Li et al. [CI] section 6
//!   ([`DetectorKind::two_miss`]): suspect once two consecutive heartbeats
//!   are missing or late.
//! * [`DetectorKind::Phi`] is the phi accrual detector (Hayashibara et al.;
//!   Akka's and Cassandra's): suspicion is phi = -log10(1 - F(t)), `t` the
//!   time since the last heartbeat and F the normal distribution of the
//!   recent inter-arrival times, and the subject is suspected past a
//!   threshold. It learns how regular the subject's heartbeats arrive.
//!
//! Both take the observer's own lateness into account, as Lifeguard's
//! local health does (Dadgar et al.; memberlist): an observer whose own
//! timer turns come late is slow itself, and silence its own slowness
//! explains does not count against the subject. The caller measures it
//! ([`Lateness`]) and hands it in.
//!
//! Sans-IO: time is handed in; nothing here reads a clock.

use core::time::Duration;

use tether_proto::Instant;

/// Which rule decides suspicion.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum DetectorKind {
    /// Suspect after `patience` without a heartbeat.
    Fixed {
        /// The silence suspected.
        patience: Duration,
    },
    /// Phi accrual, suspecting past `threshold` (8: one chance in 10^8 that
    /// a heartbeat this late still comes, if arrivals stayed as they were).
    Phi {
        /// Suspicion level at which the subject is suspected.
        threshold: f64,
        /// Floor of the inter-arrival deviation: a perfectly regular past
        /// (a quiet link, a simulator) would otherwise make any jitter
        /// look like death.
        min_deviation: Duration,
    },
}

impl DetectorKind {
    /// The seed's rule: two heartbeats missing or late, i.e. silent for
    /// two periods and a grace of half a period.
    pub fn two_miss(period: Duration) -> Self {
        DetectorKind::Fixed { patience: period * 2 + period / 2 }
    }

    /// Phi accrual with Cassandra's default threshold (8) and a deviation
    /// floor of a tenth of the period.
    pub fn phi(period: Duration) -> Self {
        DetectorKind::Phi { threshold: 8.0, min_deviation: period / 10 }
    }

    /// Its name, for tables and flags.
    pub fn name(&self) -> &'static str {
        match self {
            DetectorKind::Fixed { .. } => "fixed",
            DetectorKind::Phi { .. } => "phi",
        }
    }
}

/// Inter-arrival times kept for phi: enough for a stable deviation, few
/// enough that a change of pace (a loaded machine) shows within seconds.
const WINDOW: usize = 64;

/// One subject as its observer sees it.
#[derive(Debug, Clone)]
pub struct Detector {
    kind: DetectorKind,
    period: Duration,
    last: Instant,
    /// Recent inter-arrival times in nanoseconds, a ring.
    gaps: [u64; WINDOW],
    n: usize,
    sum: f64,
    sum_sq: f64,
    /// Silence after `last` that crosses the threshold, computed at each
    /// heartbeat (phi) or fixed (two-miss).
    patience: Duration,
}

impl Detector {
    /// A subject first heard from (or first expected) at `now`, sending a
    /// heartbeat every `period`. Until its heartbeats have a history, phi
    /// assumes they come every period, give or take a quarter.
    pub fn new(kind: DetectorKind, period: Duration, now: Instant) -> Self {
        let mut d = Detector {
            kind,
            period,
            last: now,
            gaps: [0; WINDOW],
            n: 0,
            sum: 0.0,
            sum_sq: 0.0,
            patience: Duration::ZERO,
        };
        let p = period.as_nanos() as f64;
        d.patience = d.patience_for(p, p / 4.0);
        d
    }

    pub fn kind(&self) -> DetectorKind {
        self.kind
    }

    /// The last heartbeat's arrival.
    pub fn last(&self) -> Instant {
        self.last
    }

    /// A heartbeat arrived at `now`. One that arrived before the last one
    /// (a clock handed in out of order) changes nothing.
    pub fn heartbeat(&mut self, now: Instant) {
        if now < self.last {
            return;
        }
        let gap = (now - self.last).as_nanos().min(u64::MAX as u128) as u64;
        self.last = now;
        let slot = self.n % WINDOW;
        if self.n >= WINDOW {
            let old = self.gaps[slot] as f64;
            self.sum -= old;
            self.sum_sq -= old * old;
        }
        self.gaps[slot] = gap;
        self.sum += gap as f64;
        self.sum_sq += (gap as f64) * (gap as f64);
        self.n += 1;
        let k = self.n.min(WINDOW) as f64;
        let mean = self.sum / k;
        let deviation = (self.sum_sq / k - mean * mean).max(0.0).sqrt();
        self.patience = self.patience_for(mean, deviation);
    }

    /// The silence after the last heartbeat past which the subject is
    /// suspected, for arrivals of this mean and deviation (nanoseconds).
    fn patience_for(&self, mean: f64, deviation: f64) -> Duration {
        match self.kind {
            DetectorKind::Fixed { patience } => patience,
            DetectorKind::Phi { threshold, min_deviation } => {
                let sd = deviation.max(min_deviation.as_nanos() as f64).max(1.0);
                let y = phi_crossing(threshold);
                Duration::from_nanos((mean + y * sd).max(0.0) as u64)
            }
        }
    }

    /// When the subject will be suspected if nothing more comes, before
    /// the observer's own lateness is forgiven.
    pub fn deadline(&self) -> Instant {
        self.last + self.patience
    }

    /// Is the subject suspected at `now`, by an observer whose own turns
    /// run `lateness` late?
    pub fn suspects(&self, now: Instant, lateness: Duration) -> bool {
        now >= self.deadline() + lateness
    }

    /// Phi at `now` (fixed patience: 0 before its deadline, infinite after).
    pub fn phi(&self, now: Instant) -> f64 {
        let t = (now - self.last).as_nanos() as f64;
        match self.kind {
            DetectorKind::Fixed { .. } => {
                if now > self.deadline() {
                    f64::INFINITY
                } else {
                    0.0
                }
            }
            DetectorKind::Phi { min_deviation, .. } => {
                let k = self.n.min(WINDOW) as f64;
                let (mean, dev) = if self.n == 0 {
                    let p = self.period.as_nanos() as f64;
                    (p, p / 4.0)
                } else {
                    let mean = self.sum / k;
                    (mean, (self.sum_sq / k - mean * mean).max(0.0).sqrt())
                };
                phi_of((t - mean) / dev.max(min_deviation.as_nanos() as f64).max(1.0))
            }
        }
    }
}

/// Phi for a silence `y` deviations past the mean, by the logistic
/// approximation of the normal distribution Akka uses (error below 1.4e-4
/// over the whole range, and monotone, which the crossing relies on).
fn phi_of(y: f64) -> f64 {
    let e = (-y * (1.5976 + 0.070566 * y * y)).exp();
    if y > 0.0 {
        // 1 - F = e / (1 + e), computed without cancelling.
        -(e / (1.0 + e)).log10()
    } else {
        -(1.0 - 1.0 / (1.0 + e)).log10()
    }
}

/// How many deviations past the mean phi reaches `threshold`: the inverse
/// of [`phi_of`], by bisection (it is monotone).
fn phi_crossing(threshold: f64) -> f64 {
    let (mut lo, mut hi) = (-10.0f64, 40.0f64);
    for _ in 0..80 {
        let mid = (lo + hi) / 2.0;
        if phi_of(mid) < threshold {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    hi
}

/// How late an observer's own turns come: the lateness of its latest turn
/// against the time it meant to run, decaying so that one slow moment is
/// forgiven for a while and then forgotten (Lifeguard raises its local
/// health multiplier on such evidence and lowers it as turns come on time).
#[derive(Debug, Clone, Copy, Default)]
pub struct Lateness {
    current: Duration,
}

impl Lateness {
    /// A turn meant for `due` ran at `now`. What was remembered halves
    /// with each turn, so a slow moment is forgotten within a few turns
    /// once they come on time again.
    pub fn turn(&mut self, due: Instant, now: Instant) {
        self.current = (now - due).max(self.current / 2);
    }

    /// The silence to forgive now.
    pub fn get(&self) -> Duration {
        self.current
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Duration = Duration::from_millis(10);

    fn at(ms: f64) -> Instant {
        Instant::from_nanos((ms * 1e6) as u64)
    }

    #[test]
    fn two_miss_suspects_after_two_periods_and_the_grace() {
        let mut d = Detector::new(DetectorKind::two_miss(T), T, at(0.0));
        d.heartbeat(at(10.0));
        assert!(!d.suspects(at(34.9), Duration::ZERO));
        assert!(d.suspects(at(35.1), Duration::ZERO), "two missed and the grace gone");
        assert!(!d.suspects(at(35.1), Duration::from_millis(1)), "an observer 1 ms late forgives 1 ms");
        d.heartbeat(at(36.0));
        assert!(!d.suspects(at(40.0), Duration::ZERO), "a heartbeat ends the suspicion");
    }

    #[test]
    fn phi_learns_the_jitter_of_its_subject() {
        // Heartbeats every 10 ms, exactly: suspected soon after a miss.
        let mut regular = Detector::new(DetectorKind::phi(T), T, at(0.0));
        for i in 1..=100 {
            regular.heartbeat(at(10.0 * i as f64));
        }
        let quiet = regular.deadline() - at(1000.0);
        assert!(quiet > T && quiet < 2 * T, "a regular subject: {quiet:?}");
        // The same mean with +-5 ms of jitter: more patience.
        let mut jittery = Detector::new(DetectorKind::phi(T), T, at(0.0));
        let mut t = 0.0;
        for i in 0..100 {
            t += if i % 2 == 0 { 5.0 } else { 15.0 };
            jittery.heartbeat(at(t));
        }
        let patient = jittery.deadline() - at(t);
        assert!(patient > quiet + Duration::from_millis(20), "{patient:?} against {quiet:?}");
        // phi rises with silence and crosses its threshold at the deadline.
        let d = regular.deadline();
        assert!(regular.phi(Instant::from_nanos(d.as_nanos() - 1_000_000)) < 8.0);
        assert!(regular.phi(d + Duration::from_millis(1)) >= 8.0);
        assert!(regular.suspects(d + Duration::from_millis(1), Duration::ZERO));
    }

    #[test]
    fn the_logistic_phi_matches_the_normal_tail() {
        // 1 - F(y) for the normal distribution, from tables.
        for (y, tail) in [(0.0, 0.5), (1.0, 0.158_655), (2.0, 0.022_750), (3.0, 0.001_350)] {
            let phi = phi_of(y);
            let want = -f64::log10(tail);
            assert!((phi - want).abs() < 0.05, "y {y}: phi {phi}, want {want}");
        }
        let y8 = phi_crossing(8.0);
        assert!((phi_of(y8) - 8.0).abs() < 1e-6 && y8 > 5.0 && y8 < 6.5, "{y8}");
    }

    #[test]
    fn lateness_is_remembered_then_forgotten() {
        let mut l = Lateness::default();
        l.turn(at(10.0), at(30.0));
        assert_eq!(l.get(), Duration::from_millis(20));
        l.turn(at(40.0), at(40.0));
        assert_eq!(l.get(), Duration::from_millis(10), "halved by a turn on time");
        for i in 0..10 {
            l.turn(at(50.0 + 10.0 * i as f64), at(50.0 + 10.0 * i as f64));
        }
        assert!(l.get() < Duration::from_micros(20), "{:?}", l.get());
    }
}
