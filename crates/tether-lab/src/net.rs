//! Options shared by the network commands, and endpoint set-up from them.

use std::net::SocketAddr;
use std::time::Duration;

use clap::{Args, ValueEnum};
use tether::faults::FaultPlan;
use tether::{
    AuthKind, ChecksumKind, ClusterKey, Config, Endpoint, NodeId, Options, Progress, RailPolicy, Refused,
    RetransmitMode,
};
use tether_io::{AddressBook, FaultyTransport, Transport, UdpTransport};

use crate::args;

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

/// `--auth NAME`: any authentication algorithm the wire names.
pub fn auth_kind(name: &str) -> Result<AuthKind, String> {
    AuthKind::from_name(name).ok_or_else(|| {
        let names: Vec<_> = AuthKind::ALL.iter().map(|k| k.name()).collect();
        format!("unknown authentication `{name}` (one of {})", names.join(", "))
    })
}

#[derive(Debug, Clone, Args)]
pub struct NetOpts {
    /// Message size in bytes (0 to 64 MiB, the protocol's largest message).
    #[arg(long, default_value_t = 8, allow_negative_numbers = true, value_parser = args::size(0))]
    pub size: usize,
    /// Messages per run [default: by --size: pingpong 5000 (200 from 256
    /// KiB), stream 256 MiB worth (2000 to 2 million); bench half and a
    /// quarter of those].
    #[arg(long, allow_negative_numbers = true, value_parser = args::int_in::<u64>(1, MAX_COUNT, "", ""))]
    pub count: Option<u64>,
    /// Repeat the measurement this many times and report the median, min
    /// and max (loopback only: each process of a two-process run makes one).
    #[arg(long, default_value_t = 5, allow_negative_numbers = true, value_parser = args::int_in::<usize>(1, 1000, "", ""))]
    pub runs: usize,
    /// Send window in segments (the papers' send-queue size).
    #[arg(long, default_value_t = 1024, allow_negative_numbers = true,
          value_parser = args::config_field(|c, v| { c.send_window = v; c.recv_window = v.max(1024) }))]
    pub window: usize,
    /// Largest datagram in bytes, header included, or `auto`: the largest
    /// the path to the peer carries, as the kernel knows it (65507 on
    /// loopback; the link's MTU less 28 elsewhere). Either way the
    /// handshake proves the size with a padded HELLO and falls back to
    /// 1200 bytes where larger datagrams vanish on the way.
    #[arg(long, default_value = "auto", allow_negative_numbers = true, value_parser = args::mtu)]
    pub mtu: usize,
    /// Floor of the adaptive retransmission timeout, in microseconds (above
    /// the 25 us coalescing delay, at most the 250 ms ceiling).
    #[arg(long, default_value_t = 1000, allow_negative_numbers = true, value_parser = rto_min_us())]
    pub rto_min_us: u64,
    /// A fixed retransmission timer instead of the adaptive one (its
    /// floor, start and ceiling all this): what `tether bench sweep` varies
    /// as Tang and Bilas [TB] varied their one timer. Not a flag.
    #[arg(skip)]
    pub rto_fixed: Option<Duration>,
    /// Give up on a peer that acknowledged nothing for this long while data
    /// waited for it: its messages fail and the command says who did not
    /// answer (from 250ms, the retransmission ceiling, to 1h).
    #[arg(long, default_value = "5s", value_name = "DURATION",
          value_parser = args::duration_in(Config::default().rto_max, Duration::from_secs(3600), "from the retransmission ceiling to an hour"))]
    pub give_up_after: Duration,
    /// Checksum algorithm: none, crc32c, sum, xor, adler32, fletcher64,
    /// fnv1a, murmur3, xxh3.
    #[arg(long, default_value = "crc32c", value_parser = checksum_kind)]
    pub checksum: ChecksumKind,
    /// The cluster secret: a file of at least 16 bytes that every node
    /// shares. With it every datagram is authenticated (by --auth, under
    /// keys derived from it) and any other is refused [default: none:
    /// integrity by --checksum alone].
    #[arg(long, value_name = "FILE", value_parser = key_file)]
    pub key_file: Option<ClusterKey>,
    /// With --key-file, how datagrams are protected; every node must use
    /// the same: aes-256-gmac (authenticated, the payload in clear),
    /// aes-256-gcm (authenticated and encrypted), chacha20-poly1305 (the
    /// same, for machines without AES instructions).
    #[arg(long, default_value = "aes-256-gmac", value_parser = auth_kind, requires = "key_file")]
    pub auth: AuthKind,
    /// Repair of lost segments: selective (only what the receiver's SACK
    /// ranges show missing) or go-back-n (everything from the first gap).
    #[arg(long, value_enum, default_value_t = Mode::Selective)]
    pub mode: Mode,
    /// Fraction of datagrams dropped at random on receive (e.g. 0.01).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true, value_parser = args::probability)]
    pub loss: f64,
    /// Faults to inject, in the compact form, repeatable: `--fault
    /// drop:p=0.01 --fault delay:p=0.001,mean=2ms` (kinds: drop, delay,
    /// modify, reorder, duplicate, inject, invocation, operation) [default: none].
    #[arg(long = "fault", value_name = "RULE")]
    pub faults: Vec<String>,
    /// A TOML fault plan file (`[[fault]]` tables with the same keys) [default: none].
    #[arg(long, value_name = "FILE")]
    pub fault_plan: Option<std::path::PathBuf>,
    /// Seed for the fault injector.
    #[arg(long, default_value_t = 1, allow_negative_numbers = true, value_parser = args::seed)]
    pub seed: u64,
    /// Measure the bare transport: no header, no reliability.
    #[arg(long)]
    pub raw: bool,
    /// Busy-poll this long before sleeping in the kernel, in microseconds
    /// (at most 1 s: longer only burns a core).
    #[arg(long, default_value_t = 50, allow_negative_numbers = true, value_parser = args::int_in::<u64>(0, 1_000_000, "microseconds", ""))]
    pub spin_us: u64,
    /// Peers per rail that get a socket connected to them (beside the
    /// rail's listening one), the busiest first; 0: one unconnected socket
    /// per rail for every peer.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true, value_parser = args::int_in::<usize>(0, tether_io::MAX_CONNECTED as u64, "sockets", ""))]
    pub connected_peers: usize,
    /// Send and receive every datagram alone: no runs segmented or
    /// coalesced by the kernel (UDP GSO/GRO), for measuring what they bring.
    #[arg(long)]
    pub no_offload: bool,
    /// No progress thread: the calling thread drives the protocol (inside
    /// its blocking calls) instead.
    #[arg(long)]
    pub polling: bool,
    /// Two-process mode, receiving side: bind this address (port 0: any
    /// free port, printed when bound).
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
    /// Two-process mode, sending side: the listener's address.
    #[arg(long, value_name = "ADDR")]
    pub connect: Option<SocketAddr>,
    /// Two-process mode: this side's own address (sender) / the sender's address (listener, as --peer).
    #[arg(long, value_name = "ADDR")]
    pub bind: Option<SocketAddr>,
    /// Two-process mode, listener: the sender's address.
    #[arg(long, value_name = "ADDR")]
    pub peer: Option<SocketAddr>,
    /// Two-process mode, listener: take in a sender it was not given,
    /// instead of --peer. With --key-file the sender's handshake must
    /// prove the key; without one, anyone who reaches this port may send.
    #[arg(long)]
    pub accept: bool,
    /// Rails per endpoint on loopback (each a socket of its own); with 2 or
    /// more, path health is tracked and data fails over between them.
    #[arg(long, default_value_t = 1, allow_negative_numbers = true,
          value_parser = args::int_in::<usize>(1, tether::MAX_RAILS as u64, "", ""))]
    pub rails: usize,
    /// `stream` on loopback: this many streams at once, each between two
    /// endpoints of its own; each one's goodput is measured until the
    /// first is done, with their sum and Jain's fairness index.
    #[arg(long, default_value_t = 1, allow_negative_numbers = true,
          value_parser = args::int_in::<usize>(1, MAX_FLOWS as u64, "", ""))]
    pub flows: usize,
    /// Two-process mode: another rail, `LOCAL=REMOTE` (this side's address
    /// on that network and the peer's), repeatable; --listen/--connect and
    /// --bind/--peer are rail 0 [default: none].
    #[arg(long = "rail", value_name = "LOCAL=REMOTE", value_parser = rail_pair)]
    pub extra_rails: Vec<(SocketAddr, SocketAddr)>,
    /// How data uses healthy rails (with two or more): primary-backup
    /// sends on the first healthy rail, stripe spreads over all.
    #[arg(long, value_enum, default_value_t = Policy::PrimaryBackup)]
    pub rail_policy: Policy,
    /// Congestion control: delay (queueing delay against a target, loss
    /// when sharing a queue with loss-based flows), new-reno (loss only),
    /// off (no congestion window, no pacing).
    #[arg(long, value_enum, default_value_t = Congestion::Delay)]
    pub congestion: Congestion,
    /// Print one JSON document instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// The most flows `stream --flows` runs at once (each is two endpoints and
