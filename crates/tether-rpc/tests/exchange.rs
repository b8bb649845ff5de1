//! The three-way exchange step by step (Kaur's AMVIA, Figures 3.1-3.3):
//! each state of the caller's tuple, each refusal, the credit, the freeing
//! of reply state, and who may touch whose calls.

use std::time::Duration;

use bytes::Bytes;
use tether_proto::Instant;
use tether_rpc::{
    replay, AckStatus, CallError, CallId, CallState, Caller, Envelope, Executed, MemLog, OperationStatus,
    Refusal, RpcConfig, Target,
};

const C: u32 = 1;
const S: u32 = 2;
const ECHO: u32 = 10;

fn config() -> RpcConfig {
    RpcConfig { credit: 4, ..RpcConfig::default() }
}

struct Pair {
    now: Instant,
    caller: Caller,
    server: Target,
    log: MemLog,
}

impl Pair {
    fn new() -> Self {
        let mut server = Target::new(config());
        server.register(ECHO);
        let mut log = MemLog::new(1 << 20);
        // The application serves: requests for unknown handlers are
        // refused for good from now on.
        assert!(server.poll_dispatch(&mut log).is_none());
        Pair { now: Instant::from_nanos(1_000), caller: Caller::new(config(), 77), server, log }
    }

    /// Caller to server: every envelope the caller has queued.
    fn up(&mut self) -> usize {
        let mut n = 0;
        while let Some(o) = self.caller.poll_transmit() {
            assert_eq!(o.to, S);
            self.server.handle(self.now, C, &o.bytes, &mut self.log).unwrap();
            n += 1;
        }
        self.check();
        n
    }

    /// Server to caller: every envelope the server has queued.
    fn down(&mut self) -> Vec<Bytes> {
        let mut sent = Vec::new();
        while let Some(o) = self.server.poll_transmit() {
            assert_eq!(o.to, C);
            self.caller.handle(self.now, S, &o.bytes).unwrap();
            sent.push(o.bytes);
        }
        self.check();
        sent
    }

    fn run_handlers(&mut self) -> usize {
        let mut n = 0;
        while let Some(d) = self.server.poll_dispatch(&mut self.log) {
            let mut reply = b"echo:".to_vec();
            reply.extend_from_slice(&d.args);
            self.server.complete(d.from, d.call, &reply, &mut self.log).unwrap();
            n += 1;
        }
        self.check();
        n
    }

    fn tick(&mut self, d: Duration) {
        self.now = self.now + d;
        self.caller.handle_timeout(self.now);
        self.server.handle_timeout(self.now);
        self.check();
    }

    /// Both sides' tables, checked whole.
    fn check(&self) {
        self.caller.check_invariants();
        self.server.check_invariants();
    }
}

/// Whatever a test did last, the tables still hold together.
impl Drop for Pair {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            self.check();
        }
    }
}

fn kind(bytes: &[u8]) -> &'static str {
    match Envelope::parse(bytes).unwrap() {
        Envelope::Ack { .. } => "ack",
        Envelope::Reply { .. } => "reply",
        Envelope::Refused { .. } => "refused",
        Envelope::AckRequest { .. } => "ack request",
        _ => "other",
    }
}

