//! The sending half of a stream: the sender-based message log.
//!
//! Every segment stays in this queue, in sequence order, until the
//! cumulative ACK passes it; retransmissions are sent from here, so no
//! extra copy is ever made for reliability (seeds/001 section 4.1,
//! seeds/003 section 4). The window limits segments in flight (the papers'
//! send-queue size); `bytes_buffered` limits what the application may queue.
//!
//! Loss is detected two ways: a SACK showing that a segment sent *later*
//! arrived while an earlier one is still missing (fast retransmit, with a
//! small reordering allowance), and the retransmission timeout, one per
//! stream (seeds/001: one timer, not one per packet).

use std::collections::VecDeque;

use bytes::Bytes;
use tether_wire::{DataFlags, DataFrame, PacketWriter, SackRange};

use crate::event::{FailReason, FailedMessages, MessageState};
use crate::paths::RailId;
use crate::rtt::RttEstimator;
use crate::{Config, Instant, NodeId, RetransmitMode, Stats};

/// A hole is declared lost once a segment this many sequence numbers above
/// it, sent after it, has been selectively acknowledged.
const REORDER_ALLOWANCE: u64 = 3;
/// Failure records kept for `message_state` queries.
const FAILURE_HISTORY: usize = 256;

#[derive(Debug)]
struct Segment {
    seq: u64,
    msg: u64,
    flags: DataFlags,
    total_len: u32,
    data: Bytes,
    last_tx: Instant,
    /// Position in this stream's transmission order: "sent after" for loss
    /// detection must not depend on two sends sharing a timestamp.
    tx_order: u64,
    tx_count: u32,
    sacked: bool,
    lost: bool,
    /// The rail of the latest transmission: a path going down re-sends
    /// exactly what it was carrying.
    rail: RailId,
    /// Every rail it went over (a bit per rail). An ACK proves a rail
    /// delivers only if the segment never went over another: else the copy
    /// that arrived may be an older one (Karn's ambiguity, per rail).
    rails_sent: u8,
}

impl Segment {
    /// The rail this segment's arrival proves delivers: its only one.
    fn evidence(&self) -> u8 {
        if self.rails_sent.is_power_of_two() {
            self.rails_sent
        } else {
            0
        }
    }
}

#[derive(Debug)]
pub(crate) struct SendStream {
    pub epoch: u32,
    segments: VecDeque<Segment>,
    /// Sequence number of `segments[0]`; equals `next_seq` when empty.
    base_seq: u64,
    next_seq: u64,
    /// Every segment below this was transmitted at least once.
    sent_upto: u64,
    lost_count: usize,
    bytes_buffered: usize,
    /// Wire bytes of the segments never sent yet, for the coalescing rule.
    unsent_wire_bytes: usize,
    next_msg: u64,
    /// Messages below this are settled: acknowledged or failed.
    settled_below: u64,
    next_tx_order: u64,
    next_ack_request: u64,
    rto_deadline: Option<Instant>,
    /// Last time the peer showed it is alive on this stream, for abandonment.
    last_heard: Instant,
    pub rtt: RttEstimator,
    failures: VecDeque<(FailedMessages, FailReason)>,
    /// Messages below this lost their failure record to the bounded history.
    forgotten_below: u64,
}

/// What an ACK did.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct AckOutcome {
    pub progressed: bool,
    pub messages_acked: u64,
    /// Rails (bit per rail) this ACK proves deliver: of the segments it
    /// newly covers, those that never went over another rail.
    pub rails: u8,
    /// Rails of the latest transmission of the segments it newly covers:
    /// where the data is flowing now (for timing a failover).
    pub latest_rails: u8,
}

#[derive(Debug, PartialEq, Eq)]
pub(crate) struct AckBeyondSent;

impl SendStream {
    pub fn new(config: &Config, epoch: u32) -> Self {
        SendStream {
            epoch,
            segments: VecDeque::new(),
            base_seq: 0,
            next_seq: 0,
            sent_upto: 0,
            lost_count: 0,
            bytes_buffered: 0,
            unsent_wire_bytes: 0,
            next_msg: 0,
            settled_below: 0,
            next_tx_order: 0,
            next_ack_request: 0,
            rto_deadline: None,
            last_heard: Instant::ZERO,
            rtt: RttEstimator::new(config.rto_initial, config.rto_min, config.rto_max),
            failures: VecDeque::new(),
            forgotten_below: 0,
        }
    }

