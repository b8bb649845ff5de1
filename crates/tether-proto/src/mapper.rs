//! Routes found on demand in a source-routed switched fabric: the
//! breadth-first search of Tang and Bilas [TB] section 4.2 (design:
//! docs/FABRIC.md), sans-IO. A host that must reach a peer whose route it
//! does not know (the peer moved, a link died) probes the fabric one
//! switch at a time, nearest first, until a probe reaches the peer; the
//! first route that does is a shortest one.
//!
//! Two kinds of probe, answered by the fabric (hardware on a real
//! source-routed NIC, the fabric model in the simulator):
//!
//! - a **host probe** along a route: whoever is at its end answers with
//!   its node id; nothing answers if the route ends elsewhere;
//! - a **switch probe** along a route: it comes back if the route ends at
//!   a switch.
//!
//! Switches have no identity ([TB]: "unlike hosts, Myrinet switches do not
//! have identities"), so a switch reached by two routes looks like two.
//! A host, though, is plugged into exactly one port of one switch, so a
//! switch with a host is known again by that host at that port: the
//! search stops exploring a switch as soon as a host answers at a port
//! where it answered before (a switch seen already), and explores every
//! route to a switch without hosts. Probing stops at the peer, and never
//! goes past a budget: a fabric that does not lead to the peer costs a
//! bounded number of probes, and the peer is then unreachable.
//!
//! The mapper is driven in rounds: `next_round` gives the probes to send
//! at once (a switch's ports, a few at a time), `answered` takes what came
//! back for each, in order (`Answer::Nothing` when its timeout passed).

use std::collections::{BTreeSet, VecDeque};

use crate::NodeId;

/// A port's number on its switch.
pub type Port = u8;

/// A source route: the output port to take at each switch, first to last.
pub type Route = Vec<Port>;

/// A probe to send along its route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    /// Answered by the host at the route's end, with its node id.
    Host(Route),
    /// Comes back if the route ends at a switch.
    Switch(Route),
}

/// What came back for a probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// The host at the route's end, with its id.
    Host(NodeId),
    /// The switch probe came back: the route ends at a switch.
    Switch,
    /// Nothing before the probe's timeout.
    Nothing,
}

/// Where a search ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mapped {
    /// A shortest route to the peer.
    Found(Route),
    /// No route found: every switch reachable was explored, or the
    /// probe budget was spent.
    Unreachable,
}

/// The probes a search sent, by kind, and its rounds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProbeCounts {
    /// Host probes sent.
    pub host: u64,
    /// Switch probes sent.
    pub switch: u64,
    /// Rounds of probes sent at once.
    pub rounds: u64,
}

impl ProbeCounts {
    /// Probes of both kinds.
    pub fn total(&self) -> u64 {
        self.host + self.switch
    }
}

/// Host probes sent at once: a switch with hosts is usually known again
/// by the first of them, so a switch seen already costs a round of this
/// many, not one probe per port.
const HOST_ROUND: usize = 8;

/// One switch being explored.
#[derive(Debug)]
struct Exploring {
    route: Route,
    /// Host probes sent so far (ports `0..probed`).
    probed: usize,
    /// Ports where no host answered: switch probes go there.
    empty: Vec<Port>,
    /// Hosts that answered, and where.
    hosts: Vec<(Port, NodeId)>,
    /// The switch probes are out.
    probing_switches: bool,
}

/// A search for a route to one peer.
#[derive(Debug)]
pub struct Mapper {
    target: NodeId,
    /// Ports probed on every switch (a switch answers nothing past its last).
    ports: usize,
    budget: u64,
    /// Switches to explore, by route, nearest first.
    frontier: VecDeque<Route>,
    current: Option<Exploring>,
    /// Hosts seen, with the port they answered at: a switch's identity.
    seen: BTreeSet<(Port, NodeId)>,
    /// The round out: its probes' ports, in order.
    out: Vec<Port>,
    counts: ProbeCounts,
    done: Option<Mapped>,
}

