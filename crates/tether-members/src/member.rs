//! One member of the cluster (docs/CLUSTER.md, "Roles" and "Failure
//! detection"): it sends a heartbeat to its observers every period,
//! watches its subjects with a detector each, probes a subject it
//! suspects, and raises an alert with the managers about one that does
//! not answer. A suspect refutes the suspicion itself, by a heartbeat or
//! by answering the probe. Li et al. [CI] section 6: heartbeats as
//! unreliable messages, a node suspected only after two consecutive
//! heartbeats are missing or late, then probed.
//!
//! Sans-IO: the driver hands in time and messages, and takes out what to
//! send ([`Member::poll_send`]) and what happened ([`Member::poll_event`]).

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use core::time::Duration;

use tether_proto::{Instant, NodeId};

use crate::detector::{Detector, DetectorKind, Lateness};
use crate::rings::Neighbourhood;
use crate::wire::{Change, GroupId, Msg, ViewChange};

/// Heartbeat turns between two pulls of the view from a neighbour,
/// whatever happened: nobody answers a member that is up to date.
const PULL_EVERY: u64 = 10;
/// View changes a member keeps to answer its neighbours' pulls (docs/
/// CLUSTER.md, "Views": changes spread member to member, epidemically,
/// so no node's load grows with the cluster). A neighbour further behind
/// asks a manager.
pub const KEEP_CHANGES: usize = 1 << 14;
/// Changes one pull is answered with at most; the member pulls again.
const PULL_BATCH: usize = 64;
/// How far past its view a member keeps changes that came early.
const AHEAD: usize = 4 * PULL_BATCH;

/// The latest view changes a node applied, in epoch order, at most
/// `cap`: a replica's, to answer members' pulls, and a member's, to
/// answer its neighbours'.
#[derive(Debug, Clone)]
pub struct ChangeLog {
    changes: VecDeque<ViewChange>,
    cap: usize,
}

impl ChangeLog {
    pub fn new(cap: usize) -> Self {
        ChangeLog { changes: VecDeque::new(), cap: cap.max(1) }
    }

    /// Keep `change`, the one after the last kept, forgetting the oldest
    /// past the bound.
    pub fn push(&mut self, change: ViewChange) {
        if self.changes.len() == self.cap {
            self.changes.pop_front();
        }
        self.changes.push_back(change);
    }

    pub fn clear(&mut self) {
        self.changes.clear();
    }

    /// The change that made view `epoch`, if kept.
    pub fn get(&self, epoch: u64) -> Option<ViewChange> {
        let first = self.changes.front()?.epoch;
        self.changes.get(epoch.checked_sub(first)? as usize).copied()
    }

    /// Whether the changes kept begin at or before the one after `have`.
    pub fn reaches(&self, have: u64) -> bool {
        self.changes.front().is_some_and(|c| c.epoch <= have + 1)
    }

    /// The changes after view `have`, at most `n` (from the oldest kept if
    /// `have` is further behind).
    pub fn after(&self, have: u64, n: usize) -> impl Iterator<Item = ViewChange> + '_ {
        let first = self.changes.front().map_or(0, |c| c.epoch);
        let skip = ((have + 1).saturating_sub(first) as usize).min(self.changes.len());
        self.changes.range(skip..).take(n).copied()
    }
}

/// How a member watches and is watched.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MemberConfig {
    /// Time between two heartbeats to each observer.
    pub period: Duration,
    /// The rule that decides suspicion.
    pub detector: DetectorKind,
    /// How long a suspect has to answer its probe before the alert.
    pub probe_timeout: Duration,
    /// Observers per member (the rings laid over the view).
    pub observers: u32,
}

impl MemberConfig {
    /// Heartbeats every `period`, the seed's two-miss rule, a probe
    /// answered within two periods, three observers. The probe's time
    /// must outlast an outage of two periods that struck everyone at once
    /// (the simulator's membership mix): at one and a half periods it
    /// removed live members in 93 runs of 1,000, at two in none.
    pub fn new(period: Duration) -> Self {
        MemberConfig {
            period,
            detector: DetectorKind::two_miss(period),
            probe_timeout: period * 2,
            observers: 3,
        }
    }
}

