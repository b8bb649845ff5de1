//! The public endpoint: the sans-IO core driven over a real transport.
//!
//! Who drives the core: while an application thread is inside a blocking
//! tether call it drives progress itself (spinning briefly, then sleeping
//! on the socket), so a reply costs no thread hand-off; while the
//! application is away computing, the progress thread drives it, so ACKs
//! and retransmissions flow and failures are detected within a bounded time
//! (seeds/003 section 4). With `Progress::Polling` there is no thread and
//! the application calls `progress()` itself.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant as StdInstant, SystemTime, UNIX_EPOCH};

use tether_io::{AddressBook, Transport, UdpTransport};
use tether_proto::{
    Config, Delivery, Endpoint as Core, Event, Instant, MessageId, MessageState, NodeId, SendError, Stats,
};

use crate::clock::Clock;
use crate::driver::Driver;
use crate::waiter::Waiter;
use crate::Error;

/// Who drives the protocol when the application is not inside a tether call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Progress {
    /// A background thread (the default).
    #[default]
    Thread,
    /// Nobody: the application calls `Endpoint::progress` often enough.
    Polling,
}

/// Longest the progress thread sleeps without a deadline, so a stop request
/// or a newly queued message is never left waiting long.
const IDLE_SLICE: Duration = Duration::from_millis(20);
/// Longest the progress thread leaves the endpoint undriven after the
/// application stops driving it: below the 1 ms retransmission floor, so a
/// computing application costs its peers no spurious retransmission.
const HANDOVER: Duration = Duration::from_micros(500);

#[derive(Debug, Clone)]
pub struct Options {
    pub config: Config,
    pub progress: Progress,
    /// How long a blocked call busy-polls before it sleeps in the kernel:
    /// a few tens of microseconds catch a reply on a fast network without a
    /// wake-up, at the cost of a core.
    pub spin: Duration,
    /// `None`: derived from the wall clock, so a restart gets a larger one.
    pub incarnation: Option<u64>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            config: Config::default(),
            progress: Progress::Thread,
            spin: Duration::from_micros(50),
            incarnation: None,
        }
    }
}

struct Shared {
    driver: Mutex<Driver>,
    waiter: Waiter,
    clock: Clock,
    /// Application threads currently driving progress inside a blocking call.
    app_active: AtomicUsize,
    /// When the last application thread left a blocking call, in clock nanoseconds.
    app_left_ns: AtomicU64,
    stop: AtomicBool,
    spin: Duration,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Driver> {
        // A panic while holding the lock leaves the core in whatever state
        // it reached; its invariants do not depend on the panicking caller.
        self.driver.lock().unwrap_or_else(|e| e.into_inner())
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
        // away for `HANDOVER`.
        self.0.app_left_ns.store(self.0.clock.now().as_nanos(), Ordering::SeqCst);
        self.0.app_active.fetch_sub(1, Ordering::SeqCst);
    }
}

pub struct Endpoint {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

/// A sent message: ask it how it fared.
#[derive(Clone)]
pub struct SendHandle {
    pub id: MessageId,
    shared: Arc<Shared>,
}

impl SendHandle {
    pub fn state(&self) -> MessageState {
        self.shared.lock().core.message_state(self.id)
    }

    /// Block until the message is delivered or failed, or `timeout` passes.
    pub fn wait(&self, timeout: Option<Duration>) -> Result<MessageState, Error> {
        block_on(&self.shared, timeout, |d| match d.core.message_state(self.id) {
            MessageState::Pending => None,
            settled => Some(settled),
        })
    }
}

fn default_incarnation() -> u64 {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    (now.as_nanos() as u64).max(1)
}

impl Endpoint {
    /// Bind a UDP endpoint for `node` at `bind`, knowing `peers` by address.
    pub fn udp(
        node: NodeId,
        bind: SocketAddr,
        peers: &[(NodeId, SocketAddr)],
        options: Options,
    ) -> Result<Self, Error> {
        let mut book = AddressBook::new();
        for &(id, addr) in peers {
            book.insert(id, addr);
        }
        let transport = UdpTransport::bind(node, bind, book)?;
        Self::with_transport(node, Box::new(transport), options)
    }

    /// Run over any transport (in-memory for tests, UDP, later shared memory).
    pub fn with_transport(
        node: NodeId,
        transport: Box<dyn Transport + Send>,
        options: Options,
    ) -> Result<Self, Error> {
        let incarnation = options.incarnation.unwrap_or_else(default_incarnation);
        let core = Core::new(options.config, node, incarnation)?;
        let waiter = Waiter::new(transport.raw_fd())?;
        let shared = Arc::new(Shared {
            driver: Mutex::new(Driver::new(core, transport)),
            waiter,
            clock: Clock::new(),
            app_active: AtomicUsize::new(0),
            app_left_ns: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            spin: options.spin,
        });
        let thread = match options.progress {
            Progress::Polling => None,
            Progress::Thread => {
                let s = shared.clone();
                Some(
                    std::thread::Builder::new()
                        .name(format!("tether-progress-{node}"))
                        .spawn(move || progress_loop(&s))?,
                )
            }
        };
        Ok(Endpoint { shared, thread })
    }

    pub fn node(&self) -> NodeId {
        self.shared.lock().core.node()
    }

    /// The local socket address, for transports that have one.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.shared.lock().transport().local_addr()
    }

    /// Learn (or change) the address a peer is reached at.
    pub fn add_peer(&self, node: NodeId, addr: SocketAddr) -> Result<(), Error> {
        self.shared.lock().transport_mut().add_peer(node, addr)?;
        Ok(())
    }

