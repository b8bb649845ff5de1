//! The caller's side of a call (Kaur's AMVIA initiator node, thesis
//! section 3.2.1, Figure 3.2): send the request, follow it through the
//! server's acknowledgement to its reply, retransmit while neither comes,
//! and give up (abandon) after `retries` retransmissions or at the call's
//! deadline, saying exactly what is known of whether the handler ran.
//!
//! The stream below already delivers each envelope exactly once between
//! two live incarnations; the caller retransmits only for what the stream
//! cannot repair: a server that died holding the request, or one that
//! died running the handler. A retransmitted request carries the same
//! call id, and the server's table (and log) answers it as the first copy
//! was answered.
//!
//! An abandoned call whose fate is unknown is resolved in the background:
//! the caller asks the server with a QUERY, which never runs the call and
//! fences one that has not arrived, so the answer is final: it ran (the
//! reply), it never will, or (the server died while running it) nobody
//! can tell. Until then the call holds back the caller's "first
//! incomplete", so the server keeps what it knows of it.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use bytes::Bytes;
use core::time::Duration;
use tether_proto::Instant;
use tether_wire::NodeId;

use crate::arena::Arena;
use crate::call::Refusal;
use crate::call::{AckStatus, CallId, CallRef, CallState, HandlerId, OperationStatus};
use crate::config::RpcConfig;
use crate::envelope::{Envelope, EnvelopeError};
use crate::target::Outgoing;

/// Why a call could not be made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    /// `credit` calls toward this server are open already: wait for one to
    /// finish. (Nothing was sent.)
    #[error("no credit left toward node {server}: {open} calls open")]
    NoCredit { server: NodeId, open: u32 },
    #[error("{max} calls are kept already (take or forget finished ones)")]
    TooManyCalls { max: usize },
    #[error("arguments of {len} bytes are larger than the {max} allowed")]
    TooLarge { len: usize, max: usize },
}

/// A call changed state (for calls the application watches).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallEvent {
    pub call: CallRef,
    pub state: CallState,
}

/// What the caller did, by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CallerStats {
    pub calls: u64,
    pub retransmissions: u64,
    pub queries: u64,
    pub replies: u64,
    pub abandoned: u64,
    pub resolved: u64,
    /// Envelopes that failed to parse, came to the wrong side, or named a
    /// call not kept here.
    pub malformed: u64,
    pub unknown_calls: u64,
    pub events_dropped: u64,
}

#[derive(Debug)]
struct Call {
    handler: HandlerId,
    args: Bytes,
    one_way: bool,
    state: CallState,
    /// Sends of the current phase (request, reply wait, or query), and
    /// the next one.
    sends: u32,
    next_send: Instant,
    interval: Duration,
    deadline: Option<Instant>,
    watch: bool,
    reply: Option<Bytes>,
    /// Abandoned with its fate unknown: queries go instead of requests.
    resolving: bool,
    /// Answered for good: no longer holds back the first incomplete.
    finished: bool,
    /// The application let go of it: dropped once finished (and, with a
    /// caller's log, once its end is logged).
    forgotten: bool,
    /// Its end went to the caller's log (`poll_ended`).
    end_logged: bool,
}

/// One endpoint's calls.
#[derive(Debug)]
pub struct Caller {
    config: RpcConfig,
    /// This life's id (the endpoint's incarnation): every call's `client`.
    life: u64,
    next_seq: BTreeMap<NodeId, u64>,
    calls: BTreeMap<CallRef, Call>,
    /// Calls not finished, for each server's first incomplete.
    open: BTreeSet<CallRef>,
    out: VecDeque<Outgoing>,
    /// Envelopes', arguments' and replies' bytes.
    arena: Arena,
    events: VecDeque<CallEvent>,
    /// Calls that ended since the runtime last looked, for a caller's log
    /// (`set_logging`).
    ended: VecDeque<CallRef>,
    logging: bool,
    stats: CallerStats,
}

