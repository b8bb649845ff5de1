//! The one place the runtime reads the wall clock, converting it into the
//! core's `Instant` (docs/ARCHITECTURE.md, "The sans-IO boundary": the core
//! itself never reads a clock).

use std::time::Instant as StdInstant;

use tether_proto::Instant;

/// The core's time at the clock's origin: 1 s, so no timestamp is ever
/// zero (zero reads as "unset" in logs).
const ORIGIN_NS: u64 = 1_000_000_000;

#[derive(Debug, Clone, Copy)]
pub(crate) struct Clock {
    origin: StdInstant,
}

impl Clock {
    pub fn new() -> Self {
        Clock { origin: StdInstant::now() }
    }

    pub fn now(&self) -> Instant {
        self.at(StdInstant::now())
    }

    /// The wall-clock instant of the core's time `t`.
    pub fn wall(&self, t: Instant) -> StdInstant {
        self.origin + core::time::Duration::from_nanos(t.as_nanos().saturating_sub(ORIGIN_NS))
    }

    /// The core's time for a wall-clock reading the caller already has.
    pub fn at(&self, t: StdInstant) -> Instant {
        Instant::from_nanos(ORIGIN_NS + t.saturating_duration_since(self.origin).as_nanos() as u64)
    }
}
