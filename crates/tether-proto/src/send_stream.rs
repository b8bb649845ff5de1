//! The sending half of a stream: the sender-based message log.
//!
//! Every segment stays in this queue, in sequence order, until the
//! cumulative ACK passes it; retransmissions are sent from here, so no
//! extra copy is ever made for reliability (Tang and Bilas [TB] section
//! 4.1, Trahay et al. [NMAD] section 3; docs/REFERENCES.md). The window
//! limits segments in flight (the papers' send-queue size);
//! `bytes_buffered` limits what the application may queue.
//!
//! Loss is detected by time (`loss`, RACK after RFC 8985): a segment is
//! lost once one sent *after* it was acknowledged, cumulatively or
//! selectively, and longer has passed than the reordering the stream has
//! seen explains. The retransmission timeout, one per stream ([TB]: one
//! timer, not one per packet), only probes: it sends datagrams with no
//! data that the receiver answers at once, and the answer lets RACK judge
//! the flight, or shows the timeout was spurious.
//!
//! The state is split in two types. [`SendLog`] and each segment's
//! [`LoggedSegment`] are *hard* state: what must survive an engine failure
//! (Zhou et al. [FTGM] section 4.2's host-side backup: the next sequence
//! number to assign, the cumulative ACK, the highest sequence ever put on
//! the wire, the epoch, every unacknowledged message). Everything else
//! (transmission times and counts, SACK marks, rails, the RTT estimate,
//! the timeout) is soft: [`SendStream::restore`] rebuilds it from the log,
//! treating everything that was in flight as lost.

use std::collections::VecDeque;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tether_wire::{Channel, DataFlags, DataFrame, PacketWriter, SackRange, MAX_SACK_RANGES};

use crate::aggregate::{Aggregate, Room};
use crate::congestion::{AckSignal, CongestionInfo, Controller, LossSignal, Pacer};
use crate::delivery::give_back;
use crate::event::{FailReason, FailedMessages, MessageState};
use crate::loss::{AckScan, Rack};
use crate::paths::RailId;
use crate::rtt::RttEstimator;
use crate::{Config, Instant, NodeId, RetransmitMode, Stats};

/// Payload bytes digested between two calls of a restore's `progress`.
const PROGRESS_BYTES: usize = 1 << 20;
/// Consecutive unanswered timeouts after which a timeout resends the
/// first unacknowledged segment besides its probes.
const DATA_PROBE_AFTER: u32 = 5;
/// Failure records kept for `message_state` queries.
const FAILURE_HISTORY: usize = 256;

/// One unacknowledged segment as the log keeps it: hard state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoggedSegment {
    /// Its sequence number in the stream.
    pub seq: u64,
    /// The number of the message it belongs to.
    pub msg: u64,
    /// Whether it is the first and/or the last fragment of its message.
    pub flags: DataFlags,
    /// The whole message's length.
    pub total_len: u32,
    /// The fragment's bytes.
    pub data: Bytes,
}

/// A probe sent and not yet answered.
#[derive(Debug, Clone, Copy)]
struct OutstandingProbe {
    sent: Instant,
    /// Its place in the transmission order.
    order: u64,
    /// Its number: an answer naming it or a later number answers it; one
    /// naming an earlier number answers a probe already answered (or
    /// given up on), delayed or duplicated on the way.
    number: u8,
}

impl OutstandingProbe {
    /// Whether probe `n` was sent no earlier than this one and no later
    /// than the latest, numbered `latest` (numbers wrap, skipping 0).
    fn answered_by(&self, n: u8, latest: u8) -> bool {
        n != 0 && n.wrapping_sub(self.number) <= latest.wrapping_sub(self.number)
    }
}

/// How one segment has fared on the wire: soft state.
#[derive(Debug, Clone, Copy)]
struct TxState {
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

impl TxState {
    fn unsent(now: Instant) -> Self {
        TxState { last_tx: now, tx_order: 0, tx_count: 0, sacked: false, lost: false, rail: 0, rails_sent: 0 }
    }

    /// Its acknowledgement may answer an earlier copy than the latest: it
    /// went more than once, or was in flight when the stream was restored
    /// (sent before, over rails nobody remembers).
    fn resent(&self) -> bool {
        self.tx_count > 1 || self.rails_sent == u8::MAX
    }

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
struct Segment {
    log: LoggedSegment,
    tx: TxState,
    /// With `Config::verify_payloads`, the CRC32C of `log.data` taken when
    /// the segment was queued: the bytes are checked against it before
    /// every transmission and by `audit`, so a payload the engine's own
    /// memory corrupted is never sent with a fresh, valid datagram
    /// checksum (Zhou et al. [FTGM] section 4.2: the card's state checked
    /// before it is used).
    digest: Option<u32>,
}

impl Segment {
    fn new(log: LoggedSegment, tx: TxState, verify: bool) -> Self {
        let digest = verify.then(|| crc32c::crc32c(&log.data));
        Segment { log, tx, digest }
    }

    fn intact(&self) -> bool {
        self.digest.is_none_or(|d| crc32c::crc32c(&self.log.data) == d)
    }
}

/// The one way a message is cut into segments: fragments of `max_fragment`
/// bytes from its start, the last one shorter (an empty message is one
/// empty segment), with its first and last flags where `bounds` has them
/// (`data` may be a message's rest, not its start). The live stream
/// (`SendStream::push_cut`) and an engine's successor (`Endpoint::resume`,
/// from the message and the agreed size alone) must arrive at the same
/// sequence numbers, so both cut here.
pub(crate) fn cut(
    data: &Bytes,
    bounds: DataFlags,
    max_fragment: usize,
) -> impl Iterator<Item = (DataFlags, Bytes)> + '_ {
    let total = data.len();
    (0..total.div_ceil(max_fragment).max(1)).map(move |i| {
        let (start, end) = (i * max_fragment, ((i + 1) * max_fragment).min(total));
        let flags = DataFlags::new(bounds.first() && i == 0, bounds.last() && end == total)
            .with_channel(bounds.channel());
        (flags, data.slice(start..end))
    })
}

/// What the log's bookkeeping costs per segment, besides the payload:
/// counted against `Config::send_buffer_bytes`, so 8-byte and empty
/// messages are bounded in memory as surely as large ones.
pub const SEGMENT_COST: usize = core::mem::size_of::<Segment>();

/// The hard state of a send stream: with its segments, everything a new
/// engine needs to go on without losing or repeating a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendLog {
    /// The stream's epoch: bumped on every abandonment, so the receiver
    /// discards any partial message of the old one.
    pub epoch: u32,
    /// The cumulative ACK: every segment below it was acknowledged.
    pub acked_upto: u64,
    /// Every segment below this was put on the wire at least once (recorded
    /// before the datagram leaves): the line between "in doubt" and
    /// "certainly not delivered" if the peer is abandoned.
    pub sent_upto: u64,
    /// The next sequence number to assign.
    pub next_seq: u64,
    /// The next message number to assign.
    pub next_msg: u64,
    /// Messages below this are settled: acknowledged or failed.
    pub settled_below: u64,
    /// The first sequence number of message `settled_below`: with the
    /// fragment size, where every unsettled message lies in the stream
    /// (an engine's backup needs no more to cut them again, docs/ENGINE.md).
    pub settled_seq: u64,
    /// Failed runs of messages, newest last, for `message_state` queries.
    pub failures: VecDeque<(FailedMessages, FailReason)>,
    /// Messages below this lost their failure record to the bounded history.
    pub forgotten_below: u64,
}

