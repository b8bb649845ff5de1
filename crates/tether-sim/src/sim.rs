//! The discrete-event driver: real `tether_proto::Endpoint`s on a
//! `VirtualNet` (net.rs: the clock, the event queue, delivering datagrams
//! and running timers, settling an endpoint after each event), its link
//! made of the simulated links, cuts, lossy rails and every node's fault
//! injectors; on top, one seeded RNG, a workload, restarts and soft-state
//! losses, and the checker watching every delivery and failure report.
//!
//! Determinism: the only randomness is the run's `Pcg64Mcg`; events at the
//! same instant run in the order they were scheduled; nothing iterates an
//! unordered container. One seed is one exact replay.

use std::collections::BTreeMap;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64Mcg;
use tether_fault::{node_seed, Injector};
use tether_proto::{
    Assembled, Endpoint, Event, Instant, MessageId, MessageState, NodeId, RailId, Reassembly, SendError,
    Stats,
};

use crate::checker::{message, Checker, Violation};
use crate::config::SimConfig;
use crate::forger::Forger;
use crate::nacked::NackedCheck;
use crate::net::{self, Datagram, Link, Sent, Step, Timeline, VirtualNet};
use crate::report::{LinkCounters, SimReport};
use crate::routed::{Carried, FabricNet, RoundDue};
use crate::unreliable::UnreliableCheck;

/// The simulator's own events; datagrams in flight and endpoint wake-ups
/// are the network's (`NetEvent`).
enum Ev {
    /// A node's injector holds delayed or reordered datagrams; the first
    /// is due now.
    Release {
        node: NodeId,
        rail: RailId,
        at: Instant,
    },
    Tick {
        node: NodeId,
    },
    Restart {
        node: NodeId,
    },
    SoftLoss {
        node: NodeId,
    },
    /// A slow application's turn to read.
    Read {
        node: NodeId,
    },
    /// A route search's round is due (`crate::routed`).
    Round(RoundDue),
    /// A node is unplugged and plugged in elsewhere in the fabric.
    Move {
        node: NodeId,
        hops: usize,
    },
}

/// What the simulator knows of a node beyond its endpoint.
struct Node {
    incarnation: u64,
    /// Messages of the workload sent to each peer, over all incarnations.
    sent_to: Vec<u64>,
    /// Next message number toward each peer in this incarnation.
    next_seq: Vec<u64>,
    read_scheduled: bool,
    /// With `deliver_fragments`: the application's reassembly of each
    /// peer's stream, which survives the engine (docs/ENGINE.md).
    reassembly: BTreeMap<NodeId, Reassembly>,
    /// Unreliable messages sent to each peer in this incarnation.
    unreliable_to: Vec<u64>,
}

/// Virtual time starts at 1 s so no core timestamp is zero.
const ORIGIN_NS: u64 = 1_000_000_000;
/// Messages a node sends to one peer per turn.
const BURST: u64 = 2;

/// The network between the nodes, as the `VirtualNet`'s link: latency,
/// cuts, lossy rails, and each node's network interface on each rail
/// (`nic`) with its fault injector, on the way out and on the way in.
struct Links<'a> {
    cfg: &'a SimConfig,
    /// The run's one RNG. It lives here because lossy rails draw from it;
    /// the workload draws its messages from it too.
    rng: Pcg64Mcg,
    counters: LinkCounters,
    /// What each interface does to datagrams it sends and receives.
    /// Survives the node's restarts, as a NIC would.
    injectors: Vec<Injector>,
    /// When each injector's next release is scheduled.
    release_at: Vec<Option<Instant>>,
    /// `TETHER_SIM_TRACE` set: print every datagram sent (for debugging a seed).
    trace: bool,
    /// The attacker on the path, in the `forged_epochs` mix.
    forger: Option<Forger>,
    /// The network as a source-routed fabric, in the `fabric_move` mixes.
    fabric: Option<FabricNet>,
}

