//! One remote endpoint, as a state machine of its own (quinn-proto's
//! `Connection`): the two halves of the stream, the peer's incarnation,
//! its paths and its named timers. The endpoint routes each datagram to
//! its peer by node id and keeps only the earliest deadline over peers;
//! everything a peer decides, it decides here, with a [`Context`] lent by
//! the endpoint for the call.
//!
//! State is per peer, never per message (Tang and Bilas [TB] section 4.1;
//! docs/REFERENCES.md). The hard state that must survive an engine failure
//! (Zhou et al. [FTGM] section 4's host-side backup) is what
//! [`Peer::snapshot`] exports and [`Peer::restore`] rebuilds from: the
//! streams' logs, the peer's incarnation, and the configured rails. The
//! RTT estimate, timers and rail health are soft and rebuilt.

use tether_wire::{
    DatagramFrame, Frame, HandshakeFrame, HandshakeKind, Header, HeaderFlags, MacKey, Packet, PacketWriter,
    HANDSHAKE_LEN,
};

use crate::nacked::{self, NackedFrame, NackedReceiver, NackedSender};
use crate::snapshot::NackedMarks;
use crate::unreliable::Outbox;
use tracing::{debug, info, trace, warn};

use crate::aggregate::{Aggregate, Room};
use crate::config::MIN_DATAGRAM;
use crate::context::Context;
use crate::event::{Event, FailReason};
use crate::greeting::Queued;
use crate::handshake::Handshake;
use crate::landing::LandingArea;
use crate::paths::{Control, PathState, Paths, RailId, MAX_RAILS};
use crate::ready::Listed;
use crate::recv_stream::{epoch_overtakes, RecvStream, Sender};
use crate::replay::ReplayWindow;
use crate::send_stream::{AckNews, AckRefused, SendStream};
use crate::snapshot::PeerSnapshot;
use crate::timer::{Timer, TimerTable};
use crate::{Config, Instant, NodeId, PeerMoved, Transmit, MAX_MOVES};

/// The keys of one session: both directions, for one pair of incarnations.
#[derive(Debug, Clone)]
pub(crate) struct SessionKeys {
    /// (our incarnation, the peer's) the keys were derived for.
    incs: (u64, u64),
    pub tx: MacKey,
    pub rx: MacKey,
}

/// Packet numbers skipped on a restore: what was sent after the snapshot
/// was taken is unknown, and a number must never be used twice.
const PN_RESTORE_GAP: u64 = 1 << 32;

#[derive(Debug)]
pub(crate) struct Peer {
    id: NodeId,
    pub send: SendStream,
    pub recv: RecvStream,
    /// The peer's incarnation, as proven by a completed handshake; 0
    /// before one (no session: nothing but the handshake flows).
    incarnation: u64,
    /// Our side of the handshake and the datagram size agreed.
    hs: Handshake,
    /// With a cluster key: the keys of the session (for the incarnations
    /// they were derived for), the next packet number to send, and the
    /// packet numbers taken from the peer.
    keys: Option<SessionKeys>,
    tx_pn: u64,
    replay: ReplayWindow,
    /// Reported unreachable and not heard from since.
    unreachable: bool,
    /// The rails that lead to the peer and their health.
    pub paths: Paths,
    timers: TimerTable,
    /// Its places in the endpoint's queues of peers to look at (`ready`).
    pub listed: Listed,
    /// The deadline the endpoint has this peer down for (`deadlines`).
    pub scheduled: Option<Instant>,
    /// In the queue of handshakes waiting for a place (`greeting`).
    pub greeting: Queued,
    /// Datagram payloads waiting to go: unreliable messages and the NACK
    /// class's frames (`crate::unreliable`).
    pub unreliable: Outbox,
    /// The NACK-reliable class to and from the peer (`crate::nacked`).
    nacked_tx: NackedSender,
    nacked_rx: NackedReceiver,
    /// Taken in after its handshake rather than given (`Endpoint::accept`).
    pub accepted: bool,
}

impl Peer {
    pub fn new(id: NodeId, config: &Config, aggregate: &mut Aggregate) -> Self {
        let mut p = Peer {
            id,
            send: SendStream::new(config, 1),
            recv: RecvStream::new(config),
            incarnation: 0,
            hs: Handshake::new(),
            keys: None,
            tx_pn: 1,
            replay: ReplayWindow::new(),
            unreachable: false,
            paths: Paths::new(Instant::ZERO),
            timers: TimerTable::default(),
            listed: Listed::default(),
            scheduled: None,
            greeting: Queued::default(),
            unreliable: Outbox::default(),
            nacked_tx: NackedSender::default(),
            nacked_rx: NackedReceiver::default(),
            accepted: false,
        };
        p.update_timers(config, aggregate);
        p
    }

    /// Export the hard state.
    pub fn snapshot(&self) -> PeerSnapshot {
        PeerSnapshot {
            node: self.id,
            incarnation: self.incarnation,
            max_datagram: self.hs.max_datagram(),
            tx_pn: self.tx_pn,
            rx_pn: self.replay.highest(),
            unreachable: self.unreachable,
            accepted: self.accepted,
            rails: self.paths.rails(),
            send: self.send.snapshot(),
            recv: self.recv.snapshot(),
            nacked: NackedMarks { next: self.nacked_tx.next(), expected: self.nacked_rx.expected() },
        }
    }

