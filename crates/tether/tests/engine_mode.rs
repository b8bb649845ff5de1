//! The `Endpoint` API with the protocol in an engine (`Builder::engine`):
//! the same calls as an embedded endpoint, over real engines (each on a
//! thread here, as `tether engine` runs one in a process), real shared
//! memory and real UDP. An engine that stops is replaced under the
//! endpoint, which goes on with nothing lost.

#![allow(clippy::disallowed_methods)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use tether::faults::FaultPlan;
use tether::{Endpoint, Error, Event, MessageState, SendError};
use tether_attach::EngineError;
use tether_engine::{Engine, EngineOptions};

const WAIT: Option<Duration> = Some(Duration::from_secs(10));

struct Running {
    dir: PathBuf,
    addrs: Vec<SocketAddr>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Running {
    fn start(name: &str) -> Self {
        let dir = PathBuf::from(format!("/dev/shm/tether-test-mode-{}-{name}", std::process::id()));
        Self::start_at(dir, vec!["127.0.0.1:0".parse().unwrap()])
    }

    fn start_at(dir: PathBuf, binds: Vec<SocketAddr>) -> Self {
        let mut engine = Engine::bind(EngineOptions::new(&dir, binds)).unwrap();
        let (addrs, stop) = (engine.rail_addrs(), engine.stop_flag());
        let thread = std::thread::spawn(move || engine.run().unwrap());
        Running { dir, addrs, stop, thread: Some(thread) }
    }

    fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }

    /// Stop the engine (its applications see their connection close, as
    /// on a crash) and start another on the same directory and ports.
    fn restart(&mut self) {
        self.stop();
        let new = Running::start_at(self.dir.clone(), self.addrs.clone());
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

fn msg(i: usize) -> Vec<u8> {
    let len = [8, 700, 5000][i % 3];
    (0..len).map(|j| (i * 7 + j * 13) as u8).collect()
}

/// Batches from `a` (node 1) to `to`, taken by `b`'s `recv_batch` into
/// a 40-message buffer: each message once, in order, exact, its id
/// delivered.
fn batches_arrive(a: &Endpoint, b: &Endpoint, to: tether::NodeId, n: usize, path: &str) {
    std::thread::scope(|s| {
        s.spawn(|| {
            let (mut out, mut i) = (tether::Received::new(40, 1 << 16), 0);
            while i < n {
                b.recv_batch(&mut out, WAIT).unwrap_or_else(|e| panic!("{path}: message {i}: {e}"));
                for (from, m) in out.iter() {
                    assert_eq!((from, m), (1, &msg(i)[..]), "{path}: message {i}");
                    i += 1;
                }
            }
        });
        let (mut i, mut ids) = (0, Vec::new());
        for k in 1.. {
            if i == n {
                break;
            }
            let batch: Vec<Vec<u8>> = (i..n.min(i + k % 90 + 1)).map(msg).collect();
            let sent = a.send_batch(to, &batch, WAIT).unwrap();
            assert_eq!(sent.count, batch.len(), "{path}");
            ids.extend((0..sent.count).map(|j| sent.id(j).unwrap()));
            i += batch.len();
        }
        a.flush(WAIT).unwrap();
        for id in ids {
            assert_eq!(a.message_state(id), MessageState::Delivered, "{path}: {id:?}");
        }
    });
    assert!(b.try_recv().is_none(), "{path}: nothing twice");
}

/// The batch calls of an attached endpoint: through two engines, and
/// between two applications on one engine (the direct path, where a
/// batch is packed into ring records).
#[test]
fn attached_endpoints_send_and_receive_batches() {
    let (e1, e2) = (Running::start("batch-a"), Running::start("batch-b"));
    let a = Endpoint::builder(1).engine(&e1.dir).peer(2, e2.addrs[0]).peer(3, e1.addrs[0]).build().unwrap();
    let b = Endpoint::builder(2).engine(&e2.dir).peer(1, e1.addrs[0]).build().unwrap();
    let c = Endpoint::builder(3).engine(&e1.dir).peer(1, e1.addrs[0]).build().unwrap();
    batches_arrive(&a, &b, 2, 2000, "through engines");
    batches_arrive(&a, &c, 3, 3000, "direct path");
    for ep in [a, b, c] {
        ep.close(Duration::from_secs(1)).unwrap();
    }
}

#[test]
fn endpoints_attached_to_engines_deliver_through_an_engine_restart() {
    let (e1, mut e2) = (Running::start("a"), Running::start("b"));
    let a = Endpoint::builder(1).engine(&e1.dir).peer(2, e2.addrs[0]).build().unwrap();
    let b = Endpoint::builder(2).engine(&e2.dir).peer(1, e1.addrs[0]).build().unwrap();
    assert_eq!(a.node(), 1);
    let n = 600;
    std::thread::scope(|s| {
        // One endpoint, two threads: b's receiving thread blocks in recv
        // while its other thread sends, as with an embedded endpoint.
        let receiver = s.spawn(|| {
            for i in 0..n {
                let d = b.recv(WAIT).unwrap_or_else(|e| panic!("message {i}: {e}"));
                assert_eq!((d.from, &d.message[..]), (1, &msg(i)[..]), "message {i}");
            }
        });
        let replies = b.send_blocking(1, b"from b while receiving", WAIT).unwrap();
        let mut handles = Vec::new();
        for i in 0..n {
            handles.push(a.send_blocking(2, &msg(i), WAIT).unwrap());
            if i == n / 2 {
                // The receiving side's engine goes; another takes over.
                e2.restart();
            }
        }
        receiver.join().unwrap();
        assert_eq!(replies.wait(WAIT).unwrap(), MessageState::Delivered);
        for (i, h) in handles.iter().enumerate() {
            assert_eq!(h.wait(WAIT).unwrap(), MessageState::Delivered, "message {i}");
            assert_eq!(a.message_state(h.id().unwrap()), MessageState::Delivered);
        }
    });
    assert_eq!(a.recv(WAIT).unwrap().message[..], b"from b while receiving"[..]);
    a.flush(WAIT).unwrap();
    assert!(b.try_recv().is_none(), "nothing twice");
    let told = std::iter::from_fn(|| b.poll_event()).any(|e| matches!(e, Event::EngineRecovered { .. }));
    assert!(told, "the endpoint was told its engine was replaced");
    // The engine reports the endpoint's protocol counters to it.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while a.stats().messages_acked < 600 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let stats = a.stats();
    assert!(stats.messages_acked >= 600 && stats.datagrams_sent >= 600, "{stats:?}");
    a.close(Duration::from_secs(1)).unwrap();
    b.close(Duration::from_secs(1)).unwrap();
}

#[test]
fn what_the_engine_owns_is_refused_and_errors_are_typed() {
    let e = Running::start("c");
    let bind = Endpoint::builder(1).engine(&e.dir).bind("127.0.0.1:0".parse().unwrap()).build();
    assert!(matches!(bind, Err(Error::EngineOwns { .. })), "{bind:?}");
    let faults = Endpoint::builder(1).engine(&e.dir).faults(FaultPlan::default()).build();
    assert!(matches!(faults, Err(Error::EngineOwns { .. })), "{faults:?}");
    // No engine: the error names the directory and how to start one,
    // and nothing is left in it.
    let none = PathBuf::from("/dev/shm/tether-test-mode-nobody-serves-this");
    let nobody = Endpoint::builder(1).engine(&none).build();
    assert!(
        matches!(nobody, Err(Error::Engine(EngineError::NoEngine { ref dir })) if *dir == none),
        "{nobody:?}"
    );
    let said = nobody.unwrap_err().to_string();
    assert!(said.contains(&format!("tether engine --dir {}", none.display())), "{said}");
    // A socket left by an engine that died: the same, not "connection refused".
    let stale = std::env::temp_dir().join(format!("tether-stale-engine-{}", std::process::id()));
    std::fs::create_dir_all(&stale).unwrap();
    drop(std::os::unix::net::UnixListener::bind(stale.join("engine.sock")).unwrap());
    let left = Endpoint::builder(1).engine(&stale).build();
    assert!(matches!(left, Err(Error::Engine(EngineError::NoEngine { .. }))), "{left:?}");
    let files: Vec<_> = std::fs::read_dir(&stale).unwrap().map(|f| f.unwrap().file_name()).collect();
    assert_eq!(files, ["engine.sock"], "no region left behind");
    std::fs::remove_dir_all(&stale).unwrap();
    let uid = tether_engine::attach::my_uid();
    assert_eq!(tether::default_engine_dir(), PathBuf::from(format!("/dev/shm/tether-{uid}")));
    // The same peer twice is refused, naming both addresses.
    let twice = Endpoint::builder(1)
        .engine(&e.dir)
        .peer(8, "127.0.0.1:7001".parse().unwrap())
        .peer(8, "127.0.0.1:7002".parse().unwrap())
        .build();
    let said = format!("{}", twice.as_ref().map(|_| ()).unwrap_err());
    assert!(matches!(twice, Err(Error::PeerTwice { node: 8, .. })), "{said}");
    assert!(said.contains("127.0.0.1:7001") && said.contains("127.0.0.1:7002"), "{said}");
    let a = Endpoint::builder(1).engine(&e.dir).build().unwrap();
    assert!(matches!(a.send(9, b"x"), Err(Error::Send(SendError::UnknownPeer(9)))));
    assert!(matches!(a.recv(Some(Duration::from_millis(5))), Err(Error::TimedOut)));
}

/// Serve `ep`'s calls on a thread of the scope until `stop`.
fn serving<'s>(s: &'s std::thread::Scope<'s, '_>, ep: &'s Endpoint, stop: &'s AtomicBool) {
    s.spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            match ep.serve(Some(Duration::from_millis(50))) {
                Ok(()) | Err(Error::TimedOut) => {}
                Err(e) => panic!("serve: {e}"),
            }
        }
    });
}

