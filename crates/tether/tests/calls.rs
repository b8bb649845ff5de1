//! Calls between real endpoints over UDP on loopback: the
//! three-way exchange end to end, its states, the credit, calls and
//! messages on one stream, and calls under every message fault the
//! injector has, each handler run once.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tether::faults::FaultPlan;
use tether::rpc::{AckStatus, CallError, CallOptions, CallState, Executed, RpcConfig};
use tether::{Config, Endpoint, Error, Options};

const WAIT: Option<Duration> = Some(Duration::from_secs(20));
const ECHO: u32 = 1;
const COUNT: u32 = 2;

fn any() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

fn options(rules: &[&str], seed: u64) -> Options {
    let config = Config { rto_min: Duration::from_micros(500), ..Config::default() };
    let calls = RpcConfig { credit: 16, ..RpcConfig::default() };
    Options { config, calls, faults: FaultPlan::parse_rules(seed, rules).unwrap(), ..Options::default() }
}

/// A server's call log in a file of its own, removed when dropped: with a
/// log that outlives the server its answers say exactly whether a call
/// ran (without one, "did not run" becomes "indeterminate").
struct Log(std::path::PathBuf);

impl Log {
    fn new() -> Self {
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        Log(std::env::temp_dir().join(format!("tether-calls-test-{}-{n}.log", std::process::id())))
    }

    fn options(&self) -> tether::rpc::CallLogOptions {
        tether::rpc::CallLogOptions { capacity: 1 << 20, ..tether::rpc::CallLogOptions::new(&self.0) }
    }
}

impl Drop for Log {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Stops a serving thread when dropped, so a failed assertion ends the
/// test instead of leaving the server serving for ever.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

fn pair(rules: &[&str], seed: u64) -> (Endpoint, Endpoint, Log) {
    let log = Log::new();
    let a = Endpoint::udp(1, any(), &[], options(rules, seed)).unwrap();
    let server = Options { call_log: Some(log.options()), ..options(rules, seed) };
    let b = Endpoint::udp(2, any(), &[], server).unwrap();
    a.add_peer(2, b.local_addr().unwrap()).unwrap();
    b.add_peer(1, a.local_addr().unwrap()).unwrap();
    (a, b, log)
}

/// The server's side: an echo handler and a counting one, served by a
/// thread until `stop`; how many times each call's handler ran, by its
/// argument.
struct Server {
    stop: Arc<AtomicBool>,
    runs: Arc<Mutex<Vec<u32>>>,
}

fn serve(ep: &Endpoint) -> Server {
    let runs = Arc::new(Mutex::new(vec![0u32; 100_000]));
    ep.register_handler(ECHO, |r| r.args.to_vec()).unwrap();
    let counts = runs.clone();
    ep.register_handler(COUNT, move |r| {
        let i = u32::from_le_bytes(r.args[..4].try_into().unwrap());
        counts.lock().unwrap()[i as usize] += 1;
        r.args.to_vec()
    })
    .unwrap();
    Server { stop: Arc::new(AtomicBool::new(false)), runs }
}

fn serving(ep: &Endpoint, stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        match ep.serve(Some(Duration::from_millis(20))) {
            Ok(()) | Err(Error::TimedOut) => {}
            Err(e) => panic!("serve: {e}"),
        }
    }
}

#[test]
fn a_call_goes_request_ack_reply_and_says_it_ran() {
    let (a, b, _log) = pair(&[], 1);
    let server = serve(&b);
    std::thread::scope(|s| {
        s.spawn(|| serving(&b, &server.stop));
        let _stop = StopOnDrop(&server.stop);
        let watched = CallOptions { watch: true, ..CallOptions::default() };
        let call = a.request_with(2, ECHO, b"hello", &watched).unwrap();
        let out = call.wait(WAIT).unwrap();
        assert_eq!(out.reply.as_deref(), Some(&b"hello"[..]));
        assert_eq!(out.state, CallState::PROCESSED);
        assert_eq!(out.executed(), Executed::Yes);
        let states: Vec<_> = std::iter::from_fn(|| a.poll_call_event()).map(|e| e.state).collect();
        assert_eq!(states.first(), Some(&CallState::SENT));
        assert_eq!(states.last(), Some(&CallState::PROCESSED));
        // No such handler: a negative acknowledgement, and it never ran.
        let missing = a.request(2, 99, b"").unwrap().wait(WAIT).unwrap();
        assert_eq!(missing.state.ack, AckStatus::NotFound);
        assert_eq!(missing.executed(), Executed::No);
        server.stop.store(true, Ordering::Relaxed);
    });
    let stats = a.call_stats().unwrap();
    assert_eq!((stats.caller.calls, stats.caller.replies, stats.caller.retransmissions), (2, 1, 0));
}

