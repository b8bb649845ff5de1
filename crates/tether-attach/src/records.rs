//! The records an application and its engine exchange, one per ring record
//! (docs/ENGINE.md, "Step 1 in detail"): submissions from the application,
//! completions from the engine. Little-endian, the first byte the kind.
//!
//! Neither side trusts the other's memory (a crashed or buggy engine, a
//! buggy or hostile application), so decoding is parsing: every length is
//! checked against the bytes there, every enum value against its range,
//! and what is left over is an error. Decoding borrows payloads from the
//! record and never allocates; encoding writes into the caller's buffer.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use tether_proto::{Channel, FailReason, FailedMessages, Fragment, NodeId, Refused, MAX_RAILS};
use thiserror::Error;

/// Why a record was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum RecordError {
    /// No bytes at all.
    #[error("empty record")]
    Empty,
    /// A kind byte this build does not know.
    #[error("unknown record kind {0}")]
    UnknownKind(u8),
    /// The record ends before its fields do.
    #[error("record truncated")]
    Truncated,
    /// Bytes left over after the record's last field.
    #[error("{0} bytes after the record's end")]
    Trailing(usize),
    /// A field out of its range.
    #[error("bad field: {0}")]
    BadField(&'static str),
    /// Encoding: the record does not fit the buffer given.
    #[error("the buffer is too small for the record")]
    BufferTooSmall,
}

/// From an application to its engine. `AddPeer` holds its addresses inline
/// (no allocation to decode one), which makes it the large variant; a
/// submission lives on the stack for the moment it is handled.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(clippy::large_enum_variant)]
pub enum Submission<'a> {
    /// Send `payload` to `peer`; `id` is the application's name for the
    /// message, used in the completions that settle it, on `channel`
    /// (the application's, or tether's calls').
    Send {
        /// The message's id: its sequence number toward `peer`.
        id: u64,
        /// The destination.
        peer: NodeId,
        /// The message.
        payload: &'a [u8],
        /// Whose message it is.
        channel: Channel,
    },
    /// Learn a peer's address on each rail (rail `i` is `rails[i]`).
    AddPeer {
        /// The peer.
        node: NodeId,
        /// Its address on each of the engine's rails.
        rails: Rails,
    },
    /// The application is leaving: settle what it sent within `linger_ns`.
    Close {
        /// How long the engine keeps driving what is unsettled, in
        /// nanoseconds.
        linger_ns: u64,
    },
    /// After the engine died, to the new one: where the application
    /// stands in `peer`'s stream (`None`: nothing taken from it), sent
    /// after the peer's `AddPeer` and before its unsettled messages are
    /// sent again with their ids (docs/ENGINE.md, "Restore").
    /// `failed_upto`: one past the last message it was told failed.
    Resume {
        /// The peer whose stream this is.
        peer: NodeId,
        /// One past the last message to it the application was told failed.
        failed_upto: u64,
        /// Where the application stands in the peer's stream to it.
        taken: Option<Taken>,
    },
    /// Every `Resume` and message has been given: restore.
    ResumeEnd,
    /// A message was pushed on the direct path to `peer`, which sleeps:
    /// ring its doorbell (docs/ENGINE.md, "The direct path").
    Wake {
        /// The sleeping peer.
        peer: NodeId,
    },
}

/// A peer's addresses, one per rail, at most `MAX_RAILS`, inline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Rails {
    addrs: [Option<SocketAddr>; MAX_RAILS],
    len: usize,
}

impl Rails {
    /// A peer's addresses, one per rail: between one and `MAX_RAILS`.
    pub fn new(addrs: &[SocketAddr]) -> Result<Self, RecordError> {
        if addrs.is_empty() || addrs.len() > MAX_RAILS {
            return Err(RecordError::BadField("between one and MAX_RAILS addresses"));
        }
        let mut r = Rails::default();
        for (slot, a) in r.addrs.iter_mut().zip(addrs) {
            *slot = Some(*a);
        }
        r.len = addrs.len();
        Ok(r)
    }

    /// The addresses, rail 0 first.
    pub fn iter(&self) -> impl Iterator<Item = SocketAddr> + '_ {
        self.addrs[..self.len].iter().flatten().copied()
    }
}