/// Calls through two engines: the call layer and its log in
/// the applications, the envelopes carried by the engines as marked
/// messages, in one stream with plain messages, each kind to its taker.
/// Both engines are replaced mid-run: every call is answered, every
/// handler ran exactly once, and no envelope reached the application as a
/// message nor a message the call layer.
#[test]
fn calls_through_engines_survive_engine_restarts_and_run_each_handler_once() {
    use std::collections::BTreeMap;
    use std::sync::Mutex;
    use tether::rpc::{CallOptions, CallState};

    let (mut e1, mut e2) = (Running::start("calls-a"), Running::start("calls-b"));
    let a = Endpoint::builder(1).engine(&e1.dir).peer(2, e2.addrs[0]).build().unwrap();
    let b = Endpoint::builder(2).engine(&e2.dir).peer(1, e1.addrs[0]).build().unwrap();
    let ran: Arc<Mutex<BTreeMap<u32, u32>>> = Arc::default();
    let counted = ran.clone();
    b.register_handler(7, move |r| {
        let i = u32::from_le_bytes(r.args[..4].try_into().unwrap());
        *counted.lock().unwrap().entry(i).or_default() += 1;
        let mut reply = r.args.to_vec();
        reply.reverse();
        reply
    })
    .unwrap();
    let (n, stop) = (400u32, AtomicBool::new(false));
    std::thread::scope(|s| {
        serving(s, &b, &stop);
        let options = CallOptions { credit_wait: WAIT, ..CallOptions::default() };
        let mut calls = Vec::new();
        for i in 0..n {
            let mut args = i.to_le_bytes().to_vec();
            args.extend_from_slice(&msg(i as usize));
            calls.push((args.clone(), a.request_with(2, 7, &args, &options).unwrap()));
            // A message between calls, on the same stream.
            a.send_blocking(2, &msg(i as usize), WAIT).unwrap();
            if i == n / 3 {
                e2.restart();
            }
            if i == 2 * n / 3 {
                e1.restart();
            }
        }
        for (args, call) in &calls {
            let out = call.wait(WAIT).unwrap_or_else(|e| panic!("call {:?}: {e}", call.id()));
            assert_eq!(out.state, CallState::PROCESSED, "call {:?}", call.id());
            let mut want = args.clone();
            want.reverse();
            assert_eq!(out.reply.as_deref(), Some(&want[..]), "call {:?}", call.id());
        }
        for i in 0..n as usize {
            let d = b.recv(WAIT).unwrap_or_else(|e| panic!("message {i}: {e}"));
            assert_eq!(&d.message[..], &msg(i)[..], "message {i}: only messages reach recv");
        }
        stop.store(true, Ordering::Relaxed);
    });
    assert!(b.try_recv().is_none(), "nothing more, and no envelope, as a message");
    let ran = ran.lock().unwrap();
    assert_eq!(ran.len(), n as usize, "every handler ran");
    assert!(ran.values().all(|&k| k == 1), "each exactly once: {:?}", ran.iter().find(|(_, &k)| k != 1));
    let (sa, sb) = (a.call_stats().unwrap(), b.call_stats().unwrap());
    println!("calls through engines: {sa:?}\n{sb:?}");
    assert_eq!(sb.server.handlers_started, u64::from(n), "{sb:?}");
    a.close(Duration::from_secs(1)).unwrap();
    b.close(Duration::from_secs(1)).unwrap();
}

