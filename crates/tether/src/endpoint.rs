//! The public endpoint: the sans-IO core driven over a real transport,
//! embedded in this process (its state shared by the application's threads
//! and a progress worker: `shared`, `progress`) or attached to an engine
//! process on the node (`attached`).
//!
//! A fault plan in `Options` (Li et al. [CI]) is applied here too: its send and
//! receive rules by wrapping the transport, its `api` rules to the
//! application's own calls, so an application can prove it survives
//! failed sends and failed operations.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant as StdInstant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use tether_fault::{CallVerdict, FaultCounters, FaultPlan, Injector, Side};
use tether_io::{error_of, AddressBook, FaultHandle, FaultyTransport, Transport, UdpTransport};
use tether_proto::{
    Config, CongestionInfo, Delivery, Endpoint as Core, Event, FailReason, Instant, MessageId, MessageState,
    NodeId, PathInfo, RailId, SendError, Stats, MAX_RAILS,
};
use tether_rpc::RpcConfig;

use crate::attached::Attached;
use crate::call_layer::Calls;
use crate::call_log::CallLogOptions;
use crate::clock::Clock;
use crate::driver::Driver;
use crate::handle::{Owner, SendHandle};
use crate::shared::{block_on, Awaits, Shared};
use crate::waiter::Waiter;
use crate::{leave, progress, Error};

/// Who drives the protocol when the application is not inside a tether call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Progress {
    /// The process's progress threads (the default): about one per core,
    /// shared by all its endpoints, each waiting on its endpoints' sockets
    /// and timers.
    #[default]
    Thread,
    /// Nobody: the application calls `Endpoint::progress` often enough.
    Polling,
}
/// How an endpoint runs: the protocol's configuration and the runtime's own
/// choices. `Endpoint::builder` sets these one by one.
#[derive(Debug, Clone)]
pub struct Options {
    /// The protocol core's limits, timers and checksum.
    pub config: Config,
    /// Who drives the protocol while the application is away.
    pub progress: Progress,
    /// How long a blocked call busy-polls before it sleeps in the kernel:
    /// a few tens of microseconds catch a reply on a fast network without a
    /// wake-up, at the cost of a core.
    pub spin: Duration,
    /// `None`: derived from the wall clock, so a restart gets a larger one.
    pub incarnation: Option<u64>,
    /// Faults to inject (empty: none). Each endpoint draws from its own
    /// seed, derived from the plan's seed and its node id.
    pub faults: FaultPlan,
    /// Faults for one rail only, instead of `faults` there (e.g. a rail
    /// that dies at a given time: `drop:p=1,from=300ms` on both sides).
    pub rail_faults: Vec<(RailId, FaultPlan)>,
    /// How long dropping the endpoint waits for what was sent to be
    /// acknowledged or failed (see `Endpoint::close`).
    pub linger: Duration,
    /// The calls' settings (credit, retransmissions, bounds).
    pub calls: RpcConfig,
    /// The server's call log file; `None`: in memory, so calls served
    /// here are at-most-once within this process's life only.
    pub call_log: Option<CallLogOptions>,
    /// The caller's log file: each call made and how it ended, so a
    /// restarted endpoint learns how its earlier life's calls ended
    /// (`Endpoint::earlier_calls`). `None`: not kept.
    pub caller_log: Option<CallLogOptions>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            config: Config::default(),
            progress: Progress::Thread,
            spin: Duration::from_micros(50),
            incarnation: None,
            faults: FaultPlan::default(),
            rail_faults: Vec::new(),
            linger: Duration::from_secs(1),
            calls: RpcConfig::default(),
            call_log: None,
            caller_log: None,
        }
    }
}

/// One node's tether endpoint: send to and receive from its peers over one
/// or more rails, with a progress thread (or the application) driving the
/// protocol.
///
/// Dropping an endpoint first lingers, up to `Options::linger` (1 s by
/// default), until every message it accepted is acknowledged or failed,
/// as [`close`](Self::close) does; what is still unsettled after that is
/// lost with the endpoint. Call `close` to choose the bound and learn the
/// outcome.
pub struct Endpoint {
    pub(crate) inner: Inner,
    linger: Duration,
}

/// Where the protocol runs for an endpoint.
pub(crate) enum Inner {
    Embedded(Embedded),
    /// In a `tether engine` process on this node (`Builder::engine`).
    Engine(Attached),
}

