//! The discrete-event driver: a virtual clock, one seeded RNG, a network
//! of simulated links between real `tether_proto::Endpoint`s, a workload,
//! and the checker watching every delivery and failure report.
//!
//! Determinism: the only randomness is the run's `Pcg64Mcg`; events at the
//! same instant run in the order they were scheduled; nothing iterates an
//! unordered container. One seed is one exact replay.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Duration;

use rand::{Rng, RngCore, SeedableRng};
use rand_pcg::Pcg64Mcg;
use serde::Serialize;
use tether_fault::{node_seed, FaultCounters, Injector};
use tether_proto::{Endpoint, Event, Instant, MessageId, MessageState, NodeId, RailId, SendError, Stats};

use crate::checker::{Checker, Violation, MESSAGE_HEADER};
use crate::config::SimConfig;

/// What happened to datagrams on the links.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct LinkCounters {
    pub datagrams: u64,
    /// Lost to a cut link.
    pub cut: u64,
    /// What the nodes' fault injectors did, summed.
    pub faults: FaultCounters,
}

#[derive(Debug, Clone)]
pub struct SimReport {
    pub seed: u64,
    pub mix: &'static str,
    pub config: String,
    pub sent: u64,
    pub delivered: u64,
    pub failed: u64,
    pub in_doubt_delivered: u64,
    pub lost_in_crash: u64,
    /// Engines rebuilt from hard state (`SimConfig::soft_losses` that struck).
    pub soft_losses: u64,
    /// Messages delivered to a receiver's queue that crashed before reading them.
    pub unread_at_crash: u64,
    pub violations: Vec<Violation>,
    pub retransmits: u64,
    pub checksum_failures: u64,
    pub duplicates_discarded: u64,
    pub stale_dropped: u64,
    pub links: LinkCounters,
    /// Every core counter, summed over all endpoints (crashed ones included).
    pub stats: Stats,
    pub virtual_ms: f64,
    pub events: u64,
}

impl SimReport {
    pub fn ok(&self) -> bool {
        self.violations.is_empty()
    }
}

enum Ev {
    Arrive {
        src: NodeId,
        dst: NodeId,
        rail: RailId,
        bytes: Vec<u8>,
    },
    /// A node's injector holds delayed or reordered datagrams; the first
    /// is due now.
    Release {
        node: NodeId,
        rail: RailId,
        at: u64,
    },
    Wake {
        node: NodeId,
        at: u64,
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
}

struct Scheduled {
    at: u64,
    order: u64,
    ev: Ev,
}

impl PartialEq for Scheduled {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.order) == (o.at, o.order)
    }
}
impl Eq for Scheduled {}
impl PartialOrd for Scheduled {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Scheduled {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.at, self.order).cmp(&(o.at, o.order))
    }
}

struct Node {
    ep: Endpoint,
    incarnation: u64,
    wake_at: Option<u64>,
    /// Messages of the workload sent to each peer, over all incarnations.
    sent_to: Vec<u64>,
    /// Next message number toward each peer in this incarnation.
    next_seq: Vec<u64>,
    read_scheduled: bool,
}

/// Virtual time starts at 1 s so no core timestamp is zero.
const ORIGIN_NS: u64 = 1_000_000_000;
/// Messages a node sends to one peer per turn.
const BURST: u64 = 2;

struct World<'a> {
    cfg: &'a SimConfig,
    rng: Pcg64Mcg,
    queue: BinaryHeap<Reverse<Scheduled>>,
    order: u64,
    now: u64,
    nodes: Vec<Node>,
    checker: Checker,
    links: LinkCounters,
    /// Each node's network interface on each rail (`nic`): what it does to
    /// datagrams it sends and receives. Survives the node's restarts, as a
    /// NIC would.
    injectors: Vec<Injector>,
    /// When each injector's next release is scheduled.
    release_at: Vec<Option<u64>>,
    /// Counters of crashed incarnations, so nothing they did is forgotten.
    dead_stats: Stats,
    /// Engines rebuilt from hard state so far.
    soft_losses: u64,
    buf: Vec<u8>,
    /// `TETHER_SIM_TRACE` set: print every datagram sent (for debugging a seed).
    trace: bool,
}

