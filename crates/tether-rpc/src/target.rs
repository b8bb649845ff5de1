//! The server's side of a call (Kaur's AMVIA target node, thesis section
//! 3.2.2, Figure 3.3): look the handler up, acknowledge that it starts,
//! hand it to the application, and send its reply; and, across its own
//! crashes, never run a call twice.
//!
//! Every call a server heard of is an entry under (node, caller life,
//! seq). The entry is logged before the server acts on it: `Started`
//! before the handler runs, `Completed` (with the reply) before the reply
//! goes out, `Refused` before a refusal that promises the call will never
//! run. A restarted server rebuilds its entries from the log
//! (`Target::recover`); a handler that was running when it died is
//! `Interrupted`, and a copy of that call is answered "indeterminate",
//! never run again. Entries are freed by the caller's "first incomplete"
//! (RIFL, Lee et al., SOSP'15), carried on its requests or, when it has
//! gone quiet, asked for with an ACK request; a call below it is stale
//! and refused. What a server holds is bounded: per caller life at most
//! `credit` entries (the credit-based flow control of AMVIA section 3.3),
//! per node at most `lives_per_node` lives, each reply at most
//! `max_reply` bytes.
//!
//! Identity: the node an envelope came from is the one the stream below
//! proved (its handshake); the envelope's own fields only name a call of
//! that node. One node cannot touch another's entries.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use bytes::Bytes;
use core::time::Duration;
use tether_proto::Instant;
use tether_wire::NodeId;

use crate::arena::Arena;
use crate::call::Refusal;
use crate::call::{CallId, HandlerId};
use crate::config::RpcConfig;
use crate::envelope::{Envelope, EnvelopeError};
use crate::record::{CallLog, LogError, Record};

/// A handler to run for the application: it runs it and calls
/// `Target::complete` with the result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dispatch {
    pub from: NodeId,
    pub call: CallId,
    pub handler: HandlerId,
    pub one_way: bool,
    pub args: Bytes,
}

/// An envelope for the stream to carry to `to`, as one message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outgoing {
    pub to: NodeId,
    pub bytes: Bytes,
    /// The ACK of this call, which its reply makes unnecessary while both
    /// still wait here.
    ack_of: Option<CallId>,
}

impl Outgoing {
    pub(crate) fn new(to: NodeId, bytes: Bytes) -> Self {
        Outgoing { to, bytes, ack_of: None }
    }
}

/// What the server did, by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TargetStats {
    pub requests: u64,
    /// Copies of a call already known here, answered from its entry.
    pub duplicates: u64,
    pub handlers_started: u64,
    pub replies: u64,
    /// ACKs not sent because the reply followed at once.
    pub acks_elided: u64,
    pub queries: u64,
    pub refused_not_found: u64,
    pub refused_busy: u64,
    pub refused_stale: u64,
    pub refused_not_run: u64,
    pub refused_indeterminate: u64,
    pub ack_requests: u64,
    /// Envelopes that failed to parse or came to the wrong side.
    pub malformed: u64,
    /// Completions for a call no longer running here (its life forgotten).
    pub late_completions: u64,
    pub log_compactions: u64,
}

/// Why a completion was not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CompleteError {
    #[error("no call {call:?} of node {from} is running here")]
    NotRunning { from: NodeId, call: CallId },
    #[error("reply of {len} bytes is larger than the {max} allowed")]
    TooLarge { len: usize, max: usize },
    /// The completion record could not be written: the reply was not sent
    /// and the call still runs (try again once the log has room).
    #[error(transparent)]
    Log(#[from] LogError),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Entry {
    /// Waiting for the application to take it (`poll_dispatch`): not
    /// started, not logged. A server that dies now never ran it, and a
    /// copy after its restart runs it.
    Queued,
    Running {
        one_way: bool,
    },
    /// It was running when an earlier life of this server died.
    Interrupted,
    Replied(Bytes),
    OneWayDone,
    Refused(Refusal),
}

#[derive(Debug, Default)]
struct Life {
    first_incomplete: u64,
    entries: BTreeMap<u64, Entry>,
    last_heard: Instant,
    /// When to ask for the first incomplete again, and how long after that.
    ask_at: Option<Instant>,
    ask_interval: Duration,
}

