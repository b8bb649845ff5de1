//! Members and managers together, sans-IO, in lockstep (docs/CLUSTER.md):
//! nine members join through three manager replicas that decide the views
//! through raft-rs, then heartbeat their observers, over a network that
//! loses a share of everything. A member killed is removed by a majority
//! of its observers' alerts; nobody alive is removed; every member and
//! replica sees the same views in the same order, each once (a member that
//! missed a change pulls it).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use tether_members::{Manager, ManagerConfig, Member, MemberConfig, MemberEvent, Msg, View};
use tether_proto::{Instant, NodeId};

const PERIOD: Duration = Duration::from_millis(10);
const MANAGERS: [NodeId; 3] = [101, 102, 103];

/// What travels: a member's message, or a replica's Raft message.
enum Payload {
    Member(Msg),
    Raft(Vec<u8>),
}

struct World {
    now: Instant,
    members: BTreeMap<NodeId, Member>,
    managers: Vec<Manager>,
    dead: BTreeSet<NodeId>,
    /// Every view each node applied, in order.
    seen: BTreeMap<NodeId, Vec<u64>>,
    /// A deterministic draw for losses.
    rng: u64,
    loss_percent: u64,
}

impl World {
    fn new(members: &[NodeId], loss_percent: u64) -> Self {
        let now = Instant::from_nanos(1_000_000);
        let managers = MANAGERS
            .iter()
            .enumerate()
            .map(|(i, &id)| {
                let config = ManagerConfig { election_ticks: (10 + 4 * i, 11 + 4 * i), ..Default::default() };
                Manager::new(id, &MANAGERS, config, now).unwrap()
            })
            .collect();
        let members = members
            .iter()
            .map(|&n| {
                let mut m = Member::new(n, 1, MemberConfig::new(PERIOD), now);
                m.set_managers(&MANAGERS);
                m.join();
                (n, m)
            })
            .collect();
        World {
            now,
            members,
            managers,
            dead: BTreeSet::new(),
            seen: BTreeMap::new(),
            rng: 0x1234_5678,
            loss_percent,
        }
    }

    fn lost(&mut self) -> bool {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng % 100 < self.loss_percent
    }

    fn deliver(&mut self, from: NodeId, to: NodeId, p: Payload) {
        if self.dead.contains(&from) || self.dead.contains(&to) || self.lost() {
            return;
        }
        let now = self.now;
        match p {
            Payload::Member(msg) => {
                if let Some(m) = self.members.get_mut(&to) {
                    m.handle(from, msg, now);
                } else if let Some(r) = self.managers.iter_mut().find(|r| r.node() == to) {
                    r.handle_member(from, msg);
                }
            }
            Payload::Raft(bytes) => {
                if let Some(r) = self.managers.iter_mut().find(|r| r.node() == to) {
                    r.step(from, &bytes).unwrap();
                }
            }
        }
    }

