//! `tether bench checksum --errors`: how often each algorithm misses a
//! corruption, per error pattern (Trahay et al. [NMAD] section 5.1 warns
//! that plain sums and xors miss errors a CRC catches; this measures it).
//!
//! Each trial takes one of a few random messages, corrupts a copy with the
//! pattern (redrawn until the bytes really differ), and counts the trial
//! as undetected when the algorithm's checksum of the copy equals that of
//! the original. Every algorithm sees the same corrupted messages. Trials
//! are split over the cores; the seed fixes the whole table.

use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64Mcg;
use serde::Serialize;
use tether_wire::ChecksumKind;

/// Distinct random messages the trials draw from: enough that no
/// structure of one message dominates, few enough to stay in cache.
const MESSAGES: usize = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Pattern {
    /// One bit flipped anywhere.
    SingleBit,
    /// Two distinct bits flipped anywhere.
    TwoBits,
    /// A burst of 2 to 32 bits: its first and last bit flipped, the bits
    /// between flipped at random.
    Burst32,
    /// 1 to 64 consecutive bytes overwritten with random bytes.
    Overwrite,
    /// Two distinct aligned 64-bit words exchanged.
    WordSwap,
}

impl Pattern {
    pub const ALL: [Pattern; 5] =
        [Pattern::SingleBit, Pattern::TwoBits, Pattern::Burst32, Pattern::Overwrite, Pattern::WordSwap];

    pub fn label(self) -> &'static str {
        match self {
            Pattern::SingleBit => "1-bit flip",
            Pattern::TwoBits => "2-bit flip",
            Pattern::Burst32 => "burst <= 32 bits",
            Pattern::Overwrite => "overwrite 1-64 B",
            Pattern::WordSwap => "swap 64-bit words",
        }
    }

    /// Corrupt `m` in place; returns false if the pattern left it unchanged
    /// (the caller redraws: an unchanged message is not a corruption).
    fn apply(self, m: &mut [u8], rng: &mut Pcg64Mcg) -> bool {
        let bits = m.len() * 8;
        let flip = |m: &mut [u8], bit: usize| m[bit / 8] ^= 1 << (bit % 8);
        match self {
            Pattern::SingleBit => flip(m, rng.gen_range(0..bits)),
            Pattern::TwoBits => {
                let a = rng.gen_range(0..bits);
                let b = (a + rng.gen_range(1..bits)) % bits;
                flip(m, a);
                flip(m, b);
            }
            Pattern::Burst32 => {
                let len = rng.gen_range(2..=32.min(bits));
                let start = rng.gen_range(0..=bits - len);
                flip(m, start);
                flip(m, start + len - 1);
                for bit in start + 1..start + len - 1 {
                    if rng.gen() {
                        flip(m, bit);
                    }
                }
            }
            Pattern::Overwrite => {
                let len = rng.gen_range(1..=64.min(m.len()));
                let start = rng.gen_range(0..=m.len() - len);
                let before = m[start..start + len].to_vec();
                rng.fill(&mut m[start..start + len]);
                return m[start..start + len] != before[..];
            }
            Pattern::WordSwap => {
                let words = m.len() / 8;
                let a = rng.gen_range(0..words);
                let b = (a + rng.gen_range(1..words)) % words;
                let (wa, wb) = (word(m, a), word(m, b));
                if wa == wb {
                    return false;
                }
                m[8 * a..8 * a + 8].copy_from_slice(&wb);
                m[8 * b..8 * b + 8].copy_from_slice(&wa);
            }
        }
        true
    }
}

fn word(m: &[u8], i: usize) -> [u8; 8] {
    m[8 * i..8 * i + 8].try_into().expect("an aligned 8-byte word")
}

