//! Two endpoints joined by a scripted pipe with virtual time (quinn-proto's
//! `Pair`): the smallest harness that exercises the core end to end. It
//! is tether-sim's `VirtualNet` with two nodes and a link that applies the
//! test's keep rule to every datagram; the simulator drives the same net
//! at scale with random faults.

use std::net::SocketAddr;
use std::time::Duration;

use tether_proto::{
    AuthKind, Channel, ClusterKey, Config, Endpoint, Event, FailReason, Instant, MessageId, MessageState,
    NackedFate, Origin, RetransmitMode, SendError,
};
use tether_sim::net::{self, Fate, Sent, VirtualNet};
use tether_wire::{
    AckRepr, ChecksumKind, ChecksumSet, DataFlags, HandshakeFrame, HandshakeKind, Header, HeaderFlags,
    PacketWriter,
};

const A: u32 = 1;
const B: u32 = 2;
/// A channel besides the application's (tether's calls ride on it).
const LATENCY: Duration = Duration::from_micros(50);

/// The wire: decides the fate of every datagram.
type Wire = Box<dyn FnMut(&mut Sent<'_>) -> Fate>;

struct Pair {
    net: VirtualNet<Wire>,
}

/// An endpoint that knows its one peer, with every invariant checked.
fn endpoint(config: Config, node: u32, incarnation: u64, peer: u32) -> Endpoint {
    net::endpoint(config, node, incarnation, [peer], &[0])
}

impl Pair {
    fn new(config: Config) -> Self {
        let mut net = VirtualNet::new(
            Instant::from_nanos(1_000_000),
            Box::new(|_: &mut Sent<'_>| Fate::Deliver(LATENCY)) as Wire,
        );
        net.add(endpoint(config.clone(), A, 1, B));
        net.add(endpoint(config, B, 1, A));
        Pair { net }
    }

    /// A pair whose handshake is done: both sessions stand, no data sent.
    fn connected(config: Config) -> Self {
        let mut p = Pair::new(config);
        let now = p.now();
        p.a().connect(now, B).unwrap();
        p.run(Duration::from_millis(1));
        assert!(p.a().has_session(B) && p.b().has_session(A), "the handshake completes on a clean link");
        p
    }

    /// From now on, `keep(n, bytes)` decides the fate of a sender's n-th
    /// datagram: false drops it; it may also change the bytes in flight.
    fn keep(&mut self, mut keep: impl FnMut(u64, &mut [u8]) -> bool + 'static) {
        self.net.link =
            Box::new(move |s| if keep(s.n, s.bytes) { Fate::Deliver(LATENCY) } else { Fate::Drop });
    }

    fn now(&self) -> Instant {
        self.net.now()
    }

    fn a(&mut self) -> &mut Endpoint {
        self.net.ep_mut(A)
    }

    fn b(&mut self) -> &mut Endpoint {
        self.net.ep_mut(B)
    }

    /// A sends `msg` to B now.
    fn send(&mut self, msg: &[u8]) -> Result<MessageId, SendError> {
        let now = self.now();
        self.a().send(now, B, msg)
    }

    /// Advance virtual time event by event until `until` or quiescence.
    fn run(&mut self, until: Duration) {
        self.net.run(until);
    }

    fn drain_b(&mut self) -> Vec<Vec<u8>> {
        std::iter::from_fn(|| self.b().recv()).map(|d| d.message.to_vec()).collect()
    }
}

/// Compare delivered to expected, reporting the first difference briefly.
fn check(got: &[Vec<u8>], want: &[Vec<u8>], what: &str) {
    let first_bad = got.iter().zip(want).position(|(g, w)| g != w);
    assert!(
        first_bad.is_none() && got.len() == want.len(),
        "{what}: delivered {} of {}, first difference at {first_bad:?}",
        got.len(),
        want.len()
    );
}

fn msg(i: usize, len: usize) -> Vec<u8> {
    (0..len).map(|j| (i * 31 + j * 7) as u8).collect()
}

#[test]
fn delivers_in_order_exactly_once() {
    let mut p = Pair::new(Config::default());
    let sizes = [0, 1, 8, 1000, 1472, 5000, 70_000, 3];
    for (i, &len) in sizes.iter().enumerate() {
        p.send(&msg(i, len)).unwrap();
    }
    p.run(Duration::from_secs(1));
    let got = p.drain_b();
    let want: Vec<_> = sizes.iter().enumerate().map(|(i, &l)| msg(i, l)).collect();
    check(&got, &want, "clean");
    for seq in 0..sizes.len() as u64 {
        assert_eq!(p.a().message_state(MessageId { peer: B, seq }), MessageState::Delivered);
    }
    assert_eq!(p.a().stats().retransmits, 0);
    assert!(p.a().is_idle() && p.b().is_idle());
}

/// The layer channel's messages (`send_on`: tether's calls) share the
/// stream with the application's, in order with them, whole or in
/// fragments, under loss, and each arrives on the channel it was sent on.
#[test]
fn calls_and_messages_share_a_stream_each_marked() {
    let mut p = Pair::new(Config::default());
    // Every fifth datagram lost: fragments of both kinds are repaired.
    p.keep(|n, _| n % 5 != 3);
    let sizes = [0, 8, 3000, 70_000, 1, 5000];
    let mut want = Vec::new();
    for (i, &len) in sizes.iter().enumerate() {
        for call in [false, true] {
            let m = msg(i * 2 + call as usize, len);
            let now = p.now();
            if call {
                p.a().send_on(now, B, Channel::LAYER, bytes::Bytes::from(m.clone())).unwrap();
            } else {
                p.a().send(now, B, &m).unwrap();
            }
            want.push((m, call));
        }
    }
    p.run(Duration::from_secs(2));
    let got: Vec<_> = std::iter::from_fn(|| p.b().recv())
        .map(|d| (d.message.to_vec(), d.channel == Channel::LAYER))
        .collect();
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(
            g == w,
            "delivery {i}: {} bytes, call {} (want {} bytes, call {})",
            g.0.len(),
            g.1,
            w.0.len(),
            w.1
        );
    }
    assert!(p.a().stats().retransmits > 0, "losses were repaired");
}

/// A message whose fragments disagree on their channel is a protocol
/// violation: dropped whole, never delivered on either, and the
/// stream goes on. (The fragments come as A would send them: without a
/// cluster key anyone can, and the checksum cannot tell.)
#[test]
fn fragments_that_disagree_on_their_kind_are_dropped() {
    let mut p = Pair::connected(Config::default());
    let now = p.now();
    let fragment = |seq: u64, flags: DataFlags, total: u32, payload: &[u8]| {
        let mut buf = vec![0u8; 2048];
        let mut w = PacketWriter::new(&mut buf, &header(A, B, 1, 1)).unwrap();
        w.push_data(seq, flags, total, payload).unwrap();
        let n = w.finish();
        buf.truncate(n);
        buf
    };
    let call = |first, last| DataFlags::new(first, last).with_channel(Channel::LAYER);
    // A call's first fragment, a middle one that says "message", its last.
    p.b().handle_datagram(now, &fragment(0, call(true, false), 9, b"abc"));
    p.b().handle_datagram(now, &fragment(1, DataFlags::new(false, false), 0, b"def"));
    p.b().handle_datagram(now, &fragment(2, call(false, true), 0, b"ghi"));
    // Then a whole message.
    p.b().handle_datagram(now, &fragment(3, DataFlags::new(true, true), 0, b"whole"));
    let got: Vec<_> = std::iter::from_fn(|| p.b().recv())
        .map(|d| (d.message.to_vec(), d.channel == Channel::LAYER))
        .collect();
    assert_eq!(got, [(b"whole".to_vec(), false)]);
    assert_eq!(p.b().stats().protocol_violations, 1);
}

#[test]
fn small_messages_share_datagrams() {
    let mut p = Pair::new(Config::default());
    for i in 0..1000 {
        p.send(&msg(i, 8)).unwrap();
    }
    p.run(Duration::from_secs(1));
    assert_eq!(p.drain_b().len(), 1000);
    // 8-byte messages cost 20 bytes each on the wire: ~70 per 1472-byte datagram.
    assert!(p.a().stats().datagrams_sent < 30, "{}", p.a().stats().datagrams_sent);
}

#[test]
fn repairs_every_loss_pattern_in_both_modes() {
    for mode in [RetransmitMode::Selective, RetransmitMode::GoBackN] {
        // Go-back-N at 50% loss each way advances about one segment per
        // timeout round (198 of 300 messages in 30 s here): that is its known
        // weakness and why selective is the default, not a bug to test for.
        let patterns: &[u64] = if mode == RetransmitMode::GoBackN { &[3, 5, 17] } else { &[2, 3, 5, 17] };
        for &drop_every in patterns {
            let config = Config { retransmit: mode, ..Config::default() };
            let mut p = Pair::new(config);
            // Drop one datagram in `drop_every`, chosen by a fixed hash of its
            // number: a strictly periodic pattern phase-locks with go-back-N's
            // fixed-size retransmission bursts and always hits the same segment.
            p.keep(move |n, _| n.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(29) % drop_every != 0);
            let want: Vec<_> = (0..300).map(|i| msg(i, (i * 97) % 4000)).collect();
            for m in &want {
                p.send(m).unwrap();
            }
            // Virtual time: go-back-N at 20% loss each way needs most of it
            // (one timeout round per loss), selective a fraction of a second.
            p.run(Duration::from_secs(120));
            check(&p.drain_b(), &want, &format!("{mode:?} drop_every={drop_every}"));
            assert!(p.a().stats().retransmits > 0);
        }
    }
}

#[test]
fn corrupted_datagrams_are_dropped_and_repaired() {
    let mut p = Pair::new(Config::default());
    let want: Vec<_> = (0..100).map(|i| msg(i, 600)).collect();
    for m in &want {
        p.send(m).unwrap();
    }
    // Corrupt every 4th datagram in place by dropping it and injecting a bit-flipped copy.
    let corrupt: std::rc::Rc<std::cell::RefCell<Vec<Vec<u8>>>> = Default::default();
    let c2 = corrupt.clone();
    p.keep(move |n, bytes| {
        if n % 4 == 0 {
            let mut b = bytes.to_vec();
            let bit = (n as usize * 13) % (b.len() * 8);
            b[bit / 8] ^= 1 << (bit % 8);
            c2.borrow_mut().push(b);
            return false;
        }
        true
    });
    // Long enough for the handshake (its first HELLO and first WELCOME are
    // among those corrupted: each costs a HELLO retry, 5 ms then 10 ms)
    // and for data flights after it.
    p.run(Duration::from_millis(40));
    assert!(corrupt.borrow().len() > 10, "data datagrams were corrupted, not just the handshake");
    for b in corrupt.borrow().iter() {
        let now = p.now();
        p.b().handle_datagram(now, b);
        p.a().handle_datagram(now, b);
    }
    p.run(Duration::from_secs(5));
    check(&p.drain_b(), &want, "corrupt");
    assert!(p.b().stats().checksum_failures > 0);
}

/// The receiver copies each payload to where it will live while verifying
/// the datagram (the fused receive copy): in-order fragments straight into
/// the message being reassembled, a first fragment into the buffer it will
/// start. On a clean link every byte takes that copy, and none a second
/// one, but for a first fragment that shares its datagram with the end of
/// the message before (it lands in the arena: that message is still in
/// reassembly while the datagram is verified).
#[test]
fn payloads_are_copied_once_by_the_checksum_pass() {
    let mut p = Pair::new(Config::default());
    let want: Vec<_> = (0..40).map(|i| msg(i, 20_000 + i * 1000)).collect();
    for m in &want {
        p.send(m).unwrap();
    }
    p.run(Duration::from_secs(1));
    check(&p.drain_b(), &want, "clean");
    let s = p.b().stats();
    let payload: u64 = want.iter().map(|m| m.len() as u64).sum();
    assert_eq!(s.bytes_landed, payload, "every payload byte copied by the checksum pass");
    // Here one of the 40 messages began in the datagram that ended the
    // one before; copying every first fragment again would be 40.
    let fragment = Config::default().max_fragment() as u64;
    assert!(
        s.bytes_copied_after_verify <= 2 * fragment,
        "{} bytes copied again: first fragments must land where they live",
        s.bytes_copied_after_verify
    );
}

/// A datagram corrupted in flight must leave no trace in the message its
/// fragment would have continued, under every algorithm: one payload bit
/// of every fifth data datagram flips (a pattern each algorithm is
/// guaranteed to catch), often the very fragment the receiver expects
/// next, whose landing is then written and abandoned; every message must
/// still arrive exact.
#[test]
fn corrupted_fragments_never_land_in_a_message() {
    for kind in ChecksumKind::ALL.into_iter().filter(|&k| k != ChecksumKind::None) {
        let config =
            Config { checksum: kind, accept_checksums: ChecksumSet::only(kind), ..Config::default() };
        let mut p = Pair::new(config);
        let flipped = std::rc::Rc::new(std::cell::Cell::new(0u64));
        let f2 = flipped.clone();
        p.keep(move |n, bytes| {
            // Data datagrams only (B sends small ACKs); a bit well inside the
            // payload of the datagram's one fragment.
            if bytes.len() > 1000 && n % 5 == 2 {
                let bit = 8 * 100 + (n as usize * 8 + 3) % (8 * (bytes.len() - 200));
                bytes[bit / 8] ^= 1 << (bit % 8);
                f2.set(f2.get() + 1);
            }
            true
        });
        let want: Vec<_> = (0..40).map(|i| msg(i, 20_000 + i * 1000)).collect();
        for m in &want {
            p.send(m).unwrap();
        }
        p.run(Duration::from_secs(10));
        check(&p.drain_b(), &want, kind.name());
        let s = p.b().stats();
        assert_eq!(s.checksum_failures, flipped.get(), "{}: every flipped datagram refused", kind.name());
        assert!(flipped.get() > 100, "{}: only {} flipped", kind.name(), flipped.get());
    }
}

/// Messages 0-9 from A delivered (within `settle`), then the link dies and
/// A sends 10-19 into it.
fn ten_delivered_then_ten_into_a_dead_link(p: &mut Pair, settle: Duration) {
    for i in 0..10 {
        p.send(&msg(i, 100)).unwrap();
    }
    p.run(settle);
    assert_eq!(p.drain_b().len(), 10);
    p.keep(|_, _| false);
    for i in 10..20 {
        p.send(&msg(i, 100)).unwrap();
    }
}

/// Whether A has reported B unreachable (other events are passed over).
fn gave_up(p: &mut Pair) -> Option<tether_proto::FailedMessages> {
    std::iter::from_fn(|| p.a().poll_event()).find_map(|e| match e {
        Event::PeerUnreachable { failed } => Some(failed),
        _ => None,
    })
}

/// An endpoint whose conversation is slow (200 ms each way: a starved
/// peer or a far one) waits sixteen of its round trips, not the 5 s
/// floor, before it gives a silent peer up; then it does, exactly.
#[test]
fn a_slow_conversation_is_given_up_only_after_sixteen_of_its_round_trips() {
    let mut p = Pair::new(Config::default());
    let slow = |_: &mut Sent<'_>| Fate::Deliver(Duration::from_millis(200));
    p.net.link = Box::new(slow) as Wire;
    ten_delivered_then_ten_into_a_dead_link(&mut p, Duration::from_secs(3));
    p.run(Duration::from_millis(5_500));
    assert_eq!(gave_up(&mut p), None, "given up at the 5 s floor despite 400 ms round trips");
    p.run(Duration::from_secs(60));
    let failed = gave_up(&mut p).expect("given up within the cap");
    assert_eq!((failed.first, failed.end), (10, 20));
}

/// An endpoint whose own timers run late (its thread gets the CPU a
/// second after each deadline: a hundred endpoints on two cores) hears its
/// peers late too, and takes that lateness, not only its round trips, as
/// the measure of silence: it gives a silent peer up after sixteen of its
/// late turns, not at the 5 s floor; then exactly the unacknowledged
/// messages are reported.
#[test]
fn an_endpoint_whose_timers_run_late_waits_that_much_longer_before_giving_a_peer_up() {
    let mut p = Pair::new(Config::default());
    // A alone is driven from here, every timer a second late, and whatever
    // it sends is lost.
    ten_delivered_then_ten_into_a_dead_link(&mut p, Duration::from_millis(100));
    let silent_from = p.now();
    let late = Duration::from_secs(1);
    let mut now = silent_from;
    let mut buf = vec![0u8; 2048];
    let given_up = loop {
        let due = p.a().poll_timeout().expect("a timer while messages are unacknowledged");
        now = now.max(due) + late;
        p.a().handle_timeout(now);
        while p.a().poll_transmit(now, &mut buf).is_some() {}
        if let Some(failed) = gave_up(&mut p) {
            break (now - silent_from, failed);
        }
        assert!(now - silent_from < Duration::from_secs(120), "never given up");
    };
    let (after, failed) = given_up;
    eprintln!("given up after {after:?} of silence, timers a second late");
    // Sixteen late turns: about 16 s (with the turns' own second).
    assert!(after >= Duration::from_secs(12), "given up after {after:?}, at the floor despite late timers");
    assert!(after <= Duration::from_secs(30), "given up only after {after:?}");
    assert_eq!((failed.first, failed.end), (10, 20));
}

#[test]
fn dead_link_fails_exactly_the_unacknowledged_messages() {
    let config = Config { abandon_after: Duration::from_millis(300), ..Config::default() };
    let mut p = Pair::new(config);
    ten_delivered_then_ten_into_a_dead_link(&mut p, Duration::from_millis(100));
    p.run(Duration::from_secs(2));
    match p.a().poll_event() {
        Some(Event::PeerUnreachable { failed }) => {
            assert_eq!((failed.first, failed.end), (10, 20));
            assert_eq!(failed.in_doubt_end, 20, "all were transmitted");
        }
        other => panic!("expected PeerUnreachable, got {other:?}"),
    }
    let id = |seq| MessageId { peer: B, seq };
    assert_eq!(p.a().message_state(id(9)), MessageState::Delivered);
    assert_eq!(p.a().message_state(id(10)), MessageState::Failed(FailReason::PeerUnreachable));
    assert_eq!(p.a().buffered_bytes(B), 0, "buffers released");
    // The link heals: a new epoch starts and delivery resumes.
    p.keep(|_, _| true);
    p.send(&msg(99, 10)).unwrap();
    p.run(Duration::from_secs(1));
    assert_eq!(p.drain_b(), vec![msg(99, 10)]);
    assert_eq!(p.a().poll_event(), Some(Event::PeerReachable { peer: B }));
}

#[test]
fn restarted_peer_gets_a_fresh_stream_and_old_packets_are_dropped() {
    let mut p = Pair::new(Config::default());
    p.send(b"before").unwrap();
    p.run(Duration::from_millis(10));
    assert_eq!(p.drain_b(), vec![b"before".to_vec()]);
    // Capture a datagram from A's first life toward B.
    p.send(b"old life").unwrap();
    let mut buf = vec![0u8; 2048];
    let now = p.now();
    let t = p.a().poll_transmit(now, &mut buf).unwrap();
    let old = buf[..t.len].to_vec();
    // A restarts with a new incarnation.
    p.net.replace(endpoint(Config::default(), A, 2, B));
    p.send(b"after").unwrap();
    p.run(Duration::from_millis(10));
    let now = p.now();
    p.b().handle_datagram(now, &old);
    p.run(Duration::from_millis(10));
    assert_eq!(p.drain_b(), vec![b"after".to_vec()]);
    assert!(p.b().stats().stale_dropped >= 1);
}

#[test]
fn a_checksum_downgrade_is_refused() {
    let mut p = Pair::new(Config::default());
    let weak = Config { checksum: tether_wire::ChecksumKind::None, ..Config::default() };
    let mut forger = endpoint(weak, A, 1, B);
    forger.send(p.now(), B, b"unchecked").unwrap();
    let mut buf = vec![0u8; 2048];
    let t = forger.poll_transmit(p.now(), &mut buf).unwrap();
    let now = p.now();
    p.b().handle_datagram(now, &buf[..t.len]);
    assert_eq!(p.b().stats().checksum_refused, 1);
    assert!(p.b().recv().is_none());
}

#[test]
fn coalescing_holds_small_messages_at_most_the_delay() {
    let mut p = Pair::connected(Config::default());
    let now = p.now();
    let mut buf = vec![0u8; 2048];
    // Nothing in flight: the first message goes at once.
    p.a().send(now, B, b"first").unwrap();
    assert!(p.a().poll_transmit(now, &mut buf).is_some());
    // Something in flight: a small message waits to be aggregated...
    p.a().send(now, B, b"second").unwrap();
    assert!(p.a().poll_transmit(now, &mut buf).is_none());
    let due = p.a().poll_timeout().unwrap();
    assert_eq!(due, now + Config::default().coalesce_delay);
    // ...but no longer than the coalescing delay (the driver's turn:
    // the timeout, then what is due).
    p.a().handle_timeout(due);
    assert!(p.a().poll_transmit(due, &mut buf).is_some());
    // A full datagram's worth never waits.
    for _ in 0..200 {
        p.a().send(due, B, &[7u8; 16]).unwrap();
    }
    assert!(p.a().poll_transmit(due, &mut buf).is_some());
}

/// The fast path of a stream of small messages (`join_waiting`, which the
/// runtime tries before `send`): a message joins only unsent data that
/// waits, moves no timer (the endpoint's invariant checks compare the
/// timer table with the state after each), and is held no longer than
/// `send` would hold it. Where joining would change what is due it
/// declines, and `send` takes the message.
#[test]
fn small_messages_join_the_waiting_ones_and_move_no_timer() {
    let mut p = Pair::connected(Config { send_window: 4, ..Config::default() });
    let now = p.now();
    let mut buf = vec![0u8; 2048];
    assert!(p.a().join_waiting(B, b"first").is_none(), "nothing waits: it would go at once");
    p.a().send(now, B, b"first").unwrap();
    assert!(p.a().poll_transmit(now, &mut buf).is_some());
    assert!(p.a().join_waiting(B, b"second").is_none(), "nothing unsent to join");
    p.a().send(now, B, b"second").unwrap();
    let due = p.a().poll_timeout().unwrap();
    assert_eq!(due, now + Config::default().coalesce_delay);
    for i in 0..5u8 {
        assert!(p.a().join_waiting(B, &[i; 8]).is_some(), "joins the waiting second");
        assert_eq!(p.a().poll_timeout(), Some(due), "no timer moved");
    }
    assert!(p.a().poll_transmit(now, &mut buf).is_none(), "still waiting for company");
    // A datagram's worth would make data due at once: declined.
    assert!(p.a().join_waiting(B, &[9u8; 1500]).is_none());
    // At the deadline three go together and fill the window (4 segments);
    // more messages join behind it whatever their size.
    p.a().handle_timeout(due);
    let t = p.a().poll_transmit(due, &mut buf).unwrap();
    assert!(t.len > 3 * 8, "the waiting messages share a datagram");
    for i in 0..20u8 {
        assert!(p.a().join_waiting(B, &[i; 100]).is_some(), "the window is shut: nothing is due");
    }
    p.run(Duration::from_millis(20));
    let got = p.drain_b();
    assert_eq!(got.len(), 2 + 5 + 20);
    assert_eq!(got[0], b"first");
    assert_eq!(got[7], [0u8; 100]);
    assert_eq!(p.a().stats().messages_sent, 27);
}

/// A message reassembled from fragments is delivered in a buffer from the
/// endpoint's pool, which it returns to when the application drops it (not
/// before: a slice of it keeps it), and a later message takes it from
/// there: a stream of large messages runs in two buffers, their pages
/// mapped once, not in a new allocation per message. (Two: the first
/// message's first fragment came behind the handshake's CONFIRM and was
/// copied into a buffer of its own, so the one it would have landed in
/// waits for the next message.)
#[test]
fn large_messages_reuse_the_buffers_of_those_dropped() {
    let mut p = Pair::connected(Config::default());
    let mut buffers = std::collections::BTreeSet::new();
    for i in 0..20 {
        let want = msg(i, 64 * 1024);
        p.send(&want).unwrap();
        let (before, _) = p.b().pooled_buffers();
        p.run(Duration::from_millis(2));
        let got = p.b().recv().expect("delivered");
        assert_eq!(&got.message[..], &want[..], "message {i}");
        let (taken, _) = p.b().pooled_buffers();
        if i >= 2 {
            assert_eq!(taken, before - 1, "message {i} took a pooled buffer");
        }
        buffers.insert(got.message.as_ptr() as usize);
        let tail = got.message.slice(60_000..);
        drop(got);
        assert_eq!(p.b().pooled_buffers().0, taken, "a slice still holds it");
        drop(tail);
        let (n, bytes) = p.b().pooled_buffers();
        assert_eq!(n, taken + 1, "message {i}'s buffer is back");
        assert!(bytes >= n * 64 * 1024);
    }
    assert_eq!(buffers.len(), 2);
}

#[test]
fn the_tail_of_a_large_message_is_never_held_back() {
    let mut p = Pair::connected(Config::default());
    let now = p.now();
    let mut buf = vec![0u8; 2048];
    // Three fragments: all leave at once, the short last one included.
    p.a().send(now, B, &msg(1, 4096)).unwrap();
    let mut datagrams = 0;
    while p.a().poll_transmit(now, &mut buf).is_some() {
        datagrams += 1;
    }
    assert_eq!(datagrams, 3);
}

/// A datagram as an attacker writes it: any header, DATA and handshake
/// frames of its choosing, a correct CRC32C (no secret protects it).
fn forge(header: Header, data: Option<(u64, &[u8])>, handshake: Option<HandshakeFrame>) -> Vec<u8> {
    let mut buf = vec![0u8; 2048];
    let mut w = PacketWriter::new(&mut buf, &header).unwrap();
    if let Some(h) = handshake {
        w.push_handshake(&h).unwrap();
    }
    if let Some((seq, payload)) = data {
        w.push_data(seq, DataFlags::new(true, true), 0, payload).unwrap();
    }
    let n = w.finish();
    buf.truncate(n);
    buf
}

fn header(src_node: u32, dst_node: u32, src_inc: u64, dst_inc: u64) -> Header {
    Header {
        flags: HeaderFlags::default(),
        checksum: ChecksumKind::Crc32c,
        src_node,
        dst_node,
        src_inc,
        dst_inc,
        epoch: 1,
        probe: 0,
    }
}

/// The blind attack (docs/PROTOCOL.md, "Incarnations, epochs, ACK request"): one datagram claiming A's node id with a
/// higher incarnation and `dst_inc` 0, correct checksum, carrying a
/// message. It must deliver nothing, change nothing, and A's genuine
/// stream must go on exact, before and after.
#[test]
fn a_forged_higher_incarnation_is_neither_delivered_nor_locks_the_peer_out() {
    let mut p = Pair::connected(Config::default());
    let want: Vec<_> = (0..50).map(|i| msg(i, 300)).collect();
    for m in &want[..25] {
        p.send(m).unwrap();
    }
    p.run(Duration::from_millis(5));
    for seq in [0, 25, 1 << 40] {
        for dst_inc in [0, 1] {
            let forged = forge(header(A, B, 1_000, dst_inc), Some((seq, b"forged")), None);
            let now = p.now();
            p.b().handle_datagram(now, &forged);
        }
    }
    for m in &want[25..] {
        p.send(m).unwrap();
    }
    p.run(Duration::from_secs(1));
    check(&p.drain_b(), &want, "after the forgery");
    let s = p.b().stats();
    assert_eq!(s.sessionless_dropped, 6, "each forged datagram dropped, none taken");
    assert_eq!(p.a().stats().messages_failed, 0, "the genuine sender never failed");
    assert!(p.a().has_session(B) && p.b().has_session(A));
}

/// A node id nobody configured gets nothing delivered, not even a HELLO answered.
/// Reassemble fragment deliveries as an engine's application does: each
/// fragment must continue the stream exactly where the last one ended
/// (`next`), or it is a duplicate and skipped.
fn reassemble(b: &mut Endpoint, next: &mut u64, partial: &mut Vec<u8>, out: &mut Vec<Vec<u8>>) {
    reassemble_marked(b, next, partial, out, &mut Vec::new());
}

/// `reassemble`, noting in `calls` whether each message came on the side
/// channel (`Delivery::channel`: a call's envelope) as its last fragment
/// comes.
fn reassemble_marked(
    b: &mut Endpoint,
    next: &mut u64,
    partial: &mut Vec<u8>,
    out: &mut Vec<Vec<u8>>,
    calls: &mut Vec<bool>,
) {
    while let Some(d) = b.recv() {
        let f = d.fragment.expect("fragment mode delivers fragments");
        if f.seq < *next {
            continue;
        }
        assert_eq!(f.seq, *next, "a fragment skipped");
        *next += 1;
        if f.first {
            partial.clear();
        }
        partial.extend_from_slice(&d.message);
        if f.last {
            out.push(std::mem::take(partial));
            calls.push(d.channel == Channel::LAYER);
        }
    }
}

fn fragments() -> Config {
    Config { deliver_fragments: true, ..Config::default() }
}

/// Fragment mode: messages of every size arrive as fragments in order,
/// and nothing is acknowledged before the application took it (the
/// commit point an engine needs, docs/ENGINE.md).
#[test]
fn fragment_mode_acknowledges_only_what_the_application_took() {
    let mut p = Pair::connected(fragments());
    let want: Vec<_> =
        [0, 1, 1400, 1500, 5000, 70_000, 8].iter().enumerate().map(|(i, &n)| msg(i, n)).collect();
    let ids: Vec<_> = want.iter().map(|m| p.send(m).unwrap()).collect();
    p.run(Duration::from_millis(50));
    // B's core holds them all, taken by nobody: none is acknowledged.
    assert!(p.b().pending_deliveries() > want.len());
    for &id in &ids {
        assert_eq!(p.a().message_state(id), MessageState::Pending);
    }
    // Held, not lost: selectively acknowledged, so the sender resends only
    // the first now and then (every segment would go at each timeout else).
    let waiting = p.a().stats().retransmits;
    assert!(waiting <= 12, "{waiting} resends while B's application did not read");
    let (mut next, mut partial, mut got) = (0, Vec::new(), Vec::new());
    reassemble(p.b(), &mut next, &mut partial, &mut got);
    check(&got, &want, "reassembled");
    p.run(Duration::from_millis(5));
    for &id in &ids {
        assert_eq!(p.a().message_state(id), MessageState::Delivered, "acknowledged once taken");
    }
    assert_eq!(p.a().stats().retransmits, waiting, "taking cost no resend");
}

/// An engine dies holding fragments it received and acknowledged nothing
/// of: the application took the first ones, the rest are lost with the
/// engine. The engine restored at the application's position gets the
/// rest again from the sender, and the application sees every message
/// once, whole.
#[test]
fn fragments_lost_with_the_engine_come_again_from_the_sender() {
    let mut p = Pair::connected(fragments());
    let want: Vec<_> = (0..30).map(|i| msg(i, 3000)).collect();
    for m in &want {
        p.send(m).unwrap();
    }
    p.run(Duration::from_millis(50));
    // The application takes the first 10 fragments (some message half).
    let (mut next, mut partial, mut got) = (0, Vec::new(), Vec::new());
    for _ in 0..10 {
        let d = p.b().recv().unwrap();
        let f = d.fragment.unwrap();
        assert_eq!(f.seq, next);
        next += 1;
        if f.first {
            partial.clear();
        }
        partial.extend_from_slice(&d.message);
        if f.last {
            got.push(std::mem::take(&mut partial));
        }
    }
    // The engine dies; the new one knows only where the application stands.
    let mut snap = p.b().snapshot();
    snap.deliveries.clear();
    snap.peers[0].recv.delivered_upto = next;
    snap.peers[0].recv.out_of_order.clear();
    snap.peers[0].recv.partial = None;
    let now = p.now();
    p.net.replace(Endpoint::restore(fragments(), snap, now).unwrap());
    for _ in 0..200 {
        p.run(Duration::from_millis(10));
        reassemble(p.b(), &mut next, &mut partial, &mut got);
    }
    check(&got, &want, "across the engine's death");
    assert_eq!(p.a().stats().messages_failed, 0);
    assert_eq!(p.a().unsettled(), 0, "everything acknowledged in the end");
}

/// A sending engine dies mid-stream, under loss. The new one is built from
/// the marks the old one backed up and the messages the application kept
/// (`Endpoint::resume`): it cuts every unsettled message again at its
/// original sequence numbers, the receiver sees a pause, and every message
/// arrives once, in order, and is acknowledged.
#[test]
fn a_sender_resumed_from_its_backup_loses_and_repeats_nothing() {
    for crash_after_ms in [0, 1, 2, 3, 5, 8] {
        let (mut p, want) = lossy_fragments();
        for m in &want {
            p.send(m).unwrap();
        }
        let handshakes = p.b().stats().handshakes_completed;
        resume_sender_after(&mut p, crash_after_ms, fragments(), &want);
        assert_eq!(p.b().stats().handshakes_completed, handshakes, "the peer saw a pause, no new session");
    }
}

/// Two endpoints in fragment mode that lose every seventh datagram, and
/// 40 messages of 100 to 2,900 bytes to send.
fn lossy_fragments() -> (Pair, Vec<Vec<u8>>) {
    let mut p = Pair::connected(fragments());
    let mut n = 0u64;
    p.keep(move |_, _| {
        n += 1;
        n % 7 != 3
    });
    (p, (0..40).map(|i| msg(i, 100 + 700 * (i % 5))).collect())
}

/// Messages on the layer channel (calls' envelopes) keep it through a
/// resume (an engine replaced under its applications): the application
/// kept the channel with each unsettled message, and the resumed sender
/// cuts it again with the channel on every fragment.
#[test]
fn a_resumed_sender_keeps_calls_marked_as_calls() {
    for crash_after_ms in [0, 1, 2, 3, 5, 8] {
        let (mut p, want) = lossy_fragments();
        let calls: Vec<bool> = (0..40).map(|i| i % 3 == 0).collect();
        for (m, &call) in want.iter().zip(&calls) {
            let now = p.now();
            if call {
                p.a().send_on(now, B, Channel::LAYER, bytes::Bytes::from(m.clone())).unwrap();
            } else {
                p.a().send(now, B, m).unwrap();
            }
        }
        resume_marked_sender_after(&mut p, crash_after_ms, fragments(), &want, &calls);
    }
}

/// Messages queued before the handshake, cut for the sender's own 1,472
/// bytes, and a session agreed at a peer's 600: they are cut again, and
/// the new cut must be the one `Endpoint::resume` makes from the agreed
/// size alone (each message whole, in fragments of that size). Splitting
/// the old pieces further instead (1,392 into 520 + 520 + 352) renumbered
/// fragments the receiver held after a resume, and an engine's
/// application got messages with pieces missing or doubled.
#[test]
fn a_sender_resumed_after_agreeing_a_smaller_size_cuts_as_before() {
    // At 0 ms no session is agreed yet: the successor must begin one.
    for crash_after_ms in [0, 1, 2, 3, 5, 8] {
        let mut net = VirtualNet::new(
            Instant::from_nanos(1_000_000),
            Box::new(|_: &mut Sent<'_>| Fate::Deliver(LATENCY)) as Wire,
        );
        net.add(endpoint(fragments(), A, 1, B));
        net.add(endpoint(Config { max_datagram: 600, ..fragments() }, B, 1, A));
        let mut p = Pair { net };
        let want: Vec<_> = (0..40).map(|i| msg(i, 100 + 1500 * (i % 4))).collect();
        for m in &want {
            p.send(m).unwrap();
        }
        resume_sender_after(&mut p, crash_after_ms, fragments(), &want);
        assert_eq!(p.a().max_datagram_to(B), 600);
    }
}

/// Run `crash_after_ms`, replace A by an endpoint resumed from what a dead
/// engine's backup block holds and the application kept, run on, and
/// check that B's application got `want` exactly and A reports all of it
/// delivered.
fn resume_sender_after(p: &mut Pair, crash_after_ms: u64, config: Config, want: &[Vec<u8>]) {
    resume_marked_sender_after(p, crash_after_ms, config, want, &[]);
}

/// `resume_sender_after` where `calls[i]` says message `i` is a call's
/// envelope (sent on `Channel::LAYER`; missing: not): the application kept that mark
/// with the message, and B must get each one marked as it was sent.
fn resume_marked_sender_after(
    p: &mut Pair,
    crash_after_ms: u64,
    config: Config,
    want: &[Vec<u8>],
    calls: &[bool],
) {
    let is_call = |i: usize| calls.get(i).copied().unwrap_or(false);
    p.run(Duration::from_millis(crash_after_ms));
    let (mut next, mut partial, mut got) = (0, Vec::new(), Vec::new());
    let mut marks_seen = Vec::new();
    reassemble_marked(p.b(), &mut next, &mut partial, &mut got, &mut marks_seen);
    // What the dead engine's block held: its marks, the high-water of
    // what it sent written ahead of the datagrams (record before send).
    let mut marks = p.a().stream_marks(B).unwrap();
    marks.sent_upto += 1024;
    let first = marks.settled_msg as usize;
    let messages = want[first..]
        .iter()
        .enumerate()
        .map(|(i, m)| tether_proto::Unsettled {
            data: bytes::Bytes::from(m.clone()),
            channel: if is_call(first + i) { Channel::LAYER } else { Channel::APP },
        })
        .collect();
    let stream = tether_proto::ResumedStream {
        peer: B,
        rails: vec![0],
        marks,
        messages,
        failures: Vec::new(),
        taken: None,
    };
    let now = p.now();
    let resumed = Endpoint::resume(config, A, 1, vec![stream], now).unwrap();
    p.net.replace(resumed);
    for _ in 0..300 {
        p.run(Duration::from_millis(10));
        reassemble_marked(p.b(), &mut next, &mut partial, &mut got, &mut marks_seen);
    }
    check(&got, want, &format!("resumed after {crash_after_ms} ms"));
    for (i, &call) in marks_seen.iter().enumerate() {
        assert_eq!(call, is_call(i), "message {i}'s mark, resumed after {crash_after_ms} ms");
    }
    for seq in 0..want.len() as u64 {
        let state = p.a().message_state(MessageId { peer: B, seq });
        assert_eq!(state, MessageState::Delivered, "message {seq}, resumed after {crash_after_ms} ms");
    }
    assert_eq!(p.a().stats().messages_failed, 0);
}

/// A receiver restored from its hard state without what it held out of
/// order (an engine that keeps only what it delivered, docs/ENGINE.md)
/// reneges on its selective acknowledgements. The sender notices from the
/// next ACK that no longer covers them and resends them at once: not one
/// per retransmission timeout, which would take a timeout per segment.
#[test]
fn segments_a_restored_receiver_no_longer_holds_are_resent_at_once() {
    let mut p = Pair::connected(Config::default());
    // The first data datagram never arrives (nor its repairs, until B is
    // restored): all that follows waits at B out of order, SACKed.
    let blocked = std::rc::Rc::new(std::cell::Cell::new(true));
    let gate = blocked.clone();
    let mut first = None;
    p.net.link = Box::new(move |s: &mut Sent<'_>| {
        if s.src != A || !gate.get() {
            return Fate::Deliver(LATENCY);
        }
        // One message per datagram: A's first is seq 0, the next 19 carry
        // seqs 1 to 19, and anything later is a repair.
        let first = *first.get_or_insert(s.n);
        if (first + 1..=first + 19).contains(&s.n) {
            Fate::Deliver(LATENCY)
        } else {
            Fate::Drop
        }
    });
    let want: Vec<_> = (0..20).map(|i| msg(i, 1200)).collect();
    for m in &want {
        p.send(m).unwrap();
    }
    p.run(Duration::from_millis(2));
    assert!(p.drain_b().is_empty(), "the hole holds everything back");
    assert_eq!(p.b().snapshot().peers[0].recv.out_of_order.len(), 19, "B holds the rest out of order");
    // B loses what it held out of order and comes back as the same life.
    let mut snap = p.b().snapshot();
    snap.peers[0].recv.out_of_order.clear();
    let now = p.now();
    p.net.replace(Endpoint::restore(Config::default(), snap, now).unwrap());
    blocked.set(false);
    let timeouts = p.a().stats().timeouts;
    p.run(Duration::from_millis(200));
    check(&p.drain_b(), &want, "after the restore");
    let taken = p.a().stats().timeouts - timeouts;
    assert!(taken <= 2, "{taken} retransmission timeouts to repair 19 reneged segments");
}

/// Epochs an attacker can pick, against a sender on its first epoch, 1:
/// near and far ahead, exactly half the space away, just past half (older),
/// and behind.
const FORGED_EPOCHS: [u32; 7] = [2, 3, 1 << 20, 1 << 31, (1 << 31) + 1, u32::MAX, 0];

/// Every message delivered once, in order, or reported failed; none
/// delivered that was reported certainly-not-arrived. Returns the
/// messages not reported failed (all of which `got` holds, in order).
fn delivered_or_reported(p: &mut Pair, got: &[Vec<u8>], sent: &[(u64, Vec<u8>)], what: &str) -> Vec<Vec<u8>> {
    let failed: Vec<_> = std::iter::from_fn(|| p.a().poll_event())
        .filter_map(|e| match e {
            Event::StreamReset { failed } => Some(failed),
            Event::PeerUnreachable { failed } => panic!("{what}: locked out, {failed:?} failed"),
            _ => None,
        })
        .collect();
    let failed_seq = |seq: u64| failed.iter().find(|f| f.contains(seq));
    let kept: Vec<_> =
        sent.iter().filter(|(seq, _)| failed_seq(*seq).is_none()).map(|(_, m)| m.clone()).collect();
    let in_doubt: Vec<_> = sent
        .iter()
        .filter(|(seq, _)| failed_seq(*seq).is_some_and(|f| *seq < f.in_doubt_end))
        .map(|(_, m)| m.clone())
        .collect();
    let unexplained: Vec<_> = got.iter().filter(|m| !kept.contains(m) && !in_doubt.contains(m)).collect();
    assert!(unexplained.is_empty(), "{what}: delivered but reported never sent");
    let delivered_kept: Vec<_> = got.iter().filter(|m| kept.contains(m)).cloned().collect();
    check(&delivered_kept, &kept, &format!("{what}: the messages not reported failed"));
    kept
}

/// Without a cluster key an on-path attacker, who reads the live
/// incarnations from any header, can forge DATA with any stream epoch.
/// The receiver adopts one within reach ahead (it cannot tell) and drops
/// the genuine epoch as stale. That must not lock the sender out, nor cost it a
/// message: the receiver answers the stale data with where it left the
/// genuine epoch and where it is now, and the sender carries everything
/// above that point over to the epoch after the receiver's. Every epoch an
/// attacker can pick is overtaken, the largest included (serial
/// arithmetic); with messages in flight as the forgery lands.
#[test]
fn a_forged_data_epoch_neither_locks_the_sender_out_nor_loses_a_message() {
    for forged_epoch in FORGED_EPOCHS {
        let mut p = Pair::connected(Config::default());
        let before: Vec<_> = (0..20).map(|i| msg(i, 300)).collect();
        for m in &before {
            p.send(m).unwrap();
        }
        p.run(Duration::from_millis(5));
        check(&p.drain_b(), &before, "before the forgery");
        let after: Vec<_> = (20..60u64).map(|i| (i, msg(i as usize, 300))).collect();
        for (i, (_, m)) in after.iter().enumerate() {
            p.send(m).unwrap();
            if i == 10 {
                // Lands with messages in flight, at a sequence number the
                // stream has not reached (held out of order, never delivered).
                let mut h = header(A, B, 1, 1);
                h.epoch = forged_epoch;
                let now = p.now();
                p.b().handle_datagram(now, &forge(h, Some((5, b"forged")), None));
            }
            p.run(Duration::from_micros(100));
        }
        p.run(Duration::from_millis(500));
        let got = p.drain_b();
        let what = format!("forged DATA epoch {forged_epoch}");
        let kept = delivered_or_reported(&mut p, &got, &after, &what);
        assert_eq!(kept.len(), 40, "{what}: nothing failed");
        check(&got, &kept, &what);
        // Within reach (two and three): taken by B, then overtaken once by
        // A, everything carried over. Further (2^20 ahead and beyond, or
        // behind): dropped as stale, nothing moves.
        let newer = tether_proto::epoch_within_reach(forged_epoch, 1);
        assert_eq!(p.a().stats().streams_reset, u64::from(newer), "{what}");
        assert_eq!(p.a().stats().messages_failed, 0, "{what}");
        if !newer {
            assert!(p.b().stats().stale_dropped >= 1, "{what}: dropped as stale");
        }
    }
}

/// The same attacker forges an ACK toward the sender naming another
/// epoch. Unasked, it moves nothing: the sender takes an epoch past ours
/// only from an ACK that closes ours just before it, or from the answer to
/// its own probe. A forged answer (the attacker reads the probe numbers
/// too) makes the sender resynchronise: its unacknowledged messages fail
/// in doubt and it goes on past the named epoch; if that is one the
/// receiver drops as stale (exactly half the space away, or further), the
/// receiver's answers move the sender once more. Either way the stream
/// goes on, everything reported exactly.
#[test]
fn a_forged_ack_epoch_does_not_lock_the_sender_out() {
    for answer in [None, Some(1u8)] {
        for forged_epoch in FORGED_EPOCHS {
            let mut p = Pair::connected(Config::default());
            let sent: Vec<_> = (0..60u64).map(|i| (i, msg(i as usize, 300))).collect();
            for (i, (_, m)) in sent.iter().enumerate() {
                p.send(m).unwrap();
                if i == 30 {
                    let mut ack = AckRepr::new(forged_epoch, 0);
                    ack.answer = answer;
                    let mut buf = vec![0u8; 256];
                    let mut w = PacketWriter::new(&mut buf, &header(B, A, 1, 1)).unwrap();
                    w.push_ack(&ack).unwrap();
                    let n = w.finish();
                    let now = p.now();
                    p.a().handle_datagram(now, &buf[..n]);
                }
                p.run(Duration::from_micros(100));
            }
            p.run(Duration::from_millis(500));
            let got = p.drain_b();
            let what = format!("forged ACK epoch {forged_epoch}, answer {answer:?}");
            let kept = delivered_or_reported(&mut p, &got, &sent, &what);
            let id = |seq| MessageId { peer: B, seq };
            assert_eq!(p.a().message_state(id(59)), MessageState::Delivered, "{what}: the stream went on");
            if answer.is_none() || forged_epoch == 1 || !tether_proto::epoch_overtakes(forged_epoch, 1) {
                assert_eq!(kept.len(), 60, "{what}: nothing failed");
                assert_eq!(p.a().stats().streams_reset, 0, "{what}");
            } else {
                assert!(kept.len() >= 20, "{what}: the stream resumed ({} kept)", kept.len());
            }
        }
    }
}

#[test]
fn a_stranger_is_refused_data_and_handshake_alike() {
    let mut p = Pair::connected(Config::default());
    let now = p.now();
    let hello = HandshakeFrame { kind: HandshakeKind::Hello, max_datagram: 1472, nonce: 7, cookie: 0 };
    p.b().handle_datagram(now, &forge(header(9, B, 5, 0), None, Some(hello)));
    p.b().handle_datagram(now, &forge(header(9, B, 5, 1), Some((0, b"stranger")), None));
    assert_eq!(p.b().stats().strangers_refused, 2);
    assert_eq!(p.b().stats().hellos_answered, 1, "only A's HELLO of the setup was answered");
    assert!(p.b().recv().is_none());
    assert!(!p.b().knows(9));
}

/// WELCOMEs nobody asked for and CONFIRMs with made-up cookies are refused:
/// neither can set a peer's incarnation.
#[test]
fn forged_welcomes_and_confirms_are_refused() {
    let mut p = Pair::connected(Config::default());
    let now = p.now();
    let welcome = HandshakeFrame { kind: HandshakeKind::Welcome, max_datagram: 1472, nonce: 1, cookie: 2 };
    p.a().handle_datagram(now, &forge(header(B, A, 9_999, 1), None, Some(welcome)));
    let confirm = HandshakeFrame { kind: HandshakeKind::Confirm, max_datagram: 1472, nonce: 3, cookie: 4 };
    p.b().handle_datagram(
        now,
        &forge(header(A, B, 9_999, 1), Some((0, b"behind a forged CONFIRM")), Some(confirm)),
    );
    assert_eq!(p.a().stats().handshakes_refused, 1);
    assert_eq!(p.b().stats().handshakes_refused, 1);
    assert!(p.b().recv().is_none(), "nothing behind a forged CONFIRM is delivered");
    // The sessions still stand: genuine traffic flows.
    let want = vec![msg(1, 100)];
    p.send(&want[0]).unwrap();
    p.run(Duration::from_millis(10));
    check(&p.drain_b(), &want, "after forged handshakes");
}

/// A flood of HELLOs (forged, any incarnation) costs the listener a
/// bounded queue of answers: beyond `MAX_REPLIES` waiting, each is a
/// counted drop, and the genuine stream is untouched.
#[test]
fn a_confirm_that_aged_on_the_way_does_not_refuse_a_standing_session() {
    // Both greet each other (HELLOs cross, each answers the other's with
    // a WELCOME), and nothing more from B ever reaches A: not its CONFIRM,
    // nothing A could take as B knowing it. So A's CONFIRM rides in front
    // of everything it sends (its first, alone, gives B the session from
    // A's side), and A's datagrams after it take 5 s, longer than a
    // cookie lives (two to four seconds), as in an overloaded host's
    // queues.
    let mut p = Pair::new(Config::default());
    p.net.link = Box::new(|s: &mut Sent<'_>| match (s.src, s.n) {
        (B, 0..=1) | (A, 0..=2) => Fate::Deliver(LATENCY),
        (B, _) => Fate::Drop,
        _ => Fate::Deliver(Duration::from_secs(5)),
    });
    let now = p.now();
    p.a().connect(now, B).unwrap();
    p.run(Duration::from_millis(2));
    assert!(p.a().has_session(B) && p.b().has_session(A), "the handshake completes");
    let want: Vec<_> = (0..3).map(|i| msg(i, 100)).collect();
    for m in &want {
        p.send(m).unwrap();
    }
    p.run(Duration::from_secs(6));
    // The aged CONFIRM proves nothing B's session has not: the data it
    // fronts is taken, not refused with it.
    check(&p.drain_b(), &want, "behind an aged CONFIRM");
    assert_eq!(p.b().stats().handshakes_refused, 0, "no CONFIRM refused for a standing session");
}

