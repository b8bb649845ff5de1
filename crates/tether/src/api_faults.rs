//! Faults on the application's own calls (Li et al. [CI]: invocation and
//! operation faults; docs/FAULTS.md), as a decorator around an endpoint's
//! backend: each send draws a verdict from the fault plan's `api` rules
//! before it reaches the protocol, which has no fault branch of its own
//! (TigerBeetle's discipline: fault injection wraps the real parts, it does
//! not live inside them). An endpoint whose plan has no `api` rules has no
//! decorator at all.
//!
//! - an invocation fault: the call fails at once with a typed transport
//!   error, and nothing is sent;
//! - an operation fault that drops: the call returns a handle reporting
//!   `Failed(OperationFault)`, and nothing is sent;
//! - an operation fault that does not: the message goes, yet its handle
//!   says it failed (the application cannot tell which, as with a real
//!   lost completion).
//!
//! A batch send is one call, with one verdict for all its messages. An
//! operation fault on it lets the messages go and reports every one of
//! them failed (`message_state`): a message's id exists only once the
//! protocol has it, so a batch's messages cannot be failed unsent.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use tether_fault::{CallVerdict, FaultCounters, Injector};
use tether_io::{error_of, FaultHandle};
use tether_proto::{
    CongestionInfo, Delivery, Event, FailReason, Instant, MessageId, MessageState, Messages, Nacked, NodeId,
    PathInfo, Received, SentBatch, Stats, Unreliable,
};

use crate::backend::{Backend, Outgoing};
use crate::call_site::Site;
use crate::handle::SendHandle;
use crate::Error;

/// A backend whose sends are struck by the fault plan's `api` rules.
pub(crate) struct ApiFaults<B> {
    inner: B,
    /// The injector, and the time its schedule counts from.
    injector: Mutex<(Injector, Instant)>,
    /// Batches struck by operation faults, whose messages report failed:
    /// the latest `STRUCK_BATCHES` (older ones report what the protocol
    /// says of them).
    struck_batches: Mutex<VecDeque<SentBatch>>,
}

/// How many operation-struck batches are remembered.
const STRUCK_BATCHES: usize = 1024;

impl<B: Backend> ApiFaults<B> {
    /// `inner` with `injector` drawing from `origin` on (the backend's clock).
    pub fn new(inner: B, injector: Injector, origin: Instant) -> Self {
        ApiFaults { inner, injector: Mutex::new((injector, origin)), struck_batches: Mutex::default() }
    }

    fn verdict(&self) -> CallVerdict {
        let now = self.inner.now();
        let mut guard = self.injector.lock().unwrap_or_else(|e| e.into_inner());
        let (injector, origin) = &mut *guard;
        injector.on_call(Duration::from_nanos(now.saturating_since(*origin).as_nanos() as u64))
    }

    /// Send as `send` says, unless the verdict strikes first.
    fn struck(&self, send: impl FnOnce() -> Result<SendHandle, Error>) -> Result<SendHandle, Error> {
        match self.verdict() {
            CallVerdict::Proceed => send(),
            CallVerdict::Invocation(e) => Err(Error::Transport(error_of(e))),
            CallVerdict::Operation { dropped: true, .. } => {
                Ok(SendHandle::never_sent(FailReason::OperationFault))
            }
            CallVerdict::Operation { dropped: false, .. } => {
                send().map(|h| h.reported_failed(FailReason::OperationFault))
            }
        }
    }
}

/// As the backend it decorates.
impl<B: Backend> std::fmt::Debug for ApiFaults<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.fmt(f)
    }
}

impl<B: Backend> Backend for ApiFaults<B> {
    fn send(&self, peer: NodeId, msg: Outgoing<'_>) -> Result<SendHandle, Error> {
        self.struck(|| self.inner.send(peer, msg))
    }

    fn send_blocking(
        &self,
        peer: NodeId,
        msg: Outgoing<'_>,
        timeout: Option<Duration>,
    ) -> Result<SendHandle, Error> {
        self.struck(|| self.inner.send_blocking(peer, msg, timeout))
    }

    fn send_batch(
        &self,
        peer: NodeId,
        msgs: &dyn Messages,
        timeout: Option<Duration>,
    ) -> Result<SentBatch, Error> {
        match self.verdict() {
            CallVerdict::Proceed => self.inner.send_batch(peer, msgs, timeout),
            CallVerdict::Invocation(e) => Err(Error::Transport(error_of(e))),
            CallVerdict::Operation { .. } => {
                let sent = self.inner.send_batch(peer, msgs, timeout)?;
                let mut struck = self.struck_batches.lock().unwrap_or_else(|e| e.into_inner());
                if struck.len() == STRUCK_BATCHES {
                    struck.pop_front();
                }
                struck.push_back(sent);
                Ok(sent)
            }
        }
    }

