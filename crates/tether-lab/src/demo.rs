//! `tether demo`: the main job. Several endpoints on loopback, each in its
//! own thread with its own UDP socket, exchange a verified all-to-all
//! workload through links that drop, duplicate, corrupt and reorder
//! datagrams. Every delivery is checked for order, duplication and exact
//! bytes; the table shows that faults were injected and none got through.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64Mcg;
use serde::Serialize;
use tether::faults::{FaultCounters, FaultPlan};
use tether::{Config, Endpoint, NodeId, Options};
use tether_io::{AddressBook, Transport, UdpTransport};

use crate::args;
use crate::net::{loopback, udp_rail_addrs};
use crate::pattern;
use crate::summary::Summary;

#[derive(Debug, Clone, Args)]
pub struct DemoOpts {
    /// Endpoints (nodes) taking part (2 to 256: each runs a sender and a
    /// receiver thread; the process's progress threads serve them all).
    #[arg(long, default_value_t = 4, allow_negative_numbers = true, value_parser = args::int_in::<u32>(2, MAX_NODES, "", ""))]
    pub nodes: u32,
    /// Messages each node sends to each other node.
    #[arg(long, default_value_t = 2000, allow_negative_numbers = true,
          value_parser = args::int_in::<u64>(1, 1_000_000, "", ""))]
    pub messages: u64,
    /// Fraction of datagrams dropped on receive.
    #[arg(long, default_value_t = 0.05, allow_negative_numbers = true, value_parser = args::probability)]
    pub loss: f64,
    /// Fraction of datagrams delivered twice.
    #[arg(long, default_value_t = 0.02, allow_negative_numbers = true, value_parser = args::probability)]
    pub duplicate: f64,
    /// Fraction of datagrams with a flipped bit.
    #[arg(long, default_value_t = 0.02, allow_negative_numbers = true, value_parser = args::probability)]
    pub corrupt: f64,
    /// Fraction of datagrams held back and delivered after later ones.
    #[arg(long, default_value_t = 0.05, allow_negative_numbers = true, value_parser = args::probability)]
    pub reorder: f64,
    /// Fraction of datagrams held back for an exponentially distributed
    /// time (mean 200 us) before delivery.
    #[arg(long, default_value_t = 0.01, allow_negative_numbers = true, value_parser = args::probability)]
    pub delay: f64,
    /// More faults, in the compact form (e.g. `--fault inject:p=0.01,side=send`) [default: none].
    #[arg(long = "fault", value_name = "RULE")]
    pub faults: Vec<String>,
    /// Seed for the message sizes and every fault draw (the same seed
    /// gives the same faults).
    #[arg(long, default_value_t = 7, allow_negative_numbers = true, value_parser = args::seed)]
    pub seed: u64,
    /// Rails per node (each a socket of its own on loopback).
    #[arg(long, default_value_t = 1, allow_negative_numbers = true,
          value_parser = args::int_in::<usize>(1, tether::MAX_RAILS as u64, "", ""))]
    pub rails: usize,
    /// With --rails 2 or more: node 0's rail 0 dies this many milliseconds
    /// after the start (everything it sends or receives on it is dropped),
    /// and the run prints the rail timeline of every node, from the same
    /// start [default: never].
    #[arg(long, value_name = "MS", allow_negative_numbers = true,
          value_parser = args::int_in::<u64>(0, 3_600_000, "ms", "at most an hour"))]
    pub cut_rail_at: Option<u64>,
    /// Attach each node's application to a `tether engine` process of its
    /// own (the engines inject the link faults), kill node 0's engine with
    /// SIGKILL once node 0 has a third of its messages and stop node 1's
    /// with SIGSTOP once node 1 has two thirds, and print what the
    /// supervisors did.
    #[arg(long)]
    pub engine: bool,
    /// With --engine: the engines' hang threshold (`tether engine
    /// --hang-after-us`); on a busy machine a lower one replaces engines
    /// that were only late.
    #[arg(long, default_value_t = 5000, allow_negative_numbers = true,
          value_parser = args::int_in::<u64>(100, 60_000_000, "", ""))]
    pub hang_after_us: u64,
    /// The bank instead (active messages): accounts on
    /// `--servers` processes, `--transfers` calls between them through the
    /// demo's faulty links, the servers killed with SIGKILL `--kills` times
    /// at random and restarted on their call logs; then no transfer may
    /// have run twice, no money been made or lost, and every call's final
    /// state must be true.
    #[arg(long)]
    pub rpc: bool,
    /// With --rpc: server processes.
    #[arg(long, default_value_t = 3, allow_negative_numbers = true, value_parser = args::int_in::<u32>(1, 64, "", ""))]
    pub servers: u32,
    /// With --rpc: accounts on each server.
    #[arg(long, default_value_t = 8, allow_negative_numbers = true, value_parser = args::int_in::<usize>(2, 1024, "", ""))]
    pub accounts: usize,
    /// With --rpc: transfers at least (more while kills remain).
    #[arg(long, default_value_t = 3000, allow_negative_numbers = true,
          value_parser = args::int_in::<u64>(1, 10_000_000, "", ""))]
    pub transfers: u64,
    /// With --rpc: server kills at least.
    #[arg(long, default_value_t = 100, allow_negative_numbers = true, value_parser = args::int_in::<u32>(0, 100_000, "", ""))]
    pub kills: u32,
    /// The cluster instead: three manager replicas and `--members` more
    /// nodes, each a process, in one group that every one multicasts to
    /// through the demo's faulty links, while one member is killed
    /// (SIGKILL), one frozen (SIGSTOP), one cut off for a while and one
    /// replica killed and replaced by a spare; then every failure must
    /// have been detected, nobody else removed, every node's views one
    /// sequence, and the group's deliveries one order, each in its view.
    #[arg(long)]
    pub cluster: bool,
    /// With --cluster: member processes besides the three replicas (5 to 64).
    #[arg(long, default_value_t = 8, allow_negative_numbers = true, value_parser = args::int_in::<u32>(5, 64, "", ""))]
    pub members: u32,
    /// With --cluster: the heartbeat period, in milliseconds.
    #[arg(long, default_value_t = 50, allow_negative_numbers = true,
          value_parser = args::int_in::<u64>(5, 1_000, "ms", ""))]
    pub period_ms: u64,
    /// With --cluster: multicasts each node sends to the group a second.
    #[arg(long, default_value_t = 200, allow_negative_numbers = true,
          value_parser = args::int_in::<u32>(1, 100_000, "", ""))]
    pub rate: u32,
    /// With --cluster: the suspicion rule, phi accrual (`phi`) or the
    /// seed's two-miss rule (`fixed`).
    #[arg(long, value_enum, default_value = "phi")]
    pub detector: crate::demo_cluster::Detector,
    /// Print one JSON document instead of tables.
    #[arg(long)]
    pub json: bool,
}

