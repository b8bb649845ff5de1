//! Ordered multicast in a group, with virtual synchrony (docs/CLUSTER.md,
//! "Groups"; Birman and Joseph's Isis, as Spread and Derecho keep it
//! today): every member of a group's view delivers the same messages in
//! the same order, and a member that survives into the next view has
//! delivered exactly what every other survivor delivered in the last.
//!
//! Who is in a group is part of the cluster's view (`View::groups`), so
//! group views come from the managers' log like every other change. The
//! sequencer of a group view is its lowest member: members submit their
//! messages to it (SUBMIT), it numbers what it received since its last
//! turn and sends it to every member as one batch (ORDER). When a view
//! changes the group, every member of the new view reports where it
//! stands and what it holds (FLUSH) to the new view's sequencer, which
//! sends each what it lacks and the order to install the new view
//! (FLUSHED). Messages a survivor delivered are held until the sequencer
//! says every member has them (`stable`), and the tails of views a member
//! ended are held until every member of the next one installed it
//! (`settled`), so a flush that a second change interrupts still finds
//! them.
//!
//! Sans-IO: envelopes in and out as `Bytes` on the reliable stream's layer
//! channel (FIFO and exactly once between two live nodes), views in,
//! deliveries and views out.

use std::collections::{BTreeMap, VecDeque};
use std::ops::Bound::{Excluded, Unbounded};

use bytes::Bytes;
use core::time::Duration;
use tether_proto::{Instant, MessagePool, NodeId};

use crate::group_wire::{Envelope, GroupId, Ordered, Segment};
use crate::member::View;

/// Groups a node takes part in or is told of by its peers, at most.
pub const MAX_GROUPS: usize = 1_024;
/// Ended views' tails a member keeps at most (a change during a flush
/// during a flush ...); past it the oldest goes, counted.
const MAX_HISTORY: usize = 16;

/// How a node's groups run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupsConfig {
    /// Messages a member may have submitted to a group and not yet seen
    /// delivered.
    pub max_unconfirmed: usize,
    /// And their bytes.
    pub max_unconfirmed_bytes: usize,
    /// Most bytes of messages in one ORDER.
    pub batch_bytes: usize,
    /// How often a member tells the sequencer how far it delivered.
    pub report_every: Duration,
    /// How far the sequencer numbers past what every member has: the
    /// bound on what each member holds.
    pub max_unstable: u64,
}

impl Default for GroupsConfig {
    fn default() -> Self {
        GroupsConfig {
            max_unconfirmed: 16_384,
            max_unconfirmed_bytes: 16 << 20,
            batch_bytes: 256 << 10,
            report_every: Duration::from_millis(1),
            max_unstable: 65_536,
        }
    }
}

/// A message delivered in a group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupMessage {
    pub group: GroupId,
    /// The group view it was delivered in.
    pub epoch: u64,
    /// Its place in that view's order, from 1.
    pub seq: u64,
    pub from: NodeId,
    /// The sender's own number for it (`Groups::submit`'s): each of a
    /// sender's messages to a group has its own, growing, across its
    /// leaving and joining again.
    pub n: u64,
    pub message: Bytes,
}

/// What a member of a group learns, in the order it happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GroupOutput {
    Delivered(GroupMessage),
    /// A new view of the group: what follows was delivered in it.
    View {
        group: GroupId,
        epoch: u64,
        members: Vec<NodeId>,
    },
    /// This node is no longer in the group; the messages it submitted
    /// that were not delivered (their numbers) never will be.
    Left {
        group: GroupId,
        undelivered: Vec<u64>,
    },
}

/// Why a message was not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum GroupError {
    #[error("not a member of group {0}")]
    NotMember(GroupId),
    #[error("too many messages to group {0} not yet delivered; try again as they are")]
    Full(GroupId),
}

