//! The endpoint: one node's protocol state toward all its peers.
//!
//! This is the sans-IO core's public face (quinn-proto style): `handle_*`
//! take input with `now` first, `poll_*` give output. See the crate docs
//! for the polling order.

use std::collections::{BTreeMap, VecDeque};

use bytes::{Bytes, BytesMut};
use tether_wire::{Frame, Header, HeaderFlags, PacketWriter, Unverified};
use thiserror::Error;

use crate::event::{Event, FailReason, MessageId, MessageState};
use crate::landing::{Lander, Landings, Placement};
use crate::paths::{Control, PathInfo, PathState, RailId, MAX_RAILS};
use crate::peer::Peer;
use crate::recv_stream::{copy_to_bytes, DeliveryQueue};
use crate::{Config, ConfigError, Delivery, Instant, NodeId, Stats};

/// Most peers one endpoint keeps state for: a flood of forged source ids
/// must not grow memory without bound.
pub const MAX_PEERS: usize = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum SendError {
    #[error("message of {len} bytes exceeds the limit of {max}")]
    MessageTooLarge { len: usize, max: usize },
    /// The send buffer for this peer is full: back-pressure, try again after progress.
    #[error("send buffer full")]
    WouldBlock,
    #[error("cannot send to this endpoint itself")]
    SelfSend,
    #[error("too many peers")]
    TooManyPeers,
}

/// A datagram for the driver to send: `buf[..len]` to `dst` over `rail`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transmit {
    pub dst: NodeId,
    pub len: usize,
    pub rail: RailId,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum PathError {
    #[error("a peer needs at least one rail")]
    NoRails,
    #[error("rails are numbered 0 to {}", MAX_RAILS - 1)]
    BadRail,
    #[error("cannot have paths to this endpoint itself")]
    SelfPeer,
    #[error("too many peers")]
    TooManyPeers,
}

pub struct Endpoint {
    config: Config,
    node: NodeId,
    incarnation: u64,
    peers: BTreeMap<NodeId, Peer>,
    /// Round-robin start for `poll_transmit`, so no peer starves another.
    next_peer: NodeId,
    deliveries: DeliveryQueue,
    events: VecDeque<Event>,
    stats: Stats,
    send_arena: BytesMut,
    recv_arena: BytesMut,
    /// Where payloads land while their datagram is verified (`landing`):
    /// its own arena, so nothing else is copied in between landings.
    landing_arena: BytesMut,
    /// How the current datagram's payloads were placed; reused, so
    /// receiving allocates nothing once it has grown.
    placements: Vec<Placement>,
}

impl Endpoint {
    /// `incarnation` must be non-zero and larger than any earlier
    /// incarnation of the same node (a restart), e.g. a start timestamp.
    pub fn new(config: Config, node: NodeId, incarnation: u64) -> Result<Self, ConfigError> {
        config.validate()?;
        if incarnation == 0 {
            return Err(ConfigError { field: "incarnation", why: "must be non-zero" });
        }
        Ok(Endpoint {
            deliveries: DeliveryQueue::new(config.delivery_queue_bytes),
            config,
            node,
            incarnation,
            peers: BTreeMap::new(),
            next_peer: 0,
            events: VecDeque::new(),
            stats: Stats::default(),
            send_arena: BytesMut::new(),
            recv_arena: BytesMut::new(),
            landing_arena: BytesMut::new(),
            placements: Vec::new(),
        })
    }

    pub fn node(&self) -> NodeId {
        self.node
    }
    pub fn incarnation(&self) -> u64 {
        self.incarnation
    }
    pub fn config(&self) -> &Config {
        &self.config
    }
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    fn peer_mut(&mut self, id: NodeId) -> Option<&mut Peer> {
        if !self.peers.contains_key(&id) && self.peers.len() >= MAX_PEERS {
            return None;
        }
        let config = &self.config;
        Some(self.peers.entry(id).or_insert_with(|| Peer::new(config)))
    }

    /// Queue a message for `peer`. The bytes are copied once, into the
    /// sender-based log that retransmissions are served from.
    pub fn send(&mut self, now: Instant, peer: NodeId, msg: &[u8]) -> Result<MessageId, SendError> {
        self.check_send(peer, msg.len())?;
        let data = copy_to_bytes(&mut self.send_arena, msg);
        self.push(now, peer, data)
    }

    /// Like `send`, taking ownership of the bytes: no copy at all.
    pub fn send_bytes(&mut self, now: Instant, peer: NodeId, msg: Bytes) -> Result<MessageId, SendError> {
        self.check_send(peer, msg.len())?;
        self.push(now, peer, msg)
    }

