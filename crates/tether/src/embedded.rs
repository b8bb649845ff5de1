//! The embedded home of an endpoint's protocol: the core, its rails and
//! its call layer in this process (`shared::Node`), driven by the
//! application's blocking calls and the process's progress workers
//! (Trahay et al. [NMAD] section 4; docs/REFERENCES.md).
//!
//! A fault plan in `Options` (Li et al. [CI]) is applied around it, never
//! inside: its send and receive rules by wrapping each rail's transport
//! (`FaultyTransport`), its `api` rules by wrapping the backend
//! (`api_faults`), so an application can prove it survives failed sends
//! and failed operations.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant as StdInstant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use tether_fault::{FaultCounters, Side};
use tether_io::{FaultHandle, FaultyTransport, Transport};
use tether_proto::{
    CongestionInfo, Delivery, Endpoint as Core, Event, Instant, MessageId, MessageState, Messages, Nacked,
    NodeId, PathInfo, RailId, Received, SendError, SentBatch, Stats, Unreliable, MAX_RAILS,
};

use crate::backend::{Backend, Outgoing};
use crate::call_layer::Calls;
use crate::call_site::Site;
use crate::clock::Clock;
use crate::handle::{Owner, SendHandle};
use crate::options::{Options, Progress};
use crate::shared::{block_on, Awaits, EmbeddedStation, Locked, Shared};
use crate::station::Station;
use crate::waiter::Waiter;
use crate::{leave, progress, Error};