/// A node's group counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GroupStats {
    pub submitted: u64,
    /// Messages this node numbered as a sequencer.
    pub ordered: u64,
    pub delivered: u64,
    /// Messages submitted again in a new view (not delivered in theirs).
    pub resubmitted: u64,
    /// Views installed after a flush.
    pub flushes: u64,
    /// Envelopes of an older view, or of one not installed here: normal
    /// around a view change.
    pub stale: u64,
    /// Envelopes refused: malformed, from a node with no such role, out of
    /// order.
    pub refused: u64,
    /// Messages a flush should have had and no survivor held, and tails
    /// past `MAX_HISTORY` let go: each would be a broken promise.
    pub gaps: u64,
}

#[derive(Debug, Clone)]
struct Report {
    target: u64,
    installed: u64,
    delivered: u64,
    history: Vec<Segment>,
}

#[derive(Debug, Default)]
struct Sequencer {
    /// Submitted, waiting for a number: past `max_unstable` they wait.
    waiting: VecDeque<Ordered>,
    next: u64,
    /// Numbered and not yet sent (nor delivered here).
    batch: Vec<Ordered>,
    /// How far each member says it delivered.
    delivered: BTreeMap<NodeId, u64>,
    stable: u64,
    settled: bool,
    /// What the members were last told.
    told: (u64, bool),
}

#[derive(Debug, Default)]
struct Group {
    id: GroupId,
    /// The view deliveries are of: (epoch, members, lowest first).
    installed: Option<(u64, Vec<NodeId>)>,
    delivered: u64,
    /// Delivered in the installed view and not yet stable.
    held: VecDeque<Ordered>,
    /// Ended views' tails, until the installed view is settled.
    history: Vec<Segment>,
    /// The view being installed, while its flush runs.
    flushing: Option<(u64, Vec<NodeId>)>,
    /// As the next view's sequencer: the members' reports.
    reports: BTreeMap<NodeId, Report>,
    sequencer: Option<Sequencer>,
    next_n: u64,
    unconfirmed: VecDeque<(u64, Bytes)>,
    unconfirmed_bytes: usize,
    reported: u64,
    last_report: Option<Instant>,
}

impl Group {
    fn sequencer_of(members: &[NodeId]) -> Option<NodeId> {
        members.first().copied()
    }

    /// Where submits go now: the installed view's sequencer, unless a
    /// flush runs (they wait for the new view).
    fn submit_to(&self) -> Option<NodeId> {
        match (&self.installed, &self.flushing) {
            (Some((_, m)), None) => Self::sequencer_of(m),
            _ => None,
        }
    }
}

/// What a flush's sequencer learns of one view from the reports.
#[derive(Debug, Default)]
struct Stretch {
    members: Vec<NodeId>,
    /// Where it ended, if a member installed a later view.
    ended: Option<u64>,
    /// How far the members still in it delivered, at most.
    reached: u64,
    /// Its messages held by any member.
    held: BTreeMap<u64, Ordered>,
}

impl Stretch {
    /// Its last message: where it ended, or the furthest any member that
    /// is still in it got.
    fn last(&self) -> u64 {
        self.ended.unwrap_or(self.reached)
    }
}

/// One node's groups.
pub struct Groups {
    me: NodeId,
    config: GroupsConfig,
    pool: MessagePool,
    groups: BTreeMap<GroupId, Group>,
    out: VecDeque<(NodeId, Bytes)>,
    /// Envelopes for this very node (it is its own sequencer).
    local: VecDeque<Bytes>,
    outputs: VecDeque<GroupOutput>,
    stats: GroupStats,
    /// The last number this node gave its messages to each group it left,
    /// so one that joins again numbers on (at most `MAX_GROUPS` kept).
    numbers: BTreeMap<GroupId, u64>,
}

impl core::fmt::Debug for Groups {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Groups").field("me", &self.me).field("groups", &self.groups.len()).finish()
    }
}

