//! The server's call log on disk: an append-only file of `tether-rpc`
//! records, memory-mapped (Kaur's AMVIA logs its transactions into
//! memory-mapped files, thesis section 3.3; RIFL's completion records are
//! the same idea, Lee et al., SOSP'15). A record is copied into the mapping
//! before the server acts on it, so a process killed at any instant leaves
//! in the page cache everything it acted on, and at most one record torn
//! mid-copy, which its CRC32C shows and a restart drops. Whether the file
//! survives the machine is the sync policy's choice: none (the page cache
//! alone: survives the process, not the kernel), per batch (`msync` once
//! per step that wrote), or per record (`msync` of each record before it
//! is acted on).
//!
//! The file has a fixed size. When a record does not fit, the server
//! compacts: what it still needs goes to a new file, written and synced
//! whole, then renamed over the old one, so a crash leaves one or the
//! other, never a mix.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};

use memmap2::MmapMut;
use tether_rpc::{replay, CallLog, LogError, Record, Torn};

/// When the log's writes reach the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SyncPolicy {
    /// Never asked for: the page cache keeps them through the process's
    /// death, the kernel writes them back when it will.
    #[default]
    None,
    /// Once per step of the endpoint that wrote any (`msync`).
    Batch,
    /// Each record, before the server acts on it (`msync` of its pages).
    Record,
}

/// Where the server's call log lives and how it is kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallLogOptions {
    /// The file (created if missing; reopened, and its records answered
    /// from, if not).
    pub path: PathBuf,
    /// Its size in bytes: the records a server still needs must fit.
    pub capacity: usize,
    /// When its writes reach the disk.
    pub sync: SyncPolicy,
}

impl CallLogOptions {
    /// A log at `path` of 64 MiB, synced never.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        CallLogOptions { path: path.into(), capacity: 64 << 20, sync: SyncPolicy::None }
    }
}

/// The smallest log: a few records.
const MIN_CAPACITY: usize = 4096;

/// An open log file.
pub struct FileLog {
    map: MmapMut,
    _file: File,
    path: PathBuf,
    /// Bytes of whole records.
    end: usize,
    sync: SyncPolicy,
    /// Written since the last batch sync: `[from, end)`.
    unsynced_from: Option<usize>,
    /// What was found torn at the end when it was opened.
    pub torn: Option<Torn>,
    pub compactions: u64,
}

impl std::fmt::Debug for FileLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileLog").field("path", &self.path).field("end", &self.end).finish()
    }
}

fn io(e: std::io::Error) -> LogError {
    LogError::Io(e.to_string())
}

fn map_file(path: &Path, capacity: usize, truncate: bool) -> Result<(File, MmapMut), LogError> {
    let file =
        OpenOptions::new().read(true).write(true).create(true).truncate(truncate).open(path).map_err(io)?;
    // Never smaller than it is: a smaller capacity asked for must not cut
    // off records a server still answers from.
    let len = file.metadata().map_err(io)?.len().max(capacity as u64);
    file.set_len(len).map_err(io)?;
    // The blocks themselves, now: a write into a mapping of a file the
    // disk has no room for is a SIGBUS, not an error.
    use std::os::fd::AsRawFd;
    // SAFETY: a valid descriptor and a range within the file's length.
    let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len as libc::off_t) };
    if rc != 0 {
        return Err(LogError::Io(format!(
            "reserving {len} bytes: {}",
            std::io::Error::from_raw_os_error(rc)
        )));
    }
    // SAFETY: the file is this log's alone (one server endpoint opens it);
    // its bytes are read only through `replay`, which trusts none of them.
    let map = unsafe { MmapMut::map_mut(&file) }.map_err(io)?;
    Ok((file, map))
}

impl FileLog {
    /// Open (or create) the log `o.path`, `o.capacity` bytes: its whole
    /// records are kept, a torn tail is cut off (`torn` says where).
    pub fn open(o: &CallLogOptions) -> Result<Self, LogError> {
        let capacity = o.capacity.max(MIN_CAPACITY);
        let (file, mut map) = map_file(&o.path, capacity, false)?;
        let (records, torn) = replay(&map);
        let end: usize = records.iter().map(|r| r.len()).sum();
        // Nothing after the last whole record: a torn one would otherwise
        // sit behind the next records written, unread but not unreadable.
        // (Zeroed up to the last byte written, not the whole tail.)
        let written = map[end..].iter().rposition(|&b| b != 0).map_or(end, |i| end + i + 1);
        map[end..written].fill(0);
        Ok(FileLog {
            map,
            _file: file,
            path: o.path.clone(),
            end,
            sync: o.sync,
            unsynced_from: None,
            torn,
            compactions: 0,
        })
    }

