//! Terminal tables (comfy-table) for the commands' reports.

use comfy_table::{presets::UTF8_FULL_CONDENSED, Cell, CellAlignment, Table};
use tether::faults::{FaultCounters, FaultKind};
use tether::Event;

use crate::auth_bench::{AuthOpts, AuthReport};
use crate::bench::BenchRow;
use crate::demo::{DemoOpts, DemoReport, NodeReport};
use crate::net::{Drops, NetOpts};
use crate::pingpong::PingpongRun;
use crate::stream::StreamRun;
use crate::summary::Summary;

pub(crate) fn table(header: &[&str]) -> Table {
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED);
    t.set_header(header.iter().map(Cell::new));
    t
}

pub(crate) fn right(t: &mut Table) {
    for i in 1..t.column_count() {
        if let Some(c) = t.column_mut(i) {
            c.set_cell_alignment(CellAlignment::Right);
        }
    }
}

/// One line of drops by reason, e.g. `receiver dropped: replays 3,
/// mac_failures 12`, or that nothing was.
pub fn drops(who: &str, d: &crate::net::Drops) -> String {
    if d.is_empty() {
        return format!("{who} dropped nothing");
    }
    let reasons: Vec<_> = d.iter().map(|(reason, n)| format!("{reason} {n}")).collect();
    format!("{who} dropped, by reason: {}", reasons.join(", "))
}

fn spread(s: &Summary, digits: usize) -> String {
    format!("{:.d$} ({:.d$}-{:.d$})", s.median, s.min, s.max, d = digits)
}

pub fn demo(o: &DemoOpts, r: &DemoReport) {
    println!(
        "tether demo: {} nodes all-to-all over UDP loopback{}, {} messages per stream; links drop {:.1}%, duplicate {:.1}%, corrupt {:.1}%, reorder {:.1}% (seed {})",
        o.nodes,
        if o.engine { ", each application attached to a tether engine process of its own" } else { "" },
        o.messages,
        o.loss * 100.0,
        o.duplicate * 100.0,
        o.corrupt * 100.0,
        o.reorder * 100.0,
        o.seed
    );
    let mut t = table(&[
        "node",
        "sent",
        "delivered",
        "lost",
        "duplicated",
        "corrupted",
        "failed",
        "retransmits",
        "dup discarded",
        "cksum fail",
        "injected drop/dup/modify/reorder/delay/inject",
    ]);
    let row = |t: &mut Table, name: String, n: &NodeReport| {
        let i = &n.injected;
        t.add_row(vec![
            name,
            n.sent.to_string(),
            n.delivered.to_string(),
            n.lost.to_string(),
            n.duplicated.to_string(),
            n.corrupted.to_string(),
            n.failed.to_string(),
            n.retransmits.to_string(),
            n.duplicates_discarded.to_string(),
            n.checksum_failures.to_string(),
            format!(
                "{}/{}/{}/{}/{}/{}",
                i.dropped, i.duplicated, i.modified, i.reordered, i.delayed, i.injected
            ),
        ]);
    };
    for n in &r.nodes {
        row(&mut t, n.node.to_string(), n);
    }
    row(&mut t, "total".into(), &r.total);
    right(&mut t);
    println!("{t}");
    let (api, other) = (r.total.injected.invocation + r.total.injected.operation, r.total.injected.overflow);
    if api + other > 0 {
        println!("faults injected: {}", faults(&r.total.injected));
    }
    println!("{}", drops("the nodes", &r.total.drops));
    if let Some(e) = &r.engine {
        engine_run(e);
    }
    if let Some(l) = &r.latency_us {
        println!(
            "send-to-delivery time (us), queueing behind earlier messages included: median {:.1}  p99 {:.1}  min {:.1}  max {:.1}",
            l.median, l.p99, l.min, l.max
        );
    }
    println!(
        "throughput: {:.0} messages/s, {:.1} MB/s delivered in {:.2} s",
        r.msgs_per_s, r.mb_per_s, r.seconds
    );
    if !r.rails.is_empty() {
        let changes: usize = r.rails.iter().map(|(_, _, t)| t.events.len()).sum();
        println!(
            "rails: {} failovers (data moved off a path that stopped answering), {changes} path state changes",
            r.total.failovers
        );
    }
    for (node, peer, t) in r.rails.iter().filter(|(_, _, t)| !t.events.is_empty() || !t.failovers.is_empty())
    {
        println!("node {node} toward node {peer}:");
        rails(t);
    }
    println!(
        "{}",
        if r.ok {
            "OK: every message delivered exactly once, in order, with its exact bytes"
        } else {
            "FAILED: see the lost / duplicated / corrupted / failed columns"
        }
    );
}

/// `tether demo --engine`: the engines' timeline and each strike followed
/// to the first delivery after it.
fn engine_run(e: &crate::demo_engine::EngineRun) {
    println!("engine timeline (ms since the start):");
    for ev in &e.timeline {
        println!("  {:>10.3}  node {}  {}", ev.ms, ev.node, ev.what);
    }
    let mut t = table(&["node", "fault", "at ms", "detected +ms", "new engine +ms", "first delivery +ms"]);
    let opt = |v: Option<f64>| v.map_or("never".to_string(), |v| format!("{v:.3}"));
    for r in &e.recoveries {
        t.add_row(vec![
            r.node.to_string(),
            r.fault.to_string(),
            format!("{:.3}", r.at_ms),
            opt(r.detected_ms),
            opt(r.replaced_ms),
            opt(r.first_delivery_ms),
        ]);
    }
    right(&mut t);
    println!("{t}");
    let told: Vec<String> = e.told.iter().enumerate().map(|(n, c)| format!("node {n} {c}")).collect();
    println!(
        "EngineRecovered told: {}; engines replaced that the demo did not strike: {}",
        told.join(", "),
        e.unprovoked
    );
}

