//! What the core tells the application: events, message states, handles.

use crate::paths::{Failover, PathState, RailId};
use crate::{Instant, NodeId};

/// A handle on one sent message: the peer and the message's number in the
/// stream to that peer (0, 1, 2... for the life of this endpoint).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct MessageId {
    /// The node the message was sent to.
    pub peer: NodeId,
    /// Its place in the stream to `peer`, counted from 0 and never reused,
    /// so an id names one message even across the peer's restarts.
    pub seq: u64,
}

/// Why a message failed. Non-exhaustive: new failure causes (an engine
/// that could not be recovered, an identity check) will be added.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize), serde(rename_all = "snake_case"))]
#[non_exhaustive]
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
    /// The peer's receiver moved to a stream epoch this endpoint never
    /// started, so it no longer takes the old one. Only forged traffic
    /// (no cluster key) or corruption the checksum missed does that; the
    /// stream resynchronises on a newer epoch.
    StreamReset,
}

/// Where a sent message stands: the (ACK status, operation status) query
/// of Kaur [AMVIA] sections 3.2.1-3.2.2. The four states are complete; new causes
/// of failure go into [`FailReason`], not here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize), serde(rename_all = "snake_case"))]
pub enum MessageState {
    /// Accepted, not yet acknowledged.
    Pending,
    /// Acknowledged: it reached the peer's delivery queue (the commit point).
    Delivered,
    /// Will never be delivered by this endpoint, for the reason given
    /// (it may have arrived if it was in doubt: see [`FailedMessages`]).
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
    /// The node the messages were sent to.
    pub peer: NodeId,
    /// The first failed message's `seq`.
    pub first: u64,
    /// One past the last failed message's `seq`.
    pub end: u64,
    /// One past the last message that may have arrived; `first` when none
    /// may have.
    pub in_doubt_end: u64,
}

impl FailedMessages {
    /// How many messages failed.
    pub fn len(&self) -> u64 {
        self.end - self.first
    }
    /// No message failed (a restart that cost nothing).
    pub fn is_empty(&self) -> bool {
        self.end == self.first
    }
    /// Whether message `seq` of this stream is one of them.
    pub fn contains(&self, seq: u64) -> bool {
        (self.first..self.end).contains(&seq)
    }
    /// Their ids, in send order, for matching against send handles.
    pub fn ids(&self) -> impl Iterator<Item = MessageId> + '_ {
        (self.first..self.end).map(move |seq| MessageId { peer: self.peer, seq })
    }
}

/// What became of NACK-reliable messages when they left their sender's
/// hold (`crate::nacked`), or after.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize), serde(rename_all = "snake_case"))]
pub enum NackedFate {
    /// The receiver never asked for them: it most likely has them (or it
    /// missed them and every word of the sender after them).
    NeverAskedFor,
    /// The receiver asked, and they were sent again.
    Repaired,
    /// The receiver skipped them (they had left the hold when it asked,
    /// or when it learned of them): it certainly lacks them. May follow
    /// an earlier `NeverAskedFor` or `Repaired` for the same messages, and
    /// come more than once (a copy of the receiver's report).
    Lost,
}

/// What the core tells the application besides deliveries, from
/// `poll_event`: failures it must act on and rail changes it may log.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(tag = "event", rename_all = "snake_case")
)]
#[non_exhaustive]
pub enum Event {
    /// Nothing acknowledged for `abandon_after`: every unacknowledged message
    /// to the peer failed. Later sends are tried afresh on a new epoch.
    PeerUnreachable {
        /// The messages that failed (the peer is `failed.peer`).
        failed: FailedMessages,
    },
    /// The peer restarted: unacknowledged messages to its old life failed.
    PeerRestarted {
        /// The node that restarted.
        peer: NodeId,
        /// The messages its old life never acknowledged.
        failed: FailedMessages,
    },
    /// The peer's receiver acknowledged a stream epoch this endpoint never
    /// started ([`FailReason::StreamReset`]): every unacknowledged message
    /// failed, and later sends go on an epoch past the peer's.
    StreamReset {
        /// The messages that failed (the peer is `failed.peer`).
        failed: FailedMessages,
    },
    /// The engine process serving this endpoint died or hung and a new one
    /// took its place from the endpoint's backup (docs/ENGINE.md): nothing
    /// was lost or repeated, and the peers saw a pause. Never raised by the
    /// core itself; an engine's client reports it.
    EngineRecovered {
        /// From noticing the engine gone to the new one taking over.
        outage: core::time::Duration,
    },
    /// A peer previously reported unreachable acknowledged again.
    PeerReachable {
        /// The node heard from again.
        peer: NodeId,
    },
    /// A path (a rail toward a peer) changed state; `at` is the time the
    /// core noticed. A path going down moves the peer's data elsewhere.
    PathChanged {
        /// The node the path leads to.
        peer: NodeId,
        /// The rail the path leaves on.
        rail: RailId,
        /// The state it left.
        from: PathState,
        /// The state it entered.
        to: PathState,
        /// When the core noticed, on the driver's clock.
        at: Instant,
    },
    /// Datagrams this endpoint refused since the last such event, by
    /// reason (at most one a second, and one waiting at a time): how a
    /// peer whose configuration differs looks from here, since it gets no
    /// answer. `refused.causes()` says what each reason likely means.
    Refused {
        /// The counts since the last report.
        refused: crate::Refused,
        /// When the core reported them.
        at: Instant,
    },
    /// NACK-reliable messages `[first, end)` to `peer` left the hold (or,
    /// for `Lost`, were skipped by the peer).
    Nacked {
        /// The node they were sent to.
        peer: NodeId,
        /// The first message's number (`Endpoint::send_nacked`).
        first: u64,
        /// One past the last.
        end: u64,
        /// What became of them.
        fate: NackedFate,
    },
    /// The first ACK for data sent over a new rail after the old one
    /// stopped delivering: the failover is complete.
    FailedOver {
        /// The node whose data moved.
        peer: NodeId,
        /// From which rail to which, and how long the data was stranded.
        failover: Failover,
        /// When the first ACK over the new rail arrived.
        at: Instant,
    },
    /// A node this endpoint was not given completed a handshake and was
    /// taken in as a peer (`Config::accept_peers`): messages to it may be
    /// sent from now on, and its own are delivered. With a cluster key the
    /// handshake proved it holds the key.
    PeerAccepted {
        /// The node taken in.
        peer: NodeId,
        /// The rail its handshake came over.
        rail: RailId,
        /// The address it proved it receives at (`None`: a transport
        /// without addresses, such as the in-memory network).
        addr: Option<std::net::SocketAddr>,
        /// When, on the driver's clock.
        at: Instant,
    },
}
