//! The public endpoint over two rails of real UDP sockets on loopback (no
//! namespaces needed): one rail dies mid-stream, by a per-rail fault plan
//! that drops everything on it from a given time, and the stream must go on
//! over the other with every message delivered once, in order; the path
//! table and the events must say what happened. The progress threads, not
//! the test, drive the path timers.

// Tests measure wall-clock bounds on real sockets; only the pure crates ban the clock.
#![allow(clippy::disallowed_methods)]

use std::net::SocketAddr;
use std::time::Duration;

use tether::faults::FaultPlan;
use tether::{Endpoint, Event, Options, PathState};

const WAIT: Option<Duration> = Some(Duration::from_secs(10));

fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

fn addrs(e: &Endpoint) -> Vec<SocketAddr> {
    e.rail_addrs().into_iter().map(|a| a.expect("UDP has an address")).collect()
}

fn msg(i: u32, len: usize) -> Vec<u8> {
    (0..len).map(|j| (i as usize * 13 + j) as u8).collect()
}

#[test]
fn a_rail_that_dies_mid_stream_is_failed_over_with_nothing_lost() {
    // Rail 0 of the sender drops everything, both ways, from 150 ms on.
    let dead = FaultPlan::parse_rules(1, &["drop:p=1,from=150ms,side=send", "drop:p=1,from=150ms,side=recv"])
        .expect("valid rules");
    let tx_options = Options { rail_faults: vec![(0, dead)], ..Options::default() };
    let rx = Endpoint::udp_rails(2, &[loopback(), loopback()], Options::default()).unwrap();
    let tx = Endpoint::udp_rails(1, &[loopback(), loopback()], tx_options).unwrap();
    rx.add_peer_rails(1, &addrs(&tx)).unwrap();
    tx.add_peer_rails(2, &addrs(&rx)).unwrap();

    let count = 3000u32;
    let receiver = std::thread::spawn(move || {
        for i in 0..count {
            let d = rx.recv(WAIT).expect("every message arrives");
            assert_eq!(d.message.to_vec(), msg(i, 2000), "message {i}: wrong bytes or out of order");
        }
        assert!(rx.recv(Some(Duration::from_millis(200))).is_err(), "nothing arrives twice");
        rx
    });
    for i in 0..count {
        tx.send_blocking(2, &msg(i, 2000), WAIT).unwrap();
        if i % 100 == 0 {
            // Spread the stream over the rail's death.
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    tx.flush(WAIT).unwrap();
    let _rx = receiver.join().expect("receiver checked every message");

    let paths = tx.paths(2);
    assert_eq!(paths.len(), 2);
    assert_eq!(paths[0].state, PathState::Down, "rail 0 is dead: {paths:?}");
    assert_eq!(paths[1].state, PathState::Active, "{paths:?}");
    assert!(paths[1].stats.data_frames_sent > 0, "data moved to rail 1: {paths:?}");
    let events: Vec<Event> = std::iter::from_fn(|| tx.poll_event()).collect();
    let down = events.iter().any(|e| matches!(e, Event::PathChanged { rail: 0, to: PathState::Down, .. }));
    assert!(down, "rail 0 reported down: {events:?}");
    assert!(tx.stats().failovers > 0);
}
