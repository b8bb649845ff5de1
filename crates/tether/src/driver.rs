//! One step of progress: move datagrams between the transport and the
//! sans-IO core, run expired timers. Everything here only moves bytes and
//! reads the clock; every decision is the core's (DESIGN.md).
//!
//! Datagrams go out in batches (one `sendmmsg` for up to `BATCH` packets
//! where the transport supports it) from buffers allocated once at start-up:
//! the data path does not allocate.

use std::time::Duration;

use tether_fault::{CallVerdict, FaultCounters, Injector};
use tether_io::{NodeId, RecvBatch, Transport, TransportError};
use tether_proto::{Endpoint as Core, Instant};

/// Datagrams per send or receive batch.
const BATCH: usize = 32;

pub(crate) struct Driver {
    pub core: Core,
    transport: Box<dyn Transport + Send>,
    rx: RecvBatch,
    /// `BATCH` slots of `max_datagram` bytes each.
    tx: Vec<u8>,
    tx_meta: [(NodeId, usize); BATCH],
    /// Slots `[tx_start, tx_len)` are built and not yet accepted by the transport.
    tx_start: usize,
    tx_len: usize,
    slot: usize,
    /// Datagrams the transport refused with an error other than back-pressure.
    pub send_errors: u64,
    pub last_send_error: Option<TransportError>,
    /// `None`: not known, recompute; `Some(d)`: the core's `poll_timeout()`.
    next_deadline: Option<Option<Instant>>,
    /// Faults on the application's calls, and the time they count from.
    api: Option<(Injector, Instant)>,
}

impl Driver {
    pub fn new(core: Core, transport: Box<dyn Transport + Send>, api: Option<(Injector, Instant)>) -> Self {
        let slot = core.config().max_datagram;
        Driver {
            rx: RecvBatch::new(BATCH, slot),
            tx: vec![0; BATCH * slot],
            tx_meta: [(0, 0); BATCH],
            tx_start: 0,
            tx_len: 0,
            slot,
            core,
            transport,
            send_errors: 0,
            last_send_error: None,
            next_deadline: None,
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

    pub fn api_fault_counters(&self) -> FaultCounters {
        self.api.as_ref().map(|(i, _)| i.counters()).unwrap_or_default()
    }

    pub fn set_api_faults_enabled(&mut self, on: bool) {
        if let Some((i, _)) = &mut self.api {
            i.set_enabled(on);
        }
    }

    pub fn transport(&self) -> &(dyn Transport + Send) {
        &*self.transport
    }

    pub fn transport_mut(&mut self) -> &mut (dyn Transport + Send) {
        &mut *self.transport
    }

    /// Receive everything waiting, run timers, send everything the core has.
    pub fn step(&mut self, now: Instant) {
        let received = self.receive(now);
        // A turn that brought nothing, with no timer due and nothing queued,
        // has nothing more to do: spinning receivers take this path millions
        // of times, so it must cost no more than the receive call.
        if received == 0 && self.tx_start == self.tx_len && self.next_deadline().is_none_or(|t| now < t) {
            return;
        }
        if self.core.poll_timeout().is_some_and(|t| t <= now) {
            self.core.handle_timeout(now);
        }
        self.transmit(now);
    }

    /// The core's next deadline, recomputed only after something changed:
    /// computing it visits every peer, too much to do per message sent.
    pub fn next_deadline(&mut self) -> Option<Instant> {
        *self.next_deadline.get_or_insert_with(|| self.core.poll_timeout())
    }

    /// The next delivered message. Reading from a full delivery queue lets
    /// waiting data in and owes its sender an ACK at once: a new deadline.
    pub fn recv(&mut self) -> Option<tether_proto::Delivery> {
        let was_full = self.core.delivery_queue_full();
        let d = self.core.recv();
        if was_full {
            self.refresh_deadline();
        }
        d
    }

    /// How long the driver may sleep before there is work: the core's next
    /// deadline, or a datagram a fault injector holds back until then.
    pub fn idle_for(&mut self, now: Instant) -> Option<Duration> {
        let timer = self.next_deadline().map(|t| t.saturating_since(now));
        match (timer, self.transport.next_wakeup()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Call after changing the core (a send, a step).
    pub fn refresh_deadline(&mut self) {
        self.next_deadline = None;
    }

    fn receive(&mut self, now: Instant) -> usize {
        let mut total = 0;
        loop {
            let n = match self.transport.recv_batch(&mut self.rx) {
                Ok(n) => n,
                // Receive errors are transient by nature for datagram sockets
                // (e.g. ICMP-reported refusals); reliability repairs any loss.
                Err(_) => return total,
            };
            for (_, datagram) in self.rx.iter() {
                self.core.handle_datagram(now, datagram);
            }
            total += n;
            if n < BATCH {
                return total;
            }
        }
    }

    /// Send what is pending, then keep asking the core for datagrams.
    pub fn transmit(&mut self, now: Instant) -> usize {
        let mut sent = 0;
        loop {
            if self.tx_start < self.tx_len {
                match self.flush_pending() {
                    Some(n) => sent += n,
                    // The socket is full: keep the rest for the next step.
                    None => {
                        self.refresh_deadline();
                        return sent;
                    }
                }
                continue;
            }
            self.tx_start = 0;
            self.tx_len = 0;
            while self.tx_len < BATCH {
                let at = self.tx_len * self.slot;
                match self.core.poll_transmit(now, &mut self.tx[at..at + self.slot]) {
                    Some(t) => {
                        self.tx_meta[self.tx_len] = (t.dst, t.len);
                        self.tx_len += 1;
                    }
                    None => break,
                }
            }
            if self.tx_len == 0 {
                self.refresh_deadline();
                return sent;
            }
        }
    }

    /// Hand pending slots to the transport; `None` when it would block.
    fn flush_pending(&mut self) -> Option<usize> {
        let mut batch: [(NodeId, &[u8]); BATCH] = [(0, &[]); BATCH];
        let n = self.tx_len - self.tx_start;
        for (i, slot) in (self.tx_start..self.tx_len).enumerate() {
            let (dst, len) = self.tx_meta[slot];
            let at = slot * self.slot;
            batch[i] = (dst, &self.tx[at..at + len]);
        }
        match self.transport.send_batch(&batch[..n]) {
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
                self.send_errors += 1;
                self.last_send_error = Some(e);
                self.tx_start += 1;
                Some(0)
            }
        }
    }
}
