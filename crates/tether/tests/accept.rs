//! A server that accepts (docs/PROTOCOL.md, "Accepting peers"), over UDP
//! on loopback: a keyed listener takes in a node it was never given once
//! its handshake proves the cluster key, and the two exchange both ways;
//! an unkeyed listener refuses such a node unless accepting was enabled;
//! the bound on how many holds; and taking in without a key never moves a
//! peer the application gave.

#![allow(clippy::disallowed_methods)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tether::{ClusterKey, Config, Endpoint, Event, MessageState, NodeId};

const WAIT: Option<Duration> = Some(Duration::from_secs(10));

fn any() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

fn key() -> ClusterKey {
    ClusterKey::from_material(b"the accept test's cluster secret").unwrap()
}

fn keyed() -> Config {
    Config { key: Some(key()), ..Config::default() }
}

fn msg(i: u32) -> Vec<u8> {
    let len = [1usize, 9, 700, 3000, 20_000][i as usize % 5];
    (0..len).map(|j| (i as usize * 7 + j) as u8).collect()
}

/// The first `PeerAccepted` among `ep`'s events within `within`.
fn accepted(ep: &Endpoint, within: Duration) -> Option<(NodeId, Option<SocketAddr>)> {
    let end = Instant::now() + within;
    while let Some(left) = end.checked_duration_since(Instant::now()) {
        match ep.next_event(Some(left)) {
            Ok(Event::PeerAccepted { peer, addr, .. }) => return Some((peer, addr)),
            Ok(_) => continue,
            Err(_) => return None,
        }
    }
    None
}

/// `n` messages from `from` to `to` arrive exact and in order.
fn exchange(from: &Endpoint, to: &Endpoint, n: u32) {
    let handles: Vec<_> = (0..n).map(|i| from.send(to.node(), &msg(i)).unwrap()).collect();
    for i in 0..n {
        let d = to.recv(WAIT).unwrap_or_else(|e| panic!("message {i} of {n} to {}: {e}", to.node()));
        assert_eq!(d.from, from.node());
        assert_eq!(&d.message[..], &msg(i)[..], "message {i}");
    }
    for h in handles {
        assert_eq!(h.wait(WAIT).unwrap(), MessageState::Delivered);
    }
}

#[test]
fn a_keyed_listener_takes_in_a_peer_it_was_never_given() {
    let server = Endpoint::builder(1).bind(any()).config(keyed()).build().unwrap();
    let client = Endpoint::builder(7)
        .bind(any())
        .peer(1, server.local_addr().unwrap())
        .config(keyed())
        .build()
        .unwrap();
    assert!(server.send(7, b"not yet").is_err(), "a node not taken in is no peer");
    exchange(&client, &server, 50);
    let (peer, addr) = accepted(&server, Duration::from_secs(1)).expect("the server says who joined");
    assert_eq!((peer, addr), (7, client.local_addr()));
    // The server answers at the address the handshake proved.
    exchange(&server, &client, 50);
    assert_eq!(server.stats().peers_accepted, 1);
    assert_eq!(server.stats().strangers_refused, 0);
}

/// Over a network that drops, duplicates, corrupts, reorders and delays
/// (both ways, the handshake included), at several seeds: every client is
/// taken in once and every message arrives exact, in order, once.
#[test]
fn taking_in_survives_a_faulty_network() {
    use tether::faults::FaultPlan;
    let rules = ["drop:p=0.1", "duplicate:p=0.1", "modify:p=0.05", "reorder:p=0.1", "delay:p=0.1,fixed=2ms"];
    for seed in 1..=4u64 {
        let faulty = |s: u64| FaultPlan::parse_rules(s, &rules).unwrap();
        let server = Endpoint::builder(1).bind(any()).config(keyed()).faults(faulty(seed)).build().unwrap();
        let clients: Vec<_> = (10..13)
            .map(|n| {
                Endpoint::builder(n)
                    .bind(any())
                    .peer(1, server.local_addr().unwrap())
                    .config(keyed())
                    .faults(faulty(seed * 100 + n as u64))
                    .build()
                    .unwrap()
            })
            .collect();
        for c in &clients {
            exchange(c, &server, 30);
            exchange(&server, c, 30);
        }
        assert_eq!(server.stats().peers_accepted, 3, "seed {seed}");
        let mut joined = Vec::new();
        while let Some((peer, _)) = accepted(&server, Duration::from_millis(50)) {
            joined.push(peer);
        }
        joined.sort_unstable();
        assert_eq!(joined, [10, 11, 12], "seed {seed}: one event per client");
    }
}