impl SendLog {
    fn new(epoch: u32) -> Self {
        SendLog {
            epoch,
            acked_upto: 0,
            sent_upto: 0,
            next_seq: 0,
            next_msg: 0,
            settled_below: 0,
            settled_seq: 0,
            failures: VecDeque::new(),
            forgotten_below: 0,
        }
    }
}

/// A send stream's hard state, exported: the log and its segments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendSnapshot {
    /// Sequence numbers, counters and the failure history.
    pub log: SendLog,
    /// Every unacknowledged segment, in sequence order from `log.acked_upto`.
    pub segments: Vec<LoggedSegment>,
}

#[derive(Debug)]
pub(crate) struct SendStream {
    /// Hard state (with each segment's `log`).
    log: SendLog,
    /// Unacknowledged segments from `log.acked_upto` to `log.next_seq`.
    segments: VecDeque<Segment>,
    // Soft state from here on: derived from the log, or rebuilt.
    lost_count: usize,
    /// Segments marked selectively acknowledged: when none are, an ACK
    /// needs no look for reneging.
    sacked_count: usize,
    /// Bytes of the messages not yet acknowledged (derived from the log).
    bytes_buffered: usize,
    /// Wire bytes of the segments never sent yet, for the coalescing rule.
    unsent_wire_bytes: usize,
    next_tx_order: u64,
    next_ack_request: u64,
    rto_deadline: Option<Instant>,
    /// Timeouts in a row with no acknowledgement of anything new since.
    unanswered_timeouts: u32,
    /// Probes a timeout asked for, not yet sent (`take_probe`).
    probes_owed: u8,
    /// The earliest probe not yet answered. An ACK that answers it, or a
    /// later one, covers everything the receiver took in before it.
    probe: Option<OutstandingProbe>,
    /// The number of the latest timeout's probes (`Header::probe`; 0: none
    /// yet): both probes of one timeout carry the same.
    probe_number: u8,
    /// Time-based loss detection's state (`loss`).
    rack: Rack,
    /// When RACK judges the next segment it is waiting on (`loss`): a
    /// segment sent before one delivered, not yet late enough to be lost.
    reorder_deadline: Option<Instant>,
    /// The latest ACK said `FULL`: the receiver holds the segment at the
    /// cumulative point and waits for its application. Its silence about
    /// that one is not loss (judged lost, it was resent to a receiver that
    /// had it again and again: the simulator's tight mix, with a delivery
    /// queue of one message, received four times the duplicates).
    peer_full: bool,
    /// Last time the peer showed it is alive on this stream, for abandonment.
    last_heard: Instant,
    /// How long silence lasts before the peer is given up, when longer
    /// than `Config::abandon_after`: the endpoint's (`Endpoint::patience`).
    pub patience: Duration,
    /// Corrupted state was found (`integrity_faults`): nothing more is
    /// sent from this stream; an engine stops and its successor restores
    /// the stream from the application's copy.
    halted: bool,
    /// `Config::verify_payloads`.
    verify: bool,
    /// `Config::send_window`: segments in flight at most.
    send_window: u64,
    /// `Config::send_window_bytes`: payload bytes in flight at most.
    window_bytes: usize,
    /// Payload bytes of the segments in flight (derived from the log).
    in_flight_bytes: usize,
    /// Payload bytes in flight that are neither selectively acknowledged
    /// nor judged lost: what the congestion window bounds (RFC 6675's pipe).
    pipe: u64,
    /// The pipe as last reported to the endpoint's window (`aggregate`).
    reported_pipe: u64,
    /// The congestion window's keeper (`congestion`, `Config::congestion`).
    cc: Box<dyn Controller>,
    /// Spreads what the window allows over the round trip.
    pacer: Pacer,
    pub rtt: RttEstimator,
    /// The largest fragment messages are cut into now: the agreed
    /// datagram size's (`push_message`, `recut_unsent`), `Config`'s before.
    fragment: usize,
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
    /// Segments it took off the log.
    pub popped: u64,
    /// Payload bytes it newly showed delivered, and the round trip it
    /// measured, for the endpoint's window (`aggregate`).
    pub delivered: u64,
    pub rtt: Option<Duration>,
}

/// An ACK's fixed fields, as `SendStream::on_ack` takes them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AckNews {
    /// Everything below it was delivered.
    pub cumulative: u64,
    /// The receiver holds the segment at `cumulative` but its queue is full.
    pub full: bool,
    /// It answers a probe, numbered so (`AckRepr::answer`).
    pub answer: Option<u8>,
}

#[derive(Debug, PartialEq, Eq)]
pub(crate) enum AckRefused {
    /// It acknowledges data never sent.
    BeyondSent,
    /// The stream's own marks disagree (its memory was corrupted): acting
    /// on the ACK could settle messages that never arrived.
    Inconsistent,
}

impl SendStream {
    pub fn new(config: &Config, epoch: u32) -> Self {
        SendStream {
            log: SendLog::new(epoch),
            segments: VecDeque::new(),
            lost_count: 0,
            sacked_count: 0,
            bytes_buffered: 0,
            unsent_wire_bytes: 0,
            next_tx_order: 0,
            next_ack_request: 0,
            rto_deadline: None,
            unanswered_timeouts: 0,
            probes_owed: 0,
            probe: None,
            probe_number: 0,
            rack: Rack::default(),
            reorder_deadline: None,
            peer_full: false,
            last_heard: Instant::ZERO,
            patience: Duration::ZERO,
            halted: false,
            verify: config.verify_payloads,
            send_window: config.send_window as u64,
            window_bytes: config.send_window_bytes,
            in_flight_bytes: 0,
            pipe: 0,
            reported_pipe: 0,
            cc: config.congestion.build(config.max_fragment() as u64),
            pacer: Pacer::new(config.max_fragment() as u64),
            rtt: RttEstimator::new(config.rto_initial, config.rto_min, config.rto_max),
            fragment: config.max_fragment(),
        }
    }

    /// Messages on `channel` in the log (neither acknowledged nor failed),
    /// counted one by one: for reports, not the data path. Every fragment
    /// names its message's channel, and a message's fragments are in a
    /// row, so a message is counted once even when its first fragment is
    /// acknowledged and gone.
    pub fn unsettled_on(&self, channel: Channel) -> u64 {
        let mut last = None;
        let mut n = 0;
        for s in self.segments.iter().filter(|s| s.log.flags.channel() == channel) {
            if s.log.msg >= self.log.settled_below && last != Some(s.log.msg) {
                n += 1;
            }
            last = Some(s.log.msg);
        }
        n
    }

    /// Export the hard state.
    pub fn snapshot(&self) -> SendSnapshot {
        SendSnapshot {
            log: self.log.clone(),
            segments: self.segments.iter().map(|s| s.log.clone()).collect(),
        }
    }

