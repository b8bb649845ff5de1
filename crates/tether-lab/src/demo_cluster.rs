//! `tether demo --cluster`: a cluster of processes on loopback that keeps
//! agreeing while its members fail (docs/CLUSTER.md). Three manager
//! replicas and `--members` more nodes, each a process of its own
//! (`tether cluster-member`, started here from a hostfile as a launcher
//! would), all members of one group that every one of them multicasts to
//! throughout, over links that drop, duplicate, corrupt, reorder and
//! delay. On a fixed schedule one member is killed (SIGKILL), one frozen
//! (SIGSTOP, then thawed), one cut off from everyone for a while (its
//! fault plan drops everything both ways), and one manager replica
//! killed, which the leader must replace with a spare.
//!
//! Each process writes what it saw, as it saw it, to a log of its own
//! (views, suspicions, group views, deliveries, stamped with the
//! machine's monotonic clock, which every process shares). From the logs
//! the demo checks what Li et al. [CI] section 3 and virtual synchrony
//! promise: every failure detected (and how fast, in heartbeat periods),
//! nobody else removed, every node's views one sequence, every delivery
//! in the view it was made in, and every member that went on from a view
//! delivered the same messages in it, in the same order.

// The demo paces its strikes by the wall clock.
#![allow(clippy::disallowed_methods)]

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::net::UdpSocket;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde::Serialize;
use tether::cluster::{ClusterConfig, ClusterEvent, DetectorKind, GroupOutput};
use tether::faults::FaultPlan;
use tether::launch::Launch;
use tether::{Error, NodeId, Options};

use crate::scratch::{self, Base, Scratch};
use crate::summary::Summary;

/// The group every node joins and multicasts to.
const GROUP: u32 = 1;
/// The founding manager replicas: nodes 1 to 3.
const REPLICAS: u32 = 3;

/// The schedule, from the moment the processes are started: the cluster
/// must have formed by `FORMED`; then the strikes, each given time to be
/// detected and its node to come back before the next.
const FORMED: Duration = Duration::from_secs(3);
const KILL_AT: Duration = Duration::from_secs(3);
const FREEZE_AT: Duration = Duration::from_secs(4);
const THAW_AT: Duration = Duration::from_secs(6);
const CUT_FROM: Duration = Duration::from_secs(7);
const CUT_UNTIL: Duration = Duration::from_millis(8_500);
const REPLICA_KILL_AT: Duration = Duration::from_secs(10);
const END_AT: Duration = Duration::from_secs(13);

/// `tether cluster-member` (started by the demo, not by hand).
#[derive(Debug, Clone, clap::Args)]
pub struct ClusterMemberOpts {
    /// The demo's directory: the hostfile, the logs, the stop file.
    #[arg(long)]
    pub dir: PathBuf,
    /// This process's rank in the hostfile (node rank + 1).
    #[arg(long)]
    pub rank: u32,
    /// Nodes that take a failed replica's place.
    #[arg(long, value_delimiter = ',')]
    pub spares: Vec<NodeId>,
    /// Heartbeat period, in milliseconds.
    #[arg(long)]
    pub period_ms: u64,
    /// Multicasts to the group a second.
    #[arg(long)]
    pub rate: u32,
    /// The suspicion rule: `fixed` (two heartbeats missed) or `phi`.
    #[arg(long, default_value = "phi")]
    pub detector: Detector,
    #[arg(long)]
    pub seed: u64,
    /// Fault rules for this node's endpoint.
    #[arg(long = "fault")]
    pub faults: Vec<String>,
}

/// The suspicion rule a demo's members use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Detector {
    /// The seed's rule: two heartbeats missing or late.
    Fixed,
    /// Phi accrual (Hayashibara et al.), threshold 8.
    Phi,
}

impl Detector {
    fn kind(self, period: Duration) -> DetectorKind {
        match self {
            Detector::Fixed => DetectorKind::two_miss(period),
            Detector::Phi => DetectorKind::phi(period),
        }
    }
}

/// The machine's monotonic clock, in nanoseconds: one clock for every
/// process of the demo.
fn mono_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn log_path(dir: &Path, node: NodeId) -> PathBuf {
    dir.join(format!("node-{node}.log"))
}

