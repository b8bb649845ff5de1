//! A notice board in shared memory: one writer publishes a snapshot of
//! any length up to the board's capacity, and any number of readers copy
//! the latest whole one, without the writer ever waiting for them or
//! knowing they are there (Aeron's counters file, read by AeronStat, is
//! the model; docs/OPERATING.md, "tether stat").
//!
//! The layout is one cache line of header (a version, the snapshot's
//! length, a CRC32C over the version, the length and the bytes) and the
//! bytes after it. Writes go under a sequence lock, as a [`crate::Block`]'s
//! do: the version is odd while the writer works. A reader that sees an
//! odd version, or one that changed while it copied, has a torn snapshot
//! and tries again; one whose checksum fails has a damaged one. Either way
//! it gets a typed error, never bytes it cannot trust.
//!
//! A reader maps the file read-only, so it cannot disturb the writer. A
//! board is never truncated in place (a reader's mapping would fault): a
//! new writer (a replacement engine) makes a new file and renames it over
//! the old one, and readers open the path again for each look.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::atomic::{fence, AtomicU64, Ordering};

use memmap2::{Mmap, MmapMut};

use crate::region::ALIGN;
use crate::ShmError;

const VERSION_AT: usize = 0;
const LEN_AT: usize = 8;
const CRC_AT: usize = 12;
/// Where the snapshot's bytes start: after one cache line of header.
pub const BOARD_HEADER: usize = ALIGN;
/// The largest board a reader maps (and so the largest a writer makes).
pub const MAX_BOARD: usize = 64 << 20;

/// The writer's end.
pub struct BoardWriter {
    map: MmapMut,
    path: PathBuf,
}

impl core::fmt::Debug for BoardWriter {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("BoardWriter").field("path", &self.path).field("capacity", &self.capacity()).finish()
    }
}

impl BoardWriter {
    /// A new board at `path` for snapshots of up to `capacity` bytes: made
    /// beside it and renamed over whatever was there, so a reader of the
    /// old one never sees it shrink under its mapping.
    pub fn create(path: &Path, capacity: usize) -> Result<Self, ShmError> {
        let len = BOARD_HEADER + capacity;
        if len > MAX_BOARD {
            return Err(ShmError::TooSmall { needed: len, got: MAX_BOARD });
        }
        let fresh = Self::staging_path(path, std::process::id());
        let file = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&fresh)?;
        file.set_len(len as u64)?;
        // SAFETY: the file is shared with readers by design; this writer
        // changes it only through the sequence lock's atomics and volatile
        // writes, and readers validate every copy.
        let map = unsafe { MmapMut::map_mut(&file)? };
        std::fs::rename(&fresh, path)?;
        Ok(BoardWriter { map, path: path.to_owned() })
    }

    /// Where process `pid` makes a board for `path` before renaming it
    /// into place. A writer killed between the two leaves it: whoever
    /// outlives the writer (its supervisor, the next engine) removes it.
    pub fn staging_path(path: &Path, pid: u32) -> PathBuf {
        let mut fresh = path.as_os_str().to_owned();
        fresh.push(format!(".new-{pid}"));
        PathBuf::from(fresh)
    }

    /// The writer's pid if `name` is a staging file of the board named
    /// `board` (see [`BoardWriter::staging_path`]).
    pub fn staging_owner(name: &str, board: &str) -> Option<u32> {
        name.strip_prefix(board)?.strip_prefix(".new-")?.parse().ok()
    }

    pub fn capacity(&self) -> usize {
        self.map.len() - BOARD_HEADER
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn version(&self) -> &AtomicU64 {
        // SAFETY: the mapping's first 8 bytes, page-aligned.
        unsafe { &*(self.map.as_ptr().add(VERSION_AT) as *const AtomicU64) }
    }

    /// Publish `bytes` as the board's snapshot. `Err(TooSmall)` if they do
    /// not fit; the board keeps its last snapshot.
    pub fn publish(&mut self, bytes: &[u8]) -> Result<(), ShmError> {
        if bytes.len() > self.capacity() {
            return Err(ShmError::TooSmall { needed: bytes.len(), got: self.capacity() });
        }
        let v = self.version().load(Ordering::Relaxed);
        let odd = v | 1;
        let done = odd.wrapping_add(1);
        self.version().store(odd, Ordering::Relaxed);
        fence(Ordering::Release);
        let crc = checksum(done, bytes.len() as u32, bytes);
        let base = self.map.as_mut_ptr();
        // SAFETY: the header's fields and `bytes.len() <= capacity` bytes
        // after it lie inside the mapping.
        unsafe {
            (base.add(LEN_AT) as *mut u32).write_volatile((bytes.len() as u32).to_le());
            (base.add(CRC_AT) as *mut u32).write_volatile(crc.to_le());
            for (i, b) in bytes.iter().enumerate() {
                base.add(BOARD_HEADER + i).write_volatile(*b);
            }
        }
        self.version().store(done, Ordering::Release);
        Ok(())
    }
}