impl Caller {
    pub fn new(config: RpcConfig, life: u64) -> Self {
        Caller {
            config,
            life,
            next_seq: BTreeMap::new(),
            calls: BTreeMap::new(),
            open: BTreeSet::new(),
            out: VecDeque::new(),
            arena: Arena::default(),
            events: VecDeque::new(),
            ended: VecDeque::new(),
            logging: false,
            stats: CallerStats::default(),
        }
    }

    pub fn life(&self) -> u64 {
        self.life
    }

    pub fn stats(&self) -> CallerStats {
        self.stats
    }

    /// Calls kept (open, or finished and not taken).
    pub fn len(&self) -> usize {
        self.calls.len()
    }

    pub fn is_empty(&self) -> bool {
        self.calls.is_empty()
    }

    /// Calls open toward `server` (of this life), against the credit.
    pub fn open_toward(&self, server: NodeId) -> u32 {
        let next = self.next_seq.get(&server).copied().unwrap_or(0);
        (next - self.first_incomplete(server, self.life)) as u32
    }

    /// Whether a call toward `server` may be made now (its credit is not
    /// all in use).
    pub fn has_credit(&self, server: NodeId) -> bool {
        self.open_toward(server) < self.config.credit
    }

    /// The lowest seq of `client`'s calls toward `server` not finished.
    fn first_incomplete(&self, server: NodeId, client: u64) -> u64 {
        let from = CallRef { server, id: CallId { client, seq: 0 } };
        match self.open.range(from..).next() {
            Some(c) if c.server == server && c.id.client == client => c.id.seq,
            _ if client == self.life => self.next_seq.get(&server).copied().unwrap_or(0),
            // An earlier life with nothing open: it needs nothing kept.
            _ => u64::MAX,
        }
    }

    /// Call `handler` on `server` with `args`. `deadline`: abandon the call
    /// if it has not finished by then. `watch`: report each of its state
    /// changes as an event.
    #[allow(clippy::too_many_arguments)]
    pub fn request(
        &mut self,
        now: Instant,
        server: NodeId,
        handler: HandlerId,
        args: impl AsRef<[u8]>,
        one_way: bool,
        deadline: Option<Duration>,
        watch: bool,
    ) -> Result<CallRef, CallError> {
        let args = args.as_ref();
        if args.len() > self.config.max_args {
            return Err(CallError::TooLarge { len: args.len(), max: self.config.max_args });
        }
        if self.calls.len() >= self.config.max_calls {
            return Err(CallError::TooManyCalls { max: self.config.max_calls });
        }
        let open = self.open_toward(server);
        if open >= self.config.credit {
            return Err(CallError::NoCredit { server, open });
        }
        let first_incomplete = self.first_incomplete(server, self.life);
        let seq = self.next_seq.entry(server).or_insert(0);
        assert!(first_incomplete <= *seq, "node {server}'s first incomplete call is past its next one");
        let id = CallId { client: self.life, seq: *seq };
        *seq += 1;
        let call = CallRef { server, id };
        let args = self.arena.copy(args);
        let env = Envelope::Request { call: id, handler, one_way, first_incomplete, args: &args };
        self.out.push_back(Outgoing::new(server, self.arena.envelope(&env)));
        let made = self.calls.insert(
            call,
            Call {
                handler,
                args,
                one_way,
                state: CallState::SENT,
                sends: 1,
                next_send: now + self.config.ack_timeout,
                interval: self.config.ack_timeout,
                deadline: deadline.map(|d| now + d),
                watch,
                reply: None,
                resolving: false,
                finished: false,
                forgotten: false,
                end_logged: false,
            },
        );
        assert!(made.is_none(), "call {call:?} made twice");
        assert!(self.open.insert(call), "call {call:?} open before it was made");
        // The check above let it through only with credit to spare.
        assert!(
            self.open_toward(server) <= self.config.credit,
            "more calls open toward node {server} than the credit"
        );
        self.stats.calls += 1;
        self.event(call);
        Ok(call)
    }

