//! The endpoint: one node's protocol state toward all its peers.
//!
//! This is the sans-IO core's public face (quinn-proto style): `handle_*`
//! take input with `now` first, `poll_*` give output. See the crate docs
//! for the polling order. The endpoint itself decides little: it checks
//! what no single peer can (the checksum algorithm, the addressing, the
//! peer limit), routes each datagram to its [`Peer`] by node id, and keeps
//! the earliest of the peers' deadlines; each peer is a state machine of
//! its own (`peer`).

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tether_wire::{
    DataFlags, Frame, HandshakeFrame, HandshakeKind, Header, HeaderFlags, MacKey, PacketWriter, Unverified,
    WireError,
};
use thiserror::Error;
use tracing::{debug, trace, warn};

use crate::aggregate::Aggregate;
use crate::context::Context;
use crate::deadlines::Deadlines;
use crate::delivery::{copy_to_bytes, DeliveryQueue};
use crate::event::{Event, MessageId, MessageState};
use crate::greeting::Greetings;
use crate::handshake::{cookie_slot, Reply, Secrets, MAX_REPLIES};
use crate::landing::LandingArea;
use crate::message_pool::MessagePool;
use crate::paths::{PathInfo, RailId, MAX_RAILS};
use crate::peer::Peer;
use crate::ready::ReadyList;
use crate::recv_stream::RecvSnapshot;
use crate::refused::Refused;
use crate::send_stream::{LoggedSegment, SendLog, SendSnapshot, SEGMENT_COST};
use crate::snapshot::{EndpointSnapshot, PeerSnapshot};
use crate::{Channel, Config, ConfigError, Delivery, Instant, NodeId, Stats};

/// The handshake secret's seed when the driver gives none: reproducible
/// (tests, the simulator), not secret.
fn default_seed(node: NodeId, incarnation: u64) -> [u8; 32] {
    let mut seed = [0u8; 32];
    seed[..4].copy_from_slice(&node.to_le_bytes());
    seed[8..16].copy_from_slice(&incarnation.to_le_bytes());
    seed
}

/// How often `Endpoint::update_patience` looks at the peers' round trips.
const PATIENCE_EVERY: Duration = Duration::from_millis(100);
/// Silence of this many of the slowest round trips gives a peer up...
const PATIENCE_RTTS: u32 = 16;
/// ... but never more than this many times `Config::abandon_after`
/// (unless `Config::abandon_limit` says otherwise).
const PATIENCE_CAP: u32 = 12;

/// Most peers one endpoint keeps state for: a flood of forged source ids
/// must not grow memory without bound.
pub const MAX_PEERS: usize = 4096;

/// Why a message was not accepted for sending.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum SendError {
    /// The message is larger than `Config::max_message_len`.
    #[error("message of {len} bytes exceeds the limit of {max}")]
    MessageTooLarge {
        /// The message's length.
        len: usize,
        /// The largest message the endpoint accepts.
        max: usize,
    },
    /// The send buffer for this peer is full: back-pressure, try again after progress.
    #[error("send buffer full")]
    WouldBlock,
    /// The destination is this endpoint itself.
    #[error("cannot send to this endpoint itself")]
    SelfSend,
    /// The endpoint already keeps state for `MAX_PEERS` peers.
    #[error("too many peers")]
    TooManyPeers,
    /// No peer with this node id was added (`Endpoint::add_peer`,
    /// `set_paths`), nor has one been heard from.
    #[error("unknown peer: node {0} was never added")]
    UnknownPeer(NodeId),
}

/// What taking in one datagram came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Taken {
    /// Taken, or dropped and counted.
    Done,
    /// Its sender was just taken in as a peer (`Endpoint::accept`): take
    /// the datagram again, as the peer's.
    Accepted,
}

/// What the driver knows of where a datagram came from: identity comes
/// from the source address the transport saw, never from a header alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// The transport mapped the source address to this node (the address
    /// it has for it on the rail the datagram came in on).
    Node(NodeId),
    /// An address no peer has. With a cluster key, a peer that moved there
    /// may prove itself by a handshake from it (an authenticated HELLO,
    /// answered there, and a CONFIRM whose cookie is bound to the address;
    /// then [`Endpoint::poll_moved`] says so); anything else from it is
    /// dropped, counted as `unknown_source`.
    Stranger(SocketAddr),
    /// The transport cannot tell (an in-memory network, the simulator):
    /// the header's node id routes it, and the handshake still guards.
    Untold,
}

/// A datagram for the driver to send: `buf[..len]` to `dst` over `rail`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transmit {
    /// The destination node.
    pub dst: NodeId,
    /// Bytes of the caller's buffer the datagram takes.
    pub len: usize,
    /// The rail to send it on.
    pub rail: RailId,
    /// Send it to this address rather than the one `dst` is known at: a
    /// WELCOME answering a HELLO from an address no peer has.
    pub to_addr: Option<SocketAddr>,
}

/// A broken invariant `Endpoint::audit` found: in which peer's streams,
/// and which.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("peer {peer}: {what}")]
pub struct StateFault {
    /// The peer whose streams break it.
    pub peer: NodeId,
    /// The invariant broken.
    pub what: &'static str,
}

/// Where a sliced pass of `Endpoint::audit_payloads` goes on: the peer,
/// and the sequence number in its send stream (0: the peer's pass has not
/// begun).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PayloadCursor {
    /// The peer whose payloads are checked next.
    pub peer: NodeId,
    /// The first sequence number of its send stream still to check.
    pub seq: u64,
}

/// A peer proved itself at a new address on a rail (`Origin::Stranger`):
/// from now on its datagrams on that rail come from, and go to, `addr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerMoved {
    /// The peer.
    pub node: NodeId,
    /// The rail it moved on.
    pub rail: RailId,
    /// Where it is now.
    pub addr: SocketAddr,
}

/// Moves proven and not yet taken by the driver, at most: beyond it the
/// oldest is forgotten (the peer proves itself again on its next CONFIRM).
pub const MAX_MOVES: usize = 64;

/// Why a peer's paths were not set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum PathError {
    /// An empty list of rails.
    #[error("a peer needs at least one rail")]
    NoRails,
    /// A rail id of `MAX_RAILS` or more.
    #[error("rails are numbered 0 to {}", MAX_RAILS - 1)]
    BadRail,
    /// The peer is this endpoint itself.
    #[error("cannot have paths to this endpoint itself")]
    SelfPeer,
    /// The endpoint already keeps state for `MAX_PEERS` peers.
    #[error("too many peers")]
    TooManyPeers,
}

/// One node's protocol state toward all its peers (see the crate docs).
#[derive(Debug)]
pub struct Endpoint {
    config: Config,
    node: NodeId,
    incarnation: u64,
    peers: BTreeMap<NodeId, Peer>,
    /// The earliest deadline over all peers, kept exact after every
    /// operation on a peer (`deadlines`' top, read for `poll_timeout`).
    earliest: Option<Instant>,
    /// The peers' deadlines, earliest first (`deadlines`).
    deadlines: Deadlines,
    /// The peers `handle_timeout` found due (kept, so it never allocates).
    due: Vec<NodeId>,
    /// How long a peer may be silent with data outstanding before it is
    /// given up: `Config::abandon_after`, or longer while this endpoint's
    /// own conversations are slow (`update_patience`), and when it was
    /// last worked out.
    patience: (Duration, Instant),
    /// How late this endpoint's timers ran: the most since patience was
    /// last worked out, and the figure then (halved at each look, so a
    /// stall is forgotten within a second or so of the endpoint catching up).
    lateness: (Duration, Duration),
    /// The peers `poll_transmit` looks at, in turn (`ready`).
    ready: ReadyList,
    /// Round-robin start for handing out room in the delivery queue.
    next_drain: NodeId,
    deliveries: DeliveryQueue,
    events: VecDeque<Event>,
    stats: Stats,
    send_arena: BytesMut,
    recv_arena: BytesMut,
    /// Buffers for messages reassembled from fragments, recycled.
    messages: MessagePool,
    /// Unreliable messages received and not yet taken (`recv_unreliable`).
    unreliable: crate::unreliable::Inbox,
    /// Service datagrams received and not yet taken (`recv_service`).
    services: [crate::unreliable::Inbox; 2],
    /// NACK-reliable messages delivered in order and not yet taken.
    nacked: crate::nacked::Inbox,
    /// Rails whose sockets the driver left unread this turn (`set_backlog`).
    backlog: u8,
    /// Where payloads land while their datagram is verified (`landing`).
    landing: LandingArea,
    /// Where authenticated datagrams are decrypted (grown once).
    open_buf: Vec<u8>,
    /// Refused traffic, logged at most once a second (`report_refused`).
    refused_report: (Instant, Refused),
    /// The handshake's key and nonce source.
    secrets: Secrets,
    /// WELCOMEs owed, at most `MAX_REPLIES`: the only state a HELLO costs.
    replies: VecDeque<Reply>,
    /// The source of the datagram being taken in, if no peer has it.
    from: Option<SocketAddr>,
    /// The node the transport knows the datagram's source address as.
    source: Option<NodeId>,
    /// Peers proven at new addresses, at most `MAX_MOVES`.
    moves: VecDeque<PeerMoved>,
    /// Peers taken in without being given (`Config::accept_peers`).
    accepted: usize,
    /// Assert every invariant after every operation (tests; debug builds).
    checked: bool,
    /// The window over all the streams' pipes together (`aggregate`).
    aggregate: Aggregate,
    /// The handshakes under way, at most `MAX_GREETINGS`, and those
    /// waiting for a place (`greeting`).
    greetings: Greetings,
}

