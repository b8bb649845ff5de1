//! The async API (the `tokio` feature): an endpoint's sends, receives,
//! events and calls as futures, for programs written on tokio
//! (docs/ASYNC.md).
//!
//! Where the progress work runs, and why. A future that is not ready
//! drives the endpoint itself for the endpoint's spin time (`Builder::spin`,
//! 50 us), one step per poll, yielding to the runtime between polls, as a
//! blocking call busy-polls before it sleeps (Trahay et al. \[NMAD\] section
//! 4; docs/REFERENCES.md): an answer that comes within it costs no thread
//! hand-off and no wake-up. After that the future parks: the endpoint's
//! progress worker (the thread every embedded endpoint already has, which
//! waits on the sockets with `epoll`) drives it, and its steps wake the
//! futures parked for what they brought, as they wake parked blocking
//! calls. Driving from tokio's reactor instead (the rails' sockets
//! registered with it) would add a second readiness mechanism for the
//! same sockets and the same wake-up where the worker's suffices; the
//! measurement that decided it is in docs/RESULTS.md ("Async API").
//!
//! Every future here is cancellation-safe: what it takes (a message, an
//! event, room in the send buffer) it takes in the poll that returns it,
//! so a future dropped before it returned took nothing.
//!
//! An endpoint attached to an engine has no worker in this process: its
//! futures look at the engine's rings, spinning as above, then every
//! millisecond (tokio's timer).

use std::collections::BTreeMap;
use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant as StdInstant};

use bytes::Bytes;
use tether_proto::{Delivery, Event, MessageId, MessageState, NodeId, SendError};
use tether_rpc::HandlerId;

use crate::calls::{Call, CallOptions, CallOutcome};
use crate::shared::{Awaits, Shared};
use crate::{leave, Error, SendHandle};

/// Longest a parked future waits for a worker's wake-up before it looks
/// again by itself: a safety net only, as the blocking calls' is.
const PARK_SLICE: Duration = Duration::from_millis(200);

/// How often a future on an engine-attached endpoint looks again once its
/// spin is over: tokio's timer does not count finer.
const ATTACHED_SLICE: Duration = Duration::from_millis(1);

/// How long a future spins when the endpoint does not say (attached).
const DEFAULT_SPIN: Duration = Duration::from_micros(50);

/// A request as an async handler gets it: owned, as the handler's future
/// outlives the call that started it.
#[derive(Debug, Clone)]
pub struct Request {
    /// The calling node, as the stream proved it.
    pub from: NodeId,
    /// The call's id.
    pub call: tether_rpc::CallId,
    /// The handler asked for.
    pub handler: HandlerId,
    /// The arguments.
    pub args: Bytes,
}

type BoxedReply = Pin<Box<dyn Future<Output = Vec<u8>> + Send>>;
type AsyncHandler = Arc<dyn Fn(Request) -> BoxedReply + Send + Sync>;

/// An endpoint for async programs: wraps a blocking [`crate::Endpoint`]
/// (built as usual, with `Endpoint::builder`) and offers its waits as
/// futures. Share it between tasks with an `Arc`; `get_ref` reaches the
/// rest of the API (statistics, paths, peers), none of which blocks.
///
/// ```no_run
/// # async fn demo() -> Result<(), tether::Error> {
/// let ep = tether::aio::Endpoint::new(
///     tether::Endpoint::builder(1)
///         .bind("127.0.0.1:7001".parse().unwrap())
///         .peer(2, "127.0.0.1:7002".parse().unwrap())
///         .build()?,
/// );
/// let sent = ep.send(2, b"hello").await?; // waits for room, not for the peer
/// println!("{:?}", sent.await?); // the message's fate: Delivered or Failed
/// let reply = ep.recv().await?;
/// println!("from {}: {:?}", reply.from, reply.message);
/// ep.close(std::time::Duration::from_secs(1)).await
/// # }
/// ```
pub struct Endpoint {
    ep: Arc<crate::Endpoint>,
    handlers: Arc<RwLock<BTreeMap<HandlerId, AsyncHandler>>>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("aio::Endpoint").field(&self.ep).finish()
    }
}