    /// Rebuild a peer from its hard state at `now`: the streams resume
    /// where they were (everything in flight goes again, an ACK is owed at
    /// once), with a fresh RTT estimate, fresh timers and every path
    /// healthy until it proves otherwise.
    /// `progress` is called back now and then during long work (see
    /// `SendStream::restore`).
    pub fn restore(
        config: &Config,
        snapshot: PeerSnapshot,
        now: Instant,
        progress: &mut dyn FnMut(),
        aggregate: &mut Aggregate,
    ) -> Self {
        let mut paths = Paths::new(now);
        if !snapshot.rails.is_empty() {
            paths.set_rails(now, &snapshot.rails);
        }
        let mut p = Peer {
            id: snapshot.node,
            send: SendStream::restore(config, snapshot.send, now, progress),
            recv: RecvStream::restore(config, snapshot.recv),
            incarnation: snapshot.incarnation,
            hs: Handshake::restored(snapshot.max_datagram),
            keys: None,
            tx_pn: snapshot.tx_pn.saturating_add(PN_RESTORE_GAP),
            replay: ReplayWindow::restored(snapshot.rx_pn),
            unreachable: snapshot.unreachable,
            accepted: snapshot.accepted,
            paths,
            timers: TimerTable::default(),
            listed: Listed::default(),
            scheduled: None,
            greeting: Queued::default(),
            unreliable: Outbox::default(),
            nacked_tx: NackedSender::resumed(snapshot.nacked.next),
            nacked_rx: NackedReceiver::resumed(snapshot.nacked.expected),
        };
        p.update_timers(config, aggregate);
        p
    }

    /// The datagram size the handshake agreed (0: none yet).
    pub fn agreed_datagram(&self) -> usize {
        self.hs.max_datagram()
    }

    /// The next packet number to send.
    pub fn tx_pn(&self) -> u64 {
        self.tx_pn
    }

    /// The earliest of this peer's timers.
    pub fn next_timeout(&self) -> Option<Instant> {
        self.timers.next()
    }

    /// Report the send stream's pipe to the endpoint's window, and set
    /// every timer from the state it guards; returns the earliest. Called
    /// after every operation on the peer, so neither is ever stale.
    pub fn update_timers(&mut self, config: &Config, aggregate: &mut Aggregate) -> Option<Instant> {
        self.send.report_to(aggregate);
        self.send.rtt.set_initial(aggregate.initial_rto_ns());
        let room = aggregate.room();
        // In `Timer::ALL` order. Without a session nothing but the
        // handshake (and the patience clock) runs.
        let session = self.session();
        self.paths.set_rto(self.send.rtt.base_rto());
        self.timers.set_all([
            self.send.rto_deadline(),
            self.send.reorder_deadline().filter(|_| session),
            self.recv.ack_deadline().filter(|_| session),
            self.send.send_due(config, room).filter(|_| session),
            self.paths.silence_deadline(config).filter(|_| session),
            self.paths.probe_deadline(config).filter(|_| session),
            // Not while its handshake waits for a place: silence from a
            // peer not yet asked is no evidence it is gone.
            self.send.abandon_deadline(config).filter(|_| !self.greeting_waits()),
            self.hs.deadline(),
            self.nacked_deadline(config).filter(|_| session),
        ]);
        self.next_timeout()
    }

    /// Set the delayed-ACK timer alone from the receive stream (after the
    /// application took a fragment: nothing else changed, and the window's
    /// accounting in `update_timers` is not this caller's to touch);
    /// returns the earliest timer.
    pub fn update_ack_timer(&mut self) -> Option<Instant> {
        let due = self.recv.ack_deadline().filter(|_| self.session());
        self.timers.set(Timer::DelayedAck, due);
        self.next_timeout()
    }

    /// Something should go on the wire to this peer at `now`.
    pub fn wants_transmit(&self, now: Instant, config: &Config, room: Room) -> bool {
        self.hs.hello_due()
            || self.hs.confirm_due()
            || (self.session()
                && (self.recv.ack_due(now)
                    || !self.unreliable.is_empty()
                    || self.send.has_work(now, config, room)
                    || self.send.probe_owed()
                    || self.paths.control_due(now)))
    }

    /// A handshake proved the peer's incarnation: data may flow.
    pub fn session(&self) -> bool {
        self.incarnation != 0
    }

    /// The peer's proven incarnation (0: no session).
    pub fn incarnation(&self) -> u64 {
        self.incarnation
    }

    /// The largest datagram to send this peer: the size agreed in the
    /// handshake, or our own before one.
    pub fn max_datagram(&self, config: &Config) -> usize {
        match self.hs.max_datagram() {
            0 => config.max_datagram,
            agreed => agreed.min(config.max_datagram),
        }
    }

    /// Make sure a session exists or is being made: a HELLO goes unless
    /// one is in progress. Called when there is something to send, and
    /// when the peer sent what only a session could carry.
    pub fn want_session(&mut self, cx: &mut Context<'_>, now: Instant) {
        if !self.session() && !self.hs.initiating() {
            self.start_handshake(cx, now, None);
        }
    }

    /// Begin a handshake unless one is under way. Its first HELLO goes on
    /// `rail` if one is known to work (a datagram just came in on it), else
    /// on every rail at once; retries go on the rails in turn.
    fn start_handshake(&mut self, cx: &mut Context<'_>, now: Instant, rail: Option<RailId>) {
        if self.hs.initiating() {
            return;
        }
        let first = rail.map(|r| self.paths.rail_index(r));
        if !cx.greetings.admits_newcomer() {
            // Its turn comes when one of those under way ends (`admitted`).
            trace!(node = cx.node, peer = self.id, "handshake: waiting for a place");
            self.hs.wait(first);
            cx.greetings.queue(self.id, &mut self.greeting);
            return;
        }
        debug!(node = cx.node, peer = self.id, rail, "handshake: sending HELLO");
        let first_wait = core::time::Duration::from_nanos(cx.aggregate.initial_rto_ns());
        self.hs.start(now, cx.secrets.nonce(), first_wait, first);
    }

    /// Its handshake counts among those the endpoint has under way.
    pub fn greeting_counted(&self) -> bool {
        self.hs.counted()
    }

    /// Its handshake waits for a place.
    pub fn greeting_waits(&self) -> bool {
        self.hs.waiting().is_some()
    }