/// Groups a member may ask to be in at once.
pub const MAX_GROUPS: usize = 1_024;

/// A view of the cluster: its epoch, its members with their incarnations,
/// and its groups, as the managers decided it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct View {
    /// Grows by one with each change.
    pub epoch: u64,
    /// (node, incarnation), sorted by node.
    pub members: Vec<(NodeId, u64)>,
    /// Each group with a member: the epoch its members last changed (the
    /// group view's epoch) and its members, sorted.
    pub groups: BTreeMap<GroupId, (u64, Vec<NodeId>)>,
    /// The manager replicas, sorted: the founders until a replica is
    /// replaced. Members take view changes only from these.
    pub replicas: Vec<NodeId>,
}

impl View {
    /// The incarnation `node` is a member in, if it is one.
    pub fn incarnation_of(&self, node: NodeId) -> Option<u64> {
        self.members.binary_search_by_key(&node, |m| m.0).ok().map(|i| self.members[i].1)
    }

    /// The members of `group`, sorted (empty: no such group).
    pub fn group(&self, group: GroupId) -> &[NodeId] {
        self.groups.get(&group).map_or(&[], |(_, m)| m.as_slice())
    }

    /// Apply `change`, the one after this view's epoch; false (and no
    /// change) for any other epoch. Replicas and members apply the same
    /// changes with this one function, so their views cannot differ.
    pub fn apply(&mut self, change: ViewChange) -> bool {
        if change.epoch != self.epoch + 1 {
            return false;
        }
        let (node, epoch) = (change.node, change.epoch);
        let at = self.members.binary_search_by_key(&node, |m| m.0);
        match (at, change.change) {
            // A replica is removed once the view has lost it, and its
            // replacement is a member: neither asks whether it is in.
            (_, Change::ReplicaAdded) => {
                if let Err(j) = self.replicas.binary_search(&node) {
                    self.replicas.insert(j, node);
                }
            }
            (_, Change::ReplicaRemoved) => self.replicas.retain(|&r| r != node),
            (Ok(i), Change::Joined(inc)) => {
                // A later life: the groups were the earlier one's.
                if self.members[i].1 != inc {
                    self.leave_groups(node, epoch);
                }
                self.members[i].1 = inc;
            }
            (Err(i), Change::Joined(inc)) => self.members.insert(i, (node, inc)),
            (Ok(i), Change::Left) => {
                self.members.remove(i);
                self.leave_groups(node, epoch);
            }
            (Ok(_), Change::JoinedGroup(g)) => {
                let (since, members) = self.groups.entry(g).or_default();
                if let Err(j) = members.binary_search(&node) {
                    members.insert(j, node);
                    *since = epoch;
                }
            }
            (Ok(_), Change::LeftGroup(g)) => {
                if let Some((since, members)) = self.groups.get_mut(&g) {
                    if let Ok(j) = members.binary_search(&node) {
                        members.remove(j);
                        *since = epoch;
                    }
                }
                self.groups.retain(|_, (_, m)| !m.is_empty());
            }
            (Err(_), _) => {}
        }
        self.epoch = epoch;
        true
    }

    fn leave_groups(&mut self, node: NodeId, epoch: u64) {
        for (since, members) in self.groups.values_mut() {
            if let Ok(j) = members.binary_search(&node) {
                members.remove(j);
                *since = epoch;
            }
        }
        self.groups.retain(|_, (_, m)| !m.is_empty());
    }
}

/// What a member noticed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemberEvent {
    /// `subject` went quiet past the detector's patience: probed.
    Suspected { subject: NodeId, at: Instant },
    /// `subject` showed it is alive while suspected.
    Refuted { subject: NodeId, at: Instant },
    /// `subject` did not answer its probe: the managers are told.
    Alerted { subject: NodeId, at: Instant },
    /// `from` holds a newer view than this member's.
    NewerView { from: NodeId, epoch: u64 },
    /// A new view: take it with [`Member::view`].
    ViewChanged { epoch: u64 },
    /// A view left this member out while it lives (its observers took it
    /// for dead): it joins again in a new incarnation.
    Removed { epoch: u64, rejoins_as: u64 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Trusted,
    /// Probed since `since`, the last probe sent at `sent`.
    Probing {
        nonce: u64,
        since: Instant,
        sent: Instant,
    },
    /// Alerted; the alert goes again every period until a manager
    /// acknowledges it.
    Alerted {
        since: Instant,
        acknowledged: bool,
        sent: Instant,
    },
}

