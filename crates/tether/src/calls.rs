//! Calls on an endpoint (docs/ARCHITECTURE.md, "Calls (active messages)"): the
//! call layer of `tether-rpc` (Kaur's AMVIA three-way exchange, RIFL's
//! completion records) over the endpoint's streams. Each pump takes the
//! calls' envelopes the stream delivered (`CallWire::recv_call`), runs the
//! call layer's timers, and hands what it sends back as call messages
//! (`send_call`). An embedded endpoint's driver pumps at every step, over
//! its core; an engine-attached endpoint's calls are pumped by a thread of
//! their own over the engine's client (`attached_calls`). Either way the
//! tables, the log and the handlers are this process's, and the handlers
//! run on the application's threads, in `Endpoint::serve`, never under a
//! lock.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tether_proto::{Delivery, Endpoint as Core, Instant, NodeId, SendError};
use tether_rpc::{
    for_server, CallError, CallEvent, CallLog, CallRef, CallState, Caller, CallerStats, Executed, HandlerId,
    LogError, MemLog, Record, RpcConfig, Target, TargetStats,
};

use crate::attached_calls::AttachedCalls;
use crate::call_log::{CallLogOptions, FileLog};
use crate::driver::Driver;
use crate::endpoint::{block_on, Awaits, Inner, Shared};
use crate::{Endpoint, Error};

/// What carries a call layer's envelopes: an embedded endpoint's core, or
/// an engine's client (whose engine marks them on the wire as the core
/// does).
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
        Core::recv_call(self)
    }

    fn send_call(&mut self, now: Instant, to: NodeId, envelope: &Bytes) -> Result<(), SendError> {
        // The stream keeps these very bytes (reference-counted).
        Core::send_call(self, now, to, envelope.clone()).map(drop)
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
    /// driver asks on every turn, even an idle spinning one, and the
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

    /// One call's envelope, to the side it is for.
    pub fn take(&mut self, now: Instant, d: &Delivery) {
        // A malformed envelope is counted by the side that read it.
        let _ = if for_server(&d.message) {
            self.target.handle(now, d.from, &d.message, &mut *self.log)
        } else {
            self.caller.handle(now, d.from, &d.message)
        };
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

/// How a call is made.
#[derive(Debug, Clone, Default)]
pub struct CallOptions {
    /// Abandon the call if it has not finished by then (the handler's time
    /// included); `None`: only retransmissions bound it.
    pub deadline: Option<Duration>,
    /// No reply is wanted: the call is finished once the handler starts.
    pub one_way: bool,
    /// Report every state change as an event (`Endpoint::poll_call_event`).
    pub watch: bool,
    /// With every credit toward the server in use, wait this long for one
    /// to free (`None`: fail at once with `CallError::NoCredit`).
    pub credit_wait: Option<Duration>,
}

/// What a finished call came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallOutcome {
    /// Its final state tuple.
    pub state: CallState,
    /// The handler's reply, when it ran and replied.
    pub reply: Option<Bytes>,
}

impl CallOutcome {
    /// Whether the handler ran, as far as the state says.
    pub fn executed(&self) -> Executed {
        self.state.executed()
    }
}

/// Where an endpoint's calls live, for handles that outlive a borrow of it.
#[derive(Clone)]
pub(crate) enum Host {
    Embedded(Arc<Shared>),
    Attached(Arc<AttachedCalls>),
}

impl Host {
    /// Look at or change the call layer (nothing is sent).
    fn with<R>(&self, f: impl FnOnce(&mut Calls) -> R) -> R {
        match self {
            Host::Embedded(s) => f(&mut s.lock().calls),
            Host::Attached(a) => a.with(f),
        }
    }

    /// Wait until `ready` gives something, or `timeout` passes.
    fn wait<R>(
        &self,
        timeout: Option<Duration>,
        mut ready: impl FnMut(&mut Calls) -> Option<R>,
    ) -> Result<R, Error> {
        match self {
            Host::Embedded(s) => block_on(s, timeout, Awaits::Calls, |d| ready(&mut d.calls)),
            Host::Attached(a) => a.wait(timeout, ready),
        }
    }
}

/// An endpoint's calls with what carries their envelopes.
enum Site<'a> {
    Embedded(&'a Arc<Shared>),
    Attached(&'a crate::attached::Attached),
}

impl Site<'_> {
    fn host(&self) -> Host {
        match self {
            Site::Embedded(s) => Host::Embedded(Arc::clone(s)),
            Site::Attached(a) => Host::Attached(a.calls.clone()),
        }
    }

    fn handlers(&self) -> &Handlers {
        match self {
            Site::Embedded(s) => &s.handlers,
            Site::Attached(a) => &a.calls.handlers,
        }
    }

    /// Calls are in use: an attached endpoint's pump starts.
    fn start(&self) -> Result<(), Error> {
        match self {
            Site::Embedded(_) => Ok(()),
            Site::Attached(a) => a.start_calls(),
        }
    }

    /// Change the call layer and send what that makes it send; `peer`, if
    /// given, is learned first where the endpoint can (an address book).
    fn exchange<R>(
        &self,
        peer: Option<NodeId>,
        f: impl FnOnce(&mut Calls, &dyn CallWire, Instant) -> R,
    ) -> R {
        match self {
            Site::Embedded(shared) => {
                let mut d = shared.lock();
                if let Some(peer) = peer {
                    d.learn_peer(peer);
                }
                let now = shared.clock.now();
                let Driver { calls, core, .. } = &mut *d;
                let r = f(calls, core, now);
                calls.flush(now, core);
                d.transmit(now);
                r
            }
            Site::Attached(a) => a.calls.exchange(&a.client, f),
        }
    }
}

/// A call in progress or finished: ask it where it stands, or wait for
/// its end. Dropping it lets the endpoint forget the call (once finished).
pub struct Call {
    call: CallRef,
    host: Host,
}

impl std::fmt::Debug for Call {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Call").field("call", &self.call).finish()
    }
}

