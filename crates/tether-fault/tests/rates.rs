//! Each fault kind strikes at its configured rate: at a fixed seed, the
//! number of faults over n trials lies within 5 standard deviations of the
//! binomial mean n*p (a false alarm has probability < 6e-7 per check, and
//! the seed is fixed, so the test is deterministic); and what is struck
//! really is what the fault says (a dropped datagram is gone, a duplicated
//! one arrives twice, a delayed one late, a modified one different).

use std::time::Duration;

use tether_fault::{
    CallVerdict, ErrorKind, Fault, FaultKind, FaultPlan, Injector, Modify, Recurrence, Rule, SendVerdict,
    Side, Span, Spread,
};

const N: u64 = 200_000;

fn within_binomial(observed: u64, n: u64, p: f64) -> bool {
    let mean = n as f64 * p;
    let sd = (n as f64 * p * (1.0 - p)).sqrt();
    (observed as f64 - mean).abs() <= 5.0 * sd
}

/// Print what was observed against the bound (`--nocapture` shows it).
fn report(what: &str, observed: u64, n: u64, p: f64) {
    let (mean, sd) = (n as f64 * p, (n as f64 * p * (1.0 - p)).sqrt());
    eprintln!("{what}: {observed} of {n}, expected {mean:.0} +- {:.0} (5 sd)", 5.0 * sd);
}

fn us(n: u64) -> Duration {
    Duration::from_micros(n)
}

/// Push n numbered datagrams through the receive side, one per microsecond,
/// and collect what comes out (draining the held ones at the end).
fn receive(rule: Rule, n: u64) -> (Injector, Vec<Vec<u8>>) {
    let mut inj = Injector::new(&FaultPlan::new(11).with(rule)).unwrap();
    let mut out = Vec::new();
    for i in 0..n {
        inj.on_recv(us(i), Some(1), None, &i.to_le_bytes());
        inj.drain_ready(us(i), |_, _, d| {
            out.push(d.to_vec());
            true
        });
    }
    inj.drain_ready(Duration::from_secs(3600), |_, _, d| {
        out.push(d.to_vec());
        true
    });
    (inj, out)
}

fn index(d: &[u8]) -> Option<u64> {
    Some(u64::from_le_bytes(d.get(..8)?.try_into().ok()?))
}

#[test]
fn receive_side_kinds_strike_at_their_rate() {
    for p in [0.001, 0.01, 0.1] {
        let cases = [
            Fault::Drop,
            Fault::Duplicate { copies: 1 },
            Fault::Modify(Modify::Flip(Span::exactly(1))),
            Fault::Delay(Spread::Fixed(us(50))),
            Fault::Reorder { depth: 3, max_hold: Duration::from_millis(10) },
        ];
        for fault in cases {
            let (inj, out) = receive(Rule::new(fault, Recurrence::Probability(p)), N);
            let c = inj.counters();
            let k = c.of(fault.kind());
            report(&format!("recv {} p={p}", fault.kind().name()), k, N, p);
            assert!(within_binomial(k, N, p), "{fault:?} at p={p}: {k} of {N}");
            assert_eq!(c.total(), k, "only the configured kind strikes");
            assert_eq!(c.receives_seen, N);
            // What the fault does to the stream.
            let expect_len = match fault.kind() {
                FaultKind::Drop => N - k,
                FaultKind::Duplicate => N + k,
                _ => N,
            };
            assert_eq!(out.len() as u64, expect_len, "{fault:?}: nothing lost or made up beyond the fault");
            let changed = out.iter().enumerate().filter(|(i, d)| index(d) != Some(*i as u64)).count() as u64;
            match fault.kind() {
                FaultKind::Modify => assert_eq!(changed, k, "each modified datagram differs"),
                FaultKind::Delay | FaultKind::Reorder => assert!(changed >= k, "held datagrams come late"),
                _ => {}
            }
        }
    }
}