/// Where an application stands in a peer's stream: the life and epoch of
/// it, and the next fragment it expects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Taken {
    /// The peer's incarnation.
    pub incarnation: u64,
    /// The peer's stream epoch.
    pub epoch: u32,
    /// The next fragment expected.
    pub next: u64,
}

/// From an engine to its application.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Completion<'a> {
    /// A message from `from`, the `seq`-th of its stream to us, on
    /// `channel` (`Delivery::channel`).
    Delivery {
        /// The sender.
        from: NodeId,
        /// Which fragment of which message of the sender's stream.
        fragment: Fragment,
        /// Whose message it is.
        channel: Channel,
        /// The fragment's bytes.
        payload: &'a [u8],
    },
    /// Every message to `peer` with an application id below `below` is
    /// acknowledged (ids are assigned in order per peer).
    Settled {
        /// The destination of the messages.
        peer: NodeId,
        /// Every id below this is settled.
        below: u64,
    },
    /// Messages that will never be acknowledged, and why.
    Failed {
        /// The run of messages.
        failed: FailedMessages,
        /// Why they failed.
        reason: FailReason,
    },
    /// The application's protocol counters in this engine (`Stats`, in
    /// `Stats::fields` order, then the engine's `FaultCounters::values`,
    /// then its `EngineCounters::values`),
    /// as little-endian u64s: `counter_values`.
    Counters {
        /// The counters, eight little-endian bytes each.
        values: &'a [u8],
    },
    /// `peer` is attached to this engine too: messages to and from it go
    /// through the pair region `generation` in the engine's directory
    /// (`pair_file`), never through the engine.
    Local {
        /// The peer on the same engine.
        peer: NodeId,
        /// Which pair region (`pair_file`).
        generation: u64,
    },
    /// The direct path's other side, `peer`, detached or died: what it did
    /// not take from the ring will never be delivered.
    LocalGone {
        /// The peer that went.
        peer: NodeId,
    },
    /// Datagrams the engine refused for this application's core since the
    /// last such record, by reason (its `Event::Refused`, passed on).
    Refused {
        /// The counts.
        refused: Refused,
    },
    /// The answer to `AddPeer` (after its `Local`, if the peer is local).
    PeerAdded {
        /// The peer added.
        peer: NodeId,
    },
}

/// The pair region of nodes `a` and `b`, its `generation`-th, in an
/// engine's directory: named from numbers, so no path is ever parsed out
/// of a record.
pub fn pair_file(a: NodeId, b: NodeId, generation: u64) -> String {
    format!("pair-{}-{}-{generation}.shm", a.min(b), a.max(b))
}

/// Most counters a `Counters` record carries.
pub const MAX_COUNTERS: usize = 256;

/// Bytes a `Send` or `Delivery` record takes before its payload, at most
/// (`encode_parts`' head; the longer kinds without a payload need more).
pub const PAYLOAD_HEAD: usize = 48;

/// The counters a `Counters` record carries, in order.
pub fn counter_values(values: &[u8]) -> impl Iterator<Item = u64> + '_ {
    values.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
}

// Records (and the direct path's record ids) name a message's channel
// with one bit, as the wire does: the application's or the layer's.
const _: () = assert!(Channel::COUNT == 2, "records carry a message's channel in one bit");

/// The channel a record's bit names.
pub(crate) fn channel_bit(set: bool) -> Channel {
    if set {
        Channel::LAYER
    } else {
        Channel::APP
    }
}

mod kind {
    pub const SEND: u8 = 1;
    pub const ADD_PEER: u8 = 2;
    pub const CLOSE: u8 = 3;
    pub const RESUME: u8 = 4;
    pub const RESUME_END: u8 = 5;
    pub const WAKE: u8 = 6;
    /// `SEND` on `Channel::LAYER` (tether's calls).
    pub const SEND_ON_LAYER: u8 = 7;
    pub const DELIVERY: u8 = 16;
    pub const SETTLED: u8 = 17;
    pub const FAILED: u8 = 18;
    pub const COUNTERS: u8 = 19;
    pub const LOCAL: u8 = 20;
    pub const LOCAL_GONE: u8 = 21;
    pub const PEER_ADDED: u8 = 22;
    pub const REFUSED: u8 = 23;
}