/// four threads).
pub const MAX_FLOWS: usize = 64;

/// The most messages one run may send: far beyond any measurement, and low
/// enough that per-message bookkeeping (pingpong keeps every round trip)
/// stays well under a gigabyte.
pub const MAX_COUNT: u64 = 100_000_000;

/// `--rto-min-us`: above the coalescing delay (`Config::validate` wants
/// the floor above it) and at most the retransmission ceiling.
fn rto_min_us() -> impl Fn(&str) -> Result<u64, String> + Clone {
    let c = Config::default();
    let lo = c.coalesce_delay.as_micros() as u64 + 1;
    let hi = c.rto_max.as_micros() as u64;
    args::int_in(lo, hi, "microseconds", "above the coalescing delay, at most the retransmission ceiling")
}

/// `--congestion`: the congestion controller (`tether::CongestionControl`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Congestion {
    /// Queueing delay against a target; loss when competing with loss-based flows.
    Delay,
    /// Loss only.
    NewReno,
    /// No congestion window, no pacing.
    Off,
}

impl Congestion {
    pub fn control(self) -> tether::CongestionControl {
        match self {
            Congestion::Delay => tether::CongestionControl::Delay,
            Congestion::NewReno => tether::CongestionControl::NewReno,
            Congestion::Off => tether::CongestionControl::Off,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Policy {
    PrimaryBackup,
    Stripe,
}

/// `--key-file FILE`: the file's bytes are the secret material.
pub fn key_file(path: &str) -> Result<ClusterKey, String> {
    let material = std::fs::read(path).map_err(|e| format!("cannot read `{path}`: {e}"))?;
    ClusterKey::from_material(&material).map_err(|e| format!("`{path}`: {}", e.why))
}

/// `--rail LOCAL=REMOTE`.
fn rail_pair(s: &str) -> Result<(SocketAddr, SocketAddr), String> {
    let (l, r) = s.split_once('=').ok_or_else(|| format!("`{s}`: expected LOCAL=REMOTE"))?;
    let parse = |a: &str| a.parse::<SocketAddr>().map_err(|e| format!("`{a}`: {e}"));
    Ok((parse(l)?, parse(r)?))
}

/// The counters that are reasons a datagram or frame was dropped.
const DROP_REASONS: &[&str] = &[
    "checksum_failures",
    "checksum_refused",
    "malformed",
    "misdirected",
    "stale_dropped",
    "protocol_violations",
    "out_of_window",
    "duplicates_discarded",
    "strangers_refused",
    "sessionless_dropped",
    "source_mismatch",
    "unknown_source",
    "handshakes_refused",
    "handshake_replies_dropped",
    "mtu_refused",
    "mac_failures",
    "auth_missing",
    "auth_unexpected",
    "auth_mismatch",
    "replays",
];

/// Drop counters by reason: only the non-zero ones.
pub type Drops = std::collections::BTreeMap<&'static str, u64>;

/// An endpoint's non-zero drop counters, by reason, for the reports.
pub fn drops(s: &tether::Stats) -> Drops {
    s.fields().into_iter().filter(|(name, n)| *n > 0 && DROP_REASONS.contains(name)).collect()
}

/// The sum of several endpoints' (or runs') drops.
pub fn sum_drops<'a>(all: impl IntoIterator<Item = &'a Drops>) -> Drops {
    let mut total = Drops::new();
    for d in all {
        for (&reason, &n) in d {
            *total.entry(reason).or_default() += n;
        }
    }
    total
}

pub const SENDER: NodeId = 1;
pub const RECEIVER: NodeId = 2;

impl NetOpts {
    /// `--mtu auto` made a size: the largest datagram every path to the
    /// peer carries (`tether_io::max_datagram_to`; the smallest over the
    /// rails): the listener for `--connect`, the sender for `--listen`,
    /// loopback otherwise. The handshake then takes the smaller of the
    /// two sides' sizes.
    pub fn resolve_mtu(&mut self) -> anyhow::Result<()> {
        if self.mtu != args::MTU_AUTO {
            return Ok(());
        }
        let first = match (self.listen, self.connect) {
            (_, Some(c)) => c,
            (Some(_), None) => self.peer.or(self.bind).unwrap_or_else(loopback),
            (None, None) => loopback(),
        };
        let mut mtu = usize::MAX;
        for to in std::iter::once(first).chain(self.extra_rails.iter().map(|&(_, remote)| remote)) {
            let n = tether_io::max_datagram_to(to)
                .map_err(|e| anyhow::anyhow!("--mtu auto: the path to {to}: {e}"))?;
            mtu = mtu.min(n);
        }
        if (Config { max_datagram: mtu, ..Config::default() }).validate().is_err() {
            anyhow::bail!("--mtu auto: the path to {first} carries {mtu} B datagrams, too few for tether");
        }
        self.mtu = mtu;
        Ok(())
    }

    pub fn config(&self) -> Config {
        let rto_min = Duration::from_micros(self.rto_min_us);
        let mut c = Config {
            max_datagram: self.mtu,
            send_window: self.window,
            recv_window: self.window.max(1024),
            rto_min,
            rto_initial: rto_min.max(Config::default().rto_initial),
            // The user's bound is a bound: no patience beyond it, however
            // slow the peer's round trips were before it went silent.
            abandon_after: self.give_up_after,
            abandon_limit: Some(self.give_up_after),
            checksum: self.checksum,
            key: self.key_file.clone().map(|k| k.with_auth(self.auth)),
            retransmit: match self.mode {
                Mode::Selective => RetransmitMode::Selective,
                Mode::GoBackN => RetransmitMode::GoBackN,
            },
            rail_policy: match self.rail_policy {
                Policy::PrimaryBackup => RailPolicy::PrimaryBackup,
                Policy::Stripe => RailPolicy::Stripe,
            },
            congestion: self.congestion.control(),
            // A listener with --accept takes in its one sender; without
            // --key-file, by the explicit opt-in the flag is.
            accept_peers: if self.accept { 1 } else { 0 },
            accept_unkeyed: self.accept,
            ..Config::default()
        };
        if let Some(t) = self.rto_fixed {
            (c.rto_min, c.rto_initial, c.rto_max) = (t, t, t);
            c.abandon_after = c.abandon_after.max(t);
            c.abandon_limit = c.abandon_limit.map(|l| l.max(t));
        }
        c
    }

    /// The fault plan: the file's rules, then `--fault` rules, then `--loss`.
    pub fn plan(&self) -> anyhow::Result<FaultPlan> {
        let mut plan = match &self.fault_plan {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?;
                FaultPlan::from_toml(&text).map_err(|e| match FaultPlan::toml_error_location(&text, &e) {
                    Some((line, column)) => anyhow::anyhow!("{}:{line}:{column}: {e}", path.display()),
                    None => anyhow::anyhow!("{}: {e}", path.display()),
                })?
            }
            None => FaultPlan::new(self.seed),
        };
        let mut rules = self.faults.clone();
        if self.loss > 0.0 {
            rules.push(format!("drop:p={}", self.loss));
        }
        let first = plan.rules.len();
        for (i, r) in rules.iter().enumerate() {
            plan.rules
                .push(FaultPlan::parse_rule(r, first + i).map_err(|e| anyhow::anyhow!("--fault {r}: {e}"))?);
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
            offload: !self.no_offload,
            ..Options::default()
        })
    }

