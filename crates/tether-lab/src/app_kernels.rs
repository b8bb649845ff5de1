//! Application kernels standing in for the SPLASH-2 programs of Tang and
//! Bilas [TB] section 6.1.4 (Figure 9): their communication patterns, run
//! on real endpoints over UDP on loopback, one thread a node, so their run
//! time can be set against the error rate and the protocol's parameters.
//!
//! - **All-to-all** (FFT's transpose, radix sort's key exchange): every
//!   round each node sends a block to every other and waits for a block
//!   from each; bandwidth-bound.
//! - **Nearest neighbour** (a stencil or n-body step): every round each
//!   node computes, then exchanges a block with its two neighbours on a
//!   ring; latency-bound, with computation between the exchanges.
//!
//! A round ends for a node when it holds that round's block from every
//! peer it expects one from; a peer a round ahead is fine (each peer's
//! blocks come in order), so no node waits for a round's slowest message
//! longer than the pattern needs. Every block is checked
//! (`pattern::verify`): a wrong one fails the run.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde::Serialize;
use tether::faults::FaultPlan;
use tether::{Config, Endpoint, NodeId, Options};

use crate::pattern;

/// Which pattern.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Kernel {
    AllToAll,
    Neighbour,
}

impl Kernel {
    pub const ALL: [Kernel; 2] = [Kernel::AllToAll, Kernel::Neighbour];

    pub fn name(self) -> &'static str {
        match self {
            Kernel::AllToAll => "all-to-all",
            Kernel::Neighbour => "neighbour",
        }
    }

    /// The peers `me` (0-based, of `n`) exchanges with.
    fn peers(self, me: usize, n: usize) -> Vec<usize> {
        match self {
            Kernel::AllToAll => (0..n).filter(|&p| p != me).collect(),
            Kernel::Neighbour => {
                let (left, right) = ((me + n - 1) % n, (me + 1) % n);
                if left == right {
                    vec![left]
                } else {
                    vec![left, right]
                }
            }
        }
    }
}

/// How a kernel runs.
#[derive(Debug, Clone)]
pub struct Spec {
    pub kernel: Kernel,
    /// Nodes (at least 2), a thread and an endpoint each.
    pub nodes: usize,
    pub rounds: u64,
    /// Bytes a node sends each peer a round.
    pub block: usize,
    /// Computation before each round's exchange (a busy loop).
    pub compute: Duration,
}

/// What one run took.
#[derive(Debug, Clone, Serialize)]
pub struct Run {
    pub seconds: f64,
    /// Over all nodes.
    pub retransmits: u64,
    pub dropped: u64,
}

/// How long a node waits for one block before the run fails.
const BLOCK_WAIT: Duration = Duration::from_secs(20);

/// Run `spec` on endpoints with `config` and, if `rule` is given, that
/// fault rule (the compact form) on every node from `seed`.
pub fn run(spec: &Spec, config: &Config, rule: Option<&str>, seed: u64) -> anyhow::Result<Run> {
    anyhow::ensure!(spec.nodes >= 2, "a kernel needs at least 2 nodes");
    anyhow::ensure!(spec.block >= 8, "a block carries its round: at least 8 bytes");
    let any: SocketAddr = "127.0.0.1:0".parse().expect("an address");
    let eps = (0..spec.nodes)
        .map(|i| {
            let rules: Vec<&str> = rule.into_iter().collect();
            let faults =
                FaultPlan::parse_rules(seed + i as u64, &rules).map_err(|e| anyhow::anyhow!("{e}"))?;
            let options = Options { config: config.clone(), faults, ..Options::default() };
            Ok(Endpoint::udp(node(i), any, &[], options)?)
        })
        .collect::<anyhow::Result<Vec<Endpoint>>>()?;
    for (i, a) in eps.iter().enumerate() {
        for j in spec.kernel.peers(i, spec.nodes) {
            a.add_peer(node(j), eps[j].local_addr().expect("UDP has an address"))?;
        }
    }
    let start = Instant::now();
    std::thread::scope(|s| {
        let nodes: Vec<_> =
            eps.iter().enumerate().map(|(i, ep)| s.spawn(move || run_node(spec, ep, i))).collect();
        nodes
            .into_iter()
            .try_for_each(|t| t.join().map_err(|_| anyhow::anyhow!("a node's thread panicked"))?)
    })?;
    let seconds = start.elapsed().as_secs_f64();
    for ep in &eps {
        ep.flush(Some(BLOCK_WAIT))?;
    }
    let retransmits = eps.iter().map(|e| e.stats().retransmits).sum();
    let dropped = eps.iter().map(|e| e.fault_counters().dropped).sum();
    Ok(Run { seconds, retransmits, dropped })
}

/// Node ids start at 1.
fn node(i: usize) -> NodeId {
    i as NodeId + 1
}

/// One node's rounds.
fn run_node(spec: &Spec, ep: &Endpoint, me: usize) -> anyhow::Result<()> {
    let peers = spec.kernel.peers(me, spec.nodes);
    // The next round expected from each node (by index), and a block.
    let mut next = vec![0u64; spec.nodes];
    let mut block = vec![0u8; spec.block];
    for round in 0..spec.rounds {
        compute(spec.compute);
        pattern::fill(&mut block, node(me), round);
        for &p in &peers {
            ep.send_blocking(node(p), &block, Some(BLOCK_WAIT))?;
        }
        while peers.iter().any(|&p| next[p] <= round) {
            let d = ep.recv(Some(BLOCK_WAIT)).map_err(|e| {
                anyhow::anyhow!("{}: node {} waiting for round {round}: {e}", spec.kernel.name(), node(me))
            })?;
            let from = (d.from as usize).checked_sub(1).filter(|&f| peers.contains(&f));
            let Some(from) = from else { anyhow::bail!("node {}: a block from node {}", node(me), d.from) };
            anyhow::ensure!(
                d.message.len() == spec.block && pattern::verify(&d.message, d.from, next[from]),
                "node {}: node {}'s block of round {} is not what was sent",
                node(me),
                d.from,
                next[from]
            );
            next[from] += 1;
        }
    }
    Ok(())
}

/// Busy for `d` (the computation between exchanges).
fn compute(d: Duration) {
    let start = Instant::now();
    while start.elapsed() < d {
        std::hint::spin_loop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernels_exchange_with_the_peers_of_their_pattern() {
        assert_eq!(Kernel::AllToAll.peers(1, 4), vec![0, 2, 3]);
        assert_eq!(Kernel::Neighbour.peers(0, 4), vec![3, 1]);
        assert_eq!(Kernel::Neighbour.peers(1, 2), vec![0]);
    }

    #[test]
    fn a_kernel_runs_its_rounds_under_loss() {
        for kernel in Kernel::ALL {
            let spec = Spec { kernel, nodes: 3, rounds: 20, block: 3000, compute: Duration::from_micros(10) };
            let config = Config { rto_min: Duration::from_micros(500), ..Config::default() };
            let r = run(&spec, &config, Some("drop:p=0.05,side=send"), 3).unwrap();
            assert!(r.dropped > 0 && r.retransmits > 0, "{kernel:?}: {r:?}");
        }
    }
}
