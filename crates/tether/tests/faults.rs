//! The fault injector around real endpoints over UDP on loopback: every
//! message fault is masked end to end (exactly once, in order, exact
//! bytes), and invocation and operation faults reach the application as
//! typed errors and failed handles without leaving the layer stuck or
//! holding buffers once they stop.

// Tests read the wall clock to report throughput (printed, never asserted).
#![allow(clippy::disallowed_methods)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tether::faults::{FaultKind, FaultPlan};
use tether::{Config, Endpoint, Error, FailReason, MessageState, NodeId, Options};
use tether_io::TransportError;

const WAIT: Option<Duration> = Some(Duration::from_secs(20));

fn any() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

fn options(rules: &[&str], seed: u64) -> Options {
    let config = Config { rto_min: Duration::from_micros(500), ..Config::default() };
    Options { config, faults: FaultPlan::parse_rules(seed, rules).unwrap(), ..Options::default() }
}

/// Endpoints 1..=n that all know each other, each with `rules`.
fn mesh(n: NodeId, rules: &[&str], seed: u64) -> Vec<Endpoint> {
    let eps: Vec<Endpoint> =
        (1..=n).map(|id| Endpoint::udp(id, any(), &[], options(rules, seed)).unwrap()).collect();
    for a in &eps {
        for b in &eps {
            if a.node() != b.node() {
                a.add_peer(b.node(), b.local_addr().unwrap()).unwrap();
            }
        }
    }
    eps
}

fn msg(i: u64, len: usize) -> Vec<u8> {
    let mut m: Vec<u8> = (0..len.max(8)).map(|j| (i as usize * 31 + j * 7) as u8).collect();
    m[..8].copy_from_slice(&i.to_le_bytes());
    m
}

fn size(i: u64) -> usize {
    [8, 200, 1400, 5000, 30_000][(i % 5) as usize]
}

/// Node 1 streams to 2 and 3 while every node injects `rule` on every
/// datagram side it applies to; 2 and 3 must get each message once, in
/// order, intact.
fn masked(rule: &str, count: u64) -> tether::faults::FaultCounters {
    let eps = mesh(3, &[rule], 42);
    std::thread::scope(|s| {
        for rx in &eps[1..] {
            s.spawn(move || {
                for i in 0..count {
                    let d =
                        rx.recv(WAIT).unwrap_or_else(|e| panic!("{rule}: message {i} to {}: {e}", rx.node()));
                    assert_eq!(d.from, 1);
                    assert_eq!(d.message.to_vec(), msg(i, size(i)), "{rule}: message {i} to {}", rx.node());
                }
            });
        }
        for i in 0..count {
            for dst in [2, 3] {
                eps[0].send_blocking(dst, &msg(i, size(i)), WAIT).unwrap();
            }
        }
        eps[0].flush(WAIT).unwrap();
    });
    for rx in &eps[1..] {
        assert!(rx.try_recv().is_none(), "{rule}: nothing beyond the stream");
        assert_eq!(rx.stats().messages_delivered, count);
    }
    let mut c = tether::faults::FaultCounters::default();
    for e in &eps {
        c.accumulate(&e.fault_counters());
    }
    c
}

#[test]
fn every_message_fault_is_masked_end_to_end() {
    let cases = [
        (FaultKind::Drop, "drop:p=0.05"),
        (FaultKind::Drop, "drop:p=0.05,side=send"),
        (FaultKind::Delay, "delay:p=0.05,mean=300us"),
        (FaultKind::Modify, "modify:p=0.05,bits=1..4"),
        (FaultKind::Modify, "modify:p=0.05,mode=truncate"),
        (FaultKind::Modify, "modify:p=0.05,mode=extend"),
        (FaultKind::Reorder, "reorder:p=0.05,depth=5"),
        (FaultKind::Duplicate, "duplicate:p=0.05"),
        (FaultKind::Duplicate, "duplicate:p=0.05,side=send,copies=2"),
        (FaultKind::Inject, "inject:p=0.05,side=send"),
        (FaultKind::Drop, "drop:p=1,on=5ms,off=20ms"),
    ];
    for (kind, rule) in cases {
        let c = masked(rule, 600);
        assert!(c.of(kind) > 0, "{rule}: no fault injected: {c:?}");
        eprintln!("{rule}: masked {} {} faults", c.of(kind), kind.name());
    }
}

