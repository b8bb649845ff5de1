//! Paths to one peer: which rails lead to it and how each is doing
//! (Tang and Bilas [TB] section 4: transient versus permanent failure;
//! Trahay et al. [NMAD] sections 3-4: multi-rail; docs/REFERENCES.md).
//!
//! A *rail* is one way out of this node (a NIC, a network, a socket bound
//! to one address); a *path* is a rail as seen toward one peer. Health is
//! judged per path, from the only evidence a sender has that the path
//! delivers: an ACK newly covering data last sent over it (on whichever
//! rail the ACK itself came back), or the answer to a probe sent over it.
//! Something sent that asks for an answer (data, a probe) starts a clock;
//! silence past `path_suspect_after` (or two of the peer's retransmission
//! timeouts, if longer: `Paths::patience`) can make the path *suspect*
//! (on the evidence below): it is probed, and the endpoint moves its data,
//! in flight or new, to a healthy rail. Past `path_down_after` (or five
//! timeouts) it is *down* for this peer (other peers may still reach it
//! fine). Down paths are probed
//! at a low rate and come back with the first answer. A peer with a single
//! path is not tracked at all: there is nothing to choose between, and the
//! stream's own retransmission and abandonment rules apply unchanged.
//!
//! Silence is held against a path only when the peer answered over
//! another path since the silence began (`Paths::heard_elsewhere`): a
//! peer whose process or machine stalls is silent on every path at once,
//! and moving its data then only costs duplicates. So a path silent past
//! its patience first has the others probed; it turns suspect when one of
//! them answers and it has left three asks unanswered (data, or probes
//! half a patience apart: one lost datagram is not a failed path), and
//! down without such evidence only once every path has been silent past
//! `down` (the peer is unreachable: there is nothing to move the data to).
//! A peer sends the ACK it owes before a path probe's answer, so its
//! sender hears the data's path first. When a path answers again, data
//! left on paths that went down with every other (nothing to move it to
//! then) moves to it at once. (The answer to a stream's timeout probe
//! proves nothing of the path: a path that drops large datagrams but
//! carries small ones must still lose its data to a healthy one.)
//! On a loaded two-core machine this is what keeps healthy rails steady:
//! the fixed-threshold rule failed them over whenever a peer's thread was
//! descheduled a few milliseconds (docs/ARCHITECTURE.md, "Rails").
//!
//! Probes need no frame of their own: a datagram with no frames and the
//! ACK-request flag is a probe, one with no frames and no flags its answer
//! (a "pong"), sent back at once on the rail the probe came in on. ACKs
//! sent alone go back on the rail the peer's data last came in on.
//!
//! Everything here but the list of rails is soft state (docs/ARCHITECTURE.md,
//! the engine seam): a new engine rebuilds it from the configured rails.

use core::time::Duration;

use crate::{Config, Event, Instant, NodeId};

/// A rail's number on this node: the runtime maps it to a socket (or any
/// other transport), the core only tells rails apart.
pub type RailId = u8;

/// Most rails a node has: rail ids run from 0 to `MAX_RAILS - 1`.
pub const MAX_RAILS: usize = 8;

/// Unanswered sends (data, probes) a path is judged on. Measured with
/// `tether demo --rails 2` (5% of datagrams lost, 2% corrupted, 5% held
/// back up to 10 ms): judged on two, healthy paths turned suspect 23 to 30
/// times a run; on three, 3 to 9.
const JUDGED_ON: u8 = 3;

/// How data is spread over a peer's healthy paths.
///
/// Non-exhaustive: more policies (weighted by measured bandwidth, say)
/// may come.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize), serde(rename_all = "snake_case"))]
#[non_exhaustive]
pub enum RailPolicy {
    /// All data on the lowest-numbered healthy rail; the others carry only
    /// probes until it fails.
    #[default]
    PrimaryBackup,
    /// Datagrams round-robin over every healthy rail.
    Stripe,
}

/// A path's health as judged by the evidence that it delivers.
/// Non-exhaustive: a state of its own for a path the operator disabled,
/// or one the engine's self-test (Zhou et al. [FTGM]) failed, may come.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize), serde(rename_all = "snake_case"))]
#[non_exhaustive]
pub enum PathState {
    /// Answering.
    Active,
    /// Silent past its patience while another path answered: probed, new
    /// data goes elsewhere.
    Suspect,
    /// Silent past its longer patience (with another path answering, or
    /// every path silent): not used for data, probed slowly.
    Down,
}

/// The state's lower-case name ("active", "suspect", "down"): the one the
/// `serde` feature writes too, so tables and JSON say the same.
impl core::fmt::Display for PathState {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            PathState::Active => "active",
            PathState::Suspect => "suspect",
            PathState::Down => "down",
        })
    }
}