    /// Queue checked bytes into the peer's sender-based log.
    fn push(&mut self, now: Instant, peer: NodeId, msg: Bytes) -> Result<MessageId, SendError> {
        let max_fragment = self.config.max_fragment();
        let p = self.peer_mut(peer).ok_or(SendError::TooManyPeers)?;
        let seq = p.send.push_message(now, msg, max_fragment);
        self.stats.messages_sent += 1;
        Ok(MessageId { peer, seq })
    }

    fn check_send(&self, peer: NodeId, len: usize) -> Result<(), SendError> {
        if peer == self.node {
            return Err(SendError::SelfSend);
        }
        if len > self.config.max_message_len {
            return Err(SendError::MessageTooLarge { len, max: self.config.max_message_len });
        }
        let buffered = self.peers.get(&peer).map_or(0, |p| p.send.bytes_buffered());
        if buffered > 0 && buffered + len > self.config.send_buffer_bytes {
            return Err(SendError::WouldBlock);
        }
        Ok(())
    }

    /// Room for another `len`-byte message to `peer` right now.
    pub fn can_send(&self, peer: NodeId, len: usize) -> bool {
        self.check_send(peer, len).is_ok()
    }

    /// The rails that lead to `peer` (the runtime's address book knows
    /// each rail's remote address). Until this is called a peer is reached
    /// over rail 0 alone. With two or more, each path's health is tracked
    /// and data fails over between them (see `paths`).
    pub fn set_paths(&mut self, peer: NodeId, rails: &[RailId]) -> Result<(), PathError> {
        if peer == self.node {
            return Err(PathError::SelfPeer);
        }
        if rails.is_empty() {
            return Err(PathError::NoRails);
        }
        if rails.iter().any(|&r| r as usize >= MAX_RAILS) {
            return Err(PathError::BadRail);
        }
        let p = self.peer_mut(peer).ok_or(PathError::TooManyPeers)?;
        p.paths.set_rails(Instant::ZERO, rails);
        Ok(())
    }

    /// The paths to `peer`: state, round trip, counters (empty for a peer
    /// this endpoint has no state for).
    pub fn paths(&self, peer: NodeId) -> Vec<PathInfo> {
        self.peers.get(&peer).map(|p| p.paths.info().collect()).unwrap_or_default()
    }

    /// Take in one received datagram, from rail 0. Anything wrong with it
    /// is a counted drop.
    pub fn handle_datagram(&mut self, now: Instant, datagram: &[u8]) {
        self.handle_datagram_on(now, 0, datagram);
    }

