//! Congestion control: how many bytes a stream may have in flight, and how
//! fast it puts them on the wire.
//!
//! A [`Controller`] owns the congestion window; the stream asks it before
//! sending new data and tells it what each acknowledgement delivered and
//! what loss detection (`loss`) judged lost. A [`Pacer`] spreads the window
//! over the round trip, so a window's worth never lands on a shallow
//! switch queue in one burst. `Config::congestion` picks the controller;
//! [`ControllerFactory`] plugs in one of the application's own.
//!
//! The default, [`DelayTarget`], reads congestion from queueing delay, as
//! cluster networks' controllers do (Kumar et al., "Swift: Delay is Simple
//! and Effective for Congestion Control in the Datacenter", SIGCOMM 2020;
//! Mittal et al., "TIMELY", SIGCOMM 2015; docs/REFERENCES.md): the queue a
//! stream sees is its standing round trip (the smallest of the last half
//! round trip's samples, so one late ACK or a descheduled receiver does not
//! count) less the smallest round trip of the last ten seconds. Below a
//! target the window grows by one datagram per round trip; above it, it
//! shrinks at most once per round trip, by how far above (Swift's
//! multiplicative decrease, at most half). A loss is not congestion by
//! itself: a datagram the checksum refused, or the fault injector dropped,
//! on an empty queue says nothing about the network's load, and a stream
//! that halved for each would crawl under 1% random loss. A loss only
//! drains the queue the stream sees: the window falls by the share of the
//! round trip that is queue (at most half), nothing on an empty queue.
//!
//! A delay-based stream yields to one that fills buffers until they drop
//! (TCP Cubic): the queue it measures never drains, whatever it does. Like
//! Copa (Arun and Balakrishnan, NSDI 2018), it notices that the queue has
//! stayed above the target for many round trips despite its decreases and
//! competes on loss instead (NewReno's increase, Cubic's decrease of 0.7),
//! until the queue drains again. ECN marks are not read yet (the runtime
//! does not receive the IP header's bits).

use core::fmt::Debug;
use core::time::Duration;

use crate::Instant;

/// What one acknowledgement told the sender.
#[derive(Debug, Clone, Copy)]
pub struct AckSignal {
    /// When it arrived.
    pub now: Instant,
    /// Payload bytes it newly showed delivered (cumulatively or selectively).
    pub delivered: u64,
    /// The round trip it measured (Karn: only from a segment sent once).
    pub rtt: Option<Duration>,
    /// The smoothed round trip after it, nanoseconds (0: none yet).
    pub srtt_ns: u64,
    /// The window was what held the sender back (data waited for it, or
    /// the flight filled most of it): only then may the window grow. A
    /// sender that had nothing more to send proved nothing about a
    /// larger window.
    pub window_limited: bool,
}

/// What loss detection judged lost at one time.
#[derive(Debug, Clone, Copy)]
pub struct LossSignal {
    /// When the losses were judged.
    pub now: Instant,
    /// Payload bytes newly judged lost.
    pub lost: u64,
    /// When the latest of them was sent: a controller reacts once per
    /// round trip, to losses of what was sent after its last decrease.
    pub latest_sent: Instant,
}

/// A congestion controller for one stream. The core calls it on the hot
/// path: no allocation, no clock (time comes in the signals).
pub trait Controller: Send + Debug {
    /// Payload bytes the stream may have in flight (sent, neither
    /// acknowledged nor judged lost). `u64::MAX`: unlimited, and unpaced.
    fn window(&self) -> u64;
    /// An acknowledgement arrived.
    fn on_ack(&mut self, ack: &AckSignal);
    /// Segments were judged lost.
    fn on_loss(&mut self, loss: &LossSignal);
    /// The pacing rate as a multiple of window per smoothed round trip.
    fn pacing_gain(&self) -> f64 {
        1.25
    }
    /// What a `CongestionInfo` reports as its state.
    fn state(&self) -> &'static str;
    /// The stream competes on loss with a neighbour that keeps the queue
    /// full: the endpoint's window, delay-controlled and blind to loss,
    /// then does not hold it back (it would hand the neighbour the link).
    fn competing(&self) -> bool {
        false
    }
}