    /// Rebuild a stream from its hard state at `now`. Nothing is known of
    /// what the wire did with the segments that were in flight, so all of
    /// them count as lost and go again at once (the receiver drops any
    /// duplicate by sequence number); the RTT estimate starts afresh and
    /// the patience clock for abandonment restarts.
    ///
    /// With `Config::verify_payloads` every payload is read once for its
    /// digest (`send_buffer_bytes`, megabytes, may wait per peer): `progress` is called back every
    /// `PROGRESS_BYTES` of them, so an engine can show its watchdog that
    /// it is working, not hung.
    pub fn restore(
        config: &Config,
        snapshot: SendSnapshot,
        now: Instant,
        progress: &mut dyn FnMut(),
    ) -> Self {
        let SendSnapshot { log, segments } = snapshot;
        let mut s = SendStream::new(config, log.epoch);
        let in_flight_end = log.sent_upto;
        let mut hashed = 0;
        for logged in segments {
            if s.verify {
                hashed += logged.data.len();
                if hashed >= PROGRESS_BYTES {
                    hashed = 0;
                    progress();
                }
            }
            let mut tx = TxState::unsent(now);
            if logged.seq < in_flight_end {
                s.in_flight_bytes += logged.data.len();
                // Sent before, over rails nobody remembers: a resend, and
                // its ACK proves no rail delivers (it may answer a copy
                // sent before the restore).
                tx.tx_count = 1;
                tx.rails_sent = u8::MAX;
                tx.lost = true;
                s.lost_count += 1;
            } else {
                s.unsent_wire_bytes += DataFrame::encoded_len(logged.data.len(), logged.flags);
            }
            if logged.flags.last() {
                s.bytes_buffered += logged.total_len as usize;
            }
            s.segments.push_back(Segment::new(logged, tx, s.verify));
        }
        s.log = log;
        s.last_heard = now;
        if s.in_flight() > 0 {
            s.rto_deadline = Some(now + s.rtt.rto());
        }
        s
    }

    pub fn epoch(&self) -> u32 {
        self.log.epoch
    }

    pub fn bytes_buffered(&self) -> usize {
        self.bytes_buffered
    }

    /// Memory charged to this send buffer: the unacknowledged messages'
    /// bytes plus `SEGMENT_COST` per segment.
    pub fn memory(&self) -> usize {
        self.bytes_buffered + self.segments.len() * SEGMENT_COST
    }

    pub fn has_unacked(&self) -> bool {
        !self.segments.is_empty()
    }

    /// The log's marks agree with each other and with the segments held
    /// (a handful of comparisons): checked before they are acted on, so a
    /// mark corrupted in memory stops the stream rather than sending or
    /// settling by it.
    fn consistent(&self) -> bool {
        let log = &self.log;
        log.acked_upto <= log.sent_upto
            && log.sent_upto <= log.next_seq
            && self.segments.len() as u64 == log.next_seq - log.acked_upto
            && self.segments.front().is_none_or(|s| s.log.seq == log.acked_upto)
            && self.segments.back().is_none_or(|s| s.log.seq + 1 == log.next_seq)
    }

    fn in_flight(&self) -> u64 {
        // Wrapping, not checked: marks flipped in memory (the fault hook's
        // tests, `consistent`) may put the ACK point past the send point,
        // and a huge count then admits nothing until the audit stops the
        // stream; a saturated zero would admit sending by corrupt marks.
        self.log.sent_upto.wrapping_sub(self.log.acked_upto)
    }

    /// The windows admit the next unsent segment: fewer than
    /// `send_window` segments in flight and its bytes within
    /// `send_window_bytes` (or nothing in flight at all), within the
    /// congestion window, and within the endpoint's window over all its
    /// streams, `room` (`aggregate`), unless the stream competes on loss
    /// (`Controller::competing`).
    fn window_admits(&self, room: Room) -> bool {
        let Some(next) = self.segments.get(self.in_flight() as usize) else { return false };
        let len = next.log.data.len() as u64;
        self.own_window_admits(next)
            && (self.cc.competing() || room.admits(self.pipe, self.reported_pipe, len))
    }

    /// `window_admits` but for the endpoint's window.
    fn own_window_admits(&self, next: &Segment) -> bool {
        self.flow_admits(next)
            && (self.pipe == 0 || self.pipe + next.log.data.len() as u64 <= self.cc.window())
    }

    /// Tell the endpoint's window how this stream's pipe changed since it
    /// last did, and whether it holds back data this stream's own windows
    /// would send. Called after every operation on the stream.
    pub fn report_to(&mut self, aggregate: &mut Aggregate) {
        aggregate.report(self.reported_pipe, self.pipe);
        self.reported_pipe = self.pipe;
        if self.held_by(aggregate.room()) {
            aggregate.held();
        }
    }

    /// Data waits that this stream's own windows would send and the
    /// endpoint's, `room`, does not admit.
    pub fn held_by(&self, room: Room) -> bool {
        let next = self.segments.get(self.in_flight() as usize);
        !self.halted
            && !self.cc.competing()
            && next.is_some_and(|n| {
                self.own_window_admits(n)
                    && !room.admits(self.pipe, self.reported_pipe, n.log.data.len() as u64)
            })
    }

    /// The flow-control half of `window_admits`: the limits counted from
    /// the cumulative point, which one hole holds shut however much beyond
    /// it arrived (the congestion window counts only what is in the pipe).
    fn flow_admits(&self, next: &Segment) -> bool {
        self.in_flight() < self.send_window
            && (self.in_flight() == 0 || self.in_flight_bytes + next.log.data.len() <= self.window_bytes)
    }

    /// The pacing rate, bytes per second (`None`: unpaced).
    fn pacing_rate(&self) -> Option<u64> {
        Pacer::rate(self.cc.window(), self.cc.pacing_gain(), self.rtt.smoothed_ns())
    }

    /// When the pacer lets the next datagram of data go.
    fn paced_until(&self) -> Instant {
        self.pacer.ready_at(self.pacing_rate())
    }

    /// The congestion window's state, for `Endpoint::congestion`.
    pub fn congestion(&self) -> CongestionInfo {
        CongestionInfo {
            window: self.cc.window(),
            in_flight: self.pipe,
            state: self.cc.state(),
            pacing_rate: self.pacing_rate(),
        }
    }

    /// Something to put on the wire now: a lost segment, or new data the
    /// window admits and the coalescing rule lets go.
    pub fn has_work(&self, now: Instant, config: &Config, room: Room) -> bool {
        self.send_due(config, room).is_some_and(|due| due <= now)
    }

    /// When data may go next: a lost segment at once, new data when
    /// `new_data_due` says; either no sooner than the pacer allows.
    pub fn send_due(&self, config: &Config, room: Room) -> Option<Instant> {
        let due = if !self.halted && self.lost_count > 0 {
            Some(Instant::ZERO)
        } else {
            self.new_data_due(config, room)
        };
        due.map(|d| d.max(self.paced_until()))
    }

    /// When unsent data may go: at once if nothing is in flight (no one to
    /// wait for) or a full datagram's worth is waiting, else after the
    /// coalescing delay, so a burst of small messages shares datagrams but
    /// no message waits longer than `coalesce_delay`. `None`: nothing to send
    /// or the window is closed.
    pub fn new_data_due(&self, config: &Config, room: Room) -> Option<Instant> {
        let idle = || self.log.sent_upto == self.log.next_seq || !self.window_admits(room);
        if self.halted {
            return None;
        }
        if !self.consistent() {
            // Corrupted marks: at once, so `fill` finds out and halts.
            return Some(Instant::ZERO);
        }
        if idle() {
            return None;
        }
        let oldest = &self.segments[(self.log.sent_upto - self.log.acked_upto) as usize];
        // Only whole small messages wait: a fragment of a larger message
        // gains nothing from company, and holding the short tail of a
        // message whose other fragments just left would only delay it.
        let small_message = oldest.log.flags.first() && oldest.log.flags.last();
        // A datagram's worth waiting: the datagram the peer agreed to.
        if !small_message || self.in_flight() == 0 || self.unsent_wire_bytes >= self.fragment {
            return Some(Instant::ZERO);
        }
        Some(oldest.tx.last_tx + config.coalesce_delay)
    }