    fn udp(&self, bind: SocketAddr, peers: &[(NodeId, SocketAddr)]) -> anyhow::Result<UdpTransport> {
        let mut book = AddressBook::new();
        for &(id, addr) in peers {
            book.insert(id, addr);
        }
        // The error names `bind` and the system's reason itself.
        let udp = UdpTransport::bind_with(bind, book, self.connected_peers)?;
        Ok(if self.no_offload { udp.without_offload() } else { udp })
    }

    /// A bare UDP transport for the raw baselines, with the fault plan
    /// applied the same way an endpoint applies it, drawing from `seed`.
    pub fn transport(
        &self,
        bind: SocketAddr,
        peers: &[(NodeId, SocketAddr)],
        seed: u64,
    ) -> anyhow::Result<Box<dyn Transport + Send>> {
        let udp = self.udp(bind, peers)?;
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
            let udp = self.udp(bind, peers)?;
            return Ok(Endpoint::with_transport(node, Box::new(udp), self.options()?)?);
        }
        let binds: Vec<SocketAddr> =
            std::iter::once(bind).chain(self.extra_rails.iter().map(|&(local, _)| local)).collect();
        let ep = udp_rails(node, &binds, self.connected_peers, self.options()?)?;
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
        let rx = udp_rails(RECEIVER, &binds, self.connected_peers, self.options()?)?;
        let tx = udp_rails(SENDER, &binds, self.connected_peers, self.options()?)?;
        rx.add_peer_rails(SENDER, &udp_rail_addrs(&tx))?;
        tx.add_peer_rails(RECEIVER, &udp_rail_addrs(&rx))?;
        Ok((rx, tx))
    }
}