    /// Its handshake's turn came: it begins, if it still waits (a
    /// handshake the peer began may have ended the wait meanwhile). The
    /// patience clock starts again with its first HELLO: the time spent in
    /// the queue said nothing of the peer (a 256-node demo gave up a live
    /// peer it had never greeted, and failed the messages for it).
    pub fn admitted(&mut self, cx: &mut Context<'_>, now: Instant) {
        if let Some(first) = self.hs.waiting() {
            debug!(node = cx.node, peer = self.id, "handshake: sending HELLO after waiting");
            self.send.on_heard(now);
            let first_wait = core::time::Duration::from_nanos(cx.aggregate.initial_rto_ns());
            self.hs.start(now, cx.secrets.nonce(), first_wait, first);
        }
    }

    /// Take in a verified datagram from this peer (the endpoint checked its
    /// checksum, addressing and source incarnation), over `rail`. Its DATA
    /// payloads were placed in `landing` during verification.
    pub fn handle_packet(
        &mut self,
        cx: &mut Context<'_>,
        now: Instant,
        rail: RailId,
        packet: &Packet<'_>,
        landing: &mut LandingArea,
    ) {
        let h = packet.header;
        let mut frames = packet.frames();
        if let Some(Frame::Handshake(f)) = packet.frames().next() {
            trace!(node = cx.node, peer = self.id, kind = ?f.kind, "handshake: frame in");
            frames.next();
            let go_on = match f.kind {
                // The endpoint answers HELLOs; one reaching a peer is misplaced.
                HandshakeKind::Hello => false,
                HandshakeKind::Welcome => {
                    self.on_welcome(cx, now, &h, &f, packet.datagram_len());
                    false
                }
                HandshakeKind::Confirm => self.on_confirm(cx, now, rail, &h, &f),
            };
            if !go_on {
                return;
            }
        }
        if !self.session() || h.src_inc != self.incarnation || h.dst_inc != cx.incarnation {
            self.refuse_sessionless(cx, now, rail, &h);
            return;
        }
        if let Some(pn) = packet.packet_number() {
            if !self.replay.take(pn) {
                cx.stats.replays += 1;
                debug!(peer = self.id, pn, "dropped: a replayed datagram");
                return;
            }
        }
        if self.hs.confirm().is_some() {
            // The peer sends to our incarnation: it has our CONFIRM.
            self.hs.on_confirmed(None);
        }
        if self.unreachable {
            self.unreachable = false;
            info!(peer = self.id, "peer reachable again");
            cx.events.push_back(Event::PeerReachable { peer: self.id });
        }
        // An empty datagram is a probe (ACK-request flag) or its answer.
        let empty = packet.body_len() == 0;
        let (probe, pong) = (empty && h.flags.ack_request(), empty && !h.flags.ack_request());
        if probe {
            // A probe of the peer's retransmission timeout (or of a path):
            // it wants to know what we hold, at once.
            self.recv.answer_probe(h.probe);
            // From a sender still on an epoch we left: the answer says
            // where it ended.
            self.recv.note_epoch(h.epoch);
        }
        if let Some(t) = self.paths.on_receive(now, rail, landing.carried_data(), probe, pong) {
            info!(peer = self.id, rail = t.rail, from = ?t.from, to = ?t.to, "path state changed");
            cx.events.push_back(t.event(self.id, now));
            self.rescue_stranded(cx, now);
        }
        let mut data_admitted = None;
        // An ACK of our epoch was applied from this datagram: one naming a
        // newer epoch right after it makes it the receiver's last word on
        // ours (`RecvStream::take_left_ack`).
        let mut closed_ours = false;
        let mut landings = landing.commit();
        for frame in frames {
            match frame {
                Frame::Handshake(_) => {
                    // Only first in a datagram means anything.
                    cx.stats.protocol_violations += 1;
                }
                Frame::Datagram(d) => match d.port {
                    // Of no stream and no epoch: delivered as it came.
                    tether_wire::PORT_APPLICATION => {
                        let queued =
                            cx.unreliable.deliver(self.id, d.payload, cx.messages, cx.config, cx.stats);
                        cx.stats.unreliable_received += u64::from(queued);
                    }
                    tether_wire::PORT_NACKED => self.on_nacked(cx, now, d.payload),
                    port => match crate::unreliable::Service::of_port(port) {
                        Some(s) => {
                            let inbox = &mut cx.services[s.index()];
                            let queued = inbox.deliver(self.id, d.payload, cx.messages, cx.config, cx.stats);
                            cx.stats.service_received += u64::from(queued);
                        }
                        // A newer peer's service: not ours to judge.
                        None => cx.stats.unreliable_dropped += 1,
                    },
                },
                Frame::Data(d) => {
                    let landed = landings.next(cx.stats);
                    let admitted = *data_admitted.get_or_insert_with(|| self.recv.admit_epoch(h.epoch));
                    if !admitted {
                        cx.stats.stale_dropped += 1;
                        trace!(peer = self.id, epoch = h.epoch, "dropped: data of an older epoch");
                        // The sender hears our epoch: a genuine one that a
                        // forged DATA frame overtook must learn it, or it
                        // is locked out.
                        self.recv.on_stale(now, h.epoch);
                        continue;
                    }
                    self.recv.on_data(cx, now, self.sender(), &d, landed);
                }
                Frame::Ack(a) => {
                    if epoch_overtakes(a.epoch, self.send.epoch()) {
                        // The receiver drops our epoch as stale.
                        if closed_ours {
                            // Its last word on our epoch came just before:
                            // what it does not cover never arrived.
                            self.on_overtaken(cx, now, a.epoch);
                        } else if a.answer.is_some_and(|n| self.send.answers_outstanding_probe(n)) {
                            // It answers our probe and says nothing of our
                            // epoch: what is unacknowledged is in doubt.
                            // (A late answer, from before the stream moved
                            // on, says nothing of where the receiver is:
                            // seed 137 of `forged_epochs` failed 24
                            // messages on one naming an epoch half the
                            // space behind.)
                            self.on_stream_reset(cx, a.epoch);
                        } else {
                            // Unasked, and perhaps forged: the next probe
                            // asks (the stream's data goes unacknowledged
                            // meanwhile, so a timeout comes).
                            cx.stats.stale_dropped += 1;
                        }
                        continue;
                    }
                    let (cumulative, ranges) = if a.epoch == self.send.epoch() {
                        (a.cumulative, Some(a.ranges()))
                    } else if a.answer.is_some() {
                        // The answer to our probe from a receiver that holds
                        // nothing of our epoch (it never got its first data):
                        // everything sent before the probe was lost.
                        (self.send.log().acked_upto, None)
                    } else {
                        // An ACK of an epoch we abandoned: nothing to learn.
                        continue;
                    };
                    let ranges = ranges.into_iter().flatten();
                    let mode = cx.config.retransmit;
                    let ours = a.epoch == self.send.epoch();
                    match self.send.on_ack(
                        now,
                        AckNews { cumulative, full: a.full, answer: a.answer },
                        ranges,
                        mode,
                        cx.stats,
                    ) {
                        Ok(outcome) => {
                            closed_ours = ours;
                            cx.stats.messages_acked += outcome.messages_acked;
                            cx.stats.segments_acked += outcome.popped;
                            let srtt_ns = self.send.rtt.smoothed_ns();
                            cx.aggregate.on_ack(now, outcome.delivered, outcome.rtt, srtt_ns);
                            let (events, id) = (&mut *cx.events, self.id);
                            let mut revived = false;
                            let failover =
                                self.paths.on_acked(now, outcome.rails, outcome.latest_rails, |t| {
                                    info!(peer = id, rail = t.rail, from = ?t.from, to = ?t.to, "path state changed");
                                    events.push_back(t.event(id, now));
                                    revived = true;
                                });
                            if let Some(failover) = failover {
                                info!(peer = id, from = failover.from, to = failover.to, gap = ?failover.gap, "failed over");
                                events.push_back(Event::FailedOver { peer: id, failover, at: now });
                            }
                            if revived {
                                self.rescue_stranded(cx, now);
                            }
                        }
                        Err(AckRefused::Inconsistent) => {
                            cx.stats.integrity_faults += 1;
                            warn!(peer = self.id, "ACK not applied: the send stream's marks disagree");
                        }
                        Err(AckRefused::BeyondSent) => {
                            cx.stats.protocol_violations += 1;
                            debug!(
                                peer = self.id,
                                cumulative = a.cumulative,
                                "dropped: ACK for data never sent"
                            );
                        }
                    }
                }
            }
        }
        if h.flags.ack_request() && data_admitted.is_some() {
            self.recv.request_ack(now, true);
        }
    }

