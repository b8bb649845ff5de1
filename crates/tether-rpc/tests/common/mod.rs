//! What the crash tests share with the simulator's calls mix
//! (`tether_sim::calls`): a log that can die in the middle of a write,
//! and the check of every call's end against what actually ran.

use std::collections::BTreeMap;

use tether_rpc::{CallRef, Caller};
/// The simulator's calls mix has the same log and the same check.
pub use tether_sim::calls::DyingLog;

/// Every call ended, none ran twice, and what each final state says of
/// its handler is true (`effects`: how often each call's handler took
/// effect, by (client, seq)). How many ended in each `Executed`.
pub fn check_ends(
    seed: u64,
    calls: &[CallRef],
    caller: &Caller,
    effects: &BTreeMap<(u64, u64), u32>,
) -> [usize; 3] {
    let mut violations = Vec::new();
    let claims = tether_sim::calls::check_ends(calls, caller, effects, &mut violations);
    assert!(violations.is_empty(), "seed {seed}: {:?}", &violations[..violations.len().min(3)]);
    claims.map(|n| n as usize)
}

/// What runs over many seeds came to, summed: crashes, calls, and the
/// calls that ended in each `Executed`.
pub struct Sweep {
    pub crashes: u32,
    pub calls: usize,
    pub claims: [usize; 3],
}

/// `run` at every seed of `seeds` (each giving its crashes, calls and
/// claims), summed and printed.
pub fn sweep(seeds: std::ops::Range<u64>, run: impl Fn(u64) -> (u32, usize, [usize; 3])) -> Sweep {
    let mut t = Sweep { crashes: 0, calls: 0, claims: [0; 3] };
    for seed in seeds {
        let (c, n, k) = run(seed);
        t.crashes += c;
        t.calls += n;
        (0..3).for_each(|i| t.claims[i] += k[i]);
    }
    eprintln!(
        "{} crashes, {} calls: ran {}, did not run {}, unknown {}",
        t.crashes, t.calls, t.claims[0], t.claims[1], t.claims[2]
    );
    t
}
