//! The progress threads: who drives an endpoint's protocol while its
//! application is away computing (Trahay et al. [NMAD] section 4, the
//! progress engine; docs/REFERENCES.md).
//!
//! A process's endpoints share them: about one thread per core, each
//! serving many endpoints, not one thread per endpoint. Sixty-four
//! endpoints with a thread each on a two-core machine spent the cores
//! waking threads that found nothing to do (each checked every 125 us
//! whether its application had gone), and the scheduling delay that made
//! fired retransmission timers for data that was only late.
//!
//! A worker waits in `epoll` on its endpoints' sockets, one-shot: a socket
//! that fired is re-armed only once the worker has driven its endpoint, so
//! a socket an application thread is draining (inside a blocking call, it
//! drives its endpoint itself) does not spin the worker. Timers are read
//! from each endpoint's core after every step. The worker steps an
//! endpoint only when the application has been away `HANDOVER`: a thread
//! inside a blocking call drives it itself, and one that just left will
//! likely be back.
//!
//! A worker's endpoints share it fairly, whichever of them has most to do
//! (`stream --flows 64`: 64 pairs of endpoints in one process):
//!
//! - each turn starts one endpoint further on, so none is always served
//!   first or last;
//! - an endpoint whose lock an application call holds is served after the
//!   others, not waited for in line (a thread preempted inside `send`
//!   holds it for its whole time slice);
//! - once a turn has run `LATE`, an endpoint with a call parked on it is
//!   handed to that call (`Shared::hand_off`): its own thread takes the
//!   step, at its own share of the CPU. A worker is one thread among the
//!   process's busy ones; serving 64 endpoints alone it gave each about a
//!   sixty-fourth of a thread's share, while the few flows whose threads
//!   held a leave to drive (`Permit`) took whole ones: those finished
//!   before most others had started;
//! - while calls wait for the workers for want of a leave, no call takes
//!   one (`others_waiting`), so every endpoint waits for its turn alike.
//!
//! And a thread that keeps calling the non-blocking `send` steps its
//! endpoint itself once nobody has for `HANDOVER` (`Embedded::send`).

use std::os::fd::RawFd;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant as StdInstant};

use tether_proto::Instant;

use crate::leave::{cores, HANDOVER};
use crate::shared::{Locked, Shared};

/// Longest a worker sleeps while it serves endpoints, so an application's
/// newly queued message or timer is never left waiting long.
const IDLE_SLICE: Duration = Duration::from_millis(20);
/// How long into a turn the worker steps endpoints itself; after that it
/// hands those with a parked call to the call (below a step's cost on a
/// busy stream: a single flow's worker, with one endpoint ready, never
/// hands off).
const LATE: Duration = Duration::from_micros(100);
/// Events taken per `epoll_wait`.
const EVENTS: usize = 64;
/// The epoll token of a worker's own eventfd.
const WAKE_TOKEN: u64 = u64::MAX;

/// The process's progress workers, started as endpoints arrive.
struct Pool {
    workers: Mutex<Vec<Arc<Worker>>>,
    /// How many workers at most: the cores this process may use.
    cores: usize,
}

fn pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(|| Pool { workers: Mutex::new(Vec::new()), cores: cores() })
}

/// One progress thread's shared half: endpoints handed to it, and the
/// eventfd that wakes it.
struct Worker {
    inbox: Mutex<Vec<Arc<Shared>>>,
    /// Endpoints it serves (including those in the inbox).
    load: AtomicUsize,
    event: RawFd,
    /// Its thread ended (a panic outside any endpoint's step): it is
    /// handed nothing more.
    dead: AtomicBool,
}

impl Worker {
    fn wake(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our own eventfd; a full
        // counter (EAGAIN) already means "woken".
        let _ = unsafe { libc::write(self.event, (&one as *const u64).cast(), 8) };
    }
}

/// Where an endpoint is served: enough to wake its worker.
#[derive(Clone)]
pub(crate) struct Assignment(Arc<Worker>);

