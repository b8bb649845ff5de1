//! The engine process's loop (docs/ENGINE.md, "Step 1 in detail"): one
//! process per node owns the UDP socket of every rail and runs one
//! protocol core per attached application, each application an endpoint
//! (a node id) of its own. It is the network card of Zhou et al. [FTGM]:
//! applications hand it work through shared memory and it does the
//! protocol.
//!
//! Each turn: take new attachments, notice applications that died, receive
//! on every rail and hand each datagram to the core its `dst_node` names
//! (identity from the source address, `Book::origin`), take each
//! application's submissions, run timers, publish completions (failures,
//! then settled marks, then deliveries), transmit, advance the heartbeat.
//! With nothing to do for `spin`, it sleeps in `poll` on every socket,
//! having raised each region's `engine_asleep` flag so applications ring
//! its doorbell.
//!
//! This module is the loop and what it orchestrates. The data path of each
//! application (submissions, completions, backups before sends) is
//! `application`'s, on the driver the embedded endpoint runs on too
//! (`tether-driver`); the control part is apart: admitting applications
//! (`admit`), resuming them with a new engine (`resume`), direct paths
//! (`pairs`), the audit and the self-test.

use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant as StdInstant};

use tether_attach::attach::{self, Doorbell};
use tether_attach::records::Completion;
use tether_attach::{is_probe_node, monotonic_ns, EngineCounters, EngineError};
use tether_driver::Driver;
use tether_fault::{node_seed, FaultCounters, FaultPlan, Side};
use tether_io::{AddressBook, FaultHandle, FaultyTransport, Transport, UdpTransport};
use tether_proto::{Config, Instant, NodeId, PayloadCursor, RailId, MAX_RAILS};
use tether_shm::Control;
use tether_wire::Header;
use tracing::{info, warn};

use crate::application::{completion, publish, take_submissions, transmit, Application, COUNTERS_EVERY};
use crate::audit::{AuditClock, Due, SLICE};
use crate::board::Board;
use crate::book::Book;
use crate::heartbeat::Heartbeat;
use crate::pairs::Pairs;
use crate::reclaim::Departed;
use crate::selftest::{SelfTest, SelfTestOptions, SelfTestStats};
use crate::stats::EngineStats;

/// Longest sleep without a deadline: a stop request is seen within it.
const IDLE_SLICE: Duration = Duration::from_millis(100);
/// How often a busy loop looks for new attachments and reads the
/// applications' connections (doorbells, a closed one): `accept4` on an
/// empty queue allocates and frees a socket, file and dentry in the kernel
/// (a third of a spinning engine's time in `perf`), and nothing there is
/// urgent: a sleeping loop wakes on them at once anyway.
const HOUSEKEEPING_EVERY: Duration = Duration::from_micros(500);

/// How an engine runs.
#[derive(Debug, Clone)]
pub struct EngineOptions {
    /// Where the engine's socket lives, and the applications' regions:
    /// a directory of this user's only, in `/dev/shm` for real use.
    pub dir: PathBuf,
    /// One UDP address per rail.
    pub binds: Vec<SocketAddr>,
    /// The protocol configuration every application's core runs with.
    pub config: Config,
    /// How long the loop keeps looking (yielding the core between looks)
    /// with nothing to do before it sleeps in `ppoll`; see
    /// `ClientOptions::spin` for why it yields.
    pub spin: Duration,
    /// Faults injected into what every rail receives (the same plans an
    /// embedded endpoint takes; receive-side rules only, see
    /// `check_faults`). Rail `r` draws from `node_seed(seed, r)`; a new
    /// engine after a crash starts the plan again.
    pub faults: FaultPlan,
    /// The adaptive concurrent self-test of the rails in use, with the
    /// audit of the engine's own state (`None`: both off).
    pub selftest: Option<SelfTestOptions>,
    /// Take requests to corrupt the engine's own state (`crate::hook`):
    /// for fault campaigns only. Refused by a build without the
    /// `fault-hook` feature.
    pub fault_hook: bool,
    /// Write each stream's marks to the application's backup blocks
    /// (docs/ENGINE.md, "Restore"). Off only to measure what the backup
    /// costs (`tether bench engine`): a new engine then has nothing to
    /// restore from, and applications that retain nothing either
    /// (`ClientOptions::retain`) do not wait for one.
    pub backup: bool,
    /// Publish the engine's counters and every application's peers and
    /// paths on a board in the directory (`engine.board`), for `tether
    /// stat` and the metrics exporter. Off in the simulator, whose
    /// engines nobody reads.
    pub publish_stats: bool,
}

