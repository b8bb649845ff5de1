//! Adaptive retransmission timeout from measured round-trip times.
//!
//! The estimator of RFC 6298 (smoothed RTT and its variance), clamped to the
//! configured floor and ceiling. seeds/001 (Table 1, Figs. 4-8) found about
//! 1 ms best on its SAN; the floor defaults there. Back-off doubles the
//! timeout on each expiry until an acknowledgement shows progress again.

use core::time::Duration;

#[derive(Debug, Clone)]
pub(crate) struct RttEstimator {
    srtt: Option<Duration>,
    rttvar: Duration,
    min: Duration,
    max: Duration,
    initial: Duration,
    backoff_shift: u32,
}

impl RttEstimator {
    pub fn new(initial: Duration, min: Duration, max: Duration) -> Self {
        RttEstimator { srtt: None, rttvar: Duration::ZERO, min, max, initial, backoff_shift: 0 }
    }

    /// Feed one sample. Callers follow Karn's rule: never a sample from a
    /// retransmitted segment, whose ACK is ambiguous.
    pub fn on_sample(&mut self, sample: Duration) {
        match self.srtt {
            None => {
                self.srtt = Some(sample);
                self.rttvar = sample / 2;
            }
            Some(srtt) => {
                let err = srtt.abs_diff(sample);
                self.rttvar = (self.rttvar * 3 + err) / 4;
                self.srtt = Some((srtt * 7 + sample) / 8);
            }
        }
    }

    /// An acknowledgement made progress: the path works, stop backing off.
    pub fn on_progress(&mut self) {
        self.backoff_shift = 0;
    }

    pub fn on_timeout(&mut self) {
        self.backoff_shift = (self.backoff_shift + 1).min(16);
    }

    pub fn smoothed(&self) -> Option<Duration> {
        self.srtt
    }

    /// Current timeout, back-off included.
    pub fn rto(&self) -> Duration {
        let base = match self.srtt {
            None => self.initial,
            Some(srtt) => srtt + (self.rttvar * 4).max(Duration::from_micros(100)),
        };
        let backed = base.saturating_mul(1 << self.backoff_shift);
        backed.clamp(self.min, self.max)
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
}
