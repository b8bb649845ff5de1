//! The receiving half of a stream: in-order delivery and reassembly.
//!
//! A segment is acknowledged only once it has been consumed into the
//! application's delivery queue (or into the message being reassembled for
//! it): the commit point of seeds/000 section 4, so a crash between receipt
//! and delivery can never lose an acknowledged message. Segments that arrive
//! ahead of a hole wait in a bounded out-of-order buffer and are reported in
//! SACK ranges; in go-back-N mode nothing is kept out of order.

use std::collections::{BTreeMap, VecDeque};

use core::time::Duration;

use bytes::{Bytes, BytesMut};
use tether_wire::{AckRepr, DataFlags, DataFrame, SackRange};

use crate::landing::Landed;
use crate::{Config, Delivery, Instant, NodeId, RetransmitMode, Stats};

/// Messages delivered to the application and not yet read, with a byte
/// limit: when it is full, new data is not consumed and so not acknowledged.
#[derive(Debug, Default)]
pub(crate) struct DeliveryQueue {
    queue: VecDeque<Delivery>,
    bytes: usize,
    limit: usize,
}

impl DeliveryQueue {
    pub fn new(limit: usize) -> Self {
        DeliveryQueue { queue: VecDeque::new(), bytes: 0, limit }
    }
    pub fn has_room(&self) -> bool {
        // One message may overshoot the limit, so the largest allowed message always fits.
        self.bytes < self.limit
    }
    fn push(&mut self, d: Delivery, stats: &mut Stats) {
        self.bytes += d.message.len();
        stats.messages_delivered += 1;
        self.queue.push_back(d);
    }
    pub fn pop(&mut self) -> Option<Delivery> {
        let d = self.queue.pop_front()?;
        self.bytes -= d.message.len();
        Some(d)
    }
    pub fn len(&self) -> usize {
        self.queue.len()
    }
}

/// Copy `data` into a shared arena chunk: one allocation per chunk, not per message.
pub(crate) fn copy_to_bytes(arena: &mut BytesMut, data: &[u8]) -> Bytes {
    const CHUNK: usize = 64 * 1024;
    if arena.capacity() - arena.len() < data.len() {
        arena.reserve(data.len().max(CHUNK));
    }
    arena.extend_from_slice(data);
    arena.split().freeze()
}

#[derive(Debug)]
struct Stashed {
    flags: DataFlags,
    total_len: Option<u32>,
    data: Bytes,
}

#[derive(Debug)]
enum Partial {
    Assembling {
        buf: BytesMut,
        total: usize,
    },
    /// The message broke a rule (too large, inconsistent lengths): its
    /// remaining fragments are consumed and dropped, so the stream goes on.
    Discarding,
}

#[derive(Debug, Default)]
struct AckState {
    pending: bool,
    due: Option<Instant>,
}

#[derive(Debug)]
pub(crate) struct RecvStream {
    /// The peer's stream epoch we are receiving; `None` before the first data.
    epoch: Option<u32>,
    expected: u64,
    out_of_order: BTreeMap<u64, Stashed>,
    partial: Option<Partial>,
    ack: AckState,
    ack_delay: Duration,
}

/// How an arriving data frame related to the stream, for ACK urgency.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Arrival {
    InOrder,
    /// Ahead of a hole, a duplicate, or refused: the sender should hear at once.
    Irregular,
}

impl RecvStream {
    pub fn new(config: &Config) -> Self {
        RecvStream {
            epoch: None,
            expected: 0,
            out_of_order: BTreeMap::new(),
            partial: None,
            ack: AckState::default(),
            ack_delay: config.ack_delay,
        }
    }

    /// A new epoch (or a new incarnation of the peer) starts a fresh
    /// sequence space; partial and out-of-order data of the old one is void.
    pub fn reset(&mut self, epoch: Option<u32>) {
        self.epoch = epoch;
        self.expected = 0;
        self.out_of_order.clear();
        self.partial = None;
    }

    /// Where data of `epoch` stands: true if it is current (after adopting a
    /// newer epoch), false if it is from an older epoch and must be dropped.
    pub fn admit_epoch(&mut self, epoch: u32) -> bool {
        match self.epoch {
            Some(current) if epoch < current => false,
            Some(current) if epoch == current => true,
            _ => {
                self.reset(Some(epoch));
                true
            }
        }
    }

    /// Would a DATA frame with `seq` be kept (consumed or stashed)? A hint
    /// for landing its payload during verification; `on_data` decides.
    pub fn wants(&self, seq: u64, recv_window: u64) -> bool {
        seq >= self.expected && seq < self.expected + recv_window && !self.out_of_order.contains_key(&seq)
    }

    /// The reassembly buffer `frame` would continue in order, with room for
    /// its payload: where the payload can land during verification.
    pub fn continuation(&mut self, frame: &DataFrame<'_>) -> Option<&mut BytesMut> {
        if frame.seq != self.expected || frame.flags.first() {
            return None;
        }
        match &mut self.partial {
            Some(Partial::Assembling { buf, total })
                if buf.len() + frame.payload.len() <= *total
                    && buf.capacity() - buf.len() >= frame.payload.len() =>
            {
                Some(buf)
            }
            _ => None,
        }
    }

