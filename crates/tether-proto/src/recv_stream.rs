//! The receiving half of a stream: in-order delivery and reassembly.
//!
//! A segment is acknowledged only once it has been consumed into the
//! application's delivery queue (or into the message being reassembled for
//! it): the commit point of Zhou et al. [FTGM] section 4
//! (docs/REFERENCES.md), so a crash between receipt and delivery can never
//! lose an acknowledged message. Segments that arrive ahead of a hole wait
//! in a bounded out-of-order buffer and are reported in SACK ranges; in
//! go-back-N mode nothing is kept out of order.
//!
//! Hard and soft state: everything here but the owed ACK is hard (the
//! epoch, delivered-up-to, the message being reassembled, the segments
//! held out of order, some of which the sender may already have seen
//! selectively acknowledged and will not send again). [`RecvSnapshot`]
//! exports it; a restored stream owes the sender an ACK at once.

use std::collections::{BTreeMap, VecDeque};

use core::time::Duration;

use bytes::{Bytes, BytesMut};
use tether_wire::{AckRepr, Channel, DataFlags, DataFrame, SackRange};

use crate::context::Context;
use crate::delivery::copy_to_bytes;
use crate::message_pool::MessagePool;
use crate::{Config, Delivery, Fragment, Instant, NodeId, RetransmitMode, Stats};

/// A verified payload's landing (see `landing`), handed to the stream with
/// its frame.
#[derive(Debug)]
pub(crate) enum Landed {
    /// Not copied: the stream copies from the datagram if it keeps it.
    Nowhere,
    /// Copied and committed: the stream keeps these bytes as they are.
    Arena(Bytes),
    /// Written into the spare capacity of this stream's reassembly buffer
    /// (or, for a message's first fragment, of the buffer it will start),
    /// `len` bytes, through [`RecvStream::continuation`].
    Partial { len: usize },
}

impl Landed {
    /// The payload as bytes of its own: the landing itself, or else a copy
    /// of `payload` (from the verified datagram) into `arena`, counted.
    pub fn into_bytes(self, payload: &[u8], arena: &mut BytesMut, stats: &mut Stats) -> Bytes {
        match self {
            Landed::Arena(bytes) => bytes,
            Landed::Nowhere | Landed::Partial { .. } => {
                stats.bytes_copied_after_verify += payload.len() as u64;
                copy_to_bytes(arena, payload)
            }
        }
    }
}

/// How far ahead of its current epoch a receiver takes a new one from
/// DATA. A sender moves its epoch one step at each abandonment (a peer
/// silent for `abandon_after`) or carry-over, so 65,536 steps are
/// three days of five-second outages; further ahead is no sender's, and
/// taking it would make its old epochs, still on the way in delayed
/// datagrams, look newer again (in serial arithmetic, half the space
/// ahead is also half behind): the `forged_epochs` mix re-took epoch 1's
/// datagrams after a forged DATA frame moved a receiver 2^31 - 1 ahead.
pub const EPOCH_WINDOW: u32 = 1 << 16;

/// Epochs a receive stream remembers its last word on.
const PAST_EPOCHS: usize = 8;

/// Whether a receiver on epoch `current` takes `epoch` from DATA: it lies
/// at most `EPOCH_WINDOW` ahead.
pub fn epoch_within_reach(epoch: u32, current: u32) -> bool {
    let ahead = epoch.wrapping_sub(current);
    ahead != 0 && ahead <= EPOCH_WINDOW
}

/// Whether a receiver on epoch `theirs` is somewhere a sender on `ours`
/// cannot move it by sending: anywhere but `ours` or within
/// `EPOCH_WINDOW` behind it (from there our data moves it). The sender's
/// test for having been overtaken, the complement of `epoch_within_reach`,
/// so for every pair of epochs exactly one side moves: the receiver takes
/// `ours`, or the sender goes to the epoch after `theirs`.
pub fn epoch_overtakes(theirs: u32, ours: u32) -> bool {
    ours.wrapping_sub(theirs) > EPOCH_WINDOW
}

