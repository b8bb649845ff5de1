//! The membership protocol under faults (docs/CLUSTER.md; Li et al. [CI]
//! section 6): members (`tether_members::Member`) and three manager
//! replicas (`tether_members::Manager`, raft-rs) exchange their messages
//! over links that drop, duplicate and replay them (each node's
//! `tether_fault::Injector`, the run's fault plan) with latencies drawn
//! per message (so they reorder), while members crash, one is cut off
//! from everyone for a while, and a manager replica dies and is replaced.
//!
//! At the end:
//!
//! * every replica applied the same views in the same order;
//! * every member took every view after its joining once, in order;
//! * every live member holds the last view and is in it (one that was
//!   taken for dead while cut off joined again);
//! * every crashed member was removed, within a bound;
//! * no member was removed that was neither crashed nor cut off.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64Mcg;
use serde::Serialize;
use tether_fault::{node_seed, Injector};
use tether_members::{Manager, ManagerConfig, Member, MemberConfig, MemberEvent, Msg, View};
use tether_proto::{Instant, NodeId};

use crate::checker::Violation;
use crate::{SimConfig, SimReport};

const PERIOD: Duration = Duration::from_millis(10);
/// The founding replicas, and the one that replaces a dead one.
const MANAGERS: [NodeId; 3] = [1000, 1001, 1002];
const REPLACEMENT: NodeId = 1003;
/// Faults (crashes, the cut, the replica's death) happen before this;
/// the run goes on to `END` for everything to settle.
const FAULTS_UNTIL: Duration = Duration::from_millis(4_000);
const END: Duration = Duration::from_millis(6_000);
/// A crashed member must be out of the view this long after its crash.
pub const REMOVAL_BOUND: Duration = Duration::from_millis(500);
/// Latency of a message, drawn uniformly: the spread reorders them.
const LATENCY_US: std::ops::Range<u64> = 20..2_000;

/// What a membership run came to.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct MembershipReport {
    pub members: u64,
    pub crashes: u64,
    /// Crash to removal, milliseconds, per crashed member.
    pub removal_ms: Vec<f64>,
    /// Members removed that had neither crashed nor been cut off.
    pub false_removals: u64,
    /// Members removed while cut off (alive), and joined again.
    pub cut_removals: u64,
    /// Epoch of the last view.
    pub epoch: u64,
    pub messages: u64,
}

enum Payload {
    Member(Msg),
    Raft(Vec<u8>),
}

struct Flight {
    from: NodeId,
    to: NodeId,
    payload: Payload,
}

struct World {
    start: Instant,
    now: Instant,
    rng: Pcg64Mcg,
    members: BTreeMap<NodeId, Member>,
    managers: Vec<Manager>,
    nics: BTreeMap<NodeId, Injector>,
    /// (arrival, sequence) -> the message: a heap of arrivals.
    queue: BinaryHeap<Reverse<(Instant, u64)>>,
    flights: BTreeMap<u64, Flight>,
    seq: u64,
    crashed: BTreeMap<NodeId, Instant>,
    dead_managers: BTreeSet<NodeId>,
    /// A member cut off from everyone, and until when.
    cut: Option<(NodeId, Instant, Instant)>,
    /// Views each replica applied; the epochs each member took.
    replica_views: BTreeMap<NodeId, Vec<View>>,
    member_epochs: BTreeMap<NodeId, Vec<u64>>,
    /// Members in the leader's view in their current incarnation.
    in_view: BTreeSet<NodeId>,
    report: MembershipReport,
    violations: Vec<Violation>,
}

impl World {
    fn elapsed(&self) -> Duration {
        self.now - self.start
    }

    fn is_cut(&self, node: NodeId) -> bool {
        self.cut.is_some_and(|(n, from, until)| n == node && self.now >= from && self.now < until)
    }

    fn down(&self, node: NodeId) -> bool {
        self.crashed.contains_key(&node) || self.dead_managers.contains(&node)
    }