/// A reader's look at a board: the file mapped read-only.
pub struct BoardReader {
    map: Mmap,
    _file: File,
}

impl BoardReader {
    /// Map the board at `path` read-only.
    pub fn open(path: &Path) -> Result<Self, ShmError> {
        let file = File::open(path)?;
        let len = file.metadata()?.len() as usize;
        if !(BOARD_HEADER..=MAX_BOARD).contains(&len) {
            return Err(ShmError::BadField("board size"));
        }
        // SAFETY: mapped read-only; every read goes through the version's
        // atomic and volatile copies that are validated before use. The
        // writer never shrinks the file (a new board is a new file).
        let map = unsafe { Mmap::map(&file)? };
        Ok(BoardReader { map, _file: file })
    }

    fn version(&self) -> &AtomicU64 {
        // SAFETY: the mapping's first 8 bytes, page-aligned.
        unsafe { &*(self.map.as_ptr().add(VERSION_AT) as *const AtomicU64) }
    }

    /// Copy the latest snapshot into `out`: `Ok(false)` if none was ever
    /// published, `Torn` if a write was under way (try again),
    /// `BadChecksum` if the bytes are damaged.
    pub fn read(&self, out: &mut Vec<u8>) -> Result<bool, ShmError> {
        let v1 = self.version().load(Ordering::Acquire);
        if v1 == 0 {
            return Ok(false);
        }
        if v1 % 2 == 1 {
            return Err(ShmError::Torn);
        }
        let base = self.map.as_ptr();
        // SAFETY: the header's fields lie inside the mapping (its length
        // was checked at open).
        let (len, crc) = unsafe {
            (
                u32::from_le((base.add(LEN_AT) as *const u32).read_volatile()),
                u32::from_le((base.add(CRC_AT) as *const u32).read_volatile()),
            )
        };
        let len = len as usize;
        if len > self.map.len() - BOARD_HEADER {
            return Err(ShmError::BadField("snapshot length"));
        }
        out.clear();
        out.reserve(len);
        for i in 0..len {
            // SAFETY: `BOARD_HEADER + i < map.len()`, checked above.
            out.push(unsafe { base.add(BOARD_HEADER + i).read_volatile() });
        }
        fence(Ordering::Acquire);
        if self.version().load(Ordering::Relaxed) != v1 {
            return Err(ShmError::Torn);
        }
        if checksum(v1, len as u32, out) != crc {
            return Err(ShmError::BadChecksum);
        }
        Ok(true)
    }

    /// `read`, trying again while a write is under way (up to `tries`).
    pub fn read_settled(&self, out: &mut Vec<u8>, tries: usize) -> Result<bool, ShmError> {
        let mut last = ShmError::Torn;
        for _ in 0..tries.max(1) {
            match self.read(out) {
                Err(ShmError::Torn) => {
                    last = ShmError::Torn;
                    std::thread::yield_now();
                }
                other => return other,
            }
        }
        Err(last)
    }
}

