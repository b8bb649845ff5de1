//! The manager group (docs/CLUSTER.md, "Roles"): 2f + 1 replicas whose
//! every decision (who joins, who is removed on its observers' alerts,
//! hence each view) is an entry of a log replicated by Raft, through
//! raft-rs (the `raft` crate of TiKV; Ongaro and Ousterhout's Raft). No
//! consensus is written here: this module is the state machine the log
//! drives and the loop that feeds raft-rs its ticks and messages.
//!
//! Li et al. [CI] section 3 keep a triplicated manager group in step by
//! active replication, watch the replicas with heartbeats, and replace a
//! faulty one from the state of the other two; section 6.1 found a
//! heartbeat that reached one replica and not another split their
//! decisions. Here the replicas never decide alone: a member is removed
//! only when a committed entry says so, which every replica applies in
//! the same order, and a replica replaced (`add_replica` after
//! `remove_replica`) catches up from the leader's log.
//!
//! Sans-IO: the driver hands in time and the replicas' messages and takes
//! out what to send; raft-rs's own randomness (its election timeouts) is
//! pinned by `ManagerConfig::election_ticks` where a simulator needs one
//! run per seed.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use core::time::Duration;

use protobuf::Message as _;
use raft::eraftpb::{ConfChange, ConfChangeType, Entry, EntryType, Message, Snapshot};
use raft::{RawNode, StateRole};
use tether_proto::{Instant, NodeId};

use crate::log_store::LogStore;
use crate::member::{ChangeLog, View};
use crate::rings::Rings;
use crate::wire::{Change, GroupId, Msg, ViewChange};

/// View changes a replica keeps to answer pulls; a member further behind
/// joins again (it was surely removed meanwhile).
pub const MAX_CHANGES: usize = 1 << 16;
/// Changes one pull is answered with at most; the member pulls again.
pub const PULL_BATCH: u64 = 64;
/// Members the leader tells of each change itself (besides the node it is
/// about); the others have it from their neighbours.
pub const ANNOUNCE_FANOUT: usize = 8;
/// Groups a view holds at most; a join to one more is not proposed.
pub const MAX_GROUPS: usize = 65_536;

/// How the replicas run Raft.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ManagerConfig {
    /// One Raft tick.
    pub tick: Duration,
    /// A follower that hears no leader for a number of ticks drawn from
    /// `[min, max)` stands for election (raft-rs draws it; `max = min + 1`
    /// pins it).
    pub election_ticks: (usize, usize),
    /// The leader's heartbeat, in ticks.
    pub heartbeat_ticks: usize,
    /// Observers per member: whose alerts count (a majority of them removes
    /// a member).
    pub observers: u32,
}

impl Default for ManagerConfig {
    fn default() -> Self {
        ManagerConfig {
            tick: Duration::from_millis(10),
            election_ticks: (10, 20),
            heartbeat_ticks: 2,
            observers: 3,
        }
    }
}

/// A decision the group takes, as an entry of its log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Command {
    /// `node` joins in `incarnation` (a later incarnation replaces an
    /// earlier one: the node restarted).
    Join { node: NodeId, incarnation: u64 },
    /// `node` leaves.
    Leave { node: NodeId },
    /// `observer` alerted the managers about `subject` in `incarnation`,
    /// in view `epoch`.
    Alert { observer: NodeId, subject: NodeId, incarnation: u64, epoch: u64 },
    /// `node` joins (or leaves) `group`.
    Group { node: NodeId, group: GroupId, join: bool },
}

impl Command {
    fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(25);
        match *self {
            Command::Join { node, incarnation } => {
                v.push(0);
                v.extend_from_slice(&node.to_le_bytes());
                v.extend_from_slice(&incarnation.to_le_bytes());
            }
            Command::Leave { node } => {
                v.push(1);
                v.extend_from_slice(&node.to_le_bytes());
            }
            Command::Alert { observer, subject, incarnation, epoch } => {
                v.push(2);
                v.extend_from_slice(&observer.to_le_bytes());
                v.extend_from_slice(&subject.to_le_bytes());
                v.extend_from_slice(&incarnation.to_le_bytes());
                v.extend_from_slice(&epoch.to_le_bytes());
            }
            Command::Group { node, group, join } => {
                v.push(3);
                v.extend_from_slice(&node.to_le_bytes());
                v.extend_from_slice(&group.to_le_bytes());
                v.push(u8::from(join));
            }
        }
        v
    }

    /// A command from a committed entry; `None` for bytes this version did
    /// not write (every replica skips them alike).
    fn decode(b: &[u8]) -> Option<Command> {
        let u32_at = |at: usize| Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?));
        let u64_at = |at: usize| Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?));
        match (*b.first()?, b.len()) {
            (0, 13) => Some(Command::Join { node: u32_at(1)?, incarnation: u64_at(5)? }),
            (1, 5) => Some(Command::Leave { node: u32_at(1)? }),
            (2, 25) => Some(Command::Alert {
                observer: u32_at(1)?,
                subject: u32_at(5)?,
                incarnation: u64_at(9)?,
                epoch: u64_at(17)?,
            }),
            (3, 10) if b[9] <= 1 => {
                Some(Command::Group { node: u32_at(1)?, group: u32_at(5)?, join: b[9] == 1 })
            }
            _ => None,
        }
    }
}