    /// Hand `payload` from `from` to its links: the sender's injector
    /// drops, duplicates or replays it, each copy a latency of its own.
    fn send(&mut self, from: NodeId, to: NodeId, payload: Payload) {
        self.report.messages += 1;
        if self.down(from) || self.is_cut(from) {
            return;
        }
        let bytes = match &payload {
            Payload::Member(m) => m.to_vec(),
            Payload::Raft(b) => b.clone(),
        };
        let raft = matches!(payload, Payload::Raft(_));
        let elapsed = self.elapsed();
        let mut copies = Vec::new();
        if let Some(nic) = self.nics.get_mut(&from) {
            nic.on_send(elapsed, to, &bytes, |dst, b| copies.push((dst, b.to_vec())));
        }
        for (dst, b) in copies {
            // An injected old datagram may go to another node: it goes as
            // what it is, from `from` (without a key a replay passes).
            let payload = if raft {
                Payload::Raft(b)
            } else {
                match Msg::parse(&b) {
                    Ok(m) => Payload::Member(m),
                    Err(_) => continue,
                }
            };
            let latency = Duration::from_micros(self.rng.gen_range(LATENCY_US));
            self.seq += 1;
            self.queue.push(Reverse((self.now + latency, self.seq)));
            self.flights.insert(self.seq, Flight { from, to: dst, payload });
        }
    }

    fn deliver(&mut self, f: Flight) {
        if self.down(f.to) || self.is_cut(f.to) {
            return;
        }
        let now = self.now;
        match f.payload {
            Payload::Member(msg) => {
                if let Some(m) = self.members.get_mut(&f.to) {
                    m.handle(f.from, msg, now);
                } else if let Some(r) = self.managers.iter_mut().find(|r| r.node() == f.to) {
                    r.handle_member(f.from, msg);
                }
            }
            Payload::Raft(bytes) => {
                if let Some(r) = self.managers.iter_mut().find(|r| r.node() == f.to) {
                    // A replayed or misdirected Raft message is refused.
                    let _ = r.step(f.from, &bytes);
                }
            }
        }
    }

    /// Collect what every node has to send, and what it noticed.
    fn drain(&mut self) {
        let mut out = Vec::new();
        for (&n, m) in &mut self.members {
            while let Some((to, msg)) = m.poll_send() {
                out.push((n, to, Payload::Member(msg)));
            }
            while let Some(e) = m.poll_event() {
                if let MemberEvent::ViewChanged { epoch } = e {
                    self.member_epochs.entry(n).or_default().push(epoch);
                }
            }
        }
        for r in &mut self.managers {
            while let Some((to, bytes)) = r.poll_send() {
                out.push((r.node(), to, Payload::Raft(bytes)));
            }
            while let Some((to, msg)) = r.poll_answer() {
                out.push((r.node(), to, Payload::Member(msg)));
            }
            while let Some(v) = r.poll_view() {
                self.replica_views.entry(r.node()).or_default().push(v);
            }
        }
        for (from, to, p) in out {
            self.send(from, to, p);
        }
    }

    /// One millisecond: turns, then every arrival due.
    fn step(&mut self) {
        self.now = self.now + Duration::from_millis(1);
        let now = self.now;
        for (n, m) in &mut self.members {
            if !self.crashed.contains_key(n) {
                m.turn(now);
            }
        }
        for r in &mut self.managers {
            if !self.dead_managers.contains(&r.node()) {
                r.turn(now);
            }
        }
        self.drain();
        while let Some(&Reverse((at, seq))) = self.queue.peek() {
            if at > now {
                break;
            }
            self.queue.pop();
            let f = self.flights.remove(&seq).expect("a message in flight");
            self.deliver(f);
            self.drain();
        }
        self.watch_removals();
    }

    /// The leader's view against who is alive: a member that was in it
    /// (in its incarnation) and is no longer is a removal, timed from its
    /// crash, or excused by its cut, or false.
    fn watch_removals(&mut self) {
        let dead = &self.dead_managers;
        let Some(view) = self.managers.iter().find(|r| r.is_leader() && !dead.contains(&r.node())) else {
            return;
        };
        let view = view.view().clone();
        for (&n, m) in &self.members {
            let now_in = view.incarnation_of(n) == Some(m.incarnation());
            if now_in {
                self.in_view.insert(n);
                continue;
            }
            // Out of the view (or in it only as an earlier life).
            if !self.in_view.remove(&n) || view.incarnation_of(n).is_some_and(|i| i > m.incarnation()) {
                continue;
            }
            if let Some(&crash) = self.crashed.get(&n) {
                self.report.removal_ms.push((self.now - crash).as_secs_f64() * 1e3);
            } else if self.cut.is_some_and(|(c, ..)| c == n) {
                self.report.cut_removals += 1;
            } else {
                self.report.false_removals += 1;
                self.violations.push(Violation::FalseRemoval { node: n, epoch: view.epoch });
            }
        }
    }
}

