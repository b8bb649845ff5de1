//! An application's region (docs/ENGINE.md): what one application shares
//! with its engine, at offsets that follow from a header the application
//! writes when it creates the region, so any engine (a restarted one
//! included) can open the region knowing only its path.
//!
//! ```text
//! 0                 header block (ClientHeader)
//! 64                submission ring  (application -> engine)
//! 64 + S            completion ring  (engine -> application)
//! 64 + S + C        one StreamBackup block per peer stream
//! ```

use std::path::Path;
use std::sync::Arc;

use crate::block::{Block, BlockBody, StreamBackup, BLOCK_BODY};
use crate::region::{Region, ALIGN};
use crate::ring::Ring;
use crate::ShmError;

/// The layout's version; a region of another version is refused.
pub const LAYOUT_VERSION: u32 = 1;
/// Streams one region may back up at most.
pub const MAX_STREAMS: u32 = 4096;

/// What a region's header says of its owner and its geometry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientHeader {
    pub version: u32,
    /// The application's node and its endpoint there (a (node, port) in
    /// the papers' terms).
    pub node: u32,
    pub port: u32,
    /// The owning process, for the engine to notice it dying.
    pub pid: u32,
    /// The endpoint's incarnation: a new one only when this region is gone.
    pub incarnation: u64,
    pub submission_capacity: u32,
    pub completion_capacity: u32,
    pub streams: u32,
}

impl BlockBody for ClientHeader {
    fn encode(&self) -> [u8; BLOCK_BODY] {
        let mut b = [0u8; BLOCK_BODY];
        let words = [
            self.version,
            self.node,
            self.port,
            self.pid,
            self.submission_capacity,
            self.completion_capacity,
            self.streams,
        ];
        for (i, w) in words.into_iter().enumerate() {
            b[4 * i..4 * i + 4].copy_from_slice(&w.to_le_bytes());
        }
        b[32..40].copy_from_slice(&self.incarnation.to_le_bytes());
        b
    }

    fn decode(b: &[u8; BLOCK_BODY]) -> Result<Self, ShmError> {
        let word = |i: usize| u32::from_le_bytes(b[4 * i..4 * i + 4].try_into().expect("4 bytes"));
        let h = ClientHeader {
            version: word(0),
            node: word(1),
            port: word(2),
            pid: word(3),
            submission_capacity: word(4),
            completion_capacity: word(5),
            streams: word(6),
            incarnation: u64::from_le_bytes(b[32..40].try_into().expect("8 bytes")),
        };
        if h.version != LAYOUT_VERSION {
            return Err(ShmError::BadField("layout version"));
        }
        let ring_ok = |c: u32| c.is_power_of_two() && c >= 64;
        if !ring_ok(h.submission_capacity) || !ring_ok(h.completion_capacity) {
            return Err(ShmError::BadField("ring capacity"));
        }
        if h.streams > MAX_STREAMS || h.incarnation == 0 || b[28..32] != [0; 4] || b[40..] != [0; 8] {
            return Err(ShmError::BadField("streams, incarnation or reserved bytes"));
        }
        Ok(h)
    }
}

impl ClientHeader {
    /// Bytes the region takes.
    pub fn region_len(&self) -> usize {
        self.backup_at(self.streams as usize)
    }

    fn submissions_at(&self) -> usize {
        ALIGN
    }

    fn completions_at(&self) -> usize {
        self.submissions_at() + Ring::footprint(self.submission_capacity as usize)
    }

    fn backup_at(&self, stream: usize) -> usize {
        self.completions_at() + Ring::footprint(self.completion_capacity as usize) + stream * ALIGN
    }
}

/// An application's region, opened: its header and the structures in it.
#[derive(Debug)]
pub struct ClientRegion {
    pub header: ClientHeader,
    pub submissions: Ring,
    pub completions: Ring,
    pub backups: Vec<Block<StreamBackup>>,
}

impl ClientRegion {
    /// The application's side: create the region at `path` for `header`
    /// (empty rings, no backup yet), the header written last.
    pub fn create(path: &Path, header: ClientHeader) -> Result<Self, ShmError> {
        let mut encoded = [0u8; 64];
        encoded[8..8 + BLOCK_BODY].copy_from_slice(&header.encode());
        ClientHeader::decode(encoded[8..8 + BLOCK_BODY].try_into().expect("the body"))?;
        let region = Arc::new(Region::create(path, header.region_len())?);
        let submissions =
            Ring::create(region.clone(), header.submissions_at(), header.submission_capacity as usize)?;
        let completions =
            Ring::create(region.clone(), header.completions_at(), header.completion_capacity as usize)?;
        let backups = Self::backups(&region, &header)?;
        // Last: an engine that opens the region sees a header only once
        // everything it describes is laid out.
        Block::<ClientHeader>::at(region, 0)?.write(&header);
        Ok(ClientRegion { header, submissions, completions, backups })
    }

    /// The engine's side: open the region at `path`, its header checked
    /// (a torn, damaged or impossible header, or a file shorter than the
    /// header says, is an error) and its rings attached.
    pub fn open(path: &Path) -> Result<Self, ShmError> {
        let region = Arc::new(Region::open(path)?);
        let header = Block::<ClientHeader>::at(region.clone(), 0)?
            .read()?
            .ok_or(ShmError::BadField("no header: the region is not laid out yet"))?;
        if region.len() < header.region_len() {
            return Err(ShmError::TooSmall { needed: header.region_len(), got: region.len() });
        }
        let submissions = Ring::attach(region.clone(), header.submissions_at())?;
        let completions = Ring::attach(region.clone(), header.completions_at())?;
        if submissions.capacity() != header.submission_capacity as usize
            || completions.capacity() != header.completion_capacity as usize
        {
            return Err(ShmError::NotARing);
        }
        let backups = Self::backups(&region, &header)?;
        Ok(ClientRegion { header, submissions, completions, backups })
    }

    fn backups(region: &Arc<Region>, header: &ClientHeader) -> Result<Vec<Block<StreamBackup>>, ShmError> {
        (0..header.streams as usize).map(|i| Block::at(region.clone(), header.backup_at(i))).collect()
    }
}
