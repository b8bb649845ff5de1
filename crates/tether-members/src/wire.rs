//! The membership protocol's messages (docs/CLUSTER.md): each one the
//! payload of an unreliable message on the membership port, so it is
//! authenticated and its source validated by the session it rides in; a
//! sender's identity is the session's, never a field here. Integers are
//! little-endian; the first byte is the kind.
//!
//! | kind | message | after the kind |
//! |---:|---|---|
//! | 0 | HEARTBEAT | incarnation u64, epoch u64, seq u64 |
//! | 1 | PROBE | nonce u64 |
//! | 2 | PROBE_ACK | nonce u64, incarnation u64 |
//! | 3 | ALERT | subject u32, incarnation u64, epoch u64 |
//! | 4 | ALERT_ACK | subject u32, epoch u64 |
//! | 5 | JOIN | incarnation u64 |
//! | 6 | VIEW_CHANGE | epoch u64, node u32, value u64, change u8 |
//! | 7 | VIEW_PULL | have u64 |
//! | 8 | GROUP | group u32, join u8 |
//!
//! A VIEW_CHANGE's `change` says what `node` did and what `value` is: 0
//! left the cluster (value 0), 1 joined it (value: its incarnation), 2
//! joined group `value`, 3 left group `value`.

use tether_proto::NodeId;

pub use crate::group_wire::GroupId;

const HEARTBEAT: u8 = 0;
const PROBE: u8 = 1;
const PROBE_ACK: u8 = 2;
const ALERT: u8 = 3;
const ALERT_ACK: u8 = 4;
const JOIN: u8 = 5;
const VIEW_CHANGE: u8 = 6;
const VIEW_PULL: u8 = 7;
const GROUP: u8 = 8;

/// The longest message: a HEARTBEAT.
pub const MAX_LEN: usize = 25;

/// A membership message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Msg {
    /// "I am alive": the sender's incarnation, the epoch of the view it
    /// holds (a receiver behind it learns a newer view exists), and a
    /// number that grows by one a heartbeat.
    Heartbeat { incarnation: u64, epoch: u64, seq: u64 },
    /// "Are you alive?", from an observer that suspects the receiver.
    Probe { nonce: u64 },
    /// "I am": the answer to a probe, refuting the suspicion.
    ProbeAck { nonce: u64, incarnation: u64 },
    /// To a manager: the sender observes `subject` (in `incarnation`),
    /// suspected it, probed it, and got no answer, in view `epoch`.
    Alert { subject: NodeId, incarnation: u64, epoch: u64 },
    /// From a manager: the alert about `subject` in `epoch` is recorded.
    AlertAck { subject: NodeId, epoch: u64 },
    /// To the managers: the sender asks to be a member in `incarnation`.
    Join { incarnation: u64 },
    /// From a manager: the change that made view `epoch` from the one
    /// before.
    ViewChange(ViewChange),
    /// To a manager: the sender holds view `have`; it asks for the changes
    /// after it.
    ViewPull { have: u64 },
    /// To the managers: the sender asks to join (or leave) `group`.
    Group { group: GroupId, join: bool },
}

/// One change of the view, making view `epoch`: what `node` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ViewChange {
    pub epoch: u64,
    pub node: NodeId,
    pub change: Change,
}

/// What a member did to make a view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Joined the cluster in this incarnation (or came back in a later one,
    /// leaving its groups).
    Joined(u64),
    /// Left the cluster (or was removed), and its groups with it.
    Left,
    /// Joined a group.
    JoinedGroup(GroupId),
    /// Left a group.
    LeftGroup(GroupId),
    /// Became a manager replica: the leader added it to the Raft group in
    /// place of one that failed (docs/CLUSTER.md, "Replacing a replica").
    ReplicaAdded,
    /// Stopped being a manager replica: the leader removed it from the
    /// Raft group.
    ReplicaRemoved,
}