/// `Endpoint::udp_rails`, binding each rail here so a failure reads as the
/// transport's own "cannot bind ADDR: reason", without the runtime's
/// prefix; up to `connected` peers per rail get a connected socket.
pub fn udp_rails(
    node: NodeId,
    binds: &[SocketAddr],
    connected: usize,
    options: Options,
) -> anyhow::Result<Endpoint> {
    let rails = binds
        .iter()
        .map(|&b| {
            let udp = UdpTransport::bind_with(b, AddressBook::new(), connected)?;
            let udp = if options.offload { udp } else { udp.without_offload() };
            Ok(Box::new(udp) as Box<dyn Transport + Send>)
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(Endpoint::with_rails(node, rails, options)?)
}

/// Every rail's address of an endpoint whose rails are all UDP sockets.
pub fn udp_rail_addrs(e: &Endpoint) -> Vec<SocketAddr> {
    e.rail_addrs().into_iter().map(|a| a.expect("a UDP rail has an address")).collect()
}

pub fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().expect("valid literal")
}

/// Addresses that cannot work together, refused before anything binds:
/// mixed address families (an IPv6 socket cannot reach an IPv4 peer),
/// nowhere to send to, and a sender whose port the listener cannot know.
pub fn check_addresses(o: &NetOpts) -> anyhow::Result<()> {
    let sendable = |flag: &str, a: SocketAddr| {
        anyhow::ensure!(
            !a.ip().is_unspecified() && a.port() != 0,
            "{flag} {a}: datagrams need a real address and port to go to"
        );
        Ok(())
    };
    let same_family = |(fa, a): (&str, SocketAddr), (fb, b): (&str, SocketAddr)| {
        anyhow::ensure!(
            a.is_ipv4() == b.is_ipv4(),
            "{fa} {a} and {fb} {b} are of different address families (IPv4 and IPv6)"
        );
        Ok(())
    };
    match (o.listen, o.connect) {
        (Some(_), Some(_)) => anyhow::bail!("give --listen or --connect, not both"),
        (Some(l), None) => {
            anyhow::ensure!(
                !(o.peer.is_some() && o.bind.is_some()),
                "a listener takes the sender's address once: --peer (or --bind), not both"
            );
            anyhow::ensure!(
                !(o.accept && (o.peer.is_some() || o.bind.is_some())),
                "--accept takes in a sender not given: not with --peer (or --bind)"
            );
            anyhow::ensure!(
                !(o.accept && o.raw),
                "--accept is tether's handshake; --raw needs the sender's --peer"
            );
            if let Some((f, p)) = o.peer.map(|p| ("--peer", p)).or(o.bind.map(|b| ("--bind", b))) {
                sendable(f, p)?;
                same_family(("--listen", l), (f, p))?;
            }
        }
        (None, Some(c)) => {
            anyhow::ensure!(!o.accept, "--accept is the listener's option");
            anyhow::ensure!(
                o.peer.is_none(),
                "--peer is the listener's option; a sender names the listener with --connect"
            );
            sendable("--connect", c)?;
            if let Some(b) = o.bind {
                anyhow::ensure!(
                    b.port() != 0,
                    "--bind {b}: give a fixed port; the listener names this address with --peer"
                );
                same_family(("--connect", c), ("--bind", b))?;
            }
        }
        (None, None) => {}
    }
    for &(local, remote) in &o.extra_rails {
        sendable("--rail", remote)?;
        same_family(("--rail", local), ("--rail", remote))?;
    }
    Ok(())
}

/// How long a listener waits for the first message: time to start the
/// other side by hand, and a bound, so a listener nobody talks to ends.
pub const FIRST_WAIT: Duration = Duration::from_secs(60);

/// Whom a listener takes its sender to be: the address it was given
/// (`--peer`), or whoever completes a handshake (`--accept`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sender {
    At(SocketAddr),
    Any,
}

