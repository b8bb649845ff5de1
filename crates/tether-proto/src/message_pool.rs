//! Buffers for large messages, recycled: the hot path does not allocate.
//!
//! A message larger than one datagram is reassembled in a buffer of its
//! whole size (`RecvStream`), handed to the application as [`Bytes`], and
//! dropped there when the application is done with it. Allocated fresh for
//! every message, each such buffer costs the allocator a round trip to the
//! kernel once it is large (glibc maps buffers from 128 KiB and gives back
//! freed heap above its trim threshold), and the kernel a page fault per
//! 4 KiB touched: in a 64 KiB stream the page faults alone were 7% of the
//! samples. Here a delivered message's buffer comes back to its endpoint's
//! pool when the application drops the last `Bytes` that refers to it
//! (`Bytes::from_owner`), and the next message of a similar size reuses it,
//! its pages already mapped. A sender may take its messages' buffers from
//! the same pool (`Endpoint::message_pool`; the runtime's
//! `Endpoint::message_buffer` and `seal`): each comes back when the log
//! drops it, acknowledged, so a stream of large messages allocates nothing
//! on either side once both pools are warm.
//!
//! The pool is bounded in count and in bytes, and keeps no buffer below
//! [`POOL_FROM`] (the allocator serves those from its own free lists
//! without the kernel) nor above [`MAX_POOLED`]. It is shared by the
//! endpoint's streams and the application's threads (a buffer is returned
//! wherever its last `Bytes` is dropped), behind a mutex taken once per
//! pooled message each way; a buffer outliving its endpoint is freed.

use std::sync::{Arc, Mutex, Weak};

use bytes::Bytes;

/// Buffers below this capacity are not pooled.
pub const POOL_FROM: usize = 16 * 1024;
/// Buffers above this capacity are not pooled: a message this large
/// amortises its allocation, and one kept would pin that much memory.
pub const MAX_POOLED: usize = 4 << 20;
/// At most this many buffers wait in the pool (a default send buffer's
/// worth of the smallest pooled size)...
const MAX_BUFFERS: usize = 256;
/// ...and at most this many bytes of capacity.
const MAX_BYTES: usize = 16 << 20;

/// The endpoint's pool of message buffers. Cloning shares it.
#[derive(Debug, Clone, Default)]
pub struct MessagePool {
    free: Arc<Mutex<Free>>,
}

#[derive(Debug, Default)]
struct Free {
    buffers: Vec<Vec<u8>>,
    bytes: usize,
}

impl MessagePool {
    /// An empty pool.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty buffer of at least `capacity` bytes: a pooled one no more
    /// than twice that size if there is one, else a new one.
    pub fn take(&self, capacity: usize) -> Vec<u8> {
        if !(POOL_FROM..=MAX_POOLED).contains(&capacity) {
            return Vec::with_capacity(capacity);
        }
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        let best = free
            .buffers
            .iter()
            .enumerate()
            .filter(|(_, b)| b.capacity() >= capacity && b.capacity() <= 2 * capacity)
            .min_by_key(|(_, b)| b.capacity())
            .map(|(i, _)| i);
        match best {
            Some(i) => {
                let buf = free.buffers.swap_remove(i);
                free.bytes -= buf.capacity();
                buf
            }
            None => Vec::with_capacity(capacity),
        }
    }

    /// `buf` as the application's [`Bytes`]: back to the pool when the last
    /// reference is dropped (if it is of a size the pool keeps).
    pub fn seal(&self, buf: Vec<u8>) -> Bytes {
        if !(POOL_FROM..=MAX_POOLED).contains(&buf.capacity()) {
            return Bytes::from(buf);
        }
        Bytes::from_owner(Pooled { buf, pool: Arc::downgrade(&self.free) })
    }

    /// Buffers waiting in the pool, and their capacity in bytes.
    pub fn held(&self) -> (usize, usize) {
        let free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        (free.buffers.len(), free.bytes)
    }
}

/// A delivered message's buffer, owned by its `Bytes`.
struct Pooled {
    buf: Vec<u8>,
    pool: Weak<Mutex<Free>>,
}

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        let Some(pool) = self.pool.upgrade() else { return };
        let mut free = pool.lock().unwrap_or_else(|e| e.into_inner());
        let cap = self.buf.capacity();
        if free.buffers.len() < MAX_BUFFERS && free.bytes + cap <= MAX_BYTES {
            let mut buf = std::mem::take(&mut self.buf);
            buf.clear();
            free.bytes += cap;
            free.buffers.push(buf);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dropped_message_returns_its_buffer_for_the_next() {
        let pool = MessagePool::new();
        let mut buf = pool.take(64 * 1024);
        buf.extend_from_slice(&[7u8; 64 * 1024]);
        let ptr = buf.as_ptr();
        let bytes = pool.seal(buf);
        let copy = bytes.slice(10..20);
        drop(bytes);
        assert_eq!(pool.held().0, 0, "a slice still refers to it");
        assert_eq!(&copy[..], &[7u8; 10]);
        drop(copy);
        assert_eq!(pool.held(), (1, 64 * 1024));
        let again = pool.take(60 * 1024);
        assert_eq!(again.as_ptr(), ptr, "the same memory, its pages mapped");
        assert!(again.is_empty());
        assert_eq!(pool.held(), (0, 0));
    }

    #[test]
    fn the_pool_is_bounded_and_keeps_only_its_sizes() {
        let pool = MessagePool::new();
        drop(pool.seal(pool.take(1024)));
        drop(pool.seal(pool.take(MAX_POOLED + 1)));
        assert_eq!(pool.held().0, 0, "too small and too large are not kept");
        let many: Vec<Bytes> = (0..MAX_BUFFERS + 8).map(|_| pool.seal(pool.take(POOL_FROM))).collect();
        drop(many);
        assert_eq!(pool.held().0, MAX_BUFFERS);
        // In bytes: a pool of its own, so the count bound is not the one hit.
        let fresh = MessagePool::new();
        let big: Vec<Bytes> = (0..8).map(|_| fresh.seal(fresh.take(MAX_POOLED))).collect();
        drop(big);
        assert_eq!(fresh.held(), (MAX_BYTES / MAX_POOLED, MAX_BYTES));
        // A buffer far larger than asked for is not handed out.
        let small = pool.take(POOL_FROM);
        assert!(small.capacity() <= 2 * POOL_FROM);
    }

    #[test]
    fn a_buffer_outliving_its_pool_is_freed() {
        let pool = MessagePool::new();
        let bytes = pool.seal(pool.take(POOL_FROM));
        drop(pool);
        drop(bytes);
    }
}
