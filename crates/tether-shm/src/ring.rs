//! A single-producer single-consumer ring of variable-length records in a
//! shared region: an application's submissions to its engine and the
//! engine's completions back (docs/ENGINE.md). The same design as Aeron's
//! and io_uring's rings: two monotonically increasing byte positions, each
//! written by one side only and on a cache line of its own; a record is
//! published by the release-store of the producer's position, so a writer
//! that dies mid-record leaves nothing visible.
//!
//! Each record is an 8-byte header (payload length, CRC32C of length and
//! payload) and the payload, padded to 8 bytes. A record never wraps: one
//! that would is preceded by a padding marker to the end of the ring. The
//! consumer checks every header against the ring's geometry and every
//! payload against its CRC before anything leaves the ring, so memory a
//! stray write damaged is a typed error ([`ShmError::Corrupt`]), not a
//! crash or a wrong message.

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
/// Record header: length (u32), CRC32C (u32).
const RECORD_HEADER: usize = 8;
/// The length of a padding marker.
const PAD: u32 = u32::MAX;

/// One side of a ring (`push` is the producer's, `pop` the consumer's; a
/// ring has one of each, in this process or another). Holds its region.
pub struct Ring {
    region: Arc<Region>,
    base: *mut u8,
    data: *mut u8,
    capacity: u64,
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

fn pad8(n: usize) -> usize {
    (n + 7) & !7
}

fn record_crc(len: u32, payload: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&len.to_le_bytes()), payload)
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
        let ring = Ring { base, data: ring_data(base), capacity: capacity as u64, region };
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
        Ok(Ring { base, data: ring_data(base), capacity, region })
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

    /// Producer: append `record`; `Full` if the consumer has not made room.
    pub fn push(&mut self, record: &[u8]) -> Result<(), ShmError> {
        if record.len() > self.max_record() {
            return Err(ShmError::RecordTooLarge(record.len()));
        }
        let need = RECORD_HEADER + pad8(record.len());
        let tail = self.position(TAIL_AT).load(Ordering::Relaxed);
        let head = self.position(HEAD_AT).load(Ordering::Acquire);
        let idx = (tail & (self.capacity - 1)) as usize;
        let to_end = self.capacity as usize - idx;
        let pad = if need > to_end { to_end } else { 0 };
        let free = (self.capacity - tail.wrapping_sub(head)) as usize;
        if pad + need > free {
            return Err(ShmError::Full { needed: pad + need, free });
        }
        let mut at = idx;
        if pad > 0 {
            self.write_header(at, PAD, 0);
            at = 0;
        }
        self.write_header(at, record.len() as u32, record_crc(record.len() as u32, record));
        // SAFETY: `at + need <= capacity` (a record fits before the end, or
        // starts at 0 after the padding); the consumer does not read bytes
        // between head and tail-to-be until the release below.
        unsafe {
            core::ptr::copy_nonoverlapping(record.as_ptr(), self.data.add(at + RECORD_HEADER), record.len())
        };
        self.position(TAIL_AT).store(tail + (pad + need) as u64, Ordering::Release);
        Ok(())
    }

    fn write_header(&mut self, at: usize, len: u32, crc: u32) {
        let word = u64::from(len) | u64::from(crc) << 32;
        // SAFETY: `at` is 8-aligned and `at + 8 <= capacity` (records and
        // markers start at 8-aligned offsets of a capacity that is a
        // multiple of 8).
        unsafe { (self.data.add(at) as *mut u64).write_volatile(word.to_le()) };
    }

    /// Consumer: take the oldest record into `out` (cleared first); false
    /// if the ring is empty. A record that does not check leaves the ring
    /// as it was and returns `Corrupt`.
    pub fn pop(&mut self, out: &mut Vec<u8>) -> Result<bool, ShmError> {
        let mut head = self.position(HEAD_AT).load(Ordering::Relaxed);
        let tail = self.position(TAIL_AT).load(Ordering::Acquire);
        loop {
            let ready = tail.wrapping_sub(head);
            if ready == 0 {
                return Ok(false);
            }
            if ready > self.capacity || !ready.is_multiple_of(8) {
                return Err(ShmError::Corrupt { at: head, why: "positions out of the ring's geometry" });
            }
            let idx = (head & (self.capacity - 1)) as usize;
            // SAFETY: `idx` is 8-aligned (positions advance by multiples of
            // 8, checked above) and below the capacity.
            let word = u64::from_le(unsafe { (self.data.add(idx) as *const u64).read_volatile() });
            let (len, crc) = (word as u32, (word >> 32) as u32);
            let to_end = self.capacity as usize - idx;
            if len == PAD {
                if (to_end as u64) > ready {
                    return Err(ShmError::Corrupt { at: head, why: "padding past the written bytes" });
                }
                head += to_end as u64;
                self.position(HEAD_AT).store(head, Ordering::Release);
                continue;
            }
            let len = len as usize;
            let need = RECORD_HEADER + pad8(len);
            if len > self.max_record() || need > to_end || need as u64 > ready {
                return Err(ShmError::Corrupt { at: head, why: "record length out of bounds" });
            }
            out.clear();
            out.reserve(len);
            // SAFETY: `idx + need <= capacity`, checked above; `out` has
            // room for `len` bytes, which are then initialised.
            unsafe {
                core::ptr::copy_nonoverlapping(self.data.add(idx + RECORD_HEADER), out.as_mut_ptr(), len);
                out.set_len(len);
            }
            if record_crc(len as u32, out) != crc {
                out.clear();
                return Err(ShmError::Corrupt { at: head, why: "record checksum mismatch" });
            }
            self.position(HEAD_AT).store(head + need as u64, Ordering::Release);
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

fn ring_data(base: *mut u8) -> *mut u8 {
    // SAFETY: the callers checked that the region spans the whole ring.
    unsafe { base.add(RING_HEADER) }
}
