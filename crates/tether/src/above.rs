//! What runs above an embedded endpoint's core (docs/ARCHITECTURE.md,
//! "Layers"): its calls, and its part in a cluster if it has one (the
//! member and replica of `tether_members::node`, the groups of
//! `tether_members::groups`), pumped at every step of the endpoint's
//! progress (`station::Layer`).
//!
//! Groups ride the reliable streams: their envelopes share the layer
//! channel with the calls' (`LayerWire` tells them apart by their kind
//! byte), so each is delivered once, in order, between two live nodes,
//! which is what the ordered multicast's flush relies on.

use bytes::Bytes;
use tether_members::groups::Groups;
use tether_members::ClusterNode;
use tether_proto::{Channel, Delivery, Endpoint as Core, Instant, NodeId, SendError};

use crate::call_layer::{CallWire, Calls};
use crate::station::Layer;

/// What runs above an embedded endpoint's core: its calls, and its part
/// in a cluster if it has one.
pub(crate) struct Above {
    pub calls: Calls,
    pub cluster: Option<ClusterNode>,
    /// The node's groups (with a cluster only).
    pub groups: Option<Groups>,
    /// The epoch of the view the groups last took.
    groups_epoch: u64,
    /// A group delivered something or made room since a parked call
    /// last looked.
    pub groups_moved: bool,
    /// Group envelopes the stream would not take (an unknown peer).
    pub groups_unsent: u64,
}

impl Above {
    pub fn new(calls: Calls, cluster: Option<ClusterNode>, groups: Option<Groups>) -> Self {
        Above { calls, cluster, groups, groups_epoch: 0, groups_moved: false, groups_unsent: 0 }
    }

    /// Hand the stream the groups' envelopes, in order per peer; a peer
    /// without room holds back only its own.
    pub fn flush_groups(&mut self, now: Instant, core: &mut Core) {
        let Some(g) = &mut self.groups else { return };
        let mut blocked: Vec<NodeId> = Vec::new();
        let mut held: Vec<(NodeId, Bytes)> = Vec::new();
        while let Some((to, env)) = g.poll_send() {
            if blocked.contains(&to) {
                held.push((to, env));
                continue;
            }
            match core.send_on(now, to, Channel::LAYER, env.clone()) {
                Ok(_) => {}
                Err(SendError::WouldBlock) => {
                    blocked.push(to);
                    held.push((to, env));
                }
                // A node the endpoint cannot reach: the view removes it.
                Err(_) => self.groups_unsent += 1,
            }
        }
        for (to, env) in held.into_iter().rev() {
            g.unsend(to, env);
        }
        if g.has_output() {
            self.groups_moved = true;
        }
    }
}

/// The core as the calls see it, with the groups' envelopes on the same
/// channel taken out on the way.
struct LayerWire<'a> {
    core: &'a mut Core,
    groups: &'a mut Groups,
}

impl CallWire for LayerWire<'_> {
    fn recv_call(&mut self) -> Option<Delivery> {
        loop {
            let d = self.core.recv_on(tether_rpc::CHANNEL)?;
            if tether_members::group_wire::is_group_envelope(&d.message) {
                self.groups.on_envelope(d.from, d.message);
                continue;
            }
            return Some(d);
        }
    }

    fn send_call(&mut self, now: Instant, to: NodeId, envelope: &Bytes) -> Result<(), SendError> {
        CallWire::send_call(self.core, now, to, envelope)
    }

    fn knows(&self, peer: NodeId) -> bool {
        self.core.knows(peer)
    }
}

impl Layer for Above {
    fn pump(&mut self, now: Instant, core: &mut Core) {
        match &mut self.groups {
            Some(groups) => self.calls.pump(now, &mut LayerWire { core, groups }),
            None => self.calls.pump(now, core),
        }
        if let Some(c) = &mut self.cluster {
            if c.poll_timeout().is_some_and(|t| t <= now) || core.has_service_datagrams() {
                c.pump(now, core);
            }
            if let (Some(g), Some(v)) = (&mut self.groups, c.view()) {
                if v.epoch != self.groups_epoch {
                    self.groups_epoch = v.epoch;
                    g.on_view(v);
                }
            }
        }
        if let Some(g) = &mut self.groups {
            g.pump(now);
        }
        self.flush_groups(now, core);
    }

    fn poll_timeout(&self) -> Option<Instant> {
        let calls = Layer::poll_timeout(&self.calls);
        let cluster = self.cluster.as_ref().and_then(ClusterNode::poll_timeout);
        let groups = self.groups.as_ref().and_then(Groups::poll_timeout);
        [calls, cluster, groups].into_iter().flatten().min()
    }
}