#[test]
fn request_ack_reply_walks_the_tuple() {
    let mut p = Pair::new();
    let call = p.caller.request(p.now, S, ECHO, Bytes::from_static(b"hi"), false, None, true).unwrap();
    assert_eq!(p.caller.state(call), Some(CallState::SENT));
    p.up();
    // Queued for the application: nothing said until it starts.
    assert!(p.down().is_empty());
    assert_eq!(p.caller.state(call), Some(CallState::SENT));
    // The handler starts: the ACK goes before it runs.
    let d = p.server.poll_dispatch(&mut p.log).unwrap();
    let acks = p.down();
    assert_eq!(acks.iter().map(|b| kind(b)).collect::<Vec<_>>(), ["ack"]);
    assert_eq!(p.caller.state(call), Some(CallState::PROCESSING));
    p.server.complete(d.from, d.call, b"echo:hi", &mut p.log).unwrap();
    p.down();
    assert_eq!(p.caller.state(call), Some(CallState::PROCESSED));
    assert_eq!(p.caller.state(call).unwrap().executed(), Executed::Yes);
    let events: Vec<_> = std::iter::from_fn(|| p.caller.poll_event()).map(|e| e.state).collect();
    assert_eq!(events, [CallState::SENT, CallState::PROCESSING, CallState::PROCESSED]);
    let (state, reply) = p.caller.take(call).unwrap();
    assert_eq!((state, reply.as_deref()), (CallState::PROCESSED, Some(&b"echo:hi"[..])));
    assert!(p.caller.is_empty());
}

#[test]
fn a_reply_that_follows_at_once_carries_the_ack() {
    let mut p = Pair::new();
    let call = p.caller.request(p.now, S, ECHO, Bytes::from_static(b"x"), false, None, false).unwrap();
    p.up();
    p.run_handlers();
    let sent = p.down();
    assert_eq!(sent.iter().map(|b| kind(b)).collect::<Vec<_>>(), ["reply"], "one message, not two");
    assert_eq!(p.server.stats().acks_elided, 1);
    assert_eq!(p.caller.state(call), Some(CallState::PROCESSED));
}

#[test]
fn a_missing_handler_is_a_negative_ack_that_holds() {
    let mut p = Pair::new();
    let call = p.caller.request(p.now, S, 99, Bytes::new(), false, None, false).unwrap();
    p.up();
    p.down();
    let state = p.caller.state(call).unwrap();
    assert_eq!(state.ack, AckStatus::NotFound);
    assert_eq!(state.executed(), Executed::No);
    assert_eq!(p.caller.finished(call), Some(true));
    // A copy after the handler appears is refused the same way: the
    // refusal is logged, and the caller was told it never runs.
    p.server.register(99);
    let copy =
        Envelope::Request { call: call.id, handler: 99, one_way: false, first_incomplete: 0, args: b"" };
    p.server.handle(p.now, C, &copy.to_vec(), &mut p.log).unwrap();
    assert!(p.server.poll_dispatch(&mut p.log).is_none());
    let restarted = Target::recover(config(), &replay(p.log.bytes()).0);
    let mut restarted = restarted;
    restarted.check_invariants();
    restarted.register(99);
    assert!(restarted.poll_dispatch(&mut p.log).is_none());
    restarted.handle(p.now, C, &copy.to_vec(), &mut p.log).unwrap();
    assert!(restarted.poll_dispatch(&mut p.log).is_none(), "refused after a restart too");
    restarted.check_invariants();
}

#[test]
fn the_credit_bounds_open_calls_and_the_server_refuses_past_it() {
    let mut p = Pair::new();
    for _ in 0..4 {
        p.caller.request(p.now, S, ECHO, Bytes::new(), false, None, false).unwrap();
    }
    assert_eq!(
        p.caller.request(p.now, S, ECHO, Bytes::new(), false, None, false),
        Err(CallError::NoCredit { server: S, open: 4 })
    );
    // A caller that ignores the credit is refused, and nothing is kept.
    let forged = Envelope::Request {
        call: CallId { client: 77, seq: 9 },
        handler: ECHO,
        one_way: false,
        first_incomplete: 0,
        args: b"",
    };
    p.server.handle(p.now, C, &forged.to_vec(), &mut p.log).unwrap();
    assert_eq!(p.server.stats().refused_busy, 1);
    assert_eq!(p.server.entries(), 0);
    // Answers free credit.
    p.up();
    p.run_handlers();
    p.down();
    p.caller.request(p.now, S, ECHO, Bytes::new(), false, None, false).unwrap();
}