impl DemoOpts {
    /// What the engines of `--engine` need of these options.
    pub fn cluster(&self) -> crate::demo_engine::Cluster {
        crate::demo_engine::Cluster {
            nodes: self.nodes,
            seed: self.seed,
            rails: self.rails,
            hang_after_us: self.hang_after_us,
        }
    }
}

/// The most nodes a demo runs: each is a sender and a receiver thread, and
/// the all-to-all traffic grows with the square. At 256 on two cores,
/// 130,560 messages arrive exact in 22-25 s with fewer retransmissions
/// than messages (the endpoint's window over its streams, at most 32
/// handshakes under way per endpoint, blocked calls beyond four per core
/// parked until the progress workers bring what they wait for:
/// docs/ARCHITECTURE.md).
const MAX_NODES: u64 = 256;

/// What the options cannot do together, refused before anything runs.
pub fn check(o: &DemoOpts) -> anyhow::Result<()> {
    anyhow::ensure!(
        !o.rpc || (!o.engine && o.rails == 1 && o.cut_rail_at.is_none()),
        "--rpc runs the bank over one rail, embedded: not with --engine, --rails or --cut-rail-at"
    );
    anyhow::ensure!(
        !o.cluster || (!o.rpc && !o.engine && o.rails == 1 && o.cut_rail_at.is_none()),
        "--cluster runs its processes embedded over one rail: not with --rpc, --engine, --rails or --cut-rail-at"
    );
    anyhow::ensure!(o.cut_rail_at.is_none() || o.rails >= 2, "--cut-rail-at needs --rails 2 or more");
    anyhow::ensure!(
        !(o.engine && o.cut_rail_at.is_some()),
        "--cut-rail-at is not available with --engine (the engines inject on receive only)"
    );
    let plan = plan(o)?;
    if let Some(i) = plan.rules.iter().position(|r| o.engine && r.side != tether::faults::Side::Recv) {
        anyhow::bail!("--engine: the engines inject faults on receive only, and rule {} is not", i + 1);
    }
    Ok(())
}

