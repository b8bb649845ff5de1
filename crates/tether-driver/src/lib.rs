//! The driver: the rails of a node (one transport each, a socket bound to
//! one interface) and the batching, polling and bounds that move datagrams
//! between them and the protocol cores they serve. Both homes of the
//! protocol run on it: an embedded endpoint (one core) and the engine
//! process (one core per attached application, each datagram handed to
//! the core its header names). Everything here only moves bytes and reads
//! the clock it is given; every decision is a core's (docs/ARCHITECTURE.md,
//! "The sans-IO boundary").
//!
//! - Datagrams go out in batches (one `sendmmsg` for up to `BATCH` packets
//!   where the transport supports it) from buffers allocated once at
//!   start-up: the data path does not allocate. A batch the socket has no
//!   room for waits for the next turn; nothing built is dropped.
//! - A turn takes in at most `RECV_BUDGET` datagrams, then lets its caller
//!   run timers and send (Mogul and Ramakrishnan's receive livelock).
//! - Quiet rails are read at most every `QUIET_POLL`, so an idle backup
//!   costs a spinning receiver almost nothing.
//! - The sender of each datagram is what the rail's transport saw (`Seen`):
//!   identity comes from the source address, never from the header alone.
//!
//! Trahay et al. [NMAD] sections 3-4 (docs/REFERENCES.md): the rails, and
//! the progress engine that drives them.

#![warn(missing_docs)]

use std::net::SocketAddr;
use std::time::Duration;

use tether_io::{NodeId, RecvBatch, Transport, TransportError};
use tether_proto::{Instant, Origin, PeerMoved, RailId, Transmit};

/// Datagrams per send or receive batch.
pub const BATCH: usize = 32;

/// Datagrams taken in per turn, at most, before the caller runs timers and
/// sends: a receiver that drained its socket until empty never got to send
/// while a hundred peers kept it full (Mogul and Ramakrishnan's receive
/// livelock): no ACKs and no handshake answers went out for seconds, the
/// peers retransmitted, and the input grew. The rest waits for the next
/// turn, which a readable socket brings at once. A turn stops at the first
/// receive call that reaches the budget: one call of `BATCH` slots takes
/// at most `BATCH` datagrams, or, where the kernel coalesces runs, up to
/// 64 KiB of datagrams a slot (2 MiB in all, which the kernel queued as
/// 32 buffers, so a sender's runs cannot starve the turn's sends longer
/// than copying them takes).
pub const RECV_BUDGET: usize = 8 * BATCH;

/// Receive turns a rail stays busy after it last brought a datagram.
const HOT_TURNS: u16 = 4096;
/// How often quiet rails are read: far below any path timer (probes are
/// answered within it), long against a spinning turn.
const QUIET_POLL: Duration = Duration::from_micros(50);

/// Who sent a datagram, as the rail's transport saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    /// The node the transport's address book has at the source address.
    pub from: Option<NodeId>,
    /// The source address, where the transport has addresses.
    pub addr: Option<SocketAddr>,
}

impl Seen {
    /// The origin a core is told of when the transport's address book
    /// names one node per address: that node, else a stranger at the
    /// address (whose handshake must prove it).
    pub fn origin(self) -> Origin {
        match (self.from, self.addr) {
            (Some(node), _) => Origin::Node(node),
            (None, Some(addr)) => Origin::Stranger(addr),
            (None, None) => Origin::Untold,
        }
    }
}

/// A node's rails and the buffers that move datagrams through them.
pub struct Driver {
    /// One transport per rail, indexed by rail id.
    rails: Vec<Box<dyn Transport + Send>>,
    rx: RecvBatch,
    /// `BATCH` slots of `slot` bytes each.
    tx: Vec<u8>,
    /// Per slot: destination, length, rail.
    tx_meta: [(NodeId, usize, RailId); BATCH],
    /// Slots `[tx_start, tx_len)` are built and not yet accepted by the transport.
    tx_start: usize,
    tx_len: usize,
    slot: usize,
    /// Per rail: receive turns left before the rail counts as quiet. Quiet
    /// rails are read at most every `QUIET_POLL`, so an idle backup costs a
    /// spinning receiver almost nothing (a system call per turn cost 7% of
    /// an 8-byte round trip); a datagram on it makes it busy again at once.
    heat: Vec<u16>,
    /// Rails the last turn left unread (a bit each), for the cores' path
    /// judgments (`Endpoint::set_backlog`).
    backlog: u8,
    quiet_poll_at: Instant,
    /// Datagrams built and lost on the way out: a rail the driver does not
    /// have, a transport that refused them (an unknown peer, a dead
    /// interface), or the driver closed with them waiting. Each is a loss
    /// like any other, which the core repairs or reports.
    dropped: u64,
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver").field("rails", &self.rails.len()).field("pending", &self.pending()).finish()
    }
}