    /// Take in one datagram that arrived over `rail`.
    pub fn handle_datagram_on(&mut self, now: Instant, rail: RailId, datagram: &[u8]) {
        self.stats.datagrams_received += 1;
        self.stats.bytes_received += datagram.len() as u64;
        let unverified = match Unverified::parse(datagram) {
            Ok(u) => u,
            Err(e) => return self.stats.count_wire_error(e),
        };
        // Verify while copying each payload to where it will live: the
        // receive half of the fused copy + checksum (see `landing`).
        // The datagram's length bounds its payloads: room without a walk.
        let stream = self.peers.get_mut(&unverified.header.src_node).map(|p| &mut p.recv);
        let mut lander =
            Lander::new(&mut self.landing_arena, datagram.len(), stream, &self.config, &mut self.placements);
        let packet = match unverified.verify_landing(&mut lander) {
            Ok(p) => p,
            Err(e) => return self.stats.count_wire_error(e),
        };
        let h = packet.header;
        if !self.config.accepts(h.checksum) {
            // A sender (or a bit flip) must not be able to downgrade
            // integrity checking to an algorithm this endpoint refuses.
            self.stats.checksum_refused += 1;
            return;
        }
        if h.dst_node != self.node || h.src_node == self.node {
            self.stats.misdirected += 1;
            return;
        }
        if h.src_inc == 0 {
            self.stats.protocol_violations += 1;
            return;
        }
        let Some(peer) = self.peer_mut(h.src_node) else {
            self.stats.protocol_violations += 1;
            return;
        };
        if h.src_inc < peer.incarnation {
            self.stats.stale_dropped += 1;
            return;
        }
        if h.src_inc > peer.incarnation {
            let restarted = peer.incarnation != 0;
            peer.incarnation = h.src_inc;
            if restarted {
                self.on_peer_restart(h.src_node);
            }
        }
        let peer = self.peers.get_mut(&h.src_node).expect("created above");
        if h.dst_inc != 0 && h.dst_inc != self.incarnation {
            // Meant for an earlier life of ours. Answer at once so the peer
            // learns our new incarnation and settles its old stream.
            self.stats.stale_dropped += 1;
            peer.recv.request_ack(now, true);
            return;
        }
        if peer.unreachable {
            peer.unreachable = false;
            self.events.push_back(Event::PeerReachable { peer: h.src_node });
        }
        // An empty datagram is a probe (ACK-request flag) or its answer.
        let empty = packet.body_len() == 0;
        let (probe, pong) = (empty && h.flags.ack_request(), empty && !h.flags.ack_request());
        // One placement per DATA frame: the datagram carried data.
        let data = !self.placements.is_empty();
        if let Some(t) = peer.paths.on_receive(now, rail, data, probe, pong) {
            self.events.push_back(t.event(h.src_node, now));
        }
        let mut data_admitted = None;
        let mut landings = Landings::commit(&mut self.landing_arena, &self.placements);
        for frame in packet.frames() {
            match frame {
                Frame::Data(d) => {
                    let landed = landings.next(&mut self.landing_arena, &mut self.stats);
                    let admitted = *data_admitted.get_or_insert_with(|| peer.recv.admit_epoch(h.epoch));
                    if !admitted {
                        self.stats.stale_dropped += 1;
                        continue;
                    }
                    peer.recv.on_data(
                        now,
                        h.src_node,
                        &d,
                        landed,
                        &self.config,
                        &mut self.deliveries,
                        &mut self.recv_arena,
                        &mut self.stats,
                    );
                }
                Frame::Ack(a) => {
                    if a.epoch != peer.send.epoch {
                        continue;
                    }
                    match peer.send.on_ack(now, a.cumulative, a.ranges(), self.config.retransmit) {
                        Ok(outcome) => {
                            self.stats.messages_acked += outcome.messages_acked;
                            let (events, src) = (&mut self.events, h.src_node);
                            let failover =
                                peer.paths.on_acked(now, outcome.rails, outcome.latest_rails, |t| {
                                    events.push_back(t.event(src, now))
                                });
                            if let Some(failover) = failover {
                                events.push_back(Event::FailedOver { peer: src, failover, at: now });
                            }
                        }
                        Err(_) => self.stats.protocol_violations += 1,
                    }
                }
            }
        }
        // Every landing was split off above; none may linger into the next
        // datagram's (a no-op unless a frame went unvisited).
        self.landing_arena.clear();
        if h.flags.ack_request() && data_admitted.is_some() {
            peer.recv.request_ack(now, true);
        }
    }

    fn on_peer_restart(&mut self, id: NodeId) {
        let peer = self.peers.get_mut(&id).expect("caller holds the peer");
        let failed = peer.send.abandon(id, FailReason::PeerRestarted);
        peer.recv.reset(None);
        self.stats.messages_failed += failed.len();
        self.events.push_back(Event::PeerRestarted { peer: id, failed });
    }