#[test]
fn send_side_kinds_strike_at_their_rate() {
    let p = 0.02;
    for fault in [
        Fault::Drop,
        Fault::Duplicate { copies: 2 },
        Fault::Inject,
        Fault::Invocation(ErrorKind::LocalResource),
        Fault::Operation { error: ErrorKind::RemoteResource, drop: 1.0 },
    ] {
        let plan = FaultPlan::new(5).with(Rule::new(fault, Recurrence::Probability(p)).on(Side::Send));
        let mut inj = Injector::new(&plan).unwrap();
        let (mut sent, mut failed, mut op) = (0u64, 0u64, 0u64);
        for i in 0..N {
            let dst = (i % 3) as u32 + 1;
            match inj.on_send(us(i), dst, &i.to_le_bytes(), |_, _| sent += 1) {
                SendVerdict::Sent => {}
                SendVerdict::Invocation(e) => {
                    assert_eq!(e, ErrorKind::LocalResource);
                    failed += 1
                }
                SendVerdict::Operation(e) => {
                    assert_eq!(e, ErrorKind::RemoteResource);
                    op += 1
                }
            }
        }
        let k = inj.counters().of(fault.kind());
        report(&format!("send {} p={p}", fault.kind().name()), k, N, p);
        assert!(within_binomial(k, N, p), "{fault:?}: {k} of {N}");
        let expect_sent = match fault {
            Fault::Drop => N - k,
            Fault::Duplicate { copies } => N + k * copies as u64,
            // The first inject may find no history yet: at most one short.
            Fault::Inject => N + k,
            Fault::Invocation(_) => N - failed,
            _ => N - op,
        };
        let slack = u64::from(matches!(fault, Fault::Inject));
        assert!(
            sent <= expect_sent && sent + slack >= expect_sent,
            "{fault:?}: sent {sent}, expected {expect_sent}"
        );
        assert_eq!(
            failed + op,
            if matches!(fault.kind(), FaultKind::Invocation | FaultKind::Operation) { k } else { 0 }
        );
    }
}

#[test]
fn call_faults_strike_at_their_rate() {
    let plan =
        FaultPlan::parse_rules(3, &["invocation:p=0.05,side=api", "operation:p=0.05,side=api,drop=0.5"])
            .unwrap();
    let mut inj = Injector::new(&plan).unwrap();
    let (mut inv, mut op_dropped, mut op_kept) = (0u64, 0u64, 0u64);
    for i in 0..N {
        match inj.on_call(us(i)) {
            CallVerdict::Proceed => {}
            CallVerdict::Invocation(_) => inv += 1,
            CallVerdict::Operation { dropped: true, .. } => op_dropped += 1,
            CallVerdict::Operation { dropped: false, .. } => op_kept += 1,
        }
    }
    report("api invocation p=0.05", inv, N, 0.05);
    assert!(within_binomial(inv, N, 0.05), "{inv}");
    // The operation rule sees only calls the invocation rule let through.
    let op = op_dropped + op_kept;
    report("api operation p=0.05", op, N - inv, 0.05);
    assert!(within_binomial(op, N - inv, 0.05), "{op}");
    assert!(within_binomial(op_dropped, op, 0.5), "{op_dropped} of {op}");
    assert_eq!(inj.counters().invocation, inv);
    assert_eq!(inj.counters().operation, op);
}

#[test]
fn other_recurrences_strike_at_their_rate() {
    let every = Rule::drop(Recurrence::EveryNth(100));
    assert_eq!(receive(every, N).0.counters().dropped, N / 100);
    // Geometric gaps of mean 100: the count of faults in N trials has
    // variance ~ N(1-p)/p^2 * p^3 = N p (1-p): the binomial bound holds.
    let gap = Rule::drop(Recurrence::MeanGap(100.0));
    let k = receive(gap, N).0.counters().dropped;
    assert!(within_binomial(k, N, 0.01), "{k}");
    // One datagram per microsecond for 0.2 s, a fault every ~1 ms.
    let timed = Rule::drop(Recurrence::MeanInterval(Duration::from_millis(1)));
    let k = receive(timed, N).0.counters().dropped;
    assert!((k as f64 - 200.0).abs() < 5.0 * 200f64.sqrt(), "{k}");
}

#[test]
fn delay_holds_for_the_drawn_time() {
    let rule = Rule::new(Fault::Delay(Spread::Fixed(Duration::from_millis(2))), Recurrence::EveryNth(1));
    let mut inj = Injector::new(&FaultPlan::new(1).with(rule)).unwrap();
    inj.on_recv(us(0), None, None, b"late");
    assert_eq!(inj.next_release(), Some(Duration::from_millis(2)));
    let mut got = Vec::new();
    inj.drain_ready(us(1999), |_, _, d| {
        got.push(d.to_vec());
        true
    });
    assert!(got.is_empty(), "released early");
    inj.drain_ready(us(2000), |_, _, d| {
        got.push(d.to_vec());
        true
    });
    assert_eq!(got, vec![b"late".to_vec()]);
    assert_eq!(inj.next_release(), None);
}

#[test]
fn reorder_lets_later_datagrams_pass_then_releases() {
    let rule =
        Rule::new(Fault::Reorder { depth: 1, max_hold: Duration::from_secs(1) }, Recurrence::EveryNth(3));
    let (_, out) = receive(rule, 6);
    let order: Vec<u64> = out.iter().map(|d| index(d).unwrap()).collect();
    // Datagrams 2 and 5 are held, each overtaken by exactly one later one.
    assert_eq!(order, vec![0, 1, 3, 2, 4, 5]);
}

