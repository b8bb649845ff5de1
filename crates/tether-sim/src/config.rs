//! What a simulation run is: nodes, workload, link faults, protocol
//! configuration, time limits and the seed. `Display` prints every
//! parameter, so a failing run can be read and replayed.

use std::fmt;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64Mcg;
use tether_fault::FaultPlan;
use tether_proto::{AuthKind, ClusterKey, Config, NodeId, RailId, RailPolicy, RetransmitMode};

use crate::fabric::{Fabric, SwitchId};
use crate::routed;
use crate::topology::{Topology, TopologyError};

/// A fault plan from rules in the compact command-line form: the presets
/// read like what a user would type after `--fault`.
pub fn plan(seed: u64, rules: &[&str]) -> FaultPlan {
    FaultPlan::parse_rules(seed, rules).expect("preset fault rules are valid")
}

/// A link that dies: both directions between two nodes (or, `one_way`,
/// only from `a` to `b`), from `at` until `until` (`None`: for good), on
/// one rail or (`rail: None`) on all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkCut {
    pub a: NodeId,
    pub b: NodeId,
    pub at: Duration,
    pub until: Option<Duration>,
    pub rail: Option<RailId>,
    pub one_way: bool,
}

/// The network as a source-routed fabric (`crate::routed`): one such
/// fabric per rail, the run's node `n` its host `n + 1` (the other hosts
/// bystanders); and nodes moved mid-run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FabricPlan {
    /// What the fabric was made from, for reports.
    pub topology: Topology,
    pub fabric: Fabric,
    /// (node, to a switch this many hops from node 0's, counted as [TB]
    /// Table 3 does (1: node 0's switch itself), when).
    pub moves: Vec<(NodeId, usize, Duration)>,
}

impl FabricPlan {
    /// The plan for `nodes` nodes on `topology`, each move to a switch
    /// that far from node 0's with a free port: refused, saying why, if
    /// a node is not a host of the fabric or a move has nowhere to go.
    pub fn new(
        topology: Topology,
        nodes: u32,
        moves: Vec<(NodeId, usize, Duration)>,
    ) -> Result<FabricPlan, TopologyError> {
        let fabric = topology.build()?;
        let home = Self::home(&fabric, nodes)?;
        for &(node, hops, _) in &moves {
            if node >= nodes || fabric.place_at(home, hops, None).is_none() {
                return Err(TopologyError::Plan(format!(
                    "node {node} cannot be moved {hops} hops from node 0: no switch that far has a free port"
                )));
            }
        }
        Ok(FabricPlan { topology, fabric, moves })
    }

    /// The plan for `nodes` nodes on `topology` with `node` moved `hops`
    /// hops at `at`, or as many fewer as the fabric has room for (a
    /// random fabric may have no switch that far from node 0's).
    pub fn moving(
        topology: Topology,
        nodes: u32,
        node: NodeId,
        hops: usize,
        at: Duration,
    ) -> Result<FabricPlan, TopologyError> {
        let fabric = topology.build()?;
        let home = Self::home(&fabric, nodes)?;
        let hops = (1..=hops.max(1)).rev().find(|&h| fabric.place_at(home, h, None).is_some());
        match hops {
            Some(hops) if node < nodes => Ok(FabricPlan { topology, fabric, moves: vec![(node, hops, at)] }),
            _ => Err(TopologyError::Plan(format!(
                "node {node} cannot be moved 1 hop from node 0: no switch that far has a free port"
            ))),
        }
    }

    /// Node 0's switch, once every node of the run is a host of `fabric`.
    fn home(fabric: &Fabric, nodes: u32) -> Result<SwitchId, TopologyError> {
        if let Some(n) = (0..nodes).find(|&n| fabric.host_at(routed::host(n)).is_none()) {
            return Err(TopologyError::Plan(format!(
                "the run's {nodes} nodes are hosts 1 to {nodes}: host {} is not in it",
                routed::host(n)
            )));
        }
        Ok(fabric.host_at(routed::host(0)).map_or(0, |(sw, _)| sw))
    }
}

/// What the simulated applications do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    /// Every node streams verified messages to every other (the checker's
    /// guarantees: exactly once, in order, uncorrupted, or reported).
    Streams,
    /// A caller makes calls to a server that crashes and restarts on its
    /// call log (`crate::calls`: at most once, and every call's final
    /// state true).
    Calls,
    /// Applications attached to real engine loops stream to each other
    /// while the engines are killed and started again (`crate::engines`).
    Engines,
    /// Members and manager replicas of the membership protocol under
    /// message faults, crashes, a member cut off and a replica replaced
    /// (`crate::membership`).
    Membership,
}

