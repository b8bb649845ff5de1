//! Start-up on many machines (docs/CLUSTER.md, "Start-up"): where this
//! process stands in its job - its rank, the job's size and every rank's
//! address - from whatever launched it: Slurm's environment (`srun`, the
//! HPC default), a hostfile (one line per rank, as `mpirun --hostfile`
//! takes), or a store of names every rank registers in (etcd through
//! `tether::names`, with the `names` feature). Rank `r` is tether node `r + 1` (node ids start
//! at 1 in every example and command). Each task listens at a base port
//! plus its index among the tasks on its host, so tasks sharing a host
//! never collide.
//!
//! ```no_run
//! let job = tether::launch::Launch::from_slurm(17_000)?;
//! let ep = job.builder().build()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::Path;

use tether_proto::NodeId;

/// Why the job's layout could not be read.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// A variable the launcher sets is not set: not started by it.
    #[error("{0} is not set: was this process started by srun?")]
    Missing(&'static str),
    /// A variable or line that does not say what it should.
    #[error("{what} is {value:?}: {why}")]
    Bad {
        /// Which variable, line or value.
        what: String,
        /// What it said.
        value: String,
        /// What is wrong with it.
        why: String,
    },
    /// A host name that does not resolve.
    #[error("host {host}: {error}")]
    Resolve {
        /// The host name.
        host: String,
        /// What resolving it said.
        error: std::io::Error,
    },
    /// The store of names refused, or not every rank registered in time.
    #[cfg(feature = "names")]
    #[error("names: {0}")]
    Names(String),
    /// The hostfile could not be read.
    #[error("hostfile {path}: {error}")]
    Hostfile {
        /// The file.
        path: String,
        /// What reading it said.
        error: std::io::Error,
    },
}

fn bad(what: &str, value: &str, why: impl Into<String>) -> LaunchError {
    LaunchError::Bad { what: what.to_string(), value: value.to_string(), why: why.into() }
}

/// A job's layout as its launcher described it, before any host name is
/// resolved: this process's rank and every rank's (host, port).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// This process's rank, from 0.
    pub rank: u32,
    /// Every rank's host and port, by rank.
    pub hosts: Vec<(String, u16)>,
}

impl Layout {
    /// Slurm's description (`Launch::from_slurm_vars`), unresolved.
    pub fn from_slurm_vars(
        var: impl Fn(&str) -> Option<String>,
        base_port: u16,
    ) -> Result<Layout, LaunchError> {
        let get = |k: &'static str| var(k).ok_or(LaunchError::Missing(k));
        let number = |k: &'static str| -> Result<u32, LaunchError> {
            let v = get(k)?;
            v.trim().parse().map_err(|_| bad(k, &v, "not a number"))
        };
        let rank = number("SLURM_PROCID")?;
        let size = number("SLURM_NTASKS")?;
        let list = get("SLURM_STEP_NODELIST").or_else(|_| get("SLURM_JOB_NODELIST"))?;
        let names = hostlist::expand(&list).map_err(|e| bad("SLURM_STEP_NODELIST", &list, e))?;
        let per = get("SLURM_STEP_TASKS_PER_NODE").or_else(|_| get("SLURM_TASKS_PER_NODE"))?;
        let counts = tasks_per_node(&per)?;
        if counts.len() != names.len() {
            return Err(bad(
                "SLURM_STEP_TASKS_PER_NODE",
                &per,
                format!("{} counts for {} hosts", counts.len(), names.len()),
            ));
        }
        if counts.iter().map(|&c| u64::from(c)).sum::<u64>() != u64::from(size) || rank >= size {
            return Err(bad("SLURM_PROCID", &rank.to_string(), format!("of {size} tasks placed as {per}")));
        }
        let cyclic = var("SLURM_DISTRIBUTION").is_some_and(|d| d.starts_with("cyclic"));
        let mut on_host = vec![0u16; names.len()];
        let mut hosts = Vec::with_capacity(size as usize);
        for h in place(&counts, cyclic) {
            let port = base_port
                .checked_add(on_host[h])
                .ok_or_else(|| bad("base port", &base_port.to_string(), "too high for the tasks per host"))?;
            on_host[h] += 1;
            hosts.push((names[h].clone(), port));
        }
        Ok(Layout { rank, hosts })
    }

    /// A hostfile's description (`Launch::from_hostfile`), unresolved.
    pub fn from_hostfile_text(text: &str, rank: u32, base_port: u16) -> Result<Layout, LaunchError> {
        let mut seen: Vec<(String, u16)> = Vec::new();
        let mut hosts = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let what = format!("hostfile line {}", i + 1);
            // `host:port`, `[v6]:port`, or a bare host (or v6 address).
            let with_port = match line.rsplit_once(':') {
                Some((h, p)) if !h.contains(':') || (h.starts_with('[') && h.ends_with(']')) => Some((h, p)),
                _ => None,
            };
            match with_port {
                Some((h, p)) => {
                    let port = p.parse().map_err(|_| bad(&what, line, "not a port"))?;
                    hosts.push((h.trim_matches(|c| c == '[' || c == ']').to_string(), port));
                }
                None => {
                    let n = match seen.iter_mut().find(|(h, _)| h == line) {
                        Some((_, n)) => {
                            *n = n.checked_add(1).ok_or_else(|| bad(&what, line, "too many on one host"))?;
                            *n
                        }
                        None => {
                            seen.push((line.to_string(), 0));
                            0
                        }
                    };
                    let port = base_port.checked_add(n).ok_or_else(|| bad(&what, line, "past port 65535"))?;
                    hosts.push((line.to_string(), port));
                }
            }
        }
        if rank as usize >= hosts.len() {
            return Err(bad("rank", &rank.to_string(), format!("the hostfile has {} ranks", hosts.len())));
        }
        Ok(Layout { rank, hosts })
    }

    /// Resolve every host: the job's addresses.
    pub fn resolve(self) -> Result<Launch, LaunchError> {
        let addrs = self.hosts.iter().map(|(h, p)| resolve(h, *p)).collect::<Result<_, _>>()?;
        Ok(Launch { rank: self.rank, addrs })
    }
}

