//! What one 8-byte round trip costs the core alone: two endpoints in one
//! thread, back to back, no sockets, no threads; protocol time advances by
//! 500 ns a round trip, and the wall clock measures only the total.
//! `cargo run --release -p tether-proto --example roundtrip_cost`

// Measuring needs the wall clock, which the pure crates otherwise never read.
#![allow(clippy::disallowed_methods)]

use std::time::{Duration, Instant as Wall};
use tether_proto::{Config, Endpoint, Instant};

fn main() {
    let mut a = Endpoint::new(Config::default(), 1, 1).unwrap();
    let mut b = Endpoint::new(Config::default(), 2, 1).unwrap();
    a.add_peer(2).unwrap();
    b.add_peer(1).unwrap();
    let mut buf = vec![0u8; 2048];
    let mut now = Instant::from_nanos(1_000_000_000);
    // The handshake, and the first message acknowledged: from then on a
    // round trip is one datagram each way, the ACK riding on the answer.
    a.send(now, 2, b"hello").unwrap();
    while a.unsettled() > 0 {
        now = now + Duration::from_micros(10);
        a.handle_timeout(now);
        while let Some(t) = a.poll_transmit(now, &mut buf) {
            b.handle_datagram(now, &buf[..t.len]);
        }
        b.handle_timeout(now);
        while let Some(t) = b.poll_transmit(now, &mut buf) {
            a.handle_datagram(now, &buf[..t.len]);
        }
        while b.recv().is_some() {}
    }
    let n = 1_000_000u64;
    let mut datagrams = 0u64;
    let t = Wall::now();
    for _ in 0..n {
        now = now + Duration::from_nanos(500);
        a.send(now, 2, &[7u8; 8]).unwrap();
        while let Some(tx) = a.poll_transmit(now, &mut buf) {
            datagrams += 1;
            b.handle_datagram(now, &buf[..tx.len]);
        }
        let d = b.recv().expect("the ping arrived");
        b.send(now, 1, &d.message).unwrap();
        while let Some(tx) = b.poll_transmit(now, &mut buf) {
            datagrams += 1;
            a.handle_datagram(now, &buf[..tx.len]);
        }
        a.recv().expect("the pong arrived");
        for e in [&mut a, &mut b] {
            if e.poll_timeout().is_some_and(|d| d <= now) {
                e.handle_timeout(now);
            }
        }
    }
    let per = t.elapsed().as_nanos() as f64 / n as f64;
    assert_eq!(a.unsettled(), 0, "every ping acknowledged");
    println!("{per:.0} ns per round trip (core only), {:.2} datagrams each", datagrams as f64 / n as f64);
}