impl Sender {
    /// The peers a listener's endpoint is given.
    pub fn peers(self, node: NodeId) -> Vec<(NodeId, SocketAddr)> {
        match self {
            Sender::At(addr) => vec![(node, addr)],
            Sender::Any => Vec::new(),
        }
    }
}

impl std::fmt::Display for Sender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Sender::At(addr) => write!(f, "{addr}"),
            Sender::Any => f.write_str("any sender"),
        }
    }
}

/// A listener says where it listens and what for, before it waits: one
/// line on stderr (stdout stays the result, a table or one JSON document).
pub fn listening(cmd: &str, local: SocketAddr, peer: Sender, what: &str) {
    eprintln!(
        "tether {cmd}: listening on {local} for {what} from {peer}; waiting up to {} s for the first",
        FIRST_WAIT.as_secs()
    );
}

/// A listener's first message never came. What this side refused
/// meanwhile (`refused`: its counters) is most likely why: a sender whose
/// key, `--auth` or addresses differ gets no answer, so only this side can
/// say so.
pub fn nothing_arrived(
    cmd: &str,
    local: SocketAddr,
    peer: Sender,
    refused: &Refused,
    waited: Duration,
) -> anyhow::Error {
    let causes = refused.causes();
    let waited = tether_fault::format_duration(Duration::from_millis(waited.as_millis() as u64));
    if causes.is_empty() {
        let bind = match peer {
            Sender::At(addr) => addr.to_string(),
            Sender::Any => "ADDR".to_string(),
        };
        return anyhow::anyhow!(
            "nothing arrived from {peer} within {waited} (start `tether {cmd} --connect {local} --bind {bind}` there)"
        );
    }
    anyhow::anyhow!("nothing was accepted from {peer} within {waited}: {}", causes.join("; "))
}