/// Writes fields into a caller's buffer.
struct Out<'b> {
    buf: &'b mut [u8],
    at: usize,
}

impl Out<'_> {
    fn put(&mut self, bytes: &[u8]) -> Result<(), RecordError> {
        let end = self.at.checked_add(bytes.len()).filter(|&e| e <= self.buf.len());
        let end = end.ok_or(RecordError::BufferTooSmall)?;
        self.buf[self.at..end].copy_from_slice(bytes);
        self.at = end;
        Ok(())
    }
}

/// Reads fields from a record, each bounds-checked.
struct In<'a> {
    rest: &'a [u8],
}

impl<'a> In<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], RecordError> {
        if self.rest.len() < n {
            return Err(RecordError::Truncated);
        }
        let (head, rest) = self.rest.split_at(n);
        self.rest = rest;
        Ok(head)
    }
    fn u8(&mut self) -> Result<u8, RecordError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, RecordError> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().expect("2 bytes")))
    }
    fn u32(&mut self) -> Result<u32, RecordError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }
    fn u64(&mut self) -> Result<u64, RecordError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }
    /// A payload: its length (u32) and bytes.
    fn bytes(&mut self) -> Result<&'a [u8], RecordError> {
        let n = self.u32()? as usize;
        self.take(n)
    }
    fn end(self) -> Result<(), RecordError> {
        match self.rest.len() {
            0 => Ok(()),
            n => Err(RecordError::Trailing(n)),
        }
    }
}

/// The record whose head `encode_parts` wrote into `buf`, with its
/// payload after the head: its length.
fn joined(buf: &mut [u8], (n, payload): (usize, &[u8])) -> Result<usize, RecordError> {
    let mut o = Out { buf, at: n };
    o.put(payload)?;
    Ok(o.at)
}

/// A payload's length (u32); its bytes follow (`encode_parts`).
fn put_len(o: &mut Out<'_>, payload: &[u8]) -> Result<(), RecordError> {
    let n = u32::try_from(payload.len()).map_err(|_| RecordError::BadField("payload over 4 GiB"))?;
    o.put(&n.to_le_bytes())
}

/// An address: family (4 or 6), 16 address bytes (IPv4 in the first 4),
/// port.
fn put_addr(o: &mut Out<'_>, a: SocketAddr) -> Result<(), RecordError> {
    let mut ip = [0u8; 16];
    let family = match a.ip() {
        IpAddr::V4(v4) => {
            ip[..4].copy_from_slice(&v4.octets());
            4u8
        }
        IpAddr::V6(v6) => {
            ip.copy_from_slice(&v6.octets());
            6
        }
    };
    o.put(&[family])?;
    o.put(&ip)?;
    o.put(&a.port().to_le_bytes())
}

fn take_addr(i: &mut In<'_>) -> Result<SocketAddr, RecordError> {
    let family = i.u8()?;
    let ip: [u8; 16] = i.take(16)?.try_into().expect("16 bytes");
    let port = i.u16()?;
    let ip = match family {
        4 if ip[4..] == [0; 12] => IpAddr::V4(Ipv4Addr::new(ip[0], ip[1], ip[2], ip[3])),
        6 => IpAddr::V6(Ipv6Addr::from(ip)),
        _ => return Err(RecordError::BadField("address family")),
    };
    Ok(SocketAddr::new(ip, port))
}

fn reason_code(r: FailReason) -> Result<u8, RecordError> {
    match r {
        FailReason::PeerUnreachable => Ok(1),
        FailReason::PeerRestarted => Ok(2),
        FailReason::OperationFault => Ok(3),
        FailReason::StreamReset => Ok(4),
        // A reason added to the core and not yet to the records.
        _ => Err(RecordError::BadField("fail reason")),
    }
}

