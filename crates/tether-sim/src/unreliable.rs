//! The unreliable class's guarantees (docs/ARCHITECTURE.md, "Unreliable
//! messages"), checked in every streams mix beside the streams': each
//! node also sends its peers unreliable messages, and every one that
//! arrives must be intact, from the node that sent it, one that was sent,
//! and, under a cluster key, arrive at most once; no message may be put in
//! a datagram twice (the core's `unreliable_sent` never exceeds the
//! messages it accepted).
//!
//! A message names itself: sender, receiver, sender incarnation and number,
//! then bytes derived from those, so the checker keeps no copy.

use std::collections::BTreeSet;

use tether_proto::NodeId;

use crate::checker::Violation;

/// Bytes of a message before its pattern.
const HEADER: usize = 24;

/// The `n`-th unreliable message from `src` (in `incarnation`) to `dst`,
/// `len` bytes (at least the header).
pub fn message(src: NodeId, dst: NodeId, incarnation: u64, n: u64, len: usize) -> Vec<u8> {
    let mut m = Vec::with_capacity(len.max(HEADER));
    m.extend_from_slice(&src.to_le_bytes());
    m.extend_from_slice(&dst.to_le_bytes());
    m.extend_from_slice(&incarnation.to_le_bytes());
    m.extend_from_slice(&n.to_le_bytes());
    let seed = crate::checker::fingerprint(&m);
    m.extend((0..len.saturating_sub(HEADER)).map(|i| (seed.rotate_left(i as u32 % 64) ^ i as u64) as u8));
    m
}

/// The (sender, receiver, incarnation, number) a message names, if it is
/// long enough to name them.
pub fn header(bytes: &[u8]) -> Option<(NodeId, NodeId, u64, u64)> {
    let field = |at: usize, n: usize| {
        bytes.get(at..at + n).map(|b| b.iter().rev().fold(0u64, |v, &x| v << 8 | x as u64))
    };
    Some((field(0, 4)? as NodeId, field(4, 4)? as NodeId, field(8, 8)?, field(16, 8)?))
}

/// What the unreliable class did in one run.
#[derive(Debug, Default)]
pub struct UnreliableCheck {
    /// Messages each sender's core accepted, by (sender, incarnation, receiver).
    accepted: BTreeSet<(NodeId, u64, NodeId, u64)>,
    seen: BTreeSet<(NodeId, u64, NodeId, u64)>,
    /// Messages the cores accepted, and those that arrived.
    pub sent: u64,
    pub received: u64,
}

impl UnreliableCheck {
    /// The core of `src` accepted message `n` to `dst`.
    pub fn on_send(&mut self, src: NodeId, incarnation: u64, dst: NodeId, n: u64) {
        self.accepted.insert((src, incarnation, dst, n));
        self.sent += 1;
    }

    /// `to` received `bytes` said to be from `from`; `once`: a copy may
    /// not arrive twice (a cluster key is in use).
    pub fn on_receive(
        &mut self,
        from: NodeId,
        to: NodeId,
        bytes: &[u8],
        once: bool,
        violations: &mut Vec<Violation>,
    ) {
        self.received += 1;
        let Some((src, dst, inc, n)) = header(bytes) else {
            violations.push(Violation::UnreliableCorrupted { to });
            return;
        };
        if message(src, dst, inc, n, bytes.len()) != bytes {
            violations.push(Violation::UnreliableCorrupted { to });
            return;
        }
        let key = (src, inc, dst, n);
        if src != from || dst != to || !self.accepted.contains(&key) {
            violations.push(Violation::UnreliableInvented { from, to });
            return;
        }
        if !self.seen.insert(key) && once {
            violations.push(Violation::UnreliableTwice { from, to, n });
        }
    }

    /// At the end: the cores put `put_in_datagrams` messages in datagrams.
    pub fn finish(&self, put_in_datagrams: u64, violations: &mut Vec<Violation>) {
        if put_in_datagrams > self.sent {
            violations.push(Violation::UnreliableResent { sent: put_in_datagrams, accepted: self.sent });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_check_catches_what_it_must() {
        let mut c = UnreliableCheck::default();
        let mut v = Vec::new();
        c.on_send(1, 5, 2, 0);
        let m = message(1, 2, 5, 0, 60);
        c.on_receive(1, 2, &m, true, &mut v);
        assert!(v.is_empty());
        c.on_receive(1, 2, &m, false, &mut v);
        assert!(v.is_empty(), "a copy, where copies may come");
        c.on_receive(1, 2, &m, true, &mut v);
        assert_eq!(v.pop(), Some(Violation::UnreliableTwice { from: 1, to: 2, n: 0 }));
        let mut bad = m.clone();
        bad[40] ^= 1;
        c.on_receive(1, 2, &bad, true, &mut v);
        assert_eq!(v.pop(), Some(Violation::UnreliableCorrupted { to: 2 }));
        c.on_receive(3, 2, &m, true, &mut v);
        assert_eq!(v.pop(), Some(Violation::UnreliableInvented { from: 3, to: 2 }));
        c.on_receive(1, 2, &message(1, 2, 5, 9, 30), true, &mut v);
        assert_eq!(v.pop(), Some(Violation::UnreliableInvented { from: 1, to: 2 }), "never sent");
        c.finish(2, &mut v);
        assert_eq!(v.pop(), Some(Violation::UnreliableResent { sent: 2, accepted: 1 }));
    }
}
