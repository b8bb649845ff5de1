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

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant as StdInstant};

use bytes::Bytes;
use tether_driver::Driver;
use tether_fault::{node_seed, FaultCounters, FaultPlan, Side};
use tether_io::{AddressBook, FaultHandle, FaultyTransport, Transport, UdpTransport};
use tether_proto::{
    Channel, Config, Endpoint as Core, Event, FailReason, Instant, MessageId, NodeId, PayloadCursor, RailId,
    ResumedStream, SendError, StreamMarks, Unsettled, MAX_RAILS,
};
use tether_shm::{ClientRegion, Control, ShmError, StreamBackup};
use tether_wire::Header;
use tracing::{debug, info, warn};

use crate::audit::{AuditClock, Due, SLICE};
use crate::book::Book;
use crate::pairs::Pairs;
use crate::selftest::{SelfTest, SelfTestOptions, SelfTestStats};
use tether_attach::attach::{self, Doorbell};
use tether_attach::is_probe_node;
use tether_attach::monotonic_ns;
use tether_attach::records::{Completion, Submission, Taken};
use tether_attach::EngineCounters;
use tether_attach::EngineError;

/// Submissions taken from one application per turn, so one busy
/// application cannot starve the others or the network.
const SUBMISSIONS_PER_TURN: usize = 256;
/// How often an application's protocol counters are published to it
/// (when they changed): `Endpoint::stats` in engine mode.
const COUNTERS_EVERY: Duration = Duration::from_millis(50);
/// Applications one engine serves at most.
pub const MAX_CLIENTS: usize = 256;
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
    /// embedded endpoint takes; receive-side rules only, since the engine
    /// sends to addresses). Rail `r` draws from `node_seed(seed, r)`; a new
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
        }
    }
}

/// A rail's socket, with the fault plan's injector in front of it when
/// there is one.
type Rail = Box<dyn Transport + Send>;

/// Wrap each socket in the fault plan (none: the sockets as they are).
fn rails_with_faults(
    rails: Vec<UdpTransport>,
    plan: &FaultPlan,
) -> Result<(Vec<Rail>, Vec<FaultHandle>), EngineError> {
    check_faults(plan)?;
    let mut handles = Vec::new();
    let mut out: Vec<Rail> = Vec::new();
    for (r, udp) in rails.into_iter().enumerate() {
        if plan.rules.is_empty() {
            out.push(Box::new(udp));
            continue;
        }
        let faulty = FaultyTransport::new(udp, plan, node_seed(plan.seed, r as u32))
            .map_err(|e| EngineError::Faults(e.to_string()))?;
        handles.push(faulty.handle());
        out.push(Box::new(faulty));
    }
    Ok((out, handles))
}

/// The engine injects on receive only: it sends to addresses, which a
/// send-side rule (keyed by destination node) cannot follow.
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

/// What the engine did, for operators and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineStats {
    pub attached: u64,
    pub detached: u64,
    pub attach_refused: u64,
    /// Datagrams for a node no attached application is.
    pub unknown_destination: u64,
    /// Submissions that did not decode, or were impossible: the
    /// application is detached (its memory is not to be trusted).
    pub bad_submissions: u64,
    pub turns: u64,
    /// Time spent auditing the engine's own state (`crate::audit`).
    pub audit_ns: u64,
}

/// An application attached to the engine.
struct Attached {
    node: NodeId,
    pid: u32,
    region: ClientRegion,
    core: Core,
    conn: UnixStream,
    /// The submission being handled; `stalled` while the core has no room.
    record: Vec<u8>,
    stalled: bool,
    /// A completion the ring had no room for, published before any other.
    held: Vec<u8>,
    /// Per peer, the settled mark last published.
    settled: BTreeMap<NodeId, u64>,
    /// Per peer, its pair of backup blocks (`2 * slot`, `2 * slot + 1`)
    /// and what was last written there.
    backups: BTreeMap<NodeId, (usize, Option<StreamBackup>)>,
    /// Rails each peer was given.
    rails: BTreeMap<NodeId, usize>,
    /// The backup a dead engine left, as found at attachment.
    recovered: BTreeMap<NodeId, (usize, Option<StreamBackup>)>,
    /// Taking a dead engine's place: what the application resubmits. Until
    /// it is all there the core is not run, so nothing touches the backup.
    resuming: Option<BTreeMap<NodeId, Resumed>>,
    /// `Close` received: detach once everything settles or by then.
    closing: Option<Instant>,
    /// Lost its connection or broke the protocol.
    gone: bool,
    /// `EngineOptions::backup`.
    backup: bool,
    /// Peers it named at this engine's own addresses (a direct path each,
    /// set up by `Engine::pair_up`), and peers whose doorbell it asked to
    /// have rung after a push on such a path.
    local_requests: Vec<NodeId>,
    wakes: Vec<NodeId>,
    /// Completions of the engine's own making (the direct paths' news),
    /// published before anything else, in order.
    control_out: VecDeque<Vec<u8>>,
    /// Attached as a new life: its direct paths are laid anew.
    fresh: bool,
    /// When its counters are next published, and what was last published.
    counters_due: Instant,
    counters_sent: tether_proto::Stats,
    faults_sent: FaultCounters,
    checks_sent: EngineCounters,
    counters_buf: Vec<u8>,
}

