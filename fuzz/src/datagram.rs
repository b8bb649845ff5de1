//! Fuzz whole datagrams into endpoints mid-session (docs/PROTOCOL.md): two
//! endpoints with a stream between them, with or without a cluster key
//! (each authentication algorithm in turn), take fuzz-made datagrams of
//! four kinds between the genuine ones:
//!
//! 0. the raw bytes;
//! 1. a genuine header (the session's node ids and incarnations) over a
//!    fuzz body, with a correct CRC32C, so the bytes reach the frame parser
//!    and the protocol, not just the checksum;
//! 2. a genuine datagram with fuzz-chosen bytes flipped, cut or appended;
//! 3. a genuine datagram replayed as it is.
//!
//! Either endpoint may be the target (DATA toward the receiver, ACKs toward
//! the sender). Whatever arrives: no panic, and every invariant holds
//! (checked after every operation). Where nothing forged can pass (with a
//! key, or without one when no kind-1 datagram was made, since the others
//! never carry a valid checksum), more: the receiver delivers exactly the
//! genuine messages, in order, once each, and the sender is never locked
//! out (a last message arrives). Without a key, a kind-1 datagram is
//! what a forger knowing the incarnations can send, and it may inject data:
//! only the first guarantees are asked of that run.

use core::time::Duration;
use tether_proto::{AuthKind, ClusterKey, Config, Endpoint, Instant};
use tether_wire::ChecksumKind;

const A: u32 = 1;
const B: u32 = 2;
const HEADER_LEN: usize = tether_wire::HEADER_LEN;

struct World {
    a: Endpoint,
    b: Endpoint,
    now: Instant,
    buf: Vec<u8>,
    /// Datagrams A sent (DATA) and B sent (ACKs), for the fuzz to start from.
    seen: Vec<(bool, Vec<u8>)>,
    /// What B's application received.
    got: Vec<Vec<u8>>,
}

impl World {
    /// Run both endpoints for `turns` rounds of 100 us.
    fn exchange(&mut self, turns: usize) {
        for _ in 0..turns {
            self.a.handle_timeout(self.now);
            while let Some(t) = self.a.poll_transmit(self.now, &mut self.buf) {
                let d = self.buf[..t.len].to_vec();
                self.b.handle_datagram(self.now, &d);
                if self.seen.len() < 64 {
                    self.seen.push((true, d));
                }
            }
            self.b.handle_timeout(self.now);
            while let Some(t) = self.b.poll_transmit(self.now, &mut self.buf) {
                let d = self.buf[..t.len].to_vec();
                self.a.handle_datagram(self.now, &d);
                if self.seen.len() < 64 {
                    self.seen.push((false, d));
                }
            }
            while let Some(d) = self.b.recv() {
                self.got.push(d.message.to_vec());
            }
            self.now = self.now + Duration::from_micros(100);
        }
    }
}

fn genuine(i: usize) -> Vec<u8> {
    let len = [0usize, 5, 300, 2000, 4000][i % 5];
    (0..len).map(|j| (i * 31 + j) as u8).collect()
}

/// A genuine header over `body`, with its length and a correct CRC32C.
pub(crate) fn reframed(template: &[u8], body: &[u8]) -> Vec<u8> {
    let mut d = template[..HEADER_LEN].to_vec();
    d[3] &= !tether_wire::HeaderFlags::AUTHENTICATED;
    d[4] = ChecksumKind::Crc32c as u8;
    d[6..8].copy_from_slice(&(body.len() as u16).to_le_bytes());
    let sum = ChecksumKind::Crc32c.compute(&[body, &d[..HEADER_LEN]]) as u32;
    d.extend_from_slice(body);
    d.extend_from_slice(&sum.to_le_bytes());
    d
}

/// One fuzz input.
pub fn run(input: &[u8]) {
    let Some((&mode, mut data)) = input.split_first() else { return };
    let keyed = mode & 1 == 1;
    let auth = AuthKind::ALL[(mode as usize >> 1) % AuthKind::ALL.len()];
    let key = ClusterKey::from_material(b"fuzzing cluster secret").unwrap().with_auth(auth);
    let config = Config { key: keyed.then_some(key), ..Config::default() };
    let mut w = World {
        a: Endpoint::new(config.clone(), A, 10).unwrap(),
        b: Endpoint::new(config, B, 20).unwrap(),
        now: Instant::from_nanos(1_000_000),
        buf: vec![0u8; 2048],
        seen: Vec::new(),
        got: Vec::new(),
    };
    w.a.set_invariant_checks(true);
    w.b.set_invariant_checks(true);
    w.a.add_peer(B).unwrap();
    w.b.add_peer(A).unwrap();
    let mut sent = 0;
    for _ in 0..3 {
        w.a.send(w.now, B, &genuine(sent)).unwrap();
        sent += 1;
    }
    w.exchange(30);
    let mut forged_checksum = false;
    // Each datagram: a kind byte, a target byte, a length byte, then bytes.
    while data.len() >= 3 && !w.seen.is_empty() {
        let (kind, target, len) = (data[0] % 4, data[1], data[2] as usize);
        let n = len.min(data.len() - 3);
        let bytes = &data[3..3 + n];
        data = &data[3 + n..];
        let (to_b, template) = w.seen[target as usize % w.seen.len()].clone();
        let datagram = match kind {
            0 => bytes.to_vec(),
            1 => {
                forged_checksum = true;
                reframed(&template, bytes)
            }
            2 => {
                let mut d = template;
                for pair in bytes.chunks(2) {
                    match pair {
                        [at, x] if *at == 255 => d.extend_from_slice(&[*x; 7]),
                        [at, _] if *at == 254 => d.truncate(d.len() / 2),
                        [at, x] => {
                            let i = *at as usize % d.len().max(1);
                            if let Some(b) = d.get_mut(i) {
                                *b ^= x | 1;
                            }
                        }
                        _ => {}
                    }
                }
                d
            }
            _ => template,
        };
        if to_b {
            w.b.handle_datagram(w.now, &datagram);
        } else {
            w.a.handle_datagram(w.now, &datagram);
        }
        if target & 0x80 != 0 && sent < 40 {
            w.a.send(w.now, B, &genuine(sent)).unwrap();
            sent += 1;
        }
        w.exchange(usize::from(target & 3));
    }
    let exact = keyed || !forged_checksum;
    // The sender is never locked out: a last message gets through.
    w.a.send(w.now, B, b"the last one").unwrap();
    for _ in 0..100 {
        w.exchange(20);
        if w.got.last().is_some_and(|m| m == b"the last one") {
            break;
        }
        w.now = w.now + Duration::from_millis(50);
    }
    if exact {
        let mut want: Vec<Vec<u8>> = (0..sent).map(genuine).collect();
        want.push(b"the last one".to_vec());
        assert!(
            w.got == want,
            "delivered {} messages, not the {} genuine ones in order",
            w.got.len(),
            want.len()
        );
    }
}