impl EngineOptions {
    pub fn new(dir: impl Into<PathBuf>, binds: Vec<SocketAddr>) -> Self {
        EngineOptions {
            dir: dir.into(),
            binds,
            config: Config::default(),
            spin: Duration::from_millis(1),
            faults: FaultPlan::default(),
            selftest: Some(SelfTestOptions::default()),
            fault_hook: false,
            backup: true,
            publish_stats: true,
        }
    }
}

/// A rail: its UDP socket, or a simulator's virtual one; with the fault
/// plan's injector in front of it when there is one.
pub type Rail = Box<dyn Transport + Send>;

/// Wrap each socket in the fault plan (none: the sockets as they are).
fn rails_with_faults(
    rails: Vec<Rail>,
    plan: &FaultPlan,
) -> Result<(Vec<Rail>, Vec<FaultHandle>), EngineError> {
    check_faults(plan)?;
    let mut handles = Vec::new();
    let mut out: Vec<Rail> = Vec::new();
    for (r, rail) in rails.into_iter().enumerate() {
        if plan.rules.is_empty() {
            out.push(rail);
            continue;
        }
        let faulty = FaultyTransport::new(rail, plan, node_seed(plan.seed, r as u32))
            .map_err(|e| EngineError::Faults(e.to_string()))?;
        handles.push(faulty.handle());
        out.push(Box::new(faulty));
    }
    Ok((out, handles))
}

/// The engine injects on receive only. It sent to addresses when this was
/// written, which a send-side rule (keyed by destination node) could not
/// follow; it now sends by node id through its rails' transports, so
/// taking send-side rules is open, not yet done.
fn check_faults(plan: &FaultPlan) -> Result<(), EngineError> {
    plan.validate().map_err(|e| EngineError::Faults(e.to_string()))?;
    match plan.rules.iter().position(|r| r.side != Side::Recv) {
        Some(i) => Err(EngineError::Faults(format!(
            "rule {} acts on {:?}: the engine injects faults on receive only",
            i + 1,
            plan.rules[i].side
        ))),
        None => Ok(()),
    }
}

pub struct Engine {
    pub(crate) options: EngineOptions,
    pub(crate) listener: UnixListener,
    /// The rails, and the batching and bounds of their traffic (the
    /// embedded endpoint runs on the same driver).
    driver: Driver,
    /// The fault injectors' counters, one per faulted rail.
    faults: Vec<FaultHandle>,
    book: Book,
    pub(crate) clients: Vec<Application>,
    /// The self-test's datagram buffer.
    tx: Vec<u8>,
    scratch: Vec<u8>,
    origin: StdInstant,
    stop: Arc<AtomicBool>,
    pub(crate) stats: EngineStats,
    idle_since: Option<StdInstant>,
    /// When the next look at the listener and the connections is due
    /// (`HOUSEKEEPING_EVERY`; at once after a sleep).
    housekeeping_due: Instant,
    /// The supervisor's watch on this engine.
    heartbeat: Option<Heartbeat>,
    /// The socket file is this engine's to remove when it stops.
    owns_socket: bool,
    selftest: Option<SelfTest>,
    /// How the self-test failed, if it did: the engine stops.
    selftest_failed: Option<String>,
    /// When the audit of the engine's state is next due (with the self-test).
    audit: Option<AuditClock>,
    /// A pass over the buffered payloads under way: the application whose
    /// core is being checked, and where in it.
    payload_pass: Option<(NodeId, Option<PayloadCursor>)>,
    /// Where the rails are bound: a peer named at exactly these addresses
    /// is attached here, and gets a direct path (`crate::pairs`).
    own: Vec<SocketAddr>,
    pairs: Pairs,
    /// Applications whose connection closed, until their region is gone.
    departed: Departed,
    /// The board `tether stat` reads (`crate::board`).
    board: Option<Board>,
    #[cfg(feature = "fault-hook")]
    hook: Option<crate::hook::Hook>,
}

/// What an engine listens on: the rendezvous socket and one UDP socket per
/// rail. A supervisor binds them once and hands them to each engine it
/// starts.
pub struct EngineSockets {
    listener: UnixListener,
    rails: Vec<Rail>,
}

impl std::fmt::Debug for EngineSockets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let rails: Vec<_> = self.rails.iter().map(|r| r.local_addr()).collect();
        f.debug_struct("EngineSockets").field("listener", &self.listener).field("rails", &rails).finish()
    }
}

