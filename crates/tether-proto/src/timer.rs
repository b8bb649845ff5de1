//! A peer's timers, by name: one deadline per kind, and the earliest of
//! them is the peer's next timeout.
//!
//! Tang and Bilas [TB] section 4.1 keep one retransmission timer per node,
//! not one per packet; a peer here has a fixed, small table of named
//! timers instead (quinn-proto's `TimerTable`), each set from the state it
//! guards after every operation on the peer. The endpoint keeps only the
//! earliest deadline over all peers.

use crate::Instant;

/// The timers one peer runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Timer {
    /// The retransmission timeout of the send stream.
    Retransmit,
    /// Time-based loss detection waits on a segment sent before one
    /// delivered (RACK's reorder timer, `loss`).
    Reorder,
    /// An ACK owed to the peer may wait no longer for data to ride on.
    DelayedAck,
    /// Small messages waiting to share a datagram must go.
    Coalesce,
    /// A path that asked for an answer and got none is judged (suspect or
    /// down, on evidence that the silence is its own), or asks again, or
    /// has the other paths asked.
    PathSilence,
    /// A path is due a probe (suspect, down, or idle).
    Probe,
    /// No acknowledged progress for `abandon_after`: give up on the peer.
    Abandon,
    /// Our HELLO is due again: the handshake is not complete.
    Handshake,
    /// The NACK-reliable class: a STATE or a NACK due, a message leaving
    /// the hold (`crate::nacked`).
    Nacked,
}

impl Timer {
    /// Every timer, in table order.
    pub const ALL: [Timer; 9] = [
        Timer::Retransmit,
        Timer::Reorder,
        Timer::DelayedAck,
        Timer::Coalesce,
        Timer::PathSilence,
        Timer::Probe,
        Timer::Abandon,
        Timer::Handshake,
        Timer::Nacked,
    ];
}

/// One deadline per [`Timer`], and the earliest of them, kept as plain
/// nanoseconds (`u64::MAX`: not running) so that setting the whole table
/// after every operation costs a handful of compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TimerTable {
    deadlines: [u64; Timer::ALL.len()],
    next: u64,
}

const OFF: u64 = u64::MAX;

impl Default for TimerTable {
    fn default() -> Self {
        TimerTable { deadlines: [OFF; Timer::ALL.len()], next: OFF }
    }
}

fn raw(at: Option<Instant>) -> u64 {
    // An instant at the very end of time is as good as never.
    at.map_or(OFF, Instant::as_nanos)
}

fn instant(ns: u64) -> Option<Instant> {
    (ns != OFF).then(|| Instant::from_nanos(ns))
}

impl TimerTable {
    /// Set every timer at once, in `Timer::ALL` order.
    pub fn set_all(&mut self, deadlines: [Option<Instant>; Timer::ALL.len()]) {
        let mut next = OFF;
        for (slot, at) in self.deadlines.iter_mut().zip(deadlines) {
            *slot = raw(at);
            next = next.min(*slot);
        }
        self.next = next;
    }

    /// Set one timer, the others as they are.
    pub fn set(&mut self, timer: Timer, at: Option<Instant>) {
        let mut all = Timer::ALL.map(|t| self.get(t));
        all[timer as usize] = at;
        self.set_all(all);
    }

    pub fn get(&self, timer: Timer) -> Option<Instant> {
        instant(self.deadlines[timer as usize])
    }

    /// When the earliest running timer expires.
    pub fn next(&self) -> Option<Instant> {
        instant(self.next)
    }

    /// Has `timer` expired by `now`?
    pub fn expired(&self, timer: Timer, now: Instant) -> bool {
        let at = self.deadlines[timer as usize];
        at != OFF && at <= now.as_nanos()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_earliest_running_timer_is_next() {
        let mut t = TimerTable::default();
        assert_eq!(t.next(), None);
        t.set(Timer::Abandon, Some(Instant::from_nanos(50)));
        t.set(Timer::DelayedAck, Some(Instant::from_nanos(20)));
        assert_eq!(t.next(), Some(Instant::from_nanos(20)));
        t.set(Timer::DelayedAck, None);
        assert_eq!(t.next(), Some(Instant::from_nanos(50)));
        assert_eq!(t.get(Timer::Abandon), Some(Instant::from_nanos(50)));
        assert!(t.expired(Timer::Abandon, Instant::from_nanos(50)));
        assert!(!t.expired(Timer::Retransmit, Instant::from_nanos(u64::MAX)));
    }
}