/// Views an alert outlives at most. Its observer probes the subject again
/// in each view it takes and raises the alert again while the subject
/// stays silent, so a live alert stays young; one its observer no longer
/// stands by (the subject answered) ages out. An alert held only within its own epoch never ripened while
/// a thousand members changed views every few milliseconds (the
/// simulator's `membership_1000`: removals 2.9 s after the crash).
pub const ALERT_EPOCHS: u64 = 32;

/// The replicated state: the view, the changes that made it (the latest
/// [`MAX_CHANGES`]), and the alerts that still stand.
#[derive(Debug, Clone)]
pub struct ClusterState {
    view: View,
    changes: ChangeLog,
    /// Subject -> each observer that alerted about it (in the subject's
    /// incarnation in the view, from a place on the rings it still
    /// holds) -> the epoch of its latest alert.
    alerts: BTreeMap<NodeId, BTreeMap<NodeId, u64>>,
    /// Each member's epoch of joining in its present incarnation: an
    /// alert from before it is its earlier life's.
    joined: BTreeMap<NodeId, u64>,
    rings: Rings,
    /// Replicas that have been members: one the view has lost since is
    /// replaced (one that never joined yet is only slow to start).
    seen_replicas: BTreeSet<NodeId>,
}

impl ClusterState {
    /// The state of a cluster founded by the replicas `founders`, before
    /// any change.
    fn founded(founders: &[NodeId], observers: u32) -> Self {
        let mut replicas = founders.to_vec();
        replicas.sort_unstable();
        ClusterState {
            view: View { replicas, ..View::default() },
            changes: ChangeLog::new(MAX_CHANGES),
            alerts: BTreeMap::new(),
            joined: BTreeMap::new(),
            rings: Rings::new(&[], observers),
            seen_replicas: BTreeSet::new(),
        }
    }

    pub fn view(&self) -> &View {
        &self.view
    }

    /// The first member (by node id, so every replica picks the same) that
    /// a majority of its observers alerted about, counting only observers
    /// nobody alerted about: no one observer (one bad link, one lost
    /// heartbeat) removes a member alone, and a dead observer's missing
    /// vote does not keep a dead member in (the simulator's membership mix
    /// kept two crashed members of six that watched each other, seed 726).
    fn ripe(&self) -> Option<NodeId> {
        let suspect = |o: &NodeId| self.alerts.get(o).is_some_and(|a| !a.is_empty());
        self.alerts.iter().find_map(|(&subject, alerted)| {
            let voters: Vec<NodeId> =
                self.rings.observers(subject).into_iter().filter(|o| !suspect(o)).collect();
            let votes = alerted.keys().filter(|o| voters.contains(o)).count();
            (!voters.is_empty() && votes * 2 > voters.len()).then_some(subject)
        })
    }

    /// Whether an alert counts: one of the last [`ALERT_EPOCHS`] views,
    /// about a member in the incarnation alerted about, by one of its
    /// observers in this view (an observer behind the view may no longer
    /// be one: then it does not count) in its present life (a member
    /// removed while cut off, back in a new life at the same place on
    /// the rings, sent its earlier life's alerts until it heard of its
    /// removal: the simulator's `membership_1000` removed a live member
    /// on two of those, seed 7).
    fn counts(&self, observer: NodeId, subject: NodeId, incarnation: u64, epoch: u64) -> bool {
        epoch <= self.view.epoch
            && self.view.epoch - epoch <= ALERT_EPOCHS
            && self.joined.get(&observer).is_some_and(|&since| epoch >= since)
            && self.view.incarnation_of(subject) == Some(incarnation)
            && self.rings.observers(subject).contains(&observer)
    }

    /// After a change: forget the alerts that no longer stand (about or
    /// by a member that left or came back, by one no longer among its
    /// subject's observers, or aged out).
    fn prune_alerts(&mut self, change: ViewChange) {
        if matches!(change.change, Change::Joined(_) | Change::Left) {
            self.alerts.remove(&change.node);
        }
        let (rings, epoch) = (&self.rings, self.view.epoch);
        self.alerts.retain(|&subject, by| {
            let observers = rings.observers(subject);
            by.retain(|o, &mut at| observers.contains(o) && epoch - at <= ALERT_EPOCHS);
            !by.is_empty()
        });
    }

