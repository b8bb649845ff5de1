//! Time as the core sees it: a plain number handed in by the driver.
//!
//! The core never reads a clock (docs/ARCHITECTURE.md, "The sans-IO boundary"): the runtime converts
//! `std::time::Instant` into this, the simulator advances it virtually.

use core::ops::{Add, Sub};
use core::time::Duration;

/// Nanoseconds since an origin the driver chooses. With the `serde`
/// feature it is that plain number: the origin means nothing outside the
/// driver, so nothing more could be written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize), serde(transparent))]
pub struct Instant(u64);

impl Instant {
    /// The driver's origin.
    pub const ZERO: Instant = Instant(0);

    /// The instant `nanos` after the origin: how a driver hands time in.
    pub const fn from_nanos(nanos: u64) -> Self {
        Instant(nanos)
    }
    /// Nanoseconds since the origin, for a driver converting back.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }
    /// Time from `earlier` to `self`, zero if `earlier` is later.
    pub fn saturating_since(self, earlier: Instant) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

impl Add<Duration> for Instant {
    type Output = Instant;
    fn add(self, d: Duration) -> Instant {
        Instant(self.0.saturating_add(d.as_nanos().min(u64::MAX as u128) as u64))
    }
}

impl Sub<Instant> for Instant {
    type Output = Duration;
    fn sub(self, earlier: Instant) -> Duration {
        self.saturating_since(earlier)
    }
}
