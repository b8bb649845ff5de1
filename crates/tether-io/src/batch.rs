//! Receive buffers allocated once and reused for every batch: the receive
//! path does not allocate. A slot holds one datagram, or, where the kernel
//! coalesced a run of them (UDP GRO, `offload`), the run with the size of
//! its segments: iterating the batch yields each datagram alone either way.

use std::net::SocketAddr;

use crate::NodeId;

pub struct RecvBatch {
    bufs: Vec<u8>,
    slot: usize,
    lens: Vec<usize>,
    /// Per slot: the size of the datagrams coalesced in it, the last of
    /// which may be shorter; 0 for a slot holding one datagram.
    strides: Vec<usize>,
    from: Vec<Option<NodeId>>,
    addrs: Vec<Option<SocketAddr>>,
    /// Slots filled.
    filled: usize,
    /// Datagrams in the filled slots.
    datagrams: usize,
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
            .field("datagrams", &self.datagrams)
            .finish()
    }
}

/// How many datagrams a slot of `len` bytes coalesced at `stride` holds.
fn segments(len: usize, stride: usize) -> usize {
    if stride == 0 || len == 0 {
        1
    } else {
        len.div_ceil(stride)
    }
}

impl RecvBatch {
    /// `capacity` slots of `slot` bytes each.
    pub fn new(capacity: usize, slot: usize) -> Self {
        let capacity = capacity.max(1);
        RecvBatch {
            bufs: vec![0; capacity * slot],
            slot,
            lens: vec![0; capacity],
            strides: vec![0; capacity],
            from: vec![None; capacity],
            addrs: vec![None; capacity],
            filled: 0,
            datagrams: 0,
            partial: false,
        }
    }

    /// Slots: the most receives one batch takes.
    pub fn capacity(&self) -> usize {
        self.lens.len()
    }
    /// The size of each slot.
    pub fn slot(&self) -> usize {
        self.slot
    }
    /// Datagrams received (a coalesced slot counts each of its own).
    pub fn len(&self) -> usize {
        self.datagrams
    }
    pub fn is_empty(&self) -> bool {
        self.datagrams == 0
    }
    /// Every slot is filled.
    pub fn is_full(&self) -> bool {
        self.filled == self.capacity()
    }
    pub fn clear(&mut self) {
        self.filled = 0;
        self.datagrams = 0;
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

    /// The received datagrams with their source node (if known).
    pub fn iter(&self) -> impl Iterator<Item = (Option<NodeId>, &[u8])> {
        self.datagrams().map(|(from, _, d)| (from, d))
    }

    /// The received datagrams with their source node (if known) and
    /// address (where the transport has addresses).
    pub fn datagrams(&self) -> Datagrams<'_> {
        Datagrams { batch: self, slot: 0, at: 0 }
    }

    /// Append a copy of `data` (truncated to the slot size) in a slot of
    /// its own; false when full.
    pub fn push(&mut self, from: Option<NodeId>, addr: Option<SocketAddr>, data: &[u8]) -> bool {
        if self.is_full() {
            return false;
        }
        let i = self.filled;
        let n = data.len().min(self.slot);
        self.bufs[i * self.slot..i * self.slot + n].copy_from_slice(&data[..n]);
        self.set(i, n, 0, from, addr);
        self.filled += 1;
        self.datagrams += 1;
        true
    }

    /// Raw access for batched receive syscalls: every slot's buffer.
    pub(crate) fn slots_mut(&mut self) -> std::slice::ChunksExactMut<'_, u8> {
        self.bufs.chunks_exact_mut(self.slot)
    }

    /// Slot `i` holds `len` bytes from `from` at `addr`: one datagram, or
    /// (`stride` > 0) datagrams of `stride` bytes, the last maybe shorter.
    pub(crate) fn set(
        &mut self,
        i: usize,
        len: usize,
        stride: usize,
        from: Option<NodeId>,
        addr: Option<SocketAddr>,
    ) {
        self.lens[i] = len.min(self.slot);
        self.strides[i] = stride;
        self.from[i] = from;
        self.addrs[i] = addr;
    }

    /// The first `n` slots are filled (each `set` before).
    pub(crate) fn set_filled(&mut self, n: usize) {
        self.filled = n.min(self.capacity());
        self.datagrams = (0..self.filled).map(|i| segments(self.lens[i], self.strides[i])).sum();
    }
}

/// The datagrams of a batch, in the order received (`RecvBatch::datagrams`).
pub struct Datagrams<'a> {
    batch: &'a RecvBatch,
    /// The slot being read, and the offset of its next datagram.
    slot: usize,
    at: usize,
}

impl<'a> Iterator for Datagrams<'a> {
    type Item = (Option<NodeId>, Option<SocketAddr>, &'a [u8]);

    fn next(&mut self) -> Option<Self::Item> {
        let b = self.batch;
        if self.slot >= b.filled {
            return None;
        }
        let i = self.slot;
        let (len, stride) = (b.lens[i], b.strides[i]);
        // A whole slot, or its next segment; an empty datagram is one too.
        let take = if stride == 0 { len } else { stride.min(len - self.at) };
        let start = i * b.slot + self.at;
        self.at += take;
        if self.at >= len {
            (self.slot, self.at) = (i + 1, 0);
        }
        Some((b.from[i], b.addrs[i], &b.bufs[start..start + take]))
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

    /// A coalesced slot yields each of its datagrams, the last shorter,
    /// between whole ones and empty ones; the count is of datagrams.
    #[test]
    fn coalesced_slots_yield_each_datagram() {
        let mut b = RecvBatch::new(4, 16);
        let addr: SocketAddr = "127.0.0.1:9".parse().unwrap();
        for (i, slot) in b.slots_mut().enumerate() {
            for (k, byte) in slot.iter_mut().enumerate() {
                *byte = (i * 16 + k) as u8;
            }
        }
        b.set(0, 3, 0, Some(1), None);
        b.set(1, 10, 4, Some(2), Some(addr));
        b.set(2, 0, 0, None, None);
        b.set(3, 8, 4, Some(3), None);
        b.set_filled(4);
        assert_eq!(b.len(), 1 + 3 + 1 + 2);
        let got: Vec<_> = b.datagrams().map(|(f, a, d)| (f, a, d.to_vec())).collect();
        assert_eq!(
            got,
            vec![
                (Some(1), None, vec![0, 1, 2]),
                (Some(2), Some(addr), vec![16, 17, 18, 19]),
                (Some(2), Some(addr), vec![20, 21, 22, 23]),
                (Some(2), Some(addr), vec![24, 25]),
                (None, None, vec![]),
                (Some(3), None, vec![48, 49, 50, 51]),
                (Some(3), None, vec![52, 53, 54, 55]),
            ]
        );
    }
}