/// Counters of one path.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct PathStats {
    /// Datagrams sent over this path, probes included.
    pub datagrams_sent: u64,
    /// Data frames among them, first sends and retransmissions.
    pub data_frames_sent: u64,
    /// Data frames sent again over this path.
    pub retransmits: u64,
    /// Probes sent because the path was suspect, down or idle.
    pub probes_sent: u64,
    /// Datagrams from the peer that came in on this rail and passed every check.
    pub datagrams_received: u64,
    /// Times the path's state changed.
    pub state_changes: u64,
}

/// What the application can see of one path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct PathInfo {
    /// The rail this path leaves on.
    pub rail: RailId,
    /// Its health now.
    pub state: PathState,
    /// When the path entered its current state.
    pub since: Instant,
    /// Smoothed round trip of this path's probes, if any was answered
    /// (nanoseconds with the `serde` feature, like every duration).
    #[cfg_attr(feature = "serde", serde(with = "crate::serde_support::nanos_option"))]
    pub rtt: Option<Duration>,
    /// The last time the path showed it delivers (an ACK for data sent
    /// over it, or a probe answered).
    pub last_answer: Option<Instant>,
    /// What went over it.
    pub stats: PathStats,
}

/// Data moved from a path that stopped delivering to another that does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Failover {
    /// The rail that stopped delivering.
    pub from: RailId,
    /// The rail whose ACK completed the failover.
    pub to: RailId,
    /// From the last ACK for data over `from` to the first ACK for data
    /// over `to` after it: how long the peer's data was stranded
    /// (nanoseconds with the `serde` feature).
    #[cfg_attr(feature = "serde", serde(with = "crate::serde_support::nanos"))]
    pub gap: Duration,
}

/// A datagram the paths want sent on their own account.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Control {
    Probe,
    Pong,
}

#[derive(Debug)]
struct Path {
    rail: RailId,
    state: PathState,
    since: Instant,
    /// The first send asking for an answer since the peer last answered.
    awaiting_since: Option<Instant>,
    /// Sends asking for an answer since then (saturating): a path is
    /// judged on several unanswered asks, not one lost datagram.
    asks: u8,
    /// When the latest of them went: a path is judged only once its
    /// latest ask had time to be answered (a stream's repair of a lost
    /// datagram, its timeout's probe then the resend, asks again).
    last_ask: Instant,
    last_sent: Instant,
    next_probe: Option<Instant>,
    probe_sent_at: Option<Instant>,
    pong_owed: bool,
    srtt: Option<Duration>,
    last_answer: Option<Instant>,
    /// When the latest thing the path answered had been sent (a probe's
    /// send time; an ACK's arrival, its departure being unknown).
    heard_after: Option<Instant>,
    stats: PathStats,
}

impl Path {
    fn new(rail: RailId, now: Instant) -> Self {
        Path {
            rail,
            state: PathState::Active,
            since: now,
            awaiting_since: None,
            asks: 0,
            last_ask: now,
            last_sent: now,
            next_probe: None,
            probe_sent_at: None,
            pong_owed: false,
            srtt: None,
            last_answer: None,
            heard_after: None,
            stats: PathStats::default(),
        }
    }

    fn set(&mut self, now: Instant, to: PathState) -> Option<(PathState, PathState)> {
        if self.state == to {
            return None;
        }
        let from = self.state;
        self.state = to;
        self.since = now;
        self.stats.state_changes += 1;
        Some((from, to))
    }

    /// The path can answer but was asked nothing since it last did, and
    /// has no probe due.
    fn unasked(&self) -> bool {
        self.state != PathState::Down && self.awaiting_since.is_none() && self.next_probe.is_none()
    }

    /// When the path is next due a probe: one scheduled, or an idle
    /// healthy path's.
    fn probe_deadline(&self, config: &Config) -> Option<Instant> {
        let idle = (self.state == PathState::Active && self.awaiting_since.is_none())
            .then(|| self.last_sent + config.path_idle_probe_interval);
        [self.next_probe, idle].into_iter().flatten().min()
    }
}

/// What a path's silence calls for (`Paths::verdict`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Wait,
    /// Probe the path again, the other paths, or both, before judging it.
    Ask {
        others: bool,
        again: bool,
    },
    To(PathState),
}

/// A change of one path's state, for the endpoint to report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Transition {
    pub rail: RailId,
    pub from: PathState,
    pub to: PathState,
}

impl Transition {
    /// The application's event for this change on the path to `peer`.
    pub fn event(self, peer: NodeId, at: Instant) -> Event {
        Event::PathChanged { peer, rail: self.rail, from: self.from, to: self.to, at }
    }
}

/// The paths to one peer.
#[derive(Debug)]
pub(crate) struct Paths {
    /// In rail order; never empty.
    paths: Vec<Path>,
    /// Where ACKs sent alone go: the rail the peer's data last came in on.
    reply_rail: RailId,
    /// Next turn of the stripe policy.
    stripe: usize,
    /// The rail whose data was acknowledged last, and when.
    last_delivered: Option<(RailId, Instant)>,
    /// The peer's retransmission timeout without back-off (`set_rto`).
    rto: Duration,
    /// Rails (a bit each) whose sockets the driver left unread this turn:
    /// no path over them is judged silent until they are read to the end.
    backlog: u8,
}