impl EngineSockets {
    /// Take the directory (created mode 0700 if missing; it must be this
    /// user's and no one else's to write), bind the socket and every rail.
    pub fn bind(options: &EngineOptions) -> Result<Self, EngineError> {
        Self::check(options)?;
        let listener = Self::listen(options)?;
        let rails = options
            .binds
            .iter()
            .map(|&b| UdpTransport::bind(b, AddressBook::new()).map(|udp| Box::new(udp) as Rail))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(EngineSockets { listener, rails })
    }

    /// Take the directory and bind the socket as `bind` does, over rails
    /// the caller made (one per `options.binds`, at those addresses): a
    /// simulator's virtual network.
    pub fn bind_with(options: &EngineOptions, rails: Vec<Rail>) -> Result<Self, EngineError> {
        Self::check(options)?;
        if rails.len() != options.binds.len() {
            return Err(EngineError::Rails { given: rails.len(), max: options.binds.len() });
        }
        Ok(EngineSockets { listener: Self::listen(options)?, rails })
    }

    /// The directory taken and the rendezvous socket bound in it.
    fn listen(options: &EngineOptions) -> Result<UnixListener, EngineError> {
        prepare_dir(&options.dir)?;
        let sock = attach::socket_path(&options.dir);
        if sock.exists() {
            if UnixStream::connect(&sock).is_ok() {
                return Err(EngineError::AlreadyRunning(options.dir.display().to_string()));
            }
            // Left by an engine that died: nobody answers on it.
            std::fs::remove_file(&sock)?;
        }
        // Nobody serves the directory now: what dead applications left
        // in it can go.
        let reclaimed = crate::reclaim::sweep(&options.dir);
        if reclaimed != Default::default() {
            info!(
                regions = reclaimed.regions,
                pairs = reclaimed.pairs,
                "reclaimed what dead applications left"
            );
        }
        let listener = UnixListener::bind(&sock)?;
        listener.set_nonblocking(true)?;
        Ok(listener)
    }

    /// What every engine checks before it binds anything.
    fn check(options: &EngineOptions) -> Result<(), EngineError> {
        check_faults(&options.faults)?;
        if options.binds.is_empty() || options.binds.len() > MAX_RAILS {
            return Err(EngineError::Rails { given: options.binds.len(), max: MAX_RAILS });
        }
        options.config.validate()?;
        Ok(())
    }

    /// The address each rail is bound at.
    pub fn rail_addrs(&self) -> Vec<SocketAddr> {
        self.rails.iter().filter_map(|r| r.local_addr()).collect()
    }
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("dir", &self.options.dir)
            .field("rails", &self.rail_addrs())
            .field("clients", &self.clients())
            .finish()
    }
}

impl Engine {
    /// Take the directory (created mode 0700 if missing; it must be this
    /// user's and no one else's), bind the socket and every rail.
    pub fn bind(options: EngineOptions) -> Result<Self, EngineError> {
        let sockets = EngineSockets::bind(&options)?;
        let mut engine = Engine::with_sockets(options, sockets, None)?;
        engine.owns_socket = true;
        Ok(engine)
    }

    /// An engine over sockets bound before (by a supervisor that keeps them
    /// across engines, so datagrams and attachments wait in them while an
    /// engine is replaced), advancing `heartbeat` if given.
    pub fn with_sockets(
        options: EngineOptions,
        sockets: EngineSockets,
        heartbeat: Option<Heartbeat>,
    ) -> Result<Self, EngineError> {
        let slot = options.config.max_datagram;
        let EngineSockets { listener, rails } = sockets;
        info!(dir = %options.dir.display(), rails = ?rails.iter().map(|r| r.local_addr()).collect::<Vec<_>>(), "engine up");
        let (rails, faults) = rails_with_faults(rails, &options.faults)?;
        let origin = StdInstant::now();
        let addrs: Vec<SocketAddr> = rails.iter().filter_map(|r| r.local_addr()).collect();
        let start = Instant::from_nanos(1_000_000_000);
        let selftest = options.selftest.map(|o| SelfTest::new(&options.config, &addrs, o, start));
        let audit = options.selftest.map(|o| AuditClock::new(o.every, start));
        #[cfg(feature = "fault-hook")]
        let hook = match options.fault_hook {
            true => Some(crate::hook::Hook::bind(&options.dir).map_err(EngineError::Io)?),
            false => None,
        };
        #[cfg(not(feature = "fault-hook"))]
        if options.fault_hook {
            return Err(EngineError::Faults("this build has no fault hook (the fault-hook feature)".into()));
        }
        // A board nobody can make is no reason not to serve: said, and
        // `tether stat` says nothing publishes.
        let board = match options.publish_stats {
            true => {
                Board::create(&options.dir).map_err(|e| warn!(error = %e, "no board for tether stat")).ok()
            }
            false => None,
        };
        Ok(Engine {
            driver: Driver::new(rails, slot),
            tx: vec![0; slot],
            scratch: Vec::new(),
            listener,
            faults,
            book: Book::default(),
            clients: Vec::new(),
            origin,
            stop: Arc::new(AtomicBool::new(false)),
            stats: EngineStats::default(),
            idle_since: None,
            housekeeping_due: start,
            heartbeat,
            owns_socket: false,
            selftest,
            selftest_failed: None,
            audit,
            payload_pass: None,
            own: addrs.clone(),
            pairs: Pairs::default(),
            departed: Departed::default(),
            board,
            #[cfg(feature = "fault-hook")]
            hook,
            options,
        })
    }