/// Who sent what a stream receives: the node, and the life of it the
/// session is with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sender {
    pub node: NodeId,
    pub incarnation: u64,
}

/// A segment held out of order: hard state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StashedSegment {
    /// Whether it is the first and/or the last fragment of its message.
    pub flags: DataFlags,
    /// The whole message's length, carried by first fragments.
    pub total_len: Option<u32>,
    /// The fragment's bytes.
    pub data: Bytes,
    /// With `Config::verify_payloads`, the CRC32C of `data` when it
    /// arrived (verified by the datagram's checksum): checked before the
    /// segment is consumed, so bytes the engine's own memory corrupted
    /// while they waited are dropped (and sent again by the peer, which
    /// sees them missing from the SACK ranges), never delivered (Zhou et
    /// al. [FTGM] section 4.2).
    pub digest: Option<u32>,
}

impl StashedSegment {
    /// A segment held out of order, with the digest of its bytes now if
    /// `verify`.
    pub fn new(flags: DataFlags, total_len: Option<u32>, data: Bytes, verify: bool) -> Self {
        let digest = verify.then(|| crc32c::crc32c(&data));
        StashedSegment { flags, total_len, data, digest }
    }

    /// Its bytes are still those that arrived (as far as a digest says).
    pub fn intact(&self) -> bool {
        self.digest.is_none_or(|d| crc32c::crc32c(&self.data) == d)
    }
}

/// The message being reassembled, as exported.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum PartialMessage {
    /// Fragments consumed so far (and acknowledged) of a `total`-byte message.
    Assembling {
        /// The bytes consumed so far.
        received: Bytes,
        /// The message's length.
        total: usize,
        /// Its channel (`Delivery::channel`).
        channel: Channel,
    },
    /// A message that broke a rule: its remaining fragments are dropped.
    Discarding,
}

/// A receive stream's hard state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecvSnapshot {
    /// The peer's stream epoch being received; `None` before the first data.
    pub epoch: Option<u32>,
    /// Delivered-up-to: every segment below it was consumed (delivered or
    /// taken into the message being reassembled) and may be acknowledged.
    pub delivered_upto: u64,
    /// The message being reassembled, if any.
    pub partial: Option<PartialMessage>,
    /// Segments above a hole, by sequence number.
    pub out_of_order: Vec<(u64, StashedSegment)>,
}

#[derive(Debug)]
enum Partial {
    Assembling {
        buf: Vec<u8>,
        total: usize,
        /// Bytes of `buf`'s spare capacity lent to the current datagram's
        /// landing by `continuation`; any other write to `buf` clears it.
        /// A [`Landed::Partial`] of exactly this length is the proof that
        /// the landing wrote those bytes into this very buffer, untouched
        /// since.
        lent: usize,
        /// Its channel: every fragment must name it too.
        channel: Channel,
    },
    /// The message broke a rule (too large, inconsistent lengths): its
    /// remaining fragments are consumed and dropped, so the stream goes on.
    Discarding,
}

#[derive(Debug, Default)]
struct AckState {
    pending: bool,
    due: Option<Instant>,
    /// The next ACK answers a probe, numbered so (`AckRepr::answer`).
    answer: Option<u8>,
}