struct World<'a> {
    cfg: &'a SimConfig,
    net: VirtualNet<Links<'a>, Ev>,
    nodes: Vec<Node>,
    checker: Checker,
    /// Counters of crashed incarnations, so nothing they did is forgotten.
    dead_stats: Stats,
    /// Engines rebuilt from hard state so far.
    soft_losses: u64,
    /// The unreliable messages beside the streams (`crate::unreliable`).
    unreliable: UnreliableCheck,
    /// The NACK-reliable messages beside them (`crate::nacked`).
    nacked: NackedCheck,
    /// Stream messages delivered or failed, and when the last one was.
    settled: (u64, Duration),
}

fn ns(d: Duration) -> u64 {
    d.as_nanos() as u64
}

impl<'a> World<'a> {
    fn new(cfg: &'a SimConfig) -> Self {
        let mut links = Links {
            cfg,
            rng: Pcg64Mcg::seed_from_u64(cfg.seed),
            counters: LinkCounters::default(),
            injectors: (0..cfg.nodes)
                .flat_map(|id| (0..rails(cfg)).map(move |rail| (id, rail)))
                .map(|(id, rail)| {
                    // Rail 0 keeps the seed a single-rail node has.
                    let seed = node_seed(cfg.seed, id) ^ (rail as u64).wrapping_mul(0xD1B5_4A32_D192_ED03);
                    Injector::with_seed(&cfg.faults, seed).expect("simulation fault plan is valid")
                })
                .collect(),
            release_at: vec![None; cfg.nodes as usize * rails(cfg)],
            trace: std::env::var_os("TETHER_SIM_TRACE").is_some(),
            forger: None,
            fabric: cfg.fabric.as_ref().map(|plan| FabricNet::new(plan, cfg.nodes, rails(cfg))),
        };
        let origin = Instant::from_nanos(ORIGIN_NS);
        if cfg.forgeries > 0 {
            links.forger = Some(Forger::new(&mut links.rng, cfg.forgeries, 50..cfg.forge_within.max(51)));
        }
        let mut net = VirtualNet::new(origin, links);
        for id in 0..cfg.nodes {
            net.add(endpoint(cfg, id, 1));
        }
        let nodes = (0..cfg.nodes)
            .map(|_| Node {
                incarnation: 1,
                sent_to: vec![0; cfg.nodes as usize],
                next_seq: vec![0; cfg.nodes as usize],
                read_scheduled: false,
                reassembly: BTreeMap::new(),
                unreliable_to: vec![0; cfg.nodes as usize],
            })
            .collect();
        for node in 0..cfg.nodes {
            let offset = net.link.rng.gen_range(0..ns(cfg.pace).max(1));
            net.timeline_mut().schedule(origin + Duration::from_nanos(offset), Ev::Tick { node });
        }
        for &(node, at) in &cfg.restarts {
            net.timeline_mut().schedule(origin + at, Ev::Restart { node });
        }
        for &(node, at) in &cfg.soft_losses {
            net.timeline_mut().schedule(origin + at, Ev::SoftLoss { node });
        }
        let moves = net.link.fabric.as_ref().map(|f| f.moves().to_vec()).unwrap_or_default();
        for (node, hops, at) in moves {
            net.timeline_mut().schedule(origin + at, Ev::Move { node, hops });
        }
        World {
            cfg,
            net,
            nodes,
            checker: Checker::default(),
            dead_stats: Stats::default(),
            soft_losses: 0,
            unreliable: UnreliableCheck::default(),
            nacked: NackedCheck::default(),
            settled: (0, Duration::ZERO),
        }
    }

    fn schedule(&mut self, after: Duration, ev: Ev) {
        let at = self.net.now() + after;
        self.net.timeline_mut().schedule(at, ev);
    }