/// The embedded engine: the core and the sockets in this process, driven
/// by the application's calls and the process's progress threads.
pub(crate) struct Embedded {
    pub(crate) shared: Arc<Shared>,
    /// The core's pool of message buffers, reached without the lock.
    messages: tether_proto::MessagePool,
    /// The progress worker serving it; `None` with `Progress::Polling`.
    progress: Option<progress::Assignment>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Inner::Embedded(e) = &self.inner else {
            let Inner::Engine(a) = &self.inner else { unreachable!() };
            return f.debug_struct("Endpoint").field("engine", a).finish();
        };
        let d = e.shared.lock();
        f.debug_struct("Endpoint")
            .field("node", &d.core.node())
            .field("incarnation", &d.core.incarnation())
            .field("rails", &d.rail_count())
            .field("peers", &d.core.peers().collect::<Vec<_>>())
            .field("progress_thread", &e.progress.is_some())
            .finish()
    }
}

/// 32 bytes from the kernel's random source.
fn entropy() -> Result<[u8; 32], Error> {
    use std::io::Read;
    let mut seed = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut seed))
        .map_err(tether_io::TransportError::from)?;
    Ok(seed)
}

fn default_incarnation() -> u64 {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    (now.as_nanos() as u64).max(1)
}

impl Endpoint {
    /// Set up an endpoint for `node` step by step (rails, peers, options).
    pub fn builder(node: NodeId) -> crate::Builder {
        crate::Builder::new(node)
    }

    /// Bind a UDP endpoint for `node` at `bind`, knowing `peers` by address.
    pub fn udp(
        node: NodeId,
        bind: SocketAddr,
        peers: &[(NodeId, SocketAddr)],
        options: Options,
    ) -> Result<Self, Error> {
        let mut book = AddressBook::new();
        for &(id, addr) in peers {
            book.insert(id, addr);
        }
        let transport = UdpTransport::bind(bind, book)?;
        Self::with_transport(node, Box::new(transport), options)
    }

    /// Run over any transport (in-memory for tests, UDP, later shared memory).
    pub fn with_transport(
        node: NodeId,
        transport: Box<dyn Transport + Send>,
        options: Options,
    ) -> Result<Self, Error> {
        Self::with_rails(node, vec![transport], options)
    }

    /// Bind one UDP socket per rail (`binds[i]` is rail `i`, e.g. one
    /// address on each network). Peers are added with `add_peer_rails`.
    pub fn udp_rails(node: NodeId, binds: &[SocketAddr], options: Options) -> Result<Self, Error> {
        let rails = binds
            .iter()
            .map(|&b| Ok(Box::new(UdpTransport::bind(b, AddressBook::new())?) as Box<dyn Transport + Send>))
            .collect::<Result<Vec<_>, Error>>()?;
        Self::with_rails(node, rails, options)
    }

    /// Run over several rails, one transport each (rail `i` is
    /// `rails[i]`), at most `MAX_RAILS`. The fault plan applies to every
    /// rail, each drawing from its own seed.
    pub fn with_rails(
        node: NodeId,
        rails: Vec<Box<dyn Transport + Send>>,
        options: Options,
    ) -> Result<Self, Error> {
        if rails.is_empty() || rails.len() > MAX_RAILS {
            return Err(Error::Rails { given: rails.len() });
        }
        let incarnation = options.incarnation.unwrap_or_else(default_incarnation);
        let mut core = Core::new(options.config, node, incarnation)?;
        // The handshake's cookies and nonces must be unguessable on a real
        // network: the core's default secret is derived from public values.
        core.seed_secrets(entropy()?);
        let plan = &options.faults;
        // The same derivation as the simulator's: a node's faults are the
        // same stream whether it runs in the simulator or over sockets.
        let seed = tether_fault::node_seed(plan.seed, node);
        let mut faults = Vec::new();
        let mut wrapped: Vec<Box<dyn Transport + Send>> = Vec::with_capacity(rails.len());
        for (i, transport) in rails.into_iter().enumerate() {
            let plan =
                options.rail_faults.iter().find(|(r, _)| usize::from(*r) == i).map_or(plan, |(_, p)| p);
            if plan.touches(Side::Send) || plan.touches(Side::Recv) {
                // Rail 0 keeps the seed a single-rail endpoint has.
                let faulty = FaultyTransport::new(
                    transport,
                    plan,
                    seed ^ (i as u64).wrapping_mul(0xD1B5_4A32_D192_ED03),
                )?;
                faults.push(faulty.handle());
                wrapped.push(Box::new(faulty));
            } else {
                wrapped.push(transport);
            }
        }
        let api = if plan.touches(Side::Api) { Some(Injector::with_seed(plan, seed ^ 0xA91)?) } else { None };
        let fds: Vec<_> = wrapped.iter().map(|t| t.raw_fd()).collect();
        let waiter = Waiter::new(&fds)?;
        let fds = fds.into_iter().flatten().collect();
        let clock = Clock::new();
        let messages = core.message_pool();
        let calls = Calls::open(
            options.calls.clone(),
            incarnation,
            options.call_log.as_ref(),
            options.caller_log.as_ref(),
            clock.now(),
        )?;
        let node = Driver::new(core, calls, wrapped, api.map(|i| (i, clock.now())));
        let served = options.progress == Progress::Thread;
        let shared = Arc::new(Shared::new(node, waiter, clock, options.spin, faults, fds, served));
        let progress = match options.progress {
            Progress::Polling => None,
            Progress::Thread => Some(progress::serve(shared.clone())?),
        };
        Ok(Endpoint {
            inner: Inner::Embedded(Embedded { shared, messages, progress }),
            linger: options.linger,
        })
    }

