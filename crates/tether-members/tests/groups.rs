//! Ordered multicast with virtual synchrony (`tether_members::groups`) in
//! lockstep: members exchange envelopes over FIFO links (as tether's
//! reliable streams are between two live nodes), taken in a seeded random
//! interleaving across links, while members die with some of their
//! envelopes in flight lost, views change during a flush, and newcomers
//! join. At every seed:
//!
//! * every surviving member's outputs (deliveries and views) are the same
//!   sequence: one total order, and a message of a view delivered by every
//!   survivor into the next view or by none (virtual synchrony);
//! * every message a survivor submitted is delivered, once;
//! * each sender's messages are delivered in the order it sent them.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use bytes::Bytes;
use tether_members::groups::{GroupOutput, Groups, GroupsConfig};
use tether_members::{Change, View, ViewChange};
use tether_proto::{Instant, MessagePool, NodeId};

const G: u32 = 7;

struct Net {
    nodes: BTreeMap<NodeId, Groups>,
    links: BTreeMap<(NodeId, NodeId), VecDeque<Bytes>>,
    dead: BTreeSet<NodeId>,
    outputs: BTreeMap<NodeId, Vec<GroupOutput>>,
    view: View,
    rng: u64,
    now: Instant,
    steps: u64,
    /// Views each node learns later: (step due, node, view), in order per
    /// node (each node learns the managers' views in epoch order, each
    /// when its own announcement or pull brings it).
    learning: Vec<(u64, NodeId, View)>,
    /// Most steps a node learns a view late.
    spread: u64,
}

impl Net {
    fn new(seed: u64, nodes: &[NodeId]) -> Net {
        let config = GroupsConfig { batch_bytes: 64, ..GroupsConfig::default() };
        let mut net = Net {
            nodes: nodes.iter().map(|&n| (n, Groups::new(n, config, MessagePool::new()))).collect(),
            links: BTreeMap::new(),
            dead: BTreeSet::new(),
            outputs: BTreeMap::new(),
            view: View::default(),
            rng: seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1,
            now: Instant::ZERO,
            steps: 0,
            learning: Vec::new(),
            spread: 0,
        };
        for &n in nodes {
            net.change(n, Change::Joined(1));
        }
        for &n in nodes {
            net.change(n, Change::JoinedGroup(G));
        }
        // From here on, each node learns each view up to 8 steps late.
        net.spread = 8;
        net
    }