/// How long a path may be silent: past `suspect` it is suspect, past
/// `down` down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Patience {
    suspect: Duration,
    down: Duration,
}

impl Paths {
    /// The fault hook: a path's state changed to another.
    #[cfg(feature = "fault-hook")]
    pub fn flip_state(&mut self, draw: &mut crate::fault_hook::Draw) -> String {
        let i = draw.below(self.paths.len() as u64) as usize;
        let p = &mut self.paths[i];
        let was = p.state;
        let others: Vec<PathState> = [PathState::Active, PathState::Suspect, PathState::Down]
            .into_iter()
            .filter(|s| *s != was)
            .collect();
        p.state = others[draw.below(others.len() as u64) as usize];
        format!("rail {}'s path state {was} -> {}", p.rail, p.state)
    }

    /// A peer reached over rail 0 only, until told otherwise.
    pub fn new(now: Instant) -> Self {
        Paths {
            paths: vec![Path::new(0, now)],
            reply_rail: 0,
            stripe: 0,
            last_delivered: None,
            rto: Duration::ZERO,
            backlog: 0,
        }
    }

    /// The peer's retransmission timeout as the stream measures it (its
    /// RTT and variance, no back-off): silence is judged against it.
    pub fn set_rto(&mut self, rto: Duration) {
        self.rto = rto;
    }

    /// Silence a path may keep before it is suspect and down: the
    /// configured thresholds, or two and five retransmission timeouts if
    /// those are longer (never past a quarter and a half of
    /// `abandon_after`). The fixed 2 ms failed healthy paths whenever the
    /// machine was busy: in a `tether demo --rails 2` on this 2-core
    /// machine the probes measured 2-3 ms round trips, and each healthy
    /// path changed state 80 to 153 times (416 failovers in the run); at
    /// two timeouts 0 to 12 (4 and 5 failovers). One timeout is the
    /// stream's own patience for a datagram; silence past two is the
    /// path's. The price is slower detection where the round trip is long:
    /// at one timeout the demo failed over 43 and 57 times, and the
    /// two-host cut test's median gap was 5.6 ms against 10.0 at two.
    fn patience(&self, config: &Config) -> Patience {
        let scaled = |n: u32, cap: u32| (self.rto * n).min(config.abandon_after / cap);
        Patience {
            suspect: config.path_suspect_after.max(scaled(2, 4)),
            down: config.path_down_after.max(scaled(5, 2)),
        }
    }

    /// Replace the set of rails that lead to the peer (sorted, deduplicated,
    /// at most [`MAX_RAILS`]: the caller checked). Paths kept keep their state.
    pub fn set_rails(&mut self, now: Instant, rails: &[RailId]) {
        let mut rails = rails.to_vec();
        rails.sort_unstable();
        rails.dedup();
        let mut old = std::mem::take(&mut self.paths);
        self.paths = rails
            .iter()
            .map(|&r| match old.iter().position(|p| p.rail == r) {
                Some(i) => old.swap_remove(i),
                None => Path::new(r, now),
            })
            .collect();
        if !rails.contains(&self.reply_rail) {
            self.reply_rail = rails[0];
        }
    }

    /// More than one path: health is tracked and probes flow.
    pub fn tracked(&self) -> bool {
        self.paths.len() > 1
    }

    fn path_mut(&mut self, rail: RailId) -> Option<&mut Path> {
        self.paths.iter_mut().find(|p| p.rail == rail)
    }

    /// A datagram from the peer passed every check on `rail`: `data` if
    /// it carried data frames, `probe` or `pong` if it was one.
    pub fn on_receive(
        &mut self,
        now: Instant,
        rail: RailId,
        data: bool,
        probe: bool,
        pong: bool,
    ) -> Option<Transition> {
        let tracked = self.tracked();
        let i = self.paths.iter().position(|p| p.rail == rail)?;
        if data {
            self.reply_rail = rail;
        }
        let p = &mut self.paths[i];
        p.stats.datagrams_received += 1;
        if !tracked {
            return None;
        }
        if probe {
            p.pong_owed = true;
        }
        if !pong {
            return None;
        }
        // Only an answer times a probe: the peer's own probes and data
        // cross ours on the wire.
        let sent = p.probe_sent_at.take();
        if let Some(sent) = sent {
            let sample = now - sent;
            p.srtt = Some(p.srtt.map_or(sample, |s| (s * 7 + sample) / 8));
        }
        // The answer shows the peer was there after the probe went (a pong
        // with no probe of ours out answers a duplicate: no evidence).
        Self::answered(p, now, sent)
    }

