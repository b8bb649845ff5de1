//! tether's protocol core, sans-IO (docs/ARCHITECTURE.md, "Layers" and
//! "The sans-IO boundary").
//!
//! Pure state machines: no sockets, threads, clocks or randomness. The
//! driver (the runtime over real sockets, or the simulator) feeds in
//! datagrams and the time, and polls out datagrams to send, messages to
//! deliver, events and the next deadline. The polling order for a driver is:
//!
//! 1. `handle_datagram(now, bytes)` for each received datagram and
//!    `handle_timeout(now)` when `poll_timeout()` has passed;
//! 2. `poll_transmit(now, buf)` until it returns `None`, sending each;
//! 3. `recv()` and `poll_event()` for the application;
//! 4. sleep until `poll_timeout()` or the next datagram.
//!
//! Reliability follows Tang and Bilas [TB] section 4.1 (cumulative ACKs,
//! piggy-backing, ACK-request bit, one timer per stream) with selective
//! ACKs added, aggregation of small messages from Trahay et al. [NMAD]
//! section 3, and generations from [TB] section 4.2 (docs/REFERENCES.md).
//! No data flows between two endpoints before a handshake has proven both
//! incarnations (`handshake`).

// Every public item says what it is for: this crate is the API the
// runtime, the simulator and other drivers are written against.
#![warn(missing_docs)]

mod aggregate;
mod batch;
mod config;
pub mod congestion;
mod context;
mod deadlines;
mod delivery;
mod endpoint;
mod event;
#[cfg(feature = "fault-hook")]
pub mod fault_hook;
mod greeting;
mod handshake;
mod landing;
mod loss;
pub mod mapper;
mod message_pool;
pub mod nacked;
mod paths;
mod peer;
mod ready;
mod reassembly;
mod recv_stream;
mod refused;
mod replay;
pub mod routes;
mod rtt;
mod send_stream;
#[cfg(feature = "serde")]
mod serde_support;
mod snapshot;
mod stats;
mod time;
mod timer;
mod unreliable;

pub use batch::{Messages, Received, SentBatch};
pub use config::{ClusterKey, Config, ConfigError, RetransmitMode};
pub use congestion::{
    AckSignal, CongestionControl, CongestionInfo, Controller, ControllerFactory, LossSignal,
};
pub use nacked::Nacked;
pub use refused::Refused;
pub use unreliable::{Service, Unreliable};

pub use config::MIN_DATAGRAM;
pub use delivery::DELIVERY_COST;
pub use endpoint::{
    Endpoint, Origin, PathError, PayloadCursor, PeerMoved, SendError, StateFault, Transmit, MAX_MOVES,
    MAX_PEERS,
};
pub use event::{Event, FailReason, FailedMessages, MessageId, MessageState, NackedFate};
pub use greeting::{GREETING_ROUNDS, MAX_GREETINGS};
pub use handshake::{BASE_DATAGRAM, MAX_REPLIES};
pub use message_pool::{MessagePool, MAX_POOLED, POOL_FROM};
pub use paths::{Failover, PathInfo, PathState, PathStats, RailId, RailPolicy, MAX_RAILS};
pub use reassembly::{Assembled, Reassembly, StreamPosition};
pub use recv_stream::{
    epoch_overtakes, epoch_within_reach, PartialMessage, RecvSnapshot, StashedSegment, EPOCH_WINDOW,
};
pub use replay::WINDOW as REPLAY_WINDOW;
pub use send_stream::{LoggedSegment, SendLog, SendSnapshot, SEGMENT_COST};
pub use snapshot::{EndpointSnapshot, NackedMarks, PeerSnapshot, ResumedStream, StreamMarks, Unsettled};
pub use stats::Stats;
pub use tether_wire::{AuthKind, Channel, DataFlags, NodeId};
pub use time::Instant;
pub use timer::Timer;

/// A message handed to the application: who sent it and its exact bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// The sending node.
    pub from: NodeId,
    /// The message, reassembled; `Bytes` so handing it on copies nothing.
    /// With [`Config::deliver_fragments`], one fragment of it.
    pub message: bytes::Bytes,
    /// With [`Config::deliver_fragments`]: which fragment, where. `None`
    /// for a whole message.
    pub fragment: Option<Fragment>,
    /// The channel it came on (`Endpoint::send_on`): the application's
    /// own messages, or a layer's riding the same stream.
    pub channel: Channel,
}

/// A fragment delivered as it came in order ([`Config::deliver_fragments`]):
/// the application (an engine's client, docs/ENGINE.md) reassembles, and
/// knows exactly where in the stream it stands, so a restored engine can
/// resume at that point and a fragment delivered twice is recognised.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fragment {
    /// The sender's incarnation: a new one starts its streams afresh.
    pub incarnation: u64,
    /// The sender's stream epoch.
    pub epoch: u32,
    /// The fragment's sequence number in the stream.
    pub seq: u64,
    /// The first fragment of its message.
    pub first: bool,
    /// The last fragment of its message.
    pub last: bool,
    /// The message's length, carried by first fragments of messages of
    /// more than one.
    pub total_len: Option<u32>,
}