#[derive(Debug, Clone)]
struct Watch {
    incarnation: u64,
    detector: Detector,
    state: State,
}

/// One member's side of the membership protocol.
#[derive(Debug)]
pub struct Member {
    me: NodeId,
    incarnation: u64,
    config: MemberConfig,
    view: View,
    /// This member's neighbours on the view's rings, moved with each
    /// change.
    rings: Neighbourhood,
    observers: Vec<NodeId>,
    subjects: BTreeMap<NodeId, Watch>,
    managers: Vec<NodeId>,
    next_turn: Instant,
    lateness: Lateness,
    seq: u64,
    nonces: u64,
    out: VecDeque<(NodeId, Msg)>,
    events: VecDeque<MemberEvent>,
    /// Asking to join: until a view holds this member's incarnation.
    joining: bool,
    /// The last VIEW_PULL sent: at most one a period.
    pulled: Option<Instant>,
    /// The view the latest pull asked after.
    pulled_after: u64,
    /// The newest epoch heard of (a heartbeat's, a change's), and from
    /// whom: a member behind it pulls every period until it catches up.
    newest: (u64, NodeId),
    /// Pulls from the managers go to each in turn (one may be dead).
    pulls: usize,
    /// The groups this member wants to be in: asked for every period
    /// until the view agrees.
    wanted: BTreeSet<GroupId>,
    /// The latest changes this member applied, for its neighbours' pulls.
    kept: ChangeLog,
    /// Changes that came before the ones they follow, by epoch (at most
    /// [`AHEAD`] past the view).
    ahead: BTreeMap<u64, ViewChange>,
}

impl Member {
    /// Member `me` in its `incarnation`, starting at `now` with no view.
    pub fn new(me: NodeId, incarnation: u64, config: MemberConfig, now: Instant) -> Self {
        Member {
            me,
            incarnation,
            config,
            view: View::default(),
            rings: Neighbourhood::new(me, [].into_iter(), config.observers),
            observers: Vec::new(),
            subjects: BTreeMap::new(),
            managers: Vec::new(),
            next_turn: now,
            lateness: Lateness::default(),
            seq: 0,
            // Nonces start from the incarnation: a probe answer from
            // another life of this member never matches.
            nonces: incarnation << 32,
            out: VecDeque::new(),
            events: VecDeque::new(),
            joining: false,
            pulled: None,
            pulled_after: 0,
            newest: (0, me),
            pulls: 0,
            wanted: BTreeSet::new(),
            kept: ChangeLog::new(KEEP_CHANGES),
            ahead: BTreeMap::new(),
        }
    }

    /// Ask to be in `group` (from the next turn, a period apart, until a
    /// view holds this member in it, and again after a rejoin). False past
    /// [`MAX_GROUPS`].
    pub fn join_group(&mut self, group: GroupId) -> bool {
        if self.wanted.len() >= MAX_GROUPS && !self.wanted.contains(&group) {
            return false;
        }
        self.wanted.insert(group);
        true
    }

    /// Ask to leave `group`.
    pub fn leave_group(&mut self, group: GroupId) {
        self.wanted.remove(&group);
    }

    /// Ask the managers to join, from the next turn on, a period apart,
    /// until a view holds this member.
    pub fn join(&mut self) {
        self.joining = true;
    }

    /// Is this member in its view, in its incarnation?
    pub fn is_member(&self) -> bool {
        self.view.incarnation_of(self.me) == Some(self.incarnation)
    }

    pub fn node(&self) -> NodeId {
        self.me
    }

    pub fn incarnation(&self) -> u64 {
        self.incarnation
    }