#[derive(Debug, Clone)]
pub struct SimConfig {
    pub seed: u64,
    pub workload: Workload,
    pub nodes: u32,
    pub messages_per_stream: u64,
    /// One-way latency of every link.
    pub latency: Duration,
    /// What every node's network interface does to datagrams: the same
    /// injector and plan `FaultyTransport` wraps around a real socket,
    /// each node drawing from its own stream seeded from the run's seed.
    pub faults: FaultPlan,
    pub cuts: Vec<LinkCut>,
    /// Rails between every pair of nodes (each a separate network).
    pub rails: u8,
    /// Rails that drop this fraction of their datagrams, all the time.
    pub rail_loss: Vec<(RailId, f64)>,
    /// Nodes that crash and restart as a new incarnation, and when.
    pub restarts: Vec<(NodeId, Duration)>,
    /// Moments a node's engine fails and is rebuilt from its hard state
    /// (`Endpoint::snapshot` / `restore`): every timer, RTT estimate and
    /// path's health is lost, the streams go on.
    pub soft_losses: Vec<(NodeId, Duration)>,
    /// Engines killed (`Workload::Engines`): the host, when, and how long
    /// until a new engine starts there.
    pub engine_kills: Vec<(u32, Duration, Duration)>,
    pub proto: Config,
    /// Faults apply until then; afterwards links heal (cuts for good stay).
    pub safety_phase: Duration,
    /// Virtual time by which everything must have settled.
    pub time_limit: Duration,
    /// Gap between a node's sending turns.
    pub pace: Duration,
    /// A slow application: it reads at most this many messages per
    /// millisecond (None: it reads everything at once). Fills delivery
    /// queues, so the commit point's back-pressure is exercised.
    pub reader_batch: Option<usize>,
    /// Datagrams forged by an attacker on the path without the key
    /// (`forger`): this many, beside genuine datagrams drawn from the
    /// first `forge_within` of the run's.
    pub forgeries: usize,
    pub forge_within: u64,
    /// Send unreliable and NACK-reliable messages beside the streams
    /// (`crate::unreliable`, `crate::nacked`). On in every mix; off only
    /// to replay a world pinned before they existed, whose every datagram
    /// they would move.
    pub unreliable: bool,
    /// The network as a source-routed fabric, and the moves in it
    /// (`None`: every node reaches every other directly).
    pub fabric: Option<FabricPlan>,
    pub mix: &'static str,
}

impl SimConfig {
    /// The base every preset starts from: small, quick, many seeds.
    pub fn base(seed: u64) -> Self {
        SimConfig {
            seed,
            workload: Workload::Streams,
            nodes: 3,
            messages_per_stream: 40,
            latency: Duration::from_micros(20),
            faults: FaultPlan::new(seed),
            cuts: Vec::new(),
            rails: 1,
            rail_loss: Vec::new(),
            restarts: Vec::new(),
            soft_losses: Vec::new(),
            engine_kills: Vec::new(),
            proto: Config { abandon_after: Duration::from_millis(300), ..Config::default() },
            safety_phase: Duration::from_millis(50),
            time_limit: Duration::from_secs(30),
            pace: Duration::from_micros(100),
            reader_batch: None,
            forgeries: 0,
            forge_within: 0,
            unreliable: true,
            fabric: None,
            mix: "custom",
        }
    }
}

impl fmt::Display for SimConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = &self.proto;
        write!(
            f,
            "seed={} mix={} nodes={} messages_per_stream={} latency={:?} faults={:?} cuts={:?} rails={} \
             rail_loss={:?} restarts={:?} soft_losses={:?} safety_phase={:?} time_limit={:?} pace={:?} reader_batch={:?} \
             forgeries={} window={} rto_min={:?} abandon_after={:?} mode={:?} rail_policy={:?} workload={:?}",
            self.seed,
            self.mix,
            self.nodes,
            self.messages_per_stream,
            self.latency,
            self.faults.rules,
            self.cuts,
            self.rails,
            self.rail_loss,
            self.restarts,
            self.soft_losses,
            self.safety_phase,
            self.time_limit,
            self.pace,
            self.reader_batch,
            self.forgeries,
            p.send_window,
            p.rto_min,
            p.abandon_after,
            p.retransmit,
            p.rail_policy,
            self.workload
        )?;
        if !self.engine_kills.is_empty() {
            write!(f, " engine_kills={:?}", self.engine_kills)?;
        }
        if let Some(fabric) = &self.fabric {
            write!(f, " fabric={fabric:?}")?;
        }
        Ok(())
    }
}