/// Builds a controller for each new stream; `max_payload` is the largest
/// payload one datagram carries (the window's unit).
pub trait ControllerFactory: Send + Sync + Debug {
    /// A controller for a new stream.
    fn build(&self, max_payload: u64) -> Box<dyn Controller>;
}

/// Which congestion controller streams use (`Config::congestion`).
#[derive(Debug, Clone, Default)]
pub enum CongestionControl {
    /// [`DelayTarget`]: queueing delay against a target, loss when
    /// competing with loss-based flows.
    #[default]
    Delay,
    /// [`NewReno`]: loss only (RFC 6582's increase and halving).
    NewReno,
    /// No window beyond `Config::send_window(_bytes)`, no pacing: for a
    /// network nothing else shares, and to measure what control costs.
    Off,
    /// The application's own.
    Custom(std::sync::Arc<dyn ControllerFactory>),
}

impl CongestionControl {
    pub(crate) fn build(&self, max_payload: u64) -> Box<dyn Controller> {
        match self {
            CongestionControl::Delay => Box::new(DelayTarget::new(max_payload)),
            CongestionControl::NewReno => Box::new(NewReno::new(max_payload)),
            CongestionControl::Off => Box::new(Unlimited),
            CongestionControl::Custom(f) => f.build(max_payload),
        }
    }
}

/// A stream's congestion state, for `Endpoint::congestion`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CongestionInfo {
    /// The window, payload bytes (`u64::MAX`: unlimited).
    pub window: u64,
    /// Payload bytes in flight (sent, not acknowledged, not judged lost).
    pub in_flight: u64,
    /// The controller's state (`Controller::state`).
    pub state: &'static str,
    /// The pacing rate, bytes per second (`None`: unpaced).
    pub pacing_rate: Option<u64>,
}

/// Windows start at this many datagrams (RFC 6928's ten).
pub(crate) const INITIAL_WINDOW: u64 = 10;
/// ... and never fall below this many.
pub(crate) const MIN_WINDOW: u64 = 2;
/// Nor rise above this many bytes (`Config::send_window_bytes` bounds
/// them further).
const MAX_WINDOW: u64 = 1 << 30;

/// No congestion control.
#[derive(Debug)]
struct Unlimited;

impl Controller for Unlimited {
    fn window(&self) -> u64 {
        u64::MAX
    }
    fn on_ack(&mut self, _: &AckSignal) {}
    fn on_loss(&mut self, _: &LossSignal) {}
    fn state(&self) -> &'static str {
        "off"
    }
}

/// The smallest of a signal over a sliding period, kept in two buckets of
/// half the period each: the minimum of the last half period to period.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WindowedMin {
    current: u64,
    previous: u64,
    bucket_end: Instant,
}

impl WindowedMin {
    pub(crate) const fn new() -> Self {
        WindowedMin { current: u64::MAX, previous: u64::MAX, bucket_end: Instant::ZERO }
    }

    pub(crate) fn take(&mut self, now: Instant, value: u64, half_period: Duration) {
        if now >= self.bucket_end {
            self.previous = self.current;
            self.current = value;
            self.bucket_end = now + half_period;
        } else {
            self.current = self.current.min(value);
        }
    }

    /// `None` before a sample.
    pub(crate) fn get(&self) -> Option<u64> {
        let m = self.current.min(self.previous);
        (m != u64::MAX).then_some(m)
    }
}

/// The standing round trip: the smallest sample of the last half round
/// trip, and at least of this many samples, so a small window's few
/// samples, each late by its own jitter, do not read as a queue (under a
/// link that delays each datagram by up to 8 round trips at random, a
/// window judged on one or two samples collapsed to two datagrams).
#[derive(Debug, Clone, Copy)]
pub(crate) struct StandingRtt {
    samples: [(Instant, u64); STANDING_KEEP],
    next: usize,
}

/// Samples the standing round trip looks at, at least ...
const STANDING_MIN: usize = 8;
/// ... and at most.
const STANDING_KEEP: usize = 32;

