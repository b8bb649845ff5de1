//! A single-producer single-consumer ring of variable-length records in a
//! shared region: an application's submissions to its engine and the
//! engine's completions back (docs/ENGINE.md). Two monotonically increasing
//! byte positions, each written by one side only and on a cache line of its
//! own, bound the producer; a record is published by the release-store of
//! its header, written last, so a writer that dies mid-record leaves
//! nothing visible.
//!
//! Each record is a 16-byte header (a tag made from the record's position,
//! its length, and a CRC32C of position, length and payload) and the
//! payload, padded to 16 bytes. The producer writes the payload, then the
//! header, its tag last with release: that store publishes the record.
//! The consumer finds records by polling the tag at its position (Aeron's
//! ring buffers poll a header too), so a small record costs it one cache
//! line, not also the producer's position's; a header left from an earlier
//! lap carries another position, so nothing needs zeroing. A record never
//! wraps: one that would is preceded by a padding marker to the end of the
//! ring. The consumer checks every header against the ring's geometry and
//! every payload against its CRC before anything leaves the ring, so memory
//! a stray write damaged is a typed error
//! ([`ShmError::Corrupt`]), not a crash or a wrong message.
//!
//! The same goes for both positions: they are in the region too, where the
//! other process, crashed or hostile, or a stray write can leave anything.
//! Nothing read from the region is ever asserted on. The assertions here
//! are on this side's own arithmetic once those checks have passed: where
//! it is about to write a record, and what it is about to publish.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::region::{Region, ALIGN};
use crate::ShmError;

/// Bytes before the data: magic and capacity, then each side's position
/// on a cache line of its own.
pub const RING_HEADER: usize = 3 * ALIGN;

const MAGIC: u64 = u64::from_le_bytes(*b"tthRING1");
const TAIL_AT: usize = ALIGN;
const HEAD_AT: usize = 2 * ALIGN;
/// Record header: the record's tag (its position, inverted: see `tag`),
/// then its length field (u32) and CRC32C (u32).
const RECORD_HEADER: usize = 16;
/// The header's length field of a padding marker; a record's is its
/// length plus one, so that no header is 0 (records are far shorter).
const PAD: u32 = u32::MAX;

/// One side of a ring (`push` is the producer's, `pop` the consumer's; a
/// ring has one of each, in this process or another). Holds its region.
pub struct Ring {
    region: Arc<Region>,
    base: *mut u8,
    data: *mut u8,
    capacity: u64,
    /// The consumer's position as the producer last read it: re-read only
    /// when it says the ring is full, so the producer does not pull the
    /// consumer's cache line on every record.
    seen_head: u64,
}

// SAFETY: the pointers point into `region`, which the ring keeps alive;
// shared state is reached only through atomics, and record bytes only
// between positions that the atomics hand from one side to the other.
unsafe impl Send for Ring {}

impl core::fmt::Debug for Ring {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Ring").field("capacity", &self.capacity).field("region", &self.region.path()).finish()
    }
}

/// Records take multiples of 16 bytes, so every header starts 16-aligned
/// and a whole header fits before the end of the ring.
fn pad16(n: usize) -> usize {
    (n + 15) & !15
}

/// CRC32C of the record's position (8 bytes), length field (4 bytes, both
/// little-endian) and payload: a record checks only at its own position.
/// Small records, the common case between an application and its engine,
/// go straight to the SSE4.2 instruction: the crate's entry point costs
/// more than the checksum of a dozen bytes.
fn record_crc(pos: u64, len: u32, payload: &[u8]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if payload.len() <= SMALL && std::is_x86_feature_detected!("sse4.2") {
        // SAFETY: the CPU has SSE4.2, checked just above.
        return unsafe { small_crc(pos, len, payload) };
    }
    crc32c::crc32c_append(head_crc(pos, len), payload)
}

/// Records up to this long are copied, then checksummed by `small_crc`;
/// longer ones in one pass that does both (`tether_wire`'s fused kernel:
/// a 64 KiB message crosses two rings, and four separate checksum passes
/// over it were 10% of an engine stream's time in `perf`).
const SMALL: usize = 64;