/// Named fault mixes: the presets the tests and `tether sim` run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultMix {
    Clean,
    Loss20,
    HeavyReorder,
    Duplicate,
    Corrupt,
    DeadLink,
    Flaky,
    GoBackN,
    Restart,
    /// Every limit at its smallest: tiny windows, 256-byte datagrams, send
    /// buffer and delivery queue just one largest message, under faults.
    Tight,
    /// Every message fault of Li et al. [CI] at once, from both sides, with
    /// loss bursts: stale datagrams injected toward the wrong peer too.
    Every,
    /// Two rails; rail 0 between nodes 0 and 1 dies mid-stream for good.
    RailCut,
    /// Two rails between nodes 0 and 1 die one after the other.
    RailsBothCut,
    /// Two rails; rail 0 between nodes 1 and 2 goes down and up again
    /// and again.
    RailFlap,
    /// Two rails; rail 0 drops 30% of everything rather than dying.
    RailLossy,
    /// Two rails, striped; rail 1 between nodes 0 and 2 dies.
    RailStripe,
    /// Two rails; rail 0 between nodes 0 and 1 dies and node 1 restarts.
    RailRestart,
    /// Loss, reordering and duplication while nodes lose all their soft
    /// state (timers, RTT, rail health) at moments drawn from the seed,
    /// each rebuilt from its hard state: nothing may be lost or repeated.
    SoftStateLoss,
    /// Two rails, each with message faults of its own (loss, reordering,
    /// duplication, corruption), and rail 0 between nodes 0 and 1 cut.
    RailFaults,
    /// Engines as processes of their own (docs/ENGINE.md): fragments are
    /// delivered as they come and acknowledged only once the application
    /// took them; under loss, reordering and duplication, nodes' engines
    /// die at moments drawn from the seed and lose everything not backed
    /// up (deliveries not taken, segments held out of order, timers); each
    /// comes back at the application's place in every stream. Nothing may
    /// be lost or repeated.
    EngineStateLoss,
    /// A receiver restarts while everything it sends is lost: node 1's
    /// ACKs (and handshake answers) vanish from 1 ms to 4 ms, and it
    /// restarts at 2.5 ms, so its old incarnation took data whose ACKs
    /// never arrived. The senders must neither deliver those messages to
    /// the new incarnation too nor report them as certainly lost.
    RestartAckLoss,
    /// Every message fault of `every_fault` with a cluster key: each
    /// datagram authenticated (the three algorithms in turn by seed), corrupted and injected ones refused by
    /// their MAC, and a node restarting and others losing soft state
    /// (packet numbers and replay windows rebuilt from hard state).
    Authenticated,
    /// The mix and its rates drawn from the seed: nodes, rails, which
    /// message faults at which rates, cuts, restarts, soft-state losses,
    /// windows and datagram sizes (a swarm: every seed a different world).
    Swarm,
    /// An attacker on the path without a cluster key forges DATA toward
    /// receivers under other epochs (near, far, half the space away,
    /// behind) and ACKs toward senders naming them, four times a run,
    /// under loss, reordering and duplication: no genuine stream is
    /// locked out, and only a message a receiver's epoch change cut in
    /// two may fail (reported, certainly not delivered).
    ForgedEpochs,
    /// Calls from a caller to a server whose node crashes at
    /// moments drawn from the seed, between a handler's effect and its
    /// completion record, and in the middle of a log write, and restarts
    /// on its log; 2% of datagrams lost, duplicated and corrupted each,
    /// latencies spread to reorder them. No call may run twice, every call
    /// must end, and each final state must be true of its handler.
    CallsServerCrash,
    /// Three applications on two hosts, each host's engine a real engine
    /// loop (`crate::engines`), streaming to each other under loss,
    /// reordering, duplication and corruption on both rails, while
    /// engines are killed at moments drawn from the seed and started
    /// again up to 5 ms later: each application resumes with the new
    /// engine from its own backup. Nothing may be lost or repeated.
    EngineKill,
    /// The membership protocol (docs/CLUSTER.md): members and three
    /// manager replicas over links that drop, duplicate and replay, with a
    /// 20 ms blackout every second; up to two members crash, one may be cut
    /// off for 50-400 ms, a replica may die and be replaced. Every replica
    /// applies the same views, every live member ends in the last view,
    /// every crash is detected, nobody else is removed.
    Membership,
    /// The same protocol at 1,000 members: ten to twenty crashes, perhaps
    /// a rack of eight at once, perhaps fifty members cut off from the rest
    /// (talking among themselves), a replica perhaps replaced; the same
    /// checks, and every member's messages a second counted.
    Membership1000,
    /// Two rails, each a source-routed fabric (Tang and Bilas [TB]
    /// section 4.2): a chain of four 16-port switches, four hosts on each,
    /// the three nodes on the first. Mid-stream node 1 is unplugged and
    /// plugged in 1 to 4 hops away (by seed) on both rails, under 2% loss:
    /// its routes and its peers' routes to it lead nowhere until the
    /// core's path layer judges the paths down and the route books find
    /// new ones by probing. Nothing may be lost.
    FabricMove,
    /// The same at 1,000 hosts: 40 switches of 32 ports, 25 hosts each.
    FabricMove1000,
    /// The same on a 6 x 6 torus of 10-port switches, four hosts on each.
    FabricMoveTorus,
    /// The same on a random fabric, another at each seed: 48 switches of
    /// 9 ports, four hosts and three links on each.
    FabricMoveRandom,
}

