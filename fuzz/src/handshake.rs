//! Fuzz the handshake as a peer's endpoint meets it (docs/PROTOCOL.md,
//! "Handshake"): arbitrary HELLO, WELCOME and CONFIRM messages, with any
//! header fields, correct checksums (so they reach the protocol, not just
//! the parser) and optionally a DATA frame behind them, are thrown at an
//! endpoint mid-session, with and without a cluster key (with one, the
//! forger signs with a key of its own guessing, or not at all).
//!
//! What is asked is what the threat model promises (docs/ARCHITECTURE.md,
//! "Only the peers you configured, only proven incarnations";
//! docs/PROTOCOL.md, "Handshake" and "Authentication"). For every input:
//! no panic, every invariant holds (checked after every operation), and
//! the genuine peer is never locked out: the messages it sends afterwards
//! all arrive, once each and in order, but for any whose sequence number
//! a delivered forged message took (the genuine one is then a duplicate;
//! the peer sends one more than forged messages could take, so at least
//! one arrives). No forged message is delivered where the model says none
//! can be: with a cluster key, and without one from a datagram whose
//! header does not name the live session (the genuine peer's node id and
//! both live incarnations), which is all an off-path attacker can send,
//! guessing. Without a key, a datagram that does name it is what an
//! on-path attacker who reads the incarnations off the wire sends, and it
//! may inject data: the documented limit. Each forged DATA payload names
//! its datagram, so a delivery is held against the datagram that carried
//! it.

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

/// A forged DATA payload: this, then the index of its datagram (u32,
/// little-endian).
const FORGED: &[u8] = b"forged ";
/// A genuine message sent after the forgeries: this, then its index.
const GENUINE: &[u8] = b"genuine ";

/// One forged datagram.
struct Forged {
    src_node: u32,
    src_inc: u64,
    dst_inc: u64,
    /// Whether it carried DATA where forging is the documented limit (no
    /// key, and the live session's node id and incarnations).
    may_inject: bool,
    delivered: bool,
}

/// What the endpoint delivered: forged messages, and the indices of the
/// genuine ones.
#[derive(Default)]
struct Got {
    forged: usize,
    genuine: Vec<u32>,
}

impl Got {
    /// Take one delivered message: genuine, or forged where forging is what
    /// the threat model leaves open, and at most once.
    fn take(&mut self, message: &[u8], keyed: bool, forged: &mut [Forged]) {
        let index = |rest: &[u8]| u32::from_le_bytes(rest.try_into().expect("a message's index"));
        if let Some(rest) = message.strip_prefix(GENUINE) {
            self.genuine.push(index(rest));
            return;
        }
        let i = index(message.strip_prefix(FORGED).expect("a genuine or forged message")) as usize;
        let f = &mut forged[i];
        assert!(
            f.may_inject,
            "a forged message was delivered: from forged datagram {i} (src_node {}, src_inc {}, dst_inc {}; \
             the live session is {A}, 10, 20), {}",
            f.src_node,
            f.src_inc,
            f.dst_inc,
            if keyed { "with a cluster key" } else { "without a key" }
        );
        assert!(!f.delivered, "forged datagram {i}'s message was delivered twice");
        f.delivered = true;
        self.forged += 1;
    }
}

fn take<const N: usize>(data: &mut &[u8]) -> [u8; N] {
    let mut out = [0u8; N];
    let n = data.len().min(N);
    out[..n].copy_from_slice(&data[..n]);
    *data = &data[n..];
    out
}

/// One fuzz input.
pub fn run(input: &[u8]) {
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
    let mut got = Got::default();
    while let Some(d) = b.recv() {
        got.take(&d.message, keyed, &mut []);
    }
    let mut forged: Vec<Forged> = Vec::new();
    // Forged messages, each of 40 bytes of fuzz (the last one's at least 8,
    // padded with zeros).
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
        let payload = [FORGED, &(forged.len() as u32).to_le_bytes()].concat();
        let carries_data =
            f[1] & 32 != 0 && w.push_data(u64::from(f[3]), DataFlags::new(true, true), 0, &payload).is_ok();
        let live = header.src_node == A && header.src_inc == 10 && header.dst_inc == 20;
        forged.push(Forged {
            src_node: header.src_node,
            src_inc: header.src_inc,
            dst_inc: header.dst_inc,
            may_inject: carries_data && !keyed && live,
            delivered: false,
        });
        let n = w.finish();
        b.handle_datagram(now, &buf[..n]);
        now = now + core::time::Duration::from_micros(u64::from(f[2]) * 10);
        while let Some(d) = b.recv() {
            got.take(&d.message, keyed, &mut forged);
        }
    }
    // The genuine peer is never locked out: it sends one message more than
    // forged ones could take the place of (a forged message delivered took
    // a sequence number, whose genuine message is then a duplicate), and
    // each arrives, in order, or a forged one took its place.
    let sent = 1 + forged.iter().filter(|f| f.may_inject).count() as u32;
    for i in 0..sent {
        a.send(now, B, &[GENUINE, &i.to_le_bytes()].concat()).unwrap();
    }
    for _ in 0..100 {
        exchange(&mut a, &mut b, &mut now, &mut buf);
        while let Some(d) = b.recv() {
            got.take(&d.message, keyed, &mut forged);
        }
        assert!(
            got.genuine.windows(2).all(|w| w[0] < w[1]),
            "genuine messages out of order: {:?}",
            got.genuine
        );
        if got.genuine.len() + got.forged >= sent as usize {
            return;
        }
        now = now + core::time::Duration::from_millis(50);
    }
    panic!(
        "the genuine peer was locked out: of the {sent} messages it sent, {} arrived ({:?}), {} forged ones were \
         delivered",
        got.genuine.len(),
        got.genuine,
        got.forged
    );
}
