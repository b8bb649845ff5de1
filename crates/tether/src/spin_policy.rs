//! When a blocked call busy-polls before it sleeps (Trahay et al. [NMAD]
//! section 4, the progress engine's waiting; docs/REFERENCES.md): spinning
//! pays only while the answer comes within the spin, and on a machine
//! whose cores are taken by other work it is what delays the answer.
//!
//! Beside processes that block and wake (`tether bench contention
//! --external wake`: two shell loops of `sleep 0.0005`), an 8 B round trip
//! between two threads that each spin 50 us and then sleep took 108 us,
//! and about twice the spin at every length tried (5 us: 18 us, 10: 36,
//! 20: 48, 200: 429), against 7.6 us for two threads that never spin and
//! 5.5 us for two that spin a whole millisecond: a thread that slept and
//! was woken by its answer waited for a core, and the core was the other
//! thread's, spinning out its time for an answer that this one was to
//! send. Yielding the core while spinning made it 26 us, whatever the spin.
//!
//! So a spin that ran out without its answer is evidence against the
//! next: an endpoint whose spin failed skips spinning for its next wait,
//! then two, four, up to `MAX_SKIP`, trying again after each run of skips,
//! and a spin that caught its answer starts the count again. An endpoint
//! whose peer answers within the spin (an idle machine, the same round
//! trips) always spins; one whose peer takes longer mostly sleeps at once.
//! Beside busy cores that is what does best; where the peer computes
//! before it answers, on idle cores, it costs: the answer's datagrams then
//! wake the thread one by one (a 256 KiB round trip between a sender that
//! verifies and fills each message and an echo that copies it: about 8%
//! slower, docs/RESULTS.md, "Beside other processes").

use std::sync::atomic::{AtomicU32, Ordering};

/// The longest run of waits that skip spinning after spins failed: one
/// spin in about this many costs a failing endpoint a spin's time.
const MAX_SKIP: u32 = 256;

/// An endpoint's record of how its blocked calls' spins went.
#[derive(Debug, Default)]
pub(crate) struct SpinPolicy {
    /// Waits left that sleep at once.
    skip: AtomicU32,
    /// The next run of skips after a failed spin (0: none yet).
    next_skip: AtomicU32,
}

impl SpinPolicy {
    /// Whether a wait beginning now may spin (a wait that may not counts
    /// toward the skips).
    pub fn may_spin(&self) -> bool {
        // Relaxed: a count off by one between two racing calls is harmless.
        let left = self.skip.load(Ordering::Relaxed);
        if left == 0 {
            return true;
        }
        self.skip.store(left - 1, Ordering::Relaxed);
        false
    }

    /// A wait ends with `r`; `spun`: while spinning, which caught it.
    pub fn served<R>(&self, r: R, spun: bool) -> R {
        if spun {
            self.caught();
        }
        r
    }

    /// A spin caught what it waited for.
    pub fn caught(&self) {
        if self.next_skip.load(Ordering::Relaxed) != 0 {
            self.next_skip.store(0, Ordering::Relaxed);
        }
    }

    /// A spin ran out: the next waits sleep at once, twice as many as after
    /// the last failure.
    pub fn ran_out(&self) {
        let next = self.next_skip.load(Ordering::Relaxed);
        let skip = next.clamp(1, MAX_SKIP);
        self.skip.store(skip, Ordering::Relaxed);
        self.next_skip.store((skip * 2).min(MAX_SKIP), Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn skipped(p: &SpinPolicy) -> u32 {
        let mut n = 0;
        while !p.may_spin() {
            n += 1;
        }
        n
    }

    #[test]
    fn failures_double_the_skips_up_to_the_bound_and_a_catch_resets_them() {
        let p = SpinPolicy::default();
        assert!(p.may_spin(), "spins at first");
        let mut runs = Vec::new();
        for _ in 0..11 {
            p.ran_out();
            runs.push(skipped(&p));
        }
        assert_eq!(runs, [1, 2, 4, 8, 16, 32, 64, 128, 256, 256, 256]);
        p.caught();
        p.ran_out();
        assert_eq!(skipped(&p), 1, "a catch starts the count again");
        p.caught();
        assert!(p.may_spin() && p.may_spin(), "no skips while spins catch");
    }
}
