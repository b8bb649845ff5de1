//! Cluster membership over real endpoints (docs/CLUSTER.md): members and
//! three manager replicas (raft-rs) on UDP over loopback, their messages
//! on the sessions' service ports, with the fault injector dropping a
//! share of every node's datagrams. Every node must see the same views,
//! each once, in epoch order; a member that dies must be removed; nobody
//! alive may be; and the group must keep deciding with a replica dead.

// Tests read the wall clock to time detection (asserted against a
// generous bound, printed exactly).
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tether::cluster::{ClusterConfig, ClusterEvent, GroupOutput, View};
use tether::faults::FaultPlan;
use tether::{Endpoint, NodeId, Options};

const MANAGERS: [NodeId; 3] = [1, 2, 3];
const PERIOD: Duration = Duration::from_millis(50);

fn any() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

fn node(id: NodeId, rules: &[&str], seed: u64) -> Endpoint {
    node_with_spares(id, rules, seed, &[])
}

fn node_with_spares(id: NodeId, rules: &[&str], seed: u64, spares: &[NodeId]) -> Endpoint {
    let options = Options { faults: FaultPlan::parse_rules(seed, rules).unwrap(), ..Options::default() };
    let config = ClusterConfig { spares: spares.to_vec(), ..ClusterConfig::new(&MANAGERS, PERIOD) };
    Endpoint::builder(id).bind(any()).options(options).cluster(config).build().unwrap()
}

/// Let every endpoint know every other's address.
fn introduce(eps: &[&Endpoint]) {
    for a in eps {
        for b in eps {
            if a.node() != b.node() {
                let _ = a.add_peer(b.node(), b.local_addr().unwrap());
            }
        }
    }
}

fn nodes(view: &View) -> Vec<NodeId> {
    view.members.iter().map(|m| m.0).collect()
}

