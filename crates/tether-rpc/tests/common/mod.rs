//! What the crash tests share: a log that can die in the middle of a
//! write, and the check of every call's end against what actually ran.

use std::collections::BTreeMap;

use tether_rpc::{CallLog, CallRef, Caller, Executed, LogError, MemLog, Record};

/// A log that dies in the middle of its next append when told to: half
/// the record is written, and the write fails.
pub struct DyingLog {
    pub log: MemLog,
    pub tear_next: bool,
}

impl DyingLog {
    pub fn new(capacity: usize) -> Self {
        DyingLog { log: MemLog::new(capacity), tear_next: false }
    }
}

impl CallLog for DyingLog {
    fn append(&mut self, record: &Record<'_>) -> Result<(), LogError> {
        if self.tear_next {
            let before = self.log.bytes().len();
            self.log.append(record)?;
            self.log.tear(before + record.len() / 2);
            return Err(LogError::Io("the process died in the write".into()));
        }
        self.log.append(record)
    }
    fn compact(&mut self, live: &[Record<'_>]) -> Result<(), LogError> {
        self.log.compact(live)
    }
}

/// Every call ended, none ran twice, and what each final state says of
/// its handler is true (`effects`: how often each call's handler took
/// effect, by (client, seq)). How many ended in each `Executed`.
pub fn check_ends(
    seed: u64,
    calls: &[CallRef],
    caller: &Caller,
    effects: &BTreeMap<(u64, u64), u32>,
) -> [usize; 3] {
    let mut claims = [0; 3];
    for &call in calls {
        let state = caller.state(call).expect("kept");
        assert_eq!(caller.finished(call), Some(true), "seed {seed}: {call:?} never ended: {state:?}");
        let ran = effects.get(&(call.id.client, call.id.seq)).copied().unwrap_or(0);
        assert!(ran <= 1, "seed {seed}: {call:?} ran {ran} times");
        claims[state.executed() as usize] += 1;
        match state.executed() {
            Executed::Yes => assert_eq!(ran, 1, "seed {seed}: {call:?} says it ran: {state:?}"),
            Executed::No => assert_eq!(ran, 0, "seed {seed}: {call:?} says it did not run: {state:?}"),
            Executed::Unknown => {}
        }
    }
    claims
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
