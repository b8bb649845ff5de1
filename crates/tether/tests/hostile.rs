//! Hostile traffic against real endpoints over UDP on loopback
//! (docs/PROTOCOL.md, "Handshake" and "Authentication"): a blind attacker
//! at an address of its own forging identities, incarnations, strangers'
//! node ids and a flood of HELLOs; and, with a cluster key, an attacker on
//! the path that sees every datagram and replays, alters and forges them
//! from the genuine peers' own addresses. Every genuine stream arrives
//! exact, nothing forged is delivered or acknowledged, and the genuine peer
//! is never locked out (a restart of it gets through too).

// Tests measure wall-clock bounds on real sockets; only the pure crates ban the clock.
#![allow(clippy::disallowed_methods)]

use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use tether::{ChecksumKind, ClusterKey, Config, Endpoint, MessageState, Options};
use tether_wire::{
    AckRepr, DataFlags, HandshakeFrame, HandshakeKind, Header, HeaderFlags, PacketWriter, Unverified,
};

const WAIT: Option<Duration> = Some(Duration::from_secs(10));
const A: u32 = 1;
const B: u32 = 2;

fn any() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

fn msg(i: u32) -> Vec<u8> {
    let len = [0usize, 9, 700, 3000, 20_000][i as usize % 5];
    (0..len).map(|j| (i as usize * 13 + j) as u8).collect()
}

fn header(src: u32, dst: u32, src_inc: u64, dst_inc: u64) -> Header {
    Header {
        flags: HeaderFlags::default(),
        checksum: ChecksumKind::Crc32c,
        src_node: src,
        dst_node: dst,
        src_inc,
        dst_inc,
        epoch: 0,
        probe: 0,
    }
}

/// A DATA datagram with a correct CRC32C (or sealed under `key`).
fn forged_data(h: Header, seq: u64, key: Option<(&ClusterKey, u64)>) -> Vec<u8> {
    let mut buf = vec![0u8; 2048];
    let mut w = match key {
        Some((k, pn)) => {
            let mk = k.datagram_key(h.src_node, h.src_inc, h.dst_node, h.dst_inc);
            PacketWriter::new_authenticated(&mut buf, &h, &mk, pn).unwrap()
        }
        None => PacketWriter::new(&mut buf, &h).unwrap(),
    };
    w.push_data(seq, DataFlags::new(true, true), 0, b"forged").unwrap();
    let n = w.finish();
    buf.truncate(n);
    buf
}

fn forged_hello(h: Header, nonce: u64) -> Vec<u8> {
    let mut buf = vec![0u8; 256];
    let mut w = PacketWriter::new(&mut buf, &h).unwrap();
    w.push_handshake(&HandshakeFrame { kind: HandshakeKind::Hello, max_datagram: 1472, nonce, cookie: 0 })
        .unwrap();
    let n = w.finish();
    buf.truncate(n);
    buf
}

/// Send `n` messages from `a` to `b` and check they arrive exactly, in
/// order, and are acknowledged: nothing else reached `b`'s application.
fn stream_exact(a: &Endpoint, b: &Endpoint, n: u32) {
    let handles: Vec<_> = (0..n).map(|i| a.send_blocking(B, &msg(i), WAIT).unwrap()).collect();
    for i in 0..n {
        let d = b.recv(WAIT).unwrap_or_else(|e| panic!("message {i} of {n}: {e}"));
        assert_eq!((d.from, d.message.len()), (A, msg(i).len()), "message {i}");
        assert!(d.message.to_vec() == msg(i), "message {i}: bytes differ");
    }
    for h in &handles {
        assert_eq!(h.wait(WAIT).unwrap(), MessageState::Delivered);
    }
    assert!(b.recv(Some(Duration::from_millis(50))).is_err(), "nothing beyond the genuine stream");
}

/// The blind attacks, from an address of the attacker's own, with
/// no key: the sender's node id with a higher incarnation and `dst_inc` 0,
/// a stranger's node id, and ten thousand HELLOs. The listener refuses all
/// of it by source address, the genuine stream is exact, and a restarted
/// sender (a new incarnation, the same address) gets through.
#[test]
fn a_blind_attacker_changes_nothing_and_locks_nobody_out() {
    let b = Endpoint::udp(B, any(), &[], Options::default()).unwrap();
    let b_addr = b.local_addr().unwrap();
    let a = Endpoint::udp(A, any(), &[(B, b_addr)], Options::default()).unwrap();
    let a_addr = a.local_addr().unwrap();
    b.add_peer(A, a_addr).unwrap();
    let attacker = UdpSocket::bind(any()).unwrap();
    let attack = |round: u64| {
        let forged = [
            forged_data(header(A, B, u64::MAX / 2 + round, 0), 0, None),
            forged_data(header(99, B, 7, 0), 0, None),
        ];
        for d in &forged {
            attacker.send_to(d, b_addr).unwrap();
        }
        for i in 0..1000 {
            attacker
                .send_to(&forged_hello(header(A, B, 1 << 40 | round << 16 | i, 0), i + 1), b_addr)
                .unwrap();
        }
    };
    for round in 0..10 {
        attack(round);
        stream_exact(&a, &b, 20);
    }
    let s = b.stats();
    assert!(s.unknown_source >= 10 * 1002 * 9 / 10, "refused by address: {}", s.unknown_source);
    assert_eq!(s.stale_dropped + s.strangers_refused, 0, "nothing from the attacker got past its address");
    // The genuine sender's (one, or two if a retry crossed the answer).
    assert!(s.hellos_answered <= 2, "no attacker HELLO answered: {}", s.hellos_answered);
    // The sender restarts at the same address: a new incarnation, not
    // locked out by anything the attacker sent.
    drop(a);
    let a = Endpoint::udp(A, a_addr, &[(B, b_addr)], Options::default()).unwrap();
    stream_exact(&a, &b, 20);
    assert_eq!(b.stats().peers_moved, 0);
}

