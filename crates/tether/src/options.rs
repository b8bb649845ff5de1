//! How an endpoint runs: the protocol's configuration and the runtime's
//! own choices (`Endpoint::builder` sets them one by one).

use std::time::Duration;

use tether_fault::FaultPlan;
use tether_proto::{Config, RailId};
use tether_rpc::RpcConfig;

use crate::call_log::CallLogOptions;

/// Who drives the protocol when the application is not inside a tether call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Progress {
    /// The process's progress threads (the default): about one per core,
    /// shared by all its endpoints, each waiting on its endpoints' sockets
    /// and timers.
    #[default]
    Thread,
    /// Nobody: the application calls `Endpoint::progress` often enough.
    Polling,
}
/// How an endpoint runs: the protocol's configuration and the runtime's own
/// choices. `Endpoint::builder` sets these one by one.
#[derive(Debug, Clone)]
pub struct Options {
    /// The protocol core's limits, timers and checksum.
    pub config: Config,
    /// Who drives the protocol while the application is away.
    pub progress: Progress,
    /// How long a blocked call busy-polls before it sleeps in the kernel:
    /// a few tens of microseconds catch a reply on a fast network without a
    /// wake-up, at the cost of a core.
    pub spin: Duration,
    /// Peers per UDP rail that get a socket connected to them, beside the
    /// rail's listening one, the busiest first (docs/ARCHITECTURE.md,
    /// "Connected sockets"); 0, the default: one socket per rail for all.
    pub connected_peers: usize,
    /// Let the kernel segment runs of equal datagrams on the way out and
    /// hand them over coalesced on the way in (UDP GSO and GRO, where it
    /// has them; docs/ARCHITECTURE.md, "Segmentation offload"). On by
    /// default; off only to measure what it brings or for a kernel that
    /// misbehaves.
    pub offload: bool,
    /// `None`: derived from the wall clock, so a restart gets a larger one.
    pub incarnation: Option<u64>,
    /// Faults to inject (empty: none). Each endpoint draws from its own
    /// seed, derived from the plan's seed and its node id.
    pub faults: FaultPlan,
    /// Faults for one rail only, instead of `faults` there (e.g. a rail
    /// that dies at a given time: `drop:p=1,from=300ms` on both sides).
    pub rail_faults: Vec<(RailId, FaultPlan)>,
    /// How long dropping the endpoint waits for what was sent to be
    /// acknowledged or failed (see `Endpoint::close`).
    pub linger: Duration,
    /// The calls' settings (credit, retransmissions, bounds).
    pub calls: RpcConfig,
    /// The server's call log file; `None`: in memory, so calls served
    /// here are at-most-once within this process's life only.
    pub call_log: Option<CallLogOptions>,
    /// The caller's log file: each call made and how it ended, so a
    /// restarted endpoint learns how its earlier life's calls ended
    /// (`Endpoint::earlier_calls`). `None`: not kept.
    pub caller_log: Option<CallLogOptions>,
    /// Publish this endpoint's counters (and, embedded, its peers' and
    /// paths' state) on a board in this directory, a few times a second,
    /// for `tether stat` and the metrics exporter. `None`: not published.
    pub publish_stats: Option<std::path::PathBuf>,
    /// Serve this endpoint's metrics in the Prometheus text format at this
    /// address (`GET /metrics`; port 0 picks one, see
    /// `Endpoint::metrics_addr`). Needs the `metrics` feature: without it
    /// `build` refuses it. `None`: not served.
    pub metrics: Option<std::net::SocketAddr>,
    /// This node's part in a cluster (`Builder::cluster`): its member, and
    /// its manager replica if the configuration names it. `None`: none.
    pub cluster: Option<crate::cluster::ClusterConfig>,
    /// How the node's groups run (with a cluster).
    pub groups: crate::cluster::GroupsConfig,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            config: Config::default(),
            progress: Progress::Thread,
            spin: Duration::from_micros(50),
            connected_peers: 0,
            offload: true,
            incarnation: None,
            faults: FaultPlan::default(),
            rail_faults: Vec::new(),
            linger: Duration::from_secs(1),
            calls: RpcConfig::default(),
            call_log: None,
            caller_log: None,
            publish_stats: None,
            metrics: None,
            cluster: None,
            groups: crate::cluster::GroupsConfig::default(),
        }
    }
}
