//! What a simulation run is: nodes, workload, link faults, protocol
//! configuration, time limits and the seed. `Display` prints every
//! parameter, so a failing run can be read and replayed.

use std::fmt;
use std::time::Duration;

use tether_proto::{Config, NodeId, RetransmitMode};

/// Faults on every link, and the special events of a run.
#[derive(Debug, Clone, PartialEq)]
pub struct LinkFaults {
    pub latency: Duration,
    /// Extra delay, uniform in [0, jitter]: larger than the gap between
    /// datagrams, it reorders them.
    pub jitter: Duration,
    pub loss: f64,
    pub duplicate: f64,
    /// Flip 1 to 3 random bits (or, one time in four, truncate).
    pub corrupt: f64,
}

impl Default for LinkFaults {
    fn default() -> Self {
        LinkFaults {
            latency: Duration::from_micros(20),
            jitter: Duration::ZERO,
            loss: 0.0,
            duplicate: 0.0,
            corrupt: 0.0,
        }
    }
}

/// A link that dies: both directions between two nodes, from `at` until
/// `until` (`None`: for good).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkCut {
    pub a: NodeId,
    pub b: NodeId,
    pub at: Duration,
    pub until: Option<Duration>,
}

#[derive(Debug, Clone)]
pub struct SimConfig {
    pub seed: u64,
    pub nodes: u32,
    pub messages_per_stream: u64,
    pub faults: LinkFaults,
    pub cuts: Vec<LinkCut>,
    /// Nodes that crash and restart as a new incarnation, and when.
    pub restarts: Vec<(NodeId, Duration)>,
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
    pub mix: &'static str,
}

impl SimConfig {
    /// The base every preset starts from: small, quick, many seeds.
    pub fn base(seed: u64) -> Self {
        SimConfig {
            seed,
            nodes: 3,
            messages_per_stream: 40,
            faults: LinkFaults::default(),
            cuts: Vec::new(),
            restarts: Vec::new(),
            proto: Config { abandon_after: Duration::from_millis(300), ..Config::default() },
            safety_phase: Duration::from_millis(50),
            time_limit: Duration::from_secs(30),
            pace: Duration::from_micros(100),
            reader_batch: None,
            mix: "custom",
        }
    }
}

impl fmt::Display for SimConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = &self.proto;
        write!(
            f,
            "seed={} mix={} nodes={} messages_per_stream={} faults={:?} cuts={:?} restarts={:?} \
             safety_phase={:?} time_limit={:?} pace={:?} reader_batch={:?} window={} rto_min={:?} \
             abandon_after={:?} mode={:?}",
            self.seed,
            self.mix,
            self.nodes,
            self.messages_per_stream,
            self.faults,
            self.cuts,
            self.restarts,
            self.safety_phase,
            self.time_limit,
            self.pace,
            self.reader_batch,
            p.send_window,
            p.rto_min,
            p.abandon_after,
            p.retransmit
        )
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
}

impl FaultMix {
    pub const ALL: [FaultMix; 10] = [
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
        }
    }

    pub fn from_name(name: &str) -> Option<FaultMix> {
        Self::ALL.into_iter().find(|m| m.name() == name)
    }

    /// True when the mix may legitimately fail messages (else all must arrive).
    pub fn may_fail(self) -> bool {
        matches!(self, FaultMix::DeadLink | FaultMix::Restart)
    }

    pub fn config(self, seed: u64) -> SimConfig {
        let mut c = SimConfig { mix: self.name(), ..SimConfig::base(seed) };
        let us = Duration::from_micros;
        match self {
            FaultMix::Clean => {}
            FaultMix::Loss20 => c.faults.loss = 0.2,
            FaultMix::HeavyReorder => c.faults.jitter = us(400),
            FaultMix::Duplicate => c.faults.duplicate = 0.2,
            FaultMix::Corrupt => c.faults.corrupt = 0.1,
            FaultMix::DeadLink => {
                c.cuts.push(LinkCut { a: 0, b: 1, at: Duration::from_micros(800), until: None });
            }
            FaultMix::Flaky => {
                c.faults =
                    LinkFaults { jitter: us(100), loss: 0.05, duplicate: 0.03, corrupt: 0.03, ..c.faults };
                c.cuts.push(LinkCut {
                    a: 1,
                    b: 2,
                    at: Duration::from_micros(500),
                    until: Some(Duration::from_millis(20)),
                });
            }
            FaultMix::GoBackN => {
                c.faults.loss = 0.05;
                c.proto.retransmit = RetransmitMode::GoBackN;
            }
            FaultMix::Restart => {
                c.faults.loss = 0.02;
                c.restarts.push((1, Duration::from_millis(1)));
            }
            FaultMix::Tight => {
                c.faults =
                    LinkFaults { jitter: us(60), loss: 0.05, duplicate: 0.02, corrupt: 0.02, ..c.faults };
                c.proto.max_datagram = 256;
                c.proto.send_window = 2;
                c.proto.recv_window = 4;
                c.proto.max_message_len = 128 * 1024;
                c.proto.send_buffer_bytes = 128 * 1024;
                c.proto.delivery_queue_bytes = 128 * 1024;
                c.reader_batch = Some(1);
            }
        }
        c
    }
}