pub fn pingpong(runs: &[PingpongRun], mode: &str, size: usize) {
    let mut t = table(&["run", "median us", "p99 us", "min us", "max us", "retransmits", "corrupted"]);
    for (i, r) in runs.iter().enumerate() {
        let s = &r.rtt_us;
        t.add_row(vec![
            (i + 1).to_string(),
            format!("{:.2}", s.median),
            format!("{:.2}", s.p99),
            format!("{:.2}", s.min),
            format!("{:.2}", s.max),
            r.retransmits.to_string(),
            r.corrupted.to_string(),
        ]);
    }
    right(&mut t);
    println!("pingpong {mode}, {size} B, round trip:\n{t}");
    if let Some(m) = Summary::of(&runs.iter().map(|r| r.rtt_us.median).collect::<Vec<_>>()) {
        println!("median of run medians: {:.2} us (min {:.2}, max {:.2})", m.median, m.min, m.max);
    }
    if mode != "raw" {
        println!("{}", drops("this side", &crate::net::sum_drops(runs.iter().map(|r| &r.drops))));
        if runs.iter().any(|r| r.echo_drops.is_some()) {
            let echo = crate::net::sum_drops(runs.iter().filter_map(|r| r.echo_drops.as_ref()));
            println!("{}", drops("the echo side", &echo));
        }
    }
}

/// `stream --flows N`: each run's flows side by side, their sum and
/// fairness.
pub fn flows(runs: &[crate::flows::FlowsRun], size: usize) {
    let n = runs.first().map_or(0, |r| r.flows.len());
    let mut head: Vec<String> = vec!["run".into(), "total MB/s".into(), "Jain".into()];
    head.extend((1..=n).map(|i| format!("flow {i}")));
    head.extend(["retransmits".into(), "s".into()]);
    let mut t = table(&head.iter().map(String::as_str).collect::<Vec<_>>());
    for (i, r) in runs.iter().enumerate() {
        let mut row = vec![(i + 1).to_string(), format!("{:.1}", r.total_mb_s), format!("{:.3}", r.jain)];
        row.extend(r.flows.iter().map(|f| format!("{:.1}", f.goodput_mb_s)));
        row.push(r.flows.iter().map(|f| f.retransmits).sum::<u64>().to_string());
        row.push(format!("{:.3}", r.seconds));
        t.add_row(row);
    }
    right(&mut t);
    println!("{n} tether streams at once, {size} B messages (MB/s until the first was done):\n{t}");
    if let Some(m) = Summary::of(&runs.iter().map(|r| r.total_mb_s).collect::<Vec<_>>()) {
        println!("median total: {:.1} MB/s (min {:.1}, max {:.1})", m.median, m.min, m.max);
    }
    if let Some(m) = Summary::of(&runs.iter().map(|r| r.jain).collect::<Vec<_>>()) {
        println!("median Jain fairness: {:.3} (min {:.3}, max {:.3})", m.median, m.min, m.max);
    }
    if let Some(m) = Summary::of(&runs.iter().map(|r| r.slowest_share).collect::<Vec<_>>()) {
        println!(
            "median slowest flow: {:.2} of its fair share (min {:.2}, max {:.2})",
            m.median, m.min, m.max
        );
    }
}

pub fn stream(runs: &[StreamRun], mode: &str, size: usize) {
    let mut t = table(&[
        "run",
        "MB/s",
        "msgs/s",
        "delivered",
        "sent",
        "corrupted",
        "out of order",
        "retransmits",
        "s",
    ]);
    for (i, r) in runs.iter().enumerate() {
        t.add_row(vec![
            (i + 1).to_string(),
            format!("{:.1}", r.goodput_mb_s),
            format!("{:.0}", r.msgs_per_s),
            r.delivered.to_string(),
            r.messages.to_string(),
            r.corrupted.to_string(),
            r.out_of_order.to_string(),
            r.retransmits.to_string(),
            format!("{:.3}", r.seconds),
        ]);
    }
    right(&mut t);
    println!("stream {mode}, {size} B messages:\n{t}");
    if let Some(m) = Summary::of(&runs.iter().map(|r| r.goodput_mb_s).collect::<Vec<_>>()) {
        println!("median goodput: {:.1} MB/s (min {:.1}, max {:.1})", m.median, m.min, m.max);
    }
    if let Some(m) = Summary::of(&runs.iter().map(|r| r.msgs_per_s).collect::<Vec<_>>()) {
        println!("median rate: {:.0} messages/s (min {:.0}, max {:.0})", m.median, m.min, m.max);
    }
    let mut injected = FaultCounters::default();
    for r in runs {
        injected.accumulate(&r.injected);
    }
    if injected.total() > 0 {
        println!("faults injected, all runs: {}", faults(&injected));
    }
    if mode != "raw" {
        // A side this process did not run has no counters here (the
        // other process prints its own).
        type Side = fn(&StreamRun) -> Option<&Drops>;
        let sides: [(&str, Side); 2] =
            [("the sender", |r| r.sender_drops.as_ref()), ("the receiver", |r| r.receiver_drops.as_ref())];
        for (who, of) in sides {
            if runs.iter().any(|r| of(r).is_some()) {
                println!("{}", drops(who, &crate::net::sum_drops(runs.iter().filter_map(of))));
            }
        }
    }
    if let Some(last) = runs.last().filter(|r| !r.rails.is_empty()) {
        rails(&last.rails);
    }
    let gaps: Vec<f64> = runs.iter().flat_map(|r| r.rails.failovers.iter().map(|f| f.gap_ms)).collect();
    if let Some(g) = Summary::of(&gaps) {
        println!(
            "failovers, all runs: {} (gap ms: median {:.3}, min {:.3}, max {:.3}; last ACK on the stopped rail to first ACK on the new one)",
            g.n, g.median, g.min, g.max
        );
    }
}