    /// Engines the supervisor replaced before this one, for the board.
    pub fn set_replaced_before(&mut self, n: u64) {
        self.stats.replaced_before = n;
    }

    /// What the fault plan did to what the rails received, summed.
    pub fn fault_counters(&self) -> FaultCounters {
        let mut total = FaultCounters::default();
        for h in &self.faults {
            total.accumulate(&h.snapshot());
        }
        total
    }

    /// The address each rail is bound at (port 0 resolved).
    pub fn rail_addrs(&self) -> Vec<SocketAddr> {
        self.driver.rails().iter().filter_map(|r| r.local_addr()).collect()
    }

    /// Set it to stop `run` within `IDLE_SLICE`.
    pub fn stop_flag(&self) -> Arc<AtomicBool> {
        self.stop.clone()
    }

    pub fn stats(&self) -> EngineStats {
        EngineStats { send_dropped: self.driver.dropped(), ..self.stats }
    }

    /// What the self-test did (zero if it is off).
    pub fn selftest_stats(&self) -> SelfTestStats {
        self.selftest.as_ref().map(|t| t.stats()).unwrap_or_default()
    }

    /// The self-test's stats, kept current while the engine runs (on
    /// another thread); `None` if it is off.
    pub fn selftest_watch(&self) -> Option<Arc<std::sync::Mutex<SelfTestStats>>> {
        self.selftest.as_ref().map(|t| t.watch())
    }

    /// Attached applications' node ids.
    pub fn clients(&self) -> Vec<NodeId> {
        self.clients.iter().map(|c| c.node).collect()
    }

    /// Protocol counters of the application attached as `node`.
    pub fn core_stats(&self, node: NodeId) -> Option<tether_proto::Stats> {
        self.clients.iter().find(|c| c.node == node).map(|c| c.core.stats().clone())
    }

    fn now(&self) -> Instant {
        Instant::from_nanos(1_000_000_000 + self.origin.elapsed().as_nanos() as u64)
    }

    /// Turn until stopped.
    pub fn run(&mut self) -> Result<(), EngineError> {
        while !self.stop.load(Ordering::Relaxed) {
            if let Some(why) = self.selftest_failed.take() {
                // Nothing more from this engine: its supervisor starts
                // another, which resumes from the applications' backups.
                return Err(EngineError::SelfTest(why));
            }
            if self.turn() {
                self.idle_since = None;
                continue;
            }
            let since = *self.idle_since.get_or_insert_with(StdInstant::now);
            if since.elapsed() >= self.options.spin {
                self.sleep()?;
                // Spinning is for the moments after work. A wake-up that
                // brings none (the watchdog's bound on a sleep, a timer
                // with nothing due) goes back to sleep at once.
                self.idle_since = StdInstant::now().checked_sub(self.options.spin);
            } else {
                std::thread::yield_now();
            }
        }
        // Detaching closes every connection: applications see the engine go.
        for c in self.clients.drain(..) {
            info!(node = c.node, "engine stopping: detached");
        }
        if self.owns_socket {
            let _ = std::fs::remove_file(attach::socket_path(&self.options.dir));
            let _ = std::fs::remove_file(self.options.dir.join(tether_attach::stat::ENGINE_BOARD));
        }
        Ok(())
    }

    /// One turn of the loop; true if it did anything.
    pub fn turn(&mut self) -> bool {
        self.turn_at(self.now())
    }