    fn rand(&mut self, n: u64) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng % n.max(1)
    }

    /// The managers' next change, learned by every live node at once.
    fn change(&mut self, node: NodeId, change: Change) {
        assert!(self.view.apply(ViewChange { epoch: self.view.epoch + 1, node, change }));
        if !self.nodes.contains_key(&node) && change == Change::JoinedGroup(G) {
            // A newcomer.
            let config = GroupsConfig { batch_bytes: 64, ..GroupsConfig::default() };
            self.nodes.insert(node, Groups::new(node, config, MessagePool::new()));
        }
        let view = self.view.clone();
        let nodes: Vec<NodeId> = self.nodes.keys().copied().collect();
        for n in nodes {
            let after = self.learning.iter().filter(|l| l.1 == n).map(|l| l.0).max().unwrap_or(0);
            let due = (self.steps + self.rand(self.spread + 1)).max(after);
            self.learning.push((due, n, view.clone()));
        }
        self.learn();
    }

    /// Hand every node the views due by now.
    fn learn(&mut self) {
        let steps = self.steps;
        let due: Vec<(u64, NodeId, View)> = self.learning.iter().filter(|l| l.0 <= steps).cloned().collect();
        self.learning.retain(|l| l.0 > steps);
        for (_, n, view) in due {
            if !self.dead.contains(&n) {
                self.nodes.get_mut(&n).unwrap().on_view(&view);
            }
        }
    }

    /// `node` dies; of what it had sent, each link keeps a random prefix.
    fn kill(&mut self, node: NodeId) {
        self.dead.insert(node);
        let keys: Vec<_> = self.links.keys().copied().filter(|&(from, _)| from == node).collect();
        for k in keys {
            let len = self.links[&k].len() as u64;
            let keep = self.rand(len + 1) as usize;
            self.links.get_mut(&k).unwrap().truncate(keep);
        }
    }

    fn submit(&mut self, node: NodeId, i: u64) -> bool {
        let msg = Bytes::from(format!("{node}:{i}"));
        self.nodes.get_mut(&node).unwrap().submit(G, msg).is_ok()
    }

    /// One step: every live node pumps and sends; some envelopes arrive.
    fn step(&mut self) {
        self.now = self.now + core::time::Duration::from_micros(200);
        self.steps += 1;
        self.learn();
        let now = self.now;
        for (&n, g) in &mut self.nodes {
            if self.dead.contains(&n) {
                continue;
            }
            g.pump(now);
            while let Some((to, env)) = g.poll_send() {
                self.links.entry((n, to)).or_default().push_back(env);
            }
            while let Some(o) = g.poll_output() {
                self.outputs.entry(n).or_default().push(o);
            }
        }
        let busy: Vec<_> = self.links.iter().filter(|(_, q)| !q.is_empty()).map(|(k, _)| *k).collect();
        for _ in 0..(busy.len() as u64 * 2) {
            let k = busy[self.rand(busy.len() as u64) as usize];
            let Some(env) = self.links.get_mut(&k).unwrap().pop_front() else { continue };
            if self.dead.contains(&k.1) {
                continue;
            }
            self.nodes.get_mut(&k.1).unwrap().on_envelope(k.0, env);
        }
    }

    fn quiet(&self) -> bool {
        self.learning.is_empty()
            && self.links.iter().all(|((_, to), q)| q.is_empty() || self.dead.contains(to))
            && self.nodes.iter().all(|(n, g)| self.dead.contains(n) || g.undelivered(G) == 0)
    }

    fn settle(&mut self) {
        for _ in 0..20_000 {
            if self.quiet() {
                // Reports of stability go out on the next turns.
                for _ in 0..20 {
                    self.step();
                }
                return;
            }
            self.step();
        }
        let left: Vec<_> = self.nodes.iter().map(|(n, g)| (n, g.undelivered(G))).collect();
        panic!("never quiet: undelivered {left:?}");
    }

    /// The properties, over the live members.
    fn check(&self, submitted: &BTreeMap<NodeId, u64>) {
        let live: Vec<NodeId> = self.view.group(G).to_vec();
        for n in &live {
            let stats = self.nodes[n].stats();
            assert_eq!(stats.gaps, 0, "node {n}: {stats:?}");
        }
        let first = &self.outputs[&live[0]];
        for n in &live[1..] {
            let theirs = &self.outputs[n];
            // A newcomer's outputs are the others' from the view it came in.
            let from = match theirs.first() {
                Some(GroupOutput::View { epoch, .. }) => first
                    .iter()
                    .position(|o| matches!(o, GroupOutput::View { epoch: e, .. } if e == epoch))
                    .unwrap_or_else(|| {
                        panic!("node {n}'s first view: {:?} / {:?}", views(theirs), views(first))
                    }),
                _ => 0,
            };
            assert_eq!(&first[from..], &theirs[..], "node {} and node {n} disagree", live[0]);
        }
        let mut seen: BTreeMap<NodeId, Vec<u64>> = BTreeMap::new();
        for o in first {
            if let GroupOutput::Delivered(m) = o {
                seen.entry(m.from).or_default().push(m.n);
            }
        }
        for (from, ns) in &seen {
            assert!(
                ns.windows(2).all(|w| w[0] < w[1]),
                "node {from}'s messages out of order or twice: {ns:?}"
            );
        }
        for n in &live {
            let count = submitted.get(n).copied().unwrap_or(0);
            if count > 0 && first.iter().any(|o| matches!(o, GroupOutput::Delivered(_))) {
                let want: Vec<u64> = (1..=count).collect();
                assert_eq!(seen.get(n).cloned().unwrap_or_default(), want, "node {n}'s messages");
            }
        }
    }
}

fn views(outputs: &[GroupOutput]) -> Vec<(u64, Vec<NodeId>)> {
    outputs
        .iter()
        .filter_map(|o| match o {
            GroupOutput::View { epoch, members, .. } => Some((*epoch, members.clone())),
            _ => None,
        })
        .collect()
}

#[test]
fn members_deliver_one_order() {
    let mut net = Net::new(1, &[1, 2, 3]);
    let mut submitted = BTreeMap::new();
    for i in 1..=200 {
        for n in 1..=3 {
            assert!(net.submit(n, i));
            *submitted.entry(n).or_insert(0) += 1;
        }
        net.step();
    }
    net.settle();
    net.check(&submitted);
    let delivered = net.outputs[&2].iter().filter(|o| matches!(o, GroupOutput::Delivered(_))).count();
    assert_eq!(delivered, 600);
    assert_eq!(views(&net.outputs[&1]), vec![(6, vec![1, 2, 3])]);
}

/// Submit `each` messages from every live member of the group, a step
/// apart, calling `at(step)` before each step.
fn traffic(
    net: &mut Net,
    each: u64,
    submitted: &mut BTreeMap<NodeId, u64>,
    mut at: impl FnMut(&mut Net, u64),
) {
    for i in 1..=each {
        at(net, i);
        let live: Vec<NodeId> = net.view.group(G).to_vec();
        for n in live {
            let next = submitted.get(&n).copied().unwrap_or(0) + 1;
            if net.submit(n, next) {
                submitted.insert(n, next);
            }
        }
        net.step();
    }
}

