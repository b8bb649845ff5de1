//! Where a received payload lands: the receive half of the fused copy and
//! checksum (seeds/003 section 5.2, "combining the checksum and the memory
//! copy wherever it happens").
//!
//! The receiver copies every payload it keeps once anyway: out of the
//! receive buffer into the message the application will read. So instead
//! of verifying the datagram in one pass and copying in a second, the
//! verification itself copies each DATA payload to where it will live:
//! the next bytes of the message being reassembled when the frame continues
//! it in order, else a chunk of the receive arena. Nothing is committed
//! until the checksum has passed and the frame has been accepted: a
//! landing in an arena or a reassembly buffer is written into spare
//! capacity, and only `commit` (arena) or `consume` (reassembly, see
//! [`Landed::Partial`]) extends the buffer over it. A corrupted datagram's
//! copies stay in spare capacity and are overwritten by the next one.
//!
//! The landing arena is the endpoint's own, used for nothing else: its
//! landings are split off in frame order, so no other copy may slip in
//! between them.

use std::mem::MaybeUninit;

use bytes::{Bytes, BytesMut};
use tether_wire::{DataFrame, Landing};

use crate::recv_stream::{copy_to_bytes, RecvStream};
use crate::{Config, Stats};

/// Arena chunks are allocated at least this large, so most datagrams land
/// in space already there (one allocation per chunk, not per message).
const ARENA_CHUNK: usize = 64 * 1024;

/// How one DATA frame's payload was placed during verification.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Placement {
    /// Only checksummed: the stream does not want it (a duplicate, or
    /// beyond the window), or there was no stream to ask.
    Checked,
    /// The next `len` bytes of the arena's spare capacity.
    Arena { len: usize },
    /// `len` bytes of the spare capacity of the stream's reassembly
    /// buffer, ending at this address.
    Partial { end_addr: usize, len: usize },
}

/// A verified payload's landing, handed to the stream with its frame.
#[derive(Debug)]
pub(crate) enum Landed {
    /// Not copied: the stream copies from the datagram if it keeps it.
    Nowhere,
    /// Copied and committed: the stream keeps these bytes as they are.
    Arena(Bytes),
    /// Written into the reassembly buffer's spare capacity, ending at
    /// `end_addr`. The stream extends the buffer over it only if the
    /// buffer still ends where the payload began: proof that it is the
    /// same buffer, untouched since.
    Partial { end_addr: usize },
}

impl Landed {
    /// The payload as bytes of its own: the landing itself, or else a copy
    /// of `payload` (from the verified datagram) into `arena`, counted.
    pub fn into_bytes(self, payload: &[u8], arena: &mut BytesMut, stats: &mut Stats) -> Bytes {
        match self {
            Landed::Arena(bytes) => bytes,
            Landed::Nowhere | Landed::Partial { .. } => {
                stats.bytes_copied_after_verify += payload.len() as u64;
                copy_to_bytes(arena, payload)
            }
        }
    }
}

/// The [`Landing`] the endpoint hands to `Unverified::verify_landing`.
pub(crate) struct Lander<'s> {
    arena: &'s mut BytesMut,
    arena_used: usize,
    stream: Option<&'s mut RecvStream>,
    recv_window: u64,
    placements: &'s mut Vec<Placement>,
}

impl<'s> Lander<'s> {
    /// Room is reserved in `arena` for `payload_bytes`, at least the DATA
    /// payloads of the datagram (reserved up front: growing the arena
    /// mid-datagram would move landings already written); `stream` is the
    /// receiving stream the (still unverified) header names, if any.
    pub fn new(
        arena: &'s mut BytesMut,
        payload_bytes: usize,
        stream: Option<&'s mut RecvStream>,
        config: &Config,
        placements: &'s mut Vec<Placement>,
    ) -> Self {
        debug_assert!(arena.is_empty(), "every landing is committed or abandoned before the next");
        if arena.capacity() < payload_bytes {
            arena.reserve(payload_bytes.max(ARENA_CHUNK));
        }
        placements.clear();
        Lander { arena, arena_used: 0, stream, recv_window: config.recv_window as u64, placements }
    }
}

impl Landing for Lander<'_> {
    fn landing(&mut self, frame: &DataFrame<'_>) -> Option<&mut [MaybeUninit<u8>]> {
        let len = frame.payload.len();
        let first_frame = self.placements.is_empty();
        if let Some(stream) = self.stream.as_deref_mut() {
            if !stream.wants(frame.seq, self.recv_window) {
                self.placements.push(Placement::Checked);
                return None;
            }
            // Only the datagram's first frame can continue the message in
            // order: a later one would follow a frame not yet consumed.
            if first_frame {
                if let Some(buf) = stream.continuation(frame) {
                    let end_addr = buf.as_ptr() as usize + buf.len() + len;
                    self.placements.push(Placement::Partial { end_addr, len });
                    return Some(&mut buf.spare_capacity_mut()[..len]);
                }
            }
        }
        let at = self.arena_used;
        self.arena_used += len;
        self.placements.push(Placement::Arena { len });
        Some(&mut self.arena.spare_capacity_mut()[at..at + len])
    }
}

/// The verified datagram's landings, frame by frame, once it is accepted.
pub(crate) struct Landings<'p> {
    placements: std::slice::Iter<'p, Placement>,
}

impl<'p> Landings<'p> {
    /// Commit the arena landings of a datagram that passed verification
    /// with `placements`: the arena now holds their bytes, in frame order.
    pub fn commit(arena: &mut BytesMut, placements: &'p [Placement]) -> Self {
        let used: usize =
            placements.iter().map(|p| if let Placement::Arena { len } = p { *len } else { 0 }).sum();
        debug_assert!(arena.is_empty() && arena.capacity() >= used);
        // SAFETY: `verify_landing` succeeded, so every landing was written
        // in full, and the arena landings are consecutive from the arena's
        // start (it was empty: the assertion above) over `used` bytes.
        unsafe { arena.set_len(used) };
        Landings { placements: placements.iter() }
    }

    /// The landing of the next DATA frame, in frame order: called once for
    /// every DATA frame, kept or not, so the arena splits stay aligned.
    pub fn next(&mut self, arena: &mut BytesMut, stats: &mut Stats) -> Landed {
        match self.placements.next() {
            Some(&Placement::Arena { len }) => {
                stats.bytes_landed += len as u64;
                Landed::Arena(arena.split_to(len).freeze())
            }
            Some(&Placement::Partial { end_addr, len }) => {
                stats.bytes_landed += len as u64;
                Landed::Partial { end_addr }
            }
            Some(Placement::Checked) | None => Landed::Nowhere,
        }
    }
}
