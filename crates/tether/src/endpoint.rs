//! The public endpoint: one node's sends, receives, events and calls,
//! whichever home its protocol runs in (`backend`): embedded in this
//! process (`embedded`: the core, its rails and a progress worker) or
//! attached to an engine process on the node (`attached`).

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use tether_fault::{FaultCounters, Injector, Side};
use tether_io::{AddressBook, FaultHandle, Transport, UdpTransport};
use tether_proto::{
    CongestionInfo, Delivery, Event, Instant, MessageId, MessageState, Messages, Nacked, NodeId, PathInfo,
    Received, SentBatch, Stats, Unreliable,
};

use crate::api_faults::ApiFaults;
use crate::attached::Attached;
use crate::backend::{Backend, Outgoing};
use crate::embedded::Embedded;
use crate::handle::SendHandle;
use crate::options::Options;
use crate::Error;

/// A UDP rail at `bind` as `options` ask: its connected sockets, and
/// offload unless turned off.
pub(crate) fn udp(bind: SocketAddr, book: AddressBook, options: &Options) -> Result<UdpTransport, Error> {
    let udp = UdpTransport::bind_with(bind, book, options.connected_peers)?;
    Ok(if options.offload { udp } else { udp.without_offload() })
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
    /// Where its protocol runs: in this process or in an engine's.
    pub(crate) backend: Box<dyn Backend>,
    linger: Duration,
    /// Its board, if it publishes one (`Options::publish_stats`).
    board: Option<crate::publish::Publisher>,
    /// Its metrics listener, if it serves one (`Options::metrics`).
    #[cfg(feature = "metrics")]
    metrics: Option<crate::metrics::MetricsServer>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.backend.fmt(f)
    }
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
        let transport = udp(bind, book, &options)?;
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
            .map(|&b| {
                let udp = udp(b, AddressBook::new(), &options)?;
                Ok(Box::new(udp) as Box<dyn Transport + Send>)
            })
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
        let plan = &options.faults;
        // Made before anything is bound or started: a plan it refuses
        // leaves nothing behind (no socket, no progress worker).
        let api = if plan.touches(Side::Api) {
            // The same derivation as the simulator's: a node's faults are
            // the same stream whether it runs there or over sockets.
            let seed = tether_fault::node_seed(plan.seed, node) ^ 0xA91;
            Some(Injector::with_seed(plan, seed)?)
        } else {
            None
        };
        let embedded = Embedded::open(node, rails, &options)?;
        let backend: Box<dyn Backend> = match api {
            Some(injector) => {
                let origin = embedded.now();
                Box::new(ApiFaults::new(embedded, injector, origin))
            }
            None => Box::new(embedded),
        };
        Endpoint::new(backend, options.linger).operable(options.publish_stats.as_deref(), options.metrics)
    }

    /// Attach to the engine serving `dir` as `node` (`Builder::engine`).
    pub(crate) fn attached(
        node: NodeId,
        dir: &std::path::Path,
        options: tether_attach::ClientOptions,
        calls: crate::attached::CallSetup<'_>,
        linger: Duration,
        publish: Option<&std::path::Path>,
        metrics: Option<SocketAddr>,
    ) -> Result<Self, Error> {
        let backend = Box::new(Attached::attach(dir, node, options, calls)?);
        Endpoint::new(backend, linger).operable(publish, metrics)
    }

    fn new(backend: Box<dyn Backend>, linger: Duration) -> Self {
        Endpoint {
            backend,
            linger,
            board: None,
            #[cfg(feature = "metrics")]
            metrics: None,
        }
    }

    /// Publish on a board in `dir` and serve metrics at `metrics`, where
    /// given (docs/OPERATING.md).
    fn operable(mut self, dir: Option<&std::path::Path>, metrics: Option<SocketAddr>) -> Result<Self, Error> {
        let rails: Vec<String> = self.backend.rail_addrs().iter().flatten().map(|a| a.to_string()).collect();
        if let Some(dir) = dir {
            let source = self.backend.stats_source();
            let calls = self.backend.calls().host();
            self.board =
                Some(crate::publish::Publisher::start(dir, self.node(), source, calls, rails.clone())?);
        }
        if let Some(addr) = metrics {
            #[cfg(feature = "metrics")]
            {
                let (source, calls) = (self.backend.stats_source(), self.backend.calls().host());
                let started = std::time::Instant::now();
                let snapshot = move || vec![source.snapshot(&calls, started, &rails)];
                self.metrics = Some(crate::metrics::MetricsServer::serve(addr, snapshot)?);
            }
            #[cfg(not(feature = "metrics"))]
            {
                let _ = addr;
                return Err(Error::Unsupported { what: "serving metrics without the `metrics` feature" });
            }
        }
        Ok(self)
    }

    /// Send `msg` to `peer` unreliably: once, whole, in one datagram,
    /// never acknowledged, ordered or sent again (the UNR class of Li et
    /// al. [CI]: heartbeats, status, anything a newer copy replaces). It
    /// is authenticated and its source validated as every datagram of the
    /// session is; with a cluster key a replayed copy is dropped. `Ok(true)`:
    /// queued; `Ok(false)`: the queue to the peer was full and the message
    /// was dropped (counted in `Stats::unreliable_dropped`), which is the
    /// class's answer to overload. At most `max_unreliable_len` bytes.
    /// Embedded endpoints only, for now.
    pub fn send_unreliable(&self, peer: NodeId, msg: &[u8]) -> Result<bool, Error> {
        self.backend.send_unreliable(peer, msg)
    }

    /// The next unreliable message from any peer, waiting up to `timeout`
    /// (`None`: for ever; `Err(Error::TimedOut)` past it, as `recv`).
    pub fn recv_unreliable(&self, timeout: Option<Duration>) -> Result<Unreliable, Error> {
        self.backend.recv_unreliable(timeout)
    }

    /// Send `msg` to `peer` in the NACK-reliable class (Li et al. [CI]:
    /// the request-confirm traffic whose answer is its acknowledgement):
    /// sent once and never acknowledged; the peer asks for what it misses,
    /// and this endpoint holds each message for `Config::nacked_hold` to
    /// answer. The peer gets each sender's messages in order, once each,
    /// skipping only those asked for too late. The message's number; what
    /// became of it comes as `Event::Nacked` (never asked for, repaired,
    /// or lost). `Error::Send(SendError::WouldBlock)`: the hold is full
    /// (it empties as `nacked_hold` passes). At most `max_unreliable_len`
    /// less 17 bytes. Embedded endpoints only, for now.
    pub fn send_nacked(&self, peer: NodeId, msg: &[u8]) -> Result<u64, Error> {
        self.backend.send_nacked(peer, msg)
    }

    /// The next NACK-reliable message from any peer, waiting up to
    /// `timeout` (`None`: for ever; `Err(Error::TimedOut)` past it).
    pub fn recv_nacked(&self, timeout: Option<Duration>) -> Result<Nacked, Error> {
        self.backend.recv_nacked(timeout)
    }

    /// The view of the cluster this node holds (`Builder::cluster`): its
    /// epoch and members; `None` without a cluster (or attached to an
    /// engine, for now).
    pub fn view(&self) -> Option<crate::cluster::View> {
        self.backend.embedded().and_then(crate::cluster::view)
    }

    /// The next cluster event (a new view, a suspicion, this node removed),
    /// waiting up to `timeout` (`None`: for ever; `Err(Error::TimedOut)`
    /// past it). Each view comes once, in epoch order, as long as the
    /// application takes them (the oldest of more than
    /// `tether_members::node::MAX_EVENTS` waiting goes, counted).
    /// `Error::Unsupported` without `Builder::cluster`.
    pub fn next_cluster_event(
        &self,
        timeout: Option<Duration>,
    ) -> Result<crate::cluster::ClusterEvent, Error> {
        let shared = self.embedded_for("cluster membership through an engine (not yet)")?;
        crate::cluster::next_event(shared, timeout)
    }

    /// The embedded endpoint's state, for what an engine-attached one
    /// does not have yet (`what`).
    fn embedded_for(&self, what: &'static str) -> Result<&crate::shared::Shared, Error> {
        self.backend.embedded().ok_or(Error::Unsupported { what })
    }

    /// Ask to join `group` (docs/CLUSTER.md, "Groups"): a change of the
    /// view the managers decide; the group's view then comes as
    /// `GroupOutput::View` (`next_group_output`). Kept after this node is
    /// removed and rejoins.
    pub fn join_group(&self, group: crate::cluster::GroupId) -> Result<(), Error> {
        let shared = self.embedded_for("groups through an engine (not yet)")?;
        crate::cluster::set_group(shared, group, true)
    }

    /// Ask to leave `group`.
    pub fn leave_group(&self, group: crate::cluster::GroupId) -> Result<(), Error> {
        let shared = self.embedded_for("groups through an engine (not yet)")?;
        crate::cluster::set_group(shared, group, false)
    }

    /// Multicast `message` to `group`: every member of the group's view it
    /// is ordered in delivers it, all in one order, and a member that
    /// survives into the next view delivered it if any survivor did
    /// (virtual synchrony). Waits up to `timeout` while too many of this
    /// node's messages to the group are not yet delivered
    /// (`Some(Duration::ZERO)`: not at all; `Error::Group(GroupError::Full)`
    /// past it). Its number among this node's messages to the group
    /// (`GroupMessage::n`).
    pub fn multicast(
        &self,
        group: crate::cluster::GroupId,
        message: &[u8],
        timeout: Option<Duration>,
    ) -> Result<u64, Error> {
        let shared = self.embedded_for("groups through an engine (not yet)")?;
        crate::cluster::multicast(shared, group, Bytes::copy_from_slice(message), timeout)
    }

    /// The next delivery or view of this node's groups, in order, waiting
    /// up to `timeout` (`Err(Error::TimedOut)` past it).
    pub fn next_group_output(&self, timeout: Option<Duration>) -> Result<crate::cluster::GroupOutput, Error> {
        let shared = self.embedded_for("groups through an engine (not yet)")?;
        crate::cluster::next_group_output(shared, timeout)
    }

    /// The view of `group` this node delivers in: (epoch, members).
    pub fn group_view(&self, group: crate::cluster::GroupId) -> Option<(u64, Vec<NodeId>)> {
        self.backend.embedded().and_then(|s| crate::cluster::group_view(s, group))
    }

    /// This node's group counters.
    pub fn group_stats(&self) -> Option<crate::cluster::GroupStats> {
        self.backend.embedded().and_then(crate::cluster::group_stats)
    }

    /// The next cluster event, if one waits.
    pub fn poll_cluster_event(&self) -> Option<crate::cluster::ClusterEvent> {
        self.backend.embedded().and_then(crate::cluster::poll_event)
    }

    /// This node's cluster counters (`None` without a cluster).
    pub fn cluster_stats(&self) -> Option<crate::cluster::ClusterStats> {
        self.backend.embedded().and_then(crate::cluster::stats)
    }

    /// Where this endpoint serves its metrics (`Builder::metrics`), if it
    /// does.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        #[cfg(feature = "metrics")]
        return self.metrics.as_ref().map(|m| m.local_addr());
        #[cfg(not(feature = "metrics"))]
        None
    }
}