    /// The change that made view `epoch`, if this member applied it and
    /// still keeps it.
    pub fn change_of(&self, epoch: u64) -> Option<ViewChange> {
        self.kept.get(epoch)
    }

    pub fn view(&self) -> &View {
        &self.view
    }

    /// Those this member sends heartbeats to.
    pub fn observers(&self) -> &[NodeId] {
        &self.observers
    }

    /// Those this member watches.
    pub fn subjects(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.subjects.keys().copied()
    }

    /// Where alerts go: the founding replicas (later ones come with the
    /// views that add them).
    pub fn set_managers(&mut self, managers: &[NodeId]) {
        self.managers = managers.to_vec();
        if self.view.epoch == 0 {
            self.view.replicas = managers.to_vec();
            self.view.replicas.sort_unstable();
        }
    }

    /// Take `view` (if newer than the one held) at `now`: the rings are
    /// laid again; a subject kept keeps its detector's history, a new one
    /// starts trusted as of now.
    pub fn set_view(&mut self, view: View, now: Instant) {
        if view.epoch <= self.view.epoch && !self.view.members.is_empty() {
            return;
        }
        // Not made by changes this member applied: none to pass on.
        self.kept.clear();
        self.ahead.clear();
        self.rings = Neighbourhood::new(self.me, view.members.iter().map(|m| m.0), self.config.observers);
        let before = self.view.epoch;
        self.view = view;
        self.watch(before, now);
    }

    /// Watch and be watched as the view (newer than view `before`) lays
    /// the rings: a subject kept keeps its detector's history, a new one
    /// starts trusted as of now.
    fn watch(&mut self, before: u64, now: Instant) {
        self.observers = self.rings.observers();
        // In place: most changes leave a member's subjects as they were.
        let subjects = self.rings.subjects();
        let view = &self.view;
        self.subjects.retain(|s, w| subjects.contains(s) && view.incarnation_of(*s) == Some(w.incarnation));
        for s in subjects {
            let incarnation = view.incarnation_of(s).unwrap_or_default();
            self.subjects.entry(s).or_insert_with(|| Watch {
                incarnation,
                detector: Detector::new(self.config.detector, self.config.period, now),
                state: State::Trusted,
            });
        }
        if view.epoch == before {
            return;
        }
        // An alert raised in an earlier view is checked again in this one:
        // the subject probed anew, the alert raised again if it still does
        // not answer. Raised again at once, an observer cut off with its
        // subject outside re-raised, view after view as it caught up after
        // the cut healed, the alert its cut had made (the simulator's
        // `membership_1000` removed a live member on two of those, seed 7).
        for (&s, w) in &mut self.subjects {
            if let State::Alerted { .. } = w.state {
                self.nonces += 1;
                w.state = State::Probing { nonce: self.nonces, since: now, sent: now };
                self.out.push_back((s, Msg::Probe { nonce: self.nonces }));
            }
        }
    }

    /// When the member next needs a turn, whatever arrives.
    pub fn next_deadline(&self) -> Instant {
        let mut next = self.next_turn;
        for w in self.subjects.values() {
            let due = match w.state {
                State::Trusted => w.detector.deadline() + self.lateness.get(),
                State::Probing { since, sent, .. } => {
                    (since + self.config.probe_timeout + self.lateness.get()).min(sent + self.reprobe())
                }
                State::Alerted { acknowledged: false, sent, .. } => sent + self.config.period,
                State::Alerted { .. } => continue,
            };
            next = next.min(due);
        }
        next
    }