    /// One turn of the loop at `now` (a simulator's virtual time, which
    /// must not go back; `turn` reads the engine's clock).
    pub fn turn_at(&mut self, now: Instant) -> bool {
        self.stats.turns += 1;
        if let Some(h) = &self.heartbeat {
            h.beat();
        }
        #[cfg(feature = "fault-hook")]
        self.take_strikes();
        let housekeeping = now >= self.housekeeping_due;
        let mut busy = false;
        if housekeeping {
            self.housekeeping_due = now + HOUSEKEEPING_EVERY;
            busy |= self.accept();
        }
        busy |= self.receive(now) > 0;
        for i in 0..self.clients.len() {
            busy |= self.serve(i, now, housekeeping);
        }
        if let Err(why) = self.audit(now) {
            warn!(reason = %why, "state audit failed");
            self.selftest_failed = Some(format!("state audit: {why}"));
            return true;
        }
        if let Some(t) = &mut self.selftest {
            match t.turn(now, self.driver.rails_mut(), &mut self.tx) {
                Ok(did) => busy |= did,
                Err(why) => {
                    warn!(reason = %why, "self-test failed");
                    self.selftest_failed = Some(why);
                    return true;
                }
            }
        }
        self.pair_up();
        let before = self.clients.len();
        let departed = &mut self.departed;
        self.clients.retain(|c| {
            if c.gone {
                info!(node = c.node, pid = c.pid, "application detached");
                departed.watch(c.pid, c.path.clone());
            }
            !c.gone
        });
        self.stats.detached += (before - self.clients.len()) as u64;
        if housekeeping {
            self.stats.reclaimed_regions += self.departed.check() as u64;
            // The rails' addresses are looked up only when a snapshot is due.
            if self.board.as_ref().is_some_and(|b| b.is_due(now)) {
                let rails = self.rail_addrs();
                if let Some(board) = &mut self.board {
                    board.publish_due(now, &self.stats, &rails, self.heartbeat.is_some(), &self.clients);
                }
            }
        }
        busy
    }

    /// The audit of the engine's own state (`crate::audit`): corruption
    /// the core found on use (`integrity_faults`) at once; the
    /// streams' bookkeeping and the address book when due; every buffered
    /// payload at the self-test's interval.
    fn audit(&mut self, now: Instant) -> Result<(), String> {
        let Some(clock) = &mut self.audit else { return Ok(()) };
        for c in &self.clients {
            let found = c.core.stats().integrity_faults;
            if found > 0 {
                return Err(format!(
                    "node {}: its core found its own state corrupted ({found} times)",
                    c.node
                ));
            }
        }
        let due = clock.due(now);
        let slice = clock.deep_may_run(now);
        if due == Due::Deep && self.payload_pass.is_none() {
            self.payload_pass = serving(&self.clients).next().map(|c| (c.node, None));
        }
        // What each depth costs, for its share (`audit::SHARE`) and for
        // `EngineCounters::audit_ns`; the clock is read only when there is
        // work, not on every turn.
        if self.payload_pass.is_some() && slice {
            let started = StdInstant::now();
            let result = self.audit_payloads();
            let took = started.elapsed();
            self.stats.audit_ns += took.as_nanos() as u64;
            if let Some(clock) = &mut self.audit {
                clock.deep_took(took);
            }
            result?;
        }
        if due == Due::Nothing {
            return Ok(());
        }
        let started = StdInstant::now();
        let result = self.audit_quick();
        let took = started.elapsed();
        self.stats.audit_ns += took.as_nanos() as u64;
        if let Some(clock) = &mut self.audit {
            clock.quick_took(now, took);
        }
        result
    }

    /// The whole audit at once: the address book, every application's
    /// streams and every payload buffered. A running engine does it in
    /// slices (`audit`); a simulator does it after every turn.
    pub fn audit_all(&mut self) -> Result<(), String> {
        self.audit_quick()?;
        for c in serving(&self.clients) {
            let mut at = None;
            while let Some(next) =
                c.core.audit_payloads(at, SLICE).map_err(|fault| format!("node {}: {fault}", c.node))?
            {
                at = Some(next);
            }
        }
        Ok(())
    }

    /// The streams' bookkeeping and the address book.
    fn audit_quick(&mut self) -> Result<(), String> {
        self.book.audit().map_err(|why| format!("address book: {why}"))?;
        let driver = &self.driver;
        self.book
            .agrees_with(|node, rail| match driver.rail(rail) {
                Some(t) if t.has_peer(node) => Ok(t.peer_addr(node)),
                _ => Err(()),
            })
            .map_err(|why| format!("address book: {why}"))?;
        for c in serving(&self.clients) {
            c.core.audit().map_err(|fault| format!("node {}: {fault}", c.node))?;
        }
        Ok(())
    }

