//! An embedded endpoint's state as its threads share it: the station behind
//! its lock, who may drive it, and the blocked calls parked until a step
//! brings what they wait for (Trahay et al. [NMAD] section 4, the progress
//! engine; docs/REFERENCES.md).
//!
//! Who drives the core: while an application thread is inside a blocking
//! tether call it drives progress itself (spinning briefly, then sleeping
//! on the socket), so a reply costs no thread hand-off; when as many
//! threads already do as the process may have (`leave`), it parks until
//! someone else's step brings what it waits for. While the application is
//! away computing, a progress worker (`progress`) drives it.

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, TryLockError};
use std::task::Waker;
use std::time::{Duration, Instant as StdInstant};

use tether_io::FaultHandle;
use tether_proto::Instant;

use crate::call_layer::Handlers;
use crate::clock::Clock;
use crate::leave;
use crate::station::Station;
use crate::waiter::Waiter;
use crate::Error;

/// The station an embedded endpoint runs: its core, its rails and the call
/// layer above them.
pub(crate) type EmbeddedStation = Station<crate::above::Above>;

/// Longest a blocked call that drives its endpoint sleeps without a
/// deadline, so a stop request is never left waiting long.
const IDLE_SLICE: Duration = Duration::from_millis(20);

/// Longest a parked call sleeps without a deadline: a safety net only, as
/// the steps that bring what it waits for, `stop` and the worker letting go
/// all wake it. At 20 ms the 256-node demo's 253 parked receivers woke
/// 12,600 times a second for nothing, most of its thread switches.
const PARK_SLICE: Duration = Duration::from_millis(200);

pub(crate) struct Shared {
    station: Mutex<EmbeddedStation>,
    waiter: Waiter,
    pub(crate) clock: Clock,
    /// Application threads currently driving progress inside a blocking call.
    app_active: AtomicUsize,
    /// When the last application thread left a blocking call, in clock nanoseconds.
    app_left_ns: AtomicU64,
    stop: AtomicBool,
    spin: Duration,
    /// How this endpoint's spins went: whether the next may spin.
    spins: crate::spin_policy::SpinPolicy,
    /// The transports' fault injectors (one per rail), when the plan has
    /// send or receive rules.
    faults: Vec<FaultHandle>,
    /// The rails' descriptors, for the progress worker to wait on.
    pub(crate) fds: Vec<RawFd>,
    /// The progress worker no longer drives this endpoint (after `stop`,
    /// or a step that panicked): parked calls must drive it themselves.
    pub(crate) released: AtomicBool,
    /// The progress worker holds no reference to this endpoint any more,
    /// so its sockets close with the application's last one. Outside
    /// `Shared`, as it is set after the worker's reference is dropped.
    pub(crate) dropped: Arc<AtomicBool>,
    /// A progress worker serves this endpoint (`Progress::Thread`): a
    /// blocked call without leave to drive it may wait for the worker.
    served: bool,
    /// Blocked calls waiting for someone else's step (`block_on`), by what
    /// they wait for, and where they wait, one condition variable for
    /// each: a step that may have brought it (and `stop`) wakes them. One
    /// for all woke a node's sender, waiting for room, with every message
    /// delivered to its receiver, and the receiver with every ACK.
    parked: [AtomicUsize; Awaits::COUNT],
    progressed: [Condvar; Awaits::COUNT],
    /// Futures of the async API parked for each, by their wakers
    /// (`aio`): woken with the condition variables, and counted in
    /// `parked` while registered.
    wakers: [Mutex<Vec<Waker>>; Awaits::COUNT],
    /// The handlers served here, by id (outside the lock: they run outside it).
    pub(crate) handlers: Handlers,
    /// Messages settled (acknowledged or failed) and segments acknowledged
    /// when a step last looked.
    settled_seen: AtomicU64,
    /// The core's earliest deadline (its nanoseconds; `u64::MAX`: none) as
    /// the lock was last let go: what the progress worker must drive the
    /// endpoint at, whoever set it. A worker that knew only the deadlines
    /// of its own steps never drove an endpoint whose timer was set by a
    /// non-blocking `send` or a parked call (a retransmission timeout for
    /// a lost datagram to a silent peer, a HELLO's retry): the call waited
    /// for ever.
    deadline_ns: AtomicU64,
    /// The progress worker handed this endpoint's next step to a call
    /// parked on it (`Shared::hand_off`): set under the lock, taken by the
    /// first parked call that wakes, which steps the endpoint on its own
    /// thread's time.
    pub(crate) help: AtomicBool,
    /// The progress worker serving it, to wake when the application's
    /// futures park (`app_gone`).
    pub(crate) worker: std::sync::OnceLock<crate::progress::Assignment>,
}

