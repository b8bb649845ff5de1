//! The public endpoint over real UDP sockets on loopback: delivery and
//! handle states, failure reports, back-pressure from a slow reader, and
//! the polling mode.

// Tests measure wall-clock bounds on real sockets; only the pure crates ban the clock.
#![allow(clippy::disallowed_methods)]

use std::net::SocketAddr;
use std::time::Duration;

use tether::{
    ClusterKey, Config, Endpoint, Error, Event, FailReason, MessageState, Options, Progress, SendError,
};

const WAIT: Option<Duration> = Some(Duration::from_secs(10));

fn any() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

/// Two endpoints, 1 and 2, that know each other.
fn pair(a: Options, b: Options) -> (Endpoint, Endpoint) {
    let ea = Endpoint::udp(1, any(), &[], a).unwrap();
    let eb = Endpoint::udp(2, any(), &[(1, ea.local_addr().unwrap())], b).unwrap();
    ea.add_peer(2, eb.local_addr().unwrap()).unwrap();
    (ea, eb)
}

fn msg(i: u32, len: usize) -> Vec<u8> {
    (0..len).map(|j| (i as usize * 7 + j) as u8).collect()
}

#[test]
fn delivers_in_order_and_handles_say_delivered() {
    let (a, b) = pair(Options::default(), Options::default());
    let sizes = [0usize, 8, 1500, 70_000, 3];
    let handles: Vec<_> =
        sizes.iter().enumerate().map(|(i, &n)| a.send(2, &msg(i as u32, n)).unwrap()).collect();
    for (i, &n) in sizes.iter().enumerate() {
        let d = b.recv(WAIT).unwrap();
        assert_eq!((d.from, d.message.to_vec()), (1, msg(i as u32, n)));
    }
    for h in &handles {
        assert_eq!(h.wait(WAIT).unwrap(), MessageState::Delivered);
    }
    a.flush(WAIT).unwrap();
    assert_eq!(a.stats().messages_acked, sizes.len() as u64);
}

/// `send_bytes` hands the message over whole: the sender's log holds a
/// reference to the application's very buffer (no copy) until the
/// message is acknowledged, and lets it go then; what arrives is exact,
/// in order with messages sent by copy.
#[test]
fn send_bytes_keeps_the_callers_buffer_until_acknowledged() {
    let polling = Options { progress: Progress::Polling, ..Options::default() };
    let (a, b) = pair(polling.clone(), polling);
    let big = tether::Bytes::from(msg(1, 200_000));
    let h = a.send_bytes(2, big.clone()).unwrap();
    a.send(2, &msg(2, 100)).unwrap();
    assert!(!big.is_unique(), "the log holds the caller's buffer itself, not a copy of it");
    let mut got = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while got.len() < 2 || a.stats().messages_acked < 2 {
        assert!(std::time::Instant::now() < deadline, "delivery within 10 s");
        a.progress();
        if let Some(d) = b.try_recv() {
            got.push(d.message.to_vec());
        }
    }
    assert_eq!(got, vec![msg(1, 200_000), msg(2, 100)]);
    assert_eq!(h.state(), MessageState::Delivered);
    assert!(big.is_unique(), "acknowledged: the log let the buffer go");
}

#[test]
fn an_unreachable_peer_fails_exactly_the_unacknowledged_messages() {
    let config = Config { abandon_after: Duration::from_millis(300), ..Config::default() };
    let opts = Options { config, ..Options::default() };
    // Nobody listens at the peer's address: a socket bound and dropped.
    let gone = std::net::UdpSocket::bind(any()).unwrap().local_addr().unwrap();
    let a = Endpoint::udp(1, any(), &[(2, gone)], opts).unwrap();
    let h = a.send(2, b"into the void").unwrap();
    match a.next_event(WAIT).unwrap() {
        Event::PeerUnreachable { failed } => {
            assert_eq!((failed.peer, failed.first, failed.end), (2, 0, 1));
            // Nobody answered a HELLO, so no data went on the wire: it
            // certainly did not arrive.
            assert_eq!(failed.in_doubt_end, failed.first, "never transmitted, certainly not delivered");
            assert_eq!(a.stats().data_frames_sent, 0);
            assert!(a.stats().hellos_sent > 1, "the HELLO was retried");
        }
        other => panic!("expected PeerUnreachable, got {other:?}"),
    }
    assert_eq!(h.state(), MessageState::Failed(FailReason::PeerUnreachable));
}

