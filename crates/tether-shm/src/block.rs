//! A control block in shared memory: one cache line holding a version, a
//! fixed-size body and a CRC32C (docs/ENGINE.md, "Host-side backup").
//!
//! The writer (one at a time: the engine serving the block's owner) makes
//! the version odd, writes the body and the checksum, and makes the version
//! even again: a sequence lock. A reader that sees an odd version, or a
//! version that changed while it copied, has a torn block; one whose
//! checksum (over the version and the body) does not match has a damaged
//! one. Either way it gets a typed error and trusts nothing: a recovering
//! engine restores only state whose integrity it can check. A
//! writer that died mid-write leaves the version odd for good, which every
//! later reader sees as torn.

use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::Arc;

use crate::region::{Region, ALIGN};
use crate::ShmError;

/// Bytes of a block's body.
pub const BLOCK_BODY: usize = 48;
const BODY_AT: usize = 8;
const CRC_AT: usize = BODY_AT + BLOCK_BODY;

/// What a block holds: a fixed-size encoding, and a decoding that checks
/// every field it can (the checksum has passed by then, but a writer with
/// a bug could still have written nonsense).
pub trait BlockBody: Sized {
    fn encode(&self) -> [u8; BLOCK_BODY];
    fn decode(bytes: &[u8; BLOCK_BODY]) -> Result<Self, ShmError>;
}

/// One stream's host-side backup (Zhou et al. [FTGM] section 4.2: what the
/// host keeps so a restarted card resumes without loss or duplicates):
/// with the messages the application keeps, enough for a new engine to
/// restore the stream toward `peer`, not reset it (docs/ENGINE.md,
/// "Restore"; `tether_proto::StreamMarks`). The receive side needs no
/// block: the application knows where it stands in every peer's stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StreamBackup {
    pub peer: u32,
    /// The send stream's epoch (it changes when messages are abandoned).
    pub epoch: u32,
    /// The peer's incarnation as the handshake proved it (0: no session).
    pub peer_incarnation: u64,
    /// The datagram size agreed with the peer (0: none yet): unsettled
    /// messages are cut again at the fragment size it implies.
    pub max_datagram: u32,
    /// The packet number's high 32 bits, plus one: a restored engine
    /// starts past every packet number the dead one may have used.
    pub tx_pn_hi: u32,
    /// The first unsettled message, and where it starts in the stream.
    pub settled_msg: u64,
    pub settled_seq: u64,
    /// Every sequence number below this may have been sent: written before
    /// a datagram carrying a higher one leaves (record before send).
    pub sent_upto: u64,
}

impl BlockBody for StreamBackup {
    fn encode(&self) -> [u8; BLOCK_BODY] {
        let mut b = [0u8; BLOCK_BODY];
        for (i, w) in [self.peer, self.epoch, self.max_datagram, self.tx_pn_hi].into_iter().enumerate() {
            b[4 * i..4 * i + 4].copy_from_slice(&w.to_le_bytes());
        }
        for (i, w) in [self.peer_incarnation, self.settled_msg, self.settled_seq, self.sent_upto]
            .into_iter()
            .enumerate()
        {
            b[16 + 8 * i..24 + 8 * i].copy_from_slice(&w.to_le_bytes());
        }
        b
    }

    fn decode(b: &[u8; BLOCK_BODY]) -> Result<Self, ShmError> {
        let half = |i: usize| u32::from_le_bytes(b[4 * i..4 * i + 4].try_into().expect("4 bytes"));
        let word = |i: usize| u64::from_le_bytes(b[16 + 8 * i..24 + 8 * i].try_into().expect("8 bytes"));
        let s = StreamBackup {
            peer: half(0),
            epoch: half(1),
            max_datagram: half(2),
            tx_pn_hi: half(3),
            peer_incarnation: word(0),
            settled_msg: word(1),
            settled_seq: word(2),
            sent_upto: word(3),
        };
        if s.settled_seq > s.sent_upto {
            return Err(ShmError::BadField("settled beyond what was sent"));
        }
        if s.max_datagram > u16::MAX as u32 {
            return Err(ShmError::BadField("datagram size"));
        }
        Ok(s)
    }
}

/// A control block at a cache-line-aligned place in a region.
pub struct Block<B> {
    region: Arc<Region>,
    base: *mut u8,
    _body: core::marker::PhantomData<B>,
}