/// The sender's paths at the end of the last run, and its rail timeline.
pub fn rails(t: &crate::timeline::Timeline) {
    let mut p = table(&[
        "rail",
        "state",
        "rtt us",
        "datagrams sent",
        "data frames",
        "retransmits",
        "probes",
        "received",
        "state changes",
    ]);
    for r in &t.paths {
        let s = &r.path.stats;
        p.add_row(vec![
            r.path.rail.to_string(),
            r.path.state.to_string(),
            r.rtt_us.map_or("-".into(), |v| format!("{v:.1}")),
            s.datagrams_sent.to_string(),
            s.data_frames_sent.to_string(),
            s.retransmits.to_string(),
            s.probes_sent.to_string(),
            s.datagrams_received.to_string(),
            s.state_changes.to_string(),
        ]);
    }
    right(&mut p);
    println!("paths of the sender, last run:\n{p}");
    if t.events.is_empty() && t.failovers.is_empty() {
        return;
    }
    println!("rail timeline, last run (ms from the start):");
    let mut lines: Vec<(f64, String)> = t
        .events
        .iter()
        .filter_map(|e| match e.event {
            Event::PathChanged { rail, from, to, .. } => {
                Some((e.t_ms, format!("rail {rail} {from} -> {to}")))
            }
            _ => None,
        })
        .collect();
    lines.extend(t.failovers.iter().map(|f| {
        let (from, to) = (f.failover.from, f.failover.to);
        (f.t_ms, format!("failover rail {from} -> rail {to}: gap {:.3} ms", f.gap_ms))
    }));
    lines.sort_by(|a, b| a.0.total_cmp(&b.0));
    for (t_ms, what) in lines {
        println!("  {t_ms:>10.3}  {what}");
    }
}

/// "drop 12, modify 3": the kinds that struck, with their counts.
pub fn faults(c: &FaultCounters) -> String {
    let struck: Vec<String> = FaultKind::ALL
        .iter()
        .filter(|&&k| c.of(k) > 0)
        .map(|&k| format!("{} {}", k.name(), c.of(k)))
        .collect();
    if struck.is_empty() {
        "none".into()
    } else {
        struck.join(", ")
    }
}

pub fn bench(rows: &[BenchRow], o: &NetOpts) {
    println!(
        "tether bench on UDP loopback: mtu {} B, window {}, checksum {:?}, {:?}, {} runs each; figures are median (min-max) over runs",
        o.mtu, o.window, o.checksum, o.mode, o.runs
    );
    println!(
        "limit: two spinning non-blocking sockets, messages in datagrams of up to {} B, every byte checked on arrival",
        crate::limit::MAX_DATAGRAM
    );
    let mut t = table(&[
        "size",
        "RTT limit us",
        "RTT tether us",
        "ratio",
        "limit MB/s",
        "tether MB/s",
        "ratio",
        "tether msgs/s",
        "limit delivered",
    ]);
    for r in rows {
        t.add_row(vec![
            r.size.to_string(),
            spread(&r.pingpong_limit_us, 1),
            spread(&r.pingpong_tether_us, 1),
            format!("{:.3}", r.pingpong_limit_ratio),
            spread(&r.stream_limit_mb_s, 0),
            spread(&r.stream_tether_mb_s, 0),
            format!("{:.3}", r.stream_limit_ratio),
            format!("{:.0}", r.stream_tether_msgs_s),
            format!("{:.1}%", r.stream_limit_delivered_fraction * 100.0),
        ]);
    }
    right(&mut t);
    println!("{t}");
    println!("ratio: tether / limit (RTT: lower is better; stream: higher is better)");
    println!(
        "\nthe transport layer alone (tether-io: the same sockets, no tether header, no reliability; datagrams of up to --mtu {} B)",
        o.mtu
    );
    let mut t = table(&["size", "RTT io us", "tether / io", "io MB/s", "tether / io", "io delivered"]);
    for r in rows {
        t.add_row(vec![
            r.size.to_string(),
            spread(&r.pingpong_raw_us, 1),
            format!("{:.3}", r.pingpong_ratio),
            spread(&r.stream_raw_mb_s, 0),
            format!("{:.3}", r.stream_ratio),
            format!("{:.1}%", r.stream_raw_delivered_fraction * 100.0),
        ]);
    }
    right(&mut t);
    println!("{t}");
}

pub fn shm(r: &crate::shm_bench::ShmReport, o: &crate::shm_bench::ShmOpts) {
    println!(
        "tether bench shm: two threads over a shared-memory region, {} round trips and {} records of 8 B per run, {} runs; median (min-max)",
        o.round_trips, o.records, o.runs
    );
    let mut t = table(&["", "baseline", "ring", "ratio"]);
    t.add_row(vec![
        "one-way ns (lower is better)".into(),
        spread(&r.baseline_one_way_ns, 1),
        spread(&r.ring_one_way_ns, 1),
        format!("{:.2}", r.ring_one_way_ns.median / r.baseline_one_way_ns.median),
    ]);
    t.add_row(vec![
        "M msgs/s (higher is better)".into(),
        spread(&r.baseline_m_msgs_s, 1),
        spread(&r.ring_m_msgs_s, 1),
        format!("{:.2}", r.ring_m_msgs_s.median / r.baseline_m_msgs_s.median),
    ]);
    right(&mut t);
    println!("{t}");
    println!("baselines: one-way, a counter bounced in one cache line; throughput, bare 8 B words through a ring of slots");
}

pub fn auth(r: &AuthReport, o: &AuthOpts) {
    println!(
        "one datagram on one core (no sockets): payload GB/s through PacketWriter (copy in, checksum or seal) \
         and through verification or opening and landing; median (min-max) of {} rounds of 20 ms",
        o.rounds
    );
    let mut t = table(&["protection", "payload B", "send GB/s", "receive GB/s", "send ns", "receive ns"]);
    // Nanoseconds per datagram, from the medians: what small messages feel.
    let ns = |s: &Summary, bytes: usize| format!("{:.0}", bytes as f64 / s.median);
    for d in &r.datagrams {
        t.add_row(vec![
            d.protection.to_string(),
            d.payload.to_string(),
            spread(&d.send_gb_s, 3),
            spread(&d.receive_gb_s, 3),
            ns(&d.send_gb_s, d.payload),
            ns(&d.receive_gb_s, d.payload),
        ]);
    }
    right(&mut t);
    println!("{t}");
    let rows = &r.end_to_end;
    println!(
        "tether bench auth on UDP loopback: {} B round trips and a {} B stream at mtu {} B, {} rounds; \
         figures are median (min-max) over rounds, each ratio against CRC32C in its own round",
        o.pingpong_size, o.stream_size, o.mtu, o.rounds
    );
    let mut t = table(&["protection", "encrypted", "RTT us", "RTT ratio", "stream MB/s", "stream ratio"]);
    for r in rows {
        t.add_row(vec![
            r.protection.to_string(),
            if r.encrypted { "yes" } else { "no" }.to_string(),
            spread(&r.rtt_us, 2),
            spread(&r.rtt_ratio, 3),
            spread(&r.stream_mb_s, 0),
            spread(&r.stream_ratio, 3),
        ]);
    }
    right(&mut t);
    println!("{t}");
    println!("bars for authentication: RTT ratio <= 1.05, stream ratio >= 0.9 (lower RTT and higher goodput are better)");
}