impl Endpoint {
    /// `incarnation` must be non-zero and larger than any earlier
    /// incarnation of the same node (a restart), e.g. a start timestamp.
    pub fn new(config: Config, node: NodeId, incarnation: u64) -> Result<Self, ConfigError> {
        config.validate()?;
        if incarnation == 0 {
            return Err(ConfigError { field: "incarnation", why: "must be non-zero" });
        }
        let abandon_after = config.abandon_after;
        let aggregate = Aggregate::new(&config);
        Ok(Endpoint {
            deliveries: DeliveryQueue::new(config.delivery_queue_bytes, config.delivery_queue_messages),
            config,
            node,
            incarnation,
            peers: BTreeMap::new(),
            earliest: None,
            deadlines: Deadlines::default(),
            due: Vec::new(),
            greetings: Greetings::default(),
            patience: (abandon_after, Instant::ZERO),
            lateness: (Duration::ZERO, Duration::ZERO),
            ready: ReadyList::default(),
            next_drain: 0,
            events: VecDeque::new(),
            stats: Stats::default(),
            send_arena: BytesMut::new(),
            recv_arena: BytesMut::new(),
            messages: MessagePool::new(),
            unreliable: Default::default(),
            services: Default::default(),
            nacked: Default::default(),
            backlog: 0,
            landing: LandingArea::default(),
            open_buf: Vec::new(),
            refused_report: (Instant::ZERO, Refused::default()),
            secrets: Secrets::new(default_seed(node, incarnation)),
            replies: VecDeque::new(),
            from: None,
            source: None,
            moves: VecDeque::new(),
            accepted: 0,
            checked: cfg!(debug_assertions),
            aggregate,
        })
    }

    /// Seed the handshake's secret (cookies, nonces) with 32 bytes of
    /// entropy. A driver on a real network must: without it the secret is
    /// derived from the node id and incarnation, which is fine for tests
    /// and the simulator (a run replays exactly) and guessable by anyone.
    pub fn seed_secrets(&mut self, seed: [u8; 32]) {
        self.secrets = Secrets::new(seed);
    }

    /// Export the hard state: what a new engine needs to go on as this
    /// one (see `snapshot`).
    pub fn snapshot(&self) -> EndpointSnapshot {
        EndpointSnapshot {
            node: self.node,
            incarnation: self.incarnation,
            peers: self.peers.values().map(Peer::snapshot).collect(),
            deliveries: self.deliveries.iter().cloned().collect(),
            events: self.events.iter().cloned().collect(),
            stats: self.stats.clone(),
        }
    }

    /// Rebuild an endpoint from its hard state at `now`: the same node and
    /// incarnation, every stream where it was, every soft state fresh.
    pub fn restore(config: Config, snapshot: EndpointSnapshot, now: Instant) -> Result<Self, ConfigError> {
        let mut ep = Endpoint::new(config, snapshot.node, snapshot.incarnation)?;
        for d in snapshot.deliveries {
            ep.deliveries.push(d, &mut ep.stats);
        }
        // The snapshot's counters already counted those deliveries.
        ep.stats = snapshot.stats;
        ep.events.extend(snapshot.events);
        for p in snapshot.peers {
            ep.restore_peer(p, now, &mut || {});
        }
        Ok(ep)
    }

    fn restore_peer(&mut self, snapshot: PeerSnapshot, now: Instant, progress: &mut dyn FnMut()) {
        let id = snapshot.node;
        let mut peer = Peer::restore(&self.config, snapshot, now, progress, &mut self.aggregate);
        peer.send.patience = self.patience.0;
        let next = peer.update_timers(&self.config, &mut self.aggregate);
        self.accepted += usize::from(peer.accepted);
        self.ready.list(id, &mut peer.listed);
        self.deadlines.set(id, &mut peer.scheduled, next);
        self.peers.insert(id, peer);
        self.earliest = self.deadlines.earliest(&self.peers);
        // A peer restored before any session was agreed is greeted as a new
        // one is: its messages wait for a session, and the peer, with
        // nothing to send (or restored itself), may never begin one.
        self.with_peer(id, |p, cx, _| p.want_session(cx, now));
    }

    /// Rebuild an endpoint that an engine ran and lost (docs/ENGINE.md,
    /// "Restore"): the same node and incarnation, each stream from what
    /// the backup block and the application kept. Every unsettled message
    /// is cut again as it was (the fragment size follows from the agreed
    /// datagram size) at its original sequence numbers and goes again, so
    /// the peer sees a pause and drops whatever it already had; the
    /// receive side resumes where the application stands, so what the
    /// dead engine held and never acknowledged comes again from the peer.
    pub fn resume(
        config: Config,
        node: NodeId,
        incarnation: u64,
        streams: Vec<crate::ResumedStream>,
        now: Instant,
    ) -> Result<Self, ConfigError> {
        Self::resume_with_progress(config, node, incarnation, streams, now, &mut || {})
    }

    /// `resume`, calling `progress` every so often while it works: a
    /// restore of many messages takes milliseconds, and the engine's
    /// watchdog must see it is not hung (docs/ENGINE.md, "The supervisor").
    pub fn resume_with_progress(
        config: Config,
        node: NodeId,
        incarnation: u64,
        streams: Vec<crate::ResumedStream>,
        now: Instant,
        progress: &mut dyn FnMut(),
    ) -> Result<Self, ConfigError> {
        let mut ep = Endpoint::new(config, node, incarnation)?;
        for s in streams {
            let snapshot = ep.resumed_peer(s, progress);
            ep.restore_peer(snapshot, now, progress);
            progress();
        }
        // The counters start afresh with the new engine; what it took over
        // counts as sent by it, so sent = acknowledged + failed + pending.
        ep.stats.messages_sent = ep.pending_in_logs();
        Ok(ep)
    }

    fn resumed_peer(&self, s: crate::ResumedStream, progress: &mut dyn FnMut()) -> PeerSnapshot {
        let m = s.marks;
        let datagram = if m.max_datagram == 0 { self.config.max_datagram } else { m.max_datagram };
        let max_fragment = self.config.max_fragment_for(datagram.min(self.config.max_datagram));
        let mut segments = Vec::new();
        let mut seq = m.settled_seq;
        for (i, u) in s.messages.iter().enumerate() {
            if i % 256 == 255 {
                progress();
            }
            let msg = m.settled_msg + i as u64;
            let total_len = u.data.len() as u32;
            let bounds = DataFlags::new(true, true).with_channel(u.channel);
            for (flags, data) in crate::send_stream::cut(&u.data, bounds, max_fragment) {
                segments.push(LoggedSegment { seq, msg, flags, total_len, data });
                seq += 1;
            }
        }
        let forgotten_below = s.failures.first().map_or(0, |(f, _)| f.first);
        let log = SendLog {
            epoch: m.epoch,
            acked_upto: m.settled_seq,
            // No size agreed: no session since the stream began (or since
            // the peer's restart began it anew), so nothing went as DATA,
            // whatever the mark written ahead says, and everything is cut
            // again at the size the coming handshake agrees.
            sent_upto: if m.max_datagram == 0 {
                m.settled_seq
            } else {
                m.sent_upto.clamp(m.settled_seq, seq)
            },
            next_seq: seq,
            next_msg: m.settled_msg + s.messages.len() as u64,
            settled_below: m.settled_msg,
            settled_seq: m.settled_seq,
            failures: s.failures.into_iter().collect(),
            forgotten_below,
        };
        let (epoch, delivered_upto) = match s.taken {
            Some((epoch, next)) => (Some(epoch), next),
            None => (None, 0),
        };
        PeerSnapshot {
            node: s.peer,
            incarnation: m.peer_incarnation,
            max_datagram: m.max_datagram,
            tx_pn: m.tx_pn,
            // Unknown: what the dead engine took from the peer. Replayed
            // data is a duplicate by sequence number; see docs/ENGINE.md.
            rx_pn: 0,
            unreachable: false,
            // Not in an engine's records: a peer it took in is resumed as
            // given (it is not moved without a key).
            accepted: false,
            rails: s.rails,
            send: SendSnapshot { log, segments },
            recv: RecvSnapshot { epoch, delivered_upto, partial: None, out_of_order: Vec::new() },
            // An engine's records do not carry the class yet (it is served
            // embedded only).
            nacked: Default::default(),
        }
    }

    /// The endpoint's pool of message buffers, shared: reassembled
    /// messages come from it, and an application that writes its messages
    /// into buffers taken from it (`MessagePool::take`, `MessagePool::seal`)
    /// gets each back once the stream has no more use for it.
    pub fn message_pool(&self) -> MessagePool {
        self.messages.clone()
    }

    /// Buffers for messages reassembled from fragments that wait in the
    /// endpoint's pool to be reused (their number, and their capacity in
    /// bytes): a delivered message's buffer returns there when the
    /// application drops it. Bounded in count and bytes.
    pub fn pooled_buffers(&self) -> (usize, usize) {
        self.messages.held()
    }

    /// The marks an engine backs up for the stream to `peer`.
    pub fn stream_marks(&self, peer: NodeId) -> Option<crate::StreamMarks> {
        let p = self.peers.get(&peer)?;
        let log = p.send.log();
        Some(crate::StreamMarks {
            peer_incarnation: p.incarnation(),
            max_datagram: p.agreed_datagram(),
            epoch: log.epoch,
            settled_msg: log.settled_below,
            settled_seq: log.settled_seq,
            sent_upto: log.sent_upto,
            tx_pn: p.tx_pn(),
        })
    }

    /// Turn the invariant assertions on or off (on by default in debug
    /// builds; tests and the simulator turn them on in release builds).
    pub fn set_invariant_checks(&mut self, on: bool) {
        self.checked = on;
    }

