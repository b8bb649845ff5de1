//! An embedded endpoint's station: its protocol core, the layer that rides
//! the core's streams above it (the calls), and the driver under it
//! (`tether-driver`: the rails, batching, the receive budget, quiet-rail
//! polling). One step of progress: take in what the rails have, run the
//! core's expired timers, pump the layer above, send what the core has.
//! Everything here only moves bytes and reads the clock; every decision is
//! the core's (docs/ARCHITECTURE.md, "The sans-IO boundary").
//!
//! The driver knows nothing of the layer above: it is a `Layer` the
//! station pumps at every step.

use std::time::Duration;

use tether_driver::Driver;
use tether_io::{NodeId, Transport};
use tether_proto::{Endpoint as Core, Instant, RailId};

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

pub(crate) struct Station<L> {
    pub core: Core,
    /// What runs over the core's streams (an endpoint's calls).
    pub layer: L,
    driver: Driver,
    /// When the last step began (whoever took it).
    last_step: Instant,
}

impl<L: Layer> Station<L> {
    /// `rails` is non-empty: rail 0 at least.
    pub fn new(core: Core, layer: L, rails: Vec<Box<dyn Transport + Send>>) -> Self {
        let driver = Driver::new(rails, core.config().max_datagram);
        Station { core, layer, driver, last_step: Instant::ZERO }
    }

    /// Make sure the core knows `peer` if rail 0 can reach it (a transport
    /// given an address book up front): the core refuses sends to a node
    /// nobody added, with a typed error at once.
    pub fn learn_peer(&mut self, peer: NodeId) {
        if !self.core.knows(peer) && self.driver.rail(0).is_some_and(|r| r.has_peer(peer)) {
            // A full peer table is reported by the send that follows.
            let _ = self.core.add_peer(peer);
        }
    }

    /// Close the transports, and with them their sockets: the endpoint
    /// has stopped, and what outlives it (send handles) asks only the
    /// core. A step afterwards receives nothing and counts what it would
    /// send as dropped.
    pub fn close_transports(&mut self) {
        self.driver.close();
    }

    pub fn rail(&self, rail: RailId) -> Option<&(dyn Transport + Send)> {
        self.driver.rail(rail)
    }

    pub fn rail_mut(&mut self, rail: RailId) -> Option<&mut (dyn Transport + Send)> {
        self.driver.rail_mut(rail)
    }

    pub fn rail_count(&self) -> usize {
        self.driver.rail_count()
    }

    /// Receive what the rails have (up to the driver's budget), run
    /// timers, pump the layer above, send everything the core has.
    pub fn step(&mut self, now: Instant) {
        self.last_step = self.last_step.max(now);
        let received = self.receive(now);
        self.core.set_backlog(self.driver.backlog());
        // A turn that brought nothing, with no timer due and nothing queued,
        // has nothing more to do: spinning receivers take this path millions
        // of times, so it must cost no more than the receive call.
        if received == 0 && self.driver.pending() == 0 && self.poll_timeout().is_none_or(|t| now < t) {
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

    /// How long the station may sleep before there is work: the core's next
    /// deadline, or a datagram a fault injector holds back until then.
    pub fn idle_for(&mut self, now: Instant) -> Option<Duration> {
        let timer = self.poll_timeout().map(|t| t.saturating_since(now));
        [timer, self.driver.next_wakeup()].into_iter().flatten().min()
    }

    fn receive(&mut self, now: Instant) -> usize {
        let Station { core, driver, .. } = self;
        let received = driver.receive(now, |rail, seen, datagram| {
            // Identity from the source address the transport saw (its
            // address book), never from the header alone.
            if let Some(node) = seen.from {
                if !core.knows(node) {
                    // Configured in the transport: a peer, not a stranger
                    // (a full table counts the drop).
                    let _ = core.add_peer(node);
                }
            }
            core.handle_datagram_from(now, rail, seen.origin(), datagram);
        });
        while let Some(m) = self.core.poll_moved() {
            self.driver.follow(&m);
        }
        received
    }

    /// Send what is pending, then keep asking the core for datagrams.
    pub fn transmit(&mut self, now: Instant) -> usize {
        let Station { core, driver, .. } = self;
        driver.transmit(|buf| core.poll_transmit(now, buf))
    }
}
