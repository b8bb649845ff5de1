//! The simulator's network as a source-routed fabric (docs/FABRIC.md;
//! Tang and Bilas [TB] section 4.2): each rail is a fabric of its own,
//! each node a host plugged into every one, and every datagram goes
//! where the sending node's route book says, or nowhere. A node moved to
//! another switch mid-run takes its routes with it, wrong; its peers'
//! routes to it lead to an empty port. What finds new ones is the core's
//! path layer judging the paths down (`Event::PathChanged`) and the
//! book's search, whose probes this fabric answers round by round in
//! virtual time. The streams above must lose nothing.
//!
//! A route's generation rides beside the datagram (`Datagram::tag`, out
//! of band, as a NIC's route header would), and the receiving node's book
//! refuses one older than it has heard from that source.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use serde::Serialize;
use tether_proto::routes::{Lookup, Round, RouteBook, RouteCounters, Routed};
use tether_proto::{Instant, NodeId, RailId};

use crate::config::FabricPlan;
use crate::fabric::{Answer, Drop, Fabric, ProbeTiming, SwitchId, Walk};

/// Probes one search may send.
pub const SEARCH_BUDGET: u64 = 1 << 16;
/// How long a node searches for a peer again after failing to find it.
pub const RETRY: Duration = Duration::from_millis(5);
/// Datagrams held for a peer while its route is searched for, as ARP
/// holds a few for an address it resolves: the first ones (a handshake)
/// are not lost to the search. Past this the oldest are dropped.
pub const HOLD: usize = 8;

/// The fabric host a node is (hosts are numbered from 1).
pub fn host(node: NodeId) -> NodeId {
    node + 1
}

/// The node a fabric host is (a host past the run's nodes is a bystander).
fn node_of(host: NodeId) -> NodeId {
    host - 1
}

/// One search, as it ended.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Search {
    pub node: NodeId,
    pub peer: NodeId,
    pub rail: RailId,
    /// When it started, in virtual ms since the run began.
    pub at_ms: f64,
    /// Its length in switches (0: not found).
    pub hops: usize,
    /// The oracle's shortest route then (0: none).
    pub shortest: usize,
    pub host_probes: u64,
    pub switch_probes: u64,
    /// Virtual time from start to end.
    pub us: f64,
}

/// Where datagrams were lost in the fabric, and what the books did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct FabricReport {
    /// What the fabric was made from (`crate::topology`).
    pub topology: String,
    pub hosts: usize,
    pub switches: usize,
    /// (node, hops from switch 0 it was moved to, virtual ms).
    pub moves: Vec<(NodeId, usize, f64)>,
    /// The books' counters, summed over every node and rail.
    pub books: RouteCounters,
    /// Dropped at an empty port or past the route's end.
    pub no_such_port: u64,
    pub dead_link: u64,
    pub past_host: u64,
    /// Delivered to a host that runs no node of the run.
    pub bystander: u64,
    /// Ended at a switch (a route too short).
    pub at_switch: u64,
    /// Held while their route was searched for, then sent on it.
    pub held: u64,
    /// Dropped from the hold: past `HOLD`, or their peer not found, or
    /// their sender moved.
    pub hold_dropped: u64,
    pub searches: Vec<Search>,
}

/// A search's round out: its token (a moved node's old searches are
/// recognised as gone), when it started, and the answers waiting for the
/// round's slowest probe.
struct Out {
    token: u64,
    started: Instant,
    answers: Option<Vec<Answer>>,
    /// Datagrams waiting for the route, oldest first (at most `HOLD`).
    held: VecDeque<Vec<u8>>,
}

/// Every rail's fabric, and each node's book on each.
pub struct FabricNet {
    moves: Vec<(NodeId, usize, Duration)>,
    /// Node 0's switch, from which moves count their hops.
    home: SwitchId,
    fabrics: Vec<Fabric>,
    /// `books[rail][node]`.
    books: Vec<Vec<RouteBook>>,
    out: BTreeMap<(RailId, NodeId, NodeId), Out>,
    next_token: u64,
    timing: ProbeTiming,
    report: FabricReport,
}

