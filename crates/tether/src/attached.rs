//! An endpoint whose protocol runs in the node's `tether engine` process
//! (docs/ENGINE.md; Zhou et al. [FTGM], the engine in the role of their
//! network card): the `Endpoint` calls, answered through the shared-memory
//! rings of a `tether_attach::Client`. The engine owns the sockets, the
//! core and its timers; this process keeps the host-side backup (every
//! unsettled message, where it stands in each stream), so an engine that
//! dies or hangs is replaced with nothing lost and the application only
//! sees an `Event::EngineRecovered`.
//!
//! The core's counters and the engine's fault injectors' counts come from
//! the engine (`stats`, `fault_counters`: reported every 50 ms while they
//! change, summed over every engine that served the endpoint). What the
//! engine keeps to itself is not reported here yet: paths, round trips and
//! buffers (`paths` is empty, `rtt` `None`, `buffered` zero). Fault injection belongs
//! to the engine's side (`tether engine`), not to the application's calls.
//!
//! Calls (`Endpoint::request`, `serve`) run their layer here, in the
//! application's process, over the engine's client (`attached_calls`).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tether_attach::{Client, ClientOptions, EngineError};
use tether_io::FaultHandle;
use tether_proto::{
    CongestionInfo, Delivery, Event, Instant, MessageId, MessageState, Messages, Nacked, NodeId, PathInfo,
    Received, SendError, SentBatch, Stats, Unreliable,
};

use crate::attached_calls::AttachedCalls;
use crate::backend::{Backend, Outgoing};
use crate::call_layer::Calls;
use crate::call_log::CallLogOptions;
use crate::call_site::Site;
use crate::clock::Clock;
use crate::faults::FaultCounters;
use crate::handle::{Owner, SendHandle};
use crate::Error;

pub(crate) struct Attached {
    /// Shared with the calls' pump, while it runs.
    pub(crate) client: Arc<Client>,
    clock: Clock,
    pub(crate) calls: Arc<AttachedCalls>,
}

/// How an attached endpoint's calls are set up (`Builder::calls`,
/// `call_log`, `caller_log`).
pub(crate) struct CallSetup<'a> {
    pub config: tether_rpc::RpcConfig,
    pub log: Option<&'a CallLogOptions>,
    pub caller_log: Option<&'a CallLogOptions>,
}

impl std::fmt::Debug for Attached {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Attached")
            .field("node", &self.client.node())
            .field("engine_pid", &self.client.engine_pid())
            .finish()
    }
}

impl From<EngineError> for Error {
    fn from(e: EngineError) -> Self {
        match e {
            EngineError::Timeout => Error::TimedOut,
            EngineError::Send(s) => Error::Send(s),
            EngineError::UnknownPeer(n) => Error::Send(SendError::UnknownPeer(n)),
            EngineError::Transport(t) => Error::Transport(t),
            EngineError::Config(c) => Error::Config(c),
            other => Error::Engine(other),
        }
    }
}

impl Attached {
    /// Attach, and open the calls' logs. A server's or a caller's log
    /// means calls from an earlier life may be asked about or finished at
    /// once: the calls' pump starts now; otherwise with the first use of
    /// calls (until then their envelopes are dropped as they come).
    pub fn attach(
        dir: &Path,
        node: NodeId,
        options: ClientOptions,
        calls: CallSetup<'_>,
    ) -> Result<Self, Error> {
        let client = Arc::new(Client::attach(dir, node, options)?);
        let clock = Clock::new();
        let logged = calls.log.is_some() || calls.caller_log.is_some();
        let life = client.incarnation();
        let calls = Calls::open(calls.config, life, calls.log, calls.caller_log, clock.now())?;
        let attached = Attached { client, clock, calls: AttachedCalls::new(calls, clock) };
        if logged {
            attached.start_calls()?;
        }
        Ok(attached)
    }

    /// Start the calls' pump, if it is not running.
    pub fn start_calls(&self) -> Result<(), Error> {
        self.calls.start(&self.client)
    }

    /// Send through the client: an owned message is kept by reference
    /// until it is settled, a borrowed one copied.
    fn send_with(
        &self,
        peer: NodeId,
        msg: &Outgoing<'_>,
        timeout: Option<Duration>,
    ) -> Result<MessageId, EngineError> {
        match msg {
            Outgoing::Borrowed(m) => self.client.send(peer, m, timeout),
            Outgoing::Owned(m) => self.client.send_bytes(peer, m, timeout),
        }
    }

    fn handle(&self, id: MessageId) -> SendHandle {
        SendHandle::new(Some(id), None, Owner::Engine(self.client.tracker()))
    }
}

/// The endpoint's calls (see each one's description on `Endpoint`), with
/// the protocol in the engine.
impl Backend for Attached {
    fn node(&self) -> NodeId {
        self.client.node()
    }

    /// The engine's sockets are its own.
    fn local_addr(&self) -> Option<SocketAddr> {
        None
    }

    fn add_peer(&self, node: NodeId, addr: SocketAddr) -> Result<(), Error> {
        self.add_peer_rails(node, &[addr])
    }

    fn add_peer_rails(&self, node: NodeId, addrs: &[SocketAddr]) -> Result<(), Error> {
        Ok(self.client.add_peer_rails(node, addrs)?)
    }

    fn now(&self) -> Instant {
        self.clock.now()
    }

    fn paths(&self, _peer: NodeId) -> Vec<PathInfo> {
        Vec::new()
    }

    /// The engine keeps the congestion state.
    fn congestion(&self, _peer: NodeId) -> Option<CongestionInfo> {
        None
    }

    fn aggregate(&self) -> Option<CongestionInfo> {
        None
    }