    /// Take up a call an earlier life of this endpoint made and did not
    /// see end (from its log, after a crash): its fate is asked of the
    /// server, never run again from here.
    pub fn adopt(&mut self, now: Instant, call: CallRef, watch: bool) {
        let unknown = CallState { ack: AckStatus::NotAcked, op: OperationStatus::RequestRtxExceeded };
        if self.take_up(call, unknown, None, false) {
            let c = self.calls.get_mut(&call).expect("taken up");
            (c.next_send, c.interval, c.watch, c.resolving) = (now, self.config.ack_timeout, watch, true);
            assert!(self.open.insert(call), "adopted call {call:?} was open already");
        }
    }

    /// An earlier life's `call`, as its log left it (`finished`: with its
    /// end); false if it is this life's or already here.
    fn take_up(&mut self, call: CallRef, state: CallState, reply: Option<Bytes>, finished: bool) -> bool {
        if call.id.client == self.life || self.calls.contains_key(&call) {
            return false;
        }
        let c = Call {
            handler: 0,
            args: Bytes::new(),
            one_way: false,
            state,
            sends: 0,
            next_send: Instant::ZERO,
            interval: Duration::ZERO,
            deadline: None,
            watch: false,
            reply,
            resolving: false,
            finished,
            forgotten: false,
            end_logged: finished,
        };
        self.calls.insert(call, c);
        true
    }

    /// Keep the calls that end for `poll_ended` (a caller's log writes
    /// each one's end).
    pub fn set_logging(&mut self, on: bool) {
        self.logging = on;
    }

    /// A call that ended since last asked, its state and reply.
    pub fn poll_ended(&mut self) -> Option<(CallRef, CallState, Option<Bytes>)> {
        while let Some(call) = self.ended.pop_front() {
            let Some(c) = self.calls.get_mut(&call) else { continue };
            // Queued by `finish`, once: an end is logged once.
            assert!(
                c.finished && !c.end_logged,
                "call {call:?} queued for its end's record twice or unended"
            );
            c.end_logged = true;
            let ended = (call, c.state, c.reply.clone());
            if c.forgotten {
                self.calls.remove(&call);
            }
            return Some(ended);
        }
        None
    }

    /// A call an earlier life saw end (its caller's log said so), kept
    /// for the application to ask about.
    pub fn restore(&mut self, call: CallRef, state: CallState, reply: Option<Bytes>) {
        self.take_up(call, state, reply, true);
    }

    /// Calls of earlier lives this caller took up (`adopt`, `restore`).
    pub fn earlier(&self) -> Vec<CallRef> {
        self.calls.keys().filter(|c| c.id.client != self.life).copied().collect()
    }

    /// Undo a call just made whose request has not left (its log could
    /// not record it): it never happened.
    pub fn withdraw(&mut self, call: CallRef) {
        if self.calls.remove(&call).is_some() {
            self.open.remove(&call);
            // Its request is the newest envelope queued.
            self.out.pop_back();
            if self.next_seq.get(&call.server) == Some(&(call.id.seq + 1)) {
                self.next_seq.insert(call.server, call.id.seq);
            }
        }
    }

