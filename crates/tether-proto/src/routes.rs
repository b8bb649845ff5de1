//! The route book of a host in a source-routed fabric: for each peer, the
//! route datagrams take, its generation, and the search for a new one
//! when the old one failed. Tang and Bilas [TB] section 4.2 (design:
//! docs/FABRIC.md), sans-IO like the rest of the core.
//!
//! A route is found on demand, by the breadth-first [`Mapper`]:
//!
//! - at the first datagram to a peer without one ([`RouteBook::lookup`]);
//! - when the core judged every path to the peer down
//!   ([`RouteBook::lost`]): the peer moved, or a link on the way died;
//! - when this host was plugged in elsewhere ([`RouteBook::replugged`]):
//!   every route it had starts at the wrong switch now.
//!
//! Each route found starts a new **generation** of the routes to that
//! peer. Datagrams carry it beside their route, and a receiver drops one
//! of an older generation than it has heard from that source
//! ([`RouteBook::accept`]): what was still in the fabric on a dead route
//! dies there, as [TB]'s sequence-number generations make it. tether's
//! streams need no more than that: a datagram lost on the way is sent
//! again by the stream, on the new route.
//!
//! The driver of the fabric's interface owns the book: it asks for a
//! route at every send, sends the mapper's probes and hands back their
//! answers. Every part is bounded: one search per peer at a time, each
//! within its probe budget, and the peers and sources it remembers.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::mapper::{Answer, Mapped, Mapper, Port, Probe, ProbeCounts};
use crate::{Instant, NodeId};

/// Peers (and sources heard from) a book remembers at most.
pub const MAX_ROUTED_PEERS: usize = 4096;

/// What the book has for a peer, at a send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup<'a> {
    /// Send along this route, marked with its generation.
    Route {
        /// The output port at each switch.
        route: &'a [Port],
        /// The route's generation, which its datagrams carry.
        generation: u32,
    },
    /// A search is under way: nothing can be sent yet.
    Mapping,
    /// The last search did not find the peer; another starts once the
    /// book's retry interval passed.
    Unreachable,
}

/// How a search ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Routed {
    /// A route of `hops` switches, under a new generation.
    Found {
        /// The new route's generation.
        generation: u32,
        /// Its length in switches.
        hops: usize,
        /// What the search sent.
        probes: ProbeCounts,
    },
    /// The search gave up (its budget spent, or the fabric does not lead
    /// to the peer).
    Unreachable {
        /// What the search sent.
        probes: ProbeCounts,
    },
}

/// What a search does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Round {
    /// Send these probes at once, and hand back their answers.
    Probes(Vec<Probe>),
    /// The search ended without another probe.
    Ended(Routed),
    /// No search for the peer is under way, or its round is still out.
    Idle,
}

/// What the book has done, summed over its peers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct RouteCounters {
    /// Searches started.
    pub searches: u64,
    /// Searches that found their peer.
    pub found: u64,
    /// Searches that did not.
    pub unreachable: u64,
    /// Host probes sent, over every search.
    pub host_probes: u64,
    /// Switch probes sent.
    pub switch_probes: u64,
    /// Sends with no route to take (searching, or unreachable).
    pub no_route: u64,
    /// Datagrams refused for an older generation than heard before.
    pub stale_generation: u64,
    /// Peers or sources not taken because the book was full.
    pub full: u64,
}

impl core::ops::AddAssign for RouteCounters {
    fn add_assign(&mut self, o: Self) {
        self.searches += o.searches;
        self.found += o.found;
        self.unreachable += o.unreachable;
        self.host_probes += o.host_probes;
        self.switch_probes += o.switch_probes;
        self.no_route += o.no_route;
        self.stale_generation += o.stale_generation;
        self.full += o.full;
    }
}

#[derive(Debug)]
enum State {
    /// No route, and no search yet: one starts at the next send.
    Unknown,
    Known(Vec<Port>),
    Searching(Box<Mapper>),
    /// The last search failed; `since` is the first send after it.
    Unreachable {
        since: Option<Instant>,
    },
}