impl StandingRtt {
    pub(crate) const fn new() -> Self {
        StandingRtt { samples: [(Instant::ZERO, u64::MAX); STANDING_KEEP], next: 0 }
    }

    pub(crate) fn take(&mut self, now: Instant, rtt: u64) {
        self.samples[self.next % STANDING_KEEP] = (now, rtt);
        self.next += 1;
    }

    /// The smallest of the samples since `now - period`, or of the newest
    /// `STANDING_MIN` where fewer came in that time (`None`: no sample).
    pub(crate) fn get(&self, now: Instant, period: Duration) -> Option<u64> {
        let n = self.next.min(STANDING_KEEP);
        let mut min = u64::MAX;
        for age in 0..n {
            let (at, rtt) = self.samples[(self.next - 1 - age) % STANDING_KEEP];
            if age >= STANDING_MIN && now - at > period {
                break;
            }
            min = min.min(rtt);
        }
        (min != u64::MAX).then_some(min)
    }
}

/// The queueing delay allowed above the smallest round trip: enough that
/// a sender's burst and a receiver's scheduling leave the bottleneck busy,
/// little beside a shallow switch buffer (100 us is 12.5 KB at 1 Gbit/s).
/// Not scaled by the base round trip: a stream that first measured it
/// through a queue believes it longer, and a target in proportion would
/// let it hold that queue for good.
const TARGET_QUEUE_NS: u64 = 100_000;
/// Swift's flow-based scaling: this much more queue allowed at a window
/// of `FLOW_SCALING_MIN` datagrams, none from `FLOW_SCALING_MAX` up.
const FLOW_SCALING_NS: u64 = 1_000_000;
const FLOW_SCALING_MIN: f64 = 1.0;
const FLOW_SCALING_MAX: f64 = 100.0;
/// Swift's decrease: by this share of the excess delay, at most by half.
const BETA: f64 = 0.8;
const MAX_DECREASE: f64 = 0.5;
/// Decrease on loss while competing (Cubic's, RFC 9438).
const COMPETE_DECREASE: f64 = 0.7;
/// Round trips the queue must stay above the target, however the window
/// shrinks, before the stream competes on loss; and at least this long.
/// Among delay-based flows the decreases drain the queue within a round
/// trip or two; beside TCP they only shrink the window, by half each
/// round trip, which is why competing starts from the window the stream
/// had when the queue was last short. Six round trips made delay-based
/// streams on a noisy 2-core machine take each other for TCP more often.
const COMPETE_AFTER_ROUNDS: u64 = 16;
const COMPETE_AFTER_NS: u64 = 1_000_000;
/// While competing, every this many round trips the stream drains its own
/// share of the queue for two round trips: if the queue then falls short,
/// the competitor has gone (a loss-based stream alone keeps a shallow
/// queue full itself, and would never see it short otherwise).
const DRAIN_EVERY_ROUNDS: u32 = 32;
/// Over how long the smallest round trip is remembered: a route change
/// that lengthens it is believed within this time.
pub(crate) const BASE_PERIOD: Duration = Duration::from_secs(10);

/// How the delay controller is behaving.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Doubling each round trip until the queue reaches half the target.
    SlowStart,
    /// Holding the queue near the target.
    Delay,
    /// Competing with a flow that keeps the queue full: loss-based.
    Competing,
}

/// The default controller (see the module's header).
#[derive(Debug, Clone)]
pub struct DelayTarget {
    mss: u64,
    window: u64,
    mode: Mode,
    /// The smallest round trip of the last `BASE_PERIOD`.
    base: WindowedMin,
    /// The recent round trips, for the standing one.
    standing: StandingRtt,
    /// The last time the standing queue was at or below the target, and
    /// the window then: what competing starts from (the decreases since
    /// only gave way to a loss-based neighbour).
    last_short_queue: Instant,
    window_at_short: u64,
    /// Round trips competed since the last drain, and the drain under
    /// way: until when, and the window to go back to.
    competed: u32,
    round_end: Instant,
    drain: Option<(Instant, u64)>,
    /// No decrease for what was sent before this (once per round trip).
    recovery_start: Instant,
    /// The smoothed round trip as of the latest ACK.
    srtt: Duration,
}

