//! Several flows at once through one network: `tether stream --flows N` on
//! loopback and `tether bench congestion` through a bottleneck. Each flow
//! sends as fast as its congestion control lets it; what each delivered
//! while all of them were running is compared (aggregate goodput and
//! Jain's fairness index, `(sum x)^2 / (n sum x^2)`: 1 when every flow got
//! the same, 1/n when one took everything).
//!
//! A flow is a tether stream (two endpoints, every delivered message
//! verified) or, for a neighbour to compete with, a TCP connection (the
//! kernel's Cubic unless the system says otherwise).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::net::{NetOpts, RECEIVER, SENDER};
use crate::pattern;

/// How long a blocked send or receive waits before looking at the stop flag.
const POLL: Duration = Duration::from_millis(50);

/// One flow, ready to run: its two halves, each run on a thread of its
/// own, told their flow's index in the run.
pub struct Flow {
    pub kind: &'static str,
    sender: Box<dyn FnOnce(Arc<Shared>, usize) -> anyhow::Result<SenderTally> + Send>,
    receiver: Box<dyn FnOnce(Arc<Shared>, usize) -> anyhow::Result<ReceiverTally> + Send>,
}

/// What the threads of one run share.
struct Shared {
    stop: AtomicBool,
    /// Payload bytes each flow delivered so far (verified, for tether).
    delivered: Vec<AtomicU64>,
    /// A flow's receiver got everything it was to get.
    done: AtomicBool,
    /// Taken by that receiver as it got its last message: the moment and
    /// every flow's `delivered` then, so the measurement ends when the
    /// first flow is done, not when the measuring thread next looks (with
    /// 128 flows' threads on two cores, a while later: the finished flow
    /// idle meanwhile and counted slow).
    first_done: Mutex<Option<(Instant, Vec<u64>)>>,
    /// The start line: how many threads reached it, and whether they may go.
    at_line: AtomicUsize,
    go: AtomicBool,
    /// When each flow's sender first ran past it.
    ran: Vec<OnceLock<Instant>>,
    /// Senders that have run, and the moment the last of them first ran
    /// with every flow's `delivered` then (taken by that sender).
    running: AtomicUsize,
    all_running: Mutex<Option<(Instant, Vec<u64>)>>,
}

impl Shared {
    fn snapshot(&self) -> Vec<u64> {
        self.delivered.iter().map(|d| d.load(Ordering::Relaxed)).collect()
    }

    /// A flow delivered its last message: the measurement ends now if it
    /// is the first.
    fn finished(&self) {
        if !self.done.swap(true, Ordering::SeqCst) {
            let mark = (Instant::now(), self.snapshot());
            *self.first_done.lock().unwrap_or_else(|e| e.into_inner()) = Some(mark);
        }
    }

    /// Flow `flow`'s sender runs: if it is the last, every flow is running
    /// from now on.
    fn sender_runs(&self, flow: usize) {
        let _ = self.ran[flow].set(Instant::now());
        if self.running.fetch_add(1, Ordering::SeqCst) + 1 == self.ran.len() {
            let mark = (Instant::now(), self.snapshot());
            *self.all_running.lock().unwrap_or_else(|e| e.into_inner()) = Some(mark);
        }
    }

    /// Wait at the start line until the run starts.
    ///
    /// Runnable throughout, yielding: parked instead, each thread waited
    /// for the starter to wake it, and the starter, preempted by the first
    /// threads it woke, came back to wake the rest up to 20 ms later (8
    /// flows: one flow delivered all its 5 MB before another's sender had
    /// run once). Through a condition variable, 128 threads took its lock
    /// one after another and the last went 200 ms after the first.
    fn ready(&self) {
        self.at_line.fetch_add(1, Ordering::AcqRel);
        while !self.go.load(Ordering::Acquire) {
            std::thread::yield_now();
        }
    }

