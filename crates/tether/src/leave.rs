//! Leave to work inside a blocking call: which of a process's application
//! threads may drive an endpoint themselves, which may busy-poll, and when
//! an application counts as away so its endpoint's progress worker takes
//! over (Trahay et al. [NMAD] section 4, the progress engine;
//! docs/REFERENCES.md). Process-wide counts, below both the blocking calls
//! (`shared::block_on`) and the progress workers (`progress`) that read them.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

/// Longest an endpoint is left undriven after its application stops
/// driving it: below the 1 ms retransmission floor, so a computing
/// application costs its peers no spurious retransmission.
pub(crate) const HANDOVER: Duration = Duration::from_micros(500);

/// The cores this process may run on (at least one).
pub(crate) fn cores() -> usize {
    static CORES: OnceLock<usize> = OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Whether the application has been away long enough for the worker to
/// drive its endpoint: `Some(wait)` while it is (or just was) driving.
pub(crate) fn app_away(active: bool, away: Duration) -> Option<Duration> {
    if active || away < HANDOVER {
        Some(HANDOVER.saturating_sub(away).max(HANDOVER / 4))
    } else {
        None
    }
}

/// Application threads of this process driving an endpoint inside a
/// blocking call now, and those of them busy-polling.
static DRIVING: AtomicUsize = AtomicUsize::new(0);
static SPINNING: AtomicUsize = AtomicUsize::new(0);

/// Application threads per core that drive endpoints from blocking calls.
const DRIVERS_PER_CORE: usize = 4;

/// Blocking calls of this process parked for want of a leave to drive
/// (`Permit::take_drive`): while there are any, no call takes a leave, so
/// every endpoint waits for its turn in the same way.
static WAITING: AtomicUsize = AtomicUsize::new(0);

/// Whether calls other than this one (`me`: counted among them) wait for
/// the workers for want of a leave to drive.
pub(crate) fn others_waiting(me: bool) -> bool {
    WAITING.load(Ordering::Acquire) > usize::from(me)
}

/// A blocking call counted among those waiting for the workers.
pub(crate) struct Waiting(());

impl Waiting {
    pub fn new() -> Self {
        WAITING.fetch_add(1, Ordering::AcqRel);
        Waiting(())
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        WAITING.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A place among the threads of this process that do some work inside
/// blocking calls, at most one per core (`take_drive`, `take_spin`).
pub(crate) struct Permit(Option<&'static AtomicUsize>);

impl Permit {
    /// Leave to drive an endpoint from a blocking call. Without one, the
    /// call waits for whoever drives it (the endpoint's worker) to make
    /// progress: 256 endpoints' 512 blocked application threads each
    /// stepping its endpoint and sleeping on its sockets to the next timer
    /// kept 150-190 threads runnable on two cores. A thread then ran every
    /// second or so, its timers fired that late, and the retransmissions
    /// they made kept it so (a 256-node demo never finished).
    pub fn take_drive() -> Option<Self> {
        Self::take(&DRIVING, DRIVERS_PER_CORE * cores())
    }

    /// Leave to busy-poll: so many endpoints' blocked calls in one process
    /// sleep on their sockets instead of taking turns at spinning.
    pub fn take_spin() -> Option<Self> {
        Self::take(&SPINNING, cores())
    }

    /// No place counted: for a call that must drive whatever the others
    /// do (nobody else drives its endpoint).
    pub fn none() -> Self {
        Permit(None)
    }

    fn take(count: &'static AtomicUsize, most: usize) -> Option<Self> {
        if count.fetch_add(1, Ordering::AcqRel) < most {
            Some(Permit(Some(count)))
        } else {
            count.fetch_sub(1, Ordering::AcqRel);
            None
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if let Some(count) = self.0 {
            count.fetch_sub(1, Ordering::AcqRel);
        }
    }
}
