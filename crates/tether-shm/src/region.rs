//! A shared-memory region: a file mapped shared, created by the process
//! that owns it (an application, whose backup must outlive the engine) and
//! opened by the others (the engine, and the engine after it).

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};

use memmap2::MmapMut;

use crate::ShmError;

/// Alignment of everything placed in a region: a cache line, so the
/// producer's and the consumer's counters never share one.
pub const ALIGN: usize = 64;

pub struct Region {
    map: MmapMut,
    path: PathBuf,
    _file: File,
}

impl core::fmt::Debug for Region {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Region").field("path", &self.path).field("len", &self.map.len()).finish()
    }
}

impl Region {
    /// Create (or truncate) `path` at `len` bytes, zeroed, and map it.
    pub fn create(path: &Path, len: usize) -> Result<Self, ShmError> {
        let file = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(path)?;
        file.set_len(len as u64)?;
        Self::map(path, file)
    }

    /// Map an existing region.
    pub fn open(path: &Path) -> Result<Self, ShmError> {
        let file = OpenOptions::new().read(true).write(true).open(path)?;
        Self::map(path, file)
    }

    fn map(path: &Path, file: File) -> Result<Self, ShmError> {
        // SAFETY: the file is shared with other processes by design; every
        // access to the mapping goes through atomics or through bytes that
        // are validated before use (rings, blocks), never through
        // references that assume nobody else writes.
        let map = unsafe { MmapMut::map_mut(&file)? };
        Ok(Region { map, path: path.to_owned(), _file: file })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The base of the mapping (page-aligned), for the structures laid on it.
    pub(crate) fn base(&self) -> *mut u8 {
        self.map.as_ptr() as *mut u8
    }

    /// The base of the mapping, for structures of the caller's own (a
    /// benchmark's baseline); valid for `len()` bytes while `self` lives.
    pub fn as_ptr(&self) -> *mut u8 {
        self.base()
    }

    /// Bytes `at..at + len` of the region, checked to lie within it and be
    /// aligned to [`ALIGN`].
    pub(crate) fn span(&self, at: usize, len: usize) -> Result<*mut u8, ShmError> {
        let end = at.checked_add(len).ok_or(ShmError::TooSmall { needed: usize::MAX, got: self.len() })?;
        if end > self.len() {
            return Err(ShmError::TooSmall { needed: end, got: self.len() });
        }
        if !at.is_multiple_of(ALIGN) {
            return Err(ShmError::BadField("offset not cache-line aligned"));
        }
        // SAFETY: `at + len <= len()`, checked above.
        Ok(unsafe { self.base().add(at) })
    }
}
