//! Frames: the units inside a datagram body.
//!
//! * `DATA` carries one fragment of one message with its per-stream sequence
//!   number. `FIRST`/`LAST` mark message boundaries; a multi-fragment
//!   message's first fragment also carries the total length so the receiver
//!   can check it against its limit before buffering anything.
//! * `ACK` carries the cumulative acknowledgement (next expected sequence
//!   number) and up to [`MAX_SACK_RANGES`] selective ranges above it (Tang
//!   and Bilas [TB] section 4.1: cumulative ACKs; SACK is our addition so a
//!   single loss does not cost a window of retransmissions).
//! * `HELLO`, `WELCOME` and `CONFIRM` are the handshake (docs/PROTOCOL.md,
//!   "Handshake"): one shape, [`HandshakeFrame`], 24 bytes each, so an
//!   answer is never larger than what provoked it.
//! * `DATAGRAM` carries one unreliable message whole (the UNR class of Li
//!   et al. [CI] section 3: heartbeats): no sequence number, never
//!   acknowledged or sent again, but in the session's datagrams, so it is
//!   authenticated and its source validated like the rest. Its port says
//!   which class or service it is for (Li et al.'s (node, port) layer):
//!   the application's unreliable messages, the NACK-reliable class. One
//!   the receiver does not serve is dropped and counted, not refused, so a
//!   newer peer's port costs nothing.
//! * `PADDING` fills a datagram to a size: a HELLO and its WELCOME are
//!   padded to the datagram size they propose, so their arrival proves the
//!   path carries it (RFC 8899's probe packets, in the handshake). It is
//!   the last frame: its type byte, then zeros to the end of the body.

use crate::integrity::Checksummer;
use crate::WireError;

pub(crate) const FRAME_DATA: u8 = 0x01;
pub(crate) const FRAME_ACK: u8 = 0x02;
pub(crate) const FRAME_HELLO: u8 = 0x03;
pub(crate) const FRAME_WELCOME: u8 = 0x04;
pub(crate) const FRAME_CONFIRM: u8 = 0x05;
pub(crate) const FRAME_PADDING: u8 = 0x06;
pub(crate) const FRAME_DATAGRAM: u8 = 0x07;
/// The DATAGRAM port of the application's unreliable messages.
pub const PORT_APPLICATION: u8 = 0;
/// The DATAGRAM port of the NACK-reliable class's frames.
pub const PORT_NACKED: u8 = 1;
/// The DATAGRAM port of the membership protocol's messages (heartbeats,
/// probes, alerts, joins, view changes: docs/CLUSTER.md).
pub const PORT_MEMBERS: u8 = 2;
/// The DATAGRAM port of the manager replicas' Raft messages.
pub const PORT_MANAGERS: u8 = 3;
/// Fixed part of a DATAGRAM frame: type, port, len.
pub const DATAGRAM_FIXED_LEN: usize = 4;
/// A handshake frame: type, flags, reserved, max_datagram, nonce, cookie.
pub const HANDSHAKE_LEN: usize = 24;

/// Fixed part of a DATA frame: type, flags, len, seq.
pub(crate) const DATA_FIXED_LEN: usize = 12;
/// Fixed part of an ACK frame: type, range count, flags, the probe answered,
/// epoch, cumulative.
pub(crate) const ACK_FIXED_LEN: usize = 16;
pub(crate) const SACK_RANGE_LEN: usize = 8;
/// ACK flag (byte 2, bit 0): the receiver's delivery queue is full.
const ACK_FULL: u8 = 0x01;
/// ACK flag (byte 2, bit 1): the answer to a probe.
const ACK_ANSWER: u8 = 0x02;

/// Most selective ranges one ACK frame carries.
pub const MAX_SACK_RANGES: usize = 16;

/// Which layer a message belongs to: the application's own messages
/// ([`Channel::APP`]), or a layer that rides the same stream (tether's
/// calls). The stream orders and acknowledges every channel alike; the
/// receiver hands each its own messages in order, passing over the
/// others'. Carried in every DATA fragment's flags, so a fragment alone
/// says where its message goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Channel(u8);