    /// Wait until `threads` threads are at the start line, then let them
    /// go at once; the moment they were let go.
    fn go(&self, threads: usize) -> Instant {
        while self.at_line.load(Ordering::Acquire) < threads {
            std::thread::yield_now();
        }
        let at = Instant::now();
        self.go.store(true, Ordering::Release);
        at
    }
}

#[derive(Debug, Default)]
struct SenderTally {
    retransmits: u64,
    datagrams: u64,
    timeouts: u64,
    /// The congestion window at the end, bytes, and the controller's state.
    window: Option<u64>,
    state: Option<&'static str>,
}

#[derive(Debug, Default)]
struct ReceiverTally {
    corrupted: u64,
    out_of_order: u64,
}

/// When the measurement ends.
#[derive(Debug, Clone, Copy)]
pub enum Until {
    /// After this long.
    Elapsed(Duration),
    /// When the first flow delivered all its messages (every flow was
    /// sending until then), or after this long at the most.
    FirstDone(Duration),
}

/// One flow's outcome.
#[derive(Debug, Clone, Serialize)]
pub struct FlowResult {
    pub kind: &'static str,
    /// Payload bytes delivered in the measured interval.
    pub bytes: u64,
    /// The part of the interval in which the flow was running (its sender
    /// had run), seconds: what its goodput is over (all of it unless the
    /// first flow was done before the last had started).
    pub seconds: f64,
    pub goodput_mb_s: f64,
    /// Retransmissions, datagrams and timeouts over the whole run, and
    /// the congestion window at its end (tether).
    pub retransmits: u64,
    pub datagrams: u64,
    pub timeouts: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state: Option<&'static str>,
    pub corrupted: u64,
    pub out_of_order: u64,
}

/// The outcome of flows run together.
#[derive(Debug, Clone, Serialize)]
pub struct FlowsRun {
    /// The measured interval (after the warm-up, from the moment every
    /// flow was running), seconds.
    pub seconds: f64,
    /// How long after the start the last flow started running (its sender
    /// had run), seconds: the operating system's start-up, not tether's.
    pub latest_start: f64,
    pub total_mb_s: f64,
    pub jain: f64,
    /// The slowest flow's goodput over the mean (its fair share).
    pub slowest_share: f64,
    pub flows: Vec<FlowResult>,
}

/// Jain's fairness index of `x` (1 for an empty or all-zero sample).
pub fn jain(x: &[f64]) -> f64 {
    let sum: f64 = x.iter().sum();
    let squares: f64 = x.iter().map(|v| v * v).sum();
    if squares == 0.0 {
        return 1.0;
    }
    sum * sum / (x.len() as f64 * squares)
}

/// A tether flow from `tx` to `rx` (each knowing the other as its peer):
/// `count` messages of `size` bytes, or fewer if stopped first.
pub fn tether_flow(tx: tether::Endpoint, rx: tether::Endpoint, size: usize, count: u64) -> Flow {
    let sender = move |shared: Arc<Shared>, _: usize| -> anyhow::Result<SenderTally> {
        let mut buf = vec![0u8; size];
        let mut i = 0;
        while i < count && !shared.stop.load(Ordering::Relaxed) {
            pattern::fill(&mut buf, SENDER, i);
            match tx.send_blocking(RECEIVER, &buf, Some(POLL)) {
                Ok(_) => i += 1,
                Err(tether::Error::TimedOut) => {}
                Err(e) => return Err(e.into()),
            }
        }
        // Keep the endpoint driven until told to stop, so the receiver
        // gets what was accepted; once all is acknowledged, only wait
        // (flush returns at once then, and a loop of it took a core from
        // the flows still running).
        while !shared.stop.load(Ordering::Relaxed) {
            if tx.flush(Some(POLL)).is_ok() {
                std::thread::sleep(POLL);
            }
        }
        let s = tx.stats();
        let cc = tx.congestion(RECEIVER);
        Ok(SenderTally {
            retransmits: s.retransmits,
            datagrams: s.datagrams_sent,
            timeouts: s.timeouts,
            window: cc.map(|c| c.window),
            state: cc.map(|c| c.state),
        })
    };
    let receiver = move |shared: Arc<Shared>, flow: usize| -> anyhow::Result<ReceiverTally> {
        let mut t = ReceiverTally::default();
        let mut next = 0u64;
        while !shared.stop.load(Ordering::Relaxed) {
            let d = match rx.recv(Some(POLL)) {
                Ok(d) => d,
                Err(tether::Error::TimedOut) => continue,
                Err(e) => return Err(e.into()),
            };
            let index =
                if size >= 8 { pattern::index_of(&d.message, SENDER).unwrap_or(u64::MAX) } else { next };
            if d.message.len() != size || !pattern::verify(&d.message, SENDER, index) {
                t.corrupted += 1;
            }
            if index != next {
                t.out_of_order += 1;
            }
            next = index.wrapping_add(1);
            shared.delivered[flow].fetch_add(d.message.len() as u64, Ordering::Relaxed);
            if next == count {
                shared.finished();
            }
        }
        Ok(t)
    };
    Flow { kind: "tether", sender: Box::new(sender), receiver: Box::new(receiver) }
}

