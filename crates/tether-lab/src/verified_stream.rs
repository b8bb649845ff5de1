//! A verified stream between two applications attached to engines, run
//! while something strikes the engines: the measuring stick of `tether
//! bench engine`'s recovery figures and of `tether campaign --engine`
//! (Zhou et al. [FTGM] section 5: recovery is judged by what the
//! application sees, not by what the engine says).
//!
//! A sender thread paces messages of a self-verifying pattern
//! (`pattern::fill`) from one application to the other and stamps when
//! each was submitted; a receiver thread checks every delivery
//! (`pattern::verify`), stamps when it arrived, and counts what was
//! delivered, lost, duplicated or corrupted as it happens. The caller's
//! strikes run on the calling thread meanwhile and read both from
//! [`Progress`]: "the first message submitted after the strike, and when it
//! was delivered" is the recovery time.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tether::{Event, MessageId, MessageState, NodeId};
use tether_engine::{Client, EngineError};

use crate::pattern;

/// How the stream runs.
#[derive(Debug, Clone)]
pub struct Spec {
    /// The sending application's node (its pattern's source) and the receiver's.
    pub from: NodeId,
    pub to: NodeId,
    /// Bytes per message (at least 8: each carries its index).
    pub size: usize,
    /// One message every `pace`.
    pub pace: Duration,
    /// Messages the stream may send at most (a stamp pair each).
    pub room: usize,
    /// A send blocked this long fails the stream; after the stop, how long
    /// the receiver waits in silence for the rest and the sender for its
    /// acknowledgements.
    pub patience: Duration,
}

/// Where the stream stands, shared by its two threads and the caller.
pub struct Progress {
    origin: Instant,
    stop: AtomicBool,
    /// Per message index: when it was submitted, when it was delivered
    /// (nanoseconds since `origin`, plus one; 0 means "not yet").
    submitted: Vec<AtomicU64>,
    delivered: Vec<AtomicU64>,
    /// Messages submitted so far (indices below are stamped).
    sent: AtomicU64,
    /// The receiver's counts, live.
    delivered_n: AtomicU64,
    lost: AtomicU64,
    duplicated: AtomicU64,
    corrupted: AtomicU64,
}

/// The receiver's counts at one moment.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Tally {
    pub delivered: u64,
    /// Gaps seen: in-order delivery means a skipped index never comes.
    pub lost: u64,
    pub duplicated: u64,
    pub corrupted: u64,
}

impl Progress {
    fn new(room: usize) -> Progress {
        Progress {
            origin: Instant::now(),
            stop: AtomicBool::new(false),
            submitted: (0..room).map(|_| AtomicU64::new(0)).collect(),
            delivered: (0..room).map(|_| AtomicU64::new(0)).collect(),
            sent: AtomicU64::new(0),
            delivered_n: AtomicU64::new(0),
            lost: AtomicU64::new(0),
            duplicated: AtomicU64::new(0),
            corrupted: AtomicU64::new(0),
        }
    }

    /// Now, as a stamp.
    pub fn now(&self) -> u64 {
        self.stamp_of(Instant::now())
    }

    /// `at` as a stamp (nanoseconds since the stream began, plus one).
    pub fn stamp_of(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.origin).as_nanos() as u64 + 1
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    /// Messages submitted so far.
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::Acquire)
    }

    /// Messages the sender may still submit before the stream is full.
    pub fn room_left(&self) -> usize {
        self.submitted.len().saturating_sub(self.sent() as usize)
    }

    /// The first message submitted after stamp `t`, if there is one yet.
    /// Stamps grow with the index (one sender), so this is a binary search.
    pub fn submitted_after(&self, t: u64) -> Option<usize> {
        let sent = self.sent() as usize;
        let i = self.submitted[..sent].partition_point(|s| s.load(Ordering::Acquire) <= t);
        (i < sent).then_some(i)
    }

    /// The first message submitted after `t`, waiting for one until `until`.
    pub fn first_after(&self, t: u64, until: Instant) -> Option<usize> {
        loop {
            if let Some(i) = self.submitted_after(t) {
                return Some(i);
            }
            if Instant::now() >= until {
                return None;
            }
            std::thread::sleep(Duration::from_micros(50));
        }
    }

    /// From submission to delivery, of the message delivered last at or
    /// before stamp `t`: how long the stream's queue (the send buffers and
    /// rings ahead of a new message) held a message at `t`, which a
    /// message submitted then would wait with nothing struck. Messages are
    /// delivered in order, so this is a binary search too.
    pub fn sojourn_at(&self, t: u64) -> Option<u64> {
        let sent = self.sent() as usize;
        // Only a message submitted by `t` can have been delivered by it;
        // the last of those delivered by `t` (a lost one, never delivered,
        // is passed over).
        let by = self.submitted[..sent].partition_point(|s| s.load(Ordering::Acquire) <= t);
        let i = (0..by).rev().find(|&i| {
            let d = self.delivered[i].load(Ordering::Acquire);
            d != 0 && d <= t
        })?;
        Some(
            self.delivered[i]
                .load(Ordering::Acquire)
                .saturating_sub(self.submitted[i].load(Ordering::Acquire)),
        )
    }

    /// When message `i` was delivered, if it has been.
    pub fn delivered_stamp(&self, i: usize) -> Option<u64> {
        self.delivered.get(i).map(|d| d.load(Ordering::Acquire)).filter(|&t| t != 0)
    }

    /// When message `i` was delivered, waiting for it until `until`.
    pub fn delivered_at(&self, i: usize, until: Instant) -> Option<u64> {
        loop {
            if let Some(t) = self.delivered_stamp(i) {
                return Some(t);
            }
            if Instant::now() >= until {
                return None;
            }
            std::thread::sleep(Duration::from_micros(50));
        }
    }

    /// The receiver's counts now.
    pub fn tally(&self) -> Tally {
        Tally {
            delivered: self.delivered_n.load(Ordering::Relaxed),
            lost: self.lost.load(Ordering::Relaxed),
            duplicated: self.duplicated.load(Ordering::Relaxed),
            corrupted: self.corrupted.load(Ordering::Relaxed),
        }
    }
}