impl Channel {
    /// The application's own messages.
    pub const APP: Channel = Channel(0);
    /// The channel of the layer that rides the application's streams
    /// (tether's calls, `tether_rpc::CHANNEL`).
    pub const LAYER: Channel = Channel(1);
    /// How many channels a fragment can name (one flag bit).
    pub const COUNT: usize = 2;

    /// Channel `n`, which must be below `COUNT` (a constant's is checked
    /// as it compiles).
    pub const fn new(n: u8) -> Channel {
        assert!((n as usize) < Self::COUNT, "no such channel");
        Channel(n)
    }

    /// Its number, below `COUNT`.
    pub const fn index(self) -> usize {
        self.0 as usize
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DataFlags(u8);

impl DataFlags {
    pub const FIRST: u8 = 0x01;
    pub const LAST: u8 = 0x02;
    /// The fragment's channel (`Channel`): set on every fragment of a
    /// message on `Channel::LAYER`.
    const CHANNEL: u8 = 0x04;
    const CHANNEL_SHIFT: u32 = 2;
    const KNOWN: u8 = Self::FIRST | Self::LAST | Self::CHANNEL;

    pub fn new(first: bool, last: bool) -> Self {
        DataFlags(((first as u8) * Self::FIRST) | ((last as u8) * Self::LAST))
    }
    /// These flags, for a fragment of a message on `channel`.
    pub fn with_channel(self, channel: Channel) -> Self {
        DataFlags((self.0 & !Self::CHANNEL) | (channel.0 << Self::CHANNEL_SHIFT))
    }
    pub fn channel(self) -> Channel {
        Channel((self.0 & Self::CHANNEL) >> Self::CHANNEL_SHIFT)
    }
    pub fn first(self) -> bool {
        self.0 & Self::FIRST != 0
    }
    pub fn last(self) -> bool {
        self.0 & Self::LAST != 0
    }
    /// A first fragment that is not also the last carries the message length.
    pub fn carries_total_len(self) -> bool {
        self.first() && !self.last()
    }
    pub fn bits(self) -> u8 {
        self.0
    }
}

/// One fragment of a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataFrame<'a> {
    pub seq: u64,
    pub flags: DataFlags,
    /// Total message length; present only when `flags.carries_total_len()`.
    pub total_len: Option<u32>,
    pub payload: &'a [u8],
}

impl DataFrame<'_> {
    /// Bytes a DATA frame with `payload_len` payload bytes occupies.
    pub fn encoded_len(payload_len: usize, flags: DataFlags) -> usize {
        DATA_FIXED_LEN + if flags.carries_total_len() { 4 } else { 0 } + payload_len
    }
}

/// A selective-ACK range: sequence numbers `[cumulative + start, cumulative + end)`
/// were received. `start >= 1` because `cumulative` itself is by definition missing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SackRange {
    pub start: u32,
    pub end: u32,
}

/// An ACK as the sender of it builds it: fixed capacity, no allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AckRepr {
    /// The stream epoch this ACK refers to (the acknowledged sender's epoch).
    pub epoch: u32,
    /// Next sequence number expected: everything below it was delivered.
    pub cumulative: u64,
    /// The receiver holds the segment at `cumulative` but has no room to
    /// deliver it (its application is not reading): the sender should
    /// not take the silence that follows for loss (flag bit 0 of byte 2).
    pub full: bool,
    /// Sent in answer to a probe (a datagram with no frames and the
    /// ACK-request flag), and its number (`Header::probe`; 0: an
    /// unnumbered one): it covers everything the receiver took in before
    /// that probe, so what it does not cover, sent well before the probe,
    /// was lost (flag bit 1 of byte 2; the number is byte 3). A sender
    /// believes it only for a probe it has not yet had answered: an
    /// answer to an older one, delayed or duplicated on the way, says
    /// nothing of what it sent since.
    pub answer: Option<u8>,
    ranges: [SackRange; MAX_SACK_RANGES],
    len: u8,
}

impl AckRepr {
    pub fn new(epoch: u32, cumulative: u64) -> Self {
        AckRepr { epoch, cumulative, ..Default::default() }
    }