/// A TCP flow over a connection `tx` made to `rx`: writes of 64 KiB until
/// stopped.
pub fn tcp_flow(mut tx: TcpStream, mut rx: TcpStream) -> Flow {
    let sender = move |shared: Arc<Shared>, _: usize| -> anyhow::Result<SenderTally> {
        tx.set_write_timeout(Some(POLL))?;
        let buf = vec![0x5au8; 64 << 10];
        while !shared.stop.load(Ordering::Relaxed) {
            match tx.write(&buf) {
                Ok(_) => {}
                Err(e)
                    if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
                // The receiver closed at the stop while this write waited.
                Err(_) if shared.stop.load(Ordering::Relaxed) => break,
                Err(e) => return Err(e.into()),
            }
        }
        Ok(SenderTally::default())
    };
    let receiver = move |shared: Arc<Shared>, flow: usize| -> anyhow::Result<ReceiverTally> {
        rx.set_read_timeout(Some(POLL))?;
        let mut buf = vec![0u8; 256 << 10];
        while !shared.stop.load(Ordering::Relaxed) {
            match rx.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    shared.delivered[flow].fetch_add(n as u64, Ordering::Relaxed);
                }
                Err(e)
                    if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(ReceiverTally::default())
    };
    Flow { kind: "tcp", sender: Box::new(sender), receiver: Box::new(receiver) }
}

/// A connected TCP pair: a listener bound at `listen` (made by `bind_rx`,
/// so the caller can make it inside a namespace) and a stream to it from
/// `connect` (likewise). Cubic is asked for by name; where the kernel does
/// not have it the system's default stays, and the name is returned.
pub fn tcp_pair(
    bind_rx: impl FnOnce() -> std::io::Result<TcpListener>,
    connect: impl FnOnce(SocketAddr) -> std::io::Result<TcpStream>,
) -> anyhow::Result<(TcpStream, TcpStream, String)> {
    let listener = bind_rx()?;
    let addr = listener.local_addr()?;
    let tx = connect(addr)?;
    let (rx, _) = listener.accept()?;
    let algo = congestion_algorithm(&tx, Some("cubic"));
    Ok((tx, rx, algo))
}