impl Life {
    /// Holds something only the caller's acknowledgement frees.
    fn holds_answers(&self) -> bool {
        self.entries.values().any(|e| !matches!(e, Entry::Queued | Entry::Running { .. }))
    }
}

#[derive(Debug, Default)]
struct NodeCalls {
    /// Lives below this are forgotten.
    below: u64,
    lives: BTreeMap<u64, Life>,
}

/// One server endpoint's calls.
#[derive(Debug)]
pub struct Target {
    config: RpcConfig,
    handlers: BTreeSet<HandlerId>,
    nodes: BTreeMap<NodeId, NodeCalls>,
    out: VecDeque<Outgoing>,
    /// Envelopes', arguments' and replies' bytes.
    arena: Arena,
    runnable: VecDeque<Dispatch>,
    stats: TargetStats,
    /// The log outlives the server (a file): what it does not hold never
    /// happened. Without one, a restarted server cannot know what its
    /// predecessor ran, so it never claims a call did not run
    /// (`set_volatile`).
    volatile: bool,
    /// The application has started serving (`poll_dispatch`): until then a
    /// request for a handler not registered yet is refused as busy, not as
    /// missing for good.
    open: bool,
}

impl Target {
    pub fn new(config: RpcConfig) -> Self {
        Target {
            config,
            handlers: BTreeSet::new(),
            nodes: BTreeMap::new(),
            out: VecDeque::new(),
            arena: Arena::default(),
            runnable: VecDeque::new(),
            stats: TargetStats::default(),
            volatile: false,
            open: false,
        }
    }

    /// The log does not outlive the server (memory): an unknown call may
    /// have run in an earlier life of it, so a query for one and a request
    /// for a handler not registered are answered "indeterminate", never
    /// "did not run" (the call layer's final states stay true without a
    /// log file, only less sure).
    pub fn set_volatile(&mut self, volatile: bool) {
        self.volatile = volatile;
    }