/// One line of `tether sim`: a fault mix summed over its seeds.
#[derive(Debug, serde::Serialize)]
pub struct SimRow {
    pub mix: &'static str,
    pub runs: usize,
    pub failed_runs: usize,
    pub sent: u64,
    pub delivered: u64,
    pub failed: u64,
    pub in_doubt_delivered: u64,
    pub lost_in_crash: u64,
    /// Data frames sent for the first time.
    pub first_sends: u64,
    pub retransmits: u64,
    /// Retransmission timer expiries, and those found spurious.
    pub timeouts: u64,
    pub spurious_timeouts: u64,
    pub checksum_failures: u64,
    pub datagrams_dropped: u64,
    pub datagrams_corrupted: u64,
    pub datagrams_duplicated: u64,
    pub datagrams_cut: u64,
    /// A calls mix's calls, summed (crashes, calls, and how they ended).
    pub calls: Option<tether_sim::calls::CallsReport>,
    /// The membership mix's crashes and removals, over its runs.
    pub membership: Option<MembershipRow>,
    /// The fabric mixes' moves and route searches, over their runs.
    pub fabric: Option<FabricRow>,
}

/// What the fabric mixes' runs came to: how the moved node was found
/// again by its peers, by how far it moved ([TB] Table 3's columns).
#[derive(Debug, Clone, serde::Serialize)]
pub struct FabricRow {
    /// The runs' topology (`tether_sim::topology`; a random one's seed
    /// differs run by run).
    pub topology: String,
    pub hosts: usize,
    pub switches: usize,
    pub searches: u64,
    pub host_probes: u64,
    pub switch_probes: u64,
    /// Datagrams held while their route was searched for, then sent.
    pub held: u64,
    /// Refused for an older route generation than heard.
    pub stale_generation: u64,
    /// Lost at an empty port (a route to where a moved node was).
    pub no_such_port: u64,
    pub by_hops: Vec<FabricHops>,
}

/// The peers' searches for the moved node, at one distance.
#[derive(Debug, Clone, serde::Serialize)]
pub struct FabricHops {
    pub hops: usize,
    pub searches: usize,
    pub host_probes: f64,
    pub switch_probes: f64,
    /// Virtual time a search took, mean.
    pub us: f64,
    /// The move to the search's start, mean: the core judging the paths
    /// down.
    pub noticed_ms: f64,
}

impl FabricRow {
    fn of(reports: &[tether_sim::SimReport]) -> Option<FabricRow> {
        let f: Vec<_> = reports.iter().filter_map(|r| r.fabric.as_ref()).collect();
        let first = f.first()?;
        let mut by: std::collections::BTreeMap<usize, Vec<(&tether_sim::routed::Search, f64)>> =
            Default::default();
        for r in &f {
            for &(mover, hops, at_ms) in &r.moves {
                // Each peer's last search for the mover, on each rail.
                let mut last = std::collections::BTreeMap::new();
                for s in r.searches.iter().filter(|s| s.peer == mover && s.hops > 0 && s.at_ms >= at_ms) {
                    last.insert((s.node, s.rail), s);
                }
                by.entry(hops).or_default().extend(last.into_values().map(|s| (s, s.at_ms - at_ms)));
            }
        }
        let mean = |v: &[(&tether_sim::routed::Search, f64)],
                    g: &dyn Fn(&tether_sim::routed::Search, f64) -> f64| {
            v.iter().map(|(s, d)| g(s, *d)).sum::<f64>() / v.len().max(1) as f64
        };
        let sum = |g: &dyn Fn(&tether_sim::routed::FabricReport) -> u64| f.iter().map(|r| g(r)).sum::<u64>();
        let topology = match f.iter().all(|r| r.topology == first.topology) {
            true => first.topology.clone(),
            false => format!(
                "{},SEED (a fabric a run)",
                first.topology.rsplit_once(',').map_or("", |(kind, _)| kind)
            ),
        };
        Some(FabricRow {
            topology,
            hosts: first.hosts,
            switches: first.switches,
            searches: sum(&|r| r.books.searches),
            host_probes: sum(&|r| r.books.host_probes),
            switch_probes: sum(&|r| r.books.switch_probes),
            held: sum(&|r| r.held),
            stale_generation: sum(&|r| r.books.stale_generation),
            no_such_port: sum(&|r| r.no_such_port),
            by_hops: by
                .iter()
                .map(|(&hops, v)| FabricHops {
                    hops,
                    searches: v.len(),
                    host_probes: mean(v, &|s, _| s.host_probes as f64),
                    switch_probes: mean(v, &|s, _| s.switch_probes as f64),
                    us: mean(v, &|s, _| s.us),
                    noticed_ms: mean(v, &|_, d| d),
                })
                .collect(),
        })
    }
}

/// What the membership mix's runs came to.
#[derive(Debug, Clone, serde::Serialize)]
pub struct MembershipRow {
    /// Members per run (the largest run's, where they differ).
    pub members: u64,
    pub crashes: u64,
    /// Crash to removal, milliseconds: median and max over every crash.
    pub removal_median_ms: f64,
    pub removal_max_ms: f64,
    pub false_removals: u64,
    /// Members removed while cut off, who joined again.
    pub cut_removals: u64,
    /// Messages sent (members' and replicas'), per member and run.
    pub messages_per_member: f64,
    /// What every node sent and received, over the runs.
    pub load: tether_sim::membership::Load,
    /// Simulated time of a run against its wall-clock time: the median
    /// run's, and the slowest run's.
    pub speed_median: f64,
    pub speed_min: f64,
}