/// A listener's wait for its first message: up to `FIRST_WAIT`, but once
/// this side has refused the peer's datagrams for `give_up` (another key,
/// a key on one side only, another `--auth`), no longer: nothing it sends
/// will be taken, and the user learns why at once.
pub fn first_message(
    rx: &Endpoint,
    cmd: &str,
    local: SocketAddr,
    peer: Sender,
    give_up: Duration,
) -> anyhow::Result<tether::Delivery> {
    let start = std::time::Instant::now();
    let mut refusing_since: Option<std::time::Instant> = None;
    loop {
        let slice = Duration::from_millis(100);
        match rx.recv(Some(slice)) {
            Ok(d) => return Ok(d),
            Err(tether::Error::TimedOut) => {}
            Err(e) => return Err(e.into()),
        }
        let refused = Refused::from_stats(&rx.stats());
        let now = std::time::Instant::now();
        if !refused.is_empty() && now.duration_since(*refusing_since.get_or_insert(now)) >= give_up {
            return Err(nothing_arrived(cmd, local, peer, &refused, now - start));
        }
        if now - start >= FIRST_WAIT {
            return Err(nothing_arrived(cmd, local, peer, &refused, now - start));
        }
    }
}

/// What a sender that heard nothing can say of why: what it refused, or,
/// having refused nothing, how a listener that refuses it stays silent.
fn silence(refused: &Refused, keyed: bool) -> String {
    let causes = refused.causes();
    if !causes.is_empty() {
        return format!(" This side refused: {}.", causes.join("; "));
    }
    let why = if keyed {
        "a listener with another key, another --auth or no key refuses this side's datagrams"
    } else {
        "a listener with a --key-file refuses unauthenticated datagrams"
    };
    format!(" ({why} without answering; its own output names the cause.)")
}