    /// A WELCOME: the answer to our HELLO, if it echoes our nonce and is
    /// addressed to our incarnation. It proves the peer's incarnation.
    fn on_welcome(&mut self, cx: &mut Context<'_>, now: Instant, h: &Header, f: &HandshakeFrame, len: usize) {
        if self.hs.answered_before(f.nonce) && h.src_inc == self.incarnation {
            // Another HELLO of the same burst answered: nothing new.
            return;
        }
        if h.dst_inc != cx.incarnation || h.src_inc == 0 || !self.hs.answers_ours(f.nonce) {
            cx.stats.handshakes_refused += 1;
            debug!(
                node = cx.node,
                peer = self.id,
                "handshake: dropped a WELCOME that answers no HELLO of ours"
            );
            return;
        }
        // No more than arrived: the WELCOME is padded to the size it
        // accepts, so its length is what the path back has carried.
        let proven = f.max_datagram.min(u32::try_from(len).unwrap_or(u32::MAX));
        let Some(agreed) = self.agree(cx, proven) else { return };
        if !self.adopt(cx, h.src_inc) {
            return;
        }
        let used = self.size_to_use(agreed);
        if let Some(rtt) = self.hs.round_trip(now) {
            // The first round trip to this peer: part of the endpoint's
            // guess for streams with none of their own. (Not this stream's
            // first sample: one round trip of an idle path made its first
            // timeout the 1 ms floor, and a receiver 12 ms late cost a
            // retransmission, where `rto_initial`'s 5 ms cost none.)
            cx.aggregate.on_handshake(rtt);
        }
        self.hs.on_welcome(f.cookie, agreed, used);
        self.on_session(cx, now, used);
    }

    /// A CONFIRM: the initiator's proof that it heard our WELCOME (the
    /// cookie) and knows our incarnation. True when the rest of the
    /// datagram may be taken in.
    fn on_confirm(
        &mut self,
        cx: &mut Context<'_>,
        now: Instant,
        rail: RailId,
        h: &Header,
        f: &HandshakeFrame,
    ) -> bool {
        let ours = (cx.node, cx.incarnation);
        if self.session() && h.src_inc == self.incarnation && h.dst_inc == cx.incarnation && cx.from.is_none()
        {
            // A CONFIRM in front of data, from the known address, for the
            // session we have: it proves nothing the session has not, and
            // its cookie may have aged on the way (it is good for two to
            // four seconds). Refusing the datagram for it refused all the
            // initiator sent until the peer happened to send it something:
            // at 256 nodes on two cores, with round trips of seconds,
            // sessions that never carried a byte.
            return true;
        }
        if h.dst_inc != cx.incarnation
            || h.src_inc == 0
            || !cx.secrets.cookie_valid(f.cookie, (self.id, h.src_inc, f.nonce), ours, now, cx.from)
        {
            cx.stats.handshakes_refused += 1;
            debug!(
                node = cx.node,
                peer = self.id,
                "handshake: dropped a CONFIRM whose cookie does not check"
            );
            return false;
        }
        if h.src_inc == self.incarnation && self.hs.max_datagram() != 0 {
            // A CONFIRM repeated in front of data: the session stands.
            self.moved(cx, now, rail);
            return true;
        }
        let Some(agreed) = self.agree(cx, f.max_datagram) else { return false };
        if agreed != f.max_datagram as usize {
            // The initiator claims a size above ours: it never saw our WELCOME.
            cx.stats.handshakes_refused += 1;
            return false;
        }
        if !self.adopt(cx, h.src_inc) {
            return false;
        }
        let used = self.size_to_use(agreed);
        self.hs.on_confirmed(Some(used));
        self.on_session(cx, now, used);
        self.moved(cx, now, rail);
        true
    }