    /// The changes after view `have`, at most `n`.
    pub fn changes_after(&self, have: u64, n: u64) -> impl Iterator<Item = ViewChange> + '_ {
        self.changes.after(have, n as usize)
    }

    /// Apply a committed command; the change it made to the view, if any.
    /// The change is decided here and made by `View::apply`, the very
    /// function members apply it with.
    fn apply(&mut self, cmd: Command) -> Option<ViewChange> {
        let view = &self.view;
        let (node, change) = match cmd {
            Command::Join { node, incarnation } => {
                if view.incarnation_of(node).is_some_and(|i| i >= incarnation) {
                    return None;
                }
                (node, Change::Joined(incarnation))
            }
            Command::Leave { node } => {
                view.incarnation_of(node)?;
                (node, Change::Left)
            }
            Command::Alert { observer, subject, incarnation, epoch } => {
                if !self.counts(observer, subject, incarnation, epoch) {
                    return None;
                }
                let at = self.alerts.entry(subject).or_default().entry(observer).or_default();
                *at = (*at).max(epoch);
                (self.ripe()?, Change::Left)
            }
            Command::Group { node, group, join } => {
                view.incarnation_of(node)?;
                if view.group(group).contains(&node) == join
                    || (join && !view.groups.contains_key(&group) && view.groups.len() >= MAX_GROUPS)
                {
                    return None;
                }
                (node, if join { Change::JoinedGroup(group) } else { Change::LeftGroup(group) })
            }
        };
        let change = self.record(node, change);
        match change.change {
            Change::Joined(_) => {
                self.rings.insert(node);
                self.joined.insert(node, change.epoch);
            }
            Change::Left => {
                self.rings.remove(node);
                self.joined.remove(&node);
            }
            _ => {}
        }
        self.prune_alerts(change);
        Some(change)
    }

    /// A committed change of the Raft group's configuration, as a change
    /// of the view: every replica applies it at the same place in the log,
    /// and a replacement replaying the log from the founders' view makes
    /// the same views.
    fn apply_replica(&mut self, node: NodeId, added: bool) -> Option<ViewChange> {
        if self.view.replicas.contains(&node) == added {
            return None;
        }
        let change = if added { Change::ReplicaAdded } else { Change::ReplicaRemoved };
        let change = self.record(node, change);
        self.prune_alerts(change);
        Some(change)
    }

    /// Make the next view with `change` by `node`, and keep the change for
    /// members that pull.
    fn record(&mut self, node: NodeId, change: Change) -> ViewChange {
        let change = ViewChange { epoch: self.view.epoch + 1, node, change };
        let applied = self.view.apply(change);
        debug_assert!(applied, "the next epoch");
        match change.change {
            Change::Joined(_) | Change::ReplicaAdded
                if self.view.replicas.contains(&node) && self.view.incarnation_of(node).is_some() =>
            {
                self.seen_replicas.insert(node);
            }
            Change::ReplicaRemoved => {
                self.seen_replicas.remove(&node);
            }
            _ => {}
        }
        self.changes.push(change);
        change
    }
}

/// Why a manager refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ManagerError {
    /// Only the leader proposes; this is who it is, if known.
    #[error("not the leader (the leader is {0:?})")]
    NotLeader(Option<NodeId>),
    /// A replica's message did not parse.
    #[error("a malformed replica message: {0}")]
    Malformed(String),
    /// raft-rs refused.
    #[error("raft: {0}")]
    Raft(String),
}

/// Raft's ids are never 0; tether's node ids may be.
fn raft_id(node: NodeId) -> u64 {
    u64::from(node) + 1
}

fn node_of(id: u64) -> NodeId {
    (id - 1) as NodeId
}

/// One manager replica.
pub struct Manager {
    me: NodeId,
    /// How many replicas the group keeps: as many as founded it.
    size: usize,
    config: ManagerConfig,
    raft: RawNode<LogStore>,
    state: ClusterState,
    next_tick: Instant,
    out: VecDeque<(NodeId, Vec<u8>)>,
    views: VecDeque<View>,
    /// Answers owed to members whose commands committed (by the leader
    /// that applied them): (member, the answer).
    acks: VecDeque<(NodeId, Msg)>,
    /// The leader's proposals not yet applied, and when each was made: a
    /// member repeats its request every period until it is answered, and
    /// a copy of one in flight is not proposed again (at a thousand
    /// members joining at once, the copies made the log grow faster than
    /// Raft could ship it). At most [`MAX_IN_FLIGHT`].
    in_flight: BTreeMap<Command, Instant>,
    /// The time of the latest turn.
    now: Instant,
    /// Raft ticks so far.
    ticks: u64,
}

