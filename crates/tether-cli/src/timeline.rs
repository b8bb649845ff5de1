//! The rails of a run as the sending endpoint saw them (the multi-rail
//! failover of Trahay et al. [NMAD] section 3, the transient/permanent
//! split of Tang and Bilas [TB] section 4): every path state change and
//! every failover with its gap, times relative to the start of the run,
//! and each path's counters at the end.

use serde::Serialize;
use tether::{Endpoint, Event, Instant, NodeId, PathInfo, PathState};

#[derive(Debug, Clone, Serialize)]
pub struct RailEvent {
    pub t_ms: f64,
    pub rail: u8,
    pub from: &'static str,
    pub to: &'static str,
}

#[derive(Debug, Clone, Serialize)]
pub struct FailoverRecord {
    pub t_ms: f64,
    pub from: u8,
    pub to: u8,
    /// Last ACK for data over `from` to the first for data over `to`.
    pub gap_ms: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct PathRecord {
    pub rail: u8,
    pub state: &'static str,
    pub rtt_us: Option<f64>,
    pub datagrams_sent: u64,
    pub data_frames_sent: u64,
    pub retransmits: u64,
    pub probes_sent: u64,
    pub datagrams_received: u64,
    pub state_changes: u64,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Timeline {
    pub events: Vec<RailEvent>,
    pub failovers: Vec<FailoverRecord>,
    pub paths: Vec<PathRecord>,
}

pub fn state_name(s: PathState) -> &'static str {
    match s {
        PathState::Active => "active",
        PathState::Suspect => "suspect",
        PathState::Down => "down",
    }
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
                Event::PathChanged { peer, rail, from, to, at } => {
                    if let Some(t) = of(&mut out, peer) {
                        t.events.push(RailEvent {
                            t_ms: ms(at),
                            rail,
                            from: state_name(from),
                            to: state_name(to),
                        });
                    }
                }
                Event::FailedOver { peer, failover: f, at } => {
                    if let Some(t) = of(&mut out, peer) {
                        t.failovers.push(FailoverRecord {
                            t_ms: ms(at),
                            from: f.from,
                            to: f.to,
                            gap_ms: f.gap.as_secs_f64() * 1e3,
                        });
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
        PathRecord {
            rail: p.rail,
            state: state_name(p.state),
            rtt_us: p.rtt.map(|d| d.as_secs_f64() * 1e6),
            datagrams_sent: p.stats.datagrams_sent,
            data_frames_sent: p.stats.data_frames_sent,
            retransmits: p.stats.retransmits,
            probes_sent: p.stats.probes_sent,
            datagrams_received: p.stats.datagrams_received,
            state_changes: p.stats.state_changes,
        }
    }
}
