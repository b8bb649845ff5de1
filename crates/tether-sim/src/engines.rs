//! The engine process itself in the simulator (docs/ENGINE.md, "Restore";
//! Zhou et al. [FTGM]'s recovery of a failed network interface): real
//! `tether_engine::Engine` loops on virtual rails, applications attached
//! to them through their real regions and Unix sockets with the real
//! client (`tether_attach::Client`), and engines killed and started again
//! at moments drawn from the seed. The `engine_state_loss` mix models an
//! engine's death inside the core; here the loop, its admission and
//! resumption, the application's backup and its resubmission all run.
//!
//! One thread and one clock. The world - engines, the network between
//! their rails, the kills - moves one tick at a time; the applications act
//! between ticks, and whenever a client waits (for its engine's answer,
//! for room in a ring, for a new engine after a kill) it waits on the
//! simulator's `Machine`, whose waiting is the world moving on. Nothing
//! reads the real clock, and the clients' secrets come from the seed: one
//! seed is one run. (The kernel is real: the Unix sockets, the shared
//! memory files in a scratch directory removed at the end.)
//!
//! The network is the address-based one an engine sees: each host's rail
//! `r` is an address, a datagram goes to the address its transport knows
//! for the destination node, and arrives after the link's latency through
//! the receiving rail's fault injector (the plan's loss, duplication,
//! reordering and corruption, until the safety phase ends). A dead
//! engine's addresses take nothing.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rand::{RngCore, SeedableRng};
use rand_pcg::Pcg64Mcg;
use tether_attach::{ready_now, Client, ClientOptions, EngineError, Machine};
use tether_engine::{Engine, EngineOptions, EngineSockets, Rail};
use tether_fault::{node_seed, Injector};
use tether_io::{RecvBatch, Transport, TransportCounters, TransportError};
use tether_proto::{Event, Instant, MessageId, NodeId, RailId, Stats};

use crate::checker::{message, Checker, Violation};
use crate::config::{SimConfig, HOSTS};
use crate::report::{LinkCounters, SimReport};

/// How far the world moves in one step.
const TICK: Duration = Duration::from_micros(10);
/// Virtual time starts at 1 s, as the engine's own clock does.
const ORIGIN_NS: u64 = 1_000_000_000;
/// Datagrams an address holds for its engine (a socket's buffer).
const INBOX: usize = 4096;
/// Messages an application offers each peer per turn.
const BURST: u64 = 2;
/// How long after everything settled the run goes on, for a late
/// duplicate or a delivery that should not come.
const QUIET: Duration = Duration::from_millis(5);

/// The datagrams between the rails: what waits at each address, and what
/// was sent since the world last routed.
#[derive(Default)]
struct Fabric {
    inboxes: BTreeMap<SocketAddr, VecDeque<(SocketAddr, Vec<u8>)>>,
    outbox: Vec<(SocketAddr, SocketAddr, Vec<u8>)>,
}

