//! A node's part in the cluster over a real tether endpoint
//! (docs/CLUSTER.md, "Roles"): its member (`member`), its manager replica
//! if it is one (`managers`), and the two service ports of the endpoint's
//! sessions they talk over: `Service::Members` for the membership
//! protocol's messages and `Service::Managers` for the replicas' Raft
//! messages. Both are unreliable datagrams (Li et al. [CI] section 3's UNR
//! class), authenticated and source-validated by the session like every
//! datagram: the member repeats what must arrive (heartbeats every period,
//! probes every half period, alerts, joins and pulls until answered) and
//! Raft repeats what it must, so neither needs a reliable class under it,
//! and neither waits behind the other or behind the application's streams.
//!
//! Sans-IO like the rest of this crate: the driver (an embedded endpoint's
//! progress, the simulator) calls [`ClusterNode::pump`] with the endpoint's
//! core at every step, and sleeps no longer than
//! [`ClusterNode::poll_timeout`].

use std::collections::VecDeque;

use tether_proto::{Endpoint as Core, Instant, NodeId, Service};

use crate::managers::{Manager, ManagerConfig, ManagerError};
use crate::member::{Member, MemberConfig, MemberEvent, View};
use crate::wire::Msg;

/// Events kept for the application at most; past it the oldest goes
/// (counted in `ClusterStats::events_dropped`).
pub const MAX_EVENTS: usize = 4_096;

/// Messages handed between a node's own member and its own replica in
/// one pump at most (each answer may make another; a bound, not a
/// budget: a handful in practice).
const MAX_LOCAL: usize = 1_024;

/// How a node takes part.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterConfig {
    /// The founding manager replicas. A node among them runs a replica.
    pub managers: Vec<NodeId>,
    /// The member's heartbeats and detector; `None`: a replica that is not
    /// a member itself.
    pub member: Option<MemberConfig>,
    /// How the replicas run Raft.
    pub manager: ManagerConfig,
    /// Nodes that take a failed replica's place, in this order of
    /// preference: the leader adds the first that is a member once the
    /// view has lost a replica (`Manager::replace_lost`).
    pub spares: Vec<NodeId>,
}

impl ClusterConfig {
    /// A member with heartbeats every `period` (the two-miss rule), and
    /// these founding replicas.
    pub fn new(managers: &[NodeId], period: core::time::Duration) -> Self {
        ClusterConfig {
            managers: managers.to_vec(),
            member: Some(MemberConfig::new(period)),
            manager: ManagerConfig::default(),
            spares: Vec::new(),
        }
    }
}

/// What the application learns of the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClusterEvent {
    /// A new view: each one once, in epoch order.
    View(View),
    /// This node watches `subject` and it went quiet: probed.
    Suspected { subject: NodeId, at: Instant },
    /// `subject` answered while suspected.
    Refuted { subject: NodeId, at: Instant },
    /// `subject` did not answer its probe: the managers were told.
    Alerted { subject: NodeId, at: Instant },
    /// A view left this node out while it lives; it joins again as
    /// `rejoins_as`.
    Removed { epoch: u64, rejoins_as: u64 },
}

/// A node's cluster counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClusterStats {
    /// Membership messages handed to the endpoint.
    pub member_sent: u64,
    /// Membership messages taken from the endpoint.
    pub member_received: u64,
    /// Raft messages handed to the endpoint.
    pub raft_sent: u64,
    /// Raft messages taken from the endpoint.
    pub raft_received: u64,
    /// Messages that did not parse, Raft messages refused (misdirected,
    /// replayed without a key, or for a node that runs no replica).
    pub refused: u64,
    /// Messages the endpoint would not take: an unknown peer, too large,
    /// or its queue to the peer full.
    pub unsent: u64,
    /// Events dropped because the application did not take them.
    pub events_dropped: u64,
    /// Changes of the replicas this node proposed as their leader: a lost
    /// replica removed, or a spare added.
    pub replacements: u64,
}

/// One node's member and replica over its endpoint.
pub struct ClusterNode {
    member: Option<Member>,
    /// The last view handed to the application.
    emitted: View,
    manager: Option<Manager>,
    /// What a spare needs to become a replica, and what a leader needs to
    /// replace one.
    founders: Vec<NodeId>,
    spares: Vec<NodeId>,
    manager_config: ManagerConfig,
    events: VecDeque<ClusterEvent>,
    out: Out,
    /// Something moved that the application may wait for.
    pub moved: bool,
}

/// Where a node's messages go: the endpoint, or this node's other half.
struct Out {
    me: NodeId,
    stats: ClusterStats,
    /// A member's message encoded here before it is copied into the
    /// endpoint's pool.
    buf: Vec<u8>,
    /// Messages between this node's own member and replica.
    local: VecDeque<Local>,
}