    /// Append a range; ranges must be pushed ascending and disjoint. Returns
    /// false (and changes nothing) when full or when the range is not valid.
    pub fn push_range(&mut self, range: SackRange) -> bool {
        let len = self.len as usize;
        let after_prev = len == 0 || self.ranges[len - 1].end < range.start;
        let fits = self.cumulative.checked_add(range.end as u64).is_some();
        if len == MAX_SACK_RANGES || range.start == 0 || range.start >= range.end || !after_prev || !fits {
            return false;
        }
        self.ranges[len] = range;
        self.len += 1;
        true
    }

    pub fn ranges(&self) -> &[SackRange] {
        &self.ranges[..self.len as usize]
    }

    pub fn encoded_len(&self) -> usize {
        ACK_FIXED_LEN + SACK_RANGE_LEN * self.len as usize
    }
}

/// A validated ACK frame inside a received datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AckFrame<'a> {
    pub epoch: u32,
    pub cumulative: u64,
    /// See [`AckRepr::full`].
    pub full: bool,
    /// See [`AckRepr::answer`].
    pub answer: Option<u8>,
    raw_ranges: &'a [u8],
}

impl<'a> AckFrame<'a> {
    /// The selective ranges, ascending and disjoint (validated by parse).
    pub fn ranges(&self) -> impl Iterator<Item = SackRange> + 'a {
        self.raw_ranges.chunks_exact(SACK_RANGE_LEN).map(|c| SackRange {
            start: u32::from_le_bytes([c[0], c[1], c[2], c[3]]),
            end: u32::from_le_bytes([c[4], c[5], c[6], c[7]]),
        })
    }

    pub fn to_repr(&self) -> AckRepr {
        let mut repr = AckRepr::new(self.epoch, self.cumulative);
        repr.full = self.full;
        repr.answer = self.answer;
        for r in self.ranges() {
            repr.push_range(r);
        }
        repr
    }
}

/// Which step of the handshake a [`HandshakeFrame`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandshakeKind {
    /// Initiator to responder: "I am `src_inc`; here is a fresh nonce and
    /// the largest datagram I accept." Alone in its datagram.
    Hello,
    /// Responder to initiator, stateless: "I am `src_inc`; your nonce; a
    /// cookie that proves you heard this; the largest datagram I accept."
    /// Alone in its datagram.
    Welcome,
    /// Initiator to responder: "your cookie and my nonce back; the datagram
    /// size we agreed". Data may follow it in the same datagram.
    Confirm,
}

/// One handshake message (all three share the shape).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HandshakeFrame {
    /// Which step.
    pub kind: HandshakeKind,
    /// The largest datagram the sender accepts (HELLO, WELCOME) or the one
    /// agreed, the smaller of the two (CONFIRM).
    pub max_datagram: u32,
    /// The initiator's nonce: fresh in HELLO, echoed in WELCOME and CONFIRM.
    pub nonce: u64,
    /// The responder's cookie: 0 in HELLO, set in WELCOME, echoed in CONFIRM.
    pub cookie: u64,
}

/// An unreliable message, whole in one frame, for a port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DatagramFrame<'a> {
    pub port: u8,
    pub payload: &'a [u8],
}

