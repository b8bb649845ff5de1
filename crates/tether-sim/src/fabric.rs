//! A source-routed switched fabric for the simulator: hosts and switches
//! with numbered ports and the links between them, where a datagram
//! carries its route (an output port per switch, taken from the head at
//! each hop, as a Myrinet header does) and goes where the route says or
//! is dropped on the way. The ground under Tang and Bilas [TB] section
//! 4.2 (routes found on demand after a host moves or a link dies), whose
//! design is docs/FABRIC.md; this module is the fabric alone (its
//! topologies, moves and failures, and where a route leads), with no
//! protocol in it.
//!
//! Switches have no identity a probe could read ([TB]: "unlike hosts,
//! Myrinet switches do not have identities"): nothing here gives one out
//! but [`Walk::Switch`], which the simulator's probes answer with and the
//! mapper never sees directly.

use std::collections::{BTreeMap, VecDeque};

pub use tether_proto::mapper::{Answer, Mapped, Mapper, Probe, ProbeCounts};
use tether_proto::NodeId;

/// A switch's number in its fabric.
pub type SwitchId = u32;

/// A port's number on its switch.
pub type Port = u8;

/// What is at the other end of a switch port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    Host(NodeId),
    Switch(SwitchId, Port),
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Switch {
    /// What each port leads to, and whether its link is up.
    ports: Vec<Option<(End, bool)>>,
}

/// Where a route from a host leads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Walk {
    /// Delivered to this host, after this many links.
    Host(NodeId, usize),
    /// The route ran out at a switch (a switch probe's turning point).
    Switch(SwitchId, usize),
    /// Dropped: the route named a port with nothing on it, a dead link,
    /// or a host before its end; or the sender is not attached.
    Dropped(Drop),
}

/// Why a route did not lead anywhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drop {
    NotAttached,
    NoSuchPort,
    DeadLink,
    /// The route reached a host with ports still to take.
    PastHost,
}

/// Why a change to the fabric was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FabricError {
    #[error("no switch {0}")]
    NoSwitch(SwitchId),
    #[error("switch {0} has no port {1}")]
    NoPort(SwitchId, Port),
    #[error("switch {0} port {1} is taken")]
    PortTaken(SwitchId, Port),
    #[error("host {0} is attached already")]
    HostAttached(NodeId),
    #[error("host {0} is not attached")]
    HostNotAttached(NodeId),
}

/// Hosts and switches, and the links between their ports.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Fabric {
    switches: Vec<Switch>,
    /// Where each host is plugged in.
    hosts: BTreeMap<NodeId, (SwitchId, Port)>,
}

impl Fabric {
    /// A switch of `ports` ports, nothing plugged in: its number.
    pub fn add_switch(&mut self, ports: usize) -> SwitchId {
        self.switches.push(Switch { ports: vec![None; ports.min(Port::MAX as usize + 1)] });
        (self.switches.len() - 1) as SwitchId
    }

    fn free(&self, sw: SwitchId, port: Port) -> Result<(), FabricError> {
        let s = self.switches.get(sw as usize).ok_or(FabricError::NoSwitch(sw))?;
        match s.ports.get(port as usize) {
            None => Err(FabricError::NoPort(sw, port)),
            Some(Some(_)) => Err(FabricError::PortTaken(sw, port)),
            Some(None) => Ok(()),
        }
    }

    /// Nothing is plugged into `port` of `sw`.
    pub fn is_free(&self, sw: SwitchId, port: Port) -> bool {
        self.free(sw, port).is_ok()
    }

    /// Link two switch ports.
    pub fn link(&mut self, a: (SwitchId, Port), b: (SwitchId, Port)) -> Result<(), FabricError> {
        self.free(a.0, a.1)?;
        self.free(b.0, b.1)?;
        if a == b {
            return Err(FabricError::PortTaken(a.0, a.1));
        }
        self.switches[a.0 as usize].ports[a.1 as usize] = Some((End::Switch(b.0, b.1), true));
        self.switches[b.0 as usize].ports[b.1 as usize] = Some((End::Switch(a.0, a.1), true));
        Ok(())
    }