    /// Attach to the engine serving `dir` as `node` (`Builder::engine`).
    pub(crate) fn attached(
        node: NodeId,
        dir: &std::path::Path,
        options: tether_attach::ClientOptions,
        calls: crate::attached::CallSetup<'_>,
        linger: Duration,
    ) -> Result<Self, Error> {
        Ok(Endpoint { inner: Inner::Engine(Attached::attach(dir, node, options, calls)?), linger })
    }
}

/// The endpoint's calls (see each one's description on `Endpoint`), with
/// the protocol in this process.
impl Embedded {
    fn node(&self) -> NodeId {
        self.shared.lock().core.node()
    }

    fn local_addr(&self) -> Option<SocketAddr> {
        self.shared.lock().transport().local_addr()
    }

    fn add_peer(&self, node: NodeId, addr: SocketAddr) -> Result<(), Error> {
        self.add_peer_rails(node, &[addr])
    }

    fn add_peer_rails(&self, node: NodeId, addrs: &[SocketAddr]) -> Result<(), Error> {
        let mut d = self.shared.lock();
        if addrs.is_empty() || addrs.len() > d.rail_count() {
            return Err(Error::PeerRails { given: addrs.len(), rails: d.rail_count() });
        }
        for (rail, &addr) in addrs.iter().enumerate() {
            d.rail_mut(rail as RailId).expect("checked against rail_count").add_peer(node, addr)?;
        }
        let rails: Vec<RailId> = (0..addrs.len() as RailId).collect();
        d.core.set_paths(node, &rails)?;
        Ok(())
    }

    fn now(&self) -> Instant {
        self.shared.clock.now()
    }

    fn paths(&self, peer: NodeId) -> Vec<PathInfo> {
        self.shared.lock().core.paths(peer)
    }

    fn congestion(&self, peer: NodeId) -> Option<CongestionInfo> {
        self.shared.lock().core.congestion(peer)
    }

    fn aggregate(&self) -> CongestionInfo {
        self.shared.lock().core.aggregate()
    }

    fn max_datagram_to(&self, peer: NodeId) -> usize {
        self.shared.lock().core.max_datagram_to(peer)
    }

    fn rail_addrs(&self) -> Vec<Option<SocketAddr>> {
        let d = self.shared.lock();
        (0..d.rail_count()).map(|r| d.rail(r as RailId).and_then(|t| t.local_addr())).collect()
    }

    fn send(&self, peer: NodeId, msg: Outgoing<'_>) -> Result<SendHandle, Error> {
        let mut d = self.shared.lock();
        if !d.has_api_faults() {
            // A small message joining others that wait to share a datagram:
            // no clock, no timers, no transmit attempt.
            if let Some(id) = msg.join_waiting(&mut d.core, peer) {
                return Ok(SendHandle::new(Some(id), None, Owner::Embedded(self.shared.clone())));
            }
        }
        let now = self.shared.clock.now();
        let injected = match d.api_fault(now) {
            CallVerdict::Proceed => None,
            CallVerdict::Invocation(e) => return Err(Error::Transport(error_of(e))),
            CallVerdict::Operation { dropped: true, .. } => {
                return Ok(SendHandle::new(
                    None,
                    Some(FailReason::OperationFault),
                    Owner::Embedded(self.shared.clone()),
                ))
            }
            // The status says failed, yet the message goes: the application
            // cannot tell which, as with a real lost completion.
            CallVerdict::Operation { dropped: false, .. } => Some(FailReason::OperationFault),
        };
        d.learn_peer(peer);
        let id = msg.queue(&mut d.core, now, peer)?;
        if self.progress.is_some() && d.unstepped_for(now) >= leave::HANDOVER {
            // Nobody has stepped it for a while: the worker is late (on two
            // cores shared with this and other busy threads, by tens of
            // milliseconds). The thread that keeps sending takes in its
            // ACKs and handshake answers itself, on its own share of the
            // CPU: 64 senders filling their buffers at once otherwise held
            // every handshake until they were done, and the few flows
            // whose threads drove their own endpoints had finished before
            // most others had started.
            self.shared.step(&mut d, now);
        } else {
            d.transmit(now);
        }
        Ok(SendHandle::new(Some(id), injected, Owner::Embedded(self.shared.clone())))
    }