    /// A server restarted on the log its predecessor wrote (`records`, as
    /// `record::replay` read them): every call it answered is answered the
    /// same way again, every call it was running is indeterminate.
    pub fn recover(config: RpcConfig, records: &[Record<'_>]) -> Self {
        let mut t = Target::new(config);
        for r in records {
            match *r {
                Record::Started { node, call, one_way, .. } => {
                    if let Some(life) = t.replayed_life(node, call) {
                        life.entries.insert(call.seq, Entry::Running { one_way });
                    }
                }
                Record::Completed { node, call, result } => {
                    let reply = t.arena.copy(result);
                    if let Some(life) = t.replayed_life(node, call) {
                        let one_way =
                            matches!(life.entries.get(&call.seq), Some(Entry::Running { one_way: true }));
                        let done = if one_way { Entry::OneWayDone } else { Entry::Replied(reply) };
                        life.entries.insert(call.seq, done);
                    }
                }
                Record::Refused { node, call, reason } => {
                    if let Some(life) = t.replayed_life(node, call) {
                        life.entries.insert(call.seq, Entry::Refused(reason));
                    }
                }
                Record::Forget { node, client, first_incomplete } => {
                    let call = CallId { client, seq: first_incomplete };
                    if let Some(life) = t.replayed_life(node, call) {
                        forget_below(life, first_incomplete);
                    }
                }
                Record::ForgetClients { node, below } => {
                    let n = t.nodes.entry(node).or_default();
                    n.below = n.below.max(below);
                    n.lives.retain(|&client, _| client >= below);
                }
                // A caller's records: not the server's business.
                Record::Issued { .. } | Record::Ended { .. } => {}
            }
        }
        let credit = t.config.credit as u64;
        for life in t.nodes.values_mut().flat_map(|n| n.lives.values_mut()) {
            // The log holds every call since its last compaction, but no
            // call was taken more than `credit` above the first incomplete
            // the caller had reported: everything that far below the
            // newest was freed before the crash (its `Forget` is not
            // logged, see `forget_below`), and the bound holds again.
            if let Some((&newest, _)) = life.entries.last_key_value() {
                forget_below(life, newest.saturating_add(1).saturating_sub(credit));
            }
            for e in life.entries.values_mut() {
                if matches!(e, Entry::Running { .. }) {
                    *e = Entry::Interrupted;
                }
            }
            // Ask soon: the callers may have finished with these already.
            life.ask_interval = t.config.ack_request_after;
            life.ask_at = Some(Instant::ZERO);
        }
        t
    }

    fn replayed_life(&mut self, node: NodeId, call: CallId) -> Option<&mut Life> {
        let n = self.nodes.entry(node).or_default();
        if call.client < n.below {
            return None;
        }
        Some(n.lives.entry(call.client).or_default())
    }

    /// Handlers are looked up by id; one not registered is refused
    /// (`NotFound`, logged: the call never runs under that id).
    pub fn register(&mut self, handler: HandlerId) {
        self.handlers.insert(handler);
    }

    pub fn unregister(&mut self, handler: HandlerId) {
        self.handlers.remove(&handler);
    }

    pub fn stats(&self) -> TargetStats {
        self.stats
    }

    /// The next handler to run, started: its start is logged and its
    /// acknowledgement queued (AMVIA's ACK says the handler started). A
    /// call whose start the log cannot take is refused (`Busy`: it did
    /// not run) and the next one tried.
    pub fn poll_dispatch(&mut self, log: &mut dyn CallLog) -> Option<Dispatch> {
        self.open = true;
        while let Some(d) = self.runnable.pop_front() {
            let entry = self
                .nodes
                .get(&d.from)
                .and_then(|n| n.lives.get(&d.call.client))
                .and_then(|l| l.entries.get(&d.call.seq));
            if entry != Some(&Entry::Queued) {
                // Its life was forgotten meanwhile.
                continue;
            }
            let record =
                Record::Started { node: d.from, call: d.call, handler: d.handler, one_way: d.one_way };
            let started = append(log, &record, &self.nodes, &mut self.stats).is_ok();
            let life =
                self.nodes.get_mut(&d.from).and_then(|n| n.lives.get_mut(&d.call.client)).expect("looked up");
            if !started {
                let was = life.entries.remove(&d.call.seq);
                assert_eq!(
                    was,
                    Some(Entry::Queued),
                    "call {:?} of node {} dropped from the queue",
                    d.call,
                    d.from
                );
                self.refuse(d.from, d.call, Refusal::Busy);
                continue;
            }
            let was = life.entries.insert(d.call.seq, Entry::Running { one_way: d.one_way });
            assert_eq!(
                was,
                Some(Entry::Queued),
                "call {:?} of node {} started, not from the queue",
                d.call,
                d.from
            );
            self.stats.handlers_started += 1;
            self.send(d.from, Envelope::Ack { call: d.call }, Some(d.call));
            return Some(d);
        }
        None
    }

    /// The next envelope to send.
    pub fn poll_transmit(&mut self) -> Option<Outgoing> {
        self.out.pop_front()
    }

    /// An envelope for the server side (REQUEST, QUERY, REPLY_ACK) from
    /// `from`, as the stream delivered it: parsed, then handled (`handle_envelope`). A
    /// malformed one is counted and its error returned; nothing else
    /// happens.
    pub fn handle(
        &mut self,
        now: Instant,
        from: NodeId,
        bytes: &[u8],
        log: &mut dyn CallLog,
    ) -> Result<(), EnvelopeError> {
        let env = self.parse(bytes)?;
        self.handle_envelope(now, from, env, log);
        Ok(())
    }

    /// Parse an envelope that came in; a malformed one is counted here
    /// (unparseable bytes are the server side's to count, whoever got them).
    pub fn parse<'a>(&mut self, bytes: &'a [u8]) -> Result<Envelope<'a>, EnvelopeError> {
        Envelope::parse(bytes).inspect_err(|_| self.stats.malformed += 1)
    }

    /// An envelope for the server side from `from`, parsed (once, by
    /// whoever decided it is the server's: `Envelope::for_server`). One
    /// for the caller's side is counted malformed and does nothing.
    pub fn handle_envelope(&mut self, now: Instant, from: NodeId, env: Envelope<'_>, log: &mut dyn CallLog) {
        match env {
            Envelope::Request { call, handler, one_way, first_incomplete, args } => {
                self.stats.requests += 1;
                self.request(now, from, call, first_incomplete, log, Some((handler, one_way, args)));
            }
            Envelope::Query { call, first_incomplete } => {
                self.stats.queries += 1;
                self.request(now, from, call, first_incomplete, log, None);
            }
            Envelope::ReplyAck { client, first_incomplete } => {
                let call = CallId { client, seq: first_incomplete };
                if let Some(n) = self.nodes.get_mut(&from) {
                    if let Some(life) = n.lives.get_mut(&client) {
                        life.last_heard = now;
                        let freed = forget_below(life, call.seq);
                        life.ask_at = None;
                        if freed {
                            self.prune_runnable();
                        }
                    }
                }
            }
            Envelope::Ack { .. }
            | Envelope::Refused { .. }
            | Envelope::Reply { .. }
            | Envelope::AckRequest { .. } => {
                self.stats.malformed += 1;
            }
        }
    }

    /// A request (`Some(handler, one_way, args)`) or a query (`None`) for
    /// `call` of `from`.
    fn request(
        &mut self,
        now: Instant,
        from: NodeId,
        call: CallId,
        first_incomplete: u64,
        log: &mut dyn CallLog,
        run: Option<(HandlerId, bool, &[u8])>,
    ) {
        let below = self.nodes.get(&from).map_or(0, |n| n.below);
        let (first_incomplete, entry, freed) = match self.life(now, from, call.client) {
            Ok(life) => {
                life.last_heard = now;
                let freed = forget_below(life, first_incomplete);
                (life.first_incomplete, life.entries.get(&call.seq).cloned(), freed)
            }
            Err(reason) => return self.refuse(from, call, reason),
        };
        if freed || self.nodes.get(&from).map_or(0, |n| n.below) != below {
            // Entries freed (or a life forgotten to make room): their
            // requests waiting to run go with them.
            self.prune_runnable();
        }
        if call.seq < first_incomplete {
            return self.refuse(from, call, Refusal::Stale);
        }
        if let Some(entry) = entry {
            self.stats.duplicates += 1;
            let answer = match entry {
                // A query for a call not started yet: it never will be.
                Entry::Queued if run.is_none() => return self.cancel(from, call, log),
                // It will be acknowledged when it starts.
                Entry::Queued => return,
                Entry::Running { .. } | Entry::OneWayDone => Envelope::Ack { call },
                Entry::Interrupted => Envelope::Refused { call, reason: Refusal::Indeterminate },
                Entry::Replied(r) => {
                    let env = self.arena.envelope(&Envelope::Reply { call, result: &r });
                    self.out.push_back(Outgoing::new(from, env));
                    return;
                }
                Entry::Refused(reason) => Envelope::Refused { call, reason },
            };
            if let Envelope::Refused { reason, .. } = answer {
                return self.refuse(from, call, reason);
            }
            return self.send(from, answer, None);
        }
        if call.seq >= first_incomplete.saturating_add(self.config.credit as u64) {
            return self.refuse(from, call, Refusal::Busy);
        }
        if let Some((handler, _, args)) = run {
            // Larger than any caller may send, or for a handler not
            // registered while the application has not begun serving (it
            // registers them first): not now, and nothing kept.
            if args.len() > self.config.max_args || (!self.open && !self.handlers.contains(&handler)) {
                return self.refuse(from, call, Refusal::Busy);
            }
        }
        if let Some((handler, one_way, args)) = run.filter(|(h, ..)| self.handlers.contains(h)) {
            // Started (logged, acknowledged) when the application takes it.
            let life =
                self.nodes.get_mut(&from).and_then(|n| n.lives.get_mut(&call.client)).expect("made above");
            let was = life.entries.insert(call.seq, Entry::Queued);
            assert_eq!(was, None, "new call {call:?} of node {from} queued over an entry");
            let args = self.arena.copy(args);
            self.runnable.push_back(Dispatch { from, call, handler, one_way, args });
            return;
        }
        let (record, entry, answer) = match run {
            Some(_) => (
                Record::Refused { node: from, call, reason: Refusal::NotFound },
                Entry::Refused(Refusal::NotFound),
                Envelope::Refused { call, reason: Refusal::NotFound },
            ),
            None => (
                Record::Refused { node: from, call, reason: Refusal::NotRun },
                Entry::Refused(Refusal::NotRun),
                Envelope::Refused { call, reason: Refusal::NotRun },
            ),
        };
        if append(log, &record, &self.nodes, &mut self.stats).is_err() {
            // Nothing may happen that the log does not hold.
            return self.refuse(from, call, Refusal::Busy);
        }
        let life = self.nodes.get_mut(&from).and_then(|n| n.lives.get_mut(&call.client)).expect("made above");
        let was = life.entries.insert(call.seq, entry);
        assert_eq!(was, None, "new call {call:?} of node {from} refused over an entry");
        if let Envelope::Refused { reason, .. } = answer {
            self.refuse(from, call, reason);
        }
    }

    /// Requests waiting to run whose entry is gone (freed by the caller's
    /// first incomplete, or its life forgotten): dropped, so the queue is
    /// never longer than the entries.
    fn prune_runnable(&mut self) {
        let nodes = &self.nodes;
        self.runnable.retain(|d| {
            let entry = nodes
                .get(&d.from)
                .and_then(|n| n.lives.get(&d.call.client))
                .and_then(|l| l.entries.get(&d.call.seq));
            entry == Some(&Entry::Queued)
        });
    }

    /// A query came for `call` while it waits to start: it never will
    /// (logged as fenced, taken out of the queue).
    fn cancel(&mut self, from: NodeId, call: CallId, log: &mut dyn CallLog) {
        let record = Record::Refused { node: from, call, reason: Refusal::NotRun };
        if append(log, &record, &self.nodes, &mut self.stats).is_err() {
            // Still queued; the caller asks again.
            return;
        }
        self.runnable.retain(|d| !(d.from == from && d.call == call));
        if let Some(life) = self.nodes.get_mut(&from).and_then(|n| n.lives.get_mut(&call.client)) {
            let was = life.entries.insert(call.seq, Entry::Refused(Refusal::NotRun));
            assert_eq!(was, Some(Entry::Queued), "call {call:?} of node {from} fenced, not from the queue");
        }
        self.refuse(from, call, Refusal::NotRun);
    }

    /// The life `client` of `from`, made if new: an older life than every
    /// one remembered, or a forgotten one, is refused as stale.
    fn life(&mut self, now: Instant, from: NodeId, client: u64) -> Result<&mut Life, Refusal> {
        let lives = self.config.lives_per_node.max(1);
        let node = self.nodes.entry(from).or_default();
        if client < node.below {
            return Err(Refusal::Stale);
        }
        if !node.lives.contains_key(&client) && node.lives.len() >= lives {
            let oldest = *node.lives.keys().next().expect("full");
            if client < oldest {
                return Err(Refusal::Stale);
            }
            // Every life kept is at or above `below`, so it only rises.
            assert!(
                oldest >= node.below,
                "node {from}'s life {oldest} kept below the forgotten ({})",
                node.below
            );
            // Forgotten in memory only (see `live_records`).
            node.below = oldest.saturating_add(1);
            node.lives.remove(&oldest);
        }
        Ok(node.lives.entry(client).or_insert_with(|| Life { last_heard: now, ..Life::default() }))
    }

    fn refuse(&mut self, to: NodeId, call: CallId, reason: Refusal) {
        let reason = match reason {
            // Without a log that outlives it, a server cannot know what an
            // earlier life of it ran: it claims nothing did not run.
            Refusal::NotFound | Refusal::NotRun if self.volatile => Refusal::Indeterminate,
            other => other,
        };
        match reason {
            Refusal::NotFound => self.stats.refused_not_found += 1,
            Refusal::Busy => self.stats.refused_busy += 1,
            Refusal::Stale => self.stats.refused_stale += 1,
            Refusal::NotRun => self.stats.refused_not_run += 1,
            Refusal::Indeterminate => self.stats.refused_indeterminate += 1,
        }
        self.send(to, Envelope::Refused { call, reason }, None);
    }

    fn send(&mut self, to: NodeId, env: Envelope<'_>, ack_of: Option<CallId>) {
        self.out.push_back(Outgoing { to, bytes: self.arena.envelope(&env), ack_of });
    }

    /// The application's handler for `call` of `from` finished with
    /// `result` (ignored for a one-way call). Logged, then the reply
    /// queued; an ACK of the call still waiting to go is dropped, the
    /// reply saying more.
    pub fn complete(
        &mut self,
        from: NodeId,
        call: CallId,
        result: &[u8],
        log: &mut dyn CallLog,
    ) -> Result<(), CompleteError> {
        let entry = self
            .nodes
            .get(&from)
            .and_then(|n| n.lives.get(&call.client))
            .and_then(|l| l.entries.get(&call.seq));
        let Some(&Entry::Running { one_way }) = entry else {
            self.stats.late_completions += 1;
            return Err(CompleteError::NotRunning { from, call });
        };
        if !one_way && result.len() > self.config.max_reply {
            return Err(CompleteError::TooLarge { len: result.len(), max: self.config.max_reply });
        }
        let result = if one_way { &[][..] } else { result };
        append(log, &Record::Completed { node: from, call, result }, &self.nodes, &mut self.stats)?;
        let life =
            self.nodes.get_mut(&from).and_then(|n| n.lives.get_mut(&call.client)).expect("looked up above");
        let done = if one_way { Entry::OneWayDone } else { Entry::Replied(self.arena.copy(result)) };
        // Only a running call completes, and only once (the log took it).
        let was = life.entries.insert(call.seq, done);
        assert_eq!(
            was,
            Some(Entry::Running { one_way }),
            "call {call:?} of node {from} completed, not running"
        );
        if one_way {
            return Ok(());
        }
        if life.ask_at.is_none() {
            life.ask_interval = self.config.ack_request_after;
            life.ask_at = Some(life.last_heard + life.ask_interval);
        }
        self.stats.replies += 1;
        if let Some(i) = self.out.iter().rposition(|o| o.to == from && o.ack_of == Some(call)) {
            self.out.remove(i);
            self.stats.acks_elided += 1;
        }
        self.send(from, Envelope::Reply { call, result }, None);
        Ok(())
    }

    /// Ask callers that went quiet holding replies here for their first
    /// incomplete call, so the replies can be freed.
    pub fn handle_timeout(&mut self, now: Instant) {
        let cap = self.config.max_retry_interval;
        let mut asks = Vec::new();
        for (&node, n) in &mut self.nodes {
            for (&client, life) in &mut n.lives {
                if life.ask_at.is_some_and(|t| t <= now)
                    || (life.ask_at.is_none() && life.ask_interval.is_zero())
                {
                    if !life.holds_answers() {
                        life.ask_at = None;
                        continue;
                    }
                    asks.push((node, client));
                    // Not `clamp`: a configuration whose floor is above the
                    // cap must not panic; the floor wins.
                    life.ask_interval = (life.ask_interval * 2).min(cap).max(self.config.ack_request_after);
                    assert!(
                        life.ask_interval >= self.config.ack_request_after,
                        "ACK requests sooner than ack_request_after"
                    );
                    life.ask_at = Some(now + life.ask_interval);
                }
            }
        }
        for (node, client) in asks {
            self.stats.ack_requests += 1;
            self.send(node, Envelope::AckRequest { client }, None);
        }
    }

    /// When `handle_timeout` has something to do.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.nodes.values().flat_map(|n| n.lives.values()).filter_map(|l| l.ask_at).min()
    }

    /// What the log must keep for the server to answer as it does now:
    /// what a compaction writes.
    pub fn live_records(&self) -> Vec<Record<'_>> {
        live_records(&self.nodes)
    }

    /// Entries held, over every node and life (for bounds checks).
    pub fn entries(&self) -> usize {
        self.nodes.values().flat_map(|n| n.lives.values()).map(|l| l.entries.len()).sum()
    }

    /// The server's table checked whole, a pass over every entry (tests
    /// and the simulator run it after each step): each life above its
    /// node's forgotten ones, its entries inside its credit window from
    /// its first incomplete, and the run queue exactly the calls queued.
    /// A restarted server's table holds this too, from a log this code
    /// wrote (`recover` trims each life to its window).
    pub fn check_invariants(&self) {
        let credit = u64::from(self.config.credit);
        let mut queued = BTreeSet::new();
        for (&node, n) in &self.nodes {
            for (&client, life) in &n.lives {
                assert!(
                    client >= n.below,
                    "node {node}: life {client} kept below the forgotten ({})",
                    n.below
                );
                assert!(
                    life.entries.len() as u64 <= credit,
                    "node {node}, life {client}: {} entries, credit {credit}",
                    life.entries.len()
                );
                for (&seq, e) in &life.entries {
                    let call = CallId { client, seq };
                    // (`recover` saturates at the last seq there is.)
                    let window = seq >= life.first_incomplete
                        && (seq - life.first_incomplete < credit || seq == u64::MAX);
                    assert!(
                        window,
                        "node {node}: call {call:?} outside its window from {}",
                        life.first_incomplete
                    );
                    if *e == Entry::Queued {
                        queued.insert((node, call));
                    }
                }
            }
        }
        let mut waiting = BTreeSet::new();
        for d in &self.runnable {
            assert!(
                waiting.insert((d.from, d.call)),
                "call {:?} of node {} queued to run twice",
                d.call,
                d.from
            );
            assert!(
                d.args.len() <= self.config.max_args,
                "call {:?} queued with arguments past max_args",
                d.call
            );
        }
        assert!(waiting == queued, "the run queue {waiting:?} is not the calls queued {queued:?}");
    }
}

