//! `tether campaign --cluster`: Figure 5 of Li et al. [CI] section 6 for
//! tether's cluster (docs/CLUSTER.md). A cluster of embedded endpoints on
//! loopback (three manager replicas among `--members` nodes), every
//! node's links dropping, duplicating and corrupting datagrams at one
//! rate, runs its heartbeats for a while with nobody dying, every node
//! multicasting to one group on the reliable streams. Per injected
//! fault it counts what the paper counts: retransmissions (R) and
//! duplicates discarded (D) of the reliable layer, false alarms of node
//! failure (A: a live member removed from the view) and manager
//! self-diagnosis (S: a live replica removed, its group deciding one of
//! its own had failed). Each rate runs with the seed's two-miss rule and
//! with phi accrual, side by side; and a last cell per detector runs with
//! a busy thread per core and no link faults, where heartbeats are late
//! and nobody died.

// Cells pace themselves and the busy threads by the wall clock.
#![allow(clippy::disallowed_methods)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use tether::cluster::{ClusterConfig, ClusterEvent, DetectorKind, View};
use tether::faults::FaultPlan;
use tether::{Endpoint, NodeId, Options};

use crate::net::loopback;
use crate::plot::{self, Chart, Series};

/// The founding replicas.
const REPLICAS: [NodeId; 3] = [1, 2, 3];
/// The group every node multicasts to, a few messages every 10 ms.
const GROUP: u32 = 1;
const MULTICASTS_PER_TURN: usize = 5;
/// How long a cluster has to form before its cell counts as failed.
const FORM_WITHIN: Duration = Duration::from_secs(30);

/// What a campaign runs.
#[derive(Debug, Clone)]
pub struct ClusterCampaign {
    pub members: u32,
    pub period: Duration,
    pub cell: Duration,
    pub rates: Vec<f64>,
    pub seeds: u64,
    pub first_seed: u64,
}

/// The suspicion rules compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    TwoMiss,
    Phi,
}

impl Rule {
    pub const ALL: [Rule; 2] = [Rule::TwoMiss, Rule::Phi];

    pub fn name(self) -> &'static str {
        match self {
            Rule::TwoMiss => "two-miss",
            Rule::Phi => "phi",
        }
    }

    fn kind(self, period: Duration) -> DetectorKind {
        match self {
            Rule::TwoMiss => DetectorKind::two_miss(period),
            Rule::Phi => DetectorKind::phi(period),
        }
    }
}

/// One cell: a detector, a fault rate (or the busy machine), a seed.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ClusterCell {
    pub detector: &'static str,
    /// Probability of each of drop, duplicate and corrupt per datagram
    /// received; 0 in the busy-machine cell.
    pub rate: f64,
    /// A busy thread per core ran beside the cluster.
    pub busy: bool,
    pub seed: u64,
    /// Whether every node held a view of every node within the limit.
    pub formed: bool,
    /// Seconds the heartbeats ran once formed.
    pub seconds: f64,
    pub injected: u64,
    pub retransmissions: u64,
    pub duplicates: u64,
    /// Live members (not replicas) removed from the view.
    pub false_alarms: u64,
    /// Live replicas removed from the view.
    pub self_diagnosis: u64,
    pub suspicions: u64,
    pub refuted: u64,
}

fn rules(rate: f64) -> Vec<String> {
    if rate <= 0.0 {
        return Vec::new();
    }
    vec![format!("drop:p={rate}"), format!("duplicate:p={rate}"), format!("modify:p={rate},bits=1")]
}

fn members(v: &View) -> Vec<NodeId> {
    v.members.iter().map(|m| m.0).collect()
}