/// Ticks between two re-announcements of the latest change by the leader.
const REANNOUNCE_TICKS: u64 = 10;

/// Entries' bytes in one Raft message at most: within a datagram of the
/// default size with room for the message's own fields.
const MAX_APPEND_BYTES: u64 = 1_024;

/// Proposals the leader has in flight at most; a request past it is
/// dropped, and its member asks again.
pub const MAX_IN_FLIGHT: usize = 4_096;

impl core::fmt::Debug for Manager {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Manager").field("me", &self.me).field("view", &self.state.view).finish()
    }
}

impl Manager {
    fn raft_config(me: NodeId, config: &ManagerConfig) -> raft::Config {
        let (min, max) = config.election_ticks;
        raft::Config {
            id: raft_id(me),
            election_tick: min,
            min_election_tick: min,
            max_election_tick: max.max(min + 1),
            heartbeat_tick: config.heartbeat_ticks,
            check_quorum: true,
            pre_vote: true,
            // Appends go in datagrams (the members' service): as many
            // entries as fit in one, so a follower behind catches up by
            // the datagram, not by the entry.
            max_size_per_msg: MAX_APPEND_BYTES,
            ..Default::default()
        }
    }

    fn logger() -> slog::Logger {
        slog::Logger::root(slog::Discard, slog::o!())
    }

    /// Replica `me` of the group whose configuration is `replicas`, at
    /// `now`. The founders are all given the same list. A replacement,
    /// after the leader's `add_replica`, is given the configuration that
    /// includes it (as etcd starts a new member with the existing
    /// cluster's list): it starts with an empty log and catches up from
    /// the leader's, applying every decision the others applied, in the
    /// same order.
    pub fn new(
        me: NodeId,
        replicas: &[NodeId],
        config: ManagerConfig,
        now: Instant,
    ) -> Result<Self, ManagerError> {
        Self::replacement(me, replicas, replicas, config, now)
    }

    /// A replacement for a failed replica: `me`, added by the leader to
    /// the group whose configuration is now `replicas`, in a cluster
    /// founded by `founders`. Its state starts as the founders' did and
    /// the log it catches up on makes it what theirs is.
    pub fn replacement(
        me: NodeId,
        founders: &[NodeId],
        replicas: &[NodeId],
        config: ManagerConfig,
        now: Instant,
    ) -> Result<Self, ManagerError> {
        let voters: Vec<u64> = replicas.iter().map(|&r| raft_id(r)).collect();
        let storage = LogStore::new_with_conf_state((voters, vec![]));
        let raft = RawNode::new(&Self::raft_config(me, &config), storage, &Self::logger())
            .map_err(|e| ManagerError::Raft(e.to_string()))?;
        Ok(Manager {
            me,
            size: founders.len(),
            config,
            raft,
            state: ClusterState::founded(founders, config.observers),
            next_tick: now + config.tick,
            out: VecDeque::new(),
            views: VecDeque::new(),
            acks: VecDeque::new(),
            in_flight: BTreeMap::new(),
            now,
            ticks: 0,
        })
    }

    pub fn node(&self) -> NodeId {
        self.me
    }

    /// The view as this replica has applied it.
    pub fn view(&self) -> &View {
        &self.state.view
    }

    pub fn is_leader(&self) -> bool {
        self.raft.raft.state == StateRole::Leader
    }

    /// The leader this replica knows of.
    pub fn leader(&self) -> Option<NodeId> {
        match self.raft.raft.leader_id {
            0 => None,
            id => Some(node_of(id)),
        }
    }

    /// The replicas in the group's configuration, as this one knows it.
    pub fn replicas(&self) -> Vec<NodeId> {
        let mut v: Vec<NodeId> = self.raft.raft.prs().conf().voters().ids().iter().map(node_of).collect();
        v.sort_unstable();
        v
    }

    /// When this replica next needs a turn.
    pub fn next_deadline(&self) -> Instant {
        self.next_tick
    }

    /// Tick Raft for every tick due by `now`, and handle what that made.
    pub fn turn(&mut self, now: Instant) {
        self.now = now;
        // Proposals lost with a leader's uncommitted tail are forgotten.
        let patience = self.patience();
        self.in_flight.retain(|_, &mut at| now < at + patience);
        while self.next_tick <= now {
            self.raft.tick();
            self.next_tick = self.next_tick + self.config.tick;
            self.ticks += 1;
            if self.ticks.is_multiple_of(REANNOUNCE_TICKS) && self.is_leader() {
                self.reannounce();
            }
        }
        self.process();
    }