#[test]
fn calls_and_messages_share_the_stream_without_waiting_for_each_other() {
    let (a, b, _log) = pair(&[], 2);
    let server = serve(&b);
    // Messages the application on b never reads sit in b's delivery queue;
    // calls pass them.
    for i in 0..50u32 {
        a.send_blocking(2, &i.to_le_bytes(), WAIT).unwrap();
    }
    std::thread::scope(|s| {
        s.spawn(|| serving(&b, &server.stop));
        let _stop = StopOnDrop(&server.stop);
        for i in 0..20u32 {
            let out = a.request(2, COUNT, &i.to_le_bytes()).unwrap().wait(WAIT).unwrap();
            assert_eq!(out.reply.as_deref(), Some(&i.to_le_bytes()[..]));
        }
        server.stop.store(true, Ordering::Relaxed);
    });
    for i in 0..50u32 {
        assert_eq!(b.recv(WAIT).unwrap().message.to_vec(), i.to_le_bytes(), "message {i}, not an envelope");
    }
    assert!(b.try_recv().is_none());
}

#[test]
fn the_credit_bounds_calls_in_flight_and_can_be_waited_for() {
    let (a, b, _log) = pair(&[], 3);
    let server = serve(&b);
    // Nobody serves yet: 16 calls take every credit.
    let open: Vec<_> = (0..16u32).map(|i| a.request(2, COUNT, &i.to_le_bytes()).unwrap()).collect();
    match a.request(2, COUNT, &99u32.to_le_bytes()) {
        Err(Error::Call(CallError::NoCredit { server: 2, open: 16 })) => {}
        other => panic!("expected no credit, got {other:?}"),
    }
    std::thread::scope(|s| {
        s.spawn(|| serving(&b, &server.stop));
        let _stop = StopOnDrop(&server.stop);
        // Waiting for credit: it comes as the first calls finish.
        let wait = CallOptions { credit_wait: WAIT, ..CallOptions::default() };
        let late = a.request_with(2, COUNT, &16u32.to_le_bytes(), &wait).unwrap();
        assert_eq!(late.wait(WAIT).unwrap().executed(), Executed::Yes);
        for c in &open {
            assert_eq!(c.wait(WAIT).unwrap().executed(), Executed::Yes);
        }
        server.stop.store(true, Ordering::Relaxed);
    });
    let runs = server.runs.lock().unwrap();
    assert!(runs[..17].iter().all(|&n| n == 1), "{:?}", &runs[..17]);
    assert_eq!(runs[99], 0);
}

/// Every message fault on every datagram, both ways: each call answered,
/// each handler run exactly once.
#[test]
fn calls_survive_every_message_fault_and_run_once() {
    for (seed, rule) in
        ["drop:p=0.1", "duplicate:p=0.1", "modify:p=0.05", "reorder:p=0.1", "delay:p=0.1,fixed=2ms"]
            .into_iter()
            .enumerate()
    {
        let (a, b, _log) = pair(&[rule], seed as u64);
        let server = serve(&b);
        let n = 400u32;
        std::thread::scope(|s| {
            s.spawn(|| serving(&b, &server.stop));
            let _stop = StopOnDrop(&server.stop);
            let wait = CallOptions { credit_wait: WAIT, ..CallOptions::default() };
            let calls: Vec<_> =
                (0..n).map(|i| a.request_with(2, COUNT, &i.to_le_bytes(), &wait).unwrap()).collect();
            for (i, c) in calls.iter().enumerate() {
                let out = c.wait(WAIT).unwrap_or_else(|e| panic!("{rule}: call {i}: {e}"));
                assert_eq!(out.reply.as_deref(), Some(&(i as u32).to_le_bytes()[..]), "{rule}: call {i}");
            }
            server.stop.store(true, Ordering::Relaxed);
        });
        let runs = server.runs.lock().unwrap();
        assert!(runs[..n as usize].iter().all(|&r| r == 1), "{rule}: a handler ran other than once");
        let injected = a.fault_counters().total() + b.fault_counters().total();
        assert!(injected > 0, "{rule}: nothing was injected");
    }
}

/// A node the server was not given is refused by the stream below (its
/// datagrams come from an address no peer has): its call never runs,
/// and the server's own peers are served as before.
#[test]
fn a_stranger_s_calls_never_run() {
    let (a, b, _log) = pair(&[], 4);
    let server = serve(&b);
    let quick =
        RpcConfig { retries: 2, max_retry_interval: Duration::from_millis(400), ..RpcConfig::default() };
    let c = Endpoint::udp(3, any(), &[], Options { calls: quick, ..options(&[], 4) }).unwrap();
    c.add_peer(2, b.local_addr().unwrap()).unwrap();
    std::thread::scope(|s| {
        s.spawn(|| serving(&b, &server.stop));
        let _stop = StopOnDrop(&server.stop);
        let deadline = CallOptions { deadline: Some(Duration::from_millis(300)), ..CallOptions::default() };
        let out = c.request_with(2, ECHO, b"let me in", &deadline).unwrap().wait(WAIT).unwrap();
        assert_eq!(out.executed(), Executed::Unknown, "nobody answered it: {:?}", out.state);
        let mine = a.request(2, ECHO, b"mine").unwrap().wait(WAIT).unwrap();
        assert_eq!(mine.reply.as_deref(), Some(&b"mine"[..]));
        server.stop.store(true, Ordering::Relaxed);
    });
    assert_eq!(b.call_stats().unwrap().server.requests, 1, "only a's");
    assert!(b.stats().unknown_source > 0);
}