/// One engine rail on the fabric: an address, the nodes it knows, a
/// non-blocking send and receive as a UDP socket's.
struct VirtualRail {
    addr: SocketAddr,
    fabric: Arc<Mutex<Fabric>>,
    peers: BTreeMap<NodeId, SocketAddr>,
    counters: TransportCounters,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Transport for VirtualRail {
    fn local_addr(&self) -> Option<SocketAddr> {
        Some(self.addr)
    }

    fn has_peer(&self, node: NodeId) -> bool {
        self.peers.contains_key(&node)
    }

    fn peer_addr(&self, node: NodeId) -> Option<SocketAddr> {
        self.peers.get(&node).copied()
    }

    fn add_peer(&mut self, node: NodeId, addr: SocketAddr) -> Result<(), TransportError> {
        self.peers.insert(node, addr);
        Ok(())
    }

    fn send_to(&mut self, dst: NodeId, datagram: &[u8]) -> Result<(), TransportError> {
        let addr = *self.peers.get(&dst).ok_or(TransportError::InvalidEndpoint)?;
        self.send_to_addr(addr, datagram)
    }

    fn send_to_addr(&mut self, addr: SocketAddr, datagram: &[u8]) -> Result<(), TransportError> {
        lock(&self.fabric).outbox.push((self.addr, addr, datagram.to_vec()));
        self.counters.datagrams_sent += 1;
        self.counters.bytes_sent += datagram.len() as u64;
        Ok(())
    }

    fn recv_batch(&mut self, batch: &mut RecvBatch) -> Result<usize, TransportError> {
        batch.clear();
        let mut fabric = lock(&self.fabric);
        let Some(inbox) = fabric.inboxes.get_mut(&self.addr) else { return Ok(0) };
        while !batch.is_full() {
            let Some((from, bytes)) = inbox.pop_front() else { break };
            // The node the address belongs to, as a socket's book says it.
            let node = self.peers.iter().find(|(_, &a)| a == from).map(|(&n, _)| n);
            batch.push(node, Some(from), &bytes);
            self.counters.datagrams_received += 1;
            self.counters.bytes_received += bytes.len() as u64;
        }
        Ok(batch.len())
    }

    fn wait_readable(&mut self, _timeout: Option<Duration>) -> Result<bool, TransportError> {
        Ok(lock(&self.fabric).inboxes.get(&self.addr).is_some_and(|i| !i.is_empty()))
    }

    fn counters(&self) -> TransportCounters {
        self.counters
    }
}

/// A host: its engine (none while dead), and how to start one.
struct Host {
    options: EngineOptions,
    engine: Option<Engine>,
}

/// A datagram on a link, ordered by arrival and then by sending.
type InFlight = Reverse<(Duration, u64, SocketAddr, SocketAddr, Vec<u8>)>;

/// Everything but the applications: the engines, the network, the clock.
struct World {
    cfg: SimConfig,
    elapsed: Duration,
    clock: Arc<AtomicU64>,
    fabric: Arc<Mutex<Fabric>>,
    hosts: Vec<Host>,
    /// Which host and rail each address is.
    addrs: BTreeMap<SocketAddr, (usize, RailId)>,
    flight: BinaryHeap<InFlight>,
    order: u64,
    /// Each host's rail `r` receives through `injectors[host * rails + r]`.
    injectors: Vec<Injector>,
    /// Kills to come: when, which host, for how long.
    kills: VecDeque<(Duration, usize, Duration)>,
    /// Dead hosts and when each comes back.
    restores: Vec<(Duration, usize)>,
    counters: LinkCounters,
    violations: Vec<Violation>,
    restarted: u64,
    /// Counters of engines that died: what they did is not forgotten.
    dead_turns: u64,
    dead_stats: Stats,
}

/// Rail `r` of `host`.
fn address(host: usize, rail: RailId) -> SocketAddr {
    SocketAddr::from((Ipv4Addr::new(10, rail, 0, host as u8 + 1), 7000))
}

impl World {
    fn new(cfg: &SimConfig, dir: &Path, clock: Arc<AtomicU64>) -> Self {
        let rails = cfg.rails.max(1);
        let mut addrs = BTreeMap::new();
        let mut hosts = Vec::new();
        for h in 0..HOSTS {
            let binds: Vec<SocketAddr> = (0..rails).map(|r| address(h, r)).collect();
            for (r, &a) in binds.iter().enumerate() {
                addrs.insert(a, (h, r as RailId));
            }
            let mut options = EngineOptions::new(dir.join(format!("host{h}")), binds);
            options.config = cfg.proto.clone();
            // The self-test's timing adapts to what its probes cost on the
            // real clock: off, and the whole audit runs after every turn.
            options.selftest = None;
            // Nobody reads a simulated engine's board.
            options.publish_stats = false;
            hosts.push(Host { options, engine: None });
        }
        let injectors = (0..HOSTS)
            .flat_map(|h| (0..rails).map(move |r| (h, r)))
            .map(|(h, r)| {
                let seed = node_seed(cfg.seed, h as u32) ^ (r as u64).wrapping_mul(0xD1B5_4A32_D192_ED03);
                Injector::with_seed(&cfg.faults, seed).expect("simulation fault plan is valid")
            })
            .collect();
        let mut kills: Vec<_> = cfg.engine_kills.iter().map(|&(h, at, out)| (at, h as usize, out)).collect();
        kills.sort();
        World {
            cfg: cfg.clone(),
            elapsed: Duration::ZERO,
            clock,
            fabric: Arc::default(),
            hosts,
            addrs,
            flight: BinaryHeap::new(),
            order: 0,
            injectors,
            kills: kills.into(),
            restores: Vec::new(),
            counters: LinkCounters::default(),
            violations: Vec::new(),
            restarted: 0,
            dead_turns: 0,
            dead_stats: Stats::default(),
        }
    }