fn checksum(version: u64, len: u32, bytes: &[u8]) -> u32 {
    let head = crc32c::crc32c_append(crc32c::crc32c(&version.to_le_bytes()), &len.to_le_bytes());
    crc32c::crc32c_append(head, bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("tether-board-test-{}-{name}", std::process::id()))
    }

    #[test]
    fn a_reader_sees_the_latest_whole_snapshot() {
        let p = path("latest");
        let mut w = BoardWriter::create(&p, 1024).unwrap();
        let r = BoardReader::open(&p).unwrap();
        let mut out = Vec::new();
        assert!(!r.read(&mut out).unwrap(), "nothing published yet");
        w.publish(b"first").unwrap();
        assert!(r.read(&mut out).unwrap());
        assert_eq!(out, b"first");
        w.publish(b"the second, longer").unwrap();
        w.publish(b"3rd").unwrap();
        assert!(r.read(&mut out).unwrap());
        assert_eq!(out, b"3rd");
        assert!(matches!(w.publish(&[0; 1025]), Err(ShmError::TooSmall { .. })));
        assert!(r.read(&mut out).unwrap());
        assert_eq!(out, b"3rd", "a snapshot too large leaves the last one");
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn a_torn_or_damaged_snapshot_is_refused() {
        let p = path("damaged");
        let mut w = BoardWriter::create(&p, 64).unwrap();
        w.publish(b"whole").unwrap();
        let r = BoardReader::open(&p).unwrap();
        let mut out = Vec::new();
        // A writer that died mid-write leaves the version odd.
        w.version().fetch_add(1, Ordering::AcqRel);
        assert!(matches!(r.read(&mut out), Err(ShmError::Torn)));
        assert!(matches!(r.read_settled(&mut out, 3), Err(ShmError::Torn)));
        w.version().fetch_add(1, Ordering::AcqRel);
        // A stray write in the bytes.
        // SAFETY: inside the mapping.
        unsafe { w.map.as_mut_ptr().add(BOARD_HEADER + 1).write_volatile(b'X') };
        assert!(matches!(r.read(&mut out), Err(ShmError::BadChecksum)));
        // A length past the board.
        // SAFETY: inside the mapping.
        unsafe { (w.map.as_mut_ptr().add(LEN_AT) as *mut u32).write_volatile(1 << 20) };
        assert!(matches!(r.read(&mut out), Err(ShmError::BadField(_))));
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn a_new_writer_replaces_the_file_and_an_old_reader_keeps_its_mapping() {
        let p = path("replaced");
        let mut w1 = BoardWriter::create(&p, 64).unwrap();
        w1.publish(b"old").unwrap();
        let old = BoardReader::open(&p).unwrap();
        let mut w2 = BoardWriter::create(&p, 16).unwrap();
        w2.publish(b"new").unwrap();
        let mut out = Vec::new();
        assert!(old.read(&mut out).unwrap());
        assert_eq!(out, b"old", "the old mapping is still whole");
        assert!(BoardReader::open(&p).unwrap().read(&mut out).unwrap());
        assert_eq!(out, b"new");
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn a_file_too_small_to_be_a_board_is_refused() {
        let p = path("small");
        std::fs::write(&p, b"short").unwrap();
        assert!(matches!(BoardReader::open(&p), Err(ShmError::BadField(_))));
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn concurrent_reads_never_see_a_mix() {
        let p = path("concurrent");
        let mut w = BoardWriter::create(&p, 4096).unwrap();
        let r = BoardReader::open(&p).unwrap();
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                for i in 0..20_000u32 {
                    let len = 1 + (i as usize * 7) % 4000;
                    w.publish(&vec![(i % 251) as u8; len]).unwrap();
                }
                stop.store(true, Ordering::Relaxed);
            });
            let mut out = Vec::new();
            let mut whole = 0;
            while !stop.load(Ordering::Relaxed) {
                match r.read(&mut out) {
                    Ok(true) => {
                        assert!(out.iter().all(|&b| b == out[0]), "a snapshot mixed from two writes");
                        whole += 1;
                    }
                    Ok(false) | Err(ShmError::Torn) => {}
                    Err(e) => panic!("{e:?}"),
                }
            }
            // Once the writer is done a read is whole, and the last
            // write's. (Whether any read during the writes came out whole
            // is up to the scheduler: on a loaded two-core machine the
            // writer once finished before the reader's first clean read.)
            assert!(r.read(&mut out).unwrap(), "a quiet board reads whole");
            let last = 19_999usize;
            assert_eq!(out, vec![(last % 251) as u8; 1 + (last * 7) % 4000], "the last snapshot");
            whole += 1;
            eprintln!("{whole} whole reads");
        });
        std::fs::remove_file(&p).unwrap();
    }
}