    #[allow(clippy::too_many_arguments)]
    #[allow(clippy::too_many_arguments)]
    pub fn on_data(
        &mut self,
        now: Instant,
        from: NodeId,
        frame: &DataFrame<'_>,
        landed: Landed,
        config: &Config,
        dq: &mut DeliveryQueue,
        arena: &mut BytesMut,
        stats: &mut Stats,
    ) -> Arrival {
        let seq = frame.seq;
        if seq < self.expected || self.out_of_order.contains_key(&seq) {
            stats.duplicates_discarded += 1;
            self.request_ack(now, true);
            return Arrival::Irregular;
        }
        if seq >= self.expected + config.recv_window as u64 {
            stats.out_of_window += 1;
            self.request_ack(now, true);
            return Arrival::Irregular;
        }
        let full = !dq.has_room();
        if seq > self.expected || full {
            if full {
                // The commit point: nothing is consumed, so nothing new is
                // acknowledged, until the application reads. The segment
                // waits here (unacknowledged) so that reading alone, with
                // no retransmission, lets the stream continue: see `drain`.
                stats.out_of_window += 1;
            }
            if config.retransmit == RetransmitMode::GoBackN && seq > self.expected {
                stats.out_of_window += 1;
            } else {
                let data = landed.into_bytes(frame.payload, arena, stats);
                let stashed = Stashed { flags: frame.flags, total_len: frame.total_len, data };
                self.out_of_order.insert(seq, stashed);
            }
            self.request_ack(now, true);
            return Arrival::Irregular;
        }
        self.consume(from, frame.flags, frame.total_len, frame.payload, landed, config, dq, arena, stats);
        self.drain(from, config, dq, arena, stats);
        self.request_ack(now, !self.out_of_order.is_empty());
        Arrival::InOrder
    }

    /// Consume stashed segments that are now in order, while the delivery
    /// queue has room. Called after an in-order arrival and after the
    /// application reads: a stashed segment may already be selectively
    /// acknowledged, and then its sender will never send it again.
    pub fn drain(
        &mut self,
        from: NodeId,
        config: &Config,
        dq: &mut DeliveryQueue,
        arena: &mut BytesMut,
        stats: &mut Stats,
    ) -> bool {
        let mut progressed = false;
        while dq.has_room() {
            let Some(s) = self.out_of_order.remove(&self.expected) else { break };
            self.consume(
                from,
                s.flags,
                s.total_len,
                &s.data,
                Landed::Arena(s.data.clone()),
                config,
                dq,
                arena,
                stats,
            );
            progressed = true;
        }
        progressed
    }

    /// An ACK is owed at once, whatever the time: for callers without a clock.
    pub fn request_ack_now(&mut self) {
        self.ack.pending = true;
        self.ack.due = Some(Instant::ZERO);
    }

    /// Take the in-order segment `self.expected` into reassembly or delivery.
    #[allow(clippy::too_many_arguments)]
    fn consume(
        &mut self,
        from: NodeId,
        flags: DataFlags,
        total_len: Option<u32>,
        payload: &[u8],
        landed: Landed,
        config: &Config,
        dq: &mut DeliveryQueue,
        arena: &mut BytesMut,
        stats: &mut Stats,
    ) {
        self.expected += 1;
        if flags.first() {
            if self.partial.take().is_some() {
                // A new message began before the previous one ended.
                stats.protocol_violations += 1;
            }
            if flags.last() {
                let message = landed.into_bytes(payload, arena, stats);
                dq.push(Delivery { from, message }, stats);
                return;
            }
            let total = total_len.map_or(0, |t| t as usize);
            if total > config.max_message_len {
                stats.protocol_violations += 1;
                self.partial = Some(Partial::Discarding);
                return;
            }
            let mut buf = BytesMut::with_capacity(total);
            stats.bytes_copied_after_verify += payload.len() as u64;
            buf.extend_from_slice(payload);
            self.partial = Some(Partial::Assembling { buf, total });
            return;
        }
        match self.partial.take() {
            None => stats.protocol_violations += 1,
            Some(Partial::Discarding) => {
                if !flags.last() {
                    self.partial = Some(Partial::Discarding);
                }
            }
            Some(Partial::Assembling { mut buf, total }) => {
                if buf.len() + payload.len() > total || (flags.last() && buf.len() + payload.len() != total) {
                    stats.protocol_violations += 1;
                    if !flags.last() {
                        self.partial = Some(Partial::Discarding);
                    }
                    return;
                }
                match landed {
                    Landed::Partial { end_addr }
                        if buf.as_ptr() as usize + buf.len() + payload.len() == end_addr =>
                    {
                        // SAFETY: verification landed exactly these bytes in
                        // this buffer's spare capacity: it ends where the
                        // landing began (checked above), and nothing has
                        // written to it since (the landing was planned for
                        // the datagram's first frame, this one).
                        unsafe { buf.set_len(buf.len() + payload.len()) };
                        debug_assert_eq!(&buf[buf.len() - payload.len()..], payload);
                    }
                    _ => {
                        stats.bytes_copied_after_verify += payload.len() as u64;
                        buf.extend_from_slice(payload);
                    }
                }
                if flags.last() {
                    dq.push(Delivery { from, message: buf.freeze() }, stats);
                } else {
                    self.partial = Some(Partial::Assembling { buf, total });
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

    pub fn deadline(&self) -> Option<Instant> {
        self.ack.due.filter(|_| self.ack.pending)
    }

    /// The ACK to send now: cumulative plus SACK ranges of what waits out of
    /// order (as many as fit; the lowest holes matter most).
    pub fn take_ack(&mut self) -> AckRepr {
        self.ack = AckState::default();
        let mut ack = AckRepr::new(self.epoch.unwrap_or(0), self.expected);
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
        // Offsets fit in u32: the receive window is at most 2^20 segments.
        let range = SackRange { start: (start - self.expected) as u32, end: (end - self.expected) as u32 };
        ack.push_range(range)
    }
}
