//! The NACK-reliable class (Li et al. [CI] section 3: the request-confirm
//! traffic of their management layer, where the application's own reply
//! is the acknowledgement): messages sent once and never acknowledged;
//! the receiver asks for what it misses, and the sender holds each message
//! for a bounded time to answer, then says what became of it.
//!
//! Like [CI]'s management layer it is built on the unreliable class, on a
//! port of its own (`PORT_NACKED`), so its datagrams are authenticated and
//! source-validated like every other of the session. Three frames, each
//! one DATAGRAM payload:
//!
//! * `MSG` (seq, oldest, message): message `seq` of this sender to this
//!   peer, and the oldest it still holds: anything older the receiver
//!   lacks is gone, and it stops waiting for it.
//! * `NACK` (up to [`MAX_NACK_RANGES`] ranges): the receiver asks for the
//!   messages it lacks, at most once a retransmission timeout.
//! * `STATE` (next, oldest): the sender's tail, repeated with back-off
//!   while it holds anything, so that a receiver whose last messages were
//!   lost learns they exist (the PGM/NORM watermark), and the answer to a
//!   NACK for what is no longer held.
//! * `SKIPPED` (ranges, as a NACK's): the receiver gave up on these (the
//!   sender no longer holds them) and will never deliver them. Only this
//!   makes the sender report a message lost: a NACK may be a late copy
//!   of one the message already answered (the simulator's
//!   `engine_state_loss` seed 53 delivered a message its sender then
//!   called lost on such a NACK).
//!
//! The receiver delivers each sender's messages in order, once each
//! (`Endpoint::recv_nacked`, with their numbers), and skips what the
//! sender no longer holds (`nacked_lost`). The sender reports each message
//! as it leaves the hold (`Event::Nacked`, in runs): never asked for,
//! repaired, and later lost if the receiver skipped it (it certainly
//! lacks it). "Never asked for" is not "delivered": a receiver
//! that missed a message and every `STATE` after it stays silent. That is
//! the class's bargain against the positive acknowledgements of the
//! streams: no traffic back when nothing is lost.
//!
//! Every queue is bounded by `Config::unreliable_queue_bytes` and
//! `unreliable_queue_messages`: the hold (a full one refuses the send:
//! `SendError::WouldBlock`), a receiver's reorder buffer and the endpoint's
//! delivery queue (past either a message is dropped, counted, and asked
//! for again), and a receiver never asks about more than that many
//! messages past what it delivered.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use bytes::Bytes;
use tether_wire::PORT_NACKED;

use crate::event::{Event, NackedFate};
use crate::message_pool::MessagePool;
use crate::unreliable::{Bounded, Outbox};
use crate::{Config, Instant, NodeId, Stats};

const KIND_MSG: u8 = 0;
const KIND_NACK: u8 = 1;
const KIND_STATE: u8 = 2;
const KIND_SKIPPED: u8 = 3;
/// A `MSG` frame before its message: kind, seq, oldest.
pub const MSG_HEADER: usize = 17;
const STATE_LEN: usize = 17;
/// One range of a `NACK`: first, count.
const RANGE_LEN: usize = 12;
/// Ranges one `NACK` asks for at most (the rest go in the next one).
pub const MAX_NACK_RANGES: usize = 16;

/// A NACK-reliable message delivered (`Endpoint::recv_nacked`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Nacked {
    /// The sending node.
    pub from: NodeId,
    /// Its number from that sender: increasing, with gaps where messages
    /// were lost (counted in `nacked_lost`).
    pub seq: u64,
    /// The message, whole.
    pub message: Bytes,
}

/// Why a frame of the class did not parse.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NackedError {
    /// No bytes at all.
    #[error("empty frame")]
    Empty,
    /// A kind byte this version does not know.
    #[error("unknown kind {0}")]
    UnknownKind(u8),
    /// Shorter than its kind's fixed part (or a NACK than its ranges).
    #[error("truncated")]
    Truncated,
    /// A NACK with no range or more than [`MAX_NACK_RANGES`].
    #[error("a NACK of {0} ranges (at most {MAX_NACK_RANGES}, at least one)")]
    BadRangeCount(usize),
    /// A NACK range that runs past the end of the sequence space, or a
    /// message numbered at its very end.
    #[error("past the end of the sequence space")]
    RangeOverflow,
    /// A sender's oldest held message said to be newer than what it sent.
    #[error("oldest past the message or the tail")]
    OldestAhead,
}