/// The endpoint's state, locked; letting it go publishes the core's
/// earliest deadline (`Shared::deadline_ns`) and wakes the parked calls a
/// step under it found something for.
pub(crate) struct Locked<'a> {
    guard: Option<MutexGuard<'a, EmbeddedStation>>,
    shared: &'a Shared,
    /// Condition variables to notify once the lock is let go (bit per
    /// `Awaits`): a call woken under the lock would wake only to wait for
    /// it again, a second thread switch for every wake-up.
    wakes: Wakes,
}

impl Locked<'_> {
    fn publish(&mut self) {
        if let Some(d) = &self.guard {
            let t = d.poll_timeout().map_or(u64::MAX, |t| t.as_nanos());
            self.shared.deadline_ns.store(t, Ordering::Release);
        }
    }

    /// Notify the condition variables a step marked. After the lock is let
    /// go this loses no wake-up: a call that parks later checked what it
    /// waits for under the lock, after the step that brought it.
    fn notify(&mut self) {
        if self.wakes == 0 {
            return;
        }
        for (k, c) in self.shared.progressed.iter().enumerate() {
            if self.wakes & (1 << k) != 0 {
                c.notify_all();
                self.shared.wake_futures(k);
            }
        }
        self.wakes = 0;
    }
}

impl core::ops::Deref for Locked<'_> {
    type Target = EmbeddedStation;
    fn deref(&self) -> &EmbeddedStation {
        self.guard.as_ref().expect("held until dropped")
    }
}

impl core::ops::DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut EmbeddedStation {
        self.guard.as_mut().expect("held until dropped")
    }
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        self.publish();
        drop(self.guard.take());
        self.notify();
    }
}

/// What a blocked call waits for: a step wakes the calls parked for it only
/// when that may have come. Waking every parked call at every step cost
/// the 256-node demo a fifth of its CPU in thread switches: a sender
/// waiting for room and its receiver for a message, woken for each other's
/// datagrams.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Awaits {
    /// A message in the delivery queue.
    Delivery,
    /// An event for the application.
    Event,
    /// A message settled: room to send, a handle's outcome.
    Settled,
    /// Every message settled (`flush`, `close`). Woken with each segment
    /// acknowledged, as `Settled` is, the 256-node demo's 256 flushing
    /// threads made most of its 72,000 thread switches a second (39,000
    /// once woken only when all had settled).
    AllSettled,
    /// Anything at all.
    Anything,
    /// A call moved (an answer, a state change) or a handler waits to run.
    Calls,
    /// An unreliable message for the application.
    Unreliable,
    /// A NACK-reliable message for the application.
    Nacked,
    /// A cluster event (a view, a suspicion).
    Cluster,
    /// A group's delivery or view, or room to multicast.
    Group,
}

impl Awaits {
    const COUNT: usize = 10;
}

/// A bit per `Awaits`.
type Wakes = u16;
const _: () = assert!(Awaits::COUNT <= Wakes::BITS as usize, "a bit per Awaits");

