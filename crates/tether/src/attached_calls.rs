//! Calls on an engine-attached endpoint (docs/ARCHITECTURE.md,
//! "Calls"; docs/ENGINE.md). The engine carries the calls' envelopes as
//! messages on the calls' channel (and keeps them across its own restarts,
//! as it keeps every unsettled message); the call layer itself stays in the
//! application's process: its tables, its handlers, and above all its log,
//! which records what the application's handlers did and must outlive any
//! engine (Kaur's AMVIA keeps its layer above VIA's the same way).
//!
//! Nothing in this process steps a core, so the calls get a thread of
//! their own: it waits on the engine's client for the next envelope or the
//! call layer's next deadline, whichever comes first, and pumps the call
//! layer as an embedded endpoint's station does at every step. The
//! application's waits (`Call::wait`, `Endpoint::serve`) park on a
//! condition variable the pump signals when a call moves.
//!
//! Locks are taken in one order: the calls', then the client's (inside the
//! client's calls), and the client's only if it is free (`try_lock`): a
//! recovery from the engine's death holds it for as long as it waits for
//! a new engine, and the calls (their states, waits with a timeout) must
//! not wait that long. The pump waits holding neither; it learns the call
//! layer's deadline from an atomic, not the calls' lock.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant as StdInstant};

use bytes::Bytes;
use tether_attach::{Client, EngineError};
use tether_proto::{Delivery, Instant, NodeId, SendError};

use crate::call_layer::{CallWire, Calls, Handlers};
use crate::clock::Clock;
use crate::Error;

/// How long a wait yields before it sleeps on the condition variable.
const SPIN: Duration = Duration::from_micros(200);

/// The engine's client as the call layer's wire.
struct ClientWire<'a>(&'a Client);

impl CallWire for ClientWire<'_> {
    fn recv_call(&mut self) -> Option<Delivery> {
        // An engine gone for good is the pump's to report; here it is
        // simply nothing more to take.
        self.0.try_recv_on(tether_rpc::CHANNEL).ok().flatten()
    }

    fn send_call(&mut self, _now: Instant, to: NodeId, envelope: &Bytes) -> Result<(), SendError> {
        match self.0.send_on(tether_rpc::CHANNEL, to, envelope) {
            Ok(_) => Ok(()),
            Err(EngineError::Send(e)) => Err(e),
            Err(EngineError::UnknownPeer(n)) => Err(SendError::UnknownPeer(n)),
            // A full ring, or an engine being replaced: offered again.
            Err(_) => Err(SendError::WouldBlock),
        }
    }

    fn knows(&self, peer: NodeId) -> bool {
        // A busy client cannot say: the call is made, and its envelope
        // dropped (counted) if the peer is indeed unknown.
        self.0.knows(peer).unwrap_or(true)
    }
}

/// The calls of one engine-attached endpoint, and the thread pumping them.
pub(crate) struct AttachedCalls {
    calls: Mutex<Calls>,
    progressed: Condvar,
    pub handlers: Handlers,
    clock: Clock,
    /// The call layer's earliest deadline (the core clock's nanoseconds;
    /// `u64::MAX`: none) as its last change left it.
    deadline_ns: AtomicU64,
    stop: AtomicBool,
    /// Nothing pumps the calls any more (stopped, the engine gone for
    /// good, or the pump ended otherwise): waits on them end.
    gone: AtomicBool,
    pump: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for AttachedCalls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AttachedCalls").field("gone", &self.gone.load(Ordering::Relaxed)).finish()
    }
}

impl AttachedCalls {
    pub fn new(calls: Calls, clock: Clock) -> Arc<Self> {
        let me = Arc::new(AttachedCalls {
            calls: Mutex::new(calls),
            progressed: Condvar::new(),
            handlers: Default::default(),
            clock,
            deadline_ns: AtomicU64::new(u64::MAX),
            stop: AtomicBool::new(false),
            gone: AtomicBool::new(false),
            pump: Mutex::new(None),
        });
        me.settle(&mut me.lock());
        me
    }

    fn lock(&self) -> MutexGuard<'_, Calls> {
        // A panic under the lock (a bug) leaves tables the call layer
        // keeps consistent at every return; go on with them.
        self.calls.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// After a change: the pump's deadline published, and the waits woken
    /// if a call moved. Whether the deadline moved earlier.
    fn settle(&self, c: &mut Calls) -> bool {
        let ns = c.poll_timeout().map_or(u64::MAX, |t| t.as_nanos());
        let before = self.deadline_ns.swap(ns, Ordering::SeqCst);
        if std::mem::take(&mut c.moved) {
            self.progressed.notify_all();
        }
        ns < before
    }

    /// Look at or change the call layer (nothing sent).
    pub fn with<R>(&self, f: impl FnOnce(&mut Calls) -> R) -> R {
        let mut c = self.lock();
        let r = f(&mut c);
        self.settle(&mut c);
        r
    }