    /// Plug `host` into a switch port.
    pub fn attach(&mut self, host: NodeId, at: (SwitchId, Port)) -> Result<(), FabricError> {
        if self.hosts.contains_key(&host) {
            return Err(FabricError::HostAttached(host));
        }
        self.free(at.0, at.1)?;
        self.switches[at.0 as usize].ports[at.1 as usize] = Some((End::Host(host), true));
        self.hosts.insert(host, at);
        Ok(())
    }

    /// Unplug `host` and plug it in at `to` ([TB]: a node "re-connected
    /// to a different location of the system"): where it was.
    pub fn move_host(&mut self, host: NodeId, to: (SwitchId, Port)) -> Result<(SwitchId, Port), FabricError> {
        let from = *self.hosts.get(&host).ok_or(FabricError::HostNotAttached(host))?;
        self.free(to.0, to.1)?;
        self.switches[from.0 as usize].ports[from.1 as usize] = None;
        self.hosts.remove(&host);
        self.attach(host, to)?;
        Ok(from)
    }

    /// Set the link at a switch port up or down (both of its ends).
    pub fn set_link(&mut self, sw: SwitchId, port: Port, up: bool) -> Result<(), FabricError> {
        let s = self.switches.get_mut(sw as usize).ok_or(FabricError::NoSwitch(sw))?;
        let slot = s.ports.get_mut(port as usize).ok_or(FabricError::NoPort(sw, port))?;
        let Some((end, state)) = slot.as_mut() else { return Err(FabricError::NoPort(sw, port)) };
        *state = up;
        if let End::Switch(o, op) = *end {
            if let Some(Some((_, other))) = self.switches[o as usize].ports.get_mut(op as usize) {
                *other = up;
            }
        }
        Ok(())
    }

    /// Where `host` is plugged in.
    pub fn host_at(&self, host: NodeId) -> Option<(SwitchId, Port)> {
        self.hosts.get(&host).copied()
    }

    pub fn hosts(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.hosts.keys().copied()
    }

    pub fn switch_count(&self) -> usize {
        self.switches.len()
    }

    /// Where a datagram from `from` with `route` goes: the first link is
    /// the host's own to its switch, then one port of the route a switch.
    pub fn walk(&self, from: NodeId, route: &[Port]) -> Walk {
        let Some(&(mut sw, port)) = self.hosts.get(&from) else { return Walk::Dropped(Drop::NotAttached) };
        if !self.switches[sw as usize].ports[port as usize].is_some_and(|(_, up)| up) {
            return Walk::Dropped(Drop::DeadLink);
        }
        let mut links = 1;
        for (i, &out) in route.iter().enumerate() {
            match self.switches[sw as usize].ports.get(out as usize) {
                None | Some(None) => return Walk::Dropped(Drop::NoSuchPort),
                Some(Some((_, false))) => return Walk::Dropped(Drop::DeadLink),
                Some(Some((End::Host(h), true))) => {
                    return match i + 1 == route.len() {
                        true => Walk::Host(*h, links + 1),
                        false => Walk::Dropped(Drop::PastHost),
                    };
                }
                Some(Some((End::Switch(next, _), true))) => {
                    sw = *next;
                    links += 1;
                }
            }
        }
        Walk::Switch(sw, links)
    }

    /// The shortest route from `from` to `to` over links that are up, by
    /// breadth-first search with the whole fabric in view: the oracle a
    /// mapper that sees only probe answers is checked against.
    pub fn shortest_route(&self, from: NodeId, to: NodeId) -> Option<Vec<Port>> {
        let &(start, port) = self.hosts.get(&from)?;
        if !self.switches[start as usize].ports[port as usize].is_some_and(|(_, up)| up) {
            return None;
        }
        let mut seen = vec![false; self.switches.len()];
        let mut queue = VecDeque::from([(start, Vec::new())]);
        seen[start as usize] = true;
        while let Some((sw, route)) = queue.pop_front() {
            for (p, slot) in self.switches[sw as usize].ports.iter().enumerate() {
                let mut next = route.clone();
                next.push(p as Port);
                match slot {
                    Some((End::Host(h), true)) if *h == to => return Some(next),
                    Some((End::Switch(o, _), true)) if !seen[*o as usize] => {
                        seen[*o as usize] = true;
                        queue.push_back((*o, next));
                    }
                    _ => {}
                }
            }
        }
        None
    }