impl From<crate::Endpoint> for Endpoint {
    fn from(ep: crate::Endpoint) -> Self {
        Endpoint::new(ep)
    }
}

impl Endpoint {
    /// The async face of `ep`. Its progress worker (`Progress::Thread`,
    /// the default) wakes the futures that park; with `Progress::Polling`
    /// nothing would, and the futures look again every `PARK_SLICE`.
    pub fn new(ep: crate::Endpoint) -> Self {
        Endpoint { ep: Arc::new(ep), handlers: Default::default() }
    }

    /// The blocking endpoint underneath, for what does not wait.
    pub fn get_ref(&self) -> &crate::Endpoint {
        &self.ep
    }

    /// This endpoint's node id.
    pub fn node(&self) -> NodeId {
        self.ep.node()
    }

    /// Queue `msg` for `peer`, waiting for room in the send buffer (the
    /// back-pressure of a slow or silent peer). The returned [`Sent`] is
    /// itself a future of the message's fate. Cancellation-safe: a send
    /// dropped before it returned queued nothing.
    pub async fn send(&self, peer: NodeId, msg: &[u8]) -> Result<Sent, Error> {
        self.queue(|| self.ep.send(peer, msg)).await
    }

    /// As [`send`](Self::send), for a message the application hands over
    /// (kept in the send log as it is, without a copy).
    pub async fn send_bytes(&self, peer: NodeId, msg: Bytes) -> Result<Sent, Error> {
        self.queue(|| self.ep.send_bytes(peer, msg.clone())).await
    }

    /// Try `send` until the send buffer has room for it.
    async fn queue(
        &self,
        mut send: impl FnMut() -> Result<SendHandle, Error> + Unpin,
    ) -> Result<Sent, Error> {
        let handle = Wait::new(&self.ep, Awaits::Settled)
            .until(|| match send() {
                Err(Error::Send(SendError::WouldBlock)) => None,
                done => Some(done),
            })
            .await?;
        Ok(Sent { handle })
    }

    /// The next delivered message. Cancellation-safe.
    pub async fn recv(&self) -> Result<Delivery, Error> {
        let ep = &*self.ep;
        Wait::new(ep, Awaits::Delivery).until(|| ep.try_recv().map(Ok)).await
    }

    /// The next event (a peer unreachable, restarted or taken in, a path's
    /// state changing, refused traffic). Cancellation-safe.
    pub async fn next_event(&self) -> Result<Event, Error> {
        let ep = &*self.ep;
        Wait::new(ep, Awaits::Event).until(|| ep.poll_event().map(Ok)).await
    }