    /// How long a proposal in flight holds back its copies: an election.
    fn patience(&self) -> Duration {
        self.config.tick * self.config.election_ticks.1 as u32
    }

    /// Tell [`ANNOUNCE_FANOUT`] members, others each time, the latest
    /// change again: a change whose every announcement was lost, and every
    /// member that heard of it since, would otherwise stay unknown (members
    /// pull from their neighbours, never from a manager, so a manager's
    /// load does not grow with the cluster).
    fn reannounce(&mut self) {
        let Some(change) = self.state.changes.get(self.state.view.epoch) else { return };
        let members = &self.state.view.members;
        let n = members.len();
        let fanout = n.min(ANNOUNCE_FANOUT);
        let shift = (self.ticks / REANNOUNCE_TICKS) as usize * fanout;
        for i in 0..fanout {
            let (m, _) = members[(shift + i) % n];
            self.acks.push_back((m, Msg::ViewChange(change)));
        }
    }

    /// A message from replica `from`.
    pub fn step(&mut self, from: NodeId, bytes: &[u8]) -> Result<(), ManagerError> {
        let msg = Message::parse_from_bytes(bytes).map_err(|e| ManagerError::Malformed(e.to_string()))?;
        // The session proved who sent it; the message must say the same.
        if msg.from != raft_id(from) || msg.to != raft_id(self.me) {
            return Err(ManagerError::Malformed(format!(
                "from {} to {} over {from}'s session",
                msg.from, msg.to
            )));
        }
        self.raft.step(msg).map_err(|e| ManagerError::Raft(e.to_string()))?;
        self.process();
        Ok(())
    }

    /// Propose `cmd` (leader only); `reply`: who to acknowledge once it
    /// commits, and with what (the leader that applies it answers).
    pub fn propose(&mut self, cmd: Command, reply: Option<(NodeId, Msg)>) -> Result<(), ManagerError> {
        if !self.is_leader() {
            self.in_flight.clear();
            return Err(ManagerError::NotLeader(self.leader()));
        }
        // A copy of a proposal in flight waits for it; one that has waited
        // past an election (lost with a leader's uncommitted tail) goes
        // again.
        let waiting = self.in_flight.get(&cmd).is_some_and(|&at| self.now < at + self.patience());
        if waiting || self.in_flight.len() >= MAX_IN_FLIGHT {
            return Ok(());
        }
        self.in_flight.insert(cmd, self.now);
        let context = match reply {
            Some((to, msg)) => {
                let mut c = to.to_le_bytes().to_vec();
                c.extend_from_slice(&msg.to_vec());
                c
            }
            None => Vec::new(),
        };
        self.raft.propose(context, cmd.encode()).map_err(|e| ManagerError::Raft(e.to_string()))?;
        self.process();
        Ok(())
    }

    /// A member's message for the managers. An alert or a join is
    /// proposed by the leader (a follower drops it: the member sends it to
    /// all of them until the leader's answer, an acknowledgement or the
    /// view that holds it, comes); a pull is answered by any replica from
    /// the changes it applied.
    pub fn handle_member(&mut self, from: NodeId, msg: Msg) {
        match msg {
            // An alert from an earlier view: its observer is behind, and
            // is sent what it missed (it alerts again from the view it
            // catches up to; any replica answers). Its alert counts still
            // if it is still an observer of the subject.
            Msg::Alert { subject, incarnation, epoch } => {
                if epoch < self.state.view.epoch {
                    self.answer_pull(from, epoch);
                }
                if self.is_leader() && self.state.counts(from, subject, incarnation, epoch) {
                    let cmd = Command::Alert { observer: from, subject, incarnation, epoch };
                    let _ = self.propose(cmd, Some((from, Msg::AlertAck { subject, epoch })));
                }
            }
            // Already in: a copy of a join that committed.
            Msg::Join { incarnation } if self.state.view.incarnation_of(from) != Some(incarnation) => {
                let _ = self.propose(Command::Join { node: from, incarnation }, None);
            }
            // Already so: a copy of a request that committed.
            Msg::Group { group, join } if self.state.view.group(group).contains(&from) != join => {
                let _ = self.propose(Command::Group { node: from, group, join }, None);
            }
            Msg::ViewPull { have } => self.answer_pull(from, have),
            _ => {}
        }
    }

