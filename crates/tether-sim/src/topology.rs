//! Where a simulated fabric comes from (docs/FABRIC.md, "Topologies"): a
//! fabric file a user writes or saves, or a generator named on the
//! command line (`chain:4,16,4`, `fat-tree:8`, `torus:6x6`, `random:48`,
//! `tang-bilas`, `file:PATH`). Tang and Bilas [TB] mapped one fabric, a
//! chain of four switches; the search they describe is meant for any,
//! and this is how tether's is tried on others.
//!
//! A fabric file is text, a line each:
//!
//! ```text
//! # comments and blank lines are skipped
//! switch 0 ports 16        # switches numbered 0, 1, 2, ... in order
//! switch 1 ports 8
//! link 0:14 1:4            # switch:port to switch:port
//! link 0:15 1:5 down       # a link that is cut
//! host 1 at 0:0            # host 1 plugged into switch 0's port 0
//! ```
//!
//! The parser is bounded (a megabyte of text, 4,096 switches, 256 ports a
//! switch, every host once and every port once) and refuses anything else
//! with the line and what is wrong; [`write`] gives a file that parses to
//! the same fabric.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::str::FromStr;

use tether_proto::NodeId;

use crate::fabric::{End, Fabric, FabricError, Port, SwitchId};

/// The longest fabric file read.
pub const MAX_TEXT: usize = 1 << 20;
/// The most switches a fabric may have.
pub const MAX_SWITCHES: usize = 4096;
/// The most ports a switch may have (a route names a port in a byte).
pub const MAX_PORTS: usize = Port::MAX as usize + 1;