#[test]
fn a_slow_reader_pushes_back_and_loses_nothing() {
    // A delivery queue of one largest message: most arrivals must wait.
    let config = Config { max_message_len: 8192, delivery_queue_bytes: 8192, ..Config::default() };
    let (a, b) = pair(
        Options { config: config.clone(), ..Options::default() },
        Options { config, ..Options::default() },
    );
    let n = 400u32;
    for i in 0..n {
        a.send_blocking(2, &msg(i, 4000), WAIT).unwrap();
    }
    for i in 0..n {
        if i % 50 == 0 {
            std::thread::sleep(Duration::from_millis(5)); // the application is busy
        }
        let d = b.recv(WAIT).unwrap();
        assert_eq!(d.message.to_vec(), msg(i, 4000), "message {i}");
    }
    a.flush(WAIT).unwrap();
    assert!(b.stats().out_of_window > 0, "the full queue refused data");
}

#[test]
fn polling_mode_works_without_a_progress_thread() {
    let polling = Options { progress: Progress::Polling, ..Options::default() };
    let (a, b) = pair(polling.clone(), polling);
    let h = a.send(2, b"polled").unwrap();
    // Nothing moves unless the application drives it: A's side of the
    // handshake (the WELCOME to take in, the CONFIRM and data to send)
    // happens only in A's calls.
    let start = std::time::Instant::now();
    let d = loop {
        a.progress();
        if let Ok(d) = b.recv(Some(Duration::from_millis(1))) {
            break d;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "never delivered");
    };
    assert_eq!(&d.message[..], b"polled");
    // The sender must be driven to learn of the acknowledgement.
    let start = std::time::Instant::now();
    while h.state() == MessageState::Pending {
        a.progress();
        b.progress();
        assert!(start.elapsed() < Duration::from_secs(10), "never acknowledged");
    }
    assert_eq!(h.state(), MessageState::Delivered);
}

#[test]
fn sending_to_an_unknown_node_fails_at_once() {
    let (a, _b) = pair(Options::default(), Options::default());
    let start = std::time::Instant::now();
    match a.send(9, b"nobody") {
        Err(Error::Send(SendError::UnknownPeer(9))) => {}
        other => panic!("expected UnknownPeer(9), got {other:?}"),
    }
    assert!(matches!(a.send_blocking(9, b"nobody", WAIT), Err(Error::Send(SendError::UnknownPeer(9)))));
    assert!(start.elapsed() < Duration::from_secs(1), "refused at once, not after a timeout");
    assert_eq!(a.stats().messages_sent, 0);
}

#[test]
fn the_builder_sets_up_rails_peers_and_options() {
    let b = Endpoint::builder(2).bind(any()).build().unwrap();
    let a = Endpoint::builder(1)
        .bind(any())
        .peer(2, b.local_addr().unwrap())
        .config(Config { abandon_after: Duration::from_secs(2), ..Config::default() })
        .build()
        .unwrap();
    b.add_peer(1, a.local_addr().unwrap()).unwrap();
    a.send(2, b"built").unwrap().wait(WAIT).unwrap();
    assert_eq!(&b.recv(WAIT).unwrap().message[..], b"built");
    // Refusals name the problem before anything is bound.
    let bad = Config { send_window: 0, ..Config::default() };
    let e = Endpoint::builder(1).bind(any()).config(bad).build().unwrap_err();
    assert!(e.to_string().contains("send_window"), "{e}");
    let e = Endpoint::builder(1).build().unwrap_err();
    assert!(matches!(e, Error::Rails { given: 0 }), "{e}");
    let e = Endpoint::builder(1).bind(any()).peer_rails(2, &[any(), any()]).build().unwrap_err();
    assert!(matches!(e, Error::PeerRails { given: 2, rails: 1 }), "{e}");
}

#[test]
fn close_lingers_until_everything_sent_is_acknowledged() {
    let (a, b) = pair(Options::default(), Options::default());
    let n = 2000u32;
    for i in 0..n {
        a.send_blocking(2, &msg(i, 1000), WAIT).unwrap();
    }
    // Closed at once after the last send: nothing accepted may be lost.
    a.close(Duration::from_secs(10)).unwrap();
    for i in 0..n {
        assert_eq!(b.recv(WAIT).unwrap().message.to_vec(), msg(i, 1000), "message {i}");
    }
}