impl DelayTarget {
    /// A controller for datagrams of `max_payload` bytes, in slow start.
    pub fn new(max_payload: u64) -> Self {
        let mss = max_payload.max(1);
        DelayTarget {
            mss,
            window: INITIAL_WINDOW * mss,
            mode: Mode::SlowStart,
            base: WindowedMin::new(),
            standing: StandingRtt::new(),
            last_short_queue: Instant::ZERO,
            window_at_short: INITIAL_WINDOW * mss,
            competed: 0,
            round_end: Instant::ZERO,
            drain: None,
            recovery_start: Instant::ZERO,
            srtt: Duration::ZERO,
        }
    }

    /// The queueing delay allowed (nanoseconds).
    fn target_queue(&self) -> u64 {
        TARGET_QUEUE_NS + self.flow_scaling()
    }

    /// Swift's flow-based scaling: the smaller the window, the more queue
    /// is allowed, since many streams share the bottleneck: four streams
    /// at their floor of two datagrams each hold 300 us of queue on a
    /// 300 Mbit/s link, above a fixed target whatever they do, and each
    /// would take the others for a loss-based neighbour. (It is not enough
    /// there yet: `tether bench congestion --rate-mbit 300` still ends with
    /// its four streams competing on loss, 1.2% of the packets dropped.)
    fn flow_scaling(&self) -> u64 {
        let w = (self.window as f64 / self.mss as f64).max(1.0);
        let (lo, hi) = (1.0 / FLOW_SCALING_MIN.sqrt(), 1.0 / FLOW_SCALING_MAX.sqrt());
        let share = ((1.0 / w.sqrt() - hi) / (lo - hi)).clamp(0.0, 1.0);
        (share * FLOW_SCALING_NS as f64) as u64
    }

    fn decrease(&mut self, now: Instant, factor: f64) {
        self.window = ((self.window as f64 * factor) as u64).max(MIN_WINDOW * self.mss);
        self.recovery_start = now;
        if self.mode == Mode::SlowStart {
            self.mode = Mode::Delay;
        }
    }

    fn grow(&mut self, delivered: u64) {
        let step = match self.mode {
            Mode::SlowStart => delivered,
            // One datagram per window delivered: per round trip.
            Mode::Delay | Mode::Competing => (self.mss * delivered / self.window.max(1)).max(1),
        };
        self.window = (self.window + step).min(MAX_WINDOW);
    }
}

impl Controller for DelayTarget {
    fn window(&self) -> u64 {
        self.window
    }