impl Shared {
    /// The state of an endpoint that runs `station` over rails waited on with
    /// `waiter` (descriptors `fds`), whose faults are `faults`; `served`:
    /// a progress worker will serve it.
    pub(crate) fn new(
        station: EmbeddedStation,
        waiter: Waiter,
        clock: Clock,
        spin: Duration,
        faults: Vec<FaultHandle>,
        fds: Vec<RawFd>,
        served: bool,
    ) -> Self {
        Shared {
            station: Mutex::new(station),
            waiter,
            clock,
            app_active: AtomicUsize::new(0),
            app_left_ns: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            spin,
            spins: Default::default(),
            faults,
            fds,
            released: AtomicBool::new(false),
            dropped: Arc::new(AtomicBool::new(false)),
            served,
            parked: Default::default(),
            progressed: Default::default(),
            wakers: Default::default(),
            handlers: Default::default(),
            settled_seen: AtomicU64::new(0),
            deadline_ns: AtomicU64::new(u64::MAX),
            help: AtomicBool::new(false),
            worker: std::sync::OnceLock::new(),
        }
    }

    /// The rails' fault injectors (those whose plan has send or receive rules).
    pub(crate) fn faults(&self) -> &[FaultHandle] {
        &self.faults
    }

    /// Ask every thread in a blocking call to return (`Error::Closed`) and
    /// the progress worker to let go.
    pub(crate) fn request_stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.waiter.wake();
        self.wake_parked();
    }

    pub(crate) fn lock(&self) -> Locked<'_> {
        // A panic while holding the lock leaves the core in whatever state
        // it reached; its invariants do not depend on the panicking caller.
        Locked { guard: Some(self.station.lock().unwrap_or_else(|e| e.into_inner())), shared: self, wakes: 0 }
    }

    /// The lock if nobody holds it now: the progress worker serves its
    /// other endpoints first rather than wait behind an application call
    /// (a thread preempted inside `send` holds it for its whole time
    /// slice, and every endpoint behind it in the worker's turn waited
    /// that long).
    pub(crate) fn try_lock(&self) -> Option<Locked<'_>> {
        let guard = match self.station.try_lock() {
            Ok(g) => g,
            // As `lock`: the core's invariants do not depend on the caller
            // that panicked.
            Err(TryLockError::Poisoned(e)) => e.into_inner(),
            Err(TryLockError::WouldBlock) => return None,
        };
        Some(Locked { guard: Some(guard), shared: self, wakes: 0 })
    }

    /// Hand the endpoint's next step to a call parked on it, with its lock
    /// `d` (so none parks unseen between the look and the wake-up); the
    /// lock back if none is parked. The step is then paid for by the
    /// thread waiting for it, at its own share of the CPU, not by a
    /// progress worker shared with many other endpoints.
    pub(crate) fn hand_off<'a>(&'a self, d: Locked<'a>) -> Result<(), Locked<'a>> {
        let waiting = (0..Awaits::COUNT)
            .filter(|&k| self.parked[k].load(Ordering::SeqCst) > 0)
            .fold(0 as Wakes, |w, k| w | 1 << k);
        if waiting == 0 {
            return Err(d);
        }
        self.help.store(true, Ordering::SeqCst);
        // Notified once the lock is let go, as `Locked` does.
        drop(d);
        for (k, c) in self.progressed.iter().enumerate() {
            if waiting & 1 << k != 0 {
                c.notify_all();
                self.wake_futures(k);
            }
        }
        Ok(())
    }

    /// The core's earliest deadline as last published, on the wall clock.
    pub(crate) fn deadline(&self) -> Option<StdInstant> {
        let t = self.deadline_ns.load(Ordering::Acquire);
        (t != u64::MAX).then(|| self.clock.wall(Instant::from_nanos(t)))
    }

    /// Wake every parked call (the endpoint stopped, or its worker let go).
    pub(crate) fn wake_parked(&self) {
        // Under the lock, so a call about to park sees why or is woken.
        drop(self.lock());
        for (k, c) in self.progressed.iter().enumerate() {
            c.notify_all();
            self.wake_futures(k);
        }
    }

    /// Wake the futures parked for `Awaits` number `k`; each registers
    /// again if what it waits for has not come.
    fn wake_futures(&self, k: usize) {
        let woken = std::mem::take(&mut *self.wakers[k].lock().unwrap_or_else(|e| e.into_inner()));
        if woken.is_empty() {
            return;
        }
        self.parked[k].fetch_sub(woken.len(), Ordering::SeqCst);
        for w in woken {
            w.wake();
        }
    }

    /// Park a future of the async API for `awaits`: the next step that
    /// may bring it wakes `waker` (once; a future not served by then
    /// registers again). Under the endpoint's lock, as a blocking call
    /// parks: a step cannot fall between it and the future's look.
    #[cfg(feature = "tokio")]
    pub(crate) fn park_waker(&self, awaits: Awaits, waker: &Waker) {
        let _d = self.lock();
        let mut wakers = self.wakers[awaits as usize].lock().unwrap_or_else(|e| e.into_inner());
        if wakers.iter().any(|w| w.will_wake(waker)) {
            return;
        }
        wakers.push(waker.clone());
        self.parked[awaits as usize].fetch_add(1, Ordering::SeqCst);
    }

    /// One step of the endpoint on the calling thread (a future's poll),
    /// taking over a step the worker handed to a parked call.
    #[cfg(feature = "tokio")]
    pub(crate) fn drive_once(&self) {
        let mut d = self.lock();
        self.help.store(false, Ordering::SeqCst);
        let now = self.clock.now();
        self.step(&mut d, now);
    }

    /// How long a waiting call busy-polls before it sleeps (or parks).
    #[cfg(feature = "tokio")]
    pub(crate) fn spin(&self) -> Duration {
        self.spin
    }

    /// An application future drives the endpoint now: the worker keeps
    /// off until it has been away `leave::HANDOVER`.
    #[cfg(feature = "tokio")]
    pub(crate) fn app_touch(&self) {
        self.app_left_ns.store(self.clock.now().as_nanos(), Ordering::SeqCst);
    }

    /// The application's futures parked: the worker drives from now on,
    /// without waiting out the handover a blocking call's return leaves
    /// (a caller back at once), as a parked future is not.
    #[cfg(feature = "tokio")]
    pub(crate) fn app_gone(&self) {
        self.app_left_ns.store(0, Ordering::SeqCst);
        if let Some(w) = self.worker.get() {
            w.wake();
        }
    }

    /// Wait on `awaits`'s condition variable with the lock `d` for at most
    /// `sleep`.
    fn park(&self, mut d: Locked<'_>, awaits: Awaits, sleep: Duration) {
        d.publish();
        d.notify();
        let guard = d.guard.take().expect("held until dropped");
        let parked = &self.parked[awaits as usize];
        parked.fetch_add(1, Ordering::SeqCst);
        let (guard, _) =
            self.progressed[awaits as usize].wait_timeout(guard, sleep).unwrap_or_else(|e| e.into_inner());
        parked.fetch_sub(1, Ordering::SeqCst);
        d.guard = Some(guard);
    }

    pub(crate) fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// Step the endpoint `d` (this endpoint's, locked) at `now`, and mark
    /// the calls parked for what it brought to be woken as the lock goes.
    pub(crate) fn step(&self, d: &mut Locked<'_>, now: Instant) {
        d.step(now);
        // Under the lock the parked calls wait with: none can park between
        // these loads and the wake-up and miss it.
        let parked = |k: Awaits| self.parked[k as usize].load(Ordering::SeqCst) > 0;
        if !self.parked.iter().any(|p| p.load(Ordering::SeqCst) > 0) {
            return;
        }
        let stats = d.core.stats();
        // Room to send opens with every segment acknowledged, not only
        // with whole messages settled.
        let settled = stats.messages_acked + stats.messages_failed + stats.segments_acked;
        let moved = self.settled_seen.swap(settled, Ordering::SeqCst) != settled;
        let mut wakes: Wakes = 0;
        let mut wake = |k: Awaits| wakes |= 1 << k as usize;
        if parked(Awaits::Anything) {
            wake(Awaits::Anything);
        }
        if parked(Awaits::Delivery) && d.core.pending_deliveries() > 0 {
            wake(Awaits::Delivery);
        }
        if parked(Awaits::Unreliable) && d.core.has_unreliable() {
            wake(Awaits::Unreliable);
        }
        if parked(Awaits::Nacked) && d.core.has_nacked() {
            wake(Awaits::Nacked);
        }
        if parked(Awaits::Event) && d.core.has_events() {
            wake(Awaits::Event);
        }
        if parked(Awaits::Settled) && moved {
            wake(Awaits::Settled);
        }
        if parked(Awaits::AllSettled) && d.core.unsettled() == 0 {
            wake(Awaits::AllSettled);
        }
        if parked(Awaits::Calls) && d.layer.calls.moved {
            d.layer.calls.moved = false;
            wake(Awaits::Calls);
        }
        if parked(Awaits::Group) && d.layer.groups_moved {
            d.layer.groups_moved = false;
            wake(Awaits::Group);
        }
        if let Some(c) = d.layer.cluster.as_mut().filter(|c| c.moved) {
            if parked(Awaits::Cluster) {
                c.moved = false;
                wake(Awaits::Cluster);
            }
        }
        d.wakes |= wakes;
    }

    /// `Some(wait)` while an application thread drives the endpoint, or
    /// did a moment ago: the progress worker looks again after `wait`.
    pub(crate) fn app_driving_for(&self, wall: StdInstant) -> Option<Duration> {
        let active = self.app_active.load(Ordering::SeqCst) > 0;
        let left = Instant::from_nanos(self.app_left_ns.load(Ordering::SeqCst));
        leave::app_away(active, self.clock.at(wall).saturating_since(left))
    }
}