impl Groups {
    /// Node `me`'s groups; envelopes are built in `pool`'s buffers.
    pub fn new(me: NodeId, config: GroupsConfig, pool: MessagePool) -> Self {
        Groups {
            me,
            config,
            pool,
            groups: BTreeMap::new(),
            out: VecDeque::new(),
            local: VecDeque::new(),
            outputs: VecDeque::new(),
            stats: GroupStats::default(),
            numbers: BTreeMap::new(),
        }
    }

    pub fn stats(&self) -> GroupStats {
        self.stats
    }

    /// The view of `group` this node delivers in, if it is a member.
    pub fn view(&self, group: GroupId) -> Option<(u64, &[NodeId])> {
        self.groups.get(&group)?.installed.as_ref().map(|(e, m)| (*e, m.as_slice()))
    }

    /// Messages this node submitted to `group` and has not yet seen
    /// delivered.
    pub fn undelivered(&self, group: GroupId) -> usize {
        self.groups.get(&group).map_or(0, |g| g.unconfirmed.len())
    }

    /// The next delivery or view, in order.
    pub fn poll_output(&mut self) -> Option<GroupOutput> {
        self.outputs.pop_front()
    }

    pub fn has_output(&self) -> bool {
        !self.outputs.is_empty()
    }

    /// The next envelope to send, and to whom (on the layer channel).
    pub fn poll_send(&mut self) -> Option<(NodeId, Bytes)> {
        self.out.pop_front()
    }

    /// Put back an envelope the stream had no room for: it goes first.
    pub fn unsend(&mut self, to: NodeId, envelope: Bytes) {
        self.out.push_front((to, envelope));
    }

    /// Multicast `message` to `group`: delivered to every member of the
    /// view it is ordered in, in one order. Its number among this node's
    /// messages to the group (`GroupMessage::n`).
    pub fn submit(&mut self, group: GroupId, message: Bytes) -> Result<u64, GroupError> {
        let g = self.groups.get_mut(&group).ok_or(GroupError::NotMember(group))?;
        let member = |v: &Option<(u64, Vec<NodeId>)>| v.as_ref().is_some_and(|(_, m)| m.contains(&self.me));
        if !member(&g.installed) && !member(&g.flushing) {
            return Err(GroupError::NotMember(group));
        }
        if g.unconfirmed.len() >= self.config.max_unconfirmed
            || g.unconfirmed_bytes + message.len() > self.config.max_unconfirmed_bytes
        {
            return Err(GroupError::Full(group));
        }
        g.next_n += 1;
        let n = g.next_n;
        g.unconfirmed_bytes += message.len();
        g.unconfirmed.push_back((n, message.clone()));
        self.stats.submitted += 1;
        if let (Some(to), Some((epoch, _))) = (g.submit_to(), &g.installed) {
            let env = Envelope::Submit { group, epoch: *epoch, n, message };
            self.post(to, &env);
        }
        Ok(n)
    }

    /// The cluster's view changed (or was first learned): start the flush
    /// of every group whose members changed, leave those this node is no
    /// longer in.
    pub fn on_view(&mut self, view: &View) {
        let me = self.me;
        let left: Vec<GroupId> = self
            .groups
            .keys()
            .copied()
            .filter(|id| !view.groups.get(id).is_some_and(|(_, m)| m.contains(&me)))
            .collect();
        for id in left {
            let was_in = self.groups.get(&id).is_some_and(|g| g.installed.is_some() || g.flushing.is_some());
            // A group only peers' reports told of stays, for the view
            // that makes this node a member.
            if was_in {
                let g = self.groups.remove(&id).expect("the group");
                if self.numbers.len() < MAX_GROUPS || self.numbers.contains_key(&id) {
                    self.numbers.insert(id, g.next_n);
                }
                let undelivered = g.unconfirmed.iter().map(|(n, _)| *n).collect();
                self.outputs.push_back(GroupOutput::Left { group: id, undelivered });
            }
        }
        for (&id, (since, members)) in &view.groups {
            if !members.contains(&self.me) {
                continue;
            }
            if !self.groups.contains_key(&id) && self.groups.len() >= MAX_GROUPS {
                self.stats.refused += 1;
                continue;
            }
            let next_n = self.numbers.get(&id).copied().unwrap_or(0);
            let g = self.groups.entry(id).or_insert_with(|| Group { id, next_n, ..Group::default() });
            let current = g.flushing.as_ref().or(g.installed.as_ref()).map(|(e, _)| *e);
            if current.is_some_and(|e| e >= *since) {
                continue;
            }
            self.start_flush(id, *since, members.clone());
        }
    }