#[derive(Debug)]
struct Entry {
    /// The generation of the route in use, or of the last one found; the
    /// next route found takes the one after. Kept when the route is
    /// forgotten, so generations only grow.
    generation: u32,
    state: State,
}

/// One host's routes to its peers.
#[derive(Debug)]
pub struct RouteBook {
    /// Ports a switch has, probed on each one a search explores.
    ports: usize,
    /// Probes one search may send.
    budget: u64,
    /// How long a peer found unreachable stays so before a new search.
    retry: Duration,
    peers: BTreeMap<NodeId, Entry>,
    /// The newest generation heard from each source.
    heard: BTreeMap<NodeId, u32>,
    counters: RouteCounters,
}

impl RouteBook {
    /// A book for a fabric of switches with `ports` ports, each search
    /// allowed `budget` probes, a peer not found searched for again after
    /// `retry`.
    pub fn new(ports: usize, budget: u64, retry: Duration) -> Self {
        RouteBook {
            ports,
            budget,
            retry,
            peers: BTreeMap::new(),
            heard: BTreeMap::new(),
            counters: RouteCounters::default(),
        }
    }

    /// The route to `peer` for a datagram sent `now`. A peer without one
    /// starts a search (one found unreachable, once `retry` has passed
    /// since the first send after that search).
    pub fn lookup(&mut self, now: Instant, peer: NodeId) -> Lookup<'_> {
        if !self.peers.contains_key(&peer) {
            if self.peers.len() >= MAX_ROUTED_PEERS {
                self.counters.full += 1;
                self.counters.no_route += 1;
                return Lookup::Unreachable;
            }
            self.peers.insert(peer, Entry { generation: 0, state: State::Unknown });
        }
        let retry = self.retry;
        let entry = self.peers.get_mut(&peer).expect("inserted above");
        let again = match &mut entry.state {
            State::Unknown => true,
            State::Unreachable { since: since @ None } => {
                *since = Some(now);
                false
            }
            State::Unreachable { since: Some(t) } => now.saturating_since(*t) >= retry,
            State::Known(_) | State::Searching(_) => false,
        };
        if again {
            self.search(peer);
        }
        let entry = &self.peers[&peer];
        match &entry.state {
            State::Known(route) => Lookup::Route { route, generation: entry.generation },
            State::Searching(_) | State::Unknown => {
                self.counters.no_route += 1;
                Lookup::Mapping
            }
            State::Unreachable { .. } => {
                self.counters.no_route += 1;
                Lookup::Unreachable
            }
        }
    }

    /// Start a search for `peer` unless one is under way.
    fn search(&mut self, peer: NodeId) {
        let Some(entry) = self.peers.get_mut(&peer) else { return };
        if !matches!(entry.state, State::Searching(_)) {
            entry.state = State::Searching(Box::new(Mapper::new(peer, self.ports, self.budget)));
            self.counters.searches += 1;
        }
    }

    /// Every path to `peer` was judged down: its route leads nowhere now.
    /// Forget it and search again; false if there was nothing to forget
    /// (no route known, or a search under way already).
    pub fn lost(&mut self, peer: NodeId) -> bool {
        match self.peers.get(&peer).map(|e| &e.state) {
            Some(State::Known(_) | State::Unreachable { .. }) => {
                self.search(peer);
                true
            }
            Some(State::Searching(_) | State::Unknown) | None => false,
        }
    }

    /// This host was unplugged and plugged in elsewhere: every route
    /// starts at the wrong switch now, and every search under way probes
    /// from it. All are forgotten (their generations kept), and each peer
    /// is searched for at its next send.
    pub fn replugged(&mut self) {
        for entry in self.peers.values_mut() {
            entry.state = State::Unknown;
        }
    }

    /// The peers being searched for.
    pub fn searching(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.peers.iter().filter(|(_, e)| matches!(e.state, State::Searching(_))).map(|(&p, _)| p)
    }

    /// The next probes of the search for `peer`, to send at once.
    pub fn next_round(&mut self, peer: NodeId) -> Round {
        let Some(Entry { state: State::Searching(m), .. }) = self.peers.get_mut(&peer) else {
            return Round::Idle;
        };
        let before = m.counts();
        let round = m.next_round();
        let after = m.counts();
        self.count(before, after);
        if !round.is_empty() {
            return Round::Probes(round);
        }
        // Nothing more to probe (the budget spent, or the fabric
        // explored), or the last round still out.
        self.end(peer).map_or(Round::Idle, Round::Ended)
    }

    /// What came back for the round out for `peer`, in the order of its
    /// probes: how the search ended, if it did.
    pub fn answered(&mut self, peer: NodeId, answers: &[Answer]) -> Option<Routed> {
        let Some(Entry { state: State::Searching(m), .. }) = self.peers.get_mut(&peer) else { return None };
        m.answered(answers);
        self.end(peer)
    }

    /// Take a finished search's outcome into the book.
    fn end(&mut self, peer: NodeId) -> Option<Routed> {
        let entry = self.peers.get_mut(&peer)?;
        let State::Searching(m) = &entry.state else { return None };
        let probes = m.counts();
        match m.outcome()?.clone() {
            Mapped::Found(route) => {
                entry.generation = entry.generation.saturating_add(1);
                let hops = route.len();
                entry.state = State::Known(route);
                self.counters.found += 1;
                Some(Routed::Found { generation: entry.generation, hops, probes })
            }
            Mapped::Unreachable => {
                entry.state = State::Unreachable { since: None };
                self.counters.unreachable += 1;
                Some(Routed::Unreachable { probes })
            }
        }
    }

    fn count(&mut self, before: ProbeCounts, after: ProbeCounts) {
        self.counters.host_probes += after.host - before.host;
        self.counters.switch_probes += after.switch - before.switch;
    }

    /// A datagram from `src` marked with `generation` came in: true if it
    /// may be taken, false (and counted) if a newer generation was heard
    /// from `src` already: it came by a route its sender gave up.
    pub fn accept(&mut self, src: NodeId, generation: u32) -> bool {
        let full = self.heard.len() >= MAX_ROUTED_PEERS;
        match self.heard.get_mut(&src) {
            Some(newest) if generation < *newest => {
                self.counters.stale_generation += 1;
                false
            }
            Some(newest) => {
                *newest = generation;
                true
            }
            None if full => {
                self.counters.full += 1;
                true
            }
            None => {
                self.heard.insert(src, generation);
                true
            }
        }
    }

    /// What the book has done so far.
    pub fn counters(&self) -> RouteCounters {
        self.counters
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PEER: NodeId = 9;

    fn at(ms: u64) -> Instant {
        Instant::from_nanos(1_000_000_000 + ms * 1_000_000)
    }

    fn found(generation: u32) -> Option<(u32, usize)> {
        Some((generation, 1))
    }

    fn unreachable() -> Option<(u32, usize)> {
        None
    }

    /// Answer a search on one 8-port switch where `peer` sits at `port`
    /// (nothing at all if `None`): the new route's generation and length,
    /// or `None` if the search did not find the peer.
    fn answer_one_switch(book: &mut RouteBook, port: Option<Port>) -> Option<(u32, usize)> {
        let end = search_one_switch(book, port).expect("the search ended");
        match end {
            Routed::Found { generation, hops, probes } => {
                assert_eq!(probes.total(), 8, "one round of host probes");
                Some((generation, hops))
            }
            Routed::Unreachable { .. } => None,
        }
    }

    fn search_one_switch(book: &mut RouteBook, port: Option<Port>) -> Option<Routed> {
        loop {
            let round = match book.next_round(PEER) {
                Round::Probes(round) => round,
                Round::Ended(end) => return Some(end),
                Round::Idle => return None,
            };
            let answers: Vec<Answer> = round
                .iter()
                .map(|p| match p {
                    Probe::Host(r) if Some(r[0]) == port && r.len() == 1 => Answer::Host(PEER),
                    _ => Answer::Nothing,
                })
                .collect();
            if let Some(end) = book.answered(PEER, &answers) {
                return Some(end);
            }
        }
    }

    #[test]
    fn a_route_is_searched_for_at_the_first_send_and_each_new_one_is_a_new_generation() {
        let mut book = RouteBook::new(8, 1000, Duration::from_millis(10));
        assert_eq!(book.lookup(at(0), PEER), Lookup::Mapping);
        assert_eq!(book.searching().collect::<Vec<_>>(), vec![PEER]);
        assert_eq!(answer_one_switch(&mut book, Some(3)), found(1));
        assert_eq!(book.lookup(at(1), PEER), Lookup::Route { route: &[3], generation: 1 });
        // The path died: searched again, found at another port.
        assert!(book.lost(PEER));
        assert!(!book.lost(PEER), "one search at a time");
        assert_eq!(book.lookup(at(2), PEER), Lookup::Mapping);
        assert_eq!(answer_one_switch(&mut book, Some(5)), found(2));
        assert_eq!(book.lookup(at(3), PEER), Lookup::Route { route: &[5], generation: 2 });
        // This host moved: forgotten, found at the next send.
        book.replugged();
        assert_eq!(book.lookup(at(4), PEER), Lookup::Mapping);
        assert_eq!(answer_one_switch(&mut book, Some(1)), found(3));
        let c = book.counters();
        assert_eq!((c.searches, c.found, c.unreachable), (3, 3, 0));
        assert_eq!(c.host_probes, 3 * 8, "one round of host probes each");
        assert_eq!(c.no_route, 3);
    }

    #[test]
    fn a_peer_not_found_is_searched_for_again_only_after_the_retry_interval() {
        let mut book = RouteBook::new(8, 1000, Duration::from_millis(10));
        assert_eq!(book.lookup(at(0), PEER), Lookup::Mapping);
        assert_eq!(answer_one_switch(&mut book, None), unreachable());
        let c = book.counters();
        assert_eq!((c.host_probes, c.switch_probes), (8, 8), "every port both ways, nothing behind any");
        assert_eq!(book.lookup(at(1), PEER), Lookup::Unreachable);
        assert_eq!(book.lookup(at(10), PEER), Lookup::Unreachable);
        assert_eq!(book.lookup(at(11), PEER), Lookup::Mapping, "10 ms after the first send that found none");
        assert_eq!(book.counters().searches, 2);
    }

    #[test]
    fn a_search_stops_at_its_budget() {
        let mut book = RouteBook::new(8, 5, Duration::from_millis(10));
        book.lookup(at(0), PEER);
        assert_eq!(answer_one_switch(&mut book, None), unreachable());
        let c = book.counters();
        assert_eq!(c.host_probes + c.switch_probes, 5);
    }

    #[test]
    fn a_datagram_of_an_older_generation_than_heard_is_refused() {
        let mut book = RouteBook::new(8, 1000, Duration::from_millis(10));
        assert!(book.accept(1, 1));
        assert!(book.accept(1, 2));
        assert!(book.accept(1, 2));
        assert!(!book.accept(1, 1), "came by a route its sender gave up");
        assert!(book.accept(2, 1), "generations are per source");
        assert_eq!(book.counters().stale_generation, 1);
    }

    #[test]
    fn the_book_is_bounded_in_peers_and_sources() {
        let mut book = RouteBook::new(8, 1000, Duration::from_millis(10));
        for p in 0..MAX_ROUTED_PEERS as NodeId {
            book.lookup(at(0), p);
            book.accept(p, 1);
        }
        assert_eq!(book.lookup(at(0), NodeId::MAX), Lookup::Unreachable);
        assert!(book.accept(NodeId::MAX, 1));
        assert_eq!(book.counters().full, 2);
        assert_eq!(book.peers.len(), MAX_ROUTED_PEERS);
        assert_eq!(book.heard.len(), MAX_ROUTED_PEERS);
    }
}