/// Why a message did not parse.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum MsgError {
    /// No bytes.
    #[error("empty message")]
    Empty,
    /// A kind this version does not know.
    #[error("unknown kind {0}")]
    UnknownKind(u8),
    /// Shorter or longer than its kind.
    #[error("a kind {kind} message of {len} bytes")]
    BadLength { kind: u8, len: usize },
    /// A field with a value no sender writes.
    #[error("a bad {0}")]
    BadField(&'static str),
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("eight bytes"))
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("four bytes"))
}

impl Msg {
    /// Parse one message; its length must be exactly its kind's.
    pub fn parse(b: &[u8]) -> Result<Msg, MsgError> {
        let kind = *b.first().ok_or(MsgError::Empty)?;
        let want = match kind {
            HEARTBEAT => 25,
            PROBE => 9,
            PROBE_ACK => 17,
            ALERT => 21,
            ALERT_ACK => 13,
            JOIN | VIEW_PULL => 9,
            VIEW_CHANGE => 22,
            GROUP => 6,
            k => return Err(MsgError::UnknownKind(k)),
        };
        if b.len() != want {
            return Err(MsgError::BadLength { kind, len: b.len() });
        }
        Ok(match kind {
            HEARTBEAT => {
                Msg::Heartbeat { incarnation: u64_at(b, 1), epoch: u64_at(b, 9), seq: u64_at(b, 17) }
            }
            PROBE => Msg::Probe { nonce: u64_at(b, 1) },
            PROBE_ACK => Msg::ProbeAck { nonce: u64_at(b, 1), incarnation: u64_at(b, 9) },
            ALERT => Msg::Alert { subject: u32_at(b, 1), incarnation: u64_at(b, 5), epoch: u64_at(b, 13) },
            ALERT_ACK => Msg::AlertAck { subject: u32_at(b, 1), epoch: u64_at(b, 5) },
            JOIN => Msg::Join { incarnation: u64_at(b, 1) },
            VIEW_PULL => Msg::ViewPull { have: u64_at(b, 1) },
            GROUP => match b[5] {
                0 | 1 => Msg::Group { group: u32_at(b, 1), join: b[5] == 1 },
                _ => return Err(MsgError::BadField("join")),
            },
            _ => {
                let value = u64_at(b, 13);
                let group = || GroupId::try_from(value).map_err(|_| MsgError::BadField("group"));
                let change = match b[21] {
                    0 if value == 0 => Change::Left,
                    0 => return Err(MsgError::BadField("value of a node that left")),
                    1 => Change::Joined(value),
                    2 => Change::JoinedGroup(group()?),
                    3 => Change::LeftGroup(group()?),
                    4 if value == 0 => Change::ReplicaAdded,
                    5 if value == 0 => Change::ReplicaRemoved,
                    4 | 5 => return Err(MsgError::BadField("value of a replica change")),
                    _ => return Err(MsgError::BadField("change")),
                };
                Msg::ViewChange(ViewChange { epoch: u64_at(b, 1), node: u32_at(b, 9), change })
            }
        })
    }