/// Run one cell.
pub fn cell(
    c: &ClusterCampaign,
    rule: Rule,
    rate: f64,
    busy: bool,
    seed: u64,
) -> anyhow::Result<ClusterCell> {
    let all: Vec<NodeId> = (1..=c.members).collect();
    // Every node's port picked first, so each is built knowing every
    // other: none sends to a node that does not yet know it.
    let addrs = all
        .iter()
        .map(|_| Ok(std::net::UdpSocket::bind(loopback())?.local_addr()?))
        .collect::<anyhow::Result<Vec<std::net::SocketAddr>>>()?;
    let mut eps = Vec::new();
    for (i, &id) in all.iter().enumerate() {
        let faults = FaultPlan::parse_rules(seed ^ (u64::from(id) << 32), &rules(rate))?;
        let mut cluster = ClusterConfig::new(&REPLICAS, c.period);
        if let Some(m) = &mut cluster.member {
            m.detector = rule.kind(c.period);
        }
        let options = Options { faults, ..Options::default() };
        let mut b = Endpoint::builder(id).bind(addrs[i]).options(options).cluster(cluster);
        for (j, &peer) in all.iter().enumerate().filter(|&(j, _)| j != i) {
            b = b.peer(peer, addrs[j]);
        }
        eps.push(b.build()?);
    }
    let mut out = ClusterCell { detector: rule.name(), rate, busy, seed, ..ClusterCell::default() };
    let start = Instant::now();
    while start.elapsed() < FORM_WITHIN {
        if eps.iter().all(|e| e.view().is_some_and(|v| members(&v) == all)) {
            out.formed = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    if !out.formed {
        return Ok(out);
    }
    for e in &eps {
        e.join_group(GROUP)?;
    }
    // From here on, every view is counted: one per epoch, whoever saw it.
    for e in &eps {
        while e.poll_cluster_event().is_some() {}
    }
    let stop = Arc::new(AtomicBool::new(false));
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let spinners: Vec<_> = (0..if busy { cores } else { 0 })
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut x = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
                }
            })
        })
        .collect();
    let mut views: BTreeMap<u64, Vec<NodeId>> = BTreeMap::new();
    let ran = Instant::now();
    while ran.elapsed() < c.cell {
        for e in &eps {
            // The application's traffic on the reliable streams: what R
            // and D count.
            for _ in 0..MULTICASTS_PER_TURN {
                if e.multicast(GROUP, &[0u8; 64], Some(Duration::ZERO)).is_err() {
                    break;
                }
            }
            while e.next_group_output(Some(Duration::ZERO)).is_ok() {}
            while let Some(ev) = e.poll_cluster_event() {
                match ev {
                    ClusterEvent::View(v) => {
                        views.entry(v.epoch).or_insert_with(|| members(&v));
                    }
                    ClusterEvent::Suspected { .. } => out.suspicions += 1,
                    ClusterEvent::Refuted { .. } => out.refuted += 1,
                    _ => {}
                }
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    stop.store(true, Ordering::Relaxed);
    for s in spinners {
        let _ = s.join();
    }
    out.seconds = ran.elapsed().as_secs_f64();
    // Nobody died: every member that leaves a view was a live one.
    let mut before = all.clone();
    for m in views.values() {
        for gone in before.iter().filter(|n| !m.contains(n)) {
            if REPLICAS.contains(gone) {
                out.self_diagnosis += 1;
            } else {
                out.false_alarms += 1;
            }
        }
        before = m.clone();
    }
    for e in &eps {
        let s = e.stats();
        out.retransmissions += s.retransmits;
        out.duplicates += s.duplicates_discarded;
        out.injected += e.fault_counters().total();
    }
    for e in eps {
        let _ = e.close(Duration::ZERO);
    }
    Ok(out)
}

/// Every cell: each rate with each detector, seed by seed, then the busy
/// machine with each detector.
pub fn run(c: &ClusterCampaign, mut progress: impl FnMut(&ClusterCell)) -> anyhow::Result<Vec<ClusterCell>> {
    let mut cells = Vec::new();
    for &rate in &c.rates {
        for rule in Rule::ALL {
            for seed in c.first_seed..c.first_seed + c.seeds {
                let x = cell(c, rule, rate, false, seed)?;
                progress(&x);
                cells.push(x);
            }
        }
    }
    for rule in Rule::ALL {
        for seed in c.first_seed..c.first_seed + c.seeds {
            let x = cell(c, rule, 0.0, true, seed)?;
            progress(&x);
            cells.push(x);
        }
    }
    Ok(cells)
}

/// A row of Figure 5: one detector at one rate, summed over its seeds.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Row {
    pub detector: &'static str,
    pub rate: f64,
    pub busy: bool,
    pub cells: u64,
    pub unformed: u64,
    pub seconds: f64,
    pub injected: u64,
    /// Per injected fault.
    pub r: f64,
    pub d: f64,
    pub a: f64,
    pub s: f64,
    pub false_alarms: u64,
    pub self_diagnosis: u64,
    pub suspicions: u64,
    pub refuted: u64,
}

pub fn rows(cells: &[ClusterCell]) -> Vec<Row> {
    let mut rows: Vec<Row> = Vec::new();
    for c in cells {
        let i = match rows
            .iter()
            .position(|r| r.detector == c.detector && r.rate == c.rate && r.busy == c.busy)
        {
            Some(i) => i,
            None => {
                rows.push(Row { detector: c.detector, rate: c.rate, busy: c.busy, ..Row::default() });
                rows.len() - 1
            }
        };
        let r = &mut rows[i];
        r.cells += 1;
        r.unformed += u64::from(!c.formed);
        r.seconds += c.seconds;
        r.injected += c.injected;
        r.false_alarms += c.false_alarms;
        r.self_diagnosis += c.self_diagnosis;
        r.suspicions += c.suspicions;
        r.refuted += c.refuted;
        // Sums first; per fault once all are in.
        r.r += c.retransmissions as f64;
        r.d += c.duplicates as f64;
    }
    for r in &mut rows {
        let per = |n: f64| if r.injected == 0 { 0.0 } else { n / r.injected as f64 };
        r.r = per(r.r);
        r.d = per(r.d);
        r.a = per(r.false_alarms as f64);
        r.s = per(r.self_diagnosis as f64);
    }
    rows
}

/// Write `cluster-campaign.csv` (a record per cell) and, per detector,
/// `cluster-<detector>.png`: R, D, A and S per injected fault against
/// the fault rate, Figure 5's axes.
pub fn write_out(dir: &Path, cells: &[ClusterCell]) -> anyhow::Result<Vec<PathBuf>> {
    let mut written = vec![plot::write_csv(dir, "cluster-campaign.csv", cells)?];
    let rows = rows(cells);
    for rule in Rule::ALL {
        let of = |f: fn(&Row) -> f64| -> Vec<(f64, f64)> {
            rows.iter().filter(|r| r.detector == rule.name() && !r.busy).map(|r| (r.rate, f(r))).collect()
        };
        let series = [
            Series { label: "R: retransmissions".into(), points: of(|r| r.r) },
            Series { label: "D: duplicates discarded".into(), points: of(|r| r.d) },
            Series { label: "A: false alarms of node failure".into(), points: of(|r| r.a) },
            Series { label: "S: manager self-diagnosis".into(), points: of(|r| r.s) },
        ];
        let title = format!("Cluster under message faults, {} detector (Li et al. Figure 5)", rule.name());
        let path = dir.join(format!("cluster-{}.png", rule.name()));
        let chart = Chart {
            title: &title,
            x_label: "fault rate (probability per datagram, each of drop, duplicate, corrupt)",
            y_label: "per injected fault",
            log_x: true,
            series: &series,
        };
        plot::line_png(&path, &chart, 900, 600)?;
        written.push(path);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(detector: &'static str, rate: f64, injected: u64, retx: u64, alarms: u64) -> ClusterCell {
        ClusterCell {
            detector,
            rate,
            seed: 1,
            formed: true,
            seconds: 1.0,
            injected,
            retransmissions: retx,
            false_alarms: alarms,
            ..ClusterCell::default()
        }
    }

    #[test]
    fn rows_sum_seeds_before_dividing_by_the_faults() {
        let cells =
            [cell("phi", 0.01, 100, 50, 1), cell("phi", 0.01, 300, 50, 0), cell("two-miss", 0.01, 10, 1, 0)];
        let rows = rows(&cells);
        assert_eq!(rows.len(), 2);
        assert_eq!((rows[0].injected, rows[0].r, rows[0].a), (400, 0.25, 0.0025));
        assert_eq!((rows[1].injected, rows[1].r), (10, 0.1));
    }
}