    fn audit_payloads(&mut self) -> Result<(), String> {
        let Some((node, at)) = self.payload_pass else { return Ok(()) };
        let mut rest = serving(&self.clients).skip_while(|c| c.node != node);
        let pass = match rest.next() {
            None => None,
            Some(c) => match c.core.audit_payloads(at, SLICE) {
                Err(fault) => return Err(format!("node {}: {fault}", c.node)),
                Ok(Some(at)) => Some((node, Some(at))),
                Ok(None) => rest.next().map(|c| (c.node, None)),
            },
        };
        self.payload_pass = pass;
        Ok(())
    }

    /// Requests of the fault hook (`crate::hook`), answered.
    #[cfg(feature = "fault-hook")]
    fn take_strikes(&mut self) {
        let Some(hook) = &self.hook else { return };
        while let Some(r) = hook.take() {
            let mut draw = tether_proto::fault_hook::Draw::new(r.seed);
            let answer = if r.target == "book" {
                match self.book.flip(&mut draw) {
                    Ok(what) => format!("flipped book: {what}"),
                    Err(why) => format!("none: {why}"),
                }
            } else if let Some(target) = tether_proto::fault_hook::StateTarget::parse(&r.target) {
                let serving: Vec<usize> =
                    (0..self.clients.len()).filter(|&i| self.clients[i].resuming.is_none()).collect();
                if serving.is_empty() {
                    "none: no application attached".to_string()
                } else {
                    let i = serving[draw.below(serving.len() as u64) as usize];
                    let c = &mut self.clients[i];
                    match c.core.flip_state(target, draw.next_u64()) {
                        Ok(what) => format!("flipped {}: node {}, {what}", r.target, c.node),
                        Err(why) => format!("none: node {}: {why}", c.node),
                    }
                }
            } else {
                format!("none: unknown target {:?}", r.target)
            };
            info!(request = %r.target, %answer, "fault hook");
            hook.reply(&r, &answer);
        }
    }

    /// Receive on every rail (up to the driver's budget); hand each
    /// datagram to the core its header names, with the sender as the
    /// address book proves it (never the header alone).
    fn receive(&mut self, now: Instant) -> usize {
        let Engine { driver, clients, book, selftest, stats, heartbeat, .. } = self;
        let beat = heartbeat.as_ref();
        let received = driver.receive(now, |rail, seen, datagram| {
            // Who sent it is the book's to say, from the source address:
            // an address may host many nodes, so the transport's own
            // guess (`seen.from`, `Seen::origin`) is not used here.
            let (Some(addr), Some((src, dst))) = (seen.addr, Header::peek_nodes(datagram)) else { return };
            if is_probe_node(dst) {
                if let Some(t) = selftest {
                    t.handle_datagram(now, rail, addr, dst, datagram);
                }
                return;
            }
            let Some(c) = clients.iter_mut().find(|c| c.node == dst && c.resuming.is_none()) else {
                // No one, or one still resuming: lost like any datagram,
                // and sent again.
                stats.unknown_destination += 1;
                return;
            };
            c.core.handle_datagram_from(now, rail, book.origin(rail, addr, src), datagram);
        });
        if received > 0 {
            // Work is progress, not a hang: the heartbeat says so (once a
            // turn's receive, which the driver's budget keeps short; not
            // once a datagram, a write to a line the supervisor reads).
            beat.inspect(|h| h.beat());
        }
        let backlog = driver.backlog();
        for c in clients.iter_mut() {
            c.core.set_backlog(backlog);
            while let Some(m) = c.core.poll_moved() {
                book.moved(m.node, m.rail, m.addr);
                driver.follow(&m);
            }
        }
        received
    }

