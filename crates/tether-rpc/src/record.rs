//! The server's transaction log: the records that let a restarted server
//! answer a retried call from what its dead predecessor did, never by
//! running it again (Kaur's AMVIA, thesis sections 3.2.3 and A.4.1: a
//! record before the handler runs and one with its result before the reply
//! goes out; RIFL's completion records, Lee et al., SOSP'15).
//!
//! A log is a byte sequence of records, each `[len u32][crc32c u32]`, then
//! `[kind u8][aux u8][0 u16][node u32][client u64][seq u64][handler u32][0 u32]`
//! and the kind's payload (a reply's bytes), little-endian. The CRC32C
//! covers everything after itself, so a record torn by a crash in the middle
//! of a write (or damaged on disk) is recognised and the log read up to it:
//! `replay` stops at the first record that does not check out, and zero
//! bytes (a file's unwritten tail) end the log. Bytes come from a file that
//! a crash or another process may have damaged: nothing here trusts them
//! (fuzz target `rpc_log`).

use thiserror::Error;

use tether_wire::NodeId;

use crate::call::Refusal;
use crate::call::{CallId, CallState, HandlerId};

/// Bytes of every record before its payload.
pub const RECORD_HEAD_LEN: usize = 40;

const STARTED: u8 = 1;
const COMPLETED: u8 = 2;
const REFUSED: u8 = 3;
const FORGET: u8 = 4;
const FORGET_CLIENTS: u8 = 5;
const ISSUED: u8 = 6;
const ENDED: u8 = 7;

/// One thing the server decided, in the order it decided it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Record<'a> {
    /// The handler is about to run (written before it does).
    Started { node: NodeId, call: CallId, handler: HandlerId, one_way: bool },
    /// The handler ran; its reply (empty for a one-way call). Written
    /// before the reply is sent.
    Completed { node: NodeId, call: CallId, result: &'a [u8] },
    /// The call will never run here: no such handler, or fenced by a query.
    Refused { node: NodeId, call: CallId, reason: Refusal },
    /// The caller finished every call of its life below `first_incomplete`.
    Forget { node: NodeId, client: u64, first_incomplete: u64 },
    /// Every life of `node`'s callers below `below` is forgotten.
    ForgetClients { node: NodeId, below: u64 },
    /// A caller's log: the call went to server `node` (written before the
    /// request leaves), so a restarted caller asks how it ended.
    Issued { node: NodeId, call: CallId, handler: HandlerId, one_way: bool },
    /// A caller's log: how the call to server `node` ended, and its reply.
    Ended { node: NodeId, call: CallId, state: CallState, result: &'a [u8] },
}

/// Why a log could not take a record.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum LogError {
    /// The log is full even after its live records were compacted.
    #[error("the call log is full ({capacity} bytes)")]
    Full { capacity: usize },
    /// The file under it failed.
    #[error("call log I/O failed: {0}")]
    Io(String),
}

/// Where a log stopped making sense.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum Torn {
    #[error("record at byte {at} runs past the end of the log")]
    Truncated { at: usize },
    #[error("record at byte {at} fails its checksum")]
    Checksum { at: usize },
    #[error("record at byte {at} is malformed: {why}")]
    Malformed { at: usize, why: &'static str },
}