    /// The fabric [TB] mapped in (their Figure 2): two 16-port and two
    /// 8-port switches in a chain with two links between neighbours,
    /// `hosts_per_end` hosts (at most 4) on ports 0-3 of the first switch
    /// and of the last one. Hosts are numbered from 1.
    pub fn tang_bilas(hosts_per_end: usize) -> Fabric {
        let mut f = Fabric::default();
        let s: Vec<SwitchId> = [16, 8, 8, 16].into_iter().map(|n| f.add_switch(n)).collect();
        // Two links between each neighbouring pair: ports 14-15 of a
        // 16-port switch, 6-7 of an 8-port one, facing 4-5 of the next.
        for w in s.windows(2) {
            let (a, b) = (w[0], w[1]);
            let up = (f.switches[a as usize].ports.len() - 2) as Port;
            f.link((a, up), (b, 4)).expect("a free port");
            f.link((a, up + 1), (b, 5)).expect("a free port");
        }
        let mut id = 1;
        for &sw in [s[0], s[3]].iter() {
            for p in 0..hosts_per_end.min(4) {
                f.attach(id, (sw, p as Port)).expect("a free port");
                id += 1;
            }
        }
        f
    }

    /// A two-level fat tree of `k`-port switches (k even): k leaves, each
    /// with up to k/2 hosts below (`hosts_per_leaf`, on its first ports;
    /// the rest stay free for hosts moved there) and a link to each of
    /// k/2 spines (k^2/2 hosts when full). Hosts are numbered from 1.
    pub fn fat_tree(k: usize, hosts_per_leaf: usize) -> Fabric {
        let k = k.clamp(2, 254) & !1;
        let mut f = Fabric::default();
        let leaves: Vec<SwitchId> = (0..k).map(|_| f.add_switch(k)).collect();
        let spines: Vec<SwitchId> = (0..k / 2).map(|_| f.add_switch(k)).collect();
        for (li, &leaf) in leaves.iter().enumerate() {
            for (si, &spine) in spines.iter().enumerate() {
                f.link((leaf, (k / 2 + si) as Port), (spine, li as Port)).expect("a free port");
            }
        }
        let mut id = 1;
        for &leaf in &leaves {
            for p in 0..hosts_per_leaf.min(k / 2) {
                f.attach(id, (leaf, p as Port)).expect("a free port");
                id += 1;
            }
        }
        f
    }
}

/// Ports a generated fabric keeps free on every switch, for hosts moved
/// there.
pub const FREE_PORTS: usize = 2;

impl Fabric {
    /// A `width` x `height` torus (a mesh whose rows and columns wrap
    /// around), each switch with `hosts` hosts on its first ports, then
    /// [`FREE_PORTS`] free, then a link to each of its four neighbours
    /// (+x, -x, +y, -y). A dimension of one switch has no links along it.
    /// Switch `y * width + x`; hosts are numbered from 1, switch by switch.
    pub fn torus(width: usize, height: usize, hosts: usize) -> Fabric {
        let (w, h) = (width.clamp(1, 64), height.clamp(1, 64));
        let hosts = hosts.min(Port::MAX as usize + 1 - FREE_PORTS - 4);
        let base = (hosts + FREE_PORTS) as Port;
        let mut f = Fabric::default();
        for _ in 0..w * h {
            f.add_switch(hosts + FREE_PORTS + 4);
        }
        let at = |x: usize, y: usize| (y * w + x) as SwitchId;
        for y in 0..h {
            for x in 0..w {
                if w > 1 {
                    f.link((at(x, y), base), (at((x + 1) % w, y), base + 1)).expect("a free port");
                }
                if h > 1 {
                    f.link((at(x, y), base + 2), (at(x, (y + 1) % h), base + 3)).expect("a free port");
                }
            }
        }
        f.attach_hosts(hosts);
        f
    }