/// CRC32C of a record's position and length field: where its payload's
/// checksum starts.
fn head_crc(pos: u64, len: u32) -> u32 {
    let mut head = [0u8; 12];
    head[..8].copy_from_slice(&pos.to_le_bytes());
    head[8..].copy_from_slice(&len.to_le_bytes());
    crc32c::crc32c(&head)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.2")]
unsafe fn small_crc(pos: u64, len: u32, payload: &[u8]) -> u32 {
    use core::arch::x86_64::{_mm_crc32_u32, _mm_crc32_u64, _mm_crc32_u8};
    let mut c = _mm_crc32_u64(u64::from(!0u32), pos) as u32;
    c = _mm_crc32_u32(c, len);
    let mut words = payload.chunks_exact(8);
    for w in &mut words {
        c = _mm_crc32_u64(u64::from(c), u64::from_le_bytes(w.try_into().expect("8 bytes"))) as u32;
    }
    for &b in words.remainder() {
        c = _mm_crc32_u8(c, b);
    }
    !c
}

impl Ring {
    /// Bytes a ring of `capacity` data bytes takes in a region.
    pub const fn footprint(capacity: usize) -> usize {
        RING_HEADER + capacity
    }

    /// Lay a new, empty ring of `capacity` bytes (a power of two, at least
    /// 64) at byte `at` of `region`.
    pub fn create(region: Arc<Region>, at: usize, capacity: usize) -> Result<Self, ShmError> {
        if !capacity.is_power_of_two() || capacity < 64 || capacity > u32::MAX as usize {
            return Err(ShmError::BadField("ring capacity: a power of two from 64 bytes to 4 GiB"));
        }
        let base = region.span(at, Self::footprint(capacity))?;
        let ring = Ring { base, data: ring_data(base), capacity: capacity as u64, region, seen_head: 0 };
        // No header anywhere: the region may have held a ring before.
        // SAFETY: the data span, checked above.
        unsafe { core::ptr::write_bytes(ring.data, 0, capacity) };
        ring.position(TAIL_AT).store(0, Ordering::Relaxed);
        ring.position(HEAD_AT).store(0, Ordering::Relaxed);
        // SAFETY: within the span checked above; 8-aligned (ALIGN-aligned base).
        unsafe {
            (base.add(8) as *mut u64).write_volatile(capacity as u64);
            // The magic last: a ring is only attachable once laid out.
            (*(base as *const AtomicU64)).store(MAGIC, Ordering::Release);
        }
        Ok(ring)
    }

    /// The ring at byte `at` of `region`, laid out by `create` (here or in
    /// another process): its magic and geometry are checked.
    pub fn attach(region: Arc<Region>, at: usize) -> Result<Self, ShmError> {
        let head = region.span(at, RING_HEADER)?;
        // SAFETY: within the header span; aligned.
        let (magic, capacity) = unsafe {
            (
                (*(head as *const AtomicU64)).load(Ordering::Acquire),
                (head.add(8) as *const u64).read_volatile(),
            )
        };
        if magic != MAGIC || !capacity.is_power_of_two() || !(64..=u32::MAX as u64).contains(&capacity) {
            return Err(ShmError::NotARing);
        }
        let base = region.span(at, Self::footprint(capacity as usize))?;
        Ok(Ring { base, data: ring_data(base), capacity, region, seen_head: 0 })
    }

    pub fn capacity(&self) -> usize {
        self.capacity as usize
    }

    /// The largest record `push` takes: a quarter of the ring, so a record
    /// and the padding before it always fit an empty ring.
    pub fn max_record(&self) -> usize {
        self.capacity as usize / 4 - RECORD_HEADER
    }

    fn position(&self, at: usize) -> &AtomicU64 {
        // SAFETY: `at` is TAIL_AT or HEAD_AT, inside the header, 8-aligned;
        // the region lives as long as `self`.
        unsafe { &*(self.base.add(at) as *const AtomicU64) }
    }

    /// Bytes written and not yet consumed.
    pub fn len(&self) -> usize {
        let tail = self.position(TAIL_AT).load(Ordering::Acquire);
        let head = self.position(HEAD_AT).load(Ordering::Acquire);
        tail.wrapping_sub(head) as usize
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Producer: whether a record of `len` bytes would be taken now (the
    /// consumer's position read afresh). For a producer that must not take
    /// a record from where it is kept before the ring has room for it.
    pub fn fits(&mut self, len: usize) -> bool {
        if len > self.max_record() {
            return false;
        }
        let need = RECORD_HEADER + pad16(len);
        let tail = self.position(TAIL_AT).load(Ordering::Relaxed);
        let to_end = self.capacity as usize - (tail & (self.capacity - 1)) as usize;
        let pad = if need > to_end { to_end } else { 0 };
        self.seen_head = self.position(HEAD_AT).load(Ordering::Acquire);
        self.capacity
            .checked_sub(tail.wrapping_sub(self.seen_head))
            .is_some_and(|free| pad + need <= free as usize)
    }

    /// Producer: append `record`; `Full` if the consumer has not made room.
    pub fn push(&mut self, record: &[u8]) -> Result<(), ShmError> {
        self.push_parts(&[], record)
    }

    /// Producer: append one record made of `prefix` then `body` (a
    /// message id before a payload, say) without joining them first.
    pub fn push_parts(&mut self, prefix: &[u8], body: &[u8]) -> Result<(), ShmError> {
        let len = prefix.len() + body.len();
        if len > self.max_record() {
            return Err(ShmError::RecordTooLarge(len));
        }
        let need = RECORD_HEADER + pad16(len);
        let tail = self.position(TAIL_AT).load(Ordering::Relaxed);
        let idx = (tail & (self.capacity - 1)) as usize;
        // Our own position, but in shared memory: one another process (or
        // a stray write) moved off the records' 16-byte grid would put a
        // header where no atomic may be.
        if !idx.is_multiple_of(16) {
            return Err(ShmError::Corrupt { at: tail, why: "producer position out of the ring's geometry" });
        }
        let to_end = self.capacity as usize - idx;
        let pad = if need > to_end { to_end } else { 0 };
        // The consumer's position is the other side's word: one beyond ours
        // (damaged memory, or a consumer fooled by it) is an error, not an
        // overflow.
        let free = |head: u64| self.capacity.checked_sub(tail.wrapping_sub(head)).map(|f| f as usize);
        if free(self.seen_head).is_none_or(|f| pad + need > f) {
            self.seen_head = self.position(HEAD_AT).load(Ordering::Acquire);
            let Some(free) = free(self.seen_head) else {
                return Err(ShmError::Corrupt {
                    at: self.seen_head,
                    why: "consumer position past the producer's",
                });
            };
            if pad + need > free {
                return Err(ShmError::Full { needed: pad + need, free });
            }
        }
        // What the checks above established, before anything is written:
        // the record and its padding fit the room the consumer released.
        assert!(free(self.seen_head).is_some_and(|f| pad + need <= f), "a record pushed past the consumer");
        let (mut at, mut pos) = (idx, tail);
        if pad > 0 {
            self.publish(at, pos, PAD, record_crc(pos, PAD, &[]));
            (at, pos) = (0, tail.wrapping_add(pad as u64));
        }
        // On the grid and before the end: a record never wraps.
        assert!(
            at.is_multiple_of(16) && at + need <= self.capacity as usize,
            "a record of {need} bytes placed at {at}, off the grid or past the end"
        );
        let field = len as u32 + 1;
        // SAFETY: `at + need <= capacity` (a record fits before the end, or
        // starts at 0 after the padding), in space the consumer has
        // released (its position, read with acquire above or before);
        // until the header is published below, no one else reads or
        // writes these bytes.
        let dst = unsafe { std::slice::from_raw_parts_mut(self.data.add(at + RECORD_HEADER), len) };
        let (head, rest) = dst.split_at_mut(prefix.len());
        head.copy_from_slice(prefix);
        let crc = if len <= SMALL {
            rest.copy_from_slice(body);
            record_crc(pos, field, dst)
        } else {
            let c = crc32c::crc32c_append(head_crc(pos, field), prefix);
            tether_wire::integrity::crc32c_copy(c, rest, body)
        };
        // The header last: storing its tag is what makes the record exist.
        self.publish(at, pos, field, crc);
        // For `len` and the producer's own next position; the consumer
        // finds records by their headers and never waits on this line.
        self.position(TAIL_AT).store(tail.wrapping_add((pad + need) as u64), Ordering::Release);
        Ok(())
    }

    /// Word `i` (0: the tag, 1: length field and checksum) of the header
    /// at `at`.
    fn header(&self, at: usize, i: usize) -> &AtomicU64 {
        // SAFETY: `at` is 16-aligned and `at + 16 <= capacity` (records and
        // markers start at 16-aligned offsets, which `push_parts` and `pop`
        // check of the positions they read, and take at least 16 bytes
        // before the end: `to_end` is a multiple of 16 as every record's
        // size is rounded to 16 and the capacity is a power of two of at
        // least 64, see `pad16`); the region lives as long as `self`.
        unsafe { &*(self.data.add(at + 8 * i) as *const AtomicU64) }
    }

    /// Store a header: its length field (`PAD`, or a record's length plus
    /// one) and checksum, then with release its tag, which publishes it.
    fn publish(&mut self, at: usize, pos: u64, field: u32, crc: u32) {
        self.header(at, 1).store(u64::from(field) | u64::from(crc) << 32, Ordering::Relaxed);
        self.header(at, 0).store(tag(pos), Ordering::Release);
    }

    /// Consumer: the length of the oldest record, if one is published, as
    /// its header says (past a padding marker): unchecked, for choosing the
    /// buffer `pop` is to fill, which checks the record.
    pub fn next_len(&self) -> Option<usize> {
        let mut head = self.position(HEAD_AT).load(Ordering::Relaxed);
        for _ in 0..2 {
            let idx = (head & (self.capacity - 1)) as usize;
            if !idx.is_multiple_of(16) || self.header(idx, 0).load(Ordering::Acquire) != tag(head) {
                return None;
            }
            let field = self.header(idx, 1).load(Ordering::Relaxed) as u32;
            if field != PAD {
                return Some(field.wrapping_sub(1) as usize);
            }
            head = head.wrapping_add((self.capacity as usize - idx) as u64);
        }
        None
    }

    /// Consumer: take the oldest record into `out` (cleared first); false
    /// if the ring is empty. The consumer polls the tag of the header at its
    /// position, on the same cache line as a small record's payload: a
    /// header left from an earlier lap has another tag. A record that does
    /// not check leaves the ring as it was and returns `Corrupt`.
    pub fn pop(&mut self, out: &mut Vec<u8>) -> Result<bool, ShmError> {
        let mut head = self.position(HEAD_AT).load(Ordering::Relaxed);
        loop {
            let idx = (head & (self.capacity - 1)) as usize;
            if !idx.is_multiple_of(16) {
                return Err(ShmError::Corrupt { at: head, why: "position out of the ring's geometry" });
            }
            if self.header(idx, 0).load(Ordering::Acquire) != tag(head) {
                return Ok(false);
            }
            let word = self.header(idx, 1).load(Ordering::Relaxed);
            let (field, crc) = (word as u32, (word >> 32) as u32);
            let to_end = self.capacity as usize - idx;
            if field == PAD {
                if record_crc(head, PAD, &[]) != crc {
                    return Err(ShmError::Corrupt { at: head, why: "padding checksum mismatch" });
                }
                head = head.wrapping_add(to_end as u64);
                self.position(HEAD_AT).store(head, Ordering::Release);
                continue;
            }
            let len = field.wrapping_sub(1) as usize;
            let need = RECORD_HEADER + pad16(len);
            if len > self.max_record() || need > to_end {
                return Err(ShmError::Corrupt { at: head, why: "record length out of bounds" });
            }
            // The header checked out against the geometry: what is copied
            // below lies inside the ring.
            assert!(idx + need <= self.capacity as usize, "a record taken from past the ring's end");
            out.clear();
            out.reserve(len);
            let found = if len <= SMALL {
                // SAFETY: `idx + need <= capacity`, checked above; `out` has
                // room for `len` bytes, which are then initialised.
                unsafe {
                    core::ptr::copy_nonoverlapping(self.data.add(idx + RECORD_HEADER), out.as_mut_ptr(), len);
                    out.set_len(len);
                }
                record_crc(head, field, out)
            } else {
                // SAFETY: as above; the producer does not touch a published
                // record until this side releases it. The checksum is of the
                // bytes as copied (each read once), so what `out` holds is
                // what was checked, whatever else writes the ring meanwhile.
                let src = unsafe { std::slice::from_raw_parts(self.data.add(idx + RECORD_HEADER), len) };
                let c = tether_wire::integrity::crc32c_copy_uninit(
                    head_crc(head, field),
                    &mut out.spare_capacity_mut()[..len],
                    src,
                );
                // SAFETY: `crc32c_copy_uninit` wrote all `len` bytes.
                unsafe { out.set_len(len) };
                c
            };
            if found != crc {
                out.clear();
                return Err(ShmError::Corrupt { at: head, why: "record checksum mismatch" });
            }
            self.position(HEAD_AT).store(head.wrapping_add(need as u64), Ordering::Release);
            return Ok(true);
        }
    }

    /// Overwrite `len` data bytes at `at` (test and fault-injection hook:
    /// a stray write into the ring's memory).
    #[doc(hidden)]
    pub fn scribble(&mut self, at: usize, bytes: &[u8]) {
        let at = at % self.capacity as usize;
        let n = bytes.len().min(self.capacity as usize - at);
        // SAFETY: `at + n <= capacity`.
        unsafe { core::ptr::copy_nonoverlapping(bytes.as_ptr(), self.data.add(at), n) };
    }
}

/// A header's tag for position `pos`: its bits inverted, so a zeroed ring
/// holds no header (the first position is 0) and a header from an earlier
/// lap (another position) is not taken for the current one.
fn tag(pos: u64) -> u64 {
    !pos
}

fn ring_data(base: *mut u8) -> *mut u8 {
    // SAFETY: the callers checked that the region spans the whole ring.
    unsafe { base.add(RING_HEADER) }
}