#[derive(Debug, Default, Clone, Serialize)]
pub struct NodeReport {
    pub node: NodeId,
    pub sent: u64,
    pub delivered: u64,
    pub lost: u64,
    pub duplicated: u64,
    pub corrupted: u64,
    pub failed: u64,
    pub retransmits: u64,
    /// Retransmission timer expiries, and those found spurious (the
    /// receiver or its ACKs were only late).
    pub timeouts: u64,
    pub spurious_timeouts: u64,
    /// Paths that stopped answering with data in flight on them, the data
    /// moved to another rail (with --rails 2 or more).
    pub failovers: u64,
    pub checksum_failures: u64,
    pub duplicates_discarded: u64,
    pub injected: FaultCounters,
    pub bytes_delivered: u64,
    /// What the node's endpoint dropped, by reason.
    pub drops: crate::net::Drops,
}

#[derive(Debug, Serialize)]
pub struct DemoReport {
    /// With --rails 2 or more: each node's rail timeline and paths toward
    /// each peer, as (node, peer, timeline).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rails: Vec<(NodeId, NodeId, crate::timeline::Timeline)>,
    pub nodes: Vec<NodeReport>,
    pub total: NodeReport,
    pub latency_us: Option<Summary>,
    /// With --engine: what struck the engines and what their supervisors did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub engine: Option<crate::demo_engine::EngineRun>,
    pub seconds: f64,
    pub msgs_per_s: f64,
    pub mb_per_s: f64,
    pub ok: bool,
}

/// Sizes: mostly small, some multi-datagram, a few large (many fragments).
fn message_size(rng: &mut Pcg64Mcg) -> usize {
    match rng.gen_range(0..100) {
        0..=69 => rng.gen_range(16..=256),
        70..=94 => rng.gen_range(1024..=8192),
        _ => rng.gen_range(32 * 1024..=200 * 1024),
    }
}

/// Per-source receive checking: order, duplicates, exact bytes.
struct Check {
    next: Vec<u64>,
    report: NodeReport,
    latencies: Vec<f64>,
    /// When each message was delivered (ns since the start), if asked.
    delivered_at: Option<Vec<u64>>,
}

impl Check {
    fn take(&mut self, from: NodeId, msg: &[u8], origin: Instant) {
        let index = pattern::index_of(msg, from);
        let (Some(index), true) = (index, msg.len() >= 16 && (from as usize) < self.next.len()) else {
            self.report.corrupted += 1;
            return;
        };
        let expected = &mut self.next[from as usize];
        if index < *expected {
            self.report.duplicated += 1;
            return;
        }
        self.report.lost += index - *expected;
        *expected = index + 1;
        let sent_ns = u64::from_le_bytes(msg[8..16].try_into().expect("16-byte minimum"));
        if !pattern::verify(&msg[16..], from, index) {
            self.report.corrupted += 1;
        }
        self.report.delivered += 1;
        self.report.bytes_delivered += msg.len() as u64;
        let now_ns = origin.elapsed().as_nanos() as u64;
        if let Some(at) = &mut self.delivered_at {
            at.push(now_ns);
        }
        self.latencies.push(now_ns.saturating_sub(sent_ns) as f64 / 1e3);
    }
}