impl Endpoint {
    /// This endpoint's node id.
    pub fn node(&self) -> NodeId {
        self.backend.node()
    }

    /// The local socket address, for transports that have one.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.backend.local_addr()
    }

    /// Learn (or change) the address a peer is reached at (over rail 0).
    pub fn add_peer(&self, node: NodeId, addr: SocketAddr) -> Result<(), Error> {
        self.backend.add_peer(node, addr)
    }

    /// Learn the addresses a peer is reached at, one per rail (`addrs[i]`
    /// over rail `i`): the address book per rail, and the core's paths.
    /// With two or more, the paths' health is tracked and data fails over.
    pub fn add_peer_rails(&self, node: NodeId, addrs: &[SocketAddr]) -> Result<(), Error> {
        self.backend.add_peer_rails(node, addrs)
    }

    /// This endpoint's clock, as the core reads it (event times are on it).
    pub fn now(&self) -> Instant {
        self.backend.now()
    }

    /// The paths to `peer`, one per rail: state, RTT, counters.
    pub fn paths(&self, peer: NodeId) -> Vec<PathInfo> {
        self.backend.paths(peer)
    }

    /// The congestion state of the stream toward `peer`: window, bytes in
    /// flight, the controller's state, the pacing rate. `None` for a peer
    /// with no state yet, and in engine mode (the engine keeps it).
    pub fn congestion(&self, peer: NodeId) -> Option<CongestionInfo> {
        self.backend.congestion(peer)
    }

    /// The window all this endpoint's streams share (what they have in
    /// flight together; docs/ARCHITECTURE.md, "The endpoint's window").
    /// `None` in engine mode (the engine keeps it).
    pub fn aggregate(&self) -> Option<CongestionInfo> {
        self.backend.aggregate()
    }

    /// The largest datagram sent to `peer`, header included: the size its
    /// handshake proved the path carries (this endpoint's own largest
    /// before one). `None` in engine mode (the engine's session).
    pub fn max_datagram_to(&self, peer: NodeId) -> Option<usize> {
        self.backend.max_datagram_to(peer)
    }

    /// The local address of each rail.
    pub fn rail_addrs(&self) -> Vec<Option<SocketAddr>> {
        self.backend.rail_addrs()
    }

    /// What each rail's transport did (datagrams, system calls, runs the
    /// kernel segmented and coalesced), rail `i` at `i`; empty for an
    /// endpoint attached to an engine, whose rails are the engine's.
    pub fn rail_counters(&self) -> Vec<crate::transport::TransportCounters> {
        self.backend.rail_counters()
    }

    /// Queue a message and put it on the wire at once if the window allows.
    /// Never blocks: a full send buffer is `Error::Send(SendError::WouldBlock)`.
    /// With `api` fault rules, the call may instead fail at once with a
    /// typed transport error (an invocation fault) or return a handle that
    /// reports `Failed(OperationFault)` (an operation fault).
    pub fn send(&self, peer: NodeId, msg: &[u8]) -> Result<SendHandle, Error> {
        self.backend.send(peer, Outgoing::Borrowed(msg))
    }

    /// Like `send`, but waits for room in the send buffer.
    pub fn send_blocking(
        &self,
        peer: NodeId,
        msg: &[u8],
        timeout: Option<Duration>,
    ) -> Result<SendHandle, Error> {
        self.backend.send_blocking(peer, Outgoing::Borrowed(msg), timeout)
    }

    /// Like `send`, for a message handed over whole: the sender's log keeps
    /// these very bytes until they are acknowledged, so none is copied but
    /// into each datagram (fused with the checksum). `send` copies the
    /// message into the log first. In engine mode the bytes are copied into
    /// the shared ring either way.
    pub fn send_bytes(&self, peer: NodeId, msg: Bytes) -> Result<SendHandle, Error> {
        self.backend.send(peer, Outgoing::Owned(msg))
    }

    /// Like `send_bytes`, but waits for room in the send buffer.
    pub fn send_bytes_blocking(
        &self,
        peer: NodeId,
        msg: Bytes,
        timeout: Option<Duration>,
    ) -> Result<SendHandle, Error> {
        self.backend.send_blocking(peer, Outgoing::Owned(msg), timeout)
    }

    /// Send `msgs` to `peer`, in order, in one call: their ids count up
    /// from `SentBatch::first` (follow each with `message_state`). A
    /// message too large refuses the whole batch, nothing sent. Waits up
    /// to `timeout` in all for room in the send buffer; once some are
    /// taken, a wait that runs out ends the batch short
    /// (`SentBatch::count`). Embedded, the batch takes the endpoint's lock
    /// and tries the wire once; attached to an engine, it is one doorbell
    /// for all, and between two applications on one engine the messages
    /// are packed into as few ring records as fit (docs/ENGINE.md, "The
    /// batch API").
    pub fn send_batch<M: Messages + ?Sized>(
        &self,
        peer: NodeId,
        msgs: &M,
        timeout: Option<Duration>,
    ) -> Result<SentBatch, Error> {
        self.backend.send_batch(peer, &Batch(msgs), timeout)
    }

    /// Wait up to `timeout` for at least one message, then take as many
    /// as have come and fit into `out` (cleared first; its memory is kept
    /// from call to call, so a steady stream of receipts allocates
    /// nothing for them). How many it holds: `out.iter()` gives each
    /// sender and message, in the order `recv` would have.
    pub fn recv_batch(&self, out: &mut Received, timeout: Option<Duration>) -> Result<usize, Error> {
        out.clear();
        self.backend.recv_batch(out, timeout)
    }

    /// An empty buffer of at least `capacity` bytes for a message to be
    /// written into and handed over with [`Endpoint::seal`] and
    /// [`Endpoint::send_bytes`]: from the endpoint's pool when the size is
    /// one it keeps (16 KiB to 4 MiB), its pages already mapped. A stream
    /// of large messages sent this way allocates nothing once the pool is
    /// warm: each buffer comes back when its message is acknowledged.
    pub fn message_buffer(&self, capacity: usize) -> Vec<u8> {
        self.backend.message_buffer(capacity)
    }

    /// `buf` (best taken from [`Endpoint::message_buffer`]) as the
    /// [`Bytes`] to hand to [`Endpoint::send_bytes`]: when the last
    /// reference to it is dropped (the log's, once the message is
    /// acknowledged) the buffer returns to the endpoint's pool. In engine
    /// mode the message is copied into the shared ring, and `buf` freed.
    pub fn seal(&self, buf: Vec<u8>) -> Bytes {
        self.backend.seal(buf)
    }

    /// The next delivered message, if one is waiting. Drives progress once
    /// when no progress thread does.
    pub fn try_recv(&self) -> Option<Delivery> {
        self.backend.try_recv()
    }

    /// Wait for the next delivered message.
    pub fn recv(&self, timeout: Option<Duration>) -> Result<Delivery, Error> {
        self.backend.recv(timeout)
    }

    /// The next event (peer unreachable, restarted or reachable again, a
    /// path's state changing, a failover), if one is waiting.
    pub fn poll_event(&self) -> Option<Event> {
        self.backend.poll_event()
    }

    /// Wait for the next event (peer unreachable, restarted, reachable).
    pub fn next_event(&self, timeout: Option<Duration>) -> Result<Event, Error> {
        self.backend.next_event(timeout)
    }

    /// One non-blocking step of progress (the polling mode's engine).
    pub fn progress(&self) {
        self.backend.progress()
    }

    /// Wait until everything sent has been acknowledged or failed.
    pub fn flush(&self, timeout: Option<Duration>) -> Result<(), Error> {
        self.backend.flush(timeout)
    }

    /// Where a sent message stands (as its handle's `state`).
    pub fn message_state(&self, id: MessageId) -> MessageState {
        self.backend.message_state(id)
    }

    /// Messages sent and not yet acknowledged or failed, over every peer
    /// (0: `flush` would return at once).
    pub fn unsettled(&self) -> u64 {
        self.backend.unsettled()
    }

    /// The protocol's counters: traffic, retransmissions, and every drop by reason.
    pub fn stats(&self) -> Stats {
        self.backend.stats()
    }

    /// Faults injected so far by this endpoint's fault plan, every side.
    pub fn fault_counters(&self) -> FaultCounters {
        self.backend.fault_counters()
    }

    /// Switch the fault plan off (`false`) or back on, on every side.
    pub fn set_faults_enabled(&self, on: bool) {
        self.backend.set_faults_enabled(on)
    }

    /// Rail 0's fault injector, for its trace and completion statuses.
    pub fn fault_handle(&self) -> Option<FaultHandle> {
        self.backend.fault_handle()
    }

    /// Bytes held in send buffers and delivery queues: back to zero when
    /// everything sent has been acknowledged and everything delivered read.
    pub fn buffered(&self) -> (usize, usize) {
        self.backend.buffered()
    }

    /// The smoothed round trip to `peer`, once measured.
    pub fn rtt(&self, peer: NodeId) -> Option<Duration> {
        self.backend.rtt(peer)
    }

    /// The retransmission timer to `peer` without back-off: the smoothed
    /// round trip plus four times its variation (at least 100 us),
    /// clamped to `Config::rto_min` and `rto_max`; `None` before a round
    /// trip was measured, and through an engine (whose core keeps it).
    pub fn base_rto(&self, peer: NodeId) -> Option<Duration> {
        self.backend.base_rto(peer)
    }
}

impl Endpoint {
    /// Stop sending new work and wait, up to `linger`, until every message
    /// accepted so far is acknowledged or failed (failures are reported
    /// as events and in their handles' states as usual); then stop the
    /// progress thread. `Err(Error::Lingered { unsettled, envelopes })` when the bound
    /// passed first: those messages' fate is unknown and stays so.
    /// With an engine, the engine drives for up to `linger`, then the
    /// application detaches.
    pub fn close(mut self, linger: Duration) -> Result<(), Error> {
        self.board.take();
        #[cfg(feature = "metrics")]
        self.metrics.take();
        self.backend.close(linger)
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.board.take();
        #[cfg(feature = "metrics")]
        self.metrics.take();
        self.backend.drop_lingering(self.linger);
    }
}

/// A batch of any kind (a slice is unsized) as the one trait object a
/// backend takes.
struct Batch<'a, M: ?Sized>(&'a M);

impl<M: Messages + ?Sized> Messages for Batch<'_, M> {
    fn count(&self) -> usize {
        self.0.count()
    }
    fn message(&self, i: usize) -> &[u8] {
        self.0.message(i)
    }
}