    fn send_blocking(
        &self,
        peer: NodeId,
        msg: Outgoing<'_>,
        timeout: Option<Duration>,
    ) -> Result<SendHandle, Error> {
        // Fast path: room now, no blocking-call bookkeeping.
        match self.send(peer, msg.clone()) {
            Err(Error::Send(SendError::WouldBlock)) => {}
            done => return done,
        }
        let shared = &self.shared;
        let id = block_on(shared, timeout, Awaits::Settled, |d| {
            d.learn_peer(peer);
            if !d.core.can_send(peer, msg.len()) {
                return None;
            }
            let now = shared.clock.now();
            let r = msg.queue(&mut d.core, now, peer);
            d.transmit(now);
            Some(r)
        })??;
        Ok(SendHandle::new(Some(id), None, Owner::Embedded(shared.clone())))
    }

    fn try_recv(&self) -> Option<Delivery> {
        let mut d = self.shared.lock();
        if self.progress.is_none() {
            self.shared.step(&mut d, self.shared.clock.now());
        }
        d.core.recv_message()
    }

    fn recv(&self, timeout: Option<Duration>) -> Result<Delivery, Error> {
        // Fast path: a message already queued costs one lock, nothing more.
        if let Some(d) = self.shared.lock().core.recv_message() {
            return Ok(d);
        }
        block_on(&self.shared, timeout, Awaits::Delivery, |d| d.core.recv_message())
    }

    fn poll_event(&self) -> Option<Event> {
        self.shared.lock().core.poll_event()
    }

    fn next_event(&self, timeout: Option<Duration>) -> Result<Event, Error> {
        block_on(&self.shared, timeout, Awaits::Event, |d| d.core.poll_event())
    }

    fn progress(&self) {
        let mut d = self.shared.lock();
        let now = self.shared.clock.now();
        self.shared.step(&mut d, now);
    }

    fn flush(&self, timeout: Option<Duration>) -> Result<(), Error> {
        // Settled, as the doc says and an engine's flush does: not also
        // owing no ACK (`is_idle`), which a node that peers keep sending to
        // may never be; a 256-node demo's node 0, done sending early, timed
        // out in `flush` after 60 s while the others still sent to it.
        block_on(&self.shared, timeout, Awaits::AllSettled, |d| (d.core.unsettled() == 0).then_some(()))
    }

    fn message_state(&self, id: MessageId) -> MessageState {
        self.shared.lock().core.message_state(id)
    }

    fn stats(&self) -> Stats {
        self.shared.lock().core.stats().clone()
    }

    fn fault_counters(&self) -> FaultCounters {
        let mut c = self.shared.lock().api_fault_counters();
        for f in self.shared.faults() {
            c.accumulate(&f.snapshot());
        }
        c
    }

    fn set_faults_enabled(&self, on: bool) {
        self.shared.lock().set_api_faults_enabled(on);
        for f in self.shared.faults() {
            f.set_enabled(on);
        }
    }

    fn fault_handle(&self) -> Option<FaultHandle> {
        self.shared.faults().first().cloned()
    }

    fn buffered(&self) -> (usize, usize) {
        let d = self.shared.lock();
        let peers: usize = d.core.peers().map(|p| d.core.buffered_bytes(p)).sum();
        (peers, d.core.pending_deliveries())
    }

    fn rtt(&self, peer: NodeId) -> Option<Duration> {
        self.shared.lock().core.rtt(peer)
    }
}

impl Endpoint {
    /// This endpoint's node id.
    pub fn node(&self) -> NodeId {
        match &self.inner {
            Inner::Embedded(e) => e.node(),
            Inner::Engine(a) => a.node(),
        }
    }