fn node_options(faults: FaultPlan) -> Options {
    // A small retransmission floor suits loopback; the defaults target real networks.
    let config = Config { rto_min: Duration::from_micros(500), ..Config::default() };
    Options { config, faults, ..Options::default() }
}

/// Node 0's rail 0 dies at `at`: its usual faults until then, then every
/// datagram dropped both ways.
fn dead_rail_plan(base: &FaultPlan, at: Duration) -> anyhow::Result<FaultPlan> {
    let mut plan = base.clone();
    let ms = at.as_millis();
    for (i, rule) in [format!("drop:p=1,from={ms}ms,side=send"), format!("drop:p=1,from={ms}ms,side=recv")]
        .iter()
        .enumerate()
    {
        plan.rules.push(FaultPlan::parse_rule(rule, base.rules.len() + i)?);
    }
    Ok(plan)
}

/// The demo's receive-side faults in the compact form (what `--loss` and
/// the rest say).
pub fn link_rules(o: &DemoOpts) -> [String; 5] {
    [
        format!("drop:p={}", o.loss),
        format!("duplicate:p={}", o.duplicate),
        format!("modify:p={},bits=1", o.corrupt),
        format!("reorder:p={}", o.reorder),
        format!("delay:p={},mean=200us", o.delay),
    ]
}

/// The demo's receive-side faults, plus any given with `--fault`.
pub fn plan(o: &DemoOpts) -> anyhow::Result<FaultPlan> {
    let mut plan = FaultPlan::parse_rules(o.seed, &link_rules(o))?;
    for r in &o.faults {
        let rule =
            FaultPlan::parse_rule(r, plan.rules.len()).map_err(|e| anyhow::anyhow!("--fault {r}: {e}"))?;
        plan.rules.push(rule);
    }
    Ok(plan)
}