fn live_records(nodes: &BTreeMap<NodeId, NodeCalls>) -> Vec<Record<'_>> {
    let mut out = Vec::new();
    for (&node, n) in nodes {
        if n.below > 0 {
            out.push(Record::ForgetClients { node, below: n.below });
        }
        for (&client, life) in &n.lives {
            if life.first_incomplete > 0 {
                out.push(Record::Forget { node, client, first_incomplete: life.first_incomplete });
            }
            for (&seq, e) in &life.entries {
                let call = CallId { client, seq };
                // The handler id matters to nobody once the call started.
                match e {
                    // Not started: nothing to answer from after a restart.
                    Entry::Queued => {}
                    Entry::Running { one_way } => {
                        out.push(Record::Started { node, call, handler: 0, one_way: *one_way })
                    }
                    Entry::Interrupted => {
                        out.push(Record::Started { node, call, handler: 0, one_way: false })
                    }
                    Entry::Replied(r) => out.push(Record::Completed { node, call, result: r }),
                    Entry::OneWayDone => {
                        out.push(Record::Started { node, call, handler: 0, one_way: true });
                        out.push(Record::Completed { node, call, result: &[] });
                    }
                    Entry::Refused(reason) => out.push(Record::Refused { node, call, reason: *reason }),
                }
            }
        }
    }
    out
}

