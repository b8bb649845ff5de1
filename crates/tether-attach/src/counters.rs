//! What an engine tells each application about its own checking, beside
//! the application's protocol counters and the fault injectors' (one
//! `Counters` record, `records::Completion::Counters`): the self-test's
//! probes and the time the self-test and the state audit took (Zhou et
//! al. [FTGM] section 4, whose bar is what this checking costs). Each
//! engine counts from zero; an application adds up the engines that
//! served it.

/// The engine's checking, as one engine (or the sum of several) reports it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineCounters {
    /// Self-test probes sent through the rails.
    pub selftest_probes: u64,
    /// Of them, those delivered exact.
    pub selftest_passed: u64,
    /// Time the self-test took.
    pub selftest_ns: u64,
    /// Time the audit of the engine's state took.
    pub audit_ns: u64,
}

impl EngineCounters {
    /// How many values `values` gives.
    pub const COUNT: usize = 4;

    /// The counters in record order (`Completion::Counters`).
    pub fn values(&self) -> [u64; Self::COUNT] {
        [self.selftest_probes, self.selftest_passed, self.selftest_ns, self.audit_ns]
    }

    /// The inverse of `values` (missing values are 0).
    pub fn from_values(values: impl IntoIterator<Item = u64>) -> Self {
        let mut v = values.into_iter();
        let mut next = || v.next().unwrap_or(0);
        EngineCounters {
            selftest_probes: next(),
            selftest_passed: next(),
            selftest_ns: next(),
            audit_ns: next(),
        }
    }

    /// Add another engine's counts (an application served by several).
    pub fn accumulate(&mut self, other: &EngineCounters) {
        self.selftest_probes += other.selftest_probes;
        self.selftest_passed += other.selftest_passed;
        self.selftest_ns += other.selftest_ns;
        self.audit_ns += other.audit_ns;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_round_trip() {
        let c = EngineCounters { selftest_probes: 1, selftest_passed: 2, selftest_ns: 3, audit_ns: 4 };
        assert_eq!(EngineCounters::from_values(c.values()), c);
        let mut sum = c;
        sum.accumulate(&c);
        assert_eq!(sum.values(), [2, 4, 6, 8]);
    }
}