    fn start_flush(&mut self, id: GroupId, target: u64, members: Vec<NodeId>) {
        let me = self.me;
        let g = self.groups.get_mut(&id).expect("the group");
        g.flushing = Some((target, members.clone()));
        // What was numbered and not yet sent is delivered nowhere: its
        // senders submit it again in the new view.
        g.sequencer = None;
        g.reports.retain(|_, r| r.target >= target);
        let mut history = g.history.clone();
        let (installed, delivered) = match &g.installed {
            Some((e, m)) => {
                let entries: Vec<Ordered> = g.held.iter().cloned().collect();
                history.push(Segment { epoch: *e, members: m.clone(), last: u64::MAX, entries });
                (*e, g.delivered)
            }
            None => (0, 0),
        };
        let env = Envelope::Flush { group: id, target, installed, delivered, history };
        let to = Group::sequencer_of(&members).unwrap_or(me);
        self.post(to, &env);
    }

    /// When a pump is next due (a report of how far this node delivered).
    pub fn poll_timeout(&self) -> Option<Instant> {
        let window = self.config.max_unstable;
        let numbering = |s: &Sequencer| !s.waiting.is_empty() && s.next - s.stable < window;
        if self.groups.values().any(|g| g.sequencer.as_ref().is_some_and(numbering)) {
            return Some(Instant::ZERO);
        }
        self.groups
            .values()
            .filter(|g| g.installed.is_some() && g.flushing.is_none() && g.reported != g.delivered)
            .map(|g| g.last_report.map_or(Instant::ZERO, |t| t + self.config.report_every))
            .min()
    }

    /// Take in an envelope from `from` (the stream proved it).
    pub fn on_envelope(&mut self, from: NodeId, bytes: Bytes) {
        match Envelope::parse(bytes) {
            Ok(env) => self.handle(from, env),
            Err(_) => self.stats.refused += 1,
        }
        self.run_local();
    }

    /// Run what is due: the sequencers' batches and the members' reports.
    pub fn pump(&mut self, now: Instant) {
        self.run_local();
        // Group by group without collecting their ids: this runs at every
        // step of the endpoint.
        let mut next = self.groups.keys().next().copied();
        while let Some(id) = next {
            self.send_batch(id);
            self.report(id, now);
            next = self.groups.range((Excluded(id), Unbounded)).next().map(|(&k, _)| k);
        }
        self.run_local();
    }

    fn run_local(&mut self) {
        // Bounded: each local envelope makes at most a few more.
        for _ in 0..4_096 {
            let Some(b) = self.local.pop_front() else { break };
            match Envelope::parse(b) {
                Ok(env) => self.handle(self.me, env),
                Err(_) => self.stats.refused += 1,
            }
        }
    }

    fn post(&mut self, to: NodeId, env: &Envelope) {
        let bytes = self.encode(env);
        self.post_bytes(to, bytes);
    }

    fn encode(&self, env: &Envelope) -> Bytes {
        let mut buf = self.pool.take(env.encoded_len());
        env.encode(&mut buf);
        self.pool.seal(buf)
    }

    /// An envelope already encoded: one encoding for every member an
    /// ORDER goes to, each holding the same bytes.
    fn post_bytes(&mut self, to: NodeId, bytes: Bytes) {
        if to == self.me {
            self.local.push_back(bytes);
        } else {
            self.out.push_back((to, bytes));
        }
    }