/// What is wrong with a line of a fabric file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LineError {
    #[error("`{0}` does not start a line of a fabric file (switch, link or host)")]
    UnknownWord(String),
    #[error("missing {0}")]
    Missing(&'static str),
    #[error("`{0}` after the end of the line")]
    Extra(String),
    #[error("`{found}` where `{expected}` belongs")]
    Expected { expected: &'static str, found: String },
    #[error("`{0}` is not a number in range")]
    Number(String),
    #[error("`{0}` is not SWITCH:PORT")]
    Place(String),
    #[error("switch {found} declared where switch {expected} is next (switches are numbered 0, 1, 2, ... in order)")]
    SwitchOrder { expected: usize, found: usize },
    #[error("more than {MAX_SWITCHES} switches")]
    TooManySwitches,
    #[error("a switch has 1 to {MAX_PORTS} ports, not {0}")]
    Ports(usize),
    #[error("{0}")]
    Fabric(#[from] FabricError),
}

/// Why a topology could not be had.
#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    #[error("line {line}: {error}")]
    Line { line: usize, error: LineError },
    #[error("a fabric file is at most {MAX_TEXT} bytes; this one is {0}")]
    TooLong(usize),
    #[error("a fabric file is text: {0}")]
    NotText(std::str::Utf8Error),
    #[error("the fabric has no switch")]
    Empty,
    #[error("`{0}` is not a topology: {TOPOLOGIES}")]
    Spec(String),
    #[error("{0}")]
    Plan(String),
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
}

/// The forms a topology is named in, for errors and help.
pub const TOPOLOGIES: &str = "one of tang-bilas, chain:SWITCHES[,PORTS[,HOSTS]], fat-tree:K[,HOSTS], \
                              torus:WxH[,HOSTS], random:SWITCHES[,PORTS[,HOSTS[,SEED]]], file:PATH";

/// Parse a fabric file's text.
pub fn parse(text: &[u8]) -> Result<Fabric, TopologyError> {
    if text.len() > MAX_TEXT {
        return Err(TopologyError::TooLong(text.len()));
    }
    let text = std::str::from_utf8(text).map_err(TopologyError::NotText)?;
    let mut f = Fabric::default();
    for (i, line) in text.lines().enumerate() {
        let line_no = i + 1;
        parse_line(&mut f, line).map_err(|error| TopologyError::Line { line: line_no, error })?;
    }
    if f.switch_count() == 0 {
        return Err(TopologyError::Empty);
    }
    Ok(f)
}

fn parse_line(f: &mut Fabric, line: &str) -> Result<(), LineError> {
    let line = line.split_once('#').map_or(line, |(before, _)| before);
    let mut words = line.split_whitespace();
    let Some(first) = words.next() else { return Ok(()) };
    let mut next = |what: &'static str| words.next().ok_or(LineError::Missing(what));
    match first {
        "switch" => {
            let id: usize = number(next("the switch's number")?)?;
            if id != f.switch_count() {
                return Err(LineError::SwitchOrder { expected: f.switch_count(), found: id });
            }
            if id >= MAX_SWITCHES {
                return Err(LineError::TooManySwitches);
            }
            keyword(next("`ports`")?, "ports")?;
            let ports: usize = number(next("the number of ports")?)?;
            if !(1..=MAX_PORTS).contains(&ports) {
                return Err(LineError::Ports(ports));
            }
            f.add_switch(ports);
        }
        "link" => {
            let a = place(next("the first end, SWITCH:PORT")?)?;
            let b = place(next("the second end, SWITCH:PORT")?)?;
            let down = match words.next() {
                None => false,
                Some("down") => true,
                Some(other) => return Err(LineError::Expected { expected: "down", found: other.into() }),
            };
            f.link(a, b)?;
            if down {
                f.set_link(a.0, a.1, false)?;
            }
        }
        "host" => {
            let id: NodeId = number(next("the host's number")?)?;
            keyword(next("`at`")?, "at")?;
            let at = place(next("where it is plugged in, SWITCH:PORT")?)?;
            f.attach(id, at)?;
        }
        other => return Err(LineError::UnknownWord(other.into())),
    }
    match words.next() {
        Some(extra) => Err(LineError::Extra(extra.into())),
        None => Ok(()),
    }
}

fn number<T: FromStr>(word: &str) -> Result<T, LineError> {
    word.parse().map_err(|_| LineError::Number(word.into()))
}

fn keyword(word: &str, expected: &'static str) -> Result<(), LineError> {
    match word == expected {
        true => Ok(()),
        false => Err(LineError::Expected { expected, found: word.into() }),
    }
}

fn place(word: &str) -> Result<(SwitchId, Port), LineError> {
    let (sw, port) = word.split_once(':').ok_or_else(|| LineError::Place(word.into()))?;
    Ok((number(sw)?, number(port)?))
}

/// A fabric file for `f` that [`parse`] reads back as the same fabric.
pub fn write(f: &Fabric) -> String {
    let hosts = f.hosts().count();
    let mut out = format!("# tether fabric: {} switches, {hosts} hosts\n", f.switch_count());
    for sw in 0..f.switch_count() as SwitchId {
        let _ = writeln!(out, "switch {sw} ports {}", f.ports(sw).count());
    }
    for sw in 0..f.switch_count() as SwitchId {
        for (p, end) in f.ports(sw) {
            // Each link once, from its lower end.
            if let Some((End::Switch(o, op), up)) = end {
                if (sw, p) < (o, op) {
                    let _ = writeln!(out, "link {sw}:{p} {o}:{op}{}", if up { "" } else { " down" });
                }
            }
        }
    }
    for h in f.hosts() {
        let (sw, p) = f.host_at(h).expect("listed hosts are attached");
        let _ = writeln!(out, "host {h} at {sw}:{p}");
    }
    out
}

/// A fabric named on the command line or by a simulator mix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Topology {
    /// [TB]'s own four switches, two hosts at each end.
    TangBilas,
    /// [`Fabric::chain`].
    Chain { switches: usize, ports: usize, hosts: usize },
    /// [`Fabric::fat_tree`].
    FatTree { k: usize, hosts: usize },
    /// [`Fabric::torus`].
    Torus { width: usize, height: usize, hosts: usize },
    /// [`Fabric::random`].
    Random { switches: usize, ports: usize, hosts: usize, seed: u64 },
    /// A fabric file ([`parse`]).
    File(PathBuf),
}

impl Topology {
    /// The fabric (a file is read and parsed).
    pub fn build(&self) -> Result<Fabric, TopologyError> {
        Ok(match *self {
            Topology::TangBilas => Fabric::tang_bilas(2),
            Topology::Chain { switches, ports, hosts } => Fabric::chain(switches, ports, hosts),
            Topology::FatTree { k, hosts } => Fabric::fat_tree(k, hosts),
            Topology::Torus { width, height, hosts } => Fabric::torus(width, height, hosts),
            Topology::Random { switches, ports, hosts, seed } => Fabric::random(switches, ports, hosts, seed),
            Topology::File(ref path) => {
                let io = |source| TopologyError::Io { path: path.clone(), source };
                let len = std::fs::metadata(path).map_err(io)?.len();
                if len > MAX_TEXT as u64 {
                    return Err(TopologyError::TooLong(len.try_into().unwrap_or(usize::MAX)));
                }
                parse(&std::fs::read(path).map_err(io)?)?
            }
        })
    }
}

impl std::fmt::Display for Topology {
    fn fmt(&self, out: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Topology::TangBilas => write!(out, "tang-bilas"),
            Topology::Chain { switches, ports, hosts } => write!(out, "chain:{switches},{ports},{hosts}"),
            Topology::FatTree { k, hosts } => write!(out, "fat-tree:{k},{hosts}"),
            Topology::Torus { width, height, hosts } => write!(out, "torus:{width}x{height},{hosts}"),
            Topology::Random { switches, ports, hosts, seed } => {
                write!(out, "random:{switches},{ports},{hosts},{seed}")
            }
            Topology::File(path) => write!(out, "file:{}", path.display()),
        }
    }
}

