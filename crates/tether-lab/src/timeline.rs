//! The rails of a run as the sending endpoint saw them (the multi-rail
//! failover of Trahay et al. [NMAD] section 3, the transient/permanent
//! split of Tang and Bilas [TB] section 4): every path state change and
//! every failover with its gap, times relative to the start of the run,
//! and each path's counters at the end.

use serde::Serialize;
use tether::{Endpoint, Event, Failover, Instant, NodeId, PathInfo};

/// A path state change (`Event::PathChanged`, written as the core writes
/// it), at `t_ms` from the start of the run.
#[derive(Debug, Clone, Serialize)]
pub struct RailEvent {
    pub t_ms: f64,
    #[serde(flatten)]
    pub event: Event,
}

/// A failover as the core reports it (`from`, `to`, `gap` in ns), at
/// `t_ms` from the start of the run, with the gap in milliseconds too:
/// tables and the netns test read `gap_ms`.
#[derive(Debug, Clone, Serialize)]
pub struct FailoverRecord {
    pub t_ms: f64,
    #[serde(flatten)]
    pub failover: Failover,
    /// Last ACK for data over `from` to the first for data over `to`.
    pub gap_ms: f64,
}

/// One path at the end of the run as the core reports it, with the round
/// trip in microseconds too (the unit the tables print).
#[derive(Debug, Clone, Serialize)]
pub struct PathRecord {
    #[serde(flatten)]
    pub path: PathInfo,
    pub rtt_us: Option<f64>,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Timeline {
    pub events: Vec<RailEvent>,
    pub failovers: Vec<FailoverRecord>,
    pub paths: Vec<PathRecord>,
}

impl Timeline {
    /// Drain `ep`'s events (other kinds are dropped: the stream reports
    /// failures through its own checks) and read its paths to `peer`.
    pub fn collect(ep: &Endpoint, peer: NodeId, origin: Instant) -> Self {
        Self::collect_all(ep, &[peer], origin).pop().map(|(_, t)| t).unwrap_or_default()
    }

    /// One timeline per peer in `peers`, from one drain of `ep`'s events.
    pub fn collect_all(ep: &Endpoint, peers: &[NodeId], origin: Instant) -> Vec<(NodeId, Self)> {
        let ms = |at: Instant| at.saturating_since(origin).as_secs_f64() * 1e3;
        let mut out: Vec<(NodeId, Timeline)> = peers.iter().map(|&p| (p, Timeline::default())).collect();
        fn of(out: &mut [(NodeId, Timeline)], peer: NodeId) -> Option<&mut Timeline> {
            out.iter_mut().find(|(p, _)| *p == peer).map(|(_, t)| t)
        }
        while let Some(e) = ep.poll_event() {
            match e {
                Event::PathChanged { peer, at, .. } => {
                    if let Some(t) = of(&mut out, peer) {
                        t.events.push(RailEvent { t_ms: ms(at), event: e });
                    }
                }
                Event::FailedOver { peer, failover, at } => {
                    if let Some(t) = of(&mut out, peer) {
                        let gap_ms = failover.gap.as_secs_f64() * 1e3;
                        t.failovers.push(FailoverRecord { t_ms: ms(at), failover, gap_ms });
                    }
                }
                _ => {}
            }
        }
        for (peer, t) in &mut out {
            t.paths = ep.paths(*peer).iter().map(PathRecord::of).collect();
        }
        out
    }

    pub fn is_empty(&self) -> bool {
        self.events.is_empty() && self.failovers.is_empty() && self.paths.len() <= 1
    }
}

impl PathRecord {
    fn of(p: &PathInfo) -> Self {
        PathRecord { path: *p, rtt_us: p.rtt.map(|d| d.as_secs_f64() * 1e6) }
    }
}