pub struct Engine {
    options: EngineOptions,
    listener: UnixListener,
    /// The rails, and the batching and bounds of their traffic (the
    /// embedded endpoint runs on the same driver).
    driver: Driver,
    /// The fault injectors' counters, one per faulted rail.
    faults: Vec<FaultHandle>,
    book: Book,
    clients: Vec<Attached>,
    /// The self-test's datagram buffer.
    tx: Vec<u8>,
    scratch: Vec<u8>,
    origin: StdInstant,
    stop: Arc<AtomicBool>,
    stats: EngineStats,
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
    #[cfg(feature = "fault-hook")]
    hook: Option<crate::hook::Hook>,
}

/// What an engine listens on: the rendezvous socket and one UDP socket per
/// rail. A supervisor binds them once and hands them to each engine it
/// starts.
#[derive(Debug)]
pub struct EngineSockets {
    listener: UnixListener,
    rails: Vec<UdpTransport>,
}

impl EngineSockets {
    /// Take the directory (created mode 0700 if missing; it must be this
    /// user's and no one else's to write), bind the socket and every rail.
    pub fn bind(options: &EngineOptions) -> Result<Self, EngineError> {
        check_faults(&options.faults)?;
        if options.binds.is_empty() || options.binds.len() > MAX_RAILS {
            return Err(EngineError::Rails { given: options.binds.len(), max: MAX_RAILS });
        }
        options.config.validate()?;
        prepare_dir(&options.dir)?;
        let sock = attach::socket_path(&options.dir);
        if sock.exists() {
            if UnixStream::connect(&sock).is_ok() {
                return Err(EngineError::AlreadyRunning(options.dir.display().to_string()));
            }
            // Left by an engine that died: nobody answers on it.
            std::fs::remove_file(&sock)?;
        }
        let listener = UnixListener::bind(&sock)?;
        listener.set_nonblocking(true)?;
        let rails = options
            .binds
            .iter()
            .map(|&b| UdpTransport::bind(b, AddressBook::new()))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(EngineSockets { listener, rails })
    }

    /// The address each rail is bound at.
    pub fn rail_addrs(&self) -> Vec<SocketAddr> {
        self.rails.iter().filter_map(|r| r.local_addr()).collect()
    }
}

/// The engine's heartbeat (Zhou et al. [FTGM] section 3.1, the watchdog's
/// counter): a word it advances on every turn of its loop, and the moment
/// it means to wake by when it sleeps, in a region its supervisor maps.
/// Standing still while not asleep, or asleep past its wake-up time, is a
/// hang.
#[derive(Debug, Clone)]
pub struct Heartbeat {
    region: Arc<tether_shm::Region>,
}

impl Heartbeat {
    /// Bytes a heartbeat takes.
    pub const LEN: usize = 64;

    /// The heartbeat in `region` (at least `LEN` bytes, shared).
    pub fn new(region: Arc<tether_shm::Region>) -> Self {
        assert!(region.len() >= Self::LEN, "a heartbeat needs its cache line");
        Heartbeat { region }
    }

    fn word(&self, i: usize) -> &std::sync::atomic::AtomicU64 {
        // SAFETY: words 0 and 1 of a mapping of at least 64 bytes, 8-aligned
        // (a mapping is page-aligned); it lives as long as `self.region`.
        unsafe { &*(self.region.as_ptr().add(8 * i) as *const std::sync::atomic::AtomicU64) }
    }

    /// Turns of the loop so far.
    pub fn beats(&self) -> u64 {
        self.word(0).load(Ordering::Acquire)
    }

    /// The monotonic time (`monotonic_ns`) the engine, asleep, means to
    /// wake by; 0 while awake.
    pub fn asleep_until(&self) -> u64 {
        self.word(1).load(Ordering::Acquire)
    }

    fn beat(&self) {
        self.word(0).fetch_add(1, Ordering::Release);
    }

    fn sleeping(&self, until_ns: u64) {
        self.word(1).store(until_ns, Ordering::Release);
    }

