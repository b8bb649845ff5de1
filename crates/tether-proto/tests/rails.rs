//! Two endpoints joined by two rails with virtual time: a rail cut
//! mid-stream, both rails cut one after the other, a flapping rail, a rail
//! that drops 30% instead of dying, a peer that restarts. Every case ends
//! in exactly-once, in-order delivery or an exact report of what was not
//! delivered, and the failover time (last datagram on the dead rail to the
//! first data acknowledged over the live one) is measured in virtual time.

use std::time::Duration;

use tether_proto::{
    Config, Endpoint, Event, Instant, MessageId, MessageState, PathState, RailPolicy, SendError,
};
use tether_sim::net::{self, Fate, Sent, VirtualNet};

const A: u32 = 1;
const B: u32 = 2;
const LATENCY: Duration = Duration::from_micros(30);

/// The two rails: decide the fate of every datagram.
type Wire = Box<dyn FnMut(&mut Sent<'_>) -> Fate>;

/// tether-sim's `VirtualNet` with two nodes joined by rails 0 and 1, and
/// a link that applies the test's rule by time and rail.
struct Rails {
    net: VirtualNet<Wire>,
}

/// An endpoint that reaches its one peer over both rails, with every
/// invariant checked.
fn endpoint(config: Config, node: u32, incarnation: u64, peer: u32) -> Endpoint {
    net::endpoint(config, node, incarnation, [peer], &[0, 1])
}

impl Rails {
    fn new(config: Config) -> Self {
        let mut net = VirtualNet::new(
            Instant::from_nanos(1_000_000),
            Box::new(|_: &mut Sent<'_>| Fate::Deliver(LATENCY)) as Wire,
        );
        net.add(endpoint(config.clone(), A, 1, B));
        net.add(endpoint(config, B, 1, A));
        Rails { net }
    }

    /// From now on, `gets_through(time, rail)` decides whether a datagram
    /// put on a rail at a time gets through.
    fn rule(&mut self, mut gets_through: impl FnMut(Instant, u8) -> bool + 'static) {
        self.net.link =
            Box::new(move |s| if gets_through(s.now, s.rail) { Fate::Deliver(LATENCY) } else { Fate::Drop });
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

    fn run(&mut self, until: Duration) {
        self.net.run(until);
    }

    fn drain_b(&mut self) -> Vec<Vec<u8>> {
        std::iter::from_fn(|| self.b().recv()).map(|d| d.message.to_vec()).collect()
    }

    fn events_a(&mut self) -> Vec<Event> {
        std::iter::from_fn(|| self.a().poll_event()).collect()
    }
}

fn msg(i: usize, len: usize) -> Vec<u8> {
    (0..len).map(|j| (i * 31 + j * 7) as u8).collect()
}

fn check(got: &[Vec<u8>], want: &[Vec<u8>], what: &str) {
    let first_bad = got.iter().zip(want).position(|(g, w)| g != w);
    assert!(
        first_bad.is_none() && got.len() == want.len(),
        "{what}: delivered {} of {}, first difference at {first_bad:?}",
        got.len(),
        want.len()
    );
}

/// Send `want` from A at a steady pace (one message per `gap`) while
/// running, so a cut lands mid-stream.
fn stream(r: &mut Rails, want: &[Vec<u8>], gap: Duration) {
    for m in want {
        r.send(m).unwrap();
        r.run(gap);
    }
}

/// The state of A's path to B over `rail`.
fn path_state(r: &Rails, rail: u8) -> PathState {
    r.net.ep(A).paths(B).iter().find(|p| p.rail == rail).unwrap().state
}

#[test]
fn a_rail_cut_mid_stream_fails_over_with_nothing_lost_or_repeated() {
    let mut r = Rails::new(Config::default());
    let cut_at = r.now() + Duration::from_millis(20);
    r.rule(move |t, rail| !(rail == 0 && t >= cut_at));
    let want: Vec<_> = (0..400).map(|i| msg(i, 100 + i * 37 % 3000)).collect();
    stream(&mut r, &want, Duration::from_micros(100));
    r.run(Duration::from_secs(1));
    check(&r.drain_b(), &want, "rail 0 cut");
    assert_eq!(path_state(&r, 0), PathState::Down);
    assert_eq!(path_state(&r, 1), PathState::Active);
    assert!(r.a().stats().failovers >= 1);
    let events = r.events_a();
    let at = |to: PathState| {
        events.iter().find_map(|e| match e {
            Event::PathChanged { rail: 0, to: t, at, .. } if *t == to => Some(*at),
            _ => None,
        })
    };
    let (suspect, down) = (at(PathState::Suspect).expect("suspect"), at(PathState::Down).expect("down"));
    // Data leaves rail 0 once it is suspect (2 ms of silence); what it
    // still carried goes again once it is down (5 ms).
    assert!(suspect - cut_at <= Duration::from_millis(3), "suspect {:?} after the cut", suspect - cut_at);
    assert!(down - cut_at <= Duration::from_millis(6), "down {:?} after the cut", down - cut_at);
    // The failover itself: from the last ACK for data over rail 0 to the
    // first for data over rail 1, under the 10 ms bar (three 10 ms
    // timeslices in Trahay et al. [NMAD] section 4).
    let gap = events
        .iter()
        .find_map(|e| match e {
            Event::FailedOver { failover, .. } if failover.from == 0 && failover.to == 1 => {
                Some(failover.gap)
            }
            _ => None,
        })
        .expect("a failover from rail 0 to rail 1");
    assert!(gap < Duration::from_millis(10), "failover took {gap:?}");
    eprintln!(
        "virtual-time failover: {gap:?} (suspect {:?}, down {:?} after the cut)",
        suspect - cut_at,
        down - cut_at
    );
    for seq in 0..want.len() as u64 {
        assert_eq!(r.a().message_state(MessageId { peer: B, seq }), MessageState::Delivered);
    }
    // Data moved to rail 1, the cut rail's unacknowledged segments with it.
    let info = r.net.ep(A).paths(B);
    assert!(info[1].stats.data_frames_sent > 0, "{info:?}");
    assert!(info[1].stats.retransmits > 0, "{info:?}");
}

#[test]
fn both_rails_cut_one_after_the_other_reports_exactly_what_was_lost() {
    let config = Config { abandon_after: Duration::from_millis(300), ..Config::default() };
    let mut r = Rails::new(config);
    let (cut0, cut1) = (r.now() + Duration::from_millis(10), r.now() + Duration::from_millis(30));
    r.rule(move |t, rail| t < if rail == 0 { cut0 } else { cut1 });
    let want: Vec<_> = (0..500).map(|i| msg(i, 2000)).collect();
    stream(&mut r, &want, Duration::from_micros(100));
    r.run(Duration::from_secs(2));
    let got = r.drain_b();
    // Everything delivered is an exact prefix of what was sent.
    check(&got, &want[..got.len()], "prefix");
    assert_eq!(path_state(&r, 0), PathState::Down);
    assert_eq!(path_state(&r, 1), PathState::Down);
    let failed = r
        .events_a()
        .into_iter()
        .find_map(|e| match e {
            Event::PeerUnreachable { failed } => Some(failed),
            _ => None,
        })
        .expect("peer reported unreachable");
    // Delivered + failed covers every message; the certainly-undelivered
    // part was never delivered; only the in-doubt part may overlap.
    assert_eq!(failed.end, want.len() as u64);
    assert!(failed.first <= got.len() as u64, "a gap between delivered and failed");
    assert!(failed.in_doubt_end >= got.len() as u64, "a certainly-failed message was delivered");
    for seq in 0..failed.first {
        assert_eq!(r.a().message_state(MessageId { peer: B, seq }), MessageState::Delivered);
    }
}

#[test]
fn a_flapping_rail_never_loses_or_repeats_a_message() {
    let mut r = Rails::new(Config::default());
    let start = r.now();
    // Rail 0 is up 15 ms, down 15 ms, over and over.
    r.rule(move |t, rail| rail != 0 || ((t - start).as_millis() / 15).is_multiple_of(2));
    let want: Vec<_> = (0..1500).map(|i| msg(i, 64 + i % 1500)).collect();
    stream(&mut r, &want, Duration::from_micros(80));
    r.run(Duration::from_secs(2));
    check(&r.drain_b(), &want, "flapping rail 0");
    let changes = r.events_a().iter().filter(|e| matches!(e, Event::PathChanged { rail: 0, .. })).count();
    assert!(changes >= 4, "rail 0 changed state only {changes} times");
    assert!(r.a().stats().failovers >= 2);
}

#[test]
fn a_rail_dropping_30_percent_is_repaired_not_failed() {
    let mut r = Rails::new(Config::default());
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    r.rule(move |_, rail| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        rail != 0 || x % 100 >= 30
    });
    let want: Vec<_> = (0..600).map(|i| msg(i, 1000 + i % 700)).collect();
    stream(&mut r, &want, Duration::from_micros(100));
    r.run(Duration::from_secs(2));
    check(&r.drain_b(), &want, "30% loss on rail 0");
    assert!(r.a().stats().retransmits > 0);
}

#[test]
fn a_restarted_peer_gets_fresh_sequence_numbers_on_any_rail() {
    let mut r = Rails::new(Config::default());
    let want: Vec<_> = (0..50).map(|i| msg(i, 300)).collect();
    stream(&mut r, &want, Duration::from_micros(100));
    r.run(Duration::from_millis(100));
    check(&r.drain_b(), &want, "before restart");
    r.events_a();
    // B restarts with a new incarnation; rail 0 dies at the same moment.
    r.net.replace(endpoint(Config::default(), B, 2, A));
    let now = r.now();
    r.rule(move |t, rail| rail != 0 || t < now);
    let again: Vec<_> = (100..150).map(|i| msg(i, 300)).collect();
    stream(&mut r, &again, Duration::from_micros(100));
    r.run(Duration::from_secs(1));
    // Messages sent before A learned of the restart went to the old life
    // and are reported failed; every other one arrives, once, in order.
    let failed: Vec<_> = r
        .events_a()
        .into_iter()
        .filter_map(|e| match e {
            Event::PeerRestarted { failed, .. } => Some(failed),
            _ => None,
        })
        .collect();
    assert!(!failed.is_empty(), "the restart was noticed");
    let kept: Vec<_> = (50..100u64)
        .zip(&again)
        .filter(|(seq, _)| !failed.iter().any(|f| f.contains(*seq)))
        .map(|(_, m)| m.clone())
        .collect();
    assert!(kept.len() >= 40, "only {} of 50 survived the restart", kept.len());
    check(&r.drain_b(), &kept, "after restart");
    assert_eq!(path_state(&r, 1), PathState::Active);
}

#[test]
fn an_idle_backup_that_dies_is_noticed_and_comes_back() {
    let mut r = Rails::new(Config::default());
    let (dead_from, dead_until) = (r.now() + Duration::from_millis(5), r.now() + Duration::from_millis(200));
    r.rule(move |t, rail| rail != 1 || t < dead_from || t >= dead_until);
    let want: Vec<_> = (0..100).map(|i| msg(i, 500)).collect();
    stream(&mut r, &want, Duration::from_millis(1));
    r.run(Duration::from_millis(100));
    assert_eq!(path_state(&r, 1), PathState::Down, "the idle backup's probes went unanswered");
    assert_eq!(path_state(&r, 0), PathState::Active);
    assert_eq!(r.a().stats().failovers, 0, "a backup carrying nothing moves nothing");
    r.run(Duration::from_millis(300));
    assert_eq!(path_state(&r, 1), PathState::Active, "probes found the backup again");
    check(&r.drain_b(), &want, "backup died and came back");
    let rtt = r.net.ep(A).paths(B)[1].rtt.expect("probes measured the backup");
    assert!(rtt >= LATENCY * 2, "{rtt:?}");
}

#[test]
fn striping_uses_every_healthy_rail_and_survives_a_cut() {
    let config = Config { rail_policy: RailPolicy::Stripe, ..Config::default() };
    let mut r = Rails::new(config);
    let cut_at = r.now() + Duration::from_millis(30);
    r.rule(move |t, rail| !(rail == 1 && t >= cut_at));
    let want: Vec<_> = (0..600).map(|i| msg(i, 1400)).collect();
    stream(&mut r, &want, Duration::from_micros(100));
    r.run(Duration::from_secs(1));
    check(&r.drain_b(), &want, "striped, rail 1 cut");
    let info = r.net.ep(A).paths(B);
    assert!(info[0].stats.data_frames_sent > 100 && info[1].stats.data_frames_sent > 100, "{info:?}");
    assert_eq!(info[1].state, PathState::Down);
}

#[test]
fn one_rail_behaves_as_before_no_probes() {
    let mut a = Endpoint::new(Config::default(), A, 1).unwrap();
    a.add_peer(B).unwrap();
    a.send(Instant::from_nanos(1), B, b"x").unwrap();
    let mut buf = vec![0u8; 2048];
    let t = a.poll_transmit(Instant::from_nanos(1), &mut buf).unwrap();
    assert_eq!(t.rail, 0);
    a.handle_timeout(Instant::from_nanos(1) + Duration::from_millis(100));
    assert_eq!(a.stats().probes_sent, 0);
    assert!(a.paths(B).iter().all(|p| p.state == PathState::Active));
}

/// Both rails healthy, but round trips of 3 to 5 ms (a busy machine whose
/// threads are late, or a long path): longer than the configured 2 ms
/// suspect threshold. Silence is judged against the measured timeout, so
/// no healthy path turns suspect and nothing fails over (the fixed
/// threshold flapped both paths all through the run).
#[test]
fn slow_round_trips_do_not_fail_healthy_paths() {
    let mut r = Rails::new(Config::default());
    let mut x = 0x2545_f491_4f6c_dd1du64;
    r.net.link = Box::new(move |_: &mut Sent<'_>| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        Fate::Deliver(Duration::from_micros(1_500 + x % 1_000))
    });
    let now = r.now();
    r.a().connect(now, B).unwrap();
    r.run(Duration::from_millis(50));
    let want: Vec<Vec<u8>> = (0..400).map(|i| msg(i, 1000)).collect();
    stream(&mut r, &want, Duration::from_micros(250));
    r.run(Duration::from_millis(300));
    check(&r.drain_b(), &want, "slow but healthy");
    let changes: u64 = r.net.ep(A).paths(B).iter().map(|p| p.stats.state_changes).sum();
    let s = r.a().stats().clone();
    assert_eq!(changes, 0, "healthy paths changed state: {:?}", r.net.ep(A).paths(B));
    assert_eq!(s.failovers, 0, "{s:?}");
    // The jitter reorders datagrams by up to a millisecond: a resend or
    // two while loss detection learns that, not a failover's window.
    assert!(s.retransmits <= 4, "{s:?}");
}

/// Both rails healthy, but the peer stalls: every 40 ms, for 3 to 6 ms
/// (past the 2 ms suspect and 5 ms down thresholds), nothing it is sent
/// is read and nothing it sends leaves (a descheduled process on a busy
/// machine); then it all moves at once. The peer was silent on every path
/// alike, so no path is judged: no state change, no failover. (Silence on
/// every path past the down threshold from the last path asked, here
/// 7 ms, is the peer unreachable: every path goes down together, and
/// nothing moves; `paths.rs` unit tests.)
#[test]
fn a_stalled_peer_fails_no_healthy_path_over() {
    let mut r = Rails::new(Config::default());
    let stalls: Vec<(Instant, Instant)> = (0..12u64)
        .map(|i| {
            let from = Instant::from_nanos(60_000_000 + i * 40_000_000);
            (from, from + Duration::from_millis(3 + i % 4))
        })
        .collect();
    r.net.link = Box::new(move |s: &mut Sent<'_>| {
        let held = stalls.iter().find(|(from, to)| s.now >= *from && s.now < *to);
        Fate::Deliver(held.map_or(LATENCY, |(_, to)| (*to - s.now) + LATENCY))
    });
    let now = r.now();
    r.a().connect(now, B).unwrap();
    r.run(Duration::from_millis(50));
    let want: Vec<Vec<u8>> = (0..2000).map(|i| msg(i, 1000)).collect();
    stream(&mut r, &want, Duration::from_micros(250));
    r.run(Duration::from_millis(300));
    check(&r.drain_b(), &want, "through stalls");
    let paths = r.net.ep(A).paths(B);
    let changes: u64 = paths.iter().map(|p| p.stats.state_changes).sum();
    let s = r.a().stats().clone();
    assert_eq!(changes, 0, "paths were blamed for the peer's stalls: {paths:?}");
    assert_eq!(s.failovers, 0, "{s:?}");
}

