//! The guarantees of docs/ARCHITECTURE.md, checked against what the simulated
//! applications saw. Per stream (one sender incarnation to one receiver):
//! every delivered message has its exact bytes, deliveries are in send
//! order and never repeated, and at the end every message is delivered or
//! reported failed, never neither; a message reported certainly undelivered
//! was never delivered; what the sender's `message_state` says matches.

use std::collections::BTreeMap;

use rand::{Rng, RngCore};
use rand_pcg::Pcg64Mcg;
use serde::Serialize;
use tether_proto::{FailedMessages, MessageState, NodeId};

/// A stream: sender node, sender incarnation, receiver node.
pub type StreamKey = (NodeId, u64, NodeId);

/// Bytes a message carries before its pattern: sequence number and incarnation.
pub const MESSAGE_HEADER: usize = 16;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum Violation {
    Corrupted {
        stream: StreamKey,
        seq: u64,
    },
    Unknown {
        to: NodeId,
        why: &'static str,
    },
    Duplicate {
        stream: StreamKey,
        seq: u64,
    },
    OutOfOrder {
        stream: StreamKey,
        seq: u64,
        after: u64,
    },
    DeliveredButCertainlyFailed {
        stream: StreamKey,
        seq: u64,
    },
    /// Neither delivered nor reported failed at the end.
    Lost {
        stream: StreamKey,
        seq: u64,
    },
    StateMismatch {
        stream: StreamKey,
        seq: u64,
        state: String,
    },
    NotConverged {
        pending: u64,
    },
    Panicked {
        message: String,
    },
    /// A call's handler took effect more than once (calls mixes: `client`
    /// is the caller's life, `seq` its count of calls to the server).
    CallRanTwice {
        client: u64,
        seq: u64,
        times: u32,
    },
    /// A call's final state says something false about its handler
    /// (that it ran when it did not, or the reverse).
    CallStateFalse {
        client: u64,
        seq: u64,
        state: String,
        ran: u32,
    },
    /// A call that never reached a final state.
    CallUnfinished {
        client: u64,
        seq: u64,
        state: String,
    },
    /// An unreliable message arrived changed (`crate::unreliable`).
    UnreliableCorrupted {
        to: NodeId,
    },
    /// An unreliable message arrived that its sender never sent, or from
    /// another node than it names.
    UnreliableInvented {
        from: NodeId,
        to: NodeId,
    },
    /// An unreliable message arrived twice under a cluster key.
    UnreliableTwice {
        from: NodeId,
        to: NodeId,
        n: u64,
    },
    /// The cores put more unreliable messages in datagrams than they
    /// accepted: one was sent again.
    UnreliableResent {
        sent: u64,
        accepted: u64,
    },
    /// A NACK-reliable message arrived changed (`crate::nacked`).
    NackedCorrupted {
        to: NodeId,
    },
    /// A NACK-reliable message arrived that was never sent, from another
    /// node than it names, or under another number than it was sent with.
    NackedInvented {
        from: NodeId,
        to: NodeId,
        seq: u64,
    },
    /// A NACK-reliable message delivered twice.
    NackedTwice {
        from: NodeId,
        to: NodeId,
        seq: u64,
    },
    /// A NACK-reliable message delivered after a later one of its sender.
    NackedOutOfOrder {
        from: NodeId,
        to: NodeId,
        seq: u64,
        after: u64,
    },
    /// A NACK-reliable message its sender reported lost was delivered.
    NackedLostDelivered {
        from: NodeId,
        to: NodeId,
        seq: u64,
        incarnation: u64,
    },
    /// NACK-reliable messages of a live sender that never got a fate.
    NackedUnfated {
        messages: u64,
    },
    /// A member neither crashed nor cut off left the view (`crate::membership`).
    FalseRemoval {
        node: NodeId,
        epoch: u64,
    },
    /// A crashed member still in the last view.
    CrashUndetected {
        node: NodeId,
    },
    /// Replicas or members disagree on the views, or a live member ended
    /// outside the last one.
    MembershipDiverged {
        what: String,
    },
}

#[derive(Debug, Default)]
struct Stream {
    /// (length, content hash) by message number.
    sent: Vec<(usize, u64)>,
    delivered: Vec<bool>,
    last_delivered: Option<u64>,
    failed: Vec<FailedMessages>,
    /// Messages still pending when their sender crashed: gone with it.
    lost_in_crash: Vec<u64>,
}