#[derive(Debug)]
pub(crate) struct RecvStream {
    // Hard state.
    /// The peer's stream epoch we are receiving; `None` before the first data.
    epoch: Option<u32>,
    expected: u64,
    out_of_order: BTreeMap<u64, StashedSegment>,
    partial: Option<Partial>,
    /// With `Config::deliver_fragments`: every segment below this was
    /// taken from the delivery queue by the application (its engine), the
    /// commit point; ACKs go no further.
    taken: u64,
    /// `(expected, taken)` kept twice: the marks decide what is delivered
    /// and acknowledged, and one bit flipped in either would skip or
    /// acknowledge segments never delivered, so each use checks the copy
    /// first (Zhou et al. [FTGM] section 4: state checked before use).
    marks_copy: (u64, u64),
    /// The epochs this stream left, newest last (at most `PAST_EPOCHS`),
    /// each with the point it had consumed (delivered, or queued for
    /// delivery and taken) in it when it moved on: its last word on that
    /// epoch, as the stream never goes back (`None`: not known, fragment
    /// mode with fragments consumed and not taken). A sender still on one
    /// of them, whose data is now stale here, learns it (`take_left_ack`)
    /// and carries what is above it over to a new epoch instead of failing
    /// it. Soft: lost, the sender falls back to failing its unacknowledged
    /// messages in doubt.
    past: VecDeque<(u32, Option<u64>)>,
    /// `past` holds every epoch this stream was on since its session
    /// began (none forgotten, not restored): one in neither it nor
    /// `epoch` was never taken, nothing of it consumed.
    whole: bool,
    /// The last word owed to the sender: an epoch and its point.
    owe_left: Option<(u32, u64)>,
    // Soft state.
    ack: AckState,
    /// The last ACK sent stopped short of what was consumed (fragment
    /// mode): the next take must be told at once.
    held_back: bool,
    ack_delay: Duration,
    /// The buffer a message's first fragment lands in during verification
    /// (`continuation`), to become the reassembly buffer when the fragment
    /// is consumed: so the first fragment too is copied once, not landed
    /// and copied again. One per stream, at most `max_message_len` bytes,
    /// replaced by the next first fragment's if never consumed: it bounds
    /// what an unverified header can make the stream allocate to what a
    /// message in reassembly may hold anyway.
    fresh: Option<Vec<u8>>,
    /// Bytes of `fresh` lent to the current datagram's landing (as
    /// `Partial::Assembling::lent`): 0 once consumed.
    fresh_lent: usize,
    /// `Config::max_message_len`.
    max_message_len: usize,
    /// `Config::deliver_fragments`.
    fragments: bool,
    /// `Config::verify_payloads`.
    verify: bool,
}

impl RecvStream {
    pub fn new(config: &Config) -> Self {
        RecvStream {
            epoch: None,
            expected: 0,
            out_of_order: BTreeMap::new(),
            partial: None,
            taken: 0,
            marks_copy: (0, 0),
            past: VecDeque::new(),
            whole: true,
            owe_left: None,
            ack: AckState::default(),
            held_back: false,
            ack_delay: config.ack_delay,
            fresh: None,
            fresh_lent: 0,
            max_message_len: config.max_message_len,
            fragments: config.deliver_fragments,
            verify: config.verify_payloads,
        }
    }

    /// Export the hard state.
    pub fn snapshot(&self) -> RecvSnapshot {
        let partial = self.partial.as_ref().map(|p| match p {
            Partial::Assembling { buf, total, channel, .. } => PartialMessage::Assembling {
                received: Bytes::copy_from_slice(buf),
                total: *total,
                channel: *channel,
            },
            Partial::Discarding => PartialMessage::Discarding,
        });
        RecvSnapshot {
            epoch: self.epoch,
            delivered_upto: self.expected,
            partial,
            out_of_order: self.out_of_order.iter().map(|(&seq, s)| (seq, s.clone())).collect(),
        }
    }

    /// Rebuild a stream from its hard state. It owes its sender an ACK at
    /// once: whatever ACK was owed went with the soft state.
    pub fn restore(config: &Config, snapshot: RecvSnapshot) -> Self {
        let mut r = RecvStream::new(config);
        // The epochs it left went with the soft state.
        r.whole = snapshot.epoch.is_none();
        r.epoch = snapshot.epoch;
        r.expected = snapshot.delivered_upto;
        // Whatever waits in a restored delivery queue was acknowledged
        // already (in fragment mode a restore brings none back).
        r.taken = snapshot.delivered_upto;
        r.marks_copy = (r.expected, r.taken);
        r.out_of_order = snapshot.out_of_order.into_iter().collect();
        r.partial = snapshot.partial.map(|p| match p {
            PartialMessage::Assembling { received, total, channel } => {
                let mut buf = Vec::with_capacity(total);
                buf.extend_from_slice(&received);
                Partial::Assembling { buf, total, lent: 0, channel }
            }
            PartialMessage::Discarding => Partial::Discarding,
        });
        r.request_ack_now();
        r
    }