    fn handle(&mut self, from: NodeId, env: Envelope) {
        let me = self.me;
        let id = env.group();
        if matches!(env, Envelope::Flush { .. }) && !self.groups.contains_key(&id) {
            // A member that learned the new view before this node did
            // reports to it as the new view's sequencer: kept for when it
            // learns it too.
            if self.groups.len() >= MAX_GROUPS {
                self.stats.refused += 1;
                return;
            }
            self.groups.insert(id, Group { id, ..Group::default() });
        }
        let Some(g) = self.groups.get_mut(&id) else {
            self.stats.stale += 1;
            return;
        };
        match env {
            Envelope::Submit { epoch, n, message, .. } => {
                let ok = g.installed.as_ref().is_some_and(|(e, m)| *e == epoch && m.contains(&from));
                match &mut g.sequencer {
                    Some(s) if ok => s.waiting.push_back(Ordered { seq: 0, sender: from, n, message }),
                    _ => self.stats.stale += 1,
                }
            }
            Envelope::Order { epoch, stable, settled, entries, .. } => {
                let Some((e, members)) = &g.installed else {
                    self.stats.stale += 1;
                    return;
                };
                if *e != epoch || g.flushing.is_some() {
                    // Past the flush's report: the survivors agree on what
                    // ends the view, and this is not part of it.
                    self.stats.stale += 1;
                    return;
                }
                if Group::sequencer_of(members) != Some(from) {
                    self.stats.refused += 1;
                    return;
                }
                let epoch = *e;
                for o in entries {
                    Self::deliver(g, epoch, o, me, &mut self.outputs, &mut self.stats);
                }
                while g.held.front().is_some_and(|o| o.seq <= stable) {
                    g.held.pop_front();
                }
                if settled {
                    g.history.clear();
                }
            }
            Envelope::Stable { epoch, delivered, .. } => {
                let ok = g.installed.as_ref().is_some_and(|(e, m)| *e == epoch && m.contains(&from));
                match &mut g.sequencer {
                    Some(s) if ok => {
                        let d = s.delivered.entry(from).or_default();
                        *d = (*d).max(delivered);
                    }
                    _ => self.stats.stale += 1,
                }
            }
            Envelope::Flush { target, installed, delivered, history, .. } => {
                let for_me = g.flushing.as_ref().is_none_or(|(t, m)| *t != target || m.first() == Some(&me));
                if !for_me {
                    self.stats.refused += 1;
                    return;
                }
                if g.reports.get(&from).is_some_and(|r| r.target > target) {
                    self.stats.stale += 1;
                    return;
                }
                g.reports.insert(from, Report { target, installed, delivered, history });
                self.conclude(id, target);
            }
            Envelope::Flushed { target, segments, .. } => {
                let Some((t, members)) = &g.flushing else {
                    self.stats.stale += 1;
                    return;
                };
                if *t != target {
                    self.stats.stale += 1;
                    return;
                }
                if Group::sequencer_of(members) != Some(from) {
                    self.stats.refused += 1;
                    return;
                }
                let target = (*t, members.clone());
                self.install(id, segments, target);
            }
        }
    }

    fn deliver(
        g: &mut Group,
        epoch: u64,
        o: Ordered,
        me: NodeId,
        outputs: &mut VecDeque<GroupOutput>,
        stats: &mut GroupStats,
    ) {
        if o.seq <= g.delivered {
            return;
        }
        if o.seq != g.delivered + 1 {
            stats.gaps += 1;
            return;
        }
        g.delivered = o.seq;
        if o.sender == me {
            while g.unconfirmed.front().is_some_and(|(n, _)| *n <= o.n) {
                let (_, m) = g.unconfirmed.pop_front().expect("a front");
                g.unconfirmed_bytes -= m.len();
            }
        }
        stats.delivered += 1;
        outputs.push_back(GroupOutput::Delivered(GroupMessage {
            group: g.id,
            epoch,
            seq: o.seq,
            from: o.sender,
            n: o.n,
            message: o.message.clone(),
        }));
        g.held.push_back(o);
    }