/// At each of 300 seeds: four members multicast for 60 steps, `gone`
/// dies (killed, and the managers' change made) at a step drawn from the
/// seed; the survivors must end in the view without it, the properties
/// holding.
fn one_dies(gone: NodeId, survivors: &[NodeId]) {
    for seed in 0..300 {
        let mut net = Net::new(seed, &[1, 2, 3, 4]);
        let mut submitted = BTreeMap::new();
        let die_at = 5 + seed % 40;
        traffic(&mut net, 60, &mut submitted, |net, i| {
            if i == die_at {
                net.kill(gone);
                net.change(gone, Change::Left);
            }
        });
        net.settle();
        submitted.remove(&gone);
        net.check(&submitted);
        let v = views(&net.outputs[&survivors[0]]);
        assert_eq!(v.last().map(|v| v.1.clone()), Some(survivors.to_vec()), "seed {seed}");
    }
}

#[test]
fn a_dead_sequencer_s_messages_reach_every_survivor_or_none() {
    one_dies(1, &[2, 3, 4]);
}

#[test]
fn a_member_dies_while_the_sequencer_orders_on() {
    one_dies(3, &[1, 2, 4]);
}

#[test]
fn a_sequencer_taken_for_dead_orders_on_until_it_learns_it() {
    for seed in 0..300 {
        let mut net = Net::new(seed, &[1, 2, 3, 4]);
        net.spread = 16;
        let mut submitted = BTreeMap::new();
        let out_at = 5 + seed % 40;
        traffic(&mut net, 60, &mut submitted, |net, i| {
            if i == out_at {
                // Removed while alive: it learns so up to 16 steps late,
                // and orders what it gets meanwhile.
                net.change(1, Change::Left);
            }
        });
        net.settle();
        submitted.remove(&1);
        net.check(&submitted);
        assert!(net.outputs[&1].iter().any(|o| matches!(o, GroupOutput::Left { .. })), "seed {seed}");
    }
}

#[test]
fn a_second_change_during_a_flush() {
    for seed in 0..300 {
        let mut net = Net::new(seed, &[1, 2, 3, 4, 5]);
        let mut submitted = BTreeMap::new();
        let die_at = 5 + seed % 30;
        let second = die_at + seed % 4;
        traffic(&mut net, 50, &mut submitted, |net, i| {
            if i == die_at {
                net.kill(1);
                net.change(1, Change::Left);
            }
            if i == second {
                net.kill(3);
                net.change(3, Change::Left);
            }
        });
        net.settle();
        submitted.remove(&1);
        submitted.remove(&3);
        net.check(&submitted);
        let v = views(&net.outputs[&2]);
        assert_eq!(v.last().map(|v| v.1.clone()), Some(vec![2, 4, 5]), "seed {seed}");
    }
}

#[test]
fn a_newcomer_delivers_from_its_first_view_on() {
    for seed in 0..100 {
        let mut net = Net::new(seed, &[2, 3, 4]);
        let mut submitted = BTreeMap::new();
        let join_at = 5 + seed % 20;
        traffic(&mut net, 40, &mut submitted, |net, i| {
            if i == join_at {
                net.change(1, Change::Joined(1));
                net.change(1, Change::JoinedGroup(G));
            }
        });
        net.settle();
        // Node 1 (the new sequencer) delivers only its own view's messages.
        let mine = &net.outputs[&1];
        assert!(
            matches!(mine.first(), Some(GroupOutput::View { members, .. }) if members == &vec![1, 2, 3, 4])
        );
        let all = &net.outputs[&2];
        let from = all
            .iter()
            .position(|o| matches!(o, GroupOutput::View { members, .. } if members.len() == 4))
            .unwrap();
        assert_eq!(&all[from..], &mine[..], "seed {seed}");
        for n in [2, 3, 4] {
            let ns: Vec<u64> = all
                .iter()
                .filter_map(|o| match o {
                    GroupOutput::Delivered(m) if m.from == n => Some(m.n),
                    _ => None,
                })
                .collect();
            assert_eq!(ns, (1..=submitted[&n]).collect::<Vec<_>>(), "seed {seed}: node {n}");
        }
    }
}

#[test]
fn leaving_says_what_was_not_delivered() {
    let mut net = Net::new(3, &[1, 2, 3]);
    net.spread = 0;
    for i in 1..=5 {
        net.submit(3, i);
    }
    // Node 3 leaves before anything it sent could be ordered.
    net.change(3, Change::LeftGroup(G));
    net.step();
    let left = net.outputs[&3].iter().find_map(|o| match o {
        GroupOutput::Left { undelivered, .. } => Some(undelivered.clone()),
        _ => None,
    });
    assert_eq!(left, Some(vec![1, 2, 3, 4, 5]));
    net.settle();
    let delivered_from_3 =
        net.outputs[&1].iter().filter(|o| matches!(o, GroupOutput::Delivered(m) if m.from == 3)).count();
    assert_eq!(delivered_from_3, 0, "nothing of a member that left before its messages were ordered");
}