pub fn run(o: &DemoOpts) -> anyhow::Result<DemoReport> {
    check(o)?;
    let plan = plan(o)?;
    // The start: node 0's rail faults (--cut-rail-at) count from the
    // moment its endpoint is made, just after this, and so does every
    // rail timeline printed.
    let start = Instant::now();
    let mut engines = match o.engine {
        true => Some(crate::demo_engine::Engines::start(
            o.cluster(),
            &[&link_rules(o)[..], &o.faults[..]].concat(),
        )?),
        false => None,
    };
    let endpoints = match &engines {
        Some(e) => e.endpoints()?,
        None if o.rails == 1 => single_rail_endpoints(o, &plan)?,
        None => rail_endpoints(o, &plan)?,
    };

    let total_expected = o.messages * (o.nodes as u64) * (o.nodes as u64 - 1);
    let bar = (!o.json).then(|| {
        let bar = ProgressBar::new(total_expected);
        bar.set_style(
            ProgressStyle::with_template("{bar:40} {pos}/{len} messages delivered  {per_sec}  {elapsed}")
                .expect("valid template"),
        );
        bar
    });
    // Messages delivered so far, per node.
    let delivered_to: Arc<Vec<AtomicU64>> = Arc::new((0..o.nodes).map(|_| AtomicU64::new(0)).collect());
    let origin = Instant::now();
    let mut threads = Vec::new();
    for (node, ep) in endpoints.iter().enumerate() {
        let (ep_tx, ep_rx) = (ep.clone(), ep.clone());
        let (nodes, messages, seed) = (o.nodes, o.messages, o.seed);
        let sender = std::thread::spawn(move || -> anyhow::Result<u64> {
            let mut rng = Pcg64Mcg::seed_from_u64(seed ^ ((node as u64 + 1) * 0x51_7CC1));
            let mut buf = vec![0u8; 256 * 1024];
            let mut sent = 0;
            for index in 0..messages {
                for peer in (0..nodes).filter(|&p| p != node as NodeId) {
                    let len = message_size(&mut rng);
                    let msg = &mut buf[..len];
                    pattern::fill(msg, node as NodeId, index);
                    msg[8..16].copy_from_slice(&(origin.elapsed().as_nanos() as u64).to_le_bytes());
                    ep_tx.send_blocking(peer, msg, Some(Duration::from_secs(30))).map_err(|e| {
                        anyhow::anyhow!("node {node}: sending message {index} to node {peer}: {e}")
                    })?;
                    sent += 1;
                }
            }
            ep_tx
                .flush(Some(Duration::from_secs(60)))
                .map_err(|e| anyhow::anyhow!("node {node}: waiting for its messages to settle: {e}"))?;
            Ok(sent)
        });
        let expect = messages * (nodes as u64 - 1);
        let delivered_to = delivered_to.clone();
        let record = o.engine;
        let receiver = std::thread::spawn(move || -> anyhow::Result<Check> {
            let mut check = Check {
                next: vec![0; nodes as usize],
                report: NodeReport::default(),
                latencies: Vec::new(),
                delivered_at: record.then(Vec::new),
            };
            while check.report.delivered < expect {
                let d = ep_rx.recv(Some(Duration::from_secs(30))).map_err(|e| {
                    let next: Vec<String> =
                        check.next.iter().enumerate().map(|(n, i)| format!("{n}:{i}")).collect();
                    anyhow::anyhow!(
                        "node {node}: receiving, {} of {expect} delivered (next from each node {}): {e}",
                        check.report.delivered,
                        next.join(" ")
                    )
                })?;
                check.take(d.from, &d.message, origin);
                delivered_to[node].fetch_add(1, Ordering::Relaxed);
            }
            Ok(check)
        });
        threads.push((sender, receiver));
    }
    let mut checks = Vec::new();
    let mut sent = Vec::new();
    while threads.iter().any(|(s, r)| !s.is_finished() || !r.is_finished()) {
        let delivered: Vec<u64> = delivered_to.iter().map(|d| d.load(Ordering::Relaxed)).collect();
        if let Some(bar) = &bar {
            bar.set_position(delivered.iter().sum());
        }
        if let Some(e) = &mut engines {
            e.strike(&delivered, o.messages * (o.nodes as u64 - 1), origin)?;
        }
        std::thread::sleep(Duration::from_millis(if engines.is_some() { 1 } else { 50 }));
    }
    let seconds = origin.elapsed().as_secs_f64();
    for (s, r) in threads {
        sent.push(s.join().map_err(|_| anyhow::anyhow!("sender panicked"))??);
        checks.push(r.join().map_err(|_| anyhow::anyhow!("receiver panicked"))??);
    }
    if let Some(bar) = &bar {
        bar.finish();
    }
    let delivered_at: Vec<Vec<u64>> =
        checks.iter_mut().map(|c| c.delivered_at.take().unwrap_or_default()).collect();
    let engine = engines.as_mut().map(|e| e.report(origin, &delivered_at, &endpoints));
    let mut total = NodeReport::default();
    let mut latencies = Vec::new();
    let mut nodes = Vec::new();
    for (node, mut check) in checks.into_iter().enumerate() {
        let stats = endpoints[node].stats();
        let r = &mut check.report;
        r.node = node as NodeId;
        r.sent = sent[node];
        r.failed = stats.messages_failed;
        r.retransmits = stats.retransmits;
        r.timeouts = stats.timeouts;
        r.spurious_timeouts = stats.spurious_timeouts;
        r.failovers = stats.failovers;
        r.checksum_failures = stats.checksum_failures;
        r.duplicates_discarded = stats.duplicates_discarded;
        r.drops = crate::net::drops(&stats);
        r.injected = endpoints[node].fault_counters();
        accumulate(&mut total, r);
        latencies.append(&mut check.latencies);
        nodes.push(check.report);
    }
    let ok = total.lost == 0
        && total.duplicated == 0
        && total.corrupted == 0
        && total.failed == 0
        && total.delivered == total_expected;
    let mut rails = Vec::new();
    if o.rails > 1 {
        for (node, ep) in endpoints.iter().enumerate() {
            let peers: Vec<NodeId> = (0..o.nodes).filter(|&p| p != node as NodeId).collect();
            for (peer, t) in crate::timeline::Timeline::collect_all(ep, &peers, clock_at(ep, start)) {
                rails.push((node as NodeId, peer, t));
            }
        }
    }
    Ok(DemoReport {
        rails,
        msgs_per_s: total.delivered as f64 / seconds,
        mb_per_s: total.bytes_delivered as f64 / seconds / 1e6,
        latency_us: Summary::of(&latencies),
        engine,
        nodes,
        total,
        seconds,
        ok,
    })
}