    /// A CONFIRM from an address no peer had checked: its cookie was made
    /// for that address, so the peer is there now (it got our WELCOME
    /// there, and only a holder of the cluster key could ask for it).
    fn moved(&mut self, cx: &mut Context<'_>, now: Instant, rail: RailId) {
        let Some(addr) = cx.from else { return };
        if cx.moves.len() >= MAX_MOVES {
            cx.moves.pop_front();
        }
        cx.moves.push_back(PeerMoved { node: self.id, rail, addr });
        if self.accepted && !self.paths.rails().contains(&rail) {
            // A peer taken in proves each of its rails by a handshake
            // over it: from now on data may use this one too.
            let mut rails = self.paths.rails();
            rails.push(rail);
            self.paths.set_rails(now, &rails);
        }
        cx.stats.peers_moved += 1;
        info!(peer = self.id, rail, %addr, "peer proved itself at a new address");
    }

    /// The datagram size both sides accept: the smaller one, if it is one
    /// we can work with at all.
    fn agree(&mut self, cx: &mut Context<'_>, theirs: u32) -> Option<usize> {
        let agreed = (theirs as usize).min(cx.config.max_datagram);
        if agreed < MIN_DATAGRAM {
            cx.stats.mtu_refused += 1;
            warn!(
                peer = self.id,
                theirs,
                min = MIN_DATAGRAM,
                "handshake refused: the peer's datagrams are too small"
            );
            return None;
        }
        Some(agreed)
    }

    /// The datagram size a session goes on with after a handshake proved
    /// `proven`: that one, unless segments are in flight or a message is
    /// half sent. Those keep the size in use until they settle, whatever the
    /// new proof: the receiver holds fragments by sequence number, and an
    /// engine's successor cuts every unsettled message again, whole, at the
    /// one size its backup records (`Endpoint::resume`), so a message cut
    /// at two sizes would be renumbered. Unsent messages are cut again at
    /// the new size (`SendStream::recut_unsent`). A path that no longer
    /// carries the size loses what is in flight until the stream is
    /// abandoned and its messages reported failed.
    fn size_to_use(&self, proven: usize) -> usize {
        match self.hs.max_datagram() {
            current if current != 0 && !self.send.can_resize() => current,
            _ => proven,
        }
    }

    /// Take `inc` as the peer's proven incarnation: a larger one is a
    /// restart. False for an older one (a replayed handshake of a past life).
    fn adopt(&mut self, cx: &mut Context<'_>, inc: u64) -> bool {
        if inc < self.incarnation {
            cx.stats.stale_dropped += 1;
            return false;
        }
        if inc > self.incarnation {
            let restarted = self.incarnation != 0;
            self.incarnation = inc;
            // A new session: its packet numbers start afresh.
            self.replay = ReplayWindow::new();
            if restarted {
                self.on_restart(cx);
            }
        }
        true
    }

    /// A handshake completed: data may flow, in datagrams of the agreed size.
    fn on_session(&mut self, cx: &mut Context<'_>, now: Instant, agreed: usize) {
        cx.stats.handshakes_completed += 1;
        self.send.recut_unsent(cx.config.max_fragment_for(agreed));
        // Whatever waited for the session goes now; the peer is heard from.
        self.send.on_heard(now);
        info!(
            node = cx.node,
            peer = self.id,
            incarnation = self.incarnation,
            max_datagram = agreed,
            "session established"
        );
    }

    /// A datagram that only a session could carry, from a peer we have no
    /// session with (or from a life of it or of ours that is over): dropped,
    /// and a handshake begun so that a genuine peer gets one.
    fn refuse_sessionless(&mut self, cx: &mut Context<'_>, now: Instant, rail: RailId, h: &Header) {
        if self.session() && (h.src_inc < self.incarnation || (h.dst_inc != 0 && h.dst_inc < cx.incarnation))
        {
            cx.stats.stale_dropped += 1;
            trace!(
                peer = self.id,
                src_inc = h.src_inc,
                dst_inc = h.dst_inc,
                "dropped: an earlier life's datagram"
            );
        } else {
            cx.stats.sessionless_dropped += 1;
            trace!(peer = self.id, src_inc = h.src_inc, "dropped: no session with this incarnation");
        }
        if h.dst_inc != cx.incarnation || h.src_inc > self.incarnation {
            // The peer does not know us (we restarted), or claims a life we
            // have not seen: a handshake settles it, and a forger gains a
            // HELLO to the genuine peer's address, nothing more. The first
            // goes back the way this datagram came: that rail works.
            self.start_handshake(cx, now, Some(rail));
        }
    }

    /// The peer acknowledged a stream epoch we never started. Its receiver
    /// took it from a DATA frame that was not ours (forged without a
    /// cluster key, or corrupted past the checksum) and now drops all of
    /// ours as stale; waiting would lock us out for good. Resynchronise:
    /// what was unacknowledged failed (in doubt), later sends go on an
    /// epoch past the peer's.
    fn on_stream_reset(&mut self, cx: &mut Context<'_>, receiver_epoch: u32) {
        let ours = self.send.epoch();
        let failed = self.send.resync(self.id, receiver_epoch);
        self.count_reset(cx, ours, receiver_epoch, failed.len(), "resynchronised");
        cx.events.push_back(Event::StreamReset { failed });
    }

    /// Count and log a stream reset toward the peer: our epoch `ours` left
    /// for one past `theirs`, `failed` messages failed, and how (`what`).
    fn count_reset(&self, cx: &mut Context<'_>, ours: u32, theirs: u32, failed: u64, what: &str) {
        cx.stats.messages_failed += failed;
        cx.stats.streams_reset += 1;
        warn!(peer = self.id, ours, theirs, failed, "peer's stream epoch {theirs} is not ours: {what}");
    }