impl FaultMix {
    pub const ALL: [FaultMix; 32] = [
        FaultMix::Clean,
        FaultMix::Loss20,
        FaultMix::HeavyReorder,
        FaultMix::Duplicate,
        FaultMix::Corrupt,
        FaultMix::DeadLink,
        FaultMix::Flaky,
        FaultMix::GoBackN,
        FaultMix::Restart,
        FaultMix::Tight,
        FaultMix::Every,
        FaultMix::RailCut,
        FaultMix::RailsBothCut,
        FaultMix::RailFlap,
        FaultMix::RailLossy,
        FaultMix::RailStripe,
        FaultMix::RailRestart,
        FaultMix::SoftStateLoss,
        FaultMix::RailFaults,
        FaultMix::EngineStateLoss,
        FaultMix::RestartAckLoss,
        FaultMix::Authenticated,
        FaultMix::Swarm,
        FaultMix::ForgedEpochs,
        FaultMix::CallsServerCrash,
        FaultMix::EngineKill,
        FaultMix::Membership,
        FaultMix::Membership1000,
        FaultMix::FabricMove,
        FaultMix::FabricMove1000,
        FaultMix::FabricMoveTorus,
        FaultMix::FabricMoveRandom,
    ];

    pub fn name(self) -> &'static str {
        match self {
            FaultMix::Clean => "clean",
            FaultMix::Loss20 => "loss_20pct",
            FaultMix::HeavyReorder => "heavy_reorder",
            FaultMix::Duplicate => "duplicate",
            FaultMix::Corrupt => "corrupt",
            FaultMix::DeadLink => "dead_link",
            FaultMix::Flaky => "flaky",
            FaultMix::GoBackN => "go_back_n",
            FaultMix::Restart => "restart",
            FaultMix::Tight => "tight",
            FaultMix::Every => "every_fault",
            FaultMix::RailCut => "rail_cut",
            FaultMix::RailsBothCut => "rails_both_cut",
            FaultMix::RailFlap => "rail_flap",
            FaultMix::RailLossy => "rail_lossy_30pct",
            FaultMix::RailStripe => "rail_stripe_cut",
            FaultMix::RailRestart => "rail_restart",
            FaultMix::SoftStateLoss => "soft_state_loss",
            FaultMix::RailFaults => "rail_faults",
            FaultMix::EngineStateLoss => "engine_state_loss",
            FaultMix::RestartAckLoss => "restart_ack_loss",
            FaultMix::Authenticated => "authenticated",
            FaultMix::Swarm => "swarm",
            FaultMix::ForgedEpochs => "forged_epochs",
            FaultMix::CallsServerCrash => "calls_server_crash",
            FaultMix::EngineKill => "engine_kill",
            FaultMix::Membership => "membership",
            FaultMix::Membership1000 => "membership_1000",
            FaultMix::FabricMove => "fabric_move",
            FaultMix::FabricMove1000 => "fabric_move_1000",
            FaultMix::FabricMoveTorus => "fabric_move_torus",
            FaultMix::FabricMoveRandom => "fabric_move_random",
        }
    }

    pub fn from_name(name: &str) -> Option<FaultMix> {
        Self::ALL.into_iter().find(|m| m.name() == name)
    }

    /// True when the mix may legitimately fail messages (else all must arrive).
    pub fn may_fail(self) -> bool {
        matches!(
            self,
            FaultMix::DeadLink
                | FaultMix::Restart
                | FaultMix::RailsBothCut
                | FaultMix::RailRestart
                | FaultMix::RestartAckLoss
                | FaultMix::Authenticated
                | FaultMix::Swarm
                | FaultMix::ForgedEpochs
        )
    }

    pub fn config(self, seed: u64) -> SimConfig {
        let mut c = SimConfig { mix: self.name(), ..SimConfig::base(seed) };
        // Corruption: three times in four flip 1 to 3 bits, else truncate.
        let corrupt = |p: f64| {
            [format!("modify:p={},bits=1..3", p * 0.75), format!("modify:p={},mode=truncate", p * 0.25)]
        };
        let rules = |c: &mut SimConfig, rules: &[&str]| c.faults = plan(seed, rules);
        match self {
            FaultMix::Clean => {}
            FaultMix::Loss20 => rules(&mut c, &["drop:p=0.2"]),
            // A uniform delay wider than the gap between datagrams reorders them.
            FaultMix::HeavyReorder => rules(&mut c, &["delay:p=1,min=0us,max=400us"]),
            FaultMix::Duplicate => rules(&mut c, &["duplicate:p=0.2"]),
            FaultMix::Corrupt => {
                let [flip, cut] = corrupt(0.1);
                rules(&mut c, &[&flip, &cut]);
            }
            FaultMix::DeadLink => {
                c.cuts.push(LinkCut {
                    a: 0,
                    b: 1,
                    at: Duration::from_micros(800),
                    until: None,
                    rail: None,
                    one_way: false,
                });
            }
            FaultMix::Flaky => {
                let [flip, cut] = corrupt(0.03);
                rules(
                    &mut c,
                    &["delay:p=1,min=0us,max=100us", "drop:p=0.05", "duplicate:p=0.03", &flip, &cut],
                );
                c.cuts.push(LinkCut {
                    a: 1,
                    b: 2,
                    at: Duration::from_micros(500),
                    until: Some(Duration::from_millis(20)),
                    rail: None,
                    one_way: false,
                });
            }
            FaultMix::GoBackN => {
                rules(&mut c, &["drop:p=0.05"]);
                c.proto.retransmit = RetransmitMode::GoBackN;
            }
            FaultMix::Restart => {
                rules(&mut c, &["drop:p=0.02"]);
                c.restarts.push((1, Duration::from_millis(1)));
            }
            FaultMix::Tight => {
                let [flip, cut] = corrupt(0.02);
                rules(
                    &mut c,
                    &["delay:p=1,min=0us,max=60us", "drop:p=0.05", "duplicate:p=0.02", &flip, &cut],
                );
                tighten(&mut c);
            }
            FaultMix::Every => rules(&mut c, EVERY_FAULT),
            FaultMix::RailCut => {
                c.rails = 2;
                c.cuts.push(cut_rail(0, 1, 0, Duration::from_micros(800), None));
            }
            FaultMix::RailsBothCut => {
                c.rails = 2;
                // Enough traffic that every seed is still sending when the
                // second rail dies (with 40 messages a stream, one seed in
                // a hundred had everything acknowledged by 3 ms).
                c.messages_per_stream = 80;
                c.cuts.push(cut_rail(0, 1, 0, Duration::from_micros(800), None));
                c.cuts.push(cut_rail(0, 1, 1, Duration::from_millis(3), None));
            }
            FaultMix::RailFlap => {
                c.rails = 2;
                // Each cut outlasts the 2 ms patience and the asks after
                // it (a path is judged on three unanswered asks, the
                // latest silent for half the patience): shorter ones are
                // ridden out and move nothing.
                for i in 0..8u64 {
                    let at = Duration::from_micros(300 + 6_000 * i);
                    c.cuts.push(cut_rail(1, 2, 0, at, Some(at + Duration::from_millis(4))));
                }
            }
            FaultMix::RailLossy => {
                c.rails = 2;
                c.rail_loss.push((0, 0.3));
            }
            FaultMix::RailStripe => {
                c.rails = 2;
                c.proto.rail_policy = RailPolicy::Stripe;
                c.cuts.push(cut_rail(0, 2, 1, Duration::from_micros(600), None));
            }
            FaultMix::RailRestart => {
                c.rails = 2;
                c.cuts.push(cut_rail(0, 1, 0, Duration::from_micros(800), None));
                c.restarts.push((1, Duration::from_millis(2)));
            }
            FaultMix::SoftStateLoss => {
                rules(&mut c, &["drop:p=0.05", "delay:p=0.3,min=0us,max=200us", "duplicate:p=0.03"]);
                engine_losses(&mut c, seed ^ 0x5AF7_5747_E105_5E5D);
            }
            FaultMix::EngineStateLoss => {
                c.proto.deliver_fragments = true;
                rules(&mut c, &["drop:p=0.05", "delay:p=0.3,min=0us,max=200us", "duplicate:p=0.03"]);
                engine_losses(&mut c, seed ^ 0xE791_6E5A_7E10_55E5);
            }
            FaultMix::RailFaults => {
                c.rails = 2;
                let [flip, cut] = corrupt(0.03);
                rules(
                    &mut c,
                    &["drop:p=0.05", "delay:p=0.5,min=0us,max=150us", "duplicate:p=0.03", &flip, &cut],
                );
                c.cuts.push(cut_rail(0, 1, 0, Duration::from_micros(800), None));
            }
            FaultMix::RestartAckLoss => {
                rules(&mut c, &["drop:p=0.02"]);
                let (from, until) = (Duration::from_millis(1), Some(Duration::from_millis(4)));
                for other in [0, 2] {
                    c.cuts.push(LinkCut { a: 1, b: other, at: from, until, rail: None, one_way: true });
                }
                c.restarts.push((1, Duration::from_micros(2_500)));
            }
            FaultMix::Authenticated => {
                rules(&mut c, EVERY_FAULT);
                let material = [&seed.to_le_bytes()[..], b"sim cluster secret"].concat();
                // Each algorithm in turn: every third seed alike.
                let auth = AuthKind::ALL[seed as usize % AuthKind::ALL.len()];
                let key = ClusterKey::from_material(&material).expect("26 bytes of material");
                c.proto.key = Some(key.with_auth(auth));
                // After the first loss burst (the first 2 ms), mid-stream.
                c.restarts.push((1, Duration::from_millis(6)));
                c.soft_losses.push((0, Duration::from_micros(4_500)));
                c.soft_losses.push((2, Duration::from_micros(7_000)));
            }
            FaultMix::Swarm => swarm(&mut c, seed),
            FaultMix::ForgedEpochs => {
                rules(&mut c, &["drop:p=0.03", "delay:p=0.3,min=0us,max=150us", "duplicate:p=0.03"]);
                c.forgeries = 4;
                c.forge_within = 1_500;
            }
            FaultMix::CallsServerCrash => {
                c.workload = Workload::Calls;
                c.nodes = 2;
                rules(&mut c, &["drop:p=0.02", "duplicate:p=0.02", "modify:p=0.02,bits=1"]);
                c.proto = crate::calls::proto_config();
                // Faults and crashes for the first 250 ms, then 30 s to end.
                c.safety_phase = Duration::from_millis(250);
                c.time_limit = Duration::from_secs(30);
            }
            FaultMix::EngineKill => {
                c.workload = Workload::Engines;
                c.rails = 2;
                let [flip, cut] = corrupt(0.02);
                rules(
                    &mut c,
                    &["delay:p=1,min=0us,max=100us", "drop:p=0.05", "duplicate:p=0.03", &flip, &cut],
                );
                c.safety_phase = Duration::from_millis(40);
                c.engine_kills = engine_kills(seed, c.safety_phase);
                c.time_limit = Duration::from_secs(5);
            }
            FaultMix::FabricMove
            | FaultMix::FabricMove1000
            | FaultMix::FabricMoveTorus
            | FaultMix::FabricMoveRandom => {
                c.rails = 2;
                // Enough that the streams are under way at the move and
                // long after it.
                c.messages_per_stream = 120;
                rules(&mut c, &["drop:p=0.02"]);
                let mut rng = Pcg64Mcg::seed_from_u64(seed ^ 0xFAB2_1C00_4D0E_5EED);
                let topology = match self {
                    FaultMix::FabricMove => Topology::Chain { switches: 4, ports: 16, hosts: 4 },
                    FaultMix::FabricMove1000 => Topology::Chain { switches: 40, ports: 32, hosts: 25 },
                    FaultMix::FabricMoveTorus => Topology::Torus { width: 6, height: 6, hosts: 4 },
                    _ => Topology::Random { switches: 48, ports: 9, hosts: 4, seed: rng.gen() },
                };
                let at = Duration::from_micros(rng.gen_range(300..=1_500));
                // 1 to 4 hops by seed.
                let plan = FabricPlan::moving(topology, c.nodes, 1, 1 + (seed % 4) as usize, at);
                c.fabric = Some(plan.expect("the mixes' fabrics keep free ports on node 0's switch"));
            }
            FaultMix::Membership | FaultMix::Membership1000 => {
                c.workload = Workload::Membership;
                c.nodes = if self == FaultMix::Membership { 6 + (seed % 11) as u32 } else { 1_000 };
                rules(
                    &mut c,
                    &[
                        "drop:p=0.03,side=send",
                        "duplicate:p=0.02,side=send",
                        "inject:p=0.002,side=send",
                        // Everything lost for 20 ms in every second: two
                        // heartbeats missed by everyone at once.
                        "drop:p=1,on=20ms,off=980ms,side=send",
                    ],
                );
            }
        }
        c
    }
}