    /// This endpoint's node id.
    pub fn node(&self) -> NodeId {
        self.node
    }
    /// This endpoint's incarnation.
    pub fn incarnation(&self) -> u64 {
        self.incarnation
    }
    /// The configuration it runs with.
    pub fn config(&self) -> &Config {
        &self.config
    }
    /// Its counters.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Run `f` on peer `id` with a context lent from the endpoint's other
    /// fields, then bring the peer's timers and the endpoint's deadline up to
    /// date (and check every invariant, when checks are on). `None` for a
    /// peer the endpoint does not know.
    fn with_peer<R>(
        &mut self,
        id: NodeId,
        f: impl FnOnce(&mut Peer, &mut Context<'_>, &mut LandingArea) -> R,
    ) -> Option<R> {
        let Endpoint {
            config,
            node,
            incarnation,
            peers,
            earliest,
            deadlines,
            deliveries,
            events,
            stats,
            recv_arena,
            messages,
            landing,
            secrets,
            checked,
            from,
            moves,
            aggregate,
            ready,
            greetings,
            backlog,
            unreliable,
            services,
            nacked,
            ..
        } = self;
        let peer = peers.get_mut(&id)?;
        let counted = peer.greeting_counted();
        let mut cx = Context {
            config,
            node: *node,
            incarnation: *incarnation,
            stats,
            events,
            deliveries,
            recv_arena,
            messages,
            secrets,
            from: *from,
            moves,
            aggregate,
            greetings,
            backlog: *backlog,
            unreliable,
            services,
            nacked,
        };
        let out = f(peer, &mut cx, landing);
        greetings.update(counted, peer.greeting_counted());
        let after = peer.update_timers(config, aggregate);
        ready.list(id, &mut peer.listed);
        if *checked {
            peer.check_invariants(config);
        }
        deadlines.set(id, &mut peer.scheduled, after);
        *earliest = deadlines.earliest(peers);
        Some(out)
    }

    /// Work out again, at most every `PATIENCE_EVERY`, how long silence
    /// must last before a peer is given up: `Config::abandon_after`, or
    /// `PATIENCE_RTTS` of this endpoint's slowest conversation (its
    /// smoothed round trip plus four deviations, unclamped) or of how late
    /// its own timers ran, when that is longer; at most `abandon_limit`
    /// (`PATIENCE_CAP` times `abandon_after` by default). An endpoint
    /// starved of CPU (a hundred endpoints on two cores) reads its socket
    /// seconds late: every peer then looks silent, and a fixed five
    /// seconds gave up healthy peers whose handshakes had only queued
    /// behind everyone else's. A round trip that slow is evidence the
    /// endpoint is slow, not that one peer is dead.
    fn update_patience(&mut self, now: Instant) {
        if now < self.patience.1 {
            return;
        }
        let floor = self.config.abandon_after;
        let slowest = self
            .peers
            .values()
            .filter(|p| p.session())
            .map(|p| p.send.rtt.estimate_ns())
            .max()
            .map_or(Duration::ZERO, Duration::from_nanos);
        let late = self.lateness.0.max(self.lateness.1 / 2);
        self.lateness = (Duration::ZERO, late);
        let slowest = slowest.max(late);
        let limit = self.config.abandon_limit.unwrap_or(floor * PATIENCE_CAP);
        let patience = (slowest * PATIENCE_RTTS).clamp(floor, limit);
        let changed = patience != self.patience.0;
        self.patience = (patience, now + PATIENCE_EVERY);
        if !changed {
            return;
        }
        debug!(node = self.node, ?patience, ?slowest, "patience for silent peers");
        for (&id, p) in self.peers.iter_mut() {
            p.send.patience = patience;
            p.scheduled = p.update_timers(&self.config, &mut self.aggregate);
            // Back in line, as after any operation (`with_peer`): the
            // window's room moves as the peers after this one report, and
            // one whose data the room now holds must wait in the held
            // line, or nothing wakes it when the room opens (found by the
            // `engine_state_loss` mix: a stream left waiting for a later
            // timer with data it could send).
            self.ready.list(id, &mut p.listed);
        }
        self.deadlines.rebuild(&self.peers);
        self.earliest = self.deadlines.earliest(&self.peers);
    }

    /// The next peer, from node `from` on, that `pick` selects.
    fn next_peer_from(&self, from: NodeId, pick: impl Fn(&Peer) -> bool) -> Option<NodeId> {
        self.peers.range(from..).find(|(_, p)| pick(p)).map(|(&id, _)| id)
    }

    /// The peer's state, created if new and there is room. A new peer is
    /// greeted at once (a HELLO at the next timeout): after a restart,
    /// every configured peer learns of the new incarnation within a round
    /// trip, not when traffic happens to need a session.
    fn peer_entry(&mut self, id: NodeId) -> Option<&mut Peer> {
        if !self.peers.contains_key(&id) {
            if self.peers.len() >= MAX_PEERS {
                return None;
            }
            let mut peer = Peer::new(id, &self.config, &mut self.aggregate);
            peer.send.patience = self.patience.0;
            self.peers.insert(id, peer);
            self.with_peer(id, |p, cx, _| p.want_session(cx, Instant::ZERO));
        }
        self.peers.get_mut(&id)
    }

    /// Know `peer`, reached over rail 0 until `set_paths` says otherwise.
    /// Sending needs a known peer. Adding one already known changes nothing.
    pub fn add_peer(&mut self, peer: NodeId) -> Result<(), PathError> {
        if peer == self.node {
            return Err(PathError::SelfPeer);
        }
        let p = self.peer_entry(peer).ok_or(PathError::TooManyPeers)?;
        // Given by the application now: no longer moved without a key.
        p.accepted = false;
        Ok(())
    }

    /// Begin a handshake with `peer` now, so the first message does not
    /// wait for one (sending begins one anyway). Nothing if a session
    /// exists or a handshake is under way.
    pub fn connect(&mut self, now: Instant, peer: NodeId) -> Result<(), SendError> {
        self.with_peer(peer, |p, cx, _| p.want_session(cx, now)).ok_or(SendError::UnknownPeer(peer))
    }

    /// Is `peer` known (added, given paths, or heard from)?
    pub fn knows(&self, peer: NodeId) -> bool {
        self.peers.contains_key(&peer)
    }

    /// Queue a message for `peer`. The bytes are copied once, into the
    /// sender-based log that retransmissions are served from.
    pub fn send(&mut self, now: Instant, peer: NodeId, msg: &[u8]) -> Result<MessageId, SendError> {
        self.check_send(peer, msg.len())?;
        let data = copy_to_bytes(&mut self.send_arena, msg);
        self.queue(now, peer, data, Channel::APP)
    }

    /// Queue a message the application hands over whole: the log keeps
    /// these very bytes (they are immutable and reference-counted), so the
    /// only copy made of them is into each datagram, fused with the
    /// checksum. The send buffer's limits count `msg.len()`, not whatever
    /// larger buffer it may be a slice of.
    pub fn send_bytes(&mut self, now: Instant, peer: NodeId, msg: Bytes) -> Result<MessageId, SendError> {
        self.check_send(peer, msg.len())?;
        self.queue(now, peer, msg, Channel::APP)
    }

    /// Queue a message for `peer` on `channel`, handed over whole as
    /// `send_bytes` does: a layer riding the stream (tether's calls) sends
    /// its messages so, in order with the application's, and the peer's
    /// endpoint delivers them on the same channel (`recv_on`).
    pub fn send_on(
        &mut self,
        now: Instant,
        peer: NodeId,
        channel: Channel,
        msg: Bytes,
    ) -> Result<MessageId, SendError> {
        self.check_send(peer, msg.len())?;
        self.queue(now, peer, msg, channel)
    }

    /// `send_on` for a message held as a slice: copied once, into the send
    /// log's arena, as `send` copies a message.
    pub fn send_on_slice(
        &mut self,
        now: Instant,
        peer: NodeId,
        channel: Channel,
        msg: &[u8],
    ) -> Result<MessageId, SendError> {
        self.check_send(peer, msg.len())?;
        let data = copy_to_bytes(&mut self.send_arena, msg);
        self.queue(now, peer, data, channel)
    }

    /// Send `msg` to `peer` unreliably (the UNR class, `crate::unreliable`):
    /// once, whole, in a DATAGRAM frame, never acknowledged, ordered or
    /// sent again. It waits for the session with the peer if there is none
    /// yet. `Ok(false)`: the peer's queue was full, and the message is
    /// dropped (and counted); that is the class's answer to overload, not
    /// an error. Refused (`MessageTooLarge`) if it cannot fit a datagram of
    /// this endpoint's size.
    pub fn send_unreliable(&mut self, peer: NodeId, msg: &[u8]) -> Result<bool, SendError> {
        self.send_datagram(peer, tether_wire::PORT_APPLICATION, msg)
    }

    /// Queue `msg` for `port` of `peer`'s datagrams (the application's
    /// unreliable messages, or a service's).
    fn send_datagram(&mut self, peer: NodeId, port: u8, msg: &[u8]) -> Result<bool, SendError> {
        if peer == self.node {
            return Err(SendError::SelfSend);
        }
        let max = self.max_unreliable_len();
        if msg.len() > max {
            return Err(SendError::MessageTooLarge { len: msg.len(), max });
        }
        let Endpoint { peers, config, stats, messages, ready, .. } = self;
        let Some(p) = peers.get_mut(&peer) else { return Err(SendError::UnknownPeer(peer)) };
        let mut buf = messages.take(msg.len());
        buf.extend_from_slice(msg);
        let queued = p.unreliable.offer(port, messages.seal(buf), config, stats);
        if queued {
            ready.list(peer, &mut p.listed);
        }
        Ok(queued)
    }

    /// The largest unreliable message: what one DATAGRAM frame holds in a
    /// datagram of this endpoint's size beside a CONFIRM (which rides in
    /// every datagram until the peer shows it knows us), so a message
    /// always fits the next datagram. A peer that agreed a smaller size
    /// drops larger ones, counted.
    pub fn max_unreliable_len(&self) -> usize {
        let trailer = if self.config.key.is_some() {
            tether_wire::AUTH_TRAILER_LEN
        } else {
            tether_wire::MAX_TRAILER_LEN
        };
        self.config.max_datagram
            - tether_wire::HEADER_LEN
            - trailer
            - tether_wire::DATAGRAM_FIXED_LEN
            - tether_wire::HANDSHAKE_LEN
    }

    /// The next unreliable message received, if any.
    pub fn recv_unreliable(&mut self) -> Option<crate::Unreliable> {
        self.unreliable.take()
    }

    /// Is an unreliable message waiting for the application?
    pub fn has_unreliable(&self) -> bool {
        !self.unreliable.is_empty()
    }

    /// Send `msg` to `peer` for `service` (`Service`: the cluster's own
    /// protocols), as an unreliable message on the service's port: once,
    /// whole, never acknowledged; `Ok(false)` when the queue to the peer
    /// was full (dropped, counted). The service repeats what it must.
    pub fn send_service(
        &mut self,
        peer: NodeId,
        service: crate::Service,
        msg: &[u8],
    ) -> Result<bool, SendError> {
        self.send_datagram(peer, service.port(), msg)
    }

    /// Is a datagram waiting for any service?
    pub fn has_service_datagrams(&self) -> bool {
        self.services.iter().any(|q| !q.is_empty())
    }

    /// The next datagram received for `service`, if any.
    pub fn recv_service(&mut self, service: crate::Service) -> Option<crate::Unreliable> {
        self.services[service.index()].take()
    }

    /// Send `msg` to `peer` in the NACK-reliable class (`crate::nacked`):
    /// sent once, held for `Config::nacked_hold` for the peer to ask for
    /// again, never acknowledged; `Event::Nacked` says what became of it.
    /// Its number in the class's sequence to `peer`.
    /// `WouldBlock`: the hold is full (it empties as `nacked_hold` passes).
    pub fn send_nacked(&mut self, now: Instant, peer: NodeId, msg: &[u8]) -> Result<u64, SendError> {
        if peer == self.node {
            return Err(SendError::SelfSend);
        }
        let max = self.max_nacked_len();
        if msg.len() > max {
            return Err(SendError::MessageTooLarge { len: msg.len(), max });
        }
        if !self.peers.contains_key(&peer) {
            return Err(SendError::UnknownPeer(peer));
        }
        self.with_peer(peer, |p, cx, _| {
            p.want_session(cx, now);
            p.send_nacked(cx, now, msg)
        })
        .flatten()
        .ok_or(SendError::WouldBlock)
    }

    /// The number the next NACK-reliable message to `peer` will get
    /// (`None`: an unknown peer), for a message that names itself.
    pub fn nacked_next(&self, peer: NodeId) -> Option<u64> {
        self.peers.get(&peer).map(|p| p.nacked_next())
    }

    /// The largest NACK-reliable message: an unreliable one less the
    /// class's header.
    pub fn max_nacked_len(&self) -> usize {
        self.max_unreliable_len() - crate::nacked::MSG_HEADER
    }

    /// The next NACK-reliable message delivered, if any: each sender's in
    /// order, once each.
    pub fn recv_nacked(&mut self) -> Option<crate::Nacked> {
        self.nacked.pop()
    }

    /// Is a NACK-reliable message waiting for the application?
    pub fn has_nacked(&self) -> bool {
        !self.nacked.is_empty()
    }

    /// Queue a message behind small ones that wait for company to share a
    /// datagram (the coalescing delay), when that is all it does: no timer
    /// moves and nothing becomes due, so the caller needs neither the time
    /// nor a transmit attempt. `None`: not so (or the message is refused);
    /// `send` it, which says why. The fast path of a stream of small
    /// messages: most of them join the ones before (the 8 B stream of `tether stream`).
    pub fn join_waiting(&mut self, peer: NodeId, msg: &[u8]) -> Option<MessageId> {
        self.join(peer, msg.len(), |arena| copy_to_bytes(arena, msg))
    }

    /// `join_waiting` for a message handed over whole (as `send_bytes`).
    pub fn join_waiting_bytes(&mut self, peer: NodeId, msg: &Bytes) -> Option<MessageId> {
        self.join(peer, msg.len(), |_| msg.clone())
    }

    /// Queue the message `data` makes (only once it is known to join) if
    /// it joins waiting data on `peer`'s stream.
    fn join(
        &mut self,
        peer: NodeId,
        len: usize,
        data: impl FnOnce(&mut BytesMut) -> Bytes,
    ) -> Option<MessageId> {
        self.check_send(peer, len).ok()?;
        let p = self.peers.get_mut(&peer)?;
        if !(p.session() && p.send.joins_waiting(len, self.aggregate.room())) {
            return None;
        }
        let seq = p.send.push_waiting(data(&mut self.send_arena));
        self.stats.messages_sent += 1;
        if self.checked {
            // The claim that nothing moved, checked: the timer table
            // against the state it guards, and the counters.
            p.check_invariants(&self.config);
            self.check_counters();
        }
        Some(MessageId { peer, seq })
    }

    fn queue(
        &mut self,
        now: Instant,
        peer: NodeId,
        data: Bytes,
        channel: Channel,
    ) -> Result<MessageId, SendError> {
        let seq = self
            .with_peer(peer, |p, cx, _| {
                let max_fragment = cx.config.max_fragment_for(p.max_datagram(cx.config));
                let seq = p.send.push_message(now, data, max_fragment, channel);
                p.want_session(cx, now);
                seq
            })
            .ok_or(SendError::UnknownPeer(peer))?;
        self.stats.messages_sent += 1;
        if self.checked {
            self.check_counters();
        }
        Ok(MessageId { peer, seq })
    }

    fn check_send(&self, peer: NodeId, len: usize) -> Result<(), SendError> {
        if peer == self.node {
            return Err(SendError::SelfSend);
        }
        if len > self.config.max_message_len {
            return Err(SendError::MessageTooLarge { len, max: self.config.max_message_len });
        }
        let Some(p) = self.peers.get(&peer) else { return Err(SendError::UnknownPeer(peer)) };
        let pending = p.send.pending_messages();
        if pending == 0 {
            // An empty buffer takes any message the size limit allows.
            return Ok(());
        }
        let segments = len.div_ceil(self.config.max_fragment_for(p.max_datagram(&self.config))).max(1);
        let cost = len + segments * SEGMENT_COST;
        if pending >= self.config.send_buffer_messages as u64
            || p.send.memory() + cost > self.config.send_buffer_bytes
        {
            return Err(SendError::WouldBlock);
        }
        Ok(())
    }

    /// Room for another `len`-byte message to `peer` right now.
    pub fn can_send(&self, peer: NodeId, len: usize) -> bool {
        self.check_send(peer, len).is_ok()
    }

    /// The rails that lead to `peer` (the runtime's address book knows
    /// each rail's remote address); adds the peer if it is new. Until this
    /// is called a peer is reached over rail 0 alone. With two or more,
    /// each path's health is tracked and data fails over between them
    /// (see `paths`).
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
        // Given by the application now: no longer moved without a key.
        self.peer_entry(peer).ok_or(PathError::TooManyPeers)?.accepted = false;
        self.with_peer(peer, |p, _, _| p.paths.set_rails(Instant::ZERO, rails));
        Ok(())
    }