impl Assignment {
    /// Wake the worker (it looks at every endpoint it serves, and lets go of
    /// stopped ones).
    pub fn wake(&self) {
        self.0.wake();
    }
}

/// Hand `shared` to the least loaded worker, starting a new one while
/// there are fewer than cores and every one has work.
pub(crate) fn serve(shared: Arc<Shared>) -> std::io::Result<Assignment> {
    let pool = pool();
    let mut workers = pool.workers.lock().unwrap_or_else(|e| e.into_inner());
    workers.retain(|w| !w.dead.load(Ordering::SeqCst));
    let least = workers.iter().min_by_key(|w| w.load.load(Ordering::Relaxed)).cloned();
    let worker = match least {
        Some(w) if w.load.load(Ordering::Relaxed) == 0 || workers.len() >= pool.cores => w,
        _ => {
            let w = start_worker(workers.len())?;
            workers.push(w.clone());
            w
        }
    };
    worker.load.fetch_add(1, Ordering::Relaxed);
    worker.inbox.lock().unwrap_or_else(|e| e.into_inner()).push(shared);
    worker.wake();
    Ok(Assignment(worker))
}

fn start_worker(index: usize) -> std::io::Result<Arc<Worker>> {
    // SAFETY: eventfd and epoll_create1 take no pointers; results checked,
    // and the worker thread owns both descriptors for the process's life.
    let event = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if event < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: as above.
    let epoll = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    if epoll < 0 {
        let e = std::io::Error::last_os_error();
        // SAFETY: `event` is ours and nothing else has it yet.
        unsafe { libc::close(event) };
        return Err(e);
    }
    let worker = Arc::new(Worker {
        inbox: Mutex::new(Vec::new()),
        load: AtomicUsize::new(0),
        event,
        dead: AtomicBool::new(false),
    });
    let mut ev = libc::epoll_event { events: libc::EPOLLIN as u32, u64: WAKE_TOKEN };
    // SAFETY: registers our own live eventfd with our own epoll instance.
    if unsafe { libc::epoll_ctl(epoll, libc::EPOLL_CTL_ADD, event, &mut ev) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let w = worker.clone();
    std::thread::Builder::new()
        .name(format!("tether-progress-{index}"))
        .spawn(move || Loop { worker: w, epoll, served: Vec::new(), turn: 0, busy: Vec::new() }.run())?;
    Ok(worker)
}

/// One endpoint as its worker sees it.
struct Served {
    shared: Arc<Shared>,
    /// The sockets' one-shot registration is live (has not fired since it
    /// was last armed).
    armed: bool,
    /// The sockets are in the epoll set at all, armed or not.
    registered: bool,
    /// A socket fired since the worker last drove it.
    readable: bool,
    /// An application thread was driving it when the worker last looked:
    /// whatever the worker knew of its timers is stale.
    app_was_driving: bool,
    /// When the worker must drive it next (its core's earliest timer).
    due: Option<StdInstant>,
    /// When the worker handed a step to a call parked on it, while that
    /// call has not taken it (`Shared::help` still set).
    handed: Option<StdInstant>,
}

impl Served {
    /// When it must be driven: the deadline its last step left, or an
    /// earlier one an application's call set since (published as the call
    /// let go of the lock; seen at the worker's next turn, within
    /// `IDLE_SLICE`).
    fn due(&self) -> Option<StdInstant> {
        [self.due, self.shared.deadline()].into_iter().flatten().min()
    }
}

struct Loop {
    worker: Arc<Worker>,
    epoll: RawFd,
    /// Indexed by epoll token; `None` for a slot freed.
    served: Vec<Option<Served>>,
    /// Turns taken: where the next one starts.
    turn: usize,
    /// Endpoints whose lock was busy this turn: served at its end.
    busy: Vec<usize>,
}

/// An endpoint's lock was held by someone else.
struct Busy;

impl Loop {
    fn run(mut self) {
        if catch_unwind(AssertUnwindSafe(|| self.serve())).is_err() {
            // A bug outside any endpoint's step (each step catches its
            // own): let go of every endpoint, so that their parked calls
            // drive them themselves instead of waiting for a worker that is
            // gone. A wake-up mask too narrow for a new kind of wait once
            // panicked here and left every blocked call of the process
            // hanging.
            {
                // Under the pool's lock, which `serve` hands endpoints out
                // under: none lands in this inbox after it is emptied.
                let _pool = pool().workers.lock().unwrap_or_else(|e| e.into_inner());
                self.worker.dead.store(true, Ordering::SeqCst);
                self.take_inbox();
            }
            for token in 0..self.served.len() {
                self.release(token);
            }
        }
    }

    fn serve(&mut self) {
        let mut events = [libc::epoll_event { events: 0, u64: 0 }; EVENTS];
        let mut sleep: Option<Duration> = None;
        loop {
            let n = wait(self.epoll, &mut events, sleep);
            for ev in &events[..n] {
                let token = ev.u64;
                if token == WAKE_TOKEN {
                    let mut buf = [0u8; 8];
                    // SAFETY: reads at most 8 bytes into a live 8-byte buffer.
                    let _ = unsafe { libc::read(self.worker.event, buf.as_mut_ptr().cast(), 8) };
                } else if let Some(Some(s)) = self.served.get_mut(token as usize) {
                    s.readable = true;
                    s.armed = false;
                }
            }
            self.take_inbox();
            sleep = self.drive_all();
        }
    }

    fn take_inbox(&mut self) {
        let new = std::mem::take(&mut *self.worker.inbox.lock().unwrap_or_else(|e| e.into_inner()));
        for shared in new {
            let served = Served {
                shared,
                armed: false,
                registered: false,
                readable: false,
                app_was_driving: true,
                due: None,
                handed: None,
            };
            match self.served.iter().position(Option::is_none) {
                Some(i) => self.served[i] = Some(served),
                None => self.served.push(Some(served)),
            }
        }
    }

    /// Drive every endpoint that needs it; how long until one will.
    fn drive_all(&mut self) -> Option<Duration> {
        let start = StdInstant::now();
        let mut next: Option<Duration> = None;
        let mut soon = |d: Option<Duration>| {
            if let Some(d) = d {
                next = Some(next.map_or(d, |n| n.min(d)));
            }
        };
        let len = self.served.len();
        self.turn = self.turn.wrapping_add(1);
        let first = if len == 0 { 0 } else { self.turn % len };
        let mut busy = std::mem::take(&mut self.busy);
        for k in 0..len {
            let token = (first + k) % len;
            match self.visit(token, start, false) {
                Ok(wait) => soon(wait),
                Err(Busy) => busy.push(token),
            }
        }
        // Those an application call held: now waited for (a worker that
        // came back 50 us later instead left a stream's ACKs unread while
        // the sender's `send` calls kept the lock busy: 3.6 M -> 3.0 M
        // 8-byte messages a second).
        for token in busy.drain(..) {
            if let Ok(wait) = self.visit(token, start, true) {
                soon(wait);
            }
        }
        self.busy = busy;
        // Something is served: never sleep longer than the slice, so work
        // an application queued without a wake-up is not left waiting.
        if self.served.iter().any(Option::is_some) {
            soon(Some(IDLE_SLICE));
        }
        next
    }

    /// Drive the endpoint in `token`'s slot if it needs it, or hand its
    /// step to a call parked on it once the turn that began at `start` is
    /// late; how long until it will need it. `Err(Busy)`: its lock was
    /// held, and `wait` says not to wait for it.
    fn visit(&mut self, token: usize, start: StdInstant, wait: bool) -> Result<Option<Duration>, Busy> {
        let Some(s) = &mut self.served[token] else { return Ok(None) };
        if s.shared.stopped() {
            self.release(token);
            return Ok(None);
        }
        let wall = StdInstant::now();
        if let Some(wait) = s.shared.app_driving_for(wall) {
            // An application thread drives it, or did a moment ago and
            // will likely be back: stay off its socket until it has
            // been away a while. Driving still at the look before, with
            // the registration fired: out of the epoll set. A socket with a
            // poller's entry on it pays for that entry at every datagram
            // (the kernel calls the set's callback, armed or not), 0.35 us
            // of a 3.3 us round trip between two spinning sockets; the
            // next `arm` adds it again. (At every look instead, 64 flows'
            // worker spent its turns taking sockets out and putting them
            // back, and the slowest flow fell below half the mean.)
            if s.app_was_driving && !s.armed && s.registered {
                unregister(self.epoll, &s.shared.fds);
                s.registered = false;
            }
            s.app_was_driving = true;
            return Ok(Some(wait));
        }
        if let Some(at) = s.handed {
            let waited = wall.saturating_duration_since(at);
            if s.shared.help.load(Ordering::SeqCst) && waited < HANDOVER {
                // Its caller has not run yet: its turn a while longer.
                // Readable again meanwhile (most likely what that step
                // will take): looked at again soon, in case it was more.
                let left = HANDOVER - waited;
                return Ok(Some(if s.readable { left.min(LATE) } else { left }));
            }
            // Taken, or never (the call returned first): the worker's again.
            s.handed = None;
        }
        let must = s.readable || s.app_was_driving || s.due().is_some_and(|t| t <= wall) || !s.armed;
        if must {
            let Some(mut d) = (if wait { Some(s.shared.lock()) } else { s.shared.try_lock() }) else {
                return Err(Busy);
            };
            if wall.saturating_duration_since(start) >= LATE {
                match s.shared.hand_off(d) {
                    Ok(()) => {
                        s.handed = Some(wall);
                        s.readable = false;
                        s.app_was_driving = false;
                        // Its caller's step publishes the deadline it
                        // leaves (`Shared::deadline`).
                        s.due = None;
                        if !s.armed {
                            s.armed = arm(self.epoll, &s.shared.fds, token as u64, s.registered);
                            s.registered |= s.armed;
                        }
                        return Ok(Some(HANDOVER));
                    }
                    Err(back) => d = back,
                }
            }
            match drive(&s.shared, d) {
                Driven::Panicked => {
                    // The endpoint's state is whatever the panic left;
                    // its application still drives it in its calls,
                    // but this worker serves its other endpoints.
                    tracing::error!(
                        "tether progress worker: a step panicked; endpoint left to its application"
                    );
                    self.release(token);
                    return Ok(None);
                }
                Driven::Stepped(due) => {
                    s.due = due;
                    s.readable = false;
                    s.app_was_driving = false;
                    if !s.armed {
                        s.armed = arm(self.epoll, &s.shared.fds, token as u64, s.registered);
                        s.registered |= s.armed;
                    }
                }
            }
        }
        Ok(s.due().map(|due| due.saturating_duration_since(wall)))
    }

    /// Let go of the endpoint in `token`'s slot: its sockets leave the
    /// epoll set before its last reference here is dropped (a closed and
    /// reused descriptor must not stay registered).
    fn release(&mut self, token: usize) {
        if let Some(s) = self.served[token].take() {
            unregister(self.epoll, &s.shared.fds);
            self.worker.load.fetch_sub(1, Ordering::Relaxed);
            s.shared.released.store(true, Ordering::SeqCst);
            // Its parked calls must drive it themselves now.
            s.shared.wake_parked();
            // Said only once our reference is gone: a `close` that returned
            // while we still held one left its ports bound a moment longer
            // (a fresh-clone CI run failed to bind a closed endpoint's port).
            let dropped = s.shared.dropped.clone();
            drop(s);
            dropped.store(true, Ordering::SeqCst);
        }
    }
}

/// `epoll_pwait2`, to the microsecond: a pacing deadline is tens of
/// microseconds away, and `epoll_wait`'s milliseconds would round it up a
/// hundredfold. Kernels before 5.11 get `epoll_wait`, rounded up.
fn wait(epoll: RawFd, events: &mut [libc::epoll_event; EVENTS], sleep: Option<Duration>) -> usize {
    static NO_PWAIT2: AtomicBool = AtomicBool::new(false);
    let n = if NO_PWAIT2.load(Ordering::Relaxed) {
        -1
    } else {
        let ts = sleep.map(|d| {
            let d = d.min(Duration::from_secs(3600));
            libc::timespec { tv_sec: d.as_secs() as libc::time_t, tv_nsec: d.subsec_nanos() as _ }
        });
        let ts_ptr = ts.as_ref().map_or(std::ptr::null(), |t| t as *const libc::timespec);
        // SAFETY: `events` is a live array of EVENTS structs, `ts_ptr` null
        // or a live timespec, a null signal mask leaves the mask alone.
        let n = unsafe {
            libc::epoll_pwait2(epoll, events.as_mut_ptr(), EVENTS as i32, ts_ptr, std::ptr::null())
        };
        if n < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ENOSYS) {
            NO_PWAIT2.store(true, Ordering::Relaxed);
        } else {
            return n.max(0) as usize;
        }
        -1
    };
    debug_assert!(n < 0);
    let ms = sleep.map_or(-1, |d| d.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32);
    // SAFETY: as above.
    let n = unsafe { libc::epoll_wait(epoll, events.as_mut_ptr(), EVENTS as i32, ms) };
    n.max(0) as usize
}

