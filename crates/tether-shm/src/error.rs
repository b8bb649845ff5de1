//! Why a shared-memory operation failed: every variant a typed error for
//! the caller to count or act on, never a panic.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum ShmError {
    #[error("shared memory file: {0}")]
    Io(#[from] std::io::Error),
    #[error("the region is {got} bytes, {needed} are needed")]
    TooSmall { needed: usize, got: usize },
    #[error("not a tether ring (bad magic or geometry)")]
    NotARing,
    #[error("ring full: {needed} bytes needed, {free} free")]
    Full { needed: usize, free: usize },
    #[error("record of {0} bytes is larger than the ring allows")]
    RecordTooLarge(usize),
    #[error("damaged ring record at byte {at}: {why}")]
    Corrupt { at: u64, why: &'static str },
    #[error("control block being written (or its writer died mid-write)")]
    Torn,
    #[error("control block checksum mismatch")]
    BadChecksum,
    #[error("control block field out of range: {0}")]
    BadField(&'static str),
}
