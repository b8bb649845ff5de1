//! The call layer of an endpoint (docs/ARCHITECTURE.md, "Calls (active
//! messages)"): `tether-rpc`'s caller and target (Kaur's AMVIA three-way
//! exchange, RIFL's completion records), their logs, and the envelopes
//! waiting for room in the stream. Each pump takes the envelopes the
//! stream delivered on the calls' channel (`CallWire::recv_call`), runs
//! the call layer's timers, and hands what it sends back to the stream.
//!
//! It sits above whatever carries its envelopes: an embedded endpoint's
//! station pumps it at every step as the layer above its core
//! (`station::Layer`); an engine-attached endpoint's calls are pumped over
//! the engine's client (`attached_calls`). The endpoint's call API
//! (`calls`) sits above both.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tether_proto::{Delivery, Endpoint as Core, Instant, NodeId, SendError};
use tether_rpc::{
    CallLog, CallRef, CallState, Caller, HandlerId, LogError, MemLog, Record, RpcConfig, Target,
};

use crate::call_log::{CallLogOptions, FileLog};
use crate::station::Layer;
use crate::Error;

/// What carries a call layer's envelopes: an embedded endpoint's core, or
/// an engine's client (whose engine carries them on the calls' channel as
/// the core does).
pub(crate) trait CallWire {
    /// The next call's envelope delivered, if one waits.
    fn recv_call(&mut self) -> Option<Delivery>;
    /// Queue `envelope` on the stream to `to`: `WouldBlock` while it has
    /// no room (the envelope is kept and offered again), any other error
    /// for good (dropped, counted).
    fn send_call(&mut self, now: Instant, to: NodeId, envelope: &Bytes) -> Result<(), SendError>;
    /// Whether a stream to `peer` can be had.
    fn knows(&self, peer: NodeId) -> bool;
}

impl CallWire for Core {
    fn recv_call(&mut self) -> Option<Delivery> {
        Core::recv_on(self, tether_rpc::CHANNEL)
    }

    fn send_call(&mut self, now: Instant, to: NodeId, envelope: &Bytes) -> Result<(), SendError> {
        // The stream keeps these very bytes (reference-counted).
        Core::send_on(self, now, to, tether_rpc::CHANNEL, envelope.clone()).map(drop)
    }

    fn knows(&self, peer: NodeId) -> bool {
        Core::knows(self, peer)
    }
}

/// The server's log when the endpoint is given no file: calls are
/// at-most-once within this process's life only. Bounded like any other
/// log; it compacts to what it still needs when full.
pub const VOLATILE_LOG_BYTES: usize = 16 << 20;

/// Envelopes waiting for room in the stream, at most, and their bytes:
/// past either the newest is dropped (counted) and the call layer's
/// retransmission brings it again.
const MAX_PENDING: usize = 65_536;
const MAX_PENDING_BYTES: usize = 64 << 20;

/// How soon envelopes the stream had no room for are offered again.
const PENDING_RETRY: Duration = Duration::from_millis(1);

/// What a handler is given: who called, which call, and its arguments.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// The calling node, as the stream proved it.
    pub from: NodeId,
    /// The call's id (the caller's life and its count of calls to us).
    pub call: tether_rpc::CallId,
    /// The handler asked for.
    pub handler: HandlerId,
    /// The arguments.
    pub args: &'a [u8],
}