    /// A message of `len` bytes would only join unsent data that waits
    /// (for the window to open, or for company: `new_data_due`'s
    /// coalescing) and change nothing else: the oldest unsent segment, and
    /// with it when data is due, stays the same, and with an open window
    /// less than a datagram's worth waits after it. No timer moves, so the
    /// caller may queue it with `push_waiting` alone.
    pub fn joins_waiting(&self, len: usize, room: Room) -> bool {
        if self.halted || self.lost_count > 0 || len > self.fragment {
            return false;
        }
        let Some(oldest) = self.segments.get(self.in_flight() as usize) else { return false };
        if !self.window_admits(room) {
            // Nothing goes before an ACK opens the window, whatever joins.
            return true;
        }
        let wire = DataFrame::encoded_len(len, DataFlags::new(true, true));
        oldest.log.flags.first()
            && oldest.log.flags.last()
            && self.in_flight() > 0
            && self.unsent_wire_bytes + wire < self.fragment
    }

    /// Queue a message that `joins_waiting` said may: stamped as the newest
    /// of those it joins (its time matters only once it is the oldest
    /// unsent, and then only as an earlier deadline), so no clock is read.
    pub fn push_waiting(&mut self, data: Bytes) -> u64 {
        let stamp = self.segments.back().map_or(Instant::ZERO, |s| s.tx.last_tx);
        let fragment = self.fragment;
        self.push_message(stamp, data, fragment, Channel::APP)
    }

    /// Queue one message, cut into fragments of at most `max_fragment` bytes,
    /// each naming `channel`. The caller checked the size limits. Returns
    /// the message number.
    pub fn push_message(&mut self, now: Instant, data: Bytes, max_fragment: usize, channel: Channel) -> u64 {
        if self.segments.is_empty() {
            // The patience clock starts when there is something to deliver.
            self.last_heard = now;
        }
        let msg = self.log.next_msg;
        self.log.next_msg += 1;
        self.fragment = max_fragment;
        self.bytes_buffered += data.len();
        let total_len = data.len() as u32;
        let bounds = DataFlags::new(true, true).with_channel(channel);
        self.push_cut(msg, data, total_len, bounds, TxState::unsent(now), max_fragment);
        msg
    }

    /// Queue `data` (a message of `total_len` bytes, or its rest when
    /// `bounds.first()` is not set) as the segments [`cut`] makes.
    fn push_cut(
        &mut self,
        msg: u64,
        data: Bytes,
        total_len: u32,
        bounds: DataFlags,
        tx: TxState,
        max_fragment: usize,
    ) {
        for (flags, piece) in cut(&data, bounds, max_fragment) {
            self.unsent_wire_bytes += DataFrame::encoded_len(piece.len(), flags);
            let log = LoggedSegment { seq: self.log.next_seq, msg, flags, total_len, data: piece };
            self.segments.push_back(Segment::new(log, tx, self.verify));
            self.log.next_seq += 1;
        }
    }

    /// The peer was heard from (a handshake completed), or is asked for
    /// the first time (its handshake's turn came, `Peer::admitted`): the
    /// patience clock for abandonment starts again.
    pub fn on_heard(&mut self, now: Instant) {
        self.last_heard = now;
    }

    /// Whether the datagram size may change now: nothing is in flight and
    /// the next segment to send begins a message, so every unsettled
    /// message can be cut again, whole, at the new size.
    pub fn can_resize(&self) -> bool {
        self.log.sent_upto == self.log.acked_upto && self.segments.front().is_none_or(|s| s.log.flags.first())
    }