    /// The endpoint's events as a stream, ending when the endpoint stops.
    pub fn events(&self) -> Events<'_> {
        Events { ep: &self.ep, wait: Wait::new(&self.ep, Awaits::Event) }
    }

    /// Wait until everything sent is acknowledged or failed.
    pub async fn flush(&self) -> Result<(), Error> {
        let ep = &*self.ep;
        Wait::new(ep, Awaits::AllSettled).until(|| (ep.unsettled() == 0).then_some(Ok(()))).await
    }

    /// Call `handler` on `peer` with `args` and wait for the outcome: the
    /// final `<AckStatus, OperationStatus>` state and the reply. Dropping
    /// the future lets go of the call (it goes on at the server, as a
    /// blocking call whose handle is dropped does).
    pub async fn request(&self, peer: NodeId, handler: HandlerId, args: &[u8]) -> Result<CallOutcome, Error> {
        self.request_with(peer, handler, args, &CallOptions::default()).await
    }

    /// As [`request`](Self::request), with options (deadline, one-way,
    /// watched). A `credit_wait` is waited asynchronously.
    pub async fn request_with(
        &self,
        peer: NodeId,
        handler: HandlerId,
        args: &[u8],
        options: &CallOptions,
    ) -> Result<CallOutcome, Error> {
        let ep = &*self.ep;
        let now_only = CallOptions { credit_wait: None, ..options.clone() };
        let give_up = options.credit_wait.and_then(|t| StdInstant::now().checked_add(t));
        let call: Call = Wait::new(ep, Awaits::Calls)
            .until(|| match ep.request_with(peer, handler, args, &now_only) {
                Err(Error::Call(tether_rpc::CallError::NoCredit { .. }))
                    if give_up.is_some_and(|t| StdInstant::now() < t) =>
                {
                    None
                }
                done => Some(done),
            })
            .await?;
        Wait::new(ep, Awaits::Calls).until(|| call.outcome()).await
    }

    /// Serve `handler` under `id` with an async function: requests for it
    /// are answered by [`serve`](Self::serve), each with what its future
    /// returns. Handlers registered on the blocking endpoint
    /// (`register_handler`) are served too.
    pub fn register_handler<F, Fut>(&self, id: HandlerId, handler: F) -> Result<(), Error>
    where
        F: Fn(Request) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Vec<u8>> + Send + 'static,
    {
        let boxed: AsyncHandler = Arc::new(move |r| Box::pin(handler(r)) as BoxedReply);
        self.handlers.write().unwrap_or_else(|e| e.into_inner()).insert(id, boxed);
        self.ep.register_handler_id(id)
    }

    /// Wait for requests, run the handlers of up to `max` of them (each
    /// awaited in turn on this task), and send their replies; how many
    /// ran. Run it in a loop, on as many tasks as should serve at once.
    pub async fn serve(&self, max: usize) -> Result<usize, Error> {
        let ep = &*self.ep;
        let jobs = Wait::new(ep, Awaits::Calls).until(|| ep.take_requests(max).transpose()).await?;
        let mut done = Ok(());
        for job in &jobs {
            let handler = self.handlers.read().unwrap_or_else(|e| e.into_inner()).get(&job.handler).cloned();
            let reply = match handler {
                Some(h) => {
                    let request = Request {
                        from: job.from,
                        call: job.call,
                        handler: job.handler,
                        args: job.args.clone(),
                    };
                    h(request).await
                }
                None => match ep.run_sync_handler(job) {
                    Some(reply) => reply,
                    // Not registered here: its call stays running (its
                    // caller ends indeterminate), never answered falsely.
                    None => continue,
                },
            };
            let completed = ep.complete_request(job, &reply);
            if done.is_ok() {
                done = completed;
            }
        }
        ep.send_replies();
        done.map(|()| jobs.len())
    }

    /// Settle what was sent, up to `linger`, and stop (the blocking
    /// `close`, on tokio's blocking pool).
    pub async fn close(self, linger: Duration) -> Result<(), Error> {
        let ep =
            Arc::try_unwrap(self.ep).map_err(|_| Error::Unsupported { what: "closing a shared endpoint" })?;
        tokio::task::spawn_blocking(move || ep.close(linger))
            .await
            .unwrap_or(Err(Error::Unsupported { what: "closing: the blocking task panicked" }))
    }
}

/// A message queued by [`Endpoint::send`]: await it for its fate.
#[derive(Debug)]
pub struct Sent {
    handle: SendHandle,
}

impl Sent {
    /// The message's number in its stream.
    pub fn id(&self) -> Option<MessageId> {
        self.handle.id()
    }

    /// Where it stands now.
    pub fn state(&self) -> MessageState {
        self.handle.state()
    }

    /// The blocking handle, to keep past the endpoint's async face.
    pub fn handle(&self) -> &SendHandle {
        &self.handle
    }
}

impl IntoFuture for Sent {
    type Output = Result<MessageState, Error>;
    type IntoFuture = Pin<Box<dyn Future<Output = Self::Output> + Send>>;

    /// Delivered (acknowledged at the peer's commit point) or failed.
    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            let handle = self.handle;
            Wait::on(handle.shared().map(|s| &**s), Awaits::Settled)
                .until(|| match handle.state() {
                    MessageState::Pending => None,
                    settled => Some(Ok(settled)),
                })
                .await
        })
    }
}

/// The endpoint's events as a [`futures_core::Stream`]; ends when the
/// endpoint stops.
pub struct Events<'a> {
    ep: &'a crate::Endpoint,
    wait: Wait<'a>,
}