fn reason(code: u8) -> Result<FailReason, RecordError> {
    match code {
        1 => Ok(FailReason::PeerUnreachable),
        2 => Ok(FailReason::PeerRestarted),
        3 => Ok(FailReason::OperationFault),
        4 => Ok(FailReason::StreamReset),
        _ => Err(RecordError::BadField("fail reason")),
    }
}

impl<'a> Submission<'a> {
    /// Write the record into `buf`; its length.
    pub fn encode(&self, buf: &mut [u8]) -> Result<usize, RecordError> {
        let parts = self.encode_parts(buf)?;
        joined(buf, parts)
    }

    /// Write the record into `head` up to its payload, which is returned
    /// (empty for the kinds without one): `head[..n]` and the payload,
    /// joined, are the record, and `Ring::push_parts` joins them in the
    /// ring, so a message is not copied once more to be framed.
    pub fn encode_parts(&self, head: &mut [u8]) -> Result<(usize, &'a [u8]), RecordError> {
        let mut o = Out { buf: head, at: 0 };
        match self {
            Submission::Send { id, peer, payload, channel } => {
                o.put(&[if *channel == Channel::APP { kind::SEND } else { kind::SEND_ON_LAYER }])?;
                o.put(&id.to_le_bytes())?;
                o.put(&peer.to_le_bytes())?;
                put_len(&mut o, payload)?;
                return Ok((o.at, payload));
            }
            Submission::AddPeer { node, rails } => {
                o.put(&[kind::ADD_PEER])?;
                o.put(&node.to_le_bytes())?;
                o.put(&[rails.len as u8])?;
                for a in rails.iter() {
                    put_addr(&mut o, a)?;
                }
            }
            Submission::Close { linger_ns } => {
                o.put(&[kind::CLOSE])?;
                o.put(&linger_ns.to_le_bytes())?;
            }
            Submission::Resume { peer, failed_upto, taken } => {
                o.put(&[kind::RESUME])?;
                o.put(&peer.to_le_bytes())?;
                o.put(&failed_upto.to_le_bytes())?;
                match taken {
                    None => o.put(&[0])?,
                    Some(t) => {
                        o.put(&[1])?;
                        o.put(&t.incarnation.to_le_bytes())?;
                        o.put(&t.epoch.to_le_bytes())?;
                        o.put(&t.next.to_le_bytes())?;
                    }
                }
            }
            Submission::ResumeEnd => o.put(&[kind::RESUME_END])?,
            Submission::Wake { peer } => {
                o.put(&[kind::WAKE])?;
                o.put(&peer.to_le_bytes())?;
            }
        }
        Ok((o.at, &[]))
    }

    /// Parse one record; its payload is borrowed from `record`.
    pub fn decode(record: &'a [u8]) -> Result<Self, RecordError> {
        let (&k, rest) = record.split_first().ok_or(RecordError::Empty)?;
        let mut i = In { rest };
        let s = match k {
            kind::SEND | kind::SEND_ON_LAYER => Submission::Send {
                id: i.u64()?,
                peer: i.u32()?,
                payload: i.bytes()?,
                channel: channel_bit(k == kind::SEND_ON_LAYER),
            },
            kind::ADD_PEER => {
                let node = i.u32()?;
                let n = i.u8()? as usize;
                if n == 0 || n > MAX_RAILS {
                    return Err(RecordError::BadField("between one and MAX_RAILS addresses"));
                }
                let mut rails = Rails { len: n, ..Rails::default() };
                for slot in &mut rails.addrs[..n] {
                    *slot = Some(take_addr(&mut i)?);
                }
                Submission::AddPeer { node, rails }
            }
            kind::CLOSE => Submission::Close { linger_ns: i.u64()? },
            kind::RESUME => {
                let (peer, failed_upto) = (i.u32()?, i.u64()?);
                let taken = match i.u8()? {
                    0 => None,
                    1 => Some(Taken { incarnation: i.u64()?, epoch: i.u32()?, next: i.u64()? }),
                    _ => return Err(RecordError::BadField("resume: taken flag")),
                };
                Submission::Resume { peer, failed_upto, taken }
            }
            kind::RESUME_END => Submission::ResumeEnd,
            kind::WAKE => Submission::Wake { peer: i.u32()? },
            k => return Err(RecordError::UnknownKind(k)),
        };
        i.end()?;
        Ok(s)
    }
}

