//! The functional fault model of seeds/002 (Table 2), for datagrams: drop,
//! duplicate, modify (bit flips) and reorder, each with a probability per
//! datagram, driven by a seeded RNG so a run replays exactly.
//!
//! Pure: no I/O, no clock. A transport wrapper (tether-io) applies it to
//! real sockets on the receive side, where seeds/002 Table 4 places delay,
//! reorder and modify faults. The issue "Functional fault injector and
//! fault campaigns" grows this into the full model (delay distributions,
//! inject, invocation and operation faults, schedules).

use std::collections::VecDeque;

use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64Mcg;
use serde::Serialize;

/// Probability of each fault per datagram, each in [0, 1].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FaultSpec {
    pub recv_loss: f64,
    pub recv_duplicate: f64,
    pub recv_corrupt: f64,
    /// The datagram is held back and released after 1 to `reorder_depth` later ones.
    pub recv_reorder: f64,
    pub reorder_depth: usize,
}

impl FaultSpec {
    pub fn is_clean(&self) -> bool {
        self.recv_loss == 0.0
            && self.recv_duplicate == 0.0
            && self.recv_corrupt == 0.0
            && self.recv_reorder == 0.0
    }
}

/// How many of each fault were injected.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct FaultCounters {
    pub seen: u64,
    pub dropped: u64,
    pub duplicated: u64,
    pub corrupted: u64,
    pub reordered: u64,
}

impl FaultCounters {
    pub fn accumulate(&mut self, o: &FaultCounters) {
        self.seen += o.seen;
        self.dropped += o.dropped;
        self.duplicated += o.duplicated;
        self.corrupted += o.corrupted;
        self.reordered += o.reordered;
    }
}

/// Most datagrams held back for reordering at once; beyond it a held one is
/// released early, so memory stays bounded.
const MAX_HELD: usize = 64;

pub struct Injector {
    spec: FaultSpec,
    rng: Pcg64Mcg,
    /// (datagrams still to pass before release, bytes)
    held: VecDeque<(usize, Vec<u8>)>,
    /// Buffers of released datagrams, reused for the next held ones.
    spare: Vec<Vec<u8>>,
    pub counters: FaultCounters,
}

impl Injector {
    pub fn new(spec: FaultSpec, seed: u64) -> Self {
        Injector {
            spec,
            rng: Pcg64Mcg::seed_from_u64(seed),
            held: VecDeque::new(),
            spare: Vec::new(),
            counters: FaultCounters::default(),
        }
    }

    fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && self.rng.gen_bool(p.min(1.0))
    }

    /// Apply the faults to one arriving datagram; `deliver` receives what
    /// comes out (nothing, it once or twice, possibly modified, and any
    /// held-back datagrams whose turn has come).
    pub fn on_datagram(&mut self, datagram: &mut [u8], mut deliver: impl FnMut(&[u8])) {
        self.counters.seen += 1;
        if self.chance(self.spec.recv_loss) {
            self.counters.dropped += 1;
        } else {
            if self.chance(self.spec.recv_corrupt) && !datagram.is_empty() {
                let bit = self.rng.gen_range(0..datagram.len() * 8);
                datagram[bit / 8] ^= 1 << (bit % 8);
                self.counters.corrupted += 1;
            }
            let copies = if self.chance(self.spec.recv_duplicate) {
                self.counters.duplicated += 1;
                2
            } else {
                1
            };
            if self.chance(self.spec.recv_reorder) {
                self.counters.reordered += 1;
                let wait = self.rng.gen_range(1..=self.spec.reorder_depth.max(1));
                let mut buf = self.spare.pop().unwrap_or_default();
                buf.clear();
                buf.extend_from_slice(datagram);
                self.held.push_back((wait, buf));
                if copies == 2 {
                    deliver(datagram);
                }
            } else {
                for _ in 0..copies {
                    deliver(datagram);
                }
            }
        }
        self.release(&mut deliver, false);
    }

    /// Count one more datagram past every held one and release those due
    /// (all of them when `all`).
    fn release(&mut self, deliver: &mut impl FnMut(&[u8]), all: bool) {
        let overfull = self.held.len().saturating_sub(MAX_HELD);
        let mut i = 0;
        while i < self.held.len() {
            let entry = &mut self.held[i];
            entry.0 = entry.0.saturating_sub(1);
            if entry.0 == 0 || all || i < overfull {
                let (_, buf) = self.held.remove(i).expect("index in range");
                deliver(&buf);
                self.spare.push(buf);
            } else {
                i += 1;
            }
        }
    }

    /// Release everything held: when the link goes quiet, a reordered
    /// datagram is late, not lost.
    pub fn flush(&mut self, mut deliver: impl FnMut(&[u8])) {
        self.release(&mut deliver, true);
    }

    pub fn holding(&self) -> usize {
        self.held.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(spec: FaultSpec, n: u64) -> (Injector, Vec<Vec<u8>>) {
        let mut inj = Injector::new(spec, 42);
        let mut out = Vec::new();
        for i in 0..n {
            let mut d = i.to_le_bytes().to_vec();
            inj.on_datagram(&mut d, |b| out.push(b.to_vec()));
        }
        inj.flush(|b| out.push(b.to_vec()));
        (inj, out)
    }

    /// |observed - expected| within 5 standard deviations of a binomial.
    fn near(observed: u64, n: u64, p: f64) -> bool {
        let mean = n as f64 * p;
        let sd = (n as f64 * p * (1.0 - p)).sqrt();
        (observed as f64 - mean).abs() <= 5.0 * sd + 1.0
    }

    #[test]
    fn clean_spec_passes_everything_in_order() {
        let (inj, out) = run(FaultSpec::default(), 1000);
        assert_eq!(out.len(), 1000);
        assert!(out.iter().enumerate().all(|(i, d)| d == &(i as u64).to_le_bytes()));
        assert_eq!(inj.counters.seen, 1000);
    }

    #[test]
    fn each_fault_at_its_rate() {
        let n = 100_000;
        let spec = FaultSpec {
            recv_loss: 0.05,
            recv_duplicate: 0.02,
            recv_corrupt: 0.01,
            recv_reorder: 0.03,
            reorder_depth: 4,
        };
        let (inj, out) = run(spec, n);
        let c = inj.counters;
        assert!(near(c.dropped, n, 0.05), "{c:?}");
        // The others are drawn only for datagrams that were not dropped.
        let kept = n - c.dropped;
        assert!(near(c.duplicated, kept, 0.02), "{c:?}");
        assert!(near(c.corrupted, kept, 0.01), "{c:?}");
        assert!(near(c.reordered, kept, 0.03), "{c:?}");
        assert_eq!(out.len() as u64, kept + c.duplicated, "reordered datagrams are late, never lost");
        let index = |d: &Vec<u8>| u64::from_le_bytes(d[..8].try_into().unwrap());
        let out_of_order = out.windows(2).filter(|w| index(&w[1]) < index(&w[0])).count();
        assert!(out_of_order > 0);
    }

    #[test]
    fn same_seed_same_faults() {
        let spec = FaultSpec { recv_loss: 0.1, recv_reorder: 0.1, reorder_depth: 3, ..FaultSpec::default() };
        assert_eq!(run(spec.clone(), 5000).1, run(spec, 5000).1);
    }
}