    /// Everything for one application this turn; true if anything happened.
    /// `housekeeping`: read its connection too (doorbells, a close).
    fn serve(&mut self, i: usize, now: Instant, housekeeping: bool) -> bool {
        let Engine { clients, book, driver, scratch, stats, heartbeat, selftest, faults, own, .. } = self;
        let beat = heartbeat.as_ref();
        let c = &mut clients[i];
        c.region.control.heartbeat().fetch_add(1, Ordering::Relaxed);
        if housekeeping && attach::check(&mut c.conn) == Doorbell::Closed {
            // The application exited or died: its peers see the silence
            // of a crashed application, as with an embedded engine.
            c.gone = true;
            return true;
        }
        let mut busy = take_submissions(c, book, driver, own, stats, now, beat);
        if c.resuming.is_some() {
            // The core waits for everything the application resubmits.
            return busy;
        }
        if c.core.poll_timeout().is_some_and(|t| t <= now) {
            c.core.handle_timeout(now);
            busy = true;
        }
        let published = publish(c, scratch);
        busy |= published;
        if now >= c.counters_due {
            c.counters_due = now + COUNTERS_EVERY;
            // The engine's injectors, which every application it serves
            // shares: what they did to what this engine received.
            let mut injected = FaultCounters::default();
            for h in faults.iter() {
                injected.accumulate(&h.snapshot());
            }
            let selftest = selftest.as_ref().map(|t| t.stats()).unwrap_or_default();
            let checks = EngineCounters {
                selftest_probes: selftest.probes,
                selftest_passed: selftest.passed,
                selftest_ns: selftest.busy_ns,
                audit_ns: stats.audit_ns,
            };
            c.publish_counters(injected, checks, scratch);
        }
        if published && Control::should_wake(c.region.control.client_waiting()) {
            attach::ring(&mut c.conn);
        }
        let sent = transmit(c, driver, now, beat);
        busy |= sent.datagrams > 0;
        if let (Some(t), true) = (selftest, sent.rails != 0) {
            for rail in (0..MAX_RAILS as RailId).filter(|r| sent.rails & (1 << r) != 0) {
                t.saw_traffic(rail, sent.full & (1 << rail) != 0);
            }
        }
        if let Some(deadline) = c.closing {
            // Settled, the ACKs it owes for what its peers sent go out too,
            // as an embedded endpoint's close lets them (four ACK delays at
            // most: a peer still streaming to it keeps it owing): detached
            // at once, a peer's last message was never acknowledged, and
            // its sender's own close reported it unsettled.
            let settled = c.core.unsettled() == 0;
            if settled && c.acks_by.is_none() {
                c.acks_by = Some(now + 4 * c.core.config().ack_delay);
            }
            let acked = !c.core.owes_acks() || c.acks_by.is_some_and(|t| now >= t);
            if (settled && acked) || now >= deadline {
                info!(node = c.node, unsettled = c.core.unsettled(), "application closed");
                c.gone = true;
            }
        }
        busy
    }

    /// Nothing to do: raise every region's flag, look once more, then
    /// sleep on every socket until a datagram, a doorbell, an attachment
    /// or the next deadline.
    fn sleep(&mut self) -> Result<(), EngineError> {
        for c in &mut self.clients {
            // Submissions behind a stalled one are not work: they wait for
            // room in the core's send buffer, which ACKs on the rails or a
            // timer bring, and both end the sleep. (Looking for them kept
            // a sending engine turning without a sleep, most of a core, as
            // long as its application was ahead of the network.)
            let work = || !c.stalled && !c.region.submissions.is_empty();
            if Control::before_sleep(c.region.control.engine_asleep(), work) {
                self.lower_flags();
                return Ok(());
            }
        }
        let now = self.now();
        let selftest = self.selftest.as_ref().and_then(|t| t.poll_timeout());
        let deadline = self
            .clients
            .iter()
            .filter_map(|c| c.core.poll_timeout().into_iter().chain(c.closing).chain(c.acks_by).min())
            .chain(selftest)
            .min()
            .map(|t| Duration::from_nanos(t.saturating_since(now).as_nanos() as u64));
        // A datagram the fault plan holds back (delay, reorder) is due then.
        let held = self.driver.next_wakeup();
        let mut timeout = deadline.into_iter().chain(held).min().unwrap_or(IDLE_SLICE).min(IDLE_SLICE);
        if let Some(h) = &self.heartbeat {
            timeout = timeout.min(h.max_sleep().max(Duration::from_micros(100)));
        }
        let mut fds: Vec<libc::pollfd> =
            Vec::with_capacity(1 + self.driver.rail_count() + self.clients.len());
        let fd = |fd: i32| libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
        // Datagrams a full socket left in the driver go out once it has
        // room: that wakes the loop too.
        let rail_events = if self.driver.pending() > 0 { libc::POLLIN | libc::POLLOUT } else { libc::POLLIN };
        fds.push(fd(self.listener.as_raw_fd()));
        fds.extend(self.driver.rails().iter().filter_map(|r| r.raw_fd()).map(|f| libc::pollfd {
            fd: f,
            events: rail_events,
            revents: 0,
        }));
        fds.extend(self.clients.iter().map(|c| fd(c.conn.as_raw_fd())));
        #[cfg(feature = "fault-hook")]
        fds.extend(self.hook.as_ref().map(|h| fd(h.raw_fd())));
        if let Some(h) = &self.heartbeat {
            h.sleeping(monotonic_ns() + timeout.as_nanos() as u64);
        }
        let slept = attach::sleep_on(&mut fds, timeout);
        if let Some(h) = &self.heartbeat {
            h.sleeping(0);
        }
        // Whatever woke it (an attachment, a doorbell, a close) is read now.
        self.housekeeping_due = self.now();
        self.lower_flags();
        Ok(slept?)
    }

