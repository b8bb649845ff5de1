//! Fuzz the fabric file parser (`tether_sim::topology`, docs/FABRIC.md
//! "Topologies"): no panic, whatever the bytes; a fabric that parses is
//! written back as text that parses to the same fabric; every host
//! reaches the others by the oracle's route, and the mapper's search,
//! seeing only probe answers, stays within its budget and finds a route
//! no longer than the oracle's.

use tether_sim::fabric::{Mapped, ProbeTiming, Walk};
use tether_sim::topology::{parse, write};

/// Probes a search here may send: enough for the small fabrics the
/// fuzzer makes, a bound on the large ones.
const BUDGET: u64 = 2_000;

/// One fuzz input: a fabric file's text.
pub fn run(input: &[u8]) {
    let Ok(f) = parse(input) else { return };
    let text = write(&f);
    assert_eq!(parse(text.as_bytes()).expect("a written fabric parses"), f, "{text}");
    let hosts: Vec<_> = f.hosts().take(4).collect();
    for &a in &hosts {
        for &b in hosts.iter().filter(|&&b| b != a) {
            let oracle = f.shortest_route(a, b);
            if let Some(route) = &oracle {
                assert_eq!(f.walk(a, route), Walk::Host(b, route.len() + 1));
            }
            let run = f.map(a, b, BUDGET, ProbeTiming::default());
            assert!(run.counts.total() <= BUDGET, "{:?}", run.counts);
            if let Mapped::Found(route) = &run.outcome {
                assert_eq!(f.walk(a, route), Walk::Host(b, route.len() + 1), "a found route leads there");
                let shortest = oracle.as_ref().map(Vec::len).expect("found: the oracle finds one too");
                assert_eq!(route.len(), shortest, "breadth first: a shortest route");
            }
        }
    }
}