    /// Run what is due at `now`: the heartbeats, and every subject's
    /// detector, probe and alert.
    pub fn turn(&mut self, now: Instant) {
        if now >= self.next_turn {
            // How late this turn is, is how slow this member is.
            self.lateness.turn(self.next_turn, now);
            self.seq += 1;
            let hb = Msg::Heartbeat { incarnation: self.incarnation, epoch: self.view.epoch, seq: self.seq };
            for &o in &self.observers {
                self.out.push_back((o, hb));
            }
            if self.joining {
                for &m in &self.managers {
                    self.out.push_back((m, Msg::Join { incarnation: self.incarnation }));
                }
            } else {
                self.ask_groups();
            }
            if self.newest.0 > self.view.epoch {
                // Behind (joining too: a joiner's own change may come long
                // before the ones it follows).
                self.pull_newer(now);
            } else if !self.joining && self.seq.is_multiple_of(PULL_EVERY) {
                // Anti-entropy: a change announced while this member was
                // cut off, and every heartbeat naming a newer view with it,
                // may all have been lost; a member removed meanwhile would
                // never hear of it otherwise.
                // From a neighbour (its load does not grow with the
                // cluster; a manager only for a member alone): a whole
                // neighbourhood behind hears from the leader, which tells a
                // few members the latest change again every so often.
                let round = (self.seq / PULL_EVERY) as usize;
                // Not a neighbour taken for dead: it would not answer.
                let trusted =
                    self.subjects.iter().filter(|(_, w)| w.state == State::Trusted).map(|(&s, _)| s);
                let neighbours: Vec<NodeId> = self.observers.iter().copied().chain(trusted).collect();
                let whom = match neighbours.len() {
                    0 => self.next_manager(),
                    n => Some(neighbours[round % n]),
                };
                if let Some(m) = whom {
                    self.pull(m, now);
                }
            }
            // The next turn a period after this one was due, skipping
            // those missed: heartbeats keep their pace, not their count.
            let period = self.config.period.max(Duration::from_nanos(1));
            while self.next_turn <= now {
                self.next_turn = self.next_turn + period;
            }
        }
        let lateness = self.lateness.get();
        let reprobe = self.reprobe();
        for (&s, w) in &mut self.subjects {
            match w.state {
                State::Trusted if w.detector.suspects(now, lateness) => {
                    self.nonces += 1;
                    w.state = State::Probing { nonce: self.nonces, since: now, sent: now };
                    self.out.push_back((s, Msg::Probe { nonce: self.nonces }));
                    self.events.push_back(MemberEvent::Suspected { subject: s, at: now });
                }
                // Probed again every half period until the timeout: one
                // probe or its answer lost must not make an alert (the
                // simulator's membership mix removed live members on
                // exactly that, 11 times in 100 runs with 3% loss).
                State::Probing { nonce, since, sent }
                    if now < since + self.config.probe_timeout + lateness && now >= sent + reprobe =>
                {
                    w.state = State::Probing { nonce, since, sent: now };
                    self.out.push_back((s, Msg::Probe { nonce }));
                }
                State::Probing { since, .. } if now >= since + self.config.probe_timeout + lateness => {
                    w.state = State::Alerted { since: now, acknowledged: false, sent: now };
                    let alert = Msg::Alert { subject: s, incarnation: w.incarnation, epoch: self.view.epoch };
                    for &m in &self.managers {
                        self.out.push_back((m, alert));
                    }
                    self.events.push_back(MemberEvent::Alerted { subject: s, at: now });
                }
                State::Alerted { since, acknowledged: false, sent } if now >= sent + self.config.period => {
                    w.state = State::Alerted { since, acknowledged: false, sent: now };
                    let alert = Msg::Alert { subject: s, incarnation: w.incarnation, epoch: self.view.epoch };
                    for &m in &self.managers {
                        self.out.push_back((m, alert));
                    }
                }
                _ => {}
            }
        }
    }

