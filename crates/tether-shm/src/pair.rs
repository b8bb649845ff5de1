//! A direct path between two applications attached to one engine
//! (docs/ENGINE.md, "The direct path"): a region with one ring each way,
//! laid out by the engine and then used by the two applications alone, so
//! a message between them crosses shared memory once and neither the
//! engine nor the kernel. Aeron's IPC publications are the model: a log
//! both sides map, with the driver out of the data path.
//!
//! Layout (cache lines): the header (magic, the two nodes, the rings'
//! capacity); per side a line with its "waiting" flag (the Dekker
//! handshake of [`Control`]) and the count of messages it has taken from
//! the other side's ring (which settles them at the sender); then the ring
//! from the lower node to the higher, then the other.
//!
//! What the region is trusted for: nothing beyond its checks. The rings
//! check every record; the counts are hints a sender bounds by what it
//! sent; the header is checked against the file and the nodes the engine
//! named.

use std::path::Path;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use crate::region::{Region, ALIGN};
use crate::{Control, Ring, ShmError, RING_HEADER};

const MAGIC: u64 = u64::from_le_bytes(*b"tthPAIR1");
/// Header, then one line per side.
const SIDES_AT: usize = ALIGN;
const RINGS_AT: usize = 3 * ALIGN;
/// Within a side's line: its waiting flag, then the messages it took.
const WAITING: usize = 0;
const TAKEN: usize = 8;
// The header and both sides' lines come before the rings.
const _: () = assert!(SIDES_AT >= ALIGN && SIDES_AT + 2 * ALIGN <= RINGS_AT);

/// One application's end of a direct path: its ring to the other, the
/// other's ring to it, and the words they share.
pub struct PairEnd {
    region: Arc<Region>,
    /// This side's node and the other's.
    pub me: u32,
    pub peer: u32,
    /// Records this side produces, and those it consumes.
    pub tx: Ring,
    pub rx: Ring,
    /// Offsets of this side's line and the other's.
    mine: usize,
    theirs: usize,
}

impl std::fmt::Debug for PairEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PairEnd").field("me", &self.me).field("peer", &self.peer).finish()
    }
}

// SAFETY: the words are reached only through atomics; the rings are Send.
unsafe impl Send for PairEnd {}

/// The bytes of a pair region whose rings hold `capacity` bytes each.
pub fn pair_len(capacity: usize) -> usize {
    RINGS_AT + 2 * Ring::footprint(capacity)
}

fn ring_at(capacity: usize, from_low: bool) -> usize {
    if from_low {
        RINGS_AT
    } else {
        RINGS_AT + RING_HEADER + capacity
    }
}

/// The engine's side: lay out a new pair region at `path` for nodes `a`
/// and `b` (in either order), rings of `capacity` bytes (a power of two).
pub fn create_pair(path: &Path, a: u32, b: u32, capacity: usize) -> Result<(), ShmError> {
    if a == b {
        return Err(ShmError::BadField("a pair of one node"));
    }
    let (lo, hi) = (a.min(b), a.max(b));
    // The second ring ends where the region does.
    assert_eq!(ring_at(capacity, false) + Ring::footprint(capacity), pair_len(capacity), "pair layout");
    let region = Arc::new(Region::create(path, pair_len(capacity))?);
    Ring::create(region.clone(), ring_at(capacity, true), capacity)?;
    Ring::create(region.clone(), ring_at(capacity, false), capacity)?;
    let head = region.span(0, ALIGN)?;
    // SAFETY: the header line, checked by `span`; 8-aligned.
    unsafe {
        (head.add(8) as *mut u32).write_volatile(lo);
        (head.add(12) as *mut u32).write_volatile(hi);
        (head.add(16) as *mut u64).write_volatile(capacity as u64);
        // The magic last: the region is only openable once laid out.
        (*(head as *const AtomicU64)).store(MAGIC, Ordering::Release);
    }
    Ok(())
}

impl PairEnd {
    /// Open the pair region at `path` as node `me`, whose peer must be
    /// `peer`: the header, the file's length and both rings checked.
    pub fn open(path: &Path, me: u32, peer: u32) -> Result<Self, ShmError> {
        let region = Arc::new(Region::open(path)?);
        let head = region.span(0, ALIGN)?;
        // SAFETY: the header line, checked by `span`; aligned.
        let (magic, lo, hi, capacity) = unsafe {
            (
                (*(head as *const AtomicU64)).load(Ordering::Acquire),
                (head.add(8) as *const u32).read_volatile(),
                (head.add(12) as *const u32).read_volatile(),
                (head.add(16) as *const u64).read_volatile(),
            )
        };
        if magic != MAGIC {
            return Err(ShmError::BadField("not a pair region"));
        }
        if (lo, hi) != (me.min(peer), me.max(peer)) || me == peer {
            return Err(ShmError::BadField("a pair region of other nodes"));
        }
        let capacity = usize::try_from(capacity).map_err(|_| ShmError::NotARing)?;
        if !capacity.is_power_of_two() || capacity > u32::MAX as usize {
            return Err(ShmError::NotARing);
        }
        if region.len() < pair_len(capacity) {
            return Err(ShmError::TooSmall { needed: pair_len(capacity), got: region.len() });
        }
        let low = me == lo;
        let tx = Ring::attach(region.clone(), ring_at(capacity, low))?;
        let rx = Ring::attach(region.clone(), ring_at(capacity, !low))?;
        if tx.capacity() != capacity || rx.capacity() != capacity {
            return Err(ShmError::NotARing);
        }
        let line = |low: bool| SIDES_AT + if low { 0 } else { ALIGN };
        Ok(PairEnd { region, me, peer, tx, rx, mine: line(low), theirs: line(!low) })
    }

    fn word32(&self, line: usize, at: usize) -> &AtomicU32 {
        assert!(line + at + 4 <= RINGS_AT, "a side's word past its line");
        // SAFETY: `line + at + 4 <= RINGS_AT <= region.len()` (checked at
        // open), 4-aligned in a page-aligned mapping; lives with `self`.
        unsafe { &*(self.region.base().add(line + at) as *const AtomicU32) }
    }

    fn word64(&self, line: usize, at: usize) -> &AtomicU64 {
        assert!(line + at + 8 <= RINGS_AT, "a side's word past its line");
        // SAFETY: as `word32`, 8-aligned.
        unsafe { &*(self.region.base().add(line + at) as *const AtomicU64) }
    }

    /// This side is (about to be) asleep: the other wakes it after pushing
    /// (see [`Control::before_sleep`]).
    pub fn my_waiting(&self) -> &AtomicU32 {
        self.word32(self.mine, WAITING)
    }

    /// Whether the other side sleeps and must be woken, after a push
    /// ([`Control::should_wake`]).
    pub fn peer_needs_waking(&self) -> bool {
        Control::should_wake(self.word32(self.theirs, WAITING))
    }

    /// Record that this side has taken `n` messages from its ring in all.
    pub fn set_taken(&self, n: u64) {
        self.word64(self.mine, TAKEN).store(n, Ordering::Release);
    }

    /// How many messages the other side says it has taken from this side's
    /// ring: a hint, to be bounded by what was sent.
    pub fn peer_taken(&self) -> u64 {
        self.word64(self.theirs, TAKEN).load(Ordering::Acquire)
    }

    pub fn path(&self) -> &Path {
        self.region.path()
    }
}