/// The embedded engine: the core and the sockets in this process, driven
/// by the application's calls and the process's progress threads.
pub(crate) struct Embedded {
    pub(crate) shared: Arc<Shared>,
    /// The core's pool of message buffers, reached without the lock.
    messages: tether_proto::MessagePool,
    /// The progress worker serving it; `None` with `Progress::Polling`.
    progress: Option<progress::Assignment>,
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

impl Embedded {
    /// The protocol for `node` over `rails` (rail `i` is `rails[i]`), at
    /// most `MAX_RAILS`. The fault plan applies to every rail, each
    /// drawing from its own seed.
    pub fn open(
        node: NodeId,
        rails: Vec<Box<dyn Transport + Send>>,
        options: &Options,
    ) -> Result<Self, Error> {
        if rails.is_empty() || rails.len() > MAX_RAILS {
            return Err(Error::Rails { given: rails.len() });
        }
        let incarnation = options.incarnation.unwrap_or_else(default_incarnation);
        let mut core = Core::new(options.config.clone(), node, incarnation)?;
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
        let cluster = match &options.cluster {
            Some(c) => Some(
                tether_members::ClusterNode::new(node, incarnation, c, clock.now())
                    .map_err(|e| Error::Cluster(e.to_string()))?,
            ),
            None => None,
        };
        // A member of a cluster takes part in its groups.
        let groups = cluster
            .as_ref()
            .map(|_| tether_members::groups::Groups::new(node, options.groups, core.message_pool()));
        let station = Station::new(core, crate::above::Above::new(calls, cluster, groups), wrapped);
        let served = options.progress == Progress::Thread;
        let shared = Arc::new(Shared::new(station, waiter, clock, options.spin, faults, fds, served));
        let progress = match options.progress {
            Progress::Polling => None,
            Progress::Thread => Some(progress::serve(shared.clone())?),
        };
        if let Some(p) = &progress {
            let _ = shared.worker.set(p.clone());
        }
        Ok(Embedded { shared, messages, progress })
    }
    fn linger_for(&self, linger: Duration) -> Result<(), Error> {
        let start = StdInstant::now();
        match block_on(&self.shared, Some(linger), Awaits::AllSettled, |d| {
            (d.core.unsettled() == 0).then_some(())
        }) {
            Ok(()) => {}
            Err(Error::TimedOut) => {
                let d = self.shared.lock();
                let (unsettled, envelopes) = (
                    d.core.unsettled_on(tether_proto::Channel::APP),
                    d.core.unsettled_on(tether_rpc::CHANNEL),
                );
                return Err(Error::Lingered { unsettled, envelopes });
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

    /// Put what a send queued on the wire if the window allows, or step
    /// the endpoint if nobody has for a while (see `send`).
    fn put_out(&self, d: &mut Locked<'_>, now: Instant) {
        if self.progress.is_some() && d.unstepped_for(now) >= leave::HANDOVER {
            // Nobody has stepped it for a while: the worker is late (on two
            // cores shared with this and other busy threads, by tens of
            // milliseconds). The thread that keeps sending takes in its
            // ACKs and handshake answers itself, on its own share of the
            // CPU: 64 senders filling their buffers at once otherwise held
            // every handshake until they were done, and the few flows
            // whose threads drove their own endpoints had finished before
            // most others had started.
            self.shared.step(d, now);
        } else {
            d.transmit(now);
        }
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

/// The endpoint's calls (see each one's description on `Endpoint`), with
/// the protocol in this process.
impl Backend for Embedded {
    fn node(&self) -> NodeId {
        self.shared.lock().core.node()
    }

    fn local_addr(&self) -> Option<SocketAddr> {
        self.shared.lock().rail(0).and_then(|t| t.local_addr())
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

    fn aggregate(&self) -> Option<CongestionInfo> {
        Some(self.shared.lock().core.aggregate())
    }

    fn max_datagram_to(&self, peer: NodeId) -> Option<usize> {
        Some(self.shared.lock().core.max_datagram_to(peer))
    }

    fn rail_addrs(&self) -> Vec<Option<SocketAddr>> {
        let d = self.shared.lock();
        (0..d.rail_count()).map(|r| d.rail(r as RailId).and_then(|t| t.local_addr())).collect()
    }

    fn rail_counters(&self) -> Vec<tether_io::TransportCounters> {
        let d = self.shared.lock();
        (0..d.rail_count()).map(|r| d.rail(r as RailId).map(|t| t.counters()).unwrap_or_default()).collect()
    }

    fn send(&self, peer: NodeId, msg: Outgoing<'_>) -> Result<SendHandle, Error> {
        let mut d = self.shared.lock();
        // A small message joining others that wait to share a datagram:
        // no clock, no timers, no transmit attempt.
        if let Some(id) = msg.join_waiting(&mut d.core, peer) {
            return Ok(SendHandle::new(Some(id), None, Owner::Embedded(self.shared.clone())));
        }
        let now = self.shared.clock.now();
        d.learn_peer(peer);
        let id = msg.queue(&mut d.core, now, peer)?;
        self.put_out(&mut d, now);
        Ok(SendHandle::new(Some(id), None, Owner::Embedded(self.shared.clone())))
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

    /// As many as the send buffer takes under one lock, then a wait for
    /// room (as `send_blocking`'s) for each further share.
    fn send_batch(
        &self,
        peer: NodeId,
        msgs: &dyn Messages,
        timeout: Option<Duration>,
    ) -> Result<SentBatch, Error> {
        let n = msgs.count();
        let max = self.shared.lock().core.config().max_message_len;
        if let Some(len) = (0..n).map(|i| msgs.message(i).len()).find(|&len| len > max) {
            return Err(SendError::MessageTooLarge { len, max }.into());
        }
        let deadline = timeout.and_then(|t| StdInstant::now().checked_add(t));
        let (mut sent, mut first) = {
            let mut d = self.shared.lock();
            let now = self.shared.clock.now();
            let (k, first) = queue_batch(&mut d, now, peer, msgs, 0)?;
            self.put_out(&mut d, now);
            (k, first)
        };
        while sent < n {
            let left = deadline.map(|d| d.saturating_duration_since(StdInstant::now()));
            // The ids of a batch count up from its first: a share is
            // queued only if no other thread's message to the peer came in
            // since the last (the lock is let go while waiting for room).
            let expect = first.map(|f| MessageId { peer, seq: f.seq + sent as u64 });
            let more = block_on(&self.shared, left, Awaits::Settled, |d| {
                if expect.is_some() && d.core.next_message_id(peer) != expect {
                    return Some(Err(Interleaved));
                }
                let now = self.shared.clock.now();
                match queue_batch(d, now, peer, msgs, sent) {
                    Ok((0, _)) => None,
                    r => {
                        d.transmit(now);
                        Some(r.map_err(Refused))
                    }
                }
            });
            match more {
                Ok(Ok((k, id))) => {
                    sent += k;
                    first = first.or(id);
                }
                Ok(Err(Refused(e))) if sent == 0 => return Err(e.into()),
                Err(e) if sent == 0 => return Err(e),
                // Some were taken: the batch ends short, and what stopped
                // it (another thread's message to the peer between two
                // shares, a wait that ran out, a refusal) is the next
                // call's to meet.
                Ok(Err(_)) | Err(_) => break,
            }
        }
        Ok(SentBatch { first: first.unwrap_or(MessageId { peer, seq: 0 }), count: sent })
    }

    fn recv_batch(&self, out: &mut Received, timeout: Option<Duration>) -> Result<usize, Error> {
        let mut d = self.shared.lock();
        // Fragments would come out as messages of their own.
        if d.core.config().deliver_fragments {
            return Err(Error::Unsupported { what: "recv_batch with Config::deliver_fragments" });
        }
        // Fast path: what is queued costs one lock.
        let taken = take_batch(&mut d, out).is_some();
        drop(d);
        if !taken {
            block_on(&self.shared, timeout, Awaits::Delivery, |d| take_batch(d, out))?;
        }
        Ok(out.len())
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

    fn unsettled(&self) -> u64 {
        self.shared.lock().core.unsettled()
    }

    fn message_state(&self, id: MessageId) -> MessageState {
        self.shared.lock().core.message_state(id)
    }

    fn stats(&self) -> Stats {
        self.shared.lock().core.stats().clone()
    }

    fn fault_counters(&self) -> FaultCounters {
        let mut c = FaultCounters::default();
        for f in self.shared.faults() {
            c.accumulate(&f.snapshot());
        }
        c
    }

    fn set_faults_enabled(&self, on: bool) {
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

    fn base_rto(&self, peer: NodeId) -> Option<Duration> {
        self.shared.lock().core.base_rto(peer)
    }

    fn message_buffer(&self, capacity: usize) -> Vec<u8> {
        self.messages.take(capacity)
    }

    fn seal(&self, buf: Vec<u8>) -> Bytes {
        self.messages.seal(buf)
    }

    fn close(&mut self, linger: Duration) -> Result<(), Error> {
        let out = self.linger_for(linger);
        self.stop();
        out
    }

    fn drop_lingering(&mut self, linger: Duration) {
        if self.progress.is_some() || !self.shared.stopped() {
            // A failure to settle in time is not reportable from a
            // destructor.
            let _ = self.linger_for(linger);
        }
        self.stop();
    }

    fn send_unreliable(&self, peer: NodeId, msg: &[u8]) -> Result<bool, Error> {
        let mut d = self.shared.lock();
        d.learn_peer(peer);
        let queued = d.core.send_unreliable(peer, msg)?;
        d.transmit(self.shared.clock.now());
        Ok(queued)
    }

    fn recv_unreliable(&self, timeout: Option<Duration>) -> Result<Unreliable, Error> {
        if let Some(u) = self.shared.lock().core.recv_unreliable() {
            return Ok(u);
        }
        block_on(&self.shared, timeout, Awaits::Unreliable, |d| d.core.recv_unreliable())
    }

    fn send_nacked(&self, peer: NodeId, msg: &[u8]) -> Result<u64, Error> {
        let mut d = self.shared.lock();
        d.learn_peer(peer);
        let now = self.shared.clock.now();
        let seq = d.core.send_nacked(now, peer, msg)?;
        d.transmit(now);
        Ok(seq)
    }

    fn recv_nacked(&self, timeout: Option<Duration>) -> Result<Nacked, Error> {
        if let Some(m) = self.shared.lock().core.recv_nacked() {
            return Ok(m);
        }
        block_on(&self.shared, timeout, Awaits::Nacked, |d| d.core.recv_nacked())
    }

    fn stats_source(&self) -> crate::publish::Source {
        crate::publish::Source::Embedded(Arc::clone(&self.shared))
    }

    fn calls(&self) -> Site<'_> {
        Site::Embedded(&self.shared)
    }

    fn embedded(&self) -> Option<&Shared> {
        Some(&self.shared)
    }
}

/// Why a share of a batch was not queued.
enum ShareRefused {
    /// Another thread's message to the peer took the next id.
    Interleaved,
    /// The protocol refused it.
    Refused(SendError),
}
use ShareRefused::{Interleaved, Refused};

/// Queue `msgs[from..]` to `peer` while its send buffer has room: how
/// many went and the first one's id, or the error of the first refused
/// for another reason than a full buffer (before any went: one refused
/// for its peer or size refuses them all).
fn queue_batch(
    d: &mut EmbeddedStation,
    now: Instant,
    peer: NodeId,
    msgs: &dyn Messages,
    from: usize,
) -> Result<(usize, Option<MessageId>), SendError> {
    d.learn_peer(peer);
    let mut first = None;
    for i in from..msgs.count() {
        match d.core.send(now, peer, msgs.message(i)) {
            Ok(id) => {
                first.get_or_insert(id);
            }
            Err(SendError::WouldBlock) => return Ok((i - from, first)),
            Err(e) if i == from => return Err(e),
            Err(_) => return Ok((i - from, first)),
        }
    }
    Ok((msgs.count() - from, first))
}

/// Move the application's messages waiting in the core into `out` while
/// they fit: `Some` once it holds any.
fn take_batch(d: &mut EmbeddedStation, out: &mut Received) -> Option<()> {
    while let Some(len) = d.core.next_message_len() {
        if !out.has_room(len) {
            break;
        }
        let m = d.core.recv_message()?;
        out.push(m.from, &m.message);
    }
    (!out.is_empty()).then_some(())
}

impl std::fmt::Debug for Embedded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let d = self.shared.lock();
        f.debug_struct("Endpoint")
            .field("node", &d.core.node())
            .field("incarnation", &d.core.incarnation())
            .field("rails", &d.rail_count())
            .field("peers", &d.core.peers().collect::<Vec<_>>())
            .field("progress_thread", &self.progress.is_some())
            .finish()
    }
}