    /// The engine's session.
    fn max_datagram_to(&self, _peer: NodeId) -> Option<usize> {
        None
    }

    fn rail_addrs(&self) -> Vec<Option<SocketAddr>> {
        Vec::new()
    }

    fn rail_counters(&self) -> Vec<tether_io::TransportCounters> {
        Vec::new()
    }

    /// Never waits: a full submission ring is `WouldBlock`, as a full send
    /// buffer is for an embedded endpoint.
    fn send(&self, peer: NodeId, msg: Outgoing<'_>) -> Result<SendHandle, Error> {
        match self.send_with(peer, &msg, Some(Duration::ZERO)) {
            Ok(id) => Ok(self.handle(id)),
            Err(EngineError::Timeout) => Err(Error::Send(SendError::WouldBlock)),
            Err(e) => Err(e.into()),
        }
    }

    fn send_blocking(
        &self,
        peer: NodeId,
        msg: Outgoing<'_>,
        timeout: Option<Duration>,
    ) -> Result<SendHandle, Error> {
        Ok(self.handle(self.send_with(peer, &msg, timeout)?))
    }

    fn send_batch(
        &self,
        peer: NodeId,
        msgs: &dyn Messages,
        timeout: Option<Duration>,
    ) -> Result<SentBatch, Error> {
        Ok(self.client.send_batch(peer, msgs, timeout)?)
    }

    fn recv_batch(&self, out: &mut Received, timeout: Option<Duration>) -> Result<usize, Error> {
        Ok(self.client.recv_batch(out, timeout)?)
    }

    /// An engine gone for good is reported by the blocking calls; here it
    /// is simply nothing to receive. (Calls' envelopes are the calls'
    /// pump's to take.)
    fn try_recv(&self) -> Option<Delivery> {
        self.client.try_recv().ok().flatten()
    }

    fn recv(&self, timeout: Option<Duration>) -> Result<Delivery, Error> {
        Ok(self.client.recv(timeout)?)
    }

    fn poll_event(&self) -> Option<Event> {
        self.client.poll_event().ok().flatten()
    }

    fn next_event(&self, timeout: Option<Duration>) -> Result<Event, Error> {
        Ok(self.client.next_event(timeout)?)
    }

    /// The engine drives the protocol.
    fn progress(&self) {}

    fn flush(&self, timeout: Option<Duration>) -> Result<(), Error> {
        Ok(self.client.flush(timeout)?)
    }

    fn unsettled(&self) -> u64 {
        self.client.unsettled()
    }

    fn message_state(&self, id: MessageId) -> MessageState {
        self.client.message_state(id)
    }

    /// As the engine last reported them (every 50 ms while they change),
    /// summed over every engine that served this endpoint.
    fn stats(&self) -> Stats {
        self.client.stats()
    }

    /// What the engines' fault plans injected into what they received,
    /// as they report it with the counters.
    fn fault_counters(&self) -> FaultCounters {
        self.client.fault_counters()
    }

    fn set_faults_enabled(&self, _on: bool) {}

    fn fault_handle(&self) -> Option<FaultHandle> {
        None
    }

    fn buffered(&self) -> (usize, usize) {
        (0, 0)
    }

    fn rtt(&self, _peer: NodeId) -> Option<Duration> {
        None
    }

    fn base_rto(&self, _peer: NodeId) -> Option<Duration> {
        None
    }

    /// The calls' pump stops first: it holds the client too.
    fn close(&mut self, linger: Duration) -> Result<(), Error> {
        self.calls.stop(&self.client);
        match Arc::get_mut(&mut self.client) {
            Some(client) => Ok(client.shut(linger)?),
            // Only the pump shares it, and it has ended.
            None => Err(Error::Unsupported { what: "closing a client another thread still holds" }),
        }
    }

    /// The message is copied into the shared ring either way; a sealed
    /// one is also what the client keeps until it is settled, not a copy.
    fn message_buffer(&self, capacity: usize) -> Vec<u8> {
        self.client.message_buffer(capacity)
    }

    fn seal(&self, buf: Vec<u8>) -> Bytes {
        self.client.seal(buf)
    }

    /// The client lingers as it goes (`ClientOptions::linger`).
    fn drop_lingering(&mut self, _linger: Duration) {}

    fn send_unreliable(&self, _peer: NodeId, _msg: &[u8]) -> Result<bool, Error> {
        Err(Error::Unsupported {
            what: "unreliable messages through an engine (not yet: embedded endpoints only)",
        })
    }

    fn recv_unreliable(&self, _timeout: Option<Duration>) -> Result<Unreliable, Error> {
        Err(Error::Unsupported {
            what: "unreliable messages through an engine (not yet: embedded endpoints only)",
        })
    }

    fn send_nacked(&self, _peer: NodeId, _msg: &[u8]) -> Result<u64, Error> {
        Err(Error::Unsupported {
            what: "NACK-reliable messages through an engine (not yet: embedded endpoints only)",
        })
    }

    fn recv_nacked(&self, _timeout: Option<Duration>) -> Result<Nacked, Error> {
        Err(Error::Unsupported {
            what: "NACK-reliable messages through an engine (not yet: embedded endpoints only)",
        })
    }

    fn stats_source(&self) -> crate::publish::Source {
        crate::publish::Source::Attached(Arc::clone(&self.client))
    }

    fn calls(&self) -> Site<'_> {
        Site::Attached { calls: &self.calls, client: &self.client }
    }
}

impl Drop for Attached {
    fn drop(&mut self) {
        // The pump holds the client: stopped, it lets the client go (and
        // linger as it goes).
        self.calls.stop(&self.client);
    }
}