    fn now(&self) -> Instant {
        Instant::from_nanos(ORIGIN_NS) + self.elapsed
    }

    /// Start host `h`'s engine on fresh rails at its addresses.
    fn start(&mut self, h: usize) {
        let host = &mut self.hosts[h];
        let rails: Vec<Rail> = host
            .options
            .binds
            .iter()
            .map(|&addr| {
                lock(&self.fabric).inboxes.insert(addr, VecDeque::new());
                Box::new(VirtualRail {
                    addr,
                    fabric: self.fabric.clone(),
                    peers: BTreeMap::new(),
                    counters: TransportCounters::default(),
                }) as Rail
            })
            .collect();
        let started = EngineSockets::bind_with(&host.options, rails)
            .and_then(|s| Engine::with_sockets(host.options.clone(), s, None));
        match started {
            Ok(engine) => host.engine = Some(engine),
            Err(e) => self.violations.push(Violation::Panicked { message: format!("host {h}: engine: {e}") }),
        }
    }

    /// Kill host `h`'s engine as a crash does: its sockets and mappings
    /// go, and nothing more happens (no `Drop` in the engine writes
    /// anything); what waits at its addresses is lost.
    fn kill(&mut self, h: usize) {
        if let Some(engine) = self.hosts[h].engine.take() {
            self.dead_turns += engine.stats().turns;
            self.dead_stats.accumulate(&core_stats(&engine));
        }
        let mut fabric = lock(&self.fabric);
        for addr in &self.hosts[h].options.binds {
            fabric.inboxes.remove(addr);
        }
    }

    /// Move on one tick: kills and restarts due, datagrams due handed to
    /// their rails (through the injectors), every engine's turn and audit,
    /// then what they sent put on the links.
    fn step(&mut self) {
        self.elapsed += TICK;
        self.clock.store(self.elapsed.as_nanos() as u64, Ordering::SeqCst);
        while self.kills.front().is_some_and(|&(at, _, _)| at <= self.elapsed) {
            let (_, h, outage) = self.kills.pop_front().expect("front exists");
            if self.hosts[h].engine.is_some() {
                self.kill(h);
                self.restores.push((self.elapsed + outage, h));
            }
        }
        let elapsed = self.elapsed;
        let due: Vec<usize> =
            self.restores.iter().filter(|&&(at, _)| at <= elapsed).map(|&(_, h)| h).collect();
        self.restores.retain(|&(at, _)| at > elapsed);
        for h in due {
            self.start(h);
            self.restarted += 1;
        }
        self.arrive();
        let now = self.now();
        for (h, host) in self.hosts.iter_mut().enumerate() {
            let Some(engine) = &mut host.engine else { continue };
            engine.turn_at(now);
            if let Err(why) = engine.audit_all() {
                self.violations.push(Violation::Panicked { message: format!("host {h}: audit: {why}") });
            }
        }
        self.route();
    }