/// This process's place in its job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launch {
    /// This process's rank, from 0.
    pub rank: u32,
    /// Every rank's address, by rank.
    pub addrs: Vec<SocketAddr>,
}

impl Launch {
    /// From the environment `srun` gives each task: `SLURM_PROCID` (the
    /// rank), `SLURM_NTASKS`, `SLURM_STEP_NODELIST` (the step's hosts, a
    /// hostlist such as `node[01-04,07]`) and `SLURM_STEP_TASKS_PER_NODE`
    /// (`2(x3),1`: how many tasks each host runs), placed by
    /// `SLURM_DISTRIBUTION` (block, the default, or cyclic). Each task
    /// listens at `base_port` plus its index on its host.
    pub fn from_slurm(base_port: u16) -> Result<Launch, LaunchError> {
        Self::from_slurm_vars(|k| std::env::var(k).ok(), base_port)
    }

    /// `from_slurm` over any source of variables (a test's).
    pub fn from_slurm_vars(
        var: impl Fn(&str) -> Option<String>,
        base_port: u16,
    ) -> Result<Launch, LaunchError> {
        Layout::from_slurm_vars(var, base_port)?.resolve()
    }

    /// From a hostfile: one line per rank in rank order, `host` or
    /// `host:port` (`#` starts a comment); a line without a port takes
    /// `base_port` plus the count of earlier lines on the same host.
    pub fn from_hostfile(path: &Path, rank: u32, base_port: u16) -> Result<Launch, LaunchError> {
        let text = std::fs::read_to_string(path)
            .map_err(|error| LaunchError::Hostfile { path: path.display().to_string(), error })?;
        Self::from_hostfile_text(&text, rank, base_port)
    }

    /// `from_hostfile` over its text.
    pub fn from_hostfile_text(text: &str, rank: u32, base_port: u16) -> Result<Launch, LaunchError> {
        Layout::from_hostfile_text(text, rank, base_port)?.resolve()
    }

