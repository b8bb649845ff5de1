//! An application's region (docs/ENGINE.md): what one application shares
//! with its engine, at offsets that follow from a header the application
//! writes when it creates the region, so any engine (a restarted one
//! included) can open the region knowing only its path.
//!
//! ```text
//! 0                 header block (ClientHeader)
//! 64                control line (Control: wake-up flags, heartbeat)
//! 128               submission ring  (application -> engine)
//! 128 + S           completion ring  (engine -> application)
//! 128 + S + C       one StreamBackup block per peer stream
//! ```

use std::path::Path;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use crate::block::{Block, BlockBody, StreamBackup, BLOCK_BODY};
use crate::region::{Region, ALIGN};
use crate::ring::Ring;
use crate::ShmError;

/// The layout's version; a region of another version is refused.
/// 3: submissions of calls' envelopes (`SEND_ON_LAYER`) and the direct path's
/// call mark (a record id's top bit).
pub const LAYOUT_VERSION: u32 = 3;
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

    fn control_at(&self) -> usize {
        ALIGN
    }

    fn submissions_at(&self) -> usize {
        2 * ALIGN
    }

    fn completions_at(&self) -> usize {
        self.submissions_at() + Ring::footprint(self.submission_capacity as usize)
    }

    fn backup_at(&self, stream: usize) -> usize {
        // A block per stream the header names, and the end of the last.
        assert!(stream <= self.streams as usize, "backup block {stream} of {} streams", self.streams);
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
    pub control: Control,
}

/// The region's control line: words both sides change while running,
/// outside any checksum (they are hints and counters, never trusted for
/// more than whether to wake the other side up).
///
/// Wake-ups are a Dekker handshake: a side about to sleep raises its flag,
/// then looks for work once more (both with sequentially consistent
/// ordering); the other side publishes work, then reads the flag. At least
/// one of them sees the other, so no wake-up is lost, and a side that
/// never sleeps costs the other one load per batch.
#[derive(Debug)]
pub struct Control {
    base: *mut u8,
    _region: Arc<Region>,
}

// SAFETY: every access to the line goes through atomics, and the region
// it points into lives as long as `_region`.
unsafe impl Send for Control {}
// SAFETY: as for `Send`: shared access is atomic.
unsafe impl Sync for Control {}

const ENGINE_ASLEEP: usize = 0;
const CLIENT_WAITING: usize = 4;
const HEARTBEAT: usize = 8;
const SECRET: usize = 16;
/// Bytes of the endpoint's handshake secret.
pub const SECRET_LEN: usize = 32;

impl Control {
    fn at(region: Arc<Region>, at: usize) -> Result<Self, ShmError> {
        let base = region.span(at, ALIGN)?;
        Ok(Control { base, _region: region })
    }

    fn word(&self, at: usize) -> &AtomicU32 {
        // SAFETY: within the line checked in `at`, 4-aligned; the region
        // lives as long as `self`.
        unsafe { &*(self.base.add(at) as *const AtomicU32) }
    }

    /// The engine is (about to be) asleep: the application rings the
    /// doorbell after submitting.
    pub fn engine_asleep(&self) -> &AtomicU32 {
        self.word(ENGINE_ASLEEP)
    }

    /// The application is (about to be) waiting for completions: the
    /// engine rings its doorbell after publishing.
    pub fn client_waiting(&self) -> &AtomicU32 {
        self.word(CLIENT_WAITING)
    }

    /// Advanced by the engine on every turn of its loop (the watchdog's
    /// heartbeat, Zhou et al. [FTGM] section 3.1).
    pub fn heartbeat(&self) -> &AtomicU64 {
        // SAFETY: as `word`, 8-aligned.
        unsafe { &*(self.base.add(HEARTBEAT) as *const AtomicU64) }
    }