impl Driver {
    /// Rails `rails` (rail `i` is `rails[i]`; at least one), for datagrams
    /// of at most `max_datagram` bytes. Receive slots are large enough for
    /// the runs of datagrams a rail's kernel hands over coalesced.
    pub fn new(rails: Vec<Box<dyn Transport + Send>>, max_datagram: usize) -> Self {
        assert!(!rails.is_empty(), "a driver needs at least one rail");
        let rx_slot = rails.iter().filter_map(|t| t.coalesced_slot()).fold(max_datagram, usize::max);
        Driver {
            rx: RecvBatch::new(BATCH, rx_slot),
            tx: vec![0; BATCH * max_datagram],
            tx_meta: [(0, 0, 0); BATCH],
            tx_start: 0,
            tx_len: 0,
            slot: max_datagram,
            heat: vec![HOT_TURNS; rails.len()],
            backlog: 0,
            quiet_poll_at: Instant::ZERO,
            dropped: 0,
            rails,
        }
    }

    /// Take in what the rails have, at most `RECV_BUDGET` datagrams, each
    /// handed to `deliver` with its rail and who the transport saw send
    /// it. How many were taken in.
    pub fn receive(&mut self, now: Instant, mut deliver: impl FnMut(RailId, Seen, &[u8])) -> usize {
        let mut total = 0;
        self.backlog = 0;
        let every_rail = self.rails.len() == 1 || now >= self.quiet_poll_at;
        if every_rail {
            self.quiet_poll_at = now + QUIET_POLL;
        }
        for (rail, transport) in self.rails.iter_mut().enumerate() {
            let heat = &mut self.heat[rail];
            if *heat == 0 && !every_rail {
                continue;
            }
            *heat = heat.saturating_sub(1);
            // Receive errors are transient by nature for datagram sockets
            // (e.g. ICMP-reported refusals); reliability repairs any loss.
            while let Ok(n) = transport.recv_batch(&mut self.rx) {
                if n > 0 {
                    *heat = HOT_TURNS;
                }
                for (from, addr, datagram) in self.rx.datagrams() {
                    deliver(rail as RailId, Seen { from, addr }, datagram);
                }
                total += n;
                if !self.rx.may_hold_more() {
                    break;
                }
                if !self.rx.is_full() || total >= RECV_BUDGET {
                    // Maybe left unread (a datagram taken alone, or the
                    // budget spent): no path over this rail is judged
                    // silent before a turn reads it to the end.
                    self.backlog |= 1 << rail;
                    break;
                }
            }
        }
        total
    }

    /// Rails the last `receive` left unread (bit `r` for rail `r`).
    pub fn backlog(&self) -> u8 {
        self.backlog
    }

    /// Datagrams built and not yet taken by their transport.
    pub fn pending(&self) -> usize {
        self.tx_len - self.tx_start
    }

    /// Datagrams built and lost on the way out, so far.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Send what waits from earlier turns, then ask `next` for datagrams
    /// (each built into the slot it is given: a core's `poll_transmit`)
    /// until it has none or a socket is full. How many were sent.
    pub fn transmit(&mut self, mut next: impl FnMut(&mut [u8]) -> Option<Transmit>) -> usize {
        let mut sent = 0;
        loop {
            if self.tx_start < self.tx_len {
                match self.flush_pending() {
                    Some(n) => sent += n,
                    // The socket is full: keep the rest for the next turn.
                    None => return sent,
                }
                continue;
            }
            self.tx_start = 0;
            self.tx_len = 0;
            while self.tx_len < BATCH {
                let at = self.tx_len * self.slot;
                match next(&mut self.tx[at..at + self.slot]) {
                    Some(t) if t.to_addr.is_some() => {
                        // A WELCOME to a peer proving a new address: rare,
                        // so sent on its own, outside the batch.
                        self.send_to_addr(t, at);
                        sent += 1;
                    }
                    Some(t) => {
                        self.tx_meta[self.tx_len] = (t.dst, t.len, t.rail);
                        self.tx_len += 1;
                    }
                    None => break,
                }
            }
            if self.tx_len == 0 {
                return sent;
            }
        }
    }