/// A round of a search is due: scheduled by [`FabricNet`], run by the
/// simulator's loop through [`FabricNet::round`].
#[derive(Debug, Clone, Copy)]
pub struct RoundDue {
    pub rail: RailId,
    pub node: NodeId,
    pub peer: NodeId,
    pub token: u64,
}

/// Where a datagram sent goes.
pub enum Carried {
    /// To this node, after this long, marked with this generation.
    To(NodeId, Duration, u32),
    /// Held until its route is found; start the search if one is due.
    Held(Option<RoundDue>),
    /// Nowhere (counted).
    Lost,
}

/// What a search's round came to.
pub struct RoundDone {
    /// The next round, due then.
    pub next: Option<(Instant, RoundDue)>,
    /// Datagrams held for the route just found: send them now.
    pub released: Vec<Vec<u8>>,
}

impl FabricNet {
    /// The plan's fabric, once per rail, its hosts 1 to `nodes` the
    /// run's nodes (checked by [`FabricPlan::new`]).
    pub fn new(plan: &FabricPlan, nodes: u32, rails: usize) -> Self {
        let fabric = plan.fabric.clone();
        let home = fabric.host_at(host(0)).expect("node 0 is a host of the fabric").0;
        let ports = fabric.max_ports();
        let report = FabricReport {
            topology: plan.topology.to_string(),
            hosts: fabric.hosts().count(),
            switches: fabric.switch_count(),
            ..FabricReport::default()
        };
        FabricNet {
            moves: plan.moves.clone(),
            home,
            fabrics: vec![fabric; rails],
            books: (0..rails)
                .map(|_| (0..nodes).map(|_| RouteBook::new(ports, SEARCH_BUDGET, RETRY)).collect())
                .collect(),
            out: BTreeMap::new(),
            next_token: 0,
            timing: ProbeTiming::default(),
            report,
        }
    }

    /// The plan's moves: (node, hops, when).
    pub fn moves(&self) -> &[(NodeId, usize, Duration)] {
        &self.moves
    }

    /// A datagram `src` sends `dst` over `rail` at `now`.
    pub fn carry(&mut self, now: Instant, src: NodeId, dst: NodeId, rail: RailId, bytes: &[u8]) -> Carried {
        let r = rail as usize;
        let book = &mut self.books[r][src as usize];
        let (route, generation) = match book.lookup(now, dst) {
            Lookup::Route { route, generation } => (route, generation),
            Lookup::Mapping => {
                let due = self.kick(now, rail, src, dst);
                let out = self.out.get_mut(&(rail, src, dst)).expect("a search is out");
                if out.held.len() == HOLD {
                    out.held.pop_front();
                    self.report.hold_dropped += 1;
                }
                out.held.push_back(bytes.to_vec());
                return Carried::Held(due);
            }
            Lookup::Unreachable => return Carried::Lost,
        };
        match self.fabrics[r].walk(host(src), route) {
            Walk::Host(h, links) => {
                let took = Duration::from_nanos(links as u64 * self.timing.link_ns);
                if (node_of(h) as usize) < self.books[r].len() {
                    return Carried::To(node_of(h), took, generation);
                }
                self.report.bystander += 1;
            }
            Walk::Switch(..) => self.report.at_switch += 1,
            Walk::Dropped(Drop::NoSuchPort) => self.report.no_such_port += 1,
            Walk::Dropped(Drop::DeadLink | Drop::NotAttached) => self.report.dead_link += 1,
            Walk::Dropped(Drop::PastHost) => self.report.past_host += 1,
        }
        Carried::Lost
    }

    /// A datagram from `src` marked `generation` reached `dst`: may it
    /// be taken?
    pub fn accept(&mut self, rail: RailId, src: NodeId, dst: NodeId, generation: u32) -> bool {
        self.books[rail as usize][dst as usize].accept(src, generation)
    }