    /// What a caller's log must keep: each call not ended (issued) and each
    /// ended one the application has not let go of; what a compaction
    /// writes.
    pub fn live_records(&self) -> Vec<crate::Record<'_>> {
        self.calls
            .iter()
            .map(|(c, call)| match call.finished {
                false => crate::Record::Issued {
                    node: c.server,
                    call: c.id,
                    handler: call.handler,
                    one_way: call.one_way,
                },
                true => crate::Record::Ended {
                    node: c.server,
                    call: c.id,
                    state: call.state,
                    result: call.reply.as_deref().unwrap_or(&[]),
                },
            })
            .collect()
    }

    /// Where `call` stands.
    pub fn state(&self, call: CallRef) -> Option<CallState> {
        self.calls.get(&call).map(|c| c.state)
    }

    /// Whether `call` is answered for good (its state will not change).
    pub fn finished(&self, call: CallRef) -> Option<bool> {
        self.calls.get(&call).map(|c| c.finished)
    }

    /// The reply of `call`, once it came.
    pub fn reply(&self, call: CallRef) -> Option<Bytes> {
        self.calls.get(&call)?.reply.clone()
    }

    /// The reply of a finished call, and the call let go of.
    pub fn take(&mut self, call: CallRef) -> Option<(CallState, Option<Bytes>)> {
        let c = self.calls.get_mut(&call)?;
        if !c.finished {
            return None;
        }
        if self.logging && !c.end_logged {
            // Dropped once its end is logged.
            c.forgotten = true;
            return Some((c.state, c.reply.clone()));
        }
        let c = self.calls.remove(&call).expect("looked up");
        Some((c.state, c.reply))
    }

    /// Let go of `call`: dropped now if finished, else once it is.
    pub fn forget(&mut self, call: CallRef) {
        match self.calls.get_mut(&call) {
            Some(c) if c.finished && (c.end_logged || !self.logging) => {
                self.calls.remove(&call);
            }
            Some(c) => {
                c.forgotten = true;
                c.watch = false;
            }
            None => {}
        }
    }

    /// The next envelope to send.
    pub fn poll_transmit(&mut self) -> Option<Outgoing> {
        self.out.pop_front()
    }

    /// The next state change of a watched call.
    pub fn poll_event(&mut self) -> Option<CallEvent> {
        self.events.pop_front()
    }

    fn event(&mut self, call: CallRef) {
        let Some(c) = self.calls.get(&call) else { return };
        if !c.watch {
            return;
        }
        if self.events.len() >= self.config.max_events {
            self.events.pop_front();
            self.stats.events_dropped += 1;
        }
        self.events.push_back(CallEvent { call, state: c.state });
        assert!(self.events.len() <= self.config.max_events.max(1), "more events kept than max_events");
    }

    /// An envelope for the caller's side (ACK, REFUSED, REPLY, ACK_REQUEST)
    /// from `from`, as the stream delivered it: parsed, then handled (`handle_envelope`).
    pub fn handle(&mut self, now: Instant, from: NodeId, bytes: &[u8]) -> Result<(), EnvelopeError> {
        let env = Envelope::parse(bytes).inspect_err(|_| self.stats.malformed += 1)?;
        self.handle_envelope(now, from, env);
        Ok(())
    }

    /// An envelope for the caller's side from `from`, parsed (once, by
    /// whoever decided it is the caller's: `Envelope::for_server`). One
    /// for the server's side is counted malformed and does nothing.
    pub fn handle_envelope(&mut self, now: Instant, from: NodeId, env: Envelope<'_>) {
        let (id, answer) = match env {
            Envelope::Ack { call } => (call, Answer::Ack),
            Envelope::Refused { call, reason } => (call, Answer::Refused(reason)),
            Envelope::Reply { call, result } => (call, Answer::Reply(result)),
            Envelope::AckRequest { client } => {
                let first_incomplete = self.first_incomplete(from, client);
                let env = Envelope::ReplyAck { client, first_incomplete };
                self.out.push_back(Outgoing::new(from, self.arena.envelope(&env)));
                return;
            }
            Envelope::Request { .. } | Envelope::Query { .. } | Envelope::ReplyAck { .. } => {
                self.stats.malformed += 1;
                return;
            }
        };
        let call = CallRef { server: from, id };
        let Some(c) = self.calls.get_mut(&call) else {
            self.stats.unknown_calls += 1;
            return;
        };
        if c.finished {
            // A late copy of an answer already taken in.
            return;
        }
        match answer {
            Answer::Ack if c.one_way && !c.resolving => {
                advance(call, c, CallState::PROCESSED);
                self.finish(call);
            }
            Answer::Ack => {
                if c.state.ack == AckStatus::NotAcked && !c.resolving {
                    advance(call, c, CallState::PROCESSING);
                    c.sends = 0;
                }
                // Running: wait for its reply, then ask again.
                c.interval = self.config.reply_timeout;
                c.next_send = now + c.interval;
                if !c.resolving {
                    self.event(call);
                }
            }
            Answer::Reply(result) => {
                advance(call, c, CallState::PROCESSED);
                c.reply = Some(self.arena.copy(result));
                self.stats.replies += 1;
                self.finish(call);
            }
            Answer::Refused(Refusal::Busy) => {
                // This copy did not run; an earlier one may still: try
                // again later, as a retransmission.
                c.next_send = now + c.interval;
            }
            Answer::Refused(reason) => {
                advance(call, c, CallState::refused(reason));
                self.finish(call);
            }
        }
    }

    /// `call` is answered for good.
    fn finish(&mut self, call: CallRef) {
        let c = self.calls.get_mut(&call).expect("kept");
        assert!(!c.finished, "call {call:?} finished twice");
        // Answered, or abandoned with its fate unknown: either way final.
        assert!(c.state.is_final(), "call {call:?} finished in {:?}, not a final state", c.state);
        if c.resolving {
            self.stats.resolved += 1;
        }
        c.finished = true;
        c.resolving = false;
        let forgotten = c.forgotten;
        assert!(self.open.remove(&call), "finished call {call:?} was not open");
        self.event(call);
        if self.logging {
            self.ended.push_back(call);
        }
        if forgotten && !self.logging {
            self.calls.remove(&call);
        }
    }

    /// Retransmit, abandon, resolve: whatever is due at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        let due: Vec<CallRef> = self
            .open
            .iter()
            .filter(|c| {
                let call = &self.calls[c];
                call.next_send <= now || (!call.resolving && call.deadline.is_some_and(|d| d <= now))
            })
            .copied()
            .collect();
        for call in due {
            let first_incomplete = self.first_incomplete(call.server, call.id.client);
            assert!(first_incomplete <= call.id.seq, "open call {call:?} below its first incomplete");
            let (retries, cap) = (self.config.retries, self.config.max_retry_interval);
            let c = self.calls.get_mut(&call).expect("open calls are kept");
            let past_deadline = !c.resolving && c.deadline.is_some_and(|d| d <= now);
            if past_deadline || (c.sends > retries && !c.resolving) {
                // Abandon (AMVIA's abandon states), then learn its fate.
                let abandoned = match (past_deadline, c.state.ack) {
                    (true, ack) => CallState { ack, op: OperationStatus::DeadlineExceeded },
                    (false, AckStatus::Acked) => {
                        CallState { ack: AckStatus::ReplyRtxExceeded, op: OperationStatus::RequestSent }
                    }
                    (false, ack) => CallState { ack, op: OperationStatus::RequestRtxExceeded },
                };
                advance(call, c, abandoned);
                c.resolving = true;
                c.sends = 0;
                c.interval = self.config.ack_timeout;
                c.next_send = now;
                self.stats.abandoned += 1;
                self.event(call);
            }
            let c = self.calls.get_mut(&call).expect("kept");
            if c.next_send > now {
                continue;
            }
            if c.resolving && c.sends > retries {
                // Nobody answers: its fate stays unknown.
                c.resolving = false;
                self.finish(call);
                continue;
            }
            let env = if c.resolving {
                self.stats.queries += 1;
                Envelope::Query { call: call.id, first_incomplete }
            } else {
                Envelope::Request {
                    call: call.id,
                    handler: c.handler,
                    one_way: c.one_way,
                    first_incomplete,
                    args: &c.args,
                }
            };
            if c.sends > 0 {
                self.stats.retransmissions += 1;
            }
            c.sends += 1;
            // Each phase ends after its k retransmissions (above).
            assert!(c.sends - 1 <= retries, "call {call:?} sent {} times in one phase", c.sends);
            c.next_send = now + c.interval;
            c.interval = (c.interval * 2).min(cap);
            let bytes = self.arena.envelope(&env);
            self.out.push_back(Outgoing::new(call.server, bytes));
        }
    }

    /// When `handle_timeout` has something to do.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.open
            .iter()
            .map(|c| {
                let call = &self.calls[c];
                match call.deadline {
                    Some(d) if !call.resolving => d.min(call.next_send),
                    _ => call.next_send,
                }
            })
            .min()
    }

    /// The caller's tables checked against each other, a pass over every
    /// call (tests and the simulator run it after each step; the
    /// assertions at each change are the cheap half): the open set is
    /// exactly the calls not finished, each state fits where its call
    /// stands, no server has more calls open than the credit, and nothing
    /// kept is past its bound.
    pub fn check_invariants(&self) {
        let mut this_life = 0;
        for (call, c) in &self.calls {
            assert_eq!(
                self.open.contains(call),
                !c.finished,
                "call {call:?}: the open set disagrees with it"
            );
            assert!(!(c.finished && c.resolving), "call {call:?}: finished and still being resolved");
            assert!(
                c.finished || c.resolving || call.id.client == self.life,
                "call {call:?}: an earlier life's, open, not being resolved"
            );
            assert!(c.finished || !c.end_logged, "call {call:?}: its end logged before it ended");
            // Let go of and its end logged: nothing keeps it.
            assert!(
                !(c.forgotten && c.finished && c.end_logged),
                "call {call:?}: kept after it was let go of"
            );
            if call.id.client != self.life {
                // Taken up from a caller's log: as the log says.
                continue;
            }
            this_life += 1;
            let next = self.next_seq.get(&call.server).copied().unwrap_or(0);
            assert!(call.id.seq < next, "call {call:?}: at or past its server's next seq {next}");
            assert!(
                c.sends <= self.config.retries.saturating_add(1),
                "call {call:?}: {} sends in one phase",
                c.sends
            );
            let fits = match (c.finished, c.resolving) {
                (true, _) => c.state.is_final(),
                // Abandoned, its fate asked of the server.
                (false, true) => c.state.stage() == 3,
                (false, false) => c.state == CallState::SENT || c.state == CallState::PROCESSING,
            };
            assert!(
                fits,
                "call {call:?}: state {:?} where it stands (finished {}, resolving {})",
                c.state, c.finished, c.resolving
            );
        }
        assert!(
            this_life <= self.config.max_calls,
            "{this_life} calls made, max_calls {}",
            self.config.max_calls
        );
        for &server in self.next_seq.keys() {
            let open = self.open_toward(server);
            assert!(
                open <= self.config.credit,
                "{open} calls open toward node {server}, credit {}",
                self.config.credit
            );
        }
        for call in &self.ended {
            if let Some(c) = self.calls.get(call) {
                assert!(
                    c.finished && !c.end_logged,
                    "call {call:?}: queued for its end's record, yet unended or logged"
                );
            }
        }
        assert!(self.events.len() <= self.config.max_events.max(1), "more events kept than max_events");
    }
}

/// `call` moves to `next`: a later stage than where it stands, never back
/// (`CallState::may_become`), and never once it is finished.
fn advance(call: CallRef, c: &mut Call, next: CallState) {
    assert!(!c.finished, "finished call {call:?} changed state to {next:?}");
    assert!(c.state.may_become(next), "call {call:?} went from {:?} back or across to {next:?}", c.state);
    c.state = next;
}

enum Answer<'a> {
    Ack,
    Refused(Refusal),
    Reply(&'a [u8]),
}
