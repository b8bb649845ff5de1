//! The membership protocol under faults (docs/CLUSTER.md; Li et al. [CI]
//! section 6): members (`tether_members::Member`) and three manager
//! replicas (`tether_members::Manager`, raft-rs) exchange their messages
//! over links that drop, duplicate and replay them (each node's
//! `tether_fault::Injector`, the run's fault plan) with latencies drawn
//! per message (so they reorder), while members crash, some are cut off
//! from the rest for a while (one member of a small cluster; a twentieth
//! of a large one, which still talk among themselves), and a manager
//! replica dies and is replaced. The same world runs at 6 to 16 members
//! (`membership`) and at 1,000 (`membership_1000`, where eight members of
//! a rack also crash at once), and counts every node's messages: what a
//! member sends and receives a second must not grow with the cluster.
//!
//! At the end:
//!
//! * every replica applied the same views in the same order;
//! * every member took every view after its joining once, in order;
//! * every live member holds the last view and is in it (those taken for
//!   dead while cut off joined again);
//! * every crashed member was removed, within a bound;
//! * no member was removed that was neither crashed nor cut off.

use std::collections::{BTreeMap, BTreeSet};
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
/// The simulation's step, in nanoseconds.
const MS: u64 = 1_000_000;
/// The founding replicas, and the one that replaces a dead one: ids no
/// member has (members are 1 to N).
const MANAGERS: [NodeId; 3] = [1_000_000, 1_000_001, 1_000_002];
const REPLACEMENT: NodeId = 1_000_003;
/// From this size on, a run's faults are a large cluster's (a rack
/// crashing, a partition) rather than a handful of members'.
const LARGE: u32 = 100;
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
    /// What every node sent and received.
    pub load: Load,
    /// Wall-clock time of the run against the simulated time.
    pub wall_ms: f64,
}

/// Messages each node sent and received (copies the links made count at
/// the receiver), a second after the start-up (the first second) and in
/// it, while every member joins at once.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Load {
    /// The mean member's a second after the start-up, and the busiest's.
    pub member: f64,
    pub member_max: f64,
    /// The busiest manager replica's a second after the start-up.
    pub manager_max: f64,
    /// In the start-up's second: the mean member's, the busiest replica's.
    pub startup_member: f64,
    pub startup_manager_max: f64,
    /// View changes a member received per change it applied (the cost of
    /// the epidemic spread: 1 is each change once).
    pub changes_per_change: f64,
}

impl Load {
    /// Over runs of `members` each: means weighted by members, the
    /// largest of the maxima.
    pub fn over(runs: &[(u64, Load)]) -> Load {
        let members: u64 = runs.iter().map(|r| r.0).sum::<u64>().max(1);
        let mean =
            |f: fn(&Load) -> f64| runs.iter().map(|(n, l)| f(l) * *n as f64).sum::<f64>() / members as f64;
        let max = |f: fn(&Load) -> f64| runs.iter().map(|(_, l)| f(l)).fold(0.0, f64::max);
        Load {
            member: mean(|l| l.member),
            member_max: max(|l| l.member_max),
            manager_max: max(|l| l.manager_max),
            startup_member: mean(|l| l.startup_member),
            startup_manager_max: max(|l| l.startup_manager_max),
            changes_per_change: mean(|l| l.changes_per_change),
        }
    }
}

/// What one node sent and received: in the start-up (every member
/// joining at once) and after it.
#[derive(Debug, Clone, Copy, Default)]
struct Traffic {
    startup: u64,
    after: u64,
    /// ViewChange messages received.
    changes: u64,
}

/// The start-up: the first second.
const STARTUP: Duration = Duration::from_secs(1);

/// Members cut off from the rest (the managers included) from `from`
/// until `until`; among themselves they still talk.
#[derive(Debug, Clone)]
struct Partition {
    side: BTreeSet<NodeId>,
    from: Instant,
    until: Instant,
}

enum Payload {
    Member(Msg),
    Raft(Vec<u8>),
}

struct Flight {
    /// When it arrives, and the order it was sent in (ties).
    at: Instant,
    seq: u64,
    from: NodeId,
    to: NodeId,
    payload: Payload,
}

// Arrivals in one millisecond are sorted by (arrival, sequence) alone.
impl PartialEq for Flight {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for Flight {}
impl PartialOrd for Flight {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Flight {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

struct World {
    start: Instant,
    now: Instant,
    rng: Pcg64Mcg,
    members: BTreeMap<NodeId, Member>,
    managers: Vec<Manager>,
    nics: BTreeMap<NodeId, Injector>,
    /// The messages in flight, by the simulated millisecond whose step
    /// delivers them (a heap of a thousand members' messages cost more
    /// than the members did).
    arrivals: BTreeMap<u64, Vec<Flight>>,
    seq: u64,
    crashed: BTreeMap<NodeId, Instant>,
    dead_managers: BTreeSet<NodeId>,
    partition: Option<Partition>,
    traffic: BTreeMap<NodeId, Traffic>,
    /// Views each replica applied; the epochs each member took.
    replica_views: BTreeMap<NodeId, Vec<View>>,
    member_epochs: BTreeMap<NodeId, Vec<u64>>,
    /// Members in the leader's view in their current incarnation, and
    /// the (leader, epoch) that was last looked at.
    in_view: BTreeSet<NodeId>,
    watched: (NodeId, u64),
    report: MembershipReport,
    violations: Vec<Violation>,
}

impl World {
    fn elapsed(&self) -> Duration {
        self.now - self.start
    }