    /// A new epoch (or a new incarnation of the peer) starts a fresh
    /// sequence space; partial and out-of-order data of the old one is void.
    pub fn reset(&mut self, epoch: Option<u32>) {
        if epoch.is_none() {
            // A new incarnation of the peer: a session begins.
            self.past.clear();
            self.whole = true;
        }
        self.owe_left = None;
        self.epoch = epoch;
        self.expected = 0;
        self.taken = 0;
        self.marks_copy = (0, 0);
        self.out_of_order.clear();
        self.partial = None;
        self.fresh_lent = 0;
    }

    /// Where data of `epoch` stands: true if it is current (after adopting a
    /// newer epoch), false if it is from an older epoch and must be dropped.
    pub fn admit_epoch(&mut self, epoch: u32) -> bool {
        match self.epoch {
            Some(current) if epoch == current => true,
            Some(current) if !epoch_within_reach(epoch, current) => false,
            current => {
                // In fragment mode what was consumed and not yet taken is
                // not known to arrive (an engine dying with it reneges):
                // no last word then.
                let settled = !self.fragments || self.taken >= self.expected;
                let left = current.map(|e| (e, settled.then_some(self.expected)));
                self.reset(Some(epoch));
                if let Some(left) = left {
                    if self.past.len() == PAST_EPOCHS {
                        self.past.pop_front();
                        self.whole = false;
                    }
                    self.past.push_back(left);
                }
                true
            }
        }
    }

    /// Data (or a probe) of `epoch` arrived that this stream does not take:
    /// the sender hears where the stream stands, and if `epoch` is the one
    /// it left, where that one ended.
    pub fn on_stale(&mut self, now: Instant, epoch: u32) {
        self.note_epoch(epoch);
        self.request_ack(now, false);
    }

    /// A datagram of `epoch` that this stream drops as stale (an epoch it
    /// left, or one it was never on): its next ACK says where that epoch
    /// ended, if it knows (`take_left_ack`).
    pub fn note_epoch(&mut self, epoch: u32) {
        let Some(current) = self.epoch else { return };
        if epoch == current || epoch_within_reach(epoch, current) {
            return;
        }
        let point = match self.past.iter().rev().find(|(e, _)| *e == epoch) {
            Some(&(_, point)) => point,
            None if self.whole => Some(0),
            None => None,
        };
        self.owe_left = point.map(|p| (epoch, p));
    }

    /// The ACK that closes the epoch this stream left, if one is owed: it
    /// goes just before the stream's own ACK in one datagram, which is how
    /// the sender knows it is the last word on its epoch.
    pub fn take_left_ack(&mut self) -> Option<AckRepr> {
        self.owe_left.take().map(|(epoch, point)| AckRepr::new(epoch, point))
    }

    /// Would a DATA frame with `seq` be kept (consumed or stashed)? A hint
    /// for landing its payload during verification; `on_data` decides.
    pub fn wants(&self, seq: u64, recv_window: u64) -> bool {
        seq >= self.expected && seq < self.expected + recv_window && !self.out_of_order.contains_key(&seq)
    }

    /// The reassembly buffer `frame` would continue in order, with room for
    /// its payload: where the payload can land during verification. Lends
    /// the buffer's spare capacity: the landing that asks is the only
    /// writer until the frame is consumed (see [`Partial::Assembling`]).
    pub fn continuation(&mut self, frame: &DataFrame<'_>, pool: &MessagePool) -> Option<&mut Vec<u8>> {
        if frame.seq != self.expected {
            return None;
        }
        if frame.flags.first() {
            return self.fresh_landing(frame, pool);
        }
        let len = frame.payload.len();
        match &mut self.partial {
            Some(Partial::Assembling { buf, total, lent, .. })
                if buf.len() + len <= *total && buf.capacity() - buf.len() >= len =>
            {
                *lent = len;
                Some(buf)
            }
            _ => None,
        }
    }

