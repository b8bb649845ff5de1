//! Adaptive retransmission timeout from measured round-trip times.
//!
//! The estimator of RFC 6298 (smoothed RTT and its variance), clamped to the
//! configured floor and ceiling. Tang and Bilas [TB] (Table 1, Figs. 5-8)
//! found about 1 ms best on their SAN; the floor defaults there. Back-off doubles the
//! timeout on each expiry until an acknowledgement shows progress again.

use core::time::Duration;

/// Integer nanoseconds throughout: `Duration` arithmetic normalises seconds
/// and nanoseconds on every operation, and this runs on every ACK.
#[derive(Debug, Clone)]
pub(crate) struct RttEstimator {
    srtt_ns: Option<u64>,
    rttvar_ns: u64,
    min_ns: u64,
    max_ns: u64,
    initial_ns: u64,
    backoff_shift: u32,
    /// `rto()` as of the last change: read on every deadline computation.
    rto_ns: u64,
}

/// Floor of the variance term, so a perfectly steady RTT still leaves room.
const MIN_VARIANCE_NS: u64 = 100_000;

impl RttEstimator {
    pub fn new(initial: Duration, min: Duration, max: Duration) -> Self {
        let ns = |d: Duration| d.as_nanos().min(u64::MAX as u128) as u64;
        let mut r = RttEstimator {
            srtt_ns: None,
            rttvar_ns: 0,
            min_ns: ns(min),
            max_ns: ns(max),
            initial_ns: ns(initial),
            backoff_shift: 0,
            rto_ns: 0,
        };
        r.update();
        r
    }

    /// srtt + 4 rttvar (the initial timeout before a sample), unclamped.
    pub fn estimate_ns(&self) -> u64 {
        match self.srtt_ns {
            None => self.initial_ns,
            Some(srtt) => srtt + (self.rttvar_ns * 4).max(MIN_VARIANCE_NS),
        }
    }

    fn update(&mut self) {
        self.rto_ns =
            self.estimate_ns().saturating_mul(1 << self.backoff_shift).clamp(self.min_ns, self.max_ns);
    }

    /// Before the first sample the timeout is `initial` (and backs off
    /// from it): a new stream's best guess is what the endpoint's other
    /// streams measure, when that is longer than the configured one.
    pub fn set_initial(&mut self, initial_ns: u64) {
        if self.srtt_ns.is_none() && initial_ns != self.initial_ns {
            self.initial_ns = initial_ns;
            self.update();
        }
    }

    /// Feed one sample. Callers follow Karn's rule: never a sample from a
    /// retransmitted segment, whose ACK is ambiguous.
    pub fn on_sample(&mut self, sample: Duration) {
        let sample = sample.as_nanos().min(u64::MAX as u128 / 8) as u64;
        match self.srtt_ns {
            None => {
                self.srtt_ns = Some(sample);
                self.rttvar_ns = sample / 2;
            }
            Some(srtt) => {
                self.rttvar_ns = (self.rttvar_ns * 3 + srtt.abs_diff(sample)) / 4;
                self.srtt_ns = Some((srtt * 7 + sample) / 8);
            }
        }
        self.update();
    }

    /// An acknowledgement made progress: the path works, stop backing off.
    pub fn on_progress(&mut self) {
        if self.backoff_shift != 0 {
            self.backoff_shift = 0;
            self.update();
        }
    }

    pub fn on_timeout(&mut self) {
        self.backoff_shift = (self.backoff_shift + 1).min(16);
        self.update();
    }

    /// The smoothed RTT in nanoseconds (0 before a sample).
    pub fn smoothed_ns(&self) -> u64 {
        self.srtt_ns.unwrap_or(0)
    }

    pub fn smoothed(&self) -> Option<Duration> {
        self.srtt_ns.map(Duration::from_nanos)
    }

    /// The timeout without back-off: what the estimate alone says.
    pub fn base_rto(&self) -> Duration {
        Duration::from_nanos(self.estimate_ns().clamp(self.min_ns, self.max_ns))
    }

    /// Current timeout, back-off included.
    pub fn rto(&self) -> Duration {
        Duration::from_nanos(self.rto_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn converges_and_clamps() {
        let mut r = RttEstimator::new(5 * MS, MS, 100 * MS);
        assert_eq!(r.rto(), 5 * MS);
        for _ in 0..50 {
            r.on_sample(Duration::from_micros(30));
        }
        // A steady 30 us RTT gives a timeout under the 1 ms floor: clamped.
        assert_eq!(r.rto(), MS);
        for _ in 0..50 {
            r.on_sample(20 * MS);
        }
        assert!(r.rto() >= 20 * MS && r.rto() < 30 * MS, "{:?}", r.rto());
    }

    #[test]
    fn backoff_doubles_until_progress() {
        let mut r = RttEstimator::new(2 * MS, MS, 50 * MS);
        r.on_timeout();
        assert_eq!(r.rto(), 4 * MS);
        r.on_timeout();
        assert_eq!(r.rto(), 8 * MS);
        for _ in 0..10 {
            r.on_timeout();
        }
        assert_eq!(r.rto(), 50 * MS);
        r.on_progress();
        assert_eq!(r.rto(), 2 * MS);
    }

    #[test]
    fn a_new_stream_starts_from_the_guess_it_is_given_until_it_measures() {
        let mut r = RttEstimator::new(2 * MS, MS, 500 * MS);
        r.set_initial(300_000_000);
        assert_eq!(r.rto(), 300 * MS);
        r.on_timeout();
        assert_eq!(r.rto(), 500 * MS, "backs off from it, to the ceiling");
        r.on_progress();
        r.on_sample(10 * MS);
        r.set_initial(400_000_000);
        assert_eq!(r.rto(), Duration::from_nanos(r.estimate_ns()), "a measured stream keeps its own");
        assert!(r.rto() < 50 * MS);
    }
}