#[test]
fn replies_are_freed_by_the_next_request_or_an_ack_request() {
    let mut p = Pair::new();
    let first = p.caller.request(p.now, S, ECHO, Bytes::new(), false, None, false).unwrap();
    p.up();
    p.run_handlers();
    p.down();
    assert_eq!(p.server.entries(), 1, "the reply is kept for a copy of the call");
    // The next request says the first call is finished.
    p.caller.request(p.now, S, ECHO, Bytes::new(), false, None, false).unwrap();
    p.up();
    assert_eq!(p.server.entries(), 1, "only the new call");
    p.run_handlers();
    p.down();
    assert_eq!(p.server.entries(), 1);
    // Quiet: the server asks, the caller answers, the reply goes.
    p.tick(config().ack_request_after + Duration::from_millis(1));
    let asked = p.down();
    assert_eq!(asked.iter().map(|b| kind(b)).collect::<Vec<_>>(), ["ack request"]);
    p.up();
    assert_eq!(p.server.entries(), 0);
    assert!(p.caller.take(first).is_some());
    // A late copy of a freed call is stale: refused, never run.
    let copy =
        Envelope::Request { call: first.id, handler: ECHO, one_way: false, first_incomplete: 0, args: b"" };
    p.server.handle(p.now, C, &copy.to_vec(), &mut p.log).unwrap();
    assert!(p.server.poll_dispatch(&mut p.log).is_none());
    assert_eq!(p.server.stats().refused_stale, 1);
}

#[test]
fn a_deadline_abandons_and_a_query_fences_a_call_that_never_arrived() {
    let mut p = Pair::new();
    let call =
        p.caller.request(p.now, S, ECHO, Bytes::new(), false, Some(Duration::from_millis(5)), true).unwrap();
    // The request is lost with a server that died.
    while p.caller.poll_transmit().is_some() {}
    p.tick(Duration::from_millis(6));
    let abandoned = p.caller.state(call).unwrap();
    assert_eq!(abandoned, CallState { ack: AckStatus::NotAcked, op: OperationStatus::DeadlineExceeded });
    assert_eq!(abandoned.executed(), Executed::Unknown);
    assert_eq!(p.caller.finished(call), Some(false), "resolving");
    // The query reaches the server: the call is fenced off for good.
    assert_eq!(p.up(), 1);
    p.down();
    let resolved = p.caller.state(call).unwrap();
    assert_eq!(resolved.ack, AckStatus::ErrorAck(Refusal::NotRun));
    assert_eq!(resolved.executed(), Executed::No);
    assert_eq!(p.caller.finished(call), Some(true));
    // A copy of the request arriving now is refused, never run.
    let copy =
        Envelope::Request { call: call.id, handler: ECHO, one_way: false, first_incomplete: 0, args: b"" };
    p.server.handle(p.now, C, &copy.to_vec(), &mut p.log).unwrap();
    assert!(p.server.poll_dispatch(&mut p.log).is_none());
}

#[test]
fn a_restarted_server_answers_from_its_log() {
    let mut p = Pair::new();
    let done = p.caller.request(p.now, S, ECHO, Bytes::from_static(b"a"), false, None, false).unwrap();
    let running = p.caller.request(p.now, S, ECHO, Bytes::from_static(b"b"), false, None, false).unwrap();
    p.up();
    let d = p.server.poll_dispatch(&mut p.log).unwrap();
    p.server.complete(d.from, d.call, b"echo:a", &mut p.log).unwrap();
    assert!(p.server.poll_dispatch(&mut p.log).is_some(), "b starts");
    // Dies with "b" running and both answers unsent.
    let mut server = Target::recover(config(), &replay(p.log.bytes()).0);
    server.register(ECHO);
    p.server = server;
    while p.server.poll_transmit().is_some() {}
    p.tick(config().ack_timeout + Duration::from_millis(1));
    assert_eq!(p.up(), 2, "both requests sent again");
    assert!(p.server.poll_dispatch(&mut p.log).is_none(), "neither runs again");
    p.down();
    assert_eq!(p.caller.take(done).unwrap().1.as_deref(), Some(&b"echo:a"[..]));
    let state = p.caller.state(running).unwrap();
    assert_eq!(state.ack, AckStatus::ErrorAck(Refusal::Indeterminate));
    assert_eq!(state.executed(), Executed::Unknown);
}