    fn on_ack(&mut self, ack: &AckSignal) {
        let now = ack.now;
        let srtt = Duration::from_nanos(ack.srtt_ns);
        if let Some(rtt) = ack.rtt {
            let rtt = rtt.as_nanos() as u64;
            self.base.take(now, rtt, BASE_PERIOD / 2);
            self.standing.take(now, rtt);
        }
        self.srtt = srtt;
        let (Some(base), Some(standing)) = (self.base.get(), self.standing.get(now, srtt / 2)) else {
            if ack.window_limited {
                self.grow(ack.delivered);
            }
            return;
        };
        let target = base + self.target_queue();
        let long_queue = standing > target;
        // Short by the bare target, not the flow-scaled one: at the small
        // window a Cubic neighbour leaves it, the scaled target (up to a
        // millisecond more) took the neighbour's 559-753 us queue for a
        // short one, and the stream competed 11% of the time beside it, its
        // share 0.10-0.12x of fair at 1 Gbit/s; 88% and 0.23-0.30x with the
        // bare target. Four tether streams there stay in delay mode.
        if standing <= base + TARGET_QUEUE_NS {
            self.last_short_queue = now;
            if self.mode == Mode::Delay {
                // Not slow start's: restoring a window that overshot would
                // fill the queue for every delay-based neighbour at once.
                self.window_at_short = self.window;
            }
        }
        // Leaving competition takes a queue short by the bare target, not
        // one scaled by the window: a window cut by a loss or a drain
        // raises the scaled target to nearly a millisecond, above the
        // queue a Cubic neighbour keeps, and the stream took that queue
        // for its own (traced beside TCP through a 1 Gbit/s bottleneck: it
        // left competition at every drain, window two datagrams, target
        // 790 us, standing queue 559-753 us; that alone did not raise its
        // share of fair, 0.13-0.21x before, 0.12-0.19x after: entering on
        // the bare target above and leaving only after a drain below did).
        let queue_gone = standing <= base + TARGET_QUEUE_NS;
        match self.mode {
            // Only a drain of its own tells: a loss-based neighbour's queue
            // empties now and then by itself (its decrease, its timeouts,
            // a CPU it shares), and a stream that takes each such moment
            // for the neighbour gone gives way, then competes again from a
            // small window 16 round trips later (beside Cubic at 1 Gbit/s,
            // in alternating runs: 0.18-0.22x of fair leaving at each dip,
            // 0.23-0.31x leaving only after a drain).
            Mode::Competing if queue_gone && self.drain.is_some() => {
                self.mode = Mode::Delay;
                self.drain = None;
            }
            Mode::Delay
                if (now - self.last_short_queue).as_nanos() as u64
                    > (COMPETE_AFTER_ROUNDS * ack.srtt_ns).max(COMPETE_AFTER_NS) =>
            {
                self.mode = Mode::Competing;
                self.window = self.window.max(self.window_at_short);
                self.competed = 0;
            }
            _ => {}
        }
        if self.mode == Mode::Competing {
            if now >= self.round_end {
                self.round_end = now + srtt;
                self.competed += 1;
            }
            match self.drain {
                Some((until, _)) if now < until => return,
                Some((_, saved)) => {
                    // The queue stayed long: the neighbour is still there.
                    self.window = self.window.max(saved);
                    self.drain = None;
                }
                None if self.competed >= DRAIN_EVERY_ROUNDS => {
                    self.competed = 0;
                    self.drain = Some((now + 2 * srtt, self.window));
                    let share = base as f64 / standing as f64;
                    self.window = ((self.window as f64 * share) as u64).max(MIN_WINDOW * self.mss);
                    return;
                }
                None => {}
            }
        }
        match self.mode {
            Mode::SlowStart if standing > base + self.target_queue() / 2 => self.mode = Mode::Delay,
            Mode::Delay if long_queue => {
                if now >= self.recovery_start + srtt {
                    let excess = (standing - target) as f64 / standing as f64;
                    self.decrease(now, (1.0 - BETA * excess).max(1.0 - MAX_DECREASE));
                }
                return;
            }
            _ => {}
        }
        if ack.window_limited {
            self.grow(ack.delivered);
        }
    }

    fn on_loss(&mut self, loss: &LossSignal) {
        if loss.latest_sent < self.recovery_start {
            return;
        }
        match self.mode {
            Mode::Competing => self.decrease(loss.now, COMPETE_DECREASE),
            Mode::SlowStart | Mode::Delay => {
                // Drain the queue, no more: the window falls to what the
                // smallest round trip holds of it, so the bottleneck stays
                // busy and a loss on an empty queue changes nothing.
                if let (Some(base), Some(standing)) =
                    (self.base.get(), self.standing.get(loss.now, self.srtt / 2))
                {
                    if standing > base {
                        self.decrease(loss.now, (base as f64 / standing as f64).max(1.0 - MAX_DECREASE));
                    }
                }
            }
        }
    }

    fn pacing_gain(&self) -> f64 {
        match self.mode {
            Mode::SlowStart => 2.0,
            Mode::Delay | Mode::Competing => 1.25,
        }
    }

    fn competing(&self) -> bool {
        self.mode == Mode::Competing
    }

    fn state(&self) -> &'static str {
        match self.mode {
            Mode::SlowStart => "slow start",
            Mode::Delay => "delay",
            Mode::Competing => "competing",
        }
    }
}

/// Loss-based control: slow start to the first loss, then one datagram per
/// round trip, halving once per round trip of losses (RFC 5681, 6582).
#[derive(Debug, Clone)]
pub struct NewReno {
    mss: u64,
    window: u64,
    slow_start: bool,
    recovery_start: Instant,
}