/// A handler: the reply's bytes for a request (empty for a one-way call,
/// whose result nobody reads).
pub type Handler = Arc<dyn Fn(&Request<'_>) -> Vec<u8> + Send + Sync>;

/// Handlers by id, kept outside the endpoint's lock: they run outside it.
pub(crate) type Handlers = std::sync::RwLock<BTreeMap<HandlerId, Handler>>;

/// Take up an earlier life's calls from its caller's log: those it saw end
/// are kept for the application (the newest `keep` of them: one that never
/// asks, `Endpoint::earlier_calls`, must not fill its table over many
/// restarts), the others asked about. How many ended ones were let go.
fn take_up(caller: &mut Caller, now: Instant, records: &[Record<'_>], keep: usize) -> usize {
    let mut issued = BTreeMap::new();
    for r in records {
        match *r {
            Record::Issued { node, call, .. } => {
                issued.insert(CallRef { server: node, id: call }, None);
            }
            Record::Ended { node, call, state, result } => {
                issued.insert(
                    CallRef { server: node, id: call },
                    Some((state, Bytes::copy_from_slice(result))),
                );
            }
            _ => {}
        }
    }
    let mut ended = Vec::new();
    for (call, end) in issued {
        match end {
            Some(end) => ended.push((call, end)),
            None => caller.adopt(now, call, false),
        }
    }
    // Newest first: a later life's calls, then later calls of a life.
    ended.sort_by_key(|(call, _)| std::cmp::Reverse((call.id.client, call.id.seq)));
    let dropped = ended.len().saturating_sub(keep);
    for (call, (state, reply)) in ended.into_iter().take(keep) {
        // A reply, empty or not, if the handler ran and replied.
        caller.restore(call, state, (state == CallState::PROCESSED).then_some(reply));
    }
    dropped
}

/// Open a log file (`what` names it in the warning about a torn tail).
fn open_log(o: &CallLogOptions, what: &str) -> Result<FileLog, Error> {
    let file = FileLog::open(o).map_err(|e| Error::CallLog(e.to_string()))?;
    if let Some(torn) = file.torn {
        tracing::warn!(path = %o.path.display(), "{what}: {torn}; the torn record is dropped");
    }
    Ok(file)
}

/// Append to a caller's log, compacting it to what the caller still
/// needs once if it is full.
fn append_compacting(log: &mut dyn CallLog, record: &Record<'_>, caller: &Caller) -> Result<(), LogError> {
    match log.append(record) {
        Err(LogError::Full { .. }) => {
            log.compact(&caller.live_records())?;
            log.append(record)
        }
        other => other,
    }
}

/// The calls of one endpoint, both sides.
pub(crate) struct Calls {
    pub caller: Caller,
    pub target: Target,
    pub log: Box<dyn CallLog + Send>,
    /// The caller's log: each call issued, and how it ended, so a
    /// restarted caller learns how its earlier life's calls ended.
    caller_log: Option<Box<dyn CallLog + Send>>,
    /// Caller's log records that could not be written.
    pub caller_log_failures: u64,
    /// Envelopes the stream had no room for yet, oldest first, and their
    /// bytes.
    pending: VecDeque<(NodeId, Bytes)>,
    pending_bytes: usize,
    /// A call moved or a handler waits since the flag was last cleared:
    /// calls parked on calls wake.
    pub moved: bool,
    /// The call layer's earliest deadline, as the last flush left it: the
    /// station asks on every turn, even an idle spinning one, and the
    /// tables it comes from are scanned only after they change (a stale
    /// one is only ever early: an extra turn).
    deadline: Option<Instant>,
    /// Envelopes dropped: the stream refused them for good (the peer is
    /// unknown, or they are larger than a message may be), or too many
    /// waited for room.
    pub envelopes_dropped: u64,
    /// Syncs of the server's log that failed (its envelopes were held
    /// back until one succeeded).
    pub log_sync_failures: u64,
}

impl Calls {
    /// `life`: the endpoint's incarnation, the id of its calls. `log`: the
    /// server's log file (its records recovered: what a predecessor
    /// answered is answered again), or `None` for one in memory, which
    /// makes calls at-most-once within this process's life only.
    /// `caller_log`: the caller's own log file, whose calls not seen
    /// ending are asked about (from `now`) and whose ended ones are kept
    /// for the application (`Endpoint::earlier_calls`).
    pub fn open(
        config: RpcConfig,
        life: u64,
        log: Option<&CallLogOptions>,
        caller_log: Option<&CallLogOptions>,
        now: Instant,
    ) -> Result<Self, Error> {
        let (log, target): (Box<dyn CallLog + Send>, Target) = match log {
            None => {
                let mut target = Target::new(config.clone());
                target.set_volatile(true);
                (Box::new(MemLog::new(VOLATILE_LOG_BYTES)), target)
            }
            Some(o) => {
                let file = open_log(o, "call log")?;
                let target = Target::recover(config.clone(), &file.records());
                (Box::new(file), target)
            }
        };
        let keep_earlier = config.max_calls / 2;
        let mut caller = Caller::new(config, life);
        let caller_log = match caller_log {
            None => None,
            Some(o) => {
                let file = open_log(o, "caller's log")?;
                let dropped = take_up(&mut caller, now, &file.records(), keep_earlier);
                if dropped > 0 {
                    tracing::warn!(
                        path = %o.path.display(),
                        dropped,
                        "caller's log: earlier lives' ended calls never taken (earlier_calls); the oldest let go"
                    );
                }
                caller.set_logging(true);
                Some(Box::new(file) as Box<dyn CallLog + Send>)
            }
        };
        let mut calls = Calls {
            caller,
            target,
            log,
            caller_log,
            caller_log_failures: 0,
            pending: VecDeque::new(),
            pending_bytes: 0,
            moved: false,
            deadline: None,
            envelopes_dropped: 0,
            log_sync_failures: 0,
        };
        calls.deadline = calls.earliest();
        Ok(calls)
    }

    /// Take in what the stream delivered for calls, run the call layer's
    /// timers, and give the stream what the call layer sends.
    pub fn pump(&mut self, now: Instant, wire: &mut dyn CallWire) {
        while let Some(d) = wire.recv_call() {
            self.take(now, &d);
        }
        if self.deadline.is_some_and(|t| t <= now) {
            if self.caller.poll_timeout().is_some_and(|t| t <= now) {
                self.caller.handle_timeout(now);
                self.moved = true;
            }
            if self.target.poll_timeout().is_some_and(|t| t <= now) {
                self.target.handle_timeout(now);
            }
        }
        self.log_ends();
        self.flush(now, wire);
    }

    /// One call's envelope, parsed once, to the side it is for (a
    /// malformed one is counted by the server side).
    pub fn take(&mut self, now: Instant, d: &Delivery) {
        if let Ok(env) = self.target.parse(&d.message) {
            if env.for_server() {
                self.target.handle_envelope(now, d.from, env, &mut *self.log);
            } else {
                self.caller.handle_envelope(now, d.from, env);
            }
        }
        self.moved = true;
    }

    /// Record that `call` was made, before its request leaves: false if
    /// the caller's log could not (the call is then withdrawn).
    pub fn log_issued(&mut self, call: CallRef, handler: HandlerId, one_way: bool) -> bool {
        let Some(log) = &mut self.caller_log else { return true };
        let record = Record::Issued { node: call.server, call: call.id, handler, one_way };
        // Synced (as the policy says) before the request can leave.
        if append_compacting(&mut **log, &record, &self.caller).and_then(|()| log.flush()).is_err() {
            self.caller.withdraw(call);
            return false;
        }
        true
    }

    /// Write the end of each call that ended to the caller's log.
    fn log_ends(&mut self) {
        let Some(log) = &mut self.caller_log else { return };
        while let Some((call, state, reply)) = self.caller.poll_ended() {
            let result = reply.as_deref().unwrap_or(&[]);
            let record = Record::Ended { node: call.server, call: call.id, state, result };
            if append_compacting(&mut **log, &record, &self.caller).is_err() {
                // A restart asks the server again: it answers from its log.
                self.caller_log_failures += 1;
            }
        }
        let _ = log.flush();
    }

    /// Hand the stream every envelope the call layer has for the wire.
    pub fn flush(&mut self, now: Instant, wire: &mut dyn CallWire) {
        while let Some(o) = self.caller.poll_transmit().or_else(|| self.target.poll_transmit()) {
            if self.pending.len() >= MAX_PENDING || self.pending_bytes + o.bytes.len() > MAX_PENDING_BYTES {
                self.envelopes_dropped += 1;
                continue;
            }
            self.pending_bytes += o.bytes.len();
            self.pending.push_back((o.to, o.bytes));
        }
        // What the envelopes say is in the log before they leave: with the
        // log not synced (as its policy asks), none leaves; the next flush
        // tries again (soon: `pending` is not empty).
        if self.log.flush().is_err() {
            self.log_sync_failures += 1;
            self.deadline = Some(now + PENDING_RETRY);
            return;
        }
        // In order per peer; a peer without room holds back only its own
        // (a slow or dead caller must not stall everyone's answers).
        // (Those kept go round to the back of the same queue, in their
        // order: no queue is allocated per flush.)
        let mut full: Vec<NodeId> = Vec::new();
        for _ in 0..self.pending.len() {
            let Some((to, bytes)) = self.pending.pop_front() else { break };
            if full.contains(&to) {
                self.pending.push_back((to, bytes));
                continue;
            }
            match wire.send_call(now, to, &bytes) {
                Ok(_) => self.pending_bytes -= bytes.len(),
                // Room comes with acknowledgements, and a step with them.
                Err(SendError::WouldBlock) => {
                    full.push(to);
                    self.pending.push_back((to, bytes));
                }
                Err(_) => {
                    self.pending_bytes -= bytes.len();
                    self.envelopes_dropped += 1;
                }
            }
        }
        self.deadline = self.earliest();
        if !self.pending.is_empty() {
            // Room comes with the stream's acknowledgements, which an
            // engine's client does not announce: look again soon.
            let retry = now + PENDING_RETRY;
            self.deadline = Some(self.deadline.map_or(retry, |t| t.min(retry)));
        }
    }

    /// When the call layer's timers want a step (as of the last flush).
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.deadline
    }

    fn earliest(&self) -> Option<Instant> {
        [self.caller.poll_timeout(), self.target.poll_timeout()].into_iter().flatten().min()
    }
}

/// The embedded endpoint's station pumps the calls at every step, over its
/// core, after the core's timers and before it transmits.
impl Layer for Calls {
    fn pump(&mut self, now: Instant, core: &mut Core) {
        Calls::pump(self, now, core);
    }

    fn poll_timeout(&self) -> Option<Instant> {
        Calls::poll_timeout(self)
    }
}
