//! Calls on an endpoint, as the application makes and serves them
//! (docs/ARCHITECTURE.md, "Calls (active messages)"): `request` and its
//! `Call` handle, handlers registered and run in `serve`, the earlier
//! life's calls. The tables, the logs and the handlers are this process's
//! (`call_layer`), whether the protocol runs here or in an engine, and the
//! handlers run on the application's threads, in `Endpoint::serve`, never
//! under a lock.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tether_proto::{Instant, NodeId, SendError};
use tether_rpc::{
    CallError, CallEvent, CallRef, CallState, CallerStats, Dispatch, Executed, HandlerId, TargetStats,
};

use crate::call_layer::{CallWire, Calls, Request};
use crate::call_site::{Host, Site};
use crate::{Endpoint, Error};

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

    /// The outcome if the call is finished (`None`: not yet).
    #[cfg(feature = "tokio")]
    pub(crate) fn outcome(&self) -> Option<Result<CallOutcome, Error>> {
        self.host.with(|c| outcome(c, self.call))
    }

    /// Wait until the call is finished, or `timeout` passes
    /// (`Error::TimedOut`; the call goes on).
    pub fn wait(&self, timeout: Option<Duration>) -> Result<CallOutcome, Error> {
        let call = self.call;
        self.host.wait(timeout, |c| outcome(c, call))?
    }
}

/// Call `call`'s outcome if it is finished.
fn outcome(c: &mut Calls, call: CallRef) -> Option<Result<CallOutcome, Error>> {
    let caller = &c.caller;
    match (caller.finished(call), caller.state(call)) {
        (None, _) | (_, None) => Some(Err(Error::Unsupported { what: "a call another handle let go of" })),
        (Some(true), Some(state)) => Some(Ok(CallOutcome { state, reply: caller.reply(call) })),
        (Some(false), _) => None,
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        self.host.with(|c| c.caller.forget(self.call));
    }
}

impl Endpoint {
    fn site(&self) -> Site<'_> {
        self.backend.calls()
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

    /// Take requests for `id` from now on, their handler run elsewhere
    /// (an async one, `aio::Endpoint::register_handler`).
    #[cfg(feature = "tokio")]
    pub(crate) fn register_handler_id(&self, id: HandlerId) -> Result<(), Error> {
        let site = self.site();
        site.start()?;
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
        let jobs = site.host().wait(timeout, |c| dispatch(c, max))??;
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

    /// Up to `max` requests to run, their starts logged (`None`: none
    /// waiting): `serve_batch`'s first half, for the async API's `serve`.
    #[cfg(feature = "tokio")]
    pub(crate) fn take_requests(&self, max: usize) -> Result<Option<Vec<Dispatch>>, Error> {
        let site = self.site();
        site.start()?;
        site.host().with(|c| dispatch(c, max.max(1))).transpose()
    }

    /// The reply of `job`'s handler if it is a blocking one registered here.
    #[cfg(feature = "tokio")]
    pub(crate) fn run_sync_handler(&self, job: &Dispatch) -> Option<Vec<u8>> {
        let site = self.site();
        let handler = site.handlers().read().unwrap_or_else(|e| e.into_inner()).get(&job.handler).cloned()?;
        Some(handler(&Request { from: job.from, call: job.call, handler: job.handler, args: &job.args }))
    }

    /// Log `job`'s completion with its reply (sent by `send_replies`).
    #[cfg(feature = "tokio")]
    pub(crate) fn complete_request(&self, job: &Dispatch, reply: &[u8]) -> Result<(), Error> {
        self.site()
            .host()
            .with(|c| c.target.complete(job.from, job.call, reply, &mut *c.log))
            .map_err(|e| Error::CallLog(e.to_string()))
    }

    /// Sync the log and send the replies completed so far.
    #[cfg(feature = "tokio")]
    pub(crate) fn send_replies(&self) {
        self.site().exchange(None, |_, _, _| ());
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
        Some(CallStats::of(&self.site().host()))
    }
}

impl CallStats {
    /// The call layer's counters where it runs.
    pub(crate) fn of(host: &crate::call_site::Host) -> CallStats {
        host.with(|c| CallStats {
            caller: c.caller.stats(),
            server: c.target.stats(),
            envelopes_dropped: c.envelopes_dropped,
            log_sync_failures: c.log_sync_failures,
        })
    }

    /// Every counter with a stable name (`calls_` as a caller, `served_`
    /// as a server), for boards and metrics.
    pub fn fields(&self) -> Vec<(&'static str, u64)> {
        let (c, t) = (&self.caller, &self.server);
        vec![
            ("calls_made", c.calls),
            ("calls_retransmissions", c.retransmissions),
            ("calls_queries", c.queries),
            ("calls_replies", c.replies),
            ("calls_abandoned", c.abandoned),
            ("calls_resolved", c.resolved),
            ("calls_malformed", c.malformed),
            ("calls_unknown", c.unknown_calls),
            ("calls_events_dropped", c.events_dropped),
            ("served_requests", t.requests),
            ("served_duplicates", t.duplicates),
            ("served_handlers_started", t.handlers_started),
            ("served_replies", t.replies),
            ("served_acks_elided", t.acks_elided),
            ("served_queries", t.queries),
            ("served_refused_not_found", t.refused_not_found),
            ("served_refused_busy", t.refused_busy),
            ("served_refused_stale", t.refused_stale),
            ("served_refused_not_run", t.refused_not_run),
            ("served_refused_indeterminate", t.refused_indeterminate),
            ("served_ack_requests", t.ack_requests),
            ("served_malformed", t.malformed),
            ("served_late_completions", t.late_completions),
            ("served_log_compactions", t.log_compactions),
            ("call_envelopes_dropped", self.envelopes_dropped),
            ("call_log_sync_failures", self.log_sync_failures),
        ]
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

/// Up to `max` requests to run, their starts synced (as the log's policy
/// says) before any runs; `None` when none waits.
fn dispatch(c: &mut Calls, max: usize) -> Option<Result<Vec<Dispatch>, Error>> {
    let Calls { target, log, log_sync_failures, .. } = c;
    let mut jobs = Vec::new();
    while jobs.len() < max {
        let Some(job) = target.poll_dispatch(&mut **log) else { break };
        jobs.push(job);
    }
    if jobs.is_empty() {
        return None;
    }
    // If the starts cannot be synced, none runs (their callers end
    // indeterminate, truly: the log says they started).
    if let Err(e) = log.flush() {
        *log_sync_failures += 1;
        return Some(Err(Error::CallLog(format!("the starts of {} calls not synced: {e}", jobs.len()))));
    }
    Some(Ok(jobs))
}
