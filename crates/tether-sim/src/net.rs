//! A virtual-time network of real `tether_proto::Endpoint`s: the one
//! harness the simulator's `World` and the pair and rails tests of
//! tether-proto drive endpoints with, so that how an endpoint is driven
//! (the loop of docs/ARCHITECTURE.md, "The sans-IO boundary") is written
//! once.
//!
//! It owns the virtual clock, the endpoints by node id, and one queue of
//! everything scheduled: datagrams in flight (source, destination, rail,
//! bytes), each endpoint's wake-up at its `poll_timeout`, and events of
//! the caller's own (`U`: a simulator's restarts, ticks, releases). A
//! [`Link`] decides the fate of every datagram an endpoint sends: deliver
//! it after a latency, drop it, change it, or anything more elaborate (the
//! simulator's links run fault injectors). The loop is event by event:
//! take the next event, hand a datagram to its endpoint or run an
//! endpoint's timers, then *settle* that endpoint (send everything it has
//! through the link, let the caller read its deliveries and events,
//! schedule its next wake-up).
//!
//! Determinism: events at the same instant run in the order they were
//! scheduled (a counter breaks ties), endpoints are kept in node order,
//! and nothing here draws randomness. A wake-up rescheduled leaves its
//! old entry in the queue; the entry is recognised as stale when it
//! comes up and does nothing.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::time::Duration;

use tether_proto::{Config, Endpoint, Instant, NodeId, RailId};

/// A datagram on its way: who sent it, to whom, over which rail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Datagram {
    pub src: NodeId,
    pub dst: NodeId,
    pub rail: RailId,
    pub bytes: Vec<u8>,
    /// A word the link carries beside the bytes, out of band (a fabric
    /// route's generation, `crate::routed`); 0 for other links.
    pub tag: u32,
}

/// Something scheduled on the timeline.
#[derive(Debug)]
pub enum NetEvent<U> {
    /// A datagram reaches its destination.
    Arrive(Datagram),
    /// An endpoint's `poll_timeout` as it was when it was scheduled.
    Wake { node: NodeId, at: Instant },
    /// The caller's own.
    User(U),
}

/// No events of the caller's own: the default for a plain network.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoEvent {}

struct Scheduled<E> {
    at: Instant,
    order: u64,
    ev: E,
}

impl<E> PartialEq for Scheduled<E> {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.order) == (o.at, o.order)
    }
}
impl<E> Eq for Scheduled<E> {}
impl<E> PartialOrd for Scheduled<E> {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl<E> Ord for Scheduled<E> {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.at, self.order).cmp(&(o.at, o.order))
    }
}

/// The virtual clock and the queue of everything scheduled, ordered by
/// (time, order of scheduling). Links and the caller's hooks schedule on it.
pub struct Timeline<U> {
    origin: Instant,
    now: Instant,
    order: u64,
    queue: BinaryHeap<Reverse<Scheduled<NetEvent<U>>>>,
}

impl<U> Timeline<U> {
    fn new(origin: Instant) -> Self {
        Timeline { origin, now: origin, order: 0, queue: BinaryHeap::new() }
    }

    pub fn now(&self) -> Instant {
        self.now
    }

    /// Virtual time since the network started.
    pub fn elapsed(&self) -> Duration {
        self.now - self.origin
    }

    /// When the network started.
    pub fn origin(&self) -> Instant {
        self.origin
    }

    /// Put `datagram` in flight, to arrive at `at`.
    pub fn send(&mut self, at: Instant, datagram: Datagram) {
        self.push(at, NetEvent::Arrive(datagram));
    }

    /// Schedule an event of the caller's own.
    pub fn schedule(&mut self, at: Instant, ev: U) {
        self.push(at, NetEvent::User(ev));
    }

    /// When the next scheduled thing happens.
    pub fn next_at(&self) -> Option<Instant> {
        self.queue.peek().map(|Reverse(s)| s.at)
    }

    fn push(&mut self, at: Instant, ev: NetEvent<U>) {
        self.order += 1;
        self.queue.push(Reverse(Scheduled { at, order: self.order, ev }));
    }

    /// The next event if it is due by `limit`, with the clock moved to it.
    fn pop(&mut self, limit: Instant) -> Option<NetEvent<U>> {
        if self.next_at()? > limit {
            return None;
        }
        let Reverse(s) = self.queue.pop()?;
        self.now = s.at;
        Some(s.ev)
    }
}