    /// Change the call layer and send what that makes it send.
    pub fn exchange<R>(&self, client: &Client, f: impl FnOnce(&mut Calls, &dyn CallWire, Instant) -> R) -> R {
        let mut c = self.lock();
        let now = self.clock.now();
        let mut wire = ClientWire(client);
        let r = f(&mut c, &wire, now);
        c.flush(now, &mut wire);
        if self.settle(&mut c) {
            // The pump may sleep past the new deadline: it looks again.
            client.kick();
        }
        r
    }

    /// Wait until `ready` gives something (asked again each time the pump
    /// moves a call), or `timeout` passes (`Error::TimedOut`).
    pub fn wait<R>(
        &self,
        timeout: Option<Duration>,
        mut ready: impl FnMut(&mut Calls) -> Option<R>,
    ) -> Result<R, Error> {
        let start = StdInstant::now();
        let deadline = timeout.and_then(|t| start.checked_add(t));
        let mut c = self.lock();
        loop {
            if let Some(r) = ready(&mut c) {
                self.settle(&mut c);
                return Ok(r);
            }
            if self.gone.load(Ordering::SeqCst) {
                return Err(Error::Engine(EngineError::EngineGone));
            }
            if timeout != Some(Duration::ZERO) && start.elapsed() < SPIN {
                // An answer is often a few microseconds away: yielding
                // the core to the pump costs less than a sleep and a
                // wake-up on the condition variable.
                drop(c);
                std::thread::yield_now();
                c = self.lock();
                continue;
            }
            // Woken by the pump; the slice only bounds a wait that
            // missed its wake-up (none should).
            let mut left = Duration::from_millis(100);
            if let Some(d) = deadline {
                let now = StdInstant::now();
                if now >= d {
                    return Err(Error::TimedOut);
                }
                left = left.min(d - now);
            }
            c = self.progressed.wait_timeout(c, left).unwrap_or_else(|e| e.into_inner()).0;
        }
    }

    /// Start the pump (once): from now on the client keeps the calls'
    /// envelopes for it instead of dropping them.
    pub fn start(self: &Arc<Self>, client: &Arc<Client>) -> Result<(), Error> {
        let mut pump = self.pump.lock().unwrap_or_else(|e| e.into_inner());
        if pump.is_some() || self.stop.load(Ordering::SeqCst) {
            return Ok(());
        }
        client.serve_channel(tether_rpc::CHANNEL, true);
        let (me, client) = (self.clone(), client.clone());
        let name = format!("tether-calls-{}", client.node());
        *pump = Some(std::thread::Builder::new().name(name).spawn(move || me.run(&client))?);
        Ok(())
    }

    /// Stop the pump and wait for it: woken from its wait on `client`
    /// at once (unless the client is busy recovering from its engine's
    /// death). Waits on calls end (`EngineGone`).
    pub fn stop(&self, client: &Client) {
        self.stop.store(true, Ordering::SeqCst);
        // Asleep on the client, the pump would see the flag only at the
        // end of its slice (up to 100 ms: every attached close took it).
        client.kick();
        let pump = self.pump.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(p) = pump {
            let _ = p.join();
        }
        self.end();
    }

    /// Nothing pumps the calls any more: the waits on them end.
    fn end(&self) {
        self.gone.store(true, Ordering::SeqCst);
        let _guard = self.lock();
        self.progressed.notify_all();
    }

    fn run(&self, client: &Client) {
        /// However the pump ends (a panic too): the waits on calls end,
        /// and the client drops calls' envelopes again instead of keeping
        /// them for nobody.
        struct Ended<'a>(&'a AttachedCalls, &'a Client);
        impl Drop for Ended<'_> {
            fn drop(&mut self) {
                self.1.serve_channel(tether_rpc::CHANNEL, false);
                self.0.end();
            }
        }
        let _ended = Ended(self, client);
        let until = || {
            if self.stop.load(Ordering::Relaxed) {
                return Some(StdInstant::now());
            }
            let ns = self.deadline_ns.load(Ordering::SeqCst);
            (ns != u64::MAX).then(|| self.clock.wall(Instant::from_nanos(ns)))
        };
        let mut wire = ClientWire(client);
        while !self.stop.load(Ordering::SeqCst) {
            match client.recv_on_until(tether_rpc::CHANNEL, until) {
                Ok(first) => {
                    let mut c = self.lock();
                    let now = self.clock.now();
                    if let Some(d) = first {
                        c.take(now, &d);
                    }
                    c.pump(now, &mut wire);
                    self.settle(&mut c);
                }
                // A passing failure of this process (a descriptor for the
                // wait's sleep): a moment, and on.
                Err(EngineError::Io(e)) => {
                    tracing::warn!(node = client.node(), error = %e, "calls: waiting on the engine failed; again");
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => {
                    tracing::warn!(node = client.node(), error = %e, "calls: the engine is gone for good; calls stop");
                    return;
                }
            }
        }
    }
}
