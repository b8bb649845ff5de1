//! One step of progress: move datagrams between the transport and the
//! sans-IO core, run expired timers. Everything here only moves bytes and
//! reads the clock; every decision is the core's (docs/ARCHITECTURE.md,
//! "The sans-IO boundary").
//!
//! Datagrams go out in batches (one `sendmmsg` for up to `BATCH` packets
//! where the transport supports it) from buffers allocated once at start-up:
//! the data path does not allocate.
//!
//! Each rail is a transport of its own (a socket bound to one interface);
//! the core says which rail every datagram takes and hears which rail each
//! arrived on (Trahay et al. [NMAD] sections 3-4; docs/REFERENCES.md).
//!
//! What rides on the core's streams above it (an endpoint's calls) is a
//! `Layer` the driver pumps at every step; the driver knows nothing of it.

use std::time::Duration;

use tether_fault::{CallVerdict, FaultCounters, Injector};
use tether_io::{NodeId, RecvBatch, Transport, TransportError};
use tether_proto::{Endpoint as Core, Instant, Origin, RailId, Transmit};

/// Datagrams per send or receive batch.
const BATCH: usize = 32;

/// What runs over the core's streams, above the driver: it takes what the
/// core delivered for it and gives the core what it sends, once per step,
/// after the core's timers and before the step transmits.
pub(crate) trait Layer {
    fn pump(&mut self, now: Instant, core: &mut Core);
    /// When its own timers next want a step.
    fn poll_timeout(&self) -> Option<Instant>;
}

/// No layer above the core.
impl Layer for () {
    fn pump(&mut self, _now: Instant, _core: &mut Core) {}

    fn poll_timeout(&self) -> Option<Instant> {
        None
    }
}

pub(crate) struct Driver<L> {
    pub core: Core,
    /// What runs over the core's streams (an endpoint's calls).
    pub layer: L,
    /// One transport per rail, indexed by rail id.
    rails: Vec<Box<dyn Transport + Send>>,
    rx: RecvBatch,
    /// `BATCH` slots of `max_datagram` bytes each.
    tx: Vec<u8>,
    /// Per slot: destination, length, rail.
    tx_meta: [(NodeId, usize, RailId); BATCH],
    /// Slots `[tx_start, tx_len)` are built and not yet accepted by the transport.
    tx_start: usize,
    tx_len: usize,
    slot: usize,
    /// Faults on the application's calls, and the time they count from.
    api: Option<(Injector, Instant)>,
    /// Per rail: receive turns left before the rail counts as quiet. Quiet
    /// rails are read at most every `QUIET_POLL`, so an idle backup costs a
    /// spinning receiver almost nothing (a system call per turn cost 7% of
    /// an 8-byte round trip); a datagram on it makes it busy again at once.
    heat: Vec<u16>,
    /// Rails this turn left unread (a bit each), for the core's path
    /// judgments (`Endpoint::set_backlog`).
    backlog: u8,
    quiet_poll_at: Instant,
    /// When the last step began (whoever took it).
    last_step: Instant,
}

/// Datagrams taken in per step, at most, before the step runs timers and
/// sends: a receiver that drained its socket until empty never got to send
/// while a hundred peers kept it full (Mogul and Ramakrishnan's receive
/// livelock): no ACKs and no handshake answers went out for seconds, the
/// peers retransmitted, and the input grew. The rest waits for the next
/// step, which a readable socket brings at once.
const RECV_BUDGET: usize = 8 * BATCH;

/// Receive turns a rail stays busy after it last brought a datagram.
const HOT_TURNS: u16 = 4096;
/// How often quiet rails are read: far below any path timer (probes are
/// answered within it), long against a spinning turn.
const QUIET_POLL: Duration = Duration::from_micros(50);