impl MembershipRow {
    fn of(reports: &[tether_sim::SimReport]) -> Option<MembershipRow> {
        let m: Vec<_> = reports.iter().filter_map(|r| r.membership.as_ref()).collect();
        if m.is_empty() {
            return None;
        }
        let mut removals: Vec<f64> = m.iter().flat_map(|r| r.removal_ms.iter().copied()).collect();
        removals.sort_by(f64::total_cmp);
        let members: u64 = m.iter().map(|r| r.members).sum();
        let mut speeds: Vec<f64> = reports
            .iter()
            .filter_map(|r| Some(r.virtual_ms / r.membership.as_ref()?.wall_ms.max(1e-3)))
            .collect();
        speeds.sort_by(f64::total_cmp);
        Some(MembershipRow {
            crashes: m.iter().map(|r| r.crashes).sum(),
            removal_median_ms: removals.get(removals.len() / 2).copied().unwrap_or(0.0),
            removal_max_ms: removals.last().copied().unwrap_or(0.0),
            false_removals: m.iter().map(|r| r.false_removals).sum(),
            cut_removals: m.iter().map(|r| r.cut_removals).sum(),
            messages_per_member: m.iter().map(|r| r.messages).sum::<u64>() as f64 / members.max(1) as f64,
            members: m.iter().map(|r| r.members).max().unwrap_or(0),
            load: tether_sim::membership::Load::over(
                &m.iter().map(|r| (r.members, r.load)).collect::<Vec<_>>(),
            ),
            speed_median: speeds.get(speeds.len() / 2).copied().unwrap_or(0.0),
            speed_min: speeds.first().copied().unwrap_or(0.0),
        })
    }
}

impl SimRow {
    pub fn of(mix: tether_sim::FaultMix, reports: &[tether_sim::SimReport]) -> SimRow {
        let sum = |f: &dyn Fn(&tether_sim::SimReport) -> u64| reports.iter().map(f).sum::<u64>();
        SimRow {
            mix: mix.name(),
            runs: reports.len(),
            failed_runs: reports.iter().filter(|r| !r.ok()).count(),
            sent: sum(&|r| r.sent),
            delivered: sum(&|r| r.delivered),
            failed: sum(&|r| r.failed),
            in_doubt_delivered: sum(&|r| r.in_doubt_delivered),
            lost_in_crash: sum(&|r| r.lost_in_crash),
            first_sends: sum(&|r| r.stats.data_frames_sent - r.stats.retransmits),
            retransmits: sum(&|r| r.stats.retransmits),
            timeouts: sum(&|r| r.stats.timeouts),
            spurious_timeouts: sum(&|r| r.stats.spurious_timeouts),
            checksum_failures: sum(&|r| r.stats.checksum_failures),
            datagrams_dropped: sum(&|r| r.links.faults.dropped),
            datagrams_corrupted: sum(&|r| r.links.faults.modified),
            datagrams_duplicated: sum(&|r| r.links.faults.duplicated),
            datagrams_cut: sum(&|r| r.links.cut),
            calls: reports.iter().filter_map(|r| r.calls).reduce(|a, b| tether_sim::calls::CallsReport {
                crashes: a.crashes + b.crashes,
                calls: a.calls + b.calls,
                ran: a.ran + b.ran,
                not_run: a.not_run + b.not_run,
                unknown: a.unknown + b.unknown,
            }),
            membership: MembershipRow::of(reports),
            fabric: FabricRow::of(reports),
        }
    }
}

pub fn sim(rows: &[SimRow]) {
    let mut t = table(&[
        "mix",
        "runs",
        "violating",
        "sent",
        "delivered",
        "failed",
        "in doubt",
        "crash-lost",
        "retransmits",
        "resent %",
        "timeouts",
        "cksum fail",
        "dropped/corrupt/dup/cut",
    ]);
    for r in rows {
        t.add_row(vec![
            r.mix.to_string(),
            r.runs.to_string(),
            r.failed_runs.to_string(),
            r.sent.to_string(),
            r.delivered.to_string(),
            r.failed.to_string(),
            r.in_doubt_delivered.to_string(),
            r.lost_in_crash.to_string(),
            r.retransmits.to_string(),
            format!("{:.2}", 100.0 * r.retransmits as f64 / r.first_sends.max(1) as f64),
            format!("{} ({} spurious)", r.timeouts, r.spurious_timeouts),
            r.checksum_failures.to_string(),
            format!(
                "{}/{}/{}/{}",
                r.datagrams_dropped, r.datagrams_corrupted, r.datagrams_duplicated, r.datagrams_cut
            ),
        ]);
    }
    right(&mut t);
    println!("{t}");
    for r in rows {
        if let Some(c) = r.calls {
            println!(
                "{}: a call is the unit (sent: made, delivered: ended); {} server crashes, {} calls: ran {}, did not run {}, unknown {}; none ran twice and every state was true unless violating > 0",
                r.mix, c.crashes, c.calls, c.ran, c.not_run, c.unknown
            );
        }
        if let Some(m) = &r.membership {
            println!(
                "{} ({} members): a live member is the unit (sent: live, delivered: in the last view, holding it); {} crashes, removed after {:.1} ms median, {:.1} max; {} false removals; {} removed while cut off, joined again; {:.0} messages per member a run",
                r.mix, m.members, m.crashes, m.removal_median_ms, m.removal_max_ms, m.false_removals, m.cut_removals, m.messages_per_member
            );
            println!(
                "{} ({} members): after the start-up a member sends and receives {:.0} messages a second (busiest {:.0}), the busiest replica {:.0}; in the start-up second (all joining at once) a member {:.0}, the busiest replica {:.0}; {:.2} view-change messages per change a member applies; simulated {:.1}x faster than real time (median run; slowest {:.1}x)",
                r.mix, m.members, m.load.member, m.load.member_max, m.load.manager_max, m.load.startup_member, m.load.startup_manager_max, m.load.changes_per_change, m.speed_median, m.speed_min
            );
        }
    }
    for r in rows {
        let Some(f) = &r.fabric else { continue };
        println!(
            "{} ({}: {} hosts, {} switches a rail): {} route searches, {} host and {} switch probes; {} datagrams held for a route, {} lost at the empty port a moved node left, {} refused for an older generation",
            r.mix, f.topology, f.hosts, f.switches, f.searches, f.host_probes, f.switch_probes, f.held, f.no_such_port, f.stale_generation
        );
        println!("  the moved node found again by each peer on each rail ([TB] Table 3: 28 / 73 / 124 / 186 probes for 1-4 hops):");
        for h in &f.by_hops {
            println!(
                "  {} hops: {} searches, {:.1} host + {:.1} switch = {:.1} probes, {:.1} us virtual, started {:.2} ms after the move",
                h.hops,
                h.searches,
                h.host_probes,
                h.switch_probes,
                h.host_probes + h.switch_probes,
                h.us,
                h.noticed_ms
            );
        }
    }
    println!("in doubt: delivered, then reported failed because the ACK died with the link (allowed, see FailedMessages)");
    println!("resent %: data frames sent again per hundred sent once; spurious: a timeout whose probe's answer showed everything sent before it arrived");
}