/// Ask for `want` (if any) and return the algorithm the socket uses.
fn congestion_algorithm(s: &TcpStream, want: Option<&str>) -> String {
    use std::os::fd::AsRawFd;
    let fd = s.as_raw_fd();
    if let Some(name) = want {
        // SAFETY: setsockopt reads `name.len()` bytes from a live slice.
        unsafe {
            libc::setsockopt(
                fd,
                libc::IPPROTO_TCP,
                libc::TCP_CONGESTION,
                name.as_ptr().cast(),
                name.len() as libc::socklen_t,
            );
        }
    }
    let mut buf = [0u8; 16];
    let mut len = buf.len() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into a live buffer.
    let r = unsafe {
        libc::getsockopt(fd, libc::IPPROTO_TCP, libc::TCP_CONGESTION, buf.as_mut_ptr().cast(), &mut len)
    };
    if r != 0 {
        return "unknown".into();
    }
    let end = buf[..len as usize].iter().position(|&b| b == 0).unwrap_or(len as usize);
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// Run `flows` together: start them at once, measure from `warmup` on
/// until `until`, stop them, and report. `mark` is called as the
/// measurement starts and as it ends (to read the network's own counters
/// over the same interval).
///
/// Every flow's threads are started first and wait at a start line; the
/// clock starts as they are let go together, so no flow runs before the
/// measurement does (started one after another as they were spawned, the
/// first of 64 flows delivered its 5 MB before the last had started, and
/// the clock, started after the last spawn, credited it with it all).
/// With `Until::FirstDone` the interval ends as the first flow delivers
/// its last message, every flow running until then.
///
/// The interval starts once every flow is running (its sender has run):
/// released together, 128 threads on two cores first ran up to 100 ms
/// apart, as the scheduler gave them their first turns, and once its
/// memory was warm one flow delivered its 5 MB in that time, counted
/// against the flows whose senders had not run yet as if tether had
/// starved them. (The receiver's first turn is the flow's own: what tether
/// delivered meanwhile waits for it, counted when taken.) Should the first
/// flow be done before the last has started, each flow's rate is over the
/// time since its own sender ran, and a flow whose sender never ran counts
/// as 0.
pub fn run(
    flows: Vec<Flow>,
    warmup: Duration,
    until: Until,
    mark: &mut dyn FnMut(),
) -> anyhow::Result<FlowsRun> {
    let n = flows.len();
    let shared = Arc::new(Shared {
        stop: AtomicBool::new(false),
        delivered: (0..n).map(|_| AtomicU64::new(0)).collect(),
        done: AtomicBool::new(false),
        first_done: Mutex::new(None),
        at_line: AtomicUsize::new(0),
        go: AtomicBool::new(false),
        ran: (0..n).map(|_| Default::default()).collect(),
        running: AtomicUsize::new(0),
        all_running: Mutex::new(None),
    });
    let kinds: Vec<&'static str> = flows.iter().map(|f| f.kind).collect();
    let mut senders = Vec::new();
    let mut receivers = Vec::new();
    for (i, f) in flows.into_iter().enumerate() {
        let (s1, s2) = (shared.clone(), shared.clone());
        let (send, recv) = (f.sender, f.receiver);
        receivers.push(std::thread::spawn(move || {
            s1.ready();
            recv(s1, i)
        }));
        senders.push(std::thread::spawn(move || {
            s2.ready();
            s2.sender_runs(i);
            send(s2, i)
        }));
    }
    let limit = match until {
        Until::Elapsed(d) | Until::FirstDone(d) => warmup + d,
    };
    let mut warm = warmup.is_zero();
    if warm {
        mark();
    }
    let start = shared.go(senders.len() + receivers.len());
    let mut before = (start, vec![0; n]);
    loop {
        std::thread::sleep(Duration::from_millis(1));
        let now = Instant::now();
        if !warm && now - start >= warmup {
            mark();
            before = (Instant::now(), shared.snapshot());
            warm = true;
        }
        let first_done = matches!(until, Until::FirstDone(_)) && shared.done.load(Ordering::SeqCst);
        if now - start >= limit || (warm && first_done) {
            break;
        }
    }
    let looked = (Instant::now(), shared.snapshot());
    mark();
    shared.stop.store(true, Ordering::Relaxed);
    // The first flow's last delivery, when it came within the interval.
    let after = match shared.first_done.lock().unwrap_or_else(|e| e.into_inner()).take() {
        Some(done) if matches!(until, Until::FirstDone(_)) && done.0 > before.0 => done,
        _ => looked,
    };
    let sent: Vec<SenderTally> = senders.into_iter().map(join).collect::<anyhow::Result<_>>()?;
    let got: Vec<ReceiverTally> = receivers.into_iter().map(join).collect::<anyhow::Result<_>>()?;
    // From the moment every flow was running (its sender had run), if
    // that came before the end.
    let all_running = shared.all_running.lock().unwrap_or_else(|e| e.into_inner()).take();
    let latest_start =
        all_running.as_ref().map_or(after.0, |a| a.0.min(after.0)).saturating_duration_since(start);
    let before = match all_running {
        Some(all) if all.0 > before.0 && all.0 < after.0 => all,
        _ => before,
    };
    let seconds = (after.0 - before.0).as_secs_f64().max(1e-9);
    // When each flow was running within the interval (`None`: its sender
    // had not run by the end): from its start, when the first flow was
    // done before the last had started.
    let running: Vec<Option<Instant>> =
        shared.ran.iter().map(|r| r.get().map(|&t| t.max(before.0)).filter(|&t| t < after.0)).collect();
    let flows: Vec<FlowResult> = (0..n)
        .map(|i| {
            let bytes = after.1[i] - before.1[i];
            let (ran, rate) = match running[i] {
                Some(t) => {
                    let ran = (after.0 - t).as_secs_f64().max(1e-9);
                    (ran, bytes as f64 / ran / 1e6)
                }
                None => (0.0, 0.0),
            };
            FlowResult {
                kind: kinds[i],
                bytes,
                seconds: ran,
                goodput_mb_s: rate,
                retransmits: sent[i].retransmits,
                datagrams: sent[i].datagrams,
                timeouts: sent[i].timeouts,
                window: sent[i].window,
                state: sent[i].state,
                corrupted: got[i].corrupted,
                out_of_order: got[i].out_of_order,
            }
        })
        .collect();
    let rates: Vec<f64> = flows.iter().map(|f| f.goodput_mb_s).collect();
    Ok(FlowsRun {
        seconds,
        latest_start: latest_start.as_secs_f64(),
        total_mb_s: rates.iter().sum(),
        jain: jain(&rates),
        slowest_share: slowest_share(&rates),
        flows,
    })
}

/// The least of `rates` over their mean: 1 when all are equal, 0 when one
/// got nothing.
fn slowest_share(rates: &[f64]) -> f64 {
    let mean = rates.iter().sum::<f64>() / rates.len().max(1) as f64;
    if mean > 0.0 {
        rates.iter().copied().fold(f64::INFINITY, f64::min) / mean
    } else {
        1.0
    }
}

fn join<T>(h: std::thread::JoinHandle<anyhow::Result<T>>) -> anyhow::Result<T> {
    h.join().map_err(|_| anyhow::anyhow!("a flow's thread panicked"))?
}

/// `tether stream --flows N` on loopback: N pairs of endpoints, each
/// sending `count` messages; measured until the first pair is done.
pub fn loopback(o: &NetOpts, flows: usize, count: u64) -> anyhow::Result<FlowsRun> {
    let mut all = Vec::with_capacity(flows);
    for _ in 0..flows {
        let (rx, tx) = o.loopback_pair()?;
        all.push(tether_flow(tx, rx, o.size, count));
    }
    run(all, Duration::ZERO, Until::FirstDone(Duration::from_secs(120)), &mut || {})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jain_is_one_when_equal_and_one_over_n_when_one_takes_all() {
        assert_eq!(jain(&[5.0, 5.0, 5.0, 5.0]), 1.0);
        assert_eq!(jain(&[8.0, 0.0, 0.0, 0.0]), 0.25);
        assert!((jain(&[1.0, 2.0]) - 0.9).abs() < 1e-12);
        assert_eq!(jain(&[]), 1.0);
    }

    #[test]
    fn the_slowest_share_is_the_least_rate_over_the_mean() {
        assert_eq!(slowest_share(&[5.0, 5.0]), 1.0);
        assert_eq!(slowest_share(&[1.0, 3.0]), 0.5);
        assert_eq!(slowest_share(&[8.0, 0.0, 0.0, 0.0]), 0.0);
        assert_eq!(slowest_share(&[]), 1.0);
    }
}
