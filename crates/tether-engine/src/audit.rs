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
//! a turn: up to 64 MiB may wait per peer, and one pass over it at once
//! would hold the loop for milliseconds, past the watchdog's threshold.
//! Between audits a payload is still checked before each transmission and
//! a held segment before it is delivered (the core counts
//! `integrity_faults`), so a corrupted byte is never sent or delivered
//! with a fresh, valid checksum.
//!
//! Audits run at the end of a turn, after the turn's work, and never wake
//! an idle engine: a strike is caught within `QUICK_EVERY` of the engine
//! running again, and the first turn after it may act on it.

use std::time::Duration;

use tether_proto::Instant;

/// How often the streams' bookkeeping is checked.
pub const QUICK_EVERY: Duration = Duration::from_millis(10);

/// Payload bytes checked per turn while a pass is under way (tens of
/// microseconds of CRC32C).
pub const SLICE: usize = 256 << 10;

/// When the next audits are due.
#[derive(Debug)]
pub struct AuditClock {
    deep_every: Duration,
    next_quick: Instant,
    next_deep: Instant,
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
        AuditClock { deep_every, next_quick: now + QUICK_EVERY, next_deep: now + deep_every }
    }

    pub fn due(&mut self, now: Instant) -> Due {
        if now >= self.next_deep {
            self.next_deep = now + self.deep_every;
            self.next_quick = now + QUICK_EVERY;
            Due::Deep
        } else if now >= self.next_quick {
            self.next_quick = now + QUICK_EVERY;
            Due::Quick
        } else {
            Due::Nothing
        }
    }
}