/// Run the membership mix of `cfg`.
pub(crate) fn run(cfg: &SimConfig) -> SimReport {
    let seed = cfg.seed;
    let mut rng = Pcg64Mcg::seed_from_u64(seed ^ 0x6d65_6d62);
    let start = Instant::from_nanos(1_000_000_000);
    let n = 6 + (seed % 11) as NodeId;
    let nodes: Vec<NodeId> = (1..=n).collect();
    let nic = |node| Injector::with_seed(&cfg.faults, node_seed(seed, node)).expect("a valid fault plan");
    let mut nics: BTreeMap<NodeId, Injector> = nodes.iter().map(|&n| (n, nic(n))).collect();
    for &m in MANAGERS.iter().chain([&REPLACEMENT]) {
        nics.insert(m, nic(m));
    }
    let managers = MANAGERS
        .iter()
        .enumerate()
        .map(|(i, &id)| {
            // Pinned, distinct election timeouts: one run per seed.
            let config = ManagerConfig { election_ticks: (10 + 4 * i, 11 + 4 * i), ..Default::default() };
            Manager::new(id, &MANAGERS, config, start).expect("a valid configuration")
        })
        .collect();
    let members = nodes
        .iter()
        .map(|&n| {
            let mut m = Member::new(n, 1, MemberConfig::new(PERIOD), start);
            m.set_managers(&MANAGERS);
            m.join();
            (n, m)
        })
        .collect();
    // The faults, drawn from the seed: up to two crashes, perhaps a member
    // cut off for 50-400 ms, and perhaps a replica's death.
    let mut crashes: Vec<(Duration, NodeId)> = (0..rng.gen_range(0..=2))
        .map(|_| (Duration::from_millis(rng.gen_range(1_500..3_500)), rng.gen_range(1..=n)))
        .collect();
    crashes.sort();
    crashes.dedup_by_key(|c| c.1);
    let cut = rng.gen_bool(0.5).then(|| {
        let from = Duration::from_millis(rng.gen_range(1_500..3_500));
        let node = nodes.iter().copied().rfind(|n| !crashes.iter().any(|c| c.1 == *n)).unwrap_or(1);
        (node, start + from, start + from + Duration::from_millis(rng.gen_range(50..400)))
    });
    let replica_death =
        rng.gen_bool(0.5).then(|| (Duration::from_millis(rng.gen_range(1_500..3_000)), rng.gen_range(0..3)));
    let mut w = World {
        start,
        now: start,
        rng,
        members,
        managers,
        nics,
        queue: BinaryHeap::new(),
        flights: BTreeMap::new(),
        seq: 0,
        crashed: BTreeMap::new(),
        dead_managers: BTreeSet::new(),
        cut,
        replica_views: BTreeMap::new(),
        member_epochs: BTreeMap::new(),
        in_view: BTreeSet::new(),
        report: MembershipReport { members: n as u64, ..Default::default() },
        violations: Vec::new(),
    };
    let mut replaced = false;
    while w.elapsed() < END {
        w.step();
        let t = w.elapsed();
        if t == FAULTS_UNTIL {
            for nic in w.nics.values_mut() {
                nic.set_enabled(false);
            }
        }
        for &(at, node) in &crashes {
            if at == t {
                w.crashed.insert(node, w.now);
                w.report.crashes += 1;
            }
        }
        if let Some((at, i)) = replica_death {
            if at == t {
                w.dead_managers.insert(MANAGERS[i]);
            }
            // 300 ms later, the leader takes it out and a new replica in.
            if !replaced && t >= at + Duration::from_millis(300) {
                replaced = replace(&mut w, MANAGERS[i]);
            }
        }
    }
    check(&mut w);
    let mut r = SimReport::empty(cfg);
    // A live member is "sent"; one that holds the last view and is in it,
    // "delivered".
    let last = w.managers.iter().map(|m| m.view().clone()).max_by_key(|v| v.epoch).unwrap_or_default();
    let live = w.members.iter().filter(|(n, _)| !w.crashed.contains_key(n));
    r.sent = live.clone().count() as u64;
    r.delivered = live.filter(|(_, m)| m.is_member() && m.view() == &last).count() as u64;
    r.violations = w.violations;
    r.virtual_ms = END.as_secs_f64() * 1e3;
    r.streams_ms = r.virtual_ms;
    w.report.epoch = w.managers.iter().map(|m| m.view().epoch).max().unwrap_or(0);
    for nic in w.nics.values() {
        r.links.faults.accumulate(&nic.counters());
    }
    r.membership = Some(w.report);
    r
}