    /// A buffer of the whole message's size for a first fragment in order
    /// to land in, where `consume` will start reassembly with it: only
    /// with no message in reassembly, and for a length within the limit
    /// (the header is not verified yet; `consume` checks again).
    fn fresh_landing(&mut self, frame: &DataFrame<'_>, pool: &MessagePool) -> Option<&mut Vec<u8>> {
        let total = frame.total_len? as usize;
        let len = frame.payload.len();
        if self.fragments || self.partial.is_some() || total > self.max_message_len || len > total {
            return None;
        }
        let buf = match self.fresh.take() {
            Some(mut b) if b.capacity() >= total => {
                b.clear();
                b
            }
            _ => pool.take(total),
        };
        self.fresh_lent = len;
        Some(self.fresh.insert(buf))
    }

    /// The reassembly buffer for a first fragment being consumed: `fresh`,
    /// if the fragment landed there, else a new one it is copied into.
    fn start_message(
        &mut self,
        total: usize,
        payload: &[u8],
        landed: Landed,
        stats: &mut Stats,
        pool: &MessagePool,
    ) -> Vec<u8> {
        let lent = std::mem::take(&mut self.fresh_lent);
        match (landed, self.fresh.take()) {
            (Landed::Partial { len }, Some(mut buf))
                if len == payload.len() && lent == len && buf.is_empty() =>
            {
                // SAFETY: `fresh_landing` lent exactly `len` bytes of this
                // empty buffer's spare capacity to this datagram's landing
                // (`fresh_lent`, cleared by every other use), and
                // verification succeeded, so they hold this payload.
                unsafe { buf.set_len(len) };
                debug_assert_eq!(&buf[..], payload);
                buf
            }
            (_, fresh) => {
                self.fresh = fresh;
                let mut buf = pool.take(total);
                stats.bytes_copied_after_verify += payload.len() as u64;
                buf.extend_from_slice(payload);
                buf
            }
        }
    }

    /// Take in a verified DATA frame of the current epoch.
    pub fn on_data(
        &mut self,
        cx: &mut Context<'_>,
        now: Instant,
        from: Sender,
        frame: &DataFrame<'_>,
        landed: Landed,
    ) {
        let seq = frame.seq;
        let stats = &mut *cx.stats;
        if !self.marks_intact() {
            // Nothing is consumed or acknowledged by a corrupted mark.
            stats.integrity_faults += 1;
            return;
        }
        if seq < self.expected || self.out_of_order.contains_key(&seq) {
            stats.duplicates_discarded += 1;
            self.request_ack(now, true);
            return;
        }
        if seq >= self.expected + cx.config.recv_window as u64 {
            stats.out_of_window += 1;
            self.request_ack(now, true);
            return;
        }
        let full = !cx.deliveries.has_room();
        if seq > self.expected || full {
            if full {
                // The commit point: nothing is consumed, so nothing new is
                // acknowledged, until the application reads. The segment
                // waits here (unacknowledged) so that reading alone, with
                // no retransmission, lets the stream continue: see `drain`.
                stats.out_of_window += 1;
            }
            if cx.config.retransmit == RetransmitMode::GoBackN && seq > self.expected {
                stats.out_of_window += 1;
            } else {
                let data = landed.into_bytes(frame.payload, cx.recv_arena, stats);
                self.out_of_order
                    .insert(seq, StashedSegment::new(frame.flags, frame.total_len, data, self.verify));
            }
            self.request_ack(now, true);
            return;
        }
        self.consume(cx, from, frame.flags, frame.total_len, frame.payload, landed);
        self.drain(cx, from);
        self.request_ack(now, !self.out_of_order.is_empty());
    }