    /// Every whole record, for the server to recover from.
    pub fn records(&self) -> Vec<Record<'_>> {
        replay(&self.map[..self.end]).0
    }

    fn sync_range(&self, from: usize, to: usize) -> Result<(), LogError> {
        self.map.flush_range(from, to - from).map_err(io)
    }
}

impl CallLog for FileLog {
    fn append(&mut self, record: &Record<'_>) -> Result<(), LogError> {
        let len = record.len();
        if self.end + len > self.map.len() {
            return Err(LogError::Full { capacity: self.map.len() });
        }
        // Straight into the mapping, its checksum last: a process killed in
        // the middle leaves a record that does not check.
        let start = self.end;
        record.write_to(&mut self.map[start..start + len]);
        self.end += len;
        match self.sync {
            SyncPolicy::None => {}
            SyncPolicy::Batch => {
                self.unsynced_from.get_or_insert(start);
            }
            SyncPolicy::Record => self.sync_range(start, self.end)?,
        }
        Ok(())
    }

    fn compact(&mut self, live: &[Record<'_>]) -> Result<(), LogError> {
        let mut bytes = Vec::new();
        for r in live {
            r.write(&mut bytes);
        }
        let capacity = self.map.len();
        if bytes.len() > capacity {
            return Err(LogError::Full { capacity });
        }
        let mut fresh = self.path.clone().into_os_string();
        fresh.push(".compacting");
        let fresh = PathBuf::from(fresh);
        let (file, mut map) = map_file(&fresh, capacity, true)?;
        map[..bytes.len()].copy_from_slice(&bytes);
        map.flush().map_err(io)?;
        file.sync_all().map_err(io)?;
        std::fs::rename(&fresh, &self.path).map_err(io)?;
        // The new file is the log from here on, whatever comes next.
        (self.map, self._file, self.end) = (map, file, bytes.len());
        self.unsynced_from = None;
        self.compactions += 1;
        if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty()) {
            // The rename itself, durable.
            File::open(dir).and_then(|d| d.sync_all()).map_err(io)?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), LogError> {
        if let Some(from) = self.unsynced_from {
            // Unsynced until the sync succeeds: a failed one is tried
            // again by the next flush, never taken as done.
            self.sync_range(from, self.end)?;
            self.unsynced_from = None;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tether_rpc::CallId;

    fn dir() -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "tether-call-log-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn started(seq: u64) -> Record<'static> {
        Record::Started { node: 1, call: CallId { client: 5, seq }, handler: 2, one_way: false }
    }

    #[test]
    fn records_survive_a_reopen_and_a_torn_one_is_cut_off() {
        let d = dir();
        let o = CallLogOptions { path: d.join("log"), capacity: 4096, sync: SyncPolicy::Record };
        let mut log = FileLog::open(&o).unwrap();
        for seq in 0..3 {
            log.append(&started(seq)).unwrap();
        }
        let end = log.end;
        // A fourth record half copied when the process died.
        let mut half = Vec::new();
        started(3).write(&mut half);
        log.map[end..end + half.len() / 2].copy_from_slice(&half[..half.len() / 2]);
        drop(log);
        let mut log = FileLog::open(&o).unwrap();
        assert!(log.torn.is_some());
        assert_eq!(log.records(), vec![started(0), started(1), started(2)]);
        // What is written next is read back after the three, nothing between.
        log.append(&started(9)).unwrap();
        drop(log);
        let log = FileLog::open(&o).unwrap();
        assert_eq!(log.torn, None);
        assert_eq!(log.records(), vec![started(0), started(1), started(2), started(9)]);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_full_log_compacts_by_renaming_a_whole_new_file() {
        let d = dir();
        let o = CallLogOptions { path: d.join("log"), capacity: 4096, sync: SyncPolicy::Batch };
        let mut log = FileLog::open(&o).unwrap();
        let mut n = 0;
        while log.append(&started(n)).is_ok() {
            n += 1;
        }
        assert_eq!(n as usize, 4096 / started(0).len());
        log.flush().unwrap();
        log.compact(&[started(7)]).unwrap();
        log.append(&started(8)).unwrap();
        log.flush().unwrap();
        drop(log);
        assert!(!d.join("log.compacting").exists());
        // Reopened asking for less room: nothing is cut off.
        let small = CallLogOptions { capacity: 1024, ..o.clone() };
        assert_eq!(FileLog::open(&small).unwrap().records(), vec![started(7), started(8)]);
        let log = FileLog::open(&o).unwrap();
        assert_eq!(log.records(), vec![started(7), started(8)]);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