fn ns(d: Duration) -> u64 {
    d.as_nanos() as u64
}

impl<'a> World<'a> {
    fn new(cfg: &'a SimConfig) -> Self {
        let nodes = (0..cfg.nodes)
            .map(|id| Node {
                ep: endpoint(cfg, id, 1),
                incarnation: 1,
                wake_at: None,
                sent_to: vec![0; cfg.nodes as usize],
                next_seq: vec![0; cfg.nodes as usize],
                read_scheduled: false,
            })
            .collect();
        let mut w = World {
            cfg,
            rng: Pcg64Mcg::seed_from_u64(cfg.seed),
            queue: BinaryHeap::new(),
            order: 0,
            now: 0,
            nodes,
            checker: Checker::default(),
            links: LinkCounters::default(),
            injectors: (0..cfg.nodes)
                .flat_map(|id| (0..rails(cfg)).map(move |rail| (id, rail)))
                .map(|(id, rail)| {
                    // Rail 0 keeps the seed a single-rail node has.
                    let seed = node_seed(cfg.seed, id) ^ (rail as u64).wrapping_mul(0xD1B5_4A32_D192_ED03);
                    Injector::with_seed(&cfg.faults, seed).expect("simulation fault plan is valid")
                })
                .collect(),
            release_at: vec![None; cfg.nodes as usize * rails(cfg)],
            dead_stats: Stats::default(),
            soft_losses: 0,
            buf: vec![0; tether_wire::MAX_DATAGRAM],
            trace: std::env::var_os("TETHER_SIM_TRACE").is_some(),
        };
        for node in 0..cfg.nodes {
            let offset = w.rng.gen_range(0..ns(cfg.pace).max(1));
            w.schedule(offset, Ev::Tick { node });
        }
        for &(node, at) in &cfg.restarts {
            w.schedule(ns(at), Ev::Restart { node });
        }
        for &(node, at) in &cfg.soft_losses {
            w.schedule(ns(at), Ev::SoftLoss { node });
        }
        w
    }

    fn schedule(&mut self, at: u64, ev: Ev) {
        self.order += 1;
        self.queue.push(Reverse(Scheduled { at, order: self.order, ev }));
    }

    fn instant(&self) -> Instant {
        Instant::from_nanos(ORIGIN_NS + self.now)
    }

    fn run(&mut self) -> u64 {
        let mut events = 0;
        while let Some(Reverse(s)) = self.queue.pop() {
            if s.at > ns(self.cfg.time_limit) {
                break;
            }
            self.now = s.at;
            events += 1;
            let now = self.instant();
            let node = match s.ev {
                Ev::Arrive { src, dst, rail, bytes } => {
                    if self.through_injector() {
                        let elapsed = self.elapsed();
                        let i = self.nic(dst, rail);
                        self.injectors[i].on_recv(elapsed, Some(src), &bytes);
                        self.release(dst, rail);
                    } else {
                        self.nodes[dst as usize].ep.handle_datagram_on(now, rail, &bytes);
                    }
                    dst
                }
                Ev::Release { node, rail, at } => {
                    let i = self.nic(node, rail);
                    if self.release_at[i] != Some(at) {
                        continue; // superseded by a later scheduling
                    }
                    self.release_at[i] = None;
                    self.release(node, rail);
                    node
                }
                Ev::Wake { node, at } => {
                    if self.nodes[node as usize].wake_at != Some(at) {
                        continue; // superseded by a later scheduling
                    }
                    self.nodes[node as usize].wake_at = None;
                    self.nodes[node as usize].ep.handle_timeout(now);
                    node
                }
                Ev::Tick { node } => {
                    self.send_turn(node);
                    node
                }
                Ev::Restart { node } => {
                    self.restart(node);
                    node
                }
                Ev::SoftLoss { node } => {
                    self.lose_soft_state(node);
                    node
                }
                Ev::Read { node } => {
                    self.nodes[node as usize].read_scheduled = false;
                    self.read(node, self.cfg.reader_batch.unwrap_or(usize::MAX));
                    node
                }
            };
            self.after(node);
        }
        events
    }