#[test]
fn one_node_cannot_touch_another_nodes_calls() {
    let mut p = Pair::new();
    let call = p.caller.request(p.now, S, ECHO, Bytes::from_static(b"mine"), false, None, false).unwrap();
    p.up();
    p.run_handlers();
    // Node 3 claims the same call id: it is a call of node 3's, not C's.
    let query = Envelope::Query { call: call.id, first_incomplete: 0 };
    p.server.handle(p.now, 3, &query.to_vec(), &mut p.log).unwrap();
    let ack = Envelope::ReplyAck { client: call.id.client, first_incomplete: u64::MAX };
    p.server.handle(p.now, 3, &ack.to_vec(), &mut p.log).unwrap();
    let mut to_3 = Vec::new();
    while let Some(o) = p.server.poll_transmit() {
        if o.to == 3 {
            to_3.push(o.bytes);
        } else {
            p.caller.handle(p.now, S, &o.bytes).unwrap();
        }
    }
    assert_eq!(to_3.iter().map(|b| kind(b)).collect::<Vec<_>>(), ["refused"], "fenced as node 3's own");
    assert_eq!(p.caller.take(call).unwrap().1.as_deref(), Some(&b"echo:mine"[..]));
    // And C's reply is still there for a copy of C's call.
    let copy =
        Envelope::Request { call: call.id, handler: ECHO, one_way: false, first_incomplete: 0, args: b"" };
    p.server.handle(p.now, C, &copy.to_vec(), &mut p.log).unwrap();
    assert_eq!(kind(&p.server.poll_transmit().unwrap().bytes), "reply");
}

#[test]
fn a_caller_gives_up_after_k_retransmissions() {
    let mut p = Pair::new();
    let call = p.caller.request(p.now, S, ECHO, Bytes::new(), false, None, true).unwrap();
    let mut sends = 0;
    // Intervals double to 2 s: the whole request and query phases take
    // about 30 s of protocol time.
    for _ in 0..2_000 {
        while p.caller.poll_transmit().is_some() {
            sends += 1;
        }
        p.tick(Duration::from_millis(50));
        if p.caller.finished(call) == Some(true) {
            break;
        }
    }
    let retries = config().retries as usize;
    // The request and k retransmissions, then k + 1 queries: nobody answered.
    assert_eq!(sends, 2 * (retries + 1));
    assert_eq!(p.caller.finished(call), Some(true));
    let abandoned: Vec<_> = std::iter::from_fn(|| p.caller.poll_event()).map(|e| e.state).collect();
    assert!(
        abandoned.contains(&CallState { ack: AckStatus::NotAcked, op: OperationStatus::RequestRtxExceeded })
    );
    assert_eq!(p.caller.state(call).unwrap().executed(), Executed::Unknown);
}

/// Found by the `rpc_log` fuzz target: a log naming the last possible
/// call overflowed the restart's bound (a panic with overflow checks,
/// which the test profiles have).
#[test]
fn a_log_naming_the_last_call_recovers() {
    let call = CallId { client: u64::MAX, seq: u64::MAX };
    let records = [tether_rpc::Record::Started { node: 1, call, handler: 1, one_way: false }];
    let mut server = Target::recover(config(), &records);
    let mut log = MemLog::new(1 << 10);
    let query = Envelope::Query { call, first_incomplete: 0 };
    server.handle(Instant::from_nanos(1), 1, &query.to_vec(), &mut log).unwrap();
    let answer = server.poll_transmit().unwrap().bytes;
    assert_eq!(Envelope::parse(&answer).unwrap(), Envelope::Refused { call, reason: Refusal::Indeterminate });
    server.check_invariants();
}