    /// The receiver left our epoch for `receiver_epoch` (which it took
    /// from a DATA frame that was not ours) after consuming what the ACK
    /// just applied covers. Everything above that never arrived: it goes
    /// again on the epoch after the receiver's, in order, and nothing
    /// fails but a message the receiver's point cut (its head went with
    /// the old epoch).
    fn on_overtaken(&mut self, cx: &mut Context<'_>, now: Instant, receiver_epoch: u32) {
        let ours = self.send.epoch();
        let failed = self.send.carry_over(cx.config, self.id, receiver_epoch, now);
        self.count_reset(cx, ours, receiver_epoch, failed.len(), "unacknowledged messages carried over");
        if !failed.is_empty() {
            cx.events.push_back(Event::StreamReset { failed });
        }
    }

    /// The peer as the sender of what we receive.
    fn sender(&self) -> Sender {
        Sender { node: self.id, incarnation: self.incarnation }
    }

    /// The peer came back as a new incarnation: what was unacknowledged to
    /// its old life failed, and what it had sent us is void.
    fn on_restart(&mut self, cx: &mut Context<'_>) {
        let failed = self.send.abandon(self.id, FailReason::PeerRestarted);
        self.recv.reset(None);
        self.nacked_rx.reset();
        self.nacked_tx.on_peer_restart();
        cx.stats.messages_failed += failed.len();
        warn!(
            peer = self.id,
            incarnation = self.incarnation,
            failed = failed.len(),
            in_doubt = failed.in_doubt_end - failed.first,
            "peer restarted: unacknowledged messages to its old life failed"
        );
        cx.events.push_back(Event::PeerRestarted { peer: self.id, failed });
    }

    /// Send `message` in the NACK-reliable class; its number, or `None` if
    /// the hold is full.
    pub fn send_nacked(&mut self, cx: &mut Context<'_>, now: Instant, message: &[u8]) -> Option<u64> {
        let rto = self.send.rtt.base_rto();
        let mut around = nacked_around(cx, &mut self.unreliable, rto);
        self.nacked_tx.send(message, now, &mut around)
    }

    /// The next NACK-reliable message's number.
    pub fn nacked_next(&self) -> u64 {
        self.nacked_tx.next()
    }

    /// A frame of the NACK-reliable class from the peer.
    fn on_nacked(&mut self, cx: &mut Context<'_>, now: Instant, payload: &[u8]) {
        let rto = self.send.rtt.base_rto();
        let frame = match nacked::parse(payload) {
            Ok(f) => f,
            Err(e) => {
                cx.stats.nacked_dropped += 1;
                debug!(peer = self.id, error = %e, "dropped: a malformed NACK-class frame");
                return;
            }
        };
        let mut inward = nacked_inward(cx, &mut self.unreliable, rto);
        match frame {
            NackedFrame::Msg { seq, oldest, message } => {
                self.nacked_rx.on_msg(self.id, seq, oldest, message, now, &mut inward)
            }
            NackedFrame::State { next, oldest } => {
                self.nacked_rx.on_state(self.id, next, oldest, now, &mut inward)
            }
            NackedFrame::Nack { ranges } => {
                let mut around = nacked_around(cx, &mut self.unreliable, rto);
                self.nacked_tx.on_nack(ranges, now, &mut around);
            }
            NackedFrame::Skipped { ranges } => {
                let mut around = nacked_around(cx, &mut self.unreliable, rto);
                self.nacked_tx.on_skipped(self.id, ranges, &mut around);
            }
        }
    }

    fn on_nacked_timer(&mut self, cx: &mut Context<'_>, now: Instant) {
        let rto = self.send.rtt.base_rto();
        let mut around = nacked_around(cx, &mut self.unreliable, rto);
        self.nacked_tx.on_timer(self.id, now, &mut around);
        let mut inward = nacked_inward(cx, &mut self.unreliable, rto);
        self.nacked_rx.on_timer(self.id, now, &mut inward);
    }