impl Mapper {
    /// Search from this host's own switch for `target`, probing `ports`
    /// ports a switch, at most `budget` probes in all.
    pub fn new(target: NodeId, ports: usize, budget: u64) -> Self {
        Mapper {
            target,
            ports: ports.min(Port::MAX as usize + 1),
            budget,
            frontier: VecDeque::from([Vec::new()]),
            current: None,
            seen: BTreeSet::new(),
            out: Vec::new(),
            counts: ProbeCounts::default(),
            done: None,
        }
    }

    /// Where the search ended, once it has.
    pub fn outcome(&self) -> Option<&Mapped> {
        self.done.as_ref()
    }

    /// The probes sent so far.
    pub fn counts(&self) -> ProbeCounts {
        self.counts
    }

    /// The next probes to send at once, or none when the search is over
    /// (or a round is out: answer it first).
    pub fn next_round(&mut self) -> Vec<Probe> {
        if self.done.is_some() || !self.out.is_empty() {
            return Vec::new();
        }
        loop {
            if self.counts.total() >= self.budget {
                self.done = Some(Mapped::Unreachable);
                return Vec::new();
            }
            let Some(cur) = self.current.as_mut() else {
                match self.frontier.pop_front() {
                    Some(route) => {
                        self.current = Some(Exploring {
                            route,
                            probed: 0,
                            empty: Vec::new(),
                            hosts: Vec::new(),
                            probing_switches: false,
                        });
                        continue;
                    }
                    None => {
                        self.done = Some(Mapped::Unreachable);
                        return Vec::new();
                    }
                }
            };
            let room = (self.budget - self.counts.total()) as usize;
            if cur.probed < self.ports {
                let n = HOST_ROUND.min(self.ports - cur.probed).min(room);
                let ports = (cur.probed..cur.probed + n).map(|p| p as Port);
                self.out.extend(ports);
                cur.probed += n;
                self.counts.host += n as u64;
                self.counts.rounds += 1;
                return self.out.iter().map(|&p| Probe::Host(extend(&cur.route, p))).collect();
            }
            if !cur.probing_switches && !cur.empty.is_empty() {
                cur.probing_switches = true;
                let n = cur.empty.len().min(room);
                self.out.extend(&cur.empty[..n]);
                self.counts.switch += n as u64;
                self.counts.rounds += 1;
                return self.out.iter().map(|&p| Probe::Switch(extend(&cur.route, p))).collect();
            }
            // Explored: a new switch's hosts are how it is known again.
            let cur = self.current.take().expect("exploring");
            self.seen.extend(cur.hosts);
        }
    }

    /// What came back for the round's probes, in the order given (fewer
    /// answers than probes: the rest got `Nothing`).
    pub fn answered(&mut self, answers: &[Answer]) {
        let out = std::mem::take(&mut self.out);
        let Some(cur) = self.current.as_mut() else { return };
        if !cur.probing_switches {
            let mut again = false;
            for (i, &port) in out.iter().enumerate() {
                match answers.get(i).copied().unwrap_or(Answer::Nothing) {
                    Answer::Host(h) if h == self.target => {
                        self.done = Some(Mapped::Found(extend(&cur.route, port)));
                        return;
                    }
                    Answer::Host(h) => {
                        again |= self.seen.contains(&(port, h));
                        cur.hosts.push((port, h));
                    }
                    // A switch answering a host probe is no answer.
                    Answer::Switch | Answer::Nothing => cur.empty.push(port),
                }
            }
            if again {
                // A switch explored before, by another route.
                self.current = None;
            }
            return;
        }
        for (i, &port) in out.iter().enumerate() {
            if answers.get(i) == Some(&Answer::Switch) {
                self.frontier.push_back(extend(&cur.route, port));
            }
        }
        // Every port probed both ways: explored.
        let cur = self.current.take().expect("exploring");
        self.seen.extend(cur.hosts);
    }
}

fn extend(route: &[Port], port: Port) -> Route {
    let mut r = Vec::with_capacity(route.len() + 1);
    r.extend_from_slice(route);
    r.push(port);
    r
}