#[test]
fn a_hello_flood_is_bounded_and_harmless() {
    let mut p = Pair::connected(Config::default());
    let want: Vec<_> = (0..20).map(|i| msg(i, 500)).collect();
    for m in &want {
        p.send(m).unwrap();
    }
    let now = p.now();
    for i in 0..10_000u64 {
        let hello =
            HandshakeFrame { kind: HandshakeKind::Hello, max_datagram: 1472, nonce: i + 1, cookie: 0 };
        p.b().handle_datagram(now, &forge(header(A, B, 2 + i, 0), None, Some(hello)));
    }
    let s = p.b().stats().clone();
    assert_eq!(s.hellos_answered - 1, tether_proto::MAX_REPLIES as u64, "answers bounded");
    assert_eq!(s.handshake_replies_dropped, 10_000 - tether_proto::MAX_REPLIES as u64);
    p.run(Duration::from_secs(1));
    check(&p.drain_b(), &want, "under a HELLO flood");
    assert_eq!(p.a().stats().messages_failed, 0);
    assert!(p.a().has_session(B));
}

/// A listener with smaller datagrams than its sender: the handshake agrees
/// on the smaller, so nothing is truncated and every message arrives.
#[test]
fn different_datagram_sizes_agree_on_the_smaller() {
    let mut net = VirtualNet::new(
        Instant::from_nanos(1_000_000),
        Box::new(|s: &mut Sent<'_>| if s.bytes.len() > 600 { Fate::Drop } else { Fate::Deliver(LATENCY) })
            as Wire,
    );
    net.add(endpoint(Config::default(), A, 1, B));
    net.add(endpoint(Config { max_datagram: 600, ..Config::default() }, B, 1, A));
    let want: Vec<_> = (0..20).map(|i| msg(i, 3000)).collect();
    for m in &want {
        let now = net.now();
        net.ep_mut(A).send(now, B, m).unwrap();
    }
    net.run(Duration::from_secs(1));
    let got: Vec<_> = std::iter::from_fn(|| net.ep_mut(B).recv()).map(|d| d.message.to_vec()).collect();
    check(&got, &want, "600-byte listener");
    assert_eq!(net.ep(A).max_datagram_to(B), 600);
    assert_eq!(net.ep(A).stats().messages_failed, 0);
}

/// A path that drops datagrams above 1,300 bytes without a word (a PMTU
/// black hole), between two endpoints that both accept 9,000: the padded
/// HELLOs of the full size vanish, the fallback to the base size gets
/// through, and every message arrives in 1,200-byte datagrams. Without
/// the proof in the handshake the session would agree on 9,000 and every
/// full datagram would vanish until the sender gave up.
#[test]
fn a_black_hole_for_large_datagrams_is_found_in_the_handshake() {
    const HOLE: usize = 1300;
    let largest = std::rc::Rc::new(std::cell::Cell::new(0));
    let seen = largest.clone();
    let mut net = VirtualNet::new(
        Instant::from_nanos(1_000_000),
        Box::new(move |s: &mut Sent<'_>| {
            seen.set(seen.get().max(s.bytes.len()));
            if s.bytes.len() > HOLE {
                Fate::Drop
            } else {
                Fate::Deliver(LATENCY)
            }
        }) as Wire,
    );
    let config = Config { max_datagram: 9000, ..Config::default() };
    net.add(endpoint(config.clone(), A, 1, B));
    net.add(endpoint(config, B, 1, A));
    let want: Vec<_> = (0..20).map(|i| msg(i, 5000)).collect();
    for m in &want {
        let now = net.now();
        net.ep_mut(A).send(now, B, m).unwrap();
    }
    net.run(Duration::from_secs(2));
    let got: Vec<_> = std::iter::from_fn(|| net.ep_mut(B).recv()).map(|d| d.message.to_vec()).collect();
    check(&got, &want, "through the black hole");
    assert_eq!(largest.get(), 9000, "the first HELLO proposed, and was padded to, the full size");
    assert_eq!(net.ep(A).max_datagram_to(B), tether_proto::BASE_DATAGRAM);
    assert_eq!(net.ep(B).max_datagram_to(A), tether_proto::BASE_DATAGRAM);
    assert_eq!(net.ep(A).stats().messages_failed, 0);
}