    pub fn bytes_buffered(&self) -> usize {
        self.bytes_buffered
    }

    pub fn has_unacked(&self) -> bool {
        !self.segments.is_empty()
    }

    fn in_flight(&self) -> u64 {
        self.sent_upto - self.base_seq
    }

    /// Something to put on the wire now: a lost segment, or new data the
    /// window admits and the coalescing rule lets go.
    pub fn has_work(&self, now: Instant, config: &Config) -> bool {
        self.lost_count > 0 || self.new_data_due(config).is_some_and(|due| due <= now)
    }

    /// When unsent data may go: at once if nothing is in flight (no one to
    /// wait for) or a full datagram's worth is waiting, else after the
    /// coalescing delay, so a burst of small messages shares datagrams but
    /// no message waits longer than `coalesce_delay`. `None`: nothing to send
    /// or the window is closed.
    fn new_data_due(&self, config: &Config) -> Option<Instant> {
        if self.sent_upto == self.next_seq || self.in_flight() >= config.send_window as u64 {
            return None;
        }
        let oldest = &self.segments[(self.sent_upto - self.base_seq) as usize];
        // Only whole small messages wait: a fragment of a larger message
        // gains nothing from company, and holding the short tail of a
        // message whose other fragments just left would only delay it.
        let small_message = oldest.flags.first() && oldest.flags.last();
        if !small_message || self.in_flight() == 0 || self.unsent_wire_bytes >= config.max_fragment() {
            return Some(Instant::ZERO);
        }
        Some(oldest.last_tx + config.coalesce_delay)
    }

    /// Queue one message, cut into fragments of at most `max_fragment` bytes.
    /// The caller checked the size limits. Returns the message number.
    pub fn push_message(&mut self, now: Instant, data: Bytes, max_fragment: usize) -> u64 {
        if self.segments.is_empty() {
            // The patience clock starts when there is something to deliver.
            self.last_heard = now;
        }
        let msg = self.next_msg;
        self.next_msg += 1;
        let total = data.len();
        self.bytes_buffered += total;
        let mut offset = 0;
        loop {
            let end = (offset + max_fragment).min(total);
            let flags = DataFlags::new(offset == 0, end == total);
            self.unsent_wire_bytes += DataFrame::encoded_len(end - offset, flags);
            self.segments.push_back(Segment {
                seq: self.next_seq,
                msg,
                flags,
                total_len: total as u32,
                data: data.slice(offset..end),
                last_tx: now,
                tx_order: 0,
                tx_count: 0,
                sacked: false,
                lost: false,
                rail: 0,
                rails_sent: 0,
            });
            self.next_seq += 1;
            offset = end;
            if offset == total {
                return msg;
            }
        }
    }

    /// Write lost segments, then new ones the window admits, until the
    /// datagram is full. Returns the number of data frames written.
    pub fn fill(
        &mut self,
        w: &mut PacketWriter<'_>,
        now: Instant,
        rail: RailId,
        config: &Config,
        stats: &mut Stats,
    ) -> usize {
        let mut written = 0;
        if self.lost_count > 0 {
            for i in 0..self.segments.len() {
                if self.lost_count == 0 {
                    break;
                }
                if !self.segments[i].lost {
                    continue;
                }
                if !self.write_segment(w, i, now, rail, stats) {
                    return written;
                }
                self.segments[i].lost = false;
                self.lost_count -= 1;
                written += 1;
            }
        }
        while self.sent_upto < self.next_seq && self.in_flight() < config.send_window as u64 {
            let i = (self.sent_upto - self.base_seq) as usize;
            if !self.write_segment(w, i, now, rail, stats) {
                break;
            }
            let s = &self.segments[i];
            self.unsent_wire_bytes -= DataFrame::encoded_len(s.data.len(), s.flags);
            self.sent_upto += 1;
            written += 1;
        }
        if written > 0 {
            let threshold = config.send_window as u64 * config.ack_request_at as u64 / 256;
            if self.in_flight() >= threshold.max(1) && self.sent_upto >= self.next_ack_request {
                // Ask for an immediate ACK, but at most once per quarter
                // window, so a full pipe does not turn every packet into a request.
                w.set_ack_request(true);
                stats.ack_requests += 1;
                self.next_ack_request = self.sent_upto + (config.send_window as u64 / 4).max(1);
            }
        }
        written
    }