    /// How soon a transport will have a datagram no descriptor signals
    /// (one a fault injector holds back).
    pub fn next_wakeup(&self) -> Option<Duration> {
        self.rails.iter().filter_map(|t| t.next_wakeup()).min()
    }

    /// Record a peer proven at a new address in its rail's transport.
    pub fn follow(&mut self, m: &PeerMoved) {
        match self.rails.get_mut(m.rail as usize).map(|t| t.add_peer(m.node, m.addr)) {
            Some(Ok(())) => tracing::info!(peer = m.node, rail = m.rail, addr = %m.addr, "peer moved"),
            other => {
                tracing::warn!(peer = m.node, rail = m.rail, addr = %m.addr, result = ?other, "peer moved; the transport cannot follow")
            }
        }
    }

    /// Close the transports, and with them their sockets. A turn
    /// afterwards receives nothing and counts what it would send as dropped.
    pub fn close(&mut self) {
        self.rails.clear();
        self.dropped += self.pending() as u64;
        self.tx_start = self.tx_len;
    }

    /// Rail `rail`'s transport, if the driver has it.
    pub fn rail(&self, rail: RailId) -> Option<&(dyn Transport + Send)> {
        self.rails.get(rail as usize).map(|t| &**t as _)
    }

    /// Rail `rail`'s transport, to change (learn a peer's address).
    pub fn rail_mut(&mut self, rail: RailId) -> Option<&mut (dyn Transport + Send)> {
        self.rails.get_mut(rail as usize).map(|t| &mut **t as _)
    }

    /// Every rail, rail 0 first.
    pub fn rails(&self) -> &[Box<dyn Transport + Send>] {
        &self.rails
    }

    /// Every rail, rail 0 first, to send on directly (the engine's
    /// self-test sends its probes so).
    pub fn rails_mut(&mut self) -> &mut [Box<dyn Transport + Send>] {
        &mut self.rails
    }

    /// How many rails the driver has (none once closed).
    pub fn rail_count(&self) -> usize {
        self.rails.len()
    }

    /// Send `t` (in the slot at `at`) to its own address, not its node's.
    fn send_to_addr(&mut self, t: Transmit, at: usize) {
        let (Some(addr), Some(transport)) = (t.to_addr, self.rails.get_mut(t.rail as usize)) else {
            self.dropped += 1;
            return;
        };
        if let Err(e) = transport.send_to_addr(addr, &self.tx[at..at + t.len]) {
            // Lost like any datagram: the peer's HELLO is retried.
            self.dropped += 1;
            tracing::debug!(rail = t.rail, %addr, error = %e, "dropped on send: handshake answer to a new address");
        }
    }