    /// One message sent or received by `node`, now (`change`: a view
    /// change it received).
    fn count(&mut self, node: NodeId, change: bool) {
        let startup = self.elapsed() < STARTUP;
        let t = self.traffic.entry(node).or_default();
        if startup {
            t.startup += 1;
        } else {
            t.after += 1;
        }
        t.changes += u64::from(change);
    }

    /// Whether the partition stands between `a` and `b` now.
    fn severed(&self, a: NodeId, b: NodeId) -> bool {
        self.partition.as_ref().is_some_and(|p| {
            self.now >= p.from && self.now < p.until && p.side.contains(&a) != p.side.contains(&b)
        })
    }

    fn was_cut(&self, node: NodeId) -> bool {
        self.partition.as_ref().is_some_and(|p| p.side.contains(&node))
    }

    fn down(&self, node: NodeId) -> bool {
        self.crashed.contains_key(&node) || self.dead_managers.contains(&node)
    }

    /// Hand `payload` from `from` to its links: the sender's injector
    /// drops, duplicates or replays it, each copy a latency of its own.
    fn send(&mut self, from: NodeId, to: NodeId, payload: Payload) {
        self.report.messages += 1;
        self.count(from, false);
        if self.down(from) || self.severed(from, to) {
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
            let at = self.now + latency;
            let flight = Flight { at, seq: self.seq, from, to: dst, payload };
            self.arrivals.entry(at.as_nanos().div_ceil(MS)).or_default().push(flight);
        }
    }

    fn deliver(&mut self, f: Flight) {
        if self.down(f.to) || self.severed(f.from, f.to) {
            return;
        }
        self.count(f.to, matches!(f.payload, Payload::Member(Msg::ViewChange(_))));
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
        for (from, to, p) in out {
            self.send(from, to, p);
        }
        let managers: Vec<NodeId> = self.managers.iter().map(|r| r.node()).collect();
        for r in managers {
            self.drain_node(r);
        }
    }

