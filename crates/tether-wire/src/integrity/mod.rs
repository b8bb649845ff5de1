//! Checksums over header and payload (Trahay et al. [NMAD] section 5).
//!
//! The algorithm is named in every header, so a receiver verifies with the
//! sender's choice (and may refuse algorithms it does not accept). The set is
//! that of Trahay et al. [NMAD] Figure 4 brought up to date: none, plain sum,
//! xor, Adler-32, Fletcher-64, FNV-1a, MurmurHash3, xxHash3 and CRC32C.
//!
//! Where the data path copies anyway, the checksum is computed in the same
//! pass ([`Checksummer::copy_update`]): single-pass loops for the word
//! folds and CRC32C, and for the others a copy blocked at [`BLOCK`] bytes
//! whose checksum reads the block while it is still in L1. The two-pass
//! variant ([`Checksummer::copy_then_update`]) stays callable so the bench
//! can show what fusing saves.

use core::mem::MaybeUninit;

mod auth;
mod crc;
mod words;

pub use auth::{AuthKind, MacKey, TAG_LEN};

pub use crc::{
    crc32c_copy, crc32c_copy_blocked, crc32c_copy_uninit, crc32c_copy_with, has_fused_crc32c, CrcCopyKernel,
};
pub use words::{Fletcher64, Fnv1a64, Murmur3, Sum64, Xor64};

/// Blocking of the fused copy for algorithms without a single-pass loop:
/// a block and its copy fit in a 32 KiB L1 data cache together.
pub const BLOCK: usize = 8 * 1024;

/// Checksum algorithm, as named on the wire (header byte 4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(u8)]
pub enum ChecksumKind {
    None = 0,
    /// CRC32C (Castagnoli, RFC 3720): the SSE4.2 instruction or a table.
    #[default]
    Crc32c = 1,
    /// Wrapping sum of little-endian 64-bit words.
    Sum = 2,
    /// Xor of little-endian 64-bit words.
    Xor = 3,
    /// Adler-32 (RFC 1950), from the adler2 crate.
    Adler32 = 4,
    /// Fletcher-64 over little-endian 32-bit words.
    Fletcher64 = 5,
    /// FNV-1a, 64-bit.
    Fnv1a = 6,
    /// MurmurHash3 x86_32, seed 0.
    Murmur3 = 7,
    /// xxHash3 (XXH3_64bits, seed 0), from the xxhash-rust crate.
    Xxh3 = 8,
}

impl ChecksumKind {
    pub const ALL: [ChecksumKind; 9] = [
        ChecksumKind::None,
        ChecksumKind::Crc32c,
        ChecksumKind::Sum,
        ChecksumKind::Xor,
        ChecksumKind::Adler32,
        ChecksumKind::Fletcher64,
        ChecksumKind::Fnv1a,
        ChecksumKind::Murmur3,
        ChecksumKind::Xxh3,
    ];

    pub fn from_u8(v: u8) -> Option<Self> {
        Self::ALL.get(v as usize).copied()
    }

    pub fn name(self) -> &'static str {
        match self {
            ChecksumKind::None => "none",
            ChecksumKind::Crc32c => "crc32c",
            ChecksumKind::Sum => "sum",
            ChecksumKind::Xor => "xor",
            ChecksumKind::Adler32 => "adler32",
            ChecksumKind::Fletcher64 => "fletcher64",
            ChecksumKind::Fnv1a => "fnv1a",
            ChecksumKind::Murmur3 => "murmur3",
            ChecksumKind::Xxh3 => "xxh3",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.name() == name)
    }

    /// Bytes of the trailer: the checksum's own width. `none` keeps a
    /// 4-byte trailer that must be zero, so a flipped kind byte cannot
    /// turn verification off unnoticed.
    pub const fn width(self) -> usize {
        match self {
            ChecksumKind::None | ChecksumKind::Crc32c | ChecksumKind::Adler32 | ChecksumKind::Murmur3 => 4,
            ChecksumKind::Sum
            | ChecksumKind::Xor
            | ChecksumKind::Fletcher64
            | ChecksumKind::Fnv1a
            | ChecksumKind::Xxh3 => 8,
        }
    }

    /// Checksum of the concatenation of `parts`.
    pub fn compute(self, parts: &[&[u8]]) -> u64 {
        let mut c = Checksummer::new(self);
        for p in parts {
            c.update(p);
        }
        c.finish()
    }
}

/// A set of checksum kinds (what a receiver accepts).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ChecksumSet(u16);

impl ChecksumSet {
    pub const fn empty() -> Self {
        ChecksumSet(0)
    }
    pub fn only(kind: ChecksumKind) -> Self {
        Self::empty().with(kind)
    }
    /// Every algorithm but `none`.
    pub fn checked() -> Self {
        ChecksumKind::ALL[1..].iter().fold(Self::empty(), |s, &k| s.with(k))
    }
    pub const fn with(self, kind: ChecksumKind) -> Self {
        ChecksumSet(self.0 | 1 << kind as u8)
    }
    pub fn contains(self, kind: ChecksumKind) -> bool {
        self.0 & 1 << kind as u8 != 0
    }
    pub fn iter(self) -> impl Iterator<Item = ChecksumKind> {
        ChecksumKind::ALL.into_iter().filter(move |&k| self.contains(k))
    }
}

