//! Any transport with the seeded receive-side faults of `tether-fault`
//! applied to what it receives (seeds/002 Table 4 puts delay, reorder and
//! modify on the receive side: that is where a real NIC or switch mangles).

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tether_fault::{FaultCounters, FaultSpec, Injector};

use crate::{NodeId, RecvBatch, Transport, TransportCounters, TransportError};

/// Most faulted datagrams waiting for room in the caller's batch.
const MAX_PENDING: usize = 256;

/// A shared view of the injector's counters, readable from other threads.
#[derive(Clone, Default)]
pub struct FaultHandle(Arc<Mutex<FaultCounters>>);

impl FaultHandle {
    pub fn snapshot(&self) -> FaultCounters {
        *self.0.lock().expect("counter lock")
    }
}

pub struct FaultyTransport<T> {
    inner: T,
    injector: Injector,
    inner_batch: RecvBatch,
    /// Faulted datagrams not yet handed out, with their buffers reused.
    pending: VecDeque<(Option<NodeId>, Vec<u8>)>,
    spare: Vec<Vec<u8>>,
    /// The datagram being faulted (modify flips bits in place).
    scratch: Vec<u8>,
    shared: FaultHandle,
}

impl<T: Transport> FaultyTransport<T> {
    pub fn new(inner: T, spec: FaultSpec, seed: u64) -> Self {
        let spec = FaultSpec { reorder_depth: spec.reorder_depth.max(3), ..spec };
        FaultyTransport {
            inner,
            injector: Injector::new(spec, seed),
            inner_batch: RecvBatch::new(32, tether_wire_max()),
            pending: VecDeque::new(),
            spare: Vec::new(),
            scratch: Vec::new(),
            shared: FaultHandle::default(),
        }
    }

    pub fn counters_handle(&self) -> FaultHandle {
        self.shared.clone()
    }

    pub fn inner(&self) -> &T {
        &self.inner
    }

    fn stash(
        pending: &mut VecDeque<(Option<NodeId>, Vec<u8>)>,
        spare: &mut Vec<Vec<u8>>,
        from: Option<NodeId>,
        d: &[u8],
    ) {
        if pending.len() >= MAX_PENDING {
            return; // Bounded: beyond it the datagram is lost, as in a full socket buffer.
        }
        let mut buf = spare.pop().unwrap_or_default();
        buf.clear();
        buf.extend_from_slice(d);
        pending.push_back((from, buf));
    }
}

/// Largest UDP datagram: what the inner batch must be able to hold.
fn tether_wire_max() -> usize {
    65_536
}

impl<T: Transport> Transport for FaultyTransport<T> {
    fn local_node(&self) -> NodeId {
        self.inner.local_node()
    }
    fn local_addr(&self) -> Option<SocketAddr> {
        self.inner.local_addr()
    }
    fn raw_fd(&self) -> Option<RawFd> {
        self.inner.raw_fd()
    }
    fn add_peer(&mut self, node: NodeId, addr: SocketAddr) -> Result<(), TransportError> {
        self.inner.add_peer(node, addr)
    }
    fn send_to(&mut self, dst: NodeId, datagram: &[u8]) -> Result<(), TransportError> {
        self.inner.send_to(dst, datagram)
    }
    fn send_batch(&mut self, batch: &[(NodeId, &[u8])]) -> Result<usize, TransportError> {
        self.inner.send_batch(batch)
    }

    fn recv_batch(&mut self, batch: &mut RecvBatch) -> Result<usize, TransportError> {
        batch.clear();
        if self.pending.len() < batch.capacity() {
            let n = self.inner.recv_batch(&mut self.inner_batch)?;
            let (pending, spare, injector) = (&mut self.pending, &mut self.spare, &mut self.injector);
            let scratch = &mut self.scratch;
            for (from, d) in self.inner_batch.iter() {
                scratch.clear();
                scratch.extend_from_slice(d);
                injector.on_datagram(scratch, |out| Self::stash(pending, spare, from, out));
            }
            if n == 0 && injector.holding() > 0 {
                // The link went quiet: held datagrams are late now, not lost.
                injector.flush(|out| Self::stash(pending, spare, None, out));
            }
            *self.shared.0.lock().expect("counter lock") = injector.counters;
        }
        while !batch.is_full() {
            let Some((from, d)) = self.pending.pop_front() else { break };
            batch.push(from, None, &d);
            self.spare.push(d);
        }
        Ok(batch.len())
    }

    fn wait_readable(&mut self, timeout: Option<Duration>) -> Result<bool, TransportError> {
        if !self.pending.is_empty() || self.injector.holding() > 0 {
            return Ok(true);
        }
        self.inner.wait_readable(timeout)
    }

    fn counters(&self) -> TransportCounters {
        self.inner.counters()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemNetwork;

    #[test]
    fn injects_at_the_configured_rate_and_loses_nothing_else() {
        let net = MemNetwork::new(100_000);
        let mut a = net.attach(1);
        let spec =
            FaultSpec { recv_loss: 0.1, recv_duplicate: 0.05, recv_reorder: 0.05, ..FaultSpec::default() };
        let mut b = FaultyTransport::new(net.attach(2), spec, 9);
        let n = 20_000u32;
        for i in 0..n {
            a.send_to(2, &i.to_le_bytes()).unwrap();
        }
        let mut rx = RecvBatch::new(32, 64);
        let mut got = 0u64;
        while b.recv_batch(&mut rx).unwrap() > 0 || b.injector.holding() > 0 || !b.pending.is_empty() {
            got += rx.len() as u64;
        }
        let c = b.counters_handle().snapshot();
        assert_eq!(c.seen, n as u64);
        assert_eq!(got, c.seen - c.dropped + c.duplicated);
        let sd = (n as f64 * 0.1 * 0.9).sqrt();
        assert!((c.dropped as f64 - n as f64 * 0.1).abs() < 5.0 * sd, "{c:?}");
        assert!(c.reordered > 0);
    }
}