    /// The paths to `peer`: state, round trip, counters (empty for a peer
    /// this endpoint has no state for).
    pub fn paths(&self, peer: NodeId) -> Vec<PathInfo> {
        self.peers.get(&peer).map(|p| p.paths.info().collect()).unwrap_or_default()
    }

    /// The congestion state of the stream toward `peer` (`None`: no
    /// state for it).
    pub fn congestion(&self, peer: NodeId) -> Option<crate::CongestionInfo> {
        self.peers.get(&peer).map(|p| p.send.congestion())
    }

    /// The endpoint's window over all its streams together: its size,
    /// what they have in flight (as each last reported), its state.
    pub fn aggregate(&self) -> crate::CongestionInfo {
        self.aggregate.info()
    }

    /// Take in one received datagram, from rail 0. Anything wrong with it
    /// is a counted drop.
    pub fn handle_datagram(&mut self, now: Instant, datagram: &[u8]) {
        self.handle_datagram_from(now, 0, Origin::Untold, datagram);
    }

    /// Take in one datagram that arrived over `rail`, from a source the
    /// transport cannot name.
    pub fn handle_datagram_on(&mut self, now: Instant, rail: RailId, datagram: &[u8]) {
        self.handle_datagram_from(now, rail, Origin::Untold, datagram);
    }

    /// Take in one datagram that arrived over `rail` from `origin`.
    pub fn handle_datagram_from(&mut self, now: Instant, rail: RailId, origin: Origin, datagram: &[u8]) {
        if now >= self.refused_report.0 {
            self.report_refused(now);
        }
        self.stats.datagrams_received += 1;
        self.stats.bytes_received += datagram.len() as u64;
        let from = match origin {
            // Only a holder of the cluster key can prove itself at an
            // address no peer has; without one, nothing from there is
            // taken unless the endpoint takes in anyone (`accept_unkeyed`).
            Origin::Stranger(addr) if self.config.key.is_some() || self.accepts_unkeyed() => Some(addr),
            Origin::Stranger(_) => {
                self.stats.unknown_source += 1;
                trace!(len = datagram.len(), rail, "dropped: from an address no peer has");
                return;
            }
            Origin::Node(_) | Origin::Untold => None,
        };
        self.from = from;
        self.source = match origin {
            Origin::Node(n) => Some(n),
            _ => None,
        };
        if self.take_datagram(now, rail, datagram) == Taken::Accepted {
            // The node it came from is a peer now: its CONFIRM (and any
            // data behind it) is taken again, as a peer's.
            self.take_datagram(now, rail, datagram);
        }
        self.from = None;
    }

