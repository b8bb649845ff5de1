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
    /// An ACK owed to the peer may wait no longer for data to ride on.
    DelayedAck,
    /// Small messages waiting to share a datagram must go.
    Coalesce,
    /// A path that asked for an answer turns suspect or down if none came.
    PathSilence,
    /// A path is due a probe (suspect, down, or idle).
    Probe,
    /// No acknowledged progress for `abandon_after`: give up on the peer.
    Abandon,
}

impl Timer {
    /// Every timer, in table order.
    pub const ALL: [Timer; 6] = [
        Timer::Retransmit,
        Timer::DelayedAck,
        Timer::Coalesce,
        Timer::PathSilence,
        Timer::Probe,
        Timer::Abandon,
    ];
}

/// One deadline per [`Timer`]; `None` when the timer is not running.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct TimerTable {
    deadlines: [Option<Instant>; Timer::ALL.len()],
}

impl TimerTable {
    pub fn set(&mut self, timer: Timer, at: Option<Instant>) {
        self.deadlines[timer as usize] = at;
    }

    pub fn get(&self, timer: Timer) -> Option<Instant> {
        self.deadlines[timer as usize]
    }

    /// The earliest running timer and when it expires.
    pub fn next(&self) -> Option<(Timer, Instant)> {
        Timer::ALL.iter().filter_map(|&t| self.get(t).map(|at| (t, at))).min_by_key(|&(_, at)| at)
    }

    /// Has `timer` expired by `now`?
    pub fn expired(&self, timer: Timer, now: Instant) -> bool {
        self.get(timer).is_some_and(|at| at <= now)
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
        assert_eq!(t.next(), Some((Timer::DelayedAck, Instant::from_nanos(20))));
        t.set(Timer::DelayedAck, None);
        assert_eq!(t.next(), Some((Timer::Abandon, Instant::from_nanos(50))));
        assert!(t.expired(Timer::Abandon, Instant::from_nanos(50)));
        assert!(!t.expired(Timer::Retransmit, Instant::from_nanos(u64::MAX)));
    }
}