/// On a path that carries them, the padded handshake agrees on the
/// largest size both accept: 65,507 bytes, as on loopback.
#[test]
fn a_path_that_carries_the_largest_datagrams_agrees_on_them() {
    let mut p = Pair::connected(Config { max_datagram: 65_507, ..Config::default() });
    assert_eq!(p.a().max_datagram_to(B), 65_507);
    assert_eq!(p.b().max_datagram_to(A), 65_507);
    let big = msg(1, 200_000);
    p.send(&big).unwrap();
    p.run(Duration::from_millis(50));
    check(&p.drain_b(), &[big], "one large message");
}

/// Messages must not reach two incarnations: B receives messages, every
/// ACK it sends is lost, and it restarts. A never learned B's new life from
/// a header: it must not hand those messages to B's new incarnation (they
/// are reported to A's application, in doubt), and what A sends after
/// learning of the restart arrives exactly once.
#[test]
fn a_receiver_restarting_with_its_acks_lost_never_gets_a_message_twice() {
    let mut p = Pair::connected(Config::default());
    let first: Vec<_> = (0..10).map(|i| msg(i, 200)).collect();
    p.net.link = Box::new(|s: &mut Sent<'_>| if s.src == B { Fate::Drop } else { Fate::Deliver(LATENCY) });
    for m in &first {
        p.send(m).unwrap();
    }
    p.run(Duration::from_millis(3));
    check(&p.drain_b(), &first, "the old life got them");
    // B restarts; the link heals.
    p.net.replace(endpoint(Config::default(), B, 2, A));
    p.net.link = Box::new(|_: &mut Sent<'_>| Fate::Deliver(LATENCY));
    let second: Vec<_> = (10..20).map(|i| msg(i, 200)).collect();
    for m in &second {
        p.send(m).unwrap();
        p.run(Duration::from_micros(200));
    }
    p.run(Duration::from_secs(1));
    let got = p.drain_b();
    for m in &got {
        assert!(!first.contains(m), "a message of the old life reached the new one");
    }
    let restarted: Vec<_> = std::iter::from_fn(|| p.a().poll_event())
        .filter_map(|e| match e {
            Event::PeerRestarted { failed, .. } => Some(failed),
            _ => None,
        })
        .collect();
    assert_eq!(restarted.len(), 1, "the restart was learned once, through a handshake");
    // The old life's ten (and any sent to it before the restart was
    // learned) are in doubt: it did receive them.
    assert_eq!(restarted[0].first, 0);
    assert!(restarted[0].in_doubt_end >= 10, "{:?}", restarted[0]);
    // Every message sent after that is delivered to the new life, once, in order.
    let kept: Vec<_> = (10..20u64)
        .zip(&second)
        .filter(|(id, _)| !restarted[0].contains(*id))
        .map(|(_, m)| m.clone())
        .collect();
    check(&got, &kept, "the new life");
    assert!(!kept.is_empty());
}

/// What a link closure and the test both see.
type Shared<T> = std::rc::Rc<std::cell::RefCell<T>>;

fn keyed() -> Config {
    keyed_with(AuthKind::default())
}

fn keyed_with(auth: AuthKind) -> Config {
    let key = ClusterKey::from_material(b"a cluster secret of some length").unwrap().with_auth(auth);
    Config { key: Some(key), ..Config::default() }
}

/// With a cluster key, an attacker on the path sees every datagram and
/// sends its own: it replays each one later, flips bits in copies, and
/// forges DATA and ACKs with the right sequence numbers and incarnations
/// under a key of its own. Nothing forged is delivered, nothing is falsely
/// acknowledged, and every genuine message arrives once, in order: with
/// every algorithm (with AES-256-GMAC the attacker reads the payloads too).
#[test]
fn an_on_path_attacker_without_the_key_changes_nothing() {
    for auth in AuthKind::ALL {
        on_path_attacker(auth);
    }
}

fn on_path_attacker(auth: AuthKind) {
    let mut p = Pair::connected(keyed_with(auth));
    let seen: Shared<Vec<(u32, Vec<u8>)>> = Default::default();
    let log = seen.clone();
    p.net.link = Box::new(move |s: &mut Sent<'_>| {
        log.borrow_mut().push((s.dst, s.bytes.to_vec()));
        Fate::Deliver(LATENCY)
    });
    let want: Vec<_> = (0..60).map(|i| msg(i, 100 + i * 37)).collect();
    let wrong = ClusterKey::from_material(b"the attacker's own guess at it").unwrap().with_auth(auth);
    for (i, m) in want.iter().enumerate() {
        p.send(m).unwrap();
        p.run(Duration::from_micros(300));
        let now = p.now();
        // Replays of everything seen so far, and tampered copies of it.
        let copies: Vec<_> = seen.borrow().iter().rev().take(3).cloned().collect();
        for (dst, bytes) in copies {
            let mut flipped = bytes.clone();
            let at = (i * 7) % flipped.len();
            flipped[at] ^= 0x04;
            for d in [&bytes, &flipped] {
                p.net.ep_mut(dst).handle_datagram(now, d);
            }
        }
        // Forged DATA for B and a forged ACK for A, with the genuine
        // incarnations and sequence numbers, under the wrong key.
        let (ia, ib) = (p.a().incarnation(), p.b().incarnation());
        let data_key = wrong.datagram_key(A, ia, B, ib);
        let mut buf = vec![0u8; 2048];
        let mut w =
            PacketWriter::new_authenticated(&mut buf, &header(A, B, ia, ib), &data_key, 1 << 40).unwrap();
        w.push_data(i as u64, DataFlags::new(true, true), 0, b"forged").unwrap();
        let n = w.finish();
        p.b().handle_datagram(now, &buf[..n]);
        let ack_key = wrong.datagram_key(B, ib, A, ia);
        let mut w =
            PacketWriter::new_authenticated(&mut buf, &header(B, A, ib, ia), &ack_key, 1 << 40).unwrap();
        let mut ack = AckRepr::new(1, 1_000);
        ack.full = false;
        w.push_ack(&ack).unwrap();
        let n = w.finish();
        p.a().handle_datagram(now, &buf[..n]);
        // And the same, unauthenticated, with a correct CRC32C.
        let plain = forge(header(A, B, ia, ib), Some((i as u64, b"forged")), None);
        p.b().handle_datagram(now, &plain);
    }
    p.run(Duration::from_secs(1));
    check(&p.drain_b(), &want, "under an on-path attacker");
    let (a, b) = (p.a().stats().clone(), p.b().stats().clone());
    assert_eq!(a.messages_acked, 60, "acknowledged exactly what was delivered");
    assert_eq!(a.messages_failed, 0);
    assert!(a.replays + b.replays > 100, "replays seen: {} {}", a.replays, b.replays);
    assert!(a.mac_failures + b.mac_failures > 200, "forgeries seen");
    assert_eq!(b.auth_missing, 60);
    assert_eq!(b.protocol_violations + a.protocol_violations, 0, "no forged frame was ever acted on");
}

/// Both sides must hold the same key and use it with the same algorithm:
/// a peer with another key, the same key under another algorithm, or none
/// never gets a session, and nothing of its reaches the application.
#[test]
fn a_peer_with_another_key_or_none_gets_no_session() {
    for other in [
        Config::default(),
        Config { key: Some(ClusterKey::from_material(&[9; 32]).unwrap()), ..Config::default() },
        keyed_with(AuthKind::Aes256Gcm),
        keyed_with(AuthKind::ChaCha20Poly1305),
    ] {
        assert_ne!(other.key, keyed().key);
        let mut net = VirtualNet::new(
            Instant::from_nanos(1_000_000),
            Box::new(|_: &mut Sent<'_>| Fate::Deliver(LATENCY)) as Wire,
        );
        net.add(endpoint(keyed(), A, 1, B));
        net.add(endpoint(other, B, 1, A));
        let now = net.now();
        net.ep_mut(A).send(now, B, b"for the keyed only").unwrap();
        net.run(Duration::from_millis(50));
        assert!(net.ep_mut(B).recv().is_none());
        assert!(!net.ep(A).has_session(B) && !net.ep(B).has_session(A));
        let s = net.ep(A).stats();
        let refused = s.auth_missing + s.auth_unexpected + s.auth_mismatch + s.mac_failures;
        assert!(refused > 0, "A refused B's datagrams");
    }
}

/// A peer refused for its configuration hears nothing, so the refusing
/// side tells its application: an `Event::Refused` naming the reason
/// (here: a key on one side only, each side's view of it), at most one
/// waiting at a time however long the refusals go on.
#[test]
fn refused_traffic_is_reported_by_reason_one_event_at_a_time() {
    let mut net = VirtualNet::new(
        Instant::from_nanos(1_000_000),
        Box::new(|_: &mut Sent<'_>| Fate::Deliver(LATENCY)) as Wire,
    );
    net.add(endpoint(keyed(), A, 1, B));
    net.add(endpoint(Config::default(), B, 1, A));
    let now = net.now();
    net.ep_mut(A).send(now, B, b"for the keyed only").unwrap();
    net.ep_mut(B).send(now, A, b"from the unkeyed").unwrap();
    net.run(Duration::from_secs(5));
    let refused = |ep: &mut Endpoint| {
        let mut found = Vec::new();
        while let Some(e) = ep.poll_event() {
            if let Event::Refused { refused, .. } = e {
                found.push(refused);
            }
        }
        found
    };
    let (a, b) = (refused(net.ep_mut(A)), refused(net.ep_mut(B)));
    assert_eq!((a.len(), b.len()), (1, 1), "one report waiting, the later ones added to it");
    assert!(a[0].auth_missing > 0 && a[0].auth_unexpected == 0, "{:?}", a[0]);
    assert!(b[0].auth_unexpected > 0 && b[0].auth_missing == 0, "{:?}", b[0]);
    // Reported once a second, as datagrams come: all but the last
    // second's refusals are in the one waiting report.
    let total = net.ep(A).stats().auth_missing;
    assert!(
        a[0].auth_missing <= total && a[0].auth_missing * 5 >= total * 3,
        "{} of {total}",
        a[0].auth_missing
    );
    assert!(a[0].causes()[0].contains("the other side has none"), "{:?}", a[0].causes());
    assert!(b[0].causes()[0].contains("a key on the other side only"), "{:?}", b[0].causes());
}

/// Two endpoints wired by hand with addresses: what each knows the other
/// at (its "transport's address book") decides whether a datagram reaches
/// its peer and which `Origin` it arrives with, as the runtime's driver
/// does.
struct Addressed {
    a: Endpoint,
    b: Endpoint,
    /// Where B really is, and where A believes it is.
    b_at: SocketAddr,
    a_knows_b_at: SocketAddr,
    now: Instant,
    /// Every datagram B sent, for an attacker to replay.
    from_b: Vec<Vec<u8>>,
}

impl Addressed {
    fn exchange(&mut self, turns: usize) {
        let mut buf = vec![0u8; 2048];
        for _ in 0..turns {
            self.a.handle_timeout(self.now);
            while let Some(t) = self.a.poll_transmit(self.now, &mut buf) {
                // To the address it names, else to where A believes B is.
                if t.to_addr.unwrap_or(self.a_knows_b_at) == self.b_at {
                    self.b.handle_datagram_from(self.now, 0, Origin::Node(A), &buf[..t.len]);
                }
            }
            while let Some(m) = self.a.poll_moved() {
                assert_eq!((m.node, m.rail), (B, 0));
                self.a_knows_b_at = m.addr;
            }
            self.b.handle_timeout(self.now);
            while let Some(t) = self.b.poll_transmit(self.now, &mut buf) {
                self.from_b.push(buf[..t.len].to_vec());
                let origin = if self.b_at == self.a_knows_b_at {
                    Origin::Node(B)
                } else {
                    Origin::Stranger(self.b_at)
                };
                self.a.handle_datagram_from(self.now, 0, origin, &buf[..t.len]);
            }
            self.now = self.now + Duration::from_micros(200);
        }
    }

    fn drain(e: &mut Endpoint) -> Vec<Vec<u8>> {
        std::iter::from_fn(|| e.recv().map(|d| d.message.to_vec())).collect()
    }
}

fn addressed(config: &Config) -> Addressed {
    let old: SocketAddr = "10.0.0.2:7000".parse().unwrap();
    let mut p = Addressed {
        a: endpoint(config.clone(), A, 1, B),
        b: endpoint(config.clone(), B, 1, A),
        b_at: old,
        a_knows_b_at: old,
        now: Instant::from_nanos(1_000_000),
        from_b: Vec::new(),
    };
    p.a.send(p.now, B, b"before the move").unwrap();
    p.exchange(50);
    assert_eq!(Addressed::drain(&mut p.b), [b"before the move".to_vec()]);
    // B restarts, a new incarnation at another port.
    p.b = endpoint(config.clone(), B, 2, A);
    p.b_at = "10.0.0.2:7001".parse().unwrap();
    p.from_b.clear();
    p
}

/// A peer that restarts at another address proves itself there by the
/// handshake, with a cluster key: its HELLO from the new address is
/// answered there, its CONFIRM carries a cookie made for that address,
/// and only then is it followed (`poll_moved`); both directions work
/// again. An attacker replaying everything it sent, from an address of
/// its own, moves nothing.
#[test]
fn a_peer_that_moved_proves_its_new_address_by_the_handshake() {
    for auth in AuthKind::ALL {
        let mut p = addressed(&keyed_with(auth));
        let now = p.now;
        p.b.send(now, A, b"from the new address").unwrap();
        p.exchange(50);
        assert_eq!(p.a_knows_b_at, p.b_at, "{auth:?}: A follows B to its new address");
        assert_eq!(p.a.stats().peers_moved, 1);
        assert_eq!(Addressed::drain(&mut p.a), [b"from the new address".to_vec()]);
        let now = p.now;
        p.a.send(now, B, b"to the new address").unwrap();
        p.exchange(50);
        assert_eq!(Addressed::drain(&mut p.b), [b"to the new address".to_vec()]);
        // An attacker replays every datagram B sent from its own address.
        let attacker: SocketAddr = "10.6.6.6:7001".parse().unwrap();
        let unknown = p.a.stats().unknown_source;
        for d in std::mem::take(&mut p.from_b) {
            p.a.handle_datagram_from(p.now, 0, Origin::Stranger(attacker), &d);
        }
        let mut buf = vec![0u8; 2048];
        while let Some(t) = p.a.poll_transmit(p.now, &mut buf) {
            assert_ne!(t.to_addr, None, "only WELCOMEs to the replayed HELLOs' source");
        }
        assert_eq!(p.a.poll_moved(), None, "{auth:?}: a replayed CONFIRM proves nothing from elsewhere");
        assert_eq!(p.a.stats().peers_moved, 1);
        assert!(p.a.stats().unknown_source > unknown, "replayed data from a stranger address refused");
        let now = p.now;
        p.a.send(now, B, b"still to B").unwrap();
        p.exchange(50);
        assert_eq!(Addressed::drain(&mut p.b), [b"still to B".to_vec()]);
    }
}

/// Without a cluster key nothing proves who sends from an address no peer
/// has, so nothing from there is taken: the moved peer is refused (counted
/// as `unknown_source`) and followed nowhere.
#[test]
fn without_a_key_a_peer_that_moved_is_refused() {
    let mut p = addressed(&Config::default());
    let now = p.now;
    p.b.send(now, A, b"from the new address").unwrap();
    p.exchange(50);
    assert_eq!(p.a_knows_b_at, "10.0.0.2:7000".parse().unwrap());
    assert!(Addressed::drain(&mut p.a).is_empty());
    assert!(p.a.stats().unknown_source > 0);
    assert_eq!(
        (p.a.stats().peers_moved, p.a.stats().hellos_answered),
        (0, 1),
        "only the first HELLO, before the move"
    );
    assert!(!p.b.has_session(A));
}

/// A datagram whose header names another node than the one its source
/// address belongs to is dropped (`source_mismatch`) and nothing of it is
/// delivered; one whose node id was corrupted on the way counts as
/// corruption, not as an attack (the check comes after verification).
#[test]
fn a_datagram_from_another_peers_address_is_refused() {
    let at: SocketAddr = "10.0.0.2:7000".parse().unwrap();
    let mut p = Addressed {
        a: endpoint(Config::default(), A, 1, B),
        b: endpoint(Config::default(), B, 1, A),
        b_at: at,
        a_knows_b_at: at,
        now: Instant::from_nanos(1_000_000),
        from_b: Vec::new(),
    };
    p.exchange(20);
    p.from_b.clear();
    let now = p.now;
    p.b.send(now, A, b"genuine").unwrap();
    let mut buf = vec![0u8; 2048];
    p.b.handle_timeout(now + Duration::from_millis(1));
    let t = p.b.poll_transmit(now + Duration::from_millis(1), &mut buf).expect("B sends its message");
    let genuine = buf[..t.len].to_vec();
    // From the address of node 3 (the transport says so): refused.
    p.a.handle_datagram_from(now, 0, Origin::Node(3), &genuine);
    assert_eq!(p.a.stats().source_mismatch, 1);
    assert!(p.a.recv().is_none());
    // The same with its source node id corrupted, from B's own address.
    let mut corrupted = genuine.clone();
    corrupted[8] ^= 0x01;
    p.a.handle_datagram_from(now, 0, Origin::Node(B), &corrupted);
    assert_eq!((p.a.stats().source_mismatch, p.a.stats().checksum_failures), (1, 1));
    // And from B's address as it is: delivered.
    p.a.handle_datagram_from(now, 0, Origin::Node(B), &genuine);
    assert_eq!(p.a.recv().map(|d| d.message.to_vec()), Some(b"genuine".to_vec()));
}

/// A receiver that stalls (its acknowledgements held 12 ms, past the first
/// timeout, 5 ms before any round trip is measured) with nothing lost: the
/// timeout sends probes that carry no data, the receiver's answer covers
/// the whole flight, and nothing is sent twice (the rule before resent the
/// first segment at each timeout, and the one before that the whole
/// flight: 64). Every message is still delivered once, in order.
#[test]
fn a_late_receiver_costs_no_retransmission() {
    let mut p = Pair::connected(Config::default());
    let held = std::rc::Rc::new(std::cell::Cell::new(true));
    let hold = held.clone();
    p.net.link = Box::new(move |s: &mut Sent<'_>| {
        // B's first acknowledgements are late; everything arrives.
        if s.src == B && hold.get() {
            Fate::Deliver(Duration::from_millis(12))
        } else {
            Fate::Deliver(LATENCY)
        }
    });
    let want: Vec<Vec<u8>> = (0..64).map(|i| msg(i, 1200)).collect();
    for m in &want {
        p.send(m).unwrap();
    }
    p.run(Duration::from_millis(10));
    held.set(false);
    p.run(Duration::from_millis(200));
    check(&p.drain_b(), &want, "late acknowledgements");
    let s = p.a().stats().clone();
    assert!(s.timeouts >= 1, "the acknowledgements were late enough for a timeout: {s:?}");
    assert!(s.probes_sent >= 2, "the timeout probed: {s:?}");
    assert_eq!(s.retransmits, 0, "a late receiver lost nothing: {s:?}");
    assert!(s.spurious_timeouts >= 1, "the answer showed the timeout spurious: {s:?}");
    assert_eq!(p.b().stats().duplicates_discarded, 0);
}

/// Round trips longer than the retransmission timeout may grow (its
/// ceiling, `rto_max`, as on an overloaded machine): every timeout probes,
/// and answers come back after newer probes went. An answer names its
/// probe, and one to an older probe is not taken for the answer to a
/// newer one, which would make everything sent in between look lost (a
/// 128-node demo resent hundreds of thousands of segments so).
#[test]
fn a_late_answer_to_an_older_probe_makes_nothing_look_lost() {
    let config = Config { rto_max: Duration::from_millis(10), ..Config::default() };
    let mut p = Pair::connected(config);
    p.net.link = Box::new(|s: &mut Sent<'_>| {
        // Everything from B takes 25 ms: two and a half timeouts.
        Fate::Deliver(if s.src == B { Duration::from_millis(25) } else { LATENCY })
    });
    let want: Vec<Vec<u8>> = (0..200).map(|i| msg(i, 1200)).collect();
    for (i, m) in want.iter().enumerate() {
        p.send(m).unwrap();
        if i % 10 == 9 {
            // Bursts with pauses: the pauses let the timeouts fire.
            p.run(Duration::from_millis(13));
        }
    }
    p.run(Duration::from_millis(300));
    check(&p.drain_b(), &want, "answers late");
    let s = p.a().stats().clone();
    assert!(s.timeouts >= 5, "the round trip outlasted the timeout: {s:?}");
    assert_eq!(s.retransmits, 0, "nothing was lost: {s:?}");
    assert_eq!(p.b().stats().duplicates_discarded, 0);
}

/// The tail of a flight is lost (the last three datagrams, nothing after
/// them to show the gap): the timeout's probe is answered by an ACK that
/// covers all but those three, and exactly those go again.
#[test]
fn a_lost_tail_is_found_by_the_probe_answer_and_resent_alone() {
    let mut p = Pair::connected(Config::default());
    let want: Vec<Vec<u8>> = (0..40).map(|i| msg(i, 1200)).collect();
    // A's first data datagram is the n-th of the run; the last three of
    // the forty (one message each) are dropped, once.
    let mut first = None;
    p.keep(move |n, _| {
        let first = *first.get_or_insert(n);
        !(first + 37..first + 40).contains(&n)
    });
    for m in &want {
        p.send(m).unwrap();
    }
    p.run(Duration::from_millis(100));
    check(&p.drain_b(), &want, "a lost tail");
    let s = p.a().stats().clone();
    assert!(s.timeouts >= 1 && s.probes_sent >= 1, "only a timeout can find a lost tail: {s:?}");
    assert_eq!(s.retransmits, 3, "exactly the three lost segments go again: {s:?}");
    assert_eq!(s.spurious_timeouts, 0, "the answer showed a loss: {s:?}");
}

/// Every datagram from A is delayed at random up to 8 times the round trip,
/// so later segments overtake earlier ones all the time, and none is lost.
/// Loss detection learns how late segments come and resends (almost)
/// nothing; the count of later segments acknowledged that it replaced
/// resent most of them.
#[test]
fn reordering_without_loss_is_not_taken_for_loss() {
    let mut p = Pair::connected(Config::default());
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    p.net.link = Box::new(move |s: &mut Sent<'_>| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let extra = if s.src == A { x % 800 } else { 0 };
        Fate::Deliver(LATENCY + Duration::from_micros(extra))
    });
    let want: Vec<Vec<u8>> = (0..400).map(|i| msg(i, 1000)).collect();
    for chunk in want.chunks(40) {
        for m in chunk {
            p.send(m).unwrap();
        }
        p.run(Duration::from_millis(2));
    }
    p.run(Duration::from_millis(100));
    check(&p.drain_b(), &want, "reordered");
    let s = p.a().stats().clone();
    assert!(
        s.retransmits * 100 <= s.data_frames_sent,
        "{} resends of {} data frames",
        s.retransmits,
        s.data_frames_sent
    );
}

