//! A deterministic discrete-event simulator for tether's sans-IO core
//! (docs/ARCHITECTURE.md, "The simulator"): virtual time, seeded faults on
//! every link (the same `tether_fault::Injector` real transports are wrapped
//! in), a verified workload, and the guarantees checked at the end of every
//! run. A failing run prints `replay with seed=N mix=NAME`; the same seed
//! replays it exactly.

pub mod calls;
mod checker;
mod config;
pub mod engines;
pub mod fabric;
mod forger;
pub mod membership;
mod nacked;
pub mod net;
mod report;
pub mod routed;
mod sim;
pub mod topology;
mod unreliable;

pub use checker::{fingerprint, Checker, StreamKey, Violation};
pub use config::{plan, FabricPlan, FaultMix, LinkCut, SimConfig, Workload};
pub use net::{Fate, Link, Sent, VirtualNet};
pub use report::{LinkCounters, SimReport};
pub use sim::run;

/// Run `mix` at every seed in `seeds`, calling `progress` after each.
pub fn swarm(mix: FaultMix, seeds: std::ops::Range<u64>, progress: impl FnMut(&SimReport)) -> Vec<SimReport> {
    swarm_with(mix, seeds, 1, |_| {}, progress)
}

/// Run `mix` at every seed in `seeds` on `threads` threads, each run's
/// configuration first changed by `adjust` (the members of a membership
/// mix, say), calling `progress` on the caller's thread as each run ends.
/// The reports come back in seed order; each run is its seed's alone, so
/// they are the same on any number of threads.
pub fn swarm_with(
    mix: FaultMix,
    seeds: std::ops::Range<u64>,
    threads: usize,
    adjust: impl Fn(&mut SimConfig) + Sync,
    mut progress: impl FnMut(&SimReport),
) -> Vec<SimReport> {
    let next = std::sync::atomic::AtomicU64::new(seeds.start);
    let (done, reports) = std::sync::mpsc::channel();
    let mut out: Vec<Option<SimReport>> = (seeds.start..seeds.end).map(|_| None).collect();
    std::thread::scope(|s| {
        for _ in 0..threads.max(1) {
            let done = done.clone();
            let (next, adjust, end) = (&next, &adjust, seeds.end);
            s.spawn(move || loop {
                let seed = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if seed >= end {
                    return;
                }
                let mut cfg = mix.config(seed);
                adjust(&mut cfg);
                // The receiver lives until every run is in.
                let _ = done.send(run(&cfg));
            });
        }
        drop(done);
        for report in reports {
            progress(&report);
            let at = (report.seed - seeds.start) as usize;
            out[at] = Some(report);
        }
    });
    out.into_iter().flatten().collect()
}

/// How to replay a failed run.
pub fn replay_line(r: &SimReport) -> String {
    format!("replay with seed={} mix={}", r.seed, r.mix)
}
