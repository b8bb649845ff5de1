//! The ordered multicast's envelopes (docs/CLUSTER.md, "Groups"): each
//! one a message of the reliable stream between two members, on the
//! groups' channel, so it arrives once, in order and intact, from the
//! node the session proved. Integers are little-endian. Every envelope
//! starts with its kind (u8), the group (u32) and an epoch (u64: the
//! group view it belongs to, or, for FLUSH and FLUSHED, the view being
//! installed).
//!
//! | kind | envelope | after the header |
//! |---:|---|---|
//! | 0xC0 | SUBMIT | n u64, the message |
//! | 0xC1 | ORDER | stable u64, settled u8, first u64, count u32, entries |
//! | 0xC2 | STABLE | delivered u64 |
//! | 0xC3 | FLUSH | installed u64 (0: none), delivered u64, count u32, segments |
//! | 0xC4 | FLUSHED | count u32, segments |
//!
//! They share the stream's layer channel with the calls' envelopes, whose
//! kinds are below 0x80: the kind byte says whose an envelope is
//! ([`is_group_envelope`]).
//!
//! An entry is sender u32, n u64, len u32, the message; a segment is
//! epoch u64, member count u32, members u32 each, last u64, first u64,
//! entry count u32, entries (numbered from `first`).

use bytes::Bytes;
use tether_proto::NodeId;

/// A group's name on the wire.
pub type GroupId = u32;

pub const HEADER_LEN: usize = 13;
const SUBMIT: u8 = 0xC0;
const ORDER: u8 = 0xC1;
const STABLE: u8 = 0xC2;
const FLUSH: u8 = 0xC3;
const FLUSHED: u8 = 0xC4;

/// Is this message on the layer channel a group's envelope (not a call's)?
pub fn is_group_envelope(message: &[u8]) -> bool {
    message.first().is_some_and(|k| (0xC0..0xD0).contains(k))
}
const ENTRY_FIXED: usize = 16;
/// Members of one segment at most (a group's view).
pub const MAX_MEMBERS: usize = 4_096;

/// A message in its place in a group's order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ordered {
    pub seq: u64,
    pub sender: NodeId,
    /// The sender's own number for it.
    pub n: u64,
    pub message: Bytes,
}

/// A stretch of one group view's order: view `epoch` with `members`,
/// whose messages end at `last` (`u64::MAX`: not yet ended), and the
/// messages of it held, numbered `first..`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Segment {
    pub epoch: u64,
    pub members: Vec<NodeId>,
    pub last: u64,
    pub entries: Vec<Ordered>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Envelope {
    /// To the sequencer: order this message of the sender's, its `n`th.
    Submit { group: GroupId, epoch: u64, n: u64, message: Bytes },
    /// From the sequencer: these messages, numbered consecutively from the
    /// first's `seq`; every member has delivered up to `stable`;
    /// `settled`: every member installed this view.
    Order { group: GroupId, epoch: u64, stable: u64, settled: bool, entries: Vec<Ordered> },
    /// To the sequencer: this member delivered up to `delivered`.
    Stable { group: GroupId, epoch: u64, delivered: u64 },
    /// To the sequencer of view `target`: where this member stands (the
    /// view it installed, what it delivered there) and what it holds.
    Flush { group: GroupId, target: u64, installed: u64, delivered: u64, history: Vec<Segment> },
    /// From the sequencer of view `target`: deliver these segments in
    /// order, each ending its view at its `last`, then install `target`
    /// (the last segment, empty).
    Flushed { group: GroupId, target: u64, segments: Vec<Segment> },
}

/// Why an envelope did not parse.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum EnvelopeError {
    #[error("shorter than its header or its fields")]
    Truncated,
    #[error("unknown kind {0}")]
    UnknownKind(u8),
    #[error("bytes after the last field")]
    Trailing,
    #[error("a bad {0}")]
    BadField(&'static str),
}