/// Wait until every endpoint's view holds exactly `want`.
fn until_views(eps: &[&Endpoint], want: &[NodeId], within: Duration) -> Duration {
    let start = Instant::now();
    loop {
        if eps.iter().all(|e| e.view().is_some_and(|v| nodes(&v) == want)) {
            return start.elapsed();
        }
        let views: Vec<_> = eps.iter().map(|e| (e.node(), e.view().map(|v| (v.epoch, nodes(&v))))).collect();
        assert!(start.elapsed() < within, "views after {within:?}: {views:?}, wanted {want:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Take every event waiting at each endpoint; views by node.
fn collect(eps: &[&Endpoint], views: &mut BTreeMap<NodeId, Vec<View>>, removed: &mut Vec<NodeId>) {
    for e in eps {
        while let Some(ev) = e.poll_cluster_event() {
            match ev {
                ClusterEvent::View(v) => views.entry(e.node()).or_default().push(v),
                ClusterEvent::Removed { .. } => removed.push(e.node()),
                _ => {}
            }
        }
    }
}

/// Each node's views are epochs 1, 2, 3, ... in order, and where two nodes
/// saw the same epoch they saw the same members.
/// A view's members and replicas.
type Agreed = (Vec<NodeId>, Vec<NodeId>);

fn check_agreement(views: &BTreeMap<NodeId, Vec<View>>) {
    let mut by_epoch: BTreeMap<u64, (NodeId, Agreed)> = BTreeMap::new();
    for (&n, vs) in views {
        let epochs: Vec<u64> = vs.iter().map(|v| v.epoch).collect();
        let want: Vec<u64> = (1..=epochs.len() as u64).collect();
        assert_eq!(epochs, want, "node {n}'s views, by epoch");
        for v in vs {
            let seen = (nodes(v), v.replicas.clone());
            let (first, agreed) = by_epoch.entry(v.epoch).or_insert((n, seen.clone()));
            assert_eq!(*agreed, seen, "epoch {}: node {first} and node {n} disagree", v.epoch);
        }
    }
}

#[test]
fn members_agree_and_a_dead_member_is_removed_under_loss() {
    let rules = ["drop:p=0.05"];
    let mut eps: Vec<Endpoint> = (1..=6).map(|id| node(id, &rules, 7)).collect();
    introduce(&eps.iter().collect::<Vec<_>>());
    let all: Vec<NodeId> = (1..=6).collect();
    let took = until_views(&eps.iter().collect::<Vec<_>>(), &all, Duration::from_secs(20));
    println!("six members in every view after {took:?}");
    let mut views = BTreeMap::new();
    let mut removed = Vec::new();
    collect(&eps.iter().collect::<Vec<_>>(), &mut views, &mut removed);

    // Node 6 dies: no goodbye, its socket closed.
    let dead = eps.pop().unwrap();
    dead.close(Duration::ZERO).ok();
    let died = Instant::now();
    let live: Vec<&Endpoint> = eps.iter().collect();
    let took = until_views(&live, &all[..5], Duration::from_secs(10));
    println!("node 6 removed from every view {took:?} after its death (heartbeats every {PERIOD:?})");
    assert!(died.elapsed() < Duration::from_secs(10));

    // A while longer under loss: nobody alive is removed.
    std::thread::sleep(PERIOD * 20);
    collect(&live, &mut views, &mut removed);
    assert_eq!(removed, Vec::<NodeId>::new(), "live members removed");
    for e in &live {
        assert_eq!(nodes(&e.view().unwrap()), all[..5], "node {}'s view", e.node());
    }
    check_agreement(&views);
    let stats: Vec<_> = live.iter().map(|e| e.cluster_stats().unwrap()).collect();
    assert!(stats.iter().all(|s| s.member_received > 0));
    assert!(stats[..3].iter().all(|s| s.raft_received > 0), "replicas talk Raft: {stats:?}");
    println!("node 1's cluster counters: {:?}", stats[0]);
}

/// Wait until every endpoint's view names exactly `want` as the replicas.
fn until_replicas(eps: &[&Endpoint], want: &[NodeId], within: Duration) -> Duration {
    let start = Instant::now();
    while !eps.iter().all(|e| e.view().is_some_and(|v| v.replicas == want)) {
        let seen: Vec<_> = eps.iter().map(|e| (e.node(), e.view().map(|v| v.replicas))).collect();
        assert!(start.elapsed() < within, "replicas after {within:?}: {seen:?}, wanted {want:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
    start.elapsed()
}

#[test]
fn the_group_decides_on_with_a_replica_dead_and_replaces_it() {
    const SPARES: [NodeId; 2] = [4, 5];
    let mut eps: Vec<Endpoint> = (1..=5).map(|id| node_with_spares(id, &[], 11, &SPARES)).collect();
    introduce(&eps.iter().collect::<Vec<_>>());
    until_views(&eps.iter().collect::<Vec<_>>(), &[1, 2, 3, 4, 5], Duration::from_secs(20));
    assert!(eps.iter().all(|e| e.view().unwrap().replicas == MANAGERS), "the founders");

    // Replica 1 dies; 2 and 3 remove it, take in a newcomer, and replace
    // the replica with the first spare.
    let dead = eps.remove(0);
    dead.close(Duration::ZERO).ok();
    let late = node_with_spares(6, &[], 11, &SPARES);
    eps.push(late);
    introduce(&eps.iter().collect::<Vec<_>>());
    let live: Vec<&Endpoint> = eps.iter().collect();
    let took = until_views(&live, &[2, 3, 4, 5, 6], Duration::from_secs(20));
    println!("replica 1 removed and node 6 joined after {took:?}");
    let took = until_replicas(&live, &[2, 3, 4], Duration::from_secs(20));
    println!("replica 1 replaced by spare 4 {took:?} later");

    // The newcomer caught up and takes part: with replica 2 dead too,
    // 3 and 4 are the majority that removes it and adds spare 5.
    let dead = eps.remove(0);
    dead.close(Duration::ZERO).ok();
    let live: Vec<&Endpoint> = eps.iter().collect();
    until_views(&live, &[3, 4, 5, 6], Duration::from_secs(20));
    let took = until_replicas(&live, &[3, 4, 5], Duration::from_secs(20));
    println!("replica 2 removed and replaced by spare 5, {took:?} after its removal");

    let mut views = BTreeMap::new();
    let mut removed = Vec::new();
    collect(&live, &mut views, &mut removed);
    assert_eq!(removed, Vec::<NodeId>::new());
    check_agreement(&views);
    let replacements: u64 = live.iter().map(|e| e.cluster_stats().unwrap().replacements).sum();
    assert!(replacements >= 2, "the leaders proposed the replacements: {replacements}");
}

#[test]
fn cluster_events_need_a_cluster() {
    let e = Endpoint::builder(9).bind(any()).build().unwrap();
    assert!(e.view().is_none());
    assert!(matches!(e.next_cluster_event(Some(Duration::ZERO)), Err(tether::Error::Unsupported { .. })));
}

/// Every output of `e`'s groups until `until` says stop, or `within`.
fn outputs_until(
    e: &Endpoint,
    within: Duration,
    mut until: impl FnMut(&[GroupOutput]) -> bool,
) -> Vec<GroupOutput> {
    let start = Instant::now();
    let mut got = Vec::new();
    while !until(&got) {
        assert!(start.elapsed() < within, "node {}: {} outputs after {within:?}", e.node(), got.len());
        if let Ok(o) = e.next_group_output(Some(Duration::from_millis(50))) {
            got.push(o);
        }
    }
    got
}

fn delivered(outputs: &[GroupOutput]) -> Vec<(u64, u64, NodeId, u64)> {
    outputs
        .iter()
        .filter_map(|o| match o {
            GroupOutput::Delivered(m) => Some((m.epoch, m.seq, m.from, m.n)),
            _ => None,
        })
        .collect()
}

#[test]
fn a_group_delivers_one_order_and_survives_a_death_under_loss() {
    const G: u32 = 7;
    const EACH: u64 = 300;
    let rules = ["drop:p=0.05"];
    let eps: Vec<Endpoint> = (1..=4).map(|id| node(id, &rules, 3)).collect();
    introduce(&eps.iter().collect::<Vec<_>>());
    for e in &eps {
        e.join_group(G).unwrap();
    }
    let start = Instant::now();
    while !eps.iter().all(|e| e.group_view(G).is_some_and(|(_, m)| m == [1, 2, 3, 4])) {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "group views: {:?}",
            eps.iter().map(|e| e.group_view(G)).collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // Everyone multicasts; node 4 dies halfway through its own.
    let mut eps = eps;
    let dead = eps.pop().unwrap();
    std::thread::scope(|s| {
        s.spawn(move || {
            for _ in 0..EACH / 2 {
                let _ = dead.multicast(G, &[4; 64][..], Some(Duration::from_secs(5)));
            }
            // Dies while the others multicast on: no goodbye.
            dead.close(Duration::ZERO).ok();
        });
        for e in &eps {
            s.spawn(move || {
                for _ in 0..EACH {
                    e.multicast(G, &[e.node() as u8; 64], Some(Duration::from_secs(20))).unwrap();
                }
            });
        }
    });
    // Every survivor delivers all its own and every other survivor's
    // messages, and the same sequence as the others, views and all.
    let all: Vec<Vec<GroupOutput>> = eps
        .iter()
        .map(|e| {
            outputs_until(e, Duration::from_secs(30), |got| {
                let d = delivered(got);
                (1..=3).all(|n| d.iter().filter(|m| m.2 == n).count() as u64 == EACH)
                    && got
                        .iter()
                        .any(|o| matches!(o, GroupOutput::View { members, .. } if members == &vec![1, 2, 3]))
            })
        })
        .collect();
    // From the view of all four, which every node installed before the
    // first multicast, the outputs are the same sequence.
    let from_four = |o: &[GroupOutput]| -> Vec<GroupOutput> {
        let at = o.iter().position(|o| matches!(o, GroupOutput::View { members, .. } if members.len() == 4));
        o[at.expect("the view of four")..].to_vec()
    };
    let first = from_four(&all[0]);
    for (i, o) in all.iter().enumerate().skip(1) {
        let theirs = from_four(o);
        let common = first.len().min(theirs.len());
        let differ = (0..common).find(|&k| first[k] != theirs[k]);
        assert!(differ.is_none(), "node 1 and node {} disagree at output {differ:?}", i + 1);
    }
    for n in 1..=3u32 {
        let ns: Vec<u64> = delivered(&all[0]).iter().filter(|m| m.2 == n).map(|m| m.3).collect();
        assert_eq!(ns, (1..=EACH).collect::<Vec<_>>(), "node {n}'s messages, once each, in its order");
    }
    let stats = eps[0].group_stats().unwrap();
    assert_eq!(stats.gaps, 0, "{stats:?}");
    println!("node 1's group counters: {stats:?}");
}