/// A checksum in progress: fed in pieces, equal to the checksum of their
/// concatenation. One lives on the stack for one datagram; every state but
/// xxh3's is inline, so no other checksum allocates.
#[derive(Clone)]
pub enum Checksummer {
    None,
    Crc32c(u32),
    Sum(Sum64),
    Xor(Xor64),
    Adler32(adler2::Adler32),
    Fletcher64(Fletcher64),
    Fnv1a(Fnv1a64),
    Murmur3(Murmur3),
    /// Boxed: xxh3's streaming state is 576 bytes, and every datagram's
    /// writer moves its checksummer (inline it made the writer 704 bytes,
    /// copied twice a datagram: 8% of the core's 8 B round trip with the
    /// default CRC32C). A datagram checksummed with xxh3 pays an
    /// allocation instead.
    Xxh3(Box<xxhash_rust::xxh3::Xxh3>),
}

impl Checksummer {
    pub fn new(kind: ChecksumKind) -> Self {
        match kind {
            ChecksumKind::None => Checksummer::None,
            ChecksumKind::Crc32c => Checksummer::Crc32c(0),
            ChecksumKind::Sum => Checksummer::Sum(Sum64::default()),
            ChecksumKind::Xor => Checksummer::Xor(Xor64::default()),
            ChecksumKind::Adler32 => Checksummer::Adler32(adler2::Adler32::new()),
            ChecksumKind::Fletcher64 => Checksummer::Fletcher64(Fletcher64::default()),
            ChecksumKind::Fnv1a => Checksummer::Fnv1a(Fnv1a64::default()),
            ChecksumKind::Murmur3 => Checksummer::Murmur3(Murmur3::default()),
            ChecksumKind::Xxh3 => Checksummer::Xxh3(Box::new(xxhash_rust::xxh3::Xxh3::new())),
        }
    }

    pub fn update(&mut self, data: &[u8]) {
        match self {
            Checksummer::None => {}
            Checksummer::Crc32c(c) => *c = crc32c::crc32c_append(*c, data),
            Checksummer::Sum(s) => s.update(data),
            Checksummer::Xor(s) => s.update(data),
            Checksummer::Adler32(s) => s.write_slice(data),
            Checksummer::Fletcher64(s) => s.update(data),
            Checksummer::Fnv1a(s) => s.update(data),
            Checksummer::Murmur3(s) => s.update(data),
            Checksummer::Xxh3(s) => s.update(data),
        }
    }

    /// Copy `src` into `dst` (same length) and checksum it in the same pass.
    pub fn copy_update(&mut self, dst: &mut [u8], src: &[u8]) {
        assert_eq!(dst.len(), src.len(), "copy_update needs equal lengths");
        match self {
            Checksummer::None => dst.copy_from_slice(src),
            Checksummer::Crc32c(c) => *c = crc32c_copy(*c, dst, src),
            Checksummer::Sum(s) => s.copy_update(dst, src),
            Checksummer::Xor(s) => s.copy_update(dst, src),
            _ => {
                for (d, s) in dst.chunks_mut(BLOCK).zip(src.chunks(BLOCK)) {
                    d.copy_from_slice(s);
                    self.update(d);
                }
            }
        }
    }

    /// [`copy_update`](Self::copy_update) into memory not yet initialised
    /// (a receive buffer's spare capacity): afterwards `dst` holds a copy of
    /// `src`. CRC32C runs its single-pass kernel; the others copy a block
    /// and checksum it while it is in L1.
    pub fn copy_update_uninit(&mut self, dst: &mut [MaybeUninit<u8>], src: &[u8]) {
        assert_eq!(dst.len(), src.len(), "copy_update needs equal lengths");
        if let Checksummer::Crc32c(c) = self {
            *c = crc32c_copy_uninit(*c, dst, src);
            return;
        }
        for (d, s) in dst.chunks_mut(BLOCK).zip(src.chunks(BLOCK)) {
            // SAFETY: `d` and `s` have equal lengths (chunks of equal-length
            // slices) and cannot overlap (a shared and a mutable borrow).
            unsafe { core::ptr::copy_nonoverlapping(s.as_ptr(), d.as_mut_ptr().cast::<u8>(), s.len()) };
            self.update(s);
        }
    }

    /// The two-pass variant: copy everything, then checksum the copy.
    pub fn copy_then_update(&mut self, dst: &mut [u8], src: &[u8]) {
        dst.copy_from_slice(src);
        self.update(dst);
    }

    /// The checksum; for 4-byte kinds in the low 32 bits.
    pub fn finish(&self) -> u64 {
        match self {
            Checksummer::None => 0,
            Checksummer::Crc32c(c) => u64::from(*c),
            Checksummer::Sum(s) => s.finish(),
            Checksummer::Xor(s) => s.finish(),
            Checksummer::Adler32(s) => u64::from(s.checksum()),
            Checksummer::Fletcher64(s) => s.finish(),
            Checksummer::Fnv1a(s) => s.finish(),
            Checksummer::Murmur3(s) => u64::from(s.finish()),
            Checksummer::Xxh3(s) => s.digest(),
        }
    }
}

#[cfg(test)]
mod tests;