    fn write_segment(
        &mut self,
        w: &mut PacketWriter<'_>,
        i: usize,
        now: Instant,
        rail: RailId,
        stats: &mut Stats,
    ) -> bool {
        let s = &mut self.segments[i];
        if DataFrame::encoded_len(s.data.len(), s.flags) > w.remaining() {
            return false;
        }
        if w.push_data(s.seq, s.flags, s.total_len, &s.data).is_err() {
            return false;
        }
        if s.tx_count > 0 {
            stats.retransmits += 1;
        }
        s.tx_count += 1;
        s.last_tx = now;
        s.rail = rail;
        s.rails_sent |= 1 << rail;
        s.tx_order = self.next_tx_order;
        self.next_tx_order += 1;
        stats.data_frames_sent += 1;
        if self.rto_deadline.is_none() {
            self.rto_deadline = Some(now + self.rtt.rto());
        }
        true
    }

    /// Apply an ACK of this stream's current epoch.
    pub fn on_ack(
        &mut self,
        now: Instant,
        cumulative: u64,
        ranges: impl Iterator<Item = SackRange>,
        mode: RetransmitMode,
    ) -> Result<AckOutcome, AckBeyondSent> {
        if cumulative > self.sent_upto {
            return Err(AckBeyondSent);
        }
        self.last_heard = now;
        let mut outcome = AckOutcome::default();
        let mut sample = None;
        while self.segments.front().is_some_and(|s| s.seq < cumulative) {
            let s = self.segments.pop_front().expect("front checked above");
            if s.lost {
                self.lost_count -= 1;
            }
            if s.flags.last() {
                self.bytes_buffered -= s.total_len as usize;
                self.settled_below = s.msg + 1;
                outcome.messages_acked += 1;
            }
            // Karn: only a segment sent exactly once gives an unambiguous sample.
            sample = if s.tx_count == 1 { Some(now - s.last_tx) } else { None };
            if !s.sacked {
                outcome.rails |= s.evidence();
                outcome.latest_rails |= 1 << s.rail;
            }
            outcome.progressed = true;
        }
        if outcome.progressed {
            self.base_seq = cumulative;
            if let Some(rtt) = sample {
                self.rtt.on_sample(rtt);
            }
            self.rtt.on_progress();
            self.rto_deadline = (self.in_flight() > 0).then(|| now + self.rtt.rto());
        }
        if mode == RetransmitMode::Selective {
            let (proved, latest) = self.apply_sack(cumulative, ranges);
            outcome.rails |= proved;
            outcome.latest_rails |= latest;
        }
        Ok(outcome)
    }

    /// Mark what the SACK ranges cover; returns the rails (bit per rail)
    /// the newly covered segments prove, and those they last went over.
    fn apply_sack(&mut self, cumulative: u64, ranges: impl Iterator<Item = SackRange>) -> (u8, u8) {
        let (mut rails, mut latest) = (0u8, 0u8);
        let mut newest_sacked: Option<(u64, u64)> = None; // (seq, tx_order)
        for r in ranges {
            let lo = (cumulative + r.start as u64).max(self.base_seq);
            let hi = (cumulative + r.end as u64).min(self.sent_upto);
            for seq in lo..hi {
                let s = &mut self.segments[(seq - self.base_seq) as usize];
                if !s.sacked {
                    s.sacked = true;
                    rails |= s.evidence();
                    latest |= 1 << s.rail;
                    if s.lost {
                        s.lost = false;
                        self.lost_count -= 1;
                    }
                }
                if newest_sacked.is_none_or(|(_, order)| s.tx_order > order) {
                    newest_sacked = Some((seq, s.tx_order));
                }
            }
        }
        let Some((top_seq, top_order)) = newest_sacked else { return (rails, latest) };
        for s in self.segments.iter_mut() {
            if s.seq + REORDER_ALLOWANCE > top_seq {
                break;
            }
            if !s.sacked && !s.lost && s.tx_count > 0 && s.tx_order < top_order {
                s.lost = true;
                self.lost_count += 1;
            }
        }
        (rails, latest)
    }

