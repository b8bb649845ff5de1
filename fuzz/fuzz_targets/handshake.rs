//! Fuzz the handshake as a peer's endpoint meets it (docs/PROTOCOL.md,
//! "Handshake"): arbitrary HELLO, WELCOME and CONFIRM messages, with any
//! header fields, correct checksums (so they reach the protocol, not just
//! the parser) and optionally a DATA frame behind them, are thrown at an
//! endpoint mid-session, with and without a cluster key. Whatever they
//! say: no panic, every invariant holds (checked after every operation),
//! nothing forged is delivered, and the genuine peer is never locked out:
//! a message it sends afterwards arrives.

#![no_main]

use libfuzzer_sys::fuzz_target;
use tether_proto::{ClusterKey, Config, Endpoint, Instant};
use tether_wire::{DataFlags, HandshakeFrame, HandshakeKind, Header, HeaderFlags, PacketWriter};

const A: u32 = 1;
const B: u32 = 2;

/// Run the pair until both are idle or a bounded number of turns passed.
fn exchange(a: &mut Endpoint, b: &mut Endpoint, now: &mut Instant, buf: &mut [u8]) {
    for _ in 0..200 {
        a.handle_timeout(*now);
        while let Some(t) = a.poll_transmit(*now, buf) {
            b.handle_datagram(*now, &buf[..t.len]);
        }
        b.handle_timeout(*now);
        while let Some(t) = b.poll_transmit(*now, buf) {
            a.handle_datagram(*now, &buf[..t.len]);
        }
        *now = *now + core::time::Duration::from_micros(100);
    }
}

fn take<const N: usize>(data: &mut &[u8]) -> [u8; N] {
    let mut out = [0u8; N];
    let n = data.len().min(N);
    out[..n].copy_from_slice(&data[..n]);
    *data = &data[n..];
    out
}

fuzz_target!(|input: &[u8]| {
    let mut data = input;
    let keyed = take::<1>(&mut data)[0] & 1 == 1;
    let key = ClusterKey::from_material(b"fuzzing cluster secret").unwrap();
    let config = Config { key: keyed.then(|| key.clone()), ..Config::default() };
    let mut a = Endpoint::new(config.clone(), A, 10).unwrap();
    let mut b = Endpoint::new(config, B, 20).unwrap();
    a.set_invariant_checks(true);
    b.set_invariant_checks(true);
    a.add_peer(B).unwrap();
    b.add_peer(A).unwrap();
    let mut now = Instant::from_nanos(1_000_000);
    let mut buf = vec![0u8; 2048];
    exchange(&mut a, &mut b, &mut now, &mut buf);
    let mut got = Vec::new();
    while let Some(d) = b.recv() {
        got.push(d.message.to_vec());
    }
    // Up to 16 forged messages, each 40 bytes of fuzz.
    while data.len() >= 8 {
        let f = take::<40>(&mut data);
        let kind = match f[0] % 3 {
            0 => HandshakeKind::Hello,
            1 => HandshakeKind::Welcome,
            _ => HandshakeKind::Confirm,
        };
        let word = |i: usize| u64::from_le_bytes(f[i..i + 8].try_into().unwrap());
        let header = Header {
            flags: HeaderFlags::new(f[1] & 1 == 1),
            checksum: tether_wire::ChecksumKind::Crc32c,
            src_node: if f[1] & 2 == 0 { A } else { u32::from(f[2]) },
            dst_node: B,
            // Near the genuine incarnations as often as not.
            src_inc: if f[1] & 4 == 0 { 10 + u64::from(f[3] % 3) } else { word(8) },
            dst_inc: if f[1] & 8 == 0 { 20 } else { word(16) },
            epoch: 1,
            probe: 0,
        };
        let frame = HandshakeFrame {
            kind,
            max_datagram: u32::from_le_bytes(f[4..8].try_into().unwrap()),
            nonce: word(24),
            cookie: word(32),
        };
        let mut w = if keyed && f[1] & 16 == 0 {
            // The attacker's own guess at a key for these identities.
            let guess = ClusterKey::from_material(&f[..16]).unwrap();
            let k = guess.datagram_key(header.src_node, header.src_inc, header.dst_node, header.dst_inc);
            PacketWriter::new_authenticated(&mut buf, &header, &k, word(16)).unwrap()
        } else {
            PacketWriter::new(&mut buf, &header).unwrap()
        };
        w.push_handshake(&frame).unwrap();
        if f[1] & 32 != 0 {
            let _ = w.push_data(u64::from(f[3]), DataFlags::new(true, true), 0, b"forged");
        }
        let n = w.finish();
        b.handle_datagram(now, &buf[..n]);
        now = now + core::time::Duration::from_micros(u64::from(f[2]) * 10);
        while let Some(d) = b.recv() {
            assert_ne!(&d.message[..], b"forged", "a forged message was delivered");
            got.push(d.message.to_vec());
        }
    }
    // The genuine peer is never locked out.
    a.send(now, B, b"genuine").unwrap();
    for _ in 0..100 {
        exchange(&mut a, &mut b, &mut now, &mut buf);
        while let Some(d) = b.recv() {
            assert_ne!(&d.message[..], b"forged", "a forged message was delivered");
            got.push(d.message.to_vec());
        }
        if got.iter().any(|m| m == b"genuine") {
            return;
        }
        now = now + core::time::Duration::from_millis(50);
    }
    panic!("the genuine peer was locked out");
});