    /// Take in `msg` from `from` (the session's proven sender). A message
    /// for the managers (an alert) is handed back, not handled.
    pub fn handle(&mut self, from: NodeId, msg: Msg, now: Instant) -> Option<Msg> {
        match msg {
            Msg::Heartbeat { incarnation, epoch, .. } => {
                if epoch > self.newest.0 {
                    self.newest = (epoch, from);
                }
                if epoch > self.view.epoch {
                    self.events.push_back(MemberEvent::NewerView { from, epoch });
                    self.pull_newer(now);
                }
                if let Some(w) = self.subjects.get_mut(&from).filter(|w| incarnation >= w.incarnation) {
                    w.detector.heartbeat(now);
                    Self::trust(w, from, now, &mut self.events);
                }
            }
            Msg::Probe { nonce } => {
                self.out.push_back((from, Msg::ProbeAck { nonce, incarnation: self.incarnation }));
            }
            Msg::ProbeAck { nonce, incarnation } => {
                if let Some(w) = self.subjects.get_mut(&from) {
                    let asked = matches!(w.state, State::Probing { nonce: n, .. } if n == nonce);
                    if asked && incarnation >= w.incarnation {
                        w.detector.heartbeat(now);
                        Self::trust(w, from, now, &mut self.events);
                    }
                }
            }
            Msg::AlertAck { subject, epoch } => {
                if let Some(w) = self.subjects.get_mut(&subject) {
                    if let State::Alerted { since, sent, .. } = w.state {
                        if epoch == self.view.epoch {
                            w.state = State::Alerted { since, acknowledged: true, sent };
                        }
                    }
                }
            }
            // Only the managers decide views, and a member passes on only
            // what it applied: a change counts from a manager or from a
            // member of this member's view (the session proved who sent
            // it), and from nobody else.
            Msg::ViewChange(change)
                if self.managers.contains(&from) || self.view.incarnation_of(from).is_some() =>
            {
                self.on_change(from, change, now)
            }
            Msg::ViewChange(_) => {}
            // A neighbour behind: answered from the changes kept, if they
            // reach back far enough; otherwise a replica's business.
            Msg::ViewPull { have } if have < self.view.epoch && self.kept.reaches(have) => {
                for c in self.kept.after(have, PULL_BATCH) {
                    self.out.push_back((from, Msg::ViewChange(c)));
                }
            }
            Msg::Alert { .. } | Msg::Join { .. } | Msg::ViewPull { .. } | Msg::Group { .. } => {
                return Some(msg)
            }
        }
        None
    }

    /// A change of the view from a manager: applied if it is the next one;
    /// one further ahead means changes were missed, asked for again.
    fn on_change(&mut self, from: NodeId, change: ViewChange, now: Instant) {
        if change.epoch > self.newest.0 {
            self.newest = (change.epoch, from);
        }
        if change.epoch > self.view.epoch + 1 {
            // Ahead: kept for when the gap fills (a pull's answer comes
            // in any order), and what is missing asked for.
            if change.epoch <= self.view.epoch + AHEAD as u64 {
                self.ahead.insert(change.epoch, change);
            }
            self.pull(from, now);
            return;
        }
        self.apply_change(change, now);
        while let Some(next) = self.ahead.remove(&(self.view.epoch + 1)) {
            self.apply_change(next, now);
        }
        self.ahead.retain(|&e, _| e > self.view.epoch);
        // A whole batch in and still behind: the next batch at once, not a
        // period later (a thousand members joining at once made changes
        // faster than one batch a period carried them).
        if self.view.epoch >= self.pulled_after + PULL_BATCH as u64 && self.newest.0 > self.view.epoch {
            self.pulled = None;
            self.pull_newer(now);
        }
    }

    /// Apply `change` if it is the next one.
    fn apply_change(&mut self, change: ViewChange, now: Instant) {
        let was_member = self.is_member();
        let before = self.view.epoch;
        if !self.view.apply(change) {
            return; // one already applied
        }
        self.kept.push(change);
        match change.change {
            Change::Joined(_) => self.rings.joined(change.node, self.view.members.iter().map(|m| m.0)),
            Change::Left => self.rings.left(change.node, self.view.members.iter().map(|m| m.0)),
            // A replica replaced: its successor's word counts from now on.
            Change::ReplicaAdded | Change::ReplicaRemoved => self.managers = self.view.replicas.clone(),
            Change::JoinedGroup(_) | Change::LeftGroup(_) => {}
        }
        self.watch(before, now);
        self.events.push_back(MemberEvent::ViewChanged { epoch: self.view.epoch });
        if self.is_member() {
            self.joining = false;
        } else if was_member {
            // Taken for dead while alive: back as a new life.
            self.incarnation += 1;
            self.joining = true;
            self.events
                .push_back(MemberEvent::Removed { epoch: self.view.epoch, rejoins_as: self.incarnation });
        }
    }

