//! How many handshakes an endpoint has under way at once: the others wait
//! their turn, as new data waits for the endpoint's window (`aggregate`).
//!
//! A job's start has every node greet every other: in a 256-node demo on
//! one machine, 65,280 handshakes began in the same few milliseconds, each
//! a HELLO padded to a full datagram and retried, doubling, from the 5 ms
//! `rto_initial` before any round trip was known. The sockets' queues
//! overflowed, the lost HELLOs were retried, and the retries were lost in
//! turn: 296,219 HELLOs in the first 3.8 s, 1.7 million in all, and the
//! run never finished. The handshake is what TCP's SYN is, and an endpoint
//! that begins them all at once is a SYN flood of its own making.
//!
//! So at most [`MAX_GREETINGS`] of an endpoint's handshakes count as under
//! way; a peer that wants a session beyond that waits in a queue, oldest
//! first, and begins when one ends (completed, given up, or past its first
//! [`GREETING_ROUNDS`] rounds of HELLOs). The last rule keeps dead peers
//! from holding every place: a handshake that long unanswered goes on, at
//! its backed-off rate, outside the count. A peer that waits loses little:
//! a handshake the other side begins (its HELLO answered, its CONFIRM
//! checked) gives it the session too, without a HELLO of its own. Nor is
//! it given up for the wait: its patience clock (`Config::abandon_after`)
//! stands still in the queue and starts with its first HELLO.
//!
//! With the bound, the same demo made 84,033 HELLOs for its 65,280
//! handshakes, 65,208 of them done within 9.4 s.

use std::collections::VecDeque;

use crate::NodeId;

/// Handshakes an endpoint has under way at once, at most. Every node of
/// a 256-node job then has about as many HELLOs arriving as it sent, not
/// 255 at once; a cluster of up to 33 nodes never waits.
pub const MAX_GREETINGS: usize = 32;

/// Rounds of HELLOs (the first, and each retry) a handshake is counted
/// for: past these it gives its place up and goes on outside the count.
pub const GREETING_ROUNDS: u32 = 4;

/// The count and the queue.
#[derive(Debug, Default)]
pub(crate) struct Greetings {
    /// Handshakes under way and counted.
    pub under_way: usize,
    /// Peers waiting for a place, oldest first; each at most once (the
    /// peer's `Queued` flag), so never more than `MAX_PEERS`.
    waiting: VecDeque<NodeId>,
}

/// A peer's place in the queue (kept in the peer, so joining is a flag
/// test and a push).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Queued(bool);

impl Greetings {
    /// Is there a place for one more handshake?
    pub fn has_room(&self) -> bool {
        self.under_way < MAX_GREETINGS
    }

    /// May a handshake begin now, ahead of none waiting longer?
    pub fn admits_newcomer(&self) -> bool {
        self.has_room() && self.waiting.is_empty()
    }

    /// Peer `id` waits for a place.
    pub fn queue(&mut self, id: NodeId, queued: &mut Queued) {
        if !queued.0 {
            queued.0 = true;
            self.waiting.push_back(id);
        }
    }

    /// The next peer to take a place, while there is one: the caller lets
    /// it begin if it still waits (`queued` is its flag, cleared).
    pub fn next(&mut self) -> Option<NodeId> {
        if !self.has_room() {
            return None;
        }
        self.waiting.pop_front()
    }

    /// A peer's handshake was counted `before` an operation and is `after`.
    pub fn update(&mut self, before: bool, after: bool) {
        match (before, after) {
            (false, true) => self.under_way += 1,
            (true, false) => self.under_way -= 1,
            _ => {}
        }
    }

    #[cfg(test)]
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }
}

impl Queued {
    pub fn take(&mut self) -> bool {
        core::mem::take(&mut self.0)
    }

    pub fn is_queued(&self) -> bool {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_are_counted_and_the_queue_is_first_come_first_served() {
        let mut g = Greetings::default();
        for _ in 0..MAX_GREETINGS {
            assert!(g.has_room());
            g.update(false, true);
        }
        assert!(!g.has_room());
        let mut flags = [Queued::default(); 3];
        for (id, q) in flags.iter_mut().enumerate() {
            g.queue(id as NodeId, q);
            g.queue(id as NodeId, q); // once only
        }
        assert_eq!(g.waiting(), 3);
        assert_eq!(g.next(), None, "no place yet");
        g.update(true, false);
        assert_eq!(g.next(), Some(0));
        assert!(flags[0].take());
        g.update(false, true);
        assert_eq!(g.next(), None);
        g.update(true, true); // counted before and after: no change
        g.update(true, false);
        g.update(true, false);
        assert_eq!((g.next(), g.next(), g.next()), (Some(1), Some(2), None));
    }
}