pub fn campaign(rows: &[crate::campaign::Row]) {
    let mut t = table(&[
        "workload",
        "fault",
        "rate",
        "runs",
        "sent",
        "delivered",
        "lost",
        "dup",
        "corrupt",
        "injected",
        "retransmits",
        "dup discarded",
        "cksum fail",
        "time vs fault-free",
    ]);
    for r in rows {
        t.add_row(vec![
            r.workload.to_string(),
            r.fault.to_string(),
            if r.rate == 0.0 { "-".into() } else { format!("{:e}", r.rate) },
            r.runs.to_string(),
            r.sent.to_string(),
            r.delivered.to_string(),
            r.lost.to_string(),
            r.duplicated.to_string(),
            r.corrupted.to_string(),
            r.injected.to_string(),
            r.retransmissions.to_string(),
            r.duplicates_discarded.to_string(),
            r.checksum_failures.to_string(),
            spread(&r.relative_time, 2),
        ]);
    }
    right(&mut t);
    println!("{t}");
    println!("counts summed over the seeds of a row; time: median (min-max) over seeds, relative to the median fault-free run");
}

pub fn cluster_campaign(rows: &[crate::cluster_campaign::Row], c: &crate::cluster_campaign::ClusterCampaign) {
    let mut t = table(&[
        "detector",
        "faults",
        "cells",
        "seconds",
        "injected",
        "R / fault",
        "D / fault",
        "A (false alarms)",
        "S (self-diagnosis)",
        "suspicions (refuted)",
    ]);
    for r in rows {
        t.add_row(vec![
            r.detector.to_string(),
            if r.busy { "busy thread per core".into() } else { format!("{:e} each", r.rate) },
            format!(
                "{}{}",
                r.cells,
                if r.unformed > 0 { format!(" ({} unformed)", r.unformed) } else { String::new() }
            ),
            format!("{:.0}", r.seconds),
            r.injected.to_string(),
            format!("{:.3}", r.r),
            format!("{:.3}", r.d),
            r.false_alarms.to_string(),
            r.self_diagnosis.to_string(),
            format!("{} ({})", r.suspicions, r.refuted),
        ]);
    }
    right(&mut t);
    println!("{t}");
    println!(
        "{} nodes (3 manager replicas), heartbeats every {:?}, nobody dies; faults: drop, duplicate and corrupt, each at the rate, on every datagram received; counts summed over the seeds of a row",
        c.members, c.period
    );
}

pub fn bandwidth(r: &crate::bandwidth::BandwidthReport) {
    println!(
        "tether bench checksum: GB/s, median (min-max) of {} runs; in cache = one {} B block, out of cache = {} MiB walked in {} B blocks; fused CRC32C kernel in use: {}",
        r.runs,
        r.block_bytes,
        r.large_bytes >> 20,
        r.block_bytes,
        r.crc32c_kernel
    );
    let mut t = table(&[
        "algorithm",
        "alone in cache",
        "alone out of cache",
        "fused copy in cache",
        "fused copy out of cache",
        "copy then sum in cache",
        "fused / memcpy",
    ]);
    let pair = |p: &crate::bandwidth::Pair| (spread(&p.in_cache, 1), spread(&p.out_of_cache, 1));
    let (copy_in, copy_out) = pair(&r.memcpy_gb_s);
    let (read_in, read_out) = pair(&r.memory_read_gb_s);
    t.add_row(vec!["memory read".into(), read_in, read_out, "".into(), "".into(), "".into(), "".into()]);
    t.add_row(vec!["memcpy".into(), "".into(), "".into(), copy_in, copy_out, "".into(), "1.000".into()]);
    for a in &r.algorithms {
        let (mut alone_in, mut alone_out) = pair(&a.alone_gb_s);
        if a.name == "none" {
            // Checksumming with `none` is no work at all: no bandwidth to show.
            (alone_in, alone_out) = ("-".into(), "-".into());
        }
        let (fused_in, fused_out) = pair(&a.fused_gb_s);
        t.add_row(vec![
            a.name.to_string(),
            alone_in,
            alone_out,
            fused_in,
            fused_out,
            spread(&a.two_pass_gb_s.in_cache, 1),
            format!("{:.3}", a.fused_vs_memcpy),
        ]);
    }
    for k in &r.crc32c_kernels {
        let (fused_in, fused_out) = pair(&k.fused_gb_s);
        let ratio = k.fused_gb_s.in_cache.median / r.memcpy_gb_s.in_cache.median;
        t.add_row(vec![
            format!("crc32c, {} kernel", k.kernel),
            "".into(),
            "".into(),
            fused_in,
            fused_out,
            "".into(),
            format!("{ratio:.3}"),
        ]);
    }
    right(&mut t);
    println!("{t}");
}

