//! Loss detection by time: RACK, after Cheng, Cardwell, Dukkipati and Jha
//! (RFC 8985, "The RACK-TLP Loss Detection Algorithm for TCP").
//!
//! A segment is lost once a segment *sent after it* has been delivered and
//! enough time has passed that reordering no longer explains its absence:
//!
//! ```text
//!     sent + rtt + window <= now
//! ```
//!
//! where `rtt` is the round trip of the most recently sent segment known
//! delivered, and `window` the reordering allowed.
//!
//! The window is learned, not assumed. A segment never resent that is
//! acknowledged after one sent later than it shows how late it came (its
//! acknowledgement is unambiguous), and the window covers at once the
//! latest lateness seen, an eighth added. It starts at the whole
//! retransmission timeout, and every eight round trips it halves, down
//! to the latest lateness of that period, and never below a quarter of the
//! smallest round trip (RFC 8985 section 6.2's base). So a stream waits
//! long before it calls anything lost until it has seen how its network
//! behaves, and a stream on a network that does not reorder comes down to
//! a quarter round trip within about fifty round trips. The period is a
//! trade: a long one keeps a window learned under steady reordering (the
//! simulator's reordering mix resent 0.03% of its data frames at eight
//! round trips, 0.43% at four, 2.91% at two), a short one detects real
//! loss sooner once reordering stops (a campaign stream losing 10% of its
//! datagrams both ways took 3.32 times the fault-free time at sixteen,
//! 2.09 at eight).
//!
//! RFC 8985 starts small and grows the window by a quarter round trip per
//! round that reports a spurious retransmission (DSACK). Measured in the
//! simulator's reordering mix (every datagram delayed 0-400 us on a 20 us
//! link, ten seeds, 8,702 segments), learning only after the fact cannot
//! be cheap: starting small and learning the full extent at the first
//! spurious retransmission still resent 983 segments, 11%, almost all in
//! each stream's first flight; starting at the timeout, almost none. This
//! replaced a count of later segments acknowledged (three, like TCP's
//! duplicate threshold), which resent 91,602 (stale ACKs, overtaken on the
//! way, also looked like reneging: `SendStream::apply_sack`).

use crate::Instant;

/// The latest transmission known delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Delivered {
    /// When it was sent.
    pub sent: Instant,
    /// Its place in the stream's transmission order.
    pub order: u64,
    /// Its round trip, nanoseconds.
    pub rtt_ns: u64,
}

/// Round trips without reordering after which the window halves.
const DECAY_ROUND_TRIPS: u64 = 8;

/// The detector's state for one send stream: soft, rebuilt empty on restore.
#[derive(Debug, Clone)]
pub(crate) struct Rack {
    newest: Option<Delivered>,
    /// The smallest round trip of a segment sent once (`u64::MAX`: none yet).
    min_rtt_ns: u64,
    /// The reordering window, nanoseconds (`None`: nothing measured yet,
    /// the whole timeout).
    window: Option<u64>,
    /// The latest lateness seen since `period_start`, an eighth added.
    period_late_ns: u64,
    /// When the current decay period began.
    period_start: Instant,
}

impl Default for Rack {
    fn default() -> Self {
        Rack {
            newest: None,
            min_rtt_ns: u64::MAX,
            window: None,
            period_late_ns: 0,
            period_start: Instant::ZERO,
        }
    }
}

/// What one acknowledgement newly covered, judged against what was known
/// before it (segments covered by the same ACK arrived together: no
/// reordering among them can be seen).
#[derive(Debug, Default)]
pub(crate) struct AckScan {
    before: Option<Delivered>,
    /// The latest transmission of a segment sent once: (sent, order, rtt).
    original: Option<Delivered>,
    /// The earliest-sent segment sent once that the cumulative point
    /// newly passed: its order.
    oldest_original_order: Option<u64>,
    /// Segments are now reported from the SACK ranges, not the cumulative
    /// point.
    in_ranges: bool,
    /// The latest resent segment whose ACK came at least the smallest
    /// round trip after the resend (else it answers an earlier copy, RFC
    /// 8985 section 6.2 step 2).
    resent: Option<Delivered>,
    /// How late the latest of the reordered segments came, nanoseconds.
    late_ns: u64,
    /// The shortest (`u64::MAX`: none).
    min_original_ns: u64,
    /// An answered probe.
    probe: Option<Delivered>,
    /// A resend was acknowledged sooner than any round trip: the first
    /// copy arrived after all, and judging it lost was a mistake.
    spurious: bool,
}