    /// Consume stashed segments that are now in order, while the delivery
    /// queue has room. Called after an in-order arrival and after the
    /// application reads: a stashed segment may already be selectively
    /// acknowledged, and then its sender will never send it again.
    pub fn drain(&mut self, cx: &mut Context<'_>, from: Sender) -> bool {
        let mut progressed = false;
        if !self.marks_intact() {
            cx.stats.integrity_faults += 1;
            return false;
        }
        while cx.deliveries.has_room() {
            let Some(s) = self.out_of_order.remove(&self.expected) else { break };
            if !s.intact() {
                cx.stats.integrity_faults += 1;
                break;
            }
            self.consume(cx, from, s.flags, s.total_len, &s.data, Landed::Arena(s.data.clone()));
            progressed = true;
        }
        progressed
    }

    /// An ACK is owed at once, whatever the time: for callers without a clock.
    pub fn request_ack_now(&mut self) {
        self.ack.pending = true;
        self.ack.due = Some(Instant::ZERO);
    }

    /// Probe `n` came (`Header::probe`; 0: an unnumbered one): the next
    /// ACK goes at once and says it answers it, covering all that arrived
    /// before it did. Of several probes before one ACK it names the
    /// latest numbered one: covering all before that, it covers all
    /// before the others too.
    pub fn answer_probe(&mut self, n: u8) {
        self.request_ack_now();
        self.ack.answer = Some(match self.ack.answer {
            Some(earlier) if n == 0 => earlier,
            _ => n,
        });
    }

    /// Take the in-order segment `self.expected` into reassembly or delivery.
    fn consume(
        &mut self,
        cx: &mut Context<'_>,
        Sender { node: from, incarnation }: Sender,
        flags: DataFlags,
        total_len: Option<u32>,
        payload: &[u8],
        landed: Landed,
    ) {
        let stats = &mut *cx.stats;
        self.expected += 1;
        self.marks_copy.0 = self.expected;
        if self.fragments {
            // The application reassembles: the segment goes up as it is,
            // with its place in the message and in the stream.
            let fragment = Fragment {
                incarnation,
                epoch: self.epoch.unwrap_or(0),
                seq: self.expected - 1,
                first: flags.first(),
                last: flags.last(),
                total_len,
            };
            let message = landed.into_bytes(payload, cx.recv_arena, stats);
            cx.deliveries
                .push(Delivery { from, message, fragment: Some(fragment), channel: flags.channel() }, stats);
            return;
        }
        if flags.first() {
            if self.partial.take().is_some() {
                // A new message began before the previous one ended.
                stats.protocol_violations += 1;
            }
            if flags.last() {
                let message = landed.into_bytes(payload, cx.recv_arena, stats);
                cx.deliveries
                    .push(Delivery { from, message, fragment: None, channel: flags.channel() }, stats);
                return;
            }
            let total = total_len.map_or(0, |t| t as usize);
            if total > cx.config.max_message_len {
                stats.protocol_violations += 1;
                self.partial = Some(Partial::Discarding);
                return;
            }
            let buf = self.start_message(total, payload, landed, stats, cx.messages);
            self.partial = Some(Partial::Assembling { buf, total, lent: 0, channel: flags.channel() });
            return;
        }
        match self.partial.take() {
            None => stats.protocol_violations += 1,
            Some(Partial::Discarding) => {
                if !flags.last() {
                    self.partial = Some(Partial::Discarding);
                }
            }
            Some(Partial::Assembling { mut buf, total, lent, channel }) => {
                // Every fragment names its message's channel, and they
                // must agree: one that does not is not this message's.
                let mismatch = flags.channel() != channel;
                if mismatch
                    || buf.len() + payload.len() > total
                    || (flags.last() && buf.len() + payload.len() != total)
                {
                    stats.protocol_violations += 1;
                    if !flags.last() {
                        self.partial = Some(Partial::Discarding);
                    }
                    return;
                }
                match landed {
                    Landed::Partial { len } if len == payload.len() && lent == len => {
                        // SAFETY: `continuation` lent exactly `len` bytes of
                        // this buffer's spare capacity to this datagram's
                        // landing (`lent`), every other write to the buffer
                        // clears `lent`, and verification succeeded, so
                        // those bytes hold this payload.
                        unsafe { buf.set_len(buf.len() + len) };
                        debug_assert_eq!(&buf[buf.len() - len..], payload);
                    }
                    _ => {
                        stats.bytes_copied_after_verify += payload.len() as u64;
                        buf.extend_from_slice(payload);
                    }
                }
                if flags.last() {
                    let message = cx.messages.seal(buf);
                    cx.deliveries.push(Delivery { from, message, fragment: None, channel }, stats);
                } else {
                    self.partial = Some(Partial::Assembling { buf, total, lent: 0, channel });
                }
            }
        }
    }