/// Every message fault of Li et al. [CI] at once, from both sides.
const EVERY_FAULT: &[&str] = &[
    "drop:p=0.03,side=send",
    "drop:p=0.03,side=recv",
    "delay:p=0.05,mean=300us",
    "modify:p=0.02,bits=1..8",
    "modify:p=0.01,mode=truncate",
    "modify:p=0.01,mode=extend,by=1..64",
    "reorder:p=0.05,depth=4,max_hold=2ms",
    "duplicate:p=0.03,copies=2",
    "inject:p=0.02",
    // A burst: everything lost for 2 ms in every 10 ms.
    "drop:p=1,on=2ms,off=8ms",
];

/// Four to ten engine failures (`soft_losses`) at nodes and moments drawn
/// from a stream of their own (`seed`), so the run's RNG and every other
/// mix are untouched.
fn engine_losses(c: &mut SimConfig, seed: u64) {
    let mut rng = Pcg64Mcg::seed_from_u64(seed);
    for _ in 0..rng.gen_range(4..=10) {
        let node = rng.gen_range(0..c.nodes);
        let at = Duration::from_micros(rng.gen_range(50..=4_000));
        c.soft_losses.push((node, at));
    }
}

/// Hosts of the engines workload (`Workload::Engines`), each with an
/// engine; application `n` runs on host `n % HOSTS`.
pub const HOSTS: usize = 2;

