//! Applications served by engines over real UDP, real shared memory and
//! the real rendezvous socket: each engine runs its loop on a thread of
//! its own here, exactly as `tether engine` runs it in a process.

#![allow(clippy::disallowed_methods)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use tether_engine::{
    Client, ClientOptions, Engine, EngineError, EngineOptions, EngineStats, SelfTestOptions,
};
use tether_fault::{FaultCounters, FaultPlan};
use tether_proto::{Config, Event, MessageId, MessageState, Received, SendError};

const WAIT: Option<Duration> = Some(Duration::from_secs(10));

/// An engine on its own thread, in a fresh directory under /dev/shm.
struct Running {
    dir: PathBuf,
    addrs: Vec<SocketAddr>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<JoinHandle<(EngineStats, FaultCounters)>>,
    selftest: std::sync::Arc<std::sync::Mutex<tether_engine::SelfTestStats>>,
}

static DIRS: AtomicU64 = AtomicU64::new(0);

fn scratch_dir() -> PathBuf {
    let n = DIRS.fetch_add(1, Ordering::Relaxed);
    PathBuf::from(format!("/dev/shm/tether-test-engine-{}-{n}", std::process::id()))
}

impl Running {
    fn start(rails: usize) -> Self {
        Self::start_in(scratch_dir(), rails, Config::default())
    }

    fn start_in(dir: PathBuf, rails: usize, config: Config) -> Self {
        Self::start_at(dir, vec!["127.0.0.1:0".parse().unwrap(); rails], config)
    }

    fn start_at(dir: PathBuf, binds: Vec<SocketAddr>, config: Config) -> Self {
        Self::start_with(EngineOptions { config, ..EngineOptions::new(dir, binds) })
    }

    fn start_with(options: EngineOptions) -> Self {
        let dir = options.dir.clone();
        let mut engine = Engine::bind(options).unwrap();
        let addrs = engine.rail_addrs();
        let stop = engine.stop_flag();
        let selftest = engine.selftest_watch().unwrap_or_default();
        let thread = std::thread::spawn(move || {
            engine.run().unwrap();
            (engine.stats(), engine.fault_counters())
        });
        Running { dir, addrs, stop, thread: Some(thread), selftest }
    }

    fn selftest(&self) -> tether_engine::SelfTestStats {
        *self.selftest.lock().unwrap()
    }

    fn attach(&self, node: u32) -> Client {
        Client::attach(&self.dir, node, ClientOptions::default()).unwrap()
    }

    fn stop(&mut self) -> EngineStats {
        self.stop_counting().0
    }

    /// Stop; what the engine did and what its fault plan did.
    fn stop_counting(&mut self) -> (EngineStats, FaultCounters) {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().map(|t| t.join().unwrap()).unwrap_or_default()
    }