impl Out {
    /// A membership message to `to`: over the endpoint, or, to this very
    /// node, to its other half as `here` says.
    fn post(&mut self, core: &mut Core, to: NodeId, msg: Msg, here: fn(Msg) -> Local) {
        if to == self.me {
            self.local.push_back(here(msg));
            return;
        }
        let mut buf = std::mem::take(&mut self.buf);
        buf.clear();
        msg.encode(&mut buf);
        self.send(core, to, Service::Members, &buf);
        self.buf = buf;
    }

    fn send(&mut self, core: &mut Core, to: NodeId, service: Service, bytes: &[u8]) {
        match service {
            Service::Members => self.stats.member_sent += 1,
            Service::Managers => self.stats.raft_sent += 1,
        }
        // A full queue (`Ok(false)`, the endpoint counts it too), an
        // unknown peer, a Raft message past a datagram: the protocols
        // repeat what must arrive.
        if !matches!(core.send_service(to, service, bytes), Ok(true)) {
            self.stats.unsent += 1;
        }
    }
}

enum Local {
    ToManager(Msg),
    ToMember(Msg),
}

impl core::fmt::Debug for ClusterNode {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ClusterNode").field("me", &self.out.me).field("view", &self.view()).finish()
    }
}

impl ClusterNode {
    /// Node `me` in `incarnation` (its member's; a later life needs a
    /// larger one), at `now`: a member that asks to join at once, a
    /// replica if `config.managers` names it, or both.
    pub fn new(
        me: NodeId,
        incarnation: u64,
        config: &ClusterConfig,
        now: Instant,
    ) -> Result<Self, ManagerError> {
        let manager = if config.managers.contains(&me) {
            Some(Manager::new(me, &config.managers, config.manager, now)?)
        } else {
            None
        };
        let member = config.member.map(|mc| {
            let mut m = Member::new(me, incarnation, mc, now);
            m.set_managers(&config.managers);
            m.join();
            m
        });
        Ok(ClusterNode {
            emitted: member.as_ref().map(|m| m.view().clone()).unwrap_or_default(),
            member,
            manager,
            founders: config.managers.clone(),
            spares: config.spares.clone(),
            manager_config: config.manager,
            events: VecDeque::new(),
            out: Out {
                me,
                stats: ClusterStats::default(),
                buf: Vec::with_capacity(crate::wire::MAX_LEN),
                local: VecDeque::new(),
            },
            moved: false,
        })
    }

    pub fn node(&self) -> NodeId {
        self.out.me
    }

    /// The view this node holds: its member's, or its replica's if it is
    /// not a member.
    pub fn view(&self) -> Option<&View> {
        match (&self.member, &self.manager) {
            (Some(m), _) => Some(m.view()),
            (None, Some(r)) => Some(r.view()),
            (None, None) => None,
        }
    }

    pub fn member(&self) -> Option<&Member> {
        self.member.as_ref()
    }

    pub fn manager(&self) -> Option<&Manager> {
        self.manager.as_ref()
    }

    /// Ask to be in `group` (a change of the view, decided by the
    /// managers); false for a node that is not a member, or past
    /// `member::MAX_GROUPS`.
    pub fn join_group(&mut self, group: crate::GroupId) -> bool {
        self.member.as_mut().is_some_and(|m| m.join_group(group))
    }

    /// Ask to leave `group`.
    pub fn leave_group(&mut self, group: crate::GroupId) {
        if let Some(m) = &mut self.member {
            m.leave_group(group);
        }
    }

    /// The replica, for the operations only a leader takes (replacing a
    /// replica).
    pub fn manager_mut(&mut self) -> Option<&mut Manager> {
        self.manager.as_mut()
    }

    pub fn stats(&self) -> ClusterStats {
        self.out.stats
    }

    /// The next event for the application.
    pub fn poll_event(&mut self) -> Option<ClusterEvent> {
        self.events.pop_front()
    }

    pub fn has_events(&self) -> bool {
        !self.events.is_empty()
    }

    /// When this node next needs a pump, whatever arrives.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let member = self.member.as_ref().map(Member::next_deadline);
        let manager = self.manager.as_ref().map(Manager::next_deadline);
        match (member, manager) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Take in what the endpoint received for the cluster, run what is
    /// due at `now`, and hand the endpoint what to send.
    pub fn pump(&mut self, now: Instant, core: &mut Core) {
        while let Some(d) = core.recv_service(Service::Members) {
            self.out.stats.member_received += 1;
            match Msg::parse(&d.message) {
                Ok(msg) => self.on_member_msg(d.from, msg, now),
                Err(_) => self.out.stats.refused += 1,
            }
        }
        while let Some(d) = core.recv_service(Service::Managers) {
            self.out.stats.raft_received += 1;
            // A replayed, misdirected or malformed Raft message is refused;
            // so is any for a node that runs no replica.
            let stepped = self.manager.as_mut().map(|r| r.step(d.from, &d.message));
            if !matches!(stepped, Some(Ok(()))) {
                self.out.stats.refused += 1;
            }
        }
        if let Some(m) = &mut self.member {
            if m.next_deadline() <= now {
                m.turn(now);
                Self::take_events(
                    m,
                    &mut self.emitted,
                    &mut self.events,
                    &mut self.out.stats,
                    &mut self.moved,
                );
            }
        }
        self.become_replica(now);
        if let Some(r) = &mut self.manager {
            if r.next_deadline() <= now {
                r.turn(now);
                // A tick apart: a lost replica is replaced step by step.
                if let Ok(Some(_)) = r.replace_lost(&self.spares) {
                    self.out.stats.replacements += 1;
                }
            }
        }
        for _ in 0..MAX_LOCAL {
            self.drain(core);
            let Some(l) = self.out.local.pop_front() else { break };
            match l {
                Local::ToManager(msg) => {
                    if let Some(r) = &mut self.manager {
                        r.handle_member(self.out.me, msg);
                    }
                }
                Local::ToMember(msg) => self.on_member_msg(self.out.me, msg, now),
            }
        }
    }