    /// An ACK proved the paths in `rails` deliver (a bit per rail), and
    /// covered data last sent over those in `latest`. Returns the failover
    /// this completes, if data had been stranded on a path that stopped.
    pub fn on_acked(
        &mut self,
        now: Instant,
        rails: u8,
        latest: u8,
        mut on_change: impl FnMut(Transition),
    ) -> Option<Failover> {
        if !self.tracked() || latest == 0 {
            return None;
        }
        for p in self.paths.iter_mut().filter(|p| rails & (1 << p.rail) != 0) {
            // When the ACK left the peer is not known: its arrival stands in.
            if let Some(t) = Self::answered(p, now, Some(now)) {
                on_change(t);
            }
        }
        let to = latest.trailing_zeros() as RailId;
        let failover = match self.last_delivered {
            Some((from, at)) if from != to && latest & (1 << from) == 0 => {
                // Only a move away from a path that stopped answering is a
                // failover; striping alternates between healthy rails.
                let stopped = self.paths.iter().any(|p| p.rail == from && p.state != PathState::Active);
                stopped.then(|| Failover { from, to, gap: now - at })
            }
            _ => None,
        };
        self.last_delivered = Some((to, now));
        failover
    }

    /// `p` answered at `now` something sent at `asked`.
    fn answered(p: &mut Path, now: Instant, asked: Option<Instant>) -> Option<Transition> {
        (p.awaiting_since, p.asks) = (None, 0);
        p.last_answer = Some(now);
        p.heard_after = p.heard_after.max(asked);
        if p.state != PathState::Active {
            p.next_probe = None;
        }
        let rail = p.rail;
        p.set(now, PathState::Active).map(|(from, to)| Transition { rail, from, to })
    }

    /// A datagram went out on `rail`; `asks_answer` for data and probes.
    pub fn on_sent(
        &mut self,
        now: Instant,
        rail: RailId,
        data_frames: u64,
        retransmits: u64,
        asks_answer: bool,
    ) {
        let tracked = self.tracked();
        let Some(p) = self.path_mut(rail) else { return };
        p.stats.datagrams_sent += 1;
        p.stats.data_frames_sent += data_frames;
        p.stats.retransmits += retransmits;
        p.last_sent = now;
        if tracked && asks_answer {
            p.awaiting_since.get_or_insert(now);
            p.asks = p.asks.saturating_add(1);
            p.last_ask = now;
        }
    }

    /// The rail for the next data datagram.
    pub fn data_rail(&mut self, policy: RailPolicy) -> RailId {
        let usable = |s: PathState| s != PathState::Down;
        match policy {
            RailPolicy::PrimaryBackup => {
                self.paths
                    .iter()
                    .find(|p| p.state == PathState::Active)
                    .or_else(|| self.paths.iter().find(|p| usable(p.state)))
                    .unwrap_or(&self.paths[0])
                    .rail
            }
            RailPolicy::Stripe => {
                let active: usize = self.paths.iter().filter(|p| p.state == PathState::Active).count();
                if active == 0 {
                    return self.data_rail(RailPolicy::PrimaryBackup);
                }
                self.stripe = (self.stripe + 1) % active;
                self.paths
                    .iter()
                    .filter(|p| p.state == PathState::Active)
                    .nth(self.stripe)
                    .expect("in range")
                    .rail
            }
        }
    }

    pub fn reply_rail(&self) -> RailId {
        self.reply_rail
    }

    /// Whether a path other than `rail` answered something sent after
    /// `since`: the peer is alive and reaches us another way, so `rail`'s
    /// silence since then is the path's own, not the peer's. (An answer
    /// to an earlier probe that merely arrives later may have left the peer
    /// just before it stalled.)
    fn heard_elsewhere(&self, rail: RailId, since: Instant) -> bool {
        self.paths.iter().any(|q| q.rail != rail && q.heard_after.is_some_and(|t| t > since))
    }

    /// A path other than `rail` that can answer but was asked nothing
    /// since it last did (and has no probe due): probing it tells a
    /// silent path from a silent peer.
    fn others_unasked(&self, rail: RailId) -> bool {
        self.paths.iter().any(|q| q.rail != rail && q.unasked())
    }

    /// When every path will have been silent past `down` (a down path is
    /// silent already); `None` while some path that can answer was asked
    /// nothing.
    fn all_silent_at(&self, patience: Patience) -> Option<Instant> {
        self.paths
            .iter()
            .filter(|q| q.state != PathState::Down)
            .try_fold(Instant::ZERO, |at, q| q.awaiting_since.map(|t| at.max(t + patience.down)))
    }

