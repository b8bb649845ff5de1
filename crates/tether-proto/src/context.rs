//! What a peer's state machine works with besides its own state: the
//! endpoint's configuration and identity, and the queues and counters all
//! peers share. The endpoint lends one to a peer for each call (quinn-proto
//! passes its `Connection` the same kind of context), so a peer's
//! `handle_*` and `poll_*` take one argument where they took ten.

use std::collections::VecDeque;
use std::net::SocketAddr;

use bytes::BytesMut;

use crate::aggregate::Aggregate;
use crate::delivery::DeliveryQueue;
use crate::greeting::Greetings;
use crate::handshake::Secrets;
use crate::message_pool::MessagePool;
use crate::{Config, Event, NodeId, PeerMoved, Stats};

/// The endpoint as one of its peers sees it.
pub(crate) struct Context<'a> {
    pub config: &'a Config,
    /// This endpoint's node id and incarnation.
    pub node: NodeId,
    pub incarnation: u64,
    pub stats: &'a mut Stats,
    pub events: &'a mut VecDeque<Event>,
    /// The application's delivery queue: the commit point.
    pub deliveries: &'a mut DeliveryQueue,
    /// Where received bytes are copied when they were not landed in place.
    pub recv_arena: &'a mut BytesMut,
    /// Buffers for messages reassembled from fragments.
    pub messages: &'a MessagePool,
    /// The handshake's key and nonce source.
    pub secrets: &'a mut Secrets,
    /// The source of the datagram being taken in, when it is an address
    /// no peer has: only a handshake that proves it may come from there.
    pub from: Option<SocketAddr>,
    /// Peers proven at a new address, for the driver to route to.
    pub moves: &'a mut VecDeque<PeerMoved>,
    /// The endpoint's window over all its streams.
    pub aggregate: &'a mut Aggregate,
    /// The endpoint's handshakes under way, and those waiting.
    pub greetings: &'a mut Greetings,
    /// Rails the driver left unread this turn (`Endpoint::set_backlog`).
    pub backlog: u8,
    /// Unreliable messages received, for the application.
    pub unreliable: &'a mut crate::unreliable::Inbox,
    /// The cluster services' queues, by `Service::index`.
    pub services: &'a mut [crate::unreliable::Inbox; 2],
    /// NACK-reliable messages delivered in order, for the application.
    pub nacked: &'a mut crate::nacked::Inbox,
}
