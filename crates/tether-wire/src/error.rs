//! Why a datagram was rejected. Every variant is a counted drop at the
//! receiver, never a panic.

use thiserror::Error;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum WireError {
    #[error("datagram shorter than the {needed}-byte header (got {got})")]
    Truncated { needed: usize, got: usize },
    #[error("bad magic")]
    BadMagic,
    #[error("unsupported version {0}")]
    BadVersion(u8),
    #[error("unknown header flag bits {0:#04x}")]
    BadFlags(u8),
    #[error("reserved header byte is not zero")]
    ReservedBits,
    #[error("unknown checksum or authentication algorithm {0}")]
    UnknownChecksum(u8),
    #[error("body length field says {claimed} bytes, datagram carries {actual}")]
    LengthMismatch { claimed: usize, actual: usize },
    #[error("checksum mismatch")]
    ChecksumMismatch,
    #[error("unknown frame type {0:#04x}")]
    UnknownFrame(u8),
    #[error("frame runs past the end of the datagram")]
    FrameTruncated,
    #[error("malformed frame: {0}")]
    MalformedFrame(&'static str),
    #[error("datagram larger than the maximum tether accepts")]
    Oversized,
    #[error("output buffer too small")]
    BufferTooSmall,
    /// An authenticated datagram, and no key to check it with.
    #[error("authenticated datagram, and no key to verify it")]
    KeyRequired,
}

impl WireError {
    /// A short stable name, used as a counter key.
    pub fn name(&self) -> &'static str {
        match self {
            WireError::Truncated { .. } => "truncated",
            WireError::BadMagic => "bad_magic",
            WireError::BadVersion(_) => "bad_version",
            WireError::BadFlags(_) => "bad_flags",
            WireError::ReservedBits => "reserved_bits",
            WireError::UnknownChecksum(_) => "unknown_checksum",
            WireError::LengthMismatch { .. } => "length_mismatch",
            WireError::ChecksumMismatch => "checksum_mismatch",
            WireError::UnknownFrame(_) => "unknown_frame",
            WireError::FrameTruncated => "frame_truncated",
            WireError::MalformedFrame(_) => "malformed_frame",
            WireError::Oversized => "oversized",
            WireError::BufferTooSmall => "buffer_too_small",
            WireError::KeyRequired => "key_required",
        }
    }
}
