//! An endpoint whose protocol runs in the node's `tether engine` process
//! (docs/ENGINE.md; Zhou et al. [FTGM], the engine in the role of their
//! network card): the `Endpoint` calls, answered through the shared-memory
//! rings of a `tether_engine::Client`. The engine owns the sockets, the
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

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use tether_engine::{Client, ClientOptions, EngineError};
use tether_io::FaultHandle;
use tether_proto::{Delivery, Event, Instant, MessageId, MessageState, NodeId, PathInfo, SendError, Stats};

use crate::clock::Clock;
use crate::endpoint::{Owner, SendHandle};
use crate::faults::FaultCounters;
use crate::Error;

pub(crate) struct Attached {
    client: Client,
    clock: Clock,
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
    pub fn attach(dir: &Path, node: NodeId, options: ClientOptions) -> Result<Self, Error> {
        Ok(Attached { client: Client::attach(dir, node, options)?, clock: Clock::new() })
    }

    fn handle(&self, id: MessageId) -> SendHandle {
        SendHandle::new(Some(id), None, Owner::Engine(self.client.tracker()))
    }

    pub fn node(&self) -> NodeId {
        self.client.node()
    }

    /// The engine's sockets are its own.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        None
    }

    pub fn add_peer(&self, node: NodeId, addr: SocketAddr) -> Result<(), Error> {
        self.add_peer_rails(node, &[addr])
    }

    pub fn add_peer_rails(&self, node: NodeId, addrs: &[SocketAddr]) -> Result<(), Error> {
        Ok(self.client.add_peer_rails(node, addrs)?)
    }

    pub fn now(&self) -> Instant {
        self.clock.now()
    }

    pub fn paths(&self, _peer: NodeId) -> Vec<PathInfo> {
        Vec::new()
    }

    pub fn rail_addrs(&self) -> Vec<Option<SocketAddr>> {
        Vec::new()
    }

    /// Never waits: a full submission ring is `WouldBlock`, as a full send
    /// buffer is for an embedded endpoint.
    pub fn send(&self, peer: NodeId, msg: &[u8]) -> Result<SendHandle, Error> {
        match self.client.send(peer, msg, Some(Duration::ZERO)) {
            Ok(id) => Ok(self.handle(id)),
            Err(EngineError::Timeout) => Err(Error::Send(SendError::WouldBlock)),
            Err(e) => Err(e.into()),
        }
    }

    pub fn send_blocking(
        &self,
        peer: NodeId,
        msg: &[u8],
        timeout: Option<Duration>,
    ) -> Result<SendHandle, Error> {
        Ok(self.handle(self.client.send(peer, msg, timeout)?))
    }

    /// An engine gone for good is reported by the blocking calls; here it
    /// is simply nothing to receive.
    pub fn try_recv(&self) -> Option<Delivery> {
        loop {
            let d = self.client.try_recv().ok().flatten()?;
            if !d.call {
                return Some(d);
            }
            dropped_call(&d);
        }
    }

    pub fn recv(&self, timeout: Option<Duration>) -> Result<Delivery, Error> {
        let deadline = timeout.and_then(|t| std::time::Instant::now().checked_add(t));
        loop {
            let left = deadline.map(|d| d.saturating_duration_since(std::time::Instant::now()));
            let d = self.client.recv(left.or(timeout))?;
            if !d.call {
                return Ok(d);
            }
            dropped_call(&d);
        }
    }

    pub fn poll_event(&self) -> Option<Event> {
        self.client.poll_event().ok().flatten()
    }

    pub fn next_event(&self, timeout: Option<Duration>) -> Result<Event, Error> {
        Ok(self.client.next_event(timeout)?)
    }

    /// The engine drives the protocol.
    pub fn progress(&self) {}

    pub fn flush(&self, timeout: Option<Duration>) -> Result<(), Error> {
        Ok(self.client.flush(timeout)?)
    }

    pub fn message_state(&self, id: MessageId) -> MessageState {
        self.client.message_state(id)
    }

    /// As the engine last reported them (every 50 ms while they change),
    /// summed over every engine that served this endpoint.
    pub fn stats(&self) -> Stats {
        self.client.stats()
    }

    /// What the engines' fault plans injected into what they received,
    /// as they report it with the counters.
    pub fn fault_counters(&self) -> FaultCounters {
        self.client.fault_counters()
    }

    pub fn set_faults_enabled(&self, _on: bool) {}

    pub fn fault_handle(&self) -> Option<FaultHandle> {
        None
    }

    pub fn buffered(&self) -> (usize, usize) {
        (0, 0)
    }

    pub fn rtt(&self, _peer: NodeId) -> Option<Duration> {
        None
    }

    pub fn close(&mut self, linger: Duration) -> Result<(), Error> {
        Ok(self.client.shut(linger)?)
    }
}

/// A call's envelope reached an application attached to an engine, which
/// does not serve calls yet (`Error::Unsupported` on its side): it is not
/// a message, so it is dropped, and its caller's state says the call's
/// fate is unknown.
fn dropped_call(d: &Delivery) {
    tracing::debug!(
        from = d.from,
        "a call's envelope through an engine: calls are not served there yet; dropped"
    );
}