    /// As the sequencer of the view being installed: once every member
    /// reported, send each what it lacks and the order to install.
    fn conclude(&mut self, id: GroupId, target: u64) {
        let g = self.groups.get_mut(&id).expect("the group");
        let Some((t, members)) = g.flushing.clone() else { return };
        if t != target || members.first() != Some(&self.me) {
            return;
        }
        if !members.iter().all(|m| g.reports.get(m).is_some_and(|r| r.target == target)) {
            return;
        }
        // Every view any member holds a stretch of.
        let mut views: BTreeMap<u64, Stretch> = BTreeMap::new();
        for r in g.reports.values() {
            for s in &r.history {
                let v = views
                    .entry(s.epoch)
                    .or_insert_with(|| Stretch { members: s.members.clone(), ..Stretch::default() });
                if s.last != u64::MAX {
                    v.ended = Some(s.last);
                }
                for e in &s.entries {
                    v.held.entry(e.seq).or_insert_with(|| e.clone());
                }
            }
            if let Some(v) = views.get_mut(&r.installed) {
                v.reached = v.reached.max(r.delivered);
            }
        }
        let mut sends = Vec::new();
        for &m in &members {
            let r = &g.reports[&m];
            let mut segments = Vec::new();
            // A member that never installed a view it was in (its flush
            // overtaken by a second change) goes through it from its
            // start: its stability was never reported, so nobody let go
            // of that view's messages.
            let start = match r.installed {
                // The start of its latest unbroken stretch of views.
                0 => views.iter().rev().take_while(|(_, v)| v.members.contains(&m)).last().map(|(&e, _)| e),
                e => Some(e),
            };
            if let Some(start) = start {
                for (&epoch, v) in views.range(start..) {
                    let from = if epoch == r.installed { r.delivered } else { 0 };
                    let last = v.last();
                    let entries: Vec<Ordered> = if from < last {
                        v.held.range(from + 1..=last).map(|(_, o)| o.clone()).collect()
                    } else {
                        Vec::new()
                    };
                    if entries.len() as u64 != last.saturating_sub(from) {
                        self.stats.gaps += 1;
                    }
                    segments.push(Segment { epoch, members: v.members.clone(), last, entries });
                }
            }
            segments.push(Segment { epoch: target, members: members.clone(), last: 0, entries: Vec::new() });
            sends.push((m, Envelope::Flushed { group: id, target, segments }));
        }
        g.reports.clear();
        for (m, env) in sends {
            self.post(m, &env);
        }
    }