    /// One sending turn of the workload: a few messages to each peer,
    /// stopping at back-pressure, never dropping one.
    fn send_turn(&mut self, id: NodeId) {
        let now = self.instant();
        let total = self.cfg.messages_per_stream;
        let mut more = false;
        for peer in (0..self.cfg.nodes).filter(|&p| p != id) {
            for _ in 0..BURST {
                let node = &self.nodes[id as usize];
                if node.sent_to[peer as usize] >= total {
                    break;
                }
                let seq = node.next_seq[peer as usize];
                let msg = message(&mut self.rng, seq, node.incarnation);
                let node = &mut self.nodes[id as usize];
                match node.ep.send(now, peer, &msg) {
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
        }
        if more {
            self.schedule(self.now + ns(self.cfg.pace), Ev::Tick { node: id });
        }
    }

    /// The node crashes and comes back as a new incarnation.
    fn restart(&mut self, id: NodeId) {
        let node = &mut self.nodes[id as usize];
        while let Some(d) = node.ep.recv() {
            self.checker.on_unread_at_crash(d.from, id, &d.message);
        }
        for peer in (0..self.cfg.nodes).filter(|&p| p != id) {
            let key = (id, node.incarnation, peer);
            let ep = &node.ep;
            let pending = (0..node.next_seq[peer as usize])
                .filter(|&seq| ep.message_state(MessageId { peer, seq }) == MessageState::Pending);
            self.checker.on_crash(key, pending);
            node.next_seq[peer as usize] = 0;
        }
        self.dead_stats.accumulate(node.ep.stats());
        node.incarnation += 1;
        node.ep = endpoint(self.cfg, id, node.incarnation);
        node.wake_at = None;
    }

    /// The node's engine fails and a new one is built from its hard state:
    /// the same incarnation, every timer and estimate gone.
    fn lose_soft_state(&mut self, id: NodeId) {
        let now = self.instant();
        let node = &mut self.nodes[id as usize];
        let snapshot = node.ep.snapshot();
        node.ep =
            Endpoint::restore(self.cfg.proto.clone(), snapshot, now).expect("simulation config is valid");
        node.ep.set_invariant_checks(true);
        node.wake_at = None;
        self.soft_losses += 1;
    }

    /// After a node did anything: send what it has, hand deliveries and
    /// events to the checker, and schedule its next timer.
    fn after(&mut self, id: NodeId) {
        let now = self.instant();
        let mut buf = std::mem::take(&mut self.buf);
        while let Some(t) = self.nodes[id as usize].ep.poll_transmit(now, &mut buf) {
            self.transmit(id, t.dst, t.rail, &buf[..t.len]);
        }
        self.buf = buf;
        match self.cfg.reader_batch {
            None => self.read(id, usize::MAX),
            Some(_) => {
                let node = &mut self.nodes[id as usize];
                if node.ep.pending_deliveries() > 0 && !node.read_scheduled {
                    node.read_scheduled = true;
                    self.schedule(self.now + 1_000_000, Ev::Read { node: id });
                }
            }
        }
        let node = &mut self.nodes[id as usize];
        while let Some(ev) = node.ep.poll_event() {
            match ev {
                Event::PeerUnreachable { failed } | Event::PeerRestarted { failed, .. } => {
                    self.checker.on_failed(id, node.incarnation, failed)
                }
                Event::PeerReachable { .. } | Event::PathChanged { .. } | Event::FailedOver { .. } => {}
            }
        }
        if let Some(t) = node.ep.poll_timeout() {
            let at = t.as_nanos().saturating_sub(ORIGIN_NS).max(self.now);
            if node.wake_at != Some(at) {
                node.wake_at = Some(at);
                self.schedule(at, Ev::Wake { node: id, at });
            }
        }
    }

    /// The application reads up to `max` delivered messages.
    fn read(&mut self, id: NodeId, max: usize) {
        let node = &mut self.nodes[id as usize];
        for _ in 0..max {
            let Some(d) = node.ep.recv() else { break };
            self.checker.on_deliver(d.from, id, &d.message);
        }
    }

    fn cut(&self, a: NodeId, b: NodeId, rail: RailId) -> bool {
        self.cfg.cuts.iter().any(|c| {
            ((c.a, c.b) == (a, b) || (c.a, c.b) == (b, a))
                && c.rail.is_none_or(|r| r == rail)
                && self.now >= ns(c.at)
                && c.until.is_none_or(|u| self.now < ns(u))
        })
    }

    /// Faults strike until the safety phase ends; then links heal so
    /// every run can settle.
    fn faulty(&self) -> bool {
        self.now < ns(self.cfg.safety_phase)
    }

    /// Virtual time as the injectors count it.
    fn elapsed(&self) -> Duration {
        Duration::from_nanos(self.now)
    }

    /// Do datagrams go through the nodes' injectors now? Single-rail runs
    /// until the safety phase ends; multi-rail runs only if they have
    /// message faults (a rail's own cuts and loss are the link's).
    fn through_injector(&self) -> bool {
        self.faulty() && (self.cfg.rails <= 1 || !self.cfg.faults.rules.is_empty())
    }

    /// The injector of a node's interface on `rail`: one per rail, as each
    /// rail is a network card of its own (and so a held datagram keeps its rail).
    fn nic(&self, node: NodeId, rail: RailId) -> usize {
        node as usize * rails(self.cfg) + rail as usize
    }

    /// Hand a node's endpoint what its injector on `rail` has ready, and
    /// schedule the release of what it still holds.
    fn release(&mut self, id: NodeId, rail: RailId) {
        let (now, elapsed) = (self.instant(), self.elapsed());
        let i = self.nic(id, rail);
        let ep = &mut self.nodes[id as usize].ep;
        self.injectors[i].drain_ready(elapsed, |_, bytes| {
            ep.handle_datagram_on(now, rail, bytes);
            true
        });
        if let Some(due) = self.injectors[i].next_release() {
            let at = ns(due).max(self.now);
            if self.release_at[i] != Some(at) {
                self.release_at[i] = Some(at);
                self.schedule(at, Ev::Release { node: id, rail, at });
            }
        }
    }

    fn transmit(&mut self, src: NodeId, dst: NodeId, rail: RailId, datagram: &[u8]) {
        self.links.datagrams += 1;
        if self.trace {
            eprintln!("{:>12} {src}->{dst} rail {rail} {}", self.now, describe(datagram));
        }
        let arrive = self.now + ns(self.cfg.latency);
        if self.cfg.rails > 1 {
            // Rail faults last the whole run: a lossy rail stays lossy.
            let loss = self.cfg.rail_loss.iter().find(|(r, _)| *r == rail).map_or(0.0, |(_, p)| *p);
            if self.cut(src, dst, rail) || (loss > 0.0 && self.rng.gen_bool(loss)) {
                self.links.cut += 1;
                return;
            }
            if !self.through_injector() {
                self.schedule(arrive, Ev::Arrive { src, dst, rail, bytes: datagram.to_vec() });
                return;
            }
        } else if !self.through_injector() {
            if self.cut(src, dst, rail) {
                self.links.cut += 1;
            } else {
                self.schedule(arrive, Ev::Arrive { src, dst, rail, bytes: datagram.to_vec() });
            }
            return;
        }
        // What leaves the sender's interface: nothing, the datagram, copies
        // of it, or an old datagram injected toward any peer.
        let mut out = Vec::new();
        let elapsed = self.elapsed();
        let i = self.nic(src, rail);
        self.injectors[i].on_send(elapsed, dst, datagram, |to, bytes| out.push((to, bytes.to_vec())));
        for (to, bytes) in out {
            if self.cut(src, to, rail) {
                self.links.cut += 1;
            } else {
                self.schedule(arrive, Ev::Arrive { src, dst: to, rail, bytes });
            }
        }
    }

    fn report(mut self, events: u64) -> SimReport {
        let nodes = &self.nodes;
        self.checker.finish(|(src, inc, dst), seq| {
            let n = &nodes[src as usize];
            (n.incarnation == inc).then(|| n.ep.message_state(MessageId { peer: dst, seq }))
        });
        let mut stats = self.dead_stats.clone();
        for n in &self.nodes {
            stats.accumulate(n.ep.stats());
        }
        let expected = self.cfg.messages_per_stream * self.cfg.nodes as u64 * (self.cfg.nodes as u64 - 1);
        let unsent = expected - self.checker.sent();
        if unsent > 0 {
            self.checker.violations.push(Violation::NotConverged { pending: unsent });
        }
        for inj in &self.injectors {
            self.links.faults.accumulate(&inj.counters());
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
            unread_at_crash: c.unread_at_crash,
            violations: c.violations.clone(),
            retransmits: stats.retransmits,
            checksum_failures: stats.checksum_failures,
            duplicates_discarded: stats.duplicates_discarded,
            stale_dropped: stats.stale_dropped,
            links: self.links,
            stats,
            virtual_ms: self.now as f64 / 1e6,
            events,
        }
    }
}

/// A node's endpoint, told that every rail leads to every other node.
fn endpoint(cfg: &SimConfig, id: NodeId, incarnation: u64) -> Endpoint {
    let mut ep = Endpoint::new(cfg.proto.clone(), id, incarnation).expect("simulation config is valid");
    // Every invariant after every operation: a broken one is a panic,
    // which `run` turns into a violation carrying the seed.
    ep.set_invariant_checks(true);
    let rails: Vec<RailId> = (0..cfg.rails.max(1)).collect();
    for peer in (0..cfg.nodes).filter(|&p| p != id) {
        ep.set_paths(peer, &rails).expect("at most MAX_RAILS rails");
    }
    ep
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
        };
    }
    out
}

