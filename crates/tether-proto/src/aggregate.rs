//! The endpoint's window: what all of one endpoint's streams may have in
//! flight together.
//!
//! Each stream's controller (`congestion`) bounds what that stream puts
//! on the path to its peer. An endpoint with many peers has a bottleneck
//! every one of its streams shares besides: its own host, and the hosts it
//! sends to, whose kernels queue what their processes have not yet read.
//! Per-stream control cannot see it. In a 128-node demo on two cores each
//! stream carries two messages, about 14 KB, which its initial window
//! admits whole: every node put everything it had on the wire at once,
//! the sockets queued 695 MB, round trips grew to 1-8 s, 15,542 of the
//! 16,256 streams were still in slow start at 16 s (they had no round
//! trip measured in time to leave it), and every retransmission timeout,
//! capped at 250 ms, fired into the queue.
//!
//! So the endpoint keeps one window over the sum of its streams' pipes,
//! as Balakrishnan et al.'s Congestion Manager shares congestion state
//! among a host's flows (docs/REFERENCES.md, "Other sources"), and a stream sends new
//! data only when both its own window and this one admit it. It is
//! controlled by queueing delay as the default controller is, from every
//! stream's round-trip samples: the base is the smallest round trip to any
//! peer in the last ten seconds, the standing round trip the smallest of
//! the last half round trip's samples from any peer. (A cluster's round
//! trips differ by tens of microseconds, well below the target; a peer far
//! beyond the others would read as queue.) It ignores loss: a lost
//! datagram is its own stream's controller's business, and this window
//! only keeps the endpoint from queueing more than its target at the
//! hosts. With `CongestionControl::Off` it is unlimited too.

use core::time::Duration;

use crate::congestion::{
    CongestionControl, CongestionInfo, StandingRtt, WindowedMin, BASE_PERIOD, INITIAL_WINDOW, MIN_WINDOW,
};
use crate::rtt::RttEstimator;
use crate::{Config, Instant};

/// The queueing delay the endpoint's streams together may hold: ten
/// times a single stream's target (`congestion`), so that one stream's own
/// controller binds first and this window only when many streams add up.
const TARGET_QUEUE_NS: u64 = 1_000_000;
/// Swift's decrease: by this share of the excess delay, at most by half.
const BETA: f64 = 0.8;
const MAX_DECREASE: f64 = 0.5;

/// What the endpoint's window leaves: what its streams have in flight
/// together, as last reported, and the window. Copied out for a stream's
/// admission checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Room {
    pipe: u64,
    window: u64,
}

impl Room {
    /// `len` more bytes fit, from a stream whose pipe is `own` and which
    /// last reported `reported` of it (what it sent since counts, before
    /// it reports). A window with nothing in flight admits anything, so
    /// no stream waits for an ACK that cannot come.
    pub fn admits(&self, own: u64, reported: u64, len: u64) -> bool {
        let pipe = (self.pipe + own).saturating_sub(reported);
        pipe == 0 || pipe.saturating_add(len) <= self.window
    }
}

/// The endpoint's window and its controller (see the module's header).
#[derive(Debug, Clone)]
pub(crate) struct Aggregate {
    /// The sum of the streams' pipes, as each last reported.
    pipe: u64,
    window: u64,
    /// Off: the window stays unlimited.
    enabled: bool,
    mss: u64,
    slow_start: bool,
    /// A stream waited for this window since the last sample: only then
    /// may the window grow.
    held: bool,
    base: WindowedMin,
    standing: StandingRtt,
    /// No decrease for a round trip after the last.
    recovery_start: Instant,
    /// Every stream's round trips: a new stream's first timeout.
    rtt: RttEstimator,
    /// `Config::rto_initial`.
    rto_initial: u64,
    /// `Config::rto_max`.
    rto_max: u64,
}