#[test]
fn dropping_an_endpoint_does_not_lose_what_it_accepted() {
    let (a, b) = pair(Options::default(), Options::default());
    let n = 2000u32;
    for i in 0..n {
        a.send_blocking(2, &msg(i, 1000), WAIT).unwrap();
    }
    drop(a);
    for i in 0..n {
        assert_eq!(b.recv(WAIT).unwrap().message.to_vec(), msg(i, 1000), "message {i}");
    }
}

#[test]
fn close_reports_what_it_could_not_settle() {
    let gone = std::net::UdpSocket::bind(any()).unwrap().local_addr().unwrap();
    let a = Endpoint::udp(1, any(), &[(2, gone)], Options::default()).unwrap();
    for i in 0..3 {
        a.send(2, &msg(i, 10)).unwrap();
    }
    match a.close(Duration::from_millis(50)) {
        Err(Error::Lingered { unsettled: 3, envelopes: 0 }) => {}
        other => panic!("expected Lingered {{ unsettled: 3, envelopes: 0 }}, got {other:?}"),
    }
    // A call's envelope rides the same stream, and is said apart: one
    // message and one call to nobody are one message, not two.
    let a = Endpoint::udp(1, any(), &[(2, gone)], Options::default()).unwrap();
    a.send(2, &msg(0, 10)).unwrap();
    let _call = a.request(2, 3, b"args").unwrap();
    let closed = a.close(Duration::from_millis(50));
    assert!(matches!(closed, Err(Error::Lingered { unsettled: 1, envelopes: 1 })), "{closed:?}");
    let said = closed.unwrap_err().to_string();
    assert_eq!(said, "closed with 1 message neither acknowledged nor failed (and 1 call envelope)");
}

#[test]
fn close_and_linger_take_as_long_as_it_takes() {
    // Duration::MAX means no bound, not an overflow (it panicked, once).
    let ep = Endpoint::builder(1).bind(any()).build().unwrap();
    ep.close(Duration::MAX).unwrap();
    let ep = Endpoint::builder(1).bind(any()).linger(Duration::MAX).build().unwrap();
    drop(ep);
}

#[test]
fn close_does_not_wait_for_a_peer_that_keeps_sending() {
    // B streams to A all along: A owes ACKs the whole time, yet A's own
    // (zero) messages are settled, so closing A is prompt and succeeds.
    let (a, b) = pair(Options::default(), Options::default());
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sender = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut i = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let _ = b.send(1, &msg(i, 100));
                i += 1;
            }
        })
    };
    std::thread::sleep(Duration::from_millis(20));
    let start = std::time::Instant::now();
    a.close(Duration::from_secs(5)).unwrap();
    assert!(start.elapsed() < Duration::from_secs(1), "close waited {:?}", start.elapsed());
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    sender.join().unwrap();
}

/// A peer that restarts at another port proves itself there with the
/// cluster key and is followed: the driver answers its HELLO at the new
/// address and, once its CONFIRM checks, moves it in the address book.
/// Without a key it is refused (nothing says who sends from there).
#[test]
fn a_peer_that_moves_is_followed_only_with_the_cluster_key() {
    for keyed in [true, false] {
        let key = ClusterKey::from_material(b"a cluster secret for moving").unwrap();
        let config = Config {
            key: keyed.then_some(key),
            abandon_after: Duration::from_millis(500),
            ..Config::default()
        };
        let opts = || Options { config: config.clone(), ..Options::default() };
        let (a, b) = pair(opts(), opts());
        a.send(2, b"before").unwrap();
        assert_eq!(b.recv(WAIT).unwrap().message.to_vec(), b"before");
        a.flush(WAIT).unwrap();
        let old = b.local_addr().unwrap();
        drop(b);
        // B again, a new incarnation at another port; A still has the old one.
        let b = Endpoint::udp(2, any(), &[(1, a.local_addr().unwrap())], opts()).unwrap();
        assert_ne!(b.local_addr().unwrap(), old);
        let h = b.send(1, b"from the new port").unwrap();
        if keyed {
            let d = a.recv(WAIT).unwrap();
            assert_eq!((d.from, d.message.to_vec()), (2, b"from the new port".to_vec()));
            assert_eq!(h.wait(WAIT).unwrap(), MessageState::Delivered);
            a.send(2, b"to the new port").unwrap();
            assert_eq!(b.recv(WAIT).unwrap().message.to_vec(), b"to the new port");
            assert_eq!(a.stats().peers_moved, 1);
        } else {
            assert_eq!(h.wait(WAIT).unwrap(), MessageState::Failed(FailReason::PeerUnreachable));
            assert!(a.recv(Some(Duration::from_millis(10))).is_err(), "nothing from the new port taken");
            assert!(a.stats().unknown_source > 0);
            assert_eq!(a.stats().peers_moved, 0);
        }
    }
}