/// A call still waiting for the application when the server dies never
/// ran: a copy after the restart runs it. One a query reaches first is
/// cancelled: it never runs.
#[test]
fn a_call_not_yet_started_runs_after_a_restart_or_is_cancelled_by_a_query() {
    let mut p = Pair::new();
    let waiting = p.caller.request(p.now, S, ECHO, Bytes::from_static(b"w"), false, None, false).unwrap();
    p.up();
    let mut server = Target::recover(config(), &replay(p.log.bytes()).0);
    server.register(ECHO);
    p.server = server;
    p.tick(config().ack_timeout + Duration::from_millis(1));
    p.up();
    assert_eq!(p.run_handlers(), 1, "it never ran, so it runs now");
    p.down();
    assert_eq!(p.caller.take(waiting).unwrap().1.as_deref(), Some(&b"echo:w"[..]));
    // Abandoned at its deadline while queued: the query cancels it.
    let call =
        p.caller.request(p.now, S, ECHO, Bytes::new(), false, Some(Duration::from_millis(1)), false).unwrap();
    p.up();
    p.tick(Duration::from_millis(2));
    assert_eq!(p.up(), 1, "the query");
    assert_eq!(p.run_handlers(), 0, "cancelled, not run");
    p.down();
    let state = p.caller.state(call).unwrap();
    assert_eq!((state.ack, state.executed()), (AckStatus::ErrorAck(Refusal::NotRun), Executed::No));
}

/// Without a log that outlives it, a server cannot know what an earlier
/// life of it ran: it never answers "did not run", only "indeterminate".
/// And before the application serves, a handler not yet registered is
/// "busy", not missing for good.
#[test]
fn a_server_without_a_durable_log_claims_nothing_did_not_run() {
    let mut log = MemLog::new(1 << 10);
    let mut server = Target::new(config());
    let call = CallId { client: 5, seq: 0 };
    let request = Envelope::Request { call, handler: ECHO, one_way: false, first_incomplete: 0, args: b"" };
    server.handle(Instant::from_nanos(1), C, &request.to_vec(), &mut log).unwrap();
    let answer = server.poll_transmit().unwrap().bytes;
    assert_eq!(Envelope::parse(&answer).unwrap(), Envelope::Refused { call, reason: Refusal::Busy });
    server.set_volatile(true);
    assert!(server.poll_dispatch(&mut log).is_none());
    server.handle(Instant::from_nanos(1), C, &request.to_vec(), &mut log).unwrap();
    let query = Envelope::Query { call: CallId { client: 5, seq: 1 }, first_incomplete: 0 };
    server.handle(Instant::from_nanos(1), C, &query.to_vec(), &mut log).unwrap();
    for seq in [0, 1] {
        let answer = server.poll_transmit().unwrap().bytes;
        let call = CallId { client: 5, seq };
        assert_eq!(
            Envelope::parse(&answer).unwrap(),
            Envelope::Refused { call, reason: Refusal::Indeterminate }
        );
    }
    server.check_invariants();
}

/// Requests waiting to run go when the caller's first incomplete frees
/// their entries: the queue is never longer than the entries.
#[test]
fn freed_calls_leave_the_run_queue() {
    let mut p = Pair::new();
    let request = |seq, first_incomplete| {
        let call = CallId { client: 9, seq };
        Envelope::Request { call, handler: ECHO, one_way: false, first_incomplete, args: b"x" }.to_vec()
    };
    for seq in 0..4 {
        p.server.handle(p.now, C, &request(seq, 0), &mut p.log).unwrap();
    }
    // The caller says it finished all four (it gave up on them).
    p.server.handle(p.now, C, &request(4, 4), &mut p.log).unwrap();
    assert_eq!(p.server.entries(), 1);
    let d = p.server.poll_dispatch(&mut p.log).unwrap();
    assert_eq!(d.call.seq, 4, "the four freed ones do not run");
    assert!(p.server.poll_dispatch(&mut p.log).is_none());
}