    /// Note that an ACK is owed: at once, or after the delayed-ACK interval
    /// in the hope that reverse data will carry it.
    pub fn request_ack(&mut self, now: Instant, immediate: bool) {
        self.ack.pending = true;
        if immediate {
            self.ack.due = Some(now);
        } else if self.ack.due.is_none() {
            self.ack.due = Some(now + self.ack_delay);
        }
    }

    /// An ACK is owed and may ride on data now.
    pub fn ack_pending(&self) -> bool {
        self.ack.pending
    }

    /// An ACK is owed and may not wait any longer.
    pub fn ack_due(&self, now: Instant) -> bool {
        self.ack.pending && self.ack.due.is_some_and(|due| due <= now)
    }

    /// When the owed ACK must go at the latest.
    pub fn ack_deadline(&self) -> Option<Instant> {
        self.ack.due.filter(|_| self.ack.pending)
    }

    /// The ACK to send now: cumulative plus SACK ranges of what waits out of
    /// order (as many as fit; the lowest holes matter most).
    pub fn take_ack(&mut self) -> AckRepr {
        let answer = self.ack.answer;
        self.ack = AckState::default();
        let mut ack = AckRepr::new(self.epoch.unwrap_or(0), self.ack_point());
        ack.answer = answer;
        self.held_back = ack.cumulative < self.expected;
        ack.full = self.waits_for_room();
        if ack.cumulative + 1 < self.expected {
            // Consumed and not yet taken (fragment mode): held, not lost,
            // so selectively acknowledged; if the engine dies with them the
            // sender sees the reneging and resends. The first is the
            // cumulative point itself, which no range may name.
            let base = ack.cumulative;
            let held = SackRange { start: 1, end: (self.expected - base) as u32 };
            if !ack.push_range(held) {
                return ack;
            }
        }
        let mut run: Option<(u64, u64)> = None;
        for &seq in self.out_of_order.keys() {
            match run {
                Some((start, end)) if end == seq => run = Some((start, end + 1)),
                Some((start, end)) => {
                    if !self.push_range(&mut ack, start, end) {
                        return ack;
                    }
                    run = Some((seq, seq + 1));
                }
                None => run = Some((seq, seq + 1)),
            }
        }
        if let Some((start, end)) = run {
            self.push_range(&mut ack, start, end);
        }
        ack
    }

    fn push_range(&self, ack: &mut AckRepr, start: u64, end: u64) -> bool {
        // A segment at the cumulative point waits for delivery-queue room:
        // it is not acknowledged (the commit point), so no range covers it.
        let start = start.max(self.expected + 1);
        if start >= end {
            return true;
        }
        // Offsets fit in u32: the receive window is at most 2^20 segments
        // (and in fragment mode the delivery queue's bound, far below,
        // separates `taken` from `expected`).
        let base = ack.cumulative;
        let range = SackRange { start: (start - base) as u32, end: (end - base) as u32 };
        ack.push_range(range)
    }

    /// What the cumulative ACK says was received: everything consumed, or
    /// in fragment mode everything the application took.
    fn ack_point(&self) -> u64 {
        if self.fragments {
            self.taken.min(self.expected)
        } else {
            self.expected
        }
    }

    /// The application took the fragment ending the stream at `end` in
    /// `epoch` (fragment mode): the commit point moves, and if the last ACK
    /// stopped short of it the sender hears at once.
    pub fn on_taken(&mut self, epoch: u32, end: u64) {
        if self.epoch != Some(epoch) || end <= self.taken {
            return;
        }
        self.taken = end.min(self.expected);
        self.marks_copy.1 = self.taken;
        if std::mem::take(&mut self.held_back) {
            self.request_ack_now();
        }
    }