/// A datagram an endpoint just sent, as a link sees it.
pub struct Sent<'a> {
    pub now: Instant,
    pub src: NodeId,
    pub dst: NodeId,
    pub rail: RailId,
    /// How many datagrams `src` sent before this one (over every rail and
    /// every incarnation of the node).
    pub n: u64,
    /// The bytes; a link may change them in flight.
    pub bytes: &'a mut [u8],
}

/// What a simple link does with a datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// Arrives this long after it was sent, with the bytes as the link left them.
    Deliver(Duration),
    Drop,
}

/// The network between the endpoints: what becomes of each datagram sent,
/// and how one that arrives reaches its endpoint. Any
/// `FnMut(&mut Sent) -> Fate` is a link.
pub trait Link<U = NoEvent> {
    /// `sent` left its endpoint: put on `timeline` whatever arrives of it.
    fn transmit(&mut self, timeline: &mut Timeline<U>, sent: Sent<'_>);

    /// `datagram` reached the destination's interface; by default it goes
    /// straight to the endpoint, on the rail it came over.
    fn arrive(&mut self, timeline: &mut Timeline<U>, ep: &mut Endpoint, datagram: Datagram) {
        ep.handle_datagram_on(timeline.now(), datagram.rail, &datagram.bytes);
    }
}

impl<U, F: FnMut(&mut Sent<'_>) -> Fate> Link<U> for F {
    fn transmit(&mut self, timeline: &mut Timeline<U>, mut sent: Sent<'_>) {
        if let Fate::Deliver(latency) = self(&mut sent) {
            let datagram = Datagram {
                src: sent.src,
                dst: sent.dst,
                rail: sent.rail,
                bytes: sent.bytes.to_vec(),
                tag: 0,
            };
            timeline.send(sent.now + latency, datagram);
        }
    }
}

/// What one event did.
#[derive(Debug)]
pub enum Step<U> {
    /// This node took in a datagram or ran its timers: settle it next.
    Node(NodeId),
    /// Nothing: a stale wake-up, or a datagram for a node not in the network.
    Nothing,
    /// An event of the caller's own came up.
    User(U),
}

struct Slot {
    ep: Endpoint,
    /// The wake-up scheduled for it; any other is stale.
    wake_at: Option<Instant>,
    /// Datagrams it has sent, over all its incarnations.
    sent: u64,
}

/// Endpoints by node id on a virtual clock, joined by a [`Link`].
pub struct VirtualNet<L, U = NoEvent> {
    /// The link policy; its owner may change it between runs.
    pub link: L,
    timeline: Timeline<U>,
    nodes: BTreeMap<NodeId, Slot>,
    buf: Vec<u8>,
    /// Datagrams that arrived for a node not in the network.
    pub undeliverable: u64,
    /// Steps taken since the clock last moved: a livelock guard.
    stalled: (Instant, u64),
}

/// Steps at one instant of virtual time beyond which the run is a
/// livelock (a timer that fires without being handled, say: found once as
/// a hang, a restored peer's delayed-ACK timer with no session to send
/// on). No legitimate burst comes near it.
const LIVELOCK_STEPS: u64 = 1_000_000;

impl<L: Link<U>, U> VirtualNet<L, U> {
    /// An empty network whose clock starts at `origin` (not zero: the core
    /// takes no timestamp to be zero).
    pub fn new(origin: Instant, link: L) -> Self {
        VirtualNet {
            link,
            timeline: Timeline::new(origin),
            nodes: BTreeMap::new(),
            buf: vec![0; tether_wire::MAX_DATAGRAM],
            undeliverable: 0,
            stalled: (origin, 0),
        }
    }

    /// Add an endpoint under its node id, with its invariant checks on.
    /// Panics if the id is taken.
    pub fn add(&mut self, mut ep: Endpoint) {
        ep.set_invariant_checks(true);
        let slot = Slot { ep, wake_at: None, sent: 0 };
        assert!(self.nodes.insert(slot.ep.node(), slot).is_none(), "node added twice");
    }

    /// Put `ep` in place of the endpoint with its node id (a restart, or an
    /// engine rebuilt from a snapshot), invariant checks on; the old one's
    /// wake-up no longer counts. Returns the old endpoint.
    pub fn replace(&mut self, mut ep: Endpoint) -> Endpoint {
        ep.set_invariant_checks(true);
        let slot = self.nodes.get_mut(&ep.node()).expect("replacing a node not in the network");
        slot.wake_at = None;
        std::mem::replace(&mut slot.ep, ep)
    }

