//! Where an endpoint's protocol runs: in this process (`Embedded`) or in
//! an engine process on the node (`Attached`, Zhou et al. [FTGM]). The
//! public `Endpoint` forwards each of its calls to its backend unchanged,
//! as Aeron's client talks to its media driver whether the driver runs
//! embedded or as a process of its own.

use std::fmt::Debug;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use tether_fault::FaultCounters;
use tether_io::FaultHandle;
use tether_proto::{
    CongestionInfo, Delivery, Endpoint as Core, Event, Instant, MessageId, MessageState, Messages, Nacked,
    NodeId, PathInfo, Received, SendError, SentBatch, Stats, Unreliable,
};

use crate::call_site::Site;
use crate::handle::SendHandle;
use crate::Error;

/// An endpoint's protocol, wherever it runs (each call as `Endpoint`'s of
/// the same name describes it). What a backend does not keep (an engine
/// keeps the congestion state) it answers with `None`.
pub(crate) trait Backend: Debug + Send + Sync {
    fn node(&self) -> NodeId;
    fn local_addr(&self) -> Option<SocketAddr>;
    fn add_peer(&self, node: NodeId, addr: SocketAddr) -> Result<(), Error>;
    fn add_peer_rails(&self, node: NodeId, addrs: &[SocketAddr]) -> Result<(), Error>;
    fn now(&self) -> Instant;
    fn paths(&self, peer: NodeId) -> Vec<PathInfo>;
    fn congestion(&self, peer: NodeId) -> Option<CongestionInfo>;
    fn aggregate(&self) -> Option<CongestionInfo>;
    fn max_datagram_to(&self, peer: NodeId) -> Option<usize>;
    fn rail_addrs(&self) -> Vec<Option<SocketAddr>>;
    fn rail_counters(&self) -> Vec<tether_io::TransportCounters>;
    fn send(&self, peer: NodeId, msg: Outgoing<'_>) -> Result<SendHandle, Error>;
    fn send_blocking(
        &self,
        peer: NodeId,
        msg: Outgoing<'_>,
        timeout: Option<Duration>,
    ) -> Result<SendHandle, Error>;
    fn send_batch(
        &self,
        peer: NodeId,
        msgs: &dyn Messages,
        timeout: Option<Duration>,
    ) -> Result<SentBatch, Error>;
    fn recv_batch(&self, out: &mut Received, timeout: Option<Duration>) -> Result<usize, Error>;
    fn message_buffer(&self, capacity: usize) -> Vec<u8>;
    fn seal(&self, buf: Vec<u8>) -> Bytes;
    fn try_recv(&self) -> Option<Delivery>;
    fn recv(&self, timeout: Option<Duration>) -> Result<Delivery, Error>;
    fn poll_event(&self) -> Option<Event>;
    fn next_event(&self, timeout: Option<Duration>) -> Result<Event, Error>;
    fn progress(&self);
    fn flush(&self, timeout: Option<Duration>) -> Result<(), Error>;
    fn message_state(&self, id: MessageId) -> MessageState;
    /// Messages sent and not yet settled (acknowledged or failed), over
    /// every peer.
    fn unsettled(&self) -> u64;
    fn stats(&self) -> Stats;
    fn fault_counters(&self) -> FaultCounters;
    fn set_faults_enabled(&self, on: bool);
    fn fault_handle(&self) -> Option<FaultHandle>;
    fn buffered(&self) -> (usize, usize);
    fn rtt(&self, peer: NodeId) -> Option<Duration>;
    fn base_rto(&self, peer: NodeId) -> Option<Duration>;
    /// Settle what was accepted, up to `linger`, and stop.
    fn close(&mut self, linger: Duration) -> Result<(), Error>;
    /// Dropped without `close`: give what was accepted its chance to
    /// settle, up to `linger`, as the endpoint's docs promise, and stop.
    fn drop_lingering(&mut self, linger: Duration);
    /// The endpoint's calls and what carries their envelopes.
    fn calls(&self) -> Site<'_>;
    /// Where the state `Builder::publish_stats` publishes is read from.
    fn stats_source(&self) -> crate::publish::Source;
    /// `Endpoint::send_unreliable`.
    fn send_unreliable(&self, peer: NodeId, msg: &[u8]) -> Result<bool, Error>;
    /// `Endpoint::recv_unreliable`.
    fn recv_unreliable(&self, timeout: Option<Duration>) -> Result<Unreliable, Error>;
    /// `Endpoint::send_nacked`.
    fn send_nacked(&self, peer: NodeId, msg: &[u8]) -> Result<u64, Error>;
    /// `Endpoint::recv_nacked`.
    fn recv_nacked(&self, timeout: Option<Duration>) -> Result<Nacked, Error>;
    /// The state of an embedded endpoint (its cluster layer); `None`
    /// attached to an engine.
    fn embedded(&self) -> Option<&crate::shared::Shared> {
        None
    }
}

/// A message as the application hands it to `send`: borrowed, and copied
/// into the sender's log, or owned, and kept there as it is.
#[derive(Clone)]
pub(crate) enum Outgoing<'a> {
    Borrowed(&'a [u8]),
    Owned(Bytes),
}

impl Outgoing<'_> {
    pub fn len(&self) -> usize {
        match self {
            Outgoing::Borrowed(m) => m.len(),
            Outgoing::Owned(m) => m.len(),
        }
    }

    pub fn join_waiting(&self, core: &mut Core, peer: NodeId) -> Option<MessageId> {
        match self {
            Outgoing::Borrowed(m) => core.join_waiting(peer, m),
            Outgoing::Owned(m) => core.join_waiting_bytes(peer, m),
        }
    }

    pub fn queue(&self, core: &mut Core, now: Instant, peer: NodeId) -> Result<MessageId, SendError> {
        match self {
            Outgoing::Borrowed(m) => core.send(now, peer, m),
            // A reference count, not a copy.
            Outgoing::Owned(m) => core.send_bytes(now, peer, m.clone()),
        }
    }
}
