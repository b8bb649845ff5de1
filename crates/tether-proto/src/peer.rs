//! Everything one endpoint keeps about one remote endpoint: the two halves
//! of the stream and the peer's incarnation.
//!
//! State is per peer, never per message (seeds/001 section 4.1). The hard
//! state that must survive an engine failure (DESIGN.md, the engine seam)
//! lives in the streams: unacknowledged segments, next and expected sequence
//! numbers; the RTT estimate and timers are soft and could be rebuilt.

use crate::paths::Paths;
use crate::recv_stream::RecvStream;
use crate::send_stream::SendStream;
use crate::Config;

#[derive(Debug)]
pub(crate) struct Peer {
    pub send: SendStream,
    pub recv: RecvStream,
    /// The peer's incarnation as last seen; 0 before we heard from it.
    pub incarnation: u64,
    /// Reported unreachable and not heard from since.
    pub unreachable: bool,
    /// The rails that lead to the peer and their health.
    pub paths: Paths,
}

impl Peer {
    pub fn new(config: &Config) -> Self {
        Peer {
            send: SendStream::new(config, 1),
            recv: RecvStream::new(config),
            incarnation: 0,
            unreachable: false,
            paths: Paths::new(crate::Instant::ZERO),
        }
    }

    /// Something should go on the wire to this peer at `now`.
    pub fn wants_transmit(&self, now: crate::Instant, config: &Config) -> bool {
        self.recv.ack_due(now) || self.send.has_work(now, config) || self.paths.control_due(now)
    }
}