/// A frame of the class, parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NackedFrame<'a> {
    /// A message and where the sender's hold begins.
    Msg {
        /// The message's number.
        seq: u64,
        /// The oldest message the sender still holds.
        oldest: u64,
        /// The message.
        message: &'a [u8],
    },
    /// The receiver asks for these messages again.
    Nack {
        /// What it lacks.
        ranges: NackRanges<'a>,
    },
    /// The receiver skipped these messages: it will never deliver them.
    Skipped {
        /// What it gave up on.
        ranges: NackRanges<'a>,
    },
    /// The sender's tail.
    State {
        /// One past the newest message sent.
        next: u64,
        /// The oldest message it still holds.
        oldest: u64,
    },
}

/// The ranges of a `NACK`, each `(first, count)`, checked at parse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NackRanges<'a>(&'a [u8]);

impl<'a> NackRanges<'a> {
    /// Each range as `(first, count)`.
    pub fn iter(&self) -> impl Iterator<Item = (u64, u64)> + 'a {
        self.0.chunks_exact(RANGE_LEN).map(|r| (u64_at(r, 0), u32_at(r, 8) as u64))
    }
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("eight bytes"))
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("four bytes"))
}

/// Parse one frame of the class (a DATAGRAM payload on `PORT_NACKED`).
pub fn parse(b: &[u8]) -> Result<NackedFrame<'_>, NackedError> {
    match *b.first().ok_or(NackedError::Empty)? {
        KIND_MSG => {
            let head = b.get(..MSG_HEADER).ok_or(NackedError::Truncated)?;
            let (seq, oldest) = (u64_at(head, 1), u64_at(head, 9));
            if oldest > seq {
                return Err(NackedError::OldestAhead);
            }
            // No sender gets there, and a receiver's next would overflow.
            if seq == u64::MAX {
                return Err(NackedError::RangeOverflow);
            }
            Ok(NackedFrame::Msg { seq, oldest, message: &b[MSG_HEADER..] })
        }
        kind @ (KIND_NACK | KIND_SKIPPED) => {
            let n = *b.get(1).ok_or(NackedError::Truncated)? as usize;
            if n == 0 || n > MAX_NACK_RANGES {
                return Err(NackedError::BadRangeCount(n));
            }
            let body = b.get(2..2 + n * RANGE_LEN).ok_or(NackedError::Truncated)?;
            let ranges = NackRanges(body);
            if ranges.iter().any(|(first, count)| first.checked_add(count).is_none()) {
                return Err(NackedError::RangeOverflow);
            }
            Ok(if kind == KIND_NACK { NackedFrame::Nack { ranges } } else { NackedFrame::Skipped { ranges } })
        }
        KIND_STATE => {
            let b = b.get(..STATE_LEN).ok_or(NackedError::Truncated)?;
            let (next, oldest) = (u64_at(b, 1), u64_at(b, 9));
            if oldest > next {
                return Err(NackedError::OldestAhead);
            }
            Ok(NackedFrame::State { next, oldest })
        }
        k => Err(NackedError::UnknownKind(k)),
    }
}

/// A `MSG` frame for `message`.
pub fn encode_msg(seq: u64, oldest: u64, message: &[u8], pool: &MessagePool) -> Bytes {
    let mut buf = pool.take(MSG_HEADER + message.len());
    buf.extend_from_slice(&[KIND_MSG]);
    buf.extend_from_slice(&seq.to_le_bytes());
    buf.extend_from_slice(&oldest.to_le_bytes());
    buf.extend_from_slice(message);
    pool.seal(buf)
}

/// A `STATE` frame.
pub fn encode_state(next: u64, oldest: u64, pool: &MessagePool) -> Bytes {
    let mut buf = pool.take(STATE_LEN);
    buf.extend_from_slice(&[KIND_STATE]);
    buf.extend_from_slice(&next.to_le_bytes());
    buf.extend_from_slice(&oldest.to_le_bytes());
    pool.seal(buf)
}

/// A `NACK` frame asking for `ranges` (1 to [`MAX_NACK_RANGES`] of them).
pub fn encode_nack(ranges: &[(u64, u32)], pool: &MessagePool) -> Bytes {
    encode_ranges(KIND_NACK, ranges, pool)
}