/// A relay between A and B that sees every datagram and may send its own
/// from either genuine address (an attacker on the path). B knows A at
/// `to_b`'s address and A knows B at `to_a`'s.
struct OnPath {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<u64>>,
}

impl OnPath {
    /// `meddle(seen, toward_b)` returns the datagrams to send besides the
    /// genuine one (which is always forwarded).
    fn start(
        a_addr: SocketAddr,
        b_addr: SocketAddr,
        mut meddle: impl FnMut(&[u8], bool) -> Vec<Vec<u8>> + Send + 'static,
    ) -> (Self, SocketAddr, SocketAddr) {
        // `as_a` faces B (B knows A there); `as_b` faces A.
        let as_a = UdpSocket::bind(any()).unwrap();
        let as_b = UdpSocket::bind(any()).unwrap();
        let (a_seen_at, b_seen_at) = (as_a.local_addr().unwrap(), as_b.local_addr().unwrap());
        for s in [&as_a, &as_b] {
            s.set_nonblocking(true).unwrap();
        }
        let stop = Arc::new(AtomicBool::new(false));
        let done = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut buf = vec![0u8; 65_536];
            let mut meddled = 0u64;
            while !done.load(Ordering::Relaxed) {
                let mut idle = true;
                // From A (to `as_b`) toward B, and from B (to `as_a`) toward A.
                for (from, out, to, toward_b) in [(&as_b, &as_a, b_addr, true), (&as_a, &as_b, a_addr, false)]
                {
                    while let Ok((n, _)) = from.recv_from(&mut buf) {
                        idle = false;
                        let _ = out.send_to(&buf[..n], to);
                        for extra in meddle(&buf[..n], toward_b) {
                            meddled += 1;
                            let _ = out.send_to(&extra, to);
                        }
                    }
                }
                if idle {
                    std::thread::sleep(Duration::from_micros(50));
                }
            }
            meddled
        });
        (OnPath { stop, thread: Some(thread) }, a_seen_at, b_seen_at)
    }

    fn finish(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().unwrap().join().unwrap()
    }
}

/// With a cluster key, the attacker on the path replays every third
/// datagram, flips a bit in a copy of every fifth, and forges DATA toward B
/// and ACKs toward A with the genuine incarnations read from the headers,
/// under a key of its own, from the genuine addresses. With every
/// algorithm: the stream is exact, everything acknowledged was delivered,
/// and the forgeries are counted where they were refused.
#[test]
fn an_on_path_attacker_without_the_key_changes_nothing() {
    for auth in tether::AuthKind::ALL {
        let key = ClusterKey::from_material(b"the genuine cluster secret").unwrap().with_auth(auth);
        let wrong = ClusterKey::from_material(b"the attacker's guess at it").unwrap().with_auth(auth);
        let opts = || Options {
            config: Config { key: Some(key.clone()), ..Config::default() },
            ..Options::default()
        };
        let a = Endpoint::udp(A, any(), &[], opts()).unwrap();
        let b = Endpoint::udp(B, any(), &[], opts()).unwrap();
        let mut seen = 0u64;
        let mut last: Option<Vec<u8>> = None;
        let (relay, a_seen_at, b_seen_at) =
            OnPath::start(a.local_addr().unwrap(), b.local_addr().unwrap(), move |d, toward_b| {
                seen += 1;
                let mut extra = Vec::new();
                if let Some(prev) = last.replace(d.to_vec()).filter(|_| seen.is_multiple_of(3)) {
                    extra.push(prev);
                }
                if seen.is_multiple_of(5) {
                    let mut flipped = d.to_vec();
                    let at = (seen as usize * 7) % flipped.len();
                    flipped[at] ^= 0x10;
                    extra.push(flipped);
                }
                if let Ok(u) = Unverified::parse(d) {
                    let h = u.header;
                    if toward_b {
                        extra.push(forged_data(h, seen % 50, Some((&wrong, 1 << 40 | seen))));
                    } else {
                        let mut buf = vec![0u8; 256];
                        let mk = wrong.datagram_key(h.src_node, h.src_inc, h.dst_node, h.dst_inc);
                        let mut w =
                            PacketWriter::new_authenticated(&mut buf, &h, &mk, 1 << 40 | seen).unwrap();
                        let mut ack = AckRepr::new(1 << 20, 1_000);
                        ack.full = false;
                        w.push_ack(&ack).unwrap();
                        let n = w.finish();
                        extra.push(buf[..n].to_vec());
                    }
                }
                extra
            });
        a.add_peer(B, b_seen_at).unwrap();
        b.add_peer(A, a_seen_at).unwrap();
        stream_exact(&a, &b, 200);
        let meddled = relay.finish();
        let (sa, sb) = (a.stats(), b.stats());
        assert_eq!(
            (sa.messages_acked, sa.messages_failed),
            (200, 0),
            "{auth:?}: acknowledged what was delivered"
        );
        assert!(meddled > 100, "{auth:?}: the attacker sent {meddled}");
        assert!(sa.mac_failures > 0 && sb.mac_failures > 0, "{auth:?}: forgeries refused by their tag");
        assert!(sa.replays + sb.replays > 0, "{auth:?}: replays refused");
        assert_eq!(sa.protocol_violations + sb.protocol_violations, 0, "{auth:?}: no forged frame acted on");
    }
}