    /// Ask the managers for every group this member wants to be in and is
    /// not, and out of every one it is in and does not want.
    fn ask_groups(&mut self) {
        let me = self.me;
        let joins = self.wanted.iter().filter(|&&g| !self.view.group(g).contains(&me)).map(|&g| (g, true));
        let leaves = self
            .view
            .groups
            .iter()
            .filter(|(g, (_, m))| m.contains(&me) && !self.wanted.contains(g))
            .map(|(&g, _)| (g, false));
        let asks: Vec<(GroupId, bool)> = joins.chain(leaves).collect();
        for (group, join) in asks {
            for &m in &self.managers {
                self.out.push_back((m, Msg::Group { group, join }));
            }
        }
    }

    /// Ask for the changes up to the newest view heard of: the neighbour
    /// that told of it keeps them (the view spreads member to member, as
    /// an epidemic). One this member's view does not hold yet would not be
    /// believed; then another member of the view, in turn; a manager
    /// only when the view holds nobody else. (A joiner told of its own
    /// change by a manager asks that manager: asking members of its
    /// partial view instead, at a thousand members joining at once, cut
    /// the manager's answers from 1.0 M to 80 k in the first second, but
    /// joiners caught up later, asked to join 126 k times instead of 26 k,
    /// and two live members were removed.)
    fn pull_newer(&mut self, now: Instant) {
        let (_, told) = self.newest;
        let others = || self.view.members.iter().map(|m| m.0).filter(|&m| m != self.me);
        let whom = if told != self.me
            && (self.view.incarnation_of(told).is_some() || self.managers.contains(&told))
        {
            Some(told)
        } else {
            // Without gathering the view: this runs on every heartbeat
            // that names a newer epoch.
            match others().count() {
                0 => self.next_manager(),
                n => others().nth(self.pulls % n),
            }
        };
        if let Some(m) = whom {
            self.pull(m, now);
        }
    }

    /// The manager to ask next: each in turn, as one may be dead.
    fn next_manager(&self) -> Option<NodeId> {
        self.managers.get(self.pulls % self.managers.len().max(1)).copied()
    }

    /// Ask `whom` for the changes after this member's view, at most once a
    /// period.
    fn pull(&mut self, whom: NodeId, now: Instant) {
        if self.pulled.is_some_and(|t| now < t + self.config.period) {
            return;
        }
        self.pulled = Some(now);
        self.pulled_after = self.view.epoch;
        self.pulls += 1;
        self.out.push_back((whom, Msg::ViewPull { have: self.view.epoch }));
    }

    /// A sign of life from a watched subject: whatever it was suspected of
    /// is refuted.
    fn trust(w: &mut Watch, subject: NodeId, now: Instant, events: &mut VecDeque<MemberEvent>) {
        if w.state != State::Trusted {
            w.state = State::Trusted;
            events.push_back(MemberEvent::Refuted { subject, at: now });
        }
    }

    /// The next message to send, and to whom.
    pub fn poll_send(&mut self) -> Option<(NodeId, Msg)> {
        self.out.pop_front()
    }

    pub fn poll_event(&mut self) -> Option<MemberEvent> {
        self.events.pop_front()
    }

    /// Time between two probes of one suspect.
    fn reprobe(&self) -> Duration {
        (self.config.period / 2).max(Duration::from_nanos(1))
    }