    fn run(&mut self) -> u64 {
        let limit = self.net.timeline().origin() + self.cfg.time_limit;
        let mut events = 0;
        while let Some(step) = self.net.step(limit) {
            events += 1;
            let node = match step {
                // A datagram handed in (through the interface's injector
                // on its way) or the node's timers run.
                Step::Node(node) => node,
                Step::Nothing => continue, // a superseded wake-up
                Step::User(Ev::Release { node, rail, at }) => {
                    let (links, timeline, ep) = self.net.parts(node);
                    let i = links.nic(node, rail);
                    if links.release_at[i] != Some(at) {
                        continue; // superseded by a later scheduling
                    }
                    links.release_at[i] = None;
                    links.release(timeline, ep, rail);
                    node
                }
                Step::User(Ev::Tick { node }) => {
                    self.send_turn(node);
                    node
                }
                Step::User(Ev::Restart { node }) => {
                    self.restart(node);
                    node
                }
                Step::User(Ev::SoftLoss { node }) => {
                    self.lose_soft_state(node);
                    node
                }
                Step::User(Ev::Round(due)) => {
                    let (now, origin) = (self.net.now(), self.net.timeline().origin());
                    let (links, timeline, _) = self.net.parts(due.node);
                    let fabric = links.fabric.as_mut().expect("rounds only in a fabric");
                    let done = fabric.round(now, origin, due);
                    if let Some((at, next)) = done.next {
                        timeline.schedule(at, Ev::Round(next));
                    }
                    // What waited for the route found goes on it now.
                    for bytes in done.released {
                        links.carry(timeline, due.node, due.peer, due.rail, &bytes);
                    }
                    due.node
                }
                Step::User(Ev::Move { node, hops }) => {
                    let elapsed = self.net.timeline().elapsed();
                    let fabric = self.net.link.fabric.as_mut().expect("moves only in a fabric");
                    fabric.move_node(elapsed, node, hops);
                    node
                }
                Step::User(Ev::Read { node }) => {
                    self.nodes[node as usize].read_scheduled = false;
                    let max = self.cfg.reader_batch.unwrap_or(usize::MAX);
                    let app = &mut self.nodes[node as usize].reassembly;
                    read(&mut self.checker, node, self.net.ep_mut(node), max, app);
                    node
                }
            };
            self.after(node);
            // The streams' last word: a message delivered or failed.
            let settled = self.checker.delivered + self.checker.failed;
            if settled != self.settled.0 {
                self.settled = (settled, self.net.timeline().elapsed());
            }
        }
        events
    }

    /// One sending turn of the workload: a few messages to each peer,
    /// stopping at back-pressure, never dropping one.
    fn send_turn(&mut self, id: NodeId) {
        let now = self.net.now();
        let total = self.cfg.messages_per_stream;
        let mut more = false;
        for peer in (0..self.cfg.nodes).filter(|&p| p != id) {
            for _ in 0..BURST {
                let node = &mut self.nodes[id as usize];
                if node.sent_to[peer as usize] >= total {
                    break;
                }
                let seq = node.next_seq[peer as usize];
                let msg = message(&mut self.net.link.rng, seq, node.incarnation);
                // As the runtime sends: the fast path first (a message
                // joining others that wait changes no timer; the
                // endpoint's invariant checks hold it to that).
                let ep = self.net.ep_mut(id);
                match ep.join_waiting(peer, &msg).map_or_else(|| ep.send(now, peer, &msg), Ok) {
                    Ok(MessageId { seq: got, .. }) => {
                        debug_assert_eq!(got, seq);
                        node.next_seq[peer as usize] += 1;
                        node.sent_to[peer as usize] += 1;
                        self.checker.on_send((id, node.incarnation, peer), seq, &msg);
                    }
                    Err(SendError::WouldBlock) => break,
                    Err(e) => panic!("unexpected send error {e}"),
                }
            }
            more |= self.nodes[id as usize].sent_to[peer as usize] < total;
            // Beside the stream, one unreliable message a turn (as a
            // heartbeat would go), of a size drawn from the run's seed.
            if more && self.cfg.unreliable {
                let node = &mut self.nodes[id as usize];
                let n = node.unreliable_to[peer as usize];
                let len = self.net.link.rng.gen_range(24..=400);
                let msg = crate::unreliable::message(id, peer, node.incarnation, n, len);
                let inc = node.incarnation;
                if self.net.ep_mut(id).send_unreliable(peer, &msg) == Ok(true) {
                    self.nodes[id as usize].unreliable_to[peer as usize] += 1;
                    self.unreliable.on_send(id, inc, peer, n);
                }
                // And a NACK-reliable one (a request awaiting its answer).
                let ep = self.net.ep_mut(id);
                let seq = ep.nacked_next(peer).unwrap_or_default();
                let len = self.net.link.rng.gen_range(24..=400);
                let msg = crate::nacked::message(id, peer, inc, seq, len);
                if let Ok(got) = self.net.ep_mut(id).send_nacked(now, peer, &msg) {
                    debug_assert_eq!(got, seq);
                    self.nacked.on_send(id, inc, peer, seq);
                }
            }
        }
        if more {
            self.schedule(self.cfg.pace, Ev::Tick { node: id });
        }
    }

