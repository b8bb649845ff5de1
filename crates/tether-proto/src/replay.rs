//! The anti-replay window of an authenticated session: each datagram's
//! packet number (covered by its MAC) is taken once. A sliding window of
//! `WINDOW` numbers below the highest seen, as IPsec's (RFC 4303 section
//! 3.4.3) and WireGuard's: a number below the window, or one already seen
//! in it, is a replay and is dropped; reordering within the window is fine.

/// Packet numbers below the highest seen that are still tracked.
pub const WINDOW: u64 = 1024;
const WORDS: usize = (WINDOW / 64) as usize;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ReplayWindow {
    /// The highest packet number taken (0: none yet; numbers start at 1).
    highest: u64,
    /// Bit `i` of the ring: packet number `highest - i` was taken, for
    /// the numbers `highest`, `highest - 1`, ... that fall in the window.
    seen: [u64; WORDS],
}

impl ReplayWindow {
    pub fn new() -> Self {
        ReplayWindow { highest: 0, seen: [0; WORDS] }
    }

    /// A window for a restored session: every number up to `highest`
    /// counts as taken (what arrived before the snapshot is unknown, so a
    /// replay of it must not be taken now).
    pub fn restored(highest: u64) -> Self {
        ReplayWindow { highest, seen: [u64::MAX; WORDS] }
    }

    /// The highest number taken.
    pub fn highest(&self) -> u64 {
        self.highest
    }

    /// Take `pn` if it is new: true, and it is recorded; false for a
    /// replay (or 0, which no session datagram carries).
    pub fn take(&mut self, pn: u64) -> bool {
        if pn == 0 {
            return false;
        }
        if pn > self.highest {
            let shift = pn - self.highest;
            if shift >= WINDOW {
                self.seen = [0; WORDS];
            } else {
                for _ in 0..shift {
                    self.highest += 1;
                    self.clear(self.highest);
                }
            }
            self.highest = pn;
            self.set(pn);
            return true;
        }
        if self.highest - pn >= WINDOW || self.get(pn) {
            return false;
        }
        self.set(pn);
        true
    }

    fn bit(pn: u64) -> (usize, u64) {
        let i = pn % WINDOW;
        ((i / 64) as usize, 1 << (i % 64))
    }
    fn get(&self, pn: u64) -> bool {
        let (w, b) = Self::bit(pn);
        self.seen[w] & b != 0
    }
    fn set(&mut self, pn: u64) {
        let (w, b) = Self::bit(pn);
        self.seen[w] |= b;
    }
    fn clear(&mut self, pn: u64) {
        let (w, b) = Self::bit(pn);
        self.seen[w] &= !b;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_number_is_taken_once_reordered_or_not() {
        let mut w = ReplayWindow::new();
        assert!(!w.take(0));
        for pn in [5, 3, 4, 1, 2, 10, 7] {
            assert!(w.take(pn), "{pn} is new");
        }
        for pn in [5, 3, 4, 1, 2, 10, 7] {
            assert!(!w.take(pn), "{pn} again is a replay");
        }
        assert!(w.take(6) && w.take(8) && w.take(9));
        // Far ahead: the whole window moves; below it everything is refused.
        assert!(w.take(10 + 5 * WINDOW));
        assert!(!w.take(10), "below the window");
        assert!(w.take(10 + 5 * WINDOW - 1), "just below the highest, unseen");
        assert!(!w.take(10 + 4 * WINDOW), "exactly a window below");
        // A restored window refuses everything up to where it was.
        let mut r = ReplayWindow::restored(100);
        assert!(!r.take(100) && !r.take(50) && r.take(101));
    }

    #[test]
    fn a_sliding_window_forgets_only_what_falls_out() {
        let mut w = ReplayWindow::new();
        for pn in 1..=3 * WINDOW {
            assert!(w.take(pn));
            assert!(!w.take(pn));
            if pn > WINDOW {
                assert!(!w.take(pn - WINDOW), "out of the window");
            }
        }
    }
}