    /// The direct paths between applications attached here (docs/ENGINE.md,
    /// "The direct path"): laid out for the peers applications asked for,
    /// laid anew for an application that attached as a new life, closed
    /// for one that went; and doorbells rung for sleepers on them.
    fn pair_up(&mut self) {
        for i in 0..self.clients.len() {
            let node = self.clients[i].node;
            if self.clients[i].gone {
                continue;
            }
            // A pair's rings are as large as the asking side's own.
            let capacity = self.clients[i].region.header.submission_capacity as usize;
            if std::mem::take(&mut self.clients[i].fresh) {
                for (other, generation) in self.pairs.renew(&self.options.dir, node, capacity) {
                    self.tell_local(node, other, generation);
                }
            }
            for peer in std::mem::take(&mut self.clients[i].local_requests) {
                match self.pairs.open(&self.options.dir, node, peer, capacity) {
                    Ok(generation) => self.tell_local(node, peer, generation),
                    Err(e) => {
                        // No direct path: through the rails after all, as
                        // any peer (UDP to the engine's own address).
                        warn!(node, peer, error = %e, "direct path not laid out: through the rails");
                        let own = self.own.clone();
                        let c = &mut self.clients[i];
                        if let Err(why) = c.add_remote_peer(&mut self.book, &mut self.driver, peer, &own) {
                            c.broke(&mut self.stats, &why);
                        }
                    }
                }
                let c = &mut self.clients[i];
                c.control_out.push_back(completion(&Completion::PeerAdded { peer }));
            }
            for peer in std::mem::take(&mut self.clients[i].wakes) {
                if let Some(o) = self.live_mut(peer) {
                    attach::ring(&mut o.conn);
                }
            }
        }
        // Last, so one that broke above is counted: those about to be
        // detached close their paths, and the survivors are told.
        let gone: Vec<NodeId> = self.clients.iter().filter(|c| c.gone).map(|c| c.node).collect();
        for node in gone {
            for other in self.pairs.gone(&self.options.dir, node) {
                if let Some(o) = self.live_mut(other) {
                    o.control_out.push_back(completion(&Completion::LocalGone { peer: node }));
                }
            }
        }
    }

    /// The application attached as `node`, unless it is going.
    fn live_mut(&mut self, node: NodeId) -> Option<&mut Application> {
        self.clients.iter_mut().find(|c| c.node == node && !c.gone)
    }

    /// Tell both sides of a direct path where it is (the side that asked
    /// first; the other too, if attached, which maps it on sight).
    fn tell_local(&mut self, a: NodeId, b: NodeId, generation: u64) {
        for (me, peer) in [(a, b), (b, a)] {
            if let Some(c) = self.live_mut(me) {
                c.control_out.push_back(completion(&Completion::Local { peer, generation }));
            }
        }
    }

    fn lower_flags(&mut self) {
        for c in &self.clients {
            c.region.control.engine_asleep().store(0, Ordering::SeqCst);
        }
    }
}

/// The applications served now (not resuming), in attachment order.
fn serving(clients: &[Application]) -> impl Iterator<Item = &Application> + '_ {
    clients.iter().filter(|c| c.resuming.is_none())
}

/// Create the directory (0700) or check the one there: ours, and no one
/// else's to write.
fn prepare_dir(dir: &Path) -> Result<(), EngineError> {
    if !dir.exists() {
        tether_attach::owner::make_dir(dir)?;
    }
    let meta = std::fs::metadata(dir)?;
    if meta.uid() != attach::my_uid() || meta.permissions().mode() & 0o022 != 0 {
        return Err(EngineError::Io(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!("{} must belong to this user and be writable by no one else", dir.display()),
        )));
    }
    Ok(())
}