#[derive(Debug, Default)]
pub struct Checker {
    streams: BTreeMap<StreamKey, Stream>,
    pub violations: Vec<Violation>,
    pub in_doubt_delivered: u64,
    pub delivered: u64,
    pub failed: u64,
    pub lost_in_crash: u64,
    /// Messages in a receiver's delivery queue when it crashed.
    pub unread_at_crash: u64,
}

/// FNV-1a: a content fingerprint, so the checker need not keep the bytes.
pub fn fingerprint(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3))
}

impl Checker {
    pub fn on_send(&mut self, key: StreamKey, seq: u64, bytes: &[u8]) {
        let s = self.streams.entry(key).or_default();
        assert_eq!(s.sent.len() as u64, seq, "the simulator records every send in order");
        s.sent.push((bytes.len(), fingerprint(bytes)));
        s.delivered.push(false);
    }

    /// `to` received `bytes` from `from`.
    pub fn on_deliver(&mut self, from: NodeId, to: NodeId, bytes: &[u8]) {
        if self.take(from, to, bytes) {
            self.delivered += 1;
        }
    }

    /// The receiving application crashed with this message delivered to
    /// its queue (acknowledged: the commit point) and not yet read. It
    /// counts as delivered, exactly once, in order, like any other; the
    /// application that died with it is the application's own loss.
    pub fn on_unread_at_crash(&mut self, from: NodeId, to: NodeId, bytes: &[u8]) {
        if self.take(from, to, bytes) {
            self.unread_at_crash += 1;
        }
    }

    /// Check one message handed to an application; true if it was new.
    fn take(&mut self, from: NodeId, to: NodeId, bytes: &[u8]) -> bool {
        let Some(head) = bytes.get(..MESSAGE_HEADER) else {
            self.violations.push(Violation::Unknown { to, why: "shorter than the message header" });
            return false;
        };
        let seq = u64::from_le_bytes(head[..8].try_into().expect("8 bytes"));
        let inc = u64::from_le_bytes(head[8..16].try_into().expect("8 bytes"));
        let key = (from, inc, to);
        let Some(s) = self.streams.get_mut(&key) else {
            self.violations.push(Violation::Unknown { to, why: "no such stream" });
            return false;
        };
        let Some(&(len, hash)) = s.sent.get(seq as usize) else {
            self.violations.push(Violation::Unknown { to, why: "sequence number never sent" });
            return false;
        };
        if len != bytes.len() || hash != fingerprint(bytes) {
            self.violations.push(Violation::Corrupted { stream: key, seq });
        }
        if s.delivered[seq as usize] {
            self.violations.push(Violation::Duplicate { stream: key, seq });
            return false;
        }
        if let Some(after) = s.last_delivered.filter(|&l| seq < l) {
            self.violations.push(Violation::OutOfOrder { stream: key, seq, after });
        }
        s.delivered[seq as usize] = true;
        s.last_delivered = Some(seq);
        true
    }

    pub fn on_failed(&mut self, sender: NodeId, sender_inc: u64, failed: FailedMessages) {
        let s = self.streams.entry((sender, sender_inc, failed.peer)).or_default();
        self.failed += failed.len();
        s.failed.push(failed);
    }

    /// The sender crashed: what it had not settled is gone with it.
    pub fn on_crash(&mut self, key: StreamKey, pending: impl Iterator<Item = u64>) {
        if let Some(s) = self.streams.get_mut(&key) {
            s.lost_in_crash.extend(pending);
        }
    }

    /// Final checks. `state` answers `message_state` for streams whose
    /// sender is still alive (None for a crashed incarnation).
    pub fn finish(&mut self, state: impl Fn(StreamKey, u64) -> Option<MessageState>) {
        for (&key, s) in &self.streams {
            for seq in 0..s.sent.len() as u64 {
                let delivered = s.delivered[seq as usize];
                let failed = s.failed.iter().find(|f| f.contains(seq));
                let crashed = s.lost_in_crash.contains(&seq);
                match (delivered, failed) {
                    (true, Some(f)) if seq >= f.in_doubt_end => {
                        self.violations.push(Violation::DeliveredButCertainlyFailed { stream: key, seq })
                    }
                    (true, Some(_)) => self.in_doubt_delivered += 1,
                    (false, None) if crashed => self.lost_in_crash += 1,
                    (false, None) => self.violations.push(Violation::Lost { stream: key, seq }),
                    _ => {}
                }
                let Some(st) = state(key, seq) else { continue };
                let consistent = match st {
                    MessageState::Delivered => delivered && failed.is_none(),
                    MessageState::Failed(_) => failed.is_some(),
                    // Forgotten by the bounded history: nothing to compare.
                    MessageState::Unknown => true,
                    MessageState::Pending => false,
                };
                if !consistent {
                    self.violations.push(Violation::StateMismatch {
                        stream: key,
                        seq,
                        state: format!("{st:?}"),
                    });
                }
            }
        }
    }