    /// The node crashes and comes back as a new incarnation.
    fn restart(&mut self, id: NodeId) {
        let node = &mut self.nodes[id as usize];
        let ep = self.net.ep_mut(id);
        while let Some(d) = ep.recv() {
            // A fragment not taken was not acknowledged either: its
            // message is in doubt at the sender, as the checker expects.
            if d.fragment.is_none() {
                self.checker.on_unread_at_crash(d.from, id, &d.message);
            }
        }
        node.reassembly.clear();
        for peer in (0..self.cfg.nodes).filter(|&p| p != id) {
            let key = (id, node.incarnation, peer);
            let ep = &*ep;
            let pending = (0..node.next_seq[peer as usize])
                .filter(|&seq| ep.message_state(MessageId { peer, seq }) == MessageState::Pending);
            self.checker.on_crash(key, pending);
            node.next_seq[peer as usize] = 0;
        }
        self.dead_stats.accumulate(ep.stats());
        node.incarnation += 1;
        self.net.replace(endpoint(self.cfg, id, node.incarnation));
    }

    /// The node's engine fails and a new one is built from its hard state:
    /// the same incarnation, every timer and estimate gone. In fragment mode
    /// (an engine process, docs/ENGINE.md) the engine's receive state dies
    /// too: deliveries not taken, segments held out of order; the new engine
    /// resumes each stream where the application stands.
    fn lose_soft_state(&mut self, id: NodeId) {
        let now = self.net.now();
        let mut snapshot = self.net.ep(id).snapshot();
        if self.cfg.proto.deliver_fragments {
            snapshot.deliveries.clear();
            let app = &self.nodes[id as usize].reassembly;
            for p in &mut snapshot.peers {
                p.recv.out_of_order.clear();
                p.recv.partial = None;
                match app.get(&p.node).and_then(|r| r.position()) {
                    Some(at) if at.incarnation == p.incarnation => {
                        p.recv.epoch = Some(at.epoch);
                        p.recv.delivered_upto = at.next;
                    }
                    // Nothing taken from this life of the peer: nothing of
                    // it was acknowledged either.
                    _ => {
                        p.recv.epoch = None;
                        p.recv.delivered_upto = 0;
                    }
                }
            }
        }
        let ep =
            Endpoint::restore(self.cfg.proto.clone(), snapshot, now).expect("simulation config is valid");
        self.net.replace(ep);
        self.soft_losses += 1;
        self.nacked.on_soft_loss(id, self.nodes[id as usize].incarnation);
    }

    /// After a node did anything: the network sends what it has; then
    /// deliveries and events go to the checker, before the network
    /// schedules its next timer.
    fn after(&mut self, id: NodeId) {
        let now = self.net.now();
        let (cfg, checker, node) = (self.cfg, &mut self.checker, &mut self.nodes[id as usize]);
        let unreliable = &mut self.unreliable;
        let nacked = &mut self.nacked;
        let mut down = Vec::new();
        // Under a cluster key a copy never arrives twice; without one the
        // network may duplicate a datagram, as it may UDP's.
        let once = cfg.proto.key.is_some();
        self.net.settle(id, |timeline, ep| {
            while let Some(u) = ep.recv_unreliable() {
                unreliable.on_receive(u.from, id, &u.message, once, &mut checker.violations);
            }
            while let Some(m) = ep.recv_nacked() {
                nacked.on_receive(id, &m, &mut checker.violations);
            }
            match cfg.reader_batch {
                None => read(checker, id, ep, usize::MAX, &mut node.reassembly),
                Some(_) => {
                    if ep.pending_deliveries() > 0 && !node.read_scheduled {
                        node.read_scheduled = true;
                        timeline.schedule(now + Duration::from_millis(1), Ev::Read { node: id });
                    }
                }
            }
            while let Some(ev) = ep.poll_event() {
                match ev {
                    Event::PeerUnreachable { failed }
                    | Event::PeerRestarted { failed, .. }
                    | Event::StreamReset { failed } => checker.on_failed(id, node.incarnation, failed),
                    Event::Nacked { peer, first, end, fate } => {
                        nacked.on_fate(id, node.incarnation, peer, first, end, fate)
                    }
                    // In a fabric, a path judged down has its route
                    // searched for again.
                    Event::PathChanged { peer, rail, to: tether_proto::PathState::Down, .. } => {
                        down.push((peer, rail))
                    }
                    // Reachability, paths and failovers change no guarantee.
                    _ => {}
                }
            }
        });
        if let Some(fabric) = self.net.link.fabric.as_mut() {
            let due: Vec<RoundDue> =
                down.into_iter().filter_map(|(peer, rail)| fabric.path_down(now, rail, id, peer)).collect();
            for due in due {
                self.net.timeline_mut().schedule(now, Ev::Round(due));
            }
        }
    }