    /// A random connected fabric of `switches` switches of `ports` ports:
    /// `hosts` hosts on each switch's first ports, [`FREE_PORTS`] free,
    /// and the rest linked to other switches, first as a random spanning
    /// tree (so every switch is reachable), then at random until no two
    /// switches with a free port are left (or a bounded number of tries).
    /// The same seed gives the same fabric. Hosts are numbered from 1.
    pub fn random(switches: usize, ports: usize, hosts: usize, seed: u64) -> Fabric {
        use rand::{Rng, SeedableRng};
        let n = switches.clamp(1, 4096);
        let ports = ports.clamp(hosts.min(250) + FREE_PORTS + 2, Port::MAX as usize + 1);
        let first_link = hosts.min(250) + FREE_PORTS;
        let mut rng = rand_pcg::Pcg64Mcg::seed_from_u64(seed);
        let mut f = Fabric::default();
        for _ in 0..n {
            f.add_switch(ports);
        }
        let free_link = |f: &Fabric, sw: usize| {
            (first_link..ports).map(|p| p as Port).find(|&p| f.is_free(sw as SwitchId, p))
        };
        for i in 1..n {
            // An earlier switch with a port left: one always is, as each
            // switch joined uses one port and brings at least one more.
            let open: Vec<usize> = (0..i).filter(|&j| free_link(&f, j).is_some()).collect();
            let j = open[rng.gen_range(0..open.len())];
            let (pi, pj) = (free_link(&f, i).expect("a new switch"), free_link(&f, j).expect("open"));
            f.link((i as SwitchId, pi), (j as SwitchId, pj)).expect("free ports");
        }
        for _ in 0..4 * n * ports {
            let open: Vec<usize> = (0..n).filter(|&j| free_link(&f, j).is_some()).collect();
            if open.len() < 2 {
                break;
            }
            let a = open[rng.gen_range(0..open.len())];
            let b = open[rng.gen_range(0..open.len())];
            if a != b {
                let (pa, pb) = (free_link(&f, a).expect("open"), free_link(&f, b).expect("open"));
                f.link((a as SwitchId, pa), (b as SwitchId, pb)).expect("free ports");
            }
        }
        f.attach_hosts(hosts.min(250));
        f
    }

    /// `hosts` hosts on ports `0..hosts` of every switch, numbered from 1
    /// switch by switch.
    fn attach_hosts(&mut self, hosts: usize) {
        let mut id = 1;
        for sw in 0..self.switches.len() {
            for p in 0..hosts.min(self.switches[sw].ports.len()) {
                self.attach(id, (sw as SwitchId, p as Port)).expect("a free port");
                id += 1;
            }
        }
    }

    /// What each port of `sw` leads to, and whether its link is up
    /// (nothing for a switch that does not exist).
    pub fn ports(&self, sw: SwitchId) -> impl Iterator<Item = (Port, Option<(End, bool)>)> + '_ {
        self.switches
            .get(sw as usize)
            .into_iter()
            .flat_map(|s| s.ports.iter().enumerate().map(|(p, e)| (p as Port, *e)))
    }

    /// Each switch's distance in links from `from` over links that are up
    /// (`None`: not reachable).
    pub fn distances(&self, from: SwitchId) -> Vec<Option<usize>> {
        let mut d = vec![None; self.switches.len()];
        let Some(first) = d.get_mut(from as usize) else { return d };
        *first = Some(0);
        let mut queue = VecDeque::from([from]);
        while let Some(sw) = queue.pop_front() {
            let here = d[sw as usize].expect("queued once reached");
            for slot in &self.switches[sw as usize].ports {
                if let Some((End::Switch(o, _), true)) = slot {
                    if d[*o as usize].is_none() {
                        d[*o as usize] = Some(here + 1);
                        queue.push_back(*o);
                    }
                }
            }
        }
        d
    }

    /// Where a host on switch `from` could be plugged in `hops` switches
    /// from a peer on `from` ([TB] Table 3's count: 1 is `from` itself):
    /// the lowest-numbered switch that far with `port` free (any port:
    /// its highest free one), or nothing if none is.
    pub fn place_at(&self, from: SwitchId, hops: usize, port: Option<Port>) -> Option<(SwitchId, Port)> {
        let want = Some(hops.checked_sub(1)?);
        let d = self.distances(from);
        (0..self.switches.len()).filter(|&sw| d[sw] == want).find_map(|sw| {
            let sw = sw as SwitchId;
            match port {
                Some(p) => self.is_free(sw, p).then_some((sw, p)),
                None => (0..self.switches[sw as usize].ports.len())
                    .rev()
                    .map(|p| p as Port)
                    .find(|&p| self.is_free(sw, p))
                    .map(|p| (sw, p)),
            }
        })
    }
}

