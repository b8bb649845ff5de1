//! Where a received payload lands: the receive half of the fused copy and
//! checksum (Trahay et al. [NMAD] section 5.2, "combining the checksum and
//! the memory copy wherever it happens"; docs/REFERENCES.md).
//!
//! The receiver copies every payload it keeps once anyway: out of the
//! receive buffer into the message the application will read. So instead
//! of verifying the datagram in one pass and copying in a second, the
//! verification itself copies each DATA payload to where it will live:
//! the next bytes of the message being reassembled when the frame continues
//! it in order (the stream lends that buffer's spare capacity, see
//! `RecvStream::continuation`), else a chunk of the landing arena. Nothing
//! is committed until the checksum has passed and the frame has been
//! accepted: a landing is written into spare capacity, and only
//! [`Landings::commit`] (arena) or the stream's `consume` (reassembly)
//! extends a buffer over it. A corrupted datagram's copies stay in spare
//! capacity and are overwritten by the next one.
//!
//! The landing arena is the endpoint's own, used for nothing else: its
//! landings are split off in frame order, so no other copy may slip in
//! between them.

use std::mem::MaybeUninit;

use bytes::BytesMut;
use tether_wire::{DataFrame, Landing};

use crate::delivery::ARENA_CHUNK;
use crate::message_pool::MessagePool;
use crate::recv_stream::{Landed, RecvStream};
use crate::Stats;

/// How one DATA frame's payload was placed during verification.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Placement {
    /// Only checksummed: the stream does not want it (a duplicate, or
    /// beyond the window), or there was no stream to ask.
    Checked,
    /// The next `len` bytes of the arena's spare capacity.
    Arena { len: usize },
    /// `len` bytes of the spare capacity the stream's reassembly buffer lent.
    Partial { len: usize },
}

/// The endpoint's scratch space for landings: the arena and the current
/// datagram's placements, both reused, so receiving allocates nothing once
/// they have grown.
#[derive(Debug, Default)]
pub(crate) struct LandingArea {
    arena: BytesMut,
    placements: Vec<Placement>,
}

impl LandingArea {
    /// A [`Landing`] for one datagram of `datagram_len` bytes (which bound
    /// its payloads: room is reserved without a walk over the frames, and
    /// up front, since growing the arena mid-datagram would move landings
    /// already written); `stream` is the receiving stream the (still
    /// unverified) header names, if any.
    pub fn lander<'s>(
        &'s mut self,
        datagram_len: usize,
        stream: Option<&'s mut RecvStream>,
        recv_window: usize,
        pool: &'s MessagePool,
    ) -> Lander<'s> {
        debug_assert!(self.arena.is_empty(), "every landing is committed or abandoned before the next");
        if self.arena.capacity() < datagram_len {
            self.arena.reserve(datagram_len.max(ARENA_CHUNK));
        }
        self.placements.clear();
        Lander { area: self, arena_used: 0, stream, recv_window: recv_window as u64, pool }
    }

    /// The verified datagram carried DATA frames.
    pub fn carried_data(&self) -> bool {
        !self.placements.is_empty()
    }

    /// Commit the arena landings of a datagram that passed verification:
    /// the arena now holds their bytes, in frame order.
    pub fn commit(&mut self) -> Landings<'_> {
        let used: usize =
            self.placements.iter().map(|p| if let Placement::Arena { len } = p { *len } else { 0 }).sum();
        debug_assert!(self.arena.is_empty() && self.arena.capacity() >= used);
        // SAFETY: `verify_landing` succeeded, so every landing was written
        // in full, and the arena landings are consecutive from the arena's
        // start (it was empty: the assertion above) over `used` bytes.
        unsafe { self.arena.set_len(used) };
        Landings { arena: &mut self.arena, placements: self.placements.iter() }
    }
}

/// The [`Landing`] handed to `Unverified::verify_landing`.
pub(crate) struct Lander<'s> {
    area: &'s mut LandingArea,
    arena_used: usize,
    stream: Option<&'s mut RecvStream>,
    recv_window: u64,
    /// Where a first fragment's message buffer comes from.
    pool: &'s MessagePool,
}

impl Landing for Lander<'_> {
    fn landing(&mut self, frame: &DataFrame<'_>) -> Option<&mut [MaybeUninit<u8>]> {
        let len = frame.payload.len();
        let first_frame = self.area.placements.is_empty();
        if let Some(stream) = self.stream.as_deref_mut() {
            if !stream.wants(frame.seq, self.recv_window) {
                self.area.placements.push(Placement::Checked);
                return None;
            }
            // Only the datagram's first frame can continue the message in
            // order: a later one would follow a frame not yet consumed.
            if first_frame {
                if let Some(buf) = stream.continuation(frame, self.pool) {
                    self.area.placements.push(Placement::Partial { len });
                    return Some(&mut buf.spare_capacity_mut()[..len]);
                }
            }
        }
        let at = self.arena_used;
        self.arena_used += len;
        self.area.placements.push(Placement::Arena { len });
        Some(&mut self.area.arena.spare_capacity_mut()[at..at + len])
    }
}

/// The verified datagram's landings, frame by frame, once it is accepted.
pub(crate) struct Landings<'p> {
    arena: &'p mut BytesMut,
    placements: std::slice::Iter<'p, Placement>,
}

impl Landings<'_> {
    /// The landing of the next DATA frame, in frame order: called once for
    /// every DATA frame, kept or not, so the arena splits stay aligned.
    pub fn next(&mut self, stats: &mut Stats) -> Landed {
        match self.placements.next() {
            Some(&Placement::Arena { len }) => {
                stats.bytes_landed += len as u64;
                Landed::Arena(self.arena.split_to(len).freeze())
            }
            Some(&Placement::Partial { len }) => {
                stats.bytes_landed += len as u64;
                Landed::Partial { len }
            }
            Some(Placement::Checked) | None => Landed::Nowhere,
        }
    }
}

impl Drop for Landings<'_> {
    fn drop(&mut self) {
        // Every landing was split off as its frame was visited; none may
        // linger into the next datagram's (a no-op unless a frame went
        // unvisited, e.g. a datagram dropped as stale after verification).
        self.arena.clear();
    }
}