    /// The longest the engine may sleep: its supervisor tells a hang from
    /// a sleep no sooner than the sleep's end, so this bounds detection.
    pub fn max_sleep(&self) -> Duration {
        Duration::from_nanos(self.word(2).load(Ordering::Relaxed))
    }

    /// Before an engine starts: awake, no beats, sleeps bounded by `max`.
    pub fn reset(&self, max_sleep: Duration) {
        self.word(0).store(0, Ordering::Relaxed);
        self.word(1).store(0, Ordering::Relaxed);
        self.word(2).store(max_sleep.as_nanos() as u64, Ordering::Release);
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
            #[cfg(feature = "fault-hook")]
            hook,
            options,
        })
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
        (0..self.driver.rail_count() as RailId)
            .filter_map(|r| self.driver.rail(r).and_then(|t| t.local_addr()))
            .collect()
    }

    /// Set it to stop `run` within `IDLE_SLICE`.
    pub fn stop_flag(&self) -> Arc<AtomicBool> {
        self.stop.clone()
    }

    pub fn stats(&self) -> EngineStats {
        self.stats
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
        }
        Ok(())
    }

    /// One turn of the loop; true if it did anything.
    pub fn turn(&mut self) -> bool {
        self.stats.turns += 1;
        if let Some(h) = &self.heartbeat {
            h.beat();
        }
        #[cfg(feature = "fault-hook")]
        self.take_strikes();
        let now = self.now();
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
        self.clients.retain(|c| {
            if c.gone {
                info!(node = c.node, pid = c.pid, "application detached");
            }
            !c.gone
        });
        self.stats.detached += (before - self.clients.len()) as u64;
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

    /// The streams' bookkeeping and the address book.
    fn audit_quick(&mut self) -> Result<(), String> {
        self.book.audit().map_err(|why| format!("address book: {why}"))?;
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

    /// Take every waiting attachment.
    fn accept(&mut self) -> bool {
        let mut any = false;
        loop {
            let conn = match self.listener.accept() {
                Ok((conn, _)) => conn,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return any,
                Err(e) => {
                    warn!(error = %e, "accepting an application failed");
                    return any;
                }
            };
            any = true;
            match self.admit(conn) {
                Ok(c) => {
                    info!(
                        node = c.node,
                        pid = c.pid,
                        incarnation = c.core.incarnation(),
                        "application attached"
                    );
                    self.stats.attached += 1;
                    self.clients.push(c);
                    // `check_attachment` refused past the bound.
                    assert!(self.clients.len() <= MAX_CLIENTS, "more applications attached than MAX_CLIENTS");
                }
                Err(why) => {
                    self.stats.attach_refused += 1;
                    warn!(reason = %why, "attachment refused");
                }
            }
        }
    }

    /// Check an attachment and set up its core; on refusal the reason goes
    /// back on the connection too.
    fn admit(&mut self, mut conn: UnixStream) -> Result<Attached, String> {
        conn.set_nonblocking(false).map_err(|e| e.to_string())?;
        conn.set_read_timeout(Some(attach::EXCHANGE_TIMEOUT)).map_err(|e| e.to_string())?;
        conn.set_write_timeout(Some(attach::EXCHANGE_TIMEOUT)).map_err(|e| e.to_string())?;
        let result = self.check_attachment(&mut conn);
        let reply = match &result {
            Ok(_) => Ok(std::process::id()),
            Err(why) => Err(why.as_str()),
        };
        attach::write_reply(&mut conn, reply).map_err(|e| format!("answering: {e}"))?;
        let (region, core, pid, mode) = result?;
        let recovered = read_backups(&region);
        let backups = recovered.iter().map(|(&peer, &(slot, _))| (peer, (slot, None))).collect();
        conn.set_nonblocking(true).map_err(|e| e.to_string())?;
        Ok(Attached {
            node: region.header.node,
            pid,
            region,
            core,
            conn,
            record: Vec::new(),
            stalled: false,
            held: Vec::new(),
            settled: BTreeMap::new(),
            backups,
            recovered,
            rails: BTreeMap::new(),
            resuming: (mode == attach::Mode::Resume).then(BTreeMap::new),
            closing: None,
            gone: false,
            backup: self.options.backup,
            local_requests: Vec::new(),
            wakes: Vec::new(),
            control_out: VecDeque::new(),
            fresh: mode == attach::Mode::Fresh,
            counters_due: Instant::ZERO,
            counters_sent: tether_proto::Stats::default(),
            faults_sent: FaultCounters::default(),
            checks_sent: EngineCounters::default(),
            counters_buf: Vec::new(),
        })
    }

    fn check_attachment(
        &mut self,
        conn: &mut UnixStream,
    ) -> Result<(ClientRegion, Core, u32, attach::Mode), String> {
        let cred = attach::peer_cred(conn).map_err(|e| format!("peer credentials: {e}"))?;
        if cred.uid != attach::my_uid() {
            return Err(format!("user {} may not attach to user {}'s engine", cred.uid, attach::my_uid()));
        }
        if self.clients.len() >= MAX_CLIENTS {
            return Err(format!("the engine serves {MAX_CLIENTS} applications already"));
        }
        let (path, mode) = attach::read_request(conn).map_err(|e| format!("request: {e}"))?;
        // Only regions in the engine's own directory: an application may
        // not make the engine map an arbitrary file.
        let dir = self.options.dir.canonicalize().map_err(|e| e.to_string())?;
        let canonical = path.canonicalize().map_err(|e| format!("region {}: {e}", path.display()))?;
        if canonical.parent() != Some(dir.as_path()) {
            return Err(format!("region {} is not in the engine's directory", path.display()));
        }
        let region = ClientRegion::open(&canonical).map_err(|e| format!("region {}: {e}", path.display()))?;
        let h = region.header;
        if h.pid != cred.pid {
            return Err(format!("region names pid {}, the connection is pid {}", h.pid, cred.pid));
        }
        if is_probe_node(h.node) {
            return Err(format!("node {} is reserved for the engine's self-test", h.node));
        }
        if self.clients.iter().any(|c| c.node == h.node) {
            return Err(format!("node {} is attached already", h.node));
        }
        // A message must fit one ring record either way.
        let largest = region.submissions.max_record().min(region.completions.max_record()) - RECORD_OVERHEAD;
        let config = client_config(&self.options.config, largest);
        let mut core = Core::new(config, h.node, h.incarnation).map_err(|e| e.to_string())?;
        core.seed_secrets(region.control.secret());
        Ok((region, core, cred.pid, mode))
    }

    /// Receive on every rail (up to the driver's budget); hand each
    /// datagram to the core its header names, with the sender as the
    /// address book proves it (never the header alone).
    fn receive(&mut self, now: Instant) -> usize {
        let Engine { driver, clients, book, selftest, stats, heartbeat, .. } = self;
        let beat = heartbeat.as_ref();
        let received = driver.receive(now, |rail, seen, datagram| {
            // Long work is progress, not a hang: the heartbeat says so.
            beat.inspect(|h| h.beat());
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
            if c.core.unsettled() == 0 || now >= deadline {
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
            let work = || c.stalled || !c.region.submissions.is_empty();
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
            .filter_map(|c| c.core.poll_timeout().into_iter().chain(c.closing).min())
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
        fds.push(fd(self.listener.as_raw_fd()));
        fds.extend(self.driver.rails_mut().iter().filter_map(|r| r.raw_fd()).map(fd));
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
    fn live_mut(&mut self, node: NodeId) -> Option<&mut Attached> {
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
fn serving(clients: &[Attached]) -> impl Iterator<Item = &Attached> + '_ {
    clients.iter().filter(|c| c.resuming.is_none())
}

/// Bytes a record adds to a payload at most (kind, ids, length).
const RECORD_OVERHEAD: usize = 48;
/// How far ahead of the highest sequence number sent the backup records
/// its high-water mark: a block write per this many segments.
const SENT_MARGIN: u64 = 1024;

/// The marks of a stream no block was ever written for: nothing was sent.
const FRESH: StreamMarks = StreamMarks {
    peer_incarnation: 0,
    max_datagram: 0,
    epoch: 1,
    settled_msg: 0,
    settled_seq: 0,
    sent_upto: 0,
    tx_pn: 1,
};

/// What an application resubmits for one peer when it resumes.
#[derive(Debug, Default)]
struct Resumed {
    failed_upto: u64,
    taken: Option<Taken>,
    first_id: Option<u64>,
    messages: Vec<Unsettled>,
}

/// The configuration of an application's core: the engine's, in fragment
/// mode (the commit point at the application), messages bounded by what
/// one ring record holds.
fn client_config(engine: &Config, largest: usize) -> Config {
    Config {
        max_message_len: engine.max_message_len.min(largest),
        deliver_fragments: true,
        // The engine's memory is a failure domain of its own: every
        // payload it buffers is checked before it is sent or delivered.
        verify_payloads: true,
        ..engine.clone()
    }
}

/// The backup blocks a dead engine left: per peer, its slot and the marks
/// of the first of its two blocks that reads whole.
fn read_backups(region: &ClientRegion) -> BTreeMap<NodeId, (usize, Option<StreamBackup>)> {
    let mut found = BTreeMap::new();
    for slot in 0..region.backups.len() / 2 {
        let pair = [&region.backups[2 * slot], &region.backups[2 * slot + 1]];
        if let Some(b) = pair.iter().find_map(|b| b.read().ok().flatten()) {
            found.insert(b.peer, (slot, Some(b)));
        }
    }
    found
}

/// Take the application's submissions into its core, at most
/// `SUBMISSIONS_PER_TURN`; a send the core has no room for stays until it
/// has (back-pressure: the ring fills and the application waits).
fn take_submissions(
    c: &mut Attached,
    book: &mut Book,
    driver: &mut Driver,
    own: &[SocketAddr],
    stats: &mut EngineStats,
    now: Instant,
    beat: Option<&Heartbeat>,
) -> bool {
    // Out of `c` while it is read, so handling may change `c`.
    let mut record = std::mem::take(&mut c.record);
    let mut taken = 0;
    while taken < SUBMISSIONS_PER_TURN && c.closing.is_none() {
        // Long work is progress, not a hang: the heartbeat says so.
        beat.inspect(|h| h.beat());
        // A stalled submission is this process's copy, taken whole from
        // the ring before (never re-read from shared memory).
        assert!(!c.stalled || !record.is_empty(), "node {}: stalled on no submission", c.node);
        if !c.stalled {
            match c.region.submissions.pop(&mut record) {
                Ok(true) => {}
                Ok(false) => break,
                Err(e) => {
                    c.broke(stats, &format!("submission ring: {e}"));
                    break;
                }
            }
        }
        match take(c, &record, book, driver, own, now, beat) {
            Ok(true) => taken += 1,
            Ok(false) => break,
            Err(why) => {
                c.broke(stats, &why);
                break;
            }
        }
    }
    c.record = record;
    taken > 0 || c.gone
}

/// Queue an application's message on `channel` (a call's envelope rides
/// another) on the core.
fn send(
    core: &mut Core,
    now: Instant,
    peer: NodeId,
    payload: &[u8],
    channel: Channel,
) -> Result<MessageId, SendError> {
    if channel == Channel::APP {
        core.send(now, peer, payload)
    } else {
        core.send_on_slice(now, peer, channel, payload)
    }
}

/// One submission: `Ok(false)` if the core has no room for it yet (it
/// stays, `stalled`), an error if the application broke the protocol.
fn take(
    c: &mut Attached,
    record: &[u8],
    book: &mut Book,
    driver: &mut Driver,
    own: &[SocketAddr],
    now: Instant,
    beat: Option<&Heartbeat>,
) -> Result<bool, String> {
    let s = Submission::decode(record).map_err(|e| format!("submission: {e}"))?;
    match s {
        Submission::Send { id, peer, payload, channel } if c.resuming.is_some() => {
            if !c.resumed_message(peer, id, payload, channel) {
                return Err(format!("resuming: message {id} to {peer} out of order"));
            }
        }
        Submission::Resume { peer, failed_upto, taken } => {
            let r = c.resuming.get_or_insert_with(BTreeMap::new).entry(peer).or_default();
            (r.failed_upto, r.taken) = (failed_upto, taken);
        }
        Submission::ResumeEnd => c.resume(now, beat)?,
        Submission::Send { id, peer, payload, channel } => {
            match send(&mut c.core, now, peer, payload, channel) {
                Ok(m) if m.seq == id => c.stalled = false,
                Ok(m) => return Err(format!("send id {id} to {peer}, the stream's next is {}", m.seq)),
                Err(SendError::WouldBlock) => {
                    c.stalled = true;
                    return Ok(false);
                }
                Err(e) => return Err(format!("send {id} to {peer}: {e}")),
            }
        }
        Submission::AddPeer { node, .. } if is_probe_node(node) => {
            return Err(format!("peer {node} is reserved for the engine's self-test"));
        }
        Submission::AddPeer { node, rails: addrs } => {
            let addrs: Vec<_> = addrs.iter().take(own.len()).collect();
            if addrs == own && node != c.node {
                // Attached here too (or to be): a direct path, and nothing
                // of it in the core (`Engine::pair_up`).
                if c.local_requests.len() >= MAX_CLIENTS {
                    return Err("more direct paths asked for than an engine serves applications".into());
                }
                c.local_requests.push(node);
                assert!(c.local_requests.len() <= MAX_CLIENTS, "direct paths asked for past the bound");
            } else {
                c.add_remote_peer(book, driver, node, &addrs)?;
                c.control_out.push_back(completion(&Completion::PeerAdded { peer: node }));
            }
        }
        Submission::Wake { peer } => {
            if !c.wakes.contains(&peer) && c.wakes.len() < MAX_CLIENTS {
                c.wakes.push(peer);
            }
            assert!(c.wakes.len() <= MAX_CLIENTS, "doorbells asked for past the bound");
        }
        Submission::Close { linger_ns } => c.closing = Some(now + Duration::from_nanos(linger_ns)),
    }
    Ok(true)
}

/// Publish completions in their order: a held one first, then failures
/// (events), then settled marks (after the failures they cover), then
/// deliveries. A full ring holds the record and stops: the core's own
/// delivery queue backs up, which is the commit point's back-pressure.
fn publish(c: &mut Attached, out: &mut Vec<u8>) -> bool {
    let mut any = false;
    if !c.held.is_empty() {
        match c.region.completions.push(&c.held) {
            Ok(()) => {
                c.held.clear();
                any = true;
            }
            Err(_) => return false,
        }
    }
    while let Some(record) = c.control_out.front() {
        if c.region.completions.push(record).is_err() {
            return any;
        }
        c.control_out.pop_front();
        any = true;
    }
    out.resize(64, 0);
    // Failures first: a failure the application was told of is never
    // undone by a restore (docs/ENGINE.md, "Restore").
    while let Some(event) = c.core.poll_event() {
        let (failed, reason) = match event {
            Event::PeerUnreachable { failed } => (failed, FailReason::PeerUnreachable),
            Event::PeerRestarted { failed, .. } => (failed, FailReason::PeerRestarted),
            Event::StreamReset { failed } => (failed, FailReason::StreamReset),
            other => {
                debug!(node = c.node, event = ?other, "event not forwarded to the application");
                continue;
            }
        };
        if failed.is_empty() {
            continue;
        }
        let n = Completion::Failed { failed, reason }.encode(out).expect("64 bytes hold a failure");
        if !c.push_or_hold(&out[..n]) {
            return any;
        }
        any = true;
    }
    // The backup before the marks it covers: the application lets go of a
    // message only once a new engine could not need it.
    let peers: Vec<NodeId> = c.core.peers().collect();
    for &peer in &peers {
        c.back_up(peer);
    }
    for peer in peers {
        let below = c.core.settled_below(peer).unwrap_or(0);
        let last = c.settled.entry(peer).or_insert(0);
        if below > *last {
            *last = below;
            let n = Completion::Settled { peer, below }.encode(out).expect("64 bytes hold a mark");
            if !c.push_or_hold(&out[..n]) {
                return any;
            }
            any = true;
        }
    }
    // Fragments as they came; taking each is the commit point, so one is
    // taken only when the ring has room for it.
    while let Some(len) = c.core.next_delivery_len() {
        if !c.region.completions.fits(len + RECORD_OVERHEAD) {
            break;
        }
        let Some(d) = c.core.recv() else { break };
        let Some(fragment) = d.fragment else {
            warn!(node = c.node, "a whole message from a core in fragment mode");
            continue;
        };
        out.resize(d.message.len() + RECORD_OVERHEAD, 0);
        let n = Completion::Delivery { from: d.from, fragment, channel: d.channel, payload: &d.message }
            .encode(out)
            .expect("sized for the fragment");
        any = true;
        if !c.push_or_hold(&out[..n]) {
            return any;
        }
    }
    any
}

/// What `transmit` sent: datagrams, and bit `r` set for each rail `r`
/// it used (in `full`, for full-size datagrams).
#[derive(Debug, Default)]
struct Sent {
    datagrams: usize,
    rails: u32,
    full: u32,
}

/// Send what the core has, through the driver's batches; what a full
/// socket does not take waits in the driver for the next turn.
fn transmit(c: &mut Attached, driver: &mut Driver, now: Instant, beat: Option<&Heartbeat>) -> Sent {
    let mut sent = Sent::default();
    driver.transmit(|buf| {
        let full = buf.len();
        let t = c.core.poll_transmit(now, buf)?;
        beat.inspect(|h| h.beat());
        // Record before send: the datagram may carry a sequence number past
        // the backed-up high-water mark.
        c.back_up(t.dst);
        // The rail is in use; full datagrams mean messages that fragment.
        sent.rails |= 1 << t.rail;
        if t.len + 64 >= full {
            sent.full |= 1 << t.rail;
        }
        sent.datagrams += 1;
        Some(t)
    });
    sent
}

impl Attached {
    /// A peer reached through the rails: in the address book, a pair of
    /// backup blocks, its paths in the core.
    fn add_remote_peer(
        &mut self,
        book: &mut Book,
        driver: &mut Driver,
        node: NodeId,
        addrs: &[SocketAddr],
    ) -> Result<(), String> {
        book.insert(node, addrs).map_err(|_| "the engine's address book is full".to_string())?;
        // Sent to by node id, in the driver's batches: each rail's
        // transport has the node's address there. (Who sent a datagram is
        // the engine's book's to say: an address may host many nodes.)
        for (rail, &addr) in addrs.iter().enumerate() {
            if let Some(t) = driver.rail_mut(rail as RailId) {
                t.add_peer(node, addr).map_err(|e| format!("add peer {node}: {e}"))?;
            }
        }
        if !self.backups.contains_key(&node) {
            let used: Vec<usize> = self.backups.values().map(|(slot, _)| *slot).collect();
            let slot = (0..).find(|s| !used.contains(s)).expect("a free slot");
            if 2 * slot + 1 >= self.region.backups.len() {
                return Err("more peers than the region has backup blocks for".into());
            }
            self.backups.insert(node, (slot, None));
        }
        self.rails.insert(node, addrs.len());
        if self.resuming.is_none() {
            let ids: Vec<RailId> = (0..addrs.len() as RailId).collect();
            self.core.set_paths(node, &ids).map_err(|e| format!("add peer {node}: {e}"))?;
        }
        Ok(())
    }

    /// Write `peer`'s marks to its backup blocks if they moved: both
    /// blocks in turn, so a crash tears at most one and the other holds
    /// the marks before or after. The sent high-water is written ahead by
    /// `SENT_MARGIN`, so most datagrams need no write.
    fn back_up(&mut self, peer: NodeId) {
        if !self.backup {
            return;
        }
        let (Some(m), Some((slot, last))) = (self.core.stream_marks(peer), self.backups.get_mut(&peer))
        else {
            return;
        };
        let mut b = StreamBackup {
            peer,
            epoch: m.epoch,
            peer_incarnation: m.peer_incarnation,
            max_datagram: m.max_datagram as u32,
            tx_pn_hi: (m.tx_pn >> 32) as u32 + 1,
            settled_msg: m.settled_msg,
            settled_seq: m.settled_seq,
            sent_upto: 0,
        };
        b.sent_upto = match last {
            Some(l) if l.epoch == b.epoch && l.sent_upto >= m.sent_upto => l.sent_upto,
            _ => m.sent_upto + SENT_MARGIN,
        };
        // Record before send: the block covers every sequence number the
        // core may put in a datagram now. (`last` is this engine's memory
        // of what it wrote, never read back from the region.)
        assert!(b.sent_upto >= m.sent_upto, "peer {peer}: backup's sent mark behind the stream's");
        if *last == Some(b) {
            return;
        }
        // Slots are handed out below the region's blocks (`add_remote_peer`,
        // `read_backups`).
        assert!(2 * *slot + 1 < self.region.backups.len(), "peer {peer}: backup slot {slot} past the region");
        self.region.backups[2 * *slot].write(&b);
        self.region.backups[2 * *slot + 1].write(&b);
        *last = Some(b);
    }

    /// A message given again while resuming: the next of its peer's.
    fn resumed_message(&mut self, peer: NodeId, id: u64, payload: &[u8], channel: Channel) -> bool {
        let Some(r) = self.resuming.as_mut().and_then(|r| r.get_mut(&peer)) else { return false };
        // The id is the application's word: one near the end of the
        // numbers is refused like any other out of order, not overflowed.
        let next = r.first_id.unwrap_or(id).checked_add(r.messages.len() as u64);
        if next != Some(id) {
            return false;
        }
        r.first_id.get_or_insert(id);
        r.messages.push(Unsettled { data: Bytes::copy_from_slice(payload), channel });
        // The id was checked above; what is kept runs without a gap.
        assert!(
            r.first_id.is_some_and(|f| f.wrapping_add(r.messages.len() as u64 - 1) == id),
            "resuming {peer}: messages kept out of order"
        );
        true
    }

    /// Everything resubmitted: rebuild the core from the backup blocks and
    /// what the application kept (docs/ENGINE.md, "Restore").
    fn resume(&mut self, now: Instant, beat: Option<&Heartbeat>) -> Result<(), String> {
        let resumed = self.resuming.take().unwrap_or_default();
        let mut streams = Vec::new();
        for (peer, r) in resumed {
            let last = self.recovered.get(&peer).and_then(|(_, b)| *b);
            let mut marks = last.map_or(FRESH, |b| StreamMarks {
                peer_incarnation: b.peer_incarnation,
                max_datagram: b.max_datagram as usize,
                epoch: b.epoch,
                settled_msg: b.settled_msg,
                settled_seq: b.settled_seq,
                sent_upto: b.sent_upto,
                tx_pn: u64::from(b.tx_pn_hi) << 32,
            });
            if r.failed_upto > marks.settled_msg {
                // The dead engine abandoned the stream and told the
                // application before its block said so: go on as it would
                // have, on the next epoch, after what failed.
                marks = StreamMarks {
                    epoch: marks.epoch.wrapping_add(1),
                    settled_msg: r.failed_upto,
                    settled_seq: 0,
                    sent_upto: 0,
                    ..marks
                };
            }
            let first = r.first_id.unwrap_or(marks.settled_msg);
            if first > marks.settled_msg {
                return Err(format!(
                    "resuming {peer}: messages from {first}, the backup needs {}",
                    marks.settled_msg
                ));
            }
            let skip = (marks.settled_msg - first) as usize;
            let messages: Vec<Unsettled> = r.messages.into_iter().skip(skip).collect();
            let taken =
                r.taken.filter(|t| t.incarnation == marks.peer_incarnation).map(|t| (t.epoch, t.next));
            let rails = (0..self.rails.get(&peer).copied().unwrap_or(1) as RailId).collect();
            debug!(node = self.node, peer, ?marks, ?taken, messages = messages.len(), "resuming a stream");
            streams.push(ResumedStream { peer, rails, marks, messages, failures: Vec::new(), taken });
        }
        let config = self.core.config().clone();
        // Many messages take milliseconds to restore: the watchdog is told
        // the engine is making progress, not hung.
        let mut progress = || {
            if let Some(h) = beat {
                h.beat();
            }
        };
        let incarnation = self.core.incarnation();
        let mut core =
            Core::resume_with_progress(config, self.node, incarnation, streams, now, &mut progress)
                .map_err(|e| e.to_string())?;
        // The application's secret: a handshake the dead engine began is
        // finished by this one (its cookies check).
        core.seed_secrets(self.region.control.secret());
        info!(node = self.node, unsettled = core.unsettled(), "application resumed from its backup");
        self.core = core;
        self.settled.clear();
        Ok(())
    }

    /// Push a completion, or hold it for the next turn; false if held.
    /// The core's counters to the application, if they changed. Only when
    /// nothing waits to be published before them, and only if the ring
    /// has room: the next report carries what this one would have.
    fn publish_counters(&mut self, faults: FaultCounters, checks: EngineCounters, scratch: &mut Vec<u8>) {
        let stats = self.core.stats();
        let same = *stats == self.counters_sent && faults == self.faults_sent && checks == self.checks_sent;
        if same || !self.held.is_empty() {
            return;
        }
        let mut values = std::mem::take(&mut self.counters_buf);
        values.clear();
        let fields = stats.fields();
        let faulted = faults.values();
        let all = fields.iter().map(|(_, v)| *v).chain(faulted).chain(checks.values());
        for v in all.take(tether_attach::records::MAX_COUNTERS) {
            values.extend_from_slice(&v.to_le_bytes());
        }
        scratch.resize(values.len() + 16, 0);
        if let Ok(n) = (Completion::Counters { values: &values }).encode(scratch) {
            if self.region.completions.push(&scratch[..n]).is_ok() {
                self.counters_sent = stats.clone();
                self.faults_sent = faults;
                self.checks_sent = checks;
            }
        }
        self.counters_buf = values;
    }

    fn push_or_hold(&mut self, record: &[u8]) -> bool {
        // Completions go out in order: nothing is published past one held
        // back (`publish` stops at a hold, and sends the held one first).
        assert!(self.held.is_empty(), "node {}: a completion published past one held back", self.node);
        match self.region.completions.push(record) {
            Ok(()) => true,
            Err(ShmError::Full { .. }) => {
                self.held.clear();
                self.held.extend_from_slice(record);
                false
            }
            Err(e) => {
                warn!(node = self.node, error = %e, "completion ring unusable: detaching");
                self.gone = true;
                false
            }
        }
    }

    /// The application broke the protocol or its memory did: detach it.
    fn broke(&mut self, stats: &mut EngineStats, why: &str) -> bool {
        warn!(node = self.node, pid = self.pid, reason = why, "application broke the protocol: detaching");
        stats.bad_submissions += 1;
        self.gone = true;
        true
    }
}

/// Create the directory (0700) or check the one there: ours, and no one
/// else's to write.
fn prepare_dir(dir: &Path) -> Result<(), EngineError> {
    if !dir.exists() {
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
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

/// One completion record, encoded (the engine's own news: small).
fn completion(c: &Completion<'_>) -> Vec<u8> {
    let mut buf = vec![0u8; 64];
    let n = c.encode(&mut buf).expect("a control record fits 64 bytes");
    buf.truncate(n);
    buf
}