#[test]
fn call_faults_surface_as_typed_errors_and_leave_nothing_behind() {
    // Two operation rules at the API: one always drops the message (the
    // default, drop=1), one drops it half the time and otherwise lets it go
    // while the handle still reports the failure, as a lost completion would.
    let rules = [
        "invocation:p=0.1,side=api,error=local_resource",
        "operation:p=0.1,side=api,error=remote_resource",
        "operation:p=0.1,side=api,error=remote_resource,drop=0.5",
        "invocation:p=0.1,side=send,error=local_resource",
        "operation:p=0.1,side=send",
        "invocation:p=0.1,side=recv,error=interrupted",
    ];
    let eps = mesh(2, &rules, 7);
    let (a, b) = (&eps[0], &eps[1]);
    let (initial_send, initial_queue) = a.buffered();
    let run = |first: u64, count: u64| {
        let start = Instant::now();
        let (mut refused, mut op_dropped, mut op_sent, mut expected) = (0u64, 0u64, 0u64, Vec::new());
        let (mut handles, mut failed_but_sent) = (Vec::new(), Vec::new());
        for i in first..first + count {
            match a.send_blocking(2, &msg(i, 64), WAIT) {
                Ok(h) => match (h.state(), h.id()) {
                    (MessageState::Failed(FailReason::OperationFault), None) => op_dropped += 1,
                    // Failed by its status, yet in the stream: it must
                    // arrive like any other message.
                    (MessageState::Failed(FailReason::OperationFault), Some(_)) => {
                        op_sent += 1;
                        expected.push(i);
                        failed_but_sent.push(h);
                    }
                    _ => {
                        expected.push(i);
                        handles.push(h);
                    }
                },
                Err(Error::Transport(TransportError::LocalResource)) => refused += 1,
                Err(e) => panic!("unexpected error {e}"),
            }
        }
        for &i in &expected {
            let d = b.recv(WAIT).unwrap_or_else(|e| panic!("message {i}: {e}"));
            assert_eq!(d.message.to_vec(), msg(i, 64), "exactly the accepted messages, in order");
        }
        for h in &handles {
            assert_eq!(h.wait(WAIT).unwrap(), MessageState::Delivered);
        }
        // The status is the injected one for good: delivery does not change it.
        for h in &failed_but_sent {
            assert_eq!(h.wait(WAIT).unwrap(), MessageState::Failed(FailReason::OperationFault));
        }
        a.flush(WAIT).unwrap();
        let rate = count as f64 / start.elapsed().as_secs_f64();
        (refused, op_dropped, op_sent, rate)
    };

    let n = 20_000;
    let (refused, op_dropped, op_sent, faulty_rate) = run(0, n);
    eprintln!("of {n} sends: {refused} refused, {op_dropped} failed and dropped, {op_sent} failed yet sent");
    let c = a.fault_counters();
    // Typed errors and failed handles, at the configured rate.
    let sd = (n as f64 * 0.1 * 0.9).sqrt();
    assert!((refused as f64 - n as f64 * 0.1).abs() < 5.0 * sd, "{refused} refused of {n}");
    assert!(op_dropped > 0 && op_sent > 0, "{op_dropped} dropped, {op_sent} failed but sent");
    assert!(c.invocation > refused && c.operation > op_dropped + op_sent, "{c:?}");
    // Of the calls the invocation rule let through (0.9 n), the first
    // operation rule strikes 0.1 and always drops; of the rest (0.9), the
    // second strikes 0.1 and drops half: 0.09 n + 0.0405 n dropped, 0.0405 n sent.
    let expect = |mean: f64, got: u64| {
        let sd = (mean * (1.0 - mean / n as f64)).sqrt();
        assert!((got as f64 - mean).abs() < 5.0 * sd, "{got}, expected about {mean:.0}");
    };
    expect(n as f64 * (0.09 + 0.0405), op_dropped);
    expect(n as f64 * 0.0405, op_sent);

    a.set_faults_enabled(false);
    b.set_faults_enabled(false);
    let before = a.fault_counters();
    let (refused, op_dropped, op_sent, clean_rate) = run(n, n);
    assert_eq!((refused, op_dropped, op_sent), (0, 0, 0), "switched off: no call fails");
    assert_eq!(a.fault_counters().total(), before.total(), "switched off: nothing injected");
    assert!(b.try_recv().is_none());

    // Nothing left behind: send buffers and delivery queue as at the start,
    // no datagram held by either injector.
    assert_eq!(a.buffered(), (initial_send, initial_queue));
    assert_eq!(b.buffered(), (0, 0));
    for e in [a, b] {
        let (queued, buffers) = e.fault_handle().unwrap().queued();
        assert_eq!(queued, 0);
        assert!(buffers <= tether_fault::MAX_QUEUED, "{buffers}");
    }
    assert!(a.send(2, b"one more").unwrap().wait(WAIT).unwrap() == MessageState::Delivered);
    eprintln!(
        "call faults at 10%: {faulty_rate:.0} msgs/s; switched off: {clean_rate:.0} msgs/s ({:.2}x)",
        clean_rate / faulty_rate
    );
}