/// Large datagrams: the window in bytes bounds what is in flight, not the
/// segment count alone (1,024 segments of 60,000 bytes would put 60 MB on
/// the wire at once, far past any socket buffer). Before the first ACK
/// can come back only 256 KiB have gone; every message still arrives.
#[test]
fn the_window_in_bytes_bounds_large_datagrams() {
    let config = Config { max_datagram: 65_507, send_window_bytes: 256 << 10, ..Config::default() };
    let mut p = Pair::connected(config);
    let sent = std::rc::Rc::new(std::cell::Cell::new(0u64));
    let count = sent.clone();
    p.net.link = Box::new(move |s: &mut Sent<'_>| {
        if s.src == A && s.bytes.len() > 60_000 {
            count.set(count.get() + 1);
        }
        Fate::Deliver(Duration::from_millis(1))
    });
    let want: Vec<Vec<u8>> = (0..64).map(|i| msg(i, 60_000)).collect();
    for m in &want {
        p.send(m).unwrap();
    }
    p.run(Duration::from_micros(1_500));
    assert_eq!(sent.get(), 4, "256 KiB admits four 60,000-byte segments before an ACK");
    p.run(Duration::from_millis(200));
    check(&p.drain_b(), &want, "large datagrams");
    assert_eq!(p.a().stats().retransmits, 0);
}