    fn report(mut self, events: u64) -> SimReport {
        let (nodes, net) = (&self.nodes, &self.net);
        self.checker.finish(|(src, inc, dst), seq| {
            let n = &nodes[src as usize];
            (n.incarnation == inc).then(|| net.ep(src).message_state(MessageId { peer: dst, seq }))
        });
        let mut stats = self.dead_stats.clone();
        for ep in self.net.endpoints() {
            stats.accumulate(ep.stats());
        }
        let expected = self.cfg.messages_per_stream * self.cfg.nodes as u64 * (self.cfg.nodes as u64 - 1);
        self.unreliable.finish(stats.unreliable_sent, &mut self.checker.violations);
        self.nacked.finish(|src, inc| nodes[src as usize].incarnation == inc, &mut self.checker.violations);
        let unsent = expected - self.checker.sent();
        if unsent > 0 {
            self.checker.violations.push(Violation::NotConverged { pending: unsent });
        }
        let links = &mut self.net.link;
        for inj in &links.injectors {
            links.counters.faults.accumulate(&inj.counters());
        }
        let c = &self.checker;
        SimReport {
            seed: self.cfg.seed,
            mix: self.cfg.mix,
            config: self.cfg.to_string(),
            sent: c.sent(),
            delivered: c.delivered,
            failed: c.failed,
            in_doubt_delivered: c.in_doubt_delivered,
            lost_in_crash: c.lost_in_crash,
            soft_losses: self.soft_losses,
            engine_recoveries: 0,
            unread_at_crash: c.unread_at_crash,
            violations: c.violations.clone(),
            retransmits: stats.retransmits,
            checksum_failures: stats.checksum_failures,
            duplicates_discarded: stats.duplicates_discarded,
            stale_dropped: stats.stale_dropped,
            links: links.counters,
            stats,
            virtual_ms: ns(self.net.timeline().elapsed()) as f64 / 1e6,
            streams_ms: ns(self.settled.1) as f64 / 1e6,
            events,
            calls: None,
            membership: None,
            fabric: self.net.link.fabric.take().map(FabricNet::report),
        }
    }
}

/// The application at node `id` reads up to `max` deliveries: whole
/// messages, or fragments it reassembles (skipping any it already has: a
/// restored engine may deliver again what the application took).
fn read(
    checker: &mut Checker,
    id: NodeId,
    ep: &mut Endpoint,
    max: usize,
    app: &mut BTreeMap<NodeId, Reassembly>,
) {
    for _ in 0..max {
        let Some(d) = ep.recv() else { break };
        let Some(f) = d.fragment else {
            checker.on_deliver(d.from, id, &d.message);
            continue;
        };
        // A gap would be a lost fragment: the message it belonged to goes
        // to the checker short (or not at all), and it reports it.
        let r = app.entry(d.from).or_default();
        match r.take(&f, d.channel, &d.message, usize::MAX) {
            Assembled::Whole(message, _) => checker.on_deliver(d.from, id, &message),
            // The core never hands over a message's fragments out of
            // shape: the checker sees what came of it, and reports it.
            Assembled::Dropped(_) => checker.on_deliver(d.from, id, &[]),
            Assembled::Again | Assembled::Part => {}
        }
    }
}