/// Wait until `a`'s direct path to `b` on their engine is the one both
/// use: a message sent while the second application attaches goes on a
/// path the pairing then replaces, and fails (reported so), as any
/// message there would. The greetings are taken away.
fn settle_direct(a: &Endpoint, b: &Endpoint) {
    for _ in 0..100 {
        let h = a.send_blocking(b.node(), b"hello", WAIT).unwrap();
        // The direct path is shared memory: a greeting not there at once
        // is lost with the path it went on.
        if let Ok(d) = b.recv(Some(Duration::from_millis(300))) {
            assert_eq!(&d.message[..], b"hello");
            return;
        }
        // Asking for its state has the sender look at what its engine
        // told it (the path that replaced the old one).
        assert_ne!(h.state(), MessageState::Delivered);
    }
    panic!("no direct path settled");
}

/// Calls between two applications of one engine take the direct path
/// (shared memory, no engine in between), marked there as calls.
#[test]
fn calls_between_applications_of_one_engine() {
    let e = Running::start("calls-local");
    let a = Endpoint::builder(1).engine(&e.dir).peer(2, e.addrs[0]).build().unwrap();
    let b = Endpoint::builder(2).engine(&e.dir).peer(1, e.addrs[0]).build().unwrap();
    b.register_handler(3, |r| r.args.iter().map(|x| x.wrapping_add(1)).collect()).unwrap();
    settle_direct(&a, &b);
    let stop = AtomicBool::new(false);
    let mut slow = 0;
    std::thread::scope(|s| {
        serving(s, &b, &stop);
        // Three threads wait on b's client at once: its calls' pump, the
        // serving thread, and this receiver. Each takes in what the
        // others wait for, and rings them: a call must never be left
        // waiting for a doorbell another thread read (a sleep of up to
        // 100 ms).
        let receiver = s.spawn(|| {
            for i in 0..200u8 {
                assert_eq!(&b.recv(WAIT).unwrap().message[..], &[i][..], "message {i}");
            }
        });
        for i in 0..200u8 {
            // Apart enough that every waiter is asleep when the next comes.
            std::thread::sleep(Duration::from_millis(3));
            a.send_blocking(2, &[i], WAIT).unwrap();
            let started = std::time::Instant::now();
            let call = a.request(2, 3, &[i, i, i]).unwrap();
            let out = call.wait(WAIT).unwrap();
            slow += usize::from(started.elapsed() > Duration::from_millis(50));
            let j = i.wrapping_add(1);
            assert_eq!(out.reply.as_deref(), Some(&[j, j, j][..]), "call {i}");
        }
        receiver.join().unwrap();
        stop.store(true, Ordering::Relaxed);
    });
    assert!(b.try_recv().is_none());
    // Over shared memory a call takes microseconds; a lost wake-up 100 ms.
    assert!(slow <= 20, "{slow} of 200 calls took over 50 ms");
}