    /// The earliest deadline of the NACK-reliable class, both ways.
    fn nacked_deadline(&self, config: &Config) -> Option<Instant> {
        match (self.nacked_tx.deadline(config), self.nacked_rx.deadline()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Run the timers that have expired by `now`.
    pub fn handle_timeout(&mut self, cx: &mut Context<'_>, now: Instant) {
        if self.timers.expired(Timer::Handshake, now) {
            self.hs.on_timer(now);
            if !self.send.has_unacked() && self.hs.trying_for(now) >= cx.config.abandon_after {
                // Nothing to say and nobody answering: stop asking. The
                // next message, or a datagram from the peer, asks again.
                debug!(peer = self.id, "handshake: no answer and nothing to send, giving up");
                self.hs.give_up();
            }
        }
        let expired = |t| self.timers.expired(t, now);
        let (paths_due, rto_due, reorder_due, abandon_due, nacked_due) = (
            expired(Timer::PathSilence) || expired(Timer::Probe),
            expired(Timer::Retransmit),
            expired(Timer::Reorder),
            expired(Timer::Abandon),
            expired(Timer::Nacked),
        );
        if paths_due {
            self.on_path_timers(cx, now);
        }
        if reorder_due {
            self.send.on_reorder_timer(now, cx.config.retransmit);
        }
        if rto_due {
            // A failover just now may have re-armed it: `on_timer` checks again.
            self.send.on_timer(now, cx.config.retransmit, cx.stats);
        }
        if nacked_due {
            self.on_nacked_timer(cx, now);
        }
        if abandon_due && self.send.should_abandon(now, cx.config) {
            let failed = self.send.abandon(self.id, FailReason::PeerUnreachable);
            cx.stats.messages_failed += failed.len();
            self.unreachable = true;
            if !self.session() {
                // Nothing left to say to a peer that never answered a HELLO.
                self.hs.reset();
            }
            warn!(
                node = cx.node,
                peer = self.id,
                failed = failed.len(),
                in_doubt = failed.in_doubt_end - failed.first,
                "peer unreachable: abandoned its unacknowledged messages"
            );
            cx.events.push_back(Event::PeerUnreachable { failed });
        }
    }

    /// Path silence and probe timers: state changes, and data leaving a
    /// path that stopped answering.
    fn on_path_timers(&mut self, cx: &mut Context<'_>, now: Instant) {
        let mut changed = [None; MAX_RAILS];
        let mut n = 0;
        self.paths.set_backlog(cx.backlog);
        self.paths.on_timer(now, cx.config, |t| {
            changed[n] = Some(t);
            n += 1;
        });
        for t in changed.into_iter().flatten() {
            info!(peer = self.id, rail = t.rail, from = ?t.from, to = ?t.to, "path state changed");
            // Data leaves a path as soon as it is suspect: new data goes
            // to a healthy rail, and what the path still carried goes
            // again over it at once (a false suspicion costs duplicates
            // the receiver drops; waiting for `down` cost a window's
            // worth of stalled data, measured: 9.7 ms median failover).
            // With no other path to take it (every path silent: the peer
            // is), it stays for the stream's own timeouts to repair.
            if t.to != PathState::Active && self.paths.other_usable(t.rail) {
                if t.from == PathState::Active && self.send.in_flight_on(t.rail) {
                    cx.stats.failovers += 1;
                }
                self.send.fail_over(now, t.rail);
            }
            cx.events.push_back(t.event(self.id, now));
        }
    }

    /// A path answered again: data still out on paths that are not active
    /// (left there when every path went silent at once, with nowhere to
    /// move it) goes again over the paths that answer, with a fresh
    /// timeout instead of the one backed off through the silence.
    fn rescue_stranded(&mut self, cx: &mut Context<'_>, now: Instant) {
        for rail in self.paths.inactive_rails() {
            if self.send.fail_over(now, rail) > 0 {
                cx.stats.failovers += 1;
            }
        }
    }

    /// Build the next datagram to this peer into `buf`. ACKs ride on data
    /// when there is any; small messages share one datagram.
    pub fn poll_transmit(&mut self, cx: &mut Context<'_>, now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        let config = cx.config;
        let header = Header {
            flags: HeaderFlags::default(),
            checksum: config.checksum,
            src_node: cx.node,
            dst_node: self.id,
            src_inc: cx.incarnation,
            dst_inc: self.incarnation,
            epoch: self.send.epoch(),
            probe: 0,
        };
        let cap = buf.len().min(self.max_datagram(config));
        if let Some((hello, try_no)) =
            self.hs.take_hello(now, config.max_datagram, cx.aggregate.rto_ceiling(), self.paths.rails_len())
        {
            // Alone in its datagram, padded to the size it proposes (its
            // arrival proves the path carries it, and the WELCOME it asks
            // for is no larger); each try on the next rail, as nothing says
            // which rail works.
            let rail = self.paths.nth_rail(try_no);
            // Our own largest, not a size agreed before: a new handshake
            // proposes, and proves, it afresh.
            let cap = buf.len().min(config.max_datagram);
            let mut w = self.writer(cx.config, &mut buf[..cap], &header, false)?;
            w.push_handshake(&hello).ok()?;
            w.pad_to(hello.max_datagram as usize);
            let len = w.finish();
            cx.stats.hellos_sent += 1;
            trace!(
                node = cx.node,
                peer = self.id,
                try_no,
                rail,
                size = hello.max_datagram,
                "handshake: HELLO sent"
            );
            cx.stats.datagrams_sent += 1;
            cx.stats.bytes_sent += len as u64;
            return Some(Transmit { dst: self.id, len, rail, to_addr: None });
        }
        if !self.session() {
            return None;
        }
        let stats = &mut *cx.stats;
        // A datagram with no frames: a path's probe or its answer, or a
        // retransmission timeout's probe over the rail data would take.
        // A path's probe is unnumbered (0): its answer proves the path,
        // not what the stream delivered.
        //
        // An ACK owed goes out before a path's answer: a peer that was
        // silent on every path (its thread descheduled) then answers the
        // data it holds before the probes that came in beside it (a probe
        // owes an ACK of its own too: one datagram more, not a delay), and its
        // sender does not take the other path's answer for evidence that
        // the data's path went silent alone (`Paths::heard_elsewhere`).
        let ack_first = self.paths.pong_owed() && self.recv.ack_pending() && self.recv.marks_intact();
        let control = if ack_first {
            None
        } else {
            match self.paths.take_control(now, config, self.send.has_unacked()) {
                Some((rail, control)) => Some((rail, control == Control::Probe, 0)),
                None => {
                    self.send.take_probe(now).map(|n| (self.paths.data_rail(config.rail_policy), true, n))
                }
            }
        };
        if let Some((rail, probe, number)) = control {
            let mut w = self.writer(cx.config, &mut buf[..cap], &header, true)?;
            if probe {
                w.set_probe(number);
            }
            let len = w.finish();
            self.paths.on_sent(now, rail, 0, 0, probe);
            stats.probes_sent += probe as u64;
            stats.datagrams_sent += 1;
            stats.bytes_sent += len as u64;
            return Some(Transmit { dst: self.id, len, rail, to_addr: None });
        }
        // Data goes where the rail policy says; an ACK alone answers on
        // the rail the peer was last heard on.
        let room = cx.aggregate.room();
        let rail = if self.send.has_work(now, config, room) || !self.unreliable.is_empty() {
            self.paths.data_rail(config.rail_policy)
        } else {
            self.paths.reply_rail()
        };
        let mut w = self.writer(cx.config, &mut buf[..cap], &header, true)?;
        let empty_room = w.remaining();
        // Until the peer shows it knows us, our CONFIRM rides in front.
        let confirming = self.hs.confirm().is_some_and(|c| w.push_handshake(&c).is_ok());
        if confirming {
            self.hs.on_confirm_sent();
        }
        let mut acked = false;
        if self.recv.ack_pending() {
            if self.recv.marks_intact() {
                let ack = self.recv.take_ack();
                if let Some(left) = self.recv.take_left_ack() {
                    // Before our own ACK, and only with room for both.
                    if w.remaining() >= left.encoded_len() + ack.encoded_len() {
                        let _ = w.push_ack(&left);
                    }
                }
                // Config validation guarantees room for a full ACK in any datagram.
                acked = w.push_ack(&ack).is_ok();
                stats.acks_sent += acked as u64;
            } else {
                // An ACK by a corrupted mark could acknowledge what was never
                // delivered: none is sent (an engine stops on the counter).
                stats.integrity_faults += 1;
            }
        }
        // Unreliable messages go next, as many as fit: they wait for
        // nothing. A message always fits a datagram beside a CONFIRM
        // (`Endpoint::max_unreliable_len` leaves room for one), so one
        // that does not fit now goes in the next datagram, after the ACK
        // that took its room, and every datagram makes progress. One that
        // would not fit even that (the size agreed with the peer is below
        // the one it was sent for) never will: dropped, counted.
        let mut unreliable = 0;
        while let Some(len) = self.unreliable.next_len() {
            let need = DatagramFrame::encoded_len(len);
            if need <= w.remaining() {
                let (port, msg) = self.unreliable.take().expect("a message is queued");
                w.push_datagram(port, &msg).expect("it fits");
                stats.unreliable_sent += u64::from(port == tether_wire::PORT_APPLICATION);
                stats.service_sent += u64::from(port >= tether_wire::PORT_MEMBERS);
                unreliable += 1;
            } else if need + HANDSHAKE_LEN > empty_room {
                self.unreliable.take();
                stats.unreliable_dropped += 1;
            } else {
                break;
            }
        }
        let retransmits_before = stats.retransmits;
        let frames = self.send.fill(&mut w, now, rail, config, stats, room);
        if frames == 0 && !acked && !confirming && unreliable == 0 {
            return None;
        }
        if frames == 0 {
            stats.standalone_acks += 1;
        }
        let len = w.finish();
        let retransmits = stats.retransmits - retransmits_before;
        self.paths.on_sent(now, rail, frames as u64, retransmits, frames > 0);
        stats.datagrams_sent += 1;
        stats.bytes_sent += len as u64;
        Some(Transmit { dst: self.id, len, rail, to_addr: None })
    }

    /// A writer for the next datagram to the peer: sealed under the
    /// session's key when there is a cluster key (a HELLO, `in_session`
    /// false, under the key for the header's incarnations), else checksummed.
    fn writer<'b>(
        &mut self,
        config: &Config,
        buf: &'b mut [u8],
        header: &Header,
        in_session: bool,
    ) -> Option<PacketWriter<'b>> {
        let Some(ck) = &config.key else { return PacketWriter::new(buf, header).ok() };
        // Every datagram under a key takes a fresh number: it is the
        // AES-GCM nonce, which must never repeat.
        let pn = self.next_pn();
        if !in_session {
            let key = ck.datagram_key(header.src_node, header.src_inc, header.dst_node, header.dst_inc);
            return PacketWriter::new_authenticated(buf, header, &key, pn).ok();
        }
        let keys = self.session_keys(config, header.src_node, header.src_inc)?;
        PacketWriter::new_authenticated(buf, header, &keys.tx, pn).ok()
    }

