//! The engine's audit of its own state, part of its self-test (Zhou et
//! al. [FTGM] section 4: a network card that goes on running with
//! corrupted state does the most harm, so the card's state is checked as
//! well as its paths). The probes of `selftest` find a path that no longer
//! carries messages; this finds state that no longer makes sense before
//! it is acted on: a sequence number out of line, a window pointer past
//! what was sent, a buffered payload whose bytes changed since they were
//! buffered, an address book whose two maps disagree.
//!
//! Two depths, on two intervals: the bookkeeping of every stream (a pass
//! over the segments) often, and the payloads' digests (a pass over every
//! buffered byte) at the self-test's interval, in slices of `SLICE` bytes
//! a turn: megabytes may wait per peer (`send_buffer_bytes`), and one pass over it at once
//! would hold the loop for milliseconds, past the watchdog's threshold.
//! Between audits a payload is still checked before each transmission and
//! a held segment before it is delivered (the core counts
//! `integrity_faults`), so a corrupted byte is never sent or delivered
//! with a fresh, valid checksum.
//!
//! Audits run at the end of a turn, after the turn's work, and never wake
//! an idle engine: a strike is caught within `QUICK_EVERY` of the engine
//! running again, and the first turn after it may act on it.
//!
//! Each depth takes at most `SHARE` of the engine's time. A bookkeeping
//! pass that took long pushes the next one out (a stream with 64 MiB
//! waiting has tens of thousands of segments, and its pass took 0.4 to
//! 0.9 ms: 4.4% of a 64 KiB stream's time at one every 10 ms). The
//! payload pass is paced: a slice runs only while the pass has taken less
//! than `SHARE` of the time since it began (one pass over 64 MiB took
//! 3.6% of a 2 s stream's time when its slices ran back to back). The bar
//! for all of the engine's checking together is 1%.

use std::time::Duration;

use tether_proto::Instant;

/// How often the streams' bookkeeping is checked.
pub const QUICK_EVERY: Duration = Duration::from_millis(10);

/// Payload bytes checked per turn while a pass is under way (tens of
/// microseconds of CRC32C).
pub const SLICE: usize = 256 << 10;

/// The most of the engine's time each depth of audit takes.
pub const SHARE: f64 = 0.004;

/// When the next audits are due.
#[derive(Debug)]
pub struct AuditClock {
    deep_every: Duration,
    next_quick: Instant,
    next_deep: Instant,
    /// When the payload pass under way began, and the time it took so far.
    deep_began: Instant,
    deep_spent: Duration,
}

/// What is due this turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Due {
    Nothing,
    /// The bookkeeping only.
    Quick,
    /// The bookkeeping, and a pass over every buffered payload begins.
    Deep,
}

impl AuditClock {
    /// Deep audits every `deep_every` (the self-test's interval).
    pub fn new(deep_every: Duration, now: Instant) -> Self {
        AuditClock {
            deep_every,
            next_quick: now + QUICK_EVERY,
            next_deep: now + deep_every,
            deep_began: now,
            deep_spent: Duration::ZERO,
        }
    }

    /// The bookkeeping pass begun at `now` took `took`.
    pub fn quick_took(&mut self, now: Instant, took: Duration) {
        let before = self.next_quick;
        self.next_quick = self.next_quick.max(now + took.div_f64(SHARE));
        assert!(self.next_quick >= before, "a long audit pulled the next one in");
    }

    /// May the payload pass under way take its next slice now?
    pub fn deep_may_run(&self, now: Instant) -> bool {
        let since = Duration::from_nanos(now.saturating_since(self.deep_began).as_nanos() as u64);
        self.deep_spent <= since.mul_f64(SHARE)
    }

    /// A slice of the payload pass took `took`.
    pub fn deep_took(&mut self, took: Duration) {
        let before = self.next_deep;
        self.deep_spent += took;
        self.next_deep = self.next_deep.max(self.deep_began + self.deep_spent.div_f64(SHARE));
        assert!(self.next_deep >= before, "a long payload pass pulled the next one in");
    }

    pub fn due(&mut self, now: Instant) -> Due {
        let due = if now >= self.next_deep {
            self.next_deep = now + self.deep_every;
            self.next_quick = self.next_quick.max(now + QUICK_EVERY);
            (self.deep_began, self.deep_spent) = (now, Duration::ZERO);
            Due::Deep
        } else if now >= self.next_quick {
            self.next_quick = now + QUICK_EVERY;
            Due::Quick
        } else {
            Due::Nothing
        };
        // Whatever is due, the bookkeeping's next pass is later: an audit
        // never runs twice in a turn.
        assert!(self.next_quick > now, "the bookkeeping audit due again at once");
        due
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64) -> Instant {
        Instant::from_nanos(1_000_000_000 + ms * 1_000_000)
    }

    #[test]
    fn a_long_pass_pushes_the_next_one_out_to_its_share() {
        let mut c = AuditClock::new(Duration::from_millis(500), at(0));
        assert_eq!(c.due(at(10)), Due::Quick);
        // A cheap pass keeps the interval.
        c.quick_took(at(10), Duration::from_micros(5));
        assert_eq!(c.due(at(20)), Due::Quick);
        // 1 ms of bookkeeping: the next in 1 ms / SHARE = 250 ms.
        c.quick_took(at(20), Duration::from_millis(1));
        assert_eq!(c.due(at(30)), Due::Nothing);
        assert_eq!(c.due(at(269)), Due::Nothing);
        assert_eq!(c.due(at(270)), Due::Quick);
        // A payload pass of 4 ms in slices: the next deep pass 1 s after
        // this one began, not 500 ms.
        assert_eq!(c.due(at(500)), Due::Deep);
        for _ in 0..4 {
            c.deep_took(Duration::from_millis(1));
        }
        assert_ne!(c.due(at(1499)), Due::Deep);
        assert_eq!(c.due(at(1500)), Due::Deep);
    }

    #[test]
    fn the_payload_pass_takes_its_slices_at_its_share() {
        let mut c = AuditClock::new(Duration::from_millis(500), at(0));
        assert_eq!(c.due(at(500)), Due::Deep);
        assert!(c.deep_may_run(at(500)));
        // A 1 ms slice: the next when the pass has run 1 ms / SHARE.
        c.deep_took(Duration::from_millis(1));
        assert!(!c.deep_may_run(at(500)));
        assert!(!c.deep_may_run(at(749)));
        assert!(c.deep_may_run(at(750)));
    }
}