/// Reads fields off a message, slicing its payloads without copying.
struct Reader {
    b: Bytes,
    at: usize,
}

impl Reader {
    fn take(&mut self, n: usize) -> Result<&[u8], EnvelopeError> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.b.len()).ok_or(EnvelopeError::Truncated)?;
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, EnvelopeError> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, EnvelopeError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("four")))
    }
    fn u64(&mut self) -> Result<u64, EnvelopeError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("eight")))
    }
    fn bytes(&mut self, n: usize) -> Result<Bytes, EnvelopeError> {
        let start = self.at;
        self.take(n)?;
        Ok(self.b.slice(start..self.at))
    }
    fn rest(&mut self) -> Bytes {
        let r = self.b.slice(self.at..);
        self.at = self.b.len();
        r
    }
    fn count(&mut self, min_each: usize) -> Result<usize, EnvelopeError> {
        let n = self.u32()? as usize;
        // A count the bytes left cannot hold is refused before anything is
        // reserved for it.
        if n.saturating_mul(min_each) > self.b.len() - self.at {
            return Err(EnvelopeError::Truncated);
        }
        Ok(n)
    }
    fn entries(&mut self, first: u64) -> Result<Vec<Ordered>, EnvelopeError> {
        let n = self.count(ENTRY_FIXED)?;
        let mut v = Vec::with_capacity(n);
        for i in 0..n as u64 {
            let sender = self.u32()?;
            let num = self.u64()?;
            let len = self.u32()? as usize;
            let message = self.bytes(len)?;
            let seq = first.checked_add(i).ok_or(EnvelopeError::BadField("sequence number"))?;
            v.push(Ordered { seq, sender, n: num, message });
        }
        Ok(v)
    }
    fn segments(&mut self) -> Result<Vec<Segment>, EnvelopeError> {
        let n = self.count(28)?;
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            let epoch = self.u64()?;
            let m = self.count(4)?;
            if m > MAX_MEMBERS {
                return Err(EnvelopeError::BadField("member count"));
            }
            let mut members = Vec::with_capacity(m);
            for _ in 0..m {
                members.push(self.u32()?);
            }
            if members.windows(2).any(|w| w[0] >= w[1]) {
                return Err(EnvelopeError::BadField("members (sorted, once each)"));
            }
            let last = self.u64()?;
            let first = self.u64()?;
            let entries = self.entries(first)?;
            if entries.last().is_some_and(|e| e.seq > last) {
                return Err(EnvelopeError::BadField("an entry past the segment's last"));
            }
            v.push(Segment { epoch, members, last, entries });
        }
        Ok(v)
    }
}

impl Envelope {
    /// Parse one envelope (slicing `b` for its messages).
    pub fn parse(b: Bytes) -> Result<Envelope, EnvelopeError> {
        let mut r = Reader { b, at: 0 };
        let kind = r.u8()?;
        let group = r.u32()?;
        let epoch = r.u64()?;
        let e = match kind {
            SUBMIT => {
                let n = r.u64()?;
                Envelope::Submit { group, epoch, n, message: r.rest() }
            }
            ORDER => {
                let stable = r.u64()?;
                let settled = match r.u8()? {
                    0 => false,
                    1 => true,
                    _ => return Err(EnvelopeError::BadField("settled")),
                };
                let first = r.u64()?;
                let entries = r.entries(first)?;
                Envelope::Order { group, epoch, stable, settled, entries }
            }
            STABLE => Envelope::Stable { group, epoch, delivered: r.u64()? },
            FLUSH => {
                let installed = r.u64()?;
                let delivered = r.u64()?;
                let history = r.segments()?;
                Envelope::Flush { group, target: epoch, installed, delivered, history }
            }
            FLUSHED => Envelope::Flushed { group, target: epoch, segments: r.segments()? },
            k => return Err(EnvelopeError::UnknownKind(k)),
        };
        if r.at != r.b.len() {
            return Err(EnvelopeError::Trailing);
        }
        Ok(e)
    }