impl futures_core::Stream for Events<'_> {
    type Item = Event;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Event>> {
        let ep = self.ep;
        match self.wait.poll_attempt(cx, &mut || ep.poll_event().map(Ok)) {
            Poll::Ready(Ok(e)) => {
                self.wait.reset();
                Poll::Ready(Some(e))
            }
            Poll::Ready(Err(_)) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// Where a waiting future stands.
enum Phase {
    /// Not yet polled.
    Start,
    /// Driving the endpoint itself, one step a poll, since `since`,
    /// holding one of the process's places to spin.
    Spinning { since: StdInstant, _permit: leave::Permit },
    /// Waiting for the progress worker's wake-up.
    Parked,
}

/// How every future here waits for what it is after: spinning a while,
/// then parked for the worker (see the module's header).
struct Wait<'a> {
    /// The embedded endpoint's state (`None`: attached to an engine).
    shared: Option<&'a Shared>,
    awaits: Awaits,
    phase: Phase,
    /// The safety net of a parked future.
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<'a> Wait<'a> {
    fn new(ep: &'a crate::Endpoint, awaits: Awaits) -> Self {
        Self::on(ep.backend.embedded(), awaits)
    }

    fn on(shared: Option<&'a Shared>, awaits: Awaits) -> Self {
        Wait { shared, awaits, phase: Phase::Start, sleep: None }
    }

    /// Back to the start, for the next item of a stream.
    fn reset(&mut self) {
        self.phase = Phase::Start;
        self.sleep = None;
    }

    /// A future of what `attempt` gives: `None` until it has something.
    fn until<R>(
        self,
        attempt: impl FnMut() -> Option<Result<R, Error>>,
    ) -> Until<'a, impl FnMut() -> Option<Result<R, Error>>> {
        Until { wait: self, attempt }
    }

    fn poll_attempt<R>(
        &mut self,
        cx: &mut Context<'_>,
        attempt: &mut dyn FnMut() -> Option<Result<R, Error>>,
    ) -> Poll<Result<R, Error>> {
        let shared = self.shared;
        if let (Some(s), Phase::Parked) = (shared, &self.phase) {
            // Registered before looking: a step after the look wakes it.
            s.park_waker(self.awaits, cx.waker());
        }
        if let Some(r) = attempt() {
            return Poll::Ready(r);
        }
        if let Some(s) = shared {
            if s.stopped() {
                return Poll::Ready(Err(Error::Closed));
            }
            // One step, as a blocking call's thread takes: what it brings
            // is taken at once.
            s.drive_once();
            if let Some(r) = attempt() {
                return Poll::Ready(r);
            }
        }
        let spin = shared.map_or(DEFAULT_SPIN, |s| s.spin());
        if matches!(self.phase, Phase::Start) {
            // Spinning only while fewer threads of this process do than
            // it has cores, as blocking calls do.
            if let Some(p) = leave::Permit::take_spin().filter(|_| !spin.is_zero()) {
                self.phase = Phase::Spinning { since: StdInstant::now(), _permit: p };
            }
        }
        if let Phase::Spinning { since, .. } = &self.phase {
            if since.elapsed() < spin {
                if let Some(s) = shared {
                    // The worker keeps off while this future drives.
                    s.app_touch();
                }
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
        }
        if !matches!(self.phase, Phase::Parked) {
            // From spinning, or from the start without a place to spin.
            self.phase = Phase::Parked;
            if let Some(s) = shared {
                s.park_waker(self.awaits, cx.waker());
                if let Some(r) = attempt() {
                    return Poll::Ready(r);
                }
                // The worker drives it from now on, at once.
                s.app_gone();
            }
        }
        let slice = if shared.is_some() { PARK_SLICE } else { ATTACHED_SLICE };
        let sleep = self.sleep.get_or_insert_with(|| Box::pin(tokio::time::sleep(slice)));
        if sleep.as_mut().poll(cx).is_ready() {
            // Looked at again at once, with a fresh safety net.
            self.sleep = None;
            cx.waker().wake_by_ref();
        }
        Poll::Pending
    }
}

/// A [`Wait`] for what `attempt` gives.
struct Until<'a, F> {
    wait: Wait<'a>,
    attempt: F,
}

impl<R, F: FnMut() -> Option<Result<R, Error>> + Unpin> Future for Until<'_, F> {
    type Output = Result<R, Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        this.wait.poll_attempt(cx, &mut this.attempt)
    }
}