impl Links<'_> {
    fn cut(&self, elapsed: Duration, a: NodeId, b: NodeId, rail: RailId) -> bool {
        self.cfg.cuts.iter().any(|c| {
            ((c.a, c.b) == (a, b) || !c.one_way && (c.a, c.b) == (b, a))
                && c.rail.is_none_or(|r| r == rail)
                && elapsed >= c.at
                && c.until.is_none_or(|u| elapsed < u)
        })
    }

    /// Do datagrams go through the nodes' injectors now? Faults strike
    /// until the safety phase ends; then links heal so every run can
    /// settle. Single-rail runs go through them until then; multi-rail
    /// runs only if they have message faults (a rail's own cuts and loss
    /// are the link's).
    fn through_injector(&self, elapsed: Duration) -> bool {
        elapsed < self.cfg.safety_phase && (self.cfg.rails <= 1 || !self.cfg.faults.rules.is_empty())
    }

    /// The injector of a node's interface on `rail`: one per rail, as each
    /// rail is a network card of its own (and so a held datagram keeps its rail).
    fn nic(&self, node: NodeId, rail: RailId) -> usize {
        node as usize * rails(self.cfg) + rail as usize
    }

    /// Hand a node's endpoint what its injector on `rail` has ready, and
    /// schedule the release of what it still holds.
    fn release(&mut self, timeline: &mut Timeline<Ev>, ep: &mut Endpoint, rail: RailId) {
        let (now, elapsed) = (timeline.now(), timeline.elapsed());
        let id = ep.node();
        let i = self.nic(id, rail);
        self.injectors[i].drain_ready(elapsed, |_, _, bytes| {
            ep.handle_datagram_on(now, rail, bytes);
            true
        });
        if let Some(due) = self.injectors[i].next_release() {
            let at = (timeline.origin() + due).max(now);
            if self.release_at[i] != Some(at) {
                self.release_at[i] = Some(at);
                timeline.schedule(at, Ev::Release { node: id, rail, at });
            }
        }
    }
}

impl Links<'_> {
    /// A datagram into the fabric: the route decides where it goes (or
    /// it waits for one); faults strike on the way in.
    fn carry(&mut self, timeline: &mut Timeline<Ev>, src: NodeId, dst: NodeId, rail: RailId, bytes: &[u8]) {
        let fabric = self.fabric.as_mut().expect("a fabric");
        match fabric.carry(timeline.now(), src, dst, rail, bytes) {
            Carried::To(to, took, tag) => {
                let at = timeline.now() + self.cfg.latency + took;
                timeline.send(at, Datagram { src, dst: to, rail, bytes: bytes.to_vec(), tag });
            }
            Carried::Held(Some(due)) => timeline.schedule(timeline.now(), Ev::Round(due)),
            Carried::Held(None) | Carried::Lost => {}
        }
    }
}