/// How the simulator times a search: [TB] gives no link figures, so these
/// are assumed (a switch hop of a microsecond, as Myrinet's were, and a
/// probe given up after a tenth of a millisecond).
#[derive(Debug, Clone, Copy)]
pub struct ProbeTiming {
    pub link_ns: u64,
    pub timeout_ns: u64,
}

impl Default for ProbeTiming {
    fn default() -> Self {
        ProbeTiming { link_ns: 1_000, timeout_ns: 100_000 }
    }
}

/// One search's end, probes and (virtual) time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapRun {
    pub outcome: Mapped,
    pub counts: ProbeCounts,
    /// Each round takes as long as its slowest probe: an answer's round
    /// trip, or the timeout.
    pub time_ns: u64,
}

/// A row of [TB] Table 3's analogue: a host moved so many switches away,
/// and what finding it again cost.
#[derive(Debug, Clone)]
pub struct MoveRow {
    pub hops: usize,
    pub hosts: usize,
    pub run: MapRun,
    /// The oracle's shortest route's length, in switches.
    pub shortest: usize,
}

impl Fabric {
    /// The most ports any switch has: what a mapper probes on each.
    pub fn max_ports(&self) -> usize {
        self.switches.iter().map(|s| s.ports.len()).max().unwrap_or(0)
    }

    /// What comes back to `from` for `probe`, and after how long.
    pub fn answer(&self, from: NodeId, probe: &Probe, t: ProbeTiming) -> (Answer, u64) {
        let back_and_forth = |links: usize| 2 * links as u64 * t.link_ns;
        match probe {
            Probe::Host(route) => match self.walk(from, route) {
                Walk::Host(h, links) => (Answer::Host(h), back_and_forth(links)),
                _ => (Answer::Nothing, t.timeout_ns),
            },
            Probe::Switch(route) => match self.walk(from, route) {
                Walk::Switch(_, links) => (Answer::Switch, back_and_forth(links)),
                _ => (Answer::Nothing, t.timeout_ns),
            },
        }
    }

    /// `from` searches for `to` with [`Mapper`], its probes answered by
    /// this fabric, at most `budget` probes.
    pub fn map(&self, from: NodeId, to: NodeId, budget: u64, t: ProbeTiming) -> MapRun {
        let mut mapper = Mapper::new(to, self.max_ports(), budget);
        let mut time_ns = 0;
        let mut answers = Vec::new();
        loop {
            let round = mapper.next_round();
            if round.is_empty() {
                break;
            }
            answers.clear();
            let mut slowest = 0;
            for probe in &round {
                let (a, took) = self.answer(from, probe, t);
                answers.push(a);
                slowest = slowest.max(took);
            }
            time_ns += slowest;
            mapper.answered(&answers);
        }
        let outcome = mapper.outcome().cloned().unwrap_or(Mapped::Unreachable);
        MapRun { outcome, counts: mapper.counts(), time_ns }
    }

