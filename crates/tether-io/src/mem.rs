//! An in-memory network for tests: bounded per-node inboxes behave like
//! socket buffers (a full one drops the datagram silently, as UDP would).

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use crate::{NodeId, RecvBatch, Transport, TransportCounters, TransportError};

#[derive(Default)]
struct Inbox {
    queue: Mutex<VecDeque<(NodeId, Vec<u8>)>>,
    ready: Condvar,
}

#[derive(Clone)]
pub struct MemNetwork {
    inboxes: Arc<Mutex<BTreeMap<NodeId, Arc<Inbox>>>>,
    capacity: usize,
}

impl MemNetwork {
    /// Each node's inbox holds at most `capacity` datagrams.
    pub fn new(capacity: usize) -> Self {
        MemNetwork { inboxes: Arc::default(), capacity }
    }

    pub fn attach(&self, node: NodeId) -> MemTransport {
        let inbox = Arc::new(Inbox::default());
        self.inboxes.lock().expect("network lock").insert(node, inbox.clone());
        MemTransport { node, net: self.clone(), inbox, counters: TransportCounters::default() }
    }

    /// Remove a node: sends to it now fail with `Unreachable`.
    pub fn detach(&self, node: NodeId) {
        self.inboxes.lock().expect("network lock").remove(&node);
    }
}

pub struct MemTransport {
    node: NodeId,
    net: MemNetwork,
    inbox: Arc<Inbox>,
    counters: TransportCounters,
}

impl std::fmt::Debug for MemNetwork {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let nodes: Vec<NodeId> = self.inboxes.lock().map(|m| m.keys().copied().collect()).unwrap_or_default();
        f.debug_struct("MemNetwork").field("nodes", &nodes).field("capacity", &self.capacity).finish()
    }
}

impl std::fmt::Debug for MemTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemTransport").field("node", &self.node).field("counters", &self.counters).finish()
    }
}

impl Transport for MemTransport {
    fn send_to(&mut self, dst: NodeId, datagram: &[u8]) -> Result<(), TransportError> {
        let inbox = self.net.inboxes.lock().expect("network lock").get(&dst).cloned();
        let Some(inbox) = inbox else {
            self.counters.send_errors += 1;
            return Err(TransportError::Unreachable);
        };
        let mut q = inbox.queue.lock().expect("inbox lock");
        self.counters.datagrams_sent += 1;
        self.counters.bytes_sent += datagram.len() as u64;
        if q.len() >= self.net.capacity {
            self.counters.dropped += 1;
            return Ok(());
        }
        q.push_back((self.node, datagram.to_vec()));
        inbox.ready.notify_all();
        Ok(())
    }

    fn recv_batch(&mut self, batch: &mut RecvBatch) -> Result<usize, TransportError> {
        batch.clear();
        let mut q = self.inbox.queue.lock().expect("inbox lock");
        while !batch.is_full() {
            let Some((from, d)) = q.pop_front() else { break };
            self.counters.datagrams_received += 1;
            self.counters.bytes_received += d.len() as u64;
            batch.push(Some(from), None, &d);
        }
        Ok(batch.len())
    }

    fn wait_readable(&mut self, timeout: Option<Duration>) -> Result<bool, TransportError> {
        let q = self.inbox.queue.lock().expect("inbox lock");
        let timeout = timeout.unwrap_or(Duration::from_secs(3600));
        let (q, _) = self.inbox.ready.wait_timeout_while(q, timeout, |q| q.is_empty()).expect("inbox lock");
        Ok(!q.is_empty())
    }

    fn counters(&self) -> TransportCounters {
        self.counters
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delivers_drops_when_full_and_detaches() {
        let net = MemNetwork::new(2);
        let mut a = net.attach(1);
        let mut b = net.attach(2);
        for i in 0..3u8 {
            a.send_to(2, &[i]).unwrap();
        }
        assert_eq!(a.counters().dropped, 1);
        let mut rx = RecvBatch::new(8, 16);
        assert_eq!(b.recv_batch(&mut rx).unwrap(), 2);
        assert_eq!(rx.iter().map(|(f, d)| (f, d[0])).collect::<Vec<_>>(), vec![(Some(1), 0), (Some(1), 1)]);
        net.detach(2);
        assert_eq!(a.send_to(2, b"x"), Err(TransportError::Unreachable));
    }

    #[test]
    fn wait_wakes_on_send_from_another_thread() {
        let net = MemNetwork::new(8);
        let mut a = net.attach(1);
        let mut b = net.attach(2);
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            a.send_to(2, b"wake").unwrap();
        });
        assert!(b.wait_readable(Some(Duration::from_secs(5))).unwrap());
        t.join().unwrap();
        assert!(!MemNetwork::new(1).attach(3).wait_readable(Some(Duration::from_millis(5))).unwrap());
    }
}
