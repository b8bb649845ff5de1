//! Cluster membership for tether (docs/CLUSTER.md): who is alive, learned
//! quickly and without false alarms. Li, Tao, Goldberg, Hsu and Tamir [CI]
//! section 6 is the design followed: heartbeats as unreliable messages, a
//! member suspected only after two consecutive heartbeats are missing or
//! late, then probed, and the managers told only if it does not answer.
//!
//! * [`detector`]: when silence becomes suspicion: the seed's two-miss
//!   rule, the phi accrual detector, and the observer's own lateness
//!   forgiven (Lifeguard's local health).
//! * [`rings`]: who watches whom, so each member's load is O(K) whatever
//!   the view's size.
//! * [`member`]: one member's heartbeats, detectors, probes and alerts.
//! * [`managers`]: the manager group, whose every decision (joins,
//!   removals on a majority of a member's observers' alerts, hence the
//!   views) is an entry of a log replicated by raft-rs.
//! * [`wire`]: the protocol's messages.
//! * [`groups`]: ordered multicast in a group, with virtual synchrony,
//!   over the reliable streams; [`group_wire`]: its envelopes.
//! * [`node`]: a node's member and replica over a tether endpoint's
//!   service ports, pumped by whatever drives the endpoint.
//!
//! Everything here is sans-IO, like `tether-proto`: the runtime and the
//! simulator hand in time and messages and take out what to send.

pub mod detector;
pub mod group_wire;
pub mod groups;
mod log_store;
pub mod managers;
pub mod member;
pub mod node;
pub mod rings;
pub mod wire;

pub use detector::{Detector, DetectorKind, Lateness};
pub use managers::{ClusterState, Command, Manager, ManagerConfig, ManagerError};
pub use member::{Member, MemberConfig, MemberEvent, View};
pub use node::{ClusterConfig, ClusterEvent, ClusterNode, ClusterStats};
pub use rings::Rings;
pub use wire::{Change, GroupId, Msg, MsgError, ViewChange};