/// A caller with a log, restarted: the calls its earlier life saw end are
/// there with their outcomes, and those it did not see end are asked about
/// (never run again from here): here, queued at the server and never
/// started, so cancelled.
#[test]
fn a_restarted_caller_learns_how_its_calls_ended() {
    let dir = std::env::temp_dir().join(format!("tether-caller-log-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let log = tether::rpc::CallLogOptions::new(dir.join("caller.log"));
    let server_log = Log::new();
    let b = Endpoint::udp(2, any(), &[], Options { call_log: Some(server_log.options()), ..options(&[], 5) })
        .unwrap();
    let server = serve(&b);
    let life = |incarnation, bind| {
        let o = Options { caller_log: Some(log.clone()), incarnation: Some(incarnation), ..options(&[], 5) };
        let a = Endpoint::udp(1, bind, &[], o).unwrap();
        a.add_peer(2, b.local_addr().unwrap()).unwrap();
        a
    };
    let a = life(100, any());
    let addr = a.local_addr().unwrap();
    b.add_peer(1, addr).unwrap();
    assert!(a.earlier_calls().is_empty());
    let calls: Vec<_> = (0..6u32).map(|i| a.request(2, COUNT, &i.to_le_bytes()).unwrap()).collect();
    // The server runs three of them; the other three wait in its queue.
    for _ in 0..3 {
        b.serve(WAIT).unwrap();
    }
    for c in &calls[..3] {
        assert_eq!(c.wait(WAIT).unwrap().executed(), Executed::Yes);
    }
    assert!(calls[3].state().unwrap().op != tether::rpc::OperationStatus::Processed);
    let ids: Vec<_> = calls.iter().map(|c| c.id()).collect();
    drop(calls);
    drop(a);
    // The next life, at the same address.
    let a = life(101, addr);
    let earlier = a.earlier_calls();
    assert_eq!(earlier.iter().map(|c| c.id()).collect::<Vec<_>>(), ids);
    for (i, c) in earlier.iter().enumerate() {
        let out = c.wait(WAIT).unwrap();
        if i < 3 {
            assert_eq!(out.executed(), Executed::Yes, "call {i}: {:?}", out.state);
            assert_eq!(out.reply.as_deref(), Some(&(i as u32).to_le_bytes()[..]));
        } else {
            assert_eq!(out.executed(), Executed::No, "call {i}: {:?}", out.state);
        }
    }
    // The three it saw end came from its log, not from the server.
    assert_eq!(a.call_stats().unwrap().caller.resolved, 3);
    // Nothing is left for the server to run: the three were cancelled.
    assert!(matches!(b.serve(Some(Duration::from_millis(100))), Err(Error::TimedOut)));
    assert_eq!(&server.runs.lock().unwrap()[..6], &[1, 1, 1, 0, 0, 0]);
    // A life that keeps at most 8 calls keeps at most 4 earlier ones, the
    // newest: an application that never takes them cannot fill its table
    // over many restarts.
    drop(earlier);
    drop(a);
    let mut o = Options { caller_log: Some(log.clone()), incarnation: Some(102), ..options(&[], 5) };
    o.calls.max_calls = 8;
    let a = Endpoint::udp(1, addr, &[], o).unwrap();
    let kept: Vec<_> = a.earlier_calls().iter().map(|c| c.id()).collect();
    assert_eq!(kept, ids[2..], "the newest four");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A server takes the calls waiting in batches (`serve_batch`, a group
/// commit: one sync for the batch's starts, one for its completions):
/// never more than asked, every handler once, every call answered.
#[test]
fn serve_batch_runs_the_waiting_calls_together_each_once() {
    let (a, b, _log) = pair(&[], 9);
    let server = serve(&b);
    let calls: Vec<_> = (0..16u32).map(|i| a.request(2, COUNT, &i.to_le_bytes()).unwrap()).collect();
    // All sixteen waiting at the server before it serves.
    for _ in 0..2_000 {
        if b.call_stats().unwrap().server.requests >= 16 {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(b.call_stats().unwrap().server.requests, 16, "the requests arrive");
    assert_eq!(b.serve_batch(10, WAIT).unwrap(), 10, "no more than asked");
    assert_eq!(b.serve_batch(100, WAIT).unwrap(), 6, "the rest");
    for (i, call) in calls.iter().enumerate() {
        let out = call.wait(WAIT).unwrap();
        assert_eq!(out.state, CallState::PROCESSED, "call {i}");
        assert_eq!(out.reply.as_deref(), Some(&(i as u32).to_le_bytes()[..]), "call {i}");
    }
    assert!(server.runs.lock().unwrap()[..16].iter().all(|&n| n == 1));
    assert!(matches!(b.serve_batch(4, Some(Duration::from_millis(50))), Err(Error::TimedOut)));
}