/// Without a call layer serving it (no calls used, no log), an attached
/// endpoint drops calls' envelopes as they come: the caller's call ends
/// abandoned, never answered, and the application sees only messages.
#[test]
fn an_attached_endpoint_that_uses_no_calls_drops_their_envelopes() {
    use tether::rpc::{CallOptions, Executed, RpcConfig};

    let e = Running::start("calls-none");
    // Few, quick retries: the call's queries go unanswered too.
    let config = RpcConfig { retries: 2, ack_timeout: Duration::from_millis(50), ..RpcConfig::default() };
    let a = Endpoint::builder(1).engine(&e.dir).peer(2, e.addrs[0]).calls(config).build().unwrap();
    let b = Endpoint::builder(2).engine(&e.dir).peer(1, e.addrs[0]).build().unwrap();
    settle_direct(&a, &b);
    let options = CallOptions { deadline: Some(Duration::from_millis(300)), ..CallOptions::default() };
    let call = a.request_with(2, 3, b"x", &options).unwrap();
    a.send_blocking(2, b"after", WAIT).unwrap();
    assert_eq!(&b.recv(WAIT).unwrap().message[..], b"after");
    let out = call.wait(WAIT).unwrap();
    assert!(out.reply.is_none(), "{out:?}");
    // Nothing answered it: whether it ran is unknown to the caller, who
    // could not ask a server that never heard it.
    assert_ne!(out.executed(), Executed::Yes, "{out:?}");
    assert!(b.try_recv().is_none(), "no envelope as a message");
}

/// Closing an attached endpoint with everything settled returns then, not
/// at the end of its linger: after a message and a call, `close(5 s)`
/// returns within a second on each side. (The calls' pump, asleep on the
/// client, is now woken to stop: closes here went from about 100 ms to
/// 6-17 ms. That is not asserted, on a shared machine; the linger is.)
#[test]
fn close_returns_once_settled_not_after_its_linger() {
    for round in 0..3 {
        let (e1, e2) =
            (Running::start(&format!("close-a{round}")), Running::start(&format!("close-b{round}")));
        let a = Endpoint::builder(1).engine(&e1.dir).peer(2, e2.addrs[0]).build().unwrap();
        let b = Endpoint::builder(2).engine(&e2.dir).peer(1, e1.addrs[0]).build().unwrap();
        b.register_handler(3, |r| r.args.to_vec()).unwrap();
        a.send_blocking(2, b"hello", WAIT).unwrap();
        assert_eq!(&b.recv(WAIT).unwrap().message[..], b"hello");
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            serving(s, &b, &stop);
            let out = a.request(2, 3, b"x").unwrap().wait(WAIT).unwrap();
            assert_eq!(out.reply.as_deref(), Some(&b"x"[..]));
            stop.store(true, Ordering::Relaxed);
        });
        for (who, ep) in [("a", a), ("b", b)] {
            let started = std::time::Instant::now();
            ep.close(Duration::from_secs(5)).unwrap();
            let took = started.elapsed();
            assert!(took < Duration::from_secs(1), "round {round}: {who}'s close took {took:?}");
        }
        drop((e1, e2));
    }
}

/// An attached endpoint that closes right after a message came owes its
/// sender the ACK: its engine sends it before it lets the endpoint go
/// (here a long ACK delay makes it wait), so the sender's own close finds
/// the message acknowledged, not unsettled.
#[test]
fn closing_after_a_message_came_still_acknowledges_it() {
    let dir = PathBuf::from(format!("/dev/shm/tether-test-mode-{}-owed-ack", std::process::id()));
    let mut options = EngineOptions::new(&dir, vec!["127.0.0.1:0".parse().unwrap()]);
    options.config.ack_delay = Duration::from_millis(100);
    let mut engine = Engine::bind(options).unwrap();
    let (addrs, stop) = (engine.rail_addrs(), engine.stop_flag());
    let thread = std::thread::spawn(move || engine.run().unwrap());
    let e = Running { dir, addrs, stop, thread: Some(thread) };
    let b = Endpoint::builder(2).engine(&e.dir).build().unwrap();
    let a = Endpoint::builder(1).bind("127.0.0.1:0".parse().unwrap()).peer(2, e.addrs[0]).build().unwrap();
    b.add_peer(1, a.local_addr().unwrap()).unwrap();
    // Three messages, apart: the last one's ACK waits for the delay (a
    // single message was acknowledged at once, and showed nothing; with
    // the engine letting go at once this failed: Lingered { unsettled: 1 }).
    for words in [&b"first words"[..], b"last words"] {
        a.send_blocking(2, words, WAIT).unwrap();
        assert_eq!(&b.recv(WAIT).unwrap().message[..], words);
        std::thread::sleep(Duration::from_millis(300));
    }
    a.send_blocking(2, b"after", WAIT).unwrap();
    assert_eq!(&b.recv(WAIT).unwrap().message[..], b"after");
    b.close(Duration::from_secs(2)).unwrap();
    a.close(Duration::from_secs(1)).expect("the message was acknowledged before the engine let b go");
}

