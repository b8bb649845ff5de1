//! What a simulation run reports: the checker's counts and violations,
//! the links' and the cores' counters, and how far it ran.

use serde::Serialize;
use tether_fault::FaultCounters;
use tether_proto::Stats;

use crate::checker::Violation;
use crate::config::SimConfig;

/// What happened to datagrams on the links.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct LinkCounters {
    pub datagrams: u64,
    /// Lost to a cut link.
    pub cut: u64,
    /// Forged by the attacker on the path (`forged_epochs`).
    pub forged: u64,
    /// What the nodes' fault injectors did, summed.
    pub faults: FaultCounters,
}

#[derive(Debug, Clone)]
pub struct SimReport {
    pub seed: u64,
    pub mix: &'static str,
    pub config: String,
    pub sent: u64,
    pub delivered: u64,
    pub failed: u64,
    pub in_doubt_delivered: u64,
    pub lost_in_crash: u64,
    /// Engines rebuilt from hard state (`SimConfig::soft_losses` that
    /// struck), or (`Workload::Engines`) engine loops started again.
    pub soft_losses: u64,
    /// Applications resumed with a new engine (`Workload::Engines`).
    pub engine_recoveries: u64,
    /// Messages delivered to a receiver's queue that crashed before reading them.
    pub unread_at_crash: u64,
    pub violations: Vec<Violation>,
    pub retransmits: u64,
    pub checksum_failures: u64,
    pub duplicates_discarded: u64,
    pub stale_dropped: u64,
    pub links: LinkCounters,
    /// Every core counter, summed over all endpoints (crashed ones included).
    pub stats: Stats,
    /// Virtual time until the run went quiet (the NACK-reliable class's
    /// hold included).
    pub virtual_ms: f64,
    /// Virtual time until the streams' last message was delivered or
    /// failed.
    pub streams_ms: f64,
    pub events: u64,
    /// Calls mixes (`Workload::Calls`): what the calls came to.
    pub calls: Option<crate::calls::CallsReport>,
    /// The membership mix (`Workload::Membership`): what it came to.
    pub membership: Option<crate::membership::MembershipReport>,
    /// The fabric mixes (`SimConfig::fabric`): moves, searches, drops.
    pub fabric: Option<crate::routed::FabricReport>,
}

impl SimReport {
    pub fn ok(&self) -> bool {
        self.violations.is_empty()
    }

    /// The report of a run that did nothing (it could not start, or
    /// panicked); other runs fill in what they did.
    pub(crate) fn empty(cfg: &SimConfig) -> Self {
        SimReport {
            seed: cfg.seed,
            mix: cfg.mix,
            config: cfg.to_string(),
            sent: 0,
            delivered: 0,
            failed: 0,
            in_doubt_delivered: 0,
            lost_in_crash: 0,
            soft_losses: 0,
            engine_recoveries: 0,
            unread_at_crash: 0,
            violations: Vec::new(),
            retransmits: 0,
            checksum_failures: 0,
            duplicates_discarded: 0,
            stale_dropped: 0,
            links: LinkCounters::default(),
            stats: Stats::default(),
            virtual_ms: 0.0,
            streams_ms: 0.0,
            events: 0,
            calls: None,
            membership: None,
            fabric: None,
        }
    }
}