/// A workload message: sequence number and sender incarnation, then bytes
/// from the run's RNG; sizes mostly small, some multi-fragment, a few large.
fn message(rng: &mut Pcg64Mcg, seq: u64, incarnation: u64) -> Vec<u8> {
    let len = match rng.gen_range(0..100) {
        0..=69 => rng.gen_range(MESSAGE_HEADER..=256),
        70..=94 => rng.gen_range(1024..=8192),
        _ => rng.gen_range(20_000..=100_000),
    };
    let mut m = vec![0u8; len];
    m[..8].copy_from_slice(&seq.to_le_bytes());
    m[8..16].copy_from_slice(&incarnation.to_le_bytes());
    rng.fill_bytes(&mut m[MESSAGE_HEADER..]);
    m
}

/// Run one simulation. A panic anywhere in the core becomes a violation
/// carrying the seed, not a crash of the caller.
pub fn run(cfg: &SimConfig) -> SimReport {
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
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
        SimReport {
            seed: cfg.seed,
            mix: cfg.mix,
            config: cfg.to_string(),
            sent: 0,
            delivered: 0,
            failed: 0,
            in_doubt_delivered: 0,
            lost_in_crash: 0,
            soft_losses: 0,
            unread_at_crash: 0,
            violations: vec![Violation::Panicked { message }],
            retransmits: 0,
            checksum_failures: 0,
            duplicates_discarded: 0,
            stale_dropped: 0,
            links: LinkCounters::default(),
            stats: Stats::default(),
            virtual_ms: 0.0,
            events: 0,
        }
    })
}