    /// The rest of `handle_datagram_from`, once the origin is settled.
    fn take_datagram(&mut self, now: Instant, rail: RailId, datagram: &[u8]) -> Taken {
        let unverified = match Unverified::parse(datagram) {
            Ok(u) => u,
            Err(e) => {
                trace!(len = datagram.len(), error = %e, "dropped: malformed datagram");
                self.stats.count_wire_error(e);
                return Taken::Done;
            }
        };
        let src = unverified.header.src_node;
        let authenticated = unverified.header.flags.authenticated();
        if unverified.auth() != self.config.key.as_ref().map(|k| k.auth()) {
            // With a cluster key nothing unauthenticated is taken, nor
            // anything protected by another algorithm (peers agree on one);
            // without one an authenticated datagram cannot be checked.
            match (authenticated, &self.config.key) {
                (false, _) => self.stats.auth_missing += 1,
                (true, None) => self.stats.auth_unexpected += 1,
                (true, Some(_)) => self.stats.auth_mismatch += 1,
            }
            debug!(src, auth = ?unverified.auth(), "dropped: authentication does not match this endpoint's");
            return Taken::Done;
        }
        let key = if authenticated { self.rx_key(&unverified.header) } else { None };
        // Authenticated datagrams are opened in a scratch buffer (they are
        // decrypted in place); lent out of the endpoint for the call.
        let mut scratch = std::mem::take(&mut self.open_buf);
        let taken = self.take_verified(now, rail, unverified, key.as_ref(), &mut scratch);
        self.open_buf = scratch;
        taken
    }

    /// Does this endpoint take in peers it was not given from anyone,
    /// key or none?
    fn accepts_unkeyed(&self) -> bool {
        self.config.accept_unkeyed && self.config.accept_peers > 0
    }

    /// The rest of `handle_datagram_from`, once the header is parsed.
    fn take_verified(
        &mut self,
        now: Instant,
        rail: RailId,
        unverified: Unverified<'_>,
        key: Option<&MacKey>,
        scratch: &mut Vec<u8>,
    ) -> Taken {
        let src = unverified.header.src_node;
        let len = unverified.len();
        // Verify while copying each payload to where it will live: the
        // receive half of the fused copy + checksum (see `landing`).
        let stream = self.peers.get_mut(&src).map(|p| &mut p.recv);
        // Asked once: a datagram costs a search of the peer table each
        // time it is asked, and at 255 peers those searches miss the cache.
        let known = stream.is_some();
        let mut lander = self.landing.lander(len, stream, self.config.recv_window, &self.messages);
        let verified = match key {
            Some(key) => unverified.open(key, scratch).and_then(|o| o.land(&mut lander)),
            None => unverified.verify_landing(&mut lander),
        };
        let authenticated = key.is_some();
        let packet = match verified {
            Ok(p) => p,
            Err(e) => {
                trace!(src, len, error = %e, "dropped: failed verification");
                if authenticated && e == WireError::ChecksumMismatch {
                    self.stats.mac_failures += 1;
                    return Taken::Done;
                }
                self.stats.count_wire_error(e);
                return Taken::Done;
            }
        };
        let h = packet.header;
        if !authenticated && !self.config.accepts(h.checksum) {
            // A sender (or a bit flip) must not be able to downgrade
            // integrity checking to an algorithm this endpoint refuses.
            self.stats.checksum_refused += 1;
            debug!(src, checksum = ?h.checksum, "dropped: checksum algorithm refused");
            return Taken::Done;
        }
        if h.dst_node != self.node || h.src_node == self.node {
            self.stats.misdirected += 1;
            trace!(src, dst = h.dst_node, "dropped: misdirected");
            return Taken::Done;
        }
        if self.source.is_some_and(|n| n != src) {
            // After verification, so a corrupted node id counts as
            // corruption, not as an attack.
            self.stats.source_mismatch += 1;
            debug!(
                claimed = src,
                source = self.source,
                "dropped: header names another node than its source address"
            );
            return Taken::Done;
        }
        let first = packet.frames().next();
        if !known {
            // After the checksum, so corruption of a node id counts as
            // corruption; a stranger costs a verifying pass, no state,
            // unless it is one to take in (`accept`).
            if let Some(Frame::Handshake(f)) = &first {
                if self.may_accept(authenticated) {
                    let alone = packet.frames().nth(1).is_none();
                    return self.accept(now, rail, &h, f, alone, packet.datagram_len());
                }
            }
            self.stats.strangers_refused += 1;
            debug!(src, "dropped: a node id this endpoint was not given");
            return Taken::Done;
        }
        if self.from.is_some() && !authenticated && !self.peers.get(&src).is_some_and(|p| p.accepted) {
            // Without a key (`accept_unkeyed`) only a peer taken in that
            // way may move: a configured one's address is the
            // application's word, which nobody without the key overrules.
            self.stats.unknown_source += 1;
            debug!(src, rail, "dropped: a configured peer's node id from an address no peer has, unkeyed");
            return Taken::Done;
        }
        if self.from.is_some()
            && !matches!(&first, Some(Frame::Handshake(f)) if f.kind != HandshakeKind::Welcome)
        {
            // From an address no peer has, only a HELLO or a CONFIRM (which
            // proves the address before anything behind it is taken).
            self.stats.unknown_source += 1;
            trace!(src, rail, "dropped: from an address no peer has, and no handshake");
            return Taken::Done;
        }
        if let Some(Frame::Handshake(f)) = first {
            if f.kind == HandshakeKind::Hello {
                // Alone in its datagram (but for padding), or it could be
                // an amplifier's trick.
                let alone = packet.frames().nth(1).is_none();
                self.on_hello(now, rail, &h, &f, alone, packet.datagram_len());
                return Taken::Done;
            }
        }
        self.with_peer(src, |p, cx, landing| p.handle_packet(cx, now, rail, &packet, landing));
        Taken::Done
    }

    /// Log what was refused since the last report, by reason, at most once
    /// a second: a flood of forged traffic is visible in the log without
    /// one line per datagram.
    ///
    /// The application hears of it too, as an `Event::Refused`: one
    /// waiting at a time (a report while one is unread is added to it),
    /// so refused traffic the application never looks at takes no room.
    fn report_refused(&mut self, now: Instant) {
        self.refused_report.0 = now + core::time::Duration::from_secs(1);
        let total = Refused::from_stats(&self.stats);
        let last = std::mem::replace(&mut self.refused_report.1, total);
        let new = total.since(&last);
        if new.is_empty() {
            return;
        }
        warn!(node = self.node, causes = %new.causes().join("; "), "refused datagrams in the last second or more");
        new.report(&mut self.events, now);
    }

    /// The key `header`'s datagram was authenticated with, if the cluster
    /// key is set: the session's (derived once) when the header names the
    /// session's incarnations, else derived for the ones it names (a
    /// handshake, or a datagram the session checks will refuse).
    fn rx_key(&mut self, header: &Header) -> Option<MacKey> {
        let ck = self.config.key.as_ref()?;
        let (src, node, inc) = (header.src_node, self.node, self.incarnation);
        if header.dst_inc == inc {
            if let Some(p) = self.peers.get_mut(&src) {
                if p.session() && header.src_inc == p.incarnation() {
                    return p.session_keys(&self.config, node, inc).map(|k| k.rx.clone());
                }
            }
        }
        Some(ck.datagram_key(src, header.src_inc, header.dst_node, header.dst_inc))
    }

    /// A HELLO (from a peer, or a node this endpoint may take in): answer
    /// with a WELCOME carrying a cookie, and keep nothing else (see
    /// `handshake`). The WELCOME accepts no more than the HELLO's own
    /// length (what the path here carried) and is padded to what it
    /// accepts: never larger than the HELLO.
    fn on_hello(
        &mut self,
        now: Instant,
        rail: RailId,
        h: &Header,
        f: &HandshakeFrame,
        alone: bool,
        len: usize,
    ) {
        if h.src_inc == 0 || !alone {
            self.stats.handshakes_refused += 1;
            debug!(src = h.src_node, "handshake: dropped a HELLO with no incarnation or company");
            return;
        }
        if self.replies.len() >= MAX_REPLIES {
            self.stats.handshake_replies_dropped += 1;
            trace!(src = h.src_node, "handshake: answers full, HELLO dropped");
            return;
        }
        let slot = cookie_slot(now);
        let ours = (self.node, self.incarnation);
        let cookie = self.secrets.cookie(h.src_node, h.src_inc, f.nonce, ours, slot, self.from);
        let frame = HandshakeFrame {
            kind: HandshakeKind::Welcome,
            max_datagram: self.config.max_datagram.min(len).min(f.max_datagram as usize) as u32,
            nonce: f.nonce,
            cookie,
        };
        let pn = match (&self.config.key, self.peers.contains_key(&h.src_node)) {
            (Some(_), false) => {
                Some(self.secrets.welcome_pn(&frame, (h.src_node, h.src_inc), ours, self.from))
            }
            _ => None,
        };
        self.replies.push_back(Reply {
            to: h.src_node,
            rail,
            to_inc: h.src_inc,
            to_addr: self.from,
            frame,
            pn,
        });
        self.stats.hellos_answered += 1;
        trace!(node = self.node, peer = h.src_node, queued = self.replies.len(), "handshake: HELLO answered");
    }