    /// The receiver's windows hold (see `check_invariants` on the sender).
    /// The next segment to consume waits in the out-of-order buffer: only
    /// a full delivery queue may hold it there.
    pub fn waits_for_room(&self) -> bool {
        self.out_of_order.contains_key(&self.expected)
    }

    /// Every segment held out of order against its digest
    /// (`Config::verify_payloads`); the bytes read are taken off `budget`.
    pub fn audit_payloads(&self, budget: &mut usize) -> Result<(), &'static str> {
        for s in self.out_of_order.values() {
            if !s.intact() {
                return Err("a payload held out of order changed since it arrived");
            }
            *budget = budget.saturating_sub(s.data.len().max(1));
        }
        Ok(())
    }

    /// The consumed and taken marks equal their copies.
    pub fn marks_intact(&self) -> bool {
        self.marks_copy == (self.expected, self.taken)
    }

    /// Segments wait out of order.
    #[cfg(feature = "fault-hook")]
    pub fn holds_out_of_order(&self) -> bool {
        !self.out_of_order.is_empty()
    }

    /// The fault hook: one bit of a segment held out of order flipped.
    #[cfg(feature = "fault-hook")]
    pub fn flip_payload(&mut self, draw: &mut crate::fault_hook::Draw) -> String {
        let n = draw.below(self.out_of_order.len().max(1) as u64) as usize;
        let Some((&seq, s)) = self.out_of_order.iter_mut().nth(n) else {
            return "nothing held out of order: nothing flipped".into();
        };
        match crate::fault_hook::flip_bit(&mut s.data, draw) {
            Some(bit) => format!("bit {bit} of the payload of held segment {seq}"),
            None => format!("held segment {seq} is empty: nothing flipped"),
        }
    }

    /// The fault hook: one bit of the consumed or the taken mark.
    #[cfg(feature = "fault-hook")]
    pub fn flip_window(&mut self, draw: &mut crate::fault_hook::Draw) -> String {
        let bit = draw.below(64);
        if draw.below(2) == 0 {
            self.expected ^= 1 << bit;
            format!("bit {bit} of the receive stream's consumed mark (now {})", self.expected)
        } else {
            self.taken ^= 1 << bit;
            format!("bit {bit} of the receive stream's taken mark (now {})", self.taken)
        }
    }

    pub fn check_invariants(&self, config: &Config) {
        if let Err(broken) = self.audit(config) {
            panic!("receive stream: {broken}");
        }
    }

    /// The receiver's invariants, the first one broken (see
    /// `SendStream::audit`).
    pub fn audit(&self, config: &Config) -> Result<(), &'static str> {
        let check = |ok: bool, what: &'static str| if ok { Ok(()) } else { Err(what) };
        let window = config.recv_window as u64;
        check(self.out_of_order.len() as u64 <= window, "more held out of order than the window")?;
        if let (Some((&lo, _)), Some((&hi, _))) =
            (self.out_of_order.first_key_value(), self.out_of_order.last_key_value())
        {
            check(lo >= self.expected, "a consumed segment is still held out of order")?;
            check(hi < self.expected.saturating_add(window), "a held segment beyond the window")?;
        }
        check(self.marks_intact(), "the consumed or taken mark differs from its copy")?;
        check(self.taken <= self.expected, "taken beyond what was consumed")?;
        // Consumed and not taken is held in the delivery queue, one entry
        // per fragment: no more than it holds.
        check(
            !self.fragments || self.expected - self.taken <= config.delivery_queue_messages as u64,
            "more consumed and not taken than the delivery queue holds",
        )?;
        if let Some(Partial::Assembling { buf, total, .. }) = &self.partial {
            check(buf.len() <= *total, "a reassembled message longer than announced")?;
        }
        Ok(())
    }
}