    /// The local socket address, for transports that have one.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        match &self.inner {
            Inner::Embedded(e) => e.local_addr(),
            Inner::Engine(a) => a.local_addr(),
        }
    }

    /// Learn (or change) the address a peer is reached at (over rail 0).
    pub fn add_peer(&self, node: NodeId, addr: SocketAddr) -> Result<(), Error> {
        match &self.inner {
            Inner::Embedded(e) => e.add_peer(node, addr),
            Inner::Engine(a) => a.add_peer(node, addr),
        }
    }

    /// Learn the addresses a peer is reached at, one per rail (`addrs[i]`
    /// over rail `i`): the address book per rail, and the core's paths.
    /// With two or more, the paths' health is tracked and data fails over.
    pub fn add_peer_rails(&self, node: NodeId, addrs: &[SocketAddr]) -> Result<(), Error> {
        match &self.inner {
            Inner::Embedded(e) => e.add_peer_rails(node, addrs),
            Inner::Engine(a) => a.add_peer_rails(node, addrs),
        }
    }

    /// This endpoint's clock, as the core reads it (event times are on it).
    pub fn now(&self) -> Instant {
        match &self.inner {
            Inner::Embedded(e) => e.now(),
            Inner::Engine(a) => a.now(),
        }
    }

    /// The paths to `peer`, one per rail: state, RTT, counters.
    pub fn paths(&self, peer: NodeId) -> Vec<PathInfo> {
        match &self.inner {
            Inner::Embedded(e) => e.paths(peer),
            Inner::Engine(a) => a.paths(peer),
        }
    }

    /// The congestion state of the stream toward `peer`: window, bytes in
    /// flight, the controller's state, the pacing rate. `None` for a peer
    /// with no state yet, and in engine mode (the engine keeps it).
    pub fn congestion(&self, peer: NodeId) -> Option<CongestionInfo> {
        match &self.inner {
            Inner::Embedded(e) => e.congestion(peer),
            Inner::Engine(_) => None,
        }
    }

    /// The window all this endpoint's streams share (what they have in
    /// flight together; docs/ARCHITECTURE.md, "The endpoint's window").
    /// `None` in engine mode (the engine keeps it).
    pub fn aggregate(&self) -> Option<CongestionInfo> {
        match &self.inner {
            Inner::Embedded(e) => Some(e.aggregate()),
            Inner::Engine(_) => None,
        }
    }

    /// The largest datagram sent to `peer`, header included: the size its
    /// handshake proved the path carries (this endpoint's own largest
    /// before one). `None` in engine mode (the engine's session).
    pub fn max_datagram_to(&self, peer: NodeId) -> Option<usize> {
        match &self.inner {
            Inner::Embedded(e) => Some(e.max_datagram_to(peer)),
            Inner::Engine(_) => None,
        }
    }

    /// The local address of each rail.
    pub fn rail_addrs(&self) -> Vec<Option<SocketAddr>> {
        match &self.inner {
            Inner::Embedded(e) => e.rail_addrs(),
            Inner::Engine(a) => a.rail_addrs(),
        }
    }

    /// Queue a message and put it on the wire at once if the window allows.
    /// Never blocks: a full send buffer is `Error::Send(SendError::WouldBlock)`.
    /// With `api` fault rules, the call may instead fail at once with a
    /// typed transport error (an invocation fault) or return a handle that
    /// reports `Failed(OperationFault)` (an operation fault).
    pub fn send(&self, peer: NodeId, msg: &[u8]) -> Result<SendHandle, Error> {
        match &self.inner {
            Inner::Embedded(e) => e.send(peer, Outgoing::Borrowed(msg)),
            Inner::Engine(a) => a.send(peer, msg),
        }
    }

    /// Like `send`, but waits for room in the send buffer.
    pub fn send_blocking(
        &self,
        peer: NodeId,
        msg: &[u8],
        timeout: Option<Duration>,
    ) -> Result<SendHandle, Error> {
        match &self.inner {
            Inner::Embedded(e) => e.send_blocking(peer, Outgoing::Borrowed(msg), timeout),
            Inner::Engine(a) => a.send_blocking(peer, msg, timeout),
        }
    }

    /// Like `send`, for a message handed over whole: the sender's log keeps
    /// these very bytes until they are acknowledged, so none is copied but
    /// into each datagram (fused with the checksum). `send` copies the
    /// message into the log first. In engine mode the bytes are copied into
    /// the shared ring either way.
    pub fn send_bytes(&self, peer: NodeId, msg: Bytes) -> Result<SendHandle, Error> {
        match &self.inner {
            Inner::Embedded(e) => e.send(peer, Outgoing::Owned(msg)),
            Inner::Engine(a) => a.send(peer, &msg),
        }
    }

    /// Like `send_bytes`, but waits for room in the send buffer.
    pub fn send_bytes_blocking(
        &self,
        peer: NodeId,
        msg: Bytes,
        timeout: Option<Duration>,
    ) -> Result<SendHandle, Error> {
        match &self.inner {
            Inner::Embedded(e) => e.send_blocking(peer, Outgoing::Owned(msg), timeout),
            Inner::Engine(a) => a.send_blocking(peer, &msg, timeout),
        }
    }

    /// An empty buffer of at least `capacity` bytes for a message to be
    /// written into and handed over with [`Endpoint::seal`] and
    /// [`Endpoint::send_bytes`]: from the endpoint's pool when the size is
    /// one it keeps (16 KiB to 4 MiB), its pages already mapped. A stream
    /// of large messages sent this way allocates nothing once the pool is
    /// warm: each buffer comes back when its message is acknowledged.
    pub fn message_buffer(&self, capacity: usize) -> Vec<u8> {
        match &self.inner {
            Inner::Embedded(e) => e.messages.take(capacity),
            Inner::Engine(_) => Vec::with_capacity(capacity),
        }
    }

    /// `buf` (best taken from [`Endpoint::message_buffer`]) as the
    /// [`Bytes`] to hand to [`Endpoint::send_bytes`]: when the last
    /// reference to it is dropped (the log's, once the message is
    /// acknowledged) the buffer returns to the endpoint's pool. In engine
    /// mode the message is copied into the shared ring, and `buf` freed.
    pub fn seal(&self, buf: Vec<u8>) -> Bytes {
        match &self.inner {
            Inner::Embedded(e) => e.messages.seal(buf),
            Inner::Engine(_) => Bytes::from(buf),
        }
    }

    /// The next delivered message, if one is waiting. Drives progress once
    /// when no progress thread does.
    pub fn try_recv(&self) -> Option<Delivery> {
        match &self.inner {
            Inner::Embedded(e) => e.try_recv(),
            Inner::Engine(a) => a.try_recv(),
        }
    }

    /// Wait for the next delivered message.
    pub fn recv(&self, timeout: Option<Duration>) -> Result<Delivery, Error> {
        match &self.inner {
            Inner::Embedded(e) => e.recv(timeout),
            Inner::Engine(a) => a.recv(timeout),
        }
    }

    /// The next event (peer unreachable, restarted or reachable again, a
    /// path's state changing, a failover), if one is waiting.
    pub fn poll_event(&self) -> Option<Event> {
        match &self.inner {
            Inner::Embedded(e) => e.poll_event(),
            Inner::Engine(a) => a.poll_event(),
        }
    }

    /// Wait for the next event (peer unreachable, restarted, reachable).
    pub fn next_event(&self, timeout: Option<Duration>) -> Result<Event, Error> {
        match &self.inner {
            Inner::Embedded(e) => e.next_event(timeout),
            Inner::Engine(a) => a.next_event(timeout),
        }
    }

    /// One non-blocking step of progress (the polling mode's engine).
    pub fn progress(&self) {
        match &self.inner {
            Inner::Embedded(e) => e.progress(),
            Inner::Engine(a) => a.progress(),
        }
    }

    /// Wait until everything sent has been acknowledged or failed.
    pub fn flush(&self, timeout: Option<Duration>) -> Result<(), Error> {
        match &self.inner {
            Inner::Embedded(e) => e.flush(timeout),
            Inner::Engine(a) => a.flush(timeout),
        }
    }

    /// Where a sent message stands (as its handle's `state`).
    pub fn message_state(&self, id: MessageId) -> MessageState {
        match &self.inner {
            Inner::Embedded(e) => e.message_state(id),
            Inner::Engine(a) => a.message_state(id),
        }
    }

    /// The protocol's counters: traffic, retransmissions, and every drop by reason.
    pub fn stats(&self) -> Stats {
        match &self.inner {
            Inner::Embedded(e) => e.stats(),
            Inner::Engine(a) => a.stats(),
        }
    }

    /// Faults injected so far by this endpoint's fault plan, every side.
    pub fn fault_counters(&self) -> FaultCounters {
        match &self.inner {
            Inner::Embedded(e) => e.fault_counters(),
            Inner::Engine(a) => a.fault_counters(),
        }
    }

    /// Switch the fault plan off (`false`) or back on, on every side.
    pub fn set_faults_enabled(&self, on: bool) {
        match &self.inner {
            Inner::Embedded(e) => e.set_faults_enabled(on),
            Inner::Engine(a) => a.set_faults_enabled(on),
        }
    }

    /// Rail 0's fault injector, for its trace and completion statuses.
    pub fn fault_handle(&self) -> Option<FaultHandle> {
        match &self.inner {
            Inner::Embedded(e) => e.fault_handle(),
            Inner::Engine(a) => a.fault_handle(),
        }
    }

    /// Bytes held in send buffers and delivery queues: back to zero when
    /// everything sent has been acknowledged and everything delivered read.
    pub fn buffered(&self) -> (usize, usize) {
        match &self.inner {
            Inner::Embedded(e) => e.buffered(),
            Inner::Engine(a) => a.buffered(),
        }
    }

    /// The smoothed round trip to `peer`, once measured.
    pub fn rtt(&self, peer: NodeId) -> Option<Duration> {
        match &self.inner {
            Inner::Embedded(e) => e.rtt(peer),
            Inner::Engine(a) => a.rtt(peer),
        }
    }
}