impl AckScan {
    /// A newly delivered segment, last sent at `sent` (as the `order`th
    /// transmission), `resent` if it went more than once.
    pub fn delivered(&mut self, now: Instant, sent: Instant, order: u64, resent: bool, rack: &Rack) {
        let rtt_ns = (now - sent).as_nanos() as u64;
        let d = Delivered { sent, order, rtt_ns };
        let later = |best: Option<Delivered>| best.is_none_or(|b| order > b.order);
        if resent {
            // A resend acknowledged sooner than any round trip answers an
            // earlier copy.
            let soon = rack.min_rtt_ns != u64::MAX && rtt_ns < rack.min_rtt_ns;
            if !soon && later(self.resent) {
                self.resent = Some(d);
            }
            self.spurious |= soon;
            return;
        }
        self.min_original_ns = self.min_original_ns.min(rtt_ns);
        if !self.in_ranges && self.oldest_original_order.is_none_or(|o| order < o) {
            self.oldest_original_order = Some(order);
        }
        if later(self.original) {
            self.original = Some(d);
        }
        if let Some(b) = self.before.filter(|b| order < b.order) {
            // Sent before a segment already known delivered, and only now
            // acknowledged: it came this long after RACK began to wait.
            let expected = sent + core::time::Duration::from_nanos(b.rtt_ns);
            self.late_ns = self.late_ns.max((now - expected).as_nanos() as u64);
        }
    }

    /// The round trip of the latest-sent segment newly covered, if it went
    /// only once: the RTT sample this ACK gives.
    pub fn sample(&self) -> Option<core::time::Duration> {
        self.original.map(|o| core::time::Duration::from_nanos(o.rtt_ns))
    }

    /// The ACK answers a probe sent at `sent` as the `order`th
    /// transmission: the receiver took in everything that arrived before
    /// it, so the probe counts as delivered, unambiguously (it is never
    /// resent).
    pub fn probe_answered(&mut self, now: Instant, sent: Instant, order: u64) {
        let d = Delivered { sent, order, rtt_ns: (now - sent).as_nanos() as u64 };
        if self.probe.is_none_or(|p| order > p.order) {
            self.probe = Some(d);
        }
    }

    /// What follows comes from the SACK ranges.
    pub fn ranges_follow(&mut self) {
        self.in_ranges = true;
    }

    /// The ACK newly covered a segment sent only once.
    pub fn any_original(&self) -> bool {
        self.original.is_some()
    }
}

impl Rack {
    /// Begin judging one acknowledgement.
    pub fn scan(&self) -> AckScan {
        AckScan { before: self.newest, min_original_ns: u64::MAX, ..AckScan::default() }
    }

    /// Take in what one acknowledgement covered. `srtt_ns` paces the
    /// window's decay, `rto_ns` is where it starts.
    pub fn finish(&mut self, scan: AckScan, now: Instant, srtt_ns: u64, rto_ns: u64) {
        self.min_rtt_ns = self.min_rtt_ns.min(scan.min_original_ns);
        // A resend the cumulative point passed together with a segment sent
        // once before it: the receiver was taking in old transmissions in
        // order (late, not lost), and the ACK may answer the resend's
        // earlier copy. Only unambiguous times advance. Segments newly in
        // the SACK ranges say nothing of that: a resend that filled a hole
        // below them was needed (after a cut, they are what arrived before
        // it, reported now; taken as ambiguous, the repair after a 20 ms
        // cut waited a timeout per hole).
        let resent = scan.resent.filter(|r| scan.oldest_original_order.is_none_or(|o| o > r.order));
        for d in [scan.original, resent, scan.probe].into_iter().flatten() {
            if self.newest.is_none_or(|n| d.order > n.order) {
                self.newest = Some(d);
            }
        }
        let window = match self.window {
            Some(w) => w,
            None => {
                self.period_start = now;
                rto_ns
            }
        };
        // An eighth more than the latest seen, so the next as late is not
        // judged lost at the very edge.
        let late = scan.late_ns.saturating_add(scan.late_ns / 8);
        self.period_late_ns = self.period_late_ns.max(late);
        let mut window = window.max(late);
        if scan.spurious {
            // A segment judged lost arrived: the lateness samples so far
            // underestimate this network's (both directions' jitter, and
            // a delayed ACK, add up). Twice the window, kept through the
            // current decay period (RFC 8985 section 7.2 grows it on DSACK).
            window = window.saturating_mul(2).min(rto_ns.max(window));
            self.period_late_ns = self.period_late_ns.max(window);
        }
        if now - self.period_start > decay_after(srtt_ns) {
            window = (window / 2).max(self.period_late_ns);
            self.period_late_ns = 0;
            self.period_start = now;
        }
        self.window = Some(window);
    }

    /// The latest transmission known delivered.
    pub fn newest(&self) -> Option<Delivered> {
        self.newest
    }

    /// The reordering allowed now, nanoseconds: what was learned, at least
    /// a quarter of the smallest round trip, at most `rto_ns` (beyond it the
    /// retransmission timeout speaks anyway).
    pub fn window_ns(&self, rto_ns: u64) -> u64 {
        let base = if self.min_rtt_ns == u64::MAX { 0 } else { self.min_rtt_ns / 4 };
        self.window.unwrap_or(rto_ns).max(base).min(rto_ns)
    }