/// A `SKIPPED` frame giving up on `ranges`.
pub fn encode_skipped(ranges: &[(u64, u32)], pool: &MessagePool) -> Bytes {
    encode_ranges(KIND_SKIPPED, ranges, pool)
}

fn encode_ranges(kind: u8, ranges: &[(u64, u32)], pool: &MessagePool) -> Bytes {
    debug_assert!((1..=MAX_NACK_RANGES).contains(&ranges.len()));
    let mut buf = pool.take(2 + ranges.len() * RANGE_LEN);
    buf.extend_from_slice(&[kind, ranges.len() as u8]);
    for &(first, count) in ranges {
        buf.extend_from_slice(&first.to_le_bytes());
        buf.extend_from_slice(&count.to_le_bytes());
    }
    pool.seal(buf)
}

/// What a sender needs from around it: the endpoint's pool, configuration,
/// counters and events, and the peer's queue of datagrams to go.
pub(crate) struct Around<'a> {
    pub pool: &'a MessagePool,
    pub config: &'a Config,
    pub stats: &'a mut Stats,
    pub events: &'a mut VecDeque<Event>,
    pub outbox: &'a mut Outbox,
    /// The peer's retransmission timeout: how long an answer may take.
    pub rto: Duration,
}

/// A message held for the receiver to ask for.
#[derive(Debug)]
struct Held {
    /// Its `MSG` frame, as sent (sent again as is: its `oldest` may be
    /// stale, which only makes the receiver skip less).
    frame: Bytes,
    sent_at: Instant,
    asked: bool,
    resent_at: Option<Instant>,
}

/// One peer's sending side.
#[derive(Debug, Default)]
pub(crate) struct NackedSender {
    /// The next message's number.
    next: u64,
    /// Messages `[next - held.len(), next)`, oldest first.
    held: VecDeque<Held>,
    held_bytes: usize,
    /// The peer restarted when `next` was this: nothing older is offered
    /// to its new life.
    floor: u64,
    state_due: Option<Instant>,
    state_every: Duration,
    /// Fates reported as runs: (first, end, fate) of the run being built.
    run: Option<(u64, u64, NackedFate)>,
}

impl NackedSender {
    /// A sender resumed from a snapshot: it holds nothing, and numbers
    /// from `next` on.
    pub fn resumed(next: u64) -> Self {
        NackedSender { next, ..Self::default() }
    }

    /// The next message's number.
    pub fn next(&self) -> u64 {
        self.next
    }

    fn held_from(&self) -> u64 {
        self.next - self.held.len() as u64
    }

    /// The oldest message a receiver may still ask for.
    fn oldest(&self) -> u64 {
        self.held_from().max(self.floor)
    }

    /// Hold and send `message`; its number, or `None` if the hold is full.
    pub fn send(&mut self, message: &[u8], now: Instant, a: &mut Around<'_>) -> Option<u64> {
        let len = MSG_HEADER + message.len();
        if self.held.len() >= a.config.unreliable_queue_messages
            || self.held_bytes + len > a.config.unreliable_queue_bytes
        {
            return None;
        }
        let seq = self.next;
        let frame = encode_msg(seq, self.oldest().min(seq), message, a.pool);
        self.next += 1;
        self.held_bytes += len;
        // Refused by a full outbox, it is still held: the next STATE tells
        // the receiver it exists, and it asks.
        a.outbox.offer(PORT_NACKED, frame.clone(), a.config, a.stats);
        self.held.push_back(Held { frame, sent_at: now, asked: false, resent_at: None });
        a.stats.nacked_sent += 1;
        if self.state_due.is_none() {
            self.state_every = a.rto;
            self.state_due = Some(now + a.rto);
        }
        Some(seq)
    }