/// The leader removes `dead` from the group and adds the replacement,
/// started with the configuration that holds it; true once done.
fn replace(w: &mut World, dead: NodeId) -> bool {
    let dead_managers = w.dead_managers.clone();
    let Some(l) = w.managers.iter().position(|r| r.is_leader() && !dead_managers.contains(&r.node())) else {
        return false;
    };
    if w.managers[l].replicas().contains(&dead) {
        let _ = w.managers[l].remove_replica(dead);
        return false;
    }
    if !w.managers[l].replicas().contains(&REPLACEMENT) {
        let _ = w.managers[l].add_replica(REPLACEMENT);
        return false;
    }
    let replicas = w.managers[l].replicas();
    let config = ManagerConfig { election_ticks: (30, 31), ..Default::default() };
    let r = Manager::replacement(REPLACEMENT, &MANAGERS, &replicas, config, w.now)
        .expect("a valid configuration");
    w.managers.push(r);
    let managers: Vec<NodeId> = replicas.clone();
    for m in w.members.values_mut() {
        m.set_managers(&managers);
    }
    true
}

/// The end's checks (see the module's header).
fn check(w: &mut World) {
    let live: Vec<&Manager> = w.managers.iter().filter(|r| !w.dead_managers.contains(&r.node())).collect();
    let Some(last) = live.iter().map(|r| r.view().clone()).max_by_key(|v| v.epoch) else {
        w.violations.push(Violation::MembershipDiverged { what: "no live replica".into() });
        return;
    };
    // Replicas: the same views in the same order (a replacement's from
    // its start; it replays the log, so all of them).
    let views: Vec<&Vec<View>> = w.replica_views.values().collect();
    for pair in views.windows(2) {
        let n = pair[0].len().min(pair[1].len());
        if pair[0][..n] != pair[1][..n] {
            w.violations
                .push(Violation::MembershipDiverged { what: "two replicas applied different views".into() });
        }
    }
    for r in &live {
        if r.view() != &last {
            w.violations.push(Violation::MembershipDiverged { what: format!("replica {} behind", r.node()) });
        }
    }
    // Members: each view once, in order; the live ones hold the last, in it.
    for (&n, epochs) in &w.member_epochs {
        if epochs.windows(2).any(|p| p[1] != p[0] + 1) {
            w.violations
                .push(Violation::MembershipDiverged { what: format!("member {n} took views {epochs:?}") });
        }
    }
    for (&n, m) in &w.members {
        let crashed = w.crashed.contains_key(&n);
        if crashed {
            if last.incarnation_of(n).is_some() {
                w.violations.push(Violation::CrashUndetected { node: n });
            }
            continue;
        }
        if m.view() != &last || !m.is_member() {
            w.violations.push(Violation::MembershipDiverged {
                what: format!(
                    "live member {n} holds epoch {} (member: {}), the last is {}",
                    m.view().epoch,
                    m.is_member(),
                    last.epoch
                ),
            });
        }
    }
    if let Some(&slowest) = w.report.removal_ms.iter().max_by(|a, b| a.total_cmp(b)) {
        if slowest > REMOVAL_BOUND.as_secs_f64() * 1e3 {
            w.violations.push(Violation::MembershipDiverged {
                what: format!("a crashed member removed {slowest:.1} ms after its crash"),
            });
        }
    }
}
