//! What the core tells the application: events, message states, handles.

use crate::paths::{Failover, PathState, RailId};
use crate::{Instant, NodeId};

/// A handle on one sent message: the peer and the message's number in the
/// stream to that peer (0, 1, 2... for the life of this endpoint).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct MessageId {
    pub peer: NodeId,
    pub seq: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize), serde(rename_all = "snake_case"))]
pub enum FailReason {
    /// No acknowledged progress for `Config::abandon_after`.
    PeerUnreachable,
    /// The peer came back as a new incarnation; its previous life's
    /// receive state is gone.
    PeerRestarted,
    /// An injected operation fault (Li et al. [CI] Table 2): the send was
    /// accepted and then completed with an error status. The runtime's
    /// fault injector reports it; the core never does.
    OperationFault,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize), serde(rename_all = "snake_case"))]
pub enum MessageState {
    /// Accepted, not yet acknowledged.
    Pending,
    /// Acknowledged: it reached the peer's delivery queue (the commit point).
    Delivered,
    Failed(FailReason),
    /// Not a message this endpoint has sent.
    Unknown,
}

/// A run of consecutive messages to one peer that were not acknowledged.
///
/// Messages `[first, end)` failed. Those below `in_doubt_end` had every
/// fragment transmitted at least once, so the peer may have received them
/// just before the path died and the ACK was lost; those from `in_doubt_end`
/// on certainly never reached it. No protocol can do better than this
/// (the two generals); the application gets the exact split.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct FailedMessages {
    pub peer: NodeId,
    pub first: u64,
    pub end: u64,
    pub in_doubt_end: u64,
}

impl FailedMessages {
    pub fn len(&self) -> u64 {
        self.end - self.first
    }
    pub fn is_empty(&self) -> bool {
        self.end == self.first
    }
    pub fn contains(&self, seq: u64) -> bool {
        (self.first..self.end).contains(&seq)
    }
    pub fn ids(&self) -> impl Iterator<Item = MessageId> + '_ {
        (self.first..self.end).map(move |seq| MessageId { peer: self.peer, seq })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(tag = "event", rename_all = "snake_case")
)]
pub enum Event {
    /// Nothing acknowledged for `abandon_after`: every unacknowledged message
    /// to the peer failed. Later sends are tried afresh on a new epoch.
    PeerUnreachable { failed: FailedMessages },
    /// The peer restarted: unacknowledged messages to its old life failed.
    PeerRestarted { peer: NodeId, failed: FailedMessages },
    /// A peer previously reported unreachable acknowledged again.
    PeerReachable { peer: NodeId },
    /// A path (a rail toward a peer) changed state; `at` is the time the
    /// core noticed. A path going down moves the peer's data elsewhere.
    PathChanged { peer: NodeId, rail: RailId, from: PathState, to: PathState, at: Instant },
    /// The first ACK for data sent over a new rail after the old one
    /// stopped delivering: the failover is complete.
    FailedOver { peer: NodeId, failover: Failover, at: Instant },
}
