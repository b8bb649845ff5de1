//! The unreliable class (UNR, Li et al. [CI] section 3: what heartbeats
//! travel as): a message sent once, whole, in a DATAGRAM frame of the
//! session's datagrams; never acknowledged, ordered or sent again, and
//! so never waited for. It is authenticated and its source validated as
//! every datagram of the session is, and with a cluster key a replayed
//! datagram is dropped by its packet number; without one the network may
//! deliver a copy twice, as it may a UDP datagram.
//!
//! Both queues are bounded in bytes and in count (`Config::
//! unreliable_queue_bytes`, `unreliable_queue_messages`): a message past
//! either is dropped and counted (`unreliable_dropped`), the class's
//! answer to overload. Messages are copied into buffers of the endpoint's
//! pool, as reassembled messages are.

use std::collections::VecDeque;

use bytes::Bytes;

use crate::message_pool::MessagePool;
use crate::{Config, NodeId, Stats};

/// An unreliable message delivered (`Endpoint::recv_unreliable`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unreliable {
    /// The sending node.
    pub from: NodeId,
    /// The message, whole.
    pub message: Bytes,
}

/// A bounded queue of messages: at most `Config::unreliable_queue_bytes`
/// bytes and `unreliable_queue_messages` messages.
#[derive(Debug)]
pub(crate) struct Bounded<T> {
    items: VecDeque<(T, usize)>,
    bytes: usize,
}

impl<T> Default for Bounded<T> {
    fn default() -> Self {
        Bounded { items: VecDeque::new(), bytes: 0 }
    }
}

impl<T> Bounded<T> {
    /// Would `len` more bytes stay within the bounds?
    pub fn has_room(&self, len: usize, config: &Config) -> bool {
        self.items.len() < config.unreliable_queue_messages
            && self.bytes + len <= config.unreliable_queue_bytes
    }

    /// Queue `item` of `len` bytes, if the bounds allow.
    pub fn push(&mut self, item: T, len: usize, config: &Config) -> bool {
        if !self.has_room(len, config) {
            return false;
        }
        self.bytes += len;
        self.items.push_back((item, len));
        true
    }

    pub fn pop(&mut self) -> Option<T> {
        let (item, len) = self.items.pop_front()?;
        self.bytes -= len;
        Some(item)
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}

/// Datagram payloads waiting to go to one peer, each for its port: the
/// application's unreliable messages, and the frames of the classes built
/// on them (`crate::nacked`).
pub(crate) type Outbox = Bounded<(u8, Bytes)>;

impl Outbox {
    /// Queue `msg` for `port` of the peer; `false` (and counted) if the
    /// queue is full.
    pub fn offer(&mut self, port: u8, msg: Bytes, config: &Config, stats: &mut Stats) -> bool {
        let len = msg.len();
        let queued = self.push((port, msg), len, config);
        stats.unreliable_dropped += u64::from(!queued);
        queued
    }

    /// The next message's length.
    pub fn next_len(&self) -> Option<usize> {
        self.items.front().map(|(_, len)| *len)
    }

    pub fn take(&mut self) -> Option<(u8, Bytes)> {
        self.pop()
    }
}

/// The cluster's own services that ride the session's datagrams beside
/// the application's, each on a port of its own (docs/CLUSTER.md): their
/// messages are authenticated and source-validated as every datagram of
/// the session is, and never reach the application's queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Service {
    /// The membership protocol: heartbeats, probes, alerts, joins, views.
    Members,
    /// The manager replicas' Raft messages.
    Managers,
}

impl Service {
    /// Every service, in the order of their queues.
    pub const ALL: [Service; 2] = [Service::Members, Service::Managers];

    /// The DATAGRAM port it rides on.
    pub fn port(self) -> u8 {
        match self {
            Service::Members => tether_wire::PORT_MEMBERS,
            Service::Managers => tether_wire::PORT_MANAGERS,
        }
    }

    /// The service a port serves, if one does.
    pub(crate) fn of_port(port: u8) -> Option<Service> {
        Service::ALL.into_iter().find(|s| s.port() == port)
    }

    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

/// Messages received and not yet taken by the application (or by a
/// service of the cluster: one queue each).
pub(crate) type Inbox = Bounded<Unreliable>;

impl Inbox {
    /// Copy `payload` from `from` into a pooled buffer and queue it; `false`
    /// (dropped and counted) if the queue is full.
    pub fn deliver(
        &mut self,
        from: NodeId,
        payload: &[u8],
        pool: &MessagePool,
        config: &Config,
        stats: &mut Stats,
    ) -> bool {
        // Checked before the copy: a message that will not be kept is
        // not copied.
        if !self.has_room(payload.len(), config) {
            stats.unreliable_dropped += 1;
            return false;
        }
        let mut buf = pool.take(payload.len());
        buf.extend_from_slice(payload);
        let message = pool.seal(buf);
        let len = message.len();
        let queued = self.push(Unreliable { from, message }, len, config);
        debug_assert!(queued, "room was checked");
        true
    }

    pub fn take(&mut self) -> Option<Unreliable> {
        self.pop()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_queues_are_bounded_in_bytes_and_in_count() {
        let config = Config { unreliable_queue_bytes: 10, unreliable_queue_messages: 3, ..Config::default() };
        let mut stats = Stats::default();
        let mut out = Outbox::default();
        assert!(out.offer(0, Bytes::from_static(b"12345678"), &config, &mut stats));
        assert!(!out.offer(0, Bytes::from_static(b"123"), &config, &mut stats), "past the bytes");
        assert!(out.offer(1, Bytes::from_static(b"1"), &config, &mut stats));
        assert!(out.offer(0, Bytes::from_static(b"1"), &config, &mut stats));
        assert!(!out.offer(0, Bytes::new(), &config, &mut stats), "past the count");
        assert_eq!(stats.unreliable_dropped, 2);
        assert_eq!(out.next_len(), Some(8));
        assert_eq!(out.take(), Some((0, Bytes::from_static(b"12345678"))));
        assert!(out.offer(0, Bytes::from_static(b"1234567"), &config, &mut stats), "room again");

        let pool = MessagePool::new();
        let mut inbox = Inbox::default();
        let queued = (0..4).filter(|_| inbox.deliver(7, b"abc", &pool, &config, &mut stats)).count();
        assert_eq!((queued, stats.unreliable_dropped), (3, 3));
        assert_eq!(inbox.take(), Some(Unreliable { from: 7, message: Bytes::from_static(b"abc") }));
    }
}