impl Call {
    /// The call's name: the server and the call's id.
    pub fn id(&self) -> CallRef {
        self.call
    }

    /// Where the call stands now (`<AckStatus, OperationStatus>`); `None`
    /// if the endpoint let go of it (another handle to it was dropped).
    pub fn state(&self) -> Option<CallState> {
        self.host.with(|c| c.caller.state(self.call))
    }

    /// Whether the call has its final state (answered, or abandoned and,
    /// where it could be, resolved).
    pub fn finished(&self) -> bool {
        self.host.with(|c| c.caller.finished(self.call)) == Some(true)
    }

    /// Wait until the call is finished, or `timeout` passes
    /// (`Error::TimedOut`; the call goes on).
    pub fn wait(&self, timeout: Option<Duration>) -> Result<CallOutcome, Error> {
        let call = self.call;
        self.host.wait(timeout, |c| {
            let caller = &c.caller;
            match (caller.finished(call), caller.state(call)) {
                (None, _) | (_, None) => {
                    Some(Err(Error::Unsupported { what: "a call another handle let go of" }))
                }
                (Some(true), Some(state)) => Some(Ok(CallOutcome { state, reply: caller.reply(call) })),
                (Some(false), _) => None,
            }
        })?
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        self.host.with(|c| c.caller.forget(self.call));
    }
}

impl Endpoint {
    fn site(&self) -> Site<'_> {
        match &self.inner {
            Inner::Embedded(e) => Site::Embedded(&e.shared),
            Inner::Engine(a) => Site::Attached(a),
        }
    }
}

