//! The node's one clock, read by the engine, its supervisor, its pairs
//! and its self-test alike (and by the applications, through the region).

/// CLOCK_MONOTONIC in nanoseconds: one clock for every process on the node.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid timespec to write into.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