impl FromStr for Topology {
    type Err = TopologyError;

    fn from_str(spec: &str) -> Result<Self, TopologyError> {
        let bad = || TopologyError::Spec(spec.into());
        let (kind, args) = spec.split_once(':').unwrap_or((spec, ""));
        if kind == "file" {
            return match args.is_empty() {
                true => Err(bad()),
                false => Ok(Topology::File(args.into())),
            };
        }
        // Numbers, each in its range, with a default when left out.
        let fields: Vec<&str> = if args.is_empty() { Vec::new() } else { args.split(',').collect() };
        let field = |i: usize, lo: u64, hi: u64, default: Option<u64>| -> Result<u64, TopologyError> {
            match fields.get(i) {
                Some(w) => w.trim().parse().ok().filter(|n| (lo..=hi).contains(n)).ok_or_else(bad),
                None => default.ok_or_else(bad),
            }
        };
        let at_most = |n: usize| if fields.len() > n { Err(bad()) } else { Ok(()) };
        let topology = match kind {
            "tang-bilas" => {
                at_most(0)?;
                Topology::TangBilas
            }
            "chain" => {
                at_most(3)?;
                let ports = field(1, 8, MAX_PORTS as u64, Some(16))? as usize;
                Topology::Chain {
                    switches: field(0, 1, MAX_SWITCHES as u64, None)? as usize,
                    ports,
                    hosts: field(2, 0, ports as u64 - 6, Some(4))? as usize,
                }
            }
            "fat-tree" => {
                at_most(2)?;
                let k = field(0, 2, 254, None)? as usize & !1;
                Topology::FatTree { k, hosts: field(1, 0, k as u64 / 2, Some(k as u64 / 2 - 1))? as usize }
            }
            "torus" => {
                at_most(2)?;
                let (w, h) = fields.first().and_then(|d| d.split_once('x')).ok_or_else(bad)?;
                let dim =
                    |d: &str| d.trim().parse::<usize>().ok().filter(|n| (1..=64).contains(n)).ok_or_else(bad);
                Topology::Torus {
                    width: dim(w)?,
                    height: dim(h)?,
                    hosts: field(1, 0, 250, Some(4))? as usize,
                }
            }
            "random" => {
                at_most(4)?;
                let hosts = field(2, 0, 250, Some(4))?;
                Topology::Random {
                    switches: field(0, 1, MAX_SWITCHES as u64, None)? as usize,
                    ports: field(1, hosts + 4, MAX_PORTS as u64, Some((hosts + 8).min(MAX_PORTS as u64)))?
                        as usize,
                    hosts: hosts as usize,
                    seed: field(3, 0, u64::MAX, Some(1))?,
                }
            }
            _ => return Err(bad()),
        };
        Ok(topology)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::Walk;

    fn same(a: &Fabric, b: &Fabric) {
        assert_eq!(write(a), write(b));
        for h in a.hosts() {
            for g in a.hosts() {
                assert_eq!(a.shortest_route(h, g), b.shortest_route(h, g));
            }
        }
    }

    /// Every generator's fabric, written out and read back, is the same
    /// fabric; the paper's, written by hand in docs/, is `tang-bilas`.
    #[test]
    fn a_written_fabric_reads_back_the_same() {
        let mut cut = Fabric::chain(3, 16, 4);
        cut.set_link(0, 14, false).unwrap();
        for f in [
            Fabric::tang_bilas(2),
            Fabric::fat_tree(8, 3),
            Fabric::torus(4, 3, 2),
            Fabric::random(20, 10, 3, 7),
            cut,
        ] {
            same(&f, &parse(write(&f).as_bytes()).unwrap());
        }
        let doc = include_str!("../../../docs/fabrics/tang-bilas.fabric");
        same(&parse(doc.as_bytes()).unwrap(), &Fabric::tang_bilas(2));
    }

    #[test]
    fn a_bad_line_is_refused_with_its_number_and_cause() {
        let cases: &[(&str, &str)] = &[
            ("switch 0 ports 4\nswitch 2 ports 4", "line 2: switch 2 declared where switch 1 is next"),
            ("switch 0 ports 300", "line 1: a switch has 1 to 256 ports, not 300"),
            ("switch 0 ports 0", "line 1: a switch has 1 to 256 ports, not 0"),
            ("switch 0 ports 4\nlink 0:1 0:1", "line 2: switch 0 port 1 is taken"),
            ("switch 0 ports 4\nlink 0:1 0:9", "line 2: switch 0 has no port 9"),
            ("switch 0 ports 4\nhost 1 at 0:0\nhost 1 at 0:1", "line 3: host 1 is attached already"),
            ("switch 0 ports 4\nhost 1 at 0:0\nhost 2 at 0:0", "line 3: switch 0 port 0 is taken"),
            ("switch 0 ports 4\nhost 1 at 3:0", "line 2: no switch 3"),
            ("switch 0 ports 4\nhost 1 0:0", "line 2: `0:0` where `at` belongs"),
            ("switch 0 ports 4\nhost 1 at 0-0", "line 2: `0-0` is not SWITCH:PORT"),
            ("switch 0 ports 4\nlink 0:1", "line 2: missing the second end"),
            ("switch 0 ports 4 extra", "line 1: `extra` after the end of the line"),
            ("switch 0 ports 4\nlink 0:1 0:2 up", "line 2: `up` where `down` belongs"),
            ("router 0", "line 1: `router` does not start a line"),
            ("switch -1 ports 4", "line 1: `-1` is not a number"),
            ("# nothing\n\n", "the fabric has no switch"),
        ];
        for (text, want) in cases {
            let err = parse(text.as_bytes()).unwrap_err().to_string();
            assert!(err.starts_with(want), "{text:?}: {err}");
        }
        assert!(matches!(parse(&[0xff, 0xfe]), Err(TopologyError::NotText(_))));
        let long = "# x\n".repeat(MAX_TEXT / 4 + 1);
        assert!(matches!(parse(long.as_bytes()), Err(TopologyError::TooLong(_))));
        let many: String = (0..=MAX_SWITCHES).map(|i| format!("switch {i} ports 1\n")).collect();
        assert_eq!(
            parse(many.as_bytes()).unwrap_err().to_string(),
            format!("line 4097: more than {MAX_SWITCHES} switches")
        );
    }

    #[test]
    fn topologies_are_named_and_built() {
        for (spec, switches, hosts) in [
            ("tang-bilas", 4, 4),
            ("chain:3", 3, 12),
            ("chain:4,32,25", 4, 100),
            ("fat-tree:8", 12, 24),
            ("fat-tree:8,4", 12, 32),
            ("torus:6x6", 36, 144),
            ("torus:5x1,2", 5, 10),
            ("random:48", 48, 192),
            ("random:10,12,2,9", 10, 20),
        ] {
            let t: Topology = spec.parse().unwrap();
            let f = t.build().unwrap();
            assert_eq!((f.switch_count(), f.hosts().count()), (switches, hosts), "{spec}");
            assert_eq!(t.to_string().parse::<Topology>().unwrap(), t, "{spec} printed as it parses");
            // Every host reaches every other, by the route the oracle finds.
            let first = f.hosts().next().unwrap();
            for h in f.hosts().filter(|&h| h != first) {
                let route = f.shortest_route(first, h).unwrap_or_else(|| panic!("{spec}: no route to {h}"));
                assert_eq!(f.walk(first, &route), Walk::Host(h, route.len() + 1));
            }
        }
        for bad in [
            "",
            "ring:4",
            "chain",
            "chain:0",
            "chain:4,7",
            "chain:4,16,11",
            "torus:6",
            "torus:0x3",
            "fat-tree:8,5",
            "random:4,5",
            "tang-bilas:2",
            "file:",
            "chain:1,2,3,4",
        ] {
            let err = bad.parse::<Topology>().unwrap_err().to_string();
            assert!(err.contains("is not a topology: one of tang-bilas"), "{bad}: {err}");
        }
        let missing = Topology::File("/nonexistent/x.fabric".into()).build().unwrap_err().to_string();
        assert!(missing.starts_with("/nonexistent/x.fabric: "), "{missing}");
    }

    /// A torus wraps around, and a random fabric is the same for a seed
    /// and another for another.
    #[test]
    fn generated_fabrics_have_their_shape() {
        let t = Fabric::torus(6, 6, 1);
        let d = t.distances(0);
        assert_eq!(d.iter().flatten().max(), Some(&6), "3 + 3 around a 6x6 torus");
        assert_eq!(d[5], Some(1), "the row wraps around");
        assert_eq!(d[30], Some(1), "the column wraps around");
        assert_eq!(write(&Fabric::random(30, 8, 2, 5)), write(&Fabric::random(30, 8, 2, 5)));
        assert_ne!(write(&Fabric::random(30, 8, 2, 5)), write(&Fabric::random(30, 8, 2, 6)));
        for sw in 0..30 {
            let free = Fabric::random(30, 8, 2, 5).ports(sw).filter(|(_, e)| e.is_none()).count();
            assert!(free >= crate::fabric::FREE_PORTS, "switch {sw} keeps its free ports");
        }
    }
}