impl<'a> Completion<'a> {
    /// Write the record into `buf`; its length.
    pub fn encode(&self, buf: &mut [u8]) -> Result<usize, RecordError> {
        let parts = self.encode_parts(buf)?;
        joined(buf, parts)
    }

    /// As `Submission::encode_parts`: the record up to its payload into
    /// `head`, and the payload (a delivery's; empty for the other kinds).
    pub fn encode_parts(&self, head: &mut [u8]) -> Result<(usize, &'a [u8]), RecordError> {
        let mut o = Out { buf: head, at: 0 };
        match self {
            Completion::Delivery { from, fragment: f, channel, payload } => {
                o.put(&[kind::DELIVERY])?;
                o.put(&from.to_le_bytes())?;
                o.put(&f.incarnation.to_le_bytes())?;
                o.put(&f.epoch.to_le_bytes())?;
                o.put(&f.seq.to_le_bytes())?;
                let flags = u8::from(f.first)
                    | u8::from(f.last) << 1
                    | u8::from(f.total_len.is_some()) << 2
                    | u8::from(*channel != Channel::APP) << 3;
                o.put(&[flags])?;
                o.put(&f.total_len.unwrap_or(0).to_le_bytes())?;
                put_len(&mut o, payload)?;
                return Ok((o.at, payload));
            }
            Completion::Settled { peer, below } => {
                o.put(&[kind::SETTLED])?;
                o.put(&peer.to_le_bytes())?;
                o.put(&below.to_le_bytes())?;
            }
            Completion::Failed { failed, reason } => {
                o.put(&[kind::FAILED])?;
                o.put(&failed.peer.to_le_bytes())?;
                for w in [failed.first, failed.end, failed.in_doubt_end] {
                    o.put(&w.to_le_bytes())?;
                }
                o.put(&[reason_code(*reason)?])?;
            }
            Completion::Counters { values } => {
                if values.len() % 8 != 0 || values.len() > 8 * MAX_COUNTERS {
                    return Err(RecordError::BadField("counters"));
                }
                o.put(&[kind::COUNTERS])?;
                o.put(&((values.len() / 8) as u16).to_le_bytes())?;
                o.put(values)?;
            }
            Completion::Local { peer, generation } => {
                o.put(&[kind::LOCAL])?;
                o.put(&peer.to_le_bytes())?;
                o.put(&generation.to_le_bytes())?;
            }
            Completion::LocalGone { peer } => {
                o.put(&[kind::LOCAL_GONE])?;
                o.put(&peer.to_le_bytes())?;
            }
            Completion::PeerAdded { peer } => {
                o.put(&[kind::PEER_ADDED])?;
                o.put(&peer.to_le_bytes())?;
            }
            Completion::Refused { refused } => {
                o.put(&[kind::REFUSED])?;
                for (_, n) in refused.counts() {
                    o.put(&n.to_le_bytes())?;
                }
            }
        }
        Ok((o.at, &[]))
    }

