//! Several messages a call: what a batch send took, and the caller's
//! buffer a batch receive fills.
//!
//! Per message, a blocking `send` and `recv` pay a lock, a look at the
//! peer's wake-up flag and, on receipt, an allocation and a queue; between
//! two applications on one engine (docs/ENGINE.md, "The direct path") that
//! is most of a message's cost, where the ring under it passes tens of
//! millions of records a second. A batch pays them once per call, and a
//! [`Received`] is the caller's own memory, reused from call to call, so a
//! steady stream of receipts allocates nothing (`recvmmsg` and Aeron's
//! fragment handlers, which poll many messages a call, are the models).
//! Bounded in count and in bytes, as every buffer is.

use crate::{MessageId, NodeId};

/// What a batch send took: the messages `first.seq .. first.seq + count`
/// to `first.peer`, in order. Fewer than offered when something stopped
/// the batch after some were taken: the wait for room ran out, the
/// protocol refused the next, or (embedded, while waiting for room)
/// another thread sent to the same peer, whose message would have broken
/// the run of ids. The next call meets whatever it was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SentBatch {
    /// The id of the first message taken.
    pub first: MessageId,
    /// How many were taken.
    pub count: usize,
}

impl SentBatch {
    /// The id of message `i` of the batch.
    pub fn id(&self, i: usize) -> Option<MessageId> {
        (i < self.count).then(|| MessageId { peer: self.first.peer, seq: self.first.seq + i as u64 })
    }
}

/// The messages handed to a batch send, each by its place, in order:
/// a slice, an array or a `Vec` of anything that is bytes (`&[u8]`,
/// `Vec<u8>`, `Bytes`, ...), and a trait object of them, so a batch can
/// pass through a layer that cannot be generic.
pub trait Messages {
    /// How many there are.
    fn count(&self) -> usize;
    /// Message `i` (`i < count()`).
    fn message(&self, i: usize) -> &[u8];
}

impl<M: AsRef<[u8]>> Messages for [M] {
    fn count(&self) -> usize {
        self.len()
    }
    fn message(&self, i: usize) -> &[u8] {
        self[i].as_ref()
    }
}

impl<M: AsRef<[u8]>> Messages for Vec<M> {
    fn count(&self) -> usize {
        self.len()
    }
    fn message(&self, i: usize) -> &[u8] {
        self[i].as_ref()
    }
}

impl<M: AsRef<[u8]>, const N: usize> Messages for [M; N] {
    fn count(&self) -> usize {
        N
    }
    fn message(&self, i: usize) -> &[u8] {
        self[i].as_ref()
    }
}

/// One message's place in a [`Received`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    from: NodeId,
    start: usize,
    end: usize,
}

/// Messages received in one call, copied into this buffer: at most
/// `max_messages`, and no more than `max_bytes` of them together unless a
/// single message is larger (a message is never split or refused for its
/// size: it then comes alone). Reuse one across calls: its memory is kept.
#[derive(Debug, Clone, Default)]
pub struct Received {
    bytes: Vec<u8>,
    entries: Vec<Entry>,
    max_messages: usize,
    max_bytes: usize,
}

impl Received {
    /// A buffer for up to `max_messages` messages (at least one) and
    /// `max_bytes` bytes of them, its memory taken now.
    pub fn new(max_messages: usize, max_bytes: usize) -> Self {
        let max_messages = max_messages.max(1);
        Received {
            bytes: Vec::with_capacity(max_bytes),
            entries: Vec::with_capacity(max_messages),
            max_messages,
            max_bytes,
        }
    }

    /// Messages held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// No message held.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Forget the messages held (the memory stays).
    pub fn clear(&mut self) {
        self.bytes.clear();
        self.entries.clear();
    }

    /// Message `i`: who sent it, and its bytes.
    pub fn get(&self, i: usize) -> Option<(NodeId, &[u8])> {
        let e = self.entries.get(i)?;
        Some((e.from, &self.bytes[e.start..e.end]))
    }

    /// The messages in the order they were received.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (NodeId, &[u8])> + '_ {
        self.entries.iter().map(|e| (e.from, &self.bytes[e.start..e.end]))
    }

    /// Whether a message of `len` bytes would be taken now.
    pub fn has_room(&self, len: usize) -> bool {
        self.entries.is_empty()
            || (self.entries.len() < self.max_messages && self.bytes.len() + len <= self.max_bytes)
    }

    /// Take a copy of `message` from `from`; false (and nothing taken) if
    /// there is no room for it (`has_room`).
    pub fn push(&mut self, from: NodeId, message: &[u8]) -> bool {
        if !self.has_room(message.len()) {
            return false;
        }
        let start = self.bytes.len();
        self.bytes.extend_from_slice(message);
        self.entries.push(Entry { from, start, end: self.bytes.len() });
        true
    }

    /// No more messages fit, of any size.
    pub fn is_full(&self) -> bool {
        !self.entries.is_empty()
            && (self.entries.len() >= self.max_messages || self.bytes.len() >= self.max_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_holds_what_fits_in_order_and_keeps_its_memory() {
        let mut r = Received::new(3, 10);
        assert!(r.is_empty() && !r.is_full());
        assert!(r.push(1, b"abcd"));
        assert!(r.push(2, b"efgh"));
        assert!(!r.push(3, b"ijk"), "over the byte bound");
        assert!(r.push(3, b"ij"));
        assert!(r.is_full());
        assert!(!r.push(4, b""), "over the count bound");
        let got: Vec<_> = r.iter().collect();
        assert_eq!(got, vec![(1, &b"abcd"[..]), (2, &b"efgh"[..]), (3, &b"ij"[..])]);
        assert_eq!(r.get(1), Some((2, &b"efgh"[..])));
        assert_eq!(r.get(3), None);
        let at = r.bytes.as_ptr();
        r.clear();
        assert!(r.is_empty());
        assert!(r.push(7, b"0123456789"));
        assert_eq!(r.bytes.as_ptr(), at, "the same memory, no allocation");
        r.clear();
        // A message larger than the whole bound still comes, alone.
        assert!(r.push(5, &[0u8; 64]));
        assert!(r.is_full() && !r.push(6, b"x"));
    }

    #[test]
    fn messages_are_read_by_place_whatever_holds_them() {
        fn all<M: Messages + ?Sized>(m: &M) -> Vec<&[u8]> {
            (0..m.count()).map(|i| m.message(i)).collect()
        }
        let v = vec![b"ab".to_vec(), b"c".to_vec()];
        assert_eq!(all(&v), vec![&b"ab"[..], &b"c"[..]]);
        assert_eq!(all(&[&b"x"[..]; 3]), vec![&b"x"[..]; 3]);
        assert_eq!(all(&v[1..]), vec![&b"c"[..]]);
        let boxed: &dyn Messages = &v;
        assert_eq!(all(boxed), all(&v));
    }

    #[test]
    fn a_sent_batch_names_its_messages() {
        let b = SentBatch { first: MessageId { peer: 9, seq: 40 }, count: 2 };
        assert_eq!(b.id(1), Some(MessageId { peer: 9, seq: 41 }));
        assert_eq!(b.id(2), None);
    }
}