    pub fn deadline(&self, config: &Config) -> Option<Instant> {
        let abandon = self.has_unacked().then(|| self.last_heard + config.abandon_after);
        [self.rto_deadline, abandon, self.new_data_due(config)].into_iter().flatten().min()
    }

    pub fn should_abandon(&self, now: Instant, config: &Config) -> bool {
        self.has_unacked() && now >= self.last_heard + config.abandon_after
    }

    /// The retransmission timer expired: back off and resend everything in
    /// flight that the receiver has not shown it holds.
    pub fn on_timer(&mut self, now: Instant, mode: RetransmitMode, stats: &mut Stats) {
        let Some(deadline) = self.rto_deadline else { return };
        if now < deadline {
            return;
        }
        stats.timeouts += 1;
        self.rtt.on_timeout();
        let in_flight = self.in_flight() as usize;
        for s in self.segments.iter_mut().take(in_flight) {
            if mode == RetransmitMode::GoBackN {
                s.sacked = false;
            }
            if !s.sacked && !s.lost {
                s.lost = true;
                self.lost_count += 1;
            }
        }
        self.rto_deadline = (in_flight > 0).then(|| now + self.rtt.rto());
    }

    /// Something sent over `rail` is still unacknowledged.
    pub fn in_flight_on(&self, rail: RailId) -> bool {
        self.segments.iter().take(self.in_flight() as usize).any(|s| s.rail == rail && !s.sacked)
    }

    /// The path over `rail` went down: everything last sent over it that
    /// the receiver has not shown it holds goes again at once, in order,
    /// over whatever rail carries data next (the receiver drops any
    /// duplicate by sequence number). Returns how many segments.
    pub fn fail_over(&mut self, now: Instant, rail: RailId) -> usize {
        let in_flight = self.in_flight() as usize;
        let mut moved = 0;
        for s in self.segments.iter_mut().take(in_flight) {
            if s.rail == rail && !s.sacked && !s.lost {
                s.lost = true;
                moved += 1;
            }
        }
        self.lost_count += moved;
        if moved > 0 {
            // A fresh timeout for the new path, not the backed-off one of the dead.
            self.rtt.on_progress();
            self.rto_deadline = Some(now + self.rtt.rto());
        }
        moved
    }

    /// Give up on everything unacknowledged and start a fresh epoch, so the
    /// receiver discards any partial message of the old one. Returns the
    /// failed messages (empty range if there were none).
    pub fn abandon(&mut self, peer: NodeId, reason: FailReason) -> FailedMessages {
        let in_doubt_end = match self.segments.get((self.sent_upto - self.base_seq) as usize) {
            Some(first_unsent) => first_unsent.msg,
            None => self.next_msg,
        };
        let failed = FailedMessages { peer, first: self.settled_below, end: self.next_msg, in_doubt_end };
        self.segments.clear();
        self.base_seq = 0;
        self.next_seq = 0;
        self.sent_upto = 0;
        self.lost_count = 0;
        self.bytes_buffered = 0;
        self.unsent_wire_bytes = 0;
        self.next_ack_request = 0;
        self.settled_below = self.next_msg;
        self.rto_deadline = None;
        self.epoch = self.epoch.wrapping_add(1);
        if !failed.is_empty() {
            if self.failures.len() == FAILURE_HISTORY {
                let (old, _) = self.failures.pop_front().expect("history is full");
                self.forgotten_below = old.end;
            }
            self.failures.push_back((failed, reason));
        }
        failed
    }

    pub fn message_state(&self, msg: u64) -> MessageState {
        if msg >= self.next_msg {
            return MessageState::Unknown;
        }
        if msg >= self.settled_below {
            return MessageState::Pending;
        }
        if msg < self.forgotten_below {
            return MessageState::Unknown;
        }
        match self.failures.iter().rev().find(|(f, _)| f.contains(msg)) {
            Some((_, reason)) => MessageState::Failed(*reason),
            None => MessageState::Delivered,
        }
    }
}