    /// The earliest of its deadlines: a `STATE` due, a message leaving the hold.
    pub fn deadline(&self, config: &Config) -> Option<Instant> {
        let release = self.held.front().map(|h| h.sent_at + config.nacked_hold);
        match (self.state_due, release) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Release what has been held long enough, and send a `STATE` if due.
    pub fn on_timer(&mut self, peer: NodeId, now: Instant, a: &mut Around<'_>) {
        while let Some(h) = self.held.front() {
            if h.sent_at + a.config.nacked_hold > now {
                break;
            }
            let seq = self.held_from();
            let fate = if h.asked { NackedFate::Repaired } else { NackedFate::NeverAskedFor };
            let h = self.held.pop_front().expect("a held message");
            self.held_bytes -= h.frame.len();
            self.report(peer, seq, seq + 1, fate, a.events);
        }
        self.flush(peer, a.events);
        if self.state_due.is_some_and(|due| due <= now) {
            if self.held.is_empty() {
                self.state_due = None;
            } else {
                a.outbox.offer(
                    PORT_NACKED,
                    encode_state(self.next, self.oldest(), a.pool),
                    a.config,
                    a.stats,
                );
                self.state_every = (self.state_every * 2).min(a.config.nacked_hold);
                self.state_due = Some(now + self.state_every);
            }
        }
    }

    /// The receiver asks for `ranges`: what is held goes again (at most
    /// once in half a timeout each), and a receiver that asks for
    /// anything no longer held is told where the hold begins (a `STATE`),
    /// so it skips it (and says so: `on_skipped`).
    pub fn on_nack(&mut self, ranges: NackRanges<'_>, now: Instant, a: &mut Around<'_>) {
        let (from, oldest) = (self.held_from(), self.oldest());
        let mut tell = false;
        for (first, count) in ranges.iter() {
            // Never sent: not the receiver's to ask for.
            let end = (first + count).min(self.next);
            if first >= end {
                continue;
            }
            tell |= first < oldest;
            for seq in first.max(oldest)..end {
                let h = &mut self.held[(seq - from) as usize];
                h.asked = true;
                if h.resent_at.is_some_and(|t| now < t + a.rto / 2) {
                    continue;
                }
                h.resent_at = Some(now);
                a.outbox.offer(PORT_NACKED, h.frame.clone(), a.config, a.stats);
                a.stats.nacked_repaired += 1;
            }
        }
        if tell {
            // Answers a NACK, so at most one per NACK, and a receiver asks
            // at most once a timeout.
            a.outbox.offer(PORT_NACKED, encode_state(self.next, oldest, a.pool), a.config, a.stats);
        }
    }

    /// The receiver skipped `ranges`: they are lost (reported again if a
    /// copy of the frame comes again: a report is idempotent).
    pub fn on_skipped(&mut self, peer: NodeId, ranges: NackRanges<'_>, a: &mut Around<'_>) {
        for (first, count) in ranges.iter() {
            // Never sent, or offered to an earlier life of the peer (if it
            // restarted): not this life's to report.
            let (first, end) = (first.max(self.floor), (first + count).min(self.next));
            if first < end {
                a.stats.nacked_lost_sent += end - first;
                self.report(peer, first, end, NackedFate::Lost, a.events);
            }
        }
        self.flush(peer, a.events);
    }

    /// The peer restarted: its new life is offered nothing sent before.
    pub fn on_peer_restart(&mut self) {
        self.floor = self.next;
        if !self.held.is_empty() {
            // Due at once: the new life learns where to start.
            self.state_due = Some(Instant::ZERO);
        }
    }

    /// Add `[first, end)` with `fate` to the run being built, reporting the
    /// run before it if it differs.
    fn report(&mut self, peer: NodeId, first: u64, end: u64, fate: NackedFate, events: &mut VecDeque<Event>) {
        match &mut self.run {
            Some((_, e, f)) if *e == first && *f == fate => *e = end,
            _ => {
                self.flush(peer, events);
                self.run = Some((first, end, fate));
            }
        }
    }

    fn flush(&mut self, peer: NodeId, events: &mut VecDeque<Event>) {
        if let Some((first, end, fate)) = self.run.take() {
            events.push_back(Event::Nacked { peer, first, end, fate });
        }
    }
}

/// Messages delivered in order and not yet taken by the application.
pub(crate) type Inbox = Bounded<Nacked>;

/// One peer's receiving side.
#[derive(Debug, Default)]
pub(crate) struct NackedReceiver {
    /// Heard from this life of the sender at all.
    known: bool,
    /// The next message to deliver.
    expected: u64,
    /// One past the newest message known to exist.
    newest: u64,
    /// Arrived ahead of `expected`, or waiting for room in the inbox.
    buffer: BTreeMap<u64, Bytes>,
    buffer_bytes: usize,
    nack_due: Option<Instant>,
}

/// What a receiver needs from around it.
pub(crate) struct Inward<'a> {
    pub pool: &'a MessagePool,
    pub config: &'a Config,
    pub stats: &'a mut Stats,
    pub inbox: &'a mut Inbox,
    pub outbox: &'a mut Outbox,
    pub rto: Duration,
}