/// An unreliable message: its number and a pattern of `len` bytes.
fn unreliable_msg(i: u32, len: usize) -> Vec<u8> {
    let mut m = i.to_le_bytes().to_vec();
    m.extend((0..len.saturating_sub(4)).map(|j| (i as usize * 13 + j * 5) as u8));
    m
}

/// The unreliable class: each message is sent once and never again (no
/// retransmission), arrives at most once and intact or not at all, beside
/// a reliable stream that still delivers everything in order through the
/// same loss.
#[test]
fn unreliable_messages_go_once_arrive_at_most_once_and_leave_the_stream_whole() {
    let mut p = Pair::connected(Config::default());
    p.keep(|n, _| n % 3 != 0);
    let max = p.a().max_unreliable_len();
    let mut reliable = Vec::new();
    for i in 0..300u32 {
        let len = 4 + (i as usize * 37) % (max - 4);
        assert_eq!(p.a().send_unreliable(B, &unreliable_msg(i, len)), Ok(true));
        if i % 3 == 0 {
            let m = msg(i as usize, 100);
            p.send(&m).unwrap();
            reliable.push(m);
        }
        p.run(Duration::from_micros(200));
    }
    p.run(Duration::from_secs(5));
    let mut seen = std::collections::BTreeSet::new();
    while let Some(u) = p.b().recv_unreliable() {
        assert_eq!(u.from, A);
        let i = u32::from_le_bytes(u.message[..4].try_into().unwrap());
        assert!(seen.insert(i), "unreliable message {i} arrived twice");
        assert_eq!(u.message, unreliable_msg(i, u.message.len()), "unreliable message {i} changed");
    }
    let (sent, received) = (p.a().stats().unreliable_sent, p.b().stats().unreliable_received);
    assert_eq!(sent, 300, "each sent exactly once, none again");
    assert_eq!(received, seen.len() as u64);
    assert!(received > 100 && received < 300, "a third of the datagrams dropped: {received} arrived");
    check(&p.drain_b(), &reliable, "the reliable stream beside them");
}

