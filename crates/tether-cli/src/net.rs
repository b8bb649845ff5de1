//! Options shared by the network commands, and endpoint set-up from them.

use std::net::SocketAddr;
use std::time::Duration;

use clap::{Args, ValueEnum};
use tether::{
    ChecksumKind, Config, Endpoint, FaultPlan, NodeId, Options, Progress, RailPolicy, RetransmitMode,
};
use tether_io::{AddressBook, FaultyTransport, Transport, UdpTransport};

#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum Mode {
    Selective,
    GoBackN,
}

/// `--checksum NAME`: any algorithm the wire names.
pub fn checksum_kind(name: &str) -> Result<ChecksumKind, String> {
    ChecksumKind::from_name(name).ok_or_else(|| {
        let names: Vec<_> = ChecksumKind::ALL.iter().map(|k| k.name()).collect();
        format!("unknown checksum `{name}` (one of {})", names.join(", "))
    })
}

#[derive(Debug, Clone, Args)]
pub struct NetOpts {
    /// Message size in bytes.
    #[arg(long, default_value_t = 8)]
    pub size: usize,
    /// Messages per run.
    #[arg(long)]
    pub count: Option<u64>,
    /// Repeat the measurement this many times and report the median, min and max.
    #[arg(long, default_value_t = 5)]
    pub runs: usize,
    /// Send window in segments (the papers' send-queue size).
    #[arg(long, default_value_t = 1024)]
    pub window: usize,
    /// Largest datagram in bytes, header included.
    #[arg(long, default_value_t = 1472)]
    pub mtu: usize,
    /// Floor of the adaptive retransmission timeout, in microseconds.
    #[arg(long, default_value_t = 1000)]
    pub rto_min_us: u64,
    /// Checksum algorithm: none, crc32c, sum, xor, adler32, fletcher64,
    /// fnv1a, murmur3, xxh3.
    #[arg(long, default_value = "crc32c", value_parser = checksum_kind)]
    pub checksum: ChecksumKind,
    #[arg(long, value_enum, default_value_t = Mode::Selective)]
    pub mode: Mode,
    /// Fraction of datagrams dropped at random on receive (e.g. 0.01).
    #[arg(long, default_value_t = 0.0)]
    pub loss: f64,
    /// Faults to inject, in the compact form, repeatable: `--fault
    /// drop:p=0.01 --fault delay:p=0.001,mean=2ms` (kinds: drop, delay,
    /// modify, reorder, duplicate, inject, invocation, operation).
    #[arg(long = "fault", value_name = "RULE")]
    pub faults: Vec<String>,
    /// A TOML fault plan file (`[[fault]]` tables with the same keys).
    #[arg(long, value_name = "FILE")]
    pub fault_plan: Option<std::path::PathBuf>,
    /// Seed for the fault injector.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Measure the bare transport: no header, no reliability.
    #[arg(long)]
    pub raw: bool,
    /// Busy-poll this long before sleeping in the kernel, in microseconds.
    #[arg(long, default_value_t = 50)]
    pub spin_us: u64,
    /// No progress thread: the calling thread drives the protocol (inside
    /// its blocking calls) instead.
    #[arg(long)]
    pub polling: bool,
    /// Two-process mode, receiving side: bind this address.
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Two-process mode, sending side: the listener's address.
    #[arg(long)]
    pub connect: Option<SocketAddr>,
    /// Two-process mode: this side's own address (sender) / the sender's address (listener, as --peer).
    #[arg(long)]
    pub bind: Option<SocketAddr>,
    /// Two-process mode, listener: the sender's address.
    #[arg(long)]
    pub peer: Option<SocketAddr>,
    /// Rails per endpoint on loopback (each a socket of its own); with 2 or
    /// more, path health is tracked and data fails over between them.
    #[arg(long, default_value_t = 1)]
    pub rails: usize,
    /// Two-process mode: another rail, `LOCAL=REMOTE` (this side's address
    /// on that network and the peer's), repeatable; --listen/--connect and
    /// --bind/--peer are rail 0.
    #[arg(long = "rail", value_name = "LOCAL=REMOTE", value_parser = rail_pair)]
    pub extra_rails: Vec<(SocketAddr, SocketAddr)>,
    /// How data uses healthy rails.
    #[arg(long, value_enum, default_value_t = Policy::PrimaryBackup)]
    pub rail_policy: Policy,
    /// Print one JSON document instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Policy {
    PrimaryBackup,
    Stripe,
}

/// `--rail LOCAL=REMOTE`.
fn rail_pair(s: &str) -> Result<(SocketAddr, SocketAddr), String> {
    let (l, r) = s.split_once('=').ok_or_else(|| format!("`{s}`: expected LOCAL=REMOTE"))?;
    let parse = |a: &str| a.parse::<SocketAddr>().map_err(|e| format!("`{a}`: {e}"));
    Ok((parse(l)?, parse(r)?))
}

pub const SENDER: NodeId = 1;
pub const RECEIVER: NodeId = 2;