impl NewReno {
    /// A controller for datagrams of `max_payload` bytes, in slow start.
    pub fn new(max_payload: u64) -> Self {
        let mss = max_payload.max(1);
        NewReno { mss, window: INITIAL_WINDOW * mss, slow_start: true, recovery_start: Instant::ZERO }
    }
}

impl Controller for NewReno {
    fn window(&self) -> u64 {
        self.window
    }

    fn on_ack(&mut self, ack: &AckSignal) {
        if !ack.window_limited {
            return;
        }
        let step = if self.slow_start {
            ack.delivered
        } else {
            (self.mss * ack.delivered / self.window.max(1)).max(1)
        };
        self.window = (self.window + step).min(MAX_WINDOW);
    }

    fn on_loss(&mut self, loss: &LossSignal) {
        if loss.latest_sent < self.recovery_start {
            return;
        }
        self.window = (self.window / 2).max(MIN_WINDOW * self.mss);
        self.slow_start = false;
        self.recovery_start = loss.now;
    }

    fn state(&self) -> &'static str {
        if self.slow_start {
            "slow start"
        } else {
            "avoidance"
        }
    }
}

/// The shortest burst the pacer allows, in datagrams: a wake-up of the
/// sending thread costs more than two datagrams' spacing at these rates.
const MIN_BURST: u64 = 2;
/// The longest burst, as time at the pacing rate: the runtime sleeps with
/// about this precision, and tokens it could not spend in time are lost.
const BURST_NS: u64 = 1_000_000;

/// A token bucket at the controller's rate: `gain * window / srtt`.
#[derive(Debug, Clone)]
pub(crate) struct Pacer {
    /// Bytes that may go now (may run one datagram below zero).
    tokens: i64,
    last: Instant,
    /// The largest payload of one datagram: the smallest burst is two.
    mss: u64,
}

impl Pacer {
    /// A pacer for datagrams of at most `mss` payload bytes.
    pub fn new(mss: u64) -> Self {
        Pacer { tokens: i64::MAX / 4, last: Instant::ZERO, mss }
    }

    /// Bytes per second, or `None` when nothing limits the rate (no
    /// window, or no round trip measured yet).
    pub fn rate(window: u64, gain: f64, srtt_ns: u64) -> Option<u64> {
        if window == u64::MAX || srtt_ns == 0 {
            return None;
        }
        Some((window as f64 * gain * 1e9 / srtt_ns as f64) as u64)
    }

    fn capacity(&self, rate: u64, window: u64) -> i64 {
        let mss = self.mss;
        let burst = (rate as u128 * BURST_NS as u128 / 1_000_000_000) as u64;
        burst.min(window).max(MIN_BURST * mss) as i64
    }

    fn refill(&mut self, now: Instant, rate: u64, cap: i64) {
        let elapsed = (now - self.last).as_nanos() as u64;
        let add = (rate as u128 * elapsed as u128 / 1_000_000_000).min(i64::MAX as u128 / 4) as i64;
        self.tokens = self.tokens.saturating_add(add).min(cap);
        self.last = now;
    }

    /// When the next datagram may go (`Instant::ZERO`: at once): when the
    /// tokens, refilling at `rate` since the last send, are positive again.
    pub fn ready_at(&self, rate: Option<u64>) -> Instant {
        let Some(rate) = rate.filter(|&r| r > 0) else { return Instant::ZERO };
        if self.tokens > 0 {
            return Instant::ZERO;
        }
        let wait_ns = ((1 - self.tokens) as u128 * 1_000_000_000).div_ceil(rate as u128);
        self.last + Duration::from_nanos(wait_ns.min(u64::MAX as u128) as u64)
    }