/// The unreliable class through the public API, over real UDP: a message
/// sent with `send_unreliable` wakes a `recv_unreliable` blocked for it,
/// intact, and is counted once on each side.
#[test]
fn unreliable_messages_over_udp_wake_a_blocked_receiver() {
    let a = Endpoint::udp(1, "127.0.0.1:0".parse().unwrap(), &[], Options::default()).unwrap();
    let b = Endpoint::udp(2, "127.0.0.1:0".parse().unwrap(), &[], Options::default()).unwrap();
    a.add_peer(2, b.local_addr().unwrap()).unwrap();
    b.add_peer(1, a.local_addr().unwrap()).unwrap();
    std::thread::scope(|s| {
        let waiting = s.spawn(|| b.recv_unreliable(Some(Duration::from_secs(5))));
        std::thread::sleep(Duration::from_millis(50));
        assert!(a.send_unreliable(2, b"heartbeat").unwrap());
        let u = waiting.join().unwrap().expect("woken with the message");
        assert_eq!((u.from, &u.message[..]), (1, &b"heartbeat"[..]));
    });
    assert_eq!(a.stats().unreliable_sent, 1);
    assert_eq!(b.stats().unreliable_received, 1);
    assert!(matches!(b.recv_unreliable(Some(Duration::from_millis(20))), Err(Error::TimedOut)));
}

/// The NACK-reliable class through the public API, over real UDP with the
/// fault injector dropping, duplicating and reordering both ways: every
/// message arrives once, in order, intact, and the sender's fates cover
/// each message once (nothing was lost for good with the default hold).
#[test]
fn nacked_messages_over_lossy_udp_arrive_in_order_and_each_has_a_fate() {
    let rules = ["drop:p=0.15", "duplicate:p=0.1", "reorder:p=0.1"];
    let options = |seed| Options {
        faults: tether::faults::FaultPlan::parse_rules(seed, &rules).unwrap(),
        ..Options::default()
    };
    let a = Endpoint::udp(1, "127.0.0.1:0".parse().unwrap(), &[], options(5)).unwrap();
    let b = Endpoint::udp(2, "127.0.0.1:0".parse().unwrap(), &[], options(6)).unwrap();
    a.add_peer(2, b.local_addr().unwrap()).unwrap();
    b.add_peer(1, a.local_addr().unwrap()).unwrap();
    let message = |i: u64| format!("request {i} ").repeat(1 + i as usize % 40).into_bytes();
    for i in 0..200 {
        assert_eq!(a.send_nacked(2, &message(i)).unwrap(), i);
        if i % 20 == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    for i in 0..200 {
        let m = b.recv_nacked(Some(Duration::from_secs(5))).expect("every message");
        assert_eq!((m.from, m.seq), (1, i), "in order, once");
        assert_eq!(m.message, message(i), "intact");
    }
    // Every message leaves the hold within `nacked_hold` (500 ms).
    let mut fates = vec![Vec::new(); 200];
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while fates.iter().any(Vec::is_empty) && std::time::Instant::now() < deadline {
        if let Ok(tether::Event::Nacked { peer: 2, first, end, fate }) =
            a.next_event(Some(Duration::from_millis(50)))
        {
            for seq in first..end {
                fates[seq as usize].push(fate);
            }
        }
    }
    for (seq, f) in fates.iter().enumerate() {
        assert!(
            f == &[tether::NackedFate::NeverAskedFor] || f == &[tether::NackedFate::Repaired],
            "message {seq}: {f:?}"
        );
    }
    assert!(a.stats().nacked_repaired > 0, "the drops were repaired");
    assert!(matches!(b.recv_nacked(Some(Duration::from_millis(20))), Err(Error::TimedOut)));
}