impl Link<Ev> for Links<'_> {
    fn transmit(&mut self, timeline: &mut Timeline<Ev>, sent: Sent<'_>) {
        let Sent { src, dst, rail, bytes: datagram, .. } = sent;
        let elapsed = timeline.elapsed();
        self.counters.datagrams += 1;
        if self.trace {
            eprintln!("{:>12} {src}->{dst} rail {rail} {}", ns(elapsed), describe(datagram));
        }
        let arrive = timeline.now() + self.cfg.latency;
        if self.fabric.is_some() {
            self.carry(timeline, src, dst, rail, datagram);
            return;
        }
        if let Some(forger) = &mut self.forger {
            if let Some((from, to, bytes)) = forger.on_pass(&mut self.rng, src, dst, datagram) {
                self.counters.forged += 1;
                timeline.send(arrive, Datagram { src: from, dst: to, rail, bytes, tag: 0 });
            }
        }
        let arrival = |dst, bytes| Datagram { src, dst, rail, bytes, tag: 0 };
        if self.cfg.rails > 1 {
            // Rail faults last the whole run: a lossy rail stays lossy.
            let loss = self.cfg.rail_loss.iter().find(|(r, _)| *r == rail).map_or(0.0, |(_, p)| *p);
            if self.cut(elapsed, src, dst, rail) || (loss > 0.0 && self.rng.gen_bool(loss)) {
                self.counters.cut += 1;
                return;
            }
            if !self.through_injector(elapsed) {
                timeline.send(arrive, arrival(dst, datagram.to_vec()));
                return;
            }
        } else if !self.through_injector(elapsed) {
            if self.cut(elapsed, src, dst, rail) {
                self.counters.cut += 1;
            } else {
                timeline.send(arrive, arrival(dst, datagram.to_vec()));
            }
            return;
        }
        // What leaves the sender's interface: nothing, the datagram, copies
        // of it, or an old datagram injected toward any peer.
        let mut out = Vec::new();
        let i = self.nic(src, rail);
        self.injectors[i].on_send(elapsed, dst, datagram, |to, bytes| out.push((to, bytes.to_vec())));
        for (to, bytes) in out {
            if self.cut(elapsed, src, to, rail) {
                self.counters.cut += 1;
            } else {
                timeline.send(arrive, arrival(to, bytes));
            }
        }
    }

    fn arrive(&mut self, timeline: &mut Timeline<Ev>, ep: &mut Endpoint, datagram: Datagram) {
        let Datagram { src, rail, bytes, tag, .. } = datagram;
        let elapsed = timeline.elapsed();
        if let Some(fabric) = &mut self.fabric {
            if !fabric.accept(rail, src, ep.node(), tag) {
                return; // by a route its sender gave up
            }
        }
        if self.through_injector(elapsed) {
            let i = self.nic(ep.node(), rail);
            self.injectors[i].on_recv(elapsed, Some(src), None, &bytes);
            self.release(timeline, ep, rail);
        } else {
            ep.handle_datagram_on(timeline.now(), rail, &bytes);
        }
    }
}

/// A node's endpoint, told that every rail leads to every other node.
/// Every invariant is checked after every operation: a broken one is a
/// panic, which `run` turns into a violation carrying the seed.
fn endpoint(cfg: &SimConfig, id: NodeId, incarnation: u64) -> Endpoint {
    let rails: Vec<RailId> = (0..cfg.rails.max(1)).collect();
    let peers = (0..cfg.nodes).filter(|&p| p != id);
    net::endpoint(cfg.proto.clone(), id, incarnation, peers, &rails)
}

/// Rails between every pair of nodes (at least one).
fn rails(cfg: &SimConfig) -> usize {
    usize::from(cfg.rails.max(1))
}

/// One line about a datagram, for traces.
fn describe(datagram: &[u8]) -> String {
    use std::fmt::Write;
    let Ok(p) = tether_wire::Packet::parse(datagram) else { return "unparseable".into() };
    let mut out = format!("epoch={} req={}", p.header.epoch, p.header.flags.ack_request());
    for f in p.frames() {
        let _ = match f {
            tether_wire::Frame::Data(d) => write!(
                out,
                " D{}{}{}",
                d.seq,
                if d.flags.first() { "F" } else { "" },
                if d.flags.last() { "L" } else { "" }
            ),
            tether_wire::Frame::Ack(a) => write!(
                out,
                " A{}/{}{:?}",
                a.epoch,
                a.cumulative,
                a.ranges().map(|r| (r.start, r.end)).collect::<Vec<_>>()
            ),
            tether_wire::Frame::Handshake(h) => {
                write!(out, " {:?}({:x},{})", h.kind, h.nonce, h.max_datagram)
            }
            tether_wire::Frame::Datagram(d) => write!(out, " U{}", d.payload.len()),
        };
    }
    out
}

/// Run one simulation. A panic anywhere in the core becomes a violation
/// carrying the seed, not a crash of the caller.
pub fn run(cfg: &SimConfig) -> SimReport {
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        match cfg.workload {
            crate::config::Workload::Calls => return crate::calls::run(cfg),
            crate::config::Workload::Engines => return crate::engines::run(cfg),
            crate::config::Workload::Membership => return crate::membership::run(cfg),
            crate::config::Workload::Streams => {}
        }
        let mut world = World::new(cfg);
        let events = world.run();
        world.report(events)
    }));
    outcome.unwrap_or_else(|panic| {
        let message = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        let mut report = SimReport::empty(cfg);
        report.violations.push(Violation::Panicked { message });
        report
    })
}