impl Aggregate {
    /// The window of an endpoint whose streams use `control` and carry at
    /// most `max_payload` bytes a datagram.
    pub fn new(config: &Config) -> Self {
        let control = &config.congestion;
        let mss = (config.max_fragment() as u64).max(1);
        let enabled = !matches!(control, CongestionControl::Off);
        Aggregate {
            pipe: 0,
            window: if enabled { INITIAL_WINDOW * mss } else { u64::MAX },
            enabled,
            mss,
            slow_start: true,
            held: false,
            base: WindowedMin::new(),
            standing: StandingRtt::new(),
            recovery_start: Instant::ZERO,
            rtt: RttEstimator::new(config.rto_initial, config.rto_min, config.rto_max),
            rto_initial: config.rto_initial.as_nanos() as u64,
            rto_max: config.rto_max.as_nanos() as u64,
        }
    }

    /// The first timeout of a stream with no round trip of its own yet:
    /// `Config::rto_initial`, or what the endpoint's other streams
    /// measured when longer. Under load that is much longer: in a
    /// 128-node demo on two cores, new streams that waited 5 ms for
    /// round trips of 25 ms and more timed out 142,781 times (24,395 when
    /// they waited 200 ms).
    pub fn initial_rto_ns(&self) -> u64 {
        match self.rtt.smoothed() {
            Some(_) => self.rtt.estimate_ns().max(self.rto_initial),
            None => self.rto_initial,
        }
    }

    pub fn room(&self) -> Room {
        Room { pipe: self.pipe, window: self.window }
    }

    /// The longest a handshake's HELLO back-off may grow to:
    /// `Config::rto_max`, or twice what the endpoint measures round trips
    /// to be when longer, so a handshake does not ask again four times a
    /// second while its answers take seconds. (Tried for streams'
    /// retransmission timeouts too, and worse there: a 128-node demo took
    /// 25 s instead of 11, its streams waiting that long for real losses.)
    pub fn rto_ceiling(&self) -> Duration {
        let measured = match self.rtt.smoothed() {
            Some(_) => self.rtt.estimate_ns().saturating_mul(2),
            None => 0,
        };
        Duration::from_nanos(measured.max(self.rto_max))
    }

    /// How many streams whose data waited for this window may try again:
    /// one per datagram's worth of room (at least one when nothing is in
    /// flight, which admits anything).
    pub fn releasable(&self) -> usize {
        let free = self.window.saturating_sub(self.pipe) / self.mss;
        match self.pipe {
            0 => free.max(1) as usize,
            _ => free as usize,
        }
    }

    /// A stream's pipe went from `old` (what it reported last) to `new`.
    pub fn report(&mut self, old: u64, new: u64) {
        self.pipe = (self.pipe + new).saturating_sub(old);
    }

    /// A stream has data its own window admits and this one does not.
    pub fn held(&mut self) {
        self.held = true;
    }

    /// A handshake measured the round trip to a peer: part of the
    /// estimate a new stream's first timeout comes from, not of the
    /// window's base (a route that grew longer since, or a receiver that
    /// became slow, would read as queue for ten seconds).
    pub fn on_handshake(&mut self, rtt: Duration) {
        self.rtt.on_sample(rtt);
    }

    /// A stream's ACK newly showed `delivered` bytes delivered and, if it
    /// measured one, a round trip of `rtt`; the stream's smoothed round
    /// trip is `srtt_ns`.
    pub fn on_ack(&mut self, now: Instant, delivered: u64, rtt: Option<Duration>, srtt_ns: u64) {
        if !self.enabled {
            if let Some(rtt) = rtt {
                self.rtt.on_sample(rtt);
            }
            return;
        }
        let srtt = Duration::from_nanos(srtt_ns);
        if let Some(rtt) = rtt {
            self.rtt.on_sample(rtt);
            let rtt = rtt.as_nanos() as u64;
            self.base.take(now, rtt, BASE_PERIOD / 2);
            self.standing.take(now, rtt);
        }
        if let (Some(base), Some(standing)) = (self.base.get(), self.standing.get(now, srtt / 2)) {
            let target = base + TARGET_QUEUE_NS;
            if standing > target {
                if now >= self.recovery_start + srtt {
                    let excess = (standing - target) as f64 / standing as f64;
                    let factor = (1.0 - BETA * excess).max(1.0 - MAX_DECREASE);
                    self.window = ((self.window as f64 * factor) as u64).max(MIN_WINDOW * self.mss);
                    self.recovery_start = now;
                    self.slow_start = false;
                }
                self.held = false;
                return;
            }
        }
        if self.held && delivered > 0 {
            let step = match self.slow_start {
                true => delivered,
                // One datagram per window delivered: per round trip.
                false => (self.mss * delivered / self.window.max(1)).max(1),
            };
            self.window = self.window.saturating_add(step);
            self.held = false;
        }
    }

