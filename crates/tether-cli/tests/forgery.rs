//! An attacker on the path, without the cluster key, against two `tether
//! stream` processes over real UDP (docs/PROTOCOL.md, "Incarnations,
//! epochs, ACK request"). The test is the path: a relay between the
//! sender and the listener forwards every datagram, reads the live
//! incarnations and the sender's stream epoch from the headers, and
//! injects one forged datagram from the genuine address (the relay's
//! socket is where each side knows the other): DATA toward the listener
//! under an epoch near and far ahead of the sender's, or an ACK toward the
//! sender naming such an epoch. Without a key the attacker may get forged
//! data delivered (the documented threat model); here its frame lies
//! beyond the stream's next sequence number, so it never is. What must
//! hold: the genuine stream is neither locked out nor loses a message,
//! every one of 15,000 4 KiB messages arrives verified, both processes
//! finish, and the forgery is seen where it struck.

// Tests measure wall-clock bounds on real sockets; only the pure crates ban the clock.
#![allow(clippy::disallowed_methods)]

use std::net::{SocketAddr, UdpSocket};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tether_wire::{AckRepr, DataFlags, Header, PacketWriter, Unverified};

const COUNT: u64 = 15_000;

/// Which datagram the attacker forges, and the epoch it names relative to
/// the sender's.
#[derive(Debug, Clone, Copy)]
enum Forgery {
    /// DATA toward the listener.
    Data(u32),
    /// A plain ACK toward the sender.
    Ack(u32),
}