    fn message_state(&self, id: MessageId) -> MessageState {
        let struck = self.struck_batches.lock().unwrap_or_else(|e| e.into_inner());
        let hit = |b: &SentBatch| {
            b.first.peer == id.peer && (b.first.seq..b.first.seq + b.count as u64).contains(&id.seq)
        };
        if struck.iter().any(hit) {
            return MessageState::Failed(FailReason::OperationFault);
        }
        drop(struck);
        self.inner.message_state(id)
    }

    /// The transports' injectors' counters and this one's.
    fn fault_counters(&self) -> FaultCounters {
        let mut c = self.inner.fault_counters();
        c.accumulate(&self.injector.lock().unwrap_or_else(|e| e.into_inner()).0.counters());
        c
    }

    fn set_faults_enabled(&self, on: bool) {
        self.injector.lock().unwrap_or_else(|e| e.into_inner()).0.set_enabled(on);
        self.inner.set_faults_enabled(on);
    }

    // Everything else as the backend does it.

    fn node(&self) -> NodeId {
        self.inner.node()
    }

    fn local_addr(&self) -> Option<SocketAddr> {
        self.inner.local_addr()
    }

    fn add_peer(&self, node: NodeId, addr: SocketAddr) -> Result<(), Error> {
        self.inner.add_peer(node, addr)
    }

    fn add_peer_rails(&self, node: NodeId, addrs: &[SocketAddr]) -> Result<(), Error> {
        self.inner.add_peer_rails(node, addrs)
    }

    fn now(&self) -> Instant {
        self.inner.now()
    }

    fn paths(&self, peer: NodeId) -> Vec<PathInfo> {
        self.inner.paths(peer)
    }

    fn congestion(&self, peer: NodeId) -> Option<CongestionInfo> {
        self.inner.congestion(peer)
    }

    fn aggregate(&self) -> Option<CongestionInfo> {
        self.inner.aggregate()
    }

    fn max_datagram_to(&self, peer: NodeId) -> Option<usize> {
        self.inner.max_datagram_to(peer)
    }

    fn rail_addrs(&self) -> Vec<Option<SocketAddr>> {
        self.inner.rail_addrs()
    }

    fn rail_counters(&self) -> Vec<tether_io::TransportCounters> {
        self.inner.rail_counters()
    }

    fn message_buffer(&self, capacity: usize) -> Vec<u8> {
        self.inner.message_buffer(capacity)
    }

    fn seal(&self, buf: Vec<u8>) -> Bytes {
        self.inner.seal(buf)
    }

    fn try_recv(&self) -> Option<Delivery> {
        self.inner.try_recv()
    }

    fn recv(&self, timeout: Option<Duration>) -> Result<Delivery, Error> {
        self.inner.recv(timeout)
    }

    fn recv_batch(&self, out: &mut Received, timeout: Option<Duration>) -> Result<usize, Error> {
        self.inner.recv_batch(out, timeout)
    }

    fn poll_event(&self) -> Option<Event> {
        self.inner.poll_event()
    }

    fn next_event(&self, timeout: Option<Duration>) -> Result<Event, Error> {
        self.inner.next_event(timeout)
    }

    fn progress(&self) {
        self.inner.progress()
    }

    fn flush(&self, timeout: Option<Duration>) -> Result<(), Error> {
        self.inner.flush(timeout)
    }

    fn stats(&self) -> Stats {
        self.inner.stats()
    }

    fn fault_handle(&self) -> Option<FaultHandle> {
        self.inner.fault_handle()
    }

    fn buffered(&self) -> (usize, usize) {
        self.inner.buffered()
    }

    fn rtt(&self, peer: NodeId) -> Option<Duration> {
        self.inner.rtt(peer)
    }

    fn base_rto(&self, peer: NodeId) -> Option<Duration> {
        self.inner.base_rto(peer)
    }

    fn close(&mut self, linger: Duration) -> Result<(), Error> {
        self.inner.close(linger)
    }

    fn drop_lingering(&mut self, linger: Duration) {
        self.inner.drop_lingering(linger)
    }

    fn send_unreliable(&self, peer: NodeId, msg: &[u8]) -> Result<bool, Error> {
        self.inner.send_unreliable(peer, msg)
    }

    fn recv_unreliable(&self, timeout: Option<Duration>) -> Result<Unreliable, Error> {
        self.inner.recv_unreliable(timeout)
    }

    fn send_nacked(&self, peer: NodeId, msg: &[u8]) -> Result<u64, Error> {
        self.inner.send_nacked(peer, msg)
    }

    fn recv_nacked(&self, timeout: Option<Duration>) -> Result<Nacked, Error> {
        self.inner.recv_nacked(timeout)
    }

    fn unsettled(&self) -> u64 {
        self.inner.unsettled()
    }

    fn embedded(&self) -> Option<&crate::shared::Shared> {
        self.inner.embedded()
    }

    fn stats_source(&self) -> crate::publish::Source {
        self.inner.stats_source()
    }

    fn calls(&self) -> Site<'_> {
        self.inner.calls()
    }
}