impl Endpoint {
    /// Stop sending new work and wait, up to `linger`, until every message
    /// accepted so far is acknowledged or failed (failures are reported
    /// as events and in their handles' states as usual); then stop the
    /// progress thread. `Err(Error::Lingered { unsettled })` when the bound
    /// passed first: those messages' fate is unknown and stays so.
    /// With an engine, the engine drives for up to `linger`, then the
    /// application detaches.
    pub fn close(mut self, linger: Duration) -> Result<(), Error> {
        match &mut self.inner {
            Inner::Embedded(e) => {
                let out = e.linger_for(linger);
                e.stop();
                out
            }
            Inner::Engine(a) => a.close(linger),
        }
    }
}

impl Embedded {
    fn linger_for(&self, linger: Duration) -> Result<(), Error> {
        let start = StdInstant::now();
        match block_on(&self.shared, Some(linger), Awaits::AllSettled, |d| {
            (d.core.unsettled() == 0).then_some(())
        }) {
            Ok(()) => {}
            Err(Error::TimedOut) => {
                return Err(Error::Lingered { unsettled: self.shared.lock().core.unsettled() });
            }
            Err(e) => return Err(e),
        }
        // Settled. ACKs we owe for data peers sent us go out too, so they
        // need not retransmit to a closed endpoint and report it in doubt;
        // but a peer still streaming to us keeps us owing, and must not
        // hold the close: a short grace, whatever remains of the linger.
        let grace =
            (4 * self.shared.lock().core.config().ack_delay).min(linger.saturating_sub(start.elapsed()));
        let _ =
            block_on(&self.shared, Some(grace), Awaits::Anything, |d| (!d.core.owes_acks()).then_some(()));
        Ok(())
    }