pub fn detection(r: &crate::detection::DetectionReport) {
    use crate::detection::Pattern;
    println!(
        "tether bench checksum --errors: undetected corruptions of a {} B message, {} trials per pattern (seed {}); fraction (count)",
        r.message_bytes, r.trials_per_pattern, r.seed
    );
    let mut header = vec!["algorithm"];
    header.extend(Pattern::ALL.iter().map(|p| p.label()));
    let mut t = table(&header);
    for a in &r.algorithms {
        let mut row = vec![a.name.to_string()];
        row.extend(a.cells.iter().map(|c| {
            if c.undetected == 0 {
                "0".to_string()
            } else {
                format!("{:.2e} ({})", c.fraction, c.undetected)
            }
        }));
        t.add_row(row);
    }
    right(&mut t);
    println!("{t}");
    use tether_wire::ChecksumKind as K;
    let crc = |p| r.undetected(K::Crc32c, p);
    for k in [K::Sum, K::Xor] {
        for p in [Pattern::WordSwap, Pattern::TwoBits] {
            if let (Some(missed), Some(crc_missed)) = (r.undetected(k, p), crc(p)) {
                println!(
                    "{}: missed {missed} of {} {} errors; crc32c missed {crc_missed}",
                    k.name(),
                    r.trials_per_pattern,
                    p.label()
                );
            }
        }
    }
}

pub fn model(m: &crate::model::ModelReport) {
    let i = &m.inputs;
    println!(
        "T(L) model (Trahay et al. [NMAD] section 5.2) for {}: B_copy {:.1} GB/s, B_csum {:.1} GB/s, B_fused {:.1} GB/s (in cache, above), lambda_net {:.2} us (half the raw 8 B round trip), B_net {:.0} MB/s (raw 64 KiB stream)",
        m.checksum,
        i.b_copy / 1e9,
        i.b_csum / 1e9,
        i.b_fused / 1e9,
        i.lambda_net * 1e6,
        i.b_net / 1e6
    );
    let mut t = table(&[
        "size",
        "T(L) plain us",
        "measured us",
        "predicted: paper (2 copies + 2 passes)",
        "predicted: both copies fused (tether)",
        "stream none MB/s",
        &format!("stream {} MB/s", m.checksum),
        "measured overhead",
        "with / none",
    ]);
    let pct = |x: f64| format!("{:+.2}%", x * 100.0);
    for r in &m.rows {
        t.add_row(vec![
            r.size.to_string(),
            format!("{:.1}", r.t_plain_us),
            format!("{:.1}", r.t_measured_us),
            pct(r.predicted_paper),
            pct(r.predicted_fused),
            spread(&r.stream_none_mb_s, 1),
            spread(&r.stream_checksum_mb_s, 1),
            pct(r.measured),
            format!("{:.3}", r.stream_checksum_mb_s.median / r.stream_none_mb_s.median),
        ]);
    }
    right(&mut t);
    println!("{t}");
    println!("overhead = time per message with the checksum / without - 1 (stream: medians of runs alternating the two); measured us = time per message without the checksum");
    for r in &m.rows {
        let gap = (r.measured - r.predicted_fused) * 100.0;
        println!(
            "{} B: predicted {:+.2}% for tether's path, measured {:+.2}% ({gap:+.2} points); run-to-run noise +-{:.1}%: {}",
            r.size,
            r.predicted_fused * 100.0,
            r.measured * 100.0,
            r.noise() * 100.0,
            if gap.abs() <= r.noise() * 100.0 { "agree within noise" } else { "differ by more than the noise" }
        );
    }
}

pub fn engine(r: &crate::engine_bench::EngineReport, o: &crate::engine_bench::EngineBenchOpts) {
    println!(
        "tether bench engine: two `tether engine` processes on loopback, an application attached to each; \
         {} runs, median (min-max) of the runs' medians",
        o.runs
    );
    let mut t = table(&["", "raw socket", "embedded", "engine process", "engine / embedded"]);
    t.add_row(vec![
        "8 B round trip us".into(),
        spread(&r.rtt_raw_us, 2),
        spread(&r.rtt_embedded_us, 2),
        spread(&r.rtt_engine_us, 2),
        spread(&r.rtt_ratio, 2),
    ]);
    t.add_row(vec![
        "64 KiB stream MB/s".into(),
        "-".into(),
        spread(&r.stream_embedded_mb_s, 0),
        spread(&r.stream_engine_mb_s, 0),
        spread(&r.stream_ratio, 2),
    ]);
    right(&mut t);
    println!("{t}");
    println!(
        "self-test (every 500 ms on a rail in use) and state audit: a {} x 64 KiB stream with them / without {} \
         (without: {} MB/s); their time, as the busier engine reports it, {} % of the stream's ({} probes)",
        crate::engine_bench::SELFTEST_STREAM * o.stream_messages,
        spread(&r.selftest_ratio, 3),
        spread(&r.stream_no_selftest_mb_s, 0),
        spread(&r.checking_pct, 3),
        spread(&r.selftest_probes, 0)
    );
    println!(
        "host-side backup: 8 B stream through two engines {} M msgs/s with it, {} without, {} us a message; \
         8 B round trip {} us without it, {} us added",
        spread(&r.small_stream_m_msgs_s, 3),
        spread(&r.small_stream_no_backup_m_msgs_s, 3),
        spread(&r.backup_us_per_msg, 3),
        spread(&r.rtt_no_backup_us, 2),
        spread(&r.backup_rtt_us, 2)
    );
    println!(
        "CPU time per 64 KiB message, every wait sleeping: embedded {} us, through engines {} us \
         (applications and engines; {} x embedded), the engines' supervisors {} us more",
        spread(&r.cpu_embedded_us, 2),
        spread(&r.cpu_engine_us, 2),
        spread(&r.cpu_ratio, 2),
        spread(&r.cpu_supervisors_us, 2)
    );
    println!(
        "two applications on one engine: 8 B one-way {} us (round trip / 2), {} M msgs/s, \
         {} M msgs/s with the batch API",
        spread(&r.same_node_one_way_us, 2),
        spread(&r.same_node_m_msgs_s, 3),
        spread(&r.same_node_batch_m_msgs_s, 3)
    );
    let v = &r.recovery;
    if v.kills + v.hangs == 0 {
        return;
    }
    println!(
        "\nrecovery: a verified stream of {} B messages, one every {} us, for {:.1} s; {} engines killed \
         (SIGKILL) and {} stopped (SIGSTOP, threshold {} us), each the sender's or the receiver's at random",
        1000, o.pace_us, v.seconds, v.kills, v.hangs, o.hang_after_us
    );
    let mut t = table(&["ms", "median", "p99", "min", "max", "n"]);
    let row = |t: &mut Table, name: &str, s: &Option<Summary>| {
        if let Some(s) = s {
            t.add_row(vec![
                name.to_string(),
                format!("{:.3}", s.median),
                format!("{:.3}", s.p99),
                format!("{:.3}", s.min),
                format!("{:.3}", s.max),
                s.n.to_string(),
            ]);
        }
    };
    row(&mut t, "kill -9 to first new message delivered", &v.kill_recovery_ms);
    row(&mut t, "SIGSTOP to hang reported", &v.hang_detection_ms);
    row(&mut t, "heartbeat still when declared hung", &v.hang_still_ms);
    row(&mut t, "SIGSTOP to first new message delivered", &v.hang_recovery_ms);
    right(&mut t);
    println!("{t}");
    println!(
        "{}; applications told EngineRecovered: sender {}, receiver {}; replacements no fault caused {} \
         (and {} during the cost runs)",
        v.totals,
        v.recovered_events_sender,
        v.recovered_events_receiver,
        v.spurious_replacements,
        v.cost_replacements
    );
}