    /// May a node this endpoint was not given be taken in, its datagrams
    /// `authenticated` (with the cluster key) or not?
    fn may_accept(&self, authenticated: bool) -> bool {
        (authenticated || self.config.accept_unkeyed) && self.accepted < self.config.accept_peers
    }

    /// A handshake from a node this endpoint was not given, which it may
    /// take in (docs/PROTOCOL.md, "Accepting peers"). A HELLO is answered
    /// as any is, keeping nothing. A CONFIRM whose cookie this endpoint
    /// made for that node, incarnation and address (so the node received
    /// the WELCOME there, and with a key, holds it) makes the node a peer,
    /// reached over the rail it came in on: the caller then takes the
    /// datagram again, as the peer's, which completes the session.
    fn accept(
        &mut self,
        now: Instant,
        rail: RailId,
        h: &Header,
        f: &HandshakeFrame,
        alone: bool,
        len: usize,
    ) -> Taken {
        match f.kind {
            HandshakeKind::Hello => {
                self.on_hello(now, rail, h, f, alone, len);
                return Taken::Done;
            }
            HandshakeKind::Welcome => {
                self.stats.strangers_refused += 1;
                return Taken::Done;
            }
            HandshakeKind::Confirm => {}
        }
        let (node, ours) = (h.src_node, (self.node, self.incarnation));
        if h.dst_inc != self.incarnation
            || h.src_inc == 0
            || !self.secrets.cookie_valid(f.cookie, (node, h.src_inc, f.nonce), ours, now, self.from)
        {
            self.stats.handshakes_refused += 1;
            debug!(src = node, "handshake: dropped a stranger's CONFIRM whose cookie does not check");
            return Taken::Done;
        }
        if self.peers.len() >= MAX_PEERS {
            self.stats.strangers_refused += 1;
            return Taken::Done;
        }
        // Not greeted (`peer_entry`): its CONFIRM, taken again, makes the session.
        let mut peer = Peer::new(node, &self.config, &mut self.aggregate);
        peer.send.patience = self.patience.0;
        peer.accepted = true;
        peer.paths.set_rails(now, &[rail]);
        self.peers.insert(node, peer);
        self.accepted += 1;
        self.stats.peers_accepted += 1;
        self.events.push_back(Event::PeerAccepted { peer: node, rail, addr: self.from, at: now });
        tracing::info!(node = self.node, peer = node, rail, addr = ?self.from, "took in a peer not given");
        Taken::Accepted
    }

    /// The next peer proven at a new address (oldest first): the driver
    /// sends to it there from now on, and takes its datagrams from there
    /// as its own (docs/PROTOCOL.md, "Handshake").
    pub fn poll_moved(&mut self) -> Option<PeerMoved> {
        self.moves.pop_front()
    }

    /// Build the oldest owed WELCOME into `buf`.
    fn poll_reply(&mut self, buf: &mut [u8]) -> Option<Transmit> {
        let r = self.replies.pop_front()?;
        let header = Header {
            flags: HeaderFlags::default(),
            checksum: self.config.checksum,
            src_node: self.node,
            dst_node: r.to,
            src_inc: self.incarnation,
            dst_inc: r.to_inc,
            epoch: 0,
            probe: 0,
        };
        let cap = buf.len().min(self.config.max_datagram);
        let mut w = match &self.config.key {
            Some(ck) => {
                let key = ck.datagram_key(self.node, self.incarnation, r.to, r.to_inc);
                // The peer's own counter: a number is never used twice
                // toward one node, whoever sends.
                let pn = match r.pn {
                    Some(pn) => pn,
                    None => self.peers.get_mut(&r.to)?.next_pn(),
                };
                PacketWriter::new_authenticated(&mut buf[..cap], &header, &key, pn).ok()?
            }
            None => PacketWriter::new(&mut buf[..cap], &header).ok()?,
        };
        w.push_handshake(&r.frame).ok()?;
        w.pad_to(r.frame.max_datagram as usize);
        let len = w.finish();
        self.stats.datagrams_sent += 1;
        self.stats.bytes_sent += len as u64;
        trace!(node = self.node, peer = r.to, "handshake: WELCOME sent");
        Some(Transmit { dst: r.to, len, rail: r.rail, to_addr: r.to_addr })
    }

    /// The rails (a bit each) whose sockets this turn may have left unread
    /// (its receive budget spent, or a receive that took one datagram
    /// alone); 0 when every socket was read to the end. A
    /// driver that bounds its receives tells the core before
    /// `handle_timeout`: a path over such a rail is not judged silent
    /// while its answer may be waiting there, unread.
    pub fn set_backlog(&mut self, rails: u8) {
        self.backlog = rails;
    }

