//! An embedded endpoint as a member of a cluster (docs/CLUSTER.md): the
//! membership protocol and, on the nodes that run one, a manager replica
//! (raft-rs), riding the endpoint's sessions on their own service ports
//! and pumped at every step of the endpoint's progress beside the calls
//! (`Above`). The application sees views and suspicions as
//! [`ClusterEvent`]s (`Endpoint::next_cluster_event`) and the current view
//! (`Endpoint::view`).
//!
//! Every node of the cluster must be a peer of the endpoint (its address
//! given by the builder, a hostfile or the launcher): the view decides who
//! is a member, never an address in a message.

use std::time::Duration;

use tether_members::ClusterNode;
use tether_proto::{Endpoint as Core, Instant};

pub use tether_members::{
    ClusterConfig, ClusterEvent, ClusterStats, DetectorKind, ManagerConfig, MemberConfig, View,
};

use crate::call_layer::Calls;
use crate::shared::{block_on, Awaits, Shared};
use crate::station::Layer;
use crate::Error;

/// What runs above an embedded endpoint's core: its calls, and its part
/// in a cluster if it has one.
pub(crate) struct Above {
    pub calls: Calls,
    pub cluster: Option<ClusterNode>,
}

impl Layer for Above {
    fn pump(&mut self, now: Instant, core: &mut Core) {
        self.calls.pump(now, core);
        if let Some(c) = &mut self.cluster {
            if c.poll_timeout().is_some_and(|t| t <= now) || core.has_service_datagrams() {
                c.pump(now, core);
            }
        }
    }

    fn poll_timeout(&self) -> Option<Instant> {
        let calls = Layer::poll_timeout(&self.calls);
        let cluster = self.cluster.as_ref().and_then(ClusterNode::poll_timeout);
        match (calls, cluster) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

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

/// The next cluster event, if one waits.
pub(crate) fn poll_event(shared: &Shared) -> Option<ClusterEvent> {
    shared.lock().layer.cluster.as_mut().and_then(ClusterNode::poll_event)
}