/// `tether campaign --engine`: Zhou et al. [FTGM] Table 1's outcomes per
/// fault class, with the recovery times of the detected strikes.
pub fn engine_campaign(r: &crate::engine_campaign::EngineCampaignReport) {
    println!(
        "tether campaign --engine: two hosts (network namespaces, {} veth rail{}), a supervised `tether engine` \
         on each (hang threshold {} us, receive drop {}%), a verified stream of {} B messages every {} us; \
         {} strikes per class, one at a time in a drawn order (seed {}), each on the sender's or the \
         receiver's engine; {:.1} s",
        r.rails,
        if r.rails == 1 { "" } else { "s" },
        r.hang_after_us,
        r.drop * 100.0,
        r.size,
        r.pace_us,
        r.strikes_per_class,
        r.seed,
        r.seconds
    );
    let mut t = table(&[
        "class",
        "injected",
        "no effect",
        "no state",
        "crash",
        "watchdog",
        "self-test",
        "undetected, effect",
        "coverage",
        "detect ms",
        "recovery ms median",
        "p99",
        "max",
        "queue ms",
        "added ms median",
        "p99",
    ]);
    let ms = |s: &Option<Summary>, f: fn(&Summary) -> f64| {
        s.as_ref().map_or("-".into(), |s| format!("{:.3}", f(s)))
    };
    for c in r.classes.iter().chain(std::iter::once(&r.all)) {
        t.add_row(vec![
            c.class.to_string(),
            c.injected.to_string(),
            c.no_effect.to_string(),
            c.no_state.to_string(),
            c.crash.to_string(),
            c.watchdog.to_string(),
            c.self_test.to_string(),
            c.undetected.to_string(),
            c.coverage_pct.map_or("-".into(), |p| format!("{p:.1}%")),
            ms(&c.detect_ms, |s| s.median),
            ms(&c.recovery_ms, |s| s.median),
            ms(&c.recovery_ms, |s| s.p99),
            ms(&c.recovery_ms, |s| s.max),
            ms(&c.queue_ms, |s| s.median),
            ms(&c.added_ms, |s| s.median),
            ms(&c.added_ms, |s| s.p99),
        ]);
    }
    right(&mut t);
    println!("{t}");
    println!(
        "detected: by crash (the supervisor saw the engine die), watchdog (hung), self-test (failed a probe, or the audit of its own state); \
         coverage = detected / (detected + undetected with effect); detect ms median, recovery from the \
         strike to the first message submitted after it delivered, over the detected strikes; queue ms: median of \
         how long the message delivered last before each strike had waited since its submission (what a message \
         submitted at the strike waits with nothing struck: a deep backlog's queue); added ms: recovery less that"
    );
    if r.all.not_struck > 0 {
        let n = r.all.not_struck;
        let s = if n == 1 { "" } else { "s" };
        println!("{n} strike{s} did not reach an engine (see the hook column of the CSV or JSON)");
    }
    for s in r.strikes.iter().filter(|s| s.verdict == crate::engine_campaign::Verdict::Undetected).take(10) {
        println!(
            "undetected with effect: strike {} ({} on the {}'s engine {}, {}): {}",
            s.n,
            s.class.name(),
            s.side,
            s.engine,
            if s.hook.is_empty() { "-" } else { &s.hook },
            s.effect
        );
    }
    println!(
        "{}, reported failed {}; applications told EngineRecovered: sender {}, receiver {}; replacements no \
         strike provoked {}; episodes {} ({} ended by a stall)",
        r.totals,
        r.reported_failed,
        r.recovered_events_sender,
        r.recovered_events_receiver,
        r.unprovoked_replacements,
        r.episodes,
        r.broken_episodes
    );
    for i in r.unprovoked.iter().take(5) {
        let what = if i.what.is_empty() { "(no failure reported before it)" } else { &i.what };
        println!("  not provoked: at {:.1} ms, the {}'s engine: {what}", i.at_ms, i.side);
    }
    if r.unprovoked.len() > 5 {
        println!("  ... and {} more (see --json)", r.unprovoked.len() - 5);
    }
    let detected = r.all.crash + r.all.watchdog + r.all.self_test;
    if detected > 0 && r.coincidences_expected >= 0.05 {
        println!(
            "at the rate of those while no strike was watched, about {:.1} of the {detected} detections are \
             likely coincidences (an engine failing on its own during a strike's observation)",
            r.coincidences_expected
        );
    }
}
