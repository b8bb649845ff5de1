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
mod forger;
mod membership;
mod nacked;
pub mod net;
mod report;
mod sim;
mod unreliable;

pub use checker::{fingerprint, Checker, StreamKey, Violation};
pub use config::{plan, FaultMix, LinkCut, SimConfig, Workload};
pub use net::{Fate, Link, Sent, VirtualNet};
pub use report::{LinkCounters, SimReport};
pub use sim::run;

/// Run `mix` at every seed in `seeds`, calling `progress` after each.
pub fn swarm(
    mix: FaultMix,
    seeds: std::ops::Range<u64>,
    mut progress: impl FnMut(&SimReport),
) -> Vec<SimReport> {
    seeds
        .map(|seed| {
            let report = run(&mix.config(seed));
            progress(&report);
            report
        })
        .collect()
}

/// How to replay a failed run.
pub fn replay_line(r: &SimReport) -> String {
    format!("replay with seed={} mix={}", r.seed, r.mix)
}