    /// Write the message into `out` (cleared first).
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.clear();
        match *self {
            Msg::Heartbeat { incarnation, epoch, seq } => {
                out.push(HEARTBEAT);
                out.extend_from_slice(&incarnation.to_le_bytes());
                out.extend_from_slice(&epoch.to_le_bytes());
                out.extend_from_slice(&seq.to_le_bytes());
            }
            Msg::Probe { nonce } => {
                out.push(PROBE);
                out.extend_from_slice(&nonce.to_le_bytes());
            }
            Msg::ProbeAck { nonce, incarnation } => {
                out.push(PROBE_ACK);
                out.extend_from_slice(&nonce.to_le_bytes());
                out.extend_from_slice(&incarnation.to_le_bytes());
            }
            Msg::Alert { subject, incarnation, epoch } => {
                out.push(ALERT);
                out.extend_from_slice(&subject.to_le_bytes());
                out.extend_from_slice(&incarnation.to_le_bytes());
                out.extend_from_slice(&epoch.to_le_bytes());
            }
            Msg::AlertAck { subject, epoch } => {
                out.push(ALERT_ACK);
                out.extend_from_slice(&subject.to_le_bytes());
                out.extend_from_slice(&epoch.to_le_bytes());
            }
            Msg::Join { incarnation } => {
                out.push(JOIN);
                out.extend_from_slice(&incarnation.to_le_bytes());
            }
            Msg::ViewPull { have } => {
                out.push(VIEW_PULL);
                out.extend_from_slice(&have.to_le_bytes());
            }
            Msg::ViewChange(c) => {
                let (value, kind) = match c.change {
                    Change::Left => (0, 0),
                    Change::Joined(incarnation) => (incarnation, 1),
                    Change::JoinedGroup(g) => (u64::from(g), 2),
                    Change::LeftGroup(g) => (u64::from(g), 3),
                    Change::ReplicaAdded => (0, 4),
                    Change::ReplicaRemoved => (0, 5),
                };
                out.push(VIEW_CHANGE);
                out.extend_from_slice(&c.epoch.to_le_bytes());
                out.extend_from_slice(&c.node.to_le_bytes());
                out.extend_from_slice(&value.to_le_bytes());
                out.push(kind);
            }
            Msg::Group { group, join } => {
                out.push(GROUP);
                out.extend_from_slice(&group.to_le_bytes());
                out.push(u8::from(join));
            }
        }
    }

    /// The message's bytes.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(MAX_LEN);
        self.encode(&mut v);
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_message_parses_back_and_bad_ones_are_refused() {
        let all = [
            Msg::Heartbeat { incarnation: 3, epoch: 9, seq: u64::MAX },
            Msg::Probe { nonce: 7 },
            Msg::ProbeAck { nonce: 7, incarnation: 3 },
            Msg::Alert { subject: 12, incarnation: 3, epoch: 9 },
            Msg::AlertAck { subject: 12, epoch: 9 },
            Msg::Join { incarnation: 4 },
            Msg::ViewPull { have: 8 },
            Msg::ViewChange(ViewChange { epoch: 9, node: 12, change: Change::Joined(3) }),
            Msg::ViewChange(ViewChange { epoch: 10, node: 12, change: Change::Left }),
            Msg::ViewChange(ViewChange { epoch: 11, node: 12, change: Change::JoinedGroup(u32::MAX) }),
            Msg::ViewChange(ViewChange { epoch: 12, node: 12, change: Change::LeftGroup(0) }),
            Msg::ViewChange(ViewChange { epoch: 13, node: 4, change: Change::ReplicaAdded }),
            Msg::ViewChange(ViewChange { epoch: 14, node: 1, change: Change::ReplicaRemoved }),
            Msg::Group { group: 5, join: true },
            Msg::Group { group: 5, join: false },
        ];
        for m in all {
            let b = m.to_vec();
            assert!(b.len() <= MAX_LEN);
            assert_eq!(Msg::parse(&b), Ok(m));
            assert!(matches!(Msg::parse(&b[..b.len() - 1]), Err(MsgError::BadLength { .. })));
            let mut long = b.clone();
            long.push(0);
            assert!(matches!(Msg::parse(&long), Err(MsgError::BadLength { .. })));
        }
        assert_eq!(Msg::parse(&[]), Err(MsgError::Empty));
        assert_eq!(Msg::parse(&[200, 0]), Err(MsgError::UnknownKind(200)));
        let mut bad = Msg::ViewChange(ViewChange { epoch: 1, node: 2, change: Change::Joined(3) }).to_vec();
        bad[21] = 6;
        assert_eq!(Msg::parse(&bad), Err(MsgError::BadField("change")));
        bad[21] = 4;
        assert_eq!(Msg::parse(&bad), Err(MsgError::BadField("value of a replica change")));
        bad[21] = 0;
        assert!(Msg::parse(&bad).is_err(), "a node that left has no incarnation");
        bad[13..21].copy_from_slice(&(1u64 << 32).to_le_bytes());
        bad[21] = 2;
        assert_eq!(Msg::parse(&bad), Err(MsgError::BadField("group")));
        let mut bad = Msg::Group { group: 1, join: true }.to_vec();
        bad[5] = 2;
        assert_eq!(Msg::parse(&bad), Err(MsgError::BadField("join")));
    }
}