impl NackedReceiver {
    /// A receiver resumed from a snapshot, expecting `expected` next.
    pub fn resumed(expected: Option<u64>) -> Self {
        match expected {
            Some(e) => NackedReceiver { known: true, expected: e, newest: e, ..Self::default() },
            None => Self::default(),
        }
    }

    /// The next message it expects (`None`: not heard from).
    pub fn expected(&self) -> Option<u64> {
        self.known.then_some(self.expected)
    }

    /// Message `seq` arrived (`oldest` the sender's oldest held).
    pub fn on_msg(
        &mut self,
        from: NodeId,
        seq: u64,
        oldest: u64,
        message: &[u8],
        now: Instant,
        i: &mut Inward<'_>,
    ) {
        self.learn(from, oldest, i);
        let window = i.config.unreliable_queue_messages as u64;
        if seq < self.expected || self.buffer.contains_key(&seq) {
            i.stats.nacked_duplicates += 1;
        } else if seq - self.expected >= window
            || self.buffer.len() >= i.config.unreliable_queue_messages
            || self.buffer_bytes + message.len() > i.config.unreliable_queue_bytes
        {
            // No room: it is asked for again once there is.
            i.stats.nacked_dropped += 1;
            self.newest = self.newest.max(self.expected.saturating_add(window));
        } else {
            let mut buf = i.pool.take(message.len());
            buf.extend_from_slice(message);
            self.buffer.insert(seq, i.pool.seal(buf));
            self.buffer_bytes += message.len();
            self.newest = self.newest.max(seq.saturating_add(1));
        }
        self.settle(from, now, i);
    }

    /// The sender's tail: messages up to `next` exist, none below `oldest` is held.
    pub fn on_state(&mut self, from: NodeId, next: u64, oldest: u64, now: Instant, i: &mut Inward<'_>) {
        self.learn(from, oldest, i);
        let window = i.config.unreliable_queue_messages as u64;
        self.newest = self.newest.max(next.min(self.expected.saturating_add(window)));
        self.settle(from, now, i);
    }

    /// The sender restarted: what its earlier life sent is void.
    pub fn reset(&mut self) {
        *self = NackedReceiver::default();
    }

    pub fn deadline(&self) -> Option<Instant> {
        self.nack_due
    }

    /// The NACK timer: ask for what is still missing, and deliver what
    /// waited for room.
    pub fn on_timer(&mut self, from: NodeId, now: Instant, i: &mut Inward<'_>) {
        if self.nack_due.is_some_and(|due| due <= now) {
            self.nack_due = None;
            self.deliver(from, i);
            if self.ask(i) {
                self.nack_due = Some(now + i.rto);
            }
        }
    }

    /// Start where the sender's oldest is (first word from it), or skip
    /// to it: what is older and missing will never come. What is skipped
    /// is reported (`SKIPPED`, once): the sender then knows it lost them
    /// (`NackedFate::Lost`) instead of taking silence for receipt.
    fn learn(&mut self, from: NodeId, oldest: u64, i: &mut Inward<'_>) {
        if !self.known {
            self.known = true;
            (self.expected, self.newest) = (oldest, oldest);
            return;
        }
        if oldest <= self.expected {
            return;
        }
        self.newest = self.newest.max(oldest);
        let mut skipped = [(0u64, 0u32); MAX_NACK_RANGES];
        let mut n = 0;
        let mut skip = |first: u64, end: u64, stats: &mut Stats| {
            // Saturating: a forged `oldest` (no cluster key) may be anything.
            stats.nacked_lost = stats.nacked_lost.saturating_add(end - first);
            if n < MAX_NACK_RANGES && end > first {
                skipped[n] = (first, (end - first).min(u32::MAX as u64) as u32);
                n += 1;
            }
        };
        // Delivered if there is room, in order; the missing are skipped.
        while self.expected < oldest {
            match self.buffer.first_key_value() {
                Some((&seq, _)) if seq < oldest => {
                    skip(self.expected, seq, i.stats);
                    self.expected = seq;
                    if !self.deliver_one(from, i) {
                        // No room for it, and no waiting any more.
                        let (_, m) = self.buffer.pop_first().expect("a buffered message");
                        self.buffer_bytes -= m.len();
                        skip(seq, seq + 1, i.stats);
                        self.expected += 1;
                    }
                }
                _ => {
                    skip(self.expected, oldest, i.stats);
                    self.expected = oldest;
                }
            }
        }
        if n > 0 {
            i.outbox.offer(PORT_NACKED, encode_skipped(&skipped[..n], i.pool), i.config, i.stats);
        }
    }

