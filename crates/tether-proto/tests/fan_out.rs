//! One endpoint sending to many peers at once: the endpoint's window over
//! all its streams (`aggregate`) and the queue of peers it looks at for
//! the next datagram (`ready`), end to end over the simulator's virtual
//! network with every invariant checked after every operation (among
//! them: no peer that wants to send is left out of line).

use std::time::Duration;

use tether_proto::{Config, Endpoint, Instant, NodeId};
use tether_sim::net::{self, Fate, Sent, VirtualNet};

const SENDER: NodeId = 1;
const LATENCY: Duration = Duration::from_micros(50);

type Wire = Box<dyn FnMut(&mut Sent<'_>) -> Fate>;

/// A sender that knows `receivers`, each of which knows the sender, all
/// sessions established over a clean link.
fn fan_out(receivers: &[NodeId]) -> VirtualNet<Wire> {
    let clean = Box::new(|_: &mut Sent<'_>| Fate::Deliver(LATENCY)) as Wire;
    let mut net = VirtualNet::new(Instant::from_nanos(1_000_000), clean);
    net.add(net::endpoint(Config::default(), SENDER, 1, receivers.iter().copied(), &[0]));
    for &r in receivers {
        net.add(net::endpoint(Config::default(), r, 1, [SENDER], &[0]));
    }
    let now = net.now();
    for &r in receivers {
        net.ep_mut(SENDER).connect(now, r).unwrap();
    }
    net.run(Duration::from_millis(5));
    for &r in receivers {
        assert!(net.ep_mut(SENDER).has_session(r), "session with {r}");
    }
    net
}

fn msg(to: NodeId, i: usize, len: usize) -> Vec<u8> {
    (0..len).map(|j| (to as usize * 131 + i * 31 + j * 7) as u8).collect()
}

fn drain(ep: &mut Endpoint) -> Vec<Vec<u8>> {
    std::iter::from_fn(|| ep.recv()).map(|d| d.message.to_vec()).collect()
}

#[test]
fn an_endpoint_s_streams_together_stay_within_its_window() {
    let receivers: Vec<NodeId> = (2..34).collect();
    let mut net = fan_out(&receivers);
    // Two messages of 14 KB to each of 32 peers: each stream's own initial
    // window admits its whole share, so without the endpoint's window all
    // 900 KB would go at once.
    let now = net.now();
    for i in 0..2 {
        for &r in &receivers {
            net.ep_mut(SENDER).send(now, r, &msg(r, i, 14_000)).unwrap();
        }
    }
    let (mut peak, mut first, mut over) = (0u64, None, 0u32);
    net.run_with(Duration::from_secs(2), |id, ep| {
        if id != SENDER {
            return;
        }
        let shared = ep.aggregate();
        // What the streams themselves say they have in flight.
        let sum: u64 = receivers.iter().filter_map(|&r| ep.congestion(r)).map(|c| c.in_flight).sum();
        peak = peak.max(shared.in_flight);
        if sum > 0 && first.is_none() {
            first = Some(sum);
        }
        // A segment may go whenever nothing is in flight, and lost ones go
        // again whatever the window: a datagram's payload beyond it.
        if sum > shared.window + 1_500 {
            over += 1;
        }
    });
    for &r in &receivers {
        let got = drain(net.ep_mut(r));
        assert_eq!(got, vec![msg(r, 0, 14_000), msg(r, 1, 14_000)], "to {r}: delivered exactly");
    }
    assert_eq!(over, 0, "the streams' flights together went beyond the endpoint's window");
    // The first flight is the endpoint's initial window, ten datagrams,
    // not the 320 of the streams' own initial windows; it grows from there
    // as round trips show no queue.
    let first = first.unwrap_or(0);
    assert!(first <= 11 * 1_500, "{first} bytes in the first flight");
    assert!(peak > 0, "the endpoint's window counted the flights ({peak} at most)");
}

#[test]
fn a_dead_peer_does_not_hold_back_the_endpoint_s_other_streams() {
    let receivers: Vec<NodeId> = (2..6).collect();
    let mut net = fan_out(&receivers);
    // A round trip to peer 2 measured (its timeout ~1 ms, not 5).
    let now = net.now();
    net.ep_mut(SENDER).send(now, 2, b"hello").unwrap();
    net.run(Duration::from_millis(2));
    assert_eq!(drain(net.ep_mut(2)).len(), 1);
    // Peer 2 dies: nothing reaches it or comes from it any more.
    net.link = Box::new(
        |s: &mut Sent<'_>| if s.dst == 2 || s.src == 2 { Fate::Drop } else { Fate::Deliver(LATENCY) },
    );
    let now = net.now();
    // Its stream fills the endpoint's window first ...
    net.ep_mut(SENDER).send(now, 2, &msg(2, 0, 64_000)).unwrap();
    net.run(Duration::from_micros(10));
    // ... and then the others get messages.
    let now = net.now();
    for i in 0..8 {
        for r in 3..6 {
            net.ep_mut(SENDER).send(now, r, &msg(r, i, 3_000)).unwrap();
        }
    }
    // Its flight counts toward the endpoint's window until its path is
    // judged down and the flight is taken for lost (29 ms here), not until
    // the peer is given up (5 s). (Not counting a stream's flight from its
    // first unanswered timeout freed the others in 2 ms, but under
    // overload most timeouts are only late, and a 128-node demo then
    // retransmitted 30,862-106,033 times instead of 15,338-18,187.)
    let start = net.now();
    let mut got = vec![Vec::new(); 3];
    while got.iter().any(|g: &Vec<Vec<u8>>| g.len() < 8) && net.now() - start < Duration::from_secs(1) {
        net.run(Duration::from_millis(1));
        for r in 3..6 {
            got[r as usize - 3].extend(drain(net.ep_mut(r)));
        }
    }
    let took = net.now() - start;
    for r in 3..6 {
        let got = &got[r as usize - 3];
        assert_eq!(got.len(), 8, "to {r}: {} of 8 delivered while peer 2 was silent", got.len());
        assert!(got.iter().enumerate().all(|(i, m)| *m == msg(r, i, 3_000)), "to {r}: exact and in order");
    }
    assert!(took < Duration::from_millis(50), "the others waited {took:?} for the dead peer's flight");
}

/// A controller with no window of its own that says whether it competes.
#[derive(Debug)]
struct Unlimited {
    competing: bool,
}

impl tether_proto::Controller for Unlimited {
    fn window(&self) -> u64 {
        u64::MAX
    }
    fn on_ack(&mut self, _: &tether_proto::AckSignal) {}
    fn on_loss(&mut self, _: &tether_proto::LossSignal) {}
    fn state(&self) -> &'static str {
        "unlimited"
    }
    fn competing(&self) -> bool {
        self.competing
    }
}

#[derive(Debug)]
struct UnlimitedFactory(bool);

impl tether_proto::ControllerFactory for UnlimitedFactory {
    fn build(&self, _: u64) -> Box<dyn tether_proto::Controller> {
        Box::new(Unlimited { competing: self.0 })
    }
}

/// Datagrams a sender puts out at once for 60 messages of 1,000 B, its
/// streams' controller competing or not.
fn first_flight(competing: bool) -> usize {
    let config = Config {
        congestion: tether_proto::CongestionControl::Custom(std::sync::Arc::new(UnlimitedFactory(competing))),
        ..Config::default()
    };
    let clean = Box::new(|_: &mut Sent<'_>| Fate::Deliver(LATENCY)) as Wire;
    let mut net = VirtualNet::new(Instant::from_nanos(1_000_000), clean);
    net.add(net::endpoint(config.clone(), SENDER, 1, [2], &[0]));
    net.add(net::endpoint(config, 2, 1, [SENDER], &[0]));
    let now = net.now();
    net.ep_mut(SENDER).connect(now, 2).unwrap();
    net.run(Duration::from_millis(5));
    assert!(net.ep_mut(SENDER).has_session(2));
    let now = net.now();
    let a = net.ep_mut(SENDER);
    for i in 0..60 {
        a.send(now, 2, &msg(2, i, 1000)).unwrap();
    }
    let mut buf = vec![0u8; 65_536];
    std::iter::from_fn(|| a.poll_transmit(now, &mut buf)).count()
}

/// The endpoint's window is delay-controlled and blind to loss: a stream
/// that competes on loss with a neighbour holding the queue is not held
/// by it (at 300 Mbit/s beside TCP Cubic it handed the neighbour the link:
/// 0.06-0.10x of tether's fair share, 1.22-1.29x when not held). Others
/// are: the endpoint's first window is ten datagrams.
#[test]
fn a_stream_competing_on_loss_is_not_held_by_the_endpoint_s_window() {
    let held = first_flight(false);
    let free = first_flight(true);
    eprintln!("first flight: held {held}, competing {free}");
    assert!(held <= 15, "held by the endpoint's window (ten full datagrams of bytes): {held} datagrams");
    assert!(free > 2 * held, "competing, not held: {free} datagrams against {held}");
}