    /// A spare the view names a replica starts its replica, with the
    /// configuration the view gives, and catches up from the leader.
    fn become_replica(&mut self, now: Instant) {
        let me = self.out.me;
        if self.manager.is_some() || !self.spares.contains(&me) {
            return;
        }
        let Some(view) = self.member.as_ref().map(Member::view) else { return };
        if !view.replicas.contains(&me) {
            return;
        }
        match Manager::replacement(me, &self.founders, &view.replicas, self.manager_config, now) {
            Ok(r) => {
                self.manager = Some(r);
                self.moved = true;
            }
            Err(_) => self.out.stats.refused += 1,
        }
    }

    /// A membership message from `from` (the session proved it): the
    /// member's, or handed on to the replica if it is for the managers.
    fn on_member_msg(&mut self, from: NodeId, msg: Msg, now: Instant) {
        let for_managers = match &mut self.member {
            Some(m) => {
                let up = m.handle(from, msg, now);
                // Now, while the member's view is the one the event is of.
                Self::take_events(
                    m,
                    &mut self.emitted,
                    &mut self.events,
                    &mut self.out.stats,
                    &mut self.moved,
                );
                up
            }
            None => Some(msg),
        };
        if let (Some(msg), Some(r)) = (for_managers, &mut self.manager) {
            r.handle_member(from, msg);
        }
    }

    /// Everything the member and the replica have to send, and what they
    /// noticed.
    fn drain(&mut self, core: &mut Core) {
        if let Some(m) = &mut self.member {
            while let Some((to, msg)) = m.poll_send() {
                self.out.post(core, to, msg, Local::ToManager);
            }
        }
        if let Some(r) = &mut self.manager {
            while let Some((to, bytes)) = r.poll_send() {
                self.out.send(core, to, Service::Managers, &bytes);
            }
            while let Some((to, msg)) = r.poll_answer() {
                self.out.post(core, to, msg, Local::ToMember);
            }
            while let Some(v) = r.poll_view() {
                // A replica that is a member too reports its member's views.
                if self.member.is_none() {
                    Self::push_event(&mut self.events, &mut self.out.stats, ClusterEvent::View(v));
                    self.moved = true;
                }
            }
        }
    }

    /// What the member noticed, as the application's events.
    fn take_events(
        m: &mut Member,
        emitted: &mut View,
        events: &mut VecDeque<ClusterEvent>,
        stats: &mut ClusterStats,
        moved: &mut bool,
    ) {
        while let Some(e) = m.poll_event() {
            let event = match e {
                MemberEvent::ViewChanged { epoch } => {
                    // Each view once, in epoch order, though the member
                    // may have applied several at once (changes that came
                    // early): rebuilt from the changes it applied.
                    while emitted.epoch < epoch {
                        let before = emitted.epoch;
                        match m.change_of(before + 1) {
                            Some(c) if emitted.apply(c) => {}
                            _ => *emitted = m.view().clone(),
                        }
                        if emitted.epoch <= before {
                            break;
                        }
                        Self::push_event(events, stats, ClusterEvent::View(emitted.clone()));
                        *moved = true;
                    }
                    continue;
                }
                MemberEvent::Suspected { subject, at } => ClusterEvent::Suspected { subject, at },
                MemberEvent::Refuted { subject, at } => ClusterEvent::Refuted { subject, at },
                MemberEvent::Alerted { subject, at } => ClusterEvent::Alerted { subject, at },
                MemberEvent::Removed { epoch, rejoins_as } => ClusterEvent::Removed { epoch, rejoins_as },
                MemberEvent::NewerView { .. } => continue,
            };
            Self::push_event(events, stats, event);
            *moved = true;
        }
    }

    fn push_event(events: &mut VecDeque<ClusterEvent>, stats: &mut ClusterStats, e: ClusterEvent) {
        if events.len() == MAX_EVENTS {
            events.pop_front();
            stats.events_dropped += 1;
        }
        events.push_back(e);
    }
}