fn list(nodes: impl IntoIterator<Item = NodeId>) -> String {
    let v: Vec<String> = nodes.into_iter().map(|n| n.to_string()).collect();
    if v.is_empty() {
        "-".into()
    } else {
        v.join(",")
    }
}

/// One node of the demo: a member (and a replica, if it is one of the
/// founders or becomes one) that multicasts to the group at `rate` and
/// logs everything it sees, until the stop file appears.
pub fn serve(o: &ClusterMemberOpts) -> anyhow::Result<()> {
    let launch = Launch::from_hostfile(&o.dir.join("hosts"), o.rank, 0)?;
    let me = launch.node();
    let founders: Vec<NodeId> = (1..=REPLICAS).collect();
    let faults = FaultPlan::parse_rules(o.seed ^ u64::from(me).wrapping_mul(0x9E37_79B9), &o.faults)?;
    let config = tether::Config { rto_min: Duration::from_millis(1), ..tether::Config::default() };
    let options = Options { config, faults, linger: Duration::ZERO, ..Options::default() };
    let period = Duration::from_millis(o.period_ms);
    let mut cluster = ClusterConfig { spares: o.spares.clone(), ..ClusterConfig::new(&founders, period) };
    if let Some(m) = &mut cluster.member {
        m.detector = o.detector.kind(period);
    }
    let ep = launch.builder().options(options).cluster(cluster).build()?;
    let mut log = BufWriter::new(std::fs::File::create(log_path(&o.dir, me))?);
    writeln!(log, "U {}", mono_ns())?;
    log.flush()?;
    ep.join_group(GROUP)?;
    let every = Duration::from_secs(1) / o.rate.max(1);
    let mut next_send = Instant::now();
    let mut sent = 0u64;
    let stop = o.dir.join("stop");
    let mut checked = Instant::now();
    loop {
        if checked.elapsed() >= Duration::from_millis(50) {
            checked = Instant::now();
            if stop.exists() {
                break;
            }
        }
        while let Some(e) = ep.poll_cluster_event() {
            let t = mono_ns();
            match e {
                ClusterEvent::View(v) => writeln!(
                    log,
                    "V {t} {} {} {}",
                    v.epoch,
                    v.members.iter().map(|(n, i)| format!("{n}:{i}")).collect::<Vec<_>>().join(","),
                    list(v.replicas.iter().copied())
                )?,
                ClusterEvent::Suspected { subject, .. } => writeln!(log, "S {t} {subject}")?,
                ClusterEvent::Refuted { subject, .. } => writeln!(log, "F {t} {subject}")?,
                ClusterEvent::Alerted { subject, .. } => writeln!(log, "A {t} {subject}")?,
                ClusterEvent::Removed { epoch, .. } => writeln!(log, "X {t} {epoch}")?,
            }
        }
        // Group outputs for up to a millisecond: the loop's pace.
        let until = Instant::now() + Duration::from_millis(1);
        loop {
            let left = until.saturating_duration_since(Instant::now());
            match ep.next_group_output(Some(left)) {
                Ok(GroupOutput::Delivered(m)) => {
                    let now = mono_ns();
                    let sent_at = m
                        .message
                        .get(12..20)
                        .map_or(now, |b| u64::from_le_bytes(b.try_into().expect("eight bytes")));
                    let latency = now.saturating_sub(sent_at);
                    writeln!(log, "D {now} {} {} {} {} {latency}", m.epoch, m.seq, m.from, m.n)?
                }
                Ok(GroupOutput::View { epoch, members, .. }) => {
                    writeln!(log, "G {} {epoch} {}", mono_ns(), list(members))?
                }
                Ok(GroupOutput::Left { undelivered, .. }) => {
                    writeln!(log, "L {} {}", mono_ns(), undelivered.len())?
                }
                Err(Error::TimedOut) => break,
                Err(e) => return Err(e.into()),
            }
            if left.is_zero() {
                break;
            }
        }
        if Instant::now() >= next_send {
            next_send += every;
            let mut msg = [0u8; 64];
            msg[..4].copy_from_slice(&me.to_le_bytes());
            msg[4..12].copy_from_slice(&sent.to_le_bytes());
            msg[12..20].copy_from_slice(&mono_ns().to_le_bytes());
            // Not yet (or no longer) in the group, or too much in flight:
            // this message is simply not sent.
            match ep.multicast(GROUP, &msg, Some(Duration::ZERO)) {
                Ok(_) => sent += 1,
                Err(Error::Group(_)) | Err(Error::TimedOut) => {}
                Err(e) => return Err(e.into()),
            }
            // A process that was frozen does not make up for lost time.
            if next_send < Instant::now() {
                next_send = Instant::now() + every;
            }
        }
        log.flush()?;
    }
    writeln!(log, "E {} {sent}", mono_ns())?;
    log.flush()?;
    Ok(())
}