    pub fn sent(&self) -> u64 {
        self.streams.values().map(|s| s.sent.len() as u64).sum()
    }
}

/// A workload message: sequence number and sender incarnation, then bytes
/// from the run's RNG; sizes mostly small, some multi-fragment, a few large.
pub(crate) fn message(rng: &mut Pcg64Mcg, seq: u64, incarnation: u64) -> Vec<u8> {
    let len = match rng.gen_range(0..100) {
        0..=69 => rng.gen_range(MESSAGE_HEADER..=256),
        70..=94 => rng.gen_range(1024..=8192),
        _ => rng.gen_range(20_000..=100_000),
    };
    let mut m = vec![0u8; len];
    m[..8].copy_from_slice(&seq.to_le_bytes());
    m[8..16].copy_from_slice(&incarnation.to_le_bytes());
    rng.fill_bytes(&mut m[MESSAGE_HEADER..]);
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(seq: u64, inc: u64, fill: u8) -> Vec<u8> {
        let mut m = seq.to_le_bytes().to_vec();
        m.extend_from_slice(&inc.to_le_bytes());
        m.extend_from_slice(&[fill; 10]);
        m
    }

    fn sent_three() -> Checker {
        let mut c = Checker::default();
        for seq in 0..3 {
            c.on_send((1, 7, 2), seq, &msg(seq, 7, seq as u8));
        }
        c
    }

    #[test]
    fn clean_run_passes() {
        let mut c = sent_three();
        for seq in 0..3 {
            c.on_deliver(1, 2, &msg(seq, 7, seq as u8));
        }
        c.finish(|_, _| Some(MessageState::Delivered));
        assert!(c.violations.is_empty(), "{:?}", c.violations);
    }

    /// A stream's receiver is a node, whatever its incarnation: a message
    /// its old life took and its new life takes again is a duplicate (the
    /// `restart_ack_loss` mix relies on it).
    #[test]
    fn a_message_taken_by_two_lives_of_a_receiver_is_a_duplicate() {
        let mut c = sent_three();
        c.on_deliver(1, 2, &msg(0, 7, 0));
        // Node 2 restarts; the same message reaches its new incarnation.
        c.on_unread_at_crash(1, 2, &msg(1, 7, 1));
        c.on_deliver(1, 2, &msg(1, 7, 1));
        assert_eq!(c.violations, [Violation::Duplicate { stream: (1, 7, 2), seq: 1 }]);
    }

    #[test]
    fn catches_duplicate_corruption_reordering_and_loss() {
        let mut c = sent_three();
        c.on_deliver(1, 2, &msg(1, 7, 1));
        c.on_deliver(1, 2, &msg(1, 7, 1));
        c.on_deliver(1, 2, &msg(0, 7, 9));
        c.finish(|_, _| None);
        let kinds: Vec<_> =
            c.violations.iter().map(|v| format!("{v:?}").split(' ').next().unwrap().to_string()).collect();
        assert_eq!(kinds, ["Duplicate", "Corrupted", "OutOfOrder", "Lost"], "{:?}", c.violations);
    }

    #[test]
    fn failure_reports_are_held_to_their_word() {
        let mut c = sent_three();
        c.on_deliver(1, 2, &msg(0, 7, 0));
        c.on_deliver(1, 2, &msg(2, 7, 2));
        // 1 and 2 failed, 1 in doubt, 2 certainly not delivered - yet 2 was.
        c.on_failed(1, 7, FailedMessages { peer: 2, first: 1, end: 3, in_doubt_end: 2 });
        c.finish(|_, seq| Some(if seq == 0 { MessageState::Delivered } else { MessageState::Pending }));
        assert!(c.violations.contains(&Violation::DeliveredButCertainlyFailed { stream: (1, 7, 2), seq: 2 }));
        assert!(c.violations.iter().any(|v| matches!(v, Violation::StateMismatch { seq: 1, .. })));
    }
}