/// Undetected corruptions of one algorithm under one pattern.
#[derive(Debug, Clone, Serialize)]
pub struct Cell {
    pub pattern: Pattern,
    pub trials: u64,
    pub undetected: u64,
    pub fraction: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct AlgorithmDetection {
    pub name: &'static str,
    pub cells: Vec<Cell>,
}

#[derive(Debug, Clone, Serialize)]
pub struct DetectionReport {
    pub message_bytes: usize,
    pub trials_per_pattern: u64,
    pub seed: u64,
    pub algorithms: Vec<AlgorithmDetection>,
}

impl DetectionReport {
    pub fn undetected(&self, kind: ChecksumKind, pattern: Pattern) -> Option<u64> {
        let a = self.algorithms.iter().find(|a| a.name == kind.name())?;
        a.cells.iter().find(|c| c.pattern == pattern).map(|c| c.undetected)
    }
}

/// Count undetected corruptions for `trials` trials of `pattern`, drawing
/// from `rng`; one count per entry of `kinds`.
fn count(kinds: &[ChecksumKind], pattern: Pattern, len: usize, trials: u64, rng: &mut Pcg64Mcg) -> Vec<u64> {
    let messages: Vec<Vec<u8>> = (0..MESSAGES)
        .map(|_| {
            let mut m = vec![0u8; len];
            rng.fill(&mut m[..]);
            m
        })
        .collect();
    let good: Vec<Vec<u64>> =
        messages.iter().map(|m| kinds.iter().map(|k| k.compute(&[m])).collect()).collect();
    let mut missed = vec![0u64; kinds.len()];
    let mut copy = vec![0u8; len];
    for _ in 0..trials {
        let i = rng.gen_range(0..MESSAGES);
        loop {
            copy.copy_from_slice(&messages[i]);
            if pattern.apply(&mut copy, rng) {
                break;
            }
        }
        for (j, k) in kinds.iter().enumerate() {
            if k.compute(&[&copy]) == good[i][j] {
                missed[j] += 1;
            }
        }
    }
    missed
}

/// The whole table: every pattern, `trials` each, split over two threads
/// (the machine's cores) with seeds derived from `seed`.
pub fn measure(
    kinds: &[ChecksumKind],
    len: usize,
    trials: u64,
    seed: u64,
    progress: &dyn Fn(&str),
) -> DetectionReport {
    let len = len.max(16);
    let mut algorithms: Vec<AlgorithmDetection> =
        kinds.iter().map(|k| AlgorithmDetection { name: k.name(), cells: Vec::new() }).collect();
    for (p, pattern) in Pattern::ALL.into_iter().enumerate() {
        progress(pattern.label());
        let halves = [trials / 2, trials - trials / 2];
        let counts: Vec<Vec<u64>> = std::thread::scope(|s| {
            let handles: Vec<_> = halves
                .iter()
                .enumerate()
                .map(|(h, &n)| {
                    s.spawn(move || {
                        let mut rng = Pcg64Mcg::seed_from_u64(seed ^ ((p as u64) << 32 | h as u64));
                        count(kinds, pattern, len, n, &mut rng)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().expect("a detection thread panicked")).collect()
        });
        for (j, a) in algorithms.iter_mut().enumerate() {
            let undetected = counts.iter().map(|c| c[j]).sum();
            a.cells.push(Cell {
                pattern,
                trials,
                undetected,
                fraction: undetected as f64 / trials.max(1) as f64,
            });
        }
    }
    DetectionReport { message_bytes: len, trials_per_pattern: trials, seed, algorithms }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> DetectionReport {
        measure(&ChecksumKind::ALL, 256, 20_000, 7, &|_| {})
    }

    #[test]
    fn none_misses_everything_and_crc32c_nothing() {
        let r = report();
        for p in Pattern::ALL {
            assert_eq!(r.undetected(ChecksumKind::None, p), Some(20_000), "{p:?}");
            assert_eq!(r.undetected(ChecksumKind::Crc32c, p), Some(0), "{p:?}");
        }
    }

    #[test]
    fn sum_and_xor_miss_what_crc32c_catches() {
        // [NMAD]'s warning, measured: a sum or xor of words is blind to
        // the order of the words, and xor to two flips in one bit column.
        let r = report();
        for k in [ChecksumKind::Sum, ChecksumKind::Xor] {
            assert_eq!(r.undetected(k, Pattern::WordSwap), Some(20_000), "{}", k.name());
            assert_eq!(r.undetected(k, Pattern::SingleBit), Some(0), "{}", k.name());
        }
        // Two flips in the same bit of different words: 1/64 of pairs for xor.
        let xor_two = r.undetected(ChecksumKind::Xor, Pattern::TwoBits).unwrap();
        assert!((150..=500).contains(&xor_two), "xor missed {xor_two} of 20000 two-bit errors");
        assert!(r.undetected(ChecksumKind::Sum, Pattern::TwoBits).unwrap() > 0);
        // Fletcher's position-weighted second sum sees a swap.
        assert_eq!(r.undetected(ChecksumKind::Fletcher64, Pattern::WordSwap), Some(0));
    }

    #[test]
    fn every_pattern_changes_the_message() {
        let mut rng = Pcg64Mcg::seed_from_u64(3);
        let m: Vec<u8> = (0..64).map(|i| i as u8).collect();
        for p in Pattern::ALL {
            for _ in 0..1000 {
                let mut c = m.clone();
                if p.apply(&mut c, &mut rng) {
                    assert_ne!(c, m, "{p:?} reported a change it did not make");
                }
            }
        }
    }
}
