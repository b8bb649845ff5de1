//! The engine's heartbeat (Zhou et al. [FTGM]'s watchdog counter): a word
//! it advances on every turn of its loop, and the moment it means to wake
//! by when it sleeps, in a region its supervisor maps.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// The engine's heartbeat (Zhou et al. [FTGM] section 3.1, the watchdog's
/// counter): a word it advances on every turn of its loop, and the moment
/// it means to wake by when it sleeps, in a region its supervisor maps.
/// Standing still while not asleep, or asleep past its wake-up time, is a
/// hang.
#[derive(Debug, Clone)]
pub struct Heartbeat {
    region: Arc<tether_shm::Region>,
}

impl Heartbeat {
    /// Bytes a heartbeat takes.
    pub const LEN: usize = 64;

    /// The heartbeat in `region` (at least `LEN` bytes, shared).
    pub fn new(region: Arc<tether_shm::Region>) -> Self {
        assert!(region.len() >= Self::LEN, "a heartbeat needs its cache line");
        Heartbeat { region }
    }

    fn word(&self, i: usize) -> &std::sync::atomic::AtomicU64 {
        // SAFETY: words 0 and 1 of a mapping of at least 64 bytes, 8-aligned
        // (a mapping is page-aligned); it lives as long as `self.region`.
        unsafe { &*(self.region.as_ptr().add(8 * i) as *const std::sync::atomic::AtomicU64) }
    }

    /// Turns of the loop so far.
    pub fn beats(&self) -> u64 {
        self.word(0).load(Ordering::Acquire)
    }

    /// The monotonic time (`monotonic_ns`) the engine, asleep, means to
    /// wake by; 0 while awake.
    pub fn asleep_until(&self) -> u64 {
        self.word(1).load(Ordering::Acquire)
    }

    pub(crate) fn beat(&self) {
        self.word(0).fetch_add(1, Ordering::Release);
    }

    pub(crate) fn sleeping(&self, until_ns: u64) {
        self.word(1).store(until_ns, Ordering::Release);
    }

    /// The longest the engine may sleep: its supervisor tells a hang from
    /// a sleep no sooner than the sleep's end, so this bounds detection.
    pub fn max_sleep(&self) -> Duration {
        Duration::from_nanos(self.word(2).load(Ordering::Relaxed))
    }

    /// Before an engine starts: awake, no beats, sleeps bounded by `max`.
    pub fn reset(&self, max_sleep: Duration) {
        self.word(0).store(0, Ordering::Relaxed);
        self.word(1).store(0, Ordering::Relaxed);
        self.word(2).store(max_sleep.as_nanos() as u64, Ordering::Release);
    }
}