    /// What `p`'s silence calls for now, and when it next will: judged
    /// only on evidence (`heard_elsewhere`, or every path silent), and only
    /// after `JUDGED_ON` unanswered asks (past `suspect` since the first,
    /// past half of that since the last: a lost probe or ACK is the
    /// stream's to repair, not a failed path).
    fn verdict(&self, p: &Path, now: Instant, patience: Patience) -> (Verdict, Option<Instant>) {
        let Some(t) = p.awaiting_since else { return (Verdict::Wait, None) };
        if p.state == PathState::Down {
            return (Verdict::Wait, None);
        }
        let heard = self.heard_elsewhere(p.rail, t);
        // Down: past `down` with evidence, or once every path is silent.
        let down_at = if heard {
            Some(t + patience.down)
        } else {
            self.all_silent_at(patience).map(|at| at.max(t + patience.down))
        };
        if down_at.is_some_and(|at| now >= at) {
            return (Verdict::To(PathState::Down), None);
        }
        if p.state != PathState::Active {
            return (Verdict::Wait, down_at);
        }
        let suspect_at = t + patience.suspect;
        // Past the patience, the other paths are asked (if nothing showed
        // the peer there since): their answer is the evidence. (Asked at
        // half the patience instead, the two-host cut test's median gap
        // was no shorter: 3.25-3.53 ms against 3.02-3.67.)
        let others_at = (!heard && self.others_unasked(p.rail)).then_some(suspect_at);
        // This one is asked again from then on, half a patience apart:
        // data asks as often as it is sent, a backup's probes must be.
        let next_ask_at = suspect_at.max(p.last_ask + patience.suspect / 2);
        let again_at = (p.asks < JUDGED_ON && p.next_probe.is_none()).then_some(next_ask_at);
        if let Some(ask_at) = [others_at, again_at].into_iter().flatten().min() {
            let due = |at: Option<Instant>| at.is_some_and(|at| now >= at);
            let verdict = if now >= ask_at {
                Verdict::Ask { others: due(others_at), again: due(again_at) }
            } else {
                Verdict::Wait
            };
            return (verdict, [Some(ask_at), down_at].into_iter().flatten().min());
        }
        // At most a patience late: a path that data keeps being sent into
        // (each send an ask) is judged all the same.
        let judged_at =
            (heard && p.asks >= JUDGED_ON).then_some(next_ask_at.min(suspect_at + patience.suspect));
        match judged_at {
            Some(at) if now >= at => (Verdict::To(PathState::Suspect), None),
            _ => (Verdict::Wait, [judged_at, down_at].into_iter().flatten().min()),
        }
    }

    /// The rails (a bit each) whose sockets the driver may have left
    /// unread this turn (`Endpoint::set_backlog`): an answer
    /// may wait in there, so their paths' silence is not judged until a
    /// turn reads them to the end. An answer on a quiet rail otherwise
    /// overtook one the peer sent at the same moment on a busy rail, and a
    /// healthy path was failed over (traced in the two-rail demo: the
    /// judgment 28 us after a turn that left rail 0 unread, the path back
    /// 7 us after it, in about one fault-free run in three).
    pub fn set_backlog(&mut self, rails: u8) {
        self.backlog = rails;
    }

    /// Run the path clocks; `on_change` hears of every state change.
    pub fn on_timer(&mut self, now: Instant, config: &Config, mut on_change: impl FnMut(Transition)) {
        if !self.tracked() {
            return;
        }
        let patience = self.patience(config);
        for i in 0..self.paths.len() {
            let rail = self.paths[i].rail;
            match self.verdict(&self.paths[i], now, patience).0 {
                Verdict::Wait => {}
                Verdict::Ask { others, again } => {
                    // Silent, but one datagram may have been lost, or the
                    // peer may be silent on every path: ask again, and ask
                    // the others, before judging this one.
                    for q in self.paths.iter_mut() {
                        if (q.rail == rail && again) || (q.rail != rail && others && q.unasked()) {
                            q.next_probe = Some(now);
                        }
                    }
                }
                // Its answer may be unread in this node's own socket.
                Verdict::To(_) if self.backlog & (1 << rail) != 0 => {}
                Verdict::To(to) => {
                    let p = &mut self.paths[i];
                    if let Some((from, to)) = p.set(now, to) {
                        on_change(Transition { rail, from, to });
                        // Probe a newly suspect path at once, a newly down
                        // one once more soon; `take_control` then keeps down
                        // paths at the slow rate unless every path is down.
                        p.next_probe = Some(match to {
                            PathState::Down => now + config.path_probe_interval,
                            _ => now,
                        });
                        if to == PathState::Down {
                            // Stop the clock: the path stays down until it answers.
                            (p.awaiting_since, p.asks) = (None, 0);
                        }
                    }
                }
            }
            let p = &mut self.paths[i];
            let idle = p.state == PathState::Active
                && p.awaiting_since.is_none()
                && now >= p.last_sent + config.path_idle_probe_interval;
            if idle && p.next_probe.is_none() {
                p.next_probe = Some(now);
            }
        }
    }