/// One to three engine kills, at hosts, moments and outages drawn from a
/// stream of their own (`seed`): within the first `within` of the run,
/// each engine down for up to 5 ms.
fn engine_kills(seed: u64, within: Duration) -> Vec<(u32, Duration, Duration)> {
    let mut rng = Pcg64Mcg::seed_from_u64(seed ^ 0x6B69_6C6C_0000_0001);
    let within = within.as_micros().max(1_000) as u64;
    (0..rng.gen_range(1..=3))
        .map(|_| {
            let host = rng.gen_range(0..HOSTS as u32);
            let at = Duration::from_micros(rng.gen_range(500..within));
            let outage = Duration::from_micros(rng.gen_range(0..=5_000));
            (host, at, outage)
        })
        .collect()
}

fn cut_rail(a: NodeId, b: NodeId, rail: RailId, at: Duration, until: Option<Duration>) -> LinkCut {
    LinkCut { a, b, at, until, rail: Some(rail), one_way: false }
}

/// Every limit at its smallest (the `tight` mix): tiny windows, 256-byte
/// datagrams, send buffer and delivery queue just one largest message (in
/// memory) and a few messages (in count), and a reader that takes one
/// message per millisecond.
fn tighten(c: &mut SimConfig) {
    c.proto.max_datagram = 256;
    c.proto.send_window = 2;
    c.proto.recv_window = 4;
    c.proto.max_message_len = 128 * 1024;
    c.proto.send_buffer_bytes = 128 * 1024;
    c.proto.delivery_queue_bytes = 128 * 1024;
    c.proto.send_buffer_messages = 32;
    c.proto.delivery_queue_messages = 8;
    c.reader_batch = Some(1);
}