    /// One millisecond: every turn, then everything sent, until quiet.
    fn step(&mut self) {
        self.now = self.now + Duration::from_millis(1);
        let now = self.now;
        for (n, m) in &mut self.members {
            if !self.dead.contains(n) {
                m.turn(now);
            }
        }
        for r in &mut self.managers {
            r.turn(now);
        }
        loop {
            let mut out = Vec::new();
            for (&n, m) in &mut self.members {
                while let Some((to, msg)) = m.poll_send() {
                    out.push((n, to, Payload::Member(msg)));
                }
                while let Some(e) = m.poll_event() {
                    if let MemberEvent::ViewChanged { epoch } = e {
                        self.seen.entry(n).or_default().push(epoch);
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
                    self.seen.entry(r.node()).or_default().push(v.epoch);
                }
            }
            if out.is_empty() {
                break;
            }
            for (from, to, p) in out {
                self.deliver(from, to, p);
            }
        }
    }

    fn run(&mut self, ms: u64) {
        for _ in 0..ms {
            self.step();
        }
    }

    fn view(&self) -> View {
        self.managers.iter().find(|m| m.is_leader()).expect("a leader").view().clone()
    }
}

#[test]
fn a_killed_member_is_removed_and_nobody_else_under_loss() {
    let nodes: Vec<NodeId> = (1..=9).collect();
    let mut w = World::new(&nodes, 5);
    // The members ask to join from the start; a leader is elected, and
    // takes them in.
    w.run(1000);
    assert_eq!(w.view().members.len(), 9, "all joined: {:?}", w.view());
    assert!(
        w.members.values().all(|m| m.is_member() && m.view() == &w.view()),
        "every member holds the view"
    );
    // Ten seconds of heartbeats with 5% of everything lost: nobody alive
    // is removed (a suspicion is refuted by the probe's answer, and an
    // alert needs a majority of the observers).
    let epoch = w.view().epoch;
    w.run(10_000);
    assert_eq!(w.view().epoch, epoch, "no view change without a death: {:?}", w.view());
    // Kill member 4: removed within a second.
    w.dead.insert(4);
    let killed_at = w.now;
    let mut removed_at = None;
    for _ in 0..1000 {
        w.step();
        if w.view().incarnation_of(4).is_none() {
            removed_at = Some(w.now);
            break;
        }
    }
    let after = removed_at.expect("member 4 removed") - killed_at;
    assert!(after < Duration::from_millis(200), "removed {after:?} after its death");
    assert_eq!(w.view().members.len(), 8);
    w.run(200);
    // Every replica applied the same views in the same order; every live
    // member saw every view after its own joining, each once, in order,
    // and holds the last.
    let replicas: Vec<&Vec<u64>> = MANAGERS.iter().map(|r| &w.seen[r]).collect();
    assert!(replicas.windows(2).all(|p| p[0] == p[1]), "{replicas:?}");
    assert_eq!(*replicas[0], (1..=10).collect::<Vec<u64>>(), "nine joins and a removal");
    for n in nodes.iter().filter(|&&n| n != 4) {
        let views = &w.seen[n];
        assert!(views.windows(2).all(|p| p[1] == p[0] + 1), "member {n}: {views:?}");
        assert_eq!(views.last(), Some(&10), "member {n} holds the last view");
        assert_eq!(w.members[n].view(), &w.view());
    }
}

#[test]
fn groups_are_joined_and_left_through_the_managers_under_loss() {
    let nodes: Vec<NodeId> = (1..=6).collect();
    let mut w = World::new(&nodes, 5);
    w.run(1000);
    assert_eq!(w.view().members.len(), 6, "all joined: {:?}", w.view());
    // Members 1, 3 and 5 ask for group 7, 2 and 3 for group 8.
    for n in [1, 3, 5] {
        assert!(w.members.get_mut(&n).unwrap().join_group(7));
    }
    for n in [2, 3] {
        assert!(w.members.get_mut(&n).unwrap().join_group(8));
    }
    w.run(1000);
    let v = w.view();
    assert_eq!(v.group(7), &[1, 3, 5], "{v:?}");
    assert_eq!(v.group(8), &[2, 3], "{v:?}");
    // Member 3 leaves group 8 and dies: group 8 is member 2's alone,
    // group 7 loses member 3 in the same change as the cluster.
    w.members.get_mut(&3).unwrap().leave_group(8);
    w.run(500);
    assert_eq!(w.view().group(8), &[2]);
    w.dead.insert(3);
    w.run(1000);
    let v = w.view();
    assert_eq!(v.incarnation_of(3), None);
    assert_eq!(v.group(7), &[1, 5], "{v:?}");
    // Every member holds the same view, groups and all; a group's epoch is
    // the epoch it last changed in.
    for n in nodes.iter().filter(|&&n| n != 3) {
        assert_eq!(w.members[n].view(), &v, "member {n}");
    }
    let (since, _) = v.groups[&7];
    assert!(since <= v.epoch && since > 6, "{v:?}");
}