    pub fn ep(&self, id: NodeId) -> &Endpoint {
        &self.nodes.get(&id).expect("no such node").ep
    }

    pub fn ep_mut(&mut self, id: NodeId) -> &mut Endpoint {
        &mut self.nodes.get_mut(&id).expect("no such node").ep
    }

    /// The endpoints in node order.
    pub fn endpoints(&self) -> impl Iterator<Item = &Endpoint> + '_ {
        self.nodes.values().map(|s| &s.ep)
    }

    /// The link, the timeline and one endpoint at once (for events of the
    /// caller's own that touch all three).
    pub fn parts(&mut self, id: NodeId) -> (&mut L, &mut Timeline<U>, &mut Endpoint) {
        let slot = self.nodes.get_mut(&id).expect("no such node");
        (&mut self.link, &mut self.timeline, &mut slot.ep)
    }

    pub fn now(&self) -> Instant {
        self.timeline.now
    }

    pub fn timeline(&self) -> &Timeline<U> {
        &self.timeline
    }

    pub fn timeline_mut(&mut self) -> &mut Timeline<U> {
        &mut self.timeline
    }

    /// Take the next event due by `limit` (None: nothing is) and carry it
    /// out: hand an arriving datagram to the link's `arrive`, run the
    /// timers of an endpoint whose wake-up this is. The clock moves to the
    /// event's time even when it turns out to do nothing.
    pub fn step(&mut self, limit: Instant) -> Option<Step<U>> {
        let popped = self.timeline.pop(limit)?;
        let now = self.timeline.now;
        if self.stalled.0 == now {
            self.stalled.1 += 1;
            // A failed run with its seed, not a hang.
            assert!(
                self.stalled.1 < LIVELOCK_STEPS,
                "livelock: {LIVELOCK_STEPS} steps at {now:?} without time moving"
            );
        } else {
            self.stalled = (now, 0);
        }
        let step = match popped {
            NetEvent::Arrive(datagram) => match self.nodes.get_mut(&datagram.dst) {
                Some(slot) => {
                    let dst = datagram.dst;
                    self.link.arrive(&mut self.timeline, &mut slot.ep, datagram);
                    Step::Node(dst)
                }
                None => {
                    self.undeliverable += 1;
                    Step::Nothing
                }
            },
            NetEvent::Wake { node, at } => match self.nodes.get_mut(&node) {
                Some(slot) if slot.wake_at == Some(at) => {
                    slot.wake_at = None;
                    slot.ep.handle_timeout(self.timeline.now);
                    Step::Node(node)
                }
                _ => Step::Nothing,
            },
            NetEvent::User(ev) => Step::User(ev),
        };
        Some(step)
    }

    /// After node `id` did anything: send everything it has through the
    /// link, let `observe` read its deliveries and events (it may schedule
    /// events of its own), then schedule its next wake-up. Reading comes
    /// before the wake-up because making room in a full delivery queue
    /// can owe an ACK at once.
    pub fn settle(&mut self, id: NodeId, observe: impl FnOnce(&mut Timeline<U>, &mut Endpoint)) {
        let now = self.timeline.now;
        let slot = self.nodes.get_mut(&id).expect("no such node");
        while let Some(t) = slot.ep.poll_transmit(now, &mut self.buf) {
            let n = slot.sent;
            slot.sent += 1;
            let sent = Sent { now, src: id, dst: t.dst, rail: t.rail, n, bytes: &mut self.buf[..t.len] };
            self.link.transmit(&mut self.timeline, sent);
        }
        observe(&mut self.timeline, &mut slot.ep);
        if let Some(t) = slot.ep.poll_timeout() {
            let at = t.max(now);
            if slot.wake_at != Some(at) {
                slot.wake_at = Some(at);
                self.timeline.push(at, NetEvent::Wake { node: id, at });
            }
        }
    }
}

impl<L: Link<NoEvent>> VirtualNet<L, NoEvent> {
    /// Run for `span` of virtual time or until nothing is scheduled, event
    /// by event. Every endpoint is settled first, so whatever was done to
    /// them from outside since the last run (messages sent, datagrams
    /// handed in, an endpoint replaced) is picked up. The clock ends at
    /// the end of the span, or at the last event if the network went
    /// quiet before it.
    pub fn run(&mut self, span: Duration) {
        self.run_with(span, |_, _| {});
    }