    /// Deliver what ends the views before `segments`' last, then install
    /// `target`, the view this node learned from the managers (the last
    /// segment names it; its members are this node's own word, never the
    /// envelope's).
    fn install(&mut self, id: GroupId, mut segments: Vec<Segment>, target: (u64, Vec<NodeId>)) {
        let me = self.me;
        let g = self.groups.get_mut(&id).expect("the group");
        // Views in increasing epochs, none before the one installed here,
        // the target last.
        let installed = g.installed.as_ref().map_or(0, |(e, _)| *e);
        let ordered = segments.windows(2).all(|w| w[0].epoch < w[1].epoch);
        let from_here = segments.first().is_some_and(|s| s.epoch >= installed);
        match segments.last_mut() {
            Some(last) if last.epoch == target.0 && ordered && from_here => last.members = target.1,
            _ => {
                self.stats.refused += 1;
                return;
            }
        }
        let n = segments.len();
        for (i, s) in segments.into_iter().enumerate() {
            if g.installed.as_ref().map(|(e, _)| *e) != Some(s.epoch) {
                // The view held ends here; its tail is kept until the next
                // one is settled (a flush that a second change interrupts
                // needs it).
                if let Some((e, m)) = g.installed.take() {
                    let entries: Vec<Ordered> = g.held.drain(..).collect();
                    g.history.push(Segment { epoch: e, members: m, last: g.delivered, entries });
                }
                g.installed = Some((s.epoch, s.members.clone()));
                g.delivered = 0;
                self.outputs.push_back(GroupOutput::View { group: id, epoch: s.epoch, members: s.members });
            }
            if i + 1 == n {
                break;
            }
            for o in s.entries {
                Self::deliver(g, s.epoch, o, me, &mut self.outputs, &mut self.stats);
            }
            if g.delivered != s.last {
                self.stats.gaps += 1;
            }
        }
        while g.history.len() > MAX_HISTORY {
            g.history.remove(0);
            self.stats.gaps += 1;
        }
        g.flushing = None;
        g.reported = 0;
        g.last_report = None;
        self.stats.flushes += 1;
        let Some((epoch, members)) = g.installed.clone() else { return };
        if members.first() == Some(&me) {
            g.sequencer = Some(Sequencer::default());
        }
        // What this node sent and nobody delivered goes again, in order.
        let again: Vec<(u64, Bytes)> = g.unconfirmed.iter().cloned().collect();
        for (n, message) in again {
            self.stats.resubmitted += 1;
            self.post(members[0], &Envelope::Submit { group: id, epoch, n, message });
        }
    }

    /// As a sequencer: send what was numbered since the last turn, and
    /// what became stable.
    fn send_batch(&mut self, id: GroupId) {
        let me = self.me;
        let batch_bytes = self.config.batch_bytes;
        let Some(g) = self.groups.get_mut(&id) else { return };
        let Some((epoch, members)) = &g.installed else { return };
        let epoch = *epoch;
        let Some(s) = &mut g.sequencer else { return };
        s.delivered.insert(me, g.delivered.max(s.delivered.get(&me).copied().unwrap_or(0)));
        let stable = members.iter().map(|m| s.delivered.get(m).copied().unwrap_or(0)).min().unwrap_or(0);
        let settled = members.iter().all(|m| s.delivered.contains_key(m));
        s.stable = stable;
        s.settled = settled;
        while s.next - stable < self.config.max_unstable {
            let Some(mut o) = s.waiting.pop_front() else { break };
            s.next += 1;
            o.seq = s.next;
            s.batch.push(o);
            self.stats.ordered += 1;
        }
        if s.batch.is_empty() && s.told == (stable, settled) {
            return;
        }
        s.told = (stable, settled);
        let mut batch = std::mem::take(&mut s.batch);
        let mut envs = Vec::new();
        // Split at `batch_bytes`; an empty batch still carries stability.
        loop {
            let mut bytes = 0;
            let take = batch.iter().take_while(|o| {
                bytes += o.message.len();
                bytes <= batch_bytes
            });
            let k = take.count().max(1).min(batch.len());
            let rest = batch.split_off(k);
            envs.push(Envelope::Order { group: id, epoch, stable, settled, entries: batch });
            batch = rest;
            if batch.is_empty() {
                break;
            }
        }
        // The members only now that something goes to them.
        let members = members.clone();
        for env in envs {
            let bytes = self.encode(&env);
            for &m in &members {
                self.post_bytes(m, bytes.clone());
            }
        }
    }

    /// As a member: tell the sequencer how far this node delivered.
    fn report(&mut self, id: GroupId, now: Instant) {
        let every = self.config.report_every;
        let Some(g) = self.groups.get_mut(&id) else { return };
        let (Some((epoch, members)), None) = (&g.installed, &g.flushing) else { return };
        if g.reported == g.delivered && g.last_report.is_some() {
            return;
        }
        if g.last_report.is_some_and(|t| now < t + every) {
            return;
        }
        g.reported = g.delivered;
        g.last_report = Some(now);
        let env = Envelope::Stable { group: id, epoch: *epoch, delivered: g.delivered };
        let to = members[0];
        self.post(to, &env);
    }
}