#[test]
fn unreliable_queues_are_bounded_and_bad_sends_refused() {
    let config =
        Config { unreliable_queue_messages: 4, unreliable_queue_bytes: 1 << 20, ..Config::default() };
    let mut p = Pair::connected(config);
    let max = p.a().max_unreliable_len();
    let too_large = vec![0u8; max + 1];
    assert_eq!(p.a().send_unreliable(B, &too_large), Err(SendError::MessageTooLarge { len: max + 1, max }));
    assert_eq!(p.a().send_unreliable(A, b"me"), Err(SendError::SelfSend));
    assert_eq!(p.a().send_unreliable(9, b"who"), Err(SendError::UnknownPeer(9)));
    // The sender's queue: four wait, the fifth is dropped and counted.
    let queued: Vec<bool> =
        (0..5u32).map(|i| p.a().send_unreliable(B, &unreliable_msg(i, 8)).unwrap()).collect();
    assert_eq!(queued, [true, true, true, true, false]);
    p.run(Duration::from_millis(10));
    // The receiver's queue, never drained: four kept, the rest dropped.
    for i in 0..6u32 {
        p.a().send_unreliable(B, &unreliable_msg(i, 8)).unwrap();
        p.run(Duration::from_millis(1));
    }
    assert_eq!(p.a().stats().unreliable_dropped, 1);
    assert_eq!((p.b().stats().unreliable_received, p.b().stats().unreliable_dropped), (4, 6));
    let kept: Vec<u32> = std::iter::from_fn(|| p.b().recv_unreliable())
        .map(|u| u32::from_le_bytes(u.message[..4].try_into().unwrap()))
        .collect();
    assert_eq!(kept, [0, 1, 2, 3], "the first four, as they came");
}

