//! What an application's client takes from the machine it runs on: a
//! clock, the scheduler (to let its engine run while it waits) and a
//! random source. The real machine for every application; a simulator's
//! for a client driven in one thread beside an engine loop on virtual
//! time (TigerBeetle's way: time and the scheduler behind an interface, so
//! the same client code runs in the deterministic simulation).
//!
//! Every wait of the client - for the engine's answer to an attachment,
//! for room in a ring, for a delivery, for a new engine after one died -
//! goes through here and nothing else: in a simulation, waiting is what
//! makes the world (the engine, the network) move on.

use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::{Duration, Instant as StdInstant};

use crate::attach;

/// The clock, the scheduler and the random source of a client.
pub trait Machine: Send + Sync + std::fmt::Debug {
    /// Time since an origin of the machine's choosing (monotonic).
    fn now(&self) -> Duration;
    /// Let others run (the engine may be waiting for this core).
    fn yield_now(&self);
    /// Sleep until one of `fds` is readable (each a `pollfd` asking for
    /// `POLLIN` or `POLLRDHUP`; `revents` filled in as `ppoll` does) or
    /// `timeout` passes.
    fn sleep_on(&self, fds: &mut [libc::pollfd], timeout: Duration);
    /// Fill `buf` with secret random bytes.
    fn entropy(&self, buf: &mut [u8]) -> std::io::Result<()>;
    /// Whether a watcher thread keeps the attachment (a new engine taken
    /// at once when one dies, while the application is away). A simulator
    /// runs everything in one thread and calls `Client::check_engine`
    /// itself.
    fn watcher(&self) -> bool {
        true
    }
}

/// The real machine: the monotonic clock, the kernel's scheduler and
/// `/dev/urandom`.
#[derive(Debug)]
pub struct RealMachine {
    origin: StdInstant,
}

impl RealMachine {
    /// The one real machine of this process.
    pub fn shared() -> Arc<dyn Machine> {
        static REAL: std::sync::OnceLock<Arc<RealMachine>> = std::sync::OnceLock::new();
        REAL.get_or_init(|| Arc::new(RealMachine { origin: StdInstant::now() })).clone()
    }
}

impl Machine for RealMachine {
    fn now(&self) -> Duration {
        self.origin.elapsed()
    }

    fn yield_now(&self) {
        std::thread::yield_now();
    }

    fn sleep_on(&self, fds: &mut [libc::pollfd], timeout: Duration) {
        // A failed sleep is a short one: the caller looks again.
        let _ = attach::sleep_on(fds, timeout);
    }

    fn entropy(&self, buf: &mut [u8]) -> std::io::Result<()> {
        use std::io::Read;
        std::fs::File::open("/dev/urandom")?.read_exact(buf)
    }
}

/// Poll `fds` without waiting: whether any is ready (for a machine whose
/// sleep moves a world on rather than waiting in the kernel).
pub fn ready_now(fds: &mut [libc::pollfd]) -> bool {
    let _ = attach::sleep_on(fds, Duration::ZERO);
    fds.iter().any(|f| f.revents != 0)
}

/// One descriptor to sleep on for input.
pub(crate) fn readable(fd: RawFd) -> libc::pollfd {
    libc::pollfd { fd, events: libc::POLLIN, revents: 0 }
}