    fn stop(&mut self) {
        self.shared.request_stop();
        if let Some(p) = self.progress.take() {
            // The worker lets go at its next turn; a worker stuck that long
            // in another endpoint's step keeps the sockets open until it
            // lets go and the last reference goes, nothing worse (closed
            // now, a descriptor could be reused while it is still in the
            // worker's epoll set).
            p.wake();
            if !progress::wait_dropped(&self.shared.dropped, Duration::from_secs(2)) {
                return;
            }
        }
        // Send handles keep the endpoint's state for their questions, not
        // its sockets: the ports are free once `close` returns.
        self.shared.lock().close_transports();
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        // An engine's client lingers as it goes (`ClientOptions::linger`).
        let Inner::Embedded(e) = &mut self.inner else { return };
        if e.progress.is_some() || !e.shared.stopped() {
            // Accepted messages get their chance before the sockets close
            // (the type's docs); a failure to settle them in time is not
            // reportable from a destructor.
            let _ = e.linger_for(self.linger);
        }
        e.stop();
    }
}

/// A message as the application hands it to `send`: borrowed, and copied
/// into the sender's log, or owned, and kept there as it is.
#[derive(Clone)]
enum Outgoing<'a> {
    Borrowed(&'a [u8]),
    Owned(Bytes),
}