/// How the stream ended.
pub struct Ended {
    /// The id of every message submitted, in order.
    pub ids: Vec<MessageId>,
    /// Whether the sender's final flush (every message acknowledged within
    /// the patience) succeeded.
    pub flushed: Result<(), EngineError>,
    pub tally: Tally,
}

/// The application's view of a finished stream.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Totals {
    pub messages: u64,
    pub delivered: u64,
    pub lost: u64,
    pub duplicated: u64,
    pub corrupted: u64,
    /// Messages the sender's application was not told were delivered.
    pub not_reported_delivered: u64,
}

impl Totals {
    /// Every message seen once, exact, and the sender told so.
    pub fn ok(&self) -> bool {
        self.lost == 0 && self.duplicated == 0 && self.corrupted == 0 && self.not_reported_delivered == 0
    }
}

impl std::fmt::Display for Totals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "messages {}, delivered {}, lost {}, duplicated {}, corrupted {}, not reported delivered {}",
            self.messages,
            self.delivered,
            self.lost,
            self.duplicated,
            self.corrupted,
            self.not_reported_delivered
        )
    }
}

impl std::ops::AddAssign for Totals {
    fn add_assign(&mut self, t: Totals) {
        self.messages += t.messages;
        self.delivered += t.delivered;
        self.lost += t.lost;
        self.duplicated += t.duplicated;
        self.corrupted += t.corrupted;
        self.not_reported_delivered += t.not_reported_delivered;
    }
}

impl Ended {
    /// What the stream came to, asking the sender (`a`) where each message stands.
    pub fn totals(&self, a: &Client) -> Totals {
        let messages = self.ids.len() as u64;
        let t = &self.tally;
        Totals {
            messages,
            delivered: t.delivered,
            // Gaps seen, and whatever never came at all.
            lost: t.lost + messages.saturating_sub(t.delivered + t.lost),
            duplicated: t.duplicated,
            corrupted: t.corrupted,
            not_reported_delivered: self
                .ids
                .iter()
                .filter(|&&id| a.message_state(id) != MessageState::Delivered)
                .count() as u64,
        }
    }
}

/// What an application's events said, drained.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Events {
    /// `EngineRecovered`: its engine was replaced under it.
    pub recovered: u64,
    /// Messages reported failed (peer unreachable, restarted, stream reset).
    pub failed: u64,
}

/// Take every event waiting at `c` and count what matters to a stream.
pub fn drain_events(c: &Client) -> Result<Events, EngineError> {
    let mut n = Events::default();
    while let Some(e) = c.poll_event()? {
        match e {
            Event::EngineRecovered { .. } => n.recovered += 1,
            Event::PeerUnreachable { failed }
            | Event::PeerRestarted { failed, .. }
            | Event::StreamReset { failed } => n.failed += failed.len(),
            _ => {}
        }
    }
    Ok(n)
}

/// Run the stream from `a` to `b` while `during` runs on this thread; stop
/// it when `during` returns, let it drain, and give back both. A thread that
/// failed is the second result's error, so the caller decides which
/// failure to report first.
pub fn run<T>(
    spec: &Spec,
    a: &Client,
    b: &Client,
    during: impl FnOnce(&Progress) -> T,
) -> (T, anyhow::Result<Ended>) {
    /// Stops the stream when dropped: even if `during` panics, the threads
    /// end and the scope can join them.
    struct StopOnDrop<'p>(&'p Progress);
    impl Drop for StopOnDrop<'_> {
        fn drop(&mut self) {
            self.0.stop.store(true, Ordering::Relaxed);
        }
    }
    let p = Progress::new(spec.room);
    std::thread::scope(|s| {
        let sender = s.spawn(|| send(spec, a, &p));
        let receiver = s.spawn(|| receive(spec, b, &p));
        let stop = StopOnDrop(&p);
        let out = during(&p);
        drop(stop);
        let sent = sender.join().map_err(|_| anyhow::anyhow!("sender thread panicked"));
        let received = receiver.join().map_err(|_| anyhow::anyhow!("receiver thread panicked"));
        let ended = (|| {
            let (ids, flushed) = sent??;
            let tally = received??;
            Ok(Ended { ids, flushed, tally })
        })();
        (out, ended)
    })
}

