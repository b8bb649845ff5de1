//! The NACK-reliable class's guarantees (docs/ARCHITECTURE.md,
//! "NACK-reliable messages"), checked in every streams mix beside the
//! streams and the unreliable class: each node also sends its peers
//! NACK-reliable messages, and
//!
//! * every one delivered is intact, from the node that sent it, one that
//!   was sent, under the number it was sent with;
//! * each receiver gets each sender's messages in increasing order, and
//!   each at most once;
//! * a message its sender reported lost (`NackedFate::Lost`) was never
//!   delivered;
//! * every message of a sender still alive at the end has a fate, unless
//!   its sender's soft state was lost while it was held (the hold is soft
//!   state: `Endpoint::restore` keeps only the numbers).
//!
//! A message names itself as an unreliable one does (`crate::unreliable::
//! message`), its incarnation field tagged so neither class passes for
//! the other.

use std::collections::{BTreeMap, BTreeSet};

use tether_proto::{Nacked, NackedFate, NodeId};

use crate::checker::Violation;

/// Set in the incarnation field of a NACK-reliable message's header.
const TAG: u64 = 0x4e41_434b << 32;

/// Message `seq` from `src` (in `incarnation`) to `dst`, `len` bytes.
pub fn message(src: NodeId, dst: NodeId, incarnation: u64, seq: u64, len: usize) -> Vec<u8> {
    crate::unreliable::message(src, dst, incarnation | TAG, seq, len)
}

/// (sender, its incarnation, receiver, number).
type Key = (NodeId, u64, NodeId, u64);

/// What the NACK-reliable class did in one run.
#[derive(Debug, Default)]
pub struct NackedCheck {
    accepted: BTreeSet<Key>,
    delivered: BTreeSet<Key>,
    /// The last number each receiver took from each sender's life.
    last: BTreeMap<(NodeId, NodeId, u64), u64>,
    lost: BTreeSet<Key>,
    fated: BTreeSet<Key>,
    /// Held when their sender's soft state was lost: no fate is owed.
    excused: BTreeSet<Key>,
    pub sent: u64,
    pub received: u64,
    /// Messages reported lost by their senders.
    pub reported_lost: u64,
}

impl NackedCheck {
    pub fn on_send(&mut self, src: NodeId, incarnation: u64, dst: NodeId, seq: u64) {
        self.accepted.insert((src, incarnation, dst, seq));
        self.sent += 1;
    }

    /// Node `to` took `m`.
    pub fn on_receive(&mut self, to: NodeId, m: &Nacked, violations: &mut Vec<Violation>) {
        self.received += 1;
        let bytes = &m.message[..];
        let Some((src, dst, inc, seq)) = crate::unreliable::header(bytes) else {
            violations.push(Violation::NackedCorrupted { to });
            return;
        };
        if inc & TAG != TAG || crate::unreliable::message(src, dst, inc, seq, bytes.len()) != bytes {
            violations.push(Violation::NackedCorrupted { to });
            return;
        }
        let key = (src, inc & !TAG, dst, seq);
        if src != m.from || dst != to || seq != m.seq || !self.accepted.contains(&key) {
            violations.push(Violation::NackedInvented { from: m.from, to, seq: m.seq });
            return;
        }
        if !self.delivered.insert(key) {
            violations.push(Violation::NackedTwice { from: src, to, seq });
        }
        let last = self.last.entry((to, src, key.1)).or_insert(seq);
        if *last > seq {
            violations.push(Violation::NackedOutOfOrder { from: src, to, seq, after: *last });
        }
        *last = (*last).max(seq);
    }

    /// `src` (in `incarnation`) reported the fate of `[first, end)` to `peer`.
    pub fn on_fate(
        &mut self,
        src: NodeId,
        incarnation: u64,
        peer: NodeId,
        first: u64,
        end: u64,
        fate: NackedFate,
    ) {
        for seq in first..end {
            let key = (src, incarnation, peer, seq);
            self.fated.insert(key);
            if fate == NackedFate::Lost && self.lost.insert(key) {
                self.reported_lost += 1;
            }
        }
    }

    /// `src`'s soft state was lost: what it held gets no fate.
    pub fn on_soft_loss(&mut self, src: NodeId, incarnation: u64) {
        let held: Vec<Key> = self
            .accepted
            .range((src, incarnation, 0, 0)..=(src, incarnation, NodeId::MAX, u64::MAX))
            .filter(|k| !self.fated.contains(k))
            .copied()
            .collect();
        self.excused.extend(held);
    }

    /// At the end: `alive(src, incarnation)` says whether a sender's life
    /// still runs.
    pub fn finish(&self, alive: impl Fn(NodeId, u64) -> bool, violations: &mut Vec<Violation>) {
        for &(src, inc, to, seq) in self.lost.intersection(&self.delivered) {
            violations.push(Violation::NackedLostDelivered { from: src, to, seq, incarnation: inc });
        }
        let unfated = self
            .accepted
            .iter()
            .filter(|k| alive(k.0, k.1) && !self.fated.contains(k) && !self.excused.contains(k))
            .count();
        if unfated > 0 {
            violations.push(Violation::NackedUnfated { messages: unfated as u64 });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn got(from: NodeId, seq: u64, bytes: Vec<u8>) -> Nacked {
        Nacked { from, seq, message: Bytes::from(bytes) }
    }

    #[test]
    fn the_check_catches_what_it_must() {
        let mut c = NackedCheck::default();
        let mut v = Vec::new();
        for seq in 0..4 {
            c.on_send(1, 5, 2, seq);
        }
        c.on_receive(2, &got(1, 1, message(1, 2, 5, 1, 40)), &mut v);
        assert!(v.is_empty(), "{v:?}");
        c.on_receive(2, &got(1, 1, message(1, 2, 5, 1, 40)), &mut v);
        assert_eq!(v.pop(), Some(Violation::NackedTwice { from: 1, to: 2, seq: 1 }));
        c.on_receive(2, &got(1, 0, message(1, 2, 5, 0, 40)), &mut v);
        assert_eq!(v.pop(), Some(Violation::NackedOutOfOrder { from: 1, to: 2, seq: 0, after: 1 }));
        c.on_receive(2, &got(1, 3, message(1, 2, 5, 2, 40)), &mut v);
        assert_eq!(v.pop(), Some(Violation::NackedInvented { from: 1, to: 2, seq: 3 }), "another number");
        c.on_receive(2, &got(1, 2, crate::unreliable::message(1, 2, 5, 2, 40)), &mut v);
        assert_eq!(v.pop(), Some(Violation::NackedCorrupted { to: 2 }), "an unreliable message");
        let mut bad = message(1, 2, 5, 2, 40);
        bad[30] ^= 1;
        c.on_receive(2, &got(1, 2, bad), &mut v);
        assert_eq!(v.pop(), Some(Violation::NackedCorrupted { to: 2 }));
        c.on_fate(1, 5, 2, 0, 2, NackedFate::NeverAskedFor);
        c.on_fate(1, 5, 2, 1, 2, NackedFate::Lost);
        c.finish(|_, _| true, &mut v);
        assert_eq!(
            v,
            [
                Violation::NackedLostDelivered { from: 1, to: 2, seq: 1, incarnation: 5 },
                Violation::NackedUnfated { messages: 2 },
            ]
        );
        v.clear();
        c.on_soft_loss(1, 5);
        c.finish(|_, _| true, &mut v);
        assert_eq!(v.len(), 1, "the held two are excused: {v:?}");
    }
}
