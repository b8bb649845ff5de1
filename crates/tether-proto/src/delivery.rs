//! Where received messages go: the application's delivery queue, and the
//! arena that received bytes are copied into when they are not landed in
//! place.
//!
//! The delivery queue is the commit point of Zhou et al. [FTGM] section 4
//! (docs/REFERENCES.md): a receiver acknowledges a segment only once it is
//! consumed into this queue (or into the message being reassembled for it),
//! so no acknowledged message can be lost between receipt and the
//! application. The queue is bounded in bytes; when it is full, new data is
//! not consumed and so not acknowledged, and the sender holds it.
//!
//! This module knows nothing of streams or landings: both the receive
//! stream and the landing code use it, and it uses neither.

use std::collections::VecDeque;

use bytes::{Bytes, BytesMut};

use crate::{Channel, Delivery, Stats};

/// Arena chunks are allocated at least this large, so most copies land in
/// space already there (one allocation per chunk, not per message).
pub(crate) const ARENA_CHUNK: usize = 64 * 1024;

/// What one queued delivery costs besides its bytes: its slot in the
/// queue. Counted against `Config::delivery_queue_bytes`, so a flood of
/// empty messages fills the queue as surely as large ones.
pub const DELIVERY_COST: usize = core::mem::size_of::<Delivery>();

/// Messages delivered to the application and not yet read, bounded in
/// memory and in count: when it is full, new data is not consumed and so
/// not acknowledged.
#[derive(Debug, Default)]
pub(crate) struct DeliveryQueue {
    queue: VecDeque<Delivery>,
    /// Memory charged: each message's bytes plus `DELIVERY_COST`.
    bytes: usize,
    /// How many of them each channel has (`Delivery::channel`): a search
    /// for one channel's stops at once when none of it waits.
    per_channel: [usize; Channel::COUNT],
    limit: usize,
    max_messages: usize,
}

impl DeliveryQueue {
    pub fn new(limit: usize, max_messages: usize) -> Self {
        DeliveryQueue {
            queue: VecDeque::new(),
            bytes: 0,
            per_channel: [0; Channel::COUNT],
            limit,
            max_messages,
        }
    }

    pub fn has_room(&self) -> bool {
        // One message may overshoot the byte limit, so the largest allowed
        // message always fits.
        self.bytes < self.limit && self.queue.len() < self.max_messages
    }

    pub fn push(&mut self, d: Delivery, stats: &mut Stats) {
        self.bytes += d.message.len() + DELIVERY_COST;
        self.per_channel[d.channel.index()] += 1;
        stats.messages_delivered += 1;
        self.queue.push_back(d);
    }

    /// The next delivery's length in bytes.
    pub fn front_len(&self) -> Option<usize> {
        self.queue.front().map(|d| d.message.len())
    }

    /// The length of the oldest delivery on `channel`.
    pub fn front_len_on(&self, channel: Channel) -> Option<usize> {
        if self.per_channel[channel.index()] == 0 {
            return None;
        }
        self.queue.iter().find(|d| d.channel == channel).map(|d| d.message.len())
    }

    pub fn pop(&mut self) -> Option<Delivery> {
        let d = self.queue.pop_front()?;
        self.taken(&d);
        Some(d)
    }

    /// The front delivery's channel.
    pub fn front_channel(&self) -> Option<Channel> {
        self.queue.front().map(|d| d.channel)
    }

    /// The oldest delivery on `channel`, passing over the others': each
    /// channel stays in order, and none waits for another's to be taken.
    pub fn pop_channel(&mut self, channel: Channel) -> Option<Delivery> {
        if self.per_channel[channel.index()] == 0 {
            return None;
        }
        let i = self.queue.iter().position(|d| d.channel == channel)?;
        let d = self.queue.remove(i)?;
        self.taken(&d);
        Some(d)
    }

    fn taken(&mut self, d: &Delivery) {
        self.bytes -= d.message.len() + DELIVERY_COST;
        self.per_channel[d.channel.index()] -= 1;
        give_back(&mut self.queue);
    }

    /// Memory charged to the queue now.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn len(&self) -> usize {
        self.queue.len()
    }

    /// Everything waiting, oldest first: what a rebuilt endpoint must
    /// still hand the application (the queue is the application's, not
    /// the engine's).
    pub fn iter(&self) -> impl Iterator<Item = &Delivery> {
        self.queue.iter()
    }

    /// The queue's own accounting agrees with its contents.
    pub fn check_invariants(&self) {
        assert!(
            self.bytes == self.queue.iter().map(|d| d.message.len() + DELIVERY_COST).sum::<usize>(),
            "delivery queue byte count disagrees with its contents"
        );
        for (i, &n) in self.per_channel.iter().enumerate() {
            assert!(
                n == self.queue.iter().filter(|d| d.channel.index() == i).count(),
                "delivery queue's count for channel {i} disagrees with its contents"
            );
        }
    }
}

/// Queues smaller than this keep their capacity: shrinking them would
/// only reallocate on the next burst.
const KEEP_CAPACITY: usize = 4096;

/// Return a drained queue's spare capacity to the allocator: after a
/// burst the queue would otherwise keep its peak size for good. Halves the
/// capacity once the queue is a quarter full, so a queue hovering around
/// one size never reallocates back and forth.
pub(crate) fn give_back<T>(queue: &mut VecDeque<T>) {
    let cap = queue.capacity();
    if cap > KEEP_CAPACITY && queue.len() < cap / 4 {
        queue.shrink_to((cap / 2).max(KEEP_CAPACITY));
    }
}

/// Copy `data` into a shared arena chunk: one allocation per chunk, not per message.
pub(crate) fn copy_to_bytes(arena: &mut BytesMut, data: &[u8]) -> Bytes {
    if arena.capacity() - arena.len() < data.len() {
        arena.reserve(data.len().max(ARENA_CHUNK));
    }
    arena.extend_from_slice(data);
    arena.split().freeze()
}