#[test]
fn inject_sends_an_old_datagram_elsewhere() {
    let plan = FaultPlan::parse_rules(9, &["inject:every=4"]).unwrap();
    let mut inj = Injector::new(&plan).unwrap();
    let mut out = Vec::new();
    for i in 0u64..40 {
        let dst = (i % 2) as u32 + 1;
        inj.on_send(us(i), dst, &i.to_le_bytes(), |to, d| out.push((i, to, index(d).unwrap())));
    }
    let injected: Vec<_> = out.iter().filter(|(i, _, idx)| i != idx).collect();
    assert_eq!(injected.len(), 10);
    assert!(injected.iter().all(|(i, to, idx)| idx < i && (*to == 1 || *to == 2)));
}

#[test]
fn schedules_bursts_and_switches() {
    // Dead from 10 ms to 20 ms: every datagram in the window dropped, none outside.
    let rule = Rule::drop(Recurrence::Probability(1.0))
        .during(Duration::from_millis(10), Some(Duration::from_millis(20)));
    let (inj, out) = receive(rule, 30_000);
    assert_eq!(inj.counters().dropped, 10_000);
    assert_eq!(out.len(), 20_000);
    // Bursts: on 1 ms of every 4 ms.
    let rule =
        Rule::drop(Recurrence::Probability(1.0)).bursts(Duration::from_millis(1), Duration::from_millis(3));
    assert_eq!(receive(rule, 40_000).0.counters().dropped, 10_000);
    // Switched off at run time.
    let mut inj = Injector::new(&FaultPlan::new(1).with(Rule::drop(Recurrence::Probability(1.0)))).unwrap();
    inj.on_recv(us(0), None, None, b"x");
    inj.set_enabled(false);
    inj.on_recv(us(1), None, None, b"y");
    assert_eq!(inj.counters().dropped, 1);
    assert_eq!(inj.ready(), 1);
}

#[test]
fn holding_is_bounded_and_buffers_are_reused() {
    let rule = Rule::new(Fault::Delay(Spread::Fixed(Duration::from_secs(1))), Recurrence::Probability(1.0));
    let mut inj = Injector::new(&FaultPlan::new(1).with(rule)).unwrap();
    for i in 0..(tether_fault::MAX_QUEUED as u64 + 10) {
        inj.on_recv(us(i), None, None, &[0; 100]);
    }
    assert_eq!(inj.holding(), tether_fault::MAX_QUEUED);
    assert_eq!(inj.counters().overflow, 10);
    inj.drain_ready(Duration::from_secs(2), |_, _, _| true);
    let buffers = inj.buffers();
    for i in 0..1000 {
        inj.on_recv(Duration::from_secs(3) + us(i), None, None, &[0; 100]);
        inj.drain_ready(Duration::from_secs(10), |_, _, _| true);
    }
    assert_eq!(inj.buffers(), buffers, "steady state allocates no new buffers");
}

#[test]
fn same_seed_same_faults() {
    let plan = FaultPlan::parse_rules(
        77,
        &["drop:p=0.1", "modify:p=0.05,bits=1..3", "reorder:p=0.05", "delay:p=0.05,mean=20us"],
    )
    .unwrap();
    let run = || {
        let mut inj = Injector::new(&plan).unwrap();
        let mut out = Vec::new();
        for i in 0u64..5000 {
            inj.on_recv(us(i), None, None, &i.to_le_bytes());
            inj.drain_ready(us(i), |_, _, d| {
                out.push(d.to_vec());
                true
            });
        }
        (out, inj.counters())
    };
    let (a, ca) = run();
    let (b, cb) = run();
    // The same datagrams, bytes and order (so the same drops, flips, holds
    // and releases), from the same number of faults of each kind.
    assert_eq!(a, b);
    assert_eq!(ca, cb);
    for kind in [FaultKind::Drop, FaultKind::Modify, FaultKind::Reorder, FaultKind::Delay] {
        assert!(ca.of(kind) > 0, "{kind:?} never struck: {ca:?}");
    }
}

/// Pinned: receive *calls* ran every receive-side rule, so a drop rule
/// counted (and spent its recurrence on) calls that carry no datagram.
/// Only invocation faults strike a call; datagram faults strike datagrams.
#[test]
fn receive_calls_do_not_spend_datagram_rules() {
    let plan = FaultPlan::new(3).with(Rule::drop(Recurrence::EveryNth(2)).on(Side::Recv));
    let mut inj = Injector::new(&plan).unwrap();
    for i in 0..1000 {
        assert_eq!(inj.on_recv_call(us(i)), None);
    }
    assert_eq!(inj.counters().dropped, 0, "calls are not datagrams");
    let mut passed = 0;
    for i in 0..10u64 {
        inj.on_recv(us(1000 + i), Some(1), None, &i.to_le_bytes());
        inj.drain_ready(us(1000 + i), |_, _, _| {
            passed += 1;
            true
        });
    }
    assert_eq!((inj.counters().dropped, passed), (5, 5), "every 2nd datagram, counting datagrams only");
}