/// A peer that takes in data over rail 0 and a path probe over rail 1 in
/// one batch (its thread was away while both came) answers the data
/// first: its ACK leaves before the probe's answer, so the sender hears
/// the data's path no later than the other and does not blame it.
#[test]
fn a_peer_acknowledges_data_before_answering_a_path_probe_beside_it() {
    let mut r = Rails::new(Config::default());
    let now = r.now();
    r.a().connect(now, B).unwrap();
    r.run(Duration::from_millis(50));
    let mut buf = vec![0u8; 4096];
    let now = r.now();
    r.send(&msg(0, 100)).unwrap();
    let t = r.a().poll_transmit(now, &mut buf).expect("the data");
    assert_eq!(t.rail, 0);
    let data = buf[..t.len].to_vec();
    // Rail 1 idle past its probe interval: A probes it (beside the
    // stream's own timeout probes over rail 0).
    let later = now + Duration::from_millis(25);
    r.a().handle_timeout(later);
    let mut probe = None;
    while let Some(t) = r.a().poll_transmit(later, &mut buf) {
        if t.rail == 1 {
            probe = Some(buf[..t.len].to_vec());
        }
    }
    let probe = probe.expect("rail 1 probed");
    let b = r.b();
    b.handle_datagram_on(later, 0, &data);
    b.handle_datagram_on(later, 1, &probe);
    let answers: Vec<u8> = std::iter::from_fn(|| b.poll_transmit(later, &mut buf)).map(|t| t.rail).collect();
    assert_eq!(answers, [0, 1], "the ACK over rail 0, then the probe's answer over rail 1");
}