    /// Send `to` the changes after view `have` (a batch; it pulls again).
    fn answer_pull(&mut self, to: NodeId, have: u64) {
        let answers: Vec<ViewChange> = self.state.changes_after(have, PULL_BATCH).collect();
        for c in answers {
            self.acks.push_back((to, Msg::ViewChange(c)));
        }
    }

    /// Add replica `node` to the group (leader only): a replacement.
    pub fn add_replica(&mut self, node: NodeId) -> Result<(), ManagerError> {
        self.change(node, ConfChangeType::AddNode)
    }

    /// Remove replica `node` from the group (leader only).
    pub fn remove_replica(&mut self, node: NodeId) -> Result<(), ManagerError> {
        self.change(node, ConfChangeType::RemoveNode)
    }

    /// On the leader, the next step of replacing a replica the view has
    /// lost (removed by its observers' alerts, like any member): remove it
    /// from the Raft group, then add the first of `spares` that is a
    /// member and not a replica, until the group is as large as it was
    /// founded. One change at a time (raft-rs allows no more); the
    /// replica it was, if any, is returned. Li et al. [CI] section 3
    /// replace a faulty replica from the state of the other two; here the
    /// newcomer catches up from the leader's log.
    pub fn replace_lost(&mut self, spares: &[NodeId]) -> Result<Option<NodeId>, ManagerError> {
        if !self.is_leader() || self.raft.raft.has_pending_conf() {
            return Ok(None);
        }
        let replicas = self.replicas();
        let view = &self.state.view;
        let lost = replicas.iter().copied().find(|&r| {
            r != self.me && view.incarnation_of(r).is_none() && self.state.seen_replicas.contains(&r)
        });
        if let Some(r) = lost {
            self.remove_replica(r)?;
            return Ok(Some(r));
        }
        if replicas.len() < self.size {
            let spare =
                spares.iter().copied().find(|s| view.incarnation_of(*s).is_some() && !replicas.contains(s));
            if let Some(s) = spare {
                self.add_replica(s)?;
                return Ok(Some(s));
            }
        }
        Ok(None)
    }

    fn change(&mut self, node: NodeId, kind: ConfChangeType) -> Result<(), ManagerError> {
        if !self.is_leader() {
            return Err(ManagerError::NotLeader(self.leader()));
        }
        let mut cc = ConfChange { node_id: raft_id(node), ..Default::default() };
        cc.set_change_type(kind);
        self.raft.propose_conf_change(vec![], cc).map_err(|e| ManagerError::Raft(e.to_string()))?;
        self.process();
        Ok(())
    }

    /// The next message for another replica.
    pub fn poll_send(&mut self) -> Option<(NodeId, Vec<u8>)> {
        self.out.pop_front()
    }

    /// The next message owed to a member: an answer, or a view change.
    pub fn poll_answer(&mut self) -> Option<(NodeId, Msg)> {
        self.acks.pop_front()
    }

    /// The next view this replica applied.
    pub fn poll_view(&mut self) -> Option<View> {
        self.views.pop_front()
    }

    /// raft-rs's ready loop (its README's order): send, persist, apply.
    fn process(&mut self) {
        while self.raft.has_ready() {
            let mut ready = self.raft.ready();
            self.send(ready.take_messages());
            let store = self.raft.raft.raft_log.store.clone();
            if *ready.snapshot() != Snapshot::default() {
                // A replica's whole state is its log (nothing is compacted),
                // so a snapshot only ever carries the configuration.
                let _ = store.wl().apply_snapshot(ready.snapshot().clone());
            }
            self.apply(ready.take_committed_entries());
            if !ready.entries().is_empty() {
                let _ = store.wl().append(ready.entries());
            }
            if let Some(hs) = ready.hs() {
                store.wl().set_hardstate(hs.clone());
            }
            self.send(ready.take_persisted_messages());
            let mut light = self.raft.advance(ready);
            if let Some(commit) = light.commit_index() {
                store.wl().mut_hard_state().set_commit(commit);
            }
            self.send(light.take_messages());
            self.apply(light.take_committed_entries());
            self.raft.advance_apply();
        }
    }

    /// Tell the node the change was about, and [`ANNOUNCE_FANOUT`]
    /// members of the new view spread over it, of `change`: the rest learn
    /// it from their neighbours, whose heartbeats name the newer epoch
    /// (members pass changes on; docs/CLUSTER.md, "Views"). So a change
    /// costs the leader a bounded number of messages however large the
    /// cluster.
    fn announce(&mut self, change: ViewChange) {
        let msg = Msg::ViewChange(change);
        let members = &self.state.view.members;
        let n = members.len();
        let fanout = n.min(ANNOUNCE_FANOUT);
        // Spread evenly, and shifted with each epoch: no member is always
        // the first to know.
        let shift = change.epoch as usize;
        for i in 0..fanout {
            let (m, _) = members[(shift + i * n / fanout) % n];
            if m != change.node {
                self.acks.push_back((m, msg));
            }
        }
        self.acks.push_back((change.node, msg));
    }