    /// `bytes` went on the wire at `now`.
    pub fn on_sent(&mut self, now: Instant, bytes: u64, rate: Option<u64>, window: u64) {
        let Some(rate) = rate.filter(|&r| r > 0) else { return };
        let cap = self.capacity(rate, window);
        self.refill(now, rate, cap);
        self.tokens -= bytes as i64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MSS: u64 = 1400;
    const US: u64 = 1_000;

    fn ack(now_ns: u64, rtt_us: u64, delivered: u64) -> AckSignal {
        AckSignal {
            now: Instant::from_nanos(now_ns),
            delivered,
            rtt: Some(Duration::from_micros(rtt_us)),
            srtt_ns: rtt_us * US,
            window_limited: true,
        }
    }

    /// Feed a controller a round trip's worth of ACKs (one per datagram,
    /// spread over it), each measuring `rtt_us`; `t` in microseconds.
    fn round(c: &mut dyn Controller, t: &mut u64, rtt_us: u64) {
        let acks = (c.window() / MSS).max(1);
        let start = *t * US;
        for i in 1..=acks {
            c.on_ack(&ack(start + rtt_us * US * i / acks, rtt_us, MSS));
        }
        *t += rtt_us;
    }

    #[test]
    fn the_window_grows_while_the_queue_is_short_and_shrinks_when_it_is_long() {
        let mut c = DelayTarget::new(MSS);
        let mut t = 0;
        for _ in 0..10 {
            round(&mut c, &mut t, 30);
        }
        let grown = c.window();
        assert!(grown > INITIAL_WINDOW * MSS * 4, "slow start doubles: {grown}");
        // A queue of 400 us over the 30 us base: above the 100 us target.
        for _ in 0..6 {
            round(&mut c, &mut t, 430);
        }
        assert!(c.window() < grown / 4, "{} of {grown}", c.window());
        assert_eq!(c.state(), "delay");
        // The queue drains: additive increase again.
        let low = c.window();
        for _ in 0..20 {
            round(&mut c, &mut t, 40);
        }
        assert!(c.window() > low, "{} after {low}", c.window());
    }

    #[test]
    fn loss_on_an_empty_queue_is_not_congestion_and_on_a_queue_drains_it() {
        let mut c = DelayTarget::new(MSS);
        let mut t = 0;
        for _ in 0..10 {
            round(&mut c, &mut t, 30);
        }
        let before = c.window();
        let lose = |c: &mut DelayTarget, t: u64| {
            let at = Instant::from_nanos(t * US);
            c.on_loss(&LossSignal { now: at, lost: MSS, latest_sent: at })
        };
        // One datagram lost per round trip, the queue empty: the checksum
        // or the fault injector, not the network's load.
        for _ in 0..5 {
            round(&mut c, &mut t, 30);
            lose(&mut c, t);
        }
        assert!(c.window() >= before, "random loss shrank the window: {} < {before}", c.window());
        // Losses with a 60 us queue over the 30 us base (below the
        // 100 us target: a buffer shallower than the target overflowing):
        // the window falls to what the base round trip holds of it.
        for _ in 0..4 {
            round(&mut c, &mut t, 90);
        }
        let w = c.window();
        lose(&mut c, t);
        assert_eq!(c.window(), ((w as f64) * 0.5) as u64, "at most halved (30/90 would be a third)");
        for _ in 0..4 {
            round(&mut c, &mut t, 45);
        }
        let w = c.window();
        lose(&mut c, t);
        assert_eq!(c.window(), ((w as f64) * 30.0 / 45.0) as u64, "the queue's share taken off");
    }

    #[test]
    fn a_queue_someone_else_holds_makes_it_compete_on_loss() {
        let mut c = DelayTarget::new(MSS);
        let mut t = 0;
        for _ in 0..5 {
            round(&mut c, &mut t, 30);
        }
        // A standing 1 ms queue that does not drain, however small the window.
        for _ in 0..40 {
            round(&mut c, &mut t, 1030);
        }
        assert_eq!(c.state(), "competing");
        let w = c.window();
        round(&mut c, &mut t, 1030);
        assert!(c.window() > w, "grows on ACKs despite the queue");
        c.on_loss(&LossSignal {
            now: Instant::from_nanos(t * US),
            lost: MSS,
            latest_sent: Instant::from_nanos(t * US),
        });
        assert!(c.window() < w + 2 * MSS && c.window() > w / 2, "0.7 decrease: {}", c.window());
        // The neighbour's queue empties for two round trips (its decrease):
        // no reason to give way.
        round(&mut c, &mut t, 40);
        round(&mut c, &mut t, 40);
        assert_eq!(c.state(), "competing", "a dip in the neighbour's queue is not its end");
        // The neighbour goes for good: the next drain finds the queue short.
        let mut rounds = 0;
        while c.state() == "competing" {
            round(&mut c, &mut t, 40);
            rounds += 1;
            assert!(rounds <= DRAIN_EVERY_ROUNDS + 3, "still competing after {rounds} round trips alone");
        }
        assert_eq!(c.state(), "delay");
    }

    /// A neighbour's queue above the bare target, though below the one
    /// scaled for the small window it leaves this stream, is one to
    /// compete with.
    #[test]
    fn a_queue_short_only_by_the_scaled_target_makes_it_compete() {
        let mut c = DelayTarget::new(MSS);
        let mut t = 0;
        for _ in 0..5 {
            round(&mut c, &mut t, 30);
        }
        // A burst of queue takes the window to its floor, where the scaled
        // target is most of a millisecond...
        for _ in 0..10 {
            round(&mut c, &mut t, 2030);
        }
        assert_eq!(c.state(), "delay");
        assert!(30_000 + c.target_queue() > 600_000, "window {}", c.window());
        // ...then a neighbour holds 300 us: short by that, long by the bare.
        for _ in 0..60 {
            round(&mut c, &mut t, 330);
        }
        assert_eq!(c.state(), "competing");
    }

    #[test]
    fn a_drain_beside_a_neighbours_queue_keeps_competing() {
        let mut c = DelayTarget::new(MSS);
        let mut t = 0;
        for _ in 0..5 {
            round(&mut c, &mut t, 30);
        }
        // A neighbour keeps 700 us of queue whatever this stream does: at
        // a window of two datagrams the scaled target is above that.
        for _ in 0..40 {
            round(&mut c, &mut t, 730);
        }
        assert_eq!(c.state(), "competing");
        // Through the drains (every 32 round trips, two round trips each).
        let mut least = u64::MAX;
        for _ in 0..70 {
            round(&mut c, &mut t, 730);
            least = least.min(c.window());
            assert_eq!(c.state(), "competing", "left competition at window {}", c.window());
        }
        assert!(least <= 2 * MSS, "a drain took place: least window {least}");
        assert!(c.window() > 8 * MSS, "the window came back after the drains: {}", c.window());
    }

    #[test]
    fn new_reno_halves_once_per_round_trip_of_losses() {
        let mut c = NewReno::new(MSS);
        let mut t = 0;
        round(&mut c, &mut t, 30);
        let w = c.window();
        let at = |us: u64| Instant::from_nanos(us * US);
        c.on_loss(&LossSignal { now: at(t), lost: MSS, latest_sent: at(t - 10) });
        assert_eq!(c.window(), w / 2);
        c.on_loss(&LossSignal { now: at(t + 1), lost: MSS, latest_sent: at(t - 5) });
        assert_eq!(c.window(), w / 2, "a loss sent before the decrease does not halve again");
    }

    #[test]
    fn the_pacer_spreads_a_window_over_the_round_trip() {
        let mut p = Pacer::new(MSS);
        let window = 100 * MSS;
        let rate = Pacer::rate(window, 1.0, 100 * US);
        assert_eq!(rate, Some(1_400_000_000));
        let mut now = Instant::from_nanos(1_000_000);
        let mut sent = 0;
        let start = now;
        while sent < 1000 * MSS {
            let at = p.ready_at(rate);
            now = now.max(at);
            p.on_sent(now, MSS, rate, window);
            sent += MSS;
        }
        // 1.4 MB at 1.4 GB/s: 1 ms, less the first burst.
        let took = (now - start).as_micros();
        assert!((700..=1000).contains(&took), "took {took} us");
        assert_eq!(Pacer::rate(u64::MAX, 1.0, 100), None, "no window, no pacing");
    }
}