/// One send, in short waits so a stop is seen while the ring is full:
/// `None` if the stream stopped first.
fn submit(spec: &Spec, a: &Client, buf: &[u8], p: &Progress) -> anyhow::Result<Option<MessageId>> {
    const SLICE: Duration = Duration::from_millis(50);
    let deadline = Instant::now() + spec.patience;
    loop {
        match a.send(spec.to, buf, Some(SLICE)) {
            Ok(id) => return Ok(Some(id)),
            Err(EngineError::Timeout) if p.stopped() => return Ok(None),
            Err(EngineError::Timeout) if Instant::now() < deadline => {}
            Err(e) => return Err(e.into()),
        }
    }
}

/// The sender: one message every `pace` until stopped or out of room.
fn send(spec: &Spec, a: &Client, p: &Progress) -> anyhow::Result<(Vec<MessageId>, Result<(), EngineError>)> {
    let mut buf = vec![0u8; spec.size];
    let mut ids = Vec::new();
    let start = Instant::now();
    for i in 0..spec.room {
        if p.stopped() {
            break;
        }
        pattern::fill(&mut buf, spec.from, i as u64);
        p.submitted[i].store(p.now(), Ordering::Release);
        let Some(id) = submit(spec, a, &buf, p)? else { break };
        ids.push(id);
        p.sent.store(i as u64 + 1, Ordering::Release);
        let next = start + spec.pace * (i as u32 + 1);
        if let Some(d) = next.checked_duration_since(Instant::now()) {
            std::thread::sleep(d);
        }
    }
    Ok((ids, a.flush(Some(spec.patience))))
}

/// The receiver: checks every delivery until the stream stopped and the
/// rest has come in (or `patience` of silence says it is not coming).
fn receive(spec: &Spec, b: &Client, p: &Progress) -> anyhow::Result<Tally> {
    const LOOK: Duration = Duration::from_millis(50);
    let quiet_limit = (spec.patience.as_millis() / LOOK.as_millis()).max(1);
    let mut next = 0u64;
    let mut quiet = 0;
    loop {
        let d = match b.recv(Some(LOOK)) {
            Ok(d) => d,
            Err(EngineError::Timeout) => {
                if p.stopped() {
                    quiet += 1;
                    if next >= p.sent() || quiet > quiet_limit {
                        return Ok(p.tally());
                    }
                }
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        let now = p.now();
        let index = pattern::index_of(&d.message, spec.from).unwrap_or(u64::MAX);
        if d.message.len() != spec.size || !pattern::verify(&d.message, spec.from, index) {
            p.corrupted.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        if index < next {
            p.duplicated.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        p.lost.fetch_add(index - next, Ordering::Relaxed);
        p.delivered_n.fetch_add(1, Ordering::Relaxed);
        if let Some(slot) = p.delivered.get(index as usize) {
            slot.store(now, Ordering::Release);
        }
        next = index + 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn submitted_after_finds_the_first_later_stamp() {
        let p = Progress::new(8);
        for (i, t) in [10u64, 20, 20, 30, 40].iter().enumerate() {
            p.submitted[i].store(*t, Ordering::Relaxed);
        }
        p.sent.store(5, Ordering::Relaxed);
        assert_eq!(p.submitted_after(0), Some(0));
        assert_eq!(p.submitted_after(20), Some(3));
        assert_eq!(p.submitted_after(39), Some(4));
        assert_eq!(p.submitted_after(40), None, "nothing after the last one yet");
        assert_eq!(p.room_left(), 3);
        assert_eq!(p.delivered_stamp(2), None);
        p.delivered[2].store(25, Ordering::Relaxed);
        assert_eq!(p.delivered_stamp(2), Some(25));
        assert_eq!(p.delivered_stamp(99), None);
    }

    #[test]
    fn the_queue_at_a_moment_is_the_last_delivered_messages_wait() {
        let p = Progress::new(4);
        // Submitted at 10, 20, 30, 40; delivered at 50 and 65, the rest not yet.
        for (i, (s, d)) in [(10, 50), (20, 65), (30, 0), (40, 0)].into_iter().enumerate() {
            p.submitted[i].store(s, Ordering::Relaxed);
            p.delivered[i].store(d, Ordering::Relaxed);
        }
        p.sent.store(4, Ordering::Release);
        assert_eq!(p.sojourn_at(49), None, "nothing delivered yet");
        assert_eq!(p.sojourn_at(50), Some(40));
        assert_eq!(p.sojourn_at(64), Some(40));
        assert_eq!(p.sojourn_at(1000), Some(45), "the last delivered, not one still queued");
        // A lost message (never delivered) between two delivered ones.
        p.delivered[2].store(90, Ordering::Relaxed);
        p.delivered[3].store(0, Ordering::Relaxed);
        p.delivered[1].store(0, Ordering::Relaxed);
        assert_eq!(p.sojourn_at(70), Some(40), "message 1 was lost: message 0 is the last delivered");
        assert_eq!(p.sojourn_at(95), Some(60));
    }
}