/// A sender's peer went quiet: nobody there at all, or gone mid-run.
/// `stats`: the sender's counters (what was acknowledged, what it
/// refused); `keyed`: whether it has a cluster key.
pub fn no_answer(
    cmd: &str,
    addr: SocketAddr,
    bind: SocketAddr,
    total: u64,
    quiet: Duration,
    stats: &tether::Stats,
    keyed: bool,
) -> anyhow::Error {
    let (acked, refused) = (stats.messages_acked, Refused::from_stats(stats));
    let quiet = tether_fault::format_duration(quiet);
    if acked == 0 {
        anyhow::anyhow!(
            "nobody answered at {addr}: nothing was acknowledged within {quiet} (--give-up-after); \
             is `tether {cmd} --listen {addr} --peer {bind}` running there?{}",
            silence(&refused, keyed)
        )
    } else {
        anyhow::anyhow!(
            "{addr} stopped answering: {acked} of {total} messages acknowledged, then nothing for {quiet} (--give-up-after)"
        )
    }
}

/// Wait until everything `tx` sent is acknowledged, for as long as the
/// peer keeps acknowledging: a slow peer is waited for, a silent one makes
/// messages fail after `quiet` (the layer's own bound), which ends the wait
/// with `gone()`.
pub fn drain(tx: &Endpoint, quiet: Duration, gone: impl Fn() -> anyhow::Error) -> anyhow::Result<()> {
    let mut acked = tx.stats().messages_acked;
    loop {
        // Twice `quiet`: within it the peer either acknowledges something
        // or its messages fail; a flush as long as `quiet` could race that.
        let done = tx.flush(Some(quiet * 2));
        let s = tx.stats();
        if s.messages_failed > 0 {
            return Err(gone());
        }
        match done {
            Ok(()) => return Ok(()),
            Err(tether::Error::TimedOut) if s.messages_acked > acked => acked = s.messages_acked,
            Err(e) => return Err(e.into()),
        }
    }
}

