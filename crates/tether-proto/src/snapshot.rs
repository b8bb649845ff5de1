//! The hard state of an endpoint, exported: what must survive a failure of
//! the engine that runs the protocol, so a new engine can go on without
//! losing or repeating a message (Zhou et al. [FTGM] section 4, the
//! host-side backup; docs/REFERENCES.md).
//!
//! Per stream: the next sequence number to assign, the cumulative ACK, the
//! highest sequence ever put on the wire, delivered-up-to, incarnation and
//! epoch, every unacknowledged outgoing message, and the received data
//! already acknowledged but not yet handed over (the message being
//! reassembled, segments held out of order, the delivery queue). Timers,
//! RTT estimates and rail health are soft: [`Endpoint::restore`] rebuilds
//! them, and the simulator's `soft_state_loss` mix throws them away at
//! random moments and requires every guarantee to hold.
//!
//! [`Endpoint::restore`]: crate::Endpoint::restore

use crate::paths::RailId;
use crate::recv_stream::RecvSnapshot;
use crate::send_stream::SendSnapshot;
use crate::{Channel, Delivery, Event, NodeId, Stats};

/// One peer's hard state.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PeerSnapshot {
    /// The peer's node id.
    pub node: NodeId,
    /// The peer's incarnation as proven by a handshake (0: no session).
    pub incarnation: u64,
    /// The datagram size agreed in that handshake (0: none yet): the
    /// segments in flight were cut for it.
    pub max_datagram: usize,
    /// The next packet number to send (authenticated sessions); a restore
    /// skips far ahead of it, as datagrams may have left after the snapshot.
    pub tx_pn: u64,
    /// The highest packet number taken from the peer: a restore refuses
    /// everything up to it as a replay.
    pub rx_pn: u64,
    /// Reported unreachable and not heard from since.
    pub unreachable: bool,
    /// Taken in after its handshake rather than given (`Config::accept_peers`).
    pub accepted: bool,
    /// The rails configured to reach it.
    pub rails: Vec<RailId>,
    /// The stream to the peer.
    pub send: SendSnapshot,
    /// The stream from the peer.
    pub recv: RecvSnapshot,
    /// The NACK-reliable class both ways: its numbers, so that a restore
    /// neither reuses one nor delivers one again (what was held is soft:
    /// asked for after a restore, it is reported lost).
    pub nacked: NackedMarks,
}

/// Where the NACK-reliable class stands with one peer (`crate::nacked`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NackedMarks {
    /// The next message's number to the peer.
    pub next: u64,
    /// The next message expected from the peer (`None`: not heard from).
    pub expected: Option<u64>,
}

/// An endpoint's hard state: everything [`Endpoint::restore`] needs.
///
/// [`Endpoint::restore`]: crate::Endpoint::restore
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct EndpointSnapshot {
    /// This endpoint's node id.
    pub node: NodeId,
    /// This endpoint's incarnation: a restored endpoint is the same life,
    /// not a restart (its peers must not see a new incarnation).
    pub incarnation: u64,
    /// Every peer, in node order.
    pub peers: Vec<PeerSnapshot>,
    /// Messages delivered and not yet read by the application.
    pub deliveries: Vec<Delivery>,
    /// Events not yet read by the application.
    pub events: Vec<Event>,
    /// The counters, so they keep counting across a rebuild.
    pub stats: Stats,
}

/// What an engine keeps of a stream in its application's backup block
/// (docs/ENGINE.md), read cheaply after every datagram: whatever changed
/// is written to the block before the datagram leaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamMarks {
    /// The peer's incarnation as the handshake proved it (0: no session).
    pub peer_incarnation: u64,
    /// The datagram size agreed with it (0: none yet).
    pub max_datagram: usize,
    /// The send stream's epoch.
    pub epoch: u32,
    /// Message `settled_msg` and all after it are unsettled.
    pub settled_msg: u64,
    /// Where message `settled_msg` starts in the stream.
    pub settled_seq: u64,
    /// Every segment below this may have gone on the wire.
    pub sent_upto: u64,
    /// The next packet number (authenticated sessions).
    pub tx_pn: u64,
}

/// An unsettled message an application kept for a new engine: its bytes,
/// and its channel (it goes again on the same one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unsettled {
    /// The message's bytes.
    pub data: bytes::Bytes,
    /// The channel it was sent on.
    pub channel: Channel,
}

impl Unsettled {
    /// An application message.
    pub fn message(data: bytes::Bytes) -> Self {
        Unsettled { data, channel: Channel::APP }
    }
}

/// A stream rebuilt by a new engine (docs/ENGINE.md, "Restore"): from the
/// engine's backup block, and from what the application kept (every
/// unsettled message, the failures it was told of, and how far it took
/// the peer's stream).
#[derive(Debug, Clone)]
pub struct ResumedStream {
    /// The peer the stream leads to.
    pub peer: NodeId,
    /// The rails configured to reach it.
    pub rails: Vec<RailId>,
    /// The send side as the block recorded it.
    pub marks: StreamMarks,
    /// The unsettled messages, in order: message `marks.settled_msg` first.
    pub messages: Vec<Unsettled>,
    /// Failure reports the application holds, for `message_state`.
    pub failures: Vec<(crate::FailedMessages, crate::FailReason)>,
    /// The receive side where the application stands: the epoch and next
    /// fragment of the peer's stream it took last (`None`: nothing taken
    /// from this life of the peer).
    pub taken: Option<(u32, u64)>,
}