/// The fates `A` reported for its NACK-reliable messages to `B`, by
/// message: every `Event::Nacked` taken from its queue.
fn nacked_fates(p: &mut Pair) -> std::collections::BTreeMap<u64, Vec<NackedFate>> {
    let mut fates = std::collections::BTreeMap::<u64, Vec<NackedFate>>::new();
    while let Some(e) = p.a().poll_event() {
        if let Event::Nacked { peer, first, end, fate } = e {
            assert_eq!(peer, B);
            for seq in first..end {
                fates.entry(seq).or_default().push(fate);
            }
        }
    }
    fates
}

/// The NACK-reliable class under loss both ways: the receiver asks for
/// what it lacks, and every message arrives intact, once, in order; the
/// sender holds each for `nacked_hold`, then says whether it was asked
/// for. Nothing is acknowledged: a clean stretch sends nothing back.
#[test]
fn nacked_messages_arrive_in_order_once_under_loss() {
    let mut p = Pair::connected(Config::default());
    p.keep(|n, _| n % 4 != 1);
    let max = p.a().max_nacked_len();
    for i in 0..300u32 {
        let len = 4 + (i as usize * 37) % (max - 4);
        let now = p.now();
        assert_eq!(p.a().send_nacked(now, B, &unreliable_msg(i, len)), Ok(i as u64));
        p.run(Duration::from_micros(200));
    }
    p.run(Duration::from_secs(2));
    let got: Vec<_> = std::iter::from_fn(|| p.b().recv_nacked()).collect();
    let seqs: Vec<u64> = got.iter().map(|m| m.seq).collect();
    assert_eq!(seqs, (0..300).collect::<Vec<_>>(), "every message, in order, once");
    for m in &got {
        assert_eq!(m.from, A);
        assert_eq!(m.message, unreliable_msg(m.seq as u32, m.message.len()), "message {} changed", m.seq);
    }
    let fates = nacked_fates(&mut p);
    assert_eq!(fates.len(), 300, "a fate for every message");
    let repaired = fates.values().filter(|f| **f == [NackedFate::Repaired]).count();
    let never = fates.values().filter(|f| **f == [NackedFate::NeverAskedFor]).count();
    assert_eq!(repaired + never, 300, "one fate each, none lost: {fates:?}");
    let (a, b) = (p.a().stats().clone(), p.b().stats().clone());
    assert!(repaired > 0 && a.nacked_repaired >= repaired as u64, "losses were repaired: {repaired}");
    assert!(b.nacks_sent > 0 && b.nacked_lost == 0, "{b:?}");
    assert_eq!((a.nacked_sent, b.nacked_received), (300, 300));
}