    /// Queue a message and put it on the wire at once if the window allows.
    /// Never blocks: a full send buffer is `Error::Send(SendError::WouldBlock)`.
    pub fn send(&self, peer: NodeId, msg: &[u8]) -> Result<SendHandle, Error> {
        let mut d = self.shared.lock();
        let now = self.shared.clock.now();
        let id = d.core.send(now, peer, msg)?;
        d.transmit(now);
        Ok(SendHandle { id, shared: self.shared.clone() })
    }

    /// Like `send`, but waits for room in the send buffer.
    pub fn send_blocking(
        &self,
        peer: NodeId,
        msg: &[u8],
        timeout: Option<Duration>,
    ) -> Result<SendHandle, Error> {
        // Fast path: room now, no blocking-call bookkeeping.
        match self.send(peer, msg) {
            Err(Error::Send(SendError::WouldBlock)) => {}
            done => return done,
        }
        let shared = &self.shared;
        let id = block_on(shared, timeout, |d| {
            if !d.core.can_send(peer, msg.len()) {
                return None;
            }
            let now = shared.clock.now();
            let r = d.core.send(now, peer, msg);
            d.transmit(now);
            Some(r)
        })??;
        Ok(SendHandle { id, shared: shared.clone() })
    }

    /// The next delivered message, if one is waiting. Drives progress once
    /// when no progress thread does.
    pub fn try_recv(&self) -> Option<Delivery> {
        let mut d = self.shared.lock();
        if self.thread.is_none() {
            d.step(self.shared.clock.now());
        }
        d.recv()
    }

    /// Wait for the next delivered message.
    pub fn recv(&self, timeout: Option<Duration>) -> Result<Delivery, Error> {
        // Fast path: a message already queued costs one lock, nothing more.
        if let Some(d) = self.shared.lock().recv() {
            return Ok(d);
        }
        block_on(&self.shared, timeout, |d| d.recv())
    }

    pub fn poll_event(&self) -> Option<Event> {
        self.shared.lock().core.poll_event()
    }

    /// Wait for the next event (peer unreachable, restarted, reachable).
    pub fn next_event(&self, timeout: Option<Duration>) -> Result<Event, Error> {
        block_on(&self.shared, timeout, |d| d.core.poll_event())
    }

    /// One non-blocking step of progress (the polling mode's engine).
    pub fn progress(&self) {
        let mut d = self.shared.lock();
        let now = self.shared.clock.now();
        d.step(now);
    }

    /// Wait until everything sent has been acknowledged or failed.
    pub fn flush(&self, timeout: Option<Duration>) -> Result<(), Error> {
        block_on(&self.shared, timeout, |d| d.core.is_idle().then_some(()))
    }

    pub fn message_state(&self, id: MessageId) -> MessageState {
        self.shared.lock().core.message_state(id)
    }

    pub fn stats(&self) -> Stats {
        self.shared.lock().core.stats().clone()
    }

    pub fn transport_counters(&self) -> tether_io::TransportCounters {
        self.shared.lock().transport().counters()
    }

    pub fn rtt(&self, peer: NodeId) -> Option<Duration> {
        self.shared.lock().core.rtt(peer)
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.waiter.wake();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Drive progress from the calling thread until `ready` yields a value.
fn block_on<R>(
    shared: &Shared,
    timeout: Option<Duration>,
    mut ready: impl FnMut(&mut Driver) -> Option<R>,
) -> Result<R, Error> {
    let _active = Active::enter(shared);
    let start = StdInstant::now();
    let deadline = timeout.map(|t| start + t);
    loop {
        // One clock reading per turn: it is on the hot path of every spin.
        let wall = StdInstant::now();
        let now = shared.clock.at(wall);
        let next_timer = {
            let mut d = shared.lock();
            // What is already queued is served without a system call.
            if let Some(r) = ready(&mut d) {
                return Ok(r);
            }
            d.step(now);
            if let Some(r) = ready(&mut d) {
                return Ok(r);
            }
            d.next_deadline().map(|t| t.saturating_since(now))
        };
        if deadline.is_some_and(|d| wall >= d) {
            return Err(Error::TimedOut);
        }
        if shared.stop.load(Ordering::SeqCst) {
            return Err(Error::Closed);
        }
        if wall - start < shared.spin {
            std::hint::spin_loop();
            continue;
        }
        let mut sleep = next_timer.unwrap_or(IDLE_SLICE).min(IDLE_SLICE);
        if let Some(d) = deadline {
            sleep = sleep.min(d.saturating_duration_since(wall));
        }
        shared.waiter.wait(sleep);
    }
}

fn progress_loop(shared: &Shared) {
    while !shared.stop.load(Ordering::SeqCst) {
        let away = shared
            .clock
            .now()
            .saturating_since(Instant::from_nanos(shared.app_left_ns.load(Ordering::SeqCst)));
        if shared.app_active.load(Ordering::SeqCst) > 0 || away < HANDOVER {
            // An application thread is driving, or was a moment ago and will
            // likely be back: stay out of its way (and off the socket, whose
            // every datagram would wake us) until it has been away a while.
            shared.waiter.wait_for_wake(HANDOVER.saturating_sub(away).max(HANDOVER / 4));
            continue;
        }
        let next_timer = {
            let mut d = shared.lock();
            let now = shared.clock.now();
            d.step(now);
            d.core.poll_timeout().map(|t| t.saturating_since(shared.clock.now()))
        };
        shared.waiter.wait(next_timer.unwrap_or(IDLE_SLICE).min(IDLE_SLICE));
    }
}
