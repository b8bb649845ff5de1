//! The manager replicas' Raft log, in memory: raft-rs's `MemStorage`,
//! except that a read of entries copies only about as many as the
//! message's size limit lets through. `MemStorage` copies everything from
//! the first entry asked for to the end of the log and then cuts it to
//! the limit, so a leader sending a follower that fell behind (one lost
//! append puts it back to probing) copied the whole tail for every
//! message: at a thousand members joining at once that was 80% of the
//! simulator's time (`membership_1000`).

use core::ops::Deref;

use raft::prelude::{Entry, Snapshot};
use raft::storage::{MemStorage, Storage};
use raft::{GetEntriesContext, RaftState, Result};

/// Entries a read copies first; each further read four times as many.
const FIRST_READ: u64 = 16;

/// `MemStorage` with bounded reads.
#[derive(Clone, Default)]
pub struct LogStore(MemStorage);

impl LogStore {
    /// A log whose configuration is `conf` (voters, learners), as
    /// `MemStorage::new_with_conf_state`.
    pub fn new_with_conf_state(conf: (Vec<u64>, Vec<u64>)) -> Self {
        LogStore(MemStorage::new_with_conf_state(conf))
    }
}

impl Deref for LogStore {
    type Target = MemStorage;
    fn deref(&self) -> &MemStorage {
        &self.0
    }
}

impl Storage for LogStore {
    fn initial_state(&self) -> Result<RaftState> {
        self.0.initial_state()
    }

    /// The entries in `[low, high)`, at most `max_size` bytes of them (at
    /// least one), read in growing spans until the limit or `high` stops
    /// the read. The context only matters to a store that fetches
    /// asynchronously, which this one never does.
    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        _context: GetEntriesContext,
    ) -> Result<Vec<Entry>> {
        let max_size = max_size.into();
        let mut span = FIRST_READ;
        loop {
            let end = high.min(low.saturating_add(span));
            let entries = self.0.entries(low, end, max_size, GetEntriesContext::empty(false))?;
            // Cut by the limit, or all that was asked for.
            if end == high || (entries.len() as u64) < end - low {
                return Ok(entries);
            }
            span = span.saturating_mul(4);
        }
    }

    fn term(&self, idx: u64) -> Result<u64> {
        self.0.term(idx)
    }

    fn first_index(&self) -> Result<u64> {
        self.0.first_index()
    }

    fn last_index(&self) -> Result<u64> {
        self.0.last_index()
    }

    fn snapshot(&self, request_index: u64, to: u64) -> Result<Snapshot> {
        self.0.snapshot(request_index, to)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(index: u64) -> Entry {
        Entry { index, term: 1, data: vec![7; 40].into(), ..Default::default() }
    }

    #[test]
    fn reads_what_memstorage_reads() {
        let store = LogStore::new_with_conf_state((vec![1], vec![]));
        let all: Vec<Entry> = (1..=500).map(entry).collect();
        store.wl().append(&all).unwrap();
        let ctx = || GetEntriesContext::empty(false);
        for (low, high, max) in
            [(1, 501, None), (1, 501, Some(0)), (3, 400, Some(1_000)), (100, 101, Some(10))]
        {
            let ours = store.entries(low, high, max, ctx()).unwrap();
            let theirs = store.0.entries(low, high, max, ctx()).unwrap();
            assert_eq!(ours, theirs, "[{low}, {high}) within {max:?}");
            assert!(!ours.is_empty());
        }
    }
}