/// A receiver that learns a message left the sender's hold before it
/// arrived skips it, and asks all the same: the sender reports it lost,
/// so "never asked for" is left to messages nobody missed (and to a tail
/// lost with every word after it).
#[test]
fn a_nacked_message_gone_before_it_was_asked_for_is_reported_lost() {
    let config = Config { nacked_hold: Duration::from_millis(5), ..Config::default() };
    let mut p = Pair::connected(config);
    let now = p.now();
    assert_eq!(p.a().send_nacked(now, B, b"first"), Ok(0));
    p.run(Duration::from_millis(1));
    // Ten messages into a dead link, held past their time.
    let dead = std::rc::Rc::new(std::cell::Cell::new(true));
    let d = dead.clone();
    p.keep(move |_, _| !d.get());
    for i in 1..=10u32 {
        let now = p.now();
        p.a().send_nacked(now, B, &unreliable_msg(i, 20)).unwrap();
    }
    p.run(Duration::from_millis(20));
    dead.set(false);
    let now = p.now();
    assert_eq!(p.a().send_nacked(now, B, b"after"), Ok(11));
    p.run(Duration::from_millis(20));
    let got: Vec<u64> = std::iter::from_fn(|| p.b().recv_nacked()).map(|m| m.seq).collect();
    assert_eq!(got, [0, 11], "the ten never came; the rest did, in order");
    assert_eq!(p.b().stats().nacked_lost, 10);
    let fates = nacked_fates(&mut p);
    for seq in 1..=10 {
        assert_eq!(fates[&seq], [NackedFate::NeverAskedFor, NackedFate::Lost], "message {seq}");
    }
    assert_eq!(fates[&0], [NackedFate::NeverAskedFor]);
    assert_eq!(fates[&11], [NackedFate::NeverAskedFor]);
}

/// The hold is bounded (a full one refuses the send until messages leave
/// it) and bad sends are refused.
#[test]
fn the_nacked_hold_is_bounded_and_bad_sends_refused() {
    let config = Config { unreliable_queue_messages: 4, ..Config::default() };
    let mut p = Pair::connected(config);
    let now = p.now();
    let max = p.a().max_nacked_len();
    let too_large = vec![0u8; max + 1];
    assert_eq!(p.a().send_nacked(now, B, &too_large), Err(SendError::MessageTooLarge { len: max + 1, max }));
    assert_eq!(p.a().send_nacked(now, A, b"me"), Err(SendError::SelfSend));
    assert_eq!(p.a().send_nacked(now, 9, b"who"), Err(SendError::UnknownPeer(9)));
    let sent: Vec<_> = (0..5u32).map(|i| p.a().send_nacked(now, B, &unreliable_msg(i, 8))).collect();
    assert_eq!(sent, [Ok(0), Ok(1), Ok(2), Ok(3), Err(SendError::WouldBlock)]);
    p.run(Duration::from_secs(1));
    let now = p.now();
    assert_eq!(p.a().send_nacked(now, B, b"again"), Ok(4), "the hold emptied as its time passed");
}

/// Under a cluster key an unreliable datagram is authenticated like any
/// other: a copy replayed is dropped by its packet number, and one forged
/// without the key is refused. Without a key, a copy arrives twice, as a
/// UDP datagram may (docs/PROTOCOL.md, DATAGRAM).
#[test]
fn an_unreliable_datagram_replayed_or_forged_is_dropped_under_a_key() {
    for keyed in [true, false] {
        let key = keyed.then(|| ClusterKey::from_material(b"sixteen bytes at least, please").unwrap());
        let mut p = Pair::connected(Config { key, ..Config::default() });
        let captured = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
        let c = captured.clone();
        p.keep(move |_, bytes| {
            c.borrow_mut().push(bytes.to_vec());
            true
        });
        p.a().send_unreliable(B, b"heartbeat 1").unwrap();
        p.run(Duration::from_millis(1));
        assert_eq!(p.b().recv_unreliable().map(|u| u.message.to_vec()), Some(b"heartbeat 1".to_vec()));
        let copy = captured.borrow().iter().find(|d| d.windows(11).any(|w| w == b"heartbeat 1")).cloned();
        let now = p.now();
        match copy {
            Some(copy) => p.b().handle_datagram(now, &copy),
            None => assert!(keyed, "in clear the payload shows"),
        }
        if keyed {
            // GMAC leaves the payload in clear too: the copy was found and
            // replayed; its packet number was taken already.
            assert_eq!(p.b().recv_unreliable(), None, "a replayed copy is dropped");
            assert!(p.b().stats().replays >= 1);
            // A DATAGRAM frame forged without the key.
            let mut buf = vec![0u8; 200];
            let mut w = PacketWriter::new(&mut buf, &header(A, B, 1, 1)).unwrap();
            w.push_datagram(0, b"forged").unwrap();
            let n = w.finish();
            p.b().handle_datagram(now, &buf[..n]);
            assert_eq!(p.b().recv_unreliable(), None, "a forged datagram is refused");
            assert!(p.b().stats().auth_missing >= 1);
        } else {
            assert_eq!(
                p.b().recv_unreliable().map(|u| u.message.to_vec()),
                Some(b"heartbeat 1".to_vec()),
                "without a key a copy arrives again"
            );
        }
    }
}