/// What struck a node, and when (monotonic nanoseconds).
#[derive(Debug, Clone, Serialize)]
pub struct Strike {
    pub node: NodeId,
    pub what: &'static str,
    #[serde(skip)]
    pub at_ns: u64,
    /// When the node came back (thawed, reconnected); a kill is for ever.
    #[serde(skip)]
    pub until_ns: Option<u64>,
    /// From the strike to the first view without the node, in
    /// milliseconds and in heartbeat periods.
    pub detected_ms: Option<f64>,
    pub detected_periods: Option<f64>,
}

impl Strike {
    fn new(node: NodeId, what: &'static str, at_ns: u64, until_ns: Option<u64>) -> Self {
        Strike { node, what, at_ns, until_ns, detected_ms: None, detected_periods: None }
    }
}

/// What the demo did and found.
#[derive(Debug, Serialize)]
pub struct ClusterReport {
    pub nodes: u32,
    pub replicas: u32,
    pub spares: Vec<NodeId>,
    pub period_ms: u64,
    pub detector: Detector,
    /// From the start until every node held a view of all of them.
    pub formed_ms: f64,
    pub strikes: Vec<Strike>,
    pub detection_ms: Option<Summary>,
    /// Nodes removed that nothing struck (or before they were struck).
    pub false_alarms: u64,
    /// Suspicions raised, and those the suspect refuted.
    pub suspicions: u64,
    pub refuted: u64,
    /// Views, and epochs on which two nodes' views differ.
    pub views: u64,
    pub view_disagreements: u64,
    /// Nodes whose views did not come in growing epochs.
    pub views_out_of_order: u64,
    /// The replicas at the end, as the nodes alive then hold them.
    pub final_replicas: Vec<NodeId>,
    pub replica_replaced: bool,
    pub multicasts_sent: u64,
    pub deliveries: u64,
    /// From a multicast to its delivery at each member, across processes
    /// (the machine's monotonic clock), microseconds.
    pub delivery_latency_us: Option<Summary>,
    /// Places in a group view's order given two different messages.
    pub order_disagreements: u64,
    /// Deliveries outside the node's current group view (another epoch,
    /// or from a node not in it).
    pub outside_view: u64,
    /// Group views after which two members that both went on delivered
    /// different messages (virtual synchrony broken).
    pub unequal_views: u64,
    pub faults_rules: Vec<String>,
    pub seconds: f64,
    pub ok: bool,
}

/// The demo's processes: node n's is `children[n - 1]`, until reaped.
struct Farm {
    children: Vec<Option<Child>>,
}

impl Farm {
    fn signal(&mut self, node: NodeId, sig: i32) {
        if let Some(c) = &self.children[node as usize - 1] {
            // SAFETY: a signal to a child this demo started and has not
            // reaped.
            unsafe { libc::kill(c.id() as i32, sig) };
        }
    }

    fn kill(&mut self, node: NodeId) {
        if let Some(mut c) = self.children[node as usize - 1].take() {
            let _ = c.kill();
            let _ = c.wait();
            scratch::child_gone(c.id());
        }
    }