    /// The rails whose paths are suspect or down, if any path is active
    /// (data last sent over them may be moved to it).
    pub fn inactive_rails(&self) -> impl Iterator<Item = RailId> + '_ {
        let any_active = self.paths.iter().any(|p| p.state == PathState::Active);
        self.paths.iter().filter(move |p| any_active && p.state != PathState::Active).map(|p| p.rail)
    }

    /// Whether a path other than `rail` can carry data.
    pub fn other_usable(&self, rail: RailId) -> bool {
        self.paths.iter().any(|q| q.rail != rail && q.state != PathState::Down)
    }

    /// A probe or pong to send now, with its rail. `data_waiting`: the
    /// peer has unacknowledged data, so a way to it is urgent.
    pub fn take_control(
        &mut self,
        now: Instant,
        config: &Config,
        data_waiting: bool,
    ) -> Option<(RailId, Control)> {
        if let Some(p) = self.paths.iter_mut().find(|p| p.pong_owed) {
            p.pong_owed = false;
            return Some((p.rail, Control::Pong));
        }
        // With every path down and data waiting nothing can move until one
        // answers: probe them all at the suspect rate, not the slow one.
        let all_down = data_waiting && self.paths.iter().all(|p| p.state == PathState::Down);
        let p = self.paths.iter_mut().find(|p| p.next_probe.is_some_and(|t| t <= now))?;
        p.probe_sent_at = Some(now);
        p.stats.probes_sent += 1;
        p.next_probe = match p.state {
            PathState::Active => None,
            PathState::Suspect => Some(now + config.path_probe_interval),
            PathState::Down if all_down => Some(now + config.path_probe_interval),
            PathState::Down => Some(now + config.path_down_probe_interval),
        };
        Some((p.rail, Control::Probe))
    }

    /// A probe came in that is not answered yet.
    pub fn pong_owed(&self) -> bool {
        self.paths.iter().any(|p| p.pong_owed)
    }

    pub fn control_due(&self, now: Instant) -> bool {
        self.paths.iter().any(|p| p.pong_owed || p.next_probe.is_some_and(|t| t <= now))
    }

    /// The earliest silence deadline over the paths (see `Timer::PathSilence`).
    pub fn silence_deadline(&self, config: &Config) -> Option<Instant> {
        if !self.tracked() {
            return None;
        }
        let patience = self.patience(config);
        // Any instant will do for `now`: the deadline does not depend on it.
        self.paths.iter().filter_map(|p| self.verdict(p, Instant::ZERO, patience).1).min()
    }

    /// The earliest probe deadline over the paths (see `Timer::Probe`).
    pub fn probe_deadline(&self, config: &Config) -> Option<Instant> {
        if !self.tracked() {
            return None;
        }
        self.paths.iter().filter_map(|p| p.probe_deadline(config)).min()
    }

    /// The rail for the `n`-th try of something that must find any working
    /// path without knowing which works (a HELLO before any session): the
    /// rails in turn.
    pub fn nth_rail(&self, n: u32) -> RailId {
        self.paths[n as usize % self.paths.len()].rail
    }

    /// How many rails lead to the peer.
    pub fn rails_len(&self) -> u32 {
        self.paths.len() as u32
    }

    /// Where `rail` is in the list [`nth_rail`](Self::nth_rail) turns through.
    pub fn rail_index(&self, rail: RailId) -> u32 {
        self.paths.iter().position(|p| p.rail == rail).unwrap_or(0) as u32
    }

    /// The rails that lead to the peer: configuration, not soft state, so
    /// a rebuilt peer gets the same paths (with fresh health).
    pub fn rails(&self) -> Vec<RailId> {
        self.paths.iter().map(|p| p.rail).collect()
    }

    pub fn info(&self) -> impl Iterator<Item = PathInfo> + '_ {
        self.paths.iter().map(|p| PathInfo {
            rail: p.rail,
            state: p.state,
            since: p.since,
            rtt: p.srtt,
            last_answer: p.last_answer,
            stats: p.stats,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn patience_grows_with_the_timeout_and_stays_below_abandonment() {
        let config = Config::default();
        let mut paths = Paths::new(Instant::ZERO);
        // At the timeout's floor the configured thresholds hold.
        paths.set_rto(MS);
        assert_eq!(paths.patience(&config), Patience { suspect: 2 * MS, down: 5 * MS });
        // A busy machine's 3 ms timeout: two and five of them.
        paths.set_rto(3 * MS);
        assert_eq!(paths.patience(&config), Patience { suspect: 6 * MS, down: 15 * MS });
        // Never past a quarter and a half of `abandon_after`.
        let config = Config { abandon_after: 300 * MS, ..Config::default() };
        paths.set_rto(250 * MS);
        assert_eq!(paths.patience(&config), Patience { suspect: 75 * MS, down: 150 * MS });
    }

    /// Two rails, timeout `rto`, and a stream's worth of data datagrams
    /// (as many as a path is judged on) sent over rail 0 at `sent`.
    fn streaming(sent: Instant, rto: Duration) -> Paths {
        let mut paths = Paths::new(Instant::ZERO);
        paths.set_rails(Instant::ZERO, &[0, 1]);
        paths.set_rto(rto);
        for _ in 0..JUDGED_ON {
            paths.on_sent(sent, 0, 1, 0, true);
        }
        paths
    }

    #[test]
    fn a_path_is_suspect_after_two_timeouts_of_silence_while_another_answers() {
        let config = Config::default();
        let sent = Instant::ZERO + MS;
        let mut paths = streaming(sent, 4 * MS);
        // An ACK for data over rail 1 comes after rail 0's data went: the
        // peer is there.
        paths.on_sent(sent, 1, 1, 0, true);
        let mut changes = Vec::new();
        paths.on_acked(sent + MS, 0b10, 0b10, |t| changes.push(t.to));
        assert_eq!(paths.silence_deadline(&config), Some(sent + 8 * MS));
        paths.on_timer(sent + 7 * MS, &config, |t| changes.push(t.to));
        assert!(changes.is_empty(), "the configured 2 ms passed, two timeouts have not");
        paths.on_timer(sent + 8 * MS, &config, |t| changes.push(t.to));
        assert_eq!(changes, [PathState::Suspect]);
    }

    #[test]
    fn a_peer_silent_on_every_path_changes_no_state_until_it_answers() {
        let config = Config::default();
        let sent = Instant::ZERO + MS;
        let mut paths = Paths::new(Instant::ZERO);
        paths.set_rails(Instant::ZERO, &[0, 1]);
        paths.set_rto(MS);
        // Data flowed over rail 0 before (a failover would be timed from it).
        paths.on_sent(Instant::ZERO, 0, 1, 0, true);
        paths.on_acked(Instant::ZERO + MS / 2, 0b01, 0b01, |_| {});
        for _ in 0..JUDGED_ON {
            paths.on_sent(sent, 0, 1, 0, true);
        }
        // Silent past the 2 ms patience: rail 1, asked nothing since, is
        // probed before rail 0 is judged.
        assert_eq!(paths.silence_deadline(&config), Some(sent + 2 * MS));
        let mut changes = Vec::new();
        let mut probes = Vec::new();
        // The peer is stalled for 6 ms, past the 5 ms down threshold for
        // rail 0: nothing is answered.
        let woke = sent + 6 * MS;
        let mut now = sent;
        while now < woke {
            paths.on_timer(now, &config, |t| changes.push(t));
            while let Some((rail, _)) = paths.take_control(now, &config, true) {
                paths.on_sent(now, rail, 0, 0, true);
                probes.push((rail, now));
            }
            now = now + MS / 4;
        }
        assert!(changes.is_empty(), "judged while the peer was silent on both: {changes:?}");
        assert_eq!(probes.first(), Some(&(1, sent + 2 * MS)), "{probes:?}");
        // Both silent past 5 ms would be the peer unreachable: not yet.
        assert_eq!(paths.silence_deadline(&config), Some(sent + 7 * MS));
        // The peer wakes and answers everything at once, the ACK for the
        // data first (`Peer::poll_transmit`), then the probes.
        paths.on_timer(woke, &config, |t| changes.push(t));
        let failover = paths.on_acked(woke, 0b01, 0b01, |t| changes.push(t));
        assert_eq!(paths.on_receive(woke, 1, false, false, true), None);
        paths.on_timer(woke, &config, |t| changes.push(t));
        assert!(changes.is_empty(), "a stalled peer changed path states: {changes:?}");
        assert_eq!(failover, None);
        assert!(paths.info().all(|p| p.state == PathState::Active && p.stats.state_changes == 0));
    }

    /// Data over rail 0 from 1 ms unanswered; at the 2 ms patience rail 1
    /// is probed and answers a quarter millisecond later: the paths, and
    /// when the evidence came.
    fn evidence_against_rail_0(config: &Config) -> (Paths, Instant) {
        let sent = Instant::ZERO + MS;
        let mut paths = streaming(sent, MS);
        let at = sent + 2 * MS;
        paths.on_timer(at, config, |_| panic!("judged before the other path was asked"));
        assert_eq!(paths.take_control(at, config, true), Some((1, Control::Probe)));
        paths.on_sent(at, 1, 0, 0, true);
        let answer = at + MS / 4;
        assert_eq!(paths.on_receive(answer, 1, false, false, true), None);
        (paths, answer)
    }

    #[test]
    fn a_path_silent_while_the_other_answers_its_probe_turns_suspect_then() {
        let config = Config::default();
        let (mut paths, answer) = evidence_against_rail_0(&config);
        // Rail 1's answer is the evidence: rail 0 is due at once.
        assert_eq!(paths.silence_deadline(&config), Some(Instant::ZERO + 3 * MS));
        let mut changes = Vec::new();
        paths.on_timer(answer, &config, |t| changes.push((t.rail, t.to)));
        assert_eq!(changes, [(0, PathState::Suspect)]);
    }

    /// The driver left rail 0's socket unread this turn: its answer may be
    /// in there, so the evidence from rail 1 does not judge it yet; the
    /// turn after, with the socket read to the end and still no answer,
    /// does.
    #[test]
    fn a_path_whose_socket_was_left_unread_is_not_judged_that_turn() {
        let config = Config::default();
        let (mut paths, answer) = evidence_against_rail_0(&config);
        let mut changes = Vec::new();
        paths.set_backlog(0b01);
        paths.on_timer(answer, &config, |t| changes.push((t.rail, t.to)));
        assert!(changes.is_empty(), "judged with its socket unread: {changes:?}");
        paths.set_backlog(0b10);
        paths.on_timer(answer + MS / 100, &config, |t| changes.push((t.rail, t.to)));
        assert_eq!(changes, [(0, PathState::Suspect)], "another rail's backlog is no reason to wait");
    }

    /// An idle backup whose probes are lost until the `answered`-th (none
    /// if 0) while rail 0 keeps answering, run in quarter-millisecond
    /// steps for 20 ms: the probes sent over rail 1 and when it turned
    /// suspect, if it did.
    fn backup_probed(answered: u8) -> (Vec<Instant>, Option<Instant>) {
        let config = Config::default();
        let mut paths = Paths::new(Instant::ZERO);
        paths.set_rails(Instant::ZERO, &[0, 1]);
        paths.set_rto(MS);
        let (mut probes, mut suspect) = (Vec::new(), None);
        paths.on_sent(Instant::ZERO + MS, 1, 0, 0, true);
        probes.push(Instant::ZERO + MS);
        for step in 5..80u64 {
            let now = Instant::ZERO + MS / 4 * step as u32;
            paths.on_acked(now, 0b01, 0b01, |_| {});
            if probes.len() as u8 == answered {
                paths.on_receive(now, 1, false, false, true);
            }
            paths.on_timer(now, &config, |t| {
                if t.to == PathState::Suspect {
                    suspect.get_or_insert(now);
                }
            });
            while let Some((rail, control)) = paths.take_control(now, &config, false) {
                assert_eq!((rail, control), (1, Control::Probe));
                paths.on_sent(now, 1, 0, 0, true);
                probes.push(now);
            }
        }
        (probes, suspect)
    }

    #[test]
    fn a_path_is_judged_on_three_unanswered_asks_half_a_patience_apart() {
        // Every probe lost: asked at 1 ms, again at the 2 ms patience and
        // half of it later, then suspect half of it after the third.
        let ms = |n: u64| Instant::ZERO + Duration::from_micros(n * 1000);
        let (probes, suspect) = backup_probed(0);
        assert_eq!(probes[..3], [ms(1), ms(3), ms(4)], "{probes:?}");
        assert_eq!(suspect, Some(ms(5)));
        // Answered at the second or third ask: never suspect (the idle
        // probes after it go at the 20 ms idle interval, past the run).
        for answered in [2, 3] {
            let (probes, suspect) = backup_probed(answered);
            assert_eq!(suspect, None, "answered at ask {answered}: {probes:?}");
        }
    }

    #[test]
    fn an_answer_to_a_probe_sent_before_the_silence_is_no_evidence() {
        let config = Config::default();
        let mut paths = Paths::new(Instant::ZERO);
        paths.set_rails(Instant::ZERO, &[0, 1]);
        paths.set_rto(MS);
        // Both idle past the probe interval: both probed at 20 ms.
        let idle = Instant::ZERO + 20 * MS;
        paths.on_timer(idle, &config, |_| {});
        for rail in [0, 1] {
            assert_eq!(paths.take_control(idle, &config, false), Some((rail, Control::Probe)));
            paths.on_sent(idle, rail, 0, 0, true);
        }
        assert_eq!(paths.on_receive(idle + MS / 10, 0, false, false, true), None);
        // Data over rail 0, then rail 1's answer to the earlier probe: it
        // arrives after the data went but says nothing of the peer since.
        let sent = idle + MS / 5;
        for _ in 0..JUDGED_ON {
            paths.on_sent(sent, 0, 1, 0, true);
        }
        assert_eq!(paths.on_receive(sent + MS / 10, 1, false, false, true), None);
        let mut changes = Vec::new();
        paths.on_timer(sent + 2 * MS, &config, |t| changes.push(t));
        assert!(changes.is_empty(), "judged on an answer from before the silence: {changes:?}");
        assert_eq!(
            paths.take_control(sent + 2 * MS, &config, true),
            Some((1, Control::Probe)),
            "rail 1 asked anew"
        );
    }

    #[test]
    fn every_path_silent_past_down_goes_down_together() {
        let config = Config::default();
        let sent = Instant::ZERO + MS;
        let mut paths = streaming(sent, MS);
        let asked = sent + 2 * MS;
        paths.on_timer(asked, &config, |_| {});
        assert_eq!(paths.take_control(asked, &config, true), Some((1, Control::Probe)));
        paths.on_sent(asked, 1, 0, 0, true);
        let mut changes = Vec::new();
        paths.on_timer(asked + (5 * MS - Duration::from_nanos(1)), &config, |t| changes.push((t.rail, t.to)));
        assert!(changes.is_empty(), "rail 1 was not silent past 5 ms yet: {changes:?}");
        paths.on_timer(asked + 5 * MS, &config, |t| changes.push((t.rail, t.to)));
        assert_eq!(changes, [(0, PathState::Down), (1, PathState::Down)]);
        assert!(!paths.other_usable(0));
    }
}
