//! How a service command (`tether engine`, `tether metrics`) is stopped:
//! SIGINT or SIGTERM, or the command that started it gone, sets one flag
//! its loop watches, and it stops cleanly (its files removed, exit 0). A
//! signal handler that stores to an atomic is all: the engine's
//! supervisor forks, so nothing here may take a lock another thread holds.

use std::sync::atomic::{AtomicBool, Ordering};

/// Set when the service is to stop.
pub static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

/// Stop at SIGINT or SIGTERM.
pub fn handle_interrupts() {
    // SAFETY: installs a handler that only stores to an atomic.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
}

/// Stop as SIGTERM would (the command that started this one is gone).
pub fn stop() {
    STOP.store(true, Ordering::Relaxed);
}

/// Is the service to stop?
pub fn stopping() -> bool {
    STOP.load(Ordering::Relaxed)
}