    /// The smallest round trip of a segment sent once (0: none yet).
    pub fn min_rtt(&self) -> u64 {
        if self.min_rtt_ns == u64::MAX {
            0
        } else {
            self.min_rtt_ns
        }
    }

    /// The smallest round trip of a segment sent once, if any.
    #[cfg(test)]
    pub fn min_rtt_ns(&self) -> Option<u64> {
        (self.min_rtt_ns != u64::MAX).then_some(self.min_rtt_ns)
    }
}

fn decay_after(srtt_ns: u64) -> core::time::Duration {
    core::time::Duration::from_nanos(srtt_ns.max(1_000).saturating_mul(DECAY_ROUND_TRIPS))
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: u64 = 1_000;

    fn at(us: u64) -> Instant {
        Instant::from_nanos(1_000_000_000 + us * US)
    }

    fn ack(rack: &mut Rack, now_us: u64, segs: &[(u64, u64, bool)]) {
        let mut scan = rack.scan();
        for &(sent_us, order, resent) in segs {
            scan.delivered(at(now_us), at(sent_us), order, resent, rack);
        }
        rack.finish(scan, at(now_us), 50 * US, 1_000 * US);
    }

    #[test]
    fn the_newest_delivered_transmission_is_the_reference() {
        let mut r = Rack::default();
        ack(&mut r, 50, &[(0, 0, false), (1, 1, false)]);
        let n = r.newest().unwrap();
        assert_eq!((n.order, n.rtt_ns), (1, 49 * US));
        assert_eq!(r.min_rtt_ns(), Some(49 * US));
        // An older ACK's information never moves it back.
        ack(&mut r, 60, &[(0, 0, false)]);
        assert_eq!(r.newest().unwrap().order, 1);
    }

    #[test]
    fn the_window_starts_at_the_timeout_and_decays_to_what_was_seen() {
        let mut r = Rack::default();
        assert_eq!(r.window_ns(1_000 * US), 1_000 * US, "nothing measured: the whole timeout");
        // Order 1 delivered after 40 us; order 0, sent a microsecond
        // earlier, is acknowledged 300 us after that.
        ack(&mut r, 41, &[(1, 1, false)]);
        ack(&mut r, 340, &[(0, 0, false)]);
        assert_eq!(r.window_ns(1_000 * US), 1_000 * US, "the lateness is inside the window");
        // Eight round trips (50 us each) on: halved, but no lower than
        // the lateness that period saw (300 us, an eighth added).
        ack(&mut r, 1_000, &[(950, 2, false)]);
        assert_eq!(r.window_ns(1_000 * US), 500 * US);
        let mut early = Rack::default();
        ack(&mut early, 41, &[(1, 1, false)]);
        ack(&mut early, 940, &[(0, 0, false)]);
        assert_eq!(early.window_ns(2_000 * US), 900 * US + 900 * US / 8);
        // The next period saw no lateness: halved again...
        ack(&mut r, 1_900, &[(1_850, 3, false)]);
        assert_eq!(r.window_ns(1_000 * US), 250 * US);
        // ... and then to the floor, a quarter of the smallest round trip.
        for (i, now) in (2_800..20_000).step_by(900).enumerate() {
            ack(&mut r, now, &[(now - 40, 4 + i as u64, false)]);
        }
        assert_eq!(r.window_ns(1_000 * US), 40 * US / 4);
        // A segment later than the window widens it at once.
        let order = 100;
        ack(&mut r, 20_001, &[(19_961, order + 1, false)]);
        ack(&mut r, 20_500, &[(19_960, order, false)]);
        assert_eq!(r.window_ns(1_000 * US), 500 * US + 500 * US / 8);
        assert_eq!(r.window_ns(200 * US), 200 * US, "never beyond the timeout");
    }

    #[test]
    fn a_resend_acknowledged_within_a_round_trip_answers_an_earlier_copy() {
        let mut r = Rack::default();
        ack(&mut r, 40, &[(0, 0, false)]);
        // Order 1 resent at 100 us as order 2; an ACK at 110 us is too
        // soon to be for the resend.
        ack(&mut r, 110, &[(100, 2, true)]);
        assert_eq!(r.newest().unwrap().order, 0);
        // One a full round trip after the resend is for it.
        ack(&mut r, 200, &[(150, 3, true)]);
        assert_eq!(r.newest().unwrap().order, 3);
    }

    #[test]
    fn a_resend_acknowledged_with_older_originals_proves_nothing() {
        let mut r = Rack::default();
        ack(&mut r, 40, &[(0, 0, false)]);
        // A late receiver: the originals (orders 1, 2) and the probe that
        // resent order 1 (as 3) are acknowledged at once, long after.
        ack(&mut r, 5000, &[(1, 1, false), (1000, 3, true), (2, 2, false)]);
        assert_eq!(r.newest().unwrap().order, 2, "the resend's time is not trusted");
    }
}