    /// Run the timers that have expired by `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        if let Some(due) = self.earliest {
            // The driver is asked to call at `due`; a thread that got the
            // CPU late calls later, and its peers' answers wait as long.
            self.lateness.0 = self.lateness.0.max(now.saturating_since(due));
        }
        self.update_patience(now);
        let mut due = core::mem::take(&mut self.due);
        self.deadlines.take_due(now, &mut self.peers, &mut due);
        for &id in &due {
            self.with_peer(id, |p, cx, _| p.handle_timeout(cx, now));
        }
        due.clear();
        self.due = due;
        // A peer taken as due and then left as it was (nothing there was
        // due after all) is down again through `with_peer`; one that is
        // gone would leave the deadline stale.
        self.earliest = self.deadlines.earliest(&self.peers);
        if self.checked {
            self.check_counters();
        }
    }

    /// The earliest time `handle_timeout` must be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.earliest
    }

    /// Build the next datagram into `buf` (at most `config.max_datagram`
    /// bytes are used). ACKs ride on data when there is any; small messages
    /// queued for the same peer share one datagram. What a timer makes due
    /// (coalesced or paced data, a delayed ACK, a probe) goes once
    /// `handle_timeout` has been called for it, as the driver's loop does.
    pub fn poll_transmit(&mut self, now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        if !self.replies.is_empty() {
            return self.poll_reply(buf);
        }
        self.release_held();
        self.admit_greetings(now);
        // Each peer in line at most once per call: one that wants to send
        // but makes nothing goes to the back, as one that sent does.
        for _ in 0..self.ready.ready.len() {
            let Some(id) = self.ready.ready.pop_front() else { break };
            let room = self.aggregate.room();
            let Some(p) = self.peers.get_mut(&id) else { continue };
            p.listed.ready = false;
            if !p.wants_transmit(now, &self.config, room) {
                if p.send.held_by(room) {
                    self.ready.hold(id, &mut p.listed);
                }
                // Its timers were set under the window as it was then: a
                // stream the window held has no timer for data it may
                // send later (paced, or waiting for company) now.
                let after = p.update_timers(&self.config, &mut self.aggregate);
                self.deadlines.set(id, &mut p.scheduled, after);
                self.earliest = self.deadlines.earliest(&self.peers);
                continue;
            }
            // `with_peer` puts it back in line: it may have more.
            if let Some(t) = self.with_peer(id, |p, cx, _| p.poll_transmit(cx, now, buf)).flatten() {
                return Some(t);
            }
        }
        if self.checked {
            let room = self.aggregate.room();
            for (id, p) in &self.peers {
                // A held peer waits for a datagram's worth of room (it
                // comes back with the next ACK, as something is in flight);
                // one whose timer is due comes back through
                // `handle_timeout`, which the driver calls next.
                let due = p.next_timeout().is_some_and(|t| t <= now);
                assert!(
                    p.listed.ready || p.listed.held || due || !p.wants_transmit(now, &self.config, room),
                    "peer {id} wants to send and is not in line"
                );
            }
        }
        None
    }

    /// Handshakes that waited for a place begin, oldest first, while there
    /// are places.
    fn admit_greetings(&mut self, now: Instant) {
        while let Some(id) = self.greetings.next() {
            let waits = self.peers.get_mut(&id).is_some_and(|p| p.greeting.take());
            if waits {
                self.with_peer(id, |p, cx, _| p.admitted(cx, now));
            }
        }
    }

    /// Streams whose data waited for the endpoint's window go back in
    /// line, oldest first, one per datagram's worth of room it has now.
    fn release_held(&mut self) {
        for _ in 0..self.aggregate.releasable().min(self.ready.held.len()) {
            let Some(id) = self.ready.held.pop_front() else { break };
            if let Some(p) = self.peers.get_mut(&id) {
                p.listed.held = false;
                self.ready.list(id, &mut p.listed);
            }
        }
    }

    /// An event waits for the application.
    pub fn has_events(&self) -> bool {
        !self.events.is_empty()
    }

    /// The next event for the application, if any.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// The next delivery, on any channel (`Delivery::channel`), in
    /// per-peer send order.
    pub fn recv(&mut self) -> Option<Delivery> {
        self.take(None)
    }

    /// The next application message (`Channel::APP`), in per-peer send
    /// order; other channels' messages waiting before it stay for them.
    pub fn recv_message(&mut self) -> Option<Delivery> {
        self.take(Some(Channel::APP))
    }

    /// The next message on `channel`, in per-peer send order; other
    /// channels' messages waiting before it stay for them.
    pub fn recv_on(&mut self, channel: Channel) -> Option<Delivery> {
        self.take(Some(channel))
    }

    /// The next delivery, or the next on one channel. In fragment mode
    /// taking is the commit point and must go in order: a channel's
    /// message is taken only from the front.
    fn take(&mut self, channel: Option<Channel>) -> Option<Delivery> {
        let was_full = !self.deliveries.has_room();
        let d = match channel {
            None => self.deliveries.pop()?,
            Some(channel) if self.config.deliver_fragments => {
                if self.deliveries.front_channel()? != channel {
                    return None;
                }
                self.deliveries.pop()?
            }
            Some(channel) => self.deliveries.pop_channel(channel)?,
        };
        if let Some(f) = d.fragment {
            // The commit point (fragment mode): now it may be acknowledged.
            if let Some(p) = self.peers.get_mut(&d.from) {
                p.recv.on_taken(f.epoch, f.seq + 1);
                // Its ACK may be owed now, at once: the delayed-ACK timer
                // follows (reading the table without setting it left the
                // timer stale, found by the `engine_state_loss` mix).
                self.ready.list(d.from, &mut p.listed);
                let after = p.update_ack_timer();
                self.deadlines.set(d.from, &mut p.scheduled, after);
                self.earliest = self.deadlines.earliest(&self.peers);
            }
        }
        if was_full {
            // Room again: segments that waited for it go in now, and their
            // senders hear so at once. The waiting peers take turns at
            // being first, so one busy stream cannot keep the room from
            // the others (found by the `tight` mix: a stream starved until
            // its sender gave it up).
            let start = self.next_drain;
            let (mut from, mut wrapped) = (start, false);
            while self.deliveries.has_room() {
                let next = self.next_peer_from(from, |p| p.recv.waits_for_room());
                let id = match next {
                    Some(id) if !wrapped || id < start => id,
                    None if !wrapped => {
                        (from, wrapped) = (0, true);
                        continue;
                    }
                    _ => break,
                };
                self.with_peer(id, |p, cx, _| p.on_delivery_room(cx));
                self.next_drain = id.wrapping_add(1);
                match id.checked_add(1) {
                    Some(n) => from = n,
                    None if !wrapped => (from, wrapped) = (0, true),
                    None => break,
                }
            }
        }
        Some(d)
    }

    /// The length of what `recv` would return next: an engine takes it
    /// only once its application's ring has room (in fragment mode taking
    /// is the commit point).
    pub fn next_delivery_len(&self) -> Option<usize> {
        self.deliveries.front_len()
    }

    /// The length of what `recv_message` would return next: a batch
    /// receive takes it only if its buffer has room.
    pub fn next_message_len(&self) -> Option<usize> {
        match self.config.deliver_fragments {
            true => {
                (self.deliveries.front_channel()? == Channel::APP).then(|| self.deliveries.front_len())?
            }
            false => self.deliveries.front_len_on(Channel::APP),
        }
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

    /// Where a sent message stands.
    pub fn message_state(&self, id: MessageId) -> MessageState {
        match self.peers.get(&id.peer) {
            Some(p) => p.send.message_state(id.seq),
            None => MessageState::Unknown,
        }
    }

    /// The id the next message to `peer` gets (`None`: a peer never
    /// added): a batch sent in shares checks that nobody else's message
    /// came between two of them.
    pub fn next_message_id(&self, peer: NodeId) -> Option<MessageId> {
        self.peers.get(&peer).map(|p| MessageId { peer, seq: p.send.log().next_msg })
    }

    /// The sequence below which every message sent to `peer` is settled
    /// (acknowledged, or failed and reported by an event first): what an
    /// engine tells its application in one number instead of a state per
    /// message. `None` for a peer never added.
    pub fn settled_below(&self, peer: NodeId) -> Option<u64> {
        self.peers.get(&peer).map(|p| p.send.settled_below())
    }

    /// Check every stream's invariants without trusting any of them: the
    /// first broken, and whose (a pass over the segments). An engine runs
    /// this as part of its self-test: state its own memory corrupted is
    /// found before it settles messages that never arrived or stalls a
    /// stream (Zhou et al. [FTGM] section 4).
    pub fn audit(&self) -> Result<(), StateFault> {
        for (&peer, p) in &self.peers {
            p.audit(&self.config).map_err(|what| StateFault { peer, what })?;
        }
        Ok(())
    }

    /// Check buffered payloads against the digests taken when they were
    /// buffered (`Config::verify_payloads`), a slice at a time, so that a
    /// pass over every buffered byte (up to `send_buffer_bytes` per peer)
    /// never holds up the caller's loop for long: from `at` (`None`: the
    /// start), until about `budget` bytes were read. Where the next slice
    /// starts, or `None` when the pass is complete.
    pub fn audit_payloads(
        &self,
        at: Option<PayloadCursor>,
        budget: usize,
    ) -> Result<Option<PayloadCursor>, StateFault> {
        let mut budget = budget;
        let start = at.unwrap_or(PayloadCursor { peer: 0, seq: 0 });
        for (&peer, p) in self.peers.range(start.peer..) {
            let from = if peer == start.peer { start.seq } else { 0 };
            let fault = |what| StateFault { peer, what };
            if from == 0 {
                // A peer's held segments are checked as its pass begins:
                // at most a receive window's worth.
                p.recv.audit_payloads(&mut budget).map_err(fault)?;
            }
            if let Some(seq) = p.send.audit_payloads(from, &mut budget).map_err(fault)? {
                return Ok(Some(PayloadCursor { peer, seq }));
            }
            if budget == 0 {
                return Ok(peer.checked_add(1).map(|peer| PayloadCursor { peer, seq: 0 }));
            }
        }
        Ok(None)
    }

    /// Every peer's state, for the fault hook to strike.
    #[cfg(feature = "fault-hook")]
    pub(crate) fn peers_mut(&mut self) -> impl Iterator<Item = (NodeId, &mut Peer)> + '_ {
        // Whatever the hook changes, each peer is looked at again.
        let ready = &mut self.ready;
        self.peers.iter_mut().map(move |(&id, p)| {
            ready.list(id, &mut p.listed);
            (id, p)
        })
    }

    /// The peers this endpoint has state for, in id order.
    pub fn peers(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.peers.keys().copied()
    }

    /// Bytes accepted for `peer` and not yet acknowledged.
    pub fn buffered_bytes(&self, peer: NodeId) -> usize {
        self.peers.get(&peer).map_or(0, |p| p.send.bytes_buffered())
    }

    /// Memory charged to the send buffer toward `peer` (its bytes plus
    /// `SEGMENT_COST` per segment), the figure `send_buffer_bytes` bounds.
    pub fn send_buffer_memory(&self, peer: NodeId) -> usize {
        self.peers.get(&peer).map_or(0, |p| p.send.memory())
    }

    /// Memory charged to the delivery queue (its bytes plus
    /// `DELIVERY_COST` per message), the figure `delivery_queue_bytes` bounds.
    pub fn delivery_queue_memory(&self) -> usize {
        self.deliveries.bytes()
    }

    /// Smoothed RTT toward `peer`, once measured.
    pub fn rtt(&self, peer: NodeId) -> Option<core::time::Duration> {
        self.peers.get(&peer).and_then(|p| p.send.rtt.smoothed())
    }

    /// The retransmission timer to `peer` without back-off (the smoothed
    /// round trip plus its variance term, clamped), once a round trip was
    /// measured.
    pub fn base_rto(&self, peer: NodeId) -> Option<core::time::Duration> {
        let p = self.peers.get(&peer)?;
        p.send.rtt.smoothed().map(|_| p.send.rtt.base_rto())
    }

    /// Messages accepted and neither acknowledged nor failed yet.
    pub fn unsettled(&self) -> u64 {
        // From the counters, in constant time: `flush` asks at every
        // segment acknowledged, and summing the peers' logs each time was a
        // seventh of the 256-node demo's CPU (255 peers a question). The
        // checked mode asserts that the two agree (`check_counters`).
        let s = &self.stats;
        s.messages_sent - s.messages_acked - s.messages_failed
    }

    /// Messages on `channel` neither acknowledged nor failed, counted one
    /// by one (for reports: `unsettled` counts every channel at once).
    pub fn unsettled_on(&self, channel: Channel) -> u64 {
        self.peers.values().map(|p| p.send.unsettled_on(channel)).sum()
    }

    /// Messages pending in the peers' send logs, counted one by one.
    fn pending_in_logs(&self) -> u64 {
        self.peers.values().map(|p| p.send.pending_messages()).sum()
    }

    /// An ACK is owed to some peer (for data it sent us).
    pub fn owes_acks(&self) -> bool {
        self.peers.values().any(|p| p.recv.ack_pending())
    }

    /// True when nothing is owed to any peer: no unacknowledged data, no
    /// ACK pending, no handshake answer waiting.
    pub fn is_idle(&self) -> bool {
        self.replies.is_empty() && self.peers.values().all(|p| !p.send.has_unacked() && !p.recv.ack_pending())
    }

    /// A handshake has proven `peer`'s incarnation: data flows both ways.
    pub fn has_session(&self, peer: NodeId) -> bool {
        self.peers.get(&peer).is_some_and(Peer::session)
    }

    /// The datagram size agreed with `peer` (our own until a handshake).
    pub fn max_datagram_to(&self, peer: NodeId) -> usize {
        self.peers.get(&peer).map_or(self.config.max_datagram, |p| p.max_datagram(&self.config))
    }

    /// Every message accepted is acknowledged, failed or still pending,
    /// exactly once; the endpoint's deadline agrees with the peers' tables.
    fn check_counters(&self) {
        let pending = self.pending_in_logs();
        let s = &self.stats;
        assert_eq!(
            s.messages_sent,
            s.messages_acked + s.messages_failed + pending,
            "sent = acknowledged + failed + pending"
        );
        assert_eq!(
            self.earliest,
            self.peers.values().filter_map(Peer::next_timeout).min(),
            "the endpoint's deadline is the earliest of its peers'"
        );
        for (id, p) in &self.peers {
            assert_eq!(
                p.scheduled,
                p.next_timeout(),
                "peer {id}'s deadline is the one the endpoint has it down for"
            );
        }
        assert_eq!(
            self.greetings.under_way,
            self.peers.values().filter(|p| p.greeting_counted()).count(),
            "the handshakes counted under way are those begun and in their first rounds"
        );
        for (id, p) in &self.peers {
            assert!(
                !p.greeting_waits() || p.greeting.is_queued(),
                "peer {id} waits for a place and is not queued"
            );
        }
        self.deliveries.check_invariants();
        if self.deliveries.has_room() {
            assert!(
                self.peers.values().all(|p| !p.recv.waits_for_room()),
                "an in-order segment waits for room in a delivery queue that has room"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DELIVERY_COST;

    #[test]
    fn sending_to_a_node_never_added_is_refused_at_once() {
        let mut ep = Endpoint::new(Config::default(), 1, 1).unwrap();
        let now = Instant::from_nanos(1);
        assert_eq!(ep.send(now, 2, b"x"), Err(SendError::UnknownPeer(2)));
        assert!(!ep.can_send(2, 1));
        assert_eq!(ep.add_peer(1), Err(PathError::SelfPeer));
        ep.add_peer(2).unwrap();
        assert_eq!(ep.send(now, 2, b"x"), Ok(MessageId { peer: 2, seq: 0 }));
        assert_eq!(ep.stats().messages_sent, 1);
    }

    /// Nodes 1 and 2, each given the other.
    fn two_peers(config: Config) -> (Endpoint, Endpoint) {
        let mut a = Endpoint::new(config.clone(), 1, 1).unwrap();
        let mut b = Endpoint::new(config, 2, 1).unwrap();
        a.add_peer(2).unwrap();
        b.add_peer(1).unwrap();
        (a, b)
    }

    /// Drive `a` and `b` until `a` reports an event, with every datagram
    /// from `b` after the first `b_answers` lost. Returns the event and what
    /// `b`'s application received.
    fn run_until_event(
        a: &mut Endpoint,
        b: &mut Endpoint,
        mut now: Instant,
        b_answers: usize,
    ) -> (Event, Vec<Vec<u8>>) {
        let mut buf = vec![0u8; 2048];
        let (mut delivered, mut answered) = (Vec::new(), 0);
        for _ in 0..100_000 {
            a.handle_timeout(now);
            while let Some(t) = a.poll_transmit(now, &mut buf) {
                b.handle_datagram(now, &buf[..t.len]);
            }
            b.handle_timeout(now);
            while let Some(t) = b.poll_transmit(now, &mut buf) {
                if answered < b_answers {
                    answered += 1;
                    a.handle_datagram(now, &buf[..t.len]);
                }
            }
            while let Some(d) = b.recv() {
                delivered.push(d.message.to_vec());
            }
            if let Some(e) = a.poll_event() {
                return (e, delivered);
            }
            let step = now + core::time::Duration::from_micros(1);
            now = a.poll_timeout().map_or(step, |t| t.max(step));
        }
        panic!("no event");
    }

    /// A peer that delivers a message and is never heard from again (it
    /// crashed before its first ACK, or every answer was lost) may have the
    /// message: it must be reported in doubt, never certainly undelivered.
    #[test]
    fn a_message_delivered_to_a_peer_gone_silent_is_in_doubt() {
        let (mut a, mut b) = two_peers(Config::default());
        let now = Instant::from_nanos(1_000_000);
        let id = a.send(now, 2, b"hello").unwrap();
        // B's WELCOME gets through, nothing after it: B delivers (the data
        // rides behind A's CONFIRM) and its ACK is lost.
        let (event, delivered) = run_until_event(&mut a, &mut b, now, 1);
        assert_eq!(delivered, vec![b"hello".to_vec()], "B's application got the message");
        let Event::PeerUnreachable { failed } = event else { panic!("no abandonment: {event:?}") };
        assert!(matches!(a.message_state(id), MessageState::Failed(_)));
        assert_eq!((failed.first, failed.in_doubt_end, failed.end), (0, 1, 1), "in doubt, not certain");
    }

    /// A peer that never answered a HELLO was never sent a byte of data:
    /// what failed toward it is certainly not delivered (the handshake is
    /// what makes this true: without it a failure could only be "in doubt").
    #[test]
    fn a_message_to_a_peer_that_never_answered_certainly_failed() {
        let (mut a, mut b) = two_peers(Config::default());
        let now = Instant::from_nanos(1_000_000);
        a.send(now, 2, b"hello").unwrap();
        a.send(now, 2, b"world").unwrap();
        let (event, delivered) = run_until_event(&mut a, &mut b, now, 0);
        assert!(delivered.is_empty(), "no data before a handshake");
        let Event::PeerUnreachable { failed } = event else { panic!("no abandonment: {event:?}") };
        assert_eq!((failed.first, failed.in_doubt_end, failed.end), (0, 0, 2), "certainly not delivered");
        assert!(a.stats().hellos_sent > 1, "the HELLO was retried");
        assert_eq!(a.stats().data_frames_sent, 0);
    }

    /// One turn of two endpoints wired back to back, losing nothing.
    fn exchange(a: &mut Endpoint, b: &mut Endpoint, now: Instant, buf: &mut [u8]) {
        a.handle_timeout(now);
        while let Some(t) = a.poll_transmit(now, buf) {
            b.handle_datagram(now, &buf[..t.len]);
        }
        b.handle_timeout(now);
        while let Some(t) = b.poll_transmit(now, buf) {
            a.handle_datagram(now, &buf[..t.len]);
        }
    }

    /// A receiver whose application never reads, fed by senders of empty,
    /// 8-byte and 64 KiB messages: the delivery queue stops at its bounds
    /// (in messages and in memory), the sender's buffer stops at its own,
    /// and `send` says `WouldBlock` rather than growing.
    #[test]
    fn a_frozen_reader_bounds_both_sides_in_memory_and_count() {
        for (len, max_messages) in [(0usize, 5000usize), (8, 5000), (65536, 1 << 20)] {
            let config = Config {
                send_buffer_bytes: 1 << 20,
                send_buffer_messages: max_messages,
                delivery_queue_bytes: 1 << 20,
                delivery_queue_messages: max_messages / 2,
                max_message_len: 1 << 17,
                ..Config::default()
            };
            let (mut a, mut b) = two_peers(config.clone());
            let msg = vec![7u8; len];
            let mut now = Instant::from_nanos(1_000_000);
            let (mut sent, mut blocked) = (0u64, 0u64);
            let mut buf = vec![0u8; 2048];
            for _ in 0..20_000 {
                // Bounded, so a sender that never blocks fails the test
                // below instead of hanging it.
                for _ in 0..4 * max_messages {
                    if a.send(now, 2, &msg).is_err() {
                        break;
                    }
                    sent += 1;
                }
                blocked += 1;
                assert!(
                    a.send_buffer_memory(2) <= config.send_buffer_bytes,
                    "{len} B: send buffer over its bound"
                );
                assert!(a.unsettled() <= max_messages as u64, "{len} B: send buffer over its count");
                assert!(b.delivery_queue_memory() <= config.delivery_queue_bytes + len + DELIVERY_COST);
                assert!(
                    b.pending_deliveries() <= config.delivery_queue_messages,
                    "{len} B: delivery queue count"
                );
                exchange(&mut a, &mut b, now, &mut buf);
                now = now + core::time::Duration::from_micros(100);
            }
            assert!(b.delivery_queue_full(), "{len} B: the reader's queue filled");
            assert!(blocked > 0 && sent > 0);
            // The messages the receiver holds plus those the sender holds
            // are every message sent: nothing was dropped to stay bounded.
            assert_eq!(sent, b.pending_deliveries() as u64 + a.unsettled(), "{len} B: accounted for");
            // Reading drains both sides: capacity comes back.
            let mut read = 0;
            for _ in 0..200_000 {
                while b.recv().is_some() {
                    read += 1;
                }
                if read == sent {
                    break;
                }
                exchange(&mut a, &mut b, now, &mut buf);
                now = now + core::time::Duration::from_micros(100);
            }
            assert_eq!(read, sent, "{len} B: every message read once drained");
            assert_eq!((a.send_buffer_memory(2), b.delivery_queue_memory()), (0, 0));
        }
    }

    /// A message larger than the send buffer is taken when the buffer is
    /// empty, and alone: the buffer's bound holds for everything else, and
    /// no message the size limit allows is refused for ever. A buffer taken
    /// from the endpoint's pool for it comes back once it is acknowledged.
    #[test]
    fn a_message_larger_than_the_send_buffer_goes_alone() {
        let config = Config {
            send_buffer_bytes: 64 * 1024,
            max_message_len: 1 << 20,
            max_datagram: 1472,
            ..Config::default()
        };
        let (mut a, mut b) = two_peers(config);
        let mut now = Instant::from_nanos(1_000_000);
        let pool = a.message_pool();
        let mut big = pool.take(1 << 20);
        big.extend((0..1u32 << 20).map(|i| i as u8));
        let big = pool.seal(big);
        a.send_bytes(now, 2, big.clone()).expect("an empty buffer takes a message of any allowed size");
        assert_eq!(a.send(now, 2, b"next"), Err(SendError::WouldBlock), "nothing beside it");
        assert!(a.send_buffer_memory(2) > 64 * 1024);
        drop(big);
        let mut buf = vec![0u8; 2048];
        let mut got = Vec::new();
        for _ in 0..10_000 {
            exchange(&mut a, &mut b, now, &mut buf);
            got.extend(std::iter::from_fn(|| b.recv()).map(|d| d.message));
            if a.send_buffer_memory(2) == 0 {
                break;
            }
            now = now + core::time::Duration::from_micros(50);
        }
        assert_eq!(got.len(), 1);
        assert!(got[0].iter().enumerate().all(|(i, &x)| x == i as u8), "delivered exact");
        assert_eq!(a.send_buffer_memory(2), 0, "acknowledged");
        assert_eq!(pool.held().0, 1, "its buffer back in the sender's pool");
        a.send(now, 2, b"next").expect("room again");
    }
}