    /// The group it is of.
    pub fn group(&self) -> GroupId {
        match self {
            Envelope::Submit { group, .. }
            | Envelope::Order { group, .. }
            | Envelope::Stable { group, .. }
            | Envelope::Flush { group, .. }
            | Envelope::Flushed { group, .. } => *group,
        }
    }

    /// Its length encoded.
    pub fn encoded_len(&self) -> usize {
        let entries = |es: &[Ordered]| 4 + es.iter().map(|e| ENTRY_FIXED + e.message.len()).sum::<usize>();
        let segments = |ss: &[Segment]| {
            4 + ss.iter().map(|s| 8 + 4 + 4 * s.members.len() + 16 + entries(&s.entries)).sum::<usize>()
        };
        HEADER_LEN
            + match self {
                Envelope::Submit { message, .. } => 8 + message.len(),
                Envelope::Order { entries: es, .. } => 17 + entries(es),
                Envelope::Stable { .. } => 8,
                Envelope::Flush { history, .. } => 16 + segments(history),
                Envelope::Flushed { segments: ss, .. } => segments(ss),
            }
    }

    /// Append the envelope's bytes to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let header = |out: &mut Vec<u8>, kind: u8, group: GroupId, epoch: u64| {
            out.push(kind);
            out.extend_from_slice(&group.to_le_bytes());
            out.extend_from_slice(&epoch.to_le_bytes());
        };
        match self {
            Envelope::Submit { group, epoch, n, message } => {
                header(out, SUBMIT, *group, *epoch);
                out.extend_from_slice(&n.to_le_bytes());
                out.extend_from_slice(message);
            }
            Envelope::Order { group, epoch, stable, settled, entries } => {
                header(out, ORDER, *group, *epoch);
                out.extend_from_slice(&stable.to_le_bytes());
                out.push(u8::from(*settled));
                out.extend_from_slice(&entries.first().map_or(0, |e| e.seq).to_le_bytes());
                encode_entries(out, entries);
            }
            Envelope::Stable { group, epoch, delivered } => {
                header(out, STABLE, *group, *epoch);
                out.extend_from_slice(&delivered.to_le_bytes());
            }
            Envelope::Flush { group, target, installed, delivered, history } => {
                header(out, FLUSH, *group, *target);
                out.extend_from_slice(&installed.to_le_bytes());
                out.extend_from_slice(&delivered.to_le_bytes());
                encode_segments(out, history);
            }
            Envelope::Flushed { group, target, segments } => {
                header(out, FLUSHED, *group, *target);
                encode_segments(out, segments);
            }
        }
    }
}

/// Entries must be numbered consecutively (as every envelope holds them).
pub fn encode_entries(out: &mut Vec<u8>, entries: &[Ordered]) {
    out.extend_from_slice(&(entries.len() as u32).to_le_bytes());
    for e in entries {
        out.extend_from_slice(&e.sender.to_le_bytes());
        out.extend_from_slice(&e.n.to_le_bytes());
        out.extend_from_slice(&(e.message.len() as u32).to_le_bytes());
        out.extend_from_slice(&e.message);
    }
}

fn encode_segments(out: &mut Vec<u8>, segments: &[Segment]) {
    out.extend_from_slice(&(segments.len() as u32).to_le_bytes());
    for s in segments {
        out.extend_from_slice(&s.epoch.to_le_bytes());
        out.extend_from_slice(&(s.members.len() as u32).to_le_bytes());
        for m in &s.members {
            out.extend_from_slice(&m.to_le_bytes());
        }
        out.extend_from_slice(&s.last.to_le_bytes());
        out.extend_from_slice(&s.entries.first().map_or(0, |e| e.seq).to_le_bytes());
        encode_entries(out, &s.entries);
    }
}