    /// Deliver what is in order, and arm the NACK timer if anything is
    /// missing or waits for room.
    fn settle(&mut self, from: NodeId, now: Instant, i: &mut Inward<'_>) {
        self.deliver(from, i);
        let waiting = self.expected < self.newest;
        if waiting && self.nack_due.is_none() {
            // A quarter of a timeout: reordering on the way (two rails)
            // settles first, and a loss is asked for well within one.
            self.nack_due = Some(now + i.rto / 4);
        } else if !waiting {
            self.nack_due = None;
        }
    }

    fn deliver(&mut self, from: NodeId, i: &mut Inward<'_>) {
        while self.buffer.first_key_value().is_some_and(|(&seq, _)| seq == self.expected) {
            if !self.deliver_one(from, i) {
                return;
            }
        }
    }

    /// Move message `expected` from the buffer to the inbox, if it has room.
    fn deliver_one(&mut self, from: NodeId, i: &mut Inward<'_>) -> bool {
        let Some(len) = self.buffer.get(&self.expected).map(Bytes::len) else { return false };
        if !i.inbox.has_room(len, i.config) {
            return false;
        }
        let message = self.buffer.remove(&self.expected).expect("checked");
        self.buffer_bytes -= len;
        let pushed = i.inbox.push(Nacked { from, seq: self.expected, message }, len, i.config);
        debug_assert!(pushed, "room was checked");
        i.stats.nacked_received += 1;
        self.expected += 1;
        true
    }

    /// Send a NACK for what is missing in `[expected, newest)`; false if
    /// nothing is.
    fn ask(&mut self, i: &mut Inward<'_>) -> bool {
        let mut ranges = [(0u64, 0u32); MAX_NACK_RANGES];
        let mut n = 0;
        let mut seq = self.expected;
        let mut held = self.buffer.range(self.expected..).map(|(&s, _)| s).peekable();
        while seq < self.newest && n < MAX_NACK_RANGES {
            // The next message held at or after `seq` ends a gap.
            while held.next_if(|&s| s < seq).is_some() {}
            if held.next_if_eq(&seq).is_some() {
                seq += 1;
                continue;
            }
            let end = held.peek().copied().unwrap_or(self.newest).min(self.newest);
            let count = (end - seq).min(u32::MAX as u64);
            ranges[n] = (seq, count as u32);
            n += 1;
            seq += count;
        }
        // Messages waiting for room in the inbox are not missing.
        if n == 0 {
            return self.buffer.contains_key(&self.expected);
        }
        i.outbox.offer(PORT_NACKED, encode_nack(&ranges[..n], i.pool), i.config, i.stats);
        i.stats.nacks_sent += 1;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_parse_back_and_bad_ones_are_refused() {
        let pool = MessagePool::new();
        let m = encode_msg(7, 3, b"hello", &pool);
        assert_eq!(parse(&m), Ok(NackedFrame::Msg { seq: 7, oldest: 3, message: b"hello" }));
        let s = encode_state(9, 4, &pool);
        assert_eq!(parse(&s), Ok(NackedFrame::State { next: 9, oldest: 4 }));
        let n = encode_nack(&[(1, 2), (10, 1)], &pool);
        let NackedFrame::Nack { ranges } = parse(&n).unwrap() else { panic!("a NACK") };
        assert_eq!(ranges.iter().collect::<Vec<_>>(), vec![(1, 2), (10, 1)]);
        assert_eq!(parse(&[]), Err(NackedError::Empty));
        assert_eq!(parse(&[9]), Err(NackedError::UnknownKind(9)));
        assert_eq!(parse(&m[..10]), Err(NackedError::Truncated));
        assert_eq!(parse(&encode_msg(3, 7, b"", &pool)), Err(NackedError::OldestAhead));
        assert_eq!(parse(&[KIND_NACK, 0]), Err(NackedError::BadRangeCount(0)));
        assert_eq!(parse(&n[..n.len() - 1]), Err(NackedError::Truncated));
        let over = encode_nack(&[(u64::MAX, 2)], &pool);
        assert_eq!(parse(&over), Err(NackedError::RangeOverflow));
    }
}
