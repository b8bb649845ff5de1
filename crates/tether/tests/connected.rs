//! Connected sockets (docs/ARCHITECTURE.md, "Connected sockets") under the
//! whole protocol, on real UDP sockets on loopback: every message once, in
//! order, with its bytes, through loss, duplication, reordering and
//! corruption at several seeds, on one rail and on two; and a node with
//! more peers than sockets still hears from every one of them.

// Tests measure wall-clock bounds on real sockets; only the pure crates ban the clock.
#![allow(clippy::disallowed_methods)]

use std::net::SocketAddr;
use std::time::Duration;

use tether::faults::FaultPlan;
use tether::{Endpoint, Options};

const WAIT: Option<Duration> = Some(Duration::from_secs(10));

fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

fn msg(i: u32, len: usize) -> Vec<u8> {
    (0..len).map(|j| (i as usize * 31 + j) as u8).collect()
}

fn options(connected: usize, seed: u64) -> Options {
    let rules = ["drop:p=0.03", "duplicate:p=0.02", "reorder:p=0.02", "modify:p=0.01"];
    let faults = FaultPlan::parse_rules(seed, &rules).expect("valid rules");
    Options { connected_peers: connected, faults, ..Options::default() }
}

fn addrs(e: &Endpoint) -> Vec<SocketAddr> {
    e.rail_addrs().into_iter().map(|a| a.expect("UDP has an address")).collect()
}

/// A stream of `count` messages from 1 to 2 over `rails` rails, each with
/// connected sockets: every one arrives once, in order, intact, and a
/// round trip each way goes back over the same sockets.
fn stream(rails: usize, seed: u64, count: u32) {
    let binds = vec![loopback(); rails];
    let rx = Endpoint::udp_rails(2, &binds, options(4, seed)).unwrap();
    let tx = Endpoint::udp_rails(1, &binds, options(4, seed + 1)).unwrap();
    rx.add_peer_rails(1, &addrs(&tx)).unwrap();
    tx.add_peer_rails(2, &addrs(&rx)).unwrap();
    let receiver = std::thread::spawn(move || {
        for i in 0..count {
            let d = rx.recv(WAIT).expect("every message arrives");
            assert_eq!(d.message.to_vec(), msg(i, 1 + (i as usize * 97) % 3000), "seed {seed}: message {i}");
        }
        rx.send(1, b"done").unwrap();
        rx.flush(WAIT).unwrap();
        assert!(rx.recv(Some(Duration::from_millis(200))).is_err(), "seed {seed}: nothing arrives twice");
        rx
    });
    for i in 0..count {
        tx.send_blocking(2, &msg(i, 1 + (i as usize * 97) % 3000), WAIT).unwrap();
    }
    tx.flush(WAIT).unwrap();
    assert_eq!(tx.recv(WAIT).unwrap().message.to_vec(), b"done");
    let _rx = receiver.join().expect("receiver checked every message");
    let stats = tx.stats();
    assert!(stats.retransmits > 0, "seed {seed}: the faults were felt ({stats:?})");
}

#[test]
fn a_stream_over_connected_sockets_survives_faults_at_many_seeds() {
    for seed in [1, 7, 42, 1234] {
        stream(1, seed, 2000);
    }
}

#[test]
fn two_rails_of_connected_sockets_survive_faults() {
    for seed in [3, 99] {
        stream(2, seed, 2000);
    }
}

/// One node, five peers, two sockets: the peers without one are sent to
/// from the listening socket, and every peer's messages and answers
/// arrive, in order, whichever socket carried them; the hub's port is
/// shared by exactly its listener and two connections.
#[test]
fn more_peers_than_sockets_all_get_through() {
    let hub = Endpoint::udp(100, loopback(), &[], options(2, 5)).unwrap();
    let hub_addr = hub.local_addr().unwrap();
    let spokes: Vec<Endpoint> = (1..=5)
        .map(|id| Endpoint::udp(id, loopback(), &[(100, hub_addr)], options(2, 10 + u64::from(id))).unwrap())
        .collect();
    for s in &spokes {
        hub.add_peer(s.node(), s.local_addr().unwrap()).unwrap();
    }
    let rounds = 200u32;
    std::thread::scope(|scope| {
        for s in &spokes {
            scope.spawn(move || {
                for i in 0..rounds {
                    s.send_blocking(100, &msg(i + s.node(), 64), WAIT).unwrap();
                    let back = s.recv(WAIT).expect("the hub answers");
                    assert_eq!(back.message.to_vec(), msg(i + s.node(), 64), "spoke {}", s.node());
                }
            });
        }
        let mut next = [0u32; 6];
        for _ in 0..rounds * 5 {
            let d = hub.recv(WAIT).expect("every spoke's message arrives");
            let from = d.from as usize;
            assert_eq!(d.message.to_vec(), msg(next[from] + from as u32, 64), "from {from}: in order");
            next[from] += 1;
            hub.send_blocking(d.from, &d.message, WAIT).unwrap();
        }
        assert_eq!(&next[1..], &[rounds; 5]);
    });
    // The hub's port is held by its listener and its two connections.
    assert_eq!(sockets_at(hub_addr.port()), 3, "the listener and two connected sockets");
}

/// UDP sockets of this host bound to local `port` (`/proc/net/udp`).
fn sockets_at(port: u16) -> usize {
    let table = std::fs::read_to_string("/proc/net/udp").expect("/proc/net/udp");
    let port = format!(":{port:04X}");
    table
        .lines()
        .skip(1)
        .filter(|l| l.split_whitespace().nth(1).is_some_and(|local| local.ends_with(&port)))
        .count()
}