    /// Cut the messages never sent again into fragments of `max_fragment`
    /// bytes: the datagram size agreed in a handshake may differ from the
    /// one they were cut for. Sequence numbers from the first unsent one on
    /// are assigned anew; message numbers do not change. The new cut is
    /// the uniform one (`push_cut`), never the old pieces split further:
    /// an engine's successor cuts each unsettled message again, whole, at
    /// the size its backup records (`Endpoint::resume`), and must arrive at
    /// the same sequence numbers the receiver holds fragments under. A
    /// message in several pieces is copied into one buffer to be cut; that
    /// happens only to messages queued before a session or at a size change.
    pub fn recut_unsent(&mut self, max_fragment: usize) {
        self.fragment = max_fragment;
        let first_unsent = (self.log.sent_upto - self.log.acked_upto) as usize;
        let uniform = |s: &Segment| {
            let len = s.log.data.len();
            len == max_fragment || (s.log.flags.last() && len <= max_fragment)
        };
        if self.segments.range(first_unsent..).all(uniform) {
            return;
        }
        let unsent: Vec<Segment> = self.segments.drain(first_unsent..).collect();
        self.log.next_seq = self.log.sent_upto;
        self.unsent_wire_bytes = 0;
        let mut rest = &unsent[..];
        while let Some(head) = rest.first() {
            // One message's pieces (the first run may be a message's rest,
            // when the size changes in the middle of one).
            let n = 1 + rest[1..].iter().take_while(|s| !s.log.flags.first()).count();
            let (pieces, tail) = rest.split_at(n);
            rest = tail;
            let data = match pieces {
                [one] => one.log.data.clone(),
                _ => {
                    let mut whole = BytesMut::with_capacity(pieces.iter().map(|s| s.log.data.len()).sum());
                    pieces.iter().for_each(|s| whole.extend_from_slice(&s.log.data));
                    whole.freeze()
                }
            };
            let bounds = DataFlags::new(head.log.flags.first(), pieces[n - 1].log.flags.last())
                .with_channel(head.log.flags.channel());
            self.push_cut(head.log.msg, data, head.log.total_len, bounds, head.tx, max_fragment);
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
        room: Room,
    ) -> usize {
        let mut written = 0;
        if self.halted || self.paced_until() > now {
            return 0;
        }
        let mut bytes = 0u64;
        if !self.consistent() {
            stats.integrity_faults += 1;
            self.halted = true;
            return 0;
        }
        if self.lost_count > 0 {
            for i in 0..self.segments.len() {
                if self.lost_count == 0 {
                    break;
                }
                if !self.segments[i].tx.lost {
                    continue;
                }
                if !self.write_segment(w, i, now, rail, stats) {
                    return written;
                }
                self.segments[i].tx.lost = false;
                self.lost_count -= 1;
                let len = self.segments[i].log.data.len() as u64;
                self.pipe += len;
                bytes += len;
                written += 1;
            }
        }
        while self.log.sent_upto < self.log.next_seq && self.window_admits(room) {
            let i = (self.log.sent_upto - self.log.acked_upto) as usize;
            if !self.write_segment(w, i, now, rail, stats) {
                break;
            }
            let s = &self.segments[i].log;
            self.unsent_wire_bytes -= DataFrame::encoded_len(s.data.len(), s.flags);
            self.in_flight_bytes += s.data.len();
            self.pipe += s.data.len() as u64;
            bytes += s.data.len() as u64;
            self.log.sent_upto += 1;
            written += 1;
        }
        if written > 0 {
            let rate = self.pacing_rate();
            self.pacer.on_sent(now, bytes, rate, self.cc.window());
            let threshold = config.send_window as u64 * config.ack_request_at as u64 / 256;
            let filled = self.log.sent_upto < self.log.next_seq && !self.window_admits(room);
            if filled || (self.in_flight() >= threshold.max(1) && self.log.sent_upto >= self.next_ack_request)
            {
                // Ask for an immediate ACK, but at most once per quarter
                // window, so a full pipe does not turn every packet into a
                // request; and with the datagram that fills the window,
                // after which nothing goes until an ACK comes.
                w.set_ack_request(true);
                stats.ack_requests += 1;
                self.next_ack_request = self.log.sent_upto + (config.send_window as u64 / 4).max(1);
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
        let expected_seq = self.log.acked_upto + i as u64;
        if !self.segments[i].intact() || self.segments[i].log.seq != expected_seq {
            // Corrupted in this engine's memory (the bytes or the sequence
            // number): never sent. The engine sees the counter, stops, and
            // its successor takes the message again from the application's
            // copy.
            stats.integrity_faults += 1;
            self.halted = true;
            return false;
        }
        let Segment { log: s, tx, .. } = &mut self.segments[i];
        if DataFrame::encoded_len(s.data.len(), s.flags) > w.remaining() {
            return false;
        }
        if w.push_data(s.seq, s.flags, s.total_len, &s.data).is_err() {
            return false;
        }
        if tx.tx_count > 0 {
            stats.retransmits += 1;
        }
        tx.tx_count += 1;
        tx.last_tx = now;
        tx.rail = rail;
        tx.rails_sent |= 1 << rail;
        tx.tx_order = self.next_tx_order;
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
        ack: AckNews,
        ranges: impl Iterator<Item = SackRange>,
        mode: RetransmitMode,
        stats: &mut Stats,
    ) -> Result<AckOutcome, AckRefused> {
        let AckNews { cumulative, full, answer } = ack;
        if !self.consistent() {
            return Err(AckRefused::Inconsistent);
        }
        if cumulative > self.log.sent_upto {
            return Err(AckRefused::BeyondSent);
        }
        self.last_heard = now;
        self.peer_full = full;
        // Only a sender the window held back learns from an ACK that a
        // larger window works.
        let window_limited =
            self.log.sent_upto < self.log.next_seq || self.pipe.saturating_mul(2) >= self.cc.window();
        let mut delivered = 0u64;
        let mut outcome = AckOutcome::default();
        let mut scan = self.rack.scan();
        // An answer to an earlier probe than those outstanding (late, or
        // duplicated on the way) says nothing of what went since: taken
        // for the answer to a newer probe, it made what was sent in between
        // look lost (in a 128-node demo 651 of 835 answers so taken had
        // left the receiver before the probe they were taken for was sent).
        let latest = self.probe_number;
        let answered = self.probe.filter(|p| answer.is_some_and(|n| p.answered_by(n, latest)));
        if let Some(p) = answered {
            // The probe arrived and the receiver answered after taking in
            // all that came before it: as good as a segment sent then. A
            // second probe still owed would only ask again.
            scan.probe_answered(now, p.sent, p.order);
            self.probe = None;
            self.probes_owed = 0;
        }
        while self.segments.front().is_some_and(|s| s.log.seq < cumulative) {
            if self.segments.front().is_some_and(|s| s.log.seq != self.log.acked_upto + outcome.popped) {
                // A sequence number out of line: settling by it could
                // settle a message that never arrived. Stop here.
                return Err(AckRefused::Inconsistent);
            }
            outcome.popped += 1;
            let Segment { log: s, tx, .. } = self.segments.pop_front().expect("front checked above");
            self.in_flight_bytes -= s.data.len();
            if !tx.lost && !tx.sacked {
                self.pipe -= s.data.len() as u64;
            }
            if !tx.sacked {
                delivered += s.data.len() as u64;
            }
            if tx.lost {
                self.lost_count -= 1;
            }
            if tx.sacked {
                self.sacked_count -= 1;
            }
            if s.flags.last() {
                self.bytes_buffered -= s.total_len as usize;
                self.log.settled_below = s.msg + 1;
                self.log.settled_seq = s.seq + 1;
                outcome.messages_acked += 1;
            }
            if !tx.sacked {
                // A selectively acknowledged one was delivered, and taken
                // in, by an earlier ACK.
                scan.delivered(now, tx.last_tx, tx.tx_order, tx.resent(), &self.rack);
                outcome.rails |= tx.evidence();
                outcome.latest_rails |= 1 << tx.rail;
            }
            outcome.progressed = true;
        }
        if outcome.progressed {
            give_back(&mut self.segments);
            self.log.acked_upto = cumulative;
            self.rtt.on_progress();
            self.rto_deadline = (self.in_flight() > 0).then(|| now + self.rtt.rto());
        } else if full && self.in_flight() > 0 {
            // Not loss: the receiver holds our data and waits for its
            // application to read. Its ACK once there is room may be lost,
            // so keep asking, but at the base timeout: a backed-off one
            // would stall a stream whose reader merely paused (until
            // `abandon_after` gave it up).
            self.rtt.on_progress();
            self.rto_deadline = Some(now + self.rtt.rto());
        }
        if mode == RetransmitMode::Selective {
            let fresh = outcome.progressed || answered.is_some();
            let (proved, latest, sacked) = self.apply_sack(now, cumulative, ranges, fresh, &mut scan);
            delivered += sacked;
            outcome.rails |= proved;
            outcome.latest_rails |= latest;
        }
        if let Some(rtt) = scan.sample() {
            // The latest-sent segment newly covered, if it went only once
            // (Karn: a resend's acknowledgement is ambiguous), cumulatively
            // or selectively: under reordering most first news is a SACK.
            self.rtt.on_sample(rtt);
            if self.in_flight() > 0 && outcome.progressed {
                self.rto_deadline = Some(now + self.rtt.rto());
            }
        }
        (outcome.delivered, outcome.rtt) = (delivered, scan.sample());
        if delivered > 0 || scan.sample().is_some() {
            self.cc.on_ack(&AckSignal {
                now,
                delivered,
                rtt: scan.sample(),
                srtt_ns: self.rtt.smoothed_ns(),
                window_limited,
            });
        }
        if outcome.progressed || scan.any_original() {
            self.unanswered_timeouts = 0;
        }
        self.rack.finish(scan, now, self.rtt.smoothed_ns(), self.rtt.rto().as_nanos() as u64);
        if mode == RetransmitMode::Selective {
            self.detect_losses(now);
        }
        if let Some(OutstandingProbe { order, .. }) = answered {
            let in_flight = self.in_flight() as usize;
            if self.segments.iter().take(in_flight).all(|s| s.tx.sacked || s.tx.tx_order > order) {
                // The answer to the timeout's probe shows that everything
                // sent before it arrived: the receiver (or its ACKs) was
                // late, and the probe cost no retransmission.
                stats.spurious_timeouts += 1;
            }
        }
        Ok(outcome)
    }

    /// Mark what the SACK ranges cover, telling `scan` of each newly
    /// covered segment; returns the rails (bit per rail) those prove, and
    /// those they last went over. `fresh`: the ACK moved the cumulative
    /// point or answers a probe, so it is surely the newest the receiver
    /// sent and may show reneging; an older one, overtaken on the way, covers less and would
    /// only look like it (under the simulator's reordering mix that cost
    /// 15,000 needless resends in ten seeds).
    fn apply_sack(
        &mut self,
        now: Instant,
        cumulative: u64,
        ranges: impl Iterator<Item = SackRange>,
        fresh: bool,
        scan: &mut AckScan,
    ) -> (u8, u8, u64) {
        let (mut rails, mut latest, mut delivered) = (0u8, 0u8, 0u64);
        scan.ranges_follow();
        let base = self.log.acked_upto;
        let mut covered = [(0u64, 0u64); MAX_SACK_RANGES];
        let mut n = 0;
        for r in ranges {
            let lo = (cumulative + r.start as u64).max(base);
            let hi = (cumulative + r.end as u64).min(self.log.sent_upto);
            if n < covered.len() {
                covered[n] = (lo, hi);
                n += 1;
            }
            for seq in lo..hi {
                let Segment { log, tx, .. } = &mut self.segments[(seq - base) as usize];
                if !tx.sacked {
                    tx.sacked = true;
                    self.sacked_count += 1;
                    delivered += log.data.len() as u64;
                    if !tx.lost {
                        self.pipe -= log.data.len() as u64;
                    }
                    scan.delivered(now, tx.last_tx, tx.tx_order, tx.resent(), &self.rack);
                    rails |= tx.evidence();
                    latest |= 1 << tx.rail;
                    if tx.lost {
                        tx.lost = false;
                        self.lost_count -= 1;
                    }
                }
            }
        }
        if fresh {
            self.detect_reneging(cumulative, &covered[..n]);
        }
        (rails, latest, delivered)
    }

    /// RACK (`loss`): every segment sent before the latest one known
    /// delivered, longer ago than that one's round trip and the reordering
    /// window, is lost; the earliest of the others sets the reorder timer.
    fn detect_losses(&mut self, now: Instant) {
        self.reorder_deadline = None;
        let Some(newest) = self.rack.newest() else { return };
        let window = self.rack.window_ns(self.rtt.rto().as_nanos() as u64);
        let wait = Duration::from_nanos(newest.rtt_ns.saturating_add(window));
        let in_flight = self.in_flight() as usize;
        // While the window is shut with data waiting, every hole holds it
        // shut: waiting out the reordering window for each, one after the
        // other as each reaches the cumulative point, stalls the stream
        // (a tenth of the datagrams delayed by a millisecond on average
        // made a campaign cell 4.85 times as slow; judging only the first
        // hole quickly, 2.31 times; every hole, 1.63 times, at twice the
        // duplicates: 7,073 against 3,490). They are given a quarter of the
        // smallest round trip, no more: a stall costs more than a segment
        // sent twice.
        let blocked = self.segments.get(in_flight).is_some_and(|next| !self.flow_admits(next));
        let head_wait =
            Duration::from_nanos(newest.rtt_ns.saturating_add(window.min(self.rack.min_rtt() / 4)));
        let held = self.peer_full as usize;
        let (mut lost, mut latest_sent) = (0u64, Instant::ZERO);
        for s in self.segments.iter_mut().take(in_flight).skip(held) {
            let tx = &mut s.tx;
            if tx.lost || tx.sacked {
                continue;
            }
            if tx.tx_order >= newest.order {
                // Sent after the reference. Segments sent once went in
                // sequence order, so past the first of them every later
                // one was sent after it too.
                if !tx.resent() {
                    break;
                }
                continue;
            }
            let due = tx.last_tx + if blocked { head_wait } else { wait };
            if due <= now {
                tx.lost = true;
                self.lost_count += 1;
                lost += s.log.data.len() as u64;
                latest_sent = latest_sent.max(tx.last_tx);
            } else if self.reorder_deadline.is_none_or(|d| due < d) {
                self.reorder_deadline = Some(due);
            }
        }
        if lost > 0 {
            self.pipe -= lost;
            self.cc.on_loss(&LossSignal { now, lost, latest_sent });
        }
    }

    /// The reorder timer expired: judge again what RACK was waiting on.
    pub fn on_reorder_timer(&mut self, now: Instant, mode: RetransmitMode) {
        if mode == RetransmitMode::Selective && self.reorder_deadline.is_some_and(|d| d <= now) {
            self.detect_losses(now);
        }
    }

    /// When RACK judges the next segment it waits on.
    pub fn reorder_deadline(&self) -> Option<Instant> {
        self.reorder_deadline
    }

    /// A segment the receiver selectively acknowledged and no longer
    /// reports holding was reneged on: the receiver lost it (a restored
    /// engine keeps only what it delivered, docs/ENGINE.md). It is lost and
    /// goes again; else it would wait for a timeout per segment, as only
    /// the first unacknowledged one is resent regardless of SACKs. Below
    /// the last range reported, an uncovered segment is reneged; above it
    /// the ACK may have run out of room for ranges, so nothing is judged
    /// there, unless there are no ranges at all (the receiver holds
    /// nothing out of order). Judged only from an ACK that moved the
    /// cumulative point or answers a probe (`apply_sack`): at the latest,
    /// the next timeout's probe is answered with one.
    fn detect_reneging(&mut self, cumulative: u64, covered: &[(u64, u64)]) {
        if self.sacked_count == 0 {
            return;
        }
        let judged_below = covered.iter().map(|&(_, hi)| hi).max().unwrap_or(u64::MAX);
        let base = self.log.acked_upto;
        let start = cumulative.max(base);
        let end = judged_below.min(self.log.sent_upto);
        for seq in start..end {
            let tx = &mut self.segments[(seq - base) as usize].tx;
            if tx.sacked && !covered.iter().any(|&(lo, hi)| (lo..hi).contains(&seq)) {
                tx.sacked = false;
                tx.lost = true;
                self.sacked_count -= 1;
                self.lost_count += 1;
            }
        }
    }

    /// The retransmission timer's deadline.
    pub fn rto_deadline(&self) -> Option<Instant> {
        self.rto_deadline
    }

    /// When the peer will have been silent too long with data outstanding.
    pub fn abandon_deadline(&self, config: &Config) -> Option<Instant> {
        self.has_unacked().then(|| self.last_heard + config.abandon_after.max(self.patience))
    }

    pub fn should_abandon(&self, now: Instant, config: &Config) -> bool {
        self.abandon_deadline(config).is_some_and(|at| now >= at)
    }

    /// The retransmission timer expired: back off, and ask the receiver
    /// what it holds with probes that carry no data (selective repair,
    /// `take_probe`: the answer lets RACK judge the flight, and a receiver
    /// that was only late costs no retransmission), or resend everything in
    /// flight that the receiver has not shown it holds (go-back-N).
    pub fn on_timer(&mut self, now: Instant, mode: RetransmitMode, stats: &mut Stats) {
        let Some(deadline) = self.rto_deadline else { return };
        if now < deadline {
            return;
        }
        stats.timeouts += 1;
        self.unanswered_timeouts = self.unanswered_timeouts.saturating_add(1);
        self.rtt.on_timeout();
        let in_flight = self.in_flight() as usize;
        if mode == RetransmitMode::GoBackN {
            (0..in_flight).for_each(|i| self.resend(i));
        } else if in_flight > 0 {
            // Two probes, each a datagram of its own with no frames: one
            // lost datagram must not cost a doubled timeout (after a 20 ms
            // cut, the simulator's flaky mix took half as long again with
            // one chance).
            self.probes_owed = 2;
            self.probe_number = match self.probe_number.wrapping_add(1) {
                0 => 1,
                n => n,
            };
            if self.unanswered_timeouts >= DATA_PROBE_AFTER {
                // Several timeouts unanswered: the first unacknowledged
                // segment goes too, even if selectively acknowledged. A
                // receiver that answers nothing of ours still takes data
                // (one whose state of this stream is older than ours, one
                // whose delivery queue is full and whose ACK with room was
                // lost): it answers what it receives.
                self.resend(0);
            }
        }
        self.rto_deadline = (in_flight > 0).then(|| now + self.rtt.rto());
    }

    /// Segment `i` goes again, even if selectively acknowledged.
    fn resend(&mut self, i: usize) {
        let Segment { log, tx, .. } = &mut self.segments[i];
        let sacked = std::mem::take(&mut tx.sacked);
        if sacked {
            self.sacked_count -= 1;
        }
        if !std::mem::replace(&mut tx.lost, true) {
            self.lost_count += 1;
            if !sacked {
                self.pipe -= log.data.len() as u64;
            }
        }
    }

    /// A probe is owed: the number to send one with now (a datagram with
    /// no frames and the ACK-request flag, which the receiver answers with
    /// an ACK naming the number). Counts it as sent.
    pub fn take_probe(&mut self, now: Instant) -> Option<u8> {
        if self.probes_owed == 0 || self.halted {
            return None;
        }
        self.probes_owed -= 1;
        if self.probe.is_none() {
            // Its place in the transmission order: after everything sent
            // so far, before anything sent next.
            self.probe =
                Some(OutstandingProbe { sent: now, order: self.next_tx_order, number: self.probe_number });
            self.next_tx_order += 1;
        }
        Some(self.probe_number)
    }

    /// A probe waits to be sent.
    pub fn probe_owed(&self) -> bool {
        self.probes_owed > 0 && !self.halted
    }

    /// Something sent over `rail` is still unacknowledged.
    pub fn in_flight_on(&self, rail: RailId) -> bool {
        self.segments.iter().take(self.in_flight() as usize).any(|s| s.tx.rail == rail && !s.tx.sacked)
    }

    /// The path over `rail` went down: everything last sent over it that
    /// the receiver has not shown it holds goes again at once, in order,
    /// over whatever rail carries data next (the receiver drops any
    /// duplicate by sequence number). Returns how many segments.
    pub fn fail_over(&mut self, now: Instant, rail: RailId) -> usize {
        let in_flight = self.in_flight() as usize;
        let mut moved = 0;
        for s in self.segments.iter_mut().take(in_flight) {
            if s.tx.rail == rail && !s.tx.sacked && !s.tx.lost {
                s.tx.lost = true;
                self.pipe -= s.log.data.len() as u64;
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
    /// failed messages (empty range if there were none). Every message with
    /// a fragment on the wire is in doubt, even toward a peer never heard
    /// from: it may have delivered and crashed before its first ACK, or its
    /// answers may all have been lost. Only the never-sent are certain.
    pub fn abandon(&mut self, peer: NodeId, reason: FailReason) -> FailedMessages {
        let log = &mut self.log;
        let in_doubt_end = match self.segments.get((log.sent_upto - log.acked_upto) as usize) {
            Some(first_unsent) => first_unsent.log.msg,
            None => log.next_msg,
        };
        let failed = FailedMessages { peer, first: log.settled_below, end: log.next_msg, in_doubt_end };
        self.segments.clear();
        give_back(&mut self.segments);
        log.acked_upto = 0;
        log.next_seq = 0;
        log.sent_upto = 0;
        log.settled_below = log.next_msg;
        log.settled_seq = 0;
        log.epoch = log.epoch.wrapping_add(1);
        self.lost_count = 0;
        self.sacked_count = 0;
        self.bytes_buffered = 0;
        self.in_flight_bytes = 0;
        self.pipe = 0;
        self.unsent_wire_bytes = 0;
        self.next_ack_request = 0;
        self.rto_deadline = None;
        self.unanswered_timeouts = 0;
        self.probes_owed = 0;
        self.probe = None;
        self.reorder_deadline = None;
        if !failed.is_empty() {
            if log.failures.len() == FAILURE_HISTORY {
                let (old, _) = log.failures.pop_front().expect("history is full");
                log.forgotten_below = old.end;
            }
            log.failures.push_back((failed, reason));
        }
        failed
    }

    /// The receiver acknowledged `receiver_epoch`, newer than any this
    /// stream started: it has reset its receive state and drops our epoch
    /// as stale. Abandon what is unacknowledged (it is in doubt, as after a
    /// restart) and continue on the epoch after the receiver's.
    pub fn resync(&mut self, peer: NodeId, receiver_epoch: u32) -> FailedMessages {
        let failed = self.abandon(peer, FailReason::StreamReset);
        self.log.epoch = receiver_epoch.wrapping_add(1);
        failed
    }

    /// The receiver left our epoch for `receiver_epoch` (`Peer`'s ACK
    /// handling) after consuming what the ACK just applied covers: every
    /// segment still held certainly never arrived. They go again, in
    /// order, as a fresh sequence space on the epoch after the receiver's
    /// (a new stream rebuilt from this one's hard state, as after a loss
    /// of soft state; the round-trip estimate and the window's accounting
    /// carry over, the path did not change). A message the receiver's
    /// point cut in two fails, certainly not delivered: its head went with
    /// the old epoch. Returns it (an empty range if there was none).
    pub fn carry_over(
        &mut self,
        config: &Config,
        peer: NodeId,
        receiver_epoch: u32,
        now: Instant,
    ) -> FailedMessages {
        let SendSnapshot { mut log, mut segments } = self.snapshot();
        let first = log.settled_below;
        let mut failed = FailedMessages { peer, first, end: first, in_doubt_end: first };
        let cut = segments.iter().take_while(|s| !s.flags.first()).count();
        if cut > 0 {
            segments.drain(..cut);
            failed.end = first + 1;
            log.settled_below = first + 1;
            if log.failures.len() == FAILURE_HISTORY {
                let (old, _) = log.failures.pop_front().expect("history is full");
                log.forgotten_below = old.end;
            }
            log.failures.push_back((failed, FailReason::StreamReset));
        }
        for (seq, s) in segments.iter_mut().enumerate() {
            s.seq = seq as u64;
        }
        log.epoch = receiver_epoch.wrapping_add(1);
        log.acked_upto = 0;
        log.sent_upto = 0;
        log.next_seq = segments.len() as u64;
        log.settled_seq = 0;
        let mut fresh = SendStream::restore(config, SendSnapshot { log, segments }, now, &mut || {});
        fresh.rtt = self.rtt.clone();
        fresh.reported_pipe = self.reported_pipe;
        fresh.patience = self.patience;
        fresh.fragment = self.fragment;
        fresh.next_tx_order = self.next_tx_order;
        // New probes get new numbers: a late answer to one of the old
        // epoch's must not answer them.
        fresh.probe_number = self.probe_number;
        *self = fresh;
        failed
    }

    /// Whether an ACK answering probe `n` answers one still outstanding:
    /// not a late or duplicated answer to a probe answered already, or to
    /// one of an epoch this stream has left (a carried-over stream has no
    /// probe outstanding until its next timeout).
    pub fn answers_outstanding_probe(&self, n: u8) -> bool {
        self.probe.is_some_and(|p| p.answered_by(n, self.probe_number))
    }

    /// The hard state, without the segments.
    pub fn log(&self) -> &SendLog {
        &self.log
    }

    /// Every message below this is acknowledged or failed.
    pub fn settled_below(&self) -> u64 {
        self.log.settled_below
    }

    /// Messages accepted and not yet settled (acknowledged or failed).
    pub fn pending_messages(&self) -> u64 {
        self.log.next_msg - self.log.settled_below
    }

    pub fn message_state(&self, msg: u64) -> MessageState {
        let log = &self.log;
        if msg >= log.next_msg {
            return MessageState::Unknown;
        }
        if msg >= log.settled_below {
            return MessageState::Pending;
        }
        if msg < log.forgotten_below {
            return MessageState::Unknown;
        }
        match log.failures.iter().rev().find(|(f, _)| f.contains(msg)) {
            Some((_, reason)) => MessageState::Failed(*reason),
            None => MessageState::Delivered,
        }
    }

    /// The sender's counters and windows agree with its log (TigerBeetle
    /// style: cheap enough for every test, off in production builds).
    /// Check the payloads of the segments from sequence `from` on against
    /// their digests (`Config::verify_payloads`), until `budget` bytes were
    /// read (at least one segment is): where to go on (`None`: the last
    /// segment was checked).
    pub fn audit_payloads(&self, from: u64, budget: &mut usize) -> Result<Option<u64>, &'static str> {
        let first = from.saturating_sub(self.log.acked_upto) as usize;
        let mut segments = self.segments.iter().skip(first).peekable();
        while let Some(s) = segments.next() {
            if !s.intact() {
                return Err("a buffered payload changed since it was queued");
            }
            *budget = budget.saturating_sub(s.log.data.len().max(1));
            if *budget == 0 {
                return Ok(segments.peek().map(|next| next.log.seq));
            }
        }
        Ok(None)
    }

    /// The fault hook: one bit of a buffered payload flipped in place.
    #[cfg(feature = "fault-hook")]
    pub fn flip_payload(&mut self, draw: &mut crate::fault_hook::Draw) -> String {
        let i = draw.below(self.segments.len() as u64) as usize;
        let log = &mut self.segments[i].log;
        match crate::fault_hook::flip_bit(&mut log.data, draw) {
            Some(bit) => format!("bit {bit} of the payload of send segment {}", log.seq),
            None => format!("send segment {} is empty: nothing flipped", log.seq),
        }
    }

    /// The fault hook: one bit of a segment's sequence number, or of the
    /// next one to assign.
    #[cfg(feature = "fault-hook")]
    pub fn flip_seq(&mut self, draw: &mut crate::fault_hook::Draw) -> String {
        let bit = draw.below(64);
        if !self.segments.is_empty() && draw.below(2) == 0 {
            let i = draw.below(self.segments.len() as u64) as usize;
            let log = &mut self.segments[i].log;
            log.seq ^= 1 << bit;
            format!("bit {bit} of send segment {i}'s sequence number (now {})", log.seq)
        } else {
            self.log.next_seq ^= 1 << bit;
            format!("bit {bit} of the next sequence number (now {})", self.log.next_seq)
        }
    }

    /// The fault hook: one bit of the cumulative ACK or the sent mark.
    #[cfg(feature = "fault-hook")]
    pub fn flip_window(&mut self, draw: &mut crate::fault_hook::Draw) -> String {
        let bit = draw.below(64);
        if draw.below(2) == 0 {
            self.log.acked_upto ^= 1 << bit;
            format!("bit {bit} of the send stream's cumulative ACK (now {})", self.log.acked_upto)
        } else {
            self.log.sent_upto ^= 1 << bit;
            format!("bit {bit} of the send stream's sent mark (now {})", self.log.sent_upto)
        }
    }

    pub fn check_invariants(&self, config: &Config) {
        if let Err(broken) = self.audit() {
            panic!("send stream: {broken}: {:?}", self.log);
        }
        // Not in `audit`: a stream an engine restored counts everything up
        // to its backup's sent mark, written ahead, as in flight.
        assert!(self.in_flight() <= config.send_window as u64, "in flight beyond the window");
    }

    /// The stream's invariants, checked without trusting any of it: the
    /// first one broken (a pass over the segments). An engine runs this as
    /// part of its self-test, since a corrupted sequence number or window
    /// pointer otherwise shows only as a stall or, worse, as messages
    /// settled that never arrived.
    pub fn audit(&self) -> Result<(), &'static str> {
        let log = &self.log;
        let check = |ok: bool, what: &'static str| if ok { Ok(()) } else { Err(what) };
        check(log.acked_upto <= log.sent_upto && log.sent_upto <= log.next_seq, "sequence order")?;
        check(self.segments.len() as u64 == log.next_seq - log.acked_upto, "one segment per unacked seq")?;
        check(log.settled_below <= log.next_msg, "settled beyond assigned")?;
        check(log.settled_seq <= log.acked_upto, "a settled message's segment unacknowledged")?;
        if let Some(front) = self.segments.front() {
            check(
                front.log.msg > log.settled_below || log.settled_seq <= front.log.seq,
                "settled seq ahead",
            )?;
        }
        check(self.in_flight() == 0 || self.rto_deadline.is_some(), "data in flight with no timer")?;
        let (mut lost, mut sacked, mut buffered, mut unsent, mut flying, mut pipe) = (0, 0, 0, 0, 0, 0);
        let mut msg = None;
        for (i, s) in self.segments.iter().enumerate() {
            check(s.log.seq == log.acked_upto + i as u64, "segments contiguous")?;
            check(
                s.log.msg >= log.settled_below && s.log.msg < log.next_msg,
                "a message number out of range",
            )?;
            // Message numbers rise by at most one per segment, and only
            // where a message ends.
            if let Some((prev, last)) = msg {
                check(s.log.msg == prev + u64::from(last), "message numbers follow the fragments")?;
            }
            msg = Some((s.log.msg, s.log.flags.last()));
            let sent = s.log.seq < log.sent_upto;
            check(!(s.tx.lost && s.tx.sacked), "a segment both lost and selectively acknowledged")?;
            check(sent || !(s.tx.lost || s.tx.sacked), "an unsent segment marked lost or acknowledged")?;
            lost += s.tx.lost as usize;
            sacked += s.tx.sacked as usize;
            if s.log.flags.last() {
                buffered += s.log.total_len as usize;
            }
            if sent {
                flying += s.log.data.len();
                if !s.tx.lost && !s.tx.sacked {
                    pipe += s.log.data.len() as u64;
                }
            } else {
                unsent += DataFrame::encoded_len(s.log.data.len(), s.log.flags);
            }
        }
        check(lost == self.lost_count, "lost count")?;
        check(sacked == self.sacked_count, "selectively acknowledged count")?;
        check(buffered == self.bytes_buffered, "buffered bytes")?;
        check(unsent == self.unsent_wire_bytes, "unsent wire bytes")?;
        check(flying == self.in_flight_bytes, "bytes in flight")?;
        check(pipe == self.pipe, "bytes in the pipe")
    }
}