    /// Through a store of names (etcd on a cluster, `EtcdNames`; a
    /// directory on one machine, `FileNames`): this rank registers `addr`
    /// (where it will bind, a concrete address) as `JOB.rank-RANK`, then
    /// waits up to `within` until all `size` ranks have. For launchers that
    /// say only the rank and the size.
    #[cfg(feature = "names")]
    pub fn from_names(
        names: &dyn crate::names::Names,
        job: &str,
        rank: u32,
        size: u32,
        addr: SocketAddr,
        within: std::time::Duration,
    ) -> Result<Launch, LaunchError> {
        use crate::names::Registration;
        if rank >= size {
            return Err(bad("rank", &rank.to_string(), format!("of {size}")));
        }
        if addr.ip().is_unspecified() || addr.port() == 0 {
            return Err(bad(
                "address",
                &addr.to_string(),
                "a concrete address and port: the others send to it",
            ));
        }
        let name = |r: u32| format!("{job}.rank-{r}");
        let err = |e: crate::names::NameError| LaunchError::Names(e.to_string());
        names.register(&name(rank), &Registration { node: node_of(rank), addrs: vec![addr] }).map_err(err)?;
        // A wall-clock wait: the other processes register when they start.
        #[allow(clippy::disallowed_methods)]
        let start = std::time::Instant::now();
        let mut addrs: Vec<Option<SocketAddr>> = vec![None; size as usize];
        loop {
            for (r, slot) in addrs.iter_mut().enumerate() {
                if slot.is_none() {
                    // A registration under another node id is not this job's rank.
                    *slot = names
                        .resolve(&name(r as u32))
                        .map_err(err)?
                        .filter(|reg| reg.node == node_of(r as u32))
                        .and_then(|reg| reg.addrs.first().copied());
                }
            }
            if addrs.iter().all(Option::is_some) {
                return Ok(Launch { rank, addrs: addrs.into_iter().flatten().collect() });
            }
            if start.elapsed() >= within {
                let missing: Vec<usize> = (0..addrs.len()).filter(|&r| addrs[r].is_none()).collect();
                return Err(LaunchError::Names(format!(
                    "ranks {missing:?} of {job} did not register within {within:?}"
                )));
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// How many ranks.
    pub fn size(&self) -> u32 {
        self.addrs.len() as u32
    }

    /// This process's tether node: its rank plus one.
    pub fn node(&self) -> NodeId {
        node_of(self.rank)
    }

    /// This process's address.
    pub fn addr(&self) -> SocketAddr {
        self.addrs[self.rank as usize]
    }

    /// Every other rank: (node, address).
    pub fn peers(&self) -> impl Iterator<Item = (NodeId, SocketAddr)> + '_ {
        let me = self.rank as usize;
        self.addrs.iter().enumerate().filter(move |&(r, _)| r != me).map(|(r, &a)| (node_of(r as u32), a))
    }

    /// A builder for this rank's endpoint: bound at its address, every
    /// other rank a peer.
    pub fn builder(&self) -> crate::Builder {
        let mut b = crate::Endpoint::builder(self.node()).bind(self.addr());
        for (n, a) in self.peers() {
            b = b.peer(n, a);
        }
        b
    }
}

fn node_of(rank: u32) -> NodeId {
    rank + 1
}

fn resolve(host: &str, port: u16) -> Result<SocketAddr, LaunchError> {
    let mut found = (host, port)
        .to_socket_addrs()
        .map_err(|error| LaunchError::Resolve { host: host.to_string(), error })?;
    // IPv4 first: what a cluster's hosts usually listen on.
    let all: Vec<SocketAddr> = found.by_ref().collect();
    all.iter().find(|a| a.is_ipv4()).or(all.first()).copied().ok_or_else(|| LaunchError::Resolve {
        host: host.to_string(),
        error: std::io::Error::other("no address"),
    })
}

/// Slurm's tasks-per-node syntax: `2(x3),1` is 2, 2, 2, 1.
fn tasks_per_node(s: &str) -> Result<Vec<u32>, LaunchError> {
    let mut out = Vec::new();
    for part in s.split(',') {
        let part = part.trim();
        let (count, times) = match part.split_once("(x") {
            Some((c, t)) => {
                (c, t.strip_suffix(')').ok_or_else(|| bad("tasks per node", s, "an unclosed (x"))?)
            }
            None => (part, "1"),
        };
        let count: u32 = count.parse().map_err(|_| bad("tasks per node", s, "not a count"))?;
        let times: usize = times.parse().map_err(|_| bad("tasks per node", s, "not a repeat"))?;
        if times > 1 << 20 || out.len() + times > 1 << 20 {
            return Err(bad("tasks per node", s, "more than a million hosts"));
        }
        out.extend(std::iter::repeat_n(count, times));
    }
    Ok(out)
}

/// The host of each rank: in blocks (the first host's tasks first), or
/// cyclically (one task per host in turn).
fn place(counts: &[u32], cyclic: bool) -> Vec<usize> {
    let mut placed = Vec::new();
    if cyclic {
        let mut left = counts.to_vec();
        while left.iter().any(|&c| c > 0) {
            for (h, c) in left.iter_mut().enumerate() {
                if *c > 0 {
                    *c -= 1;
                    placed.push(h);
                }
            }
        }
    } else {
        for (h, &c) in counts.iter().enumerate() {
            placed.extend(std::iter::repeat_n(h, c as usize));
        }
    }
    placed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars<'a>(v: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| v.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
    }

    #[test]
    fn slurm_places_ranks_on_hosts_in_blocks_and_cyclically() {
        let env = [
            ("SLURM_PROCID", "2"),
            ("SLURM_NTASKS", "5"),
            ("SLURM_STEP_NODELIST", "127.0.0.[1-2]"),
            ("SLURM_STEP_TASKS_PER_NODE", "3,2"),
        ];
        let l = Launch::from_slurm_vars(vars(&env), 9000).unwrap();
        let want: Vec<SocketAddr> =
            ["127.0.0.1:9000", "127.0.0.1:9001", "127.0.0.1:9002", "127.0.0.2:9000", "127.0.0.2:9001"]
                .iter()
                .map(|a| a.parse().unwrap())
                .collect();
        assert_eq!(l.addrs, want);
        assert_eq!((l.rank, l.node(), l.size(), l.addr()), (2, 3, 5, want[2]));
        assert_eq!(l.peers().count(), 4);
        let mut cyc = env.to_vec();
        cyc.push(("SLURM_DISTRIBUTION", "cyclic"));
        let l = Launch::from_slurm_vars(vars(&cyc), 9000).unwrap();
        let hosts: Vec<String> = l.addrs.iter().map(|a| a.to_string()).collect();
        assert_eq!(
            hosts,
            ["127.0.0.1:9000", "127.0.0.2:9000", "127.0.0.1:9001", "127.0.0.2:9001", "127.0.0.1:9002"]
        );
    }

    #[test]
    fn slurm_errors_say_which_variable() {
        let e = Launch::from_slurm_vars(vars(&[]), 9000).unwrap_err();
        assert!(matches!(e, LaunchError::Missing("SLURM_PROCID")), "{e}");
        let env = [
            ("SLURM_PROCID", "7"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_STEP_NODELIST", "localhost"),
            ("SLURM_STEP_TASKS_PER_NODE", "2"),
        ];
        let e = Launch::from_slurm_vars(vars(&env), 9000).unwrap_err();
        assert!(e.to_string().contains("SLURM_PROCID"), "{e}");
        let env = [
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_STEP_NODELIST", "localhost"),
            ("SLURM_STEP_TASKS_PER_NODE", "1(x2"),
        ];
        assert!(Launch::from_slurm_vars(vars(&env), 9000).is_err());
        assert_eq!(tasks_per_node("2(x3),1").unwrap(), vec![2, 2, 2, 1]);
    }

    #[test]
    fn hostfiles_number_ports_per_host() {
        let text =
            "# two on one host, one with its own port\n127.0.0.1\n127.0.0.1\n\n127.0.0.2:7000 # the third\n";
        let l = Launch::from_hostfile_text(text, 1, 9000).unwrap();
        let got: Vec<String> = l.addrs.iter().map(|a| a.to_string()).collect();
        assert_eq!(got, ["127.0.0.1:9000", "127.0.0.1:9001", "127.0.0.2:7000"]);
        assert!(Launch::from_hostfile_text(text, 3, 9000).is_err(), "a rank past the file");
        assert!(Launch::from_hostfile_text("127.0.0.1:x\n", 0, 9000).is_err());
    }
}