impl<L: Layer> Driver<L> {
    /// `rails` is non-empty: rail 0 at least.
    pub fn new(
        core: Core,
        layer: L,
        rails: Vec<Box<dyn Transport + Send>>,
        api: Option<(Injector, Instant)>,
    ) -> Self {
        assert!(!rails.is_empty(), "a driver needs at least one rail");
        let slot = core.config().max_datagram;
        Driver {
            rx: RecvBatch::new(BATCH, slot),
            tx: vec![0; BATCH * slot],
            tx_meta: [(0, 0, 0); BATCH],
            tx_start: 0,
            tx_len: 0,
            slot,
            core,
            layer,
            heat: vec![HOT_TURNS; rails.len()],
            quiet_poll_at: Instant::ZERO,
            backlog: 0,
            last_step: Instant::ZERO,
            rails,
            api,
        }
    }

    /// Whether an injected fault strikes this application call.
    pub fn api_fault(&mut self, now: Instant) -> CallVerdict {
        match &mut self.api {
            None => CallVerdict::Proceed,
            Some((inj, origin)) => {
                inj.on_call(Duration::from_nanos(now.saturating_since(*origin).as_nanos() as u64))
            }
        }
    }

    /// Calls may be struck by the fault plan (`api_fault` must be asked).
    pub fn has_api_faults(&self) -> bool {
        self.api.is_some()
    }

    pub fn api_fault_counters(&self) -> FaultCounters {
        self.api.as_ref().map(|(i, _)| i.counters()).unwrap_or_default()
    }

    pub fn set_api_faults_enabled(&mut self, on: bool) {
        if let Some((i, _)) = &mut self.api {
            i.set_enabled(on);
        }
    }

    /// Make sure the core knows `peer` if rail 0 can reach it (a transport
    /// given an address book up front): the core refuses sends to a node
    /// nobody added, with a typed error at once.
    pub fn learn_peer(&mut self, peer: NodeId) {
        if !self.core.knows(peer) && self.rails.first().is_some_and(|r| r.has_peer(peer)) {
            // A full peer table is reported by the send that follows.
            let _ = self.core.add_peer(peer);
        }
    }

    /// Close the transports, and with them their sockets: the endpoint
    /// has stopped, and what outlives it (send handles) asks only the
    /// core. A step afterwards receives nothing and counts what it would
    /// send as dropped.
    pub fn close_transports(&mut self) {
        self.rails.clear();
    }

    /// Rail 0's transport (while the endpoint is open).
    pub fn transport(&self) -> &(dyn Transport + Send) {
        &*self.rails[0]
    }

    pub fn rail(&self, rail: RailId) -> Option<&(dyn Transport + Send)> {
        self.rails.get(rail as usize).map(|t| &**t as _)
    }

    pub fn rail_mut(&mut self, rail: RailId) -> Option<&mut (dyn Transport + Send)> {
        self.rails.get_mut(rail as usize).map(|t| &mut **t as _)
    }

    pub fn rail_count(&self) -> usize {
        self.rails.len()
    }

    /// Receive everything waiting, run timers, send everything the core has.
    pub fn step(&mut self, now: Instant) {
        self.last_step = self.last_step.max(now);
        let received = self.receive(now);
        self.core.set_backlog(self.backlog);
        // A turn that brought nothing, with no timer due and nothing queued,
        // has nothing more to do: spinning receivers take this path millions
        // of times, so it must cost no more than the receive call.
        if received == 0 && self.tx_start == self.tx_len && self.poll_timeout().is_none_or(|t| now < t) {
            return;
        }
        if self.core.poll_timeout().is_some_and(|t| t <= now) {
            self.core.handle_timeout(now);
        }
        self.layer.pump(now, &mut self.core);
        self.transmit(now);
    }

    /// How long since a step last began, at `now`.
    pub fn unstepped_for(&self, now: Instant) -> Duration {
        now.saturating_since(self.last_step)
    }

    /// The earliest deadline of the core and the layer above it.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match (self.core.poll_timeout(), self.layer.poll_timeout()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// How long the driver may sleep before there is work: the core's next
    /// deadline, or a datagram a fault injector holds back until then.
    pub fn idle_for(&mut self, now: Instant) -> Option<Duration> {
        let timer = self.poll_timeout().map(|t| t.saturating_since(now));
        let held = self.rails.iter().filter_map(|t| t.next_wakeup()).min();
        [timer, held].into_iter().flatten().min()
    }