    /// Collect what `node` has to send, and what it noticed (after a
    /// delivery only its receiver has anything new).
    fn drain_node(&mut self, node: NodeId) {
        let mut out = Vec::new();
        if let Some(m) = self.members.get_mut(&node) {
            while let Some((to, msg)) = m.poll_send() {
                out.push((to, Payload::Member(msg)));
            }
            while let Some(e) = m.poll_event() {
                if let MemberEvent::ViewChanged { epoch } = e {
                    self.member_epochs.entry(node).or_default().push(epoch);
                }
            }
        } else if let Some(r) = self.managers.iter_mut().find(|r| r.node() == node) {
            while let Some((to, bytes)) = r.poll_send() {
                out.push((to, Payload::Raft(bytes)));
            }
            while let Some((to, msg)) = r.poll_answer() {
                out.push((to, Payload::Member(msg)));
            }
            while let Some(v) = r.poll_view() {
                self.replica_views.entry(node).or_default().push(v);
            }
        }
        for (to, p) in out {
            self.send(node, to, p);
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
        // What arrives by now, in order of arrival. A message sent now
        // arrives in a later millisecond.
        let mut due = self.arrivals.remove(&now.as_nanos().div_ceil(MS)).unwrap_or_default();
        due.sort_unstable();
        for f in due {
            let to = f.to;
            self.deliver(f);
            self.drain_node(to);
        }
        self.watch_removals();
    }

    /// The leader's view against who is alive: a member that was in it
    /// (in its incarnation) and is no longer is a removal, timed from its
    /// crash, or excused by its cut, or false. Looked at when the leader
    /// or its epoch changed.
    fn watch_removals(&mut self) {
        let dead = &self.dead_managers;
        let Some(leader) = self.managers.iter().find(|r| r.is_leader() && !dead.contains(&r.node())) else {
            return;
        };
        let now_watched = (leader.node(), leader.view().epoch);
        if now_watched == self.watched {
            return;
        }
        self.watched = now_watched;
        let view = leader.view().clone();
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
            } else if self.was_cut(n) {
                self.report.cut_removals += 1;
            } else {
                self.report.false_removals += 1;
                self.violations.push(Violation::FalseRemoval { node: n, epoch: view.epoch });
            }
        }
    }
}

/// The faults of one run, drawn from its seed.
struct Scenario {
    /// (when, member), in time order.
    crashes: Vec<(Duration, NodeId)>,
    partition: Option<Partition>,
    /// When, and which founding replica.
    replica_death: Option<(Duration, usize)>,
}

impl Scenario {
    /// A small cluster's: up to two crashes, perhaps the last member that
    /// does not crash cut off for 50-400 ms, perhaps a replica's death.
    /// A large one's: a member in fifty to a hundred crashes, perhaps the
    /// eight members of a rack at once, and perhaps a twentieth of the
    /// members, drawn at random, cut off from the rest.
    fn draw(rng: &mut Pcg64Mcg, n: NodeId, start: Instant) -> Scenario {
        let fault_time = |rng: &mut Pcg64Mcg| Duration::from_millis(rng.gen_range(1_500..3_500));
        let large = n >= LARGE;
        let count = if large { rng.gen_range(n / 100..=n / 50) } else { rng.gen_range(0..=2) };
        let mut crashes: Vec<(Duration, NodeId)> =
            (0..count).map(|_| (fault_time(rng), rng.gen_range(1..=n))).collect();
        if large && rng.gen_bool(0.5) {
            let (at, first) = (fault_time(rng), rng.gen_range(1..=n - 7));
            crashes.extend((first..first + 8).map(|m| (at, m)));
        }
        crashes.sort();
        // A member crashes once: its first crash stands.
        let mut seen = BTreeSet::new();
        crashes.retain(|c| seen.insert(c.1));
        let crashed = |m: &NodeId| crashes.iter().any(|c| c.1 == *m);
        let partition = rng.gen_bool(0.5).then(|| {
            let from = start + fault_time(rng);
            let side: BTreeSet<NodeId> = if large {
                let mut side = BTreeSet::new();
                while side.len() < (n / 20) as usize {
                    let m = rng.gen_range(1..=n);
                    if !crashed(&m) {
                        side.insert(m);
                    }
                }
                side
            } else {
                [(1..=n).rfind(|m| !crashed(m)).unwrap_or(1)].into()
            };
            Partition { side, from, until: from + Duration::from_millis(rng.gen_range(50..400)) }
        });
        let replica_death = rng
            .gen_bool(0.5)
            .then(|| (Duration::from_millis(rng.gen_range(1_500..3_000)), rng.gen_range(0..3)));
        Scenario { crashes, partition, replica_death }
    }
}

/// Run the membership mix of `cfg`: `cfg.nodes` members.
pub(crate) fn run(cfg: &SimConfig) -> SimReport {
    #[allow(clippy::disallowed_methods, clippy::disallowed_types)] // the run's own cost, reported
    let wall = std::time::Instant::now();
    let seed = cfg.seed;
    let mut rng = Pcg64Mcg::seed_from_u64(seed ^ 0x6d65_6d62);
    let start = Instant::from_nanos(1_000_000_000);
    let n = cfg.nodes.max(2) as NodeId;
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
    let Scenario { crashes, partition, replica_death } = Scenario::draw(&mut rng, n, start);
    let mut w = World {
        start,
        now: start,
        rng,
        members,
        managers,
        nics,
        arrivals: BTreeMap::new(),
        seq: 0,
        crashed: BTreeMap::new(),
        dead_managers: BTreeSet::new(),
        report: MembershipReport { members: n as u64, ..Default::default() },
        partition,
        traffic: BTreeMap::new(),
        replica_views: BTreeMap::new(),
        member_epochs: BTreeMap::new(),
        in_view: BTreeSet::new(),
        watched: (0, 0),
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
    load(&mut w);
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
    w.report.wall_ms = wall.elapsed().as_secs_f64() * 1e3;
    r.membership = Some(w.report);
    r
}

/// Each node's messages a second, and the changes a member received per
/// change it applied.
fn load(w: &mut World) {
    let secs = (END - STARTUP).as_secs_f64();
    let after = |t: &Traffic| t.after as f64 / secs;
    let startup = |t: &Traffic| t.startup as f64;
    let members: Vec<Traffic> =
        w.members.keys().map(|n| w.traffic.get(n).copied().unwrap_or_default()).collect();
    let managers: Vec<Traffic> =
        w.managers.iter().filter_map(|m| w.traffic.get(&m.node()).copied()).collect();
    let mean = |f: &dyn Fn(&Traffic) -> f64| members.iter().map(f).sum::<f64>() / members.len().max(1) as f64;
    let received: u64 = members.iter().map(|t| t.changes).sum();
    let applied: usize = w.member_epochs.values().map(Vec::len).sum();
    w.report.load = Load {
        member: mean(&after),
        member_max: members.iter().map(after).fold(0.0, f64::max),
        manager_max: managers.iter().map(after).fold(0.0, f64::max),
        startup_member: mean(&startup),
        startup_manager_max: managers.iter().map(startup).fold(0.0, f64::max),
        changes_per_change: received as f64 / applied.max(1) as f64,
    };
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