/// Draw a whole world from the seed (Groce et al.'s swarm testing: each
/// run leaves out a random set of features, so rare combinations appear).
fn swarm(c: &mut SimConfig, seed: u64) {
    let mut rng = Pcg64Mcg::seed_from_u64(seed ^ 0x5A4A_4D00_0000_0001);
    let mut rules: Vec<String> = Vec::new();
    c.nodes = rng.gen_range(2..=4);
    c.rails = rng.gen_range(1..=2);
    let mut maybe = |p: f64| rng.gen_bool(p);
    let (drop, delay, dup, flip, truncate, reorder, inject) =
        (maybe(0.5), maybe(0.5), maybe(0.3), maybe(0.3), maybe(0.2), maybe(0.2), maybe(0.1));
    if drop {
        rules.push(format!("drop:p={:.3}", rng.gen_range(0.0..0.2)));
    }
    if delay {
        rules.push(format!("delay:p={:.3},min=0us,max={}us", rng.gen_range(0.0..1.0), rng.gen_range(1..400)));
    }
    if dup {
        rules.push(format!("duplicate:p={:.3}", rng.gen_range(0.0..0.1)));
    }
    if flip {
        rules.push(format!("modify:p={:.3},bits=1..4", rng.gen_range(0.0..0.05)));
    }
    if truncate {
        rules.push(format!("modify:p={:.3},mode=truncate", rng.gen_range(0.0..0.02)));
    }
    if reorder {
        rules.push(format!(
            "reorder:p={:.3},depth={},max_hold=2ms",
            rng.gen_range(0.0..0.1),
            rng.gen_range(2..6)
        ));
    }
    if inject {
        rules.push(format!("inject:p={:.3}", rng.gen_range(0.0..0.02)));
    }
    let refs: Vec<&str> = rules.iter().map(String::as_str).collect();
    c.faults = plan(seed, &refs);
    let node = |rng: &mut Pcg64Mcg, n: u32| rng.gen_range(0..n);
    if rng.gen_bool(0.2) {
        let (a, b) = (node(&mut rng, c.nodes), node(&mut rng, c.nodes));
        if a != b {
            let at = Duration::from_micros(rng.gen_range(300..3_000));
            let until = rng.gen_bool(0.5).then(|| at + Duration::from_micros(rng.gen_range(500..5_000)));
            let rail = (c.rails > 1 && rng.gen_bool(0.7)).then(|| rng.gen_range(0..c.rails));
            c.cuts.push(LinkCut { a, b, at, until, rail, one_way: false });
        }
    }
    if rng.gen_bool(0.15) {
        let n = node(&mut rng, c.nodes);
        c.restarts.push((n, Duration::from_micros(rng.gen_range(500..5_000))));
    }
    if rng.gen_bool(0.3) {
        for _ in 0..rng.gen_range(1..=5) {
            let n = node(&mut rng, c.nodes);
            c.soft_losses.push((n, Duration::from_micros(rng.gen_range(50..4_000))));
        }
    }
    if rng.gen_bool(0.15) {
        c.proto.retransmit = RetransmitMode::GoBackN;
    }
    if c.rails > 1 && rng.gen_bool(0.3) {
        c.proto.rail_policy = RailPolicy::Stripe;
    }
    if rng.gen_bool(0.15) {
        tighten(c);
    } else {
        c.proto.send_window = [8, 64, 256][rng.gen_range(0..3)];
        c.proto.max_datagram = [512, 1472, 9000][rng.gen_range(0..3)];
    }
}

impl SimConfig {
    /// Can messages legitimately fail in this world (a node restarts, or a
    /// link dies with no other rail)? Else every message must be
    /// delivered. (A swarm world has at most one cut.)
    pub fn may_fail(&self) -> bool {
        let kills_a_link = |c: &LinkCut| c.rail.is_none() || self.rails <= 1;
        !self.restarts.is_empty() || self.cuts.iter().any(kills_a_link)
    }
}