    /// Wait up to `within` for the children to stop by themselves, then
    /// kill what is left.
    fn stop(&mut self, within: Duration) {
        let start = Instant::now();
        for c in self.children.iter_mut().flatten() {
            while start.elapsed() < within && matches!(c.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        for i in 0..self.children.len() {
            self.kill(i as NodeId + 1);
        }
    }
}

impl Drop for Farm {
    fn drop(&mut self) {
        for i in 0..self.children.len() {
            self.signal(i as NodeId + 1, libc::SIGCONT);
            self.kill(i as NodeId + 1);
        }
    }
}

/// The demo's options that concern the cluster.
pub struct ClusterRun {
    pub members: u32,
    pub period_ms: u64,
    pub rate: u32,
    pub detector: Detector,
    pub seed: u64,
    /// Every node's link faults, in the compact form.
    pub rules: Vec<String>,
}

/// Run the cluster, strike it, and check what every node logged.
pub fn run(r: &ClusterRun) -> anyhow::Result<ClusterReport> {
    anyhow::ensure!(r.members >= 5, "--cluster needs --members 5 or more (three struck, two spares)");
    let total = REPLICAS + r.members;
    let killed = REPLICAS + 1;
    let frozen = REPLICAS + 2;
    let cut = REPLICAS + 3;
    let replica = 1;
    let spares = vec![total, total - 1];
    let scratch = Scratch::new(Base::Tmp, "cluster")?;
    let dir = scratch.path().to_owned();
    // One port per node, free a moment ago; the hostfile a launcher
    // would give.
    let mut hosts = String::new();
    for _ in 0..total {
        let a = UdpSocket::bind("127.0.0.1:0")?.local_addr()?;
        hosts.push_str(&format!("{a}\n"));
    }
    std::fs::write(dir.join("hosts"), hosts)?;
    let cut_rules = [
        format!("drop:p=1,from={}ms,until={}ms,side=send", CUT_FROM.as_millis(), CUT_UNTIL.as_millis()),
        format!("drop:p=1,from={}ms,until={}ms,side=recv", CUT_FROM.as_millis(), CUT_UNTIL.as_millis()),
    ];
    let start = Instant::now();
    let start_ns = mono_ns();
    let mut farm = Farm { children: Vec::new() };
    for node in 1..=total {
        let mut cmd = Command::new(std::env::current_exe()?);
        scratch::owned_by_this_run(&mut cmd)
            .arg("cluster-member")
            .arg("--dir")
            .arg(&dir)
            .args(["--rank", &(node - 1).to_string()])
            .args(["--spares", &list(spares.iter().copied())])
            .args(["--period-ms", &r.period_ms.to_string(), "--rate", &r.rate.to_string()])
            .args(["--seed", &r.seed.to_string()])
            .args(["--detector", if r.detector == Detector::Phi { "phi" } else { "fixed" }]);
        for rule in &r.rules {
            cmd.arg(format!("--fault={rule}"));
        }
        if node == cut {
            for rule in &cut_rules {
                cmd.arg(format!("--fault={rule}"));
            }
        }
        let stderr = std::fs::File::create(dir.join(format!("node-{node}.err")))?;
        let child = cmd.stdout(Stdio::null()).stderr(stderr).spawn()?;
        scratch::child_started(child.id());
        farm.children.push(Some(child));
    }
    let everyone: Vec<NodeId> = (1..=total).collect();
    // Formed: every node logged a view of every node.
    let formed_ms = loop {
        let logs = read_logs(&dir, total);
        if logs.iter().all(|l| l.views.last().is_some_and(|v| v.members() == everyone)) {
            break start.elapsed().as_secs_f64() * 1e3;
        }
        if start.elapsed() > FORMED {
            let held: Vec<String> = logs
                .iter()
                .enumerate()
                .map(|(i, l)| format!("{}: {:?}", i + 1, l.views.last().map(|v| v.members())))
                .collect();
            anyhow::bail!("the cluster did not form within {FORMED:?}: {}", held.join("; "));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut strikes = Vec::new();
    let at = |d: Duration| {
        std::thread::sleep(d.saturating_sub(start.elapsed()));
        mono_ns()
    };
    let t = at(KILL_AT);
    farm.kill(killed);
    strikes.push(Strike::new(killed, "SIGKILL", t, None));
    let t = at(FREEZE_AT);
    farm.signal(frozen, libc::SIGSTOP);
    let thawed = at(THAW_AT);
    farm.signal(frozen, libc::SIGCONT);
    strikes.push(Strike::new(frozen, "SIGSTOP (2 s)", t, Some(thawed)));
    at(CUT_FROM);
    // The cut counts from its process's endpoint's start, as its plan does.
    let cut_up = read_log(&log_path(&dir, cut)).up_ns.unwrap_or(start_ns);
    strikes.push(Strike::new(
        cut,
        "cut off (1.5 s)",
        cut_up + CUT_FROM.as_nanos() as u64,
        Some(cut_up + CUT_UNTIL.as_nanos() as u64),
    ));
    let t = at(REPLICA_KILL_AT);
    farm.kill(replica);
    strikes.push(Strike::new(replica, "SIGKILL (replica)", t, None));
    at(END_AT);
    std::fs::write(dir.join("stop"), b"")?;
    farm.stop(Duration::from_secs(5));
    let seconds = start.elapsed().as_secs_f64();
    let logs = read_logs(&dir, total);
    drop(farm);
    let mut report = check(&logs, &mut strikes, r, &spares, replica);
    report.formed_ms = formed_ms;
    report.strikes = strikes;
    report.seconds = seconds;
    drop(scratch);
    Ok(report)
}

/// A view as one node logged it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct LoggedView {
    at: u64,
    epoch: u64,
    /// (node, incarnation)
    members: Vec<(NodeId, u64)>,
    replicas: Vec<NodeId>,
}

impl LoggedView {
    fn members(&self) -> Vec<NodeId> {
        self.members.iter().map(|m| m.0).collect()
    }
}

/// A group output as one node logged it.
#[derive(Debug, Clone)]
enum Logged {
    View { epoch: u64, members: Vec<NodeId> },
    Delivered { epoch: u64, seq: u64, from: NodeId, n: u64 },
    Left,
}

#[derive(Debug, Default)]
struct NodeLog {
    up_ns: Option<u64>,
    views: Vec<LoggedView>,
    suspicions: u64,
    refuted: u64,
    group: Vec<Logged>,
    /// Multicast to delivery, microseconds, per delivery.
    latencies_us: Vec<f64>,
    sent: u64,
    ended: bool,
}

fn nodes_of(s: &str) -> Vec<NodeId> {
    if s == "-" {
        return Vec::new();
    }
    s.split(',').filter_map(|n| n.parse().ok()).collect()
}

/// A node's log; a line cut short by a kill is left out.
fn read_log(path: &Path) -> NodeLog {
    let mut l = NodeLog::default();
    let Ok(f) = std::fs::File::open(path) else { return l };
    for line in BufReader::new(f).lines().map_while(Result::ok) {
        let w: Vec<&str> = line.split(' ').collect();
        let num = |i: usize| w.get(i).and_then(|s| s.parse::<u64>().ok());
        match (w.first().copied(), w.len()) {
            (Some("U"), 2) => l.up_ns = num(1),
            (Some("V"), 5) => {
                let members = w[3]
                    .split(',')
                    .filter_map(|m| {
                        let (n, i) = m.split_once(':')?;
                        Some((n.parse().ok()?, i.parse().ok()?))
                    })
                    .collect();
                if let (Some(at), Some(epoch)) = (num(1), num(2)) {
                    l.views.push(LoggedView { at, epoch, members, replicas: nodes_of(w[4]) });
                }
            }
            (Some("S"), 3) => l.suspicions += 1,
            (Some("F"), 3) => l.refuted += 1,
            (Some("G"), 4) => {
                if let Some(epoch) = num(2) {
                    l.group.push(Logged::View { epoch, members: nodes_of(w[3]) });
                }
            }
            (Some("D"), 7) => {
                if let (Some(epoch), Some(seq), Some(from), Some(n)) = (num(2), num(3), num(4), num(5)) {
                    l.group.push(Logged::Delivered { epoch, seq, from: from as NodeId, n });
                    l.latencies_us.push(num(6).unwrap_or(0) as f64 / 1e3);
                }
            }
            (Some("L"), 3) => l.group.push(Logged::Left),
            (Some("E"), 3) => {
                l.sent = num(2).unwrap_or(0);
                l.ended = true;
            }
            _ => {}
        }
    }
    l
}

fn read_logs(dir: &Path, total: u32) -> Vec<NodeLog> {
    (1..=total).map(|n| read_log(&log_path(dir, n))).collect()
}

/// Everything the logs must show.
fn check(
    logs: &[NodeLog],
    strikes: &mut [Strike],
    r: &ClusterRun,
    spares: &[NodeId],
    replica: NodeId,
) -> ClusterReport {
    let period_ns = r.period_ms as f64 * 1e6;
    // Views: one per epoch, whoever logged it.
    let mut by_epoch: BTreeMap<u64, &LoggedView> = BTreeMap::new();
    let mut view_disagreements = BTreeSet::new();
    let mut views_out_of_order = 0;
    let mut views = 0;
    for l in logs {
        views += l.views.len() as u64;
        if !l.views.windows(2).all(|p| p[1].epoch > p[0].epoch) {
            views_out_of_order += 1;
        }
        for v in &l.views {
            let first = by_epoch.entry(v.epoch).or_insert(v);
            if (first.members.clone(), first.replicas.clone()) != (v.members.clone(), v.replicas.clone()) {
                view_disagreements.insert(v.epoch);
            }
        }
    }
    // Detection: the first view, logged by anyone, without the struck
    // node after the strike. False alarms: a node leaving a view that
    // nothing had struck by then.
    // A removal is the strike's if it came after the strike and before
    // the node had been back for eight periods.
    let grace = 8 * r.period_ms * 1_000_000;
    let struck = |node: NodeId, at: u64| {
        strikes.iter().any(|s| s.node == node && at >= s.at_ns && s.until_ns.is_none_or(|u| at <= u + grace))
    };
    let mut false_alarms = 0;
    let mut first_seen: BTreeMap<u64, u64> = BTreeMap::new();
    for l in logs {
        for v in &l.views {
            let t = first_seen.entry(v.epoch).or_insert(v.at);
            *t = (*t).min(v.at);
        }
    }
    let ordered: Vec<&LoggedView> = by_epoch.values().copied().collect();
    for pair in ordered.windows(2) {
        let (before, after) = (pair[0], pair[1]);
        if after.epoch != before.epoch + 1 {
            continue;
        }
        let at = first_seen[&after.epoch];
        for gone in before.members().into_iter().filter(|n| !after.members().contains(n)) {
            if !struck(gone, at) {
                false_alarms += 1;
            }
        }
    }
    for s in strikes.iter_mut() {
        let removed = ordered
            .iter()
            .filter(|v| first_seen[&v.epoch] >= s.at_ns && !v.members().contains(&s.node))
            .map(|v| first_seen[&v.epoch])
            .min();
        if let Some(t) = removed {
            let ns = (t - s.at_ns) as f64;
            s.detected_ms = Some(ns / 1e6);
            s.detected_periods = Some(ns / period_ns);
        }
    }
    let detected: Vec<f64> = strikes.iter().filter_map(|s| s.detected_ms).collect();
    // The replicas at the end, as the nodes that ran to the end hold them.
    let finals: Vec<&LoggedView> = logs.iter().filter(|l| l.ended).filter_map(|l| l.views.last()).collect();
    let final_replicas = finals.first().map(|v| v.replicas.clone()).unwrap_or_default();
    let replica_replaced = !finals.is_empty()
        && finals.iter().all(|v| v.replicas == final_replicas)
        && final_replicas.len() == REPLICAS as usize
        && !final_replicas.contains(&replica)
        && final_replicas.iter().any(|n| spares.contains(n));
    // The group: one message per place in each view's order; each node
    // delivers only in its current group view and from its members; and
    // members that went on from a view delivered the same in it.
    let mut places: BTreeMap<(u64, u64), (NodeId, u64)> = BTreeMap::new();
    let mut order_disagreements = 0;
    let mut outside_view = 0;
    let mut deliveries = 0;
    // (node, group epoch) -> the places it delivered in it, for nodes that
    // installed a later group view.
    let mut went_on: BTreeMap<u64, Vec<Vec<u64>>> = BTreeMap::new();
    for l in logs {
        let mut current: Option<(u64, Vec<NodeId>)> = None;
        let mut in_view: Vec<u64> = Vec::new();
        for o in &l.group {
            match o {
                Logged::View { epoch, members } => {
                    if let Some((e, _)) = current.take() {
                        went_on.entry(e).or_default().push(std::mem::take(&mut in_view));
                    }
                    current = Some((*epoch, members.clone()));
                }
                Logged::Left => {
                    current = None;
                    in_view.clear();
                }
                &Logged::Delivered { epoch, seq, from, n } => {
                    deliveries += 1;
                    match &current {
                        Some((e, m)) if *e == epoch && m.contains(&from) => {}
                        _ => outside_view += 1,
                    }
                    let first = places.entry((epoch, seq)).or_insert((from, n));
                    if *first != (from, n) {
                        order_disagreements += 1;
                    }
                    in_view.push(seq);
                }
            }
        }
    }
    let unequal_views = went_on.values().filter(|seen| seen.windows(2).any(|p| p[0] != p[1])).count() as u64;
    let suspicions = logs.iter().map(|l| l.suspicions).sum();
    let refuted = logs.iter().map(|l| l.refuted).sum();
    let multicasts_sent = logs.iter().map(|l| l.sent).sum();
    let all_detected = strikes.iter().all(|s| s.detected_ms.is_some());
    let ok = all_detected
        && false_alarms == 0
        && view_disagreements.is_empty()
        && views_out_of_order == 0
        && replica_replaced
        && order_disagreements == 0
        && outside_view == 0
        && unequal_views == 0
        && deliveries > 0;
    ClusterReport {
        nodes: logs.len() as u32,
        replicas: REPLICAS,
        spares: spares.to_vec(),
        period_ms: r.period_ms,
        detector: r.detector,
        formed_ms: 0.0,
        strikes: Vec::new(),
        detection_ms: Summary::of(&detected),
        false_alarms,
        suspicions,
        refuted,
        views,
        view_disagreements: view_disagreements.len() as u64,
        views_out_of_order,
        final_replicas,
        replica_replaced,
        multicasts_sent,
        deliveries,
        delivery_latency_us: Summary::of(
            &logs.iter().flat_map(|l| l.latencies_us.iter().copied()).collect::<Vec<_>>(),
        ),
        order_disagreements,
        outside_view,
        unequal_views,
        faults_rules: r.rules.clone(),
        seconds: 0.0,
        ok,
    }
}

/// The report as a few lines.
pub fn print(r: &ClusterReport) {
    println!(
        "cluster: {} processes ({} manager replicas, spares {:?}), heartbeats every {} ms, detector {:?}, one group; formed in {:.1} ms; link faults {}",
        r.nodes,
        r.replicas,
        r.spares,
        r.period_ms,
        r.detector,
        r.formed_ms,
        r.faults_rules.join(" ")
    );
    for s in &r.strikes {
        match (s.detected_ms, s.detected_periods) {
            (Some(ms), Some(p)) => {
                println!(
                    "  node {:>2} {:<18} removed from the view {ms:.1} ms later ({p:.2} periods)",
                    s.node, s.what
                )
            }
            _ => println!("  node {:>2} {:<18} NEVER removed", s.node, s.what),
        }
    }
    if let Some(d) = &r.detection_ms {
        println!(
            "detection: median {:.1} ms ({:.2} periods), max {:.1} ms ({:.2} periods)",
            d.median,
            d.median / r.period_ms as f64,
            d.max,
            d.max / r.period_ms as f64
        );
    }
    println!(
        "views: {} logged, {} epochs where two nodes disagree, {} nodes out of order; false alarms {}; suspicions {} ({} refuted by the suspect)",
        r.views, r.view_disagreements, r.views_out_of_order, r.false_alarms, r.suspicions, r.refuted
    );
    println!(
        "replicas at the end: {:?} ({})",
        r.final_replicas,
        if r.replica_replaced { "the killed replica replaced by a spare" } else { "NOT replaced" }
    );
    println!(
        "group: {} multicasts sent, {} deliveries; {} places with two messages, {} delivered outside the view, {} group views where members that went on delivered differently",
        r.multicasts_sent, r.deliveries, r.order_disagreements, r.outside_view, r.unequal_views
    );
    if let Some(l) = &r.delivery_latency_us {
        println!(
            "multicast to delivery across processes: median {:.1} us, p99 {:.1} us, max {:.1} us",
            l.median, l.p99, l.max
        );
    }
    println!("{:.1} s: {}", r.seconds, if r.ok { "ok" } else { "FAILED" });
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn view(at_ms: u64, epoch: u64, members: &[NodeId]) -> LoggedView {
        LoggedView {
            at: at_ms * MS,
            epoch,
            members: members.iter().map(|&n| (n, 1)).collect(),
            replicas: vec![1],
        }
    }

    fn delivered(epoch: u64, seq: u64, from: NodeId) -> Logged {
        Logged::Delivered { epoch, seq, from, n: seq }
    }

    fn gview(epoch: u64, members: &[NodeId]) -> Logged {
        Logged::View { epoch, members: members.to_vec() }
    }

    /// Nodes 1 and 2 agree on everything; node 3 is killed at 100 ms and
    /// out of the view at 300 ms.
    fn agreeing() -> (Vec<NodeLog>, Vec<Strike>) {
        let views = vec![view(10, 1, &[1, 2, 3]), view(300, 2, &[1, 2])];
        let group = vec![
            gview(1, &[1, 2, 3]),
            delivered(1, 1, 1),
            delivered(1, 2, 3),
            gview(2, &[1, 2]),
            delivered(2, 1, 2),
        ];
        let node =
            || NodeLog { views: views.clone(), group: group.clone(), ended: true, ..NodeLog::default() };
        let dead = NodeLog { views: views[..1].to_vec(), group: group[..3].to_vec(), ..NodeLog::default() };
        let strike = Strike::new(3, "SIGKILL", 100 * MS, None);
        (vec![node(), node(), dead], vec![strike])
    }

    fn run() -> ClusterRun {
        ClusterRun { members: 5, period_ms: 50, rate: 1, detector: Detector::Phi, seed: 1, rules: Vec::new() }
    }

    fn checked(logs: &[NodeLog], strikes: &mut [Strike]) -> ClusterReport {
        check(logs, strikes, &run(), &[], 9)
    }

    #[test]
    fn agreeing_logs_pass_every_check() {
        let (logs, mut strikes) = agreeing();
        let r = checked(&logs, &mut strikes);
        assert_eq!(strikes[0].detected_ms, Some(200.0));
        assert_eq!(strikes[0].detected_periods, Some(4.0));
        assert_eq!(
            (r.false_alarms, r.view_disagreements, r.views_out_of_order, r.order_disagreements),
            (0, 0, 0, 0)
        );
        assert_eq!((r.outside_view, r.unequal_views, r.deliveries), (0, 0, 8));
    }

    #[test]
    fn each_broken_promise_is_counted() {
        // Two messages at one place in the order.
        let (mut logs, mut strikes) = agreeing();
        logs[1].group[2] = delivered(1, 2, 2);
        assert_eq!(checked(&logs, &mut strikes).order_disagreements, 1);
        // A delivery after the node had moved on to the next group view.
        let (mut logs, mut strikes) = agreeing();
        logs[1].group.push(delivered(1, 3, 1));
        assert_eq!(checked(&logs, &mut strikes).outside_view, 1);
        // From a node not in the view.
        let (mut logs, mut strikes) = agreeing();
        logs[1].group[4] = delivered(2, 1, 3);
        assert_eq!(checked(&logs, &mut strikes).outside_view, 1);
        // Two members that went on from view 1 delivered differently in it.
        let (mut logs, mut strikes) = agreeing();
        logs[1].group.remove(2);
        assert_eq!(checked(&logs, &mut strikes).unequal_views, 1);
        // A live node removed.
        let (mut logs, mut strikes) = agreeing();
        for l in &mut logs[..2] {
            l.views.push(view(400, 3, &[1]));
        }
        assert_eq!(checked(&logs, &mut strikes).false_alarms, 1);
        // Removed before it was struck.
        let (logs, mut strikes) = agreeing();
        strikes[0].at_ns = 350 * MS;
        let r = checked(&logs, &mut strikes);
        assert_eq!((r.false_alarms, strikes[0].detected_ms), (1, None));
        // Two nodes with different views of one epoch, and views out of order.
        let (mut logs, mut strikes) = agreeing();
        logs[1].views[1] = view(300, 2, &[1, 3]);
        logs[0].views.swap(0, 1);
        let r = checked(&logs, &mut strikes);
        assert_eq!((r.view_disagreements, r.views_out_of_order), (1, 1));
    }
}
