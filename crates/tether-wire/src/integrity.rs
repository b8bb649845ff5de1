//! Checksums over header and payload (seeds/003 section 5).
//!
//! The algorithm is named in every header, so a receiver verifies with the
//! sender's choice. CRC32C is the default: the `crc32c` crate uses the SSE4.2
//! instruction where the CPU has it and a table fallback with identical
//! results where it does not. `None` exists for raw measurements.

/// Checksum algorithm, as named on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(u8)]
pub enum ChecksumKind {
    None = 0,
    #[default]
    Crc32c = 1,
}

impl ChecksumKind {
    pub const ALL: [ChecksumKind; 2] = [ChecksumKind::None, ChecksumKind::Crc32c];

    pub fn from_u8(v: u8) -> Option<Self> {
        match v {
            0 => Some(ChecksumKind::None),
            1 => Some(ChecksumKind::Crc32c),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ChecksumKind::None => "none",
            ChecksumKind::Crc32c => "crc32c",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.name() == name)
    }

    /// Checksum of the concatenation of `parts`.
    pub fn compute(self, parts: &[&[u8]]) -> u32 {
        match self {
            ChecksumKind::None => 0,
            ChecksumKind::Crc32c => parts.iter().fold(0, |crc, p| crc32c::crc32c_append(crc, p)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_known_answer() {
        // RFC 3720 B.4 check value for "123456789".
        assert_eq!(ChecksumKind::Crc32c.compute(&[b"123456789"]), 0xE306_9283);
        // Split input gives the same answer as contiguous input.
        assert_eq!(ChecksumKind::Crc32c.compute(&[b"1234", b"56789"]), 0xE306_9283);
        // 32 bytes of zeros, RFC 3720 B.4.
        assert_eq!(ChecksumKind::Crc32c.compute(&[&[0u8; 32]]), 0x8A91_36AA);
    }

    #[test]
    fn names_round_trip() {
        for k in ChecksumKind::ALL {
            assert_eq!(ChecksumKind::from_name(k.name()), Some(k));
            assert_eq!(ChecksumKind::from_u8(k as u8), Some(k));
        }
        assert_eq!(ChecksumKind::from_u8(200), None);
    }
}