    /// Parse one record; its payload is borrowed from `record`.
    pub fn decode(record: &'a [u8]) -> Result<Self, RecordError> {
        let (&k, rest) = record.split_first().ok_or(RecordError::Empty)?;
        let mut i = In { rest };
        let c = match k {
            kind::DELIVERY => {
                let (from, incarnation, epoch, seq, flags, total) =
                    (i.u32()?, i.u64()?, i.u32()?, i.u64()?, i.u8()?, i.u32()?);
                // Canonical: no unknown flag, no length where none is said.
                if flags > 15 || (flags & 4 == 0 && total != 0) {
                    return Err(RecordError::BadField("delivery flags"));
                }
                let total_len = (flags & 4 != 0).then_some(total);
                let fragment = Fragment {
                    incarnation,
                    epoch,
                    seq,
                    first: flags & 1 != 0,
                    last: flags & 2 != 0,
                    total_len,
                };
                Completion::Delivery {
                    from,
                    fragment,
                    channel: channel_bit(flags & 8 != 0),
                    payload: i.bytes()?,
                }
            }
            kind::SETTLED => Completion::Settled { peer: i.u32()?, below: i.u64()? },
            kind::FAILED => {
                let failed =
                    FailedMessages { peer: i.u32()?, first: i.u64()?, end: i.u64()?, in_doubt_end: i.u64()? };
                // The report's own invariant: first <= in-doubt end <= end.
                if !(failed.first <= failed.in_doubt_end && failed.in_doubt_end <= failed.end) {
                    return Err(RecordError::BadField("failed range out of order"));
                }
                Completion::Failed { failed, reason: reason(i.u8()?)? }
            }
            kind::COUNTERS => {
                let n = i.u16()? as usize;
                if n > MAX_COUNTERS {
                    return Err(RecordError::BadField("more counters than a record carries"));
                }
                Completion::Counters { values: i.take(8 * n)? }
            }
            kind::LOCAL => Completion::Local { peer: i.u32()?, generation: i.u64()? },
            kind::LOCAL_GONE => Completion::LocalGone { peer: i.u32()? },
            kind::PEER_ADDED => Completion::PeerAdded { peer: i.u32()? },
            kind::REFUSED => {
                let mut counts = [0u64; 11];
                for c in &mut counts {
                    *c = i.u64()?;
                }
                Completion::Refused { refused: Refused::from_counts(counts) }
            }
            k => return Err(RecordError::UnknownKind(k)),
        };
        i.end()?;
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn addr() -> impl Strategy<Value = SocketAddr> {
        prop_oneof![
            (any::<[u8; 4]>(), any::<u16>()).prop_map(|(ip, p)| SocketAddr::new(IpAddr::from(ip), p)),
            (any::<[u8; 16]>(), any::<u16>()).prop_map(|(ip, p)| SocketAddr::new(IpAddr::from(ip), p)),
        ]
    }

    proptest! {
        #[test]
        fn submissions_round_trip(
            id in any::<u64>(), peer in any::<u32>(), payload in proptest::collection::vec(any::<u8>(), 0..300),
            addrs in proptest::collection::vec(addr(), 1..=MAX_RAILS), linger in any::<u64>(),
        ) {
            let all = [
                Submission::Send { id, peer, payload: &payload, channel: Channel::APP },
                Submission::Send { id, peer, payload: &payload, channel: Channel::LAYER },
                Submission::AddPeer { node: peer, rails: Rails::new(&addrs).unwrap() },
                Submission::Close { linger_ns: linger },
                Submission::Resume { peer, failed_upto: id, taken: None },
                Submission::Resume {
                    peer,
                    failed_upto: linger,
                    taken: Some(Taken { incarnation: id, epoch: peer, next: linger }),
                },
                Submission::ResumeEnd,
                Submission::Wake { peer },
            ];
            let mut buf = vec![0u8; 1024];
            for s in all {
                let n = s.encode(&mut buf).unwrap();
                prop_assert_eq!(Submission::decode(&buf[..n]).unwrap(), s.clone());
                // Every strict prefix is refused, and so is a byte more.
                for cut in 0..n {
                    prop_assert!(Submission::decode(&buf[..cut]).is_err());
                }
                buf[n] = 0;
                prop_assert_eq!(Submission::decode(&buf[..n + 1]), Err(RecordError::Trailing(1)));
            }
        }

        #[test]
        fn completions_round_trip(
            from in any::<u32>(), seq in any::<u64>(), payload in proptest::collection::vec(any::<u8>(), 0..300),
            mut range in any::<[u64; 3]>(), code in 1u8..=4, flags in 0u8..16, total in any::<u32>(),
        ) {
            range.sort_unstable();
            let failed = FailedMessages { peer: from, first: range[0], in_doubt_end: range[1], end: range[2] };
            let all = [
                Completion::Delivery {
                    from,
                    fragment: Fragment {
                        incarnation: seq ^ 1,
                        epoch: from,
                        seq,
                        first: flags & 1 != 0,
                        last: flags & 2 != 0,
                        total_len: (flags & 4 != 0).then_some(total),
                    },
                    channel: channel_bit(flags & 8 != 0),
                    payload: &payload,
                },
                Completion::Settled { peer: from, below: seq },
                Completion::Failed { failed, reason: reason(code).unwrap() },
                Completion::Counters { values: &payload[..payload.len() / 8 * 8] },
                Completion::Local { peer: from, generation: seq },
                Completion::LocalGone { peer: from },
                Completion::PeerAdded { peer: from },
                Completion::Refused { refused: Refused { auth_missing: seq, mac_failures: u64::from(from), ..Refused::default() } },
            ];
            let mut buf = vec![0u8; 1024];
            for c in all {
                let n = c.encode(&mut buf).unwrap();
                prop_assert_eq!(Completion::decode(&buf[..n]).unwrap(), c.clone());
                for cut in 0..n {
                    prop_assert!(Completion::decode(&buf[..cut]).is_err());
                }
            }
        }

        /// Arbitrary bytes never panic, and what parses encodes back to them.
        #[test]
        fn any_bytes_parse_or_are_refused(bytes in proptest::collection::vec(any::<u8>(), 0..80)) {
            let mut buf = vec![0u8; 256];
            if let Ok(s) = Submission::decode(&bytes) {
                let n = s.encode(&mut buf).unwrap();
                prop_assert_eq!(&buf[..n], &bytes[..]);
            }
            if let Ok(c) = Completion::decode(&bytes) {
                let n = c.encode(&mut buf).unwrap();
                prop_assert_eq!(&buf[..n], &bytes[..]);
            }
        }
    }

    #[test]
    fn refusals_name_their_reason() {
        assert_eq!(Submission::decode(&[]), Err(RecordError::Empty));
        assert_eq!(Submission::decode(&[99]), Err(RecordError::UnknownKind(99)));
        assert_eq!(Completion::decode(&[kind::SEND]), Err(RecordError::UnknownKind(kind::SEND)));
        // A payload length beyond the record.
        let mut r = vec![kind::SEND];
        r.extend_from_slice(&[0; 12]);
        r.extend_from_slice(&1000u32.to_le_bytes());
        assert_eq!(Submission::decode(&r), Err(RecordError::Truncated));
        // No rails, or more than there can be.
        assert_eq!(
            Submission::decode(&[kind::ADD_PEER, 1, 0, 0, 0, 0]),
            Err(RecordError::BadField("between one and MAX_RAILS addresses"))
        );
        // A failure report whose range is out of order.
        let f = FailedMessages { peer: 1, first: 5, in_doubt_end: 3, end: 9 };
        let mut buf = [0u8; 64];
        let n = Completion::Failed { failed: f, reason: FailReason::PeerRestarted }.encode(&mut buf).unwrap();
        assert_eq!(Completion::decode(&buf[..n]), Err(RecordError::BadField("failed range out of order")));
        assert_eq!(
            Submission::Close { linger_ns: 1 }.encode(&mut [0u8; 4]),
            Err(RecordError::BufferTooSmall)
        );
    }
}

/// The messages of a direct path's batch record, after its id
/// (docs/ENGINE.md, "The batch API"): each its length (u32, little-endian)
/// and bytes. Stops at the first that does not fit what is left
/// (`batch_count` says whether all did).
#[derive(Debug, Clone)]
pub struct BatchMessages<'a>(pub &'a [u8]);

impl<'a> Iterator for BatchMessages<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        let (len, rest) = self.0.split_first_chunk::<4>()?;
        let len = u32::from_le_bytes(*len) as usize;
        if len > rest.len() {
            return None;
        }
        let (m, rest) = rest.split_at(len);
        self.0 = rest;
        Some(m)
    }
}

/// How many messages a batch record's body holds, if it parses to its end.
pub fn batch_count(body: &[u8]) -> Option<u64> {
    let mut it = BatchMessages(body);
    let n = it.by_ref().count() as u64;
    it.0.is_empty().then_some(n)
}

/// Append `m` to a batch record's body.
pub fn put_batch_message(body: &mut Vec<u8>, m: &[u8]) {
    body.extend_from_slice(&(m.len() as u32).to_le_bytes());
    body.extend_from_slice(m);
}
