//! An embedded endpoint as a member of a cluster (docs/CLUSTER.md): the
//! membership protocol and, on the nodes that run one, a manager replica
//! (raft-rs), riding the endpoint's sessions on their own service ports
//! and pumped at every step of the endpoint's progress beside the calls
//! (`Above`). The application sees views and suspicions as
//! [`ClusterEvent`]s (`Endpoint::next_cluster_event`) and the current view
//! (`Endpoint::view`). The layers themselves are pumped by `above`; this
//! module is what the endpoint's cluster and group calls reach them by.
//!
//! Every node of the cluster must be a peer of the endpoint (its address
//! given by the builder, a hostfile or the launcher): the view decides who
//! is a member, never an address in a message.

use std::time::Duration;

use bytes::Bytes;
use tether_members::groups::Groups;
use tether_members::ClusterNode;
use tether_proto::NodeId;

pub use tether_members::groups::{GroupError, GroupMessage, GroupOutput, GroupStats, GroupsConfig};
pub use tether_members::{
    ClusterConfig, ClusterEvent, ClusterStats, DetectorKind, GroupId, ManagerConfig, MemberConfig, View,
};

use crate::shared::{block_on, Awaits, Shared};
use crate::Error;

fn not_a_member() -> Error {
    Error::Unsupported { what: "cluster events on an endpoint built without `Builder::cluster`" }
}

/// The view the endpoint's node holds, if it takes part in a cluster.
pub(crate) fn view(shared: &Shared) -> Option<View> {
    shared.lock().layer.cluster.as_ref().and_then(|c| c.view().cloned())
}

/// The node's cluster counters.
pub(crate) fn stats(shared: &Shared) -> Option<ClusterStats> {
    shared.lock().layer.cluster.as_ref().map(ClusterNode::stats)
}

/// The next cluster event, waiting up to `timeout`.
pub(crate) fn next_event(shared: &Shared, timeout: Option<Duration>) -> Result<ClusterEvent, Error> {
    if shared.lock().layer.cluster.is_none() {
        return Err(not_a_member());
    }
    block_on(shared, timeout, Awaits::Cluster, |d| d.layer.cluster.as_mut().and_then(ClusterNode::poll_event))
}

fn no_groups() -> Error {
    Error::Unsupported { what: "groups on an endpoint built without `Builder::cluster`" }
}

/// Ask to join (`join`) or leave `group`.
pub(crate) fn set_group(shared: &Shared, group: GroupId, join: bool) -> Result<(), Error> {
    let mut d = shared.lock();
    let c = d.layer.cluster.as_mut().ok_or_else(no_groups)?;
    if join {
        if !c.join_group(group) {
            return Err(Error::Group(GroupError::NotMember(group)));
        }
    } else {
        c.leave_group(group);
    }
    Ok(())
}

/// Multicast `message` to `group`, waiting up to `timeout` for room
/// (`Some(ZERO)`: not at all).
pub(crate) fn multicast(
    shared: &Shared,
    group: GroupId,
    message: Bytes,
    timeout: Option<Duration>,
) -> Result<u64, Error> {
    let submit = |d: &mut crate::shared::EmbeddedStation| -> Option<Result<u64, Error>> {
        let g = match d.layer.groups.as_mut() {
            Some(g) => g,
            None => return Some(Err(no_groups())),
        };
        match g.submit(group, message.clone()) {
            Err(GroupError::Full(_)) => None,
            r => Some(r.map_err(Error::Group)),
        }
    };
    let mut d = shared.lock();
    let first = submit(&mut d);
    let n = match first {
        Some(r) => r?,
        None if timeout == Some(Duration::ZERO) => return Err(Error::Group(GroupError::Full(group))),
        None => {
            drop(d);
            let n = block_on(shared, timeout, Awaits::Group, submit)??;
            d = shared.lock();
            n
        }
    };
    let now = shared.clock.now();
    if d.unstepped_for(now) >= crate::leave::HANDOVER {
        // Nobody has stepped the endpoint for a while (a thread that keeps
        // multicasting holds its lock most of the time, and the worker
        // serves a locked endpoint last): this thread takes the step, so
        // the membership's heartbeats and what arrived are not starved. A
        // sequencer falsely removed under load, its heartbeats a second
        // late, was how this showed.
        shared.step(&mut d, now);
    } else {
        // Out at once, not at the next step: numbered here if this node
        // is the sequencer, handed to the stream either way.
        let crate::station::Station { layer, core, .. } = &mut *d;
        if let Some(g) = &mut layer.groups {
            g.pump(now);
        }
        layer.flush_groups(now, core);
        d.transmit(now);
    }
    Ok(n)
}

/// The next delivery or view of the node's groups, waiting up to
/// `timeout`.
pub(crate) fn next_group_output(shared: &Shared, timeout: Option<Duration>) -> Result<GroupOutput, Error> {
    if shared.lock().layer.groups.is_none() {
        return Err(no_groups());
    }
    block_on(shared, timeout, Awaits::Group, |d| d.layer.groups.as_mut().and_then(Groups::poll_output))
}

/// The view of `group` the node delivers in.
pub(crate) fn group_view(shared: &Shared, group: GroupId) -> Option<(u64, Vec<NodeId>)> {
    let d = shared.lock();
    let (epoch, members) = d.layer.groups.as_ref()?.view(group)?;
    Some((epoch, members.to_vec()))
}

/// The node's group counters.
pub(crate) fn group_stats(shared: &Shared) -> Option<GroupStats> {
    shared.lock().layer.groups.as_ref().map(Groups::stats)
}

/// The next cluster event, if one waits.
pub(crate) fn poll_event(shared: &Shared) -> Option<ClusterEvent> {
    shared.lock().layer.cluster.as_mut().and_then(ClusterNode::poll_event)
}