    /// A chain of switches of `ports` ports each (at least 8), two links
    /// between neighbours (each switch's last four ports: two back, two
    /// on), and `hosts` hosts on ports `0..hosts` of every switch (at most
    /// ports - 6: two ports stay free for hosts moved there). Hosts are
    /// numbered from 1, switch by switch.
    pub fn chain(switches: usize, ports: usize, hosts: usize) -> Fabric {
        let ports = ports.clamp(8, Port::MAX as usize + 1);
        let mut f = Fabric::default();
        let s: Vec<SwitchId> = (0..switches.max(1)).map(|_| f.add_switch(ports)).collect();
        for w in s.windows(2) {
            let on = (ports - 2) as Port;
            let back = (ports - 4) as Port;
            f.link((w[0], on), (w[1], back)).expect("a free port");
            f.link((w[0], on + 1), (w[1], back + 1)).expect("a free port");
        }
        let mut id = 1;
        for &sw in &s {
            for p in 0..hosts.min(ports - 6) {
                f.attach(id, (sw, p as Port)).expect("a free port");
                id += 1;
            }
        }
        f
    }

    /// [TB] Table 3's experiment on this fabric: host `from` stays where
    /// it is; host `moved` is unplugged and plugged in `hops` switches
    /// away from it ([`Fabric::place_at`]: at `port`, or any free port),
    /// for 1 to `max_hops` hops, and `from` searches for it. A distance
    /// with no switch to go to has no row.
    pub fn moves(&self, from: NodeId, moved: NodeId, port: Option<Port>, max_hops: usize) -> Vec<MoveRow> {
        let t = ProbeTiming::default();
        let Some((start, _)) = self.host_at(from) else { return Vec::new() };
        (1..=max_hops)
            .filter_map(|hops| {
                let mut f = self.clone();
                f.move_host(moved, self.place_at(start, hops, port)?).ok()?;
                let shortest = f.shortest_route(from, moved).map_or(0, |r| r.len());
                Some(MoveRow {
                    hops,
                    hosts: f.hosts().count(),
                    run: f.map(from, moved, 1 << 20, t),
                    shortest,
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_route_goes_where_its_ports_say_or_is_dropped_on_the_way() {
        let mut f = Fabric::default();
        let (a, b) = (f.add_switch(4), f.add_switch(4));
        f.link((a, 3), (b, 3)).unwrap();
        f.attach(1, (a, 0)).unwrap();
        f.attach(2, (b, 1)).unwrap();
        assert_eq!(f.walk(1, &[3, 1]), Walk::Host(2, 3));
        assert_eq!(f.walk(1, &[3]), Walk::Switch(b, 2), "a switch probe's turning point");
        assert_eq!(f.walk(1, &[2]), Walk::Dropped(Drop::NoSuchPort));
        assert_eq!(f.walk(1, &[9]), Walk::Dropped(Drop::NoSuchPort));
        assert_eq!(f.walk(1, &[3, 1, 0]), Walk::Dropped(Drop::PastHost));
        assert_eq!(f.walk(7, &[3]), Walk::Dropped(Drop::NotAttached));
        f.set_link(b, 3, false).unwrap();
        assert_eq!(f.walk(1, &[3, 1]), Walk::Dropped(Drop::DeadLink), "down at both ends");
        assert_eq!(f.shortest_route(1, 2), None);
        f.set_link(a, 3, true).unwrap();
        assert_eq!(f.shortest_route(1, 2), Some(vec![3, 1]));
        // Moved: the old route leads nowhere, a new one does.
        assert_eq!(f.move_host(2, (a, 1)), Ok((b, 1)));
        assert_eq!(f.walk(1, &[3, 1]), Walk::Dropped(Drop::NoSuchPort));
        assert_eq!(f.shortest_route(1, 2), Some(vec![1]));
        assert_eq!(f.attach(3, (a, 1)), Err(FabricError::PortTaken(a, 1)));
        assert_eq!(f.move_host(9, (b, 0)), Err(FabricError::HostNotAttached(9)));
    }

    #[test]
    fn generated_fabrics_connect_every_host_by_their_shortest_routes() {
        let f = Fabric::fat_tree(8, 4);
        assert_eq!((f.hosts().count(), f.switch_count()), (32, 12));
        for a in f.hosts() {
            for b in f.hosts().filter(|&b| b != a) {
                let route = f.shortest_route(a, b).unwrap();
                let same_leaf = f.host_at(a).unwrap().0 == f.host_at(b).unwrap().0;
                assert_eq!(route.len(), if same_leaf { 1 } else { 3 }, "{a} to {b}");
                assert_eq!(f.walk(a, &route), Walk::Host(b, route.len() + 1));
            }
        }
        let t = Fabric::tang_bilas(2);
        let route = t.shortest_route(1, 3).unwrap();
        assert_eq!(route.len(), 4, "four switches in a chain");
        assert_eq!(t.walk(1, &route), Walk::Host(3, 5));
    }

    fn found(run: &MapRun) -> &[Port] {
        match &run.outcome {
            Mapped::Found(r) => r,
            Mapped::Unreachable => panic!("not found: {run:?}"),
        }
    }

    /// The mapper, seeing only probe answers, finds a route as short as
    /// the oracle's between every pair of hosts, and the route leads there.
    #[test]
    fn the_mapper_finds_a_shortest_route_between_every_pair() {
        let t = ProbeTiming::default();
        for f in [Fabric::fat_tree(8, 4), Fabric::tang_bilas(4), Fabric::chain(3, 16, 5)] {
            for a in f.hosts() {
                for b in f.hosts().filter(|&b| b != a) {
                    let run = f.map(a, b, 100_000, t);
                    let route = found(&run);
                    assert_eq!(route.len(), f.shortest_route(a, b).unwrap().len(), "{a} to {b}");
                    assert_eq!(f.walk(a, route), Walk::Host(b, route.len() + 1));
                    assert!(run.time_ns > 0 && run.counts.rounds > 0);
                }
            }
        }
    }

    /// After a host moves, and around a dead link, the search finds where
    /// it is now; a host with no way to it is unreachable, within the
    /// probe budget whatever the budget.
    #[test]
    fn moves_and_dead_links_are_mapped_around_and_the_budget_holds() {
        let t = ProbeTiming::default();
        let mut tree = Fabric::fat_tree(8, 4);
        let leaf0 = tree.host_at(1).unwrap().0;
        tree.set_link(leaf0, 4, false).unwrap();
        let run = tree.map(1, 32, 100_000, t);
        assert_eq!(found(&run).len(), 3, "around the dead uplink");
        assert_ne!(found(&run)[0], 4);
        // A chain of three 16-port switches, five hosts each (1-5, 6-10,
        // 11-15): host 15 moves from the last switch to the first.
        let mut f = Fabric::chain(3, 16, 5);
        assert_eq!(found(&f.map(1, 15, 100_000, t)).len(), 3);
        f.move_host(15, (0, 5)).unwrap();
        assert_eq!(found(&f.map(1, 15, 100_000, t)), &[5], "found where it went");
        // Both links from the first switch on cut: the others are gone.
        f.set_link(0, 14, false).unwrap();
        f.set_link(0, 15, false).unwrap();
        assert_eq!(f.map(1, 11, 100_000, t).outcome, Mapped::Unreachable);
        assert_eq!(found(&f.map(1, 15, 100_000, t)), &[5]);
        for budget in [1, 7, 50, 200] {
            let run = tree.map(1, 999, budget, t);
            assert_eq!(run.outcome, Mapped::Unreachable, "no host 999");
            assert!(run.counts.total() <= budget, "{budget}: {:?}", run.counts);
        }
    }

    /// [TB] Table 3's experiment: a host moved 1 to 4 switches away is
    /// found by a shortest route, at more probes the further it is, on the
    /// paper's four switches and on a chain of 1,000 hosts.
    #[test]
    fn a_host_moved_one_to_four_hops_away_is_found() {
        for (f, moved, port) in
            [(Fabric::tang_bilas(2), 4, Some(3)), (Fabric::chain(4, 256, 250), 1000, Some(250))]
        {
            let rows = f.moves(1, moved, port, 4);
            assert_eq!(rows.len(), 4);
            for w in rows.windows(2) {
                assert!(w[1].run.counts.total() > w[0].run.counts.total(), "{:?}", rows);
            }
            for r in &rows {
                assert_eq!(found(&r.run).len(), r.hops, "{r:?}");
                assert_eq!(r.shortest, r.hops);
            }
        }
    }
}