    /// Run the timers that have expired by `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        for (&id, peer) in self.peers.iter_mut() {
            let (send, events, stats) = (&mut peer.send, &mut self.events, &mut self.stats);
            peer.paths.on_timer(now, &self.config, |t| {
                // Data leaves a path as soon as it is suspect: new data goes
                // to a healthy rail, and what the path still carried goes
                // again over it at once (a false suspicion costs duplicates
                // the receiver drops; waiting for `down` cost a window's
                // worth of stalled data, measured: 9.7 ms median failover).
                if t.from == PathState::Active && send.in_flight_on(t.rail) {
                    stats.failovers += 1;
                }
                if t.to != PathState::Active {
                    send.fail_over(now, t.rail);
                }
                events.push_back(t.event(id, now));
            });
            peer.send.on_timer(now, self.config.retransmit, &mut self.stats);
            if peer.send.should_abandon(now, &self.config) {
                let failed = peer.send.abandon(id, FailReason::PeerUnreachable);
                self.stats.messages_failed += failed.len();
                peer.unreachable = true;
                self.events.push_back(Event::PeerUnreachable { failed });
            }
        }
    }

    /// The earliest time `handle_timeout` must be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.peers
            .values()
            .flat_map(|p| [p.send.deadline(&self.config), p.recv.deadline(), p.paths.deadline(&self.config)])
            .flatten()
            .min()
    }

    /// Build the next datagram into `buf` (at most `config.max_datagram`
    /// bytes are used). ACKs ride on data when there is any; small messages
    /// queued for the same peer share one datagram.
    pub fn poll_transmit(&mut self, now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        let config = &self.config;
        let id = self
            .peers
            .range(self.next_peer..)
            .chain(self.peers.range(..self.next_peer))
            .find(|(_, p)| p.wants_transmit(now, config))
            .map(|(&id, _)| id)?;
        self.next_peer = id.wrapping_add(1);
        let peer = self.peers.get_mut(&id).expect("found above");
        let header = Header {
            flags: HeaderFlags::default(),
            checksum: config.checksum,
            src_node: self.node,
            dst_node: id,
            src_inc: self.incarnation,
            dst_inc: peer.incarnation,
            epoch: peer.send.epoch,
        };
        let cap = buf.len().min(config.max_datagram);
        if let Some((rail, control)) = peer.paths.take_control(now, config, peer.send.has_unacked()) {
            // A probe or its answer: no frames, alone in its datagram.
            let mut w = PacketWriter::new(&mut buf[..cap], &header).ok()?;
            w.set_ack_request(control == Control::Probe);
            let len = w.finish();
            peer.paths.on_sent(now, rail, 0, 0, control == Control::Probe);
            self.stats.probes_sent += (control == Control::Probe) as u64;
            self.stats.datagrams_sent += 1;
            self.stats.bytes_sent += len as u64;
            return Some(Transmit { dst: id, len, rail });
        }
        // Data goes where the rail policy says; an ACK alone answers on
        // the rail the peer was last heard on.
        let rail = if peer.send.has_work(now, config) {
            peer.paths.data_rail(config.rail_policy)
        } else {
            peer.paths.reply_rail()
        };
        let mut w = PacketWriter::new(&mut buf[..cap], &header).ok()?;
        let mut acked = false;
        if peer.recv.ack_pending() {
            let ack = peer.recv.take_ack();
            // Config validation guarantees room for a full ACK in any datagram.
            acked = w.push_ack(&ack).is_ok();
            self.stats.acks_sent += acked as u64;
        }
        let retransmits_before = self.stats.retransmits;
        let frames = peer.send.fill(&mut w, now, rail, config, &mut self.stats);
        if frames == 0 && !acked {
            return None;
        }
        if frames == 0 {
            self.stats.standalone_acks += 1;
        }
        let len = w.finish();
        let retransmits = self.stats.retransmits - retransmits_before;
        peer.paths.on_sent(now, rail, frames as u64, retransmits, frames > 0);
        self.stats.datagrams_sent += 1;
        self.stats.bytes_sent += len as u64;
        Some(Transmit { dst: id, len, rail })
    }

    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// The next message delivered to this endpoint, in per-peer send order.
    pub fn recv(&mut self) -> Option<Delivery> {
        let was_full = !self.deliveries.has_room();
        let d = self.deliveries.pop()?;
        if was_full {
            // Room again: segments that waited for it go in now, and their
            // senders hear so at once.
            for (&id, peer) in self.peers.iter_mut() {
                let (config, dq, arena, stats) =
                    (&self.config, &mut self.deliveries, &mut self.recv_arena, &mut self.stats);
                if peer.recv.drain(id, config, dq, arena, stats) {
                    peer.recv.request_ack_now();
                }
            }
        }
        Some(d)
    }

    /// The delivery queue is at its limit: new data waits unacknowledged
    /// until the application reads (the commit point's back-pressure).
    pub fn delivery_queue_full(&self) -> bool {
        !self.deliveries.has_room()
    }

    /// Messages waiting in the delivery queue.
    pub fn pending_deliveries(&self) -> usize {
        self.deliveries.len()
    }

    pub fn message_state(&self, id: MessageId) -> MessageState {
        match self.peers.get(&id.peer) {
            Some(p) => p.send.message_state(id.seq),
            None => MessageState::Unknown,
        }
    }

    /// The peers this endpoint has state for, in id order.
    pub fn peers(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.peers.keys().copied()
    }

    /// Bytes accepted for `peer` and not yet acknowledged.
    pub fn buffered_bytes(&self, peer: NodeId) -> usize {
        self.peers.get(&peer).map_or(0, |p| p.send.bytes_buffered())
    }

    /// Smoothed RTT toward `peer`, once measured.
    pub fn rtt(&self, peer: NodeId) -> Option<core::time::Duration> {
        self.peers.get(&peer).and_then(|p| p.send.rtt.smoothed())
    }

    /// True when nothing is owed to any peer: no unacknowledged data, no ACK pending.
    pub fn is_idle(&self) -> bool {
        self.peers.values().all(|p| !p.send.has_unacked() && !p.recv.ack_pending())
    }
}
