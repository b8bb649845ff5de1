//! Where the call layer's bytes come from: envelopes for the wire, the
//! arguments a caller keeps for retransmission, the replies both sides
//! keep. Each is a slice split off one growing buffer (as the core's send
//! log takes its messages' bytes), so a call costs no allocation of its
//! own: a new chunk is allocated when one is used up and no earlier slice
//! still holds it, and the chunk is reused in place when every slice of it
//! has been dropped.

use bytes::{Bytes, BytesMut};

use crate::envelope::Envelope;

/// Bytes reserved at a time. Small against the replies a server keeps
/// (one kept slice holds its whole chunk).
const CHUNK: usize = 16 << 10;

#[derive(Debug, Default)]
pub(crate) struct Arena(BytesMut);

impl Arena {
    /// `env`'s bytes.
    pub fn envelope(&mut self, env: &Envelope<'_>) -> Bytes {
        self.room(env.len());
        env.write(&mut self.0);
        let bytes = self.0.split().freeze();
        assert_eq!(bytes.len(), env.len(), "an envelope wrote other than its length");
        bytes
    }

    /// A copy of `data`.
    pub fn copy(&mut self, data: &[u8]) -> Bytes {
        self.room(data.len());
        self.0.extend_from_slice(data);
        self.0.split().freeze()
    }

    fn room(&mut self, n: usize) {
        if self.0.capacity() - self.0.len() < n {
            self.0.reserve(n.max(CHUNK));
        }
        assert!(self.0.capacity() - self.0.len() >= n, "the arena made no room for {n} bytes");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::call::CallId;

    #[test]
    fn slices_are_the_bytes_given_and_stay_so() {
        let mut a = Arena::default();
        let call = CallId { client: 1, seq: 2 };
        let env = Envelope::Reply { call, result: b"result" };
        let first = a.envelope(&env);
        let copy = a.copy(b"kept");
        for _ in 0..10_000 {
            a.copy(&[7; 100]);
        }
        assert_eq!(first, env.to_vec());
        assert_eq!(&copy[..], b"kept");
    }
}
