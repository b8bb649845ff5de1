//! The unreliable datagram layer (docs/ARCHITECTURE.md, "Layers"; the "CL"
//! of Li et al. [CI], docs/REFERENCES.md):
//! non-blocking send to a node, receive into caller-owned buffers, typed
//! errors from Li et al. [CI] Table 1. Nothing here looks inside a datagram.
//!
//! * [`UdpTransport`]: UDP sockets with `sendmmsg`/`recvmmsg` batching,
//!   runs of datagrams segmented and coalesced by the kernel where it can,
//!   and connected sockets for the busiest peers where asked for.
//! * [`MemNetwork`]: an in-memory network for tests.
//! * [`FaultyTransport`]: any transport with a seeded fault plan (Li et al.
//!   [CI]).
//! * [`max_datagram_to`]: the largest datagram the route to a peer carries.

#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

mod batch;
mod connected;
mod error;
mod faulty;
mod mem;
mod offload;
mod path_mtu;
mod udp;

use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::time::Duration;

pub use batch::{Datagrams, RecvBatch};
pub use error::TransportError;
pub use faulty::{error_of, FaultHandle, FaultyTransport};
pub use mem::{MemNetwork, MemTransport};
pub use offload::COALESCED_SLOT;
pub use path_mtu::max_datagram_to;
pub use tether_fault::{FaultCounters, FaultPlan};
/// A node's identity: the one type the wire format and the core use too.
pub use tether_wire::NodeId;
pub use udp::{grow_buffers, AddressBook, UdpTransport, MAX_CONNECTED};

/// What a transport did, for operators and for showing batching at work.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TransportCounters {
    pub datagrams_sent: u64,
    pub bytes_sent: u64,
    pub datagrams_received: u64,
    pub bytes_received: u64,
    pub send_errors: u64,
    /// Datagrams dropped by this transport itself: a full in-memory inbox,
    /// or (one count each) runs of datagrams cut by a receive slot too
    /// small for them, of which the whole ones that fit were kept.
    pub dropped: u64,
    /// System calls made for sending and receiving.
    pub syscalls: u64,
    /// Runs of datagrams sent as one buffer the kernel segmented.
    pub runs_sent: u64,
    /// Runs of datagrams the kernel handed over coalesced.
    pub runs_received: u64,
}

/// An unreliable, non-blocking datagram service addressed by node.
pub trait Transport {
    fn local_addr(&self) -> Option<SocketAddr> {
        None
    }

    /// A descriptor that polls readable when a datagram may be waiting.
    fn raw_fd(&self) -> Option<RawFd> {
        None
    }

    /// Can this transport address `node`? (A transport that cannot tell
    /// says yes, and a send to a node it cannot reach fails when tried.)
    fn has_peer(&self, _node: NodeId) -> bool {
        true
    }

    /// The address `node` is sent to, where the transport has addresses
    /// (`None`: it does not know the node, or has no addresses at all).
    fn peer_addr(&self, _node: NodeId) -> Option<SocketAddr> {
        None
    }

    /// Learn (or change) the address of a node.
    fn add_peer(&mut self, _node: NodeId, _addr: SocketAddr) -> Result<(), TransportError> {
        Err(TransportError::InvalidArgs)
    }

    fn send_to(&mut self, dst: NodeId, datagram: &[u8]) -> Result<(), TransportError>;

    /// Send to an address no node is known at: the answer to a handshake
    /// from a peer that moved there, before it has proven itself. A
    /// transport without addresses refuses.
    fn send_to_addr(&mut self, _addr: SocketAddr, _datagram: &[u8]) -> Result<(), TransportError> {
        Err(TransportError::InvalidArgs)
    }

    /// Send a prefix of `batch`; returns its length. An error on the first
    /// datagram is returned; an error later ends the prefix early.
    fn send_batch(&mut self, batch: &[(NodeId, &[u8])]) -> Result<usize, TransportError> {
        for (i, &(dst, d)) in batch.iter().enumerate() {
            if let Err(e) = self.send_to(dst, d) {
                return if i == 0 { Err(e) } else { Ok(i) };
            }
        }
        Ok(batch.len())
    }

    /// The receive slot size in which this transport hands over runs of
    /// datagrams coalesced by the kernel, if it can (`COALESCED_SLOT`): a
    /// receiver that wants them gives batches of slots this large. Smaller
    /// slots get one datagram each.
    fn coalesced_slot(&self) -> Option<usize> {
        None
    }

    /// Receive what is waiting into `batch` (cleared first), without
    /// blocking. Returns how many datagrams were received (`batch.len()`);
    /// 0 when none.
    fn recv_batch(&mut self, batch: &mut RecvBatch) -> Result<usize, TransportError>;

    /// Block until a datagram may be waiting or `timeout` passes; true if readable.
    fn wait_readable(&mut self, timeout: Option<Duration>) -> Result<bool, TransportError>;

    /// How soon the transport will have a datagram that no descriptor
    /// signals (one held back by a fault injector); `None`: only the
    /// descriptor tells. A driver sleeping on `raw_fd` sleeps no longer.
    fn next_wakeup(&self) -> Option<Duration> {
        None
    }

    fn counters(&self) -> TransportCounters;
}

impl<T: Transport + ?Sized> Transport for Box<T> {
    fn local_addr(&self) -> Option<SocketAddr> {
        (**self).local_addr()
    }
    fn raw_fd(&self) -> Option<RawFd> {
        (**self).raw_fd()
    }
    fn peer_addr(&self, node: NodeId) -> Option<SocketAddr> {
        (**self).peer_addr(node)
    }
    fn has_peer(&self, node: NodeId) -> bool {
        (**self).has_peer(node)
    }
    fn add_peer(&mut self, node: NodeId, addr: SocketAddr) -> Result<(), TransportError> {
        (**self).add_peer(node, addr)
    }
    fn send_to(&mut self, dst: NodeId, datagram: &[u8]) -> Result<(), TransportError> {
        (**self).send_to(dst, datagram)
    }
    fn send_to_addr(&mut self, addr: SocketAddr, datagram: &[u8]) -> Result<(), TransportError> {
        (**self).send_to_addr(addr, datagram)
    }
    fn send_batch(&mut self, batch: &[(NodeId, &[u8])]) -> Result<usize, TransportError> {
        (**self).send_batch(batch)
    }
    fn coalesced_slot(&self) -> Option<usize> {
        (**self).coalesced_slot()
    }
    fn recv_batch(&mut self, batch: &mut RecvBatch) -> Result<usize, TransportError> {
        (**self).recv_batch(batch)
    }
    fn wait_readable(&mut self, timeout: Option<Duration>) -> Result<bool, TransportError> {
        (**self).wait_readable(timeout)
    }
    fn next_wakeup(&self) -> Option<Duration> {
        (**self).next_wakeup()
    }
    fn counters(&self) -> TransportCounters {
        (**self).counters()
    }
}