    /// The core judged `node`'s path to `peer` over `rail` down: search
    /// again.
    pub fn path_down(&mut self, now: Instant, rail: RailId, node: NodeId, peer: NodeId) -> Option<RoundDue> {
        let book = self.books.get_mut(rail as usize)?.get_mut(node as usize)?;
        if book.lost(peer) {
            return self.kick(now, rail, node, peer);
        }
        None
    }

    /// Move `node` to a free port of a switch `hops` from node 0's
    /// ([`Fabric::place_at`]), on every rail; its books forget their
    /// routes and searches.
    pub fn move_node(&mut self, elapsed: Duration, node: NodeId, hops: usize) {
        for (r, fabric) in self.fabrics.iter_mut().enumerate() {
            let to = fabric.place_at(self.home, hops, None).expect("FabricPlan::new found a place");
            fabric.move_host(host(node), to).expect("a free port");
            self.books[r][node as usize].replugged();
        }
        let dropped = &mut self.report.hold_dropped;
        self.out.retain(|&(_, n, _), out| {
            if n == node {
                *dropped += out.held.len() as u64;
            }
            n != node
        });
        self.report.moves.push((node, hops, elapsed.as_secs_f64() * 1e3));
    }

    /// Start a round for (`node`, `peer`) on `rail` unless one is out.
    fn kick(&mut self, now: Instant, rail: RailId, node: NodeId, peer: NodeId) -> Option<RoundDue> {
        if self.out.contains_key(&(rail, node, peer)) {
            return None;
        }
        self.next_token += 1;
        let token = self.next_token;
        self.out
            .insert((rail, node, peer), Out { token, started: now, answers: None, held: VecDeque::new() });
        Some(RoundDue { rail, node, peer, token })
    }

    /// Run a search's round that came due at `now`: give its answers to
    /// the book and send the next one.
    pub fn round(&mut self, now: Instant, origin: Instant, due: RoundDue) -> RoundDone {
        let RoundDue { rail, node, peer, token } = due;
        let key = (rail, node, peer);
        let mut done = RoundDone { next: None, released: Vec::new() };
        let Some(out) = self.out.get_mut(&key).filter(|o| o.token == token) else { return done };
        let started = out.started;
        let book = &mut self.books[rail as usize][node as usize];
        let mut ended = out.answers.take().and_then(|answers| book.answered(peer, &answers));
        if ended.is_none() {
            match book.next_round(peer) {
                Round::Probes(probes) => {
                    let fabric = &self.fabrics[rail as usize];
                    let mut slowest = 0;
                    let answers = probes
                        .iter()
                        .map(|p| {
                            let (a, took) = fabric.answer(host(node), p, self.timing);
                            slowest = slowest.max(took);
                            // The fabric answers with hosts; the book knows nodes.
                            match a {
                                Answer::Host(h) => Answer::Host(node_of(h)),
                                other => other,
                            }
                        })
                        .collect();
                    self.out.get_mut(&key).expect("looked up above").answers = Some(answers);
                    done.next = Some((now + Duration::from_nanos(slowest), due));
                    return done;
                }
                Round::Ended(end) => ended = Some(end),
                Round::Idle => {}
            }
        }
        let held = self.out.remove(&key).map(|o| o.held).unwrap_or_default();
        let Some(end) = ended else { return done };
        let shortest =
            self.fabrics[rail as usize].shortest_route(host(node), host(peer)).map_or(0, |r| r.len());
        let (hops, probes) = match end {
            Routed::Found { hops, probes, .. } => {
                self.report.held += held.len() as u64;
                done.released.extend(held);
                (hops, probes)
            }
            Routed::Unreachable { probes } => {
                self.report.hold_dropped += held.len() as u64;
                (0, probes)
            }
        };
        self.report.searches.push(Search {
            node,
            peer,
            rail,
            at_ms: (started - origin).as_secs_f64() * 1e3,
            hops,
            shortest,
            host_probes: probes.host,
            switch_probes: probes.switch,
            us: (now - started).as_secs_f64() * 1e6,
        });
        done
    }

    /// What the fabric and the books did.
    pub fn report(mut self) -> FabricReport {
        for c in self.books.iter().flatten().map(RouteBook::counters) {
            self.report.books += c;
        }
        self.report
    }
}
