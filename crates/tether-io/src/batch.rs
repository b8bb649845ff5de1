//! Receive buffers allocated once and reused for every batch: the receive
//! path does not allocate.

use std::net::SocketAddr;

use crate::NodeId;

pub struct RecvBatch {
    bufs: Vec<u8>,
    slot: usize,
    lens: Vec<usize>,
    from: Vec<Option<NodeId>>,
    addrs: Vec<Option<SocketAddr>>,
    filled: usize,
    /// The receive that filled it took one datagram alone and did not look
    /// for more: the socket may hold others (`may_hold_more`).
    partial: bool,
}

impl std::fmt::Debug for RecvBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Not the buffers: a batch holds up to megabytes of them.
        f.debug_struct("RecvBatch")
            .field("capacity", &self.lens.len())
            .field("slot", &self.slot)
            .field("filled", &self.filled)
            .finish()
    }
}

impl RecvBatch {
    /// `capacity` datagrams of up to `slot` bytes each.
    pub fn new(capacity: usize, slot: usize) -> Self {
        let capacity = capacity.max(1);
        RecvBatch {
            bufs: vec![0; capacity * slot],
            slot,
            lens: vec![0; capacity],
            from: vec![None; capacity],
            addrs: vec![None; capacity],
            filled: 0,
            partial: false,
        }
    }

    pub fn capacity(&self) -> usize {
        self.lens.len()
    }
    pub fn len(&self) -> usize {
        self.filled
    }
    pub fn is_empty(&self) -> bool {
        self.filled == 0
    }
    pub fn is_full(&self) -> bool {
        self.filled == self.capacity()
    }
    pub fn clear(&mut self) {
        self.filled = 0;
        self.partial = false;
    }

    /// The socket may hold more than this batch took though it is not
    /// full: a receive that takes one datagram alone does not look further.
    pub fn may_hold_more(&self) -> bool {
        self.partial || self.is_full()
    }

    pub(crate) fn set_partial(&mut self) {
        self.partial = true;
    }

    /// The filled datagrams with their source node (if known).
    pub fn iter(&self) -> impl Iterator<Item = (Option<NodeId>, &[u8])> {
        (0..self.filled).map(|i| (self.from[i], &self.bufs[i * self.slot..i * self.slot + self.lens[i]]))
    }

    /// Source address of datagram `i`, where the transport has addresses.
    pub fn addr(&self, i: usize) -> Option<SocketAddr> {
        self.addrs[..self.filled].get(i).copied().flatten()
    }

    /// Append a copy of `data` (truncated to the slot size); false when full.
    pub fn push(&mut self, from: Option<NodeId>, addr: Option<SocketAddr>, data: &[u8]) -> bool {
        if self.is_full() {
            return false;
        }
        let i = self.filled;
        let n = data.len().min(self.slot);
        self.bufs[i * self.slot..i * self.slot + n].copy_from_slice(&data[..n]);
        self.set(i, n, from, addr);
        self.filled += 1;
        true
    }

    /// Raw access for batched receive syscalls: every slot's buffer.
    pub(crate) fn slots_mut(&mut self) -> std::slice::ChunksExactMut<'_, u8> {
        self.bufs.chunks_exact_mut(self.slot)
    }

    pub(crate) fn set(&mut self, i: usize, len: usize, from: Option<NodeId>, addr: Option<SocketAddr>) {
        self.lens[i] = len.min(self.slot);
        self.from[i] = from;
        self.addrs[i] = addr;
    }

    pub(crate) fn set_filled(&mut self, n: usize) {
        self.filled = n.min(self.capacity());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_iter_clear() {
        let mut b = RecvBatch::new(2, 4);
        assert!(b.push(Some(1), None, b"abc"));
        assert!(b.push(None, None, b"toolong"));
        assert!(!b.push(Some(3), None, b"x"), "full");
        let got: Vec<_> = b.iter().map(|(f, d)| (f, d.to_vec())).collect();
        assert_eq!(got, vec![(Some(1), b"abc".to_vec()), (None, b"tool".to_vec())]);
        b.clear();
        assert!(b.is_empty());
    }
}