    /// `run`, with `observe` reading each endpoint's deliveries and events
    /// every time it is settled.
    pub fn run_with(&mut self, span: Duration, mut observe: impl FnMut(NodeId, &mut Endpoint)) {
        let end = self.timeline.now + span;
        let ids: Vec<NodeId> = self.nodes.keys().copied().collect();
        for id in ids {
            self.settle(id, |_, ep| observe(id, ep));
        }
        while let Some(step) = self.step(end) {
            match step {
                Step::Node(id) => self.settle(id, |_, ep| observe(id, ep)),
                Step::Nothing => {}
                Step::User(never) => match never {},
            }
        }
        if self.timeline.next_at().is_some() {
            self.timeline.now = end;
        }
    }
}

/// An endpoint fit for a virtual network: every invariant checked after
/// every operation, and each of `peers` known over `rails` (sending to a
/// node it does not know is an error).
pub fn endpoint(
    config: Config,
    node: NodeId,
    incarnation: u64,
    peers: impl IntoIterator<Item = NodeId>,
    rails: &[RailId],
) -> Endpoint {
    let mut ep = Endpoint::new(config, node, incarnation).expect("valid endpoint config");
    ep.set_invariant_checks(true);
    for peer in peers {
        ep.set_paths(peer, rails).expect("a peer other than itself, at most MAX_RAILS rails");
    }
    ep
}

#[cfg(test)]
mod tests {
    use super::*;

    const LATENCY: Duration = Duration::from_micros(40);

    fn pair(link: impl FnMut(&mut Sent<'_>) -> Fate) -> VirtualNet<impl Link> {
        let mut net = VirtualNet::new(Instant::from_nanos(1_000_000), link);
        net.add(endpoint(Config::default(), 1, 1, [2], &[0]));
        net.add(endpoint(Config::default(), 2, 1, [1], &[0]));
        net
    }

    #[test]
    fn a_message_arrives_after_the_latency_and_the_net_goes_quiet() {
        let mut arrived = None;
        let mut net = pair(|_: &mut Sent<'_>| Fate::Deliver(LATENCY));
        let start = net.now();
        net.ep_mut(1).send(start, 2, b"hello").unwrap();
        net.run_with(Duration::from_secs(1), |id, ep| {
            if id == 2 && arrived.is_none() && ep.pending_deliveries() > 0 {
                arrived = Some(ep.recv().unwrap().message.to_vec());
            }
        });
        assert_eq!(arrived.as_deref(), Some(&b"hello"[..]));
        assert!(net.endpoints().all(|ep| ep.is_idle()));
        // Quiet long before the second was up: the clock stopped at the last event.
        assert!(net.now() < start + Duration::from_millis(500), "{:?}", net.now() - start);
        assert!(net.now() >= start + LATENCY * 2, "the ACK came back");
    }

    #[test]
    fn the_link_sees_every_datagram_numbered_and_can_drop_it() {
        let mut seen = Vec::new();
        let mut net = pair(|s: &mut Sent<'_>| {
            seen.push((s.src, s.n));
            // The first datagram from node 1 (its HELLO) is lost: the
            // protocol repairs it (node 2's own HELLO or node 1's retry).
            if (s.src, s.n) == (1, 0) {
                Fate::Drop
            } else {
                Fate::Deliver(LATENCY)
            }
        });
        let now = net.now();
        net.ep_mut(1).send(now, 2, b"again").unwrap();
        net.run(Duration::from_secs(1));
        assert_eq!(net.ep_mut(2).recv().unwrap().message.as_ref(), b"again");
        drop(net);
        // Each sender's datagrams are numbered 0, 1, 2, ... as the link saw them.
        for src in [1, 2] {
            let ns: Vec<u64> = seen.iter().filter(|(s, _)| *s == src).map(|(_, n)| *n).collect();
            assert!(ns.len() >= 2, "node {src} sent {ns:?}");
            assert!(ns.iter().enumerate().all(|(i, &n)| n == i as u64), "node {src}: {ns:?}");
        }
        assert_eq!(seen[0], (1, 0), "the first datagram is node 1's");
    }
}