impl Outgoing<'_> {
    fn len(&self) -> usize {
        match self {
            Outgoing::Borrowed(m) => m.len(),
            Outgoing::Owned(m) => m.len(),
        }
    }

    fn join_waiting(&self, core: &mut Core, peer: NodeId) -> Option<MessageId> {
        match self {
            Outgoing::Borrowed(m) => core.join_waiting(peer, m),
            Outgoing::Owned(m) => core.join_waiting_bytes(peer, m),
        }
    }

    fn queue(&self, core: &mut Core, now: Instant, peer: NodeId) -> Result<MessageId, SendError> {
        match self {
            Outgoing::Borrowed(m) => core.send(now, peer, m),
            // A reference count, not a copy.
            Outgoing::Owned(m) => core.send_bytes(now, peer, m.clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    // The test measures wall-clock bounds on real sockets.
    #![allow(clippy::disallowed_methods)]

    use std::sync::Mutex;

    use super::*;

    /// The tests take every leave to drive the process has: one at a time.
    static PERMITS: Mutex<()> = Mutex::new(());

    /// Nodes 0 and 1 on loopback, each the other's peer, each with its
    /// options.
    fn two_on_loopback([a, b]: [Options; 2]) -> [Endpoint; 2] {
        let any = || "127.0.0.1:0".parse().unwrap();
        let eps = [Endpoint::udp(0, any(), &[], a).unwrap(), Endpoint::udp(1, any(), &[], b).unwrap()];
        eps[0].add_peer(1, eps[1].local_addr().unwrap()).unwrap();
        eps[1].add_peer(0, eps[0].local_addr().unwrap()).unwrap();
        eps
    }

    /// A call without leave to drive its endpoint waits for the endpoint's
    /// progress worker, and the worker's step that brings what it waits for
    /// wakes it at once, not at its safety slice (`PARK_SLICE`).
    #[test]
    fn calls_that_may_not_drive_wait_for_the_worker_and_wake_at_once() {
        const ROUND_TRIPS: u32 = 200;
        let eps = two_on_loopback(Default::default());
        // Every leave to drive this process has, taken: each blocking call
        // below waits for the workers.
        let _one = PERMITS.lock().unwrap_or_else(|e| e.into_inner());
        let held: Vec<_> = std::iter::from_fn(leave::Permit::take_drive).collect();
        assert!(!held.is_empty());
        let limit = Some(Duration::from_secs(20));
        let start = StdInstant::now();
        std::thread::scope(|s| {
            let pong = &eps[1];
            s.spawn(move || {
                for i in 0..ROUND_TRIPS {
                    let d = pong.recv(limit).expect("a ping");
                    assert_eq!((d.from, &d.message[..]), (0, &i.to_le_bytes()[..]));
                    pong.send_blocking(0, &i.to_le_bytes(), limit).unwrap();
                }
            });
            for i in 0..ROUND_TRIPS {
                eps[0].send_blocking(1, &i.to_le_bytes(), limit).unwrap();
                let d = eps[0].recv(limit).expect("a pong");
                assert_eq!((d.from, &d.message[..]), (1, &i.to_le_bytes()[..]));
            }
        });
        let took = start.elapsed();
        drop(held);
        // Left to the safety slice, each receive would take 200 ms.
        assert!(took < Duration::from_secs(1), "{ROUND_TRIPS} round trips took {took:?}");
    }

    /// A `flush` without leave to drive wakes when its endpoint's last
    /// message settles (`Awaits::AllSettled`), not at its safety slice.
    #[test]
    fn a_parked_flush_wakes_when_the_last_message_settles() {
        const ROUNDS: u32 = 100;
        let eps = two_on_loopback(Default::default());
        let limit = Some(Duration::from_secs(20));
        let _one = PERMITS.lock().unwrap_or_else(|e| e.into_inner());
        let held: Vec<_> = std::iter::from_fn(leave::Permit::take_drive).collect();
        let start = StdInstant::now();
        for i in 0..ROUNDS {
            let h = eps[0].send(1, &i.to_le_bytes()).unwrap();
            eps[0].flush(limit).unwrap();
            assert_eq!(h.state(), MessageState::Delivered, "settled when flush returned");
        }
        let took = start.elapsed();
        drop(held);
        for i in 0..ROUNDS {
            assert_eq!(&eps[1].recv(limit).unwrap().message[..], &i.to_le_bytes()[..]);
        }
        // Left to the safety slice, each flush would take 200 ms.
        assert!(took < Duration::from_millis(500), "{ROUNDS} flushes took {took:?}");
    }

    /// A timer set by a call the worker did not make (a non-blocking
    /// `send`'s retransmission timeout) is driven by the worker all the
    /// same: here the only thing that can deliver the message, as the
    /// receiver drops the first transmissions and has nothing to say, and
    /// the waiting call may not drive.
    #[test]
    fn the_worker_drives_a_timer_an_application_call_set() {
        let quiet = Options::default();
        // The receiver drops everything that arrives from 100 to 150 ms
        // after it was made.
        let plan = FaultPlan::parse_rules(1, &["drop:p=1,from=100ms,until=150ms,side=recv"]).unwrap();
        let lossy = Options { faults: plan, ..Options::default() };
        let start = StdInstant::now();
        let [a, b] = two_on_loopback([quiet, lossy]);
        let limit = Some(Duration::from_secs(2));
        // A session first, while everything arrives.
        assert_eq!(a.send(1, b"first").unwrap().wait(limit).unwrap(), MessageState::Delivered);
        assert_eq!(&b.recv(limit).unwrap().message[..], b"first");
        std::thread::sleep(Duration::from_millis(110).saturating_sub(start.elapsed()));
        let _one = PERMITS.lock().unwrap_or_else(|e| e.into_inner());
        let held: Vec<_> = std::iter::from_fn(leave::Permit::take_drive).collect();
        let h = a.send(1, b"second").unwrap();
        let state = h.wait(limit);
        drop(held);
        assert_eq!(state.unwrap(), MessageState::Delivered, "retransmitted by the worker");
        assert_eq!(&b.recv(limit).unwrap().message[..], b"second");
    }
}