    fn send(&mut self, msgs: Vec<Message>) {
        for m in msgs {
            if let Ok(bytes) = m.write_to_bytes() {
                self.out.push_back((node_of(m.to), bytes));
            }
        }
    }

    /// A change a committed entry made, if it made one: a view for the
    /// node, announced if this replica leads.
    fn made(&mut self, change: Option<ViewChange>) {
        if let Some(change) = change {
            self.views.push_back(self.state.view.clone());
            if self.is_leader() {
                self.announce(change);
            }
        }
    }

    /// Apply committed entries to the state machine, and answer the
    /// members whose commands they were (if this replica leads).
    fn apply(&mut self, entries: Vec<Entry>) {
        for e in entries {
            if e.data.is_empty() {
                continue; // a new leader's empty entry
            }
            match e.get_entry_type() {
                EntryType::EntryConfChange => {
                    let mut cc = ConfChange::default();
                    // A replacement replays changes its configuration
                    // already holds: raft-rs refuses those, harmlessly.
                    if cc.merge_from_bytes(&e.data).is_ok() {
                        if let Ok(cs) = self.raft.apply_conf_change(&cc) {
                            self.raft.raft.raft_log.store.wl().set_conf_state(cs);
                        }
                        let added = match cc.get_change_type() {
                            ConfChangeType::AddNode => true,
                            ConfChangeType::RemoveNode => false,
                            ConfChangeType::AddLearnerNode => continue,
                        };
                        if cc.node_id == 0 {
                            continue; // no node: not one this group wrote
                        }
                        let node = node_of(cc.node_id);
                        let change = self.state.apply_replica(node, added);
                        self.made(change);
                    }
                }
                EntryType::EntryNormal => {
                    let cmd = Command::decode(&e.data);
                    // An alert that did not count (an observer behind the
                    // view, say) is not acknowledged: its observer sends
                    // it again from the view it catches up to.
                    let acknowledged = match cmd {
                        Some(Command::Alert { observer, subject, incarnation, epoch }) => {
                            self.state.counts(observer, subject, incarnation, epoch)
                        }
                        _ => true,
                    };
                    if let Some(cmd) = cmd {
                        self.in_flight.remove(&cmd);
                        let change = self.state.apply(cmd);
                        self.made(change);
                    }
                    if acknowledged && self.is_leader() && e.context.len() > 4 {
                        let to = u32::from_le_bytes(e.context[..4].try_into().expect("four bytes"));
                        if let Ok(msg) = Msg::parse(&e.context[4..]) {
                            self.acks.push_back((to, msg));
                        }
                    }
                }
                EntryType::EntryConfChangeV2 => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Replicas on a perfect network, stepped in lockstep.
    struct Group {
        managers: Vec<Manager>,
        down: BTreeSet<NodeId>,
        now: Instant,
    }

    impl Group {
        fn new(ids: &[NodeId]) -> Self {
            let now = Instant::from_nanos(1_000_000);
            let managers = ids
                .iter()
                .enumerate()
                .map(|(i, &id)| {
                    // Pinned, distinct election timeouts: one run per test.
                    let config =
                        ManagerConfig { election_ticks: (10 + 4 * i, 11 + 4 * i), ..Default::default() };
                    Manager::new(id, ids, config, now).unwrap()
                })
                .collect();
            Group { managers, down: BTreeSet::new(), now }
        }

        fn index(&self, node: NodeId) -> Option<usize> {
            self.managers.iter().position(|m| m.node() == node)
        }

        /// Run for `ms` milliseconds, a turn a millisecond.
        fn run(&mut self, ms: u64) {
            for _ in 0..ms {
                self.now = self.now + Duration::from_millis(1);
                for i in 0..self.managers.len() {
                    if self.down.contains(&self.managers[i].node()) {
                        continue;
                    }
                    self.managers[i].turn(self.now);
                }
                // Deliver until quiet.
                loop {
                    let mut moved = false;
                    for i in 0..self.managers.len() {
                        let from = self.managers[i].node();
                        while let Some((to, bytes)) = self.managers[i].poll_send() {
                            moved = true;
                            if self.down.contains(&from) || self.down.contains(&to) {
                                continue;
                            }
                            if let Some(j) = self.index(to) {
                                self.managers[j].step(from, &bytes).unwrap();
                            }
                        }
                    }
                    if !moved {
                        break;
                    }
                }
            }
        }

        fn leader(&self) -> Option<usize> {
            self.managers.iter().position(|m| m.is_leader() && !self.down.contains(&m.node()))
        }
    }

    #[test]
    fn three_replicas_elect_a_leader_and_agree_on_every_view() {
        let mut g = Group::new(&[1, 2, 3]);
        g.run(300);
        let l = g.leader().expect("a leader within 300 ms");
        for n in 10..16 {
            g.managers[l].propose(Command::Join { node: n, incarnation: 1 }, None).unwrap();
        }
        g.run(50);
        for m in &mut g.managers {
            assert_eq!(m.view().epoch, 6, "replica {}", m.node());
            assert_eq!(m.view().members.len(), 6);
            let views: Vec<u64> = std::iter::from_fn(|| m.poll_view()).map(|v| v.epoch).collect();
            assert_eq!(views, [1, 2, 3, 4, 5, 6], "each view once, in order");
        }
        // One observer's alert does not remove; a majority's does.
        let view = g.managers[l].view().clone();
        let nodes: Vec<NodeId> = view.members.iter().map(|m| m.0).collect();
        let rings = Rings::new(&nodes, 3);
        let observers = rings.observers(12);
        let alert = |o| Command::Alert { observer: o, subject: 12, incarnation: 1, epoch: view.epoch };
        g.managers[l].propose(alert(observers[0]), None).unwrap();
        g.managers[l].propose(alert(99), None).unwrap(); // not an observer: ignored
        g.run(20);
        assert!(g.managers.iter().all(|m| m.view().incarnation_of(12) == Some(1)), "one alert is not enough");
        g.managers[l].propose(alert(observers[1]), None).unwrap();
        g.run(20);
        for m in &g.managers {
            assert_eq!(m.view().incarnation_of(12), None, "removed by a majority of its observers");
            assert_eq!(m.view().epoch, 7);
        }
    }

    /// The group keeps deciding with one replica dead, and a replacement
    /// catches up from the others' log.
    #[test]
    fn a_dead_replica_is_replaced_and_the_new_one_catches_up() {
        let mut g = Group::new(&[1, 2, 3]);
        g.run(300);
        let l = g.leader().unwrap();
        g.managers[l].propose(Command::Join { node: 10, incarnation: 1 }, None).unwrap();
        g.run(20);
        // Kill a follower; the other two go on deciding.
        let dead = g.managers.iter().find(|m| !m.is_leader()).unwrap().node();
        g.down.insert(dead);
        let l = g.leader().unwrap();
        g.managers[l].propose(Command::Join { node: 11, incarnation: 1 }, None).unwrap();
        g.run(20);
        assert_eq!(g.managers[l].view().epoch, 2, "decided with one replica dead");
        // Replace it: out with the dead, in with replica 4.
        g.managers[l].remove_replica(dead).unwrap();
        g.run(20);
        let l = g.leader().unwrap();
        g.managers[l].add_replica(4).unwrap();
        g.run(20);
        let config = ManagerConfig { election_ticks: (30, 31), ..Default::default() };
        let replicas = g.managers[g.leader().unwrap()].replicas();
        assert_eq!(replicas.len(), 3, "{replicas:?}");
        g.managers.push(Manager::replacement(4, &[1, 2, 3], &replicas, config, g.now).unwrap());
        g.run(200);
        let new = g.index(4).unwrap();
        assert_eq!(g.managers[new].view(), g.managers[g.leader().unwrap()].view(), "caught up");
        // Two joins, then the replicas' two changes, as views.
        assert_eq!(g.managers[new].view().epoch, 4);
        let mut want: Vec<NodeId> = [1, 2, 3, 4].into_iter().filter(|&r| r != dead).collect();
        want.sort_unstable();
        assert_eq!(g.managers[new].view().replicas, want);
        assert_eq!(g.managers[new].replicas().len(), 3);
        // And it takes part: the next decision reaches it too.
        let l = g.leader().unwrap();
        g.managers[l].propose(Command::Join { node: 12, incarnation: 1 }, None).unwrap();
        g.run(20);
        assert_eq!(g.managers[new].view().epoch, 5);
    }

    #[test]
    fn commands_encode_and_strangers_are_skipped() {
        for c in [
            Command::Join { node: 7, incarnation: 9 },
            Command::Leave { node: 7 },
            Command::Alert { observer: 1, subject: 2, incarnation: 3, epoch: 4 },
        ] {
            assert_eq!(Command::decode(&c.encode()), Some(c));
        }
        assert_eq!(Command::decode(&[9, 1, 2]), None);
        assert_eq!(Command::decode(&[0, 1]), None);
    }
}