    /// The endpoint's handshake secret (its cookies and nonces), chosen by
    /// the application when it lays the region out, so every engine that
    /// serves it answers the same: a handshake begun with a dead engine is
    /// finished with the new one. Not checksummed: damage makes cookies
    /// fail to check, which costs a new handshake, never a false one.
    pub fn secret(&self) -> [u8; SECRET_LEN] {
        let mut out = [0u8; SECRET_LEN];
        for (i, b) in out.iter_mut().enumerate() {
            // SAFETY: bytes 16..48 of the line checked in `at`.
            *b = unsafe { self.base.add(SECRET + i).read_volatile() };
        }
        out
    }

    /// Set the secret (the application, before it attaches).
    pub fn set_secret(&self, secret: &[u8; SECRET_LEN]) {
        for (i, &b) in secret.iter().enumerate() {
            // SAFETY: as in `secret`.
            unsafe { self.base.add(SECRET + i).write_volatile(b) };
        }
    }

    /// Raise `flag`, then check `work` once more: true if there is work
    /// after all (the flag is lowered again), false if it is safe to sleep.
    pub fn before_sleep(flag: &AtomicU32, work: impl FnOnce() -> bool) -> bool {
        flag.store(1, Ordering::SeqCst);
        if work() {
            flag.store(0, Ordering::Relaxed);
            return true;
        }
        false
    }

    /// After publishing work: whether the other side sleeps and must be
    /// woken (its flag is lowered here, so it is woken once).
    pub fn should_wake(flag: &AtomicU32) -> bool {
        // The work was published with release stores, which may pass a
        // later load: the fence keeps the flag's load after them.
        std::sync::atomic::fence(Ordering::SeqCst);
        flag.load(Ordering::Relaxed) != 0 && flag.swap(0, Ordering::SeqCst) != 0
    }
}

impl ClientRegion {
    /// The application's side: create the region at `path` for `header`
    /// (empty rings, no backup yet), the header written last.
    pub fn create(path: &Path, header: ClientHeader) -> Result<Self, ShmError> {
        let mut encoded = [0u8; 64];
        encoded[8..8 + BLOCK_BODY].copy_from_slice(&header.encode());
        ClientHeader::decode(encoded[8..8 + BLOCK_BODY].try_into().expect("the body"))?;
        let region = Arc::new(Region::create(path, header.region_len())?);
        assert_eq!(region.len(), header.region_len(), "a region laid out at another length");
        let submissions =
            Ring::create(region.clone(), header.submissions_at(), header.submission_capacity as usize)?;
        let completions =
            Ring::create(region.clone(), header.completions_at(), header.completion_capacity as usize)?;
        let backups = Self::backups(&region, &header)?;
        let control = Control::at(region.clone(), header.control_at())?;
        // Last: an engine that opens the region sees a header only once
        // everything it describes is laid out.
        Block::<ClientHeader>::at(region, 0)?.write(&header);
        Ok(ClientRegion { header, submissions, completions, backups, control })
    }

    /// The engine's side: open the region at `path`, its header checked
    /// (a torn, damaged or impossible header, or a file shorter than the
    /// header says, is an error) and its rings attached.
    pub fn open(path: &Path) -> Result<Self, ShmError> {
        let region = Arc::new(Region::open(path)?);
        let header = Block::<ClientHeader>::at(region.clone(), 0)?
            .read()?
            .ok_or(ShmError::BadField("no header: the region is not laid out yet"))?;
        // The header came from the region: checked as it was decoded, and
        // its layout against the file here, so an impossible one is an
        // error; what follows lays nothing past the mapping.
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
        let control = Control::at(region, header.control_at())?;
        Ok(ClientRegion { header, submissions, completions, backups, control })
    }

    fn backups(region: &Arc<Region>, header: &ClientHeader) -> Result<Vec<Block<StreamBackup>>, ShmError> {
        (0..header.streams as usize).map(|i| Block::at(region.clone(), header.backup_at(i))).collect()
    }
}
