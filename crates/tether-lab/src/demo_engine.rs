//! `tether demo --engine`: the demo's verified all-to-all workload with each
//! node's application attached to a `tether engine` process of its own
//! (docs/ENGINE.md; Zhou et al. [FTGM], the engine as a failure domain).
//! Mid-run one engine is killed with SIGKILL and another stopped with
//! SIGSTOP; each supervisor's timeline (death or hang seen, fencing, the new
//! engine) is printed beside the first message delivered after, and the
//! usual totals say whether anything was lost, repeated or corrupted.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use tether::{Endpoint, Event, NodeId};

use crate::engine_proc::{EngineProcess, Line};
use crate::net::loopback;

/// A fault the demo strikes an engine with, once a share of all messages
/// has been delivered.
struct Strike {
    node: NodeId,
    signal: libc::c_int,
    /// Struck once this share of the node's messages is delivered to it.
    at_share: f64,
    /// When it was struck (since the run's start), and the engine's pid.
    struck: Option<(Duration, u32)>,
}

/// The engines of a demo run, one per node, and what struck them.
pub struct Engines {
    procs: Vec<EngineProcess>,
    strikes: Vec<Strike>,
}

/// One line of the timeline: what happened to node `node`'s engine and when.
#[derive(Debug, Clone, Serialize)]
pub struct EngineEvent {
    /// Since the run's start.
    pub ms: f64,
    pub node: NodeId,
    pub what: String,
}

/// One strike followed through: each figure in milliseconds after it.
#[derive(Debug, Clone, Serialize)]
pub struct Recovery {
    pub node: NodeId,
    pub fault: &'static str,
    /// When it struck, since the run's start.
    pub at_ms: f64,
    /// Death or hang reported by the supervisor.
    pub detected_ms: Option<f64>,
    /// A new engine serving.
    pub replaced_ms: Option<f64>,
    /// The first message delivered to the node's application after that.
    pub first_delivery_ms: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct EngineRun {
    pub timeline: Vec<EngineEvent>,
    pub recoveries: Vec<Recovery>,
    /// Engines replaced that no strike caused (a heartbeat late on a busy
    /// machine is a hang to the supervisor: replaced, nothing lost).
    pub unprovoked: usize,
    /// Per node, `EngineRecovered` events its endpoint was told.
    pub told: Vec<u64>,
}

fn signal_name(signal: libc::c_int) -> &'static str {
    if signal == libc::SIGKILL {
        "kill -9"
    } else {
        "SIGSTOP"
    }
}

/// The cluster the engines serve: what of the demo's options they need.
#[derive(Debug, Clone, Copy)]
pub struct Cluster {
    pub nodes: u32,
    /// The run's seed; each node's fault seed is drawn from it.
    pub seed: u64,
    pub rails: usize,
    /// The engines' watchdog: a turn longer than this is a hang.
    pub hang_after_us: u64,
}

impl Engines {
    /// Start one supervised engine per node of `o`, each injecting `rules`
    /// into what it receives, with a fault seed of its own.
    pub fn start(o: Cluster, rules: &[String]) -> anyhow::Result<Self> {
        let mut procs = Vec::new();
        for node in 0..o.nodes {
            let seed = tether::faults::node_seed(o.seed, node).to_string();
            let hang = o.hang_after_us.to_string();
            let mut extra = vec!["--seed", &seed, "--hang-after-us", &hang];
            for r in rules {
                extra.extend(["--fault", r.as_str()]);
            }
            procs.push(EngineProcess::start(&format!("demo-{node}"), &vec![loopback(); o.rails], &extra)?);
        }
        let strikes = vec![
            Strike { node: 0, signal: libc::SIGKILL, at_share: 1.0 / 3.0, struck: None },
            Strike { node: 1, signal: libc::SIGSTOP, at_share: 2.0 / 3.0, struck: None },
        ];
        Ok(Engines { procs, strikes })
    }

    /// An endpoint per node, attached to its engine, every other node a peer
    /// on every rail.
    pub fn endpoints(&self) -> anyhow::Result<Vec<Arc<Endpoint>>> {
        let mut endpoints = Vec::new();
        for (node, e) in self.procs.iter().enumerate() {
            let mut b = Endpoint::builder(node as NodeId).engine(e.dir());
            for (peer, p) in self.procs.iter().enumerate().filter(|&(p, _)| p != node) {
                b = b.peer_rails(peer as NodeId, &p.rails);
            }
            endpoints.push(Arc::new(b.build()?));
        }
        Ok(endpoints)
    }