/// Append `record`, compacting the log to what `nodes` still needs once
/// if it is full.
fn append(
    log: &mut dyn CallLog,
    record: &Record<'_>,
    nodes: &BTreeMap<NodeId, NodeCalls>,
    stats: &mut TargetStats,
) -> Result<(), LogError> {
    match log.append(record) {
        Err(LogError::Full { .. }) => {
            log.compact(&live_records(nodes))?;
            stats.log_compactions += 1;
            log.append(record)
        }
        other => other,
    }
}

/// The caller finished every call below `first_incomplete`: free them.
/// Not logged: the log holds every call since its last compaction, and a
/// compaction writes each life's first incomplete (`live_records`), so a
/// restarted server that remembers a freed call answers a copy of it as
/// before, and one it does not remember is below a logged first
/// incomplete. Two records a call (started, completed), not three.
fn forget_below(life: &mut Life, first_incomplete: u64) -> bool {
    if first_incomplete <= life.first_incomplete {
        return false;
    }
    life.first_incomplete = first_incomplete;
    // Taken from the front one by one: `split_off` would allocate a new
    // tree at every call (the first incomplete moves with each request).
    let mut freed = false;
    while let Some(e) = life.entries.first_entry() {
        if *e.key() >= first_incomplete {
            break;
        }
        e.remove();
        freed = true;
    }
    assert!(
        life.entries.first_key_value().is_none_or(|(&seq, _)| seq >= first_incomplete),
        "an entry kept below the first incomplete {first_incomplete}"
    );
    freed
}