/// Rail 0 dies for good while rail 1 holds everything for 12 ms (the peer
/// unreachable on both: every path goes down together and nothing can
/// move). When rail 1 delivers again, what was stranded on rail 0 goes
/// over it at once, not at the stream's timeout backed off through the
/// silence: every message is in within 3 ms of rail 1's return.
#[test]
fn data_stranded_while_every_path_was_down_moves_when_one_returns() {
    let mut r = Rails::new(Config::default());
    let now = r.now();
    r.a().connect(now, B).unwrap();
    r.run(Duration::from_millis(50));
    let cut = r.now() + Duration::from_millis(2);
    let back = cut + Duration::from_millis(12);
    r.net.link = Box::new(move |s: &mut Sent<'_>| match s.rail {
        0 if s.now >= cut => Fate::Drop,
        1 if s.now >= cut && s.now < back => Fate::Deliver((back - s.now) + LATENCY),
        _ => Fate::Deliver(LATENCY),
    });
    let want: Vec<Vec<u8>> = (0..20).map(|i| msg(i, 1000)).collect();
    stream(&mut r, &want, Duration::from_micros(200));
    let mut got = Vec::new();
    let mut done_at = None;
    while r.now() < back + Duration::from_millis(100) {
        r.run(Duration::from_micros(100));
        got.extend(r.drain_b());
        if got.len() == want.len() && done_at.is_none() {
            done_at = Some(r.now());
        }
    }
    check(&got, &want, "after the outage");
    let events = r.events_a();
    let both_down =
        events.iter().filter(|e| matches!(e, Event::PathChanged { to: PathState::Down, .. })).count();
    assert!(both_down >= 2, "both paths went down: {events:?}");
    let done_at = done_at.expect("all delivered");
    assert!(
        done_at <= back + Duration::from_millis(3),
        "delivered {:?} after rail 1 came back",
        done_at - back
    );
    assert!(r.a().stats().failovers >= 1);
}