    /// Stop the engine (its applications see their connection close, as
    /// on a crash) and start a new one on the same directory and ports.
    fn restart(&mut self) {
        self.stop();
        let new = Running::start_at(self.dir.clone(), self.addrs.clone(), Config::default());
        let mut old = std::mem::replace(self, new);
        old.dir = PathBuf::new();
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop();
        if !self.dir.as_os_str().is_empty() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

fn msg(i: usize, len: usize) -> Vec<u8> {
    (0..len).map(|j| (i * 31 + j * 7) as u8).collect()
}

/// Send `count` messages of assorted sizes from `a` to `b` (`b` reading as
/// they come), check every one arrives exact and in order, and every one
/// is reported delivered to the sender.
fn exchange(a: &mut Client, b: &mut Client, count: usize) {
    let sizes = [0, 1, 8, 100, 1400, 1473, 5000, 70_000];
    let mut got = Vec::new();
    for i in 0..count {
        let m = msg(i, sizes[i % sizes.len()]);
        let id = a.send(b.node(), &m, WAIT).unwrap();
        assert_eq!(id, MessageId { peer: b.node(), seq: i as u64 });
        while let Some(d) = b.try_recv().unwrap() {
            got.push(d);
        }
    }
    while got.len() < count {
        got.push(b.recv(WAIT).unwrap());
    }
    for (i, d) in got.iter().enumerate() {
        assert_eq!(d.from, a.node());
        assert!(d.message[..] == msg(i, sizes[i % sizes.len()])[..], "message {i} differs");
    }
    a.flush(WAIT).unwrap();
    for seq in [0, count as u64 / 2, count as u64 - 1] {
        assert_eq!(a.message_state(MessageId { peer: b.node(), seq }), MessageState::Delivered);
    }
    assert_eq!(a.message_state(MessageId { peer: b.node(), seq: count as u64 }), MessageState::Unknown);
}

/// Two applications on one node, one engine: each is an endpoint of its
/// own, and both reach each other through the engine's socket.
#[test]
fn two_applications_on_one_engine_exchange_messages() {
    let engine = Running::start(1);
    let (mut a, mut b) = (engine.attach(1), engine.attach(2));
    assert_eq!(a.engine_pid(), std::process::id());
    a.add_peer_rails(2, &engine.addrs).unwrap();
    b.add_peer_rails(1, &engine.addrs).unwrap();
    exchange(&mut a, &mut b, 2000);
    exchange(&mut b, &mut a, 500);
}

/// Two nodes, each with its engine and two rails: the applications never
/// touch a socket.
#[test]
fn applications_on_two_engines_exchange_messages_over_two_rails() {
    let (e1, e2) = (Running::start(2), Running::start(2));
    let (mut a, mut b) = (e1.attach(10), e2.attach(20));
    a.add_peer_rails(20, &e2.addrs).unwrap();
    b.add_peer_rails(10, &e1.addrs).unwrap();
    exchange(&mut a, &mut b, 3000);
    exchange(&mut b, &mut a, 300);
}

/// What the engine must not take: a node already attached, a region
/// outside its directory, a directory others could write.
/// The engine takes the fault plans embedded endpoints take, on what its
/// rails receive: every kind strikes, and the applications still get every
/// message once, exact and in order (`exchange` checks).
#[test]
fn engines_deliver_exactly_through_the_faults_their_rails_receive() {
    let rules = [
        "drop:p=0.05",
        "duplicate:p=0.05",
        "modify:p=0.05,bits=1",
        "reorder:p=0.05",
        "delay:p=0.02,mean=200us",
    ];
    let start = |seed| {
        let faults = FaultPlan::parse_rules(seed, &rules).unwrap();
        Running::start_with(EngineOptions {
            faults,
            ..EngineOptions::new(scratch_dir(), vec!["127.0.0.1:0".parse().unwrap()])
        })
    };
    let (mut e1, mut e2) = (start(1), start(2));
    let (mut a, mut b) = (e1.attach(1), e2.attach(2));
    a.add_peer_rails(2, &e2.addrs).unwrap();
    b.add_peer_rails(1, &e1.addrs).unwrap();
    exchange(&mut a, &mut b, 600);
    exchange(&mut b, &mut a, 100);
    // The engines report each application's protocol counters to it.
    let counted = wait_for(|| {
        let (sa, sb) = (a.stats(), b.stats());
        (sa.messages_sent >= 600 && sb.messages_delivered >= 600 && sa.messages_delivered >= 100)
            .then_some((sa, sb))
    });
    assert!(counted.0.retransmits > 0, "5% loss was repaired by retransmission: {:?}", counted.0);
    assert!(counted.1.checksum_failures > 0, "corruption was caught: {:?}", counted.1);
    // ... and what their fault plans injected.
    let injected = wait_for(|| Some(b.fault_counters()).filter(|f| f.dropped > 0 && f.modified > 0));
    assert!(injected.receives_seen > 600, "{injected:?}");
    drop((a, b));
    for (side, e) in [("sender", &mut e1), ("receiver", &mut e2)] {
        let (_, f) = e.stop_counting();
        assert!(f.receives_seen > 100, "{side}: {f:?}");
        for (what, n) in [
            ("dropped", f.dropped),
            ("duplicated", f.duplicated),
            ("modified", f.modified),
            ("reordered", f.reordered),
            ("delayed", f.delayed),
        ] {
            assert!(n > 0, "{side}: nothing {what}: {f:?}");
        }
    }
}

#[test]
fn a_fault_plan_the_engine_cannot_apply_is_refused() {
    let plan = FaultPlan::parse_rules(1, &["drop:p=0.1,side=send"]).unwrap();
    let options = EngineOptions {
        faults: plan,
        ..EngineOptions::new(scratch_dir(), vec!["127.0.0.1:0".parse().unwrap()])
    };
    let refused = Engine::bind(options);
    assert!(
        matches!(&refused, Err(EngineError::Faults(why)) if why.contains("receive only")),
        "{:?}",
        refused.err()
    );
}

fn quick_selftest() -> Option<SelfTestOptions> {
    Some(SelfTestOptions { every: Duration::from_millis(10), deadline: Duration::from_millis(200) })
}

/// The self-test probes the rails applications use, small and fragmented
/// probes and ones whose first datagram it withholds, every one delivered
/// exact; it stops probing when the rails go idle.
#[test]
fn the_self_test_probes_rails_in_use_and_stops_when_they_are_idle() {
    let binds = vec!["127.0.0.1:0".parse().unwrap()];
    let start = || {
        Running::start_with(EngineOptions {
            selftest: quick_selftest(),
            ..EngineOptions::new(scratch_dir(), binds.clone())
        })
    };
    let (e1, e2) = (start(), start());
    let (a, b) = (e1.attach(1), e2.attach(2));
    a.add_peer_rails(2, &e2.addrs).unwrap();
    b.add_peer_rails(1, &e1.addrs).unwrap();
    let started = std::time::Instant::now();
    let mut i = 0;
    while started.elapsed() < Duration::from_millis(300) {
        let m = msg(i, [8, 5000, 70_000][i % 3]);
        a.send(2, &m, WAIT).unwrap();
        assert!(b.recv(WAIT).unwrap().message[..] == m[..], "message {i}");
        i += 1;
    }
    std::thread::sleep(Duration::from_millis(100));
    let (busy, idle) = (e1.selftest(), e2.selftest());
    // The idle rail's next turns skip their probe (every 10 ms; waited for
    // rather than slept on: a loaded machine's engine thread ran none in a
    // fixed 100 ms once).
    let later = wait_for(|| Some(e1.selftest()).filter(|t| t.idle_skips > busy.idle_skips));
    for (side, t) in [("sender", busy), ("receiver", idle)] {
        assert!(t.probes >= 5, "{side}: {t:?}");
        assert!(t.passed + 2 >= t.probes, "{side}: probes passed: {t:?}");
    }
    assert!(busy.fragmented > 0 && busy.withheld > 0, "the sender's rail carried large messages: {busy:?}");
    assert_eq!(later.probes, busy.probes, "no probes on an idle rail: {busy:?} then {later:?}");
    assert!(later.idle_skips > busy.idle_skips, "{later:?}");
    // Each application is told what its engine's checking did and took.
    for (side, c, e) in [("sender", &a, &e1), ("receiver", &b, &e2)] {
        let told = wait_for(|| {
            let (told, t) = (c.engine_counters(), e.selftest());
            (told.selftest_probes == t.probes && told.selftest_passed == t.passed).then_some(told)
        });
        assert!(told.selftest_ns > 0 && told.audit_ns > 0, "{side}: {told:?}");
    }
}

/// An engine whose rail stops delivering (its receive path drops
/// everything from 150 ms on, a fault inside the engine) fails its
/// self-test and stops with the reason.
#[test]
fn an_engine_whose_rail_stops_working_fails_its_self_test() {
    let peer = Running::start(1);
    let faults = FaultPlan::parse_rules(1, &["drop:p=1,from=150ms"]).unwrap();
    let options = EngineOptions {
        selftest: quick_selftest(),
        faults,
        ..EngineOptions::new(scratch_dir(), vec!["127.0.0.1:0".parse().unwrap()])
    };
    let dir = options.dir.clone();
    let mut engine = Engine::bind(options).unwrap();
    let addrs = engine.rail_addrs();
    let started = std::time::Instant::now();
    let thread = std::thread::spawn(move || (engine.run(), engine.selftest_stats()));
    let a = Client::attach(&dir, 1, ClientOptions { recovery: None, ..ClientOptions::default() }).unwrap();
    a.add_peer_rails(2, &peer.addrs).unwrap();
    let b = peer.attach(2);
    b.add_peer_rails(1, &addrs).unwrap();
    // Traffic keeps the rail in use until the engine stops.
    while !thread.is_finished() && started.elapsed() < Duration::from_secs(10) {
        let _ = a.send(2, &msg(0, 100), Some(Duration::from_millis(10)));
        std::thread::sleep(Duration::from_millis(2));
    }
    let (result, stats) = thread.join().unwrap();
    let took = started.elapsed();
    assert!(
        matches!(&result, Err(EngineError::SelfTest(why)) if why.contains("not delivered")),
        "{result:?}"
    );
    assert!(stats.passed > 0, "probes passed before the fault: {stats:?}");
    assert!(took < Duration::from_secs(2), "detected in {took:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn attachments_that_cannot_be_are_refused_with_the_reason() {
    let engine = Running::start(1);
    let _a = engine.attach(1);
    match Client::attach(&engine.dir, 1, ClientOptions::default()) {
        Err(EngineError::Refused(why)) => assert!(why.contains("attached already"), "{why}"),
        other => panic!("a second node 1 was not refused: {other:?}"),
    }
    // A region elsewhere, named over the engine's socket by hand.
    let elsewhere = scratch_dir();
    std::fs::create_dir_all(&elsewhere).unwrap();
    let region = elsewhere.join("region.shm");
    let header = tether_shm::ClientHeader {
        version: tether_shm::LAYOUT_VERSION,
        node: 5,
        port: 0,
        pid: std::process::id(),
        incarnation: 1,
        submission_capacity: 1 << 16,
        completion_capacity: 1 << 16,
        streams: 0,
    };
    let _r = tether_shm::ClientRegion::create(&region, header).unwrap();
    let mut conn =
        std::os::unix::net::UnixStream::connect(tether_engine::attach::socket_path(&engine.dir)).unwrap();
    tether_engine::attach::write_request(&mut conn, &region, tether_engine::attach::Mode::Fresh).unwrap();
    let reply = tether_engine::attach::read_reply(&mut conn).unwrap();
    assert!(matches!(&reply, Err(why) if why.contains("not in the engine's directory")), "{reply:?}");
    std::fs::remove_dir_all(&elsewhere).unwrap();
    // Nonsense instead of a request: refused, and the engine goes on.
    let mut conn =
        std::os::unix::net::UnixStream::connect(tether_engine::attach::socket_path(&engine.dir)).unwrap();
    std::io::Write::write_all(&mut conn, &u32::MAX.to_le_bytes()).unwrap();
    assert!(tether_engine::attach::read_reply(&mut conn).unwrap().is_err());
    let _b = engine.attach(2);
    // A directory anyone may write is not an engine's.
    let open = scratch_dir();
    std::fs::create_dir_all(&open).unwrap();
    std::fs::set_permissions(&open, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let refused = Engine::bind(EngineOptions::new(&open, vec!["127.0.0.1:0".parse().unwrap()]));
    assert!(matches!(refused, Err(EngineError::Io(_))), "{refused:?}");
    std::fs::remove_dir_all(&open).unwrap();
    // One engine per directory.
    let twice = Engine::bind(EngineOptions::new(&engine.dir, vec!["127.0.0.1:0".parse().unwrap()]));
    assert!(matches!(twice, Err(EngineError::AlreadyRunning(_))), "{twice:?}");
}

/// An application that goes away without closing is detached, its node
/// free again; one that closes lingers until its messages are settled.
#[test]
fn applications_detach_by_closing_or_by_dying() {
    let mut engine = Running::start(1);
    let (a, b) = (engine.attach(1), engine.attach(2));
    a.add_peer_rails(2, &engine.addrs).unwrap();
    b.add_peer_rails(1, &engine.addrs).unwrap();
    for i in 0..200 {
        a.send(2, &msg(i, 1000), WAIT).unwrap();
    }
    // Closing returns once the engine has settled everything and let go.
    a.close(Duration::from_secs(5)).unwrap();
    for i in 0..200 {
        assert_eq!(b.recv(WAIT).unwrap().message[..], msg(i, 1000)[..]);
    }
    // Dropped without a word, as a killed process would be.
    drop(b);
    let again = wait_for(|| Client::attach(&engine.dir, 2, ClientOptions::default()).ok());
    drop(again);
    let stats = engine.stop();
    assert_eq!(stats.attached, 3);
    assert!(stats.detached >= 2, "{stats:?}");
    assert_eq!(stats.bad_submissions, 0);
}

/// The engine going away, with no recovery asked for, is an error the
/// application sees at once, not a hang.
#[test]
fn an_application_learns_its_engine_is_gone() {
    let mut engine = Running::start(1);
    let options = ClientOptions { recovery: None, ..ClientOptions::default() };
    let a = Client::attach(&engine.dir, 1, options).unwrap();
    a.add_peer_rails(2, &engine.addrs).unwrap();
    engine.stop();
    let started = std::time::Instant::now();
    assert!(matches!(a.recv(Some(Duration::from_secs(5))), Err(EngineError::EngineGone)));
    assert!(started.elapsed() < Duration::from_secs(1), "noticed in {:?}", started.elapsed());
}

/// A peer that never answers: the sender's messages fail with the exact
/// report, through the completion ring.
#[test]
fn failures_reach_the_application_exactly() {
    let config = Config { abandon_after: Duration::from_millis(300), ..Config::default() };
    let engine = Running::start_in(scratch_dir(), 1, config);
    let a = engine.attach(1);
    // Nobody listens there.
    let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    a.add_peer_rails(9, &[silent.local_addr().unwrap()]).unwrap();
    for i in 0..10 {
        a.send(9, &msg(i, 100), WAIT).unwrap();
    }
    let event = wait_for(|| a.poll_event().unwrap());
    match event {
        Event::PeerUnreachable { failed } => assert_eq!((failed.peer, failed.first, failed.end), (9, 0, 10)),
        other => panic!("expected PeerUnreachable, got {other:?}"),
    }
    let state = a.message_state(MessageId { peer: 9, seq: 3 });
    assert_eq!(state, MessageState::Failed(tether_proto::FailReason::PeerUnreachable));
    assert_eq!(a.unsettled(), 0);
}

fn wait_for<T>(mut f: impl FnMut() -> Option<T>) -> T {
    for _ in 0..1000 {
        if let Some(t) = f() {
            return t;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("not within 10 s");
}

/// An engine dies mid-stream (the sender's, then the receiver's) and a new
/// one takes its place on the same ports: from the applications' backups
/// it resumes every stream where it was. Every message arrives once, in
/// order, every one is reported delivered, and each application is told of
/// the outage.
#[test]
fn a_new_engine_resumes_where_the_dead_one_stopped() {
    for (restart_sender, at) in [(true, 1000), (false, 1000), (false, 0), (true, 0), (false, 3), (false, 200)]
    {
        let (mut e1, mut e2) = (Running::start(1), Running::start(1));
        let (mut a, mut b) = (e1.attach(1), e2.attach(2));
        a.add_peer_rails(2, &e2.addrs).unwrap();
        b.add_peer_rails(1, &e1.addrs).unwrap();
        let sizes = [8, 3000, 70_000, 1];
        let count = 3000;
        let mut got = Vec::new();
        for i in 0..count {
            // One thread plays both applications: while it waits for room
            // it reads, as the receiving engine acknowledges only what its
            // application took (and the sender's buffer holds a few MiB,
            // not the whole test).
            let started = std::time::Instant::now();
            while let Err(e) = a.send(2, &msg(i, sizes[i % 4]), Some(Duration::from_millis(1))) {
                assert!(
                    matches!(e, EngineError::Timeout) && started.elapsed() < WAIT.unwrap(),
                    "send {i}: {e}"
                );
                while let Some(d) = b.try_recv().unwrap() {
                    got.push(d);
                }
            }
            if i == at {
                if restart_sender {
                    e1.restart()
                } else {
                    e2.restart()
                }
            }
            while let Some(d) = b.try_recv().unwrap() {
                got.push(d);
            }
        }
        while got.len() < count {
            got.push(b.recv(WAIT).unwrap());
        }
        for (i, d) in got.iter().enumerate() {
            assert!(
                d.message[..] == msg(i, sizes[i % 4])[..],
                "message {i} differs (sender restarted: {restart_sender})"
            );
        }
        a.flush(WAIT).unwrap();
        for seq in 0..count as u64 {
            assert_eq!(a.message_state(MessageId { peer: 2, seq }), MessageState::Delivered, "message {seq}");
        }
        let restarted = if restart_sender { &mut a } else { &mut b };
        let recovered = std::iter::from_fn(|| restarted.poll_event().unwrap())
            .find(|e| matches!(e, Event::EngineRecovered { .. }));
        assert!(recovered.is_some(), "the application was told of the outage");
        assert!(b.try_recv().unwrap().is_none(), "nothing more, nothing twice");
    }
}

/// Two applications on one engine: a direct path (docs/ENGINE.md, "The
/// direct path"). Messages of every size both ways arrive exactly, in
/// order, each reported delivered, and none of them went through the
/// engine's core (it sent no datagram for them).
#[test]
fn applications_on_one_engine_talk_by_the_direct_path() {
    let e = Running::start(1);
    let (a, b) = (e.attach(1), e.attach(2));
    a.add_peer_rails(2, &e.addrs).unwrap();
    // The other side learns of the path without asking; asking is fine too.
    b.add_peer_rails(1, &e.addrs).unwrap();
    let sizes = [0, 1, 8, 100, 1000, 70_000, a.max_message_len() - 8];
    let mut ids = Vec::new();
    for (i, &len) in sizes.iter().cycle().take(200).enumerate() {
        ids.push(a.send(2, &msg(i, len), WAIT).unwrap());
        let d = b.recv(WAIT).unwrap();
        assert_eq!((d.from, &d.message[..]), (1, &msg(i, len)[..]), "message {i}");
        b.send(1, &msg(i + 1000, len), WAIT).unwrap();
        assert_eq!(&a.recv(WAIT).unwrap().message[..], &msg(i + 1000, len)[..], "reply {i}");
    }
    a.flush(WAIT).unwrap();
    for id in ids {
        assert_eq!(a.message_state(id), MessageState::Delivered, "{id:?}");
    }
    std::thread::sleep(Duration::from_millis(100));
    for c in [&a, &b] {
        let s = c.stats();
        assert_eq!(
            (s.messages_sent, s.datagrams_sent),
            (0, 0),
            "the engine's core carried none of it: {s:?}"
        );
    }
}

/// Send `count` messages of assorted sizes from `a` to `b` with the batch
/// API, interleaved with single sends, in batches of assorted lengths;
/// `b` takes them with `recv_batch` into a buffer smaller than a batch
/// (so batches are split between calls and what does not fit waits) and
/// with `recv`. Every one arrives exact, in order, once, with the ids the
/// sends returned, and is reported delivered.
fn exchange_batches(a: &Client, b: &Client, count: usize) {
    let sizes = [0, 1, 8, 100, 1400, 5000];
    let lens = [1, 7, 64, 300, 2];
    let (from, to) = (a.node(), b.node());
    std::thread::scope(|s| {
        let receiver = s.spawn(|| {
            let mut got = Received::new(50, 20_000);
            let mut i = 0;
            while i < count {
                // Now and then one at a time, between batches.
                if i % 5 == 3 {
                    let d = b.recv(WAIT).unwrap();
                    assert_eq!((d.from, &d.message[..]), (from, &msg(i, sizes[i % sizes.len()])[..]), "{i}");
                    i += 1;
                    continue;
                }
                let n = b.recv_batch(&mut got, WAIT).unwrap();
                assert!(n >= 1 && n == got.len() && n <= 50, "{n}");
                for (who, m) in got.iter() {
                    assert_eq!((who, m), (from, &msg(i, sizes[i % sizes.len()])[..]), "message {i}");
                    i += 1;
                }
            }
        });
        let mut i = 0;
        let mut k = 0;
        while i < count {
            k += 1;
            if k % 4 == 0 {
                let id = a.send(to, &msg(i, sizes[i % sizes.len()]), WAIT).unwrap();
                assert_eq!(id.seq, i as u64);
                i += 1;
                continue;
            }
            let n = lens[k % lens.len()].min(count - i);
            let batch: Vec<Vec<u8>> = (i..i + n).map(|j| msg(j, sizes[j % sizes.len()])).collect();
            let sent = a.send_batch(to, &batch, WAIT).unwrap();
            assert_eq!(sent.first, MessageId { peer: to, seq: i as u64 });
            assert_eq!(sent.count, n, "no wait ran out");
            i += n;
        }
        receiver.join().unwrap();
    });
    a.flush(WAIT).unwrap();
    for seq in [0, count as u64 / 2, count as u64 - 1] {
        assert_eq!(a.message_state(MessageId { peer: to, seq }), MessageState::Delivered);
    }
    assert_eq!(a.message_state(MessageId { peer: to, seq: count as u64 }), MessageState::Unknown);
    assert!(b.try_recv().unwrap().is_none(), "nothing more");
}

/// An engine whose application is ahead of the network (its peer never
/// acknowledges: the core's send buffer is full, the submission ring
/// behind it too) sleeps until an ACK or a timer could change that: it
/// does not turn over the submissions waiting behind the stalled one.
#[test]
fn an_engine_stalled_on_a_full_send_buffer_sleeps() {
    let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let dir = scratch_dir();
    let options = EngineOptions {
        spin: Duration::ZERO,
        selftest: None,
        ..EngineOptions::new(dir, vec!["127.0.0.1:0".parse().unwrap()])
    };
    let mut e = Running::start_with(options);
    // Not waiting for a new engine once this one is stopped.
    let a = Client::attach(&e.dir, 1, ClientOptions { recovery: None, ..ClientOptions::default() }).unwrap();
    a.add_peer_rails(2, &[silent.local_addr().unwrap()]).unwrap();
    let m = vec![7u8; 64 * 1024];
    let mut sent = 0;
    while a.send(2, &m, Some(Duration::from_millis(20))).is_ok() {
        sent += 1;
        assert!(sent < 100_000, "the send buffer never filled");
    }
    std::thread::sleep(Duration::from_millis(500));
    let stats = e.stop();
    // Spinning, an engine turns about a million times a second; asleep,
    // it wakes for its retransmission timer (backing off) and its idle
    // slice, and for the sends that filled the buffer.
    assert!(stats.turns < 20_000 + 10 * sent, "{} turns for {sent} messages and 0.5 s stalled", stats.turns);
    drop(a);
}

/// The batch API between two applications on one engine (the direct
/// path, batch records) and between two engines (a submission each): the
/// same messages, exact and in order.
#[test]
fn batches_arrive_exactly_by_the_direct_path_and_through_engines() {
    let e = Running::start(1);
    let (a, b) = (e.attach(1), e.attach(2));
    a.add_peer_rails(2, &e.addrs).unwrap();
    b.add_peer_rails(1, &e.addrs).unwrap();
    exchange_batches(&a, &b, 5000);
    exchange_batches(&b, &a, 1000);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(a.stats().messages_sent, 0, "the direct path carried them");
    let (e1, e2) = (Running::start(1), Running::start(1));
    let (c, d) = (e1.attach(10), e2.attach(20));
    c.add_peer_rails(20, &e2.addrs).unwrap();
    d.add_peer_rails(10, &e1.addrs).unwrap();
    exchange_batches(&c, &d, 3000);
    // A batch with one message too large is refused whole.
    let too_large = vec![0u8; c.max_message_len() + 1];
    let err = c.send_batch(20, &[&b"fine"[..], &too_large[..]], WAIT).unwrap_err();
    assert!(matches!(err, EngineError::Send(SendError::MessageTooLarge { .. })), "{err}");
    assert_eq!(c.send(20, b"next", WAIT).unwrap().seq, 3000, "nothing of it was sent");
    assert_eq!(&d.recv(WAIT).unwrap().message[..], b"next");
}

/// The direct path's other side goes (detaches with messages it never
/// took): what it took is delivered, the rest fails exactly, at once.
/// When it attaches again (a new life), a new path carries new messages.
#[test]
fn a_direct_peer_that_goes_fails_exactly_what_it_did_not_take() {
    let e = Running::start(1);
    let a = e.attach(1);
    let b = e.attach(2);
    a.add_peer_rails(2, &e.addrs).unwrap();
    let first: Vec<_> = (0..5).map(|i| a.send(2, &msg(i, 100), WAIT).unwrap()).collect();
    for i in 0..5 {
        assert_eq!(&b.recv(WAIT).unwrap().message[..], &msg(i, 100)[..]);
    }
    a.flush(WAIT).unwrap();
    let rest: Vec<_> = (5..12).map(|i| a.send(2, &msg(i, 100), WAIT).unwrap()).collect();
    drop(b);
    let event = a.next_event(WAIT).unwrap();
    let Event::PeerUnreachable { failed } = event else { panic!("{event:?}") };
    assert_eq!((failed.peer, failed.first, failed.end, failed.in_doubt_end), (2, 5, 12, 5));
    for id in &first {
        assert_eq!(a.message_state(*id), MessageState::Delivered);
    }
    for id in &rest {
        assert_eq!(a.message_state(*id), MessageState::Failed(tether_proto::FailReason::PeerUnreachable));
    }
    // Sent while it is gone: failed at once.
    let lone = a.send(2, b"nobody", WAIT).unwrap();
    assert_eq!(a.message_state(lone), MessageState::Failed(tether_proto::FailReason::PeerUnreachable));
    assert_eq!(a.unsettled(), 0);
    // A new life of node 2: a new path, and what is sent now arrives.
    let b = e.attach(2);
    let id = wait_for(|| {
        let id = a.send(2, b"again", WAIT).unwrap();
        (a.message_state(id) != MessageState::Failed(tether_proto::FailReason::PeerUnreachable)).then_some(id)
    });
    assert_eq!(&b.recv(WAIT).unwrap().message[..], b"again");
    assert_eq!(a.tracker().wait_settled(id, WAIT).unwrap(), MessageState::Delivered);
}

/// The engine dies while two of its applications talk by a direct path:
/// the path goes on without it (messages sent during the outage arrive),
/// and the new engine adopts it: every message once, in order.
#[test]
fn a_direct_path_outlives_its_engine() {
    let mut e = Running::start(1);
    let (a, b) = (e.attach(1), e.attach(2));
    a.add_peer_rails(2, &e.addrs).unwrap();
    b.add_peer_rails(1, &e.addrs).unwrap();
    let mut sent = 0;
    for _ in 0..3 {
        for _ in 0..50 {
            a.send(2, &msg(sent, 64), WAIT).unwrap();
            sent += 1;
        }
        e.restart();
    }
    for i in 0..sent {
        assert_eq!(&b.recv(WAIT).unwrap().message[..], &msg(i, 64)[..], "message {i}");
    }
    a.flush(WAIT).unwrap();
    assert!(b.try_recv().unwrap().is_none(), "nothing twice");
    assert_eq!(a.unsettled(), 0);
}