fn free_port() -> SocketAddr {
    UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

/// The relay: `toward_listener` faces the listener (which knows the
/// sender there), `toward_sender` faces the sender (which knows the
/// listener there). After `after` genuine datagrams in the forgery's
/// direction it sends the forgery once, right behind the genuine one.
struct Relay {
    stop: Arc<AtomicBool>,
    forged: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Relay {
    fn start(listener: SocketAddr, sender: SocketAddr, forgery: Forgery) -> (Relay, SocketAddr, SocketAddr) {
        let toward_listener = UdpSocket::bind("127.0.0.1:0").unwrap();
        let toward_sender = UdpSocket::bind("127.0.0.1:0").unwrap();
        let (sender_seen_at, listener_seen_at) =
            (toward_listener.local_addr().unwrap(), toward_sender.local_addr().unwrap());
        for s in [&toward_listener, &toward_sender] {
            s.set_nonblocking(true).unwrap();
        }
        let stop = Arc::new(AtomicBool::new(false));
        let forged = Arc::new(AtomicU64::new(0));
        let (done, count) = (stop.clone(), forged.clone());
        let thread = std::thread::spawn(move || {
            let mut buf = vec![0u8; 65_536];
            let mut out = vec![0u8; 256];
            let mut sender_epoch = None;
            let mut seen = [0u64; 2];
            while !done.load(Ordering::Relaxed) {
                let mut idle = true;
                // From the sender toward the listener, then back.
                for (dir, from, to, addr) in [
                    (0, &toward_sender, &toward_listener, listener),
                    (1, &toward_listener, &toward_sender, sender),
                ] {
                    while let Ok((n, _)) = from.recv_from(&mut buf) {
                        idle = false;
                        let _ = to.send_to(&buf[..n], addr);
                        let Ok(h) = Unverified::parse(&buf[..n]).map(|u| u.header) else { continue };
                        if dir == 0 {
                            sender_epoch = Some(h.epoch);
                        }
                        seen[dir] += 1;
                        let Some(epoch) = sender_epoch else { continue };
                        if count.load(Ordering::Relaxed) > 0 || seen[dir] < 40 {
                            continue;
                        }
                        let len = match (forgery, dir) {
                            (Forgery::Data(ahead), 0) => {
                                let h = Header { epoch: epoch.wrapping_add(ahead), ..h };
                                let mut w = PacketWriter::new(&mut out, &h).unwrap();
                                w.push_data(3, DataFlags::new(true, true), 0, b"forged").unwrap();
                                w.finish()
                            }
                            (Forgery::Ack(ahead), 1) => {
                                let mut w = PacketWriter::new(&mut out, &h).unwrap();
                                w.push_ack(&AckRepr::new(epoch.wrapping_add(ahead), 0)).unwrap();
                                w.finish()
                            }
                            _ => continue,
                        };
                        let _ = to.send_to(&out[..len], addr);
                        count.fetch_add(1, Ordering::Relaxed);
                    }
                }
                if idle {
                    std::thread::sleep(Duration::from_micros(20));
                }
            }
        });
        (Relay { stop, forged, thread: Some(thread) }, sender_seen_at, listener_seen_at)
    }

    fn finish(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().unwrap().join().unwrap();
        self.forged.load(Ordering::Relaxed)
    }
}

fn json(who: &str, out: &Output) -> serde_json::Value {
    assert!(out.status.success(), "{who} failed: {}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
    v["runs"][0].clone()
}

fn stream_through(forgery: Forgery) {
    let (listen, bind) = (free_port(), free_port());
    let (relay, sender_seen_at, listener_seen_at) = Relay::start(listen, bind, forgery);
    let common =
        ["stream", "--size", "4096", "--count", "15000", "--runs", "1", "--json", "--give-up-after", "5s"];
    let tether = || Command::new(env!("CARGO_BIN_EXE_tether"));
    let listener = tether()
        .args(common)
        .args(["--listen", &listen.to_string(), "--peer", &sender_seen_at.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the listener");
    std::thread::sleep(Duration::from_millis(200));
    let start = Instant::now();
    let sender = tether()
        .args(common)
        .args(["--connect", &listener_seen_at.to_string(), "--bind", &bind.to_string()])
        .output()
        .expect("the sender runs");
    let listener = listener.wait_with_output().expect("the listener exits");
    let took = start.elapsed();
    let forged = relay.finish();
    let what = format!("{forgery:?}");
    let (s, r) = (json("sender", &sender), json("listener", &listener));
    eprintln!("{what}: {forged} forged, {took:?}\n  sender: {s}\n  listener: {r}");
    assert_eq!(forged, 1, "{what}: the forgery was sent");
    assert_eq!(r["delivered"].as_u64(), Some(COUNT), "{what}: every message delivered");
    assert_eq!(r["corrupted"].as_u64(), Some(0), "{what}: nothing forged delivered");
    assert_eq!(r["out_of_order"].as_u64(), Some(0), "{what}");
    assert_eq!(s["delivered"].as_u64(), Some(COUNT), "{what}: every message acknowledged");
    // Where it struck: the listener took the forged epoch (two ahead) and
    // dropped the genuine one's data as stale until the sender carried
    // its messages past it, or dropped the forged frame itself as beyond
    // reach (2^31 - 1 and 2^31 ahead); or the sender set the forged ACK
    // aside.
    let stale = |side: &serde_json::Value, drops: &str| side[drops]["stale_dropped"].as_u64().unwrap_or(0);
    match forgery {
        Forgery::Data(_) => assert!(stale(&r, "receiver_drops") >= 1, "{what}: {r}"),
        Forgery::Ack(_) => assert!(stale(&s, "sender_drops") >= 1, "{what}: {s}"),
    }
}

#[test]
fn forged_data_near_ahead() {
    stream_through(Forgery::Data(2));
}

#[test]
fn forged_data_far_ahead() {
    stream_through(Forgery::Data((1 << 31) - 1));
}

#[test]
fn forged_data_half_the_space_away() {
    stream_through(Forgery::Data(1 << 31));
}

#[test]
fn forged_ack_near_ahead() {
    stream_through(Forgery::Ack(2));
}

#[test]
fn forged_ack_far_ahead() {
    stream_through(Forgery::Ack((1 << 31) - 1));
}