#[test]
fn an_unkeyed_listener_refuses_a_stranger_unless_accepting_was_enabled() {
    let closed = Endpoint::builder(1).bind(any()).build().unwrap();
    let client = Endpoint::builder(7).bind(any()).peer(1, closed.local_addr().unwrap()).build().unwrap();
    let h = client.send(1, b"let me in").unwrap();
    assert!(closed.recv(Some(Duration::from_millis(500))).is_err(), "nothing delivered from a stranger");
    assert_eq!(h.state(), MessageState::Pending, "nor acknowledged");
    assert!(closed.stats().unknown_source > 0, "its datagrams were counted as refused");
    assert_eq!(closed.stats().peers_accepted, 0);
    client.close(Duration::ZERO).ok();

    let open = Endpoint::builder(1).bind(any()).accept_unkeyed(4).build().unwrap();
    let client = Endpoint::builder(7).bind(any()).peer(1, open.local_addr().unwrap()).build().unwrap();
    exchange(&client, &open, 20);
    assert_eq!(accepted(&open, Duration::from_secs(1)).map(|a| a.0), Some(7));
    exchange(&open, &client, 20);
}

#[test]
fn no_more_are_taken_in_than_the_bound() {
    let server = Endpoint::builder(1).bind(any()).config(keyed()).accept(1).build().unwrap();
    let first = Endpoint::builder(7)
        .bind(any())
        .peer(1, server.local_addr().unwrap())
        .config(keyed())
        .build()
        .unwrap();
    exchange(&first, &server, 5);
    let second = Endpoint::builder(8)
        .bind(any())
        .peer(1, server.local_addr().unwrap())
        .config(keyed())
        .build()
        .unwrap();
    let h = second.send(1, b"one too many").unwrap();
    // Only the first's message is ever delivered.
    assert!(server.recv(Some(Duration::from_millis(500))).is_err(), "the second got past the bound");
    assert_eq!(h.state(), MessageState::Pending);
    assert!(server.stats().strangers_refused > 0);
    assert_eq!(server.stats().peers_accepted, 1);
    // The first is still served.
    exchange(&first, &server, 5);
}

#[test]
fn accepting_without_a_key_never_moves_a_peer_that_was_given() {
    let server = Endpoint::builder(1).bind(any()).accept_unkeyed(8).build().unwrap();
    let genuine = Endpoint::builder(2).bind(any()).peer(1, server.local_addr().unwrap()).build().unwrap();
    server.add_peer(2, genuine.local_addr().unwrap()).unwrap();
    exchange(&genuine, &server, 10);
    // Another process claims node 2 from an address of its own.
    let impostor = Endpoint::builder(2).bind(any()).peer(1, server.local_addr().unwrap()).build().unwrap();
    let h = impostor.send(1, b"I am node 2 now").unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(h.state(), MessageState::Pending, "the impostor's message was taken");
    assert!(server.stats().unknown_source > 0);
    assert_eq!(server.stats().peers_moved, 0);
    // The genuine node 2 is still reached where it was given.
    exchange(&server, &genuine, 10);
    exchange(&genuine, &server, 10);
}

/// A client with two rails is taken in over the rail its handshake
/// completed on (the others are not proven: docs/PROTOCOL.md, "Accepting
/// peers"), and both ways work.
#[test]
fn a_client_with_two_rails_is_taken_in() {
    let server = Endpoint::builder(1).bind(any()).bind(any()).config(keyed()).build().unwrap();
    let addrs: Vec<SocketAddr> = server.rail_addrs().into_iter().map(Option::unwrap).collect();
    let client =
        Endpoint::builder(7).bind(any()).bind(any()).peer_rails(1, &addrs).config(keyed()).build().unwrap();
    exchange(&client, &server, 20);
    exchange(&server, &client, 20);
    let rails: Vec<_> = server.paths(7).iter().map(|p| p.rail).collect();
    assert_eq!(rails.len(), 1, "{rails:?}");
    assert_eq!(server.stats().peers_accepted, 1);
}