    /// Datagrams whose time came, into their rail's injector; then what
    /// each injector lets through, into its address's inbox.
    fn arrive(&mut self) {
        let faulty = self.elapsed < self.cfg.safety_phase && !self.cfg.faults.rules.is_empty();
        let rails = usize::from(self.cfg.rails.max(1));
        while self.flight.peek().is_some_and(|Reverse((at, ..))| *at <= self.elapsed) {
            let Reverse((_, _, from, to, bytes)) = self.flight.pop().expect("peeked");
            let Some(&(h, r)) = self.addrs.get(&to) else { continue };
            if faulty {
                self.injectors[h * rails + r as usize].on_recv(self.elapsed, None, Some(from), &bytes);
            } else {
                self.deliver(from, to, &bytes);
            }
        }
        for i in 0..self.injectors.len() {
            let to = address(i / rails, (i % rails) as RailId);
            let mut ready = Vec::new();
            self.injectors[i].drain_ready(self.elapsed, |_, addr, bytes| {
                ready.push((addr, bytes.to_vec()));
                true
            });
            for (from, bytes) in ready {
                if let Some(from) = from {
                    self.deliver(from, to, &bytes);
                }
            }
        }
    }

    /// Into the inbox at `to`, if an engine is there and it has room.
    fn deliver(&mut self, from: SocketAddr, to: SocketAddr, bytes: &[u8]) {
        let mut fabric = lock(&self.fabric);
        let Some(inbox) = fabric.inboxes.get_mut(&to) else {
            self.counters.cut += 1;
            return;
        };
        if inbox.len() >= INBOX {
            // Dropped as a full socket buffer would: counted with the
            // datagrams that found no engine (none expected at this size).
            self.counters.cut += 1;
            return;
        }
        inbox.push_back((from, bytes.to_vec()));
    }

    /// What the engines sent this tick, onto the links.
    fn route(&mut self) {
        let sent = std::mem::take(&mut lock(&self.fabric).outbox);
        for (from, to, bytes) in sent {
            self.counters.datagrams += 1;
            self.order += 1;
            self.flight.push(Reverse((self.elapsed + self.cfg.latency, self.order, from, to, bytes)));
        }
    }
}

/// Every application core's counters on `engine`, summed.
fn core_stats(engine: &Engine) -> Stats {
    let mut total = Stats::default();
    for node in engine.clients() {
        total.accumulate(&engine.core_stats(node).unwrap_or_default());
    }
    total
}

/// The simulator's machine for the clients: its clock is the world's,
/// and waiting moves the world.
struct SimMachine {
    world: Arc<Mutex<World>>,
    clock: Arc<AtomicU64>,
    entropy: Mutex<Pcg64Mcg>,
}

impl std::fmt::Debug for SimMachine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimMachine").field("now", &self.now()).finish()
    }
}

impl Machine for SimMachine {
    fn now(&self) -> Duration {
        Duration::from_nanos(self.clock.load(Ordering::SeqCst))
    }

    fn yield_now(&self) {
        lock(&self.world).step();
    }

    fn sleep_on(&self, fds: &mut [libc::pollfd], timeout: Duration) {
        let end = self.now() + timeout;
        while !ready_now(fds) && self.now() < end {
            lock(&self.world).step();
        }
    }

    fn entropy(&self, buf: &mut [u8]) -> std::io::Result<()> {
        lock(&self.entropy).fill_bytes(buf);
        Ok(())
    }

    fn watcher(&self) -> bool {
        false
    }
}

/// An application: its client and what it has sent to each peer.
struct App {
    node: NodeId,
    client: Option<Client>,
    /// Messages sent to each peer (by node).
    sent: BTreeMap<NodeId, u64>,
}

/// A scratch directory for the engines' sockets and the regions, removed
/// at the end of the run whatever happens. It lies in the process's run
/// directory (`tether_engine::owner::run_dir_name`), which a `tether sim`
/// interrupted removes, and the next tether command does if it was killed.
struct Scratch(PathBuf);