// SAFETY: `base` points into `region`, kept alive; concurrent access goes
// through the version's atomics and volatile copies that are validated.
unsafe impl<B> Send for Block<B> {}

impl<B> core::fmt::Debug for Block<B> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Block").field("region", &self.region.path()).finish()
    }
}

impl<B: BlockBody> Block<B> {
    /// Bytes a block takes in a region: one cache line.
    pub const FOOTPRINT: usize = ALIGN;

    /// The block at byte `at` of `region` (a new region's zeroes are a
    /// block never written).
    pub fn at(region: Arc<Region>, at: usize) -> Result<Self, ShmError> {
        let base = region.span(at, Self::FOOTPRINT)?;
        Ok(Block { region, base, _body: core::marker::PhantomData })
    }

    fn version(&self) -> &AtomicU64 {
        // SAFETY: the block's first 8 bytes, aligned, inside the region.
        unsafe { &*(self.base as *const AtomicU64) }
    }

    /// Write `body` (one writer at a time).
    pub fn write(&mut self, body: &B) {
        let v = self.version().load(Ordering::Relaxed);
        // From an odd version (a writer died mid-write) start a fresh even one.
        let odd = (v | 1).wrapping_add(if v % 2 == 1 { 2 } else { 0 });
        let done = odd.wrapping_add(1);
        // `v` is read from shared memory and may be anything (a writer that
        // died, a stray write): it is only moved on, never asserted on.
        // What this writer makes of it is its own: odd while it writes,
        // even once done.
        assert!(odd % 2 == 1 && done % 2 == 0, "the sequence lock's versions out of step");
        self.version().store(odd, Ordering::Relaxed);
        fence(Ordering::Release);
        let bytes = body.encode();
        let crc = checksum(done, &bytes);
        // SAFETY: body and checksum lie inside the block's cache line.
        unsafe {
            for (i, b) in bytes.iter().enumerate() {
                self.base.add(BODY_AT + i).write_volatile(*b);
            }
            (self.base.add(CRC_AT) as *mut u32).write_volatile(crc.to_le());
        }
        self.version().store(done, Ordering::Release);
    }

    /// The body, if one was ever written whole; `Torn` if a write is under
    /// way or its writer died in it, `BadChecksum` if the bytes were damaged.
    pub fn read(&self) -> Result<Option<B>, ShmError> {
        let v1 = self.version().load(Ordering::Acquire);
        let mut raw = [0u8; 64];
        for (i, b) in raw.iter_mut().enumerate() {
            // SAFETY: i < 64, inside the block's cache line in the region.
            *b = unsafe { self.base.add(i).read_volatile() };
        }
        fence(Ordering::Acquire);
        let v2 = self.version().load(Ordering::Relaxed);
        if v1 != v2 {
            return Err(ShmError::Torn);
        }
        raw[..8].copy_from_slice(&v1.to_le_bytes());
        Self::parse(&raw)
    }

    /// A block's 64 bytes as read from memory: version, body, checksum.
    /// What `read` does once it has a stable copy; public so it can be fuzzed.
    pub fn parse(raw: &[u8; 64]) -> Result<Option<B>, ShmError> {
        let version = u64::from_le_bytes(raw[..8].try_into().expect("8 bytes"));
        if version == 0 {
            return Ok(None);
        }
        if version % 2 == 1 {
            return Err(ShmError::Torn);
        }
        let body: &[u8; BLOCK_BODY] = raw[BODY_AT..CRC_AT].try_into().expect("the body");
        let crc = u32::from_le_bytes(raw[CRC_AT..CRC_AT + 4].try_into().expect("4 bytes"));
        if checksum(version, body) != crc {
            return Err(ShmError::BadChecksum);
        }
        B::decode(body).map(Some)
    }

    /// Overwrite a byte of the block (test and fault-injection hook).
    #[doc(hidden)]
    pub fn scribble(&mut self, at: usize, byte: u8) {
        // SAFETY: `at % 64` lies in the block's cache line.
        unsafe { self.base.add(at % 64).write_volatile(byte) };
    }

    /// Make the version odd, as a writer that died mid-write leaves it
    /// (test and fault-injection hook).
    #[doc(hidden)]
    pub fn tear(&mut self) {
        self.version().fetch_add(1, Ordering::AcqRel);
    }
}

fn checksum(version: u64, body: &[u8; BLOCK_BODY]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&version.to_le_bytes()), body)
}