    /// The silence this member forgives its subjects for its own slowness.
    pub fn lateness(&self) -> Duration {
        self.lateness.get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Duration = Duration::from_millis(10);

    fn at(ms: u64) -> Instant {
        Instant::from_nanos(ms * 1_000_000)
    }

    fn view(epoch: u64, nodes: &[NodeId]) -> View {
        View { epoch, members: nodes.iter().map(|&n| (n, 1)).collect(), ..View::default() }
    }

    /// Three members heartbeating each other on a perfect network for a
    /// second: nobody is suspected. Then one goes silent: its observers
    /// suspect it within two periods and a grace, probe it, and alert the
    /// managers once the probe times out.
    #[test]
    fn silence_is_suspected_probed_then_alerted() {
        let nodes = [1, 2, 3];
        let mut m: Vec<Member> =
            nodes.iter().map(|&n| Member::new(n, 1, MemberConfig::new(T), at(0))).collect();
        for x in &mut m {
            x.set_view(view(1, &nodes), at(0));
            x.set_managers(&[100]);
        }
        let mut to_managers = Vec::new();
        let mut events = Vec::new();
        let mut dead: Option<NodeId> = None;
        for ms in 0..400u64 {
            if ms == 200 {
                dead = Some(3);
            }
            for i in 0..m.len() {
                if Some(m[i].node()) == dead {
                    continue;
                }
                m[i].turn(at(ms));
                while let Some((to, msg)) = m[i].poll_send() {
                    let from = m[i].node();
                    if to == 100 {
                        to_managers.push((from, msg));
                    } else if Some(to) != dead {
                        let j = nodes.iter().position(|&n| n == to).unwrap();
                        m[j].handle(from, msg, at(ms));
                    }
                }
                while let Some(e) = m[i].poll_event() {
                    events.push((m[i].node(), e));
                }
            }
        }
        let suspected: Vec<_> =
            events.iter().filter(|(_, e)| matches!(e, MemberEvent::Suspected { .. })).collect();
        assert!(!suspected.is_empty());
        for (by, e) in &suspected {
            let MemberEvent::Suspected { subject, at: when } = e else { unreachable!() };
            assert_eq!(*subject, 3, "only the silent one, by {by}");
            // Its last heartbeat went at 190 ms (or 200): suspected 25 ms later.
            assert!(*when >= at(214) && *when <= at(227), "suspected at {when:?}");
        }
        let alerts: Vec<_> =
            to_managers.iter().filter(|(_, m)| matches!(m, Msg::Alert { subject: 3, .. })).collect();
        assert!(!alerts.is_empty(), "the managers were told");
        assert!(events.iter().all(|(_, e)| !matches!(e, MemberEvent::Refuted { .. })), "nobody refuted");
    }

    /// A subject whose heartbeats are lost but who answers its probe stays
    /// trusted: the suspicion is refuted, no alert goes.
    #[test]
    fn a_probe_answered_refutes_the_suspicion() {
        let mut a = Member::new(1, 1, MemberConfig::new(T), at(0));
        let mut b = Member::new(2, 1, MemberConfig::new(T), at(0));
        for x in [&mut a, &mut b] {
            x.set_view(view(1, &[1, 2]), at(0));
            x.set_managers(&[100]);
        }
        let mut alerts = 0;
        let mut refuted = 0;
        for ms in 0..300u64 {
            a.turn(at(ms));
            b.turn(at(ms));
            while let Some((to, msg)) = b.poll_send() {
                // Every heartbeat from b is lost; its probe answers are not.
                if to == 1 && !matches!(msg, Msg::Heartbeat { .. }) {
                    a.handle(2, msg, at(ms));
                }
            }
            while let Some((to, msg)) = a.poll_send() {
                alerts += usize::from(to == 100 && matches!(msg, Msg::Alert { .. }));
                if to == 2 {
                    b.handle(1, msg, at(ms));
                }
            }
            while let Some(e) = a.poll_event() {
                refuted += usize::from(matches!(e, MemberEvent::Refuted { subject: 2, .. }));
            }
        }
        assert_eq!(alerts, 0, "a live suspect is never reported");
        assert!(refuted >= 5, "suspected and refuted again and again: {refuted}");
    }

    /// An observer whose own turns come late forgives its subjects that
    /// much silence (local health).
    #[test]
    fn a_slow_observer_doubts_its_own_suspicions() {
        let mut a = Member::new(1, 1, MemberConfig::new(T), at(0));
        a.set_view(view(1, &[1, 2]), at(0));
        a.handle(2, Msg::Heartbeat { incarnation: 1, epoch: 1, seq: 1 }, at(0));
        // a's next turn was due at 10 ms and runs at 60 ms: it was frozen
        // 50 ms, and so was everything it would have received.
        a.turn(at(0));
        a.turn(at(60));
        assert_eq!(a.lateness(), Duration::from_millis(50));
        assert!(a.poll_event().is_none(), "30 ms past the deadline, 50 ms late itself: no suspicion");
    }
}