/// Marks an application thread as the driver for the duration of a call.
struct Active<'a>(&'a Shared);

impl<'a> Active<'a> {
    fn enter(shared: &'a Shared) -> Self {
        shared.app_active.fetch_add(1, Ordering::SeqCst);
        Active(shared)
    }
}

impl Drop for Active<'_> {
    fn drop(&mut self) {
        // No wake-up for the progress thread: an application that calls in
        // again at once (a pingpong, a stream) would pay a thread switch per
        // call. The progress thread takes over once the application has been
        // away for `leave::HANDOVER`.
        self.0.app_left_ns.store(self.0.clock.now().as_nanos(), Ordering::SeqCst);
        self.0.app_active.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Wait until `ready` yields a value: driving progress from the calling
/// thread, or, when as many threads of this process as it has cores do
/// already (`leave::Permit::take_drive`), parked until the endpoint's
/// progress worker (or the thread that drives it) has stepped it.
pub(crate) fn block_on<R>(
    shared: &Shared,
    timeout: Option<Duration>,
    awaits: Awaits,
    mut ready: impl FnMut(&mut EmbeddedStation) -> Option<R>,
) -> Result<R, Error> {
    let start = StdInstant::now();
    // A timeout past the end of time (Duration::MAX: "as long as it
    // takes") is no deadline, not an overflow.
    let deadline = timeout.and_then(|t| start.checked_add(t));
    let mut driving: Option<(leave::Permit, Active<'_>)> = None;
    // Busy-polling only while fewer threads of this process do than it
    // has cores: with more, each spinner's turn is another's delay.
    let mut spinning = None;
    // Counted among the calls waiting for the workers while parked.
    let mut waiting: Option<leave::Waiting> = None;
    loop {
        if driving.is_none() {
            // Parking needs someone else to drive: a worker that still serves it.
            let must = !shared.served || shared.released.load(Ordering::SeqCst);
            // No leave while other calls wait for the workers: those that
            // held one drove their endpoints on their own threads while
            // the others waited for the turns of workers shared by all
            // (64 streams: the slowest had 0.52-0.62 of its fair share
            // with leaves still taken meanwhile, 0.64-0.74 without).
            let permit =
                if leave::others_waiting(waiting.is_some()) { None } else { leave::Permit::take_drive() };
            let permit = permit.or_else(|| must.then(leave::Permit::none));
            if permit.is_some() {
                waiting = None;
            } else if waiting.is_none() {
                waiting = Some(leave::Waiting::new());
            }
            driving = permit.map(|p| (p, Active::enter(shared)));
            if driving.is_some() && !shared.spin.is_zero() && shared.spins.may_spin() {
                spinning = leave::Permit::take_spin();
            }
        }
        let mut d = shared.lock();
        // What is already queued is served without a system call.
        if let Some(r) = ready(&mut d) {
            return Ok(shared.spins.served(r, spinning.is_some()));
        }
        // One clock reading per turn (it is on the hot path of every
        // spin), taken under the lock: a reading from before a wait for it
        // would hand the core a time earlier than the one another thread
        // just stepped it with. With 256 threads on two cores the wait was
        // tens of milliseconds; time running backwards made round trips
        // negative and probe answers arrive before their probes, and RACK
        // resent what had not been lost.
        let wall = StdInstant::now();
        let mut sleep = if driving.is_some() { IDLE_SLICE } else { PARK_SLICE };
        if driving.is_some() {
            let now = shared.clock.at(wall);
            shared.step(&mut d, now);
            if let Some(r) = ready(&mut d) {
                return Ok(shared.spins.served(r, spinning.is_some()));
            }
            sleep = d.idle_for(now).map_or(sleep, |t| t.min(sleep));
        } else if shared.help.swap(false, Ordering::SeqCst) {
            // The worker handed this step to us (`Shared::hand_off`): one
            // step, then parked again.
            shared.step(&mut d, shared.clock.at(wall));
            if let Some(r) = ready(&mut d) {
                return Ok(r);
            }
        }
        if deadline.is_some_and(|d| wall >= d) {
            return Err(Error::TimedOut);
        }
        if shared.stop.load(Ordering::SeqCst) {
            return Err(Error::Closed);
        }
        if let Some(d) = deadline {
            sleep = sleep.min(d.saturating_duration_since(wall));
        }
        if driving.is_none() {
            // Parked: `Shared::step` wakes it; the slice is a safety net.
            shared.park(d, awaits, sleep);
            continue;
        }
        drop(d);
        if spinning.is_some() && wall - start < shared.spin {
            std::hint::spin_loop();
            continue;
        }
        if spinning.take().is_some() {
            shared.spins.ran_out();
        }
        shared.waiter.wait(sleep);
    }
}

#[cfg(test)]
mod tests {
    // The test measures wall-clock bounds on real sockets.
    #![allow(clippy::disallowed_methods)]

    use std::sync::Mutex;

    use tether_fault::FaultPlan;
    use tether_proto::MessageState;

    use super::*;
    use crate::{Endpoint, Options};

    /// The tests take every leave to drive the process has: one at a time.
    static PERMITS: Mutex<()> = Mutex::new(());

    /// Nodes 0 and 1 on loopback, each the other's peer, each with its
    /// options.
    fn two_on_loopback([a, b]: [Options; 2]) -> [Endpoint; 2] {
        let any = || "127.0.0.1:0".parse().unwrap();
        let eps = [Endpoint::udp(0, any(), &[], a).unwrap(), Endpoint::udp(1, any(), &[], b).unwrap()];
        eps[0].add_peer(1, eps[1].local_addr().unwrap()).unwrap();
        eps[1].add_peer(0, eps[0].local_addr().unwrap()).unwrap();
        eps
    }

    /// A call without leave to drive its endpoint waits for the endpoint's
    /// progress worker, and the worker's step that brings what it waits for
    /// wakes it at once, not at its safety slice (`PARK_SLICE`).
    #[test]
    fn calls_that_may_not_drive_wait_for_the_worker_and_wake_at_once() {
        const ROUND_TRIPS: u32 = 200;
        let eps = two_on_loopback(Default::default());
        // Every leave to drive this process has, taken: each blocking call
        // below waits for the workers.
        let _one = PERMITS.lock().unwrap_or_else(|e| e.into_inner());
        let held: Vec<_> = std::iter::from_fn(leave::Permit::take_drive).collect();
        assert!(!held.is_empty());
        let limit = Some(Duration::from_secs(20));
        let start = StdInstant::now();
        std::thread::scope(|s| {
            let pong = &eps[1];
            s.spawn(move || {
                for i in 0..ROUND_TRIPS {
                    let d = pong.recv(limit).expect("a ping");
                    assert_eq!((d.from, &d.message[..]), (0, &i.to_le_bytes()[..]));
                    pong.send_blocking(0, &i.to_le_bytes(), limit).unwrap();
                }
            });
            for i in 0..ROUND_TRIPS {
                eps[0].send_blocking(1, &i.to_le_bytes(), limit).unwrap();
                let d = eps[0].recv(limit).expect("a pong");
                assert_eq!((d.from, &d.message[..]), (1, &i.to_le_bytes()[..]));
            }
        });
        let took = start.elapsed();
        drop(held);
        // Left to the safety slice, each receive would take 200 ms.
        assert!(took < Duration::from_secs(1), "{ROUND_TRIPS} round trips took {took:?}");
    }

    /// A `flush` without leave to drive wakes when its endpoint's last
    /// message settles (`Awaits::AllSettled`), not at its safety slice.
    #[test]
    fn a_parked_flush_wakes_when_the_last_message_settles() {
        const ROUNDS: u32 = 100;
        let eps = two_on_loopback(Default::default());
        let limit = Some(Duration::from_secs(20));
        let _one = PERMITS.lock().unwrap_or_else(|e| e.into_inner());
        let held: Vec<_> = std::iter::from_fn(leave::Permit::take_drive).collect();
        let start = StdInstant::now();
        for i in 0..ROUNDS {
            let h = eps[0].send(1, &i.to_le_bytes()).unwrap();
            eps[0].flush(limit).unwrap();
            assert_eq!(h.state(), MessageState::Delivered, "settled when flush returned");
        }
        let took = start.elapsed();
        drop(held);
        for i in 0..ROUNDS {
            assert_eq!(&eps[1].recv(limit).unwrap().message[..], &i.to_le_bytes()[..]);
        }
        // Left to the safety slice, each flush would take 200 ms.
        assert!(took < Duration::from_millis(500), "{ROUNDS} flushes took {took:?}");
    }

    /// A timer set by a call the worker did not make (a non-blocking
    /// `send`'s retransmission timeout) is driven by the worker all the
    /// same: here the only thing that can deliver the message, as the
    /// receiver drops the first transmissions and has nothing to say, and
    /// the waiting call may not drive.
    #[test]
    fn the_worker_drives_a_timer_an_application_call_set() {
        let quiet = Options::default();
        // The receiver drops everything that arrives from 100 to 150 ms
        // after it was made.
        let plan = FaultPlan::parse_rules(1, &["drop:p=1,from=100ms,until=150ms,side=recv"]).unwrap();
        let lossy = Options { faults: plan, ..Options::default() };
        let start = StdInstant::now();
        let [a, b] = two_on_loopback([quiet, lossy]);
        let limit = Some(Duration::from_secs(2));
        // A session first, while everything arrives.
        assert_eq!(a.send(1, b"first").unwrap().wait(limit).unwrap(), MessageState::Delivered);
        assert_eq!(&b.recv(limit).unwrap().message[..], b"first");
        std::thread::sleep(Duration::from_millis(110).saturating_sub(start.elapsed()));
        let _one = PERMITS.lock().unwrap_or_else(|e| e.into_inner());
        let held: Vec<_> = std::iter::from_fn(leave::Permit::take_drive).collect();
        let h = a.send(1, b"second").unwrap();
        let state = h.wait(limit);
        drop(held);
        assert_eq!(state.unwrap(), MessageState::Delivered, "retransmitted by the worker");
        assert_eq!(&b.recv(limit).unwrap().message[..], b"second");
    }
}