impl Scratch {
    fn new(seed: u64) -> std::io::Result<Self> {
        static RUNS: AtomicU64 = AtomicU64::new(0);
        let base = Path::new("/dev/shm");
        let base = if base.is_dir() { base.to_path_buf() } else { std::env::temp_dir() };
        let n = RUNS.fetch_add(1, Ordering::Relaxed);
        let run = tether_engine::owner::run_dir_name(std::process::id());
        let dir = base.join(run).join(format!("sim-{seed}-{n}"));
        tether_engine::owner::make_dir(&dir)?;
        Ok(Scratch(dir))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Run the engines mix of `cfg`: its applications stream to each other
/// through their engines while the engines are killed and restarted.
pub(crate) fn run(cfg: &SimConfig) -> SimReport {
    let scratch = match Scratch::new(cfg.seed) {
        Ok(s) => s,
        Err(e) => return failed(cfg, format!("scratch directory: {e}")),
    };
    let clock = Arc::new(AtomicU64::new(0));
    let world = Arc::new(Mutex::new(World::new(cfg, &scratch.0, clock.clone())));
    for h in 0..HOSTS {
        lock(&world).start(h);
    }
    let machine: Arc<dyn Machine> = Arc::new(SimMachine {
        world: world.clone(),
        clock,
        entropy: Mutex::new(Pcg64Mcg::seed_from_u64(cfg.seed ^ 0x656E_7472_6F70_7900)),
    });
    let mut rng = Pcg64Mcg::seed_from_u64(cfg.seed);
    let mut checker = Checker::default();
    let mut recoveries = 0;
    let mut apps = Vec::new();
    let mut problems: Vec<Violation> = Vec::new();
    for node in 0..cfg.nodes {
        let options = ClientOptions {
            machine: machine.clone(),
            incarnation: Some(1),
            ring_bytes: 1 << 20,
            spin: Duration::ZERO,
            linger: Duration::from_millis(100),
            peers: 8,
            recovery: Some(Duration::from_secs(2)),
            retain: true,
        };
        let dir = lock(&world).hosts[node as usize % HOSTS].options.dir.clone();
        match Client::attach(&dir, node, options) {
            Ok(c) => apps.push(App { node, client: Some(c), sent: BTreeMap::new() }),
            Err(e) => return failed(cfg, format!("node {node}: attach: {e}")),
        }
    }
    for a in &apps {
        let client = a.client.as_ref().expect("attached");
        for peer in (0..cfg.nodes).filter(|&p| p != a.node) {
            let binds = lock(&world).hosts[peer as usize % HOSTS].options.binds.clone();
            if let Err(e) = client.add_peer_rails(peer, &binds) {
                return failed(cfg, format!("node {}: peer {peer}: {e}", a.node));
            }
        }
    }
    let elapsed = || lock(&world).elapsed;
    let total = cfg.messages_per_stream;
    let mut next_turn = Duration::ZERO;
    let mut settled_at: Option<Duration> = None;
    while elapsed() < cfg.time_limit {
        lock(&world).step();
        if elapsed() < next_turn {
            continue;
        }
        next_turn = elapsed() + cfg.pace;
        for a in &mut apps {
            let Some(client) = &a.client else { continue };
            // What the watcher thread does in a real application.
            if let Err(e) = client.check_engine() {
                problems.push(Violation::Panicked { message: format!("node {}: engine: {e}", a.node) });
                a.client = None;
                continue;
            }
            if let Err(e) = turn(a, &mut rng, &mut checker, &mut recoveries, total, cfg.nodes) {
                problems.push(Violation::Panicked { message: format!("node {}: {e}", a.node) });
                a.client = None;
            }
        }
        let all_sent = apps.iter().all(|a| a.sent.values().sum::<u64>() == total * (cfg.nodes as u64 - 1));
        let idle = apps.iter().all(|a| a.client.as_ref().is_none_or(|c| c.unsettled() == 0));
        match settled_at {
            _ if !(all_sent && idle && elapsed() >= cfg.safety_phase) => settled_at = None,
            None => settled_at = Some(elapsed()),
            Some(at) if elapsed() >= at + QUIET => break,
            Some(_) => {}
        }
    }
    checker.finish(|(src, _, dst), seq| {
        let client = apps.get(src as usize)?.client.as_ref()?;
        Some(client.message_state(MessageId { peer: dst, seq }))
    });
    let stats = {
        let w = lock(&world);
        let mut stats = w.dead_stats.clone();
        for e in w.hosts.iter().filter_map(|h| h.engine.as_ref()) {
            stats.accumulate(&core_stats(e));
        }
        stats
    };
    let expected = total * cfg.nodes as u64 * (cfg.nodes as u64 - 1);
    if checker.sent() < expected {
        checker.violations.push(Violation::NotConverged { pending: expected - checker.sent() });
    }
    // Each client closes (lingering on the machine, so the world turns),
    // then the engines go; the scratch directory last.
    let closed: Vec<_> = apps.into_iter().filter_map(|a| a.client.map(|c| (a.node, c))).collect();
    for (node, c) in closed {
        if let Err(e) = c.close(Duration::from_millis(100)) {
            problems.push(Violation::Panicked { message: format!("node {node}: close: {e}") });
        }
    }
    let mut w = lock(&world);
    let w = &mut *w;
    for i in &w.injectors {
        w.counters.faults.accumulate(&i.counters());
    }
    let mut violations = std::mem::take(&mut checker.violations);
    violations.append(&mut w.violations);
    violations.append(&mut problems);
    let virtual_ms = w.elapsed.as_secs_f64() * 1e3;
    let events =
        w.dead_turns + w.hosts.iter().filter_map(|h| h.engine.as_ref()).map(|e| e.stats().turns).sum::<u64>();
    let report = SimReport {
        seed: cfg.seed,
        mix: cfg.mix,
        config: cfg.to_string(),
        sent: checker.sent(),
        delivered: checker.delivered,
        failed: checker.failed,
        in_doubt_delivered: checker.in_doubt_delivered,
        lost_in_crash: checker.lost_in_crash,
        soft_losses: w.restarted,
        engine_recoveries: recoveries,
        unread_at_crash: checker.unread_at_crash,
        violations,
        retransmits: stats.retransmits,
        checksum_failures: stats.checksum_failures,
        duplicates_discarded: stats.duplicates_discarded,
        stale_dropped: stats.stale_dropped,
        links: w.counters,
        stats,
        virtual_ms,
        // No NACK-reliable messages in this mix: the run ends with its streams.
        streams_ms: virtual_ms,
        events,
        calls: None,
        membership: None,
        fabric: None,
    };
    for h in &mut w.hosts {
        h.engine = None;
    }
    drop(scratch);
    report
}

/// One turn of an application: offer each peer a few messages (stopping
/// where its ring is full), take every delivery and every report.
fn turn(
    a: &mut App,
    rng: &mut Pcg64Mcg,
    checker: &mut Checker,
    recoveries: &mut u64,
    total: u64,
    nodes: u32,
) -> Result<(), EngineError> {
    let client = a.client.as_ref().expect("a live application");
    for peer in (0..nodes).filter(|&p| p != a.node) {
        for _ in 0..BURST {
            let seq = *a.sent.get(&peer).unwrap_or(&0);
            if seq >= total {
                break;
            }
            let msg = message(rng, seq, 1);
            match client.send(peer, &msg, Some(Duration::ZERO)) {
                Ok(MessageId { seq: got, .. }) => {
                    debug_assert_eq!(got, seq, "the client numbers messages as the simulator counts them");
                    checker.on_send((a.node, 1, peer), seq, &msg);
                    *a.sent.entry(peer).or_default() += 1;
                }
                Err(EngineError::Timeout) => break,
                Err(e) => return Err(e),
            }
        }
    }
    while let Some(d) = client.try_recv()? {
        checker.on_deliver(d.from, a.node, &d.message);
    }
    while let Some(ev) = client.poll_event()? {
        match ev {
            Event::PeerUnreachable { failed }
            | Event::PeerRestarted { failed, .. }
            | Event::StreamReset { failed } => checker.on_failed(a.node, 1, failed),
            Event::EngineRecovered { .. } => *recoveries += 1,
            // Reachability and paths change no guarantee.
            _ => {}
        }
    }
    Ok(())
}

/// A run that could not start.
fn failed(cfg: &SimConfig, message: String) -> SimReport {
    let mut r = SimReport::empty(cfg);
    r.violations.push(Violation::Panicked { message });
    r
}
