//! What one 8-byte round trip costs the core alone: two endpoints in one
//! thread, no sockets, no threads, no clock but the wall clock for the total.
//! `cargo run --release -p tether-proto --example roundtrip_cost`

// Measuring needs the wall clock, which the pure crates otherwise never read.
#![allow(clippy::disallowed_methods)]

use std::time::Instant as Wall;
use tether_proto::{Config, Endpoint, Instant};
fn main() {
    let mut a = Endpoint::new(Config::default(), 1, 1).unwrap();
    let mut b = Endpoint::new(Config::default(), 2, 1).unwrap();
    a.add_peer(2).unwrap();
    b.add_peer(1).unwrap();
    let mut buf = vec![0u8; 2048];
    let n = 1_000_000u64;
    let t = Wall::now();
    let mut now = Instant::from_nanos(1_000_000_000);
    for _ in 0..n {
        now = now + std::time::Duration::from_nanos(500);
        a.send(now, 2, &[7u8; 8]).unwrap();
        let tx = a.poll_transmit(now, &mut buf).unwrap();
        b.handle_datagram(now, &buf[..tx.len]);
        while b.poll_transmit(now, &mut buf).is_some() {}
        let d = b.recv().unwrap();
        b.send(now, 1, &d.message).unwrap();
        let tx = b.poll_transmit(now, &mut buf).unwrap();
        a.handle_datagram(now, &buf[..tx.len]);
        while a.poll_transmit(now, &mut buf).is_some() {}
        let _ = a.poll_timeout();
        let _ = b.poll_timeout();
        a.recv().unwrap();
    }
    println!("{:.0} ns per round trip (core only)", t.elapsed().as_nanos() as f64 / n as f64);
}