/// A plan the injector refuses (an `api` rule whose probability is not
/// one) is refused before anything is bound or started: the port is free
/// at once. Made after the endpoint was opened, the refusal left a live
/// endpoint behind with nobody to close it, its socket bound.
#[test]
fn an_endpoint_refused_for_its_api_plan_leaves_nothing_behind() {
    let mut options = options(&["invocation:p=0.5,side=api"], 1);
    options.faults.rules[0].recurrence = tether::faults::Recurrence::Probability(1.5);
    let bind = std::net::UdpSocket::bind(any()).unwrap();
    let addr = bind.local_addr().unwrap();
    drop(bind);
    assert!(matches!(Endpoint::udp(1, addr, &[], options), Err(Error::FaultPlan(_))));
    let again = Endpoint::udp(1, addr, &[], Options::default());
    assert!(again.is_ok(), "the port is free again: {again:?}");
}

/// `n` messages from `a` to node 2 (`b`) in batches of 1 to 120, taken by
/// `recv_batch` into a 50-message buffer and, now and then, by `recv`:
/// each once, in order, exact; the batches' ids count up, and every one is
/// delivered. What each batch send took is checked against what went.
fn batched(a: &Endpoint, b: &Endpoint, n: u64, what: &str) {
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut out = tether::Received::new(50, 64 * 1024);
            let mut i = 0;
            while i < n {
                if i % 7 == 3 {
                    let d = b.recv(WAIT).unwrap_or_else(|e| panic!("{what}: message {i}: {e}"));
                    assert_eq!((d.from, d.message.to_vec()), (1, msg(i, size(i))), "{what}: message {i}");
                    i += 1;
                    continue;
                }
                let got = b.recv_batch(&mut out, WAIT).unwrap_or_else(|e| panic!("{what}: message {i}: {e}"));
                assert!((1..=50).contains(&got) && got == out.len(), "{what}: {got} taken");
                for (from, m) in out.iter() {
                    assert_eq!((from, m), (1, &msg(i, size(i))[..]), "{what}: message {i}");
                    i += 1;
                }
            }
        });
        let (mut i, mut k, mut ids) = (0, 1, Vec::new());
        while i < n {
            let len = (k * 37 % 120 + 1).min(n - i);
            k += 1;
            let batch: Vec<Vec<u8>> = (i..i + len).map(|j| msg(j, size(j))).collect();
            let sent = a.send_batch(2, &batch, WAIT).unwrap_or_else(|e| panic!("{what}: batch at {i}: {e}"));
            assert_eq!(sent.count as u64, len, "{what}: the whole batch taken within the wait");
            if let Some(&last) = ids.last() {
                assert_eq!(sent.first, tether::MessageId { peer: 2, seq: last + 1 }, "{what}: ids count up");
            }
            ids.extend((0..sent.count).map(|j| sent.id(j).unwrap().seq));
            i += len;
        }
        a.flush(WAIT).unwrap();
        for seq in ids {
            let id = tether::MessageId { peer: 2, seq };
            assert_eq!(a.message_state(id), MessageState::Delivered, "{what}: message {id:?}");
        }
    });
    assert!(b.try_recv().is_none(), "{what}: nothing beyond the stream");
}