impl NetOpts {
    pub fn config(&self) -> Config {
        let rto_min = Duration::from_micros(self.rto_min_us);
        Config {
            max_datagram: self.mtu,
            send_window: self.window,
            recv_window: self.window.max(1024),
            rto_min,
            rto_initial: rto_min.max(Config::default().rto_initial),
            checksum: self.checksum,
            retransmit: match self.mode {
                Mode::Selective => RetransmitMode::Selective,
                Mode::GoBackN => RetransmitMode::GoBackN,
            },
            rail_policy: match self.rail_policy {
                Policy::PrimaryBackup => RailPolicy::PrimaryBackup,
                Policy::Stripe => RailPolicy::Stripe,
            },
            ..Config::default()
        }
    }

    /// The fault plan: the file's rules, then `--fault` rules, then `--loss`.
    pub fn plan(&self) -> anyhow::Result<FaultPlan> {
        let mut plan = match &self.fault_plan {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?;
                FaultPlan::from_toml(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?
            }
            None => FaultPlan::new(self.seed),
        };
        let mut rules = self.faults.clone();
        if self.loss > 0.0 {
            rules.push(format!("drop:p={}", self.loss));
        }
        let first = plan.rules.len();
        for (i, r) in rules.iter().enumerate() {
            plan.rules.push(FaultPlan::parse_rule(r, first + i)?);
        }
        Ok(plan)
    }

    pub fn options(&self) -> anyhow::Result<Options> {
        let progress = if self.polling { Progress::Polling } else { Progress::Thread };
        Ok(Options {
            config: self.config(),
            spin: Duration::from_micros(self.spin_us),
            progress,
            faults: self.plan()?,
            ..Options::default()
        })
    }

    fn udp(
        &self,
        node: NodeId,
        bind: SocketAddr,
        peers: &[(NodeId, SocketAddr)],
    ) -> Result<UdpTransport, tether_io::TransportError> {
        let mut book = AddressBook::new();
        for &(id, addr) in peers {
            book.insert(id, addr);
        }
        UdpTransport::bind(node, bind, book)
    }

    /// A bare UDP transport for the raw baselines, with the fault plan
    /// applied the same way an endpoint applies it, drawing from `seed`.
    pub fn transport(
        &self,
        node: NodeId,
        bind: SocketAddr,
        peers: &[(NodeId, SocketAddr)],
        seed: u64,
    ) -> anyhow::Result<Box<dyn Transport + Send>> {
        let udp = self.udp(node, bind, peers)?;
        let plan = self.plan()?;
        if plan.is_empty() {
            return Ok(Box::new(udp));
        }
        Ok(Box::new(FaultyTransport::new(udp, &plan, seed)?))
    }

    /// An endpoint with this command's options and fault plan: rail 0
    /// bound at `bind`, plus the `--rail` rails, each peer reached over all.
    pub fn endpoint(
        &self,
        node: NodeId,
        bind: SocketAddr,
        peers: &[(NodeId, SocketAddr)],
    ) -> anyhow::Result<Endpoint> {
        if self.extra_rails.is_empty() {
            let udp = self.udp(node, bind, peers)?;
            return Ok(Endpoint::with_transport(node, Box::new(udp), self.options()?)?);
        }
        let binds: Vec<SocketAddr> =
            std::iter::once(bind).chain(self.extra_rails.iter().map(|&(local, _)| local)).collect();
        let ep = Endpoint::udp_rails(node, &binds, self.options()?)?;
        for &(id, addr) in peers {
            let addrs: Vec<SocketAddr> =
                std::iter::once(addr).chain(self.extra_rails.iter().map(|&(_, remote)| remote)).collect();
            ep.add_peer_rails(id, &addrs)?;
        }
        Ok(ep)
    }

    /// Two endpoints on loopback, `--rails` sockets each, knowing each
    /// other over every rail: (receiver, sender).
    pub fn loopback_pair(&self) -> anyhow::Result<(Endpoint, Endpoint)> {
        if self.rails <= 1 {
            let rx = self.endpoint(RECEIVER, loopback(), &[])?;
            let rx_addr = rx.local_addr().expect("UDP has an address");
            let tx = self.endpoint(SENDER, loopback(), &[(RECEIVER, rx_addr)])?;
            rx.add_peer(SENDER, tx.local_addr().expect("UDP has an address"))?;
            return Ok((rx, tx));
        }
        let binds = vec![loopback(); self.rails];
        let rx = Endpoint::udp_rails(RECEIVER, &binds, self.options()?)?;
        let tx = Endpoint::udp_rails(SENDER, &binds, self.options()?)?;
        rx.add_peer_rails(SENDER, &udp_rail_addrs(&tx))?;
        tx.add_peer_rails(RECEIVER, &udp_rail_addrs(&rx))?;
        Ok((rx, tx))
    }
}

/// Every rail's address of an endpoint whose rails are all UDP sockets.
pub fn udp_rail_addrs(e: &Endpoint) -> Vec<SocketAddr> {
    e.rail_addrs().into_iter().map(|a| a.expect("a UDP rail has an address")).collect()
}

pub fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().expect("valid literal")
}