/// `ep`'s clock reading at `start`. Each endpoint's clock has an origin of
/// its own (its creation), so one shared reading of `endpoints[0]` would
/// shift every other node's events by the time between their creations.
fn clock_at(ep: &Endpoint, start: Instant) -> tether::Instant {
    let now = ep.now();
    let since = start.elapsed().as_nanos() as u64;
    tether::Instant::from_nanos(now.as_nanos().saturating_sub(since))
}

/// One socket per node: the demo as it always was.
fn single_rail_endpoints(o: &DemoOpts, plan: &FaultPlan) -> anyhow::Result<Vec<Arc<Endpoint>>> {
    // Bind every socket first, then tell each endpoint every other's address.
    let mut sockets = Vec::new();
    for _ in 0..o.nodes {
        sockets.push(UdpTransport::bind(loopback(), AddressBook::new())?);
    }
    let addrs: Vec<SocketAddr> = sockets.iter().map(|s| s.local_addr().expect("bound")).collect();
    let mut endpoints = Vec::new();
    for (node, mut udp) in sockets.into_iter().enumerate() {
        for (peer, &addr) in addrs.iter().enumerate() {
            if peer != node {
                udp.add_peer(peer as NodeId, addr)?;
            }
        }
        let options = node_options(plan.clone());
        endpoints.push(Arc::new(Endpoint::with_transport(node as NodeId, Box::new(udp), options)?));
    }
    Ok(endpoints)
}

/// `--rails` sockets per node, every node reaching every other over all.
fn rail_endpoints(o: &DemoOpts, plan: &FaultPlan) -> anyhow::Result<Vec<Arc<Endpoint>>> {
    let binds = vec![loopback(); o.rails];
    let mut endpoints = Vec::new();
    for node in 0..o.nodes {
        let mut options = node_options(plan.clone());
        if let (0, Some(ms)) = (node, o.cut_rail_at) {
            options.rail_faults.push((0, dead_rail_plan(plan, Duration::from_millis(ms))?));
        }
        endpoints.push(Arc::new(Endpoint::udp_rails(node, &binds, options)?));
    }
    let addrs: Vec<Vec<SocketAddr>> = endpoints.iter().map(|e| udp_rail_addrs(e)).collect();
    for (node, ep) in endpoints.iter().enumerate() {
        for (peer, a) in addrs.iter().enumerate().filter(|&(p, _)| p != node) {
            ep.add_peer_rails(peer as NodeId, a)?;
        }
    }
    Ok(endpoints)
}

fn accumulate(total: &mut NodeReport, r: &NodeReport) {
    total.sent += r.sent;
    total.delivered += r.delivered;
    total.lost += r.lost;
    total.duplicated += r.duplicated;
    total.corrupted += r.corrupted;
    total.failed += r.failed;
    total.retransmits += r.retransmits;
    total.timeouts += r.timeouts;
    total.spurious_timeouts += r.spurious_timeouts;
    total.failovers += r.failovers;
    total.checksum_failures += r.checksum_failures;
    total.duplicates_discarded += r.duplicates_discarded;
    total.bytes_delivered += r.bytes_delivered;
    total.injected.accumulate(&r.injected);
    total.drops = crate::net::sum_drops([&total.drops, &r.drops]);
}