/// A peer refused for its configuration gets no answer, so the refusing
/// side must say why, and on an attached endpoint the refusing side is
/// its engine: the engine passes its core's `Event::Refused` on. Here a
/// peer with a cluster key talks to an engine without one.
#[test]
fn an_attached_endpoint_hears_what_its_engine_refused() {
    let e = Running::start("refused");
    let keyed = tether::Config {
        key: Some(tether::ClusterKey::from_material(&[7u8; 32]).unwrap()),
        ..Default::default()
    };
    let b = Endpoint::builder(2)
        .bind("127.0.0.1:0".parse().unwrap())
        .config(keyed)
        .peer(1, e.addrs[0])
        .build()
        .unwrap();
    let a = Endpoint::builder(1).engine(&e.dir).peer(2, b.local_addr().unwrap()).build().unwrap();
    b.send(1, b"from a keyed peer").unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let refused = loop {
        match a.poll_event() {
            Some(Event::Refused { refused, .. }) => break refused,
            Some(_) => continue,
            None if std::time::Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            None => panic!("no Event::Refused within 10 s"),
        }
    };
    assert!(refused.auth_unexpected > 0, "{refused:?}");
    assert!(refused.causes()[0].contains("a key on the other side only"), "{:?}", refused.causes());
    assert!(a.try_recv().is_none(), "nothing of the refused peer delivered");
}

/// Where the application process of the test below attaches (set for
/// the child it starts: this same test binary, run as that application).
const APP_IN: &str = "TETHER_TEST_RECLAIM_APP_IN";

/// An application in a process of its own (this test binary again),
/// attached to the engine serving `dir`; returned once attached.
fn application_process(dir: &std::path::Path) -> std::process::Child {
    use std::io::BufRead;
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "a_killed_applications_region_is_reclaimed", "--nocapture", "--test-threads", "1"])
        .env(APP_IN, dir)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let out = std::io::BufReader::new(child.stdout.take().unwrap());
    for line in out.lines() {
        if line.unwrap().contains("application attached") {
            return child;
        }
    }
    let _ = child.kill();
    let status = child.wait();
    panic!("the application process never attached: {status:?}");
}

/// The client regions in `dir`.
fn regions(dir: &std::path::Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("client-"))
        .collect()
}

/// Wait up to five seconds for `dir` to hold no client region.
fn regions_gone(dir: &std::path::Path) -> Vec<String> {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !regions(dir).is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    regions(dir)
}

/// An application killed outright (SIGKILL runs no destructor) leaves its
/// region behind. The engine serving it removes it once the process is
/// gone; killed while no engine serves, it is removed by the next engine
/// that starts in the directory.
#[test]
fn a_killed_applications_region_is_reclaimed() {
    if let Some(dir) = std::env::var_os(APP_IN) {
        // The application: attached until killed.
        let _ep = Endpoint::builder(5).engine(PathBuf::from(dir)).build().unwrap();
        println!("application attached");
        std::thread::sleep(Duration::from_secs(60));
        return;
    }
    let mut e = Running::start("reclaim");
    let mut app = application_process(&e.dir);
    assert_eq!(regions(&e.dir).len(), 1, "the application's region is there while it runs");
    app.kill().unwrap();
    app.wait().unwrap();
    assert_eq!(regions_gone(&e.dir), Vec::<String>::new(), "the engine removes a dead application's region");

    // Killed while no engine serves: the next engine's start removes it.
    let mut app = application_process(&e.dir);
    e.stop();
    app.kill().unwrap();
    app.wait().unwrap();
    assert_eq!(regions(&e.dir).len(), 1, "nobody has removed it yet");
    e.restart();
    assert_eq!(
        regions(&e.dir),
        Vec::<String>::new(),
        "the engine's start removes a dead application's region"
    );
}