#[test]
fn batches_are_masked_end_to_end() {
    for rule in ["drop:p=0.05", "duplicate:p=0.05", "reorder:p=0.05,depth=5", "modify:p=0.05,bits=1..4"] {
        let eps = mesh(2, &[rule], 11);
        let (a, b) = (&eps[0], &eps[1]);
        batched(a, b, 3000, rule);
        assert!(a.fault_counters().total() + b.fault_counters().total() > 0, "{rule}: nothing injected");
        // One message too large refuses the whole batch: nothing goes.
        let max = Config::default().max_message_len;
        let too_large = [vec![1u8; 8], vec![0u8; max + 1]];
        match a.send_batch(2, &too_large, WAIT) {
            Err(Error::Send(tether::SendError::MessageTooLarge { len, .. })) => assert_eq!(len, max + 1),
            other => panic!("{rule}: a batch with a message too large: {other:?}"),
        }
        let mut out = tether::Received::new(4, 1024);
        assert!(b.recv_batch(&mut out, Some(Duration::from_millis(100))).is_err() && out.is_empty());
    }
}

/// A batch send is one call: an invocation fault refuses all of it,
/// nothing sent; an operation fault lets it go and reports each of its
/// messages failed.
#[test]
fn call_faults_strike_whole_batches() {
    let rules =
        ["invocation:p=0.2,side=api,error=local_resource", "operation:p=0.2,side=api,error=remote_resource"];
    let eps = mesh(2, &rules, 5);
    let (a, b) = (&eps[0], &eps[1]);
    let (mut expected, mut struck, mut clean, mut refused) = (Vec::new(), Vec::new(), Vec::new(), 0);
    for k in 0..300u64 {
        let batch: Vec<Vec<u8>> = (0..10).map(|j| msg(k * 10 + j, 64)).collect();
        // Which batches were struck, from the injector's own count, not
        // from the states this test asserts.
        let before = a.fault_counters();
        match a.send_batch(2, &batch, WAIT) {
            Ok(sent) => {
                assert_eq!(sent.count, 10);
                expected.extend(k * 10..k * 10 + 10);
                let ids = (0..10).map(|j| sent.id(j).unwrap());
                let after = a.fault_counters();
                assert_eq!(after.invocation, before.invocation, "a batch taken was not refused");
                match after.operation - before.operation {
                    0 => clean.extend(ids),
                    1 => struck.extend(ids),
                    n => panic!("batch {k} struck {n} times: a batch is one call"),
                }
            }
            Err(Error::Transport(TransportError::LocalResource)) => {
                assert_eq!(a.fault_counters().invocation, before.invocation + 1, "refused by one fault");
                refused += 1;
            }
            Err(e) => panic!("batch {k}: {e}"),
        }
    }
    let mut out = tether::Received::new(64, 1 << 16);
    let mut got = Vec::new();
    while got.len() < expected.len() {
        b.recv_batch(&mut out, WAIT).unwrap();
        got.extend(out.iter().map(|(_, m)| u64::from_le_bytes(m[..8].try_into().unwrap())));
    }
    assert_eq!(got, expected, "exactly the batches taken, in order, struck ones too");
    a.flush(WAIT).unwrap();
    for id in &clean {
        assert_eq!(a.message_state(*id), MessageState::Delivered);
    }
    for id in &struck {
        assert_eq!(a.message_state(*id), MessageState::Failed(FailReason::OperationFault));
    }
    eprintln!("300 batches: {refused} refused, {} struck, {} clean", struck.len() / 10, clean.len() / 10);
    assert!(
        refused > 20 && struck.len() > 200 && !clean.is_empty(),
        "{refused} refused, {} struck",
        struck.len()
    );
}