    /// Hand pending slots to their rail's transport, the leading run that
    /// shares a rail at a time; `None` when it would block.
    fn flush_pending(&mut self) -> Option<usize> {
        let mut batch: [(NodeId, &[u8]); BATCH] = [(0, &[]); BATCH];
        let rail = self.tx_meta[self.tx_start].2;
        let mut n = 0;
        for slot in self.tx_start..self.tx_len {
            let (dst, len, r) = self.tx_meta[slot];
            if r != rail {
                break;
            }
            let at = slot * self.slot;
            batch[n] = (dst, &self.tx[at..at + len]);
            n += 1;
        }
        let Some(transport) = self.rails.get_mut(rail as usize) else {
            // A rail the core knows and the driver does not (set_paths
            // named more rails than were bound): a loss, counted.
            tracing::debug!(rail, datagrams = n, "dropped on send: no transport for this rail");
            self.dropped += n as u64;
            self.tx_start += n;
            return Some(0);
        };
        match transport.send_batch(&batch[..n]) {
            Ok(0) => None,
            Ok(k) => {
                self.tx_start += k;
                Some(k)
            }
            Err(TransportError::WouldBlock) => None,
            Err(e) => {
                // A datagram the transport cannot take (unknown peer, dead
                // interface) is a loss like any other: the core retransmits
                // or, eventually, reports the peer unreachable.
                // The transport counts its own errors (`TransportCounters`).
                tracing::debug!(rail, dst = batch[0].0, error = %e, "dropped on send: transport refused");
                self.dropped += 1;
                self.tx_start += 1;
                Some(0)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tether_io::MemNetwork;
    use tether_proto::{Config, Endpoint as Core};

    /// A turn takes in at most `RECV_BUDGET` datagrams and then gets to its
    /// timers and sends; the rest wait for the next turn, none is lost.
    #[test]
    fn a_flooded_turn_stops_at_its_budget() {
        let net = MemNetwork::new(10_000);
        let mut flood = net.attach(2);
        let mut core = Core::new(Config::default(), 1, 1).unwrap();
        let mut driver = Driver::new(vec![Box::new(net.attach(1))], core.config().max_datagram);
        for _ in 0..1000 {
            // Garbage, dropped by the core's parser: counted, cheap.
            flood.send_to(1, &[0xAB; 40]).unwrap();
        }
        let turn = |driver: &mut Driver, core: &mut Core, at: u64| {
            let now = Instant::from_nanos(at);
            driver.receive(now, |rail, seen, d| core.handle_datagram_from(now, rail, seen.origin(), d))
        };
        assert_eq!(turn(&mut driver, &mut core, 1), RECV_BUDGET, "one turn, one budget");
        assert_eq!(core.stats().datagrams_received, RECV_BUDGET as u64);
        for at in 2..=4 {
            turn(&mut driver, &mut core, at);
        }
        assert_eq!(core.stats().datagrams_received, 1000, "the rest in the following turns");
    }

    /// A socket with no room (a transport answering `WouldBlock`) keeps
    /// what was built: nothing is lost, and all of it goes once there is
    /// room, before anything newer. A transport that refuses a datagram
    /// for good (an unknown peer) loses it, counted.
    #[test]
    fn a_full_socket_keeps_what_was_built_and_a_refusal_is_counted() {
        use std::sync::{Arc, Mutex};

        /// Sends go to `sent` while `room`, else `WouldBlock`; node 9 is
        /// unknown to it.
        struct Socket {
            room: Arc<Mutex<bool>>,
            sent: Arc<Mutex<Vec<Vec<u8>>>>,
        }
        impl Transport for Socket {
            fn send_to(&mut self, dst: NodeId, datagram: &[u8]) -> Result<(), TransportError> {
                if dst == 9 {
                    return Err(TransportError::Unreachable);
                }
                if !*self.room.lock().unwrap() {
                    return Err(TransportError::WouldBlock);
                }
                self.sent.lock().unwrap().push(datagram.to_vec());
                Ok(())
            }
            fn recv_batch(&mut self, _batch: &mut RecvBatch) -> Result<usize, TransportError> {
                Ok(0)
            }
            fn wait_readable(&mut self, _timeout: Option<Duration>) -> Result<bool, TransportError> {
                Ok(false)
            }
            fn counters(&self) -> tether_io::TransportCounters {
                Default::default()
            }
        }

        let (room, sent) = (Arc::new(Mutex::new(false)), Arc::new(Mutex::new(Vec::new())));
        let socket = Socket { room: room.clone(), sent: sent.clone() };
        let mut driver = Driver::new(vec![Box::new(socket)], 64);
        // Five datagrams to node 2, numbered in their first byte.
        let mut next = 0u8;
        let mut build = |buf: &mut [u8]| {
            if next == 5 {
                return None;
            }
            buf[0] = next;
            next += 1;
            Some(Transmit { dst: 2, len: 1, rail: 0, to_addr: None })
        };
        assert_eq!(driver.transmit(&mut build), 0, "no room: nothing sent");
        assert_eq!(driver.pending(), 5, "all five kept");
        assert_eq!(driver.transmit(|_| unreachable!("the kept ones go first")), 0);
        *room.lock().unwrap() = true;
        assert_eq!(driver.transmit(|_| None), 5);
        assert_eq!(driver.pending(), 0);
        let order: Vec<u8> = sent.lock().unwrap().iter().map(|d| d[0]).collect();
        assert_eq!(order, [0, 1, 2, 3, 4], "in the order built");
        assert_eq!(driver.dropped(), 0);
        // Refused for good: lost, counted, and the turn goes on.
        let mut once = Some(Transmit { dst: 9, len: 1, rail: 0, to_addr: None });
        assert_eq!(driver.transmit(|_| once.take()), 0);
        assert_eq!((driver.dropped(), driver.pending()), (1, 0));
    }
}