    /// The window's state, for `Endpoint::aggregate`.
    pub fn info(&self) -> CongestionInfo {
        CongestionInfo {
            window: self.window,
            in_flight: self.pipe,
            state: match (self.enabled, self.slow_start) {
                (false, _) => "off",
                (true, true) => "slow start",
                (true, false) => "delay",
            },
            pacing_rate: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: u64 = 1_000;
    const MSS: u64 = 1400;

    /// A config whose datagrams carry `MSS` payload bytes.
    fn config(congestion: CongestionControl) -> Config {
        let mut config = Config { congestion, ..Config::default() };
        config.max_datagram += MSS as usize - config.max_fragment();
        assert_eq!(config.max_fragment(), MSS as usize);
        config
    }

    fn at(ns: u64) -> Instant {
        Instant::from_nanos(ns)
    }

    #[test]
    fn a_window_with_nothing_in_flight_admits_anything_and_counts_what_a_stream_has_not_reported() {
        let room = Room { pipe: 0, window: MSS };
        assert!(room.admits(0, 0, 10 * MSS), "an empty window must admit, or nothing could start");
        let room = Room { pipe: 2 * MSS, window: 3 * MSS };
        assert!(room.admits(0, 0, MSS));
        // The stream sent one more since it reported: the window is full.
        assert!(!room.admits(MSS, 0, MSS));
        // The stream's reported pipe was acknowledged since: room again.
        assert!(room.admits(0, 2 * MSS, MSS));
    }

    #[test]
    fn the_window_grows_only_while_held_and_the_queue_is_short_and_shrinks_when_it_is_long() {
        let mut a = Aggregate::new(&config(CongestionControl::Delay));
        let start = a.room().window;
        // Short round trips, but nothing waited for the window: no growth.
        a.on_ack(at(100 * US), MSS, Some(Duration::from_micros(50)), 50 * US);
        assert_eq!(a.room().window, start);
        // Held: slow start grows it by what was delivered.
        a.held();
        a.on_ack(at(200 * US), 4 * MSS, Some(Duration::from_micros(50)), 50 * US);
        assert_eq!(a.room().window, start + 4 * MSS);
        // The queue (every recent sample) far beyond the target: it
        // shrinks, by half at most, and once per round trip.
        let mut t = 50_000 * US;
        for _ in 0..10 {
            a.on_ack(at(t), MSS, Some(Duration::from_millis(20)), 20_000 * US);
            t += 100 * US;
        }
        let once = a.room().window;
        assert_eq!(once, (start + 4 * MSS) / 2, "one decrease, by half, in one round trip");
        for _ in 0..2_000 {
            a.on_ack(at(t), MSS, Some(Duration::from_millis(20)), 20_000 * US);
            t += 100 * US;
        }
        assert_eq!(a.room().window, MIN_WINDOW * MSS, "and never below the floor");
        assert_eq!(a.info().state, "delay");
    }

    #[test]
    fn with_congestion_control_off_the_window_is_unlimited() {
        let mut a = Aggregate::new(&config(CongestionControl::Off));
        a.report(0, 1 << 40);
        a.on_ack(at(0), MSS, Some(Duration::from_secs(1)), 1_000_000_000);
        assert!(a.room().admits(0, 0, 1 << 30));
        assert_eq!(a.info().state, "off");
    }
}