    /// Strike what is due, `delivered` being the messages each node has
    /// had of the `expect` each is sent: every strike comes while its node
    /// still has messages to receive, so delivery after it is seen.
    pub fn strike(&mut self, delivered: &[u64], expect: u64, origin: Instant) -> anyhow::Result<()> {
        for s in self.strikes.iter_mut().filter(|s| s.struck.is_none()) {
            if delivered[s.node as usize] as f64 >= s.at_share * expect as f64 {
                let pid = self.procs[s.node as usize].signal_engine(s.signal)?;
                s.struck = Some((origin.elapsed(), pid));
            }
        }
        Ok(())
    }

    /// Every supervisor's timeline since the start, with the strikes, and
    /// each strike followed to the first delivery after it (`delivered_at`:
    /// per node, when each message reached its application, in ns since
    /// the start); `endpoints` are asked what they were told.
    pub fn report(
        &mut self,
        origin: Instant,
        delivered_at: &[Vec<u64>],
        endpoints: &[Arc<Endpoint>],
    ) -> EngineRun {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let mut timeline = Vec::new();
        let mut recoveries = Vec::new();
        let mut unprovoked = 0;
        for s in &self.strikes {
            if let Some((at, pid)) = s.struck {
                let what = format!("{} engine {pid}", signal_name(s.signal));
                timeline.push(EngineEvent { ms: ms(at), node: s.node, what });
            }
        }
        for (node, e) in self.procs.iter().enumerate() {
            let node = node as NodeId;
            // This node's strikes in the order they struck, each waiting
            // for the supervisor to report it.
            let mut pending: Vec<Recovery> = self
                .strikes
                .iter()
                .filter(|s| s.node == node)
                .filter_map(|s| {
                    let (at, _) = s.struck?;
                    Some(Recovery {
                        node,
                        fault: signal_name(s.signal),
                        at_ms: ms(at),
                        detected_ms: None,
                        replaced_ms: None,
                        first_delivery_ms: None,
                    })
                })
                .collect();
            let mut provoked = false;
            while let Some((when, text)) = e.next_line(Duration::ZERO) {
                let t = ms(when.saturating_duration_since(origin));
                let line = Line::parse(&text);
                // "   507.993 ms engine 18964 ..." without the supervisor's own clock.
                let said = text.split_once(" ms ").map_or(text.trim(), |(_, rest)| rest).to_string();
                let mut what = said;
                match line {
                    Line::Died | Line::Hung { .. } => {
                        provoked = match pending.iter_mut().find(|r| r.detected_ms.is_none() && r.at_ms <= t)
                        {
                            Some(r) => {
                                r.detected_ms = Some(t - r.at_ms);
                                true
                            }
                            None => false,
                        };
                        if !provoked {
                            what.push_str(" (not struck by the demo)");
                        }
                    }
                    Line::Replaced { .. } => {
                        let r =
                            pending.iter_mut().find(|r| r.detected_ms.is_some() && r.replaced_ms.is_none());
                        match r.filter(|_| provoked) {
                            Some(r) => {
                                r.replaced_ms = Some(t - r.at_ms);
                                let after = (t * 1e6) as u64;
                                let first = delivered_at[node as usize].iter().find(|&&d| d >= after);
                                if let Some(&d) = first {
                                    r.first_delivery_ms = Some(d as f64 / 1e6 - r.at_ms);
                                    timeline.push(EngineEvent {
                                        ms: d as f64 / 1e6,
                                        node,
                                        what: "first message delivered to the application after".into(),
                                    });
                                }
                            }
                            None => unprovoked += 1,
                        }
                    }
                    Line::Fenced | Line::Other => {}
                }
                timeline.push(EngineEvent { ms: t, node, what });
            }
            recoveries.append(&mut pending);
        }
        timeline.sort_by(|a, b| a.ms.total_cmp(&b.ms));
        let told = endpoints
            .iter()
            .map(|ep| {
                std::iter::from_fn(|| ep.poll_event())
                    .filter(|e| matches!(e, Event::EngineRecovered { .. }))
                    .count() as u64
            })
            .collect();
        EngineRun { timeline, recoveries, unprovoked, told }
    }
}