impl DatagramFrame<'_> {
    /// Bytes a DATAGRAM frame with `payload_len` bytes takes.
    pub const fn encoded_len(payload_len: usize) -> usize {
        DATAGRAM_FIXED_LEN + payload_len
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Frame<'a> {
    Data(DataFrame<'a>),
    Ack(AckFrame<'a>),
    Handshake(HandshakeFrame),
    Datagram(DatagramFrame<'a>),
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4-byte slice"))
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8-byte slice"))
}

/// Parse the frame at the start of `b`; returns it (`None` for padding,
/// which means nothing) and its encoded length. Every length is checked
/// against `b.len()` before it is used.
pub(crate) fn parse_frame(b: &[u8]) -> Result<(Option<Frame<'_>>, usize), WireError> {
    if b.first() == Some(&FRAME_PADDING) {
        // Zeros to the end: nothing can hide in the padding.
        if b[1..].iter().any(|&x| x != 0) {
            return Err(WireError::MalformedFrame("padding not zero"));
        }
        return Ok((None, b.len()));
    }
    let (frame, len) = parse_meaningful(b)?;
    Ok((Some(frame), len))
}

fn parse_meaningful(b: &[u8]) -> Result<(Frame<'_>, usize), WireError> {
    match b.first().copied() {
        Some(FRAME_DATA) => {
            if b.len() < DATA_FIXED_LEN {
                return Err(WireError::FrameTruncated);
            }
            if b[1] & !DataFlags::KNOWN != 0 {
                return Err(WireError::MalformedFrame("unknown data flags"));
            }
            let flags = DataFlags(b[1]);
            let len = u16_at(b, 2) as usize;
            let seq = u64_at(b, 4);
            let mut at = DATA_FIXED_LEN;
            let total_len = if flags.carries_total_len() {
                if b.len() < at + 4 {
                    return Err(WireError::FrameTruncated);
                }
                let total = u32_at(b, at);
                at += 4;
                if (total as usize) <= len {
                    return Err(WireError::MalformedFrame("message length not above fragment length"));
                }
                Some(total)
            } else {
                None
            };
            if b.len() < at + len {
                return Err(WireError::FrameTruncated);
            }
            let payload = &b[at..at + len];
            Ok((Frame::Data(DataFrame { seq, flags, total_len, payload }), at + len))
        }
        Some(FRAME_ACK) => {
            if b.len() < ACK_FIXED_LEN {
                return Err(WireError::FrameTruncated);
            }
            let n = b[1] as usize;
            if n > MAX_SACK_RANGES {
                return Err(WireError::MalformedFrame("too many SACK ranges"));
            }
            if b[2] & !(ACK_FULL | ACK_ANSWER) != 0 || (b[2] & ACK_ANSWER == 0 && b[3] != 0) {
                return Err(WireError::MalformedFrame("reserved ACK bits set"));
            }
            let (full, answer) = (b[2] & ACK_FULL != 0, (b[2] & ACK_ANSWER != 0).then_some(b[3]));
            let epoch = u32_at(b, 4);
            let cumulative = u64_at(b, 8);
            let total = ACK_FIXED_LEN + n * SACK_RANGE_LEN;
            if b.len() < total {
                return Err(WireError::FrameTruncated);
            }
            let ack = AckFrame { epoch, cumulative, full, answer, raw_ranges: &b[ACK_FIXED_LEN..total] };
            let mut prev_end = 0u32;
            for r in ack.ranges() {
                if r.start == 0 || r.start >= r.end || (r.start <= prev_end && prev_end != 0) {
                    return Err(WireError::MalformedFrame("SACK ranges not ascending and disjoint"));
                }
                if cumulative.checked_add(r.end as u64).is_none() {
                    return Err(WireError::MalformedFrame("SACK range overflows sequence space"));
                }
                prev_end = r.end;
            }
            Ok((Frame::Ack(ack), total))
        }
        Some(FRAME_DATAGRAM) => {
            if b.len() < DATAGRAM_FIXED_LEN {
                return Err(WireError::FrameTruncated);
            }
            let port = b[1];
            let len = u16_at(b, 2) as usize;
            if b.len() < DATAGRAM_FIXED_LEN + len {
                return Err(WireError::FrameTruncated);
            }
            let payload = &b[DATAGRAM_FIXED_LEN..DATAGRAM_FIXED_LEN + len];
            Ok((Frame::Datagram(DatagramFrame { port, payload }), DATAGRAM_FIXED_LEN + len))
        }
        Some(t @ (FRAME_HELLO | FRAME_WELCOME | FRAME_CONFIRM)) => {
            if b.len() < HANDSHAKE_LEN {
                return Err(WireError::FrameTruncated);
            }
            if b[1] != 0 || u16_at(b, 2) != 0 {
                return Err(WireError::MalformedFrame("reserved handshake bits set"));
            }
            let kind = match t {
                FRAME_HELLO => HandshakeKind::Hello,
                FRAME_WELCOME => HandshakeKind::Welcome,
                _ => HandshakeKind::Confirm,
            };
            let frame = HandshakeFrame {
                kind,
                max_datagram: u32_at(b, 4),
                nonce: u64_at(b, 8),
                cookie: u64_at(b, 16),
            };
            Ok((Frame::Handshake(frame), HANDSHAKE_LEN))
        }
        Some(other) => Err(WireError::UnknownFrame(other)),
        None => Err(WireError::FrameTruncated),
    }
}

/// Fill `out` with one padding frame (nothing if it is empty).
pub(crate) fn emit_padding(out: &mut [u8]) -> usize {
    if let Some((first, rest)) = out.split_first_mut() {
        *first = FRAME_PADDING;
        rest.fill(0);
    }
    out.len()
}

pub(crate) fn emit_handshake(out: &mut [u8], h: &HandshakeFrame) -> Result<usize, WireError> {
    if out.len() < HANDSHAKE_LEN {
        return Err(WireError::BufferTooSmall);
    }
    out[0] = match h.kind {
        HandshakeKind::Hello => FRAME_HELLO,
        HandshakeKind::Welcome => FRAME_WELCOME,
        HandshakeKind::Confirm => FRAME_CONFIRM,
    };
    out[1..4].fill(0);
    out[4..8].copy_from_slice(&h.max_datagram.to_le_bytes());
    out[8..16].copy_from_slice(&h.nonce.to_le_bytes());
    out[16..24].copy_from_slice(&h.cookie.to_le_bytes());
    Ok(HANDSHAKE_LEN)
}

pub(crate) fn emit_datagram(out: &mut [u8], port: u8, payload: &[u8]) -> Result<usize, WireError> {
    let need = DatagramFrame::encoded_len(payload.len());
    if out.len() < need || payload.len() > u16::MAX as usize {
        return Err(WireError::BufferTooSmall);
    }
    out[0] = FRAME_DATAGRAM;
    out[1] = port;
    out[2..4].copy_from_slice(&(payload.len() as u16).to_le_bytes());
    out[DATAGRAM_FIXED_LEN..need].copy_from_slice(payload);
    Ok(need)
}

pub(crate) fn emit_data(
    out: &mut [u8],
    seq: u64,
    flags: DataFlags,
    total_len: u32,
    payload: &[u8],
    sum: Option<&mut Checksummer>,
) -> Result<usize, WireError> {
    let need = DataFrame::encoded_len(payload.len(), flags);
    if out.len() < need || payload.len() > u16::MAX as usize {
        return Err(WireError::BufferTooSmall);
    }
    if flags.carries_total_len() && total_len as usize <= payload.len() {
        // The parser rejects this; never emit what we would not accept.
        return Err(WireError::MalformedFrame("message length not above fragment length"));
    }
    out[0] = FRAME_DATA;
    out[1] = flags.0;
    out[2..4].copy_from_slice(&(payload.len() as u16).to_le_bytes());
    out[4..12].copy_from_slice(&seq.to_le_bytes());
    let mut at = DATA_FIXED_LEN;
    if flags.carries_total_len() {
        out[at..at + 4].copy_from_slice(&total_len.to_le_bytes());
        at += 4;
    }
    match sum {
        Some(sum) => {
            sum.update(&out[..at]);
            sum.copy_update(&mut out[at..at + payload.len()], payload);
        }
        None => out[at..at + payload.len()].copy_from_slice(payload),
    }
    Ok(need)
}

pub(crate) fn emit_ack(out: &mut [u8], ack: &AckRepr) -> Result<usize, WireError> {
    let need = ack.encoded_len();
    if out.len() < need {
        return Err(WireError::BufferTooSmall);
    }
    out[0] = FRAME_ACK;
    out[1] = ack.len;
    out[2] = if ack.full { ACK_FULL } else { 0 } | if ack.answer.is_some() { ACK_ANSWER } else { 0 };
    out[3] = ack.answer.unwrap_or(0);
    out[4..8].copy_from_slice(&ack.epoch.to_le_bytes());
    out[8..16].copy_from_slice(&ack.cumulative.to_le_bytes());
    for (i, r) in ack.ranges().iter().enumerate() {
        let at = ACK_FIXED_LEN + i * SACK_RANGE_LEN;
        out[at..at + 4].copy_from_slice(&r.start.to_le_bytes());
        out[at + 4..at + 8].copy_from_slice(&r.end.to_le_bytes());
    }
    Ok(need)
}