    /// The next packet number toward this peer (shared by every datagram
    /// to it, the endpoint's WELCOMEs included, so none repeats).
    pub fn next_pn(&mut self) -> u64 {
        self.tx_pn += 1;
        self.tx_pn - 1
    }

    /// The session's keys (derived once per pair of incarnations), given
    /// our node and incarnation; `None` without a cluster key or a session.
    pub fn session_keys(&mut self, config: &Config, node: NodeId, inc: u64) -> Option<&SessionKeys> {
        let ck = config.key.as_ref()?;
        if !self.session() {
            return None;
        }
        let incs = (inc, self.incarnation);
        if self.keys.as_ref().is_none_or(|k| k.incs != incs) {
            self.keys = Some(SessionKeys {
                incs,
                tx: ck.datagram_key(node, inc, self.id, self.incarnation),
                rx: ck.datagram_key(self.id, self.incarnation, node, inc),
            });
        }
        self.keys.as_ref()
    }

    /// The application read from a full delivery queue: segments that
    /// waited for room go in now, and the sender hears so at once.
    pub fn on_delivery_room(&mut self, cx: &mut Context<'_>) {
        if self.recv.drain(cx, self.sender()) {
            self.recv.request_ack_now();
        }
    }

    /// Both halves' invariants without trusting them (`SendStream::audit`):
    /// the first one broken.
    pub fn audit(&self, config: &Config) -> Result<(), &'static str> {
        self.send.audit()?;
        self.recv.audit(config)
    }

    /// Both halves' invariants, and the timer table agrees with them.
    pub fn check_invariants(&self, config: &Config) {
        self.send.check_invariants(config);
        self.recv.check_invariants(config);
        assert_eq!(self.timers.get(Timer::Retransmit), self.send.rto_deadline(), "stale retransmit timer");
        let ack_deadline = self.recv.ack_deadline().filter(|_| self.session());
        assert_eq!(self.timers.get(Timer::DelayedAck), ack_deadline, "stale delayed-ACK timer");
    }
}

/// The NACK-reliable sender's view of the endpoint and the peer's outbox.
fn nacked_around<'a>(
    cx: &'a mut Context<'_>,
    outbox: &'a mut Outbox,
    rto: core::time::Duration,
) -> nacked::Around<'a> {
    nacked::Around { pool: cx.messages, config: cx.config, stats: cx.stats, events: cx.events, outbox, rto }
}

/// The NACK-reliable receiver's view.
fn nacked_inward<'a>(
    cx: &'a mut Context<'_>,
    outbox: &'a mut Outbox,
    rto: core::time::Duration,
) -> nacked::Inward<'a> {
    nacked::Inward { pool: cx.messages, config: cx.config, stats: cx.stats, inbox: cx.nacked, outbox, rto }
}