    fn receive(&mut self, now: Instant) -> usize {
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
                for (i, (from, datagram)) in self.rx.iter().enumerate() {
                    // Identity from the source address the transport saw
                    // (its address book), never from the header alone.
                    let origin = match (from, self.rx.addr(i)) {
                        (Some(node), _) => {
                            if !self.core.knows(node) && transport.has_peer(node) {
                                // Configured in the transport: a peer, not a
                                // stranger (a full table counts the drop).
                                let _ = self.core.add_peer(node);
                            }
                            Origin::Node(node)
                        }
                        (None, Some(addr)) => Origin::Stranger(addr),
                        (None, None) => Origin::Untold,
                    };
                    self.core.handle_datagram_from(now, rail as RailId, origin, datagram);
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
        self.follow_moves();
        total
    }

    /// Send what is pending, then keep asking the core for datagrams.
    pub fn transmit(&mut self, now: Instant) -> usize {
        let mut sent = 0;
        loop {
            if self.tx_start < self.tx_len {
                match self.flush_pending() {
                    Some(n) => sent += n,
                    // The socket is full: keep the rest for the next step.
                    None => return sent,
                }
                continue;
            }
            self.tx_start = 0;
            self.tx_len = 0;
            while self.tx_len < BATCH {
                let at = self.tx_len * self.slot;
                match self.core.poll_transmit(now, &mut self.tx[at..at + self.slot]) {
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

    /// Send `t` (in the slot at `at`) to its own address, not its node's.
    fn send_to_addr(&mut self, t: Transmit, at: usize) {
        let (Some(addr), Some(transport)) = (t.to_addr, self.rails.get_mut(t.rail as usize)) else { return };
        if let Err(e) = transport.send_to_addr(addr, &self.tx[at..at + t.len]) {
            // Lost like any datagram: the peer's HELLO is retried.
            tracing::debug!(rail = t.rail, %addr, error = %e, "dropped on send: handshake answer to a new address");
        }
    }

    /// Record peers proven at new addresses in their rail's transport.
    fn follow_moves(&mut self) {
        while let Some(m) = self.core.poll_moved() {
            match self.rails.get_mut(m.rail as usize).map(|t| t.add_peer(m.node, m.addr)) {
                Some(Ok(())) => tracing::info!(peer = m.node, rail = m.rail, addr = %m.addr, "peer moved"),
                other => {
                    tracing::warn!(peer = m.node, rail = m.rail, addr = %m.addr, result = ?other, "peer moved; the transport cannot follow")
                }
            }
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
            // A rail the core knows and the runtime does not (set_paths
            // named more rails than were bound): a loss, counted.
            tracing::debug!(rail, datagrams = n, "dropped on send: no transport for this rail");
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
    use tether_proto::Config;

    /// A step takes in at most `RECV_BUDGET` datagrams and then gets to its
    /// timers and sends; the rest wait for the next step, none is lost.
    #[test]
    fn a_flooded_step_stops_at_its_budget() {
        let net = MemNetwork::new(10_000);
        let mut flood = net.attach(2);
        let core = Core::new(Config::default(), 1, 1).unwrap();
        let mut driver = Driver::new(core, (), vec![Box::new(net.attach(1))], None);
        for _ in 0..1000 {
            // Garbage, dropped by the core's parser: counted, cheap.
            flood.send_to(1, &[0xAB; 40]).unwrap();
        }
        let received = |d: &Driver<()>| d.core.stats().datagrams_received;
        driver.step(Instant::from_nanos(1));
        assert_eq!(received(&driver), RECV_BUDGET as u64, "one step, one budget");
        for turn in 2..=4 {
            driver.step(Instant::from_nanos(turn));
        }
        assert_eq!(received(&driver), 1000, "the rest in the following steps");
    }
}