/// Register (or re-arm, when `registered`) `fds` one-shot under `token`;
/// whether all took.
fn arm(epoll: RawFd, fds: &[RawFd], token: u64, registered: bool) -> bool {
    let mut all = true;
    for &fd in fds {
        let mut ev = libc::epoll_event { events: (libc::EPOLLIN | libc::EPOLLONESHOT) as u32, u64: token };
        // SAFETY: `fd` is open (its endpoint is alive), `ev` a live struct.
        let modified = registered && unsafe { libc::epoll_ctl(epoll, libc::EPOLL_CTL_MOD, fd, &mut ev) } == 0;
        if !modified {
            // SAFETY: as above; a first registration.
            let added = unsafe { libc::epoll_ctl(epoll, libc::EPOLL_CTL_ADD, fd, &mut ev) };
            all &= added == 0;
        }
    }
    all
}

/// Take `fds` out of the epoll set (those not in it are left as they are).
fn unregister(epoll: RawFd, fds: &[RawFd]) {
    for &fd in fds {
        // SAFETY: the descriptor is still open (its endpoint is alive).
        unsafe { libc::epoll_ctl(epoll, libc::EPOLL_CTL_DEL, fd, std::ptr::null_mut()) };
    }
}

enum Driven {
    Panicked,
    /// Stepped; the next deadline.
    Stepped(Option<StdInstant>),
}

/// One step of `shared`'s endpoint, now, with its lock `d`.
fn drive(shared: &Shared, mut d: Locked<'_>) -> Driven {
    catch_unwind(AssertUnwindSafe(move || {
        if shared.stopped() {
            return Driven::Stepped(None);
        }
        // A step handed to a parked call and not taken yet: this is it.
        shared.help.store(false, Ordering::SeqCst);
        // The clock after the lock: a reading from before the wait would
        // make the step's pacing and timers lag by the wait.
        let wall = StdInstant::now();
        let now: Instant = shared.clock.at(wall);
        shared.step(&mut d, now);
        Driven::Stepped(d.idle_for(now).map(|idle| wall + idle))
    }))
    .unwrap_or(Driven::Panicked)
}

/// Wait, at most `bound`, until the worker has dropped its reference to
/// an endpoint (it sets `dropped` after); whether it has.
pub(crate) fn wait_dropped(dropped: &AtomicBool, bound: Duration) -> bool {
    let start = StdInstant::now();
    while !dropped.load(Ordering::SeqCst) {
        if start.elapsed() >= bound {
            return false;
        }
        std::thread::sleep(Duration::from_micros(20));
    }
    true
}