/// The durable medium a server's decisions go to. The server writes a
/// record and only then acts on it, so what the log holds is never behind
/// what a caller saw.
pub trait CallLog {
    /// Append `record`, as durable as the log's sync policy makes it.
    /// `Full` when it does not fit: the server compacts and tries again.
    fn append(&mut self, record: &Record<'_>) -> Result<(), LogError>;

    /// Replace the whole log with `live` (what the server still needs), as
    /// one step: a crash leaves the old log or the new one, never a mix.
    fn compact(&mut self, live: &[Record<'_>]) -> Result<(), LogError>;

    /// The end of a batch of appends: the per-batch sync policy syncs here.
    fn flush(&mut self) -> Result<(), LogError> {
        Ok(())
    }
}

impl Record<'_> {
    /// Bytes the record takes in a log.
    pub fn len(&self) -> usize {
        RECORD_HEAD_LEN
            + match self {
                Record::Completed { result, .. } | Record::Ended { result, .. } => result.len(),
                _ => 0,
            }
    }

    /// Never: every record has a head. (For clippy's `len` convention.)
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Append the record to `out`.
    pub fn write(&self, out: &mut Vec<u8>) {
        let start = out.len();
        out.resize(start + self.len(), 0);
        self.write_to(&mut out[start..]);
    }

    /// Write the record into `out`, exactly `len()` bytes (a log file's
    /// mapping: no buffer between). The checksum goes in last, so a
    /// write cut short leaves a record that does not check.
    pub fn write_to(&self, out: &mut [u8]) {
        let (kind, aux, node, client, seq, handler, payload): (u8, u8, NodeId, u64, u64, HandlerId, &[u8]) =
            match *self {
                Record::Started { node, call, handler, one_way } => {
                    (STARTED, one_way as u8, node, call.client, call.seq, handler, &[])
                }
                Record::Completed { node, call, result } => {
                    (COMPLETED, 0, node, call.client, call.seq, 0, result)
                }
                Record::Refused { node, call, reason } => {
                    (REFUSED, reason as u8, node, call.client, call.seq, 0, &[])
                }
                Record::Forget { node, client, first_incomplete } => {
                    (FORGET, 0, node, client, first_incomplete, 0, &[])
                }
                Record::ForgetClients { node, below } => (FORGET_CLIENTS, 0, node, below, 0, 0, &[]),
                Record::Issued { node, call, handler, one_way } => {
                    (ISSUED, one_way as u8, node, call.client, call.seq, handler, &[])
                }
                Record::Ended { node, call, state, result } => {
                    (ENDED, 0, node, call.client, call.seq, state.to_bits(), result)
                }
            };
        let out = &mut out[..self.len()];
        out[0..4].copy_from_slice(&(self.len() as u32).to_le_bytes());
        out[8..12].copy_from_slice(&[kind, aux, 0, 0]);
        out[12..16].copy_from_slice(&node.to_le_bytes());
        out[16..24].copy_from_slice(&client.to_le_bytes());
        out[24..32].copy_from_slice(&seq.to_le_bytes());
        out[32..36].copy_from_slice(&handler.to_le_bytes());
        out[36..40].fill(0);
        out[RECORD_HEAD_LEN..].copy_from_slice(payload);
        let crc = crc32c::crc32c(&out[8..]);
        out[4..8].copy_from_slice(&crc.to_le_bytes());
    }

    /// Read the record at the start of `b`: it and its length, `None` at
    /// the log's end (zero length: bytes never written), or where it tore.
    pub fn parse(b: &[u8], at: usize) -> Result<Option<(Record<'_>, usize)>, Torn> {
        if b.len() < 4 {
            // Fewer bytes than a length: a file ends here, or a write tore.
            return if b.iter().all(|&x| x == 0) { Ok(None) } else { Err(Torn::Truncated { at }) };
        }
        let len = u32::from_le_bytes(b[0..4].try_into().expect("4 bytes")) as usize;
        if len == 0 {
            return Ok(None);
        }
        if len < RECORD_HEAD_LEN {
            return Err(Torn::Malformed { at, why: "shorter than a record head" });
        }
        if len > b.len() {
            return Err(Torn::Truncated { at });
        }
        let r = &b[..len];
        let crc = u32::from_le_bytes(r[4..8].try_into().expect("4 bytes"));
        if crc32c::crc32c(&r[8..]) != crc {
            return Err(Torn::Checksum { at });
        }
        let bad = |why| Err(Torn::Malformed { at, why });
        let (kind, aux) = (r[8], r[9]);
        if r[10] != 0 || r[11] != 0 || r[36..40] != [0; 4] {
            return bad("reserved bytes are not zero");
        }
        let u64_at = |i: usize| u64::from_le_bytes(r[i..i + 8].try_into().expect("8 bytes"));
        let node = u32::from_le_bytes(r[12..16].try_into().expect("4 bytes"));
        let (client, seq) = (u64_at(16), u64_at(24));
        let handler = u32::from_le_bytes(r[32..36].try_into().expect("4 bytes"));
        let call = CallId { client, seq };
        let payload = &r[RECORD_HEAD_LEN..];
        if !matches!(kind, COMPLETED | ENDED) && !payload.is_empty() {
            return bad("payload on a record that has none");
        }
        if !matches!(kind, STARTED | ISSUED | ENDED) && handler != 0 {
            return bad("handler on a record that has none");
        }
        let record = match (kind, aux) {
            (STARTED, 0 | 1) => Record::Started { node, call, handler, one_way: aux == 1 },
            (COMPLETED, 0) => Record::Completed { node, call, result: payload },
            (REFUSED, reason) => match reason {
                1 => Record::Refused { node, call, reason: Refusal::NotFound },
                4 => Record::Refused { node, call, reason: Refusal::NotRun },
                _ => return bad("a refusal that is never logged"),
            },
            (FORGET, 0) => Record::Forget { node, client, first_incomplete: seq },
            (FORGET_CLIENTS, 0) if seq == 0 => Record::ForgetClients { node, below: client },
            (ISSUED, 0 | 1) => Record::Issued { node, call, handler, one_way: aux == 1 },
            (ENDED, 0) => match CallState::from_bits(handler) {
                Some(state) => Record::Ended { node, call, state, result: payload },
                None => return bad("a call state no call has"),
            },
            _ => return bad("unknown kind or flags"),
        };
        Ok(Some((record, len)))
    }
}

/// Every whole record of `log`, in order, and where it tore if it did
/// (the records after a tear are lost with it: a log is written in order,
/// so only its tail can tear).
pub fn replay(log: &[u8]) -> (Vec<Record<'_>>, Option<Torn>) {
    let mut records = Vec::new();
    let mut at = 0;
    loop {
        match Record::parse(&log[at..], at) {
            Ok(Some((r, len))) => {
                records.push(r);
                at += len;
            }
            Ok(None) => return (records, None),
            Err(t) => return (records, Some(t)),
        }
    }
}

/// A log in memory, bounded in bytes: the simulator's durable medium (it
/// outlives the node it serves) and the tests'.
#[derive(Debug, Clone)]
pub struct MemLog {
    bytes: Vec<u8>,
    capacity: usize,
    /// Appends and compactions so far.
    pub appends: u64,
    pub compactions: u64,
}

impl MemLog {
    pub fn new(capacity: usize) -> Self {
        MemLog { bytes: Vec::new(), capacity, appends: 0, compactions: 0 }
    }

    /// What a restarted server reads.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Cut the log short, as a crash in the middle of a write leaves it.
    pub fn tear(&mut self, keep: usize) {
        self.bytes.truncate(keep);
    }
}

impl CallLog for MemLog {
    fn append(&mut self, record: &Record<'_>) -> Result<(), LogError> {
        if self.bytes.len() + record.len() > self.capacity {
            return Err(LogError::Full { capacity: self.capacity });
        }
        let end = self.bytes.len();
        record.write(&mut self.bytes);
        // A log only grows at its end, by the record, inside its bound.
        assert_eq!(self.bytes.len(), end + record.len(), "a record wrote other than its length");
        assert!(self.bytes.len() <= self.capacity, "the log past its capacity");
        self.appends += 1;
        Ok(())
    }

    fn compact(&mut self, live: &[Record<'_>]) -> Result<(), LogError> {
        let mut fresh = Vec::with_capacity(self.capacity.min(1 << 20));
        for r in live {
            r.write(&mut fresh);
        }
        if fresh.len() > self.capacity {
            return Err(LogError::Full { capacity: self.capacity });
        }
        self.bytes = fresh;
        assert!(self.bytes.len() <= self.capacity, "the log compacted past its capacity");
        self.compactions += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn every_kind() -> Vec<Record<'static>> {
        let call = CallId { client: 9, seq: 4 };
        vec![
            Record::Started { node: 3, call, handler: 12, one_way: false },
            Record::Started { node: 3, call, handler: 12, one_way: true },
            Record::Completed { node: 3, call, result: b"the reply" },
            Record::Completed { node: 3, call, result: b"" },
            Record::Refused { node: 3, call, reason: Refusal::NotFound },
            Record::Refused { node: 3, call, reason: Refusal::NotRun },
            Record::Forget { node: 3, client: 9, first_incomplete: 5 },
            Record::ForgetClients { node: 3, below: 9 },
            Record::Issued { node: 3, call, handler: 12, one_way: true },
            Record::Ended { node: 3, call, state: CallState::PROCESSED, result: b"the reply" },
            Record::Ended { node: 3, call, state: CallState::refused(Refusal::NotRun), result: b"" },
        ]
    }

    #[test]
    fn a_log_replays_what_was_written() {
        let mut log = Vec::new();
        every_kind().iter().for_each(|r| r.write(&mut log));
        let (records, torn) = replay(&log);
        assert_eq!(records, every_kind());
        assert_eq!(torn, None);
        // A file's zeroed tail ends it.
        log.extend_from_slice(&[0; 100]);
        assert_eq!(replay(&log), (every_kind(), None));
    }

    #[test]
    fn a_torn_or_damaged_tail_is_found_and_dropped() {
        let mut log = Vec::new();
        every_kind().iter().for_each(|r| r.write(&mut log));
        let last = every_kind().last().unwrap().len();
        let whole = every_kind().len();
        for cut in [1, 3, 5, 20, last - 1] {
            let (records, torn) = replay(&log[..log.len() - cut]);
            assert_eq!(records.len(), whole - 1, "cut {cut}");
            assert!(torn.is_some(), "cut {cut}");
        }
        let mut damaged = log.clone();
        let n = damaged.len();
        damaged[n - 10] ^= 0x40;
        let (records, torn) = replay(&damaged);
        assert_eq!(records.len(), whole - 1);
        assert!(matches!(torn, Some(Torn::Checksum { .. })));
    }

    #[test]
    fn a_mem_log_is_bounded_and_compacts_to_what_lives() {
        let mut log = MemLog::new(200);
        let r = Record::Started { node: 1, call: CallId { client: 1, seq: 1 }, handler: 1, one_way: false };
        for _ in 0..5 {
            log.append(&r).unwrap();
        }
        assert_eq!(log.append(&r), Err(LogError::Full { capacity: 200 }));
        log.compact(&[r]).unwrap();
        assert_eq!(replay(log.bytes()).0, vec![r]);
        log.append(&r).unwrap();
    }

    proptest! {
        /// Any bytes: records or a tear, never a panic; whatever parses
        /// writes back to the bytes it came from.
        #[test]
        fn any_bytes_replay_cleanly(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let (records, _) = replay(&bytes);
            let mut again = Vec::new();
            records.iter().for_each(|r| r.write(&mut again));
            prop_assert_eq!(&bytes[..again.len()], &again[..]);
        }
    }
}
