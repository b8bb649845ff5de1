//! Which peers may have something to send: the endpoint looks at these,
//! not at every peer, for the next datagram.
//!
//! `poll_transmit` used to ask every peer in turn whether it wanted to
//! send; the driver polls until nothing does, so every datagram, and the
//! last poll of each batch, cost a look at every peer. With 127 peers per
//! endpoint that look was a quarter of all the CPU a 128-node demo used
//! (`Endpoint::poll_transmit` 15%, `SendStream::send_due` 11%).
//!
//! A peer can come to want to send in three ways only: an operation on it
//! (a datagram from it, a message for it, one of its timers: everything
//! goes through `Endpoint::with_peer`), the application reading from a
//! full delivery queue (its ACK owed), and room opening in the endpoint's
//! window (`aggregate`) for data that waited for it. So every peer an
//! operation touched joins the `ready` queue (once), and `poll_transmit`
//! takes peers from its front: a peer with something to send sends and
//! goes to the back (round robin, as before), one with nothing leaves;
//! one whose data waits for the endpoint's window joins the `held` queue,
//! from which peers return to `ready`, oldest first, as room opens. What
//! a peer will want later, at a time (a delayed ACK, paced or coalesced
//! data, a probe), its timer brings back through `with_peer`.

use std::collections::VecDeque;

use crate::NodeId;

/// The two queues; each peer's flags say which it is in (`Peer::listed`).
#[derive(Debug, Default)]
pub(crate) struct ReadyList {
    /// Peers that may want to send now, in turn.
    pub ready: VecDeque<NodeId>,
    /// Peers whose data waits for room in the endpoint's window, oldest
    /// first.
    pub held: VecDeque<NodeId>,
}

/// A peer's places in the queues (kept in the peer, so joining is a flag
/// test and a push; each queue holds a peer once, so neither holds more
/// than `MAX_PEERS`).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Listed {
    pub ready: bool,
    pub held: bool,
}

impl ReadyList {
    /// The peer `id` may want to send: in line, if it is not already.
    pub fn list(&mut self, id: NodeId, listed: &mut Listed) {
        if !listed.ready {
            listed.ready = true;
            self.ready.push_back(id);
        }
    }

    /// The peer's data waits for the endpoint's window.
    pub fn hold(&mut self, id: NodeId, listed: &mut Listed) {
        if !listed.held {
            listed.held = true;
            self.held.push_back(id);
        }
    }
}