/// Calls (active messages): handlers registered on one endpoint, invoked
/// from another, each invocation followed through Kaur's three-way
/// exchange to a reply or an abandon state that says whether the handler
/// ran (docs/ARCHITECTURE.md, "Calls (active messages)"). Embedded and engine-attached
/// endpoints alike: with an engine, the call layer and its log stay in
/// this process and the engine carries the envelopes.
impl Endpoint {
    /// Serve `handler` under `id`: requests for it run it (in `serve`), and
    /// its result goes back as the reply. Requests for an id nobody
    /// registered are refused (`AckStatus::NotFound`), for good.
    pub fn register_handler(
        &self,
        id: HandlerId,
        handler: impl Fn(&Request<'_>) -> Vec<u8> + Send + Sync + 'static,
    ) -> Result<(), Error> {
        let site = self.site();
        site.start()?;
        site.handlers().write().unwrap_or_else(|e| e.into_inner()).insert(id, Arc::new(handler));
        site.host().with(|c| c.target.register(id));
        Ok(())
    }

    /// Call `handler` on `peer` with `args`, with the default options.
    pub fn request(&self, peer: NodeId, handler: HandlerId, args: &[u8]) -> Result<Call, Error> {
        self.request_with(peer, handler, args, &CallOptions::default())
    }

    /// Call `handler` on `peer` with `args`.
    pub fn request_with(
        &self,
        peer: NodeId,
        handler: HandlerId,
        args: &[u8],
        options: &CallOptions,
    ) -> Result<Call, Error> {
        let site = self.site();
        site.start()?;
        let make = |c: &mut Calls, wire: &dyn CallWire, now: Instant| {
            if !wire.knows(peer) {
                return Err(Error::Send(SendError::UnknownPeer(peer)));
            }
            let call = c.caller.request(
                now,
                peer,
                handler,
                args,
                options.one_way,
                options.deadline,
                options.watch,
            )?;
            if !c.log_issued(call, handler, options.one_way) {
                return Err(Error::CallLog("the caller's log could not record the call".into()));
            }
            Ok(call)
        };
        let give_up = options.credit_wait.map(|t| std::time::Instant::now().checked_add(t));
        let call = loop {
            match site.exchange(Some(peer), make) {
                Err(Error::Call(CallError::NoCredit { .. })) if give_up.is_some() => {
                    // Wait for a credit to free, then try again (another
                    // thread may take it first). No lock is held meanwhile.
                    let left =
                        give_up.flatten().map(|t| t.saturating_duration_since(std::time::Instant::now()));
                    site.host().wait(left, |c| c.caller.has_credit(peer).then_some(()))?;
                }
                other => break other?,
            }
        };
        Ok(Call { call, host: site.host() })
    }

    /// Run one handler for a request that came in, waiting up to `timeout`
    /// for one (`Error::TimedOut`), and send its reply. Handlers run on the
    /// thread that calls this (as Active Messages' handlers run in the
    /// poll), never under a lock.
    pub fn serve(&self, timeout: Option<Duration>) -> Result<(), Error> {
        self.serve_batch(1, timeout).map(drop)
    }

    /// Run the handlers of up to `max` requests that came in, waiting up
    /// to `timeout` for the first (`Error::TimedOut`), then send their
    /// replies; how many ran. A group commit: with the log synced per
    /// batch (`SyncPolicy::Batch`) the batch's starts reach the disk in
    /// one sync before the first handler runs, and its completions in one
    /// before the first reply leaves, where `serve` syncs twice a call.
    /// The price is precision after a crash: a server that dies while the
    /// batch runs reports its calls not yet run as indeterminate (they
    /// were logged as started), never as run or not.
    pub fn serve_batch(&self, max: usize, timeout: Option<Duration>) -> Result<usize, Error> {
        let site = self.site();
        site.start()?;
        let max = max.max(1);
        let jobs = site.host().wait(timeout, |c| {
            let Calls { target, log, log_sync_failures, .. } = c;
            let mut jobs = Vec::new();
            while jobs.len() < max {
                let Some(job) = target.poll_dispatch(&mut **log) else { break };
                jobs.push(job);
            }
            if jobs.is_empty() {
                return None;
            }
            // Their starts synced (as the policy says) before any runs:
            // if they cannot be, none runs (their callers end
            // indeterminate, truly: the log says they started).
            if let Err(e) = log.flush() {
                *log_sync_failures += 1;
                return Some(Err(Error::CallLog(format!(
                    "the starts of {} calls not synced: {e}",
                    jobs.len()
                ))));
            }
            Some(Ok(jobs))
        })??;
        // Each completion logged as its handler returns (a handler that
        // panics leaves those before it complete: their replies go with
        // the next flush); the log synced once, then every reply.
        let host = site.host();
        let mut done = Ok(());
        for job in &jobs {
            let handler =
                site.handlers().read().unwrap_or_else(|e| e.into_inner()).get(&job.handler).cloned();
            // The target dispatches only registered ids, and none is
            // removed; were one missing, its call would stay running (its
            // caller ends indeterminate), never answered falsely.
            let Some(handler) = handler else { continue };
            let request = Request { from: job.from, call: job.call, handler: job.handler, args: &job.args };
            let result = handler(&request);
            let completed = host.with(|c| c.target.complete(job.from, job.call, &result, &mut *c.log));
            if done.is_ok() {
                done = completed;
            }
        }
        site.exchange(None, |_, _, _| ());
        done.map(|()| jobs.len()).map_err(|e| Error::CallLog(e.to_string()))
    }

    /// Calls an earlier life of this endpoint made, from its caller's log
    /// (`Builder::caller_log`): those it saw end, with their outcome, and
    /// those it did not, being asked about (`Call::wait` for the answer:
    /// the server's log says whether each ran; none is run again from
    /// here).
    pub fn earlier_calls(&self) -> Vec<Call> {
        let host = self.site().host();
        let calls = host.with(|c| c.caller.earlier());
        calls.into_iter().map(|call| Call { call, host: host.clone() }).collect()
    }

    /// The next state change of a watched call.
    pub fn poll_call_event(&self) -> Option<CallEvent> {
        self.site().host().with(|c| c.caller.poll_event())
    }

    /// What the call layer did on both sides: calls made, retransmitted,
    /// abandoned and resolved; requests served, duplicates answered from
    /// the table, refusals by reason; envelopes dropped.
    pub fn call_stats(&self) -> Option<CallStats> {
        Some(self.site().host().with(|c| CallStats {
            caller: c.caller.stats(),
            server: c.target.stats(),
            envelopes_dropped: c.envelopes_dropped,
            log_sync_failures: c.log_sync_failures,
        }))
    }
}

/// The call layer's counters, both sides (`Endpoint::call_stats`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallStats {
    /// As a caller.
    pub caller: CallerStats,
    /// As a server.
    pub server: TargetStats,
    /// Envelopes the stream refused for good or that found no room.
    pub envelopes_dropped: u64,
    /// Syncs of the server's log that failed: the replies and ACKs they
    /// covered were held back, the handlers not run.
    pub log_sync_failures: u64,
}
