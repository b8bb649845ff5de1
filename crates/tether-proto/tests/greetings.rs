//! An endpoint greeting many peers at once (`greeting`): at most
//! `MAX_GREETINGS` handshakes under way, the rest waiting their turn, and
//! peers that never answer cannot keep the others waiting. Over the
//! simulator's virtual network, every invariant checked after every
//! operation (among them: the count of handshakes under way is exact, and
//! every peer waiting for a place is in the queue).

use std::time::Duration;

use tether_proto::{Config, Endpoint, Event, Instant, NodeId, MAX_GREETINGS};
use tether_sim::net::{self, Fate, Sent, VirtualNet};
use tether_wire::{Frame, HandshakeKind, Packet};

const GREETER: NodeId = 1;
const LATENCY: Duration = Duration::from_micros(200);

type Wire = Box<dyn FnMut(&mut Sent<'_>) -> Fate>;

/// A greeter that knows `peers`; of them, those in `alive` exist and know it.
fn net(peers: &[NodeId], alive: &[NodeId]) -> VirtualNet<Wire> {
    net_with(Config::default(), peers, alive)
}

/// As `net`, the greeter configured with `greeter`.
fn net_with(greeter: Config, peers: &[NodeId], alive: &[NodeId]) -> VirtualNet<Wire> {
    let clean = Box::new(|_: &mut Sent<'_>| Fate::Deliver(LATENCY)) as Wire;
    let mut net = VirtualNet::new(Instant::from_nanos(1_000_000), clean);
    net.add(net::endpoint(greeter, GREETER, 1, peers.iter().copied(), &[0]));
    for &p in alive {
        net.add(net::endpoint(Config::default(), p, 1, [GREETER], &[0]));
    }
    net
}

/// A HELLO from anyone but the greeter.
fn is_hello(s: &Sent<'_>) -> bool {
    s.src != GREETER
        && Packet::parse(s.bytes).is_ok_and(|p| {
            p.frames().any(|f| matches!(f, Frame::Handshake(h) if h.kind == HandshakeKind::Hello))
        })
}

fn msg(to: NodeId) -> Vec<u8> {
    (0..200).map(|j| (to as usize * 131 + j * 7) as u8).collect()
}

fn drain(ep: &mut Endpoint) -> Vec<Vec<u8>> {
    std::iter::from_fn(|| ep.recv()).map(|d| d.message.to_vec()).collect()
}

#[test]
fn a_job_start_greets_a_bounded_number_of_peers_at_once() {
    let peers: Vec<NodeId> = (2..102).collect();
    let mut net = net(&peers, &peers);
    let now = net.now();
    for &p in &peers {
        net.ep_mut(GREETER).send(now, p, &msg(p)).unwrap();
    }
    // Before any answer can arrive (a round trip is 400 us), the HELLOs
    // that went are the handshakes under way: one each (one rail).
    net.run(Duration::from_micros(100));
    let first = net.ep(GREETER).stats().hellos_sent;
    assert_eq!(first, MAX_GREETINGS as u64, "HELLOs in the first instant");
    // Every peer gets its message all the same, exactly once.
    net.run(Duration::from_millis(200));
    for &p in &peers {
        assert!(net.ep(GREETER).has_session(p), "session with {p}");
        assert_eq!(drain(net.ep_mut(p)), vec![msg(p)], "to {p}");
    }
    // And the waiting cost few HELLOs: none lost, so about one each.
    let hellos = net.ep(GREETER).stats().hellos_sent;
    assert!(hellos <= peers.len() as u64 + 10, "{hellos} HELLOs for {} peers", peers.len());
}

#[test]
fn peers_that_never_answer_do_not_hold_the_places_for_long() {
    // Enough dead peers to take every place first (node order), then live
    // ones behind them.
    let dead: Vec<NodeId> = (2..2 + MAX_GREETINGS as NodeId + 8).collect();
    let live: Vec<NodeId> = (1000..1010).collect();
    let peers: Vec<NodeId> = dead.iter().chain(&live).copied().collect();
    let mut net = net(&peers, &live);
    // The live peers' own HELLOs are lost: only the greeter's handshakes,
    // in their turn, can give it the sessions.
    net.link = Box::new(|s: &mut Sent<'_>| if is_hello(s) { Fate::Drop } else { Fate::Deliver(LATENCY) });
    let now = net.now();
    for &p in &peers {
        net.ep_mut(GREETER).send(now, p, &msg(p)).unwrap();
    }
    let start = net.now();
    while live.iter().any(|&p| !net.ep(GREETER).has_session(p)) && net.now() - start < Duration::from_secs(5)
    {
        net.run(Duration::from_millis(1));
    }
    let took = net.now() - start;
    for &p in &live {
        assert_eq!(drain(net.ep_mut(p)), vec![msg(p)], "to {p}");
    }
    // A dead peer's handshake gives its place up after GREETING_ROUNDS
    // rounds of HELLOs (waits of about 5, 10 and 20 ms from the 5 ms first
    // timeout, each spread by up to half), not when the peer is given up
    // (5 s): 69 ms here, the live peers' handshakes behind the dead ones'.
    eprintln!("the live peers had their sessions after {took:?}");
    assert!(took < Duration::from_millis(200), "the live peers waited {took:?} behind the dead ones");
}

#[test]
fn time_spent_waiting_for_a_place_does_not_count_toward_giving_a_peer_up() {
    // Three waves of dead peers take every place in turn (each handshake
    // gives its place up after its first rounds, about 69 ms), so the live
    // peers behind them wait longer than the greeter's patience before
    // their first HELLO. A 256-node demo lost a pair this way: the sender
    // gave up a peer it had never greeted, its two messages failed, and
    // the receiver waited for them in vain.
    let patience = Duration::from_millis(100);
    let config = Config {
        rto_max: Duration::from_millis(50),
        abandon_after: patience,
        path_suspect_after: Duration::from_millis(2),
        path_down_after: Duration::from_millis(5),
        ..Config::default()
    };
    let dead: Vec<NodeId> = (2..2 + 3 * MAX_GREETINGS as NodeId).collect();
    let live: Vec<NodeId> = (1000..1010).collect();
    let peers: Vec<NodeId> = dead.iter().chain(&live).copied().collect();
    let mut net = net_with(config, &peers, &live);
    // Only the greeter's handshakes, in their turn, can make the sessions.
    net.link = Box::new(|s: &mut Sent<'_>| if is_hello(s) { Fate::Drop } else { Fate::Deliver(LATENCY) });
    let now = net.now();
    for &p in &peers {
        net.ep_mut(GREETER).send(now, p, &msg(p)).unwrap();
    }
    net.run(Duration::from_secs(1));
    let mut given_up = Vec::new();
    while let Some(e) = net.ep_mut(GREETER).poll_event() {
        if let Event::PeerUnreachable { failed } = e {
            given_up.push(failed.peer);
        }
    }
    given_up.sort_unstable();
    assert_eq!(given_up, dead, "the peers given up are the dead ones, each once");
    for &p in &live {
        assert!(net.ep(GREETER).has_session(p), "session with {p}");
        assert_eq!(drain(net.ep_mut(p)), vec![msg(p)], "to {p}");
    }
    assert_eq!(net.ep(GREETER).stats().messages_failed, dead.len() as u64);
}