/// What a two-process run is, agreed before it starts: the sender offers
/// its terms as its first message, the listener answers, and a mismatch
/// is refused on both sides naming both values (a listener expecting
/// 1024 B messages that were sent 8 B ones would otherwise report them
/// all corrupted).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Terms {
    /// Each message's size in bytes.
    pub size: usize,
    /// How many messages.
    pub count: u64,
}

/// The first bytes of a terms message, and of the listener's answer.
const TERMS: &[u8; 8] = b"TTHRUN01";
const AGREED: &[u8; 8] = b"TTHRUNOK";
const REFUSED: &[u8; 8] = b"TTHRUNNO";

impl Terms {
    fn encode(&self) -> Vec<u8> {
        let mut m = TERMS.to_vec();
        m.extend_from_slice(&(self.size as u64).to_le_bytes());
        m.extend_from_slice(&self.count.to_le_bytes());
        m
    }

    fn decode(m: &[u8]) -> Option<Terms> {
        let rest = m.strip_prefix(TERMS)?;
        let (size, count) = (rest.get(..8)?, rest.get(8..16)?);
        (rest.len() == 16).then(|| Terms {
            size: u64::from_le_bytes(size.try_into().expect("8 bytes")) as usize,
            count: u64::from_le_bytes(count.try_into().expect("8 bytes")),
        })
    }
}

impl std::fmt::Display for Terms {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} messages of {} B", self.count, self.size)
    }
}

/// The sender's side: offer `terms` to `peer` and wait (up to `wait`) for
/// its answer. `quiet()` is the error for a listener that never answers.
pub fn offer(
    tx: &Endpoint,
    peer: NodeId,
    addr: SocketAddr,
    terms: Terms,
    wait: Duration,
    quiet: impl Fn() -> anyhow::Error,
) -> anyhow::Result<()> {
    tx.send(peer, &terms.encode())?;
    let answer = match tx.recv(Some(wait)) {
        Ok(d) => d.message,
        Err(tether::Error::TimedOut) => return Err(quiet()),
        Err(e) => return Err(e.into()),
    };
    if answer.as_ref() == AGREED {
        return Ok(());
    }
    match answer.strip_prefix(REFUSED) {
        Some(why) => {
            anyhow::bail!("the listener at {addr} refused the run: {}", String::from_utf8_lossy(why))
        }
        None => anyhow::bail!("the listener at {addr} answered the run's terms with something else"),
    }
}

/// The listener's side: `first` must be the sender's terms, the same as
/// `ours`; the answer goes back to `peer` either way, and a refusal is
/// given time to arrive before this side ends.
pub fn agree(rx: &Endpoint, peer: NodeId, ours: Terms, first: &[u8]) -> anyhow::Result<()> {
    let why = match Terms::decode(first) {
        Some(theirs) if theirs == ours => {
            rx.send(peer, AGREED)?;
            return Ok(());
        }
        Some(theirs) => format!(
            "the sender offers {theirs}, the listener expects {ours}: start both with the same --size and --count"
        ),
        None => "the sender did not say what it sends (another version of tether?)".to_string(),
    };
    let mut answer = REFUSED.to_vec();
    answer.extend_from_slice(why.as_bytes());
    rx.send(peer, &answer)?;
    let _ = rx.flush(Some(Duration::from_secs(2)));
    anyhow::bail!("{why}")
}

#[cfg(test)]
mod terms_tests {
    use super::*;

    #[test]
    fn terms_round_trip_and_refuse_the_malformed() {
        let t = Terms { size: 1024, count: 262_144 };
        assert_eq!(Terms::decode(&t.encode()), Some(t));
        assert_eq!(Terms::decode(b"TTHRUN01short"), None);
        assert_eq!(Terms::decode(&[0u8; 24]), None);
        let mut long = t.encode();
        long.push(0);
        assert_eq!(Terms::decode(&long), None);
        assert_eq!(t.to_string(), "262144 messages of 1024 B");
    }
}
